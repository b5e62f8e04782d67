//! Warrant's gateway (PRODUCT §10): the HTTP API under `/v1`, health and metrics, over the one
//! pipeline (`warrant_runtime::dispatch`). `warrant serve` is a thin wrapper over [`serve`],
//! which tests call with a port-0 listener.
//!
//! **API boundary:** only this crate knows HTTP. Wire shapes are built here from domain types;
//! the core and runtime never see a request.

pub mod auth;
pub mod authoring;
mod body;
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::Semaphore;
use tower::ServiceExt;

pub use bootstrap::{Gateway, GatewayConfig, HttpLimits, StartError};
pub use error::ApiError;
pub use state::{AppState, ContractChanges, ReloadablePolicy, UnusableBinding};

/// The whole HTTP application.
///
/// Every route but the health probes shares ONE in-flight limit (`limits.concurrency`, one
/// semaphore: a request that finds no permit is answered 503 at once, see [`trace::observe`]).
/// Bodies are read whole, within `limits.body_timeout`, before a request takes a slot: a
/// client that trickles its body holds a connection for at most that long, and never a slot.
///
/// What every request passes through before its route — JSON errors, the body limits, the
/// request deadline, panics — is one service, [`Edge`], around the routed application; the
/// trace, metrics and in-flight limit that need the matched route are one route layer,
/// [`trace::observe`] (docs/benchmarks.md, "2026-12-04 (evening)").
pub fn router(state: Arc<AppState>, limits: HttpLimits) -> Router {
    let slots = trace::Slots::new(limits.concurrency);
    let api = Router::new()
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
        .merge(routes::health::probes())
        .route_layer(axum::middleware::from_fn_with_state(slots, trace::observe))
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
    let requests = Arc::clone(&state.requests_in_flight);
    let edge = Edge {
        requests,
        inner: api.with_state(state),
        body_limit: axum::extract::DefaultBodyLimit::max(limits.body_bytes),
        limiter: auth::AuthLimiter::new(limits.auth_failures_per_minute),
        limits: EdgeLimits {
            body_bytes: limits.body_bytes,
            body_timeout: limits.body_timeout,
            request_timeout: limits.request_timeout,
        },
    };
    Router::new().fallback_service(edge)
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

/// The limits [`Edge`] holds every request to.
#[derive(Debug, Clone, Copy)]
struct EdgeLimits {
    body_bytes: usize,
    body_timeout: Duration,
    request_timeout: Duration,
}

/// The edge of every request, in order:
///
/// - the auth-failure limiter and the extractors' body limit (the one the edge reads with) go
///   into the request's extensions;
/// - the body is read whole, at most `body_bytes` (413 `PAYLOAD_TOO_LARGE`, at once when the
///   declared length is over), within `body_timeout` (408 `BODY_TIMEOUT`, and the connection
///   is closed: the rest of the body is never read);
/// - the routed application answers within `request_timeout`, counted from the request's
///   arrival (503 `TIMEOUT`);
/// - a panic anywhere below is answered 500 `INTERNAL`;
/// - an error answer that is not JSON (an extractor's rejection, say) is rewritten into the one
///   JSON error shape.
///
/// Written as one service rather than a stack of `tower`/`tower-http` layers (a map-response,
/// an extension, an error handler, a timeout, a panic catcher, a body limit, a body reader):
/// each layer wrapped the request in its own future, and two of them armed a timer each, for
/// every request. Here one boxed future does all of it with one timer, reset from the body's
/// deadline to the request's (the test `the_edge_answers_every_failure_in_json` holds each
/// answer).
#[derive(Clone)]
struct Edge {
    /// The requests being answered ([`AppState::requests_in_flight`]).
    requests: Arc<AtomicUsize>,
    inner: Router,
    body_limit: axum::extract::DefaultBodyLimit,
    limiter: auth::AuthLimiter,
    limits: EdgeLimits,
}

impl tower::Service<Request> for Edge {
    type Response = Response;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        use futures_util::FutureExt as _;
        request.extensions_mut().insert(self.limiter.clone());
        self.body_limit.apply(&mut request);
        let answer = edge(self.inner.clone(), self.limits, request);
        let counted = InFlight::count(&self.requests);
        Box::pin(async move {
            let _counted = counted;
            let response = std::panic::AssertUnwindSafe(answer)
                .catch_unwind()
                .await
                .unwrap_or_else(|_| ApiError::internal(&"a request handler panicked").into_response());
            Ok(json_errors(response))
        })
    }
}

/// One request counted on a gauge of requests in flight ([`AppState::requests_in_flight`])
/// until this is dropped: with its answer, or with the request (the edge's, an MCP stdio
/// session's).
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(crate) fn count(requests: &Arc<AtomicUsize>) -> Self {
        requests.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(requests))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// [`Edge`]'s body read, deadline and call of the routed application.
async fn edge(inner: Router, limits: EdgeLimits, request: Request) -> Response {
    use axum::body::HttpBody as _;
    let arrived = tokio::time::Instant::now();
    let answer_by = arrived + limits.request_timeout;
    let body_by = arrived + limits.body_timeout;
    let (parts, body) = request.into_parts();
    if body.size_hint().lower() > u64::try_from(limits.body_bytes).unwrap_or(u64::MAX) {
        return ApiError::payload_too_large().into_response();
    }
    // One timer for both deadlines: the body's (or the request's, if sooner), then the
    // request's.
    let timer = tokio::time::sleep_until(body_by.min(answer_by));
    let mut timer = std::pin::pin!(timer);
    let bytes = tokio::select! {
        biased;
        read = body::whole(body, limits.body_bytes) => match read {
            Ok(bytes) => bytes,
            Err(unread) => return ApiError::from(unread).into_response(),
        },
        () = &mut timer => {
            return if body_by <= answer_by { body_timed_out() } else { request_timed_out() };
        }
    };
    timer.as_mut().reset(answer_by);
    tokio::select! {
        biased;
        answered = inner.oneshot(Request::from_parts(parts, Body::from(bytes))) => match answered {
            Ok(response) => response,
            Err(never) => match never {},
        },
        () = &mut timer => request_timed_out(),
    }
}

/// 408 `BODY_TIMEOUT`, closing the connection.
fn body_timed_out() -> Response {
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

/// 503 `TIMEOUT`: the request outlived `request_timeout`.
fn request_timed_out() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "request",
        "TIMEOUT",
        "the request took too long",
    )
    .into_response()
}

/// Answers every error in the one JSON shape, including those produced below the handlers
/// (body too large, unsupported media type, rejected extractors).
fn json_errors(response: Response) -> Response {
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
    self::shutdown(gateway).await;
    served
}

/// Shuts the gateway's calls down gracefully once no request arrives any more (the listener
/// is closed, or the stdio lane's input ended): the workers that start calls on their own —
/// the workflow runner, the inbound worker — claim nothing more and finish the steps and
/// events they hold, then the calls handed to the runtime reach their recorded end
/// ([`drain_calls`]); all of it within the longest call and a margin. What is still running
/// then keeps its `attempting` row, and reconciliation resolves it.
pub async fn shutdown(gateway: &Gateway) {
    let deadline = gateway.state.runtime.longest_call() + Duration::from_secs(5);
    gateway.state.stopping.cancel();
    let waited = tokio::time::timeout(deadline, async {
        while !gateway.callers_stopped() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if waited.is_err() {
        tracing::warn!(
            "workflow steps or inbound events still running at shutdown; their leases will lapse and another node takes them over"
        );
    }
    drain_calls(gateway).await;
}

/// Waits for the calls handed to the runtime to reach their recorded end (graceful
/// shutdown: the listener is already closed), at most as long as a call may run
/// ([`warrant_runtime::Runtime::longest_call`]: an inquiry reconciling its key's operation
/// first, then its attempts) and a margin.
pub async fn drain_calls(gateway: &Gateway) {
    let runtime = &gateway.state.runtime;
    let deadline = runtime.longest_call() + Duration::from_secs(5);
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
                if probes_only && !routes::health::PROBE_PATHS.contains(&request.uri().path()) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

    use axum::routing::{get, post};

    use super::*;

    fn edge(inner: Router) -> Router {
        counted_edge(inner, Arc::default())
    }

    /// [`edge`], counting its requests in `requests`.
    fn counted_edge(inner: Router, requests: Arc<AtomicUsize>) -> Router {
        Router::new().fallback_service(Edge {
            requests,
            inner,
            body_limit: axum::extract::DefaultBodyLimit::max(64),
            limiter: auth::AuthLimiter::new(10),
            limits: EdgeLimits {
                body_bytes: 64,
                body_timeout: Duration::from_millis(100),
                request_timeout: Duration::from_millis(300),
            },
        })
    }

    async fn answer(app: &Router, request: Request) -> (StatusCode, serde_json::Value, Option<HeaderValue>) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let connection = response.headers().get(header::CONNECTION).cloned();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, body, connection)
    }

    fn post_to(path: &str, body: Body) -> Request {
        Request::post(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    }

    #[tokio::test]
    async fn the_edge_counts_the_requests_it_is_answering() {
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&requests);
        let inner = Router::new()
            .route(
                "/",
                get(move || {
                    let now = seen.load(Ordering::SeqCst);
                    async move { axum::Json(now) }
                }),
            )
            .route("/forever", get(std::future::pending::<()>));
        let app = counted_edge(inner, Arc::clone(&requests));
        let (status, body, _) = answer(&app, Request::get("/").body(Body::empty()).unwrap()).await;
        assert_eq!((status, body), (StatusCode::OK, serde_json::json!(1)));
        assert_eq!(requests.load(Ordering::SeqCst), 0);
        // A request dropped before its answer is no longer counted either.
        let mut pending = Box::pin(
            app.clone()
                .oneshot(Request::get("/forever").body(Body::empty()).unwrap()),
        );
        assert!(tokio::time::timeout(Duration::ZERO, &mut pending).await.is_err());
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        drop(pending);
        assert_eq!(requests.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_edge_answers_every_failure_in_json() {
        let app = edge(
            Router::new()
                .route(
                    "/echo",
                    post(|axum::Json(v): axum::Json<serde_json::Value>| async move { axum::Json(v) }),
                )
                .route(
                    "/plain",
                    get(|| async { (StatusCode::BAD_REQUEST, "plain words") }),
                )
                .route(
                    "/panic",
                    get(|| async {
                        if true {
                            panic!("a handler bug");
                        }
                        "unreachable"
                    }),
                )
                .route(
                    "/slow",
                    get(|| async {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        "late"
                    }),
                ),
        );
        let code = |body: &serde_json::Value| body["error"]["code"].as_str().unwrap_or_default().to_owned();

        // A body within the limit reaches the route, as the client sent it.
        let (status, body, _) = answer(&app, post_to("/echo", Body::from(r#"{"a":1}"#))).await;
        assert_eq!((status, body), (StatusCode::OK, serde_json::json!({"a": 1})));

        // Over the limit: by its declared length (refused before it is read) and as it streams.
        let (status, body, _) = answer(&app, post_to("/echo", Body::from(vec![b' '; 65]))).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE")
        );
        let chunks = futures_util::stream::iter(
            (0..5).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 20]))),
        );
        let (status, body, _) = answer(&app, post_to("/echo", Body::from_stream(chunks))).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE")
        );

        // A body that never ends: 408, and the connection is to be closed.
        let never = futures_util::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        let (status, body, connection) = answer(&app, post_to("/echo", Body::from_stream(never))).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::REQUEST_TIMEOUT, "BODY_TIMEOUT")
        );
        assert_eq!(connection, Some(HeaderValue::from_static("close")));

        // A route that outlives the request deadline: 503 TIMEOUT.
        let (status, body, _) = answer(&app, Request::get("/slow").body(Body::empty()).unwrap()).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "TIMEOUT")
        );

        // A panic: 500 INTERNAL, and the service goes on answering.
        let (status, body, _) = answer(&app, Request::get("/panic").body(Body::empty()).unwrap()).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL")
        );

        // Errors that are not JSON — a route's plain text, an extractor's rejection — are.
        let (status, body, _) = answer(&app, Request::get("/plain").body(Body::empty()).unwrap()).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::BAD_REQUEST, "BAD_REQUEST")
        );
        let (status, body, _) = answer(&app, post_to("/echo", Body::from("{"))).await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::BAD_REQUEST, "BAD_REQUEST")
        );
        let (status, body, _) = answer(&app, post_to("/echo", Body::from(r#"{"a":1}"#))).await;
        assert_eq!((status, body), (StatusCode::OK, serde_json::json!({"a": 1})));
    }
}
