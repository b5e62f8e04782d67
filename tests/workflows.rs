//! The seed workflow (`examples/workflows/credit_after_review.yaml`) end to end over the real
//! `warrant serve`: a stub chat model drafts the credit, a supervisor approves it over HTTP,
//! the credit is applied at a loopback upstream once, the customer's email reaches an SMTP
//! sink, a recipient outside the tenant's allow-list is refused before anyone is asked to
//! review it, and the run shows its cost. Then `SIGKILL`: between a review's approval and its
//! tool step, and inside the tool step — after a restart each run completes with one effect.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;
#[path = "../crates/warrant-runtime/tests/runtime/smtp.rs"]
#[allow(dead_code, reason = "the sink's envelope sender is not checked here")]
mod smtp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::{Value, json};

/// The loopback world: the credit tool (one effect per idempotency key, counted per customer)
/// and the stub chat model.
#[derive(Default)]
struct World {
    /// Idempotency key → customer, one entry per effect.
    credits: Mutex<HashMap<String, String>>,
    /// Credit requests received (retries with the same key included).
    requests: Mutex<u32>,
    /// Set when a `slow` credit arrives (the test kills the server then).
    slow_arrived: tokio::sync::Notify,
}

impl World {
    fn effects_for(&self, customer: &str) -> usize {
        self.credits
            .lock()
            .unwrap()
            .values()
            .filter(|c| *c == customer)
            .count()
    }
}

async fn start_world() -> (SocketAddr, Arc<World>) {
    use axum::routing::post;
    let world = Arc::new(World::default());
    let (w1, w2, w3) = (world.clone(), world.clone(), world.clone());
    let app = axum::Router::new()
        .route(
            "/credit",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let world = w1.clone();
                async move {
                    *world.requests.lock().unwrap() += 1;
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    let args: Value = serde_json::from_slice(&body).unwrap();
                    let customer = args["customer_id"].as_str().unwrap().to_owned();
                    world.credits.lock().unwrap().entry(key.clone()).or_insert(customer);
                    if args["reason"] == "slow" {
                        // The effect happened; the answer is late, and the server dies meanwhile.
                        world.slow_arrived.notify_one();
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                    let id: String = key.chars().filter(char::is_ascii_alphanumeric).take(20).collect();
                    axum::Json(json!({"credit_id": format!("cr_{id}"), "status": "applied"}))
                }
            }),
        )
        // What became of an operation (its idempotency key): how reconciliation learns that the
        // effect of a call whose answer was lost happened.
        .route(
            "/credit/status/{operation}",
            axum::routing::get(move |axum::extract::Path(operation): axum::extract::Path<String>| {
                let world = w3.clone();
                async move {
                    let known = world.credits.lock().unwrap().contains_key(&operation);
                    if known {
                        let id: String = operation.chars().filter(char::is_ascii_alphanumeric).take(20).collect();
                        axum::Json(json!({"status": "committed", "result": {"credit_id": format!("cr_{id}"), "status": "applied"}}))
                            .into_response()
                    } else {
                        axum::http::StatusCode::NOT_FOUND.into_response()
                    }
                }
            }),
        )
        .route(
            "/v1/chat/completions",
            post(move |body: axum::body::Bytes| {
                let _world = w2.clone();
                async move {
                    let request: Value = serde_json::from_slice(&body).unwrap();
                    let prompt = request["messages"][1]["content"].as_str().unwrap_or_default().to_owned();
                    // The prompt names the customer: `cus_<id>: <complaint>`.
                    let customer = prompt
                        .split_whitespace()
                        .find(|w| w.starts_with("cus_"))
                        .unwrap_or("cus_unknown00")
                        .trim_end_matches(':')
                        .to_owned();
                    let reason = if prompt.contains("slow") { "slow" } else { "late delivery" };
                    let arguments = json!({"customer_id": customer, "amount_cents": 1500, "reason": reason});
                    axum::Json(json!({
                        "id": "chatcmpl-1", "object": "chat.completion", "model": "stub",
                        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                            "role": "assistant", "content": null,
                            "tool_calls": [{"id": "call_1", "type": "function", "function": {
                                "name": "create_support_credit", "arguments": arguments.to_string()}}]}}],
                        "usage": {"prompt_tokens": 90, "completion_tokens": 30, "total_tokens": 120},
                    }))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, world)
}

/// The example contracts, policies and workflow, with the credit bound to the loopback tool;
/// and a config with the SMTP sink, the stub model, the tenant's allow-list and short deadlines.
fn layout(dir: &Path, world: SocketAddr, sink: SocketAddr) -> std::path::PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let contracts = dir.join("contracts");
    let policies = dir.join("policies");
    std::fs::create_dir_all(&contracts).unwrap();
    std::fs::create_dir_all(&policies).unwrap();
    let credit =
        std::fs::read_to_string(format!("{root}/examples/contracts/create_support_credit.v1.yaml")).unwrap();
    let head = credit
        .find("\nadapter:")
        .map_or(credit.as_str(), |at| &credit[..at]);
    std::fs::write(
        contracts.join("create_support_credit.v1.yaml"),
        format!(
            "{head}\nadapter: {{ kind: http, url: \"http://{world}/credit\", \
             status_url: \"http://{world}/credit/status/{{operation_id}}\" }}\n"
        ),
    )
    .unwrap();
    std::fs::copy(
        format!("{root}/examples/contracts/send_email.v1.yaml"),
        contracts.join("send_email.v1.yaml"),
    )
    .unwrap();
    for file in ["support.cedar", "email.cedar"] {
        std::fs::copy(format!("{root}/examples/policies/{file}"), policies.join(file)).unwrap();
    }
    let config = dir.join("warrant.toml");
    std::fs::write(
        &config,
        format!(
            "[network]\nallow_hosts = [\"127.0.0.1\"]\n\
             [adapters.smtp]\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\n\
             [model]\nbase_url = \"http://{world}/v1\"\nmodel = \"stub\"\ntimeout = \"5s\"\n\
             [limits]\ncall_deadline = \"5s\"\n\
             [guards.demo]\nemail_recipients = [\"*@acme.example\"]\n",
            sink.port()
        ),
    )
    .unwrap();
    config
}

fn start(dir: &Path, config: &Path) -> common::serve::Served {
    common::serve::serve(|cmd| {
        cmd.arg("--config")
            .arg(config)
            .arg("--contracts")
            .arg(dir.join("contracts"))
            .arg("--policy")
            .arg(dir.join("policies"))
            .arg("--data-dir")
            .arg(dir.join("data"));
    })
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut b = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(key);
        if let Some(body) = body {
            b = b.json(&body);
        }
        let r = b.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn run(&self, key: &str, id: &str) -> Value {
        self.send(reqwest::Method::GET, &format!("/v1/runs/{id}"), key, None)
            .await
            .1
    }

    /// Polls a run until `done` says so (or `limit` passes).
    async fn until(&self, key: &str, id: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let run = self.run(key, id).await;
            if done(&run) {
                return run;
            }
            assert!(
                started.elapsed() < limit,
                "run {id} did not get there in {limit:?}: {run:#}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the run to wait at `review`, and answers the approval ids it waits for.
    async fn waiting_at(&self, key: &str, id: &str, review: &str) -> Vec<String> {
        self.waiting_within(key, id, review, Duration::from_secs(30))
            .await
    }

    async fn waiting_within(&self, key: &str, id: &str, review: &str, limit: Duration) -> Vec<String> {
        let run = self
            .until(key, id, limit, |r| {
                r["status"] == "waiting" && r["next_step"] == review
            })
            .await;
        let steps = run["steps"].as_array().unwrap();
        let last = steps.last().unwrap();
        assert_eq!(
            (last["step"].as_str(), last["status"].as_str()),
            (Some(review), Some("waiting"))
        );
        last["output"]["approvals"]
            .as_object()
            .unwrap()
            .values()
            .map(|a| a["approval_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn input(customer: &str, email: &str, complaint: &str) -> Value {
    json!({"customer_id": customer, "email": email, "complaint": complaint})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seed_workflow_runs_end_to_end_and_survives_sigkill() {
    let (world_addr, world) = start_world().await;
    let (sink_addr, sink) = smtp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = layout(dir.path(), world_addr, sink_addr);
    let mut server = start(dir.path(), &config);
    let (admin, agent) = (server.keys["admin"].clone(), server.keys["agent"].clone());
    let mut c = Client {
        http: common::http_client(),
        url: server.url.clone(),
    };
    use reqwest::Method;

    // A supervisor (a second principal) reviews; the admin publishes the example workflow.
    let (status, made) = c
        .send(
            Method::POST,
            "/v1/keys",
            &admin,
            Some(json!({"principal": "sup-1", "grants": [], "roles": ["supervisor"], "label": "supervisor"})),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let supervisor = made["key"].as_str().unwrap().to_owned();
    let definition = std::fs::read_to_string(format!(
        "{}/examples/workflows/credit_after_review.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let r = c
        .http
        .post(format!("{}/v1/workflows", c.url))
        .bearer_auth(&admin)
        .header("content-type", "application/yaml")
        .body(definition)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    let start_run = async |c: &Client, body: Value| -> String {
        let (status, run) = c
            .send(
                Method::POST,
                "/v1/workflows/credit_after_review/1/runs",
                &agent,
                Some(body),
            )
            .await;
        assert_eq!(status, 201, "{run}");
        run["id"].as_str().unwrap().to_owned()
    };
    let approve = async |c: &Client, ids: &[String]| {
        for id in ids {
            let (status, body) = c
                .send(
                    Method::POST,
                    &format!("/v1/approvals/{id}/approve"),
                    &supervisor,
                    Some(json!({"reason": "checked"})),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
    };

    // 1. The seed scenario.
    let run = start_run(
        &c,
        input("cus_janejane01", "jane@acme.example", "parcel arrived broken"),
    )
    .await;
    let ids = c.waiting_at(&agent, &run, "review_credit").await;
    // The proposer cannot approve its own run's call.
    let (status, _) = c
        .send(
            Method::POST,
            &format!("/v1/approvals/{}/approve", ids[0]),
            &agent,
            Some(json!({})),
        )
        .await;
    assert_ne!(status, 200);
    approve(&c, &ids).await;
    let ids = c.waiting_at(&agent, &run, "review_notice").await;
    assert_eq!(world.effects_for("cus_janejane01"), 1);
    approve(&c, &ids).await;
    let done = c
        .until(&agent, &run, Duration::from_secs(30), |r| {
            r["status"] != "running" && r["status"] != "waiting"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(world.effects_for("cus_janejane01"), 1);
    {
        let messages = sink.messages.lock().unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].recipients, ["jane@acme.example"]);
        assert!(
            messages[0].data.contains("has been applied"),
            "{}",
            messages[0].data
        );
    }
    // The run's cost: the model's 120 tokens, the credit's 1, the email's cost.
    let steps = done["steps"].as_array().unwrap();
    let sum: u64 = steps.iter().map(|s| s["cost"].as_u64().unwrap()).sum();
    assert_eq!(done["cost"].as_u64(), Some(sum), "{done:#}");
    assert_eq!(steps[0]["cost"], 120);
    assert!(sum > 120);

    // 2. A recipient outside the tenant's allow-list: refused when the notice's review asks
    // for it — nobody is asked to approve an email that can never be sent, and none is sent.
    let run = start_run(
        &c,
        input("cus_mallory001", "mallory@evil.example", "where is my parcel"),
    )
    .await;
    let ids = c.waiting_at(&agent, &run, "review_credit").await;
    approve(&c, &ids).await;
    let failed = c
        .until(&agent, &run, Duration::from_secs(30), |r| r["status"] == "failed")
        .await;
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("GUARD") || error.contains("ALLOW"), "{failed:#}");
    assert_eq!(world.effects_for("cus_mallory001"), 1);
    assert_eq!(sink.messages.lock().unwrap().len(), 1);

    // 3. SIGKILL between a review's approval and its tool step: after a restart the run
    // completes, with one credit.
    let run = start_run(&c, input("cus_killedaa01", "kim@acme.example", "damaged box")).await;
    let ids = c.waiting_at(&agent, &run, "review_credit").await;
    approve(&c, &ids).await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    server = start(dir.path(), &config);
    c.url = server.url.clone();
    let ids = c.waiting_at(&agent, &run, "review_notice").await;
    approve(&c, &ids).await;
    let done = c
        .until(&agent, &run, Duration::from_secs(60), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(world.effects_for("cus_killedaa01"), 1, "{done:#}");

    // 4. SIGKILL inside the tool step: the credit's effect happened, its answer never reached
    // the dead server. After a restart the step is taken over, the call is resolved with the
    // same idempotency key, and the run completes with that one credit.
    let run = start_run(
        &c,
        input("cus_slowslow01", "sam@acme.example", "slow refund please"),
    )
    .await;
    let ids = c.waiting_at(&agent, &run, "review_credit").await;
    let arrived = world.slow_arrived.notified();
    approve(&c, &ids).await;
    tokio::time::timeout(Duration::from_secs(30), arrived)
        .await
        .unwrap();
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    server = start(dir.path(), &config);
    c.url = server.url.clone();
    let restarted = Instant::now();
    let ids = c
        .waiting_within(&agent, &run, "review_notice", Duration::from_secs(180))
        .await;
    eprintln!(
        "the killed tool step was resolved {:?} after the restart",
        restarted.elapsed()
    );
    approve(&c, &ids).await;
    let done = c
        .until(&agent, &run, Duration::from_secs(60), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(world.effects_for("cus_slowslow01"), 1, "{done:#}");
    assert_eq!(sink.messages.lock().unwrap().len(), 3);
    drop(server);
}
