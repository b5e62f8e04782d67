//! API keys of the admin's tenant: list (ids and what they grant, never a key or its hash),
//! create (the key is shown once) and revoke. Keys of another tenant are the platform
//! operator's to create (`routes::tenants`).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde::Deserialize;
use serde_json::json;
use warrant_core::authority::Principal;
use warrant_core::records::NewApiKey;
use warrant_store::keys;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/keys", get(list).post(create))
        .route("/v1/keys/{id}", delete(revoke))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateKey {
    principal: String,
    #[serde(default)]
    grants: Vec<String>,
    #[serde(default)]
    roles: Vec<String>,
    label: Option<String>,
}

/// The keys of the admin's tenant, oldest first, revoked ones included (with `revoked_at`):
/// ids, principals, grants, roles and labels; never a key or its hash.
#[utoipa::path(get, path = "/v1/keys", tag = "keys",
    responses((status = 200, description = "the tenant's keys", body = crate::openapi::KeyList),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require_admin()?;
    let keys = state.store.list_api_keys(caller.principal.tenant()).await?;
    let keys: Vec<serde_json::Value> = keys
        .iter()
        .map(|k| {
            json!({
                "id": k.key.id,
                "tenant": k.key.tenant,
                "principal": k.key.principal,
                "grants": k.key.grants,
                "roles": k.key.roles,
                "label": k.key.label,
                "created_at": rfc3339(k.key.created_at),
                "revoked_at": k.revoked_at.map(rfc3339),
            })
        })
        .collect();
    Ok(Json(json!({"keys": keys})))
}

/// Create a key in the admin's tenant; the key is shown once.
#[utoipa::path(post, path = "/v1/keys", tag = "keys",
    request_body(content = crate::openapi::CreateKey, content_type = "application/json"),
    responses((status = 201, description = "created", body = crate::openapi::CreatedKey), (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody)))]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let req: CreateKey = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("expected {{principal, grants, roles, label}}: {e}")))?;
    let created = create_key(&state, caller.principal.tenant(), req).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Creates a key of `tenant` (the caller has been authorized for that tenant) and answers it,
/// shown once.
pub(crate) async fn create_key(
    state: &AppState,
    tenant: &str,
    req: CreateKey,
) -> Result<serde_json::Value, ApiError> {
    // The same identity rules as authentication: a key that could not authenticate is refused.
    Principal::new(&req.principal, tenant, req.grants.iter().cloned())
        .and_then(|p| p.with_roles(req.roles.iter().cloned()))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if req.label.as_ref().is_some_and(|l| l.chars().count() > 200) {
        return Err(ApiError::bad_request("the label is over 200 characters"));
    }
    let generated = keys::generate();
    state
        .store
        .create_api_key(&NewApiKey {
            id: generated.id.clone(),
            key_hash: generated.hash,
            tenant: tenant.to_owned(),
            principal: req.principal.clone(),
            grants: req.grants.clone(),
            roles: req.roles.clone(),
            label: req.label.clone(),
            created_at: state.env.now(),
        })
        .await?;
    Ok(json!({
        "id": generated.id,
        "key": generated.key,
        "tenant": tenant,
        "principal": req.principal,
        "grants": req.grants,
        "roles": req.roles,
        "label": req.label,
    }))
}

impl CreateKey {
    /// A tenant's first admin key.
    pub(crate) fn admin(principal: String) -> Self {
        CreateKey {
            principal,
            grants: Vec::new(),
            roles: vec![crate::auth::ADMIN_ROLE.to_owned()],
            label: Some("first admin".to_owned()),
        }
    }
}

/// Revoke a key.
#[utoipa::path(delete, path = "/v1/keys/{id}", tag = "keys",
    params(("id" = String, Path, description = "key id")),
    responses((status = 204, description = "revoked"), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn revoke(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require_admin()?;
    if state
        .store
        .revoke_api_key(caller.principal.tenant(), &id, state.env.now())
        .await?
    {
        // Refused here from now on; other nodes within `KEY_CACHE_TTL`.
        state.keys.forget(&id);
        if let Ok(mut live) = state.live_principals.lock() {
            live.clear();
        }
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("key"))
    }
}
