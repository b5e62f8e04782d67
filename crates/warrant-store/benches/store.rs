//! Store throughput and lookup cost on each backend, in one criterion run:
//!
//! - `ledger_write/<backend>/1_writer` and `8_writers`: committed write-ahead attempts
//!   (idempotency claim + ledger row, one transaction each); criterion reports rows/s.
//! - `replay_lookup/<backend>/<rows>`: one idempotency lookup by key with 1k and 1M existing
//!   records (it must stay flat), and `replay_begin/<backend>/<rows>`: a full replay
//!   (`begin_attempt` finding a committed key and writing the `replayed` ledger row).
//!
//! PostgreSQL runs when `WARRANT_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! answers; it is skipped otherwise. Run: `cargo bench -p warrant-store --bench store`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "benchmark"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use time::OffsetDateTime;
use warrant_store::*;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn attempt(now: OffsetDateTime) -> (LedgerEntry, IdempotencyScope) {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let id = format!("led_bench_{n:012}");
    let mut e = LedgerEntry::new(id, "acme", "agent-7", "trace", "create_support_credit", now);
    e.decision = LedgerDecision::Allow;
    e.outcome = Some(Outcome::Attempting);
    e.contract_id = Some("tool-contract@sha256:aa".into());
    e.payload_digest = Some("sha256:p".into());
    e.arguments =
        Some(json!({"customer_id": "cus_8f3k2m9q", "amount_cents": 2500, "reason": "hmac:0123456789abcdef"}));
    let scope = IdempotencyScope {
        tenant: "acme".into(),
        principal: "agent-7".into(),
        contract_id: "tool-contract@sha256:aa".into(),
        key: format!("bench-{n}"),
    };
    (e, scope)
}

async fn write_rows(store: Arc<SqlStore>, rows: u64) {
    let now = OffsetDateTime::now_utc();
    for _ in 0..rows {
        let (e, scope) = attempt(now);
        store
            .begin_attempt(
                &e,
                Some(&scope),
                &AttemptClaims::NONE,
                now + time::Duration::hours(24),
            )
            .await
            .unwrap();
    }
}

/// Bulk-loads committed idempotency records `pre-<from>` ..= `pre-<to>` directly in SQL.
async fn preload(backend: &str, url: &str, schema: Option<&str>, from: u64, to: u64) {
    let now = OffsetDateTime::now_utc().unix_timestamp() * 1000;
    let exp = now + 86_400_000;
    let idem = format!(
        "INSERT INTO idempotency (tenant, principal, contract_id, key, payload_digest, status, result, ledger_id, \
         created_at, updated_at, expires_at) SELECT 'acme', 'agent-7', 'tool-contract@sha256:aa', 'pre-' || n, \
         'sha256:p', 'committed', '{{\"credit_id\":\"cr\"}}', 'led_pre_' || n, {now}, {now}, {exp} FROM "
    );
    match backend {
        "sqlite" => {
            let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(url)
                .await
                .unwrap();
            let series = format!(
                "(WITH RECURSIVE s(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM s WHERE n < {to}) SELECT n FROM s)"
            );
            sqlx::query(sqlx::AssertSqlSafe(format!("{idem}{series}")))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        _ => {
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
                .await
                .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SET search_path TO {}",
                schema.unwrap()
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            let series = format!("generate_series({from}, {to}) AS n");
            sqlx::query(sqlx::AssertSqlSafe(format!("{idem}{series}")))
                .execute(&mut conn)
                .await
                .unwrap();
            sqlx::query("ANALYZE idempotency")
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
}

struct Target {
    name: &'static str,
    store: Arc<SqlStore>,
    url: String,
    schema: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

async fn targets() -> Vec<Target> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warrant.db");
    let sqlite = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()), &StoreOptions::default())
        .await
        .unwrap();
    let mut out = vec![Target {
        name: "sqlite",
        store: Arc::new(sqlite),
        url: format!("sqlite://{}", path.display()),
        schema: None,
        _dir: Some(dir),
    }];
    let pg = std::env::var("WARRANT_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("warrant_bench_{}", hex::encode(rand::random::<[u8; 4]>()));
    let options = StoreOptions {
        postgres_schema: Some(schema.clone()),
        ..StoreOptions::default()
    };
    match SqlStore::open(&DatabaseUrl::Postgres(pg.clone()), &options).await {
        Ok(store) => out.push(Target {
            name: "postgres",
            store: Arc::new(store),
            url: pg,
            schema: Some(schema),
            _dir: None,
        }),
        Err(e) => eprintln!("postgres skipped: {e}"),
    }
    out
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let targets = rt.block_on(targets());

    let mut group = c.benchmark_group("ledger_write");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));
    for t in &targets {
        group.bench_function(BenchmarkId::new(t.name, "1_writer"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = t.store.clone();
                async move {
                    let start = Instant::now();
                    write_rows(store, iters).await;
                    start.elapsed()
                }
            })
        });
        group.bench_function(BenchmarkId::new(t.name, "8_writers"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = t.store.clone();
                async move {
                    let start = Instant::now();
                    let per = iters.div_ceil(8);
                    let tasks: Vec<_> = (0..8)
                        .map(|_| tokio::spawn(write_rows(store.clone(), per)))
                        .collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                    // Report time per row actually written.
                    start.elapsed().mul_f64(iters as f64 / (per * 8) as f64)
                }
            })
        });
    }
    group.finish();

    let mut lookup = c.benchmark_group("replay_lookup");
    lookup.sample_size(30).measurement_time(Duration::from_secs(3));
    let mut replay: Vec<(&'static str, u64, IdempotencyScope)> = Vec::new();
    let mut loaded = 0;
    for rows in [1_000u64, 1_000_000] {
        for t in &targets {
            rt.block_on(preload(t.name, &t.url, t.schema.as_deref(), loaded + 1, rows));
        }
        loaded = rows;
        for t in &targets {
            let scope = IdempotencyScope {
                tenant: "acme".into(),
                principal: "agent-7".into(),
                contract_id: "tool-contract@sha256:aa".into(),
                key: format!("pre-{}", rows / 2),
            };
            lookup.bench_function(BenchmarkId::new(t.name, rows), |b| {
                b.to_async(&rt).iter(|| {
                    let store = t.store.clone();
                    let scope = scope.clone();
                    async move { store.get_idempotency(&scope).await.unwrap().unwrap() }
                })
            });
            replay.push((t.name, rows, scope));
        }
    }
    lookup.finish();

    let mut group = c.benchmark_group("replay_begin");
    group.sample_size(10).measurement_time(Duration::from_secs(3));
    for (name, rows, scope) in replay.drain(..) {
        let t = targets.iter().find(|t| t.name == name).unwrap();
        group.bench_function(BenchmarkId::new(name, rows), |b| {
            b.to_async(&rt).iter(|| {
                let store = t.store.clone();
                let scope = scope.clone();
                async move {
                    let (e, _) = attempt(OffsetDateTime::now_utc());
                    let start = store
                        .begin_attempt(&e, Some(&scope), &AttemptClaims::NONE, OffsetDateTime::now_utc())
                        .await
                        .unwrap();
                    assert!(matches!(start, AttemptStart::Replay(_)));
                }
            })
        });
    }
    group.finish();

    for t in &targets {
        rt.block_on(t.store.close());
        if let (Some(schema), "postgres") = (&t.schema, t.name) {
            rt.block_on(async {
                let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&t.url)
                    .await
                    .unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                    .execute(&mut conn)
                    .await
                    .unwrap();
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
