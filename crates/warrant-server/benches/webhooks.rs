//! Webhooks in both directions on SQLite (`synchronous=FULL`), beside their floor, in one
//! process and one run:
//!
//! - **bare verify**: `warrant_core::inbound::verify` of a Standard Webhooks signature over a
//!   ~300-byte event, in a loop (HMAC-SHA256, no I/O): the floor of inbound work;
//! - **inbound accepted**: `inbound::receive` — the route's whole work without the HTTP framing:
//!   the source read, the signature verified over the raw bytes, the body parsed strictly, the
//!   event and its job committed in one transaction — with `WARRANT_BENCH_PARALLEL` deliveries in
//!   flight;
//! - **outbound delivered**: messages (`webhook.deliver` jobs) delivered by the webhook worker
//!   (`webhooks::deliver_due`: claim 16 under a lease, sign, `POST` through the outbound guard
//!   to a loopback receiver answering `200`, record the attempt, complete the job).
//!
//! Reported: events/s and this process's CPU per event (the loopback receiver runs here too).
//!
//! Run: `cargo bench -p warrant-server --bench webhooks` (`WARRANT_BENCH_EVENTS`, default
//! 2000; `WARRANT_BENCH_PARALLEL`, default 16).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "benchmark"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use serde_json::{Value, json};
use warrant_core::guard::Guards;
use warrant_core::inbound::{InboundSecret, Provider};
use warrant_core::pipeline::Settings;
use warrant_core::records::{NewJob, WEBHOOK_JOB};
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

const CONTRACT: &str = "name: lookup\nversion: 1\ndescription: Look up an order.\nowner: bench\neffect: read\n\
    scopes: [orders:read]\napproval: none\ninput:\n  type: object\n  additionalProperties: false\n  required: [order_id]\n  \
    properties:\n    order_id: { type: string, maxLength: 20 }\noutput:\n  type: object\n  additionalProperties: false\n  \
    properties:\n    status: { type: string, maxLength: 16 }\nadapter: { kind: http, url: \"http://127.0.0.1:9/lookup\" }\n";

fn event(i: usize) -> Vec<u8> {
    json!({
        "type": "invoice.paid",
        "id": format!("evt_{i}"),
        "data": {"object": {"id": format!("in_{i:08}"), "customer": "cus_8f3k2m9q", "amount_paid": 2500,
            "currency": "eur", "lines": [{"description": "Pro plan", "amount": 2500}]}},
        "created": 1_764_000_000,
    })
    .to_string()
    .into_bytes()
}

fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn receiver() -> SocketAddr {
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn report(label: &str, n: usize, elapsed: Duration, spent: Duration, floor: f64) {
    let per_second = n as f64 / elapsed.as_secs_f64();
    let cpu_each = spent.as_secs_f64() * 1e6 / n as f64;
    println!(
        "{label:<22} {per_second:>10.0} /s   {cpu_each:>8.1} µs CPU each   {:>6.1}× the bare verify's CPU",
        cpu_each / floor
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n = env("WARRANT_BENCH_EVENTS", 2000);
    let width = env("WARRANT_BENCH_PARALLEL", 16);

    // The floor: verifying a signature, nothing else.
    let secret_text = format!(
        "whsec_{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 32])
    );
    let secret = InboundSecret::parse(Provider::StandardWebhooks, &secret_text).unwrap();
    let body = event(0);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let signature = warrant_core::inbound::sign(Provider::StandardWebhooks, &secret, "msg_0", now, &body);
    let timestamp = now.to_string();
    let header = |name: &str| match name {
        "webhook-id" => Some("msg_0"),
        "webhook-timestamp" => Some(timestamp.as_str()),
        "webhook-signature" => Some(signature.as_str()),
        _ => None,
    };
    let loops = n * 50;
    let (t, c) = (Instant::now(), cpu());
    for _ in 0..loops {
        let verified =
            warrant_core::inbound::verify(Provider::StandardWebhooks, &[&secret], &header, &body, now);
        assert!(std::hint::black_box(verified).is_ok());
    }
    let (elapsed, spent) = (t.elapsed(), cpu().saturating_sub(c));
    let floor = spent.as_secs_f64() * 1e6 / loops as f64;
    println!("webhooks, {n} events, {width} in flight, SQLite; CPU of this process");
    report("bare verify", loops, elapsed, spent, floor);

    // A gateway on SQLite, served on loopback (the API makes the source and the endpoint).
    let dir = tempfile::tempdir().unwrap();
    let contracts = dir.path().join("contracts");
    std::fs::create_dir_all(&contracts).unwrap();
    std::fs::write(contracts.join("lookup.yaml"), CONTRACT).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqlStore::open(
            &DatabaseUrl::data_dir(dir.path().join("store")),
            &StoreOptions::default(),
        )
        .await
        .unwrap(),
    );
    let gateway = Gateway::start(GatewayConfig {
        store: store.clone(),
        contracts_dir: Some(contracts),
        policies: vec![PolicySource::new(
            "all.cedar",
            "permit (principal, action, resource);",
        )],
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: RedactionKey::new(vec![7; 32]).unwrap(),
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
        public_url: "http://bench.invalid".into(),
        first_tenant: "acme".into(),
        background: false,
        contract_sync_every: Duration::ZERO,
        requests_in_flight: Default::default(),
        review_mail: None,
    })
    .await
    .unwrap();
    let admin = gateway.first_keys.as_ref().unwrap().admin.clone();
    let state = gateway.state.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (s, limits) = (state.clone(), gateway.limits);
    tokio::spawn(async move {
        axum::serve(listener, warrant_server::router(s, limits))
            .await
            .unwrap()
    });
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let request = http.post(format!("{base}{path}")).bearer_auth(&admin).json(&body);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let key = post(
        "/v1/keys",
        json!({"principal": "billing", "grants": ["orders:read"]}),
    )
    .await;
    let source = post(
        "/v1/inbound-sources",
        json!({"provider": "standard_webhooks", "key_id": key["id"], "secret": secret_text,
            "action": {"tool": "lookup@1", "arguments": {"order_id": "${event.id}"}}}),
    )
    .await;
    let source_id: Arc<str> = source["id"].as_str().unwrap().into();

    // Inbound: every delivery verified and durably queued.
    let deliveries: Vec<(HeaderMap, Vec<u8>)> = (0..n)
        .map(|i| {
            let body = event(i);
            let id = format!("msg_{i}");
            let mut headers = HeaderMap::new();
            headers.insert("webhook-id", id.parse().unwrap());
            headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
            headers.insert(
                "webhook-signature",
                warrant_core::inbound::sign(Provider::StandardWebhooks, &secret, &id, now, &body)
                    .parse()
                    .unwrap(),
            );
            (headers, body)
        })
        .collect();
    let deliveries = Arc::new(deliveries);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (t, c) = (Instant::now(), cpu());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..width {
        let (state, deliveries, next, source_id) =
            (state.clone(), deliveries.clone(), next.clone(), source_id.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((headers, body)) = deliveries.get(i) else {
                    return;
                };
                let received = warrant_server::inbound::receive(&state, &source_id, headers, body).await;
                assert!(
                    matches!(received, Ok(warrant_server::inbound::Received::Accepted(_))),
                    "{received:?}"
                );
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    report("inbound accepted", n, t.elapsed(), cpu().saturating_sub(c), floor);

    // Outbound: n messages to a loopback receiver.
    let addr = receiver().await;
    let endpoint = post("/v1/webhooks", json!({"url": format!("http://{addr}/hook")})).await;
    let endpoint_id = endpoint["id"].as_str().unwrap().to_owned();
    for i in 0..n {
        store
            .enqueue_job(&NewJob {
                id: format!("whm_bench_{i}"),
                tenant: "acme".into(),
                kind: WEBHOOK_JOB.into(),
                payload: json!({
                    "event_id": format!("evt_bench_{i}"),
                    "endpoint_id": endpoint_id,
                    "body": {"type": "invocation.completed", "timestamp": "2026-12-03T00:00:00Z",
                        "data": {"ledger_id": format!("led_{i}"), "outcome": "committed"}},
                }),
                run_at: state.env.now(),
                max_attempts: 8,
            })
            .await
            .unwrap();
    }
    let (t, c) = (Instant::now(), cpu());
    let mut delivered = 0;
    while delivered < n {
        let claimed = warrant_server::webhooks::deliver_due(
            &state,
            "bench",
            &warrant_server::webhooks::SCHEDULE,
            warrant_server::webhooks::DELIVERY_TIMEOUT,
        )
        .await
        .unwrap();
        assert!(claimed > 0, "messages left undelivered");
        delivered += claimed;
    }
    report(
        "outbound delivered",
        n,
        t.elapsed(),
        cpu().saturating_sub(c),
        floor,
    );
    let attempts = store
        .list_webhook_attempts("acme", None, Some(&endpoint_id), 1000)
        .await
        .unwrap();
    assert!(
        attempts.iter().all(|a| a.status == Some(200)),
        "every delivery answered 200"
    );
}
