//! Workflow runs against the same calls made directly, in one process and one run:
//!
//! - **direct**: a client makes the three calls of the workflow itself — three `submit`s
//!   (`dispatch`, the pipeline every lane uses) of the read `lookup`, each with its own
//!   idempotency key, one after the other;
//! - **run**: `runs::start` of a published three-tool-step workflow (`lookup` → `lookup` →
//!   `lookup` → `end`, no review) and the wait for its end, executed by the node's runner: each
//!   step a job claimed under a lease, the call through `dispatch`, the step recorded with the
//!   next step's job in one transaction.
//!
//! Both against the same loopback upstream, on SQLite (`synchronous=FULL`) and on PostgreSQL
//! at `WARRANT_TEST_POSTGRES_URL` when it answers. Reported: latency p50/p99 of one run against
//! three direct calls (sequential: one at a time), the per-step overhead (a run's latency less
//! its three direct calls, over its four steps), throughput (runs/s with `WARRANT_BENCH_PARALLEL`
//! runs in flight, against three-call groups/s at the same concurrency) and this process's CPU
//! per run or per group (the upstream runs here too, the same for both). The target of the
//! workflow issue: a run within 1.5× its three direct calls.
//!
//! Run: `cargo bench -p warrant-server --bench runs` (`WARRANT_BENCH_RUNS`, default 300;
//! `WARRANT_BENCH_PARALLEL`, default 16; `WARRANT_BENCH_ONLY=direct|run` measures one path alone,
//! in flight, for a profiler).
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

use serde_json::{Value, json};
use warrant_core::authority::Principal;
use warrant_core::contract::DocumentFormat;
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::records::{RunStatus, WorkflowRecord};
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{Dispatched, OwnedCall, RuntimeSettings, Secrets, submit};
use warrant_server::state::AppState;
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

const CONTRACT: &str = r#"
name: lookup
version: 1
description: Look up an order.
owner: bench
effect: read
scopes: [orders:read]
approval: none
input:
  type: object
  additionalProperties: false
  required: [order_id]
  properties:
    order_id: { type: string, maxLength: 20 }
output:
  type: object
  additionalProperties: false
  required: [order_id, status]
  properties:
    order_id: { type: string, maxLength: 20 }
    status: { type: string, maxLength: 16 }
"#;

const WORKFLOW: &str = "name: thrice\nversion: 1\ndescription: Three lookups.\ninput:\n  type: object\n  \
    additionalProperties: false\n  required: [order_id]\n  properties:\n    order_id: { type: string, maxLength: 20 }\n\
    steps:\n  - id: one\n    tool: lookup@1\n    with: { order_id: \"${input.order_id}\" }\n    next: two\n  \
    - id: two\n    tool: lookup@1\n    with: { order_id: \"${steps.one.output.order_id}\" }\n    next: three\n  \
    - id: three\n    tool: lookup@1\n    with: { order_id: \"${steps.two.output.order_id}\" }\n    next: done\n  \
    - { id: done, end: { status: completed } }\n";

async fn start_upstream() -> SocketAddr {
    let app = axum::Router::new().route(
        "/lookup",
        axum::routing::post(|body: axum::body::Bytes| async move {
            let args: Value = serde_json::from_slice(&body).unwrap();
            axum::Json(json!({"order_id": args["order_id"], "status": "paid"}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn gateway(store: Arc<dyn Store>, dir: &std::path::Path, upstream: SocketAddr) -> Gateway {
    let contracts = dir.join("contracts");
    std::fs::create_dir_all(&contracts).unwrap();
    std::fs::write(
        contracts.join("lookup.yaml"),
        format!("{CONTRACT}adapter: {{ kind: http, url: \"http://{upstream}/lookup\" }}\n"),
    )
    .unwrap();
    Gateway::start(GatewayConfig {
        store,
        contracts_dir: Some(contracts),
        policies: vec![PolicySource::new(
            "bench.cedar",
            r#"permit (principal in Warrant::Role::"agent", action in Warrant::Action::"lookup", resource);"#,
        )],
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: RedactionKey::new(vec![7; 32]).unwrap(),
        adapters: AdapterConfig {
            client: SafeClient::new(NetPolicy {
                allow_hosts: vec![upstream.ip().to_string()],
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
    .unwrap()
}

async fn publish(state: &AppState) -> WorkflowRecord {
    let now = state.env.now();
    let (document, compiled) =
        warrant_server::authoring::compile_text(&state.registry, "acme", WORKFLOW, DocumentFormat::Yaml, now)
            .await
            .unwrap();
    let record = WorkflowRecord {
        tenant: "acme".into(),
        name: "thrice".into(),
        version: 1,
        digest: warrant_core::canon::digest(&document).to_string(),
        document,
        pinned: compiled
            .pinned()
            .into_iter()
            .map(|(s, id)| (s, id.to_string()))
            .collect(),
        published_by: "bench".into(),
        published_at: now,
    };
    state.store.publish_workflow(&record).await.unwrap();
    record
}

/// Three direct calls, as a client of `dispatch` would make them.
async fn direct(state: &Arc<AppState>, principal: &Principal, tag: &str) {
    for step in 0..3 {
        let call = OwnedCall {
            bytes: json!({"tool": "lookup", "version": 1, "arguments": {"order_id": format!("ord_{step}")}})
                .to_string()
                .into_bytes()
                .into(),
            idempotency_key: Some(format!("{tag}.{step}")),
            trace_id: "bench".into(),
            ..OwnedCall::default()
        };
        match submit(
            state.authority.clone(),
            state.runtime.clone(),
            principal.clone(),
            call,
        )
        .await
        .unwrap()
        {
            Dispatched::Executed(e) => assert!(e.result.is_ok()),
            other => panic!("not executed: {other:?}"),
        }
    }
}

/// Runs ended, routed to the one waiter of each (one subscriber for the whole benchmark: a
/// subscriber per run would wake every waiter on every end, and count that as the runs' CPU).
#[derive(Default)]
struct Ends {
    /// The waiters by run id, and the runs that ended before their waiter came.
    waiters: std::sync::Mutex<(Waiting, Ended)>,
}

type Waiting = std::collections::HashMap<String, tokio::sync::oneshot::Sender<RunStatus>>;
type Ended = std::collections::HashMap<String, RunStatus>;

impl Ends {
    fn start(state: &Arc<AppState>) -> Arc<Ends> {
        let ends = Arc::new(Ends::default());
        let (router, mut ended) = (ends.clone(), state.runs_ended.subscribe());
        tokio::spawn(async move {
            while let Ok((id, status)) = ended.recv().await {
                let mut w = router.waiters.lock().unwrap();
                match w.0.remove(&id) {
                    Some(waiter) => {
                        let _ = waiter.send(status);
                    }
                    None => {
                        w.1.insert(id, status);
                    }
                }
            }
        });
        ends
    }

    async fn wait(&self, id: &str) -> RunStatus {
        let waiter = {
            let mut w = self.waiters.lock().unwrap();
            if let Some(status) = w.1.remove(id) {
                return status;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            w.0.insert(id.to_owned(), tx);
            rx
        };
        waiter.await.unwrap()
    }
}

/// Starts a run and waits for its end.
async fn run(state: &Arc<AppState>, ends: &Ends, principal: &Principal, record: &WorkflowRecord, i: usize) {
    let input = json!({"order_id": format!("ord_{i}")}).to_string();
    let run = warrant_server::runs::start(state, principal, record, input.as_bytes())
        .await
        .unwrap();
    assert_eq!(ends.wait(&run.id).await, RunStatus::Completed);
}

fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Figures {
    p50: Duration,
    p99: Duration,
    per_second: f64,
    cpu_each: Duration,
}

async fn sequential<F, Fut>(n: usize, mut one: F) -> (Duration, Duration)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        one(i).await;
        latencies.push(t.elapsed());
    }
    latencies.sort();
    (percentile(&latencies, 0.5), percentile(&latencies, 0.99))
}

async fn parallel<F, Fut>(n: usize, width: usize, one: F) -> (f64, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let one = Arc::new(one);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (t, c) = (Instant::now(), cpu());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..width {
        let (one, next) = (one.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                one(i).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let (elapsed, spent) = (t.elapsed(), cpu().saturating_sub(c));
    (
        n as f64 / elapsed.as_secs_f64(),
        spent / u32::try_from(n).unwrap(),
    )
}

async fn measure(label: &str, store: Arc<dyn Store>, n: usize, width: usize) {
    let dir = tempfile::tempdir().unwrap();
    let upstream = start_upstream().await;
    let gateway = gateway(store, dir.path(), upstream).await;
    let state = gateway.state.clone();
    let record = publish(&state).await;
    let runner = warrant_server::runs::spawn_runner(state.clone());
    // The principal holds a key (a run's acting steps check that it still does).
    let generated = warrant_store::keys::generate();
    state
        .store
        .create_api_key(&warrant_core::records::NewApiKey {
            id: generated.id,
            key_hash: generated.hash,
            tenant: "acme".into(),
            principal: "bench-agent".into(),
            grants: vec!["orders:read".into()],
            roles: vec!["agent".into()],
            label: None,
            created_at: state.env.now(),
        })
        .await
        .unwrap();
    let principal = Principal::new("bench-agent", "acme", ["orders:read".to_owned()])
        .unwrap()
        .with_roles(["agent".to_owned()])
        .unwrap();
    let ends = Ends::start(&state);
    // Warm up both paths (connections, caches, compiled workflow).
    for i in 0..20 {
        direct(&state, &principal, &format!("warm.{i}")).await;
        run(&state, &ends, &principal, &record, i).await;
    }
    // One path alone, in flight, for a profiler (`WARRANT_BENCH_ONLY=direct|run`).
    if let Ok(only) = std::env::var("WARRANT_BENCH_ONLY") {
        let (s, p, r, e) = (state.clone(), principal.clone(), record.clone(), ends.clone());
        let only_run = only == "run";
        let (per_second, cpu_each) = parallel(n, width, move |i| {
            let (s, p, r, e) = (s.clone(), p.clone(), r.clone(), e.clone());
            async move {
                if only_run {
                    run(&s, &e, &p, &r, i).await;
                } else {
                    direct(&s, &p, &format!("only.{i}")).await;
                }
            }
        })
        .await;
        println!(
            "{label}, {only} only: {per_second:.0}/s, {:.0} µs CPU each",
            cpu_each.as_secs_f64() * 1e6
        );
        runner.abort();
        return;
    }
    let mut figures = Vec::new();
    for round in 0..2 {
        let (s, p, r, e) = (state.clone(), principal.clone(), record.clone(), ends.clone());
        let (d50, d99) = sequential(n, |i| {
            let (s, p) = (s.clone(), p.clone());
            async move { direct(&s, &p, &format!("seq.{round}.{i}")).await }
        })
        .await;
        let (r50, r99) = sequential(n, |i| {
            let (s, p, r, e) = (s.clone(), p.clone(), r.clone(), e.clone());
            async move { run(&s, &e, &p, &r, i).await }
        })
        .await;
        let (s2, p2) = (state.clone(), principal.clone());
        let (dps, dcpu) = parallel(n, width, move |i| {
            let (s, p) = (s2.clone(), p2.clone());
            async move { direct(&s, &p, &format!("par.{round}.{i}")).await }
        })
        .await;
        let (s3, p3, r3, e3) = (state.clone(), principal.clone(), record.clone(), ends.clone());
        let (rps, rcpu) = parallel(n, width, move |i| {
            let (s, p, r, e) = (s3.clone(), p3.clone(), r3.clone(), e3.clone());
            async move { run(&s, &e, &p, &r, i).await }
        })
        .await;
        figures.push((
            Figures {
                p50: d50,
                p99: d99,
                per_second: dps,
                cpu_each: dcpu,
            },
            Figures {
                p50: r50,
                p99: r99,
                per_second: rps,
                cpu_each: rcpu,
            },
        ));
    }
    println!("\n{label}: {n} per measurement, {width} in flight for throughput, two rounds");
    println!(
        "| round | path | p50 | p99 | per step overhead p50 | per second | CPU each | run / direct (p50, CPU) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, (d, r)) in figures.iter().enumerate() {
        println!(
            "| {} | 3 direct calls | {:.2} ms | {:.2} ms | — | {:.0} groups/s | {:.2} ms | |",
            i + 1,
            ms(d.p50),
            ms(d.p99),
            d.per_second,
            ms(d.cpu_each)
        );
        println!(
            "| {} | run of 3 tool steps | {:.2} ms | {:.2} ms | {:.2} ms | {:.0} runs/s | {:.2} ms | {:.2}×, {:.2}× |",
            i + 1,
            ms(r.p50),
            ms(r.p99),
            ms(r.p50.saturating_sub(d.p50)) / 4.0,
            r.per_second,
            ms(r.cpu_each),
            r.p50.as_secs_f64() / d.p50.as_secs_f64(),
            r.cpu_each.as_secs_f64() / d.cpu_each.as_secs_f64().max(1e-9),
        );
    }
    runner.abort();
    drop(gateway);
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = std::env::var("WARRANT_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let width: usize = std::env::var("WARRANT_BENCH_PARALLEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    // `cargo test --benches` runs each bench binary with `--bench` absent: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
            .await
            .unwrap();
        measure("SQLite", Arc::new(sqlite), n, width).await;
        if let Some(db) = TestDatabase::postgres().await.unwrap() {
            let store = db.open().await.unwrap();
            measure("PostgreSQL", Arc::new(store), n, width).await;
            db.drop_schema().await;
        }
    });
}
