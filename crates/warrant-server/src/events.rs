//! The gateway's event worker. Events are jobs of kind [`EVENT_JOB`] the store commits with the
//! records that cause them (the outbox: an approval request and its `approval.requested` event
//! commit together or not at all); any node claims due events under a lease, and one whose
//! node died is claimed again when the lease lapses. Delivery is at least once: a failed one is
//! retried with backoff, and dead after its attempts.
//!
//! Today's consumer: `approval.requested` → an email to the tenant's reviewers through the
//! operator's relay, when the operator configured them (`[console.notify]` in `warrant.toml`):
//! the tool, the proposer, the digest, the expiry and the console link — never the arguments
//! (the reviewer reads those signed in).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use warrant_core::records::{EVENT_JOB, Job, JobCompletion};
use warrant_core::store::StoreError;
use warrant_runtime::adapters::email::Mailer;

use crate::state::AppState;

/// How long a claimed event is a node's from its claim or last renewal (renewed while it is
/// delivered).
const LEASE: Duration = Duration::from_secs(30);
/// Events claimed at once, delivered side by side (each send is bounded well inside the lease).
const CLAIM: u32 = 8;
/// How often an idle worker looks for due events.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// Who is told when an approval is requested (the operator's `[console.notify]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewMail {
    /// The sender address.
    pub from: String,
    /// Each tenant's reviewer addresses.
    pub reviewers: BTreeMap<String, Vec<String>>,
}

/// Sends reviewer notifications: the mailer and the addresses.
#[derive(Debug, Clone)]
pub struct Notifier {
    mailer: Mailer,
    reviewers: BTreeMap<String, Vec<String>>,
}

impl Notifier {
    /// The notifier of `mail` through the relay in `adapters`.
    ///
    /// # Errors
    /// No relay is configured, or the sender is not an address.
    pub fn new(
        mail: &ReviewMail,
        adapters: &warrant_runtime::adapters::AdapterConfig,
    ) -> Result<Self, String> {
        Ok(Notifier {
            mailer: Mailer::new(&mail.from, adapters)?,
            reviewers: mail.reviewers.clone(),
        })
    }
}

/// Runs the event worker until the gateway stops.
pub(crate) fn spawn_worker(state: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let worker = format!("events-{}", hex::encode(rand::random::<[u8; 6]>()));
        loop {
            match deliver_due(&state, &worker).await {
                Ok(0) => tokio::time::sleep(IDLE_POLL).await,
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "the event worker cannot claim events");
                    tokio::time::sleep(IDLE_POLL * 5).await;
                }
            }
        }
    })
}

/// Claims the due events as `worker` and delivers each; answers how many were claimed.
///
/// # Errors
/// The store fails to claim.
pub async fn deliver_due(state: &Arc<AppState>, worker: &str) -> Result<usize, StoreError> {
    let jobs = state
        .store
        .claim_jobs(worker, EVENT_JOB, CLAIM, LEASE, state.env.now())
        .await?;
    let claimed = jobs.len();
    let mut deliveries = tokio::task::JoinSet::new();
    for job in jobs {
        let (state, worker) = (state.clone(), worker.to_owned());
        deliveries.spawn(async move {
            crate::jobs::holding(&state, &job, &worker, LEASE, settle(&state, &worker, &job)).await;
        });
    }
    while deliveries.join_next().await.is_some() {}
    Ok(claimed)
}

/// Delivers one claimed event and records how that went.
async fn settle(state: &AppState, worker: &str, job: &Job) {
    let completion = match deliver(state, job).await {
        Ok(()) => JobCompletion::Done,
        Err(Undelivered::Never(error)) => {
            tracing::warn!(event = job.job.id, %error, "an event cannot be delivered");
            JobCompletion::Dead { error }
        }
        Err(Undelivered::Later(error)) => {
            let wait = Duration::from_secs(5u64.saturating_mul(1 << job.attempts.min(7)));
            tracing::warn!(event = job.job.id, attempts = job.attempts, %error, "an event was not delivered; retrying");
            JobCompletion::Retry {
                run_at: state.env.now() + wait,
                error,
            }
        }
    };
    if let Err(error) = state
        .store
        .complete_job(&job.job.id, worker, &completion, state.env.now())
        .await
    {
        tracing::warn!(event = job.job.id, %error, "an event's delivery was not recorded");
    }
}

/// Why an event was not delivered.
enum Undelivered {
    /// Worth trying again later (the relay deferred, or could not be reached).
    Later(String),
    /// Never deliverable (a malformed address): dead at once.
    Never(String),
}

/// Delivers one event: its webhook messages (one per subscribed endpoint), then its own
/// consumers.
async fn deliver(state: &AppState, job: &Job) -> Result<(), Undelivered> {
    let kind = job
        .job
        .payload
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let data = event_data(state, job)
        .await
        .map_err(|e| Undelivered::Later(e.to_string()))?;
    crate::webhooks::fan_out(state, job, kind, &data)
        .await
        .map_err(|e| Undelivered::Later(e.to_string()))?;
    match kind {
        "approval.requested" => approval_requested(state, job).await,
        _ => Ok(()),
    }
}

/// The `data` of an event's webhook body: what a receiver needs, never arguments or secrets.
async fn event_data(state: &AppState, job: &Job) -> Result<Value, StoreError> {
    let payload = &job.job.payload;
    if let Some(ledger_id) = payload.get("ledger_id").and_then(Value::as_str) {
        // A call: what it came to, never its arguments or result.
        let mut data = match state.store.get_ledger(&job.job.tenant, ledger_id).await? {
            Some(e) => serde_json::json!({
                "ledger_id": e.id,
                "trace_id": e.trace_id,
                "principal": e.principal,
                "tool": e.tool,
                "contract_id": e.contract_id,
                "payload_digest": e.payload_digest,
                "decision": e.decision.as_str(),
                "outcome": e.outcome.map(|o| o.as_str()),
                "error_code": e.error_code,
                "attempts": e.attempts,
                "latency_ms": e.latency_ms,
                "cost": e.cost,
                "run_id": e.run_id,
                "step_id": e.step_id,
                "approval_id": e.approval_id,
                "created_at": crate::routes::rfc3339(e.created_at),
                "updated_at": crate::routes::rfc3339(e.updated_at),
            }),
            None => serde_json::json!({"ledger_id": ledger_id}),
        };
        if let (Value::Object(map), Some(counter)) = (&mut data, payload.get("counter")) {
            map.insert("counter".into(), counter.clone());
        }
        return Ok(data);
    }
    if let Some(run_id) = payload.get("run_id").and_then(Value::as_str) {
        // A run: where it stands, never its input.
        return Ok(match state.store.get_run(&job.job.tenant, run_id).await? {
            Some(run) => serde_json::json!({
                "run_id": run.id,
                "workflow": run.workflow,
                "version": run.version,
                "status": run.status.as_str(),
                "cost": run.cost,
                "error": run.error,
                "created_at": crate::routes::rfc3339(run.created_at),
                "updated_at": crate::routes::rfc3339(run.updated_at),
            }),
            None => serde_json::json!({"run_id": run_id}),
        });
    }
    let Some(id) = payload.get("approval_id").and_then(Value::as_str) else {
        // A contract: its name, version and content id, as the event carries them.
        let mut data = payload.clone();
        if let Value::Object(map) = &mut data {
            map.remove("type");
        }
        return Ok(data);
    };
    let Some(a) = state
        .store
        .get_approval(&job.job.tenant, id, state.env.now())
        .await?
    else {
        return Ok(serde_json::json!({"approval_id": id}));
    };
    let r = &a.request;
    Ok(serde_json::json!({
        "approval_id": r.id,
        "tool": r.tool,
        "contract_id": r.contract_id,
        "proposer": r.proposer,
        "payload_digest": r.payload_digest,
        "created_at": crate::routes::rfc3339(r.created_at),
        "expires_at": crate::routes::rfc3339(r.expires_at),
        "review_url": crate::mcp::review_url(state, id),
        "status": a.status.as_str(),
        "reviewer": a.reviewer,
        "decided_at": a.decided_at.map(crate::routes::rfc3339),
        "superseded_by": a.superseded_by,
    }))
}

/// Emails the tenant's reviewers about a new approval request (nothing when none are
/// configured, or the request was decided meanwhile).
async fn approval_requested(state: &AppState, job: &Job) -> Result<(), Undelivered> {
    let Some(notifier) = &state.review_mail else {
        return Ok(());
    };
    let tenant = &job.job.tenant;
    let Some(to) = notifier.reviewers.get(tenant).filter(|to| !to.is_empty()) else {
        return Ok(());
    };
    let Some(id) = job.job.payload.get("approval_id").and_then(Value::as_str) else {
        return Ok(());
    };
    let approval = state
        .store
        .get_approval(tenant, id, state.env.now())
        .await
        .map_err(|e| Undelivered::Later(e.to_string()))?;
    let Some(approval) = approval.filter(|a| a.status == warrant_core::records::ApprovalStatus::Pending)
    else {
        return Ok(());
    };
    let request = &approval.request;
    let url = crate::mcp::review_url(state, id);
    let subject = format!("Approval requested: {} by {}", request.tool, request.proposer);
    let body = format!(
        "{proposer} asks to call `{tool}` in tenant {tenant}.\n\n\
         Approval   {id}\n\
         Payload    {digest}\n\
         Expires    {expires}\n\n\
         Review the exact payload and decide:\n{url}\n",
        proposer = request.proposer,
        tool = request.tool,
        digest = request.payload_digest,
        expires = crate::routes::rfc3339(request.expires_at),
    );
    notifier
        .mailer
        .send(to, &subject, &body, &format!("approval-requested.{id}"))
        .await
        .map_err(|failure| {
            if failure.code() == warrant_core::ToolErrorCode::InputInvalid {
                Undelivered::Never(failure.to_string())
            } else {
                Undelivered::Later(failure.to_string())
            }
        })?;
    metrics::counter!("warrant_review_notifications_total").increment(1);
    Ok(())
}
