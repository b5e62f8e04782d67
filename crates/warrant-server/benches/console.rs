//! The console's inbox with 10,000 pending approvals, in one process and one run:
//!
//! - **inbox**: `GET /console/approvals` through the whole router (session cookie → key →
//!   principal, the store's newest-first page, policy's review check for each request shown,
//!   the pending count, the HTML), server time from request to the last byte of the body;
//! - **ledger query**: the store's first ledger page (50 rows, newest first) of a tenant with
//!   10,000 rows, the query alone — the baseline the issue names;
//! - **approvals query**: the store's first page of pending approvals, the query alone.
//!
//! On SQLite (`synchronous=FULL`). Target of the console issue: the inbox's first page in
//! ≤ 20 ms p99.
//!
//! Run: `cargo bench -p warrant-server --bench console` (`WARRANT_BENCH_APPROVALS`, default
//! 10,000; `WARRANT_BENCH_ROUNDS`, default 300).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "benchmark"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};
use tower::ServiceExt;
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::records::{
    ApprovalFilter, ApprovalStatus, ConsoleSession, ConsoleSessionKind, LedgerDecision, LedgerEntry,
    LedgerFilter, NewApiKey, NewApproval,
};
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

const CONTRACT: &str = r#"
name: credit
version: 1
description: Apply a goodwill credit.
owner: bench
effect: write
scopes: [credits:write]
approval: per_call
idempotency: { honoured: true, retention: 24h }
input:
  type: object
  additionalProperties: false
  required: [customer_id, amount_cents]
  properties:
    customer_id: { type: string, maxLength: 20 }
    amount_cents: { type: integer, minimum: 1, maximum: 100000 }
output:
  type: object
  additionalProperties: false
  properties:
    credit_id: { type: string, maxLength: 40 }
"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn report(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!(
        "| {name} | {:.2} ms | {:.2} ms | {:.2} ms |",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3
    );
    (p50, p99)
}

fn main() {
    let approvals: usize = std::env::var("WARRANT_BENCH_APPROVALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let rounds: usize = std::env::var("WARRANT_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
                .await
                .unwrap(),
        );
        let contracts = dir.path().join("contracts");
        std::fs::create_dir_all(&contracts).unwrap();
        std::fs::write(contracts.join("credit.yaml"), CONTRACT).unwrap();
        let gateway = Gateway::start(GatewayConfig {
            store: store.clone(),
            contracts_dir: Some(contracts),
            policies: vec![PolicySource::new(
                "bench.cedar",
                r#"permit (principal in Warrant::Role::"supervisor", action in Warrant::Action::"review:credit", resource);"#,
            )],
            guards: Guards::new(),
            budgets: Default::default(),
            redaction: RedactionKey::new(vec![7; 32]).unwrap(),
            adapters: AdapterConfig {
                client: SafeClient::new(NetPolicy::default()),
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
        let state = gateway.state.clone();
        let contract_id = store
            .list_contracts()
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.name == "credit")
            .unwrap()
            .content_id;

        // 10,000 pending approvals and 10,000 ledger rows, written 64 at a time.
        let now = state.env.now();
        let started = Instant::now();
        for chunk in (0..approvals).collect::<Vec<_>>().chunks(64) {
            let mut tasks = Vec::new();
            for &i in chunk {
                let store = store.clone();
                let contract_id = contract_id.clone();
                tasks.push(tokio::spawn(async move {
                    let at = now - time::Duration::milliseconds(i64::try_from(i).unwrap());
                    store
                        .create_approval(&NewApproval {
                            id: format!("apr_{i:06}"),
                            tenant: "acme".into(),
                            contract_id: contract_id.clone(),
                            tool: "credit".into(),
                            proposer: format!("agent-{}", i % 7),
                            payload_digest: format!("sha256:{:064x}", i),
                            idempotency_key: Some(format!("k-{i}")),
                            arguments: json!({"customer_id": format!("cus_{i}"), "amount_cents": 100 + i}),
                            sealed_arguments: None,
                            created_at: at,
                            expires_at: now + time::Duration::hours(24),
                            reviewers: None,
                        })
                        .await
                        .unwrap();
                    let mut row = LedgerEntry::new(format!("led_{i:06}"), "acme", "agent-1", "trace", "credit", at);
                    row.decision = LedgerDecision::NeedsApproval;
                    row.contract_id = Some(contract_id);
                    row.approval_id = Some(format!("apr_{i:06}"));
                    store.insert_ledger(&row).await.unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
        eprintln!("seeded {approvals} approvals and ledger rows in {:?}", started.elapsed());

        // A supervisor's key and console session.
        let key = format!("wrn_{}_{}", "0123456789abcdef", "a".repeat(64));
        store
            .create_api_key(&NewApiKey {
                id: "0123456789abcdef".into(),
                key_hash: warrant_store::keys::hash_presented(&key).unwrap(),
                tenant: "acme".into(),
                principal: "sam".into(),
                grants: Vec::new(),
                roles: vec!["supervisor".into()],
                label: None,
                created_at: now,
            })
            .await
            .unwrap();
        let token = "b".repeat(64);
        store
            .create_console_session(&ConsoleSession {
                token_hash: hex::encode(Sha256::digest(token.as_bytes())),
                kind: ConsoleSessionKind::Session,
                key_hash: warrant_store::keys::hash_presented(&key).unwrap(),
                csrf: "c".repeat(64),
                created_at: now,
                expires_at: now + time::Duration::hours(8),
            })
            .await
            .unwrap();
        let app = warrant_server::router(state.clone(), gateway.limits);
        let inbox = || {
            axum::http::Request::get("/console/approvals")
                .header("cookie", format!("warrant_session={token}"))
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let first = app.clone().oneshot(inbox()).await.unwrap();
        assert_eq!(first.status(), 200);
        let html = axum::body::to_bytes(first.into_body(), usize::MAX).await.unwrap();
        assert!(String::from_utf8_lossy(&html).contains(" pending"));

        let mut page = Vec::with_capacity(rounds);
        let mut ledger = Vec::with_capacity(rounds);
        let mut pending = Vec::with_capacity(rounds);
        let mut counting = Vec::with_capacity(rounds);
        let mut reviewing = Vec::with_capacity(rounds);
        let reviewer = warrant_core::authority::Principal::new("sam", "acme", Vec::<String>::new())
            .unwrap()
            .with_roles(["supervisor".to_owned()])
            .unwrap();
        for _ in 0..rounds {
            let t = Instant::now();
            let r = app.clone().oneshot(inbox()).await.unwrap();
            let body = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap();
            page.push(t.elapsed());
            assert!(body.len() > 10_000);

            let t = Instant::now();
            let rows = store
                .list_ledger("acme", &LedgerFilter { limit: 50, ..LedgerFilter::default() })
                .await
                .unwrap();
            ledger.push(t.elapsed());
            assert_eq!(rows.entries.len(), 50);

            let t = Instant::now();
            let listed = store
                .page_approvals(
                    "acme",
                    &ApprovalFilter {
                        status: Some(ApprovalStatus::Pending),
                        limit: 50,
                        ..ApprovalFilter::default()
                    },
                    state.env.now(),
                )
                .await
                .unwrap();
            pending.push(t.elapsed());
            assert_eq!(listed.approvals.len(), 50);

            let t = Instant::now();
            let n = store
                .count_approvals("acme", ApprovalStatus::Pending, state.env.now(), warrant_server::console::pages::COUNT_AT_MOST)
                .await
                .unwrap();
            counting.push(t.elapsed());
            assert_eq!(n, (approvals as u64).min(u64::from(warrant_server::console::pages::COUNT_AT_MOST)));

            let t = Instant::now();
            let shown = state.authority.reviewable(&reviewer, listed.approvals).await.unwrap();
            reviewing.push(t.elapsed());
            assert_eq!(shown.len(), 50);
        }
        println!("SQLite, {approvals} pending approvals, {rounds} rounds, interleaved");
        println!("| measurement | p50 | p99 | max |");
        println!("|---|---|---|---|");
        let (lp50, lp99) = report("ledger query alone (first page, 50 rows)", ledger);
        report("pending approvals query alone (first page, 50)", pending);
        report("pending count alone", counting);
        report("policy's review check of 50 requests", reviewing);
        let (ip50, ip99) = report("inbox page, whole request (session, policy, count, HTML)", page);
        println!(
            "inbox ÷ ledger query: p50 {:.1}×, p99 {:.1}× (target: inbox p99 ≤ 20 ms)",
            ip50.as_secs_f64() / lp50.as_secs_f64(),
            ip99.as_secs_f64() / lp99.as_secs_f64()
        );
    });
}
