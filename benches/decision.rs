//! The offline decision on the example contract, beside its floors, in one criterion run:
//! bare `serde_json` parse and bare SHA-256 of the same bytes, then the strict parser, the
//! canonical digest, and the full decision (parse → validate → digest → scopes → idempotency →
//! approval binding) that `warrant check` runs.
//!
//! Run: `cargo bench --bench decision`. Compare the medians as ratios to the floors.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "benchmark setup"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sha2::Digest;
use warrant_core::authority::{ApprovalRecord, Principal};
use warrant_core::canon;
use warrant_core::check::{CheckInput, evaluate};
use warrant_core::contract::DocumentFormat;
use warrant_core::decision::Decision;
use warrant_core::json::{self, Limits};
use warrant_core::{Contract, proposal::Envelope};

const CONTRACT: &str = include_str!("../examples/contracts/create_support_credit.v1.yaml");
const PROPOSAL: &[u8] = include_bytes!("../examples/proposals/create_support_credit.json");
const APPROVAL: &[u8] = include_bytes!("../examples/approvals/create_support_credit.approved.json");

fn bench(c: &mut Criterion) {
    let contract = Contract::from_text(CONTRACT, DocumentFormat::Yaml).unwrap();
    let principal = Principal::new("agent-7", "acme", ["support:credits:write".to_owned()]).unwrap();
    let approval = ApprovalRecord::from_value(&json::parse(APPROVAL, Limits::DOCUMENT).unwrap()).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let input = CheckInput {
        contract: &contract,
        proposal: PROPOSAL,
        principal: &principal,
        approval: Some(&approval),
        now,
        limits: Limits::PROPOSAL,
    };
    assert!(matches!(evaluate(&input).decision, Decision::Allow(_)));
    let arguments = json::parse(PROPOSAL, Limits::PROPOSAL).unwrap()["arguments"].clone();

    let mut group = c.benchmark_group("decision");
    group.bench_function("floor_serde_json_parse", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(PROPOSAL)).unwrap())
    });
    group.bench_function("floor_sha256", |b| {
        b.iter(|| sha2::Sha256::digest(black_box(PROPOSAL)))
    });
    group.bench_function("strict_parse", |b| {
        b.iter(|| json::parse(black_box(PROPOSAL), Limits::PROPOSAL).unwrap())
    });
    group.bench_function("envelope_parse", |b| {
        b.iter(|| Envelope::parse(black_box(PROPOSAL), Limits::PROPOSAL).unwrap())
    });
    group.bench_function("schema_validate", |b| {
        b.iter(|| contract.input_schema().is_valid(black_box(&arguments)))
    });
    group.bench_function("canonical_digest", |b| {
        b.iter(|| canon::digest(black_box(&arguments)))
    });
    group.bench_function("full_offline_decision", |b| {
        b.iter(|| evaluate(black_box(&input)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
