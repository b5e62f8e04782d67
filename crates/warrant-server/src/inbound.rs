//! Inbound webhooks (PRODUCT §9): outside systems — billing, ticketing, CI — start governed work
//! by posting signed events to `POST /v1/inbound/<source id>`.
//!
//! A delivery is verified over its **raw bytes** before anything parses them
//! ([`warrant_core::inbound::verify`]: the source's provider scheme, constant-time, a 5-minute
//! timestamp tolerance where the scheme signs one). A refused delivery answers `401`, is counted on
//! its source (with the reason; within a write budget, [`refusals_quota`], beyond which they are only
//! counted in metrics) and does nothing else. A verified event is stored with the job
//! that acts on it in one transaction (`Store::accept_inbound`), deduplicated on the source and
//! the provider's event id for [`warrant_core::records::INBOUND_RETENTION`]: the first delivery answers `202`, a
//! redelivery `200` and starts nothing.
//!
//! The work runs on the job runtime ([`INBOUND_JOB`]), as the principal of the source's API key
//! (its grants and roles; a revoked key stops the source): **start a workflow run** (its id
//! derived from the event, so a job run twice starts one run) or **make a call through
//! `dispatch`** (the pipeline every lane uses; its idempotency key derived from the event, so a
//! job run twice replays the call). The input or the arguments are the source's mapping — the
//! workflow binding syntax, with the roots `event` (the body) and `delivery` (`id`, `type`) —
//! resolved against the event. What each event did is recorded on it.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use warrant_core::authority::Principal;
use warrant_core::decision::Outcome;
use warrant_core::inbound::{InboundSecret, Provider, Refusal};
use warrant_core::records::{
    INBOUND_JOB, InboundEvent, InboundSource, InboundStatus, Job, JobCompletion, NewJob,
};
use warrant_core::registry::Pin;
use warrant_core::store::StoreError;
use warrant_runtime::{Dispatched, OwnedCall, submit};
use warrant_workflow::definition::ToolRef;
use warrant_workflow::template::{Grammar, Template};

use crate::state::AppState;

/// Refused deliveries written to their source's record: 2 a second after a burst of 20, at most
/// (a flood of forged deliveries must not become a flood of writes); every refusal is counted
/// in metrics and logged.
pub(crate) fn refusals_quota() -> governor::Quota {
    governor::Quota::per_second(std::num::NonZeroU32::MIN.saturating_add(1))
        .allow_burst(std::num::NonZeroU32::MIN.saturating_add(19))
}
/// How long a rotated-out secret is still accepted.
pub const ROTATION_OVERLAP: time::Duration = time::Duration::hours(24);
/// Events acted on at once.
const CLAIM: u32 = 16;
/// How long a claimed event is a node's from its claim or last renewal (renewed while it acts).
const LEASE: Duration = Duration::from_secs(30);
/// Attempts before an event's job is dead (a store that keeps failing).
pub(crate) const MAX_ATTEMPTS: u32 = 10;
/// The longest provider event id kept.
const MAX_EVENT_ID: usize = 255;

/// What a source does with a verified event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Start a run of a published workflow with the mapped input.
    Workflow {
        /// The workflow's name.
        name: String,
        /// Its version.
        version: u32,
        /// The run's input.
        input: Mapping,
    },
    /// Make a call of a pinned contract with the mapped arguments.
    Call {
        /// The contract's qualified name.
        tool: String,
        /// Its content id, pinned when the source was made.
        contract: String,
        /// The call's arguments.
        arguments: Mapping,
    },
}

impl Action {
    /// Reads an action as a tenant admin writes it (`{"workflow": "name@version", "input": …}`
    /// or `{"tool": "name@version" | content id, "arguments": …}`) or as it is stored (a call
    /// with its pinned `contract`). The contract itself is resolved by [`Action::pin`].
    ///
    /// # Errors
    /// What is wrong with it.
    pub(crate) fn parse(value: &Value) -> Result<Self, String> {
        let Value::Object(map) = value else {
            return Err("an action is an object".into());
        };
        let text = |key: &str| map.get(key).and_then(Value::as_str);
        if let Some(workflow) = text("workflow") {
            refuse_unknown(map, &["workflow", "input"])?;
            let (name, version) = workflow
                .rsplit_once('@')
                .and_then(|(n, v)| Some((n, v.parse::<u32>().ok()?)))
                .filter(|(n, _)| !n.is_empty())
                .ok_or_else(|| format!("`{workflow}` is not `name@version`"))?;
            let input = Mapping::parse(map.get("input").cloned().unwrap_or_else(|| json!("${event}")))?;
            return Ok(Action::Workflow {
                name: name.to_owned(),
                version,
                input,
            });
        }
        if let Some(tool) = text("tool") {
            refuse_unknown(map, &["tool", "contract", "arguments"])?;
            let arguments = Mapping::parse(
                map.get("arguments")
                    .cloned()
                    .ok_or("a call action needs `arguments`")?,
            )?;
            return Ok(Action::Call {
                tool: tool.to_owned(),
                contract: text("contract").unwrap_or_default().to_owned(),
                arguments,
            });
        }
        Err("an action names a `workflow` (`name@version`) or a `tool`".into())
    }

    /// Resolves what the action names in `tenant`: the workflow must be published; a call's
    /// contract must be registered and not retired, and its content id is pinned (a later
    /// version does not change what the source calls).
    ///
    /// # Errors
    /// What is missing; `Ok(Err(..))` is a refusal, `Err` a store failure.
    pub(crate) async fn pin(
        self,
        state: &AppState,
        tenant: &str,
    ) -> Result<Result<Self, String>, StoreError> {
        match self {
            Action::Workflow { name, version, input } => {
                if state.store.get_workflow(tenant, &name, version).await?.is_none() {
                    return Ok(Err(format!(
                        "no workflow {name}@{version} is published in this tenant"
                    )));
                }
                Ok(Ok(Action::Workflow { name, version, input }))
            }
            Action::Call { tool, arguments, .. } => {
                let tool_ref = match ToolRef::parse(&tool) {
                    Ok(t) => t,
                    Err(why) => return Ok(Err(why)),
                };
                let content;
                let pin = match &tool_ref {
                    ToolRef::Version { name, version } => Pin::Version(name, *version),
                    ToolRef::Content(id) => {
                        content = id.to_string();
                        Pin::ContentId(&content)
                    }
                };
                match state.registry.find_pinned(tenant, pin, state.env.now()).await? {
                    Some((contract, false)) => Ok(Ok(Action::Call {
                        tool: contract.qualified_name(),
                        contract: contract.id().to_string(),
                        arguments,
                    })),
                    Some((_, true)) => Ok(Err(format!("{tool_ref} is retired"))),
                    None => Ok(Err(format!("{tool_ref} is not registered"))),
                }
            }
        }
    }

    /// The stored form.
    pub(crate) fn to_value(&self) -> Value {
        match self {
            Action::Workflow { name, version, input } => {
                json!({"workflow": format!("{name}@{version}"), "input": input.0})
            }
            Action::Call {
                tool,
                contract,
                arguments,
            } => json!({"tool": tool, "contract": contract, "arguments": arguments.0}),
        }
    }
}

fn refuse_unknown(map: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(format!("`{key}` is not a field of this action")),
        None => Ok(()),
    }
}

/// A JSON value whose strings may bind the event: `"${event.data.object.id}"` alone is that
/// value, typed; inside text it is rendered into the string; `$${` is a literal `${`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mapping(Value);

impl Mapping {
    /// Checks every string of `value` under the inbound grammar.
    ///
    /// # Errors
    /// The first malformed binding.
    pub(crate) fn parse(value: Value) -> Result<Self, String> {
        fn check(value: &Value) -> Result<(), String> {
            match value {
                Value::String(s) => Template::parse_in(s, Grammar::Inbound).map(drop),
                Value::Array(items) => items.iter().try_for_each(check),
                Value::Object(map) => map.values().try_for_each(check),
                _ => Ok(()),
            }
        }
        check(&value)?;
        Ok(Mapping(value))
    }

    /// The value with every binding resolved in `scope` (`{"event": …, "delivery": …}`).
    ///
    /// # Errors
    /// A binding the event has no value for.
    pub(crate) fn resolve(&self, scope: &Value) -> Result<Value, String> {
        fn walk(value: &Value, scope: &Value) -> Result<Value, String> {
            Ok(match value {
                Value::String(s) => {
                    let template = Template::parse_in(s, Grammar::Inbound)?;
                    let missing =
                        |r: &warrant_workflow::template::Reference| format!("the event has no `{r}`");
                    match template.single() {
                        Some(reference) => reference
                            .lookup(scope)
                            .cloned()
                            .ok_or_else(|| missing(reference))?,
                        None => Value::String(template.render(scope).map_err(|r| missing(&r))?),
                    }
                }
                Value::Array(items) => {
                    Value::Array(items.iter().map(|v| walk(v, scope)).collect::<Result<_, _>>()?)
                }
                Value::Object(map) => Value::Object(
                    map.iter()
                        .map(|(k, v)| Ok((k.clone(), walk(v, scope)?)))
                        .collect::<Result<_, String>>()?,
                ),
                other => other.clone(),
            })
        }
        walk(&self.0, scope)
    }
}

/// The associated data a source's secret is sealed with.
pub(crate) fn secret_aad(tenant: &str, id: &str) -> String {
    format!("warrant-inbound-secret-v1|{tenant}|{id}")
}

/// What a delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Verified and stored; its work is queued.
    Accepted(String),
    /// Verified; this source already has the event: nothing new starts.
    Duplicate(String),
}

/// Why a delivery was not received.
#[derive(Debug)]
pub enum NotReceived {
    /// No enabled source has this id (`404`).
    UnknownSource,
    /// The signature is missing, malformed, stale or wrong (`401`): nothing else happens.
    Refused(Refusal),
    /// Verified, but not an event Warrant can read (`400`): not JSON, or no event id.
    Unreadable(String),
    /// The store failed (`503`): nothing was stored; the provider retries.
    Store(StoreError),
}

/// Receives one delivery to source `id`: verify, then store the event with its job.
///
/// # Errors
/// [`NotReceived`].
pub async fn receive(
    state: &AppState,
    id: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Received, NotReceived> {
    let source = match state.store.get_inbound_source(id).await {
        Ok(Some(s)) if s.enabled => s,
        Ok(_) => return Err(NotReceived::UnknownSource),
        Err(e) => return Err(NotReceived::Store(e)),
    };
    let now = state.env.now();
    let aad = secret_aad(&source.tenant, &source.id);
    let open = |sealed: &str| {
        state
            .webhook_secrets
            .open_text(sealed, &aad)
            .and_then(|text| InboundSecret::parse(source.provider, &text).ok())
    };
    let mut secrets: Vec<InboundSecret> = open(&source.secret).into_iter().collect();
    if source.previous_until.is_some_and(|until| until > now) {
        secrets.extend(source.previous_secret.as_deref().and_then(open));
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let secrets: Vec<&InboundSecret> = secrets.iter().collect();
    let verified =
        match warrant_core::inbound::verify(source.provider, &secrets, &header, body, now.unix_timestamp()) {
            Ok(v) => v,
            Err(refusal) => {
                refused(state, &source, &refusal.to_string()).await;
                return Err(NotReceived::Refused(refusal));
            }
        };
    let parsed = match warrant_core::json::parse(body, warrant_core::json::Limits::PROPOSAL) {
        Ok(v) => v,
        Err(e) => {
            let why = format!("the body is not strict JSON: {e}");
            refused(state, &source, &why).await;
            return Err(NotReceived::Unreadable(why));
        }
    };
    let event_id = match source.provider {
        Provider::Stripe => parsed.get("id").and_then(Value::as_str).map(str::to_owned),
        Provider::StandardWebhooks | Provider::Github => verified.event_id,
    };
    let Some(event_id) = event_id.filter(|e| valid_event_id(e)) else {
        let why = format!(
            "the delivery carries no usable event id ({})",
            match source.provider {
                Provider::Stripe => "the body's `id`",
                Provider::StandardWebhooks => "`webhook-id`",
                Provider::Github => "`X-GitHub-Delivery`",
            }
        );
        refused(state, &source, &why).await;
        return Err(NotReceived::Unreadable(why));
    };
    let kind = match source.provider {
        Provider::Github => header("x-github-event").map(str::to_owned),
        Provider::Stripe | Provider::StandardWebhooks => {
            parsed.get("type").and_then(Value::as_str).map(str::to_owned)
        }
    };
    let event = InboundEvent {
        tenant: source.tenant.clone(),
        source_id: source.id.clone(),
        event_id: event_id.clone(),
        body: parsed,
        body_digest: hex::encode(Sha256::digest(body)),
        status: InboundStatus::Queued,
        deliveries: 1,
        detail: None,
        received_at: now,
        updated_at: now,
    };
    let job = NewJob {
        id: format!("inb_{}_{}", source.id, event_digest(&source.id, &event_id)),
        tenant: source.tenant.clone(),
        kind: INBOUND_JOB.to_owned(),
        payload: json!({"source_id": source.id, "event_id": event_id, "type": kind}),
        run_at: now,
        max_attempts: MAX_ATTEMPTS,
    };
    match state.store.accept_inbound(&event, &job).await {
        Ok(true) => {
            metrics::counter!("warrant_inbound_events_total", "result" => "accepted").increment(1);
            state.inbound_due.notify_one();
            Ok(Received::Accepted(event_id))
        }
        Ok(false) => {
            metrics::counter!("warrant_inbound_events_total", "result" => "duplicate").increment(1);
            Ok(Received::Duplicate(event_id))
        }
        Err(e) => Err(NotReceived::Store(e)),
    }
}

/// An event id Warrant keeps: 1 to 255 visible ASCII characters.
fn valid_event_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_EVENT_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// A short stable digest of a source's event id (for the ids derived from it).
fn event_digest(source: &str, event: &str) -> String {
    let digest = Sha256::digest(format!("{source}\n{event}").as_bytes());
    hex::encode(digest.get(..16).unwrap_or_default())
}

/// Counts a refused delivery: always in metrics and the log, on the source's record within the
/// write budget.
async fn refused(state: &AppState, source: &InboundSource, why: &str) {
    metrics::counter!("warrant_inbound_events_total", "result" => "refused").increment(1);
    tracing::warn!(
        source = source.id,
        tenant = source.tenant,
        reason = why,
        "an inbound delivery was refused"
    );
    if state.inbound_refusals.check_key(&source.id).is_ok()
        && let Err(error) = state
            .store
            .note_inbound_refusal(&source.id, why, state.env.now())
            .await
    {
        tracing::warn!(source = source.id, %error, "a refused inbound delivery was not recorded");
    }
}

/// Runs the inbound worker until the gateway stops.
pub(crate) fn spawn_worker(state: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let worker = state.env.new_id("inbound");
        // Until the gateway shuts down: then nothing more is claimed (the events being acted
        // on finish first, inside `act_on_due`).
        while !state.stopping.is_cancelled() {
            let wait = match act_on_due(&state, &worker).await {
                Ok(0) => Duration::from_secs(1),
                Ok(_) => continue,
                Err(error) => {
                    tracing::warn!(%error, "the inbound worker cannot claim events");
                    Duration::from_secs(5)
                }
            };
            tokio::select! {
                () = state.inbound_due.notified() => {}
                () = tokio::time::sleep(wait) => {}
                () = state.stopping.cancelled() => {}
            }
        }
    })
}

/// Claims the due inbound events as `worker` and acts on them side by side; answers how many
/// were claimed.
///
/// # Errors
/// The store fails to claim.
pub async fn act_on_due(state: &Arc<AppState>, worker: &str) -> Result<usize, StoreError> {
    let jobs = state
        .store
        .claim_jobs(worker, INBOUND_JOB, CLAIM, LEASE, state.env.now())
        .await?;
    let claimed = jobs.len();
    let mut running = tokio::task::JoinSet::new();
    for job in jobs {
        let (state, worker) = (state.clone(), worker.to_owned());
        running.spawn(async move {
            let completion = match crate::jobs::holding(&state, &job, &worker, LEASE, act(&state, &job)).await {
                Ok(()) => JobCompletion::Done,
                Err(error) => {
                    let wait = Duration::from_secs(2u64.saturating_mul(1 << job.attempts.min(8)));
                    tracing::warn!(job = job.job.id, %error, "an inbound event could not be acted on; retrying");
                    JobCompletion::Retry {
                        run_at: state.env.now() + wait,
                        error: error.to_string(),
                    }
                }
            };
            if let Err(error) = state
                .store
                .complete_job(&job.job.id, &worker, &completion, state.env.now())
                .await
            {
                tracing::warn!(job = job.job.id, %error, "an inbound event's job was not recorded");
            }
        });
    }
    while running.join_next().await.is_some() {}
    Ok(claimed)
}

/// Acts on one event and records what it did; `Err` only when the store failed (the job is
/// retried, and acting again starts nothing twice).
async fn act(state: &AppState, job: &Job) -> Result<(), StoreError> {
    let tenant = &job.job.tenant;
    let payload = &job.job.payload;
    let (Some(source_id), Some(event_id)) = (
        payload.get("source_id").and_then(Value::as_str),
        payload.get("event_id").and_then(Value::as_str),
    ) else {
        return Ok(());
    };
    let Some(event) = state.store.get_inbound_event(tenant, source_id, event_id).await? else {
        return Ok(());
    };
    if event.status != InboundStatus::Queued {
        return Ok(());
    }
    let (status, detail) = match work(state, job, &event).await? {
        Ok((status, detail)) => (status, detail),
        Err(why) => (InboundStatus::Failed, json!({"error": why})),
    };
    metrics::counter!("warrant_inbound_actions_total", "status" => status.as_str()).increment(1);
    state
        .store
        .finish_inbound(tenant, source_id, event_id, status, &detail, state.env.now())
        .await?;
    Ok(())
}

/// What acting on `event` came to: `Ok(Err(why))` when it cannot act (recorded as failed).
async fn work(
    state: &AppState,
    job: &Job,
    event: &InboundEvent,
) -> Result<Result<(InboundStatus, Value), String>, StoreError> {
    let source = match state.store.get_inbound_source(&event.source_id).await? {
        Some(s) if s.tenant == event.tenant => s,
        _ => return Ok(Err("the source no longer exists".into())),
    };
    let principal = match principal_of_key(state, &source).await? {
        Ok(p) => p,
        Err(why) => return Ok(Err(why)),
    };
    let action = match Action::parse(&source.action) {
        Ok(a) => a,
        Err(why) => return Ok(Err(format!("the source's action is unusable: {why}"))),
    };
    let scope = json!({
        "event": event.body,
        "delivery": {"id": event.event_id, "type": job.job.payload.get("type")},
    });
    let digest = event_digest(&source.id, &event.event_id);
    match action {
        Action::Workflow { name, version, input } => {
            let input = match input.resolve(&scope) {
                Ok(v) => v,
                Err(why) => return Ok(Err(why)),
            };
            let Some(workflow) = state.store.get_workflow(&event.tenant, &name, version).await? else {
                return Ok(Err(format!("no workflow {name}@{version} is published")));
            };
            // A run id derived from the event: acting twice (a job retried after a crash)
            // finds the run it started.
            let run_id = format!("run_inb{digest}");
            let bytes = input.to_string().into_bytes();
            match crate::runs::start_with_id(state, &principal, &workflow, &bytes, run_id.clone()).await {
                Ok(_) | Err(crate::runs::StartRefusal::Store(StoreError::Conflict(_))) => {
                    Ok(Ok((InboundStatus::Started, json!({"run_id": run_id}))))
                }
                Err(crate::runs::StartRefusal::Store(e)) => Err(e),
                Err(crate::runs::StartRefusal::NotRunnable(code, why)) => {
                    Ok(Ok((InboundStatus::Failed, json!({"code": code, "error": why}))))
                }
                Err(crate::runs::StartRefusal::Input(why)) => Ok(Err(why)),
                Err(crate::runs::StartRefusal::Schema(r)) => Ok(Ok((
                    InboundStatus::Failed,
                    json!({"code": r.code().as_str(), "error": r.detail()}),
                ))),
            }
        }
        Action::Call {
            tool,
            contract,
            arguments,
        } => {
            let arguments = match arguments.resolve(&scope) {
                Ok(v) => v,
                Err(why) => return Ok(Err(why)),
            };
            let proposal = json!({"tool": tool, "contract": contract, "arguments": arguments});
            let trace_id = state.env.new_id("trace");
            let call = OwnedCall {
                bytes: proposal.to_string().into_bytes().into(),
                // Derived from the event: acting twice replays the call.
                idempotency_key: Some(format!("inbound.{}.{digest}", source.id)),
                approval_id: None,
                trace_id: trace_id.clone(),
                run_id: None,
                step_id: None,
                review: false,
                review_ttl: None,
                reviewers: None,
                then: None,
                note: None,
            };
            let dispatched = submit(state.authority.clone(), state.runtime.clone(), principal, call).await?;
            Ok(Ok((InboundStatus::Done, call_detail(&dispatched, &trace_id))))
        }
    }
}

/// What a call came to, as an event's detail.
fn call_detail(dispatched: &Dispatched, trace_id: &str) -> Value {
    let ledger_id = dispatched.ledger_id();
    match dispatched {
        Dispatched::Executed(e) => match &e.result {
            Ok(Outcome::Committed(_)) => {
                json!({"ledger_id": ledger_id, "trace_id": trace_id, "outcome": "committed"})
            }
            Ok(Outcome::Failed(code)) => {
                json!({"ledger_id": ledger_id, "trace_id": trace_id, "outcome": "failed", "code": code.as_str()})
            }
            Ok(Outcome::Unknown(_)) => {
                json!({"ledger_id": ledger_id, "trace_id": trace_id, "outcome": "unknown"})
            }
            Err(r) => json!({
                "ledger_id": ledger_id, "trace_id": trace_id, "outcome": "refused",
                "code": r.code().as_str(), "error": r.detail(),
            }),
        },
        Dispatched::NeedsApproval { needed, .. } => json!({
            "ledger_id": ledger_id, "trace_id": trace_id, "outcome": "needs_approval",
            "approval_id": needed.request_id,
        }),
        Dispatched::Rejected { rejection, .. } => json!({
            "ledger_id": ledger_id, "trace_id": trace_id, "outcome": "rejected",
            "code": rejection.code().as_str(), "error": rejection.detail(),
        }),
    }
}

/// The principal of the source's API key — its grants and roles as they are now — or why it
/// cannot act (revoked, gone).
async fn principal_of_key(
    state: &AppState,
    source: &InboundSource,
) -> Result<Result<Principal, String>, StoreError> {
    let keys = state.store.list_api_keys(&source.tenant).await?;
    let Some(key) = keys.iter().find(|k| k.key.id == source.key_id) else {
        return Ok(Err(format!(
            "the source's key {} no longer exists",
            source.key_id
        )));
    };
    if key.revoked_at.is_some() {
        return Ok(Err(format!("the source's key {} is revoked", source.key_id)));
    }
    Ok(
        Principal::new(&key.key.principal, &source.tenant, key.key.grants.iter().cloned())
            .and_then(|p| p.with_roles(key.key.roles.iter().cloned()))
            .map_err(|e| e.to_string()),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn mappings_bind_the_event_typed_or_in_text() {
        let mapping = Mapping::parse(json!({
            "charge": "${event.data.object.id}",
            "amount": "${event.data.object.amount}",
            "first": "${event.data.items.0}",
            "note": "Refund of ${event.data.object.id} (${delivery.type}), $${literal}",
            "fixed": 3,
        }))
        .unwrap();
        let scope = json!({
            "event": {"data": {"object": {"id": "ch_1", "amount": 1200}, "items": ["a", "b"]}},
            "delivery": {"id": "evt_1", "type": "charge.refunded"},
        });
        assert_eq!(
            mapping.resolve(&scope).unwrap(),
            json!({
                "charge": "ch_1",
                "amount": 1200,
                "first": "a",
                "note": "Refund of ch_1 (charge.refunded), ${literal}",
                "fixed": 3,
            })
        );
        let missing = Mapping::parse(json!({"x": "${event.data.nothing}"})).unwrap();
        assert_eq!(
            missing.resolve(&scope).unwrap_err(),
            "the event has no `event.data.nothing`"
        );
    }

    #[test]
    fn mappings_and_actions_are_read_strictly() {
        for bad in [
            json!({"x": "${input.a}"}),
            json!({"x": "${steps.a.output}"}),
            json!({"x": "${delivery.body}"}),
            json!({"x": "${event.a"}),
        ] {
            assert!(Mapping::parse(bad.clone()).is_err(), "{bad}");
        }
        assert!(Action::parse(&json!({"workflow": "refund", "input": {}})).is_err());
        assert!(Action::parse(&json!({"workflow": "refund@1", "inputs": {}})).is_err());
        assert!(Action::parse(&json!({"tool": "refund@1"})).is_err());
        assert!(Action::parse(&json!({"neither": 1})).is_err());
        let workflow = Action::parse(&json!({"workflow": "refund@2"})).unwrap();
        assert_eq!(
            workflow,
            Action::Workflow {
                name: "refund".into(),
                version: 2,
                input: Mapping(json!("${event}")),
            }
        );
        assert_eq!(Action::parse(&workflow.to_value()).unwrap(), workflow);
    }
}
