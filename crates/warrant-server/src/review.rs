//! What follows a reviewer's decision, whichever lane it came from (the console,
//! `/v1/approvals/{id}/approve|reject`, the CLI through the API): a workflow run waiting on the
//! review wakes, and an approved call of a contract that says `execute_on_approval` runs at once,
//! as its proposer, through the one pipeline. The proposer's later retry (the same call and
//! key, an MCP `requestState`, a task poll) then answers the stored result: the approval is
//! consumed, and a consumed approval presented again with its key replays the recorded outcome
//! or is refused, never runs twice (`warrant_core::authority::bind_approval`).

use serde_json::json;
use warrant_core::authority::Principal;
use warrant_core::records::{ApprovalRequest, ApprovalStatus};
use warrant_core::store::StoreError;
use warrant_runtime::{Dispatched, OwnedCall};

use crate::state::AppState;

/// Runs a reviewer's decision and what follows it (the approved call executed on approval,
/// an edit's replacement approved and run) as work the runtime owns: once the verdict is
/// committed, the rest runs to its end even if the reviewer's request is cancelled — a
/// disconnect, the request timeout — and a graceful shutdown waits for it. `None` when the
/// work panicked.
pub(crate) async fn owned<T: Send + 'static>(
    state: &AppState,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    state.runtime.own(work).await.ok()
}

/// Runs what a decision on `approval` sets off: wakes its workflow run; executes the approved
/// call when its contract says `execute_on_approval`. Failures are logged, never undo the
/// decision (the proposer can still call again with the approval).
pub(crate) async fn after_decision(state: &AppState, approval: &ApprovalRequest) {
    crate::runs::wake_for_approval(state, approval).await;
    if approval.status != ApprovalStatus::Approved || of_a_run(approval) {
        return;
    }
    let tenant = &approval.request.tenant;
    let contract = match state
        .registry
        .by_id(tenant, &approval.request.contract_id, state.env.now())
        .await
    {
        Ok(Some(contract)) => contract,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, approval = approval.request.id, "cannot read the approved call's contract");
            return;
        }
    };
    // A call with a sensitive field is rebuilt from its sealed copy; one without (sealed by
    // no node) waits for its proposer.
    if !contract.execute_on_approval()
        || (contract.has_sensitive_fields() && state.authority.unsealed_arguments(approval).is_none())
    {
        return;
    }
    match execute_approved(state, approval, None).await {
        Ok(Some(ran)) => tracing::info!(
            approval = approval.request.id,
            ledger = ran.ledger_id(),
            "approved call executed on the reviewer's decision"
        ),
        Ok(None) => tracing::warn!(
            approval = approval.request.id,
            "the approved call was not executed: its proposer holds no live key"
        ),
        Err(error) => {
            tracing::warn!(%error, approval = approval.request.id, "the approved call could not be executed")
        }
    }
}

/// Whether the approval belongs to a workflow run's review step (its run executes it).
pub(crate) fn of_a_run(approval: &ApprovalRequest) -> bool {
    approval
        .request
        .idempotency_key
        .as_deref()
        .is_some_and(|k| k.starts_with(warrant_core::pipeline::RUN_KEY_PREFIX))
}

/// Submits the approved call `approval` holds — its exact arguments, contract and key — as its
/// proposer (the least authority of the proposer's live keys), with the approval, through
/// `submit`: the whole pipeline runs again and the approval binds to the digest. `None` when the
/// proposer holds no live key. `trace` names the trace (fresh when `None`).
///
/// # Errors
/// The store fails.
pub(crate) async fn execute_approved(
    state: &AppState,
    approval: &ApprovalRequest,
    trace: Option<String>,
) -> Result<Option<Dispatched>, StoreError> {
    let request = &approval.request;
    let Some(proposer) = proposer_authority(state, &request.tenant, &request.proposer).await? else {
        return Ok(None);
    };
    // The exact arguments: the sealed copy when the contract has a sensitive field (the stored
    // `arguments` then hold its keyed hash, whose digest would not bind).
    let arguments = match state.authority.unsealed_arguments(approval) {
        Some(exact) => serde_json::Value::Object(exact),
        None => request.arguments.clone(),
    };
    let bytes = json!({
        "tool": request.tool,
        "contract": request.contract_id,
        "arguments": arguments,
    })
    .to_string();
    let call = OwnedCall {
        bytes: bytes.into_bytes().into(),
        idempotency_key: request.idempotency_key.clone(),
        approval_id: Some(request.id.clone()),
        trace_id: trace.unwrap_or_else(|| crate::trace::trace_id(&axum::http::HeaderMap::new())),
        ..OwnedCall::default()
    };
    warrant_runtime::submit(state.authority.clone(), state.runtime.clone(), proposer, call)
        .await
        .map(Some)
}

/// The authority a proposer acts with when Warrant runs its call for it: the grants and roles
/// every one of its live keys holds (the least of them), `None` when it holds none.
///
/// # Errors
/// The store fails.
pub(crate) async fn proposer_authority(
    state: &AppState,
    tenant: &str,
    proposer: &str,
) -> Result<Option<Principal>, StoreError> {
    let keys = state.store.list_api_keys(tenant).await?;
    let mut live = keys
        .iter()
        .filter(|k| k.key.principal == proposer && k.revoked_at.is_none());
    let Some(first) = live.next() else {
        return Ok(None);
    };
    let (mut grants, mut roles) = (first.key.grants.clone(), first.key.roles.clone());
    for k in live {
        grants.retain(|g| k.key.grants.contains(g));
        roles.retain(|r| k.key.roles.contains(r));
    }
    Ok(Principal::new(proposer, tenant, grants)
        .and_then(|p| p.with_roles(roles))
        .ok())
}

/// An approval with edits that did not happen, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum EditRefusal {
    /// The reviewer may not decide this request (its proposer, or one policy does not let
    /// review the tool), or it is no longer pending.
    #[error("{0}")]
    NotDecidable(&'static str),
    /// The edited arguments equal the proposed ones.
    #[error("the arguments are unchanged: approve the request as it is instead")]
    Unchanged,
    /// Edits are not offered for this request.
    #[error(
        "this request cannot be approved with edits (a workflow's review, a sensitive field, or a retired contract)"
    )]
    NotEditable,
    /// The proposer holds no live key: the edited call would have no authority.
    #[error("the proposer's keys have all been revoked; the edited call would have no authority")]
    ProposerWithoutKey,
    /// The pipeline refused the edited call.
    #[error("the edited call is refused: {code} at the {stage} stage: {detail}")]
    Refused {
        /// The stage that refused it.
        stage: &'static str,
        /// The refusal's code.
        code: &'static str,
        /// Why.
        detail: String,
    },
    /// The original was decided meanwhile, or a decision failed.
    #[error("not decided: {0}")]
    Conflict(String),
    /// The edited call ran without being held for review (a bug, reported as such).
    #[error("the edited call ran without a review")]
    NotHeld,
}

impl EditRefusal {
    /// The HTTP status and a short title for the refusal.
    pub(crate) fn status_and_title(&self) -> (axum::http::StatusCode, &'static str) {
        use axum::http::StatusCode;
        match self {
            EditRefusal::NotDecidable(_) => (StatusCode::FORBIDDEN, "Not yours to decide"),
            EditRefusal::Unchanged => (StatusCode::BAD_REQUEST, "Nothing was edited"),
            EditRefusal::NotEditable => (StatusCode::BAD_REQUEST, "Edits are not offered here"),
            EditRefusal::ProposerWithoutKey => (StatusCode::CONFLICT, "The proposer holds no key"),
            EditRefusal::Refused { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "The edited call is refused"),
            EditRefusal::Conflict(_) => (StatusCode::CONFLICT, "Not decided"),
            EditRefusal::NotHeld => (StatusCode::INTERNAL_SERVER_ERROR, "The edited call was not held"),
        }
    }

    /// The API's error code for the refusal.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            EditRefusal::NotDecidable(_) => "REVIEW_FORBIDDEN",
            EditRefusal::Unchanged => "EDIT_UNCHANGED",
            EditRefusal::NotEditable => "EDIT_NOT_OFFERED",
            EditRefusal::ProposerWithoutKey => "PROPOSER_WITHOUT_KEY",
            EditRefusal::Refused { .. } => "EDIT_REFUSED",
            EditRefusal::Conflict(_) => "APPROVAL_NOT_PENDING",
            EditRefusal::NotHeld => "INTERNAL",
        }
    }
}

/// An approval with edits that happened.
#[derive(Debug)]
pub(crate) struct Edited {
    /// The approval request of the edited call (approved).
    pub(crate) approval_id: String,
    /// What running the edited call came to.
    pub(crate) ran: Dispatched,
}

/// Whether `original` (a pending request `reviewer` may decide) may be approved with edits:
/// a direct call's (a workflow's review binds the step's exact payload, and the run waits for
/// that one) whose contract's input has no sensitive field (the stored arguments hold only its
/// keyed hash, so an edit could not carry the real value).
pub(crate) fn editable(original: &ApprovalRequest, contract: &warrant_core::Contract) -> bool {
    !of_a_run(original) && !contract.has_sensitive_fields()
}

/// Approves `original` with edits, as `reviewer`: the edited arguments are proposed again as
/// the proposer (the least authority of its live keys) through `submit` — strict parser,
/// schema, policy, guards, budget — held for review and so bound to the edited payload's
/// digest; the original is linked to the edited request and rejected (its payload can never
/// run on this decision); the edited request is approved by `reviewer` (both reasons name the
/// other request and the original digest) and executed at once with its approval, as the
/// proposer, under the original idempotency key. Whoever calls it (the console, the API), the
/// reviewer must be allowed to decide `original` — not its proposer, permitted by policy's
/// review rule — and `original` must be pending; lanes check first only to answer precisely.
///
/// Its steps are separate writes (the edited call held, the original superseded, the edited
/// request approved, the call run): every caller runs it as work the runtime owns ([`owned`]),
/// so a reviewer's request that goes away between two steps cannot leave the edit half done.
///
/// # Errors
/// The store fails.
pub(crate) async fn approve_with_edits(
    state: &AppState,
    reviewer: &Principal,
    original: &ApprovalRequest,
    contract: &warrant_core::Contract,
    edited: serde_json::Map<String, serde_json::Value>,
    reason: &str,
) -> Result<Result<Edited, EditRefusal>, StoreError> {
    use warrant_core::records::Verdict;
    if original.request.proposer == reviewer.id() {
        return Ok(Err(EditRefusal::NotDecidable(
            "the proposer cannot review its own call",
        )));
    }
    if !state.authority.may_review(reviewer, original).await? {
        return Ok(Err(EditRefusal::NotDecidable(
            "policy does not let this principal review this tool",
        )));
    }
    if original.status != warrant_core::records::ApprovalStatus::Pending {
        return Ok(Err(EditRefusal::Conflict(
            "the request is no longer pending".into(),
        )));
    }
    if !editable(original, contract) {
        return Ok(Err(EditRefusal::NotEditable));
    }
    if serde_json::Value::Object(edited.clone()) == original.request.arguments {
        return Ok(Err(EditRefusal::Unchanged));
    }
    let tenant = reviewer.tenant();
    let Some(proposer) = proposer_authority(state, tenant, &original.request.proposer).await? else {
        return Ok(Err(EditRefusal::ProposerWithoutKey));
    };
    let bytes = json!({
        "tool": contract.qualified_name(),
        "contract": contract.id_str(),
        "arguments": edited,
    })
    .to_string();
    let trace = crate::trace::trace_id(&axum::http::HeaderMap::new());
    // Both of the edited call's ledger rows (held, then executed) say who edited which
    // request, from which digest, and why; the rows' own payload digest is the edited one.
    let note = format!(
        "edited by {} from {} ({}): {reason}",
        reviewer.id(),
        original.request.id,
        original.request.payload_digest
    );
    let call = |approval: Option<String>| OwnedCall {
        bytes: bytes.clone().into_bytes().into(),
        idempotency_key: original.request.idempotency_key.clone(),
        approval_id: approval.clone(),
        trace_id: trace.clone(),
        review: approval.is_none(),
        note: Some(note.clone()),
        ..OwnedCall::default()
    };
    let held = warrant_runtime::submit(
        state.authority.clone(),
        state.runtime.clone(),
        proposer.clone(),
        call(None),
    )
    .await?;
    let new_id = match held {
        Dispatched::NeedsApproval { needed, .. } => match needed.request_id {
            Some(id) => id,
            None => return Ok(Err(EditRefusal::NotHeld)),
        },
        Dispatched::Rejected { rejection, .. } => {
            return Ok(Err(EditRefusal::Refused {
                stage: rejection.stage().as_str(),
                code: rejection.code().as_str(),
                detail: rejection.detail().to_owned(),
            }));
        }
        Dispatched::Executed(_) => return Ok(Err(EditRefusal::NotHeld)),
    };
    let id = &original.request.id;
    let who = reviewer.id();
    // Rejected and linked in one write: an agent waiting on the original (a task, an MCP
    // retry) follows the link to the edited call's result and never sees a bare rejection; an
    // original decided meanwhile is left alone, and the edited request is withdrawn.
    let superseded = state
        .store
        .supersede_approval(
            tenant,
            id,
            &new_id,
            who,
            &format!("edited into {new_id} by {who}: {reason}"),
            state.env.now(),
        )
        .await?;
    if !superseded {
        let withdrawn = state
            .store
            .decide_approval(
                tenant,
                &new_id,
                who,
                Verdict::Reject,
                Some("withdrawn: the original request was decided meanwhile"),
                state.env.now(),
            )
            .await?;
        if let Err(refusal) = withdrawn {
            tracing::warn!(
                approval = new_id,
                ?refusal,
                "an unused edited request was not withdrawn"
            );
        }
        return Ok(Err(EditRefusal::Conflict(
            "the original request was decided meanwhile".into(),
        )));
    }
    let original_digest = &original.request.payload_digest;
    let approved = state
        .authority
        .review(
            reviewer,
            &new_id,
            Verdict::Approve,
            Some(&format!(
                "{reason} (edited by {who} from {id}, {original_digest})"
            )),
        )
        .await?;
    if let Err(refusal) = approved {
        return Ok(Err(EditRefusal::Conflict(format!(
            "the edited request could not be approved: {refusal:?}"
        ))));
    }
    metrics::counter!("warrant_console_decisions_total", "verdict" => "approved_with_edits").increment(1);
    // Executed on the decision: the proposer's call with its approval, through the pipeline.
    let ran = warrant_runtime::submit(
        state.authority.clone(),
        state.runtime.clone(),
        proposer,
        call(Some(new_id.clone())),
    )
    .await?;
    tracing::info!(
        approval = new_id,
        original = id,
        ledger = ran.ledger_id(),
        "edited call executed on the reviewer's decision"
    );
    Ok(Ok(Edited {
        approval_id: new_id,
        ran,
    }))
}
