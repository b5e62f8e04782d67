//! The cost of executing an allowed call, against calling its upstream directly, in one run:
//!
//! - `execute/upstream_direct`: one POST of the call's canonical arguments (with the headers the
//!   `http` adapter sends) to a loopback upstream, through the same `SafeClient` the adapter
//!   uses, and a parse of the JSON answer — the baseline;
//! - `execute/execute_http_sqlite`: `Runtime::execute` of an allowed `create_support_credit`
//!   (write, idempotency honoured, a fresh key per iteration so every iteration really runs):
//!   `begin_attempt` (idempotency claim + ledger row `attempting`, one durable transaction) →
//!   adapter POST → output validation → `finish_attempt` (outcome, stored result and spend, one
//!   durable transaction), on the embedded SQLite store. `decide` runs untimed before each call;
//! - `execute/decide_execute_http_sqlite`: `decide` (including its budget reservation commit)
//!   plus `execute`, both timed;
//! - `execute/execute_read_http_sqlite`, `execute/decide_execute_read_http_sqlite`: the same for
//!   the read `lookup_order` without an idempotency key (no idempotency record; one ledger
//!   row, written with its outcome after the call);
//! - `execute/execute_http_memory`, `execute/decide_execute_http_memory`: the write over the
//!   in-memory store, which separates the runtime's own work from the durable commits;
//! - then a throughput table (printed, not criterion): committed calls per second with 1, 8
//!   and 64 concurrent callers, each looping `decide` + `execute` with fresh keys, beside the
//!   upstream called directly at the same concurrency.
//!
//! The contracts are the examples in `examples/contracts/` bound to the loopback upstream
//! (`create_support_credit` as version 2 with `approval: none` and a daily call budget that
//! cannot run out; `lookup_order` with the same). SQLite keeps `synchronous=FULL`.
//!
//! Every timed loop runs in a task on the runtime's two workers, as a server's handlers would.
//!
//! Run: `cargo bench -p warrant-runtime --bench execute`. `WARRANT_BENCH_CALLS` sets the calls
//! per throughput level (default 2000; 0 skips the table).
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::routing::post;
use bytes::Bytes;
use criterion::Criterion;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;
use warrant_core::Contract;
use warrant_core::authority::Principal;
use warrant_core::budget::BudgetConfig;
use warrant_core::contract::DocumentFormat;
use warrant_core::decision::{Allowed, Decision, Outcome};
use warrant_core::guard::Guards;
use warrant_core::pipeline::{Authority, Call, Settings};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::store::Store;
use warrant_policy::{CedarEngine, PolicySource};
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, OutboundRequest, SafeClient};
use warrant_runtime::{Adapters, CredentialSpec, Execution, Runtime, RuntimeSettings, Secrets};
use warrant_store::{DatabaseUrl, MemoryStore, SqlStore, StoreOptions, SystemEnv};

// The allocator the `warrant` binary runs with (see src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CREDIT: &str = include_str!("../../../examples/contracts/create_support_credit.v1.yaml");
const LOOKUP: &str = include_str!("../../../examples/contracts/lookup_order.v1.yaml");
const SUPPORT: &str = include_str!("../../../examples/policies/support.cedar");
const ORDERS: &str = include_str!("../../../examples/policies/orders.cedar");

const CREDIT_PROPOSAL: &[u8] = br#"{"tool":"create_support_credit","version":2,"arguments":{"customer_id":"cus_8f3k2m9q","amount_cents":2500,"reason":"Refund for duplicate charge on invoice 1042"}}"#;
const LOOKUP_PROPOSAL: &[u8] =
    br#"{"tool":"lookup_order","version":1,"arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}"#;
const CREDIT_RESULT: &str = r#"{"credit_id":"cr_01JDQ8Z6Y4M2","status":"applied"}"#;
const ORDER_RESULT: &str =
    r#"{"order_id":"ord_7Hq2Lm9Xv3","status":"paid","total_cents":1200,"currency":"EUR"}"#;

/// Starts the upstream on its own runtime (as another process would be), on 127.0.0.1:0.
fn start_upstream() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route(
                    "/credits",
                    post(|| async { ([(CONTENT_TYPE, "application/json")], CREDIT_RESULT) }),
                )
                .route(
                    "/orders",
                    post(|| async { ([(CONTENT_TYPE, "application/json")], ORDER_RESULT) }),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn contracts(upstream: SocketAddr) -> Vec<Contract> {
    let credit = CREDIT
        .replace("version: 1", "version: 2")
        .replace("approval: per_call ", "approval: none     ")
        .replace("calls_per_day: 200", "calls_per_day: 1000000000000")
        + &format!(
            "adapter:\n  kind: http\n  url: http://{upstream}/credits\n  credential: CREDITS_API_TOKEN\n"
        );
    let lookup = LOOKUP
        .replace("calls_per_day: 5000", "calls_per_day: 1000000000000")
        .replace(
            "https://orders.internal.example/lookup",
            &format!("http://{upstream}/orders"),
        );
    assert_ne!(lookup, LOOKUP);
    [credit, lookup]
        .iter()
        .map(|text| Contract::from_text(text, DocumentFormat::Yaml).unwrap())
        .collect()
}

struct Fixture {
    authority: Authority,
    runtime: Runtime,
    /// The SQLite store to close at the end (`None`: the in-memory store).
    sqlite: Option<Arc<SqlStore>>,
    client: SafeClient,
    principal: Principal,
    credits_url: url::Url,
    canonical: Bytes,
    credential: HeaderValue,
    seq: AtomicU64,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// The upstream called directly.
    Upstream,
    /// `decide` + `execute` of the idempotent write.
    Write,
    /// `decide` + `execute` of the read, without a key.
    Read,
}

impl Fixture {
    /// The decision pipeline and the runtime over SQLite (`sqlite`) or the in-memory store,
    /// adapters using `client`, tools bound to `upstream`.
    async fn new(upstream: SocketAddr, client: SafeClient, sqlite: bool) -> Fixture {
        let (dyn_store, sqlite, dir): (Arc<dyn Store>, _, _) = if sqlite {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(
                SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
                    .await
                    .unwrap(),
            );
            (store.clone(), Some(store), Some(dir))
        } else {
            (Arc::new(MemoryStore::new()), None, None)
        };
        let env = Arc::new(SystemEnv);
        let registry = Arc::new(Registry::new(dyn_store.clone(), time::Duration::seconds(60)));
        let contracts = contracts(upstream);
        for c in &contracts {
            registry
                .register(c.clone(), time::OffsetDateTime::now_utc())
                .await
                .unwrap();
        }
        let contracts: Vec<Arc<Contract>> = contracts.into_iter().map(Arc::new).collect();
        let policy = Arc::new(
            CedarEngine::new(
                &contracts,
                &[
                    PolicySource::new("support.cedar", SUPPORT),
                    PolicySource::new("orders.cedar", ORDERS),
                ],
            )
            .unwrap(),
        );
        let authority = Authority::new(
            dyn_store.clone(),
            registry.clone(),
            policy,
            Arc::new(Guards::new()),
            BudgetConfig::default(),
            RedactionKey::new(vec![3; 32]).unwrap(),
            env.clone(),
            Settings::default(),
        );
        let token = "tok-credits-bench-secret";
        let adapters = Arc::new(Adapters::new(AdapterConfig {
            client: client.clone(),
            secrets: {
                let origin = format!("http://{upstream}");
                let spec = |tool: &str| {
                    CredentialSpec::new(token)
                        .for_tools([tool])
                        .and_then(|s| s.to_origins([origin.as_str()]))
                        .unwrap()
                };
                Secrets::default()
                    .with("CREDITS_API_TOKEN", spec("create_support_credit"))
                    .with("ORDERS_API_TOKEN", spec("lookup_order"))
            },
            smtp: None,
            command_roots: Vec::new(),
            model: None,
        }));
        let runtime = Runtime::new(dyn_store, registry, env, adapters, RuntimeSettings::default());
        let principal = Principal::new(
            "agent-7",
            "acme",
            ["support:credits:write", "orders:read"].map(str::to_owned),
        )
        .unwrap()
        .with_roles(["operator".to_owned(), "agent".to_owned()])
        .unwrap();
        let arguments = &serde_json::from_slice::<Value>(CREDIT_PROPOSAL).unwrap()["arguments"];
        let mut credential = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        credential.set_sensitive(true);
        Fixture {
            authority,
            runtime,
            sqlite,
            client,
            principal,
            credits_url: url::Url::parse(&format!("http://{upstream}/credits")).unwrap(),
            canonical: Bytes::from(warrant_core::canon::canonical_bytes(arguments)),
            credential,
            seq: AtomicU64::new(0),
            _dir: dir,
        }
    }

    /// `decide` on the write (a fresh idempotency key) or the read (no key); must allow.
    async fn decide(&self, work: Work) -> Box<Allowed> {
        let key = format!("credit-bench-{:010}", self.seq.fetch_add(1, Ordering::Relaxed));
        let call = match work {
            Work::Write => Call {
                bytes: CREDIT_PROPOSAL,
                idempotency_key: Some(&key),
                trace_id: "bench",
                ..Call::default()
            },
            Work::Read => Call {
                bytes: LOOKUP_PROPOSAL,
                trace_id: "bench",
                ..Call::default()
            },
            Work::Upstream => unreachable!(),
        };
        match self
            .authority
            .decide(&self.principal, &call)
            .await
            .unwrap()
            .decision
        {
            Decision::Allow(allowed) => allowed,
            other => panic!("not allowed: {other:?}"),
        }
    }

    async fn execute(&self, allowed: Box<Allowed>) {
        committed(&self.runtime.execute(allowed).await.unwrap());
    }

    /// The baseline: what the adapter sends, sent directly with the same client.
    async fn upstream(&self) {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(header::AUTHORIZATION, self.credential.clone());
        headers.insert("warrant-tenant", HeaderValue::from_static("acme"));
        headers.insert(
            "warrant-scopes",
            HeaderValue::from_static("support:credits:write"),
        );
        let key = format!("{:064x}", self.seq.fetch_add(1, Ordering::Relaxed));
        headers.insert("idempotency-key", HeaderValue::from_str(&key).unwrap());
        let request = OutboundRequest {
            headers,
            timeout: Some(Duration::from_secs(10)),
            ..OutboundRequest::post(self.credits_url.clone(), self.canonical.clone())
        };
        let response = self.client.send(request).await.unwrap();
        assert_eq!(response.status, StatusCode::OK);
        let value: Value = serde_json::from_slice(&response.body).unwrap();
        assert!(value.is_object());
    }

    async fn run(&self, work: Work) {
        match work {
            Work::Upstream => self.upstream().await,
            Work::Write | Work::Read => self.execute(self.decide(work).await).await,
        }
    }
}

fn committed(e: &Execution) {
    assert!(
        matches!(e.result, Ok(Outcome::Committed(_))) && !e.replayed && e.attempts == 1,
        "{e:?}"
    );
}

/// Runs `iters` iterations in a task on the runtime's workers (where a server's handlers run),
/// returning the time `timed` reports for them.
async fn on_worker(f: &Arc<Fixture>, work: Work, iters: u64, execute_only: bool) -> Duration {
    let f = f.clone();
    tokio::spawn(async move {
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            if execute_only {
                let allowed = f.decide(work).await;
                let start = Instant::now();
                f.execute(allowed).await;
                timed += start.elapsed();
            } else {
                let start = Instant::now();
                f.run(work).await;
                timed += start.elapsed();
            }
        }
        timed
    })
    .await
    .unwrap()
}

fn bench(c: &mut Criterion, rt: &tokio::runtime::Runtime, sqlite: &Arc<Fixture>, memory: &Arc<Fixture>) {
    let mut group = c.benchmark_group("execute");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    group.bench_function("upstream_direct", |b| {
        b.to_async(rt)
            .iter_custom(|iters| on_worker(sqlite, Work::Upstream, iters, false))
    });
    for (f, work, name) in [
        (sqlite, Work::Write, "http_sqlite"),
        (sqlite, Work::Read, "read_http_sqlite"),
        (memory, Work::Write, "http_memory"),
    ] {
        group.bench_function(format!("execute_{name}"), |b| {
            b.to_async(rt)
                .iter_custom(|iters| on_worker(f, work, iters, true))
        });
        group.bench_function(format!("decide_execute_{name}"), |b| {
            b.to_async(rt)
                .iter_custom(|iters| on_worker(f, work, iters, false))
        });
    }
    group.finish();
}

struct Level {
    calls: u64,
    wall: Duration,
    p50: Duration,
    p99: Duration,
}

impl Level {
    fn per_second(&self) -> f64 {
        self.calls as f64 / self.wall.as_secs_f64()
    }
}

/// `total` calls of `work` split over `callers` concurrent tasks; every call must commit.
async fn level(f: &Arc<Fixture>, work: Work, callers: u64, total: u64) -> Level {
    let per = total.div_ceil(callers);
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per as usize);
                for _ in 0..per {
                    let t = Instant::now();
                    f.run(work).await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let wall = start.elapsed();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Level {
        calls: per * callers,
        wall,
        p50: at(0.5),
        p99: at(0.99),
    }
}

fn throughput(rt: &tokio::runtime::Runtime, sqlite: &Arc<Fixture>, memory: &Arc<Fixture>, total: u64) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!();
    println!("throughput: {total} calls per level, SQLite synchronous=FULL, runtime with 2 workers");
    println!(
        "| workload | callers | calls/s | upstream calls/s ÷ this | p50 | p99 |\n|---|---|---|---|---|---|"
    );
    let mut baseline = Vec::new();
    for (f, work, name) in [
        (sqlite, Work::Upstream, "upstream_direct"),
        (sqlite, Work::Write, "decide+execute write, SQLite"),
        (sqlite, Work::Read, "decide+execute read (no key), SQLite"),
        (memory, Work::Write, "decide+execute write, memory store"),
    ] {
        rt.block_on(level(f, work, 8, (total / 10).max(8)));
        for (i, callers) in [1u64, 8, 64].into_iter().enumerate() {
            let l = rt.block_on(level(f, work, callers, total));
            if work == Work::Upstream {
                baseline.push(l.per_second());
            }
            println!(
                "| {name} | {callers} | {:.0} | {:.1}× | {:.3} ms | {:.3} ms |",
                l.per_second(),
                baseline[i] / l.per_second(),
                ms(l.p50),
                ms(l.p99),
            );
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let upstream = start_upstream();
    // One client for the baseline and every adapter: one connection pool.
    let client = SafeClient::new(NetPolicy {
        allow_hosts: vec!["127.0.0.1".into()],
        ..NetPolicy::default()
    });
    let sqlite = Arc::new(rt.block_on(Fixture::new(upstream, client.clone(), true)));
    let memory = Arc::new(rt.block_on(Fixture::new(upstream, client, false)));
    for (f, work) in [
        (&sqlite, Work::Upstream),
        (&sqlite, Work::Write),
        (&sqlite, Work::Read),
        (&memory, Work::Write),
    ] {
        rt.block_on(f.run(work));
    }
    let test_mode = std::env::args().any(|a| a == "--test");
    let listing = std::env::args().any(|a| a == "--list");

    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &rt, &sqlite, &memory);
    c.final_summary();

    let total = if test_mode {
        16
    } else {
        std::env::var("WARRANT_BENCH_CALLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000)
    };
    if total > 0 && !listing {
        throughput(&rt, &sqlite, &memory, total);
    }
    if let Some(store) = &sqlite.sqlite {
        rt.block_on(store.close());
    }
}
