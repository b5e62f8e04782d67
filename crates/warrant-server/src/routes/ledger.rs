//! The ledger of the caller's tenant: filtered, cursor-paginated listing and single rows.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use warrant_core::records::{LedgerEntry, LedgerFilter, Outcome};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/ledger", get(list))
        .route("/v1/ledger/{id}", get(show))
}

/// A ledger row as the API shows it (arguments already redacted by the pipeline).
pub fn ledger_json(e: &LedgerEntry) -> Value {
    json!({
        "id": e.id,
        "tenant": e.tenant,
        "principal": e.principal,
        "trace_id": e.trace_id,
        "run_id": e.run_id,
        "step_id": e.step_id,
        "tool": e.tool,
        "contract_id": e.contract_id,
        "binding_digest": e.binding_digest,
        "payload_digest": e.payload_digest,
        "decision": e.decision.as_str(),
        "stage": e.stage,
        "error_code": e.error_code,
        "detail": e.detail,
        "approval_id": e.approval_id,
        "idempotency_key": e.idempotency_key,
        "attempts": e.attempts,
        "outcome": e.outcome.map(Outcome::as_str),
        "created_at": rfc3339(e.created_at),
        "updated_at": rfc3339(e.updated_at),
        "latency_ms": e.latency_ms,
        "cost": e.cost,
        "arguments": e.arguments,
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    tool: Option<String>,
    outcome: Option<String>,
    principal: Option<String>,
    since: Option<String>,
    until: Option<String>,
    trace_id: Option<String>,
    approval_id: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
}

fn time_param(name: &str, value: Option<&str>) -> Result<Option<OffsetDateTime>, ApiError> {
    value
        .map(|v| {
            OffsetDateTime::parse(v, &Rfc3339)
                .map_err(|_| ApiError::bad_request(format!("`{name}` must be an RFC 3339 time")))
        })
        .transpose()
}

/// Ledger rows of the caller's tenant, newest first.
#[utoipa::path(get, path = "/v1/ledger", tag = "ledger",
    params(("tool" = Option<String>, Query, description = "only this tool"),
           ("outcome" = Option<String>, Query, description = "only this outcome"),
           ("principal" = Option<String>, Query, description = "only this principal"),
           ("since" = Option<String>, Query, description = "RFC 3339, inclusive"),
           ("until" = Option<String>, Query, description = "RFC 3339, exclusive"),
           ("trace_id" = Option<String>, Query, description = "only this trace (narrow with since/until on a large ledger)"),
           ("approval_id" = Option<String>, Query, description = "only this approval request's rows"),
           ("cursor" = Option<String>, Query, description = "from next_cursor"),
           ("limit" = Option<u32>, Query, description = "1..=500, default 100")),
    responses((status = 200, description = "one page", body = crate::openapi::LedgerPage), (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let outcome = match q.outcome.as_deref() {
        None => None,
        Some(o) => {
            Some(Outcome::parse(o).ok_or_else(|| ApiError::bad_request(format!("unknown outcome `{o}`")))?)
        }
    };
    let filter = LedgerFilter {
        tool: q.tool,
        outcome,
        principal: q.principal,
        since: time_param("since", q.since.as_deref())?,
        until: time_param("until", q.until.as_deref())?,
        trace_id: q.trace_id,
        approval_id: q.approval_id,
        cursor: q.cursor,
        limit: q.limit.unwrap_or(100).clamp(1, 500),
    };
    let page = state
        .store
        .list_ledger(caller.principal.tenant(), &filter)
        .await
        .map_err(|e| match e {
            warrant_core::store::StoreError::Invalid(m) => ApiError::bad_request(m),
            other => other.into(),
        })?;
    Ok(Json(json!({
        "entries": page.entries.iter().map(ledger_json).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })))
}

/// One ledger row.
#[utoipa::path(get, path = "/v1/ledger/{id}", tag = "ledger",
    params(("id" = String, Path, description = "ledger id")),
    responses((status = 200, description = "the row", body = crate::openapi::LedgerRow), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let entry = state
        .store
        .get_ledger(caller.principal.tenant(), &id)
        .await?
        .ok_or_else(|| ApiError::not_found("ledger row"))?;
    Ok(Json(ledger_json(&entry)))
}
