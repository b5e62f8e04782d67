//! The MCP lane end to end, on SQLite and PostgreSQL: a real gateway on a port-0 listener,
//! driven by rmcp's own client over streamable HTTP (and over stdio streams): tools listed by
//! grant with hints from the effect class, a read committed, a write held for approval,
//! approved over HTTP by another principal, committed once and replayed; refusals as tool
//! errors; keys checked before any MCP processing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, MetaObject, RequestMetaObject, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceError, ServiceExt};
use serde_json::{Value, json};
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::records::NewApiKey;
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions, keys};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Kind {
    Sqlite,
    Postgres,
}

/// Effects at the upstream: requests per path, and effects per idempotency key.
#[derive(Default)]
struct Upstream {
    lookups: Mutex<u32>,
    effects: Mutex<HashMap<String, u32>>,
}

impl Upstream {
    fn effects(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }
}

async fn start_upstream() -> (SocketAddr, Arc<Upstream>) {
    use axum::routing::post;
    let up = Arc::new(Upstream::default());
    let (u1, u2) = (up.clone(), up.clone());
    let app = axum::Router::new()
        .route(
            "/lookup",
            post(move |body: axum::body::Bytes| {
                let up = u1.clone();
                async move {
                    *up.lookups.lock().unwrap() += 1;
                    let args: Value = serde_json::from_slice(&body).unwrap();
                    axum::Json(json!({"order_id": args["order_id"], "status": "paid", "total_cents": 1200}))
                }
            }),
        )
        .route(
            "/credit",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let up = u2.clone();
                async move {
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    let args: Value = serde_json::from_slice(&body).unwrap();
                    // Counts every request carrying a key: a second effect would show.
                    *up.effects.lock().unwrap().entry(key.clone()).or_insert(0) += 1;
                    axum::Json(json!({"credit_id": format!("cr_{}", args["customer_id"].as_str().unwrap()), "status": "applied"}))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, up)
}

fn contract(name: &str, effect: &str, scope: &str, approval: &str, extra: &str, url: &str) -> String {
    format!(
        r#"
name: {name}
version: 1
description: The {name} tool.
owner: test
effect: {effect}
scopes: [{scope}]
approval: {approval}
{extra}
input:
  type: object
  additionalProperties: false
  required: [customer_id]
  properties:
    customer_id: {{ type: string, maxLength: 36 }}
    amount_cents: {{ type: integer, minimum: 1, maximum: 500000 }}
output:
  type: object
  additionalProperties: false
  properties:
    credit_id: {{ type: string, maxLength: 64 }}
    status: {{ type: string, maxLength: 16 }}
adapter: {{ kind: http, url: "{url}" }}
"#
    )
}

fn contracts(upstream: SocketAddr) -> Vec<(&'static str, String)> {
    let credit = format!("http://{upstream}/credit");
    vec![
        (
            "lookup.yaml",
            format!(
                r#"
name: lookup
version: 1
description: Look up an order.
owner: test
effect: read
scopes: [orders:read]
approval: none
input:
  type: object
  additionalProperties: false
  required: [order_id]
  properties:
    order_id: {{ type: string, pattern: "^ord_[a-z0-9]{{4,16}}$", maxLength: 20 }}
output:
  type: object
  additionalProperties: false
  required: [order_id, status, total_cents]
  properties:
    order_id: {{ type: string, maxLength: 20 }}
    status: {{ type: string, maxLength: 16 }}
    total_cents: {{ type: integer, minimum: 0, maximum: 100000000 }}
adapter: {{ kind: http, url: "http://{upstream}/lookup" }}
"#
            ),
        ),
        (
            "credit.yaml",
            contract(
                "credit",
                "write",
                "credits:write",
                "per_call",
                "idempotency: { honoured: true, retention: 24h }",
                &credit,
            ),
        ),
        (
            "payout.yaml",
            contract(
                "payout",
                "write",
                "credits:write",
                "per_call",
                "execute_on_approval: true\nidempotency: { honoured: true, retention: 24h }",
                &credit,
            ),
        ),
        (
            "note.yaml",
            contract(
                "note",
                "write",
                "credits:write",
                "none",
                "idempotency: { honoured: true, retention: 24h }",
                &credit,
            ),
        ),
        (
            "refund.yaml",
            contract(
                "refund",
                "irreversible",
                "credits:write",
                "none",
                "idempotency: { honoured: false, retention: 24h }\nretry: { max_attempts: 1 }",
                &credit,
            ),
        ),
        (
            "wipe.yaml",
            contract(
                "wipe",
                "irreversible",
                "danger:wipe",
                "none",
                "idempotency: { honoured: true, retention: 24h }",
                &credit,
            ),
        ),
        (
            "old.yaml",
            contract("old", "read", "orders:read", "none", "", &credit),
        ),
        (
            "secret.yaml",
            contract(
                "secret",
                "write",
                "credits:write",
                "per_call",
                "idempotency: { honoured: true, retention: 24h }",
                &credit,
            )
            .replace(
                "customer_id: { type: string, maxLength: 36 }",
                "customer_id: { type: string, maxLength: 36, x-warrant-sensitive: true }",
            ),
        ),
    ]
}

/// Everyone may invoke anything; supervisors may review anything.
const POLICY: &str = r#"
permit (principal, action in Warrant::Action::"invoke", resource);
permit (principal in Warrant::Role::"supervisor", action in Warrant::Action::"review", resource);
"#;

/// A gateway over `store` whose public URL is `base`.
async fn start_gateway(store: Arc<dyn Store>, contracts_dir: std::path::PathBuf, base: &str) -> Gateway {
    Gateway::start(GatewayConfig {
        store,
        contracts_dir: Some(contracts_dir),
        policies: vec![PolicySource::new("test.cedar", POLICY)],
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: RedactionKey::new(vec![5; 32]).unwrap(),
        adapters: AdapterConfig {
            client: SafeClient::new(NetPolicy {
                allow_hosts: vec!["127.0.0.1".into()],
                ..NetPolicy::default()
            }),
            secrets: Secrets::default(),
            smtp: None,
            command_roots: Vec::new(),
            model: None,
        },
        runtime: RuntimeSettings::default(),
        settings: Settings::default(),
        limits: HttpLimits::default(),
        public_url: base.to_owned(),
        first_tenant: "acme".into(),
        background: false,
        contract_sync_every: warrant_server::CONTRACT_SYNC_EVERY,
        requests_in_flight: Default::default(),
        review_mail: None,
    })
    .await
    .unwrap()
}

struct Harness {
    base: String,
    store: Arc<dyn Store>,
    contracts_dir: std::path::PathBuf,
    gateway: Gateway,
    upstream: Arc<Upstream>,
    /// Keys by name: agent (orders:read, credits:write), reader (orders:read), reviewer.
    keys: HashMap<&'static str, String>,
    cleanup: Option<TestDatabase>,
    _server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn new(kind: Kind) -> Option<Harness> {
        // The workspace's reqwest has rustls without a built-in provider (the binary installs
        // ring); so does every client a test builds, rmcp's included.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let (upstream_addr, upstream) = start_upstream().await;
        let contracts_dir = dir.path().join("contracts");
        std::fs::create_dir_all(&contracts_dir).unwrap();
        for (name, text) in contracts(upstream_addr) {
            std::fs::write(contracts_dir.join(name), text).unwrap();
        }
        let (store, cleanup): (Arc<dyn Store>, _) = match kind {
            Kind::Sqlite => (
                Arc::new(
                    SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
                        .await
                        .unwrap(),
                ),
                None,
            ),
            Kind::Postgres => {
                let db = TestDatabase::postgres().await.unwrap()?;
                (Arc::new(db.open().await.unwrap()), Some(db))
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let gateway = start_gateway(store.clone(), contracts_dir.clone(), &base).await;
        // A retired contract is not a tool (retired as the retire route does it).
        let state = &gateway.state;
        let old = state
            .store
            .get_contract(&warrant_core::contract::Namespace::Platform, "old", 1)
            .await
            .unwrap()
            .unwrap();
        state
            .registry
            .retire(
                &warrant_core::contract::Namespace::Platform,
                &old.content_id,
                time::OffsetDateTime::now_utc(),
            )
            .await
            .unwrap();
        state.sync_contracts().await.unwrap();

        let mut keys = HashMap::new();
        for (name, principal, grants, roles) in [
            (
                "agent",
                "agent-7",
                vec!["orders:read", "credits:write"],
                vec!["agent"],
            ),
            ("reader", "reader-1", vec!["orders:read"], vec!["agent"]),
            ("reviewer", "sup-1", vec![], vec!["supervisor"]),
            ("admin", "root", vec![], vec!["admin"]),
        ] {
            let generated = keys::generate();
            store
                .create_api_key(&NewApiKey {
                    id: generated.id.clone(),
                    key_hash: generated.hash,
                    tenant: "acme".into(),
                    principal: principal.into(),
                    grants: grants.into_iter().map(str::to_owned).collect(),
                    roles: roles.into_iter().map(str::to_owned).collect(),
                    label: None,
                    created_at: time::OffsetDateTime::now_utc(),
                })
                .await
                .unwrap();
            keys.insert(name, generated.key);
        }
        let state = gateway.state.clone();
        let limits = gateway.limits;
        let server = tokio::spawn(async move {
            axum::serve(listener, warrant_server::router(state, limits))
                .await
                .unwrap();
        });
        Some(Harness {
            base,
            store,
            contracts_dir,
            gateway,
            upstream,
            keys,
            cleanup,
            _server: server,
            _dir: dir,
        })
    }

    /// A second node: another gateway over the same store (and the same server secret), on its
    /// own port; served until the handle is dropped.
    async fn second_node(&self) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let gateway = start_gateway(self.store.clone(), self.contracts_dir.clone(), &base).await;
        let (state, limits) = (gateway.state.clone(), gateway.limits);
        let server = tokio::spawn(async move {
            let _gateway = gateway;
            axum::serve(listener, warrant_server::router(state, limits))
                .await
                .unwrap();
        });
        (base, server)
    }

    /// An MCP client over streamable HTTP with `who`'s key.
    async fn client(&self, who: &str) -> Result<RunningService<RoleClient, ()>, String> {
        let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", self.base))
            .auth_header(self.keys[who].clone());
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|e| e.to_string())
    }

    async fn finish(self) {
        drop(self.gateway);
        if let Some(db) = self.cleanup {
            db.drop_schema().await;
        }
    }
}

fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn call(name: &str, arguments: Value, meta: Option<Value>) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments));
    if let Some(meta) = meta {
        params.meta = Some(RequestMetaObject(MetaObject(args(meta))));
    }
    params
}

async fn call_ok(
    client: &RunningService<RoleClient, ()>,
    params: CallToolRequestParams,
) -> Result<CallToolResult, ServiceError> {
    client.call_tool(params).await
}

fn structured(result: &CallToolResult) -> &Value {
    result.structured_content.as_ref().expect("structured content")
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn by_name(tools: &[Tool]) -> HashMap<String, &Tool> {
    tools.iter().map(|t| (t.name.to_string(), t)).collect()
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

async fn tools_are_listed_by_grant_with_hints(h: &Harness) {
    let agent = h.client("agent").await.unwrap();
    let tools = agent.list_all_tools().await.unwrap();
    let tools = by_name(&tools);
    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort_unstable();
    // `wipe` needs a scope the agent lacks; `old` is retired.
    assert_eq!(names, ["credit", "lookup", "note", "payout", "refund", "secret"]);

    let lookup = tools["lookup"];
    assert_eq!(lookup.description.as_deref(), Some("Look up an order."));
    assert_eq!(lookup.input_schema["required"], json!(["order_id"]));
    assert_eq!(lookup.input_schema["additionalProperties"], json!(false));
    let hints = lookup.annotations.as_ref().unwrap();
    assert_eq!(hints.read_only_hint, Some(true));
    assert!(lookup.output_schema.is_none());
    let meta = &lookup.meta.as_ref().unwrap().0;
    assert_eq!(meta["io.warrant/effect"], "read");
    assert!(
        meta["io.warrant/contract_id"]
            .as_str()
            .unwrap()
            .starts_with("tool-contract@sha256:")
    );

    let credit = tools["credit"];
    let hints = credit.annotations.as_ref().unwrap();
    assert_eq!(
        (
            hints.read_only_hint,
            hints.destructive_hint,
            hints.idempotent_hint
        ),
        (Some(false), Some(false), Some(true))
    );
    assert!(credit.description.as_deref().unwrap().contains("approval"));
    assert_eq!(credit.meta.as_ref().unwrap().0["io.warrant/approval"], "per_call");

    let refund = tools["refund"];
    let hints = refund.annotations.as_ref().unwrap();
    assert_eq!(
        (
            hints.read_only_hint,
            hints.destructive_hint,
            hints.idempotent_hint
        ),
        (Some(false), Some(true), Some(false))
    );

    let reader = h.client("reader").await.unwrap();
    let tools = reader.list_all_tools().await.unwrap();
    assert_eq!(
        tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>(),
        ["lookup"]
    );
    agent.cancel().await.unwrap();
    reader.cancel().await.unwrap();
}

async fn a_read_is_committed(h: &Harness) {
    let agent = h.client("agent").await.unwrap();
    let result = call_ok(&agent, call("lookup", json!({"order_id": "ord_abc123"}), None))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    assert_eq!(
        structured(&result),
        &json!({"order_id": "ord_abc123", "status": "paid", "total_cents": 1200})
    );
    let from_text: Value = serde_json::from_str(&text(&result)).unwrap();
    assert_eq!(&from_text, structured(&result));
    let meta = &result.meta.as_ref().unwrap().0;
    assert_eq!(meta["io.warrant/outcome"], "committed");
    let ledger_id = meta["io.warrant/ledger_id"].as_str().unwrap();
    let row = h
        .gateway
        .state
        .store
        .get_ledger("acme", ledger_id)
        .await
        .unwrap()
        .expect("the call's ledger row");
    assert_eq!(row.tool, "lookup");
    assert_eq!(meta["io.warrant/trace_id"].as_str(), Some(row.trace_id.as_str()));
    assert_eq!(*h.upstream.lookups.lock().unwrap(), 1);
    agent.cancel().await.unwrap();
}

async fn a_write_is_approved_then_committed_once(h: &Harness) {
    let agent = h.client("agent").await.unwrap();
    let arguments = json!({"customer_id": "cus_42", "amount_cents": 2500});

    // Held: a tool error naming the approval, nothing at the upstream.
    let held = call_ok(&agent, call("credit", arguments.clone(), None))
        .await
        .unwrap();
    assert_eq!(held.is_error, Some(true));
    let s = structured(&held).clone();
    assert_eq!(s["decision"], "needs_approval");
    let approval = s["approval_id"].as_str().unwrap().to_owned();
    assert!(s["expires_at"].is_string());
    assert_eq!(
        s["review_url"],
        format!("{}/console/approvals/{approval}", h.base)
    );
    assert!(s["idempotency_key"].as_str().unwrap().starts_with("mcp-"));
    let t = text(&held);
    assert!(
        t.contains(&approval) && t.contains("approval_id") && t.contains("/console/approvals/"),
        "{t}"
    );
    assert_eq!(h.upstream.effects(), 0);

    // Asking again before review holds the same request.
    let again = call_ok(&agent, call("credit", arguments.clone(), None))
        .await
        .unwrap();
    assert_eq!(structured(&again)["approval_id"], approval.as_str());

    // Presenting the approval while it is pending still holds.
    let pending = call_ok(
        &agent,
        call(
            "credit",
            arguments.clone(),
            Some(json!({"approval_id": approval})),
        ),
    )
    .await
    .unwrap();
    assert_eq!(pending.is_error, Some(true));
    assert_eq!(structured(&pending)["decision"], "needs_approval");

    // Another principal approves over HTTP.
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/approvals/{approval}/approve", h.base))
        .bearer_auth(&h.keys["reviewer"])
        .json(&json!({"reason": "checked"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());

    // The same call with the approval id commits, once.
    let meta = Some(json!({"approval_id": approval}));
    let done = call_ok(&agent, call("credit", arguments.clone(), meta.clone()))
        .await
        .unwrap();
    assert_eq!(done.is_error, Some(false), "{}", text(&done));
    assert_eq!(
        structured(&done),
        &json!({"credit_id": "cr_cus_42", "status": "applied"})
    );
    assert_eq!(done.meta.as_ref().unwrap().0["io.warrant/outcome"], "committed");
    assert_eq!(h.upstream.effects(), 1);

    // Replayed: the stored result, no second effect (with the approval id, or without it
    // inside the derivation window).
    for meta in [meta, None] {
        let replay = call_ok(&agent, call("credit", arguments.clone(), meta))
            .await
            .unwrap();
        assert_eq!(replay.is_error, Some(false), "{}", text(&replay));
        assert_eq!(structured(&replay), structured(&done));
        assert_eq!(replay.meta.as_ref().unwrap().0["io.warrant/outcome"], "replayed");
    }
    assert_eq!(h.upstream.effects(), 1);

    // Keys of the form `run_…` belong to workflow runs: no other call may use one.
    let reserved = call_ok(
        &agent,
        call(
            "credit",
            arguments.clone(),
            Some(json!({"idempotency_key": "run_01abc.credit.1"})),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        structured(&reserved)["code"],
        "IDEMPOTENCY_KEY_INVALID",
        "{}",
        text(&reserved)
    );

    // Changed arguments do not ride on the approval.
    let changed = call_ok(
        &agent,
        call(
            "credit",
            json!({"customer_id": "cus_42", "amount_cents": 2600}),
            Some(json!({"approval_id": approval})),
        ),
    )
    .await
    .unwrap();
    assert_eq!(changed.is_error, Some(true));
    // Refused by the approval binding, or by the committed key's record, whichever runs first.
    let code = structured(&changed)["code"].as_str().unwrap();
    assert!(
        ["APPROVAL_MISMATCH", "IDEMPOTENCY_KEY_REUSED"].contains(&code),
        "{}",
        text(&changed)
    );
    assert_eq!(h.upstream.effects(), 1);
    agent.cancel().await.unwrap();
}

async fn client_keys_win_and_derived_keys_dedupe(h: &Harness) {
    let agent = h.client("agent").await.unwrap();
    let a = json!({"customer_id": "cus_7"});
    // No key sent: a derived one; the same call again is the same operation.
    let first = call_ok(&agent, call("note", a.clone(), None)).await.unwrap();
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    let second = call_ok(&agent, call("note", a.clone(), None)).await.unwrap();
    assert_eq!(second.meta.as_ref().unwrap().0["io.warrant/outcome"], "replayed");
    assert_eq!(h.upstream.effects(), 1);
    // The client's own keys win: two keys, two operations.
    for key in ["k-1", "k-2", "k-2"] {
        let r = call_ok(
            &agent,
            call("note", a.clone(), Some(json!({"idempotency_key": key}))),
        )
        .await
        .unwrap();
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
    }
    assert_eq!(h.upstream.effects(), 3);
    // A key reused with other arguments is refused.
    let reused = call_ok(
        &agent,
        call(
            "note",
            json!({"customer_id": "cus_8"}),
            Some(json!({"io.warrant/idempotency_key": "k-1"})),
        ),
    )
    .await
    .unwrap();
    assert_eq!(reused.is_error, Some(true));
    assert_eq!(
        structured(&reused)["code"],
        "IDEMPOTENCY_KEY_REUSED",
        "{}",
        text(&reused)
    );
    assert_eq!(h.upstream.effects(), 3);
    agent.cancel().await.unwrap();
}

async fn refusals_are_tool_errors(h: &Harness) {
    let agent = h.client("agent").await.unwrap();
    let cases = [
        (
            call("lookup", json!({"order_id": 7}), None),
            "schema",
            "SCHEMA_TYPE_MISMATCH",
        ),
        (
            call("lookup", json!({"order_id": "ord_abc123", "x": 1}), None),
            "schema",
            "SCHEMA_UNKNOWN_FIELD",
        ),
        (call("nope", json!({}), None), "contract", "CONTRACT_NOT_FOUND"),
        (
            call("old", json!({"customer_id": "c"}), None),
            "contract",
            "CONTRACT_RETIRED",
        ),
        (
            call("wipe", json!({"customer_id": "c"}), None),
            "scope",
            "SCOPE_MISSING",
        ),
        (
            call(
                "lookup",
                json!({"order_id": "ord_abc123"}),
                Some(json!({"approval_id": 5})),
            ),
            "parse",
            "ENVELOPE_INVALID",
        ),
        (
            call(
                "note",
                json!({"customer_id": "c"}),
                Some(json!({"io.warrant/idempotency_key": ["k"]})),
            ),
            "idempotency",
            "IDEMPOTENCY_KEY_INVALID",
        ),
        // Written as `7.0` by the client (serde_json spells an f64 with its fraction): not an
        // integer, as over HTTP, though the SDK's decoded value would print as `7`.
        (
            call("note", json!({"customer_id": "c", "amount_cents": 7.0}), None),
            "schema",
            "SCHEMA_NOT_INTEGER",
        ),
        (
            call(
                "note",
                json!({"customer_id": "c"}),
                Some(json!({"idempotency_key": "has space"})),
            ),
            "idempotency",
            "IDEMPOTENCY_KEY_INVALID",
        ),
    ];
    for (params, stage, code) in cases {
        let name = params.name.to_string();
        let result = call_ok(&agent, params)
            .await
            .unwrap_or_else(|e| panic!("{name}: a protocol error instead of a tool error: {e}"));
        assert_eq!(result.is_error, Some(true), "{name}");
        let s = structured(&result);
        assert_eq!(
            (s["stage"].as_str(), s["code"].as_str()),
            (Some(stage), Some(code)),
            "{name}: {s}"
        );
        let t = text(&result);
        assert!(t.contains(&format!("{stage} {code}")), "{name}: {t}");
        // Every refusal has its ledger row, with the same stage and code.
        let id = s["ledger_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: a refusal names its ledger row: {s}"));
        let row = h
            .gateway
            .state
            .store
            .get_ledger("acme", id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: no ledger row {id}"));
        assert_eq!(
            (row.stage.as_deref(), row.error_code.as_deref()),
            (Some(stage), Some(code)),
            "{name}"
        );
    }
    assert_eq!(h.upstream.effects(), 0);
    agent.cancel().await.unwrap();
}

async fn keys_are_checked_before_mcp(h: &Harness) {
    let http = reqwest::Client::new();
    let url = format!("{}/mcp", h.base);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let post = |key: Option<&str>| {
        let b = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        match key {
            Some(k) => b.bearer_auth(k),
            None => b,
        }
    };
    for key in [None, Some("wrn_nope_nope"), Some("garbage")] {
        let r = post(key).body(init.to_string()).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{key:?}");
        assert!(
            r.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer")
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    }
    // rmcp's client with a wrong key does not get in.
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header("wrn_nope_nope");
    assert!(
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .is_err()
    );

    // With a key: the stateless handshake answers JSON and opens no session.
    let r = post(Some(&h.keys["agent"]))
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers().get("mcp-session-id").is_none());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["result"]["serverInfo"]["name"], "warrant");

    // A duplicate key inside the arguments is the proposal's: refused by `decide`, as over
    // HTTP, with a ledger row.
    let dup = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"note","arguments":{"customer_id":"a","customer_id":"b"}}}"#;
    let r = post(Some(&h.keys["agent"]))
        .header("mcp-protocol-version", "2025-06-18")
        .body(dup)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    let s = &body["result"]["structuredContent"];
    assert_eq!(
        (s["stage"].as_str(), s["code"].as_str()),
        (Some("parse"), Some("DUPLICATE_KEY")),
        "{body}"
    );
    assert!(s["ledger_id"].is_string(), "{body}");
    // Anywhere else in the message it is not strict JSON: a parse error, not a proposal.
    let dup = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"note","name":"lookup","arguments":{"customer_id":"a"}}}"#;
    let r = post(Some(&h.keys["agent"]))
        .header("mcp-protocol-version", "2025-06-18")
        .body(dup)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["id"], 4);
    assert_eq!(body["error"]["code"], -32700);
    // A batch is refused whole.
    let batch = format!(
        "[{}]",
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"note","arguments":{"customer_id":"a"}}}"#
    );
    let r = post(Some(&h.keys["agent"]))
        .header("mcp-protocol-version", "2025-06-18")
        .body(batch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32600);
    assert_eq!(h.upstream.effects(), 0);

    // Stateless: no session stream to open or close.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = http
            .request(method.clone(), &url)
            .bearer_auth(&h.keys["agent"])
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method}");
    }

    // The DNS-rebinding guard stays on.
    let r = post(Some(&h.keys["agent"]))
        .header("host", "evil.example")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
}

async fn stdio_serves_the_same_tools(h: &Harness) {
    let key = &h.keys["agent"];
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(server_io);
    let state = h.gateway.state.clone();
    let server = tokio::spawn(warrant_server::mcp::serve_io(
        state,
        key.clone(),
        server_read,
        server_write,
    ));
    let client = ().serve(tokio::io::split(client_io)).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 6);
    let result = client
        .call_tool(call("lookup", json!({"order_id": "ord_stdio1"}), None))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    assert_eq!(structured(&result)["order_id"], "ord_stdio1");
    let held = client
        .call_tool(call("credit", json!({"customer_id": "cus_9"}), None))
        .await
        .unwrap();
    assert_eq!(structured(&held)["decision"], "needs_approval");
    // Revoked as the revocation route does (the store, then this node's key cache), the key
    // stops working in the running stdio session.
    let state = &h.gateway.state;
    let record = state
        .store
        .find_api_key(&keys::hash_presented(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    let now = time::OffsetDateTime::now_utc();
    assert!(
        state
            .store
            .revoke_api_key(&record.key.tenant, &record.key.id, now)
            .await
            .unwrap()
    );
    state.keys.forget(&record.key.id);
    let refused = client
        .call_tool(call("lookup", json!({"order_id": "ord_stdio2"}), None))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(client.list_all_tools().await.is_err());
    client.cancel().await.unwrap();
    server.await.unwrap().unwrap();
}

/// A published workflow is a tool (`workflow-<name>`, effect `async`) for a caller whose grants
/// cover its contracts' scopes; calling it starts a run through the same code as HTTP, with
/// the client's own argument bytes held to the workflow's input schema, and answers the run id.
async fn workflows_are_tools_that_start_runs(h: &Harness) {
    let doc = "name: order_check\nversion: 1\ndescription: Look an order up.\ninput:\n  type: object\n  \
               additionalProperties: false\n  required: [order_id]\n  properties:\n    order_id: { type: string, maxLength: 20 }\n\
               steps:\n  - id: look\n    tool: lookup@1\n    with: { order_id: \"${input.order_id}\" }\n    next: done\n  \
               - { id: done, end: { status: completed } }\n";
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/workflows", h.base))
        .bearer_auth(&h.keys["admin"])
        .header("content-type", "application/yaml")
        .body(doc)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    let runner = warrant_server::runs::spawn_runner(h.gateway.state.clone());

    let agent = h.client("agent").await.unwrap();
    let tools = agent.list_all_tools().await.unwrap();
    let tools = by_name(&tools);
    let tool = tools["workflow-order_check"];
    // Every tool name is a valid function name for the model APIs clients bridge tools to.
    for name in tools.keys() {
        assert!(
            name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{name}"
        );
    }
    assert_eq!(tool.input_schema["required"], json!(["order_id"]));
    assert_eq!(tool.annotations.as_ref().unwrap().read_only_hint, Some(false));
    assert_eq!(tool.meta.as_ref().unwrap().0["io.warrant/effect"], "async");
    assert_eq!(tool.meta.as_ref().unwrap().0["io.warrant/version"], 1);
    // The reviewer holds no `orders:read`: the workflow is not its tool, and it cannot start it.
    let reviewer = h.client("reviewer").await.unwrap();
    let names: Vec<String> = reviewer
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with("workflow-")), "{names:?}");
    let refused = call_ok(
        &reviewer,
        call("workflow-order_check", json!({"order_id": "ord_abc123"}), None),
    )
    .await
    .unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(structured(&refused)["code"], "WORKFLOW_NOT_FOUND");

    // The input is held to the workflow's input schema.
    let bad = call_ok(
        &agent,
        call("workflow-order_check", json!({"order_id": "ord_1", "x": 1}), None),
    )
    .await
    .unwrap();
    assert_eq!(bad.is_error, Some(true), "{}", text(&bad));
    assert_eq!(structured(&bad)["stage"], "schema", "{}", text(&bad));
    let lookups_before = *h.upstream.lookups.lock().unwrap();
    let started = call_ok(
        &agent,
        call("workflow-order_check", json!({"order_id": "ord_abc123"}), None),
    )
    .await
    .unwrap();
    assert_eq!(started.is_error, Some(false), "{}", text(&started));
    let run_id = structured(&started)["run_id"].as_str().unwrap().to_owned();
    assert!(run_id.starts_with("run_"));
    assert_eq!(structured(&started)["status"], "running");
    // The run goes on without the caller, and its tool step is a governed call.
    let mut run = Value::Null;
    for _ in 0..100 {
        run = http
            .get(format!("{}/v1/runs/{run_id}", h.base))
            .bearer_auth(&h.keys["agent"])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if run["status"] == "completed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(*h.upstream.lookups.lock().unwrap(), lookups_before + 1);
    runner.abort();
    agent.cancel().await.unwrap();
    reviewer.cancel().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Native approvals (2026-07-28: input-required results, the tasks extension)
// ---------------------------------------------------------------------------------------------

/// A 2026-07-28 client that declares URL elicitation (and the tasks extension when `tasks`).
/// When `approve_as` holds a reviewer key, answering the URL elicitation approves the approval
/// it names over HTTP first (the human acting on the page), then accepts.
#[derive(Clone)]
struct NativeClient {
    tasks: bool,
    approve_as: Option<(String, String)>,
}

impl rmcp::ClientHandler for NativeClient {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        use rmcp::model::{ClientCapabilities, ElicitationCapability, UrlElicitationCapability};
        let builder = ClientCapabilities::builder()
            .enable_elicitation_with(ElicitationCapability::new().with_url(UrlElicitationCapability::new()));
        let capabilities = if self.tasks {
            builder.enable_tasks().build()
        } else {
            builder.build()
        };
        rmcp::model::ClientConfig::new(
            capabilities,
            rmcp::model::Implementation::new("warrant-tests", "1"),
        )
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
        let ElicitRequestParams::UrlElicitationParams {
            elicitation_id, url, ..
        } = request
        else {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        if let Some((base, key)) = &self.approve_as {
            assert_eq!(url, format!("{base}/console/approvals/{elicitation_id}"));
            let r = reqwest::Client::new()
                .post(format!("{base}/v1/approvals/{elicitation_id}/approve"))
                .bearer_auth(key)
                .json(&json!({"reason": "seen on the page"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
        }
        Ok(ElicitResult::new(ElicitationAction::Accept))
    }
}

impl Harness {
    /// A 2026-07-28 client (`server/discover`, per-request metadata) with `who`'s key.
    async fn native(&self, who: &str, client: NativeClient) -> RunningService<RoleClient, NativeClient> {
        use rmcp::{ClientLifecycleMode, ClientServiceExt};
        let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", self.base))
            .auth_header(self.keys[who].clone());
        let running = client
            .serve_with_lifecycle(
                StreamableHttpClientTransport::from_config(config),
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .unwrap();
        assert_eq!(
            running.peer_info().unwrap().protocol_version,
            rmcp::model::ProtocolVersion::V_2026_07_28
        );
        running
    }

    async fn decide(&self, approval: &str, verdict: &str) {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/approvals/{approval}/{verdict}", self.base))
            .bearer_auth(&self.keys["reviewer"])
            .json(&json!({"reason": "checked"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    }

    async fn approval_status(&self, approval: &str) -> String {
        let r = reqwest::Client::new()
            .get(format!("{}/v1/approvals/{approval}", self.base))
            .bearer_auth(&self.keys["reviewer"])
            .send()
            .await
            .unwrap();
        let body: Value = r.json().await.unwrap();
        body["status"].as_str().unwrap().to_owned()
    }
}

/// The URL elicitation of an input-required result or a task: (approval id, url).
fn elicited(requests: &rmcp::model::InputRequests) -> (String, String) {
    let value = serde_json::to_value(&requests["approval"]).unwrap();
    assert_eq!(value["method"], "elicitation/create", "{value}");
    assert_eq!(value["params"]["mode"], "url", "{value}");
    (
        value["params"]["elicitationId"].as_str().unwrap().to_owned(),
        value["params"]["url"].as_str().unwrap().to_owned(),
    )
}

fn input_required(response: rmcp::model::CallToolResponse) -> rmcp::model::InputRequiredResult {
    match response {
        rmcp::model::CallToolResponse::InputRequired(ir) => ir,
        other => panic!("not input-required: {other:?}"),
    }
}

fn complete(response: rmcp::model::CallToolResponse) -> CallToolResult {
    match response {
        rmcp::model::CallToolResponse::Complete(r) => r,
        other => panic!("not complete: {other:?}"),
    }
}

fn retry(name: &str, arguments: &Value, state: &str) -> CallToolRequestParams {
    let mut responses = rmcp::model::InputResponses::new();
    responses.insert("approval".into(), json!({"action": "accept"}));
    call(name, arguments.clone(), None)
        .with_input_responses(responses)
        .with_request_state(state.to_owned())
}

/// MRTR: a call that needs approval answers an input-required result (a URL elicitation to the
/// console page, a sealed `requestState`); a retry while pending answers a fresh one; each
/// state is spent once; a tampered or foreign state is a typed refusal and runs nothing; once
/// approved, the retry runs the call once and answers the tool result.
async fn an_input_required_result_resumes_with_its_sealed_state_once(h: &Harness) {
    let agent = h
        .native(
            "agent",
            NativeClient {
                tasks: false,
                approve_as: None,
            },
        )
        .await;
    let arguments = json!({"customer_id": "cus_mrtr", "amount_cents": 1200});
    let first = input_required(
        agent
            .call_tool_once(call("credit", arguments.clone(), None))
            .await
            .unwrap(),
    );
    let requests = first.input_requests.as_ref().unwrap();
    let (approval, url) = elicited(requests);
    assert_eq!(url, format!("{}/console/approvals/{approval}", h.base));
    let state = first.request_state.clone().unwrap();
    assert_eq!(h.upstream.effects(), 0);

    // Pending: a fresh state; the presented one is spent.
    let again = input_required(
        agent
            .call_tool_once(retry("credit", &arguments, &state))
            .await
            .unwrap(),
    );
    let fresh = again.request_state.clone().unwrap();
    assert_ne!(fresh, state);
    assert_eq!(elicited(again.input_requests.as_ref().unwrap()).0, approval);
    let replayed = complete(
        agent
            .call_tool_once(retry("credit", &arguments, &state))
            .await
            .unwrap(),
    );
    assert_eq!(
        structured(&replayed)["code"],
        "REQUEST_STATE_REPLAYED",
        "{}",
        text(&replayed)
    );

    // Tampered: any changed character of the sealed state.
    let mut tampered = fresh.clone().into_bytes();
    let at = tampered.len() / 2;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let refused = complete(
        agent
            .call_tool_once(retry("credit", &arguments, &tampered))
            .await
            .unwrap(),
    );
    assert_eq!(
        structured(&refused)["code"],
        "REQUEST_STATE_INVALID",
        "{}",
        text(&refused)
    );
    assert_eq!(structured(&refused)["stage"], "approval");

    // Foreign: another principal presenting the agent's state.
    let reader = h
        .native(
            "reader",
            NativeClient {
                tasks: false,
                approve_as: None,
            },
        )
        .await;
    let foreign = complete(
        reader
            .call_tool_once(retry("credit", &arguments, &fresh))
            .await
            .unwrap(),
    );
    assert_eq!(
        structured(&foreign)["code"],
        "REQUEST_STATE_FOREIGN",
        "{}",
        text(&foreign)
    );
    reader.cancel().await.unwrap();
    assert_eq!(h.upstream.effects(), 0);

    // Approved: the retry runs the call, once.
    h.decide(&approval, "approve").await;
    let done = complete(
        agent
            .call_tool_once(retry("credit", &arguments, &fresh))
            .await
            .unwrap(),
    );
    assert_eq!(done.is_error, Some(false), "{}", text(&done));
    assert_eq!(
        structured(&done),
        &json!({"credit_id": "cr_cus_mrtr", "status": "applied"})
    );
    assert_eq!(h.upstream.effects(), 1);
    let twice = complete(
        agent
            .call_tool_once(retry("credit", &arguments, &fresh))
            .await
            .unwrap(),
    );
    assert_eq!(structured(&twice)["code"], "REQUEST_STATE_REPLAYED");
    assert_eq!(h.upstream.effects(), 1);
    assert_eq!(h.approval_status(&approval).await, "consumed");
    agent.cancel().await.unwrap();
}

/// The SDK's own client loop (`call_tool`): it answers the URL elicitation (here the human
/// approves on the page meanwhile), retries with the state, and returns the tool result.
async fn the_sdk_client_loop_receives_the_result_natively(h: &Harness) {
    let reviewer = (h.base.clone(), h.keys["reviewer"].clone());
    let agent = h
        .native(
            "agent",
            NativeClient {
                tasks: false,
                approve_as: Some(reviewer),
            },
        )
        .await;
    let arguments = json!({"customer_id": "cus_loop", "amount_cents": 900});
    let done = agent.call_tool(call("credit", arguments, None)).await.unwrap();
    assert_eq!(done.is_error, Some(false), "{}", text(&done));
    assert_eq!(structured(&done)["credit_id"], "cr_cus_loop");
    assert_eq!(h.upstream.effects(), 1);
    agent.cancel().await.unwrap();
}

/// A client of `who` that declares the tasks extension.
async fn tasks_client(h: &Harness, who: &str) -> RunningService<RoleClient, NativeClient> {
    h.native(
        who,
        NativeClient {
            tasks: true,
            approve_as: None,
        },
    )
    .await
}

/// The task a held call of `tool` answers at once (checked: still asking for input when
/// polled), and the approval its poll names.
async fn held_task(
    agent: &RunningService<RoleClient, NativeClient>,
    tool: &str,
    arguments: Value,
) -> (String, String) {
    use rmcp::model::{CallToolResponse, GetTaskParams, TaskPayload, TaskStatus};
    let CallToolResponse::Task(created) = agent.call_tool_once(call(tool, arguments, None)).await.unwrap()
    else {
        panic!("not a task")
    };
    assert_eq!(created.task.status, TaskStatus::InputRequired);
    let id = created.task.task_id.clone();
    let got = agent
        .peer()
        .get_task(GetTaskParams::new(id.clone()))
        .await
        .unwrap();
    let TaskPayload::InputRequired { input_requests } = &got.task.payload else {
        panic!("not input-required: {got:?}")
    };
    (id, elicited(input_requests).0)
}

/// The tasks extension: the held call is a durable task — `input_required` with the console
/// link while pending, invisible to another principal; once approved, any node's `tasks/get`
/// runs the call and completes the task with the tool result, once.
async fn a_task_completes_when_the_reviewer_decides_on_any_node(h: &Harness) {
    use rmcp::model::{GetTaskParams, TaskPayload, TaskStatus};
    let agent = tasks_client(h, "agent").await;
    let arguments = json!({"customer_id": "cus_task", "amount_cents": 700});
    let (id, approval) = held_task(&agent, "credit", arguments).await;
    assert_eq!(h.upstream.effects(), 0);

    let other = tasks_client(h, "reader").await;
    let unknown = other.peer().get_task(GetTaskParams::new(id.clone())).await;
    assert!(
        matches!(&unknown, Err(ServiceError::McpError(e)) if e.code.0 == -32602),
        "{unknown:?}"
    );
    other.cancel().await.unwrap();

    h.decide(&approval, "approve").await;
    // Another node on the same store answers the poll.
    let (second, _node) = h.second_node().await;
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{second}/mcp"))
        .auth_header(h.keys["agent"].clone());
    let elsewhere = {
        use rmcp::{ClientLifecycleMode, ClientServiceExt};
        NativeClient {
            tasks: true,
            approve_as: None,
        }
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(config),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap()
    };
    let done = elsewhere
        .peer()
        .get_task(GetTaskParams::new(id.clone()))
        .await
        .unwrap();
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("not completed: {done:?}")
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result.clone())).unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    assert_eq!(structured(&result)["credit_id"], "cr_cus_task");
    assert_eq!(h.upstream.effects(), 1);
    // Polled again (here, back on the first node): the same result, no second effect.
    let again = agent.peer().get_task(GetTaskParams::new(id)).await.unwrap();
    assert_eq!(again.task.task.status, TaskStatus::Completed);
    let TaskPayload::Completed { result: again } = &again.task.payload else {
        panic!("{again:?}")
    };
    let TaskPayload::Completed { result: first } = &done.task.payload else {
        unreachable!()
    };
    assert_eq!(again, first);
    assert_eq!(h.upstream.effects(), 1);
    elsewhere.cancel().await.unwrap();
    agent.cancel().await.unwrap();
}

/// A held call of a contract with a sensitive field is a task too: the task keeps the call
/// sealed (never the value in clear) and runs it, exactly, on the decision.
async fn a_task_keeps_a_sensitive_call_sealed(h: &Harness) {
    use rmcp::model::{GetTaskParams, TaskPayload};
    let agent = tasks_client(h, "agent").await;
    let arguments = json!({"customer_id": "cus_hidden", "amount_cents": 900});
    let (id, approval) = held_task(&agent, "secret", arguments).await;
    let stored = h
        .store
        .get_task("acme", &id, time::OffsetDateTime::now_utc())
        .await
        .unwrap()
        .expect("the task is stored");
    assert!(!stored.call.to_string().contains("cus_hidden"), "{}", stored.call);
    assert_eq!(stored.call["sealed"], true);
    h.decide(&approval, "approve").await;
    let done = agent.peer().get_task(GetTaskParams::new(id)).await.unwrap();
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("not completed: {done:?}")
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result.clone())).unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    assert_eq!(structured(&result)["credit_id"], "cr_cus_hidden");
    assert_eq!(h.upstream.effects(), 1);
    agent.cancel().await.unwrap();
}

/// A rejected approval fails its task with the typed refusal; cancelling a task withdraws its
/// pending approval (no reviewer can run it any more), and an ended task cannot be cancelled.
async fn a_task_fails_on_rejection_and_cancels_its_approval(h: &Harness) {
    use rmcp::model::{CallToolResponse, CancelTaskParams, GetTaskParams, TaskPayload, TaskStatus};
    let agent = tasks_client(h, "agent").await;
    let task_of = |r: CallToolResponse| match r {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("not a task: {other:?}"),
    };
    let rejected = task_of(
        agent
            .call_tool_once(call(
                "credit",
                json!({"customer_id": "cus_no", "amount_cents": 5}),
                None,
            ))
            .await
            .unwrap(),
    );
    let got = agent
        .peer()
        .get_task(GetTaskParams::new(rejected.clone()))
        .await
        .unwrap();
    let TaskPayload::InputRequired { input_requests } = &got.task.payload else {
        panic!("{got:?}")
    };
    let (approval, _) = elicited(input_requests);
    h.decide(&approval, "reject").await;
    let failed = agent
        .peer()
        .get_task(GetTaskParams::new(rejected.clone()))
        .await
        .unwrap();
    let TaskPayload::Failed { error } = &failed.task.payload else {
        panic!("{failed:?}")
    };
    assert_eq!(error["data"]["code"], "APPROVAL_REJECTED", "{error:?}");
    assert_eq!(failed.task.task.status, TaskStatus::Failed);

    let cancelled = task_of(
        agent
            .call_tool_once(call(
                "credit",
                json!({"customer_id": "cus_cancel", "amount_cents": 6}),
                None,
            ))
            .await
            .unwrap(),
    );
    let got = agent
        .peer()
        .get_task(GetTaskParams::new(cancelled.clone()))
        .await
        .unwrap();
    let TaskPayload::InputRequired { input_requests } = &got.task.payload else {
        panic!("{got:?}")
    };
    let (approval, _) = elicited(input_requests);
    agent
        .peer()
        .cancel_task(CancelTaskParams::new(cancelled.clone()))
        .await
        .unwrap();
    let got = agent
        .peer()
        .get_task(GetTaskParams::new(cancelled.clone()))
        .await
        .unwrap();
    assert_eq!(got.task.task.status, TaskStatus::Cancelled);
    assert_eq!(h.approval_status(&approval).await, "rejected");
    let twice = agent.peer().cancel_task(CancelTaskParams::new(cancelled)).await;
    assert!(twice.is_err(), "{twice:?}");
    assert_eq!(h.upstream.effects(), 0);

    // Approved: too late to cancel; the task still completes with the call's result.
    let approved = task_of(
        agent
            .call_tool_once(call(
                "credit",
                json!({"customer_id": "cus_late", "amount_cents": 7}),
                None,
            ))
            .await
            .unwrap(),
    );
    let got = agent
        .peer()
        .get_task(GetTaskParams::new(approved.clone()))
        .await
        .unwrap();
    let TaskPayload::InputRequired { input_requests } = &got.task.payload else {
        panic!("{got:?}")
    };
    let (approval, _) = elicited(input_requests);
    h.decide(&approval, "approve").await;
    let refused = agent
        .peer()
        .cancel_task(CancelTaskParams::new(approved.clone()))
        .await;
    assert!(
        matches!(&refused, Err(ServiceError::McpError(e)) if e.code.0 == -32602),
        "{refused:?}"
    );
    assert_eq!(h.approval_status(&approval).await, "approved");
    let done = agent.peer().get_task(GetTaskParams::new(approved)).await.unwrap();
    assert_eq!(done.task.task.status, TaskStatus::Completed);
    assert_eq!(h.upstream.effects(), 1);
    agent.cancel().await.unwrap();
}

/// A contract with `execute_on_approval`: the reviewer's decision runs the call at once; the
/// agent's later retry (a legacy retry with the approval id, or an MRTR retry with its state)
/// answers the stored result without a second effect.
async fn an_approval_executes_on_decision_and_the_retry_replays(h: &Harness) {
    // Legacy client.
    let agent = h.client("agent").await.unwrap();
    let arguments = json!({"customer_id": "cus_auto", "amount_cents": 300});
    let held = call_ok(&agent, call("payout", arguments.clone(), None))
        .await
        .unwrap();
    let approval = structured(&held)["approval_id"].as_str().unwrap().to_owned();
    h.decide(&approval, "approve").await;
    assert_eq!(h.upstream.effects(), 1, "executed on the decision");
    assert_eq!(h.approval_status(&approval).await, "consumed");
    let retried = call_ok(
        &agent,
        call("payout", arguments, Some(json!({"approval_id": approval}))),
    )
    .await
    .unwrap();
    assert_eq!(retried.is_error, Some(false), "{}", text(&retried));
    assert_eq!(retried.meta.as_ref().unwrap().0["io.warrant/outcome"], "replayed");
    assert_eq!(structured(&retried)["credit_id"], "cr_cus_auto");
    assert_eq!(h.upstream.effects(), 1);
    agent.cancel().await.unwrap();

    // MRTR client.
    let native = h
        .native(
            "agent",
            NativeClient {
                tasks: false,
                approve_as: None,
            },
        )
        .await;
    let arguments = json!({"customer_id": "cus_auto2", "amount_cents": 301});
    let first = input_required(
        native
            .call_tool_once(call("payout", arguments.clone(), None))
            .await
            .unwrap(),
    );
    let (approval, _) = elicited(first.input_requests.as_ref().unwrap());
    h.decide(&approval, "approve").await;
    assert_eq!(h.upstream.effects(), 2);
    let state = first.request_state.unwrap();
    let done = complete(
        native
            .call_tool_once(retry("payout", &arguments, &state))
            .await
            .unwrap(),
    );
    assert_eq!(done.is_error, Some(false), "{}", text(&done));
    assert_eq!(done.meta.as_ref().unwrap().0["io.warrant/outcome"], "replayed");
    assert_eq!(h.upstream.effects(), 2);
    native.cancel().await.unwrap();
}

/// Approve with edits (`POST /v1/approvals/{id}/approve` with `arguments`): the edited call
/// runs at once, the original never; an agent waiting natively — a task poll, an MRTR retry —
/// receives the edited call's result, marked as edited; a legacy retry of the original is told
/// which approval replaced it.
async fn an_edited_approval_answers_the_waiting_agent_with_the_edited_call(h: &Harness) {
    use rmcp::model::{GetTaskParams, TaskPayload};
    let http = reqwest::Client::new();
    let edit = |approval: String, amount: u64, customer: &'static str| {
        let http = http.clone();
        let url = format!("{}/v1/approvals/{approval}/approve", h.base);
        let key = h.keys["reviewer"].clone();
        async move {
            let r = http
                .post(url)
                .bearer_auth(key)
                .json(&json!({"reason": "smaller credit", "arguments": {"customer_id": customer, "amount_cents": amount}}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            assert_eq!(status, 200, "{body:#}");
            assert_eq!(body["status"], "consumed", "{body:#}");
            assert_eq!(body["edited_from"], approval.as_str());
            body
        }
    };

    // A task: completes with the edited call's result.
    let agent = tasks_client(h, "agent").await;
    let (id, approval) = held_task(
        &agent,
        "credit",
        json!({"customer_id": "cus_ed1", "amount_cents": 9000}),
    )
    .await;
    let edited = edit(approval.clone(), 4000, "cus_ed1").await;
    assert_eq!(h.upstream.effects(), 1, "the edited call ran on the decision");
    // The execution's ledger row records the edit: the editor, the original request and its
    // digest, the reason; its own payload digest is the edited one.
    let row: Value = http
        .get(format!(
            "{}/v1/ledger/{}",
            h.base,
            edited["execution_ledger_id"].as_str().unwrap()
        ))
        .bearer_auth(&h.keys["reviewer"])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let detail = row["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!("edited by sup-1 from {approval} (sha256:"))
            && detail.ends_with(": smaller credit"),
        "{row:#}"
    );
    assert_eq!(row["approval_id"], edited["id"], "{row:#}");
    assert_eq!(row["payload_digest"], edited["payload_digest"], "{row:#}");
    assert_eq!(h.approval_status(&approval).await, "rejected");
    let done = agent.peer().get_task(GetTaskParams::new(id)).await.unwrap();
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("{done:?}")
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result.clone())).unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    let marked = &result.meta.as_ref().unwrap().0["io.warrant/edited"];
    assert_eq!(marked["original_approval_id"], approval.as_str());
    assert_eq!(marked["approval_id"], edited["id"]);
    assert_eq!(marked["arguments"]["amount_cents"], 4000);
    assert_eq!(result.meta.as_ref().unwrap().0["io.warrant/outcome"], "replayed");
    assert_eq!(h.upstream.effects(), 1);
    agent.cancel().await.unwrap();

    // MRTR: the retry with the original state answers the edited call's result.
    let native = h
        .native(
            "agent",
            NativeClient {
                tasks: false,
                approve_as: None,
            },
        )
        .await;
    let arguments = json!({"customer_id": "cus_ed2", "amount_cents": 9000});
    let first = input_required(
        native
            .call_tool_once(call("credit", arguments.clone(), None))
            .await
            .unwrap(),
    );
    let (approval, _) = elicited(first.input_requests.as_ref().unwrap());
    edit(approval.clone(), 3000, "cus_ed2").await;
    assert_eq!(h.upstream.effects(), 2);
    let done = complete(
        native
            .call_tool_once(retry(
                "credit",
                &arguments,
                first.request_state.as_deref().unwrap(),
            ))
            .await
            .unwrap(),
    );
    assert_eq!(done.is_error, Some(false), "{}", text(&done));
    assert_eq!(
        done.meta.as_ref().unwrap().0["io.warrant/edited"]["arguments"]["amount_cents"],
        3000
    );
    assert_eq!(h.upstream.effects(), 2);
    native.cancel().await.unwrap();

    // A legacy retry of the original with its approval id: refused, naming the edited approval.
    let legacy = h.client("agent").await.unwrap();
    let arguments = json!({"customer_id": "cus_ed3", "amount_cents": 9000});
    let held = call_ok(&legacy, call("credit", arguments.clone(), None))
        .await
        .unwrap();
    let approval = structured(&held)["approval_id"].as_str().unwrap().to_owned();
    let edited = edit(approval.clone(), 2000, "cus_ed3").await;
    let retried = call_ok(
        &legacy,
        call("credit", arguments, Some(json!({"approval_id": approval}))),
    )
    .await
    .unwrap();
    assert_eq!(structured(&retried)["code"], "APPROVAL_REJECTED");
    assert!(
        text(&retried).contains(edited["id"].as_str().unwrap()),
        "{}",
        text(&retried)
    );
    assert_eq!(h.upstream.effects(), 3);
    legacy.cancel().await.unwrap();

    // The proposer cannot edit its own request; edits of a decided request conflict.
    let r = http
        .post(format!("{}/v1/approvals/{approval}/approve", h.base))
        .bearer_auth(&h.keys["reviewer"])
        .json(&json!({"reason": "again", "arguments": {"customer_id": "cus_ed3", "amount_cents": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
}

// ---------------------------------------------------------------------------------------------
// Both backends
// ---------------------------------------------------------------------------------------------

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = crate::Harness::new(crate::Kind::Sqlite).await.unwrap();
                    crate::$case(&h).await;
                    h.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(h) = crate::Harness::new(crate::Kind::Postgres).await else { return };
                    crate::$case(&h).await;
                    h.finish().await;
                }
            )*
        }
    };
}

on_every_backend! {
    an_input_required_result_resumes_with_its_sealed_state_once,
    the_sdk_client_loop_receives_the_result_natively,
    a_task_completes_when_the_reviewer_decides_on_any_node,
    a_task_keeps_a_sensitive_call_sealed,
    a_task_fails_on_rejection_and_cancels_its_approval,
    an_approval_executes_on_decision_and_the_retry_replays,
    an_edited_approval_answers_the_waiting_agent_with_the_edited_call,
    tools_are_listed_by_grant_with_hints,
    a_read_is_committed,
    a_write_is_approved_then_committed_once,
    client_keys_win_and_derived_keys_dedupe,
    refusals_are_tool_errors,
    keys_are_checked_before_mcp,
    stdio_serves_the_same_tools,
    workflows_are_tools_that_start_runs,
}
