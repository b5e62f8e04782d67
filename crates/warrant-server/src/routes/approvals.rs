//! Approvals of the caller's tenant: the inbox, one request, and a reviewer's verdict. Only
//! principals that policy lets review a request's tool see it (the pipeline's `may_review`,
//! the rule `review` applies); the proposer cannot review its own call. Arguments are shown as
//! the approval stores them: sensitive values as their keyed hashes, like the ledger.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use warrant_core::pipeline::ReviewRefusal;
use warrant_core::records::{ApprovalRequest, ApprovalStatus, Verdict};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{id}", get(show))
        .route("/v1/approvals/{id}/approve", post(approve))
        .route("/v1/approvals/{id}/reject", post(reject))
}

/// An approval request as the API shows it (the arguments as stored, for the reviewer).
pub fn approval_json(a: &ApprovalRequest) -> Value {
    let r = &a.request;
    json!({
        "id": r.id,
        "status": a.status.as_str(),
        "tool": r.tool,
        "contract_id": r.contract_id,
        "proposer": r.proposer,
        "payload_digest": r.payload_digest,
        "idempotency_key": r.idempotency_key,
        "arguments": r.arguments,
        "created_at": rfc3339(r.created_at),
        "expires_at": rfc3339(r.expires_at),
        "reviewer": a.reviewer,
        "reason": a.reason,
        "decided_at": a.decided_at.map(rfc3339),
        "consumed_at": a.consumed_at.map(rfc3339),
        "reviewers": r.reviewers.as_ref().map(warrant_core::records::ReviewerRule::to_json),
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
}

/// How many of the tenant's oldest approvals (of the status asked) a listing reads before
/// keeping those the caller may review: the store lists by tenant and status only, and
/// whether a principal may review a request is policy's answer for that request.
const LIST_SCAN: u32 = 1000;

/// Approval requests of the caller's tenant that the caller may review.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals",
    params(("status" = Option<String>, Query, description = "pending, approved, rejected, expired or consumed"),
           ("limit" = Option<u32>, Query, description = "1..=500, default 100")),
    responses((status = 200, description = "oldest first; only the requests policy lets the caller review", body = crate::openapi::ApprovalList), (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(
            ApprovalStatus::parse(s).ok_or_else(|| ApiError::bad_request(format!("unknown status `{s}`")))?,
        ),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    let approvals = state
        .store
        .list_approvals(caller.principal.tenant(), status, LIST_SCAN, state.env.now())
        .await?;
    let mut visible = state.authority.reviewable(&caller.principal, approvals).await?;
    visible.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(Json(
        json!({"approvals": visible.iter().map(approval_json).collect::<Vec<_>>()}),
    ))
}

/// One approval request, for a principal that policy lets review it (anyone else is told
/// there is no such approval: its existence is not theirs to know).
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals",
    params(("id" = String, Path, description = "approval id")),
    responses((status = 200, description = "the request", body = crate::openapi::Approval),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found, or not reviewable by the caller", body = crate::openapi::ErrorBody)))]
pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let found = match state
        .store
        .get_approval(caller.principal.tenant(), &id, state.env.now())
        .await?
    {
        Some(request) if state.authority.may_review(&caller.principal, &request).await? => request,
        _ => return Err(ApiError::not_found("approval")),
    };
    Ok(Json(approval_json(&found)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewBody {
    reason: Option<String>,
    /// Edited arguments: approve with edits (approve only).
    arguments: Option<serde_json::Map<String, Value>>,
}

/// The body, read with the strict parser first (a repeated key, a lone surrogate or excessive
/// depth is refused, not silently resolved by `serde_json`), then as a [`ReviewBody`].
fn review_body(body: &Bytes) -> Result<ReviewBody, ApiError> {
    if body.is_empty() {
        return Ok(ReviewBody::default());
    }
    let value = warrant_core::json::parse(body, warrant_core::json::Limits::PROPOSAL)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let parsed: ReviewBody = serde_json::from_value(value).map_err(|_| {
        ApiError::bad_request("the body is `{\"reason\": \"…\"}`, with `arguments` to approve with edits")
    })?;
    if parsed.reason.as_ref().is_some_and(|r| r.chars().count() > 1000) {
        return Err(ApiError::bad_request("the reason is over 1000 characters"));
    }
    Ok(parsed)
}

/// [`review`], owned by the runtime with what follows the verdict (`review::owned`).
async fn review_owned(
    state: Arc<AppState>,
    caller: Caller,
    id: String,
    verdict: Verdict,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let work = {
        let state = Arc::clone(&state);
        async move { review(&state, &caller, &id, verdict, &body).await }
    };
    crate::review::owned(&state, work)
        .await
        .unwrap_or_else(|| Err(ApiError::internal(&"the review ended abnormally")))
}

async fn review(
    state: &AppState,
    caller: &Caller,
    id: &str,
    verdict: Verdict,
    body: &Bytes,
) -> Result<Json<Value>, ApiError> {
    let body = review_body(body)?;
    if let Some(arguments) = body.arguments {
        if verdict != Verdict::Approve {
            return Err(ApiError::bad_request("edited arguments go with an approval only"));
        }
        return approve_with_edits(state, caller, id, arguments, body.reason.as_deref()).await;
    }
    let reason = body.reason;
    match state
        .authority
        .review(&caller.principal, id, verdict, reason.as_deref())
        .await?
    {
        Ok(approval) => {
            crate::review::after_decision(state, &approval).await;
            Ok(Json(approval_json(&approval)))
        }
        Err(refusal) => Err(review_refusal(refusal)),
    }
}

/// The API error of a refused review.
fn review_refusal(refusal: ReviewRefusal) -> ApiError {
    match refusal {
        ReviewRefusal::NotFound => ApiError::not_found("approval"),
        ReviewRefusal::Forbidden(_) => ApiError::new(
            StatusCode::FORBIDDEN,
            "approval",
            "REVIEW_FORBIDDEN",
            "policy does not let this principal review this tool",
        ),
        ReviewRefusal::SelfReview => ApiError::new(
            StatusCode::FORBIDDEN,
            "approval",
            "SELF_REVIEW",
            "the proposer cannot review its own call",
        ),
        ReviewRefusal::NotPending(status) => ApiError::new(
            StatusCode::CONFLICT,
            "approval",
            "APPROVAL_NOT_PENDING",
            format!("the approval is {status}"),
        ),
        ReviewRefusal::Expired => ApiError::new(
            StatusCode::CONFLICT,
            "approval",
            "APPROVAL_EXPIRED",
            "the approval request expired",
        ),
    }
}

/// Approves `id` with edited `arguments` (`review::approve_with_edits`); answers the edited
/// request (approved, executed) with `edited_from` naming the original.
async fn approve_with_edits(
    state: &AppState,
    caller: &Caller,
    id: &str,
    arguments: serde_json::Map<String, Value>,
    reason: Option<&str>,
) -> Result<Json<Value>, ApiError> {
    let Some(reason) = reason.map(str::trim).filter(|r| !r.is_empty()) else {
        return Err(ApiError::bad_request("approving with edits needs a reason"));
    };
    let principal = &caller.principal;
    let now = state.env.now();
    // Refused as a plain approval would be: the proposer, then policy, then the state.
    let Some(original) = state.store.get_approval(principal.tenant(), id, now).await? else {
        return Err(review_refusal(ReviewRefusal::NotFound));
    };
    if original.request.proposer == principal.id() {
        return Err(review_refusal(ReviewRefusal::SelfReview));
    }
    if !state.authority.may_review(principal, &original).await? {
        return Err(review_refusal(ReviewRefusal::Forbidden(Vec::new())));
    }
    match original.status {
        ApprovalStatus::Pending => {}
        ApprovalStatus::Expired => return Err(review_refusal(ReviewRefusal::Expired)),
        other => return Err(review_refusal(ReviewRefusal::NotPending(other))),
    }
    let Some(contract) = state
        .registry
        .by_id(principal.tenant(), &original.request.contract_id, now)
        .await?
    else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "approval",
            "EDIT_NOT_OFFERED",
            "the request's contract is no longer registered",
        ));
    };
    match crate::review::approve_with_edits(state, principal, &original, &contract, arguments, reason).await?
    {
        Ok(edited) => {
            let approval = state
                .store
                .get_approval(principal.tenant(), &edited.approval_id, state.env.now())
                .await?
                .ok_or_else(|| ApiError::not_found("approval"))?;
            let mut answer = approval_json(&approval);
            if let Value::Object(map) = &mut answer {
                map.insert("edited_from".into(), json!(id));
                map.insert("execution_ledger_id".into(), json!(edited.ran.ledger_id()));
            }
            Ok(Json(answer))
        }
        Err(refusal) => Err(ApiError::new(
            refusal.status_and_title().0,
            "approval",
            refusal.code(),
            refusal.to_string(),
        )),
    }
}

/// Approve a request (a reviewer other than the proposer, permitted by policy); with
/// `arguments`, approve it with edits.
#[utoipa::path(post, path = "/v1/approvals/{id}/approve", tag = "approvals",
    params(("id" = String, Path, description = "approval id")),
    request_body(content = Option<crate::openapi::ReviewBody>, content_type = "application/json"),
    responses((status = 200, description = "approved", body = crate::openapi::Approval), (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody),
        (status = 409, description = "conflict", body = crate::openapi::ErrorBody)))]
pub(crate) async fn approve(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    review_owned(state, caller, id, Verdict::Approve, body).await
}

/// Reject a request.
#[utoipa::path(post, path = "/v1/approvals/{id}/reject", tag = "approvals",
    params(("id" = String, Path, description = "approval id")),
    request_body(content = Option<crate::openapi::ReviewBody>, content_type = "application/json"),
    responses((status = 200, description = "rejected", body = crate::openapi::Approval), (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody),
        (status = 409, description = "conflict", body = crate::openapi::ErrorBody)))]
pub(crate) async fn reject(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    review_owned(state, caller, id, Verdict::Reject, body).await
}
