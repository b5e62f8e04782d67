//! Inbound webhooks: the receiving route, `POST /v1/inbound/{id}` (no API key: the delivery's
//! signature is its credential), and a tenant's sources (tenant admins): create (a secret
//! Warrant makes is shown once), list, rotate the secret (the previous one is accepted for 24
//! hours), disable or enable, and the events each received with what they did. See
//! `crate::inbound` and `docs/webhooks.md`.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use warrant_core::inbound::{InboundSecret, Provider};
use warrant_core::records::{InboundEvent, InboundSource};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::inbound::{Action, NotReceived, ROTATION_OVERLAP, Received, secret_aad};
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/inbound/{id}", post(receive))
        .route("/v1/inbound-sources", get(list).post(create))
        .route("/v1/inbound-sources/{id}/rotate", post(rotate))
        .route("/v1/inbound-sources/{id}/disable", post(disable))
        .route("/v1/inbound-sources/{id}/enable", post(enable))
        .route("/v1/inbound-sources/{id}/events", get(events))
        .route("/v1/inbound-sources/{id}/events/{event_id}", get(event))
}

/// Receive a signed event from an outside system: `202` when it was verified and stored (its
/// work then runs on the job runtime), `200` for a redelivery of an event already received.
#[utoipa::path(post, path = "/v1/inbound/{id}", tag = "inbound",
    params(("id" = String, Path, description = "the source id")),
    request_body(content = Object, description = "the provider's event, signed per the source's provider", content_type = "application/json"),
    responses((status = 202, description = "verified and stored; its work is queued", body = Object),
        (status = 200, description = "a redelivery: nothing new starts", body = Object),
        (status = 400, description = "verified, but not JSON or without an event id", body = crate::openapi::ErrorBody),
        (status = 401, description = "the signature is missing, malformed, stale or wrong", body = crate::openapi::ErrorBody),
        (status = 404, description = "no enabled source has this id", body = crate::openapi::ErrorBody),
        (status = 503, description = "the store is unavailable; nothing was stored", body = crate::openapi::ErrorBody)))]
pub(crate) async fn receive(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    match crate::inbound::receive(&state, &id, &headers, &body).await {
        Ok(Received::Accepted(event_id)) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"event_id": event_id, "status": "queued"})),
        )
            .into_response()),
        Ok(Received::Duplicate(event_id)) => Ok((
            StatusCode::OK,
            Json(json!({"event_id": event_id, "status": "duplicate"})),
        )
            .into_response()),
        Err(NotReceived::UnknownSource) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "inbound",
            "INBOUND_SOURCE_UNKNOWN",
            "no enabled inbound source has this id",
        )),
        Err(NotReceived::Refused(refusal)) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "inbound",
            "INBOUND_SIGNATURE_INVALID",
            refusal.to_string(),
        )),
        Err(NotReceived::Unreadable(why)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "inbound",
            "INBOUND_EVENT_UNREADABLE",
            why,
        )),
        Err(NotReceived::Store(e)) => Err(e.into()),
    }
}

fn source_json(state: &AppState, s: &InboundSource) -> Value {
    json!({
        "id": s.id,
        "url": format!("{}/v1/inbound/{}", state.public_url.trim_end_matches('/'), s.id),
        "provider": s.provider.as_str(),
        "key_id": s.key_id,
        "action": s.action,
        "description": s.description,
        "enabled": s.enabled,
        "rotating_until": s.previous_until.map(rfc3339),
        "refusals": s.refusals,
        "last_refusal": s.last_refusal,
        "last_refusal_at": s.last_refusal_at.map(rfc3339),
        "created_at": rfc3339(s.created_at),
        "updated_at": rfc3339(s.updated_at),
    })
}

fn event_json(e: &InboundEvent, with_body: bool) -> Value {
    let mut value = json!({
        "event_id": e.event_id,
        "source_id": e.source_id,
        "status": e.status.as_str(),
        "deliveries": e.deliveries,
        "detail": e.detail,
        "body_digest": e.body_digest,
        "received_at": rfc3339(e.received_at),
        "updated_at": rfc3339(e.updated_at),
    });
    if with_body && let Value::Object(map) = &mut value {
        map.insert("body".into(), e.body.clone());
    }
    value
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSource {
    provider: String,
    key_id: String,
    action: Value,
    secret: Option<String>,
    description: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Rotate {
    secret: Option<String>,
}

fn invalid(code: &str, why: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "request", code, why)
}

/// The secret a source verifies with: the one given (Stripe's is made by Stripe, so it must
/// be), or a new one made here, written as the provider expects it. Answers the secret and
/// whether it was made here (then it is shown once).
fn secret_for(provider: Provider, given: Option<String>) -> Result<(InboundSecret, bool), ApiError> {
    let (written, made) = match given {
        Some(text) => (text, false),
        None => {
            let bytes: [u8; 32] = rand::random();
            match provider {
                Provider::StandardWebhooks => (
                    format!(
                        "{}{}",
                        warrant_core::webhook::SECRET_PREFIX,
                        base64::engine::general_purpose::STANDARD.encode(bytes)
                    ),
                    true,
                ),
                Provider::Github => (hex::encode(bytes), true),
                Provider::Stripe => {
                    return Err(invalid(
                        "INBOUND_SECRET_REQUIRED",
                        "a Stripe source takes the signing secret Stripe shows for the endpoint (`secret`)",
                    ));
                }
            }
        }
    };
    InboundSecret::parse(provider, &written)
        .map(|s| (s, made))
        .map_err(|e| invalid("INBOUND_SECRET_INVALID", e.to_string()))
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], expected: &str) -> Result<T, ApiError> {
    let value = if body.is_empty() {
        json!({})
    } else {
        warrant_core::json::parse(body, warrant_core::json::Limits::PROPOSAL)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?
    };
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("expected {expected}: {e}")))
}

/// Create a source: answers it with its URL, and its secret when Warrant made it (shown only
/// here).
#[utoipa::path(post, path = "/v1/inbound-sources", tag = "inbound",
    request_body(content = Object, description = "{provider: standard_webhooks|stripe|github, key_id, action: {workflow: name@version, input?} | {tool: name@version|content id, arguments}, secret?, description?}", content_type = "application/json"),
    responses((status = 201, description = "created; `secret` is shown only here when Warrant made it", body = Object),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 403, description = "not an admin", body = crate::openapi::ErrorBody),
        (status = 422, description = "the provider, key, action or secret is refused", body = crate::openapi::ErrorBody)))]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let req: CreateSource = parse_body(&body, "{provider, key_id, action, secret, description}")?;
    let tenant = caller.principal.tenant().to_owned();
    let provider = Provider::parse(&req.provider).ok_or_else(|| {
        invalid(
            "INBOUND_PROVIDER_UNKNOWN",
            format!(
                "`{}` is not a provider (standard_webhooks, stripe, github)",
                req.provider
            ),
        )
    })?;
    if req.description.as_ref().is_some_and(|d| d.chars().count() > 200) {
        return Err(ApiError::bad_request("the description is over 200 characters"));
    }
    // The source acts as this key's principal: a key of this tenant, live, and not an admin's
    // (an outside system only starts work; it never administers).
    let keys = state.store.list_api_keys(&tenant).await?;
    let key = keys
        .iter()
        .find(|k| k.key.id == req.key_id && k.revoked_at.is_none())
        .ok_or_else(|| invalid("INBOUND_KEY_UNKNOWN", "no live key of this tenant has this id"))?;
    if key.key.roles.iter().any(|r| r == crate::auth::ADMIN_ROLE) {
        return Err(invalid(
            "INBOUND_KEY_ADMIN",
            "a source acts as an agent: give it a key without the admin role",
        ));
    }
    let action = Action::parse(&req.action).map_err(|why| invalid("INBOUND_ACTION_INVALID", why))?;
    let action = action
        .pin(&state, &tenant)
        .await?
        .map_err(|why| invalid("INBOUND_ACTION_INVALID", why))?;
    let (secret, made) = secret_for(provider, req.secret)?;
    let id = format!("ins_{}", hex::encode(rand::random::<[u8; 12]>()));
    let now = state.env.now();
    let source = InboundSource {
        secret: state
            .webhook_secrets
            .seal_text(secret.expose(), &secret_aad(&tenant, &id)),
        tenant,
        id,
        provider,
        previous_secret: None,
        previous_until: None,
        key_id: req.key_id,
        action: action.to_value(),
        description: req.description,
        enabled: true,
        refusals: 0,
        last_refusal: None,
        last_refusal_at: None,
        created_at: now,
        updated_at: now,
    };
    state.store.create_inbound_source(&source).await?;
    let mut answer = source_json(&state, &source);
    if made && let Value::Object(map) = &mut answer {
        map.insert("secret".into(), json!(secret.expose()));
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The tenant's sources (never their secrets).
#[utoipa::path(get, path = "/v1/inbound-sources", tag = "inbound",
    responses((status = 200, description = "the sources", body = Object),
        (status = 403, description = "not an admin", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let sources = state
        .store
        .list_inbound_sources(caller.principal.tenant())
        .await?;
    Ok(Json(json!({
        "sources": sources.iter().map(|s| source_json(&state, s)).collect::<Vec<_>>()
    })))
}

async fn own(state: &AppState, caller: &Caller, id: &str) -> Result<InboundSource, ApiError> {
    caller.require_admin()?;
    state
        .store
        .get_inbound_source(id)
        .await?
        .filter(|s| s.tenant == caller.principal.tenant())
        .ok_or_else(|| ApiError::not_found("inbound source"))
}

/// Rotate a source's secret (the one given, or a new one made here and shown only here); the
/// previous one is still accepted for 24 hours.
#[utoipa::path(post, path = "/v1/inbound-sources/{id}/rotate", tag = "inbound",
    params(("id" = String, Path, description = "source id")),
    request_body(content = Object, description = "{secret?}", content_type = "application/json"),
    responses((status = 200, description = "rotated", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody),
        (status = 422, description = "the secret is refused", body = crate::openapi::ErrorBody)))]
pub(crate) async fn rotate(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let mut source = own(&state, &caller, &id).await?;
    let req: Rotate = parse_body(&body, "{secret}")?;
    let (secret, made) = secret_for(source.provider, req.secret)?;
    let now = state.env.now();
    let sealed = state
        .webhook_secrets
        .seal_text(secret.expose(), &secret_aad(&source.tenant, &source.id));
    source.previous_secret = Some(std::mem::replace(&mut source.secret, sealed));
    source.previous_until = Some(now + ROTATION_OVERLAP);
    source.updated_at = now;
    state.store.update_inbound_source(&source).await?;
    let mut answer = source_json(&state, &source);
    if made && let Value::Object(map) = &mut answer {
        map.insert("secret".into(), json!(secret.expose()));
    }
    Ok(Json(answer))
}

async fn set_enabled(
    state: &AppState,
    caller: &Caller,
    id: &str,
    enabled: bool,
) -> Result<Json<Value>, ApiError> {
    let mut source = own(state, caller, id).await?;
    source.enabled = enabled;
    source.updated_at = state.env.now();
    state.store.update_inbound_source(&source).await?;
    Ok(Json(source_json(state, &source)))
}

/// Stop accepting deliveries (they answer `404`, so the provider retries them later).
#[utoipa::path(post, path = "/v1/inbound-sources/{id}/disable", tag = "inbound",
    params(("id" = String, Path, description = "source id")),
    responses((status = 200, description = "disabled", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn disable(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_enabled(&state, &caller, &id, false).await
}

/// Accept deliveries again.
#[utoipa::path(post, path = "/v1/inbound-sources/{id}/enable", tag = "inbound",
    params(("id" = String, Path, description = "source id")),
    responses((status = 200, description = "enabled", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn enable(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_enabled(&state, &caller, &id, true).await
}

/// The source's events, newest first: each with its deliveries and what it did (the run it
/// started, or its call's ledger row and outcome, or why it failed).
#[utoipa::path(get, path = "/v1/inbound-sources/{id}/events", tag = "inbound",
    params(("id" = String, Path, description = "source id"), ("limit" = Option<u32>, Query, description = "at most (default 50)")),
    responses((status = 200, description = "events", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn events(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<crate::routes::webhooks::DeliveriesQuery>,
) -> Result<Json<Value>, ApiError> {
    let source = own(&state, &caller, &id).await?;
    let events = state
        .store
        .list_inbound_events(&source.tenant, &source.id, q.limit.unwrap_or(50))
        .await?;
    Ok(Json(json!({
        "events": events.iter().map(|e| event_json(e, false)).collect::<Vec<_>>()
    })))
}

/// One event, with its body.
#[utoipa::path(get, path = "/v1/inbound-sources/{id}/events/{event_id}", tag = "inbound",
    params(("id" = String, Path, description = "source id"), ("event_id" = String, Path, description = "the provider's event id")),
    responses((status = 200, description = "the event", body = Object),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn event(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((id, event_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let source = own(&state, &caller, &id).await?;
    let event = state
        .store
        .get_inbound_event(&source.tenant, &source.id, &event_id)
        .await?
        .ok_or_else(|| ApiError::not_found("inbound event"))?;
    Ok(Json(event_json(&event, true)))
}
