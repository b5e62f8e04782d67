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
    if !contract.execute_on_approval() || contract.input_document().is_some_and(mentions_sensitive) {
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
        .is_some_and(|k| k.starts_with("run_"))
}

/// Whether an input schema marks a field sensitive: the stored arguments then hold only its
/// keyed hash, so the call cannot be rebuilt from them.
pub(crate) fn mentions_sensitive(input: &serde_json::Value) -> bool {
    input.to_string().contains("x-warrant-sensitive")
}

/// Submits the approved call `approval` holds — its stored arguments, contract and key — as its
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
    let bytes = json!({
        "tool": request.tool,
        "contract": request.contract_id,
        "arguments": request.arguments,
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
