//! Two `warrant serve` processes on one PostgreSQL database behave as one: the same approved
//! call raced through both commits one effect and consumes the approval once, and both replay
//! the one result afterwards; a contract registered or retired through one is honoured by the
//! other within a few seconds, without a restart.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CONTRACT: &str = r#"
name: credit
version: 1
description: Issue a credit.
owner: test
effect: write
scopes: [credits:write]
approval: per_call
idempotency: { honoured: false, retention: 24h }
retry: { max_attempts: 1 }
input:
  type: object
  additionalProperties: false
  required: [customer_id, amount_cents]
  properties:
    customer_id: { type: string, maxLength: 36 }
    amount_cents: { type: integer, minimum: 1, maximum: 500000 }
output:
  type: object
  additionalProperties: false
  required: [credit_id, status]
  properties:
    credit_id: { type: string, maxLength: 64 }
    status: { enum: [applied, pending] }
"#;

const POLICY: &str = r#"
permit (principal in Warrant::Role::"agent", action in Warrant::Action::"credit", resource);
permit (principal in Warrant::Role::"supervisor", action in Warrant::Action::"review:credit", resource);
"#;

fn start(dir: &std::path::Path, db: &warrant_store::testing::TestDatabase) -> common::serve::Served {
    common::serve::serve(|cmd| {
        cmd.args(["--database", db.url(), "--database-schema", db.schema()])
            .arg("--contracts")
            .arg(dir.join("contracts"))
            .arg("--policy")
            .arg(dir.join("policies"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("WARRANT_ALLOW_HOSTS", "127.0.0.1")
            .env("WARRANT_REDACTION_KEY", "ab".repeat(32));
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_serve_processes_on_one_postgres_behave_as_one() {
    let Some(db) = warrant_store::testing::TestDatabase::postgres().await.unwrap() else {
        return;
    };
    // The tool: counts every effect (it does not deduplicate).
    let effects = Arc::new(Mutex::new(0u32));
    let counter = effects.clone();
    let app = axum::Router::new().route(
        "/credit",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                *counter.lock().unwrap() += 1;
                axum::Json(json!({"credit_id": "cr_1", "status": "applied"}))
            }
        }),
    );
    let upstream = serve_upstream(app).await;
    let dir = layout(
        "credit.yaml",
        &format!("{CONTRACT}adapter: {{ kind: http, url: \"http://{upstream}/credit\" }}\n"),
        POLICY,
    );

    let a = start(dir.path(), &db);
    let b = start(dir.path(), &db);
    let (agent, admin) = (a.keys["agent"].clone(), a.keys["admin"].clone());
    assert!(
        b.keys.is_empty(),
        "the second node found the keys and created none"
    );

    let http = common::http_client();
    let credit = json!({"tool": "credit", "version": 1, "idempotency_key": "race-1",
                        "arguments": {"customer_id": "cus_1", "amount_cents": 700}});
    let propose = |node: &common::serve::Served, approval: Option<&str>| {
        propose(&http, node, &agent, &credit, approval)
    };
    // Held on node A, approved on node B.
    let (status, held) = propose(&a, None).await;
    assert_eq!(status, 202, "{held}");
    let approval = held["approval"]["id"].as_str().unwrap().to_owned();
    let r = http
        .post(format!("{}/v1/approvals/{approval}/approve", b.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // Raced through both nodes: one commit, one effect.
    let mut tasks = Vec::new();
    for i in 0..12 {
        let node = if i % 2 == 0 { &a } else { &b };
        tasks.push(tokio::spawn(propose(node, Some(&approval))));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let committed = answers
        .iter()
        .filter(|(s, v)| *s == 200 && v["outcome"] == "committed")
        .count();
    assert_eq!(committed, 1, "{answers:?}");
    assert!(answers.iter().all(|(s, _)| *s < 500), "{answers:?}");
    assert_eq!(*effects.lock().unwrap(), 1);

    // Both nodes replay the one result.
    for node in [&a, &b] {
        let (status, body) = propose(node, Some(&approval)).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("replayed")),
            "{body}"
        );
    }
    assert_eq!(*effects.lock().unwrap(), 1);
    drop((a, b));
    db.drop_schema().await;
}

const LOOKUP: &str = r#"
name: NAME
version: VERSION
description: Look up a customer.
owner: test
effect: read
scopes: [customers:read]
approval: none
retry: { max_attempts: 1 }
input:
  type: object
  additionalProperties: false
  required: [customer_id]
  properties:
    customer_id: { type: string, maxLength: 36 }
output:
  type: object
  additionalProperties: false
  required: [name]
  properties:
    name: { type: string, maxLength: 64 }
adapter: { kind: http, url: "UPSTREAM" }
"#;

fn lookup(name: &str, version: u32, upstream: std::net::SocketAddr) -> String {
    LOOKUP
        .replace("NAME", name)
        .replace("VERSION", &version.to_string())
        .replace("UPSTREAM", &format!("http://{upstream}/lookup"))
}

/// Serves `app` on a free loopback port; answers its address.
async fn serve_upstream(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    upstream
}

/// A directory with one contract file (`contracts/<file>`) and one policy file.
fn layout(file: &str, contract: &str, policy: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("contracts")).unwrap();
    std::fs::create_dir_all(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("contracts").join(file), contract).unwrap();
    std::fs::write(dir.path().join("policies/p.cedar"), policy).unwrap();
    dir
}

/// `POST /v1/proposals` of `call` to `node` as `key` (with an approval id, if any); the
/// request is built now, so the answer can be awaited in another task.
fn propose(
    http: &reqwest::Client,
    node: &common::serve::Served,
    key: &str,
    call: &Value,
    approval: Option<&str>,
) -> impl Future<Output = (u16, Value)> + use<> {
    let mut req = http
        .post(format!("{}/v1/proposals", node.url))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(call.to_string());
    if let Some(id) = approval {
        req = req.header("warrant-approval", id);
    }
    async move {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    }
}

/// Asks `node` until `accept` holds for its answer to a call of `tool@version`, for at most
/// `limit`; returns the last answer and how long it took.
async fn until(
    http: &reqwest::Client,
    node: &common::serve::Served,
    key: &str,
    (tool, version): (&str, u32),
    limit: Duration,
    accept: impl Fn(u16, &Value) -> bool,
) -> (u16, Value, Duration) {
    let start = Instant::now();
    let call = json!({"tool": tool, "version": version, "arguments": {"customer_id": "cus_1"}});
    loop {
        let (status, body) = propose(http, node, key, &call, None).await;
        if accept(status, &body) || start.elapsed() > limit {
            return (status, body, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contracts_registered_or_retired_on_one_node_reach_the_other() {
    let Some(db) = warrant_store::testing::TestDatabase::postgres().await.unwrap() else {
        return;
    };
    let app = axum::Router::new().route(
        "/lookup",
        axum::routing::post(|| async { axum::Json(json!({"name": "Ada"})) }),
    );
    let upstream = serve_upstream(app).await;
    // Every tool, so the policies validate against contracts registered later.
    let dir = layout(
        "lookup.yaml",
        &lookup("lookup", 1, upstream),
        r#"permit (principal in Warrant::Role::"agent", action in Warrant::Action::"invoke", resource);"#,
    );
    let a = start(dir.path(), &db);
    let b = start(dir.path(), &db);
    // Bound platform contracts are the operator's to register and retire.
    let (agent, admin) = (a.keys["agent"].clone(), a.keys["operator"].clone());
    let http = common::http_client();
    let allowed = |status: u16, body: &Value| status == 200 && body["outcome"] == "committed";
    let retired = |status: u16, body: &Value| status == 404 && body["error"]["code"] == "CONTRACT_RETIRED";
    let now = Duration::ZERO;
    let soon = Duration::from_secs(10);

    let (status, body, _) = until(&http, &b, &agent, ("lookup", 1), now, allowed).await;
    assert!(allowed(status, &body), "{status} {body}");

    // A new version and a new contract, registered on node A.
    let mut ids = Vec::new();
    for (name, version) in [("lookup", 2), ("profile", 1)] {
        let r = http
            .post(format!("{}/v1/contracts", a.url))
            .bearer_auth(&admin)
            .header("content-type", "application/yaml")
            .body(lookup(name, version, upstream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        ids.push(
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        let (status, body, _) = until(&http, &a, &agent, (name, version), now, allowed).await;
        assert!(
            allowed(status, &body),
            "node A, {name}@{version}: {status} {body}"
        );
    }
    // Node B takes them up without a restart.
    for tool in [("lookup", 2), ("profile", 1)] {
        let (status, body, took) = until(&http, &b, &agent, tool, soon, allowed).await;
        assert!(
            allowed(status, &body),
            "node B, {tool:?} after {took:?}: {status} {body}"
        );
    }

    // Retired on node A: refused there at once, and on node B well before its registry's
    // cache would have expired (30 s).
    let r = http
        .post(format!("{}/v1/contracts/{}/retire", a.url, ids[0]))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (status, body, _) = until(&http, &a, &agent, ("lookup", 2), now, retired).await;
    assert!(retired(status, &body), "node A: {status} {body}");
    let (status, body, took) = until(&http, &b, &agent, ("lookup", 2), soon, retired).await;
    assert!(retired(status, &body), "node B after {took:?}: {status} {body}");
    // The others stay callable on both.
    for node in [&a, &b] {
        for tool in [("lookup", 1), ("profile", 1)] {
            let (status, body, _) = until(&http, node, &agent, tool, now, allowed).await;
            assert!(allowed(status, &body), "{tool:?}: {status} {body}");
        }
    }
    drop((a, b));
    db.drop_schema().await;
}
