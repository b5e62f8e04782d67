//! A tenant's outbound webhook endpoints (tenant admins): create (the secret is shown once),
//! list, rotate the secret (the previous one keeps signing for 24 hours), disable or enable,
//! the attempts of recent deliveries, the dead-letter queue and its replay. See
//! `crate::webhooks` and `docs/webhooks.md`.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use warrant_core::records::{WEBHOOK_JOB, WebhookAttempt, WebhookEndpoint};
use warrant_core::webhook::WebhookSecret;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;
use crate::webhooks::secret_aad;

/// The event types an endpoint may subscribe to (all of them when it names none).
pub const EVENT_TYPES: &[&str] = &[
    "invocation.completed",
    "invocation.reconciled",
    "approval.requested",
    "approval.decided",
    "approval.expired",
    "run.started",
    "run.waiting",
    "run.completed",
    "run.failed",
    "contract.registered",
    "contract.retired",
    "budget.exhausted",
];
/// How long the previous secret keeps signing after a rotation.
const ROTATION_OVERLAP: time::Duration = time::Duration::hours(24);

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/webhooks", get(list).post(create))
        .route("/v1/webhooks/dead", get(dead))
        .route("/v1/webhooks/dead/{id}/replay", post(replay))
        .route("/v1/webhooks/{id}/rotate", post(rotate))
        .route("/v1/webhooks/{id}/disable", post(disable))
        .route("/v1/webhooks/{id}/enable", post(enable))
        .route("/v1/webhooks/{id}/deliveries", get(deliveries))
}

fn endpoint_json(state: &AppState, w: &WebhookEndpoint) -> Value {
    let public_key = state
        .webhook_secrets
        .open(&w.secret, &secret_aad(&w.tenant, &w.id))
        .and_then(|signer| signer.public_key());
    json!({
        "signature": if public_key.is_some() { "ed25519" } else { "hmac" },
        "public_key": public_key,
        "id": w.id,
        "url": w.url,
        "events": w.events,
        "description": w.description,
        "enabled": w.enabled,
        "disabled_reason": w.disabled_reason,
        "rotating_until": w.previous_until.map(rfc3339),
        "created_at": rfc3339(w.created_at),
        "updated_at": rfc3339(w.updated_at),
    })
}

fn attempt_json(a: &WebhookAttempt) -> Value {
    json!({
        "message_id": a.message_id,
        "endpoint_id": a.endpoint_id,
        "attempt": a.attempt,
        "at": rfc3339(a.at),
        "status": a.status,
        "latency_ms": a.latency_ms,
        "response": a.response,
        "error": a.error,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateEndpoint {
    url: String,
    #[serde(default)]
    events: Vec<String>,
    description: Option<String>,
    /// `hmac` (the default: `v1` signatures under a shared secret) or `ed25519` (`v1a`:
    /// receivers verify with the public key).
    signature: Option<String>,
}

/// A new signing key: its written form (to seal) and the secret to show once (an HMAC secret;
/// an Ed25519 key's is never shown — receivers get its public key).
fn new_key(ed25519: bool) -> Result<(String, Option<String>), ApiError> {
    if ed25519 {
        let (_, written) = crate::webhooks::Signer::new_ed25519().map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "webhooks",
                "RANDOMNESS_UNAVAILABLE",
                "no key could be made",
            )
        })?;
        return Ok((written, None));
    }
    let secret =
        WebhookSecret::from_bytes(rand::random::<[u8; 32]>().to_vec()).map_err(|e| ApiError::internal(&e))?;
    Ok((secret.expose(), Some(secret.expose())))
}

/// Checks an endpoint URL: `https` (or `http` to a host the operator allows), a host, no
/// credentials, and an address the outbound guard accepts (a private one only where the
/// operator allows that host).
async fn checked_url(state: &AppState, text: &str) -> Result<url::Url, ApiError> {
    let invalid = |why: &str| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "request",
            "WEBHOOK_URL_INVALID",
            why.to_owned(),
        )
    };
    let url = url::Url::parse(text).map_err(|_| invalid("the URL does not parse"))?;
    if !matches!(url.scheme(), "https" | "http") || !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("an endpoint is an http(s) URL without credentials"));
    }
    let host = url.host_str().ok_or_else(|| invalid("the URL has no host"))?;
    let port = url.port_or_known_default().unwrap_or(443);
    state
        .adapters
        .config()
        .client
        .vet(url.scheme() == "https", host, port)
        .await
        .map_err(|e| {
            invalid(&format!(
                "the endpoint is not reachable under the outbound rules: {e}"
            ))
        })?;
    Ok(url)
}

/// Create an endpoint: answers it with its secret, shown only here.
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks",
    request_body(content = Object, description = "{url, events?, description?}", content_type = "application/json"),
    responses((status = 201, description = "created; `secret` is shown only here", body = Object),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 403, description = "not an admin", body = crate::openapi::ErrorBody),
        (status = 422, description = "the URL or an event type is refused", body = crate::openapi::ErrorBody)))]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let value = warrant_core::json::parse(&body, warrant_core::json::Limits::PROPOSAL)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let req: CreateEndpoint = serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request(format!("expected {{url, events, description, signature}}: {e}"))
    })?;
    if let Some(unknown) = req.events.iter().find(|e| !EVENT_TYPES.contains(&e.as_str())) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "request",
            "WEBHOOK_EVENT_UNKNOWN",
            format!("`{unknown}` is not an event type"),
        ));
    }
    if req.description.as_ref().is_some_and(|d| d.chars().count() > 200) || req.url.len() > 2048 {
        return Err(ApiError::bad_request(
            "the description is over 200 characters or the URL over 2048",
        ));
    }
    let ed25519 = match req.signature.as_deref() {
        None | Some("hmac") => false,
        Some("ed25519") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "request",
                "WEBHOOK_SIGNATURE_UNKNOWN",
                format!("`{other}` is not a signature scheme (hmac, ed25519)"),
            ));
        }
    };
    let url = checked_url(&state, &req.url).await?;
    let tenant = caller.principal.tenant().to_owned();
    let id = format!("whe_{}", hex::encode(rand::random::<[u8; 10]>()));
    let (written, shown) = new_key(ed25519)?;
    let now = state.env.now();
    let endpoint = WebhookEndpoint {
        secret: state
            .webhook_secrets
            .seal_text(&written, &secret_aad(&tenant, &id)),
        tenant,
        id,
        url: url.to_string(),
        events: req.events,
        previous_secret: None,
        previous_until: None,
        description: req.description,
        enabled: true,
        disabled_reason: None,
        created_at: now,
        updated_at: now,
    };
    state.store.create_webhook(&endpoint).await?;
    let mut answer = endpoint_json(&state, &endpoint);
    if let (Value::Object(map), Some(secret)) = (&mut answer, shown) {
        map.insert("secret".into(), json!(secret));
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The tenant's endpoints (never their secrets).
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks",
    responses((status = 200, description = "the endpoints", body = Object),
        (status = 403, description = "not an admin", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let endpoints = state.store.list_webhooks(caller.principal.tenant()).await?;
    Ok(Json(
        json!({"endpoints": endpoints.iter().map(|e| endpoint_json(&state, e)).collect::<Vec<_>>()}),
    ))
}

async fn own(state: &AppState, caller: &Caller, id: &str) -> Result<WebhookEndpoint, ApiError> {
    caller.require_admin()?;
    state
        .store
        .get_webhook(caller.principal.tenant(), id)
        .await?
        .ok_or_else(|| ApiError::not_found("webhook endpoint"))
}

/// Rotate an endpoint's secret: the new one is shown only here; the previous one keeps
/// signing beside it for 24 hours.
#[utoipa::path(post, path = "/v1/webhooks/{id}/rotate", tag = "webhooks",
    params(("id" = String, Path, description = "endpoint id")),
    responses((status = 200, description = "rotated; `secret` is shown only here", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn rotate(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut endpoint = own(&state, &caller, &id).await?;
    let aad = secret_aad(&endpoint.tenant, &endpoint.id);
    // The same kind of key as before.
    let ed25519 = state
        .webhook_secrets
        .open(&endpoint.secret, &aad)
        .is_some_and(|signer| signer.public_key().is_some());
    let (written, shown) = new_key(ed25519)?;
    let now = state.env.now();
    endpoint.previous_secret = Some(std::mem::replace(
        &mut endpoint.secret,
        state.webhook_secrets.seal_text(&written, &aad),
    ));
    endpoint.previous_until = Some(now + ROTATION_OVERLAP);
    endpoint.updated_at = now;
    state.store.update_webhook(&endpoint).await?;
    let mut answer = endpoint_json(&state, &endpoint);
    if let (Value::Object(map), Some(secret)) = (&mut answer, shown) {
        map.insert("secret".into(), json!(secret));
    }
    Ok(Json(answer))
}

async fn set_enabled(
    state: &AppState,
    caller: &Caller,
    id: &str,
    enabled: bool,
) -> Result<Json<Value>, ApiError> {
    let mut endpoint = own(state, caller, id).await?;
    endpoint.enabled = enabled;
    endpoint.disabled_reason = (!enabled).then(|| format!("disabled by {}", caller.principal.id()));
    endpoint.updated_at = state.env.now();
    state.store.update_webhook(&endpoint).await?;
    Ok(Json(endpoint_json(state, &endpoint)))
}

/// Stop delivering to an endpoint.
#[utoipa::path(post, path = "/v1/webhooks/{id}/disable", tag = "webhooks",
    params(("id" = String, Path, description = "endpoint id")),
    responses((status = 200, description = "disabled", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn disable(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_enabled(&state, &caller, &id, false).await
}

/// Deliver to an endpoint again.
#[utoipa::path(post, path = "/v1/webhooks/{id}/enable", tag = "webhooks",
    params(("id" = String, Path, description = "endpoint id")),
    responses((status = 200, description = "enabled", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn enable(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_enabled(&state, &caller, &id, true).await
}

/// `?limit=` of a listing (default 50).
#[derive(Debug, Deserialize)]
pub(crate) struct DeliveriesQuery {
    pub(crate) limit: Option<u32>,
}

/// The endpoint's recent delivery attempts, newest first.
#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "endpoint id"), ("limit" = Option<u32>, Query, description = "at most (default 50)")),
    responses((status = 200, description = "attempts", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn deliveries(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<DeliveriesQuery>,
) -> Result<Json<Value>, ApiError> {
    let endpoint = own(&state, &caller, &id).await?;
    let attempts = state
        .store
        .list_webhook_attempts(&endpoint.tenant, None, Some(&endpoint.id), q.limit.unwrap_or(50))
        .await?;
    Ok(Json(
        json!({"attempts": attempts.iter().map(attempt_json).collect::<Vec<_>>()}),
    ))
}

/// The dead-letter queue: messages whose attempts are spent, each with its attempts.
#[utoipa::path(get, path = "/v1/webhooks/dead", tag = "webhooks",
    responses((status = 200, description = "dead messages", body = Object),
        (status = 403, description = "not an admin", body = crate::openapi::ErrorBody)))]
pub(crate) async fn dead(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let tenant = caller.principal.tenant();
    let mut messages = Vec::new();
    for job in state.store.list_dead_jobs(tenant, 500).await? {
        if job.job.kind != WEBHOOK_JOB {
            continue;
        }
        let attempts = state
            .store
            .list_webhook_attempts(tenant, Some(&job.job.id), None, 50)
            .await?;
        messages.push(json!({
            "message_id": job.job.id,
            "event_id": job.job.payload.get("event_id"),
            "endpoint_id": job.job.payload.get("endpoint_id"),
            "type": job.job.payload.pointer("/body/type"),
            "last_error": job.last_error,
            "attempts": attempts.iter().map(attempt_json).collect::<Vec<_>>(),
        }));
    }
    Ok(Json(json!({"messages": messages})))
}

/// Replay a dead message: delivered again (same event id), its attempts reset.
#[utoipa::path(post, path = "/v1/webhooks/dead/{id}/replay", tag = "webhooks",
    params(("id" = String, Path, description = "message id")),
    responses((status = 200, description = "queued again", body = Object),
        (status = 404, description = "no such dead message", body = crate::openapi::ErrorBody)))]
pub(crate) async fn replay(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    if !id.starts_with("whm_")
        || !state
            .store
            .requeue_dead_job(caller.principal.tenant(), &id, state.env.now())
            .await?
    {
        return Err(ApiError::not_found("dead message"));
    }
    Ok(Json(json!({"message_id": id, "queued": true})))
}
