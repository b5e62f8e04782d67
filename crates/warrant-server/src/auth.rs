//! Authentication: `Authorization: Bearer wrn_…` on every route. The principal, its tenant,
//! grants and roles always come from the stored key, never from the request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use warrant_core::authority::Principal;
use warrant_store::keys::hash_presented;

use crate::error::ApiError;
use crate::state::AppState;

/// The role that may register contracts and manage keys (of its own tenant).
pub const ADMIN_ROLE: &str = "admin";

/// The reserved tenant of the platform operator: an admin of this tenant is the operator, who
/// owns tenants, platform contracts and adapter bindings (see `docs/security.md`). No other
/// tenant may be given this id, and only the operator creates keys in it.
pub const PLATFORM_TENANT: &str = "platform";

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

    /// Whether the caller is the platform operator (an admin of [`PLATFORM_TENANT`]).
    pub fn is_operator(&self) -> bool {
        self.principal.tenant() == PLATFORM_TENANT && self.principal.roles().contains(ADMIN_ROLE)
    }

    /// Refuses callers other than the platform operator.
    ///
    /// # Errors
    /// 403.
    pub fn require_operator(&self) -> Result<(), ApiError> {
        if self.is_operator() {
            Ok(())
        } else {
            Err(ApiError::forbidden("this is the platform operator's"))
        }
    }
}

/// How long a resolved key is trusted without asking the store again: the longest a key
/// revoked through another node keeps working here.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(2);

/// Recently resolved keys, so a request does not read its key from the store every time.
///
/// An entry lives for `ttl`: a key revoked through this gateway is dropped at once
/// ([`KeyCache::forget`]); a key revoked through another node sharing the database stops
/// working here within `ttl`. Unknown keys are remembered too, so a flood of forged keys costs
/// no database reads; the cache holds at most `capacity` entries and is emptied when full,
/// which bounds its memory whatever is presented. Written by hand (a map and a clock): the
/// cache crates bring eviction policies and background machinery this does not need.
#[derive(Debug)]
pub struct KeyCache {
    ttl: Duration,
    capacity: usize,
    entries: RwLock<HashMap<String, (Instant, Option<Caller>)>>,
    /// Bumped by every [`KeyCache::forget`]: a resolution read from the store before a
    /// revocation is not cached after it.
    revocations: AtomicU64,
}

impl KeyCache {
    /// A cache whose entries live for `ttl` (zero turns it off).
    pub fn new(ttl: Duration) -> Self {
        KeyCache {
            ttl,
            capacity: 10_000,
            entries: RwLock::new(HashMap::new()),
            revocations: AtomicU64::new(0),
        }
    }

    /// Taken before reading a key from the store, and passed to [`KeyCache::put`].
    fn revocations(&self) -> u64 {
        self.revocations.load(Ordering::Acquire)
    }

    /// The cached resolution of a key hash: `Some(None)` for a key known not to be valid.
    fn get(&self, hash: &str, now: Instant) -> Option<Option<Caller>> {
        let entries = self.entries.read().ok()?;
        let (at, caller) = entries.get(hash)?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| caller.clone())
    }

    /// Caches a resolution read from the store, unless a key was revoked since `seen` (from
    /// [`KeyCache::revocations`]) — it may be this one, read just before its revocation.
    fn put(&self, hash: String, caller: Option<Caller>, now: Instant, seen: u64) {
        if self.ttl.is_zero() {
            return;
        }
        if let Ok(mut entries) = self.entries.write() {
            if self.revocations() != seen {
                return;
            }
            if entries.len() >= self.capacity {
                entries.clear();
            }
            entries.insert(hash, (now, caller));
        }
    }

    /// Drops the key with public id `key_id` (it was just revoked).
    pub fn forget(&self, key_id: &str) {
        if let Ok(mut entries) = self.entries.write() {
            self.revocations.fetch_add(1, Ordering::AcqRel);
            entries.retain(|_, (_, caller)| caller.as_ref().is_none_or(|c| c.key_id != key_id));
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
    let now = Instant::now();
    if let Some(known) = state.keys.get(&hash, now) {
        return Ok(known);
    }
    let seen = state.keys.revocations();
    let caller = match state.store.find_api_key(&hash).await? {
        Some(record) if record.revoked_at.is_none() => {
            let key = record.key;
            let principal = Principal::new(&key.principal, &key.tenant, key.grants.iter().cloned())
                .and_then(|p| p.with_roles(key.roles.iter().cloned()))
                .map_err(|e| ApiError::internal(&e))?;
            Some(Caller {
                principal,
                key_id: key.id,
            })
        }
        _ => None,
    };
    state.keys.put(hash, caller.clone(), now, seen);
    Ok(caller)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::*;

    fn caller(key_id: &str) -> Caller {
        Caller {
            principal: Principal::new("agent", "acme", ["lookup_order".to_owned()]).unwrap(),
            key_id: key_id.into(),
        }
    }

    #[test]
    fn entries_expire_after_the_ttl_and_revoked_keys_are_forgotten_at_once() {
        let cache = KeyCache::new(Duration::from_secs(2));
        let t0 = Instant::now();
        cache.put("h1".into(), Some(caller("key_1")), t0, cache.revocations());
        cache.put("forged".into(), None, t0, cache.revocations());
        assert_eq!(cache.get("h1", t0).unwrap().unwrap().key_id, "key_1");
        assert!(
            cache.get("forged", t0).unwrap().is_none(),
            "an unknown key is remembered as unknown"
        );
        assert!(cache.get("h1", t0 + Duration::from_secs(2)).is_none(), "expired");
        cache.forget("key_1");
        assert!(cache.get("h1", t0).is_none(), "forgotten on revocation");
        assert!(cache.get("forged", t0).is_some(), "other entries stay");
    }

    #[test]
    fn a_resolution_read_before_a_revocation_is_not_cached() {
        let cache = KeyCache::new(Duration::from_secs(2));
        let t0 = Instant::now();
        // Read from the store (still valid), then the key is revoked, then the read lands.
        let seen = cache.revocations();
        cache.forget("key_1");
        cache.put("h1".into(), Some(caller("key_1")), t0, seen);
        assert!(cache.get("h1", t0).is_none(), "a stale resolution was cached");
        cache.put("h1".into(), None, t0, cache.revocations());
        assert!(cache.get("h1", t0).is_some());
    }

    #[test]
    fn a_full_cache_is_emptied_and_a_zero_ttl_caches_nothing() {
        let mut cache = KeyCache::new(Duration::from_secs(2));
        cache.capacity = 3;
        let t0 = Instant::now();
        for i in 0..3 {
            cache.put(format!("h{i}"), None, t0, cache.revocations());
        }
        cache.put("h3".into(), None, t0, cache.revocations());
        assert!(cache.get("h0", t0).is_none());
        assert!(cache.get("h3", t0).is_some());
        let off = KeyCache::new(Duration::ZERO);
        off.put("h".into(), Some(caller("k")), t0, off.revocations());
        assert!(off.get("h", t0).is_none());
    }
}
