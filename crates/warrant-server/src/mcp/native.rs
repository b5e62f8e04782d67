//! Native approvals over MCP (protocol revision 2026-07-28): a call held for review answers what
//! the client can take, decided per request from its protocol version and declared
//! capabilities ([`Native`]):
//!
//! - **Tasks extension declared:** a durable task ([`TaskRecord`]) is stored before its id is
//!   returned. `tasks/get` answers `input_required` (a URL-mode elicitation pointing at the
//!   console page) while the reviewer decides; once approved it runs the call through the
//!   pipeline, as the proposer, with the approval and the key it is bound to, and completes with
//!   the tool result; it fails with the typed refusal on reject or expiry. `tasks/cancel`
//!   withdraws the pending approval. Any node answers: everything is in the store.
//! - **2026-07-28 with URL elicitation:** an input-required result (MRTR) with a URL-mode
//!   elicitation to the console page and a `requestState` sealed with HMAC-SHA256 under a key
//!   derived from the server's secret ([`State`]: tenant, principal, tool, contract id, payload
//!   digest, approval id, key, expiry and a one-time id). The retry is checked against it and
//!   against the stored approval; each `requestState` is spent once, in the store; a tampered,
//!   expired, replayed or foreign one is a typed refusal.
//! - **Anyone else:** the tool error naming the approval and its console link (`tools::answer`).
//!
//! The client's `inputResponses` are untrusted and carry no authority: `accept` only says the
//! user went to the page. Only the stored approval decides.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask, ElicitRequest, ElicitRequestParams,
    GetTaskResult, InputRequest, InputRequests, InputRequiredResult, RequestStateCodec, Task, TaskPayload,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use time::OffsetDateTime;
use warrant_core::authority::Principal;
use warrant_core::decision::ApprovalNeeded;
use warrant_core::records::{ApprovalRequest, ApprovalStatus, TaskRecord, TaskStatus, Verdict};
use warrant_runtime::{Dispatched, OwnedCall, submit};

use crate::routes::rfc3339;
use crate::state::AppState;

/// The store scope of spent `requestState` ids.
const SPENT_SCOPE: &str = "mcp-request-state";
/// The version of the sealed state's layout.
const STATE_VERSION: u8 = 1;
/// The key of the approval's URL elicitation in `inputRequests`.
const APPROVAL_REQUEST: &str = "approval";
/// How long a task outlives its approval's expiry (its result stays readable that long).
const TASK_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How often a client should poll a task.
const POLL_INTERVAL_MS: u64 = 2_000;
/// The reviewer recorded when an agent withdraws its call by cancelling its task.
const CANCELLED_BY: &str = "warrant:task-cancelled";

/// What the client of one request can take for a call held for review.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Native {
    /// The client declared the tasks extension.
    pub(crate) tasks: bool,
    /// The request negotiated 2026-07-28 or newer and the client declared URL elicitation.
    pub(crate) input_required: bool,
}

impl Native {
    /// Whether a call held for review is answered natively (a task or an input-required
    /// result) rather than with the tool error.
    pub(crate) fn takes_held(self) -> bool {
        self.tasks || self.input_required
    }

    /// From the request's negotiated version and the capabilities its client declared.
    pub(crate) fn of(context: &RequestContext<RoleServer>) -> Self {
        let capabilities = context.client_capabilities();
        let modern = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str());
        Native {
            tasks: capabilities.as_ref().is_some_and(|c| c.supports_tasks()),
            input_required: modern
                && capabilities
                    .as_ref()
                    .and_then(|c| c.elicitation.as_ref())
                    .is_some_and(|e| e.url.is_some()),
        }
    }
}

/// The sealer of `requestState`s: HMAC-SHA256 (the SDK's `RequestStateCodec`, constant-time
/// verification) under a key derived from the server's secret, so every node opens what any
/// node sealed.
#[derive(Clone)]
pub struct Sealer(RequestStateCodec);

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A sealer keyed by `key` (32 bytes derived from the server's secret).
    pub fn new(key: [u8; 32]) -> Self {
        // A keyring of one 32-byte key under a short id is always valid; the fallback (the
        // same key, unnamed) is never taken.
        let codec = RequestStateCodec::new_with_keyring("w1", [("w1", key.to_vec())])
            .unwrap_or_else(|_| RequestStateCodec::new_unchecked(key.to_vec()));
        Sealer(codec)
    }
}

/// What a `requestState` binds: sealed, so the client can read it but not change it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct State {
    v: u8,
    /// One-time id, spent in the store when the state is presented.
    jti: String,
    tenant: String,
    principal: String,
    tool: String,
    contract_id: String,
    payload_digest: String,
    approval_id: String,
    idempotency_key: Option<String>,
    /// Unix seconds; the approval's expiry.
    expires_at: i64,
}

/// A refused `requestState`, each with its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateRefusal {
    Invalid,
    Expired,
    Foreign,
    Replayed,
}

impl StateRefusal {
    fn code(self) -> &'static str {
        match self {
            StateRefusal::Invalid => "REQUEST_STATE_INVALID",
            StateRefusal::Expired => "REQUEST_STATE_EXPIRED",
            StateRefusal::Foreign => "REQUEST_STATE_FOREIGN",
            StateRefusal::Replayed => "REQUEST_STATE_REPLAYED",
        }
    }

    fn message(self) -> &'static str {
        match self {
            StateRefusal::Invalid => "the requestState is not one this server issued, or was altered",
            StateRefusal::Expired => "the requestState has expired with its approval",
            StateRefusal::Foreign => "the requestState was issued to another principal, tenant or tool",
            StateRefusal::Replayed => {
                "the requestState was already presented; each is used once (retry with the newest one, or call again with `_meta.approval_id`)"
            }
        }
    }
}

/// The URL of an approval's console page.
pub(crate) fn review_url(state: &AppState, approval_id: &str) -> String {
    format!(
        "{}/console/approvals/{approval_id}",
        state.public_url.trim_end_matches('/')
    )
}

/// The URL-mode elicitation that sends the user to the approval's console page.
fn elicitation(state: &AppState, tool: &str, approval_id: &str) -> InputRequests {
    let url = review_url(state, approval_id);
    let message = format!(
        "This call of `{tool}` needs a human approval before it runs (approval {approval_id}). \
         A reviewer decides at {url}; the call continues once it is approved."
    );
    let mut requests = InputRequests::new();
    requests.insert(
        APPROVAL_REQUEST.to_owned(),
        InputRequest::Elicitation(ElicitRequest::new(ElicitRequestParams::UrlElicitationParams {
            meta: None,
            message,
            url,
            elicitation_id: approval_id.to_owned(),
        })),
    );
    requests
}

/// A pending approval request, as a held call's answer names it.
struct Pending {
    id: String,
    contract_id: String,
    payload_digest: String,
    idempotency_key: Option<String>,
    expires_at: OffsetDateTime,
}

impl Pending {
    fn of_needed(needed: &ApprovalNeeded) -> Option<Self> {
        Some(Pending {
            id: needed.request_id.clone()?,
            contract_id: needed.contract_id.to_string(),
            payload_digest: needed.payload_digest.to_string(),
            idempotency_key: needed.idempotency_key.clone(),
            expires_at: needed.expires_at?,
        })
    }

    fn of_request(approval: &ApprovalRequest) -> Self {
        let request = &approval.request;
        Pending {
            id: request.id.clone(),
            contract_id: request.contract_id.clone(),
            payload_digest: request.payload_digest.clone(),
            idempotency_key: request.idempotency_key.clone(),
            expires_at: request.expires_at,
        }
    }
}

/// A call whose answer is "held for review", in the form the client takes: a task, an
/// input-required result, or `None` for the tool error older clients get.
pub(crate) async fn held(
    state: &Arc<AppState>,
    native: Native,
    principal: &Principal,
    tool: &str,
    call: &OwnedCall,
    needed: &ApprovalNeeded,
    sensitive: bool,
) -> Option<CallToolResponse> {
    if !native.takes_held() {
        return None;
    }
    // A call without an idempotency key cannot be answered from its record once its approval
    // is consumed (by a decision that ran it, or a concurrent poll): the tool error, whose
    // retry is the agent's own.
    needed.idempotency_key.as_ref()?;
    let pending = Pending::of_needed(needed)?;
    // A task stores the call to run it later: sealed when the contract has a sensitive field
    // (a sensitive value is never stored in clear).
    if native.tasks {
        return create_task(state, principal, tool, call, &pending, sensitive)
            .await
            .map(CallToolResponse::Task);
    }
    input_required(state, principal, tool, &pending).map(CallToolResponse::InputRequired)
}

/// An input-required result for the pending approval `request`, with a fresh sealed state.
fn input_required(
    state: &AppState,
    principal: &Principal,
    tool: &str,
    request: &Pending,
) -> Option<InputRequiredResult> {
    let now = state.env.now();
    let sealed = State {
        v: STATE_VERSION,
        jti: hex::encode(rand::random::<[u8; 16]>()),
        tenant: principal.tenant().to_owned(),
        principal: principal.id().to_owned(),
        tool: tool.to_owned(),
        contract_id: request.contract_id.clone(),
        payload_digest: request.payload_digest.clone(),
        approval_id: request.id.clone(),
        idempotency_key: request.idempotency_key.clone(),
        expires_at: request.expires_at.unix_timestamp(),
    };
    let ttl = Duration::try_from(request.expires_at - now).unwrap_or(Duration::from_secs(1));
    let options = rmcp::model::SealOptions::new().ttl(ttl);
    match state.mcp_sealer.0.seal_json_with(&sealed, &options) {
        Ok(text) => Some(InputRequiredResult::new(
            Some(elicitation(state, tool, &request.id)),
            Some(text),
        )),
        Err(error) => {
            tracing::error!(%error, "mcp: cannot seal a requestState");
            None
        }
    }
}

/// The retry of a call with its `requestState`: the state is opened (integrity, expiry),
/// checked against the caller and the tool, spent once in the store; a still pending approval
/// answers a fresh input-required result; otherwise the call the client sent again runs
/// through `submit` with the approval and key the state binds (the pipeline binds them to the
/// resent arguments' digest).
pub(crate) async fn resume(
    state: &Arc<AppState>,
    principal: Principal,
    trace: String,
    tool: &str,
    bytes: Vec<u8>,
    sealed: &str,
) -> CallToolResponse {
    let refused = |why: StateRefusal| {
        metrics::counter!("warrant_mcp_request_state_refused_total", "code" => why.code()).increment(1);
        CallToolResponse::Complete(super::tools::refusal(
            "approval",
            why.code(),
            why.message(),
            Some("/requestState"),
            json!({"decision": "reject", "trace_id": trace}),
        ))
    };
    let now = state.env.now();
    let opened = match open(&state.mcp_sealer, sealed, &principal, tool, now) {
        Ok(opened) => opened,
        Err(why) => return refused(why),
    };
    let until = OffsetDateTime::from_unix_timestamp(opened.expires_at).unwrap_or(now);
    // Read before the state is spent: a store failure here leaves the state usable.
    let approval = match state
        .store
        .get_approval(principal.tenant(), &opened.approval_id, now)
        .await
    {
        Ok(approval) => approval,
        Err(e) => return CallToolResponse::Complete(super::tools::store_failed(&e, &trace)),
    };
    match state
        .store
        .spend_token(SPENT_SCOPE, principal.tenant(), &opened.jti, until)
        .await
    {
        Ok(true) => {}
        Ok(false) => return refused(StateRefusal::Replayed),
        Err(e) => return CallToolResponse::Complete(super::tools::store_failed(&e, &trace)),
    }
    match approval {
        Some(a) if a.status == ApprovalStatus::Pending => {
            if let Some(again) = input_required(state, &principal, tool, &Pending::of_request(&a)) {
                return CallToolResponse::InputRequired(again);
            }
        }
        // Approved with edits: the edited call answers (run now, or replayed when it ran on
        // the decision).
        Some(a) if a.status == ApprovalStatus::Rejected && a.superseded_by.is_some() => {
            return match edited(state, &a, &trace).await {
                Ok(Some((_, result))) => CallToolResponse::Complete(result),
                Ok(None) => match input_required(state, &principal, tool, &Pending::of_request(&a)) {
                    Some(again) => CallToolResponse::InputRequired(again),
                    None => CallToolResponse::Complete(super::tools::internal(
                        &"no input-required result",
                        &trace,
                    )),
                },
                Err(e) => CallToolResponse::Complete(super::tools::store_failed(&e, &trace)),
            };
        }
        _ => {}
    }
    let call = OwnedCall {
        bytes: bytes.into(),
        idempotency_key: opened.idempotency_key,
        approval_id: Some(opened.approval_id),
        trace_id: trace.clone(),
        ..OwnedCall::default()
    };
    match submit(state.authority.clone(), state.runtime.clone(), principal, call).await {
        Ok(dispatched) => CallToolResponse::Complete(super::tools::answer(state, tool, dispatched, &trace)),
        Err(e) => CallToolResponse::Complete(super::tools::store_failed(&e, &trace)),
    }
}

/// The answer for a request a reviewer approved with edits (`original.superseded_by`): the
/// edited call, run through the pipeline with its approval as the proposer (or replayed when it
/// already ran on the decision), as a tool result naming both approvals; `Ok(None)` while the
/// edited request is not yet approved. A settled flag says whether the result is final.
async fn edited(
    state: &AppState,
    original: &ApprovalRequest,
    trace: &str,
) -> Result<Option<(bool, CallToolResult)>, warrant_core::store::StoreError> {
    let Some(by) = original.superseded_by.as_deref() else {
        return Ok(None);
    };
    let Some(successor) = state
        .store
        .get_approval(&original.request.tenant, by, state.env.now())
        .await?
    else {
        return Ok(None);
    };
    if successor.status == ApprovalStatus::Pending {
        return Ok(None);
    }
    let Some(dispatched) = crate::review::execute_approved(state, &successor, Some(trace.to_owned())).await?
    else {
        return Ok(Some((
            true,
            super::tools::refusal(
                "approval",
                "PROPOSER_WITHOUT_KEY",
                "the edited call cannot run: its proposer holds no live key",
                None,
                json!({"trace_id": trace}),
            ),
        )));
    };
    let settled = settled(&dispatched);
    let mut result = super::tools::answer(state, &successor.request.tool, dispatched, trace);
    let meta = result.meta.get_or_insert_with(Default::default);
    meta.0.insert(
        "io.warrant/edited".into(),
        json!({
            "original_approval_id": original.request.id,
            "original_payload_digest": original.request.payload_digest,
            "approval_id": successor.request.id,
            "payload_digest": successor.request.payload_digest,
            "arguments": successor.request.arguments,
            "reviewer": successor.reviewer,
        }),
    );
    Ok(Some((settled, result)))
}

/// Opens a presented `requestState`: sealed by this server (any node), unaltered, of this
/// layout, issued to this tenant, principal and tool, and not past its approval's expiry.
fn open(
    sealer: &Sealer,
    sealed: &str,
    principal: &Principal,
    tool: &str,
    now: OffsetDateTime,
) -> Result<State, StateRefusal> {
    let opened: State = match sealer.0.open_json_with(sealed, b"") {
        Ok(s) => s,
        Err(rmcp::model::RequestStateError::Expired) => return Err(StateRefusal::Expired),
        Err(_) => return Err(StateRefusal::Invalid),
    };
    if opened.v != STATE_VERSION {
        return Err(StateRefusal::Invalid);
    }
    if opened.tenant != principal.tenant() || opened.principal != principal.id() || opened.tool != tool {
        return Err(StateRefusal::Foreign);
    }
    if opened.expires_at <= now.unix_timestamp() {
        return Err(StateRefusal::Expired);
    }
    Ok(opened)
}

/// What a task stores to run its call once approved.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskCall {
    tool: String,
    /// The proposal as the agent sent it (its own bytes), as text; sealed to the task
    /// (`crate::webhooks::SecretBox`, bound to its tenant and id) when `sealed`.
    proposal: String,
    /// Whether `proposal` is sealed (a contract with a sensitive field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    sealed: bool,
    idempotency_key: Option<String>,
    trace_id: String,
}

/// Stores a task for the held call and answers it; `None` (the tool error instead) when the
/// store refuses, since a task id must never be returned before the task is durable.
async fn create_task(
    state: &AppState,
    principal: &Principal,
    tool: &str,
    call: &OwnedCall,
    approval: &Pending,
    sensitive: bool,
) -> Option<CreateTaskResult> {
    let now = state.env.now();
    let id = format!("task_{}", hex::encode(rand::random::<[u8; 16]>()));
    let proposal = if sensitive {
        warrant_core::seal::ArgumentSeal::seal(
            &state.argument_seal,
            &call.bytes,
            &task_aad(principal.tenant(), &id),
        )
    } else {
        String::from_utf8(call.bytes.to_vec()).ok()?
    };
    let stored = TaskCall {
        tool: tool.to_owned(),
        proposal,
        sealed: sensitive,
        idempotency_key: approval.idempotency_key.clone(),
        trace_id: call.trace_id.clone(),
    };
    let record = TaskRecord {
        id,
        tenant: principal.tenant().to_owned(),
        principal: principal.id().to_owned(),
        approval_id: approval.id.clone(),
        call: serde_json::to_value(&stored).ok()?,
        status: TaskStatus::Working,
        result: None,
        created_at: now,
        updated_at: now,
        expires_at: approval.expires_at + TASK_RETENTION,
    };
    if let Err(error) = state.store.create_task(&record).await {
        tracing::warn!(%error, "mcp: cannot store a task; answering the tool error instead");
        return None;
    }
    metrics::counter!("warrant_mcp_tasks_created_total").increment(1);
    let task = task_of(&record, rmcp::model::TaskStatus::InputRequired, now);
    Some(CreateTaskResult::new(task))
}

/// What a task's sealed call is bound to: its tenant and id.
fn task_aad(tenant: &str, task_id: &str) -> String {
    format!("task-call:{tenant}:{task_id}")
}

/// The wire task of `record` with `status`.
fn task_of(record: &TaskRecord, status: rmcp::model::TaskStatus, now: OffsetDateTime) -> Task {
    let ttl = (record.expires_at - now).whole_milliseconds().max(0);
    let mut task = Task::new(
        record.id.clone(),
        status,
        rfc3339(record.created_at),
        rfc3339(record.updated_at),
    )
    .with_ttl_ms(u64::try_from(ttl).unwrap_or(0));
    if !status.is_terminal() {
        task = task.with_poll_interval_ms(POLL_INTERVAL_MS);
    }
    task
}

/// The caller's task `id`, or the `-32602` the specification asks for an unknown task (another
/// principal's task is unknown to this one).
async fn own_task(state: &AppState, principal: &Principal, id: &str) -> Result<TaskRecord, ErrorData> {
    match state
        .store
        .get_task(principal.tenant(), id, state.env.now())
        .await
    {
        Ok(Some(task)) if task.principal == principal.id() => Ok(task),
        Ok(_) => Err(ErrorData::invalid_params(format!("unknown task `{id}`"), None)),
        Err(e) => Err(super::internal_error(&e)),
    }
}

/// `tasks/get`: the task as it stands, moved on first when its approval was decided (running
/// the approved call, or failing with the refusal).
pub(crate) async fn get_task(
    state: &Arc<AppState>,
    principal: &Principal,
    id: &str,
) -> Result<GetTaskResult, ErrorData> {
    let mut task = own_task(state, principal, id).await?;
    if task.status == TaskStatus::Working {
        advance(state, principal, &mut task).await?;
    }
    let now = state.env.now();
    let payload = match (task.status, &task.result) {
        (TaskStatus::Completed, Some(Value::Object(result))) => TaskPayload::Completed {
            result: result.clone(),
        },
        (TaskStatus::Failed, Some(Value::Object(error))) => TaskPayload::Failed { error: error.clone() },
        (TaskStatus::Cancelled, _) => TaskPayload::Cancelled,
        (TaskStatus::Working, _) => match pending_tool(state, principal, &task).await? {
            Some(tool) => TaskPayload::InputRequired {
                input_requests: elicitation(state, &tool, &task.approval_id),
            },
            None => TaskPayload::Working,
        },
        _ => return Err(super::internal_error(&"a task ended without its result")),
    };
    let status = match payload {
        TaskPayload::Completed { .. } => rmcp::model::TaskStatus::Completed,
        TaskPayload::Failed { .. } => rmcp::model::TaskStatus::Failed,
        TaskPayload::Cancelled => rmcp::model::TaskStatus::Cancelled,
        TaskPayload::InputRequired { .. } => rmcp::model::TaskStatus::InputRequired,
        _ => rmcp::model::TaskStatus::Working,
    };
    Ok(GetTaskResult::new(DetailedTask::new(
        task_of(&task, status, now),
        payload,
    )))
}

/// The tool of a working task whose approval is still pending (it asks for input).
async fn pending_tool(
    state: &AppState,
    principal: &Principal,
    task: &TaskRecord,
) -> Result<Option<String>, ErrorData> {
    let approval = state
        .store
        .get_approval(principal.tenant(), &task.approval_id, state.env.now())
        .await
        .map_err(|e| super::internal_error(&e))?;
    if approval.is_none_or(|a| a.status != ApprovalStatus::Pending) {
        return Ok(None);
    }
    Ok(serde_json::from_value::<TaskCall>(task.call.clone())
        .ok()
        .map(|c| c.tool))
}

/// Moves a working task on from its approval's state: approved (or consumed: executed on the
/// decision) → the call runs (or replays) and the task completes with its result; rejected or
/// expired → the task fails with the typed refusal. A result that is not final yet (another
/// poll's execution in flight, an outcome being reconciled) leaves the task working.
async fn advance(
    state: &Arc<AppState>,
    principal: &Principal,
    task: &mut TaskRecord,
) -> Result<(), ErrorData> {
    let now = state.env.now();
    let approval = state
        .store
        .get_approval(principal.tenant(), &task.approval_id, now)
        .await
        .map_err(|e| super::internal_error(&e))?;
    let ended = match approval.as_ref().map(|a| a.status) {
        Some(ApprovalStatus::Pending) => return Ok(()),
        Some(ApprovalStatus::Approved | ApprovalStatus::Consumed) => {
            let call: TaskCall =
                serde_json::from_value(task.call.clone()).map_err(|e| super::internal_error(&e))?;
            let bytes = if call.sealed {
                // The trait's `open` (the box's own opens a signing key).
                warrant_core::seal::ArgumentSeal::open(
                    &state.argument_seal,
                    &call.proposal,
                    &task_aad(&task.tenant, &task.id),
                )
                .ok_or_else(|| super::internal_error(&"a task's sealed call does not open"))?
            } else {
                call.proposal.into_bytes()
            };
            let owned = OwnedCall {
                bytes: bytes.into(),
                idempotency_key: call.idempotency_key,
                approval_id: Some(task.approval_id.clone()),
                trace_id: call.trace_id.clone(),
                ..OwnedCall::default()
            };
            let dispatched = submit(
                state.authority.clone(),
                state.runtime.clone(),
                principal.clone(),
                owned,
            )
            .await
            .map_err(|e| super::internal_error(&e))?;
            if !settled(&dispatched) {
                return Ok(());
            }
            let result = super::tools::answer(state, &call.tool, dispatched, &call.trace_id);
            (TaskStatus::Completed, tool_result_json(&result)?)
        }
        Some(ApprovalStatus::Rejected) if approval.as_ref().is_some_and(|a| a.superseded_by.is_some()) => {
            let original = approval
                .as_ref()
                .ok_or_else(|| super::internal_error(&"no approval"))?;
            let call: TaskCall =
                serde_json::from_value(task.call.clone()).map_err(|e| super::internal_error(&e))?;
            match edited(state, original, &call.trace_id)
                .await
                .map_err(|e| super::internal_error(&e))?
            {
                Some((true, result)) => (TaskStatus::Completed, tool_result_json(&result)?),
                _ => return Ok(()),
            }
        }
        Some(ApprovalStatus::Rejected) => {
            let reason = approval
                .as_ref()
                .and_then(|a| a.reason.clone())
                .unwrap_or_default();
            failure(
                task,
                "APPROVAL_REJECTED",
                &format!("a reviewer rejected this call: {reason}"),
            )
        }
        Some(ApprovalStatus::Expired) => failure(
            task,
            "APPROVAL_EXPIRED",
            "the approval request expired before a reviewer decided",
        ),
        None => failure(
            task,
            "APPROVAL_NOT_FOUND",
            "the approval request no longer exists",
        ),
    };
    let (status, result) = ended;
    match state
        .store
        .end_task(principal.tenant(), &task.id, status, &result, now)
        .await
    {
        // Ended here, or by a concurrent poll: read what the store holds.
        Ok(_) => {
            if let Some(stored) = state
                .store
                .get_task(principal.tenant(), &task.id, now)
                .await
                .map_err(|e| super::internal_error(&e))?
            {
                *task = stored;
            }
            Ok(())
        }
        Err(e) => Err(super::internal_error(&e)),
    }
}

/// Whether a dispatched call's answer is final for its task: not a refusal because another
/// attempt of the same operation is in flight, nor an outcome still being reconciled.
fn settled(dispatched: &Dispatched) -> bool {
    use warrant_core::decision::Outcome;
    match dispatched {
        Dispatched::Executed(e) => match &e.result {
            Err(rejection) => rejection.code() != warrant_core::RejectCode::IdempotencyInFlight,
            Ok(Outcome::Unknown(_)) => false,
            Ok(_) => true,
        },
        Dispatched::NeedsApproval { .. } => false,
        Dispatched::Rejected { .. } => true,
    }
}

/// A task's failure: the JSON-RPC error object `tasks/get` carries, with the typed refusal in
/// its data.
fn failure(task: &TaskRecord, code: &str, message: &str) -> (TaskStatus, Value) {
    (
        TaskStatus::Failed,
        json!({
            "code": -32003,
            "message": message,
            "data": {"stage": "approval", "code": code, "approval_id": task.approval_id},
        }),
    )
}

fn tool_result_json(result: &CallToolResult) -> Result<Value, ErrorData> {
    serde_json::to_value(result).map_err(|e| super::internal_error(&e))
}

/// `tasks/cancel`: withdraws the task's pending approval first (rejected as
/// `warrant:task-cancelled`, atomically, so no reviewer can run a call its agent gave up on),
/// then ends the task as cancelled. A task whose approval was already decided — approved (its
/// call runs, or ran: poll for the result), rejected or expired — or that has ended is refused
/// with `-32602`.
pub(crate) async fn cancel_task(state: &AppState, principal: &Principal, id: &str) -> Result<(), ErrorData> {
    let task = own_task(state, principal, id).await?;
    if task.status.is_terminal() {
        return Err(ErrorData::invalid_params(
            format!("task `{id}` has already ended"),
            None,
        ));
    }
    let now = state.env.now();
    let withdrawn = state
        .store
        .decide_approval(
            principal.tenant(),
            &task.approval_id,
            CANCELLED_BY,
            Verdict::Reject,
            Some("withdrawn: the proposer cancelled its task"),
            now,
        )
        .await
        .map_err(|e| super::internal_error(&e))?;
    if let Err(refusal) = withdrawn {
        return Err(ErrorData::invalid_params(
            format!(
                "task `{id}` cannot be cancelled: its approval was already decided ({refusal:?}); poll it for its end"
            ),
            None,
        ));
    }
    // Withdrawn: the call can no longer run. A concurrent poll may have ended the task as
    // failed (the rejection) first; either way it ended without running.
    state
        .store
        .end_task(principal.tenant(), id, TaskStatus::Cancelled, &json!({}), now)
        .await
        .map_err(|e| super::internal_error(&e))?;
    Ok(())
}

/// `tasks/update`: the client's answers to a task's input requests. They carry no authority
/// (only the stored approval decides), so they are acknowledged once the task is known.
pub(crate) async fn update_task(state: &AppState, principal: &Principal, id: &str) -> Result<(), ErrorData> {
    own_task(state, principal, id).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn state(expires_at: i64) -> State {
        State {
            v: STATE_VERSION,
            jti: "j1".into(),
            tenant: "acme".into(),
            principal: "agent".into(),
            tool: "credit".into(),
            contract_id: "tool-contract@sha256:00".into(),
            payload_digest: "sha256:00".into(),
            approval_id: "apr_1".into(),
            idempotency_key: Some("k".into()),
            expires_at,
        }
    }

    fn seal(sealer: &Sealer, s: &State) -> String {
        let options = rmcp::model::SealOptions::new().ttl(Duration::from_secs(60));
        sealer.0.seal_json_with(s, &options).unwrap()
    }

    /// Only a state this server sealed, unaltered, for this caller and tool, before its
    /// approval's expiry opens; each other case is refused with its own code.
    #[test]
    fn a_request_state_opens_only_for_its_caller_before_it_expires() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let sealer = Sealer::new([7; 32]);
        let agent = Principal::new("agent", "acme", Vec::new()).unwrap();
        let valid = seal(&sealer, &state(now.unix_timestamp() + 60));
        assert_eq!(
            open(&sealer, &valid, &agent, "credit", now),
            Ok(state(now.unix_timestamp() + 60))
        );

        let other_server = Sealer::new([8; 32]);
        assert_eq!(
            open(&other_server, &valid, &agent, "credit", now),
            Err(StateRefusal::Invalid)
        );
        for garbage in ["", "rs2.x.y.z", "not a state", &valid[..valid.len() - 2]] {
            assert_eq!(
                open(&sealer, garbage, &agent, "credit", now),
                Err(StateRefusal::Invalid)
            );
        }
        let mut flipped = valid.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(
            open(&sealer, &flipped, &agent, "credit", now),
            Err(StateRefusal::Invalid)
        );

        let stranger = Principal::new("agent", "globex", Vec::new()).unwrap();
        assert_eq!(
            open(&sealer, &valid, &stranger, "credit", now),
            Err(StateRefusal::Foreign)
        );
        let colleague = Principal::new("agent-2", "acme", Vec::new()).unwrap();
        assert_eq!(
            open(&sealer, &valid, &colleague, "credit", now),
            Err(StateRefusal::Foreign)
        );
        assert_eq!(
            open(&sealer, &valid, &agent, "refund", now),
            Err(StateRefusal::Foreign)
        );

        let lapsed = seal(&sealer, &state(now.unix_timestamp()));
        assert_eq!(
            open(&sealer, &lapsed, &agent, "credit", now),
            Err(StateRefusal::Expired)
        );
        let mut old = state(now.unix_timestamp() + 60);
        old.v = 0;
        assert_eq!(
            open(&sealer, &seal(&sealer, &old), &agent, "credit", now),
            Err(StateRefusal::Invalid)
        );
    }
}
