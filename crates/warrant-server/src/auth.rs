//! Authentication: `Authorization: Bearer wrn_…` on every route. The principal, its tenant,
//! grants and roles always come from the stored key, never from the request.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use warrant_core::authority::Principal;
use warrant_store::keys::hash_presented;

use crate::error::ApiError;
use crate::state::AppState;

/// The role that may register contracts and manage keys.
pub const ADMIN_ROLE: &str = "admin";

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The principal the key maps to.
    pub principal: Principal,
    /// The key's public id.
    pub key_id: String,
}

impl Caller {
    /// Refuses callers without the admin role.
    ///
    /// # Errors
    /// 403.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.principal.roles().contains(ADMIN_ROLE) {
            Ok(())
        } else {
            Err(ApiError::forbidden("this needs the admin role"))
        }
    }
}

/// Resolves a presented key to its caller; `None` for unknown, revoked or malformed keys.
///
/// # Errors
/// A store failure.
pub async fn authenticate(state: &AppState, presented: &str) -> Result<Option<Caller>, ApiError> {
    // A key that is not shaped like one never reaches the database.
    let Some(hash) = hash_presented(presented) else {
        return Ok(None);
    };
    let Some(record) = state.store.find_api_key(&hash).await? else {
        return Ok(None);
    };
    if record.revoked_at.is_some() {
        return Ok(None);
    }
    let key = record.key;
    let principal = Principal::new(&key.principal, &key.tenant, key.grants.iter().cloned())
        .and_then(|p| p.with_roles(key.roles.iter().cloned()))
        .map_err(|e| ApiError::internal(&e))?;
    Ok(Some(Caller {
        principal,
        key_id: key.id,
    }))
}

/// The bearer token of a request, if it has a well-formed `Authorization` header.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let token = bearer(parts).ok_or_else(|| ApiError::unauthorized("missing bearer key"))?;
        authenticate(state, token)
            .await?
            .ok_or_else(|| ApiError::unauthorized("unknown, revoked or malformed key"))
    }
}
