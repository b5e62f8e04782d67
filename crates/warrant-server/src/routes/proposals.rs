//! `POST /v1/proposals`: decide and, when allowed, execute — through the same `dispatch` every
//! lane calls.
//!
//! | answer | status |
//! |---|---|
//! | committed (or replayed) | 200, `result` |
//! | held for approval | 202, `approval` |
//! | outcome unknown (being reconciled) | 202, `operation_id` |
//! | executed and failed | 502, `error` with stage `execute` and the tool's code |
//! | refused | 400 / 403 / 404 / 409 / 422 / 429 by stage (`error`) |
//!
//! Every answer carries `ledger_id`, `decision` and `trace_id`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{RequestExt as _, Router};
use serde_json::{Value, json};
use warrant_core::decision::Outcome;
use warrant_runtime::{Dispatched, OwnedCall, submit};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new().route("/v1/proposals", post(propose))
}

/// The `Idempotency-Key` request header (named once: a lookup by `&str` parses the name again
/// on every request).
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The `Warrant-Approval` request header: the approved request a call redeems.
const WARRANT_APPROVAL: HeaderName = HeaderName::from_static("warrant-approval");

/// A header's text, if present and visible ASCII.
pub(crate) fn header_text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Decide a proposal and, when allowed, execute it.
#[utoipa::path(
    post,
    path = "/v1/proposals",
    tag = "proposals",
    request_body(content = crate::openapi::Proposal, content_type = "application/json"),
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "the idempotency key"),
        ("Warrant-Approval" = Option<String>, Header, description = "an approval id"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context"),
    ),
    responses(
        (status = 200, description = "committed or replayed", body = crate::openapi::ProposalAnswer),
        (status = 202, description = "held for approval, or outcome unknown", body = crate::openapi::ProposalAnswer),
        (status = 502, description = "executed and failed", body = crate::openapi::ProposalAnswer),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody),
        (status = 409, description = "conflict", body = crate::openapi::ErrorBody),
        (status = 413, description = "body too large", body = crate::openapi::ErrorBody),
        (status = 415, description = "wrong content type", body = crate::openapi::ErrorBody),
        (status = 422, description = "invalid", body = crate::openapi::ErrorBody),
        (status = 429, description = "budget exhausted", body = crate::openapi::ErrorBody),
        (status = 503, description = "overloaded or store unavailable", body = crate::openapi::ErrorBody)
    )
)]
pub(crate) async fn propose(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    axum::Extension(crate::trace::TraceId(trace)): axum::Extension<crate::trace::TraceId>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    // The headers read where they lie (a `HeaderMap` extractor copies the whole map).
    let headers = request.headers();
    let json = header_text(headers, &header::CONTENT_TYPE)
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|ct| ct.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "request",
            "UNSUPPORTED_MEDIA_TYPE",
            "proposals are application/json",
        ));
    }
    let idempotency_key = header_text(headers, &IDEMPOTENCY_KEY).map(str::to_owned);
    let approval_id = header_text(headers, &WARRANT_APPROVAL).map(str::to_owned);
    // Within the extractors' limit (`DefaultBodyLimit`, the edge's), as the `Bytes` extractor
    // reads it, without its copy of the list it gathers frames in (`crate::body::whole`).
    let body = crate::body::whole(request.with_limited_body().into_body(), usize::MAX).await?;
    // The call is handed to the runtime, which runs it to a recorded end even if this request
    // is dropped (a client disconnect, the timeout layer): see `warrant_runtime::submit`.
    let call = OwnedCall {
        bytes: body,
        idempotency_key,
        approval_id,
        trace_id: trace.clone(),
        ..OwnedCall::default()
    };
    match submit(
        state.authority.clone(),
        state.runtime.clone(),
        caller.principal,
        call,
    )
    .await
    {
        Ok(dispatched) => Ok(answer(&state, dispatched, &trace)),
        Err(e) => Ok(not_executed(&e, &trace)),
    }
}

/// The answer when the store failed before anything ran: nothing was executed, and the same
/// call may simply be sent again (with the same idempotency key, if it had one).
fn not_executed(error: &warrant_core::store::StoreError, trace: &str) -> Response {
    let (code, message) = if let warrant_core::store::StoreError::Overloaded(_) = error {
        // Expected under overload: counted, logged below ERROR (as `ApiError::from` does).
        metrics::counter!(crate::error::OVERLOADED_METRIC).increment(1);
        tracing::warn!(%error, "a proposal could not be decided or recorded: store overloaded");
        (
            "STORE_OVERLOADED",
            "the store is overloaded; nothing was executed; retry later",
        )
    } else {
        tracing::error!(%error, "a proposal could not be decided or recorded");
        (
            "STORE_UNAVAILABLE",
            "the store cannot record this call right now; nothing was executed; retry later",
        )
    };
    let mut response = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "internal", code, message)
        .with("decision", json!("none"))
        .with("trace_id", json!(trace))
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}

/// The HTTP answer to a dispatched proposal.
fn answer(state: &AppState, dispatched: Dispatched, trace: &str) -> Response {
    let ledger_id = dispatched.ledger_id().to_owned();
    match dispatched {
        Dispatched::Rejected { rejection, .. } => ApiError::rejection(&rejection)
            .with("ledger_id", json!(ledger_id))
            .with("decision", json!("reject"))
            .with("trace_id", json!(trace))
            .into_response(),
        Dispatched::NeedsApproval { needed, .. } => {
            let id = needed.request_id.clone().unwrap_or_default();
            let body = json!({
                "ledger_id": ledger_id,
                "decision": "needs_approval",
                "trace_id": trace,
                "approval": {
                    "id": id,
                    "contract_id": needed.contract_id.to_string(),
                    "payload_digest": needed.payload_digest.to_string(),
                    "idempotency_key": needed.idempotency_key,
                    "expires_at": needed.expires_at.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()),
                    "review_url": format!("{}/console/approvals/{id}", state.public_url),
                },
            });
            (StatusCode::ACCEPTED, axum::Json(body)).into_response()
        }
        Dispatched::Executed(e) => {
            let body = |outcome, result, error| Executed {
                ledger_id: &e.ledger_id,
                decision: "allow",
                trace_id: trace,
                operation_id: e.operation_id.as_str(),
                attempts: e.attempts,
                replayed: e.replayed,
                outcome,
                result,
                error,
            };
            match &e.result {
                // Refused by the write-ahead commit (idempotency, budget, approval): the ledger
                // row records a rejection, and so does the answer.
                Err(rejection) => ApiError::rejection(rejection)
                    .with("ledger_id", json!(e.ledger_id))
                    .with("decision", json!("reject"))
                    .with("trace_id", json!(trace))
                    .with("operation_id", json!(e.operation_id.as_str()))
                    .into_response(),
                Ok(Outcome::Committed(result)) => {
                    let outcome = committed_outcome(e.replayed);
                    (StatusCode::OK, axum::Json(body(outcome, Some(result), None))).into_response()
                }
                Ok(Outcome::Unknown(_)) => {
                    let (code, message) = if e.unrecorded {
                        (
                            "OUTCOME_NOT_RECORDED",
                            "the tool was called but its outcome could not be recorded; it may have taken \
                             effect and will be reconciled: send the same call with the same idempotency key \
                             later to learn the outcome",
                        )
                    } else {
                        (
                            "OUTCOME_UNKNOWN",
                            "the call may have taken effect; it is being reconciled: send the same call with \
                             the same idempotency key later to learn the outcome",
                        )
                    };
                    let error =
                        json!({"stage": "execute", "code": code, "message": message, "detail": e.detail});
                    (
                        StatusCode::ACCEPTED,
                        axum::Json(body("unknown", None, Some(error))),
                    )
                        .into_response()
                }
                Ok(Outcome::Failed(code)) => {
                    let error = json!({
                        "stage": "execute",
                        "code": code.as_str(),
                        "message": failure_message(*code, e.detail.as_deref()),
                        "detail": e.detail,
                        "retryable": retryable(*code),
                    });
                    (
                        StatusCode::BAD_GATEWAY,
                        axum::Json(body("failed", None, Some(error))),
                    )
                        .into_response()
                }
            }
        }
    }
}

/// The answer to an executed call, serialised from borrowed parts (the tool's result is
/// written out, not copied into a JSON tree first): the call's identifiers and outcome, then
/// its `result` when it committed or its `error` when it did not.
#[derive(serde::Serialize)]
struct Executed<'a> {
    ledger_id: &'a str,
    decision: &'static str,
    trace_id: &'a str,
    operation_id: &'a str,
    attempts: u32,
    replayed: bool,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

/// The outcome a committed call answers: `replayed` when the answer came from the
/// idempotency record, else `committed` (the same in every lane).
pub(crate) fn committed_outcome(replayed: bool) -> &'static str {
    if replayed { "replayed" } else { "committed" }
}

/// The message of a failed call: what failed and why, in one line.
pub(crate) fn failure_message(code: warrant_core::ToolErrorCode, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("the tool call failed ({}): {detail}", code.as_str()),
        None => format!("the tool call failed ({})", code.as_str()),
    }
}

/// Whether a failed call may be retried, as the answer spells it.
pub(crate) fn retryable(code: warrant_core::ToolErrorCode) -> &'static str {
    match code.retryable() {
        warrant_core::decision::Retryable::No => "no",
        warrant_core::decision::Retryable::Yes => "yes",
        warrant_core::decision::Retryable::OnlyIfIdempotent => "only_if_idempotent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_overloaded_store_is_answered_as_overloaded() {
        let response = not_executed(
            &warrant_core::store::StoreError::Overloaded("the SQLite write queue is full".into()),
            "trace-1",
        );
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "STORE_OVERLOADED", "{body}");
        assert_eq!(body["decision"], "none", "{body}");
        let response = not_executed(
            &warrant_core::store::StoreError::Unavailable("disk full".into()),
            "trace-1",
        );
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    /// The executed answers, written from borrowed parts, are the documents they were when
    /// built as JSON trees: the same keys in the same order, `result` or `error` last.
    #[test]
    fn executed_answers_keep_their_documents() {
        let result = json!({"rows": [1, 2], "note": "a \"quoted\" text"});
        let error = json!({"stage": "execute", "code": "UPSTREAM_ERROR", "detail": null});
        let body = |outcome, result, error| Executed {
            ledger_id: "led_1",
            decision: "allow",
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
            operation_id: "op_1",
            attempts: 2,
            replayed: false,
            outcome,
            result,
            error,
        };
        let tree = |outcome: &str, last: &str, value: &Value| {
            let mut tree = json!({
                "ledger_id": "led_1",
                "decision": "allow",
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "operation_id": "op_1",
                "attempts": 2,
                "replayed": false,
                "outcome": outcome,
            });
            if let Value::Object(map) = &mut tree {
                map.insert(last.into(), value.clone());
            }
            serde_json::to_string(&tree).ok()
        };
        assert_eq!(
            serde_json::to_string(&body("committed", Some(&result), None)).ok(),
            tree("committed", "result", &result)
        );
        assert_eq!(
            serde_json::to_string(&body("failed", None, Some(error.clone()))).ok(),
            tree("failed", "error", &error)
        );
    }
}
