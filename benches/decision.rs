//! The decision on the example contract, in one criterion run, beside its peers and floors:
//!
//! - `floor_parse_hash`: bare `serde_json` parse plus SHA-256 of the proposal bytes;
//! - `rego_rule`: the same authorization rule written in Rego, evaluated with `regorus` (input
//!   built from already-parsed arguments — the policy evaluation alone);
//! - `cedar_policy`: Warrant's Cedar policy evaluation alone;
//! - `decide_memory`: Warrant's full `decide` (strict parse → registry → schema → canonical
//!   digest → Cedar → scopes → idempotency read → budget reservation → allow) over the
//!   in-memory store;
//! - `decide_sqlite`: the same decision over the embedded SQLite store (one read and one
//!   durable write transaction, `synchronous=FULL`).
//!
//! The contract is `create_support_credit` as in `examples/`, registered as version 2 with
//! `approval: none` and a budget large enough not to run out, so every iteration takes the
//! `allow` path. Run: `cargo bench --bench decision`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "benchmark"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use sha2::Digest;
use time::OffsetDateTime;
use warrant_core::Contract;
use warrant_core::authority::Principal;
use warrant_core::budget::BudgetConfig;
use warrant_core::contract::DocumentFormat;
use warrant_core::decision::Decision;
use warrant_core::env::Env;
use warrant_core::guard::Guards;
use warrant_core::pipeline::{Authority, Call, Settings};
use warrant_core::policy::{PolicyAction, PolicyEngine, PolicyRequest, PolicyVerdict};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::store::Store;
use warrant_policy::{CedarEngine, PolicySource};
use warrant_store::{DatabaseUrl, MemoryStore, SqlStore, StoreOptions};

const CONTRACT: &str = include_str!("../examples/contracts/create_support_credit.v1.yaml");
const POLICY: &str = include_str!("../examples/policies/support.cedar");
const PROPOSAL: &[u8] = br#"{"tool":"create_support_credit","version":2,"arguments":{"customer_id":"cus_8f3k2m9q","amount_cents":2500,"reason":"Refund for duplicate charge on invoice 1042"},"idempotency_key":"credit-cus_8f3k2m9q-inv1042"}"#;

const REGO: &str = r#"
package warrant

default allow := false

allow if {
    "operator" in input.principal.roles
    input.resource.tenant == input.principal.tenant
    input.action == "create_support_credit"
    input.context.amount_cents <= 50000
}

allow if {
    "supervisor" in input.principal.roles
    input.resource.tenant == input.principal.tenant
    input.action == "create_support_credit"
}
"#;

// The allocator the `warrant` binary runs with (see src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct BenchEnv(AtomicU64);

impl Env for BenchEnv {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}_{:012}", self.0.fetch_add(1, Ordering::Relaxed))
    }
}

fn bench_contract() -> Contract {
    let text = CONTRACT
        .replace("version: 1", "version: 2")
        .replace("approval: per_call ", "approval: none     ")
        .replace("calls_per_day: 200", "calls_per_day: 1000000000000");
    Contract::from_text(&text, DocumentFormat::Yaml).unwrap()
}

async fn authority(store: Arc<dyn Store>, contract: &Contract, policy: Arc<CedarEngine>) -> Authority {
    let registry = Arc::new(Registry::new(store.clone(), time::Duration::hours(1)));
    registry
        .register(contract.clone(), OffsetDateTime::now_utc())
        .await
        .unwrap();
    Authority::new(
        store,
        registry,
        policy,
        Arc::new(Guards::new()),
        BudgetConfig::default(),
        RedactionKey::new(vec![3; 32]).unwrap(),
        Arc::new(BenchEnv(AtomicU64::new(0))),
        Settings::default(),
    )
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let contract = bench_contract();
    let contracts = [Arc::new(contract.clone())];
    let policy =
        Arc::new(CedarEngine::new(&contracts, &[PolicySource::new("support.cedar", POLICY)]).unwrap());
    let principal = Principal::new("agent-7", "acme", ["support:credits:write".to_owned()])
        .unwrap()
        .with_roles(["operator".to_owned()])
        .unwrap();
    let memory = rt.block_on(authority(Arc::new(MemoryStore::new()), &contract, policy.clone()));
    let dir = tempfile::tempdir().unwrap();
    let sqlite_store = rt
        .block_on(SqlStore::open(
            &DatabaseUrl::data_dir(dir.path()),
            &StoreOptions::default(),
        ))
        .unwrap();
    let sqlite = rt.block_on(authority(Arc::new(sqlite_store), &contract, policy.clone()));
    let call = Call {
        bytes: PROPOSAL,
        trace_id: "bench",
        ..Call::default()
    };
    for a in [&memory, &sqlite] {
        let d = rt.block_on(a.decide(&principal, &call)).unwrap();
        assert!(matches!(d.decision, Decision::Allow(_)), "{:?}", d.decision);
    }

    let arguments: serde_json::Value =
        serde_json::from_slice::<serde_json::Value>(PROPOSAL).unwrap()["arguments"].clone();
    let args_map = arguments.as_object().unwrap().clone();
    assert_eq!(
        policy.authorize(&PolicyRequest {
            principal: &principal,
            action: PolicyAction::Invoke,
            contract: &contract,
            arguments: &args_map
        }),
        PolicyVerdict::Allow
    );
    let mut rego = regorus::Engine::new();
    rego.add_policy("warrant.rego".into(), REGO.into()).unwrap();
    let rego_input = |args: &serde_json::Value| {
        regorus::Value::from(serde_json::json!({
            "principal": {"id": "agent-7", "tenant": "acme", "roles": ["operator"]},
            "action": "create_support_credit",
            "resource": {"name": "create_support_credit", "version": 2, "effect": "write", "tenant": "acme"},
            "context": args,
        }))
    };
    rego.set_input(rego_input(&arguments));
    assert_eq!(
        rego.eval_rule("data.warrant.allow".into()).unwrap(),
        regorus::Value::from(true)
    );

    let mut group = c.benchmark_group("decision");
    group.bench_function("floor_parse_hash", |b| {
        b.iter(|| {
            let v = serde_json::from_slice::<serde_json::Value>(black_box(PROPOSAL)).unwrap();
            (v, sha2::Sha256::digest(black_box(PROPOSAL)))
        })
    });
    group.bench_function("rego_rule", |b| {
        b.iter(|| {
            rego.set_input(rego_input(black_box(&arguments)));
            rego.eval_rule("data.warrant.allow".into()).unwrap()
        })
    });
    group.bench_function("cedar_policy", |b| {
        b.iter(|| {
            policy.authorize(black_box(&PolicyRequest {
                principal: &principal,
                action: PolicyAction::Invoke,
                contract: &contract,
                arguments: &args_map,
            }))
        })
    });
    group.bench_function("decide_memory", |b| {
        b.iter(|| {
            rt.block_on(memory.decide(black_box(&principal), black_box(&call)))
                .unwrap()
        })
    });
    group.bench_function("decide_sqlite", |b| {
        b.iter(|| {
            rt.block_on(sqlite.decide(black_box(&principal), black_box(&call)))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
