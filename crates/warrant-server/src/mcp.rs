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

mod lines;
mod raw;
pub(crate) mod tools;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;
use warrant_core::authority::Principal;
use warrant_core::json::Limits;

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
    sdk = if config.allowed_hosts.is_empty() {
        sdk.with_allowed_hosts(["localhost", "127.0.0.1", "::1"])
    } else {
        sdk.with_allowed_hosts(config.allowed_hosts.clone())
    };
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
    };
    Router::new()
        .route_service(MCP_PATH, service)
        .route_layer(axum::middleware::from_fn_with_state(guard, guard_request))
}

/// Serves MCP over stdin/stdout as the holder of the API key `key` until the client closes
/// stdin. The key is checked on every request, as over HTTP (so a revocation reaches a
/// running session).
///
/// # Errors
/// The handshake or the streams fail.
pub async fn serve_stdio(state: Arc<AppState>, key: String) -> std::io::Result<()> {
    serve_io(state, key, tokio::io::stdin(), tokio::io::stdout()).await
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
    let transport = lines::StrictLines::new(reader, writer);
    let running = Gateway::new(state, Some(key))
        .serve(transport)
        .await
        .map_err(std::io::Error::other)?;
    running.waiting().await.map_err(std::io::Error::other)?;
    Ok(())
}

#[derive(Clone)]
struct Guard {
    state: Arc<AppState>,
    max_body_bytes: usize,
}

/// Authenticates the request (401 before any MCP processing) and frames its body
/// ([`raw::frame`]: the strict parser for the message, the raw arguments of a `tools/call` kept
/// aside); the caller and those arguments travel to the handler in the request's extensions.
async fn guard_request(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = match authenticate_request(&guard.state, &parts).await {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    parts.extensions.insert(caller);
    if parts.method != axum::http::Method::POST {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let bytes = match axum::body::to_bytes(body, guard.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request",
                "PAYLOAD_TOO_LARGE",
                "the request body is too large",
            )
            .into_response();
        }
    };
    let limits = Limits {
        max_bytes: guard.max_body_bytes,
        max_depth: MESSAGE_MAX_DEPTH,
    };
    let framed = match raw::frame(&bytes, limits) {
        Ok(framed) => framed,
        Err(refused) => {
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                refused.line(),
            )
                .into_response();
        }
    };
    // The SDK hands the request's parts to the handler: the raw parts of a `tools/call` go
    // with them.
    if let Some(call) = framed.call {
        parts.extensions.insert(call);
    }
    let body = match framed.message {
        std::borrow::Cow::Borrowed(_) => bytes,
        std::borrow::Cow::Owned(message) => axum::body::Bytes::from(message),
    };
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    next.run(Request::from_parts(parts, Body::from(body))).await
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
        let from_meta = context
            .meta
            .0
            .get_traceparent()
            .and_then(crate::trace::parse_traceparent);
        let trace = from_meta
            .or_else(|| {
                parts
                    .and_then(|p| p.extensions.get::<crate::trace::TraceId>())
                    .map(|t| t.0.clone())
            })
            .unwrap_or_else(|| crate::trace::trace_id(&HeaderMap::new()));
        if let Some(key) = &self.key {
            let caller = authenticate(&self.state, key)
                .await
                .map_err(|e| internal_error(&format!("cannot check the API key: {e:?}")))?
                .ok_or_else(|| {
                    ErrorData::invalid_request("the API key is unknown, revoked or malformed", None)
                })?;
            return Ok((caller.principal, trace));
        }
        parts
            .and_then(|p| p.extensions.get::<Caller>())
            .map(|c| (c.principal.clone(), trace))
            .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None))
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("warrant", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool is a Warrant contract. Calls are checked (schema, policy, scopes, \
                 budgets, approvals) and recorded before anything happens. A result marked as an \
                 error says why (stage and code); a call awaiting approval names its approval id: \
                 once a reviewer approves it, call again with the same arguments and \
                 `_meta.approval_id`.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (principal, _) = self.caller(&context).await?;
        Ok(ListToolsResult::with_all_items(tools::visible(
            &self.state.tool_index(),
            &principal,
        )))
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
        let result = match raw {
            Some(raw) => tools::call(&self.state, principal, trace, request, raw, &context.meta.0.0).await,
            None => tools::unframed(&trace),
        };
        Ok(result.into())
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
    async fn gateway(dir: &std::path::Path) -> (crate::Gateway, String) {
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
            },
            runtime: Default::default(),
            settings: Default::default(),
            limits: Default::default(),
            public_url: "http://127.0.0.1:1".into(),
            first_tenant: "acme".into(),
            background: false,
            contract_sync_every: crate::CONTRACT_SYNC_EVERY,
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
