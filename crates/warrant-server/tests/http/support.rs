//! A real gateway on a port-0 listener over SQLite or PostgreSQL, test contracts bound to a
//! loopback upstream that counts effects, and keys for several principals and tenants.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
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

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// Effects per idempotency key at the upstream.
#[derive(Default)]
pub struct Upstream {
    pub effects: Mutex<HashMap<String, u32>>,
    pub requests: Mutex<u32>,
    /// The arguments of each credit the upstream received.
    pub credits: Mutex<Vec<Value>>,
    /// What the stub chat model answers next (`tool_calls` of its one choice); a default
    /// proposal of a credit when empty.
    pub model_answers: Mutex<std::collections::VecDeque<Value>>,
    /// The chat completion requests the stub received, with their `authorization` header.
    pub model_requests: Mutex<Vec<(Option<String>, Value)>>,
}

/// The stub model's tool calls: one call of `function` with `arguments` as its string.
pub fn model_calls(function: &str, arguments: &str) -> Value {
    json!([{"id": "call_1", "type": "function", "function": {"name": function, "arguments": arguments}}])
}

impl Upstream {
    pub fn total(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }
}

pub async fn start_upstream() -> (SocketAddr, Arc<Upstream>) {
    use axum::routing::post;
    let up = Arc::new(Upstream::default());
    let (u1, u2, u3) = (up.clone(), up.clone(), up.clone());
    let app = axum::Router::new()
        .route(
            "/lookup",
            post(move |body: axum::body::Bytes| {
                let up = u1.clone();
                async move {
                    *up.requests.lock().unwrap() += 1;
                    let args: Value = serde_json::from_slice(&body).unwrap();
                    axum::Json(json!({"order_id": args["order_id"], "status": "paid", "total_cents": 1200, "currency": "EUR"}))
                }
            }),
        )
        .route(
            "/credit",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let up = u2.clone();
                async move {
                    *up.requests.lock().unwrap() += 1;
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    let args: Value = serde_json::from_slice(&body).unwrap();
                    if args["reason"] == "slow" {
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                    up.credits.lock().unwrap().push(args.clone());
                    // Honours idempotency: one effect per key.
                    up.effects.lock().unwrap().entry(key.clone()).or_insert(1);
                    axum::Json(json!({"credit_id": format!("cr_{}", &key[3..15]), "status": "applied"}))
                }
            }),
        )
        .route(
            "/v1/chat/completions",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let up = u3.clone();
                async move {
                    let request: Value = serde_json::from_slice(&body).unwrap();
                    let auth = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned());
                    up.model_requests.lock().unwrap().push((auth, request));
                    let calls = up.model_answers.lock().unwrap().pop_front().unwrap_or_else(|| {
                        model_calls("credit", r#"{"customer_id": "cus_model", "amount_cents": 750, "reason": "late delivery"}"#)
                    });
                    axum::Json(json!({
                        "id": "chatcmpl-1", "object": "chat.completion", "model": "stub",
                        "choices": [{"index": 0, "finish_reason": "tool_calls",
                            "message": {"role": "assistant", "content": null, "tool_calls": calls}}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                    }))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, up)
}

pub fn contracts(upstream: SocketAddr) -> Vec<(String, String)> {
    vec![
        (
            "workflow_validator.yaml".into(),
            include_str!("../../../../examples/contracts/workflow_validator.v1.yaml").into(),
        ),
        (
            "lookup.yaml".into(),
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
  required: [order_id, status, total_cents, currency]
  properties:
    order_id: {{ type: string, maxLength: 20 }}
    status: {{ type: string, maxLength: 16 }}
    total_cents: {{ type: integer, minimum: 0, maximum: 100000000 }}
    currency: {{ type: string, maxLength: 3 }}
adapter: {{ kind: http, url: "http://{upstream}/lookup" }}
"#
            ),
        ),
        ("credit.yaml".into(), credit_contract(upstream, "credit", "")),
        (
            "payout.yaml".into(),
            credit_contract(upstream, "payout", "execute_on_approval: true\n"),
        ),
    ]
}

/// A write contract issuing a credit, held for review per call, with a sensitive field
/// (`customer_id`); `extra` adds lines (e.g. `execute_on_approval`).
fn credit_contract(upstream: SocketAddr, name: &str, extra: &str) -> String {
    credit_document(upstream, name, 1, extra, true)
}

/// The credit contract's document: `version`, `extra` lines, `customer_id` sensitive or not.
pub fn credit_document(
    upstream: SocketAddr,
    name: &str,
    version: u32,
    extra: &str,
    sensitive: bool,
) -> String {
    let marked = if sensitive {
        ", x-warrant-sensitive: true"
    } else {
        ""
    };
    format!(
        r#"
name: {name}
version: {version}
description: Issue a credit.
owner: test
effect: write
scopes: [credits:write]
approval: per_call
{extra}idempotency: {{ honoured: true, retention: 24h }}
retry: {{ max_attempts: 2 }}
input:
  type: object
  additionalProperties: false
  required: [customer_id, amount_cents, reason]
  properties:
    customer_id: {{ type: string, maxLength: 36{marked} }}
    amount_cents: {{ type: integer, minimum: 1, maximum: 500000 }}
    reason: {{ type: string, minLength: 1, maxLength: 200 }}
output:
  type: object
  additionalProperties: false
  required: [credit_id, status]
  properties:
    credit_id: {{ type: string, maxLength: 64 }}
    status: {{ enum: [applied, pending] }}
adapter: {{ kind: http, url: "http://{upstream}/credit" }}
"#
    )
}

const POLICY: &str = r#"
permit (principal in Warrant::Role::"agent", action in Warrant::Action::"lookup", resource);
permit (principal in Warrant::Role::"agent", action in Warrant::Action::"workflow_validator", resource);
permit (principal in Warrant::Role::"agent", action in Warrant::Action::"credit", resource)
when { resource.tenant == principal.tenant };
permit (principal in Warrant::Role::"supervisor", action in Warrant::Action::"review:credit", resource);
permit (principal in Warrant::Role::"agent", action in Warrant::Action::"payout", resource);
permit (principal in Warrant::Role::"supervisor", action in Warrant::Action::"review:payout", resource);
permit (principal in Warrant::Role::"senior", action in Warrant::Action::"reveal", resource);
permit (principal in Warrant::Role::"agent", action in Warrant::Action::"invoke", resource)
when { !resource.platform };
@id("credit.overflow")
forbid (principal, action in Warrant::Action::"credit", resource)
when { context.amount_cents == 424242 && context.amount_cents * 9223372036854775807 > 0 };
"#;

/// A credit amount for which the forbid `credit.overflow` cannot be evaluated.
pub const OVERFLOWING_AMOUNT: u32 = 424_242;

/// The gateways' redaction key: a test computes the keyed hash a sensitive value is kept as.
pub fn redaction_key() -> RedactionKey {
    RedactionKey::new(vec![3; 32]).unwrap()
}

pub struct Node {
    pub base: String,
    pub gateway: Gateway,
    _server: tokio::task::JoinHandle<()>,
}

pub struct Harness {
    pub nodes: Vec<Node>,
    pub upstream: Arc<Upstream>,
    pub upstream_addr: SocketAddr,
    pub http: reqwest::Client,
    /// The store of node 0, to check what is kept.
    pub store: Arc<dyn Store>,
    /// Keys by name: admin, agent, reviewer, other (another tenant's agent), other_admin
    /// (another tenant's admin), operator (the platform operator).
    pub keys: HashMap<&'static str, String>,
    cleanup: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

async fn start_node(store: Arc<dyn Store>, dir: &std::path::Path, upstream: SocketAddr) -> Node {
    let gateway = Gateway::start(GatewayConfig {
        store,
        contracts_dir: Some(dir.join("contracts")),
        policies: vec![PolicySource::new("test.cedar", POLICY)],
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: redaction_key(),
        adapters: AdapterConfig {
            client: SafeClient::new(NetPolicy {
                allow_hosts: vec![upstream.ip().to_string()],
                ..NetPolicy::default()
            }),
            secrets: Secrets::default(),
            smtp: None,
            command_roots: Vec::new(),
            model: Some(warrant_runtime::model::ModelEndpoint {
                base_url: format!("http://{upstream}/v1").parse().unwrap(),
                model: "stub".into(),
                credential: Some(warrant_runtime::Secret::new("sk-stub")),
                max_tokens: Some(200),
                timeout: std::time::Duration::from_secs(5),
            }),
        },
        runtime: RuntimeSettings::default(),
        settings: Settings::default(),
        limits: HttpLimits::default(),
        public_url: "http://warrant.test".into(),
        first_tenant: "acme".into(),
        background: false,
        contract_sync_every: warrant_server::CONTRACT_SYNC_EVERY,
        requests_in_flight: Default::default(),
        review_mail: None,
    })
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = gateway.state.clone();
    let limits = gateway.limits;
    let server = tokio::spawn(async move {
        axum::serve(listener, warrant_server::router(state, limits))
            .await
            .unwrap();
    });
    Node {
        base,
        gateway,
        _server: server,
    }
}

impl Harness {
    /// `nodes` gateways over one store (several only make sense on PostgreSQL, where each
    /// node gets its own connection pool).
    pub async fn new(kind: Kind, nodes: usize) -> Option<Harness> {
        // The workspace's reqwest has rustls without a built-in provider (the binary installs
        // ring); so does every client a test builds, rmcp's included.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let (upstream_addr, upstream) = start_upstream().await;
        std::fs::create_dir_all(dir.path().join("contracts")).unwrap();
        for (name, text) in contracts(upstream_addr) {
            std::fs::write(dir.path().join("contracts").join(name), text).unwrap();
        }
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        let mut cleanup = None;
        match kind {
            Kind::Sqlite => {
                let s = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
                    .await
                    .unwrap();
                stores.push(Arc::new(s));
            }
            Kind::Postgres => {
                let db = TestDatabase::postgres().await.unwrap()?;
                for _ in 0..nodes {
                    stores.push(Arc::new(db.open().await.unwrap()));
                }
                cleanup = Some(db);
            }
        }
        let store = stores[0].clone();
        let mut started = Vec::new();
        for s in stores {
            started.push(start_node(s, dir.path(), upstream_addr).await);
        }
        let mut keys = HashMap::new();
        for (name, tenant, principal, grants, roles) in [
            ("admin", "acme", "root", vec![], vec!["admin"]),
            (
                "agent",
                "acme",
                "agent-7",
                vec!["orders:read", "credits:write", "workflows:validate"],
                vec!["agent"],
            ),
            ("reviewer", "acme", "sup-1", vec![], vec!["supervisor"]),
            ("senior", "acme", "sup-2", vec![], vec!["supervisor", "senior"]),
            ("other_admin", "globex", "root-g", vec![], vec!["admin"]),
            ("operator", "platform", "ops", vec![], vec!["admin"]),
            (
                "other",
                "globex",
                "agent-9",
                vec!["orders:read", "credits:write"],
                vec!["agent", "supervisor"],
            ),
        ] {
            let generated = keys::generate();
            store
                .create_api_key(&NewApiKey {
                    id: generated.id.clone(),
                    key_hash: generated.hash,
                    tenant: tenant.into(),
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
        Some(Harness {
            nodes: started,
            upstream,
            upstream_addr,
            http: reqwest::Client::new(),
            store,
            keys,
            cleanup,
            _dir: dir,
        })
    }

    pub fn base(&self) -> &str {
        &self.nodes[0].base
    }

    /// A request to node 0 with `who`'s key.
    pub fn req(&self, method: reqwest::Method, path: &str, who: &str) -> reqwest::RequestBuilder {
        self.req_on(0, method, path, who)
    }

    pub fn req_on(
        &self,
        node: usize,
        method: reqwest::Method,
        path: &str,
        who: &str,
    ) -> reqwest::RequestBuilder {
        let b = self
            .http
            .request(method, format!("{}{path}", self.nodes[node].base));
        match self.keys.get(who) {
            Some(key) => b.bearer_auth(key),
            None => b,
        }
    }

    /// `who` approves approval `id` through node `node`; answers the status.
    pub async fn approve_on(&self, node: usize, who: &str, id: &str) -> u16 {
        self.req_on(
            node,
            reqwest::Method::POST,
            &format!("/v1/approvals/{id}/approve"),
            who,
        )
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
    }

    /// POSTs a proposal as `who`; answers (status, body).
    /// The approval request `id` of tenant `acme` as the store holds it.
    pub async fn stored_approval(&self, id: &str) -> warrant_core::records::ApprovalRequest {
        self.store
            .get_approval("acme", id, time::OffsetDateTime::now_utc())
            .await
            .unwrap()
            .unwrap()
    }

    /// `GET path` on node 0 as `who`: the JSON answer.
    pub async fn get_json(&self, path: &str, who: &str) -> Value {
        self.req(reqwest::Method::GET, path, who)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn propose(&self, who: &str, proposal: &Value) -> (u16, Value) {
        self.propose_with(0, who, proposal, &[]).await
    }

    pub async fn propose_with(
        &self,
        node: usize,
        who: &str,
        proposal: &Value,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut b = self
            .req_on(node, reqwest::Method::POST, "/v1/proposals", who)
            .header("content-type", "application/json")
            .body(proposal.to_string());
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = b.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn finish(self) {
        drop(self.nodes);
        if let Some(db) = self.cleanup {
            db.drop_schema().await;
        }
    }
}

pub fn credit(amount: u32, key: &str) -> Value {
    json!({"tool": "credit", "version": 1, "idempotency_key": key,
           "arguments": {"customer_id": "cus_1", "amount_cents": amount, "reason": "refund"}})
}

/// The error body shape every failure answers with.
pub fn assert_error_shape(body: &Value) {
    let e = &body["error"];
    assert!(
        e["stage"].is_string() && e["code"].is_string() && e["message"].is_string(),
        "{body}"
    );
}
