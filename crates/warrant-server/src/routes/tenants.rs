//! Tenants (the platform operator's): create a tenant with its first admin key, list them, and
//! create keys in any tenant. A tenant admin manages only its own tenant's keys
//! (`routes::keys`); nothing here is reachable with a tenant's key.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use warrant_core::records::TenantRecord;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::contracts::check_tenant_id;
use crate::routes::keys::{CreateKey, create_key};
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/tenants", get(list).post(create))
        .route("/v1/tenants/{id}/keys", post(create_tenant_key))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTenant {
    id: String,
    label: Option<String>,
    /// The principal of the first admin key (default `admin`).
    admin: Option<String>,
}

/// Create a tenant and its first admin key (operator); the key is shown once.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants",
    request_body(content = crate::openapi::CreateTenant, content_type = "application/json"),
    responses((status = 201, description = "created, with the first admin key", body = crate::openapi::CreatedTenant),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not the platform operator", body = crate::openapi::ErrorBody),
        (status = 409, description = "the tenant exists", body = crate::openapi::ErrorBody)))]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_operator()?;
    let req: CreateTenant = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("expected {{id, label, admin}}: {e}")))?;
    check_tenant_id(&req.id)?;
    if req.label.as_ref().is_some_and(|l| l.chars().count() > 200) {
        return Err(ApiError::bad_request("the label is over 200 characters"));
    }
    let record = TenantRecord {
        id: req.id.clone(),
        label: req.label.clone(),
        created_at: state.env.now(),
    };
    if !state.store.create_tenant(&record).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "request",
            "TENANT_EXISTS",
            format!("tenant `{}` exists", req.id),
        ));
    }
    let key = create_key(
        &state,
        &req.id,
        CreateKey::admin(req.admin.unwrap_or_else(|| "admin".to_owned())),
    )
    .await?;
    let body = json!({"id": record.id, "label": record.label, "created_at": rfc3339(record.created_at), "admin_key": key});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Every tenant (operator).
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants",
    responses((status = 200, description = "the tenants", body = crate::openapi::TenantList),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not the platform operator", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    caller.require_operator()?;
    let tenants: Vec<Value> = state
        .store
        .list_tenants()
        .await?
        .iter()
        .map(|t| json!({"id": t.id, "label": t.label, "created_at": rfc3339(t.created_at)}))
        .collect();
    Ok(Json(json!({"tenants": tenants})))
}

/// Create a key in a tenant (operator); the key is shown once.
#[utoipa::path(post, path = "/v1/tenants/{id}/keys", tag = "tenants",
    params(("id" = String, Path, description = "tenant id")),
    request_body(content = crate::openapi::CreateKey, content_type = "application/json"),
    responses((status = 201, description = "created", body = crate::openapi::CreatedKey),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not the platform operator", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant", body = crate::openapi::ErrorBody)))]
pub(crate) async fn create_tenant_key(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(tenant): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_operator()?;
    let req: CreateKey = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("expected {{principal, grants, roles, label}}: {e}")))?;
    let known = tenant == crate::auth::PLATFORM_TENANT
        || state.store.list_tenants().await?.iter().any(|t| t.id == tenant);
    if !known {
        return Err(ApiError::not_found("tenant"));
    }
    let created = create_key(&state, &tenant, req).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}
