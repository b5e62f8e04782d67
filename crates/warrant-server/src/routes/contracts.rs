//! Contracts: list and read (any caller), register and retire (admin).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use warrant_core::Contract;
use warrant_core::contract::{ContractError, DocumentFormat};
use warrant_core::records::{Registration, StoredContract};
use warrant_core::store::StoreError;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::proposals::header_text;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/contracts", get(list).post(register))
        .route("/v1/contracts/{name}/{version}", get(show))
        .route("/v1/contracts/{id}/retire", post(retire))
}

fn summary(c: &StoredContract) -> Value {
    json!({
        "id": c.content_id,
        "name": c.name,
        "version": c.version,
        "description": c.body.get("description"),
        "effect": c.body.get("effect"),
        "scopes": c.body.get("scopes"),
        "approval": c.body.get("approval"),
        "binding_digest": c.binding_digest,
        "registered_at": rfc3339(c.registered_at),
        "retired_at": c.retired_at.map(rfc3339),
    })
}

/// Registered contracts.
#[utoipa::path(get, path = "/v1/contracts", tag = "contracts",
    responses((status = 200, description = "every registered contract", body = crate::openapi::ContractList), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    _caller: Caller,
) -> Result<Json<Value>, ApiError> {
    let contracts = state.store.list_contracts().await?;
    Ok(Json(
        json!({"contracts": contracts.iter().map(summary).collect::<Vec<_>>()}),
    ))
}

/// One contract, with the document its id covers.
#[utoipa::path(get, path = "/v1/contracts/{name}/{version}", tag = "contracts",
    params(("name" = String, Path, description = "contract name"), ("version" = u32, Path, description = "version")),
    responses((status = 200, description = "the contract", body = crate::openapi::ContractSummary), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    _caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let version: u32 = version.parse().map_err(|_| ApiError::not_found("contract"))?;
    let stored = state
        .store
        .get_contract(&name, version)
        .await?
        .ok_or_else(|| ApiError::not_found("contract"))?;
    let mut body = summary(&stored);
    if let Value::Object(map) = &mut body {
        // The document the id covers; the binding (endpoints, credential names) stays inside.
        map.insert("document".into(), stored.body.clone());
    }
    Ok(Json(body))
}

/// Register a contract (admin).
#[utoipa::path(post, path = "/v1/contracts", tag = "contracts",
    request_body(content = String, description = "the contract document", content_type = "application/yaml"),
    responses(
        (status = 201, description = "registered", body = crate::openapi::Registered),
        (status = 200, description = "already registered with this body", body = crate::openapi::Registered),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 409, description = "conflict", body = crate::openapi::ErrorBody),
        (status = 415, description = "wrong content type", body = crate::openapi::ErrorBody),
        (status = 422, description = "invalid", body = crate::openapi::ErrorBody)))]
pub(crate) async fn register(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let format = match header_text(&headers, header::CONTENT_TYPE.as_str())
        .and_then(|ct| ct.split(';').next())
        .map(str::trim)
    {
        Some("application/json") => DocumentFormat::Json,
        Some("application/yaml" | "application/x-yaml" | "text/yaml") => DocumentFormat::Yaml,
        _ => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "request",
                "UNSUPPORTED_MEDIA_TYPE",
                "a contract is application/json or application/yaml",
            ));
        }
    };
    let text = std::str::from_utf8(&body).map_err(|_| ApiError::bad_request("the contract is not UTF-8"))?;
    let contract = match Contract::from_text(text, format) {
        Ok(c) => c,
        Err(ContractError::Syntax(message)) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "contract",
                "CONTRACT_SYNTAX",
                message,
            ));
        }
        Err(ContractError::Lint(problems)) => {
            let list: Vec<Value> = problems
                .iter()
                .map(|p| json!({"pointer": p.pointer(), "message": p.message()}))
                .collect();
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "contract",
                "CONTRACT_INVALID",
                format!("{} problem(s) in the contract", list.len()),
            )
            .with("problems", Value::Array(list)));
        }
    };
    if contract.adapter().is_some()
        && let Err(e) = state.adapters.validate(&contract)
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "contract",
            "ADAPTER_BINDING_INVALID",
            e.to_string(),
        ));
    }
    let now = state.env.now();
    let id = contract.id_str().to_owned();
    let (name, version) = (contract.name().to_owned(), contract.version());
    let outcome = match state.registry.register(contract, now).await {
        Ok(o) => o,
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "contract",
                "CONTRACT_VERSION_TAKEN",
                format!("{name}@{version} is registered with another body; register a new version"),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    state.sync_contracts().await?;
    let status = match outcome {
        Registration::Registered => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(json!({"id": id, "name": name, "version": version}))).into_response())
}

/// Retire a contract (admin): new calls are refused.
#[utoipa::path(post, path = "/v1/contracts/{id}/retire", tag = "contracts",
    params(("id" = String, Path, description = "content id")),
    responses((status = 200, description = "retired", body = crate::openapi::Retired), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn retire(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    if !state.registry.retire(&id, state.env.now()).await? {
        return Err(ApiError::not_found("contract"));
    }
    state.sync_contracts().await?;
    Ok(Json(json!({"id": id, "retired": true})))
}
