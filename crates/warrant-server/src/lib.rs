//! Warrant's gateway (PRODUCT §10): the HTTP API under `/v1`, health and metrics, over the one
//! pipeline (`warrant_runtime::dispatch`). `warrant serve` is a thin wrapper over [`serve`],
//! which tests call with a port-0 listener.
//!
//! **API boundary:** only this crate knows HTTP. Wire shapes are built here from domain types;
//! the core and runtime never see a request.

pub mod auth;
pub mod authoring;
pub mod bootstrap;
pub mod console;
pub mod error;
pub mod events;
pub mod inbound;
mod jobs;
pub mod mcp;
pub mod openapi;
mod review;
pub mod routes;
pub mod runs;
pub mod state;
pub mod trace;
pub mod webhooks;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::Semaphore;
use tower::ServiceBuilder;
use tower::ServiceExt;
use tower_http::limit::RequestBodyLimitLayer;

pub use bootstrap::{Gateway, GatewayConfig, HttpLimits, StartError};
pub use error::ApiError;
pub use state::{AppState, ContractChanges, ReloadablePolicy, UnusableBinding};

/// The whole HTTP application.
///
/// Every route but the health probes shares ONE in-flight limit (`limits.concurrency`, one
/// semaphore: a request that finds no permit is answered 503 at once, see [`in_flight`]).
/// Bodies are read whole, within `limits.body_timeout`, before a request takes a slot: a
/// client that trickles its body holds a connection for at most that long, and never a slot.
///
/// The layers around every request (JSON errors, body limits, the request deadline, panics,
/// the body read) wrap the routed application once, as one service: `Router::layer` would
/// wrap each route separately, so every request would clone and box each layer again and
/// box each layer's future (docs/benchmarks.md, "2026-12-04 (later)"). Only the layers that
/// need the matched route (the in-flight limit, the trace and metrics of [`trace::observe`])
/// are per route.
pub fn router(state: Arc<AppState>, limits: HttpLimits) -> Router {
    let slots = Arc::new(Semaphore::new(limits.concurrency.max(1)));
    let limited = Router::new()
        .merge(routes::proposals::router())
        .merge(routes::contracts::router())
        .merge(routes::approvals::router())
        .merge(routes::ledger::router())
        .merge(routes::keys::router())
        .merge(routes::tenants::router())
        .merge(routes::workflows::router())
        .merge(routes::webhooks::router())
        .merge(routes::inbound::router())
        .merge(routes::health::router())
        .merge(mcp::router(&state))
        .merge(console::router())
        .route_layer(axum::middleware::from_fn_with_state(slots, in_flight));
    let api = Router::new()
        .merge(limited)
        .merge(routes::health::probes())
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
    let body = BodyLimits {
        bytes: limits.body_bytes,
        timeout: limits.body_timeout,
    };
    // Outside a router the middleware's marker types (the extractors each takes) cannot be
    // inferred, hence the turbofish; the body limit hands its `Limited` body on as a `Body`,
    // which `read_body` takes.
    let around = ServiceBuilder::new()
        .layer(axum::middleware::map_response::<_, ()>(json_errors))
        .layer(axum::extract::DefaultBodyLimit::max(limits.body_bytes))
        .layer(Extension(auth::AuthLimiter::new(limits.auth_failures_per_minute)))
        .layer(axum::error_handling::HandleErrorLayer::<_, ()>::new(
            |e: tower::BoxError| async move {
                if e.is::<tower::timeout::error::Elapsed>() {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "request",
                        "TIMEOUT",
                        "the request took too long",
                    )
                } else {
                    ApiError::internal(&e)
                }
            },
        ))
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
        .layer(RequestBodyLimitLayer::new(limits.body_bytes))
        .map_request(|request: axum::http::Request<tower_http::body::Limited<Body>>| request.map(Body::new))
        .layer(axum::middleware::from_fn_with_state::<
            _,
            _,
            (State<BodyLimits>, Request),
        >(body, read_body))
        .service(api.with_state(state));
    Router::new().fallback_service(around)
}

/// The in-flight limit of the routes it wraps: a request takes a permit of the one semaphore
/// for as long as its handler runs, or is answered 503 `OVERLOADED` at once (it never queues).
async fn in_flight(State(slots): State<Arc<Semaphore>>, request: Request, next: Next) -> Response {
    match slots.try_acquire() {
        Ok(_permit) => next.run(request).await,
        Err(_) => overloaded("too many requests in flight"),
    }
}

/// 503 `OVERLOADED`, with `Retry-After`.
fn overloaded(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "request", "OVERLOADED", message).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

#[derive(Debug, Clone, Copy)]
struct BodyLimits {
    bytes: usize,
    timeout: Duration,
}

/// Reads the request body whole within the body deadline (408 `BODY_TIMEOUT` past it, and the
/// connection is closed: the rest of the body is never read).
async fn read_body(State(limits): State<BodyLimits>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, limits.bytes)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) if is_length_limit(&e) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request",
            "PAYLOAD_TOO_LARGE",
            "the request body is too large",
        )
        .into_response(),
        Ok(Err(_)) => ApiError::bad_request("the request body could not be read").into_response(),
        Err(_) => {
            let mut response = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request",
                "BODY_TIMEOUT",
                "the request body did not arrive in time",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

fn is_length_limit(error: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Answers every error in the one JSON shape, including those produced below the handlers
/// (body too large, unsupported media type, rejected extractors).
async fn json_errors(response: axum::response::Response) -> axum::response::Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json") || ct.starts_with("text/html"));
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

/// Connections kept past `limits.connections` for health probes: each serves one request
/// (`/healthz` or `/readyz`; anything else is answered 503 at once) and must send its head
/// within [`PROBE_HEADER_TIMEOUT`]. Past these, a connection is closed as it is accepted.
pub const PROBE_CONNECTIONS: usize = 32;

/// The header timeout of the connections kept for health probes (or the configured one, if
/// shorter): they are for one quick request.
pub const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

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
    let served = serve_router(listener, app, gateway.limits, shutdown).await;
    drain_calls(gateway).await;
    served
}

/// Waits for the calls handed to the runtime to reach their recorded end (graceful
/// shutdown: the listener is already closed), at most one call deadline and a margin.
pub async fn drain_calls(gateway: &Gateway) {
    let runtime = &gateway.state.runtime;
    let deadline = runtime.settings().retry.deadline + Duration::from_secs(5);
    let running = runtime.in_flight();
    if running > 0 {
        tracing::info!(running, "waiting for calls in flight to finish");
    }
    if !runtime.drain(deadline).await {
        tracing::warn!(
            running = runtime.in_flight(),
            "calls still running at shutdown keep their `attempting` rows; reconciliation resolves them"
        );
    }
}

/// Serves `app` (from [`router`]) over HTTP/1.1 with the connection limits of `limits`.
///
/// `axum::serve` has no header timeout, no connection cap and waits on a full file table,
/// so this is its accept loop with those added, on hyper's own connection builder:
/// - a request head must arrive within `limits.header_timeout` of the server waiting for it,
///   which also closes idle keep-alive connections;
/// - at most `limits.connections` connections are served; the next [`PROBE_CONNECTIONS`] are
///   kept for health probes; any further one is closed at once (not queued);
/// - each request carries its peer address ([`ConnectInfo`]), which authentication counts
///   failures by;
/// - on `shutdown`, the listener closes, idle connections close, and requests in flight
///   finish (bounded by the request timeout).
///
/// # Errors
/// None today: accept errors are logged and retried (a full file table clears as
/// connections close); the signature leaves room for a listener that can fail for good.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let served = Arc::new(Semaphore::new(limits.connections.max(1)));
    let kept_for_probes = Arc::new(Semaphore::new(PROBE_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut probe_http = hyper::server::conn::http1::Builder::new();
    probe_http
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout.min(PROBE_HEADER_TIMEOUT))
        .keep_alive(false);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
        };
        let (permit, builder, probes_only) = if let Ok(p) = served.clone().try_acquire_owned() {
            (p, &http, false)
        } else if let Ok(p) = kept_for_probes.clone().try_acquire_owned() {
            (p, &probe_http, true)
        } else {
            metrics::counter!("warrant_http_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        // Answers go out whole, at once: no wait on Nagle's algorithm for an answer written in
        // more than one piece (a client's delayed ACK would add up to 40 ms).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, %peer, "cannot set TCP_NODELAY");
        }
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(ConnectInfo(peer));
            let app = app.clone();
            async move {
                if probes_only && !matches!(request.uri().path(), "/healthz" | "/readyz") {
                    return Ok::<_, Infallible>(overloaded("too many connections"));
                }
                app.oneshot(request).await
            }
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// An accept that failed: a connection reset before it was accepted is skipped; anything else
/// (a full file table) is logged and retried after a pause, as `axum::serve` does.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "cannot accept a connection");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// How long the background reconciler waits between passes.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(15);

/// How often a gateway looks, by default, for contracts registered or retired by other nodes
/// on the same store (one contract listing per look; see `GatewayConfig::contract_sync_every`).
pub const CONTRACT_SYNC_EVERY: Duration = Duration::from_secs(1);
