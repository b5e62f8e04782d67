//! Authentication: `Authorization: Bearer wrn_…` on every route. The principal, its tenant,
//! grants and roles always come from the stored key, never from the request.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
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
/// working here within `ttl`. Unknown keys are remembered too, so repeating a forged key costs
/// no database reads — but in a map of their own: anyone can present any number of forged
/// keys, so that map is emptied when full, and it never pushes a valid key out. The valid map
/// fills only with keys an admin created; when full it drops its expired entries, then
/// everything (which costs one store read per key). Each holds at most `capacity` entries,
/// which bounds the memory whatever is presented. Written by hand (two maps and a clock): the
/// cache crates bring eviction policies and background machinery this does not need.
#[derive(Debug)]
pub struct KeyCache {
    ttl: Duration,
    capacity: usize,
    valid: RwLock<foldhash::HashMap<String, (Instant, Caller)>>,
    unknown: RwLock<foldhash::HashMap<String, Instant>>,
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
            valid: RwLock::default(),
            unknown: RwLock::default(),
            revocations: AtomicU64::new(0),
        }
    }

    /// Taken before reading a key from the store, and passed to [`KeyCache::put`].
    fn revocations(&self) -> u64 {
        self.revocations.load(Ordering::Acquire)
    }

    fn fresh(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) < self.ttl
    }

    /// The cached resolution of a key hash: `Some(None)` for a key known not to be valid.
    fn get(&self, hash: &str, now: Instant) -> Option<Option<Caller>> {
        if let Ok(valid) = self.valid.read()
            && let Some((at, caller)) = valid.get(hash)
            && self.fresh(*at, now)
        {
            return Some(Some(caller.clone()));
        }
        let unknown = self.unknown.read().ok()?;
        let at = unknown.get(hash)?;
        self.fresh(*at, now).then_some(None)
    }

    /// Caches a resolution read from the store, unless a key was revoked since `seen` (from
    /// [`KeyCache::revocations`]) — it may be this one, read just before its revocation.
    fn put(&self, hash: String, caller: Option<Caller>, now: Instant, seen: u64) {
        if self.ttl.is_zero() {
            return;
        }
        match caller {
            Some(caller) => {
                if let Ok(mut valid) = self.valid.write() {
                    if self.revocations() != seen {
                        return;
                    }
                    if valid.len() >= self.capacity {
                        valid.retain(|_, (at, _)| now.saturating_duration_since(*at) < self.ttl);
                    }
                    if valid.len() >= self.capacity {
                        valid.clear();
                    }
                    valid.insert(hash, (now, caller));
                }
            }
            None => {
                if let Ok(mut unknown) = self.unknown.write() {
                    if unknown.len() >= self.capacity {
                        unknown.clear();
                    }
                    unknown.insert(hash, now);
                }
            }
        }
    }

    /// Drops the key with public id `key_id` (it was just revoked).
    pub fn forget(&self, key_id: &str) {
        if let Ok(mut valid) = self.valid.write() {
            self.revocations.fetch_add(1, Ordering::AcqRel);
            valid.retain(|_, (_, caller)| caller.key_id != key_id);
        }
    }
}

/// Counts failed authentications per client address (`governor`'s keyed GCRA limiter): up to
/// `per_minute` in a burst, refilled at `per_minute` a minute. An address past its budget is
/// answered 429 with `Retry-After`, and until then a key the cache does not hold is refused
/// before the store is asked — so a flood of forged keys from one address costs no store
/// reads, while other addresses (and keys this gateway saw valid in the last
/// [`KEY_CACHE_TTL`]) are unaffected. IPv6 clients are counted by their /64, which one host
/// usually holds whole. Behind a reverse proxy every client shares the proxy's address.
///
/// Installed by [`crate::router`] as a request extension; requests served without it (a
/// router mounted elsewhere) are not limited.
#[derive(Debug, Clone)]
pub struct AuthLimiter {
    inner: Arc<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    failures: governor::DefaultKeyedRateLimiter<IpAddr>,
    /// Addresses past their budget, and until when (what `governor` answered on their last
    /// failure), so a request can be refused before its key is looked up.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
}

/// Addresses tracked at once, before expired entries are dropped (the budget of an address
/// not seen for a minute is full again, so forgetting it changes nothing).
const LIMITER_ADDRESSES: usize = 100_000;

impl AuthLimiter {
    /// A limiter allowing `per_minute` failures per address (at least one).
    pub fn new(per_minute: u32) -> Self {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        AuthLimiter {
            inner: Arc::new(LimiterState {
                failures: governor::RateLimiter::keyed(governor::Quota::per_minute(per_minute)),
                blocked: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// How long `peer` must still wait, if it is past its budget.
    fn blocked_for(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let blocked = self.inner.blocked.lock().ok()?;
        let until = blocked.get(&peer)?;
        let wait = until.saturating_duration_since(now);
        (!wait.is_zero()).then_some(wait)
    }

    /// Counts a failure of `peer`: `None` while within its budget, else how long to wait.
    fn fail(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let failures = &self.inner.failures;
        if failures.len() >= LIMITER_ADDRESSES {
            failures.retain_recent();
        }
        let not_until = failures.check_key(&peer).err()?;
        let wait = not_until.wait_time_from(failures.clock().now());
        if let Ok(mut blocked) = self.inner.blocked.lock() {
            if blocked.len() >= LIMITER_ADDRESSES {
                blocked.retain(|_, until| *until > now);
            }
            if blocked.len() >= LIMITER_ADDRESSES {
                blocked.clear();
            }
            blocked.insert(peer, now + wait);
        }
        Some(wait)
    }
}

/// The address a client's failures are counted under: IPv4 as is, IPv6 by its /64.
fn client_of(parts: &Parts) -> IpAddr {
    let ip = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
}

/// Why a request was not authenticated.
#[derive(Debug)]
pub enum AuthRefusal {
    /// No bearer key (401).
    Missing,
    /// An unknown, revoked or malformed key (401).
    Invalid,
    /// Too many failed authentications from this address (429, retry after this long).
    Limited(Duration),
    /// The store failed.
    Store(ApiError),
}

impl IntoResponse for AuthRefusal {
    fn into_response(self) -> Response {
        let (error, header) = match self {
            AuthRefusal::Missing => (
                ApiError::unauthorized("missing bearer key"),
                (
                    WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"warrant\""),
                ),
            ),
            AuthRefusal::Invalid => (
                ApiError::unauthorized("unknown, revoked or malformed key"),
                (
                    WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"warrant\""),
                ),
            ),
            AuthRefusal::Limited(wait) => {
                // Whole seconds, rounded up: a client that waits exactly this long gets in.
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                (
                    ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "auth",
                        "AUTH_RATE_LIMITED",
                        "too many failed authentications from this address; retry later",
                    ),
                    (RETRY_AFTER, HeaderValue::from(secs.max(1))),
                )
            }
            AuthRefusal::Store(e) => return e.into_response(),
        };
        let mut response = error.into_response();
        response.headers_mut().insert(header.0, header.1);
        response
    }
}

/// Resolves a presented key to its caller; `None` for unknown, revoked or malformed keys.
/// Not rate limited: for the stdio lane, whose one key comes from the operator.
///
/// # Errors
/// A store failure.
pub async fn authenticate(state: &AppState, presented: &str) -> Result<Option<Caller>, ApiError> {
    // A key that is not shaped like one never reaches the database.
    let Some(hash) = hash_presented(presented) else {
        return Ok(None);
    };
    let now = Instant::now();
    match state.keys.get(&hash, now) {
        Some(known) => Ok(known),
        None => look_up(state, hash, now).await,
    }
}

/// Reads a key from the store and caches the answer.
async fn look_up(state: &AppState, hash: String, now: Instant) -> Result<Option<Caller>, ApiError> {
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

/// Authenticates an HTTP request by its bearer key, counting failures against the client's
/// address (see [`AuthLimiter`]); every HTTP lane (the API and `/mcp`) goes through here.
///
/// # Errors
/// 401, 429, or a store failure.
pub async fn authenticate_request(state: &AppState, parts: &Parts) -> Result<Caller, AuthRefusal> {
    let token = bearer(parts).ok_or(AuthRefusal::Missing)?;
    authenticate_presented(state, parts, token).await
}

/// The caller of an API key presented some other way than a bearer header (the console's
/// sign-in form), counted and limited per client address exactly like a bearer key.
///
/// # Errors
/// 401, 429, or a store failure.
pub async fn authenticate_presented(
    state: &AppState,
    parts: &Parts,
    token: &str,
) -> Result<Caller, AuthRefusal> {
    let limiter = parts.extensions.get::<AuthLimiter>();
    let client = client_of(parts);
    let now = Instant::now();
    let hash = hash_presented(token);
    let cached = hash.as_deref().and_then(|h| state.keys.get(h, now));
    let caller = match (hash, cached) {
        (_, Some(Some(caller))) => return Ok(caller),
        (Some(hash), None) => {
            if let Some(wait) = limiter.and_then(|l| l.blocked_for(client, now)) {
                return Err(AuthRefusal::Limited(wait));
            }
            look_up(state, hash, now).await.map_err(AuthRefusal::Store)?
        }
        // Malformed, or known not to be valid: no store read, but a failure all the same.
        (None, _) | (Some(_), Some(None)) => None,
    };
    match caller {
        Some(caller) => Ok(caller),
        None => Err(match limiter.and_then(|l| l.fail(client, now)) {
            Some(wait) => AuthRefusal::Limited(wait),
            None => AuthRefusal::Invalid,
        }),
    }
}

/// The caller of a stored key hash (a console session's key), through the key cache: `None`
/// for a key revoked or unknown.
///
/// # Errors
/// A store failure.
pub async fn caller_by_hash(state: &AppState, hash: &str) -> Result<Option<Caller>, ApiError> {
    let now = Instant::now();
    match state.keys.get(hash, now) {
        Some(known) => Ok(known),
        None => look_up(state, hash.to_owned(), now).await,
    }
}

/// The bearer token of a request, if it has a well-formed `Authorization` header.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = AuthRefusal;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        authenticate_request(state, parts).await
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
    fn forged_keys_never_evict_a_valid_cached_key() {
        let mut cache = KeyCache::new(Duration::from_secs(2));
        cache.capacity = 4;
        let t0 = Instant::now();
        cache.put("valid".into(), Some(caller("key_1")), t0, cache.revocations());
        // A flood of distinct forged keys, many times what the cache holds.
        for i in 0..100 {
            cache.put(format!("forged{i}"), None, t0, cache.revocations());
        }
        assert_eq!(
            cache.get("valid", t0).unwrap().unwrap().key_id,
            "key_1",
            "forged keys pushed a valid key out of the cache"
        );
        assert!(
            cache.get("forged99", t0).is_some(),
            "the latest forged key is remembered"
        );
    }

    #[test]
    fn failures_past_the_budget_are_limited_for_that_address_only() {
        let limiter = AuthLimiter::new(3);
        let now = Instant::now();
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        for _ in 0..3 {
            assert!(limiter.fail(a, now).is_none(), "within the budget");
        }
        assert!(limiter.blocked_for(a, now).is_none());
        let wait = limiter.fail(a, now).expect("past the budget");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(limiter.blocked_for(a, now).is_some());
        assert!(limiter.blocked_for(a, now + wait).is_none(), "the block ends");
        assert!(limiter.blocked_for(b, now).is_none());
        assert!(
            limiter.fail(b, now).is_none(),
            "another address has its own budget"
        );
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
