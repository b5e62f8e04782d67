//! Liveness, readiness and metrics (no key needed: they carry no tenant data).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};

use crate::error::ApiError;
use crate::state::AppState;

/// The probes, `/healthz` and `/readyz`: mounted outside the in-flight limit, and answered
/// on the connections kept for them past the connection cap, so an orchestrator still gets
/// an answer from a busy gateway.
pub fn probes() -> Router<Arc<AppState>> {
    let [health, ready_path] = PROBE_PATHS;
    Router::new().route(health, get(healthz)).route(
        ready_path,
        get(ready).layer(Extension(Arc::new(Readiness::default()))),
    )
}

/// The paths of the probes ([`probes`]).
pub const PROBE_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The other unauthenticated routes: metrics and the OpenAPI document.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi_json))
}

/// How long `/readyz` waits for the store to take its write before answering 503.
pub const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one probe's answer is reused: `/readyz` needs no key, so however often it is
/// asked, the store takes at most one probe write a second from it.
const READY_PROBE_REUSE: Duration = Duration::from_secs(1);

/// The last readiness probe (one at a time: callers arriving during a probe wait for it).
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    last: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

/// The process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "ok", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// The store answers and takes a write.
// A read alone passes on a full disk or a read-only database, where every call would fail.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses((status = 200, description = "ready", body = String),
              (status = 503, description = "the store is unavailable", body = crate::openapi::ErrorBody)))]
pub(crate) async fn ready(
    State(state): State<Arc<AppState>>,
    Extension(readiness): Extension<Arc<Readiness>>,
) -> Result<&'static str, ApiError> {
    let mut last = readiness.last.lock().await;
    let ok = match *last {
        Some((at, ok)) if at.elapsed() < READY_PROBE_REUSE => ok,
        _ => {
            let ok = probe(&state).await;
            *last = Some((Instant::now(), ok));
            ok
        }
    };
    if ok {
        Ok("ready")
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "internal",
            "STORE_UNAVAILABLE",
            "the store cannot take writes; retry later",
        ))
    }
}

/// A read, then a write, within [`READY_PROBE_TIMEOUT`]; a failure is logged with its cause.
async fn probe(state: &AppState) -> bool {
    let checks = async {
        state.store.ping().await?;
        state.store.probe_write(state.env.now()).await
    };
    match tokio::time::timeout(READY_PROBE_TIMEOUT, checks).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "not ready: the store failed its probe");
            false
        }
        Err(_) => {
            tracing::warn!(
                timeout = ?READY_PROBE_TIMEOUT,
                "not ready: the store did not take the probe write in time"
            );
            false
        }
    }
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
