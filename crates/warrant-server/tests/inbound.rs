//! Inbound webhooks end to end, on SQLite and PostgreSQL: sources of each provider kind are
//! made by a tenant admin; deliveries signed by an independent implementation (the
//! `standardwebhooks` crate; `ring`'s HMAC for Stripe and GitHub) are verified over their raw
//! bytes; tampered, truncated, wrongly keyed and stale ones answer 401 and start nothing, each
//! counted on its source; a redelivered event answers 200 and starts nothing; an event delivered
//! three times at once starts exactly one workflow run; a call source's event is one call
//! through the pipeline, on the ledger as the source key's principal.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, SqlStore};

fn lookup_contract(upstream: SocketAddr) -> String {
    format!(
        "name: lookup\nversion: 1\ndescription: Look up an order.\nowner: t\neffect: read\nscopes: [orders:read]\n\
         approval: none\ninput:\n  type: object\n  additionalProperties: false\n  required: [order_id]\n  properties:\n    \
         order_id: {{ type: string, maxLength: 20 }}\noutput:\n  type: object\n  additionalProperties: false\n  \
         properties:\n    order_id: {{ type: string, maxLength: 20 }}\n    status: {{ type: string, maxLength: 16 }}\n\
         adapter: {{ kind: http, url: \"http://{upstream}/lookup\" }}\n"
    )
}

const WORKFLOW: &str = "name: refund_review\nversion: 1\ndescription: Review a refund.\ninput:\n  type: object\n  \
    additionalProperties: false\n  required: [charge]\n  properties:\n    charge: { type: string, maxLength: 40 }\n    \
    kind: { type: string, maxLength: 40 }\nsteps:\n  - { id: done, end: { status: completed } }\n";

/// An upstream answering every lookup with the order it was asked for.
async fn upstream() -> SocketAddr {
    let app = axum::Router::new().route(
        "/lookup",
        axum::routing::post(|body: axum::body::Bytes| async move {
            let asked: Value = serde_json::from_slice(&body).unwrap_or_default();
            axum::Json(json!({"order_id": asked["order_id"], "status": "paid"}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Harness {
    gateway: Gateway,
    base: String,
    admin: String,
    http: reqwest::Client,
}

impl Harness {
    async fn start(store: Arc<dyn Store>, dir: &std::path::Path) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        std::fs::write(dir.join("lookup.yaml"), lookup_contract(upstream().await)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let gateway = Gateway::start(GatewayConfig {
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
                smtp: None,
                command_roots: Vec::new(),
                model: None,
            },
            runtime: RuntimeSettings::default(),
            settings: Settings::default(),
            limits: HttpLimits::default(),
            public_url: base.clone(),
            first_tenant: "acme".into(),
            background: false,
            contract_sync_every: warrant_server::CONTRACT_SYNC_EVERY,
            requests_in_flight: Default::default(),
            review_mail: None,
        })
        .await
        .unwrap();
        let admin = gateway.first_keys.as_ref().unwrap().admin.clone();
        let (state, limits) = (gateway.state.clone(), gateway.limits);
        tokio::spawn(async move {
            axum::serve(
                listener,
                warrant_server::router(state, limits).into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        Harness {
            gateway,
            base,
            admin,
            http: reqwest::Client::new(),
        }
    }

    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.admin);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let r = request.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn deliver(&self, source: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}/v1/inbound/{source}", self.base))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let r = request.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn act(&self) -> usize {
        warrant_server::inbound::act_on_due(&self.gateway.state, "test")
            .await
            .unwrap()
    }

    async fn source(&self, id: &str) -> Value {
        let (_, listed) = self
            .admin(reqwest::Method::GET, "/v1/inbound-sources", None)
            .await;
        listed["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap()
    }
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Standard Webhooks headers, signed by the independent implementation.
fn standard(secret: &str, id: &str, at: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let signer = standardwebhooks::Webhook::new(secret).unwrap();
    let signature = signer.sign(id, at, body).unwrap();
    vec![
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", at.to_string()),
        ("webhook-signature", signature),
    ]
}

fn hmac_hex(secret: &str, message: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    hex::encode(ring::hmac::sign(&key, message).as_ref())
}

async fn inbound_events_are_verified_deduplicated_and_started_once(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start(store, dir.path()).await;
    use reqwest::Method;

    let (status, published) = {
        let r = h
            .http
            .post(format!("{}/v1/workflows", h.base))
            .bearer_auth(&h.admin)
            .header("content-type", "application/yaml")
            .body(WORKFLOW)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(status, 201, "{published}");
    let (status, key) = h
        .admin(
            Method::POST,
            "/v1/keys",
            Some(json!({"principal": "billing-bot", "grants": ["orders:read"], "label": "billing"})),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let key_id = key["id"].as_str().unwrap().to_owned();
    let keys = h.gateway.state.store.list_api_keys("acme").await.unwrap();
    let admin_key = keys
        .iter()
        .find(|k| k.key.roles.iter().any(|r| r == "admin"))
        .unwrap()
        .key
        .id
        .clone();

    // Refused sources: an admin's key, an unknown workflow, a bad binding, a Stripe source
    // without Stripe's secret, an unknown provider.
    for bad in [
        json!({"provider": "standard_webhooks", "key_id": admin_key, "action": {"workflow": "refund_review@1"}}),
        json!({"provider": "standard_webhooks", "key_id": key_id, "action": {"workflow": "nope@1"}}),
        json!({"provider": "standard_webhooks", "key_id": key_id, "action": {"workflow": "refund_review@1", "input": {"charge": "${input.x}"}}}),
        json!({"provider": "stripe", "key_id": key_id, "action": {"workflow": "refund_review@1"}}),
        json!({"provider": "svix", "key_id": key_id, "action": {"workflow": "refund_review@1"}}),
        json!({"provider": "github", "key_id": key_id, "action": {"tool": "lookup@7", "arguments": {}}}),
    ] {
        let (status, body) = h
            .admin(Method::POST, "/v1/inbound-sources", Some(bad.clone()))
            .await;
        assert_eq!(status, 422, "{bad} → {body}");
    }

    // A Standard Webhooks source that starts the workflow; Warrant makes its secret.
    let (status, made) = h
        .admin(
            Method::POST,
            "/v1/inbound-sources",
            Some(json!({
                "provider": "standard_webhooks",
                "key_id": key_id,
                "description": "billing events",
                "action": {"workflow": "refund_review@1", "input": {"charge": "${event.data.charge}", "kind": "${delivery.type}"}},
            })),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let sw = made["id"].as_str().unwrap().to_owned();
    let secret = made["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    assert!(
        made["url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v1/inbound/{sw}"))
    );
    let (_, listed) = h.admin(Method::GET, "/v1/inbound-sources", None).await;
    assert!(!listed.to_string().contains(&secret), "the secret is shown once");

    let body = br#"{"type":"charge.refunded","data":{"charge":"ch_1"}}"#;
    let at = now();
    let (status, answer) = h.deliver(&sw, &standard(&secret, "msg_1", at, body), body).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (202, Some("queued")),
        "{answer}"
    );

    // Refused deliveries: nothing stored, each counted on the source.
    let wrong = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([7u8; 32])
    );
    let good = standard(&secret, "msg_2", at, body);
    let mut tampered_signature = good.clone();
    let sig = tampered_signature[2].1.clone();
    tampered_signature[2].1 = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode([1u8; 32])
    );
    let mut truncated = good.clone();
    truncated[2].1 = sig[..sig.len() - 6].to_owned();
    let mut missing = good.clone();
    missing.pop();
    type Headers = Vec<(&'static str, String)>;
    type Signed<'a> = Box<dyn Fn() -> Headers + 'a>;
    // A timestamp outside the tolerance is signed as it is sent, a minute past the tolerance:
    // signed at the test's start, "ahead" would drift back inside it on a slow machine.
    let skewed = |by: i64| standard(&secret, "msg_2", now() + by, body);
    let outside = warrant_core::inbound::TOLERANCE + 60;
    let cases: Vec<(&str, Signed<'_>, &[u8])> = vec![
        (
            "tampered body",
            Box::new(|| good.clone()),
            br#"{"type":"charge.refunded","data":{"charge":"ch_2"}}"#,
        ),
        (
            "tampered signature",
            Box::new(|| tampered_signature.clone()),
            body,
        ),
        ("truncated signature", Box::new(|| truncated.clone()), body),
        ("missing signature", Box::new(|| missing.clone()), body),
        (
            "wrong secret",
            Box::new(|| standard(&wrong, "msg_2", at, body)),
            body,
        ),
        ("too old", Box::new(|| skewed(-outside)), body),
        ("too far ahead", Box::new(|| skewed(outside)), body),
    ];
    let refused_cases = cases.len();
    for (case, headers, sent) in cases {
        let (status, answer) = h.deliver(&sw, &headers(), sent).await;
        assert_eq!(status, 401, "{case}: {answer}");
        assert_eq!(answer["error"]["code"], "INBOUND_SIGNATURE_INVALID", "{case}");
    }
    let source = h.source(&sw).await;
    assert_eq!(source["refusals"], refused_cases, "{source}");
    assert!(
        source["last_refusal"].as_str().unwrap().contains("s from now"),
        "{source}"
    );

    // A redelivery of msg_1 answers 200 and starts nothing.
    let (status, answer) = h
        .deliver(&sw, &standard(&secret, "msg_1", now(), body), body)
        .await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("duplicate")));
    assert_eq!(h.act().await, 1, "one event, one job");
    assert_eq!(h.act().await, 0);

    // msg_3 delivered three times at once: one 202, two 200s, one run.
    let body3 = br#"{"type":"charge.refunded","data":{"charge":"ch_3"}}"#;
    let headers3 = standard(&secret, "msg_3", now(), body3);
    let (a, b, c) = tokio::join!(
        h.deliver(&sw, &headers3, body3),
        h.deliver(&sw, &headers3, body3),
        h.deliver(&sw, &headers3, body3)
    );
    let mut statuses = [a.0, b.0, c.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 202]);
    assert_eq!(h.act().await, 1);
    let (_, runs) = h.admin(Method::GET, "/v1/runs", None).await;
    let runs = runs["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "one run per event: {runs:?}");
    assert!(runs.iter().all(|r| r["started_by"] == "billing-bot"));
    let (_, events) = h
        .admin(Method::GET, &format!("/v1/inbound-sources/{sw}/events"), None)
        .await;
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    let msg3 = events.iter().find(|e| e["event_id"] == "msg_3").unwrap();
    assert_eq!(msg3["status"], "started");
    assert_eq!(msg3["deliveries"], 3);
    let run_id = msg3["detail"]["run_id"].as_str().unwrap();
    let run = h
        .gateway
        .state
        .store
        .get_run("acme", run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.input, json!({"charge": "ch_3", "kind": "charge.refunded"}));
    let (_, one) = h
        .admin(
            Method::GET,
            &format!("/v1/inbound-sources/{sw}/events/msg_1"),
            None,
        )
        .await;
    assert_eq!(
        (one["deliveries"].as_u64(), &one["body"]["data"]["charge"]),
        (Some(2), &json!("ch_1"))
    );

    // A Stripe source that makes a call: Stripe's secret, its `t=…,v1=…` header, the body's id.
    let stripe_secret = "whsec_stripe_test_0123456789abcdef";
    let (status, made) = h
        .admin(
            Method::POST,
            "/v1/inbound-sources",
            Some(json!({
                "provider": "stripe",
                "key_id": key_id,
                "secret": stripe_secret,
                "action": {"tool": "lookup@1", "arguments": {"order_id": "${event.data.object.order}"}},
            })),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert!(made.get("secret").is_none(), "a given secret is never answered");
    assert!(
        made["action"]["contract"]
            .as_str()
            .unwrap()
            .starts_with("tool-contract@sha256:"),
        "pinned"
    );
    let stripe = made["id"].as_str().unwrap().to_owned();
    let body = br#"{"id":"evt_9","type":"checkout.completed","data":{"object":{"order":"ord_77"}}}"#;
    let t = now();
    let signed = format!("{t}.{}", std::str::from_utf8(body).unwrap());
    let header = format!("t={t},v1={}", hmac_hex(stripe_secret, signed.as_bytes()));
    let (status, answer) = h
        .deliver(&stripe, &[("stripe-signature", header.clone())], body)
        .await;
    assert_eq!(
        (status, answer["event_id"].as_str()),
        (202, Some("evt_9")),
        "{answer}"
    );
    let stale = format!(
        "t={},v1={}",
        t - 301,
        hmac_hex(
            stripe_secret,
            format!("{}.{}", t - 301, std::str::from_utf8(body).unwrap()).as_bytes()
        )
    );
    assert_eq!(
        h.deliver(&stripe, &[("stripe-signature", stale)], body).await.0,
        401
    );
    assert_eq!(h.act().await, 1);
    let (_, events) = h
        .admin(Method::GET, &format!("/v1/inbound-sources/{stripe}/events"), None)
        .await;
    let detail = &events["events"][0]["detail"];
    assert_eq!(events["events"][0]["status"], "done", "{events}");
    assert_eq!(detail["outcome"], "committed", "{detail}");
    let ledger_id = detail["ledger_id"].as_str().unwrap();
    let row = h
        .gateway
        .state
        .store
        .get_ledger("acme", ledger_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.principal, "billing-bot");
    assert_eq!(row.tool, "lookup");

    // A GitHub source: `X-Hub-Signature-256` over the body, `X-GitHub-Delivery` as the id.
    let (status, made) = h
        .admin(
            Method::POST,
            "/v1/inbound-sources",
            Some(json!({"provider": "github", "key_id": key_id, "action": {"workflow": "refund_review@1", "input": {"charge": "${event.ref}", "kind": "${delivery.type}"}}})),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let gh = made["id"].as_str().unwrap().to_owned();
    let gh_secret = made["secret"].as_str().unwrap().to_owned();
    let body = br#"{"ref":"refs/heads/main"}"#;
    let headers = [
        (
            "x-hub-signature-256",
            format!("sha256={}", hmac_hex(&gh_secret, body)),
        ),
        ("x-github-delivery", "72d3162e-cc78".to_owned()),
        ("x-github-event", "push".to_owned()),
    ];
    assert_eq!(h.deliver(&gh, &headers, body).await.0, 202);
    assert_eq!(
        h.deliver(&gh, &headers, br#"{"ref":"refs/heads/evil"}"#).await.0,
        401
    );
    assert_eq!(h.act().await, 1);
    let (_, one) = h
        .admin(
            Method::GET,
            &format!("/v1/inbound-sources/{gh}/events/72d3162e-cc78"),
            None,
        )
        .await;
    let run = h
        .gateway
        .state
        .store
        .get_run("acme", one["detail"]["run_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.input, json!({"charge": "refs/heads/main", "kind": "push"}));

    // Rotation: the new secret verifies at once, the previous one still does for a while.
    let (status, rotated) = h
        .admin(Method::POST, &format!("/v1/inbound-sources/{sw}/rotate"), None)
        .await;
    assert_eq!(status, 200);
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    let body = br#"{"type":"x","data":{"charge":"ch_4"}}"#;
    assert_eq!(
        h.deliver(&sw, &standard(&new_secret, "msg_4", now(), body), body)
            .await
            .0,
        202
    );
    assert_eq!(
        h.deliver(&sw, &standard(&secret, "msg_5", now(), body), body)
            .await
            .0,
        202
    );

    // A disabled source and an unknown one answer 404; a revoked key stops the source's work.
    h.admin(Method::POST, &format!("/v1/inbound-sources/{sw}/disable"), None)
        .await;
    assert_eq!(
        h.deliver(&sw, &standard(&new_secret, "msg_6", now(), body), body)
            .await
            .0,
        404
    );
    assert_eq!(
        h.deliver("ins_nope", &standard(&new_secret, "msg_6", now(), body), body)
            .await
            .0,
        404
    );
    let (status, _) = h.admin(Method::DELETE, &format!("/v1/keys/{key_id}"), None).await;
    assert_eq!(status, 204);
    assert_eq!(h.act().await, 2);
    let (_, one) = h
        .admin(
            Method::GET,
            &format!("/v1/inbound-sources/{sw}/events/msg_4"),
            None,
        )
        .await;
    assert_eq!(one["status"], "failed");
    assert!(
        one["detail"]["error"].as_str().unwrap().contains("revoked"),
        "{one}"
    );
}

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
    inbound_events_are_verified_deduplicated_and_started_once,
}
