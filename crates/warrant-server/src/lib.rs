//! Warrant's gateway (PRODUCT §10): the HTTP API under `/v1`, health and metrics, over the one
//! pipeline (`warrant_runtime::dispatch`). `warrant serve` is a thin wrapper over [`serve`],
//! which tests call with a port-0 listener.
//!
//! **API boundary:** only this crate knows HTTP. Wire shapes are built here from domain types;
//! the core and runtime never see a request.

pub mod auth;
pub mod bootstrap;
pub mod error;
pub mod mcp;
pub mod openapi;
pub mod routes;
pub mod state;
pub mod trace;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;

pub use bootstrap::{Gateway, GatewayConfig, HttpLimits, StartError};
pub use error::ApiError;
pub use state::{AppState, ContractChanges, ReloadablePolicy};

/// The whole HTTP application.
pub fn router(state: Arc<AppState>, limits: HttpLimits) -> Router {
    let api = Router::new()
        .merge(routes::proposals::router())
        .merge(routes::contracts::router())
        .merge(routes::approvals::router())
        .merge(routes::ledger::router())
        .merge(routes::keys::router())
        .merge(routes::tenants::router())
        .merge(routes::health::router())
        .merge(mcp::router(&state))
        .route_layer(axum::middleware::from_fn(trace::observe))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "route", "NOT_FOUND", "no such route").into_response()
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "route",
                "METHOD_NOT_ALLOWED",
                "method not allowed",
            )
            .into_response()
        });
    api.with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(
                    |e: tower::BoxError| async move {
                        if e.is::<tower::timeout::error::Elapsed>() {
                            ApiError::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "request",
                                "TIMEOUT",
                                "the request took too long",
                            )
                        } else if e.is::<tower::load_shed::error::Overloaded>() {
                            ApiError::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "request",
                                "OVERLOADED",
                                "too many requests in flight",
                            )
                        } else {
                            ApiError::internal(&e)
                        }
                    },
                ))
                .load_shed()
                .concurrency_limit(limits.concurrency)
                .timeout(limits.request_timeout)
                .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "INTERNAL",
                        "internal error",
                    )
                    .into_response()
                }))
                .layer(RequestBodyLimitLayer::new(limits.body_bytes)),
        )
        .layer(axum::extract::DefaultBodyLimit::max(limits.body_bytes))
        .layer(axum::middleware::map_response(json_errors))
}

/// Answers every error in the one JSON shape, including those produced below the handlers
/// (body too large, unsupported media type, rejected extractors).
async fn json_errors(response: axum::response::Response) -> axum::response::Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "PAYLOAD_TOO_LARGE",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "UNSUPPORTED_MEDIA_TYPE",
        StatusCode::BAD_REQUEST => "BAD_REQUEST",
        StatusCode::UNPROCESSABLE_ENTITY => "UNPROCESSABLE",
        _ => "HTTP_ERROR",
    };
    let message = status.canonical_reason().unwrap_or("error").to_lowercase();
    ApiError::new(status, "request", code, message).into_response()
}

/// Serves the application on `listener` until `shutdown` resolves, then stops accepting and
/// lets in-flight requests finish (a call cut off anyway is left `attempting` in the ledger
/// and reconciled).
///
/// # Errors
/// The listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: &Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(gateway.state.clone(), gateway.limits);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// How long the background reconciler waits between passes.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(15);

/// How often a gateway looks, by default, for contracts registered or retired by other nodes
/// on the same store (one contract listing per look; see `GatewayConfig::contract_sync_every`).
pub const CONTRACT_SYNC_EVERY: Duration = Duration::from_secs(1);
