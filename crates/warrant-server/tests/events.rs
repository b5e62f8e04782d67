//! The event outbox end to end, on SQLite and PostgreSQL: a call held for review commits its
//! `approval.requested` event with the approval request; the event worker emails the tenant's
//! reviewers through the operator's relay (a real SMTP receiver on loopback) and fans the event
//! out to the tenant's webhook endpoints, delivered, retried and dead-lettered by the webhook
//! worker.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

#[path = "../../warrant-runtime/tests/runtime/smtp.rs"]
mod smtp;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use serde_json::{Value, json};
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::records::{EVENT_JOB, NewApiKey};
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::{AdapterConfig, RelaySecurity, SmtpRelay};
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{Dispatched, OwnedCall, RuntimeSettings, Secrets};
use warrant_server::events::{ReviewMail, deliver_due};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, SqlStore};

const CREDIT: &str = "name: credit\nversion: 1\ndescription: Credit.\nowner: t\neffect: write\n\
scopes: [credits:write]\napproval: per_call\nidempotency: { honoured: true, retention: 1h }\n\
input:\n  type: object\n  additionalProperties: false\n  required: [customer_id]\n  properties:\n    \
customer_id: { type: string, maxLength: 36 }\noutput:\n  type: object\n  additionalProperties: false\n  \
properties: {}\nadapter: { kind: http, url: \"http://127.0.0.1:9/credit\" }\n";

/// A gateway over `store` reached at `public_url`, with the credit contract in `dir`; with a
/// relay on loopback `relay_port`, acme's reviewers are mailed through it.
async fn gateway(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    public_url: &str,
    relay_port: Option<u16>,
) -> Gateway {
    std::fs::write(dir.join("credit.yaml"), CREDIT).unwrap();
    Gateway::start(GatewayConfig {
        store,
        contracts_dir: Some(dir.to_owned()),
        policies: vec![PolicySource::new(
            "all.cedar",
            "permit (principal, action, resource);",
        )],
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: RedactionKey::new(vec![3; 32]).unwrap(),
        adapters: AdapterConfig {
            client: SafeClient::new(NetPolicy {
                allow_hosts: vec!["127.0.0.1".into()],
                ..NetPolicy::default()
            }),
            secrets: Secrets::default(),
            smtp: relay_port.map(|port| SmtpRelay {
                host: "127.0.0.1".into(),
                port,
                security: RelaySecurity::Plain,
                login: None,
            }),
            command_roots: Vec::new(),
            model: None,
        },
        runtime: RuntimeSettings::default(),
        settings: Settings::default(),
        limits: HttpLimits::default(),
        public_url: public_url.into(),
        first_tenant: "acme".into(),
        background: false,
        contract_sync_every: warrant_server::CONTRACT_SYNC_EVERY,
        requests_in_flight: Default::default(),
        review_mail: relay_port.map(|_| ReviewMail {
            from: "warrant@example.com".into(),
            reviewers: BTreeMap::from([("acme".to_owned(), vec!["sup@acme.example".to_owned()])]),
        }),
    })
    .await
    .unwrap()
}

/// Holds a credit for review as `principal` of `tenant`; answers the approval id.
async fn held(gateway: &Gateway, tenant: &str, customer: &str) -> String {
    let state = &gateway.state;
    let principal =
        warrant_core::authority::Principal::new("agent-7", tenant, vec!["credits:write".into()]).unwrap();
    let call = OwnedCall {
        bytes: json!({"tool": "credit", "version": 1, "arguments": {"customer_id": customer}})
            .to_string()
            .into_bytes()
            .into(),
        idempotency_key: Some(format!("k-{customer}")),
        trace_id: "t".repeat(32),
        ..OwnedCall::default()
    };
    match warrant_runtime::submit(state.authority.clone(), state.runtime.clone(), principal, call)
        .await
        .unwrap()
    {
        Dispatched::NeedsApproval { needed, .. } => needed.request_id.unwrap(),
        other => panic!("not held: {other:?}"),
    }
}

async fn reviewers_are_emailed_once_per_request(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let (relay, sink) = smtp::start().await;
    let g = gateway(
        store.clone(),
        dir.path(),
        "https://warrant.example",
        Some(relay.port()),
    )
    .await;
    store
        .create_api_key(&NewApiKey {
            id: "key_g".into(),
            key_hash: "h_globex".into(),
            tenant: "globex".into(),
            principal: "agent-7".into(),
            grants: vec!["credits:write".into()],
            roles: Vec::new(),
            label: None,
            created_at: time::OffsetDateTime::now_utc(),
        })
        .await
        .unwrap();

    let approval = held(&g, "acme", "cus_1").await;
    // The same call again is the same request: one event.
    assert_eq!(held(&g, "acme", "cus_1").await, approval);
    held(&g, "globex", "cus_2").await;
    assert_eq!(deliver_due(&g.state, "w1").await.unwrap(), 2);
    let messages = sink.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let m = &messages[0];
    assert_eq!(m.recipients, ["sup@acme.example"]);
    assert_eq!(m.from, "warrant@example.com");
    assert!(
        m.data
            .contains(&format!("https://warrant.example/console/approvals/{approval}")),
        "{}",
        m.data
    );
    assert!(
        m.data.contains("Approval requested: credit by agent-7"),
        "{}",
        m.data
    );
    assert!(
        !m.data.contains("cus_1"),
        "the arguments stay in the console: {}",
        m.data
    );
    // Delivered: nothing left to claim.
    assert_eq!(deliver_due(&g.state, "w1").await.unwrap(), 0);
    assert_eq!(sink.messages.lock().unwrap().len(), 1);

    // The relay is down: the event stays, due later (retried with backoff), and is not lost.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir2 = tempfile::tempdir().unwrap();
    let down = gateway(
        store.clone(),
        dir2.path(),
        "https://warrant.example",
        Some(closed),
    )
    .await;
    let later = held(&down, "acme", "cus_3").await;
    assert_eq!(deliver_due(&down.state, "w2").await.unwrap(), 1);
    assert_eq!(
        deliver_due(&down.state, "w2").await.unwrap(),
        0,
        "retried later, not at once"
    );
    let soon = time::OffsetDateTime::now_utc() + time::Duration::minutes(5);
    let again = store
        .claim_jobs("w3", EVENT_JOB, 10, std::time::Duration::from_secs(60), soon)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job.payload["approval_id"], later.as_str());
    assert!(again[0].last_error.is_some());
}

/// One request the receiver saw: its headers and body.
type Seen = (HeaderMap, Vec<u8>);

/// What the receiver saw, per path, and how each path answers its n-th request.
#[derive(Default)]
struct Receiver {
    seen: Mutex<HashMap<String, Vec<Seen>>>,
}

impl Receiver {
    fn seen(&self, path: &str) -> Vec<Seen> {
        self.seen.lock().unwrap().get(path).cloned().unwrap_or_default()
    }
}

async fn start_receiver() -> (SocketAddr, Arc<Receiver>) {
    let receiver = Arc::new(Receiver::default());
    let r = receiver.clone();
    let app = axum::Router::new().route(
        "/{path}",
        axum::routing::post(
            move |axum::extract::Path(path): axum::extract::Path<String>,
                  headers: HeaderMap,
                  body: axum::body::Bytes| {
                let r = r.clone();
                async move {
                    let n = {
                        let mut seen = r.seen.lock().unwrap();
                        let list = seen.entry(path.clone()).or_default();
                        list.push((headers, body.to_vec()));
                        list.len()
                    };
                    let retry_after = [("retry-after", "1")];
                    match (path.as_str(), n) {
                        ("flaky", 1) => (StatusCode::INTERNAL_SERVER_ERROR, [("retry-after", "0")], "boom"),
                        ("flaky", 2) => (StatusCode::TOO_MANY_REQUESTS, retry_after, "slow down"),
                        ("slow", 1) => {
                            // Answers long after the attempt's timeout: the attempt fails, and is retried.
                            tokio::time::sleep(TIMEOUT * 4).await;
                            (StatusCode::OK, [("retry-after", "0")], "too late")
                        }
                        ("gone", _) => (StatusCode::GONE, [("retry-after", "0")], "gone"),
                        ("down", n) if n <= 8 => (StatusCode::BAD_GATEWAY, [("retry-after", "0")], "down"),
                        _ => (StatusCode::OK, [("retry-after", "0")], "ok"),
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, receiver)
}

/// Outbound webhooks end to end: endpoints made over the API (the secret shown once), an
/// event fanned out to each subscribed endpoint, delivered to a flaky loopback receiver on a
/// compressed schedule — a 500, a 429 with `Retry-After`, then a 2xx, all under one
/// `webhook-id`; a `410 Gone` disables its endpoint; an endpoint that keeps failing is
/// dead-lettered after its attempts and a replay delivers it once — every request verified with
/// the independent `standardwebhooks` implementation.
async fn webhooks_are_delivered_retried_and_dead_lettered(store: Arc<dyn Store>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (receiver_addr, receiver) = start_receiver().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let gateway = gateway(store.clone(), dir.path(), &base, None).await;
    let admin = gateway.first_keys.as_ref().unwrap().admin.clone();
    let state = gateway.state.clone();
    let limits = gateway.limits;
    tokio::spawn(async move {
        axum::serve(listener, warrant_server::router(state, limits))
            .await
            .unwrap();
    });
    let http = reqwest::Client::new();
    let get = |path: &'static str| {
        let request = http.get(format!("{base}{path}")).bearer_auth(&admin);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let mut secrets = HashMap::new();
    for path in ["ok", "flaky", "slow", "gone", "down"] {
        let r = http
            .post(format!("{base}/v1/webhooks"))
            .bearer_auth(&admin)
            .json(&json!({"url": format!("http://{receiver_addr}/{path}"), "events": ["approval.requested"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let body: Value = r.json().await.unwrap();
        let secret = body["secret"].as_str().unwrap().to_owned();
        assert!(secret.starts_with("whsec_"));
        secrets.insert(path, secret);
    }
    // An Ed25519 endpoint (`v1a`): no secret to show, a public key to verify with.
    let r = http
        .post(format!("{base}/v1/webhooks"))
        .bearer_auth(&admin)
        .json(&json!({"url": format!("http://{receiver_addr}/ed"), "events": ["approval.requested"], "signature": "ed25519"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let made: Value = r.json().await.unwrap();
    assert!(made.get("secret").is_none(), "{made}");
    assert_eq!(made["signature"], "ed25519");
    let public_key = made["public_key"].as_str().unwrap().to_owned();
    assert!(public_key.starts_with("whpk_"), "{made}");
    // Not subscribed: never called.
    let r = http
        .post(format!("{base}/v1/webhooks"))
        .bearer_auth(&admin)
        .json(&json!({"url": format!("http://{receiver_addr}/other"), "events": ["run.completed"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    // A private address the operator did not allow is refused; so is an unknown event type.
    for bad in [
        json!({"url": "http://10.0.0.8/hook"}),
        json!({"url": format!("http://{receiver_addr}/x"), "events": ["nope"]}),
    ] {
        let r = http
            .post(format!("{base}/v1/webhooks"))
            .bearer_auth(&admin)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 422, "{bad}");
    }
    let listed: Value = get("/v1/webhooks").await;
    assert_eq!(listed["endpoints"].as_array().unwrap().len(), 7);
    assert!(!listed.to_string().contains("whsec_"), "secrets are shown once");

    // A call held for review: its approval.requested event.
    let state = gateway.state.clone();
    let approval = held(&gateway, "acme", "cus_1").await;

    // Compressed schedule: every retry due at once (a Retry-After still waits).
    let schedule = [Duration::ZERO; 7];
    assert_eq!(warrant_server::events::deliver_due(&state, "e").await.unwrap(), 1);
    for _ in 0..40 {
        warrant_server::webhooks::deliver_due(&state, "w", &schedule, TIMEOUT)
            .await
            .unwrap();
        if receiver.seen("flaky").len() >= 3
            && receiver.seen("slow").len() >= 2
            && receiver.seen("down").len() >= 8
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(receiver.seen("ok").len(), 1);
    assert_eq!(receiver.seen("flaky").len(), 3, "500, 429, then 200");
    assert_eq!(receiver.seen("slow").len(), 2, "a timeout, then 200");
    assert_eq!(receiver.seen("gone").len(), 1);
    assert_eq!(receiver.seen("down").len(), 8, "every attempt, then dead");
    assert!(receiver.seen("other").is_empty());

    // Every request verifies with the independent implementation, under one event id.
    let mut ids = std::collections::BTreeSet::new();
    for path in ["ok", "flaky", "slow", "gone", "down"] {
        let reference = standardwebhooks::Webhook::new(&secrets[path]).unwrap();
        for (headers, body) in receiver.seen(path) {
            let mut h = http::HeaderMap::new();
            for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
                h.insert(name, headers[name].to_str().unwrap().parse().unwrap());
            }
            reference.verify(&body, &h).unwrap();
            ids.insert(headers["webhook-id"].to_str().unwrap().to_owned());
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                (&body["type"], &body["version"]),
                (&json!("approval.requested"), &json!(1))
            );
            assert_eq!(body["data"]["approval_id"], approval.as_str());
            assert!(body["data"]["review_url"].as_str().unwrap().ends_with(&approval));
            assert!(!body.to_string().contains("cus_1"), "never the arguments");
        }
    }
    // The Ed25519 endpoint's request verifies with its public key alone (ring's verifier).
    let ed = receiver.seen("ed");
    assert_eq!(ed.len(), 1);
    let (headers, body) = &ed[0];
    let key = base64::engine::general_purpose::STANDARD
        .decode(public_key.strip_prefix("whpk_").unwrap())
        .unwrap();
    let signature = headers["webhook-signature"].to_str().unwrap();
    let signature = base64::engine::general_purpose::STANDARD
        .decode(signature.strip_prefix("v1a,").unwrap())
        .unwrap();
    let mut signed = format!(
        "{}.{}.",
        headers["webhook-id"].to_str().unwrap(),
        headers["webhook-timestamp"].to_str().unwrap()
    )
    .into_bytes();
    signed.extend_from_slice(body);
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(&signed, &signature)
        .unwrap();
    ids.insert(headers["webhook-id"].to_str().unwrap().to_owned());
    assert_eq!(ids.len(), 1, "one event, one id: {ids:?}");

    // 410 disabled its endpoint; the dead-letter queue holds the message that kept failing.
    let listed: Value = get("/v1/webhooks").await;
    // The slow endpoint's first attempt timed out (no status, an error), its second answered.
    let slow = listed["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["url"].as_str().unwrap().ends_with("/slow"))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let attempts: Value = http
        .get(format!("{base}/v1/webhooks/{slow}/deliveries"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let attempts = attempts["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(
        (&attempts[1]["status"], attempts[1]["error"].is_string()),
        (&Value::Null, true)
    );
    assert_eq!(attempts[0]["status"], 200);
    let gone = listed["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["url"].as_str().unwrap().ends_with("/gone"))
        .unwrap()
        .clone();
    assert_eq!(gone["enabled"], false);
    let dead: Value = get("/v1/webhooks/dead").await;
    let messages = dead["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{dead:#}");
    let down = messages
        .iter()
        .find(|m| m["attempts"].as_array().unwrap().len() == 8)
        .unwrap();
    assert_eq!(down["attempts"][0]["status"], 502);
    let id = down["message_id"].as_str().unwrap();

    // Replayed: delivered once more, with the same event id.
    let r = http
        .post(format!("{base}/v1/webhooks/dead/{id}/replay"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    warrant_server::webhooks::deliver_due(&state, "w", &schedule, TIMEOUT)
        .await
        .unwrap();
    let seen = receiver.seen("down");
    assert_eq!(seen.len(), 9);
    assert_eq!(seen[8].0["webhook-id"], seen[0].0["webhook-id"]);
    let dead: Value = get("/v1/webhooks/dead").await;
    assert_eq!(
        dead["messages"].as_array().unwrap().len(),
        1,
        "only the gone endpoint's"
    );
    let r = http
        .post(format!("{base}/v1/webhooks/dead/{id}/replay"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404, "delivered: nothing to replay");
}

/// A delivery attempt's timeout, compressed.
const TIMEOUT: Duration = Duration::from_millis(300);

/// Runs `$case` on SQLite and, when it answers, PostgreSQL.
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = crate::SqlStore::open(&crate::DatabaseUrl::data_dir(dir.path()), &Default::default())
                        .await
                        .unwrap();
                    crate::$case(std::sync::Arc::new(store)).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(db) = crate::TestDatabase::postgres().await.unwrap() else { return };
                    crate::$case(std::sync::Arc::new(db.open().await.unwrap())).await;
                    db.drop_schema().await;
                }
            )*
        }
    };
}

on_every_backend! {
    reviewers_are_emailed_once_per_request,
    webhooks_are_delivered_retried_and_dead_lettered,
}
