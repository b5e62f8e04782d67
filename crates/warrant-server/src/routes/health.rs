//! Liveness, readiness and metrics (no key needed: they carry no tenant data).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::ApiError;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi_json))
}

/// The process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "ok", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// The store answers.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses((status = 200, description = "ready", body = String),
              (status = 503, description = "the store is unavailable", body = crate::openapi::ErrorBody)))]
pub(crate) async fn ready(State(state): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    state.store.ping().await?;
    Ok("ready")
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

/// This API's OpenAPI document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "health", security(()),
    responses((status = 200, description = "the OpenAPI 3.1 document", body = Object)))]
pub(crate) async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::document(),
    )
        .into_response()
}
