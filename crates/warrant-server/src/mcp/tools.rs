//! `tools/list` and `tools/call`: live contracts as MCP tools, and a dispatched proposal as a
//! tool result. Every refusal is a tool result marked as an error with its stage and code —
//! never a JSON-RPC error, which agents would retry blindly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, JsonObject, MetaObject, Tool, ToolAnnotations,
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use warrant_core::Contract;
use warrant_core::Rejection;
use warrant_core::authority::Principal;
use warrant_core::canon::canonical_bytes_of_map;
use warrant_core::contract::{ApprovalMode, Effect};
use warrant_core::decision::Outcome;
use warrant_core::json::{self, Limits};
use warrant_core::proposal::Envelope;
use warrant_core::store::StoreError;
use warrant_runtime::{Dispatched, OwnedCall, submit};

use super::native::Native;
use super::raw::RawCall;
use crate::routes::rfc3339;
use crate::state::AppState;
use warrant_core::records::StoredContract;

/// The window a derived idempotency key is stable in: identical calls by one principal within
/// one window are one operation (the second answers the first's stored result).
pub const DERIVED_KEY_WINDOW: Duration = Duration::from_secs(600);

/// `_meta` fields carrying the caller's idempotency key, in order of preference.
const KEY_FIELDS: [&str; 2] = ["io.warrant/idempotency_key", "idempotency_key"];
/// `_meta` fields carrying an approval id.
const APPROVAL_FIELDS: [&str; 2] = ["io.warrant/approval_id", "approval_id"];

/// The registered contracts as tools, per namespace: the newest live version of each name,
/// and the newest version of any state (so a call to a retired tool is refused as retired,
/// with a ledger row). A caller sees its tenant's own tools and the platform's; its own win
/// for a name both have, as a call resolves them.
#[derive(Debug, Default)]
pub(crate) struct Index {
    platform: Space,
    /// Ordered, not hashed: a call's lookup compares its tenant with a few names rather than
    /// hashing it with SipHash.
    tenants: BTreeMap<String, Space>,
}

/// The tools of one namespace.
#[derive(Debug, Default)]
struct Space {
    live: BTreeMap<String, Arc<Contract>>,
    newest: BTreeMap<String, u32>,
}

impl Index {
    /// The index of the stored contracts `stored`, compiled as `compiled` (the same order, as
    /// [`warrant_core::registry::Registry::load`] answers them), at `now`.
    pub(crate) fn of(stored: &[StoredContract], compiled: &[Arc<Contract>], now: OffsetDateTime) -> Self {
        let mut index = Index::default();
        for (s, contract) in stored.iter().zip(compiled) {
            let space = match s.namespace.tenant() {
                None => &mut index.platform,
                Some(t) => index.tenants.entry(t.to_owned()).or_default(),
            };
            let newest = space.newest.entry(s.name.clone()).or_insert(s.version);
            *newest = (*newest).max(s.version);
            if s.retired_at.is_some_and(|at| at <= now) {
                continue;
            }
            if space
                .live
                .get(&s.name)
                .is_none_or(|live| live.version() < s.version)
            {
                space.live.insert(s.name.clone(), contract.clone());
            }
        }
        index
    }

    /// The spaces a caller of `tenant` sees, its own first.
    fn spaces(&self, tenant: &str) -> impl Iterator<Item = &Space> {
        self.tenants.get(tenant).into_iter().chain([&self.platform])
    }

    /// The version a call to `name` by a caller of `tenant` pins, and the contract if it is live.
    fn resolve(&self, tenant: &str, name: &str) -> (u32, Option<&Arc<Contract>>) {
        for space in self.spaces(tenant) {
            if let Some(c) = space.live.get(name) {
                return (c.version(), Some(c));
            }
            if let Some(v) = space.newest.get(name) {
                return (*v, None);
            }
        }
        (1, None)
    }
}

/// The tools `principal` may invoke: live contracts of its tenant and of the platform whose
/// scopes its grants cover (a tenant's own tool hides a platform tool of the same name).
pub(crate) fn visible(index: &Index, principal: &Principal) -> Vec<Tool> {
    let mut seen = std::collections::BTreeSet::new();
    index
        .spaces(principal.tenant())
        .flat_map(|space| space.live.values())
        .filter(|c| seen.insert(c.name().to_owned()))
        .filter(|c| c.scopes().is_subset(principal.grants()))
        .map(|c| tool(c))
        .collect()
}

/// One contract as an MCP tool. The input schema is the contract's as authored (its
/// `x-warrant-*` keywords are annotations clients ignore). No `outputSchema`: error results
/// carry their own structured content, which a client validating against the contract's
/// output schema would refuse.
fn tool(contract: &Contract) -> Tool {
    let schema = match contract.input_document() {
        Some(Value::Object(map)) => map.clone(),
        _ => {
            let mut map = JsonObject::new();
            map.insert("type".into(), json!("object"));
            map
        }
    };
    let mut description = contract.description().to_owned();
    if contract.approval() == ApprovalMode::PerCall {
        description.push_str(
            " Each call needs a human approval: the first call answers with an approval id; once a \
             reviewer approves, call again with the same arguments and `_meta.approval_id`.",
        );
    }
    let mut tool = Tool::new_with_raw(
        contract.name().to_owned(),
        Some(description.into()),
        Arc::new(schema),
    );
    tool.annotations = Some(annotations(
        contract.effect(),
        contract.idempotency().is_some_and(|i| i.honoured),
    ));
    let mut meta = JsonObject::new();
    meta.insert("io.warrant/contract_id".into(), json!(contract.id_str()));
    meta.insert("io.warrant/version".into(), json!(contract.version()));
    meta.insert("io.warrant/effect".into(), json!(contract.effect().as_str()));
    meta.insert("io.warrant/approval".into(), json!(contract.approval().as_str()));
    tool.meta = Some(MetaObject(meta));
    tool
}

/// MCP hints from the effect class: `read` is read-only; `write` is not destructive;
/// `irreversible` is; both are idempotent when the tool honours idempotency keys; `async`
/// says only that it is not read-only.
pub(crate) fn annotations(effect: Effect, honoured: bool) -> ToolAnnotations {
    match effect {
        Effect::Read => ToolAnnotations::new().read_only(true),
        Effect::Write => ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(honoured),
        Effect::Irreversible => ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(honoured),
        Effect::Async => ToolAnnotations::new().read_only(false),
    }
}

/// The idempotency key derived for a call whose client sent none (PRODUCT §5):
/// `mcp-<hex SHA-256>` over the tenant, principal, tool, the RFC 8785 canonical arguments and
/// the index of the [`DERIVED_KEY_WINDOW`] `now` falls in (each field length-prefixed).
pub fn derived_idempotency_key(
    principal: &Principal,
    tool: &str,
    arguments: &Map<String, Value>,
    now: OffsetDateTime,
) -> String {
    let window = now
        .unix_timestamp()
        .div_euclid(i64::try_from(DERIVED_KEY_WINDOW.as_secs()).unwrap_or(600));
    let mut hash = Sha256::new();
    let window = window.to_string();
    let arguments = canonical_bytes_of_map(arguments);
    for field in [
        b"warrant-mcp-key-v1".as_slice(),
        principal.tenant().as_bytes(),
        principal.id().as_bytes(),
        tool.as_bytes(),
        &arguments,
        window.as_bytes(),
    ] {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field);
    }
    format!("mcp-{}", warrant_core::canon::hex_lower(&hash.finalize()))
}

/// A call's `_meta` as the handler reads it: the SDK's decoded object, or the members of a
/// `_meta` whose every value is a string, decoded by the direct path into an ordered map
/// (`direct::DirectMeta::Plain`), which answer every lookup as the decoded object would.
#[derive(Clone, Copy)]
pub(crate) enum Meta<'a> {
    /// As the SDK decodes it.
    Object(&'a JsonObject),
    /// Keys and their string values.
    Plain(&'a BTreeMap<String, String>),
}

impl<'a> Meta<'a> {
    /// Whether `_meta` has no members.
    pub(crate) fn is_empty(self) -> bool {
        match self {
            Meta::Object(object) => object.is_empty(),
            Meta::Plain(members) => members.is_empty(),
        }
    }

    /// The string value of `key`, when it has one.
    pub(crate) fn text(self, key: &str) -> Option<&'a str> {
        match self {
            Meta::Object(object) => object.get(key).and_then(Value::as_str),
            Meta::Plain(members) => members.get(key).map(String::as_str),
        }
    }
}

/// A string `_meta` field: `Ok(None)` when absent, `Err(field)` when present but not a string.
fn meta_text<'a>(meta: Meta<'a>, fields: &[&'static str]) -> Result<Option<&'a str>, &'static str> {
    let object = match meta {
        Meta::Object(object) => object,
        // Every value is a string.
        Meta::Plain(_) => return Ok(fields.iter().find_map(|field| meta.text(field))),
    };
    for field in fields {
        match object.get(*field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => return Ok(Some(s)),
            Some(_) => return Err(field),
        }
    }
    Ok(None)
}

/// A `_meta` field as the proposal carries it: a string goes as a transport value (like an
/// HTTP header); any other value goes into the envelope under `field`, where `decide` refuses
/// it with the envelope's own code and a ledger row.
fn meta_field<'a>(
    meta: Meta<'a>,
    fields: &[&'static str],
    field: &str,
    envelope: &mut Vec<u8>,
) -> Option<&'a str> {
    match meta_text(meta, fields) {
        Ok(text) => text,
        Err(name) => {
            if let Meta::Object(object) = meta
                && let Some(value) = object.get(name)
            {
                envelope.extend_from_slice(format!("\"{field}\":{value},").as_bytes());
            }
            None
        }
    }
}

/// What a `tools/call` came to: an answer already made, or a dispatched call whose answer is
/// still to be written ([`Called::into_response`], or by the direct path from its parts).
pub(crate) enum Called {
    /// The answer (a workflow, a resumed or held call, a refusal before dispatch).
    Answered(CallToolResponse),
    /// A dispatched call (of the raw call's tool).
    Dispatched { dispatched: Dispatched, trace: String },
}

impl Called {
    /// A dispatched call that committed: its execution, result and trace id.
    pub(crate) fn committed(&self) -> Option<(&warrant_runtime::Execution, &Value, &str)> {
        match self {
            Called::Dispatched {
                dispatched: Dispatched::Executed(execution),
                trace,
                ..
            } => match &execution.result {
                Ok(Outcome::Committed(result)) => Some((execution, result, trace)),
                _ => None,
            },
            _ => None,
        }
    }

    /// The trace id of a dispatched call.
    pub(crate) fn trace(&self) -> Option<&str> {
        match self {
            Called::Dispatched { trace, .. } => Some(trace),
            Called::Answered(_) => None,
        }
    }

    /// The tool result as the SDK sends it, for a call of `tool`.
    pub(crate) fn into_response(self, state: &AppState, tool: &str) -> CallToolResponse {
        match self {
            Called::Answered(response) => response,
            Called::Dispatched { dispatched, trace } => answer(state, tool, dispatched, &trace).into(),
        }
    }
}

/// Runs one `tools/call` through `dispatch` up to its answer ([`Called`]): a tool result, or
/// for a call held for review what the client can take (`native`: a task, an input-required
/// result, else the tool error). The proposal is built from `raw`, the client's own bytes of
/// the call; `request` (the SDK's decoding of the same message) names the tool and carries the
/// `requestState` of a retry.
pub(crate) async fn call(
    state: &Arc<AppState>,
    principal: Principal,
    trace: String,
    request_state: Option<String>,
    raw: &RawCall,
    meta: Meta<'_>,
    native: Native,
) -> Called {
    // Of the SDK's parameters only a retry's state is taken (the name is the raw call's, which
    // the caller matched with the request's): the rest would be held in this future, twice
    // (as an argument and as a local), until the call ends.
    let name = raw.name();
    if name.starts_with(super::workflows::PREFIX) {
        // Boxed, as the other paths that are not a plain call: the future of every call is
        // as large as its largest branch, and it is moved several times on its way.
        return Called::Answered(
            Box::pin(super::workflows::call(state, principal, trace, name, raw))
                .await
                .into(),
        );
    }
    let mut extra = Vec::new();
    // Most calls carry no `_meta`: nothing to look up.
    let (client_key, approval_id) = if meta.is_empty() {
        (None, None)
    } else {
        (
            meta_field(meta, &KEY_FIELDS, "idempotency_key", &mut extra).map(str::to_owned),
            meta_field(meta, &APPROVAL_FIELDS, "approval", &mut extra).map(str::to_owned),
        )
    };
    let index = state.tool_index();
    let (version, contract) = index.resolve(principal.tenant(), name);
    let needs_key = contract.is_some_and(|c| c.effect().requires_idempotency_key());
    let bytes = raw.proposal(version, &extra);
    if let Some(sealed) = request_state.as_deref() {
        return Called::Answered(
            Box::pin(super::native::resume(
                state, principal, trace, name, bytes, sealed,
            ))
            .await,
        );
    }
    let key = match client_key {
        Some(key) => Some(key),
        None if needs_key => {
            match derive_key(state, &principal, name, &bytes, approval_id.as_deref()).await {
                Ok(key) => key,
                Err(e) => return Called::Answered(store_failed(&e, &trace).into()),
            }
        }
        None => None,
    };
    // The call is handed to the runtime, which runs it to a recorded end even if this request
    // is cancelled (a client that disconnects cancels the handler): `warrant_runtime::submit`.
    // Built in a block, so its storage is not held in this future while it runs.
    let (submitted, kept) = {
        let call = OwnedCall {
            bytes: bytes.into(),
            idempotency_key: key,
            approval_id,
            trace_id: trace.clone(),
            ..OwnedCall::default()
        };
        // Kept for a held call's native answer, when the client can take one (boxed: most
        // clients cannot, and the future need not be as large as the copies).
        let kept = native
            .takes_held()
            .then(|| Box::new((principal.clone(), call.clone())));
        (
            submit(state.authority.clone(), state.runtime.clone(), principal, call),
            kept,
        )
    };
    let dispatched = match submitted.await {
        Ok(dispatched) => dispatched,
        Err(e) => return Called::Answered(store_failed(&e, &trace).into()),
    };
    let sensitive = contract.is_some_and(|c| c.has_sensitive_fields());
    if let Dispatched::NeedsApproval { needed, .. } = &dispatched
        && let Some(kept) = &kept
        && let (held, call) = &**kept
        && let Some(native) = Box::pin(super::native::held(
            state, native, held, name, call, needed, sensitive,
        ))
        .await
    {
        return Called::Answered(native);
    }
    Called::Dispatched { dispatched, trace }
}

/// A `tools/call` whose raw bytes the transport did not keep (or that do not match the
/// request): refused rather than run from the SDK's decoded arguments, which have lost their
/// spelling. The framing of both transports keeps them for every `tools/call`, so this is a
/// server fault, logged with an incident id.
pub(crate) fn unframed(trace: &str) -> CallToolResult {
    internal(&"a tools/call without its raw arguments", trace)
}

/// The key of a non-read call whose client sent none: the key the presented approval is bound
/// to (approvals are single use, so it names one operation), else the windowed derivation over
/// the proposal's arguments (none when they do not parse: `decide` refuses them first).
async fn derive_key(
    state: &AppState,
    principal: &Principal,
    tool: &str,
    proposal: &[u8],
    approval_id: Option<&str>,
) -> Result<Option<String>, StoreError> {
    if let Some(id) = approval_id
        && warrant_core::proposal::is_valid_id(id)
        && let Some(approval) = state
            .store
            .get_approval(principal.tenant(), id, state.env.now())
            .await?
        && let Some(key) = approval.request.idempotency_key
    {
        return Ok(Some(key));
    }
    // Over the arguments as `decide` will read them. Limits no configuration exceeds: a
    // proposal `decide` accepts always gets its key; one it refuses at the parse stage (the
    // only proposals refused here) needs none.
    let limits = Limits {
        max_bytes: proposal.len(),
        max_depth: json::MAX_DEPTH_CAP,
    };
    let Ok(envelope) = Envelope::parse(proposal, limits) else {
        return Ok(None);
    };
    let Value::Object(arguments) = envelope.arguments() else {
        return Ok(None);
    };
    Ok(Some(derived_idempotency_key(
        principal,
        tool,
        arguments,
        state.env.now(),
    )))
}

/// The tool result of a dispatched proposal.
pub(crate) fn answer(state: &AppState, tool: &str, dispatched: Dispatched, trace: &str) -> CallToolResult {
    let ledger_id = dispatched.ledger_id().to_owned();
    match dispatched {
        Dispatched::Rejected { rejection, .. } => rejected(
            &rejection,
            json!({"decision": "reject", "ledger_id": ledger_id, "trace_id": trace}),
        ),
        Dispatched::NeedsApproval { needed, .. } => {
            let id = needed.request_id.clone().unwrap_or_default();
            let expires_at = needed.expires_at.map(rfc3339);
            let review_url = super::native::review_url(state, &id);
            let text = format!(
                "awaiting approval: this call of `{tool}` needs a human approval before it runs. \
                 Approval id: {id}{}. A reviewer can approve it at {review_url}. Once it is \
                 approved, call `{tool}` again with the same arguments and \
                 `_meta: {{\"approval_id\": \"{id}\"}}`.",
                expires_at
                    .as_deref()
                    .map(|t| format!(" (expires {t})"))
                    .unwrap_or_default(),
            );
            let structured = json!({
                "decision": "needs_approval",
                "stage": "approval",
                "code": "APPROVAL_REQUIRED",
                "approval_id": id,
                "expires_at": expires_at,
                "review_url": review_url,
                "contract_id": needed.contract_id.to_string(),
                "payload_digest": needed.payload_digest.to_string(),
                "idempotency_key": needed.idempotency_key,
                "ledger_id": ledger_id,
                "trace_id": trace,
            });
            error_result(text, structured)
        }
        Dispatched::Executed(e) => {
            let base = executed_base(&e, trace);
            match e.result {
                Err(rejection) => rejected(&rejection, base),
                Ok(Outcome::Committed(result)) => committed(result, base, e.replayed),
                Ok(Outcome::Failed(code)) => {
                    let retry = crate::routes::proposals::retryable(code);
                    let message = crate::routes::proposals::failure_message(code, e.detail.as_deref());
                    let mut structured = base;
                    extend(
                        &mut structured,
                        json!({"outcome": "failed", "stage": "execute", "code": code.as_str(),
                               "message": message, "detail": e.detail, "retryable": retry}),
                    );
                    error_result(format!("{message} (retryable: {retry})"), structured)
                }
                Ok(Outcome::Unknown(operation)) => {
                    let mut structured = base;
                    let code = if e.unrecorded {
                        "OUTCOME_NOT_RECORDED"
                    } else {
                        "OUTCOME_UNKNOWN"
                    };
                    extend(
                        &mut structured,
                        json!({"outcome": "unknown", "stage": "execute", "code": code,
                               "message": "the call may have taken effect; it is being reconciled",
                               "detail": e.detail}),
                    );
                    error_result(
                        format!(
                            "outcome unknown: the call may have taken effect and is being reconciled \
                             (operation {}). Calling again with the same arguments and idempotency \
                             key answers the outcome once it is known, without a second effect.",
                            operation.as_str()
                        ),
                        structured,
                    )
                }
            }
        }
    }
}

/// What every executed call's answer carries: the decision, the call's identifiers and its
/// attempts (as structured content, or as `io.warrant/…` metadata when it committed).
pub(crate) fn executed_base(e: &warrant_runtime::Execution, trace: &str) -> Value {
    json!({
        "decision": if e.result.is_err() { "reject" } else { "allow" },
        "ledger_id": e.ledger_id,
        "operation_id": e.operation_id.as_str(),
        "attempts": e.attempts,
        "replayed": e.replayed,
        "trace_id": trace,
    })
}

/// The tool result of a committed call: the result as text and as structured content (an
/// object as it is, anything else as `{"result": …}`), and `base` with the outcome as
/// `io.warrant/…` metadata. The direct path writes the same answer from borrowed parts
/// (`direct::committed`, held byte-equal to this by its test).
pub(crate) fn committed(result: Value, base: Value, replayed: bool) -> CallToolResult {
    let text = result.to_string();
    let structured = match result {
        Value::Object(_) => result,
        other => json!({"result": other}),
    };
    let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
    answer.structured_content = Some(structured);
    if let Value::Object(fields) = base {
        let mut meta = JsonObject::new();
        for (k, v) in fields {
            meta.insert(format!("io.warrant/{k}"), v);
        }
        meta.insert(
            "io.warrant/outcome".into(),
            json!(crate::routes::proposals::committed_outcome(replayed)),
        );
        answer.meta = Some(MetaObject(meta));
    }
    answer
}

fn extend(target: &mut Value, fields: Value) {
    if let (Value::Object(target), Value::Object(fields)) = (target, fields) {
        target.extend(fields);
    }
}

fn rejected(rejection: &Rejection, base: Value) -> CallToolResult {
    refusal(
        rejection.stage().as_str(),
        rejection.code().as_str(),
        rejection.detail(),
        rejection.pointer(),
        base,
    )
}

/// A refused call: `refused: <stage> <CODE>: <detail>` and the same as structured content.
pub(crate) fn refusal(
    stage: &str,
    code: &str,
    message: &str,
    pointer: Option<&str>,
    base: Value,
) -> CallToolResult {
    let mut structured = base;
    extend(
        &mut structured,
        json!({"outcome": "refused", "stage": stage, "code": code, "message": message}),
    );
    if let (Some(p), Value::Object(map)) = (pointer, &mut structured) {
        map.insert("pointer".into(), json!(p));
    }
    let at = pointer.map(|p| format!(" (at {p})")).unwrap_or_default();
    error_result(format!("refused: {stage} {code}: {message}{at}"), structured)
}

/// A store failure before anything ran: nothing was executed and the same call may be sent
/// again. An overloaded store (a full queue) and an unavailable one say so, with a retry hint,
/// as the HTTP lane's 503 does; the overload is counted with the HTTP lane's. Anything else is
/// [`internal`].
pub(crate) fn store_failed(error: &StoreError, trace: &str) -> CallToolResult {
    let (code, message) = match error {
        StoreError::Overloaded(_) => {
            metrics::counter!(crate::error::OVERLOADED_METRIC).increment(1);
            tracing::warn!(%error, "mcp: store overloaded");
            (
                "STORE_OVERLOADED",
                "the store is overloaded; nothing was executed; retry later",
            )
        }
        StoreError::Unavailable(_) => {
            tracing::error!(%error, "mcp: store unavailable");
            (
                "STORE_UNAVAILABLE",
                "the store cannot record this call right now; nothing was executed; retry later",
            )
        }
        other => return internal(other, trace),
    };
    refusal(
        "internal",
        code,
        message,
        None,
        json!({"trace_id": trace, "decision": "none", "retryable": "yes",
               "retry_after_seconds": crate::error::OVERLOADED_RETRY_AFTER}),
    )
}

/// A store failure or a lost task: logged with an incident id, answered without details.
pub(crate) fn internal(error: &dyn std::fmt::Display, trace: &str) -> CallToolResult {
    let incident = hex::encode(rand::random::<[u8; 8]>());
    tracing::error!(incident, %error, "mcp: internal error");
    refusal(
        "internal",
        "INTERNAL",
        &format!("internal error (incident {incident})"),
        None,
        json!({"trace_id": trace}),
    )
}

fn error_result(text: String, structured: Value) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    /// A store that failed before anything ran is answered as what it is — overloaded or
    /// unavailable, nothing executed, retry — as the HTTP lane's 503 is, not as an internal
    /// error.
    #[test]
    fn a_store_failure_before_anything_ran_says_so() {
        for (error, code) in [
            (
                StoreError::Overloaded("the SQLite write queue is full".into()),
                "STORE_OVERLOADED",
            ),
            (StoreError::Unavailable("disk full".into()), "STORE_UNAVAILABLE"),
            (StoreError::Corrupt("bad row".into()), "INTERNAL"),
        ] {
            let answer = store_failed(&error, "trace-1");
            assert_eq!(answer.is_error, Some(true));
            let structured = answer.structured_content.unwrap();
            assert_eq!(structured["code"], code, "{structured}");
            assert_eq!(structured["trace_id"], "trace-1");
            if code != "INTERNAL" {
                assert_eq!(structured["decision"], "none");
                assert_eq!(structured["retry_after_seconds"], 1);
                assert!(
                    structured["message"]
                        .as_str()
                        .unwrap()
                        .contains("nothing was executed")
                );
            }
            assert!(
                !structured.to_string().contains("queue is full"),
                "no internals: {structured}"
            );
        }
    }

    fn principal(id: &str) -> Principal {
        Principal::new(id, "acme", Vec::new()).unwrap()
    }

    #[test]
    fn derived_keys_are_stable_within_a_window_and_bound_to_the_call() {
        let args: Map<String, Value> = serde_json::from_str(r#"{"b": 1, "a": "x"}"#).unwrap();
        let reordered: Map<String, Value> = serde_json::from_str(r#"{"a": "x", "b": 1}"#).unwrap();
        // A multiple of 600: the start of a window.
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let later = t0 + time::Duration::seconds(599);
        let next = t0 + time::Duration::seconds(600);
        let k = derived_idempotency_key(&principal("agent"), "t", &args, t0);
        assert!(k.starts_with("mcp-") && k.len() == 68);
        assert_eq!(
            k,
            derived_idempotency_key(&principal("agent"), "t", &reordered, later)
        );
        assert_ne!(k, derived_idempotency_key(&principal("agent"), "t", &args, next));
        assert_ne!(k, derived_idempotency_key(&principal("other"), "t", &args, t0));
        assert_ne!(k, derived_idempotency_key(&principal("agent"), "u", &args, t0));
    }

    #[test]
    fn annotations_follow_the_effect_class() {
        let read = annotations(Effect::Read, false);
        assert_eq!(read.read_only_hint, Some(true));
        let write = annotations(Effect::Write, true);
        assert_eq!(
            (
                write.read_only_hint,
                write.destructive_hint,
                write.idempotent_hint
            ),
            (Some(false), Some(false), Some(true))
        );
        let irreversible = annotations(Effect::Irreversible, false);
        assert_eq!(
            (irreversible.destructive_hint, irreversible.idempotent_hint),
            (Some(true), Some(false))
        );
        let later = annotations(Effect::Async, true);
        assert_eq!(
            (later.read_only_hint, later.destructive_hint),
            (Some(false), None)
        );
    }

    #[test]
    fn meta_fields_must_be_strings() {
        let meta: JsonObject =
            serde_json::from_str(r#"{"approval_id": "a1", "idempotency_key": 3}"#).unwrap();
        assert_eq!(meta_text(Meta::Object(&meta), &APPROVAL_FIELDS), Ok(Some("a1")));
        assert_eq!(
            meta_text(Meta::Object(&meta), &KEY_FIELDS),
            Err("idempotency_key")
        );
    }
}
