//! The MCP lane (PRODUCT §10): streamable HTTP at `/mcp` and stdio (`warrant mcp`), with the
//! official SDK (`rmcp`). `tools/list` shows the contracts the caller may invoke; `tools/call`
//! runs the same `dispatch` as `POST /v1/proposals`. Semantics, idempotency derivation and
//! approvals: `docs/mcp.md`.
//!
//! **API boundary:** `rmcp` is used only here and in `mcp/`. It has had three major versions in
//! five months, so the dependency is pinned to one minor version and nothing else in the
//! workspace names its types.
//!
//! - **Stateless.** Each HTTP request is served on its own (`legacy_session_mode` off, no
//!   `Mcp-Session-Id`), so any number of gateway nodes behind a load balancer behave as one.
//! - **Authentication first.** `Authorization: Bearer <key>` is checked against the store
//!   before any MCP processing; a missing or unknown key is a 401 with the API's error shape.
//! - **The client's own bytes.** Request bodies (and stdio lines) are framed below the SDK
//!   (`raw`): the arguments of a `tools/call` are kept as written and become the proposal
//!   `decide` parses, so its strict parser refuses over MCP exactly what it refuses over HTTP
//!   (duplicate keys, `7.0` for an integer, depth, size, …), with a ledger row; the rest of
//!   the message must pass the strict parser before the SDK's `serde_json` sees it, else it is a
//!   JSON-RPC parse error (-32700), not a proposal.
//! - **DNS-rebinding guard.** The SDK's `Host` check stays on; the allowed hosts are the
//!   loopback names plus the host of the public URL, or what [`McpConfig`] says.
//! - **Tool calls answered directly.** A plain `tools/call` over HTTP is answered by the lane
//!   (`direct`) with the SDK's own message types and the same handler, without the SDK's four
//!   tasks per request; everything else, and anything unusual about a call, goes to the SDK.

mod direct;
mod lines;
mod native;
mod raw;
pub(crate) mod tools;
mod workflows;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;
use warrant_core::authority::Principal;
use warrant_core::json::Limits;

pub use native::Sealer;
pub(crate) use native::review_url;
pub use tools::{DERIVED_KEY_WINDOW, derived_idempotency_key};

use crate::auth::{Caller, authenticate, authenticate_request};
use crate::error::ApiError;
use crate::state::AppState;

/// The path of the streamable HTTP endpoint.
pub const MCP_PATH: &str = "/mcp";

/// Nesting allowed in an MCP message: a proposal's limit plus the JSON-RPC wrapping
/// (`params`, `_meta`). The proposal built from `arguments` is held to the proposal limits
/// again by the pipeline.
const MESSAGE_MAX_DEPTH: usize = Limits::PROPOSAL.max_depth + 4;

/// Configuration of the streamable HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    /// `Host` values accepted (`host` or `host:port`): the SDK's DNS-rebinding guard. Never
    /// empty: an empty list would turn the guard off.
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted (`scheme://host:port`); empty accepts requests without an
    /// `Origin` and any origin (agents are not browsers; the bearer key is the credential).
    pub allowed_origins: Vec<String>,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// Whether plain `tools/call` requests are answered without the SDK's per-request service
    /// (`direct`; on by default). Off, every request goes through the SDK: the reference the
    /// direct path is tested against.
    pub direct_calls: bool,
}

impl McpConfig {
    /// The loopback names plus the host of `public_url` (where clients are told to connect).
    pub fn for_public_url(public_url: &str) -> Self {
        let mut allowed_hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|h| (*h).to_owned())
            .collect();
        let authority = public_url
            .split_once("://")
            .map_or(public_url, |(_, rest)| rest)
            .split(['/', '?', '#'])
            .next()
            .unwrap_or_default();
        let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
        if let Ok(parsed) = authority.parse::<axum::http::uri::Authority>() {
            let host = parsed.host().trim_matches(['[', ']']).to_ascii_lowercase();
            if !host.is_empty() && !allowed_hosts.contains(&host) {
                allowed_hosts.push(host);
            }
        }
        McpConfig {
            allowed_hosts,
            allowed_origins: Vec::new(),
            max_body_bytes: 1024 * 1024,
            direct_calls: true,
        }
    }
}

/// The `/mcp` route with the defaults of [`McpConfig::for_public_url`].
pub fn router(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    router_with(state, McpConfig::for_public_url(&state.public_url))
}

/// The `/mcp` route: bearer authentication and the strict-JSON check, then the SDK's
/// stateless streamable HTTP service.
pub fn router_with(state: &Arc<AppState>, config: McpConfig) -> Router<Arc<AppState>> {
    let mut sdk = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(config.max_body_bytes);
    let allowed_hosts = if config.allowed_hosts.is_empty() {
        ["localhost", "127.0.0.1", "::1"].map(str::to_owned).to_vec()
    } else {
        config.allowed_hosts.clone()
    };
    sdk = sdk.with_allowed_hosts(allowed_hosts.clone());
    if !config.allowed_origins.is_empty() {
        sdk = sdk.with_allowed_origins(config.allowed_origins.clone());
    }
    let handler = Gateway::new(state.clone(), None);
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        sdk,
    );
    let guard = Guard {
        state: state.clone(),
        max_body_bytes: config.max_body_bytes,
        direct: config
            .direct_calls
            .then(|| direct::AllowedHosts::new(&allowed_hosts)),
    };
    // One handler, its guard and the SDK's service shared (not cloned per request): only a
    // request the direct path does not answer gets its own copy of the SDK's service (whose
    // clone takes a lock for its cancellation token).
    let entry = Arc::new(Entry { guard, sdk: service });
    Router::new().route(
        MCP_PATH,
        axum::routing::any(move |request: Request| {
            let entry = Arc::clone(&entry);
            async move { entry.serve(request).await }
        }),
    )
}

/// The `/mcp` endpoint: the guard, then the direct answer or the SDK's service.
struct Entry {
    guard: Guard,
    sdk: StreamableHttpService<Gateway, NeverSessionManager>,
}

impl Entry {
    async fn serve(&self, request: Request) -> Response {
        match guard_request(&self.guard, request).await {
            Guarded::Answered(response) => response,
            // Awaited here, after the guard's future has ended, rather than inside it: the two
            // futures share their room in this one, instead of one holding the other.
            Guarded::Direct(direct) => call_directly(&self.guard.state, direct).await,
            Guarded::Forward(request) => {
                use tower::ServiceExt as _;
                // Boxed: the SDK's future is several times the size of the direct path's, and
                // an unboxed branch would make every request's future that large (it is moved
                // on its way through the router's layers).
                match Box::pin(self.sdk.clone().oneshot(request)).await {
                    Ok(response) => response.map(Body::new),
                    Err(never) => match never {},
                }
            }
        }
    }
}

/// What the guard made of a request: answered (refused), a plain `tools/call` to answer
/// directly, or to be served by the SDK.
enum Guarded {
    Answered(Response),
    Direct(Box<Direct>),
    Forward(Request),
}

/// A plain `tools/call` to answer without the SDK's service (see `direct`), with all it needs:
/// the caller, the trace id the SDK's handler would get, the call's raw parts.
struct Direct {
    principal: warrant_core::authority::Principal,
    trace: String,
    raw: raw::RawCall,
    call: direct::DirectCall,
}

/// Serves MCP over stdin/stdout as the holder of the API key `key` until the client closes
/// stdin. The key is checked on every request, as over HTTP (so a revocation reaches a
/// running session).
///
/// # Errors
/// The handshake or the streams fail.
pub async fn serve_stdio(state: Arc<AppState>, key: String) -> std::io::Result<()> {
    serve_io(state, key, stdio_in(), stdio_out()).await
}

/// This process's stdin, read by the runtime's reactor when it is a pipe or a socket (as MCP
/// clients start a server: a pipe, or a socket pair where the client runs on libuv), else
/// tokio's stdin, whose every read is handed to a blocking thread and back (a terminal, a file).
///
/// The reactor reads a descriptor of its own (a duplicate of 0) set non-blocking; nothing else
/// in `warrant mcp` reads stdin.
fn stdio_in() -> Box<StdioIn> {
    through_reactor(
        &std::io::stdin(),
        |fd| Ok(Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?) as Box<StdioIn>),
        |socket| Box::new(socket) as Box<StdioIn>,
    )
    .unwrap_or_else(|| Box::new(tokio::io::stdin()))
}

/// What `warrant mcp` reads its session from.
type StdioIn = dyn tokio::io::AsyncRead + Unpin + Send;

/// What `warrant mcp` writes its session to.
type StdioOut = dyn tokio::io::AsyncWrite + Unpin + Send;

/// This process's stdout, written by the runtime's reactor when it is a pipe or a socket, else
/// tokio's stdout (see [`stdio_in`]). Nothing else in `warrant mcp` writes to stdout: it is the
/// protocol's (what `serve` prints in its banner is logged, to stderr).
fn stdio_out() -> Box<StdioOut> {
    through_reactor(
        &std::io::stdout(),
        |fd| Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(fd)?) as Box<StdioOut>),
        |socket| Box::new(socket) as Box<StdioOut>,
    )
    .unwrap_or_else(|| Box::new(tokio::io::stdout()))
}

/// A standard stream as the reactor's: `pipe` or `socket` over a duplicate of its descriptor;
/// `None` when it is neither, or cannot be made non-blocking.
fn through_reactor<T: ?Sized>(
    stream: &impl std::os::fd::AsFd,
    pipe: impl FnOnce(std::os::fd::OwnedFd) -> std::io::Result<Box<T>>,
    socket: impl FnOnce(tokio::net::UnixStream) -> Box<T>,
) -> Option<Box<T>> {
    let owned = match own_stdio(stream)? {
        Own::Pipe(fd) => pipe(fd),
        Own::Socket(unix) => socket_stream(unix).map(socket),
    };
    owned
        .inspect_err(|e| tracing::debug!(error = %e, "mcp stdio: through a blocking thread"))
        .ok()
}

/// A duplicate of a standard stream's descriptor, by what it is.
enum Own {
    Pipe(std::os::fd::OwnedFd),
    Socket(std::os::unix::net::UnixStream),
}

fn own_stdio(stream: &impl std::os::fd::AsFd) -> Option<Own> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // A duplicate of the stream's descriptor, and what it is (one `fstat`).
    let owned = |fd: std::os::fd::BorrowedFd<'_>| {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        let meta = file.metadata().ok()?;
        Some((file, meta))
    };
    let (file, meta) = owned(stream.as_fd())?;
    // A stream that is also stderr (`2>&1`, or one socket for all three) stays blocking: the
    // logs are written to stderr with blocking writes, which a non-blocking descriptor would
    // answer with `WouldBlock` when the pipe is full.
    let stderr = std::io::stderr();
    if owned(std::os::fd::AsFd::as_fd(&stderr))
        .is_none_or(|(_, err)| (err.dev(), err.ino()) == (meta.dev(), meta.ino()))
    {
        return None;
    }
    if meta.file_type().is_fifo() {
        return Some(Own::Pipe(file.into()));
    }
    let socket = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(file));
    // Only a Unix socket has a local address; anything else (a terminal, a file) stays with
    // tokio's blocking reads and writes.
    socket.local_addr().ok().map(|_| Own::Socket(socket))
}

fn socket_stream(socket: std::os::unix::net::UnixStream) -> std::io::Result<tokio::net::UnixStream> {
    socket.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(socket)
}

/// Serves MCP over a pair of byte streams (newline-delimited JSON-RPC) as the holder of the
/// API key `key`.
///
/// # Errors
/// The handshake or the streams fail.
pub async fn serve_io<R, W>(state: Arc<AppState>, key: String, reader: R, writer: W) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    serve_lines(state, key, reader, writer, true).await
}

/// [`serve_io`], with plain `tools/call`s answered by the transport (`direct_calls`, see
/// `lines`) or, off, every message served by the SDK: the reference the direct answers are
/// tested against.
async fn serve_lines<R, W>(
    state: Arc<AppState>,
    key: String,
    reader: R,
    writer: W,
    direct_calls: bool,
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut transport = lines::StrictLines::new(reader, writer, Arc::clone(&state.requests_in_flight));
    let answering = direct_calls.then(|| transport.answer_calls(Arc::clone(&state), &key));
    let running = Gateway::new(state, Some(key))
        .serve(transport)
        .await
        .map_err(std::io::Error::other)?;
    running.waiting().await.map_err(std::io::Error::other)?;
    // The calls the transport was answering when the client closed its end are answered.
    if let Some(calls) = answering {
        calls.close();
        calls.wait().await;
    }
    Ok(())
}

struct Guard {
    state: Arc<AppState>,
    max_body_bytes: usize,
    /// The allowed hosts, when plain tool calls are answered directly (`direct`).
    direct: Option<direct::AllowedHosts>,
}

/// Authenticates the request (401 before any MCP processing) and frames its body
/// ([`raw::frame`]: the strict parser for the message, the raw arguments of a `tools/call` kept
/// aside); the caller and those arguments travel to the SDK's handler in the request's
/// extensions, or, for a call answered directly, to [`call_directly`] as they are.
async fn guard_request(guard: &Guard, request: Request) -> Guarded {
    let (mut parts, body) = request.into_parts();
    let caller = match authenticate_request(&guard.state, &parts).await {
        Ok(caller) => caller,
        Err(refusal) => return Guarded::Answered(refusal.into_response()),
    };
    if parts.method != axum::http::Method::POST {
        parts.extensions.insert(caller);
        return Guarded::Forward(Request::from_parts(parts, body));
    }
    let bytes = match crate::body::whole(body, guard.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(unread) => return Guarded::Answered(ApiError::from(unread).into_response()),
    };
    let limits = Limits {
        max_bytes: guard.max_body_bytes,
        max_depth: MESSAGE_MAX_DEPTH,
    };
    let framed = match raw::frame(&bytes, limits) {
        Ok(framed) => framed,
        Err(refused) => {
            return Guarded::Answered(
                (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                    refused.line(),
                )
                    .into_response(),
            );
        }
    };
    // A plain `tools/call`: answered as the SDK would answer it (`direct`).
    if let (Some(_), Some(hosts)) = (&framed.call, &guard.direct)
        && direct::headers_allow(&parts, hosts)
        && let Some(call) = direct::call_of(&framed)
        && let Some(raw) = framed.call
    {
        return Guarded::Direct(Box::new(Direct {
            principal: caller.principal,
            trace: trace_of(call.meta.view(), Some(&parts)),
            raw,
            call,
        }));
    }
    parts.extensions.insert(caller);
    // The SDK hands the request's parts to the handler: the raw parts of a `tools/call` go
    // with them.
    let body = match framed.message() {
        std::borrow::Cow::Borrowed(_) => bytes.clone(),
        std::borrow::Cow::Owned(message) => axum::body::Bytes::from(message),
    };
    if let Some(call) = framed.call {
        parts.extensions.insert(call);
    }
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Guarded::Forward(Request::from_parts(parts, Body::from(body)))
}

/// Answers a plain `tools/call` over HTTP without the SDK's service (see `direct`).
///
/// The call comes boxed and stays in its box: this future holds a pointer, not the call.
async fn call_directly(state: &Arc<AppState>, mut direct: Box<Direct>) -> Response {
    let Direct {
        principal,
        trace,
        raw,
        call,
    } = &mut *direct;
    match answer_directly(state, principal.clone(), std::mem::take(trace), raw, call).await {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, direct::JSON)],
            Body::from(body),
        )
            .into_response(),
        Err(e) => ApiError::internal(&e).into_response(),
    }
}

/// The JSON-RPC answer to a plain `tools/call` answered without the SDK's service (see
/// `direct`; over HTTP and over stdio): the handler's [`tools::call`] with the caller, trace id
/// and raw arguments it would get from the SDK, answered as the SDK answers it.
async fn answer_directly(
    state: &Arc<AppState>,
    principal: Principal,
    trace: String,
    raw: &raw::RawCall,
    call: &direct::DirectCall,
) -> Result<Vec<u8>, serde_json::Error> {
    // A direct call is one the SDK would serve on a legacy protocol without capabilities: its
    // held answer is the tool error (`native::Native::default()`). Its id and name are the
    // raw call's (`direct::call_of`).
    let called = tools::call(
        state,
        principal,
        trace,
        None,
        raw,
        call.meta.view(),
        native::Native::default(),
    )
    .await;
    match called.committed() {
        // The call that is most of the traffic: its answer written from its parts.
        Some((execution, result, trace)) => direct::committed(&call.id, execution, result, trace),
        None => {
            // The trace id travels in the answer; kept for the error that cannot happen.
            let trace = called.trace().unwrap_or_default().to_owned();
            let result = match called.into_response(state, raw.name()) {
                CallToolResponse::Complete(result) => result,
                _ => tools::internal(&"a direct call answered other than a tool result", &trace),
            };
            direct::answer(call.id.clone(), result)
        }
    }
}

/// The principal of the stdio lane's API key, checked on every request like a bearer key
/// (through the same cache, so a revocation reaches a running session).
async fn key_holder(state: &AppState, key: &str) -> Result<Principal, ErrorData> {
    authenticate(state, key)
        .await
        .map_err(|e| internal_error(&format!("cannot check the API key: {e:?}")))?
        .map(|caller| caller.principal)
        .ok_or_else(|| ErrorData::invalid_request("the API key is unknown, revoked or malformed", None))
}

/// The trace id of a request: a `traceparent` in `_meta` (SEP-414) wins; otherwise the id the
/// HTTP layer gave the request (from its header or fresh), so the span, the ledger and the
/// answer agree; over stdio a fresh one.
fn trace_of(meta: tools::Meta<'_>, parts: Option<&axum::http::request::Parts>) -> String {
    meta.text("traceparent")
        .and_then(crate::trace::parse_traceparent)
        .or_else(|| {
            parts
                .and_then(|p| p.extensions.get::<crate::trace::TraceId>())
                .map(|t| t.0.clone())
        })
        .unwrap_or_else(|| crate::trace::trace_id(&HeaderMap::new()))
}

/// The MCP server: one per HTTP request (stateless) or per stdio connection.
#[derive(Clone)]
struct Gateway {
    state: Arc<AppState>,
    /// The stdio lane's API key, authenticated on every request like a bearer key (through
    /// the same cache); HTTP callers come authenticated with each request.
    key: Option<String>,
}

impl Gateway {
    fn new(state: Arc<AppState>, key: Option<String>) -> Self {
        Gateway { state, key }
    }

    /// The caller and the trace id of a request: a `traceparent` in `_meta` (SEP-414) wins;
    /// otherwise the id the HTTP layer gave the request (from its header or fresh), so the
    /// span, the ledger and the answer agree; over stdio a fresh one.
    async fn caller(&self, context: &RequestContext<RoleServer>) -> Result<(Principal, String), ErrorData> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let trace = trace_of(tools::Meta::Object(&context.meta.0.0), parts);
        if let Some(key) = &self.key {
            return Ok((key_holder(&self.state, key).await?, trace));
        }
        parts
            .and_then(|p| p.extensions.get::<Caller>())
            .map(|c| (c.principal.clone(), trace))
            .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None))
    }
}

impl ServerHandler for Gateway {
    /// The revisions this server implements, up to 2026-07-28 (pinned, so a newer SDK does not
    /// advertise a revision before it is implemented here).
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("warrant", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Each tool is a Warrant contract. Calls are checked (schema, policy, scopes, \
                 budgets, approvals) and recorded before anything happens. A result marked as an \
                 error says why (stage and code). A call that needs a human approval answers a \
                 task (tasks extension) or an input-required result linking to the review page \
                 (2026-07-28 with URL elicitation); otherwise it names its approval id: once a \
                 reviewer approves it, call again with the same arguments and \
                 `_meta.approval_id`.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (principal, _) = self.caller(&context).await?;
        let mut tools = tools::visible(&self.state.tool_index(), &principal);
        tools.extend(
            workflows::visible(&self.state, &principal)
                .await
                .map_err(|e| internal_error(&e))?,
        );
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (principal, trace) = self.caller(&context).await?;
        // The client's own bytes of this call, from the transport's framing (stdio: in the
        // message's extensions; HTTP: in the request parts the SDK passes on). Without them
        // the call is refused: the SDK's decoded arguments have lost their spelling.
        let raw = context
            .extensions
            .get::<raw::RawCall>()
            .or_else(|| {
                context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|p| p.extensions.get::<raw::RawCall>())
            })
            .filter(|raw| raw.matches(&context.id, &request.name));
        let native = native::Native::of(&context);
        Ok(match raw {
            Some(raw) => tools::call(
                &self.state,
                principal,
                trace,
                request.request_state,
                raw,
                tools::Meta::Object(&context.meta.0.0),
                native,
            )
            .await
            .into_response(&self.state, raw.name()),
            None => tools::unframed(&trace).into(),
        })
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let (principal, _) = self.caller(&context).await?;
        native::get_task(&self.state, &principal, &request.task_id).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (principal, _) = self.caller(&context).await?;
        native::cancel_task(&self.state, &principal, &request.task_id).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (principal, _) = self.caller(&context).await?;
        native::update_task(&self.state, &principal, &request.task_id).await
    }
}

/// A store failure outside a call (listing tools): logged with an incident id, answered
/// without details.
fn internal_error(error: &dyn std::fmt::Display) -> ErrorData {
    let incident = hex::encode(rand::random::<[u8; 8]>());
    tracing::error!(incident, %error, "mcp: internal error");
    ErrorData::internal_error(
        format!("internal error (incident {incident})"),
        Some(json!({"incident": incident})),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

    use super::*;

    /// A gateway over a memory store with one read tool, `pay`, and the first keys.
    pub(super) async fn gateway(dir: &std::path::Path) -> (crate::Gateway, String) {
        use warrant_runtime::adapters::AdapterConfig;
        use warrant_runtime::net::{NetPolicy, SafeClient};
        std::fs::write(
            dir.join("pay.yaml"),
            "name: pay\nversion: 1\ndescription: Pay.\nowner: t\neffect: read\nscopes: [p:read]\n\
             approval: none\ninput:\n  type: object\n  additionalProperties: false\n  properties:\n    \
             n: { type: integer, minimum: 0, maximum: 9 }\noutput:\n  type: object\n  \
             additionalProperties: false\n  properties: {}\nadapter: { kind: http, url: \"http://127.0.0.1:9/\" }\n",
        )
        .unwrap();
        let store: Arc<dyn warrant_core::store::Store> = Arc::new(warrant_store::MemoryStore::new());
        let gateway = crate::Gateway::start(crate::GatewayConfig {
            store: store.clone(),
            contracts_dir: Some(dir.to_owned()),
            policies: vec![warrant_policy::PolicySource::new(
                "all.cedar",
                "permit (principal, action, resource);",
            )],
            guards: warrant_core::guard::Guards::new(),
            budgets: Default::default(),
            redaction: warrant_core::redact::RedactionKey::new(vec![5; 32]).unwrap(),
            adapters: AdapterConfig {
                client: SafeClient::new(NetPolicy::default()),
                secrets: warrant_runtime::Secrets::default(),
                smtp: None,
                command_roots: Vec::new(),
                model: None,
            },
            runtime: Default::default(),
            settings: Default::default(),
            limits: Default::default(),
            public_url: "http://127.0.0.1:1".into(),
            first_tenant: "acme".into(),
            background: false,
            contract_sync_every: crate::CONTRACT_SYNC_EVERY,
            requests_in_flight: Default::default(),
            review_mail: None,
        })
        .await
        .unwrap();
        let key = gateway.first_keys.as_ref().unwrap().agent.clone();
        (gateway, key)
    }

    /// The SDK's own stdio framing keeps no raw bytes: a `tools/call` served through it is
    /// refused, never run from the SDK's decoded arguments (where `7.0` reads as `7`); through
    /// the lane's framing the same line is decided on what the client wrote.
    #[tokio::test]
    async fn a_call_without_its_raw_bytes_is_refused() {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let (gateway, key) = gateway(dir.path()).await;
        let lines = [
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{"n":7.0}}}"#,
        ];
        for framed in [false, true] {
            let (client, server) = tokio::io::duplex(1 << 16);
            let (read, write) = tokio::io::split(server);
            let state = gateway.state.clone();
            let key = key.clone();
            let served = tokio::spawn(async move {
                if framed {
                    serve_io(state, key, read, write).await.unwrap();
                } else {
                    let running = Gateway::new(state, Some(key)).serve((read, write)).await.unwrap();
                    let _ = running.waiting().await;
                }
            });
            let (read, mut write) = tokio::io::split(client);
            for line in lines {
                write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            }
            let mut answers = tokio::io::BufReader::new(read).lines();
            let answer = loop {
                let line = answers.next_line().await.unwrap().unwrap();
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v["id"] == 1 {
                    break v;
                }
            };
            let s = &answer["result"]["structuredContent"];
            let seen = (s["stage"].as_str(), s["code"].as_str());
            if framed {
                assert_eq!(seen, (Some("schema"), Some("SCHEMA_NOT_INTEGER")), "{answer}");
            } else {
                assert_eq!(seen, (Some("internal"), Some("INTERNAL")), "{answer}");
                assert!(s["ledger_id"].is_null(), "{answer}");
            }
            drop(write);
            drop(answers);
            served.await.unwrap();
        }
        let principal = Principal::new("demo-agent", "acme", Vec::new()).unwrap();
        let page = gateway
            .state
            .store
            .list_ledger(principal.tenant(), &Default::default())
            .await
            .unwrap();
        assert_eq!(page.entries.len(), 1, "only the framed call was decided");
    }

    /// Volatile values (ids minted per call) replaced by placeholders, so two answers to the
    /// same request compare equal.
    fn normalized(body: &[u8]) -> String {
        fn collect(v: &serde_json::Value, found: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(map) => {
                    for (k, v) in map {
                        if let (true, Some(s)) = (
                            ["ledger_id", "trace_id", "operation_id", "incident"]
                                .iter()
                                .any(|suffix| k.ends_with(suffix)),
                            v.as_str(),
                        ) {
                            found.push(s.to_owned());
                        }
                        collect(v, found);
                    }
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, found)),
                _ => {}
            }
        }
        let mut text = String::from_utf8_lossy(body).into_owned();
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
            let mut found = Vec::new();
            collect(&value, &mut found);
            for (i, s) in found.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
                text = text.replace(s.as_str(), &format!("<volatile {i}>"));
            }
        }
        text
    }

    /// The direct path (`direct`) answers every request exactly as the SDK's own service does:
    /// the same status, content type and body (ids minted per call aside) — for the plain calls
    /// it takes and for everything it hands over.
    #[tokio::test]
    async fn the_direct_path_answers_as_the_sdk_does() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let (gateway, key) = gateway(dir.path()).await;
        let state = gateway.state.clone();
        let app = |direct: bool| {
            let mut config = McpConfig::for_public_url("http://127.0.0.1:1");
            config.direct_calls = direct;
            Router::new()
                .merge(router_with(&state, config))
                .with_state(state.clone())
        };
        let call = |id: &str, args: &str, meta: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"pay","arguments":{args}{meta}}}}}"#
            )
        };
        let plain = [
            ("host", "127.0.0.1"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
        ];
        let cases: Vec<(Vec<(&str, &str)>, String)> = vec![
            (plain.to_vec(), call("1", r#"{"n":3}"#, "")),
            (plain.to_vec(), call("\"s-1\"", r#"{"n":7.0}"#, "")),
            (plain.to_vec(), call("2", r#"{"n":3,"n":4}"#, "")),
            (
                plain.to_vec(),
                call("3", r#"{"m":1}"#, r#","_meta":{"idempotency_key":"k-1"}"#),
            ),
            (
                plain.to_vec(),
                call("4", "{}", r#","_meta":{"idempotency_key":5}"#),
            ),
            (
                plain.to_vec(),
                call(
                    "5",
                    "{}",
                    r#","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
                ),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#
                    .to_owned(),
            ),
            (
                [plain.as_slice(), &[("mcp-protocol-version", "2025-06-18")]].concat(),
                call("7", r#"{"n":1}"#, ""),
            ),
            (
                [plain.as_slice(), &[("mcp-protocol-version", "2026-07-28")]].concat(),
                call("8", r#"{"n":1}"#, ""),
            ),
            (
                [plain.as_slice(), &[("mcp-protocol-version", "1999-01-01")]].concat(),
                call("9", r#"{"n":1}"#, ""),
            ),
            (
                [plain.as_slice(), &[("origin", "http://evil.example")]].concat(),
                call("10", r#"{"n":1}"#, ""),
            ),
            (
                vec![plain[0], ("accept", "application/json"), plain[2]],
                call("11", r#"{"n":1}"#, ""),
            ),
            (
                vec![("host", "evil.example"), plain[1], plain[2]],
                call("12", r#"{"n":1}"#, ""),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"2.0","id":13,"method":"tools/list"}"#.to_owned(),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{}}"#.to_owned(),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"pay","arguments":{"n":2}},"extra":1}"#.to_owned(),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"1.0","id":16,"method":"tools/call","params":{"name":"pay","arguments":{"n":2}}}"#.to_owned(),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"pay","arguments":{"n":2},"_meta":[]}}"#.to_owned(),
            ),
            (
                plain.to_vec(),
                r#"{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"pay","arguments":{"n":2},"task":{"ttl":1}}}"#.to_owned(),
            ),
        ];
        for (headers, body) in cases {
            let mut answers = Vec::new();
            for direct in [true, false] {
                let mut request =
                    axum::http::Request::post(MCP_PATH).header("authorization", format!("Bearer {key}"));
                for (k, v) in &headers {
                    request = request.header(*k, *v);
                }
                let response = app(direct)
                    .oneshot(request.body(Body::from(body.clone())).unwrap())
                    .await
                    .unwrap();
                let status = response.status();
                let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                answers.push((status, content_type, normalized(&bytes)));
            }
            assert_eq!(answers[0], answers[1], "{headers:?} {body}");
        }
    }

    /// One stdio session: `lines` written, then the answers to the requests among them, by id
    /// (normalized), read until every request is answered; then the client closes its end.
    async fn stdio_session(
        state: &Arc<AppState>,
        key: &str,
        lines: &[String],
        direct: bool,
    ) -> std::collections::BTreeMap<String, String> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let requests = lines
            .iter()
            .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.get("id").is_some()))
            .count();
        let (client, server) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(server);
        let served = tokio::spawn(serve_lines(state.clone(), key.to_owned(), read, write, direct));
        let (read, mut write) = tokio::io::split(client);
        for line in lines {
            write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        }
        let mut out = tokio::io::BufReader::new(read).lines();
        let mut answers = std::collections::BTreeMap::new();
        while answers.len() < requests {
            let line = tokio::time::timeout(std::time::Duration::from_secs(30), out.next_line())
                .await
                .expect("an answer to every request")
                .unwrap()
                .expect("the session still open");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            answers.insert(v["id"].to_string(), normalized(line.as_bytes()));
        }
        drop(write);
        drop(out);
        // The handshake of a session the SDK refuses fails; either way the session ends.
        let _ = served.await.unwrap();
        answers
    }

    /// Over stdio, the plain calls the transport answers itself (`lines`) are answered exactly
    /// as the SDK answers them: the same messages, with and without the transport's answers,
    /// after every kind of handshake (versions it serves and ones it leaves to the SDK, a
    /// client with the tasks extension, a key that does not authenticate, a session begun
    /// without `initialize`).
    #[tokio::test]
    async fn stdio_direct_answers_are_the_sdks() {
        let dir = tempfile::tempdir().unwrap();
        let (gateway, key) = gateway(dir.path()).await;
        let initialize = |version: &str, capabilities: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{capabilities},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
            )
        };
        let call = |id: &str, args: &str, meta: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"pay","arguments":{args}{meta}}}}}"#
            )
        };
        let messages = [
            call("1", r#"{"n":3}"#, ""),
            call("\"s-1\"", r#"{"n":7.0}"#, ""),
            call("2", r#"{"n":3,"n":4}"#, ""),
            call("3", r#"{"m":1}"#, r#","_meta":{"idempotency_key":"k-1"}"#),
            call("4", "{}", r#","_meta":{"idempotency_key":5}"#),
            call(
                "5",
                "{}",
                r#","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
            ),
            call("6", "{}", r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2025-06-18"}"#),
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"pay","arguments":{"n":2},"task":{"ttl":1}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":10,"method":"ping"}"#.to_owned(),
        ];
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned();
        let tasks = r#"{"extensions":{"io.modelcontextprotocol/tasks":{}}}"#;
        let sessions: Vec<(&str, Vec<String>)> = vec![
            (&key, vec![initialize("2025-06-18", "{}"), initialized.clone()]),
            (&key, vec![initialize("2025-11-25", "{}"), initialized.clone()]),
            (&key, vec![initialize("2024-11-05", "{}")]),
            (&key, vec![initialize("2025-11-25", tasks), initialized.clone()]),
            (
                &key,
                vec![
                    initialize("2026-07-28", r#"{"elicitation":{"url":{}}}"#),
                    initialized.clone(),
                ],
            ),
            (
                "wk_not_a_key",
                vec![initialize("2025-06-18", "{}"), initialized.clone()],
            ),
            // No `initialize`: the SDK's lifecycle from each request's own metadata.
            (&key, Vec::new()),
            // A ping may come first; a second `initialize` is the SDK's to answer.
            (
                &key,
                vec![
                    r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#.to_owned(),
                    initialize("2025-06-18", "{}"),
                    initialized.clone(),
                    initialize("2025-06-18", "{}").replace(r#""id":0"#, r#""id":"again""#),
                ],
            ),
        ];
        for (key, handshake) in sessions {
            let lines = [handshake.as_slice(), &messages].concat();
            let direct = stdio_session(&gateway.state, key, &lines, true).await;
            let sdk = stdio_session(&gateway.state, key, &lines, false).await;
            assert_eq!(direct, sdk, "{handshake:?}");
            assert_eq!(
                direct.len(),
                lines.len() - usize::from(lines.contains(&initialized))
            );
        }
    }

    #[test]
    fn allowed_hosts_include_the_public_host() {
        let c = McpConfig::for_public_url("https://gw.example.com:8443/base");
        assert_eq!(
            c.allowed_hosts,
            ["localhost", "127.0.0.1", "::1", "gw.example.com"]
        );
        let c = McpConfig::for_public_url("http://127.0.0.1:8080");
        assert_eq!(c.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        let c = McpConfig::for_public_url("http://[::1]:8080");
        assert_eq!(c.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        let c = McpConfig::for_public_url("garbage with spaces");
        assert_eq!(c.allowed_hosts.len(), 3);
    }
}
