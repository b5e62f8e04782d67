//! Every probe of PRODUCT §3 as a typed rejection through `decide`, scope attenuation, the
//! idempotency-key rule and approval binding, over an in-memory store.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::macros::datetime;
use warrant_core::authority::{ApprovalRecord, ApprovalStatus, Principal};
use warrant_core::budget::BudgetConfig;
use warrant_core::canon::Sha256Digest;
use warrant_core::contract::DocumentFormat;
use warrant_core::decision::{ApprovalState, Decision, IdempotencyState};
use warrant_core::env::Env;
use warrant_core::guard::Guards;
use warrant_core::pipeline::{Authority, Call, Settings};
use warrant_core::policy::NoPolicy;
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::{Contract, ContractId, RejectCode, Stage};
use warrant_store::MemoryStore;

const CREDIT: &str = include_str!("../examples/contracts/create_support_credit.v1.yaml");
const LOOKUP: &str = include_str!("../examples/contracts/lookup_order.v1.yaml");
const NOW: OffsetDateTime = datetime!(2026-11-29 12:00 UTC);

fn credit() -> Contract {
    Contract::from_text(CREDIT, DocumentFormat::Yaml).unwrap()
}

fn agent() -> Principal {
    Principal::new("agent-7", "acme", ["support:credits:write".to_owned()]).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SchemaState {
    Valid,
    Invalid,
}

/// The facts of one decision, as the offline audit reports them.
struct Facts {
    schema: Option<SchemaState>,
    payload_digest: Option<Sha256Digest>,
    delegated_scopes: Option<Vec<String>>,
    idempotency: Option<IdempotencyState>,
    approval: Option<ApprovalState>,
}

struct Report {
    contract_id: ContractId,
    facts: Facts,
    decision: Decision,
}

struct FixedEnv(AtomicU64);

impl Env for FixedEnv {
    fn now(&self) -> OffsetDateTime {
        NOW
    }
    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.0.fetch_add(1, Ordering::Relaxed))
    }
}

/// Runs `decide` (the one pipeline) over an in-memory store holding `contract` and, if given,
/// the approval record.
fn run_with(
    contract: &Contract,
    proposal: &[u8],
    principal: &Principal,
    approval: Option<&ApprovalRecord>,
) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Arc::new(MemoryStore::new());
        let registry = Arc::new(Registry::new(store.clone(), time::Duration::days(1)));
        registry.register(contract.clone(), NOW).await.unwrap();
        if let Some(r) = approval {
            store
                .insert_approval(r.to_request(contract.name(), principal.id()))
                .unwrap();
        }
        let authority = Authority::new(
            store,
            registry,
            Arc::new(NoPolicy),
            Arc::new(Guards::new()),
            BudgetConfig::default(),
            RedactionKey::new(vec![1; 32]).unwrap(),
            Arc::new(FixedEnv(AtomicU64::new(1))),
            Settings::default(),
        );
        let call = Call {
            bytes: proposal,
            approval_id: approval.map(|a| a.id.as_str()),
            trace_id: "t",
            ..Call::default()
        };
        let d = authority.decide(principal, &call).await.unwrap();
        Report {
            contract_id: contract.id(),
            facts: Facts {
                schema: d.facts.schema.map(|v| {
                    if v {
                        SchemaState::Valid
                    } else {
                        SchemaState::Invalid
                    }
                }),
                payload_digest: d.facts.payload_digest,
                delegated_scopes: d.facts.delegated_scopes,
                idempotency: d.facts.idempotency,
                approval: d.facts.approval,
            },
            decision: d.decision,
        }
    })
}

fn run(proposal: &str) -> Report {
    run_with(&credit(), proposal.as_bytes(), &agent(), None)
}

fn args() -> Value {
    json!({"customer_id": "cus_8f3k2m9q", "amount_cents": 2500, "reason": "duplicate charge"})
}

fn proposal_with(arguments: Value) -> String {
    json!({"tool": "create_support_credit", "version": 1, "arguments": arguments, "idempotency_key": "k-1"})
        .to_string()
}

/// (stage, code, pointer) of a rejected report.
fn rejection(report: &Report) -> (Stage, RejectCode, Option<String>) {
    match &report.decision {
        Decision::Reject(r) => (r.stage(), r.code(), r.pointer().map(str::to_owned)),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn valid_proposal_needs_approval_without_a_record() {
    let report = run(&proposal_with(args()));
    assert_eq!(report.facts.schema, Some(SchemaState::Valid));
    assert_eq!(report.facts.idempotency, Some(IdempotencyState::RequiredPresent));
    assert_eq!(report.facts.approval, Some(ApprovalState::RequiredMissing));
    let Decision::NeedsApproval(needed) = &report.decision else {
        panic!("{:?}", report.decision)
    };
    assert_eq!(Some(needed.payload_digest), report.facts.payload_digest);
    assert_eq!(needed.idempotency_key.as_deref(), Some("k-1"));
}

/// Every refusal of PRODUCT §3, each with its stage, code and pointer.
#[test]
fn strict_parsing_probes() {
    let big = format!(
        r#"{{"tool":"create_support_credit","version":1,"arguments":{{"reason":"{}"}}}}"#,
        "a".repeat(70_000)
    );
    let deep = format!(
        r#"{{"tool":"create_support_credit","version":1,"arguments":{{"reason":{}1{}}}}}"#,
        "[".repeat(40),
        "]".repeat(40)
    );
    let stale = r#"{"tool":"create_support_credit","version":2,"arguments":{}}"#.to_owned();
    let wrong_id = format!(
        r#"{{"tool":"create_support_credit","contract":"tool-contract@sha256:{}","arguments":{{}}}}"#,
        "0".repeat(64)
    );
    let p = |s: &str| proposal_with(serde_json::from_str(s).unwrap());
    let raw = |args: &str| {
        format!(r#"{{"tool":"create_support_credit","version":1,"arguments":{args},"idempotency_key":"k"}}"#)
    };
    type Probe<'a> = (&'a str, Vec<u8>, Stage, RejectCode, Option<&'a str>);
    let cases: Vec<Probe> = vec![
        (
            "duplicate key at depth",
            raw(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":1,"amount_cents":2,"reason":"r"}"#).into_bytes(),
            Stage::Parse, RejectCode::DuplicateKey, Some("/arguments/amount_cents"),
        ),
        (
            "duplicate envelope key",
            br#"{"tool":"a","tool":"b","version":1,"arguments":{}}"#.to_vec(),
            Stage::Parse, RejectCode::DuplicateKey, Some("/tool"),
        ),
        (
            "integer overflow",
            raw(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":123456789012345678901234567890,"reason":"r"}"#).into_bytes(),
            Stage::Parse, RejectCode::NumberOutOfRange, Some("/arguments/amount_cents"),
        ),
        (
            "float overflow",
            raw(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":1e400,"reason":"r"}"#).into_bytes(),
            Stage::Parse, RejectCode::NumberOutOfRange, Some("/arguments/amount_cents"),
        ),
        (
            "float underflow",
            raw(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":1e-400,"reason":"r"}"#).into_bytes(),
            Stage::Parse, RejectCode::NumberOutOfRange, Some("/arguments/amount_cents"),
        ),
        (
            "NaN is not JSON",
            raw(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":NaN,"reason":"r"}"#).into_bytes(),
            Stage::Parse, RejectCode::InvalidJson, Some("/arguments/amount_cents"),
        ),
        (
            "fraction where integer",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":2500.0,"reason":"r"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaNotInteger, Some("/arguments/amount_cents"),
        ),
        (
            "exponent where integer",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":2.5e3,"reason":"r"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaNotInteger, Some("/arguments/amount_cents"),
        ),
        (
            "boolean where number",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":true,"reason":"r"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaTypeMismatch, Some("/arguments/amount_cents"),
        ),
        (
            "string where number",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":"2500","reason":"r"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaTypeMismatch, Some("/arguments/amount_cents"),
        ),
        (
            "unknown argument",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":1,"reason":"r","note":"x"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaUnknownField, Some("/arguments/note"),
        ),
        (
            "unknown envelope field",
            br#"{"tool":"create_support_credit","version":1,"arguments":{},"priority":"high"}"#.to_vec(),
            Stage::Parse, RejectCode::EnvelopeUnknownField, Some("/priority"),
        ),
        (
            "string over maxLength",
            p(&format!(r#"{{"customer_id":"cus_8f3k2m9q","amount_cents":1,"reason":"{}"}}"#, "r".repeat(501))).into_bytes(),
            Stage::Schema, RejectCode::SchemaStringTooLong, Some("/arguments/reason"),
        ),
        (
            "missing required",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":1}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaRequiredMissing, Some("/arguments/reason"),
        ),
        (
            "out of range",
            p(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":500001,"reason":"r"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaOutOfRange, Some("/arguments/amount_cents"),
        ),
        (
            "pattern",
            p(r#"{"customer_id":"CUS_X","amount_cents":1,"reason":"r"}"#).into_bytes(),
            Stage::Schema, RejectCode::SchemaPatternMismatch, Some("/arguments/customer_id"),
        ),
        ("payload over 64 KiB", big.into_bytes(), Stage::Parse, RejectCode::PayloadTooLarge, None),
        ("nesting over 32", deep.into_bytes(), Stage::Parse, RejectCode::NestingTooDeep, None),
        (
            "invalid UTF-8",
            b"{\"tool\":\"create_support_credit\",\"version\":1,\"arguments\":{\"reason\":\"\xc3\x28\"}}".to_vec(),
            Stage::Parse, RejectCode::InvalidUtf8, None,
        ),
        (
            "lone surrogate",
            raw(r#"{"customer_id":"cus_8f3k2m9q","amount_cents":1,"reason":"\udead"}"#).into_bytes(),
            Stage::Parse, RejectCode::LoneSurrogate, Some("/arguments/reason"),
        ),
        ("stale version", stale.into_bytes(), Stage::Contract, RejectCode::ContractVersionMismatch, Some("/version")),
        ("content id mismatch", wrong_id.into_bytes(), Stage::Contract, RejectCode::ContractIdMismatch, Some("/contract")),
        (
            "unknown tool",
            br#"{"tool":"delete_customer","version":1,"arguments":{}}"#.to_vec(),
            Stage::Contract, RejectCode::ContractNotFound, Some("/tool"),
        ),
        (
            "identity: tenant",
            br#"{"tool":"create_support_credit","version":1,"arguments":{},"tenant":"other"}"#.to_vec(),
            Stage::Identity, RejectCode::IdentityInProposal, Some("/tenant"),
        ),
        (
            "identity: principal",
            br#"{"tool":"create_support_credit","version":1,"arguments":{},"principal":"admin"}"#.to_vec(),
            Stage::Identity, RejectCode::IdentityInProposal, Some("/principal"),
        ),
        (
            "identity: scopes",
            br#"{"tool":"create_support_credit","version":1,"arguments":{},"scopes":["*"]}"#.to_vec(),
            Stage::Identity, RejectCode::IdentityInProposal, Some("/scopes"),
        ),
        ("not JSON", b"tool=create_support_credit".to_vec(), Stage::Parse, RejectCode::InvalidJson, Some("")),
        ("empty", Vec::new(), Stage::Parse, RejectCode::InvalidJson, Some("")),
    ];
    for (name, proposal, stage, code, pointer) in cases {
        let report = run_with(&credit(), &proposal, &agent(), None);
        let (got_stage, got_code, got_pointer) = rejection(&report);
        assert_eq!((got_stage, got_code), (stage, code), "{name}");
        if let Some(pointer) = pointer {
            assert_eq!(got_pointer.as_deref(), Some(pointer), "{name}");
        }
        // A refused proposal never reaches a later stage.
        if stage < Stage::Schema {
            assert_eq!(report.facts.schema, None, "{name}");
        }
        assert_eq!(report.facts.payload_digest, None, "{name}");
        assert_eq!(report.facts.approval, None, "{name}");
    }
}

#[test]
fn details_never_echo_argument_values() {
    let secret = "cus_SECRETVALUE";
    for args in [
        json!({"customer_id": secret, "amount_cents": 1, "reason": "r"}),
        json!({"customer_id": "cus_8f3k2m9q", "amount_cents": 1, "reason": secret.repeat(40)}),
        json!({"customer_id": "cus_8f3k2m9q", "amount_cents": secret, "reason": "r"}),
    ] {
        let report = run(&proposal_with(args));
        let Decision::Reject(r) = &report.decision else {
            panic!()
        };
        assert!(!r.detail().contains("SECRETVALUE"), "{}", r.detail());
    }
}

#[test]
fn scope_attenuation_denies_a_missing_scope() {
    let nobody = Principal::new("agent-7", "acme", ["orders:read".to_owned()]).unwrap();
    let report = run_with(&credit(), proposal_with(args()).as_bytes(), &nobody, None);
    assert_eq!(rejection(&report).1, RejectCode::ScopeMissing);
    assert!(report.facts.payload_digest.is_some());

    let broad = Principal::new(
        "agent-7",
        "acme",
        ["support:credits:write".into(), "orders:read".into()],
    )
    .unwrap();
    let report = run_with(&credit(), proposal_with(args()).as_bytes(), &broad, None);
    assert_eq!(
        report.facts.delegated_scopes,
        Some(vec!["support:credits:write".to_owned()])
    );
}

#[test]
fn missing_idempotency_key_is_refused_before_approval() {
    let proposal = json!({"tool": "create_support_credit", "version": 1, "arguments": args()}).to_string();
    let report = run(&proposal);
    assert_eq!(rejection(&report).1, RejectCode::IdempotencyKeyRequired);
    assert_eq!(report.facts.idempotency, Some(IdempotencyState::RequiredMissing));
    assert_eq!(
        report.facts.approval, None,
        "no approval may be requested without a key"
    );
}

#[test]
fn read_effects_need_neither_key_nor_approval() {
    let lookup = Contract::from_text(LOOKUP, DocumentFormat::Yaml).unwrap();
    let reader = Principal::new("agent-7", "acme", ["orders:read".to_owned()]).unwrap();
    let proposal = br#"{"tool":"lookup_order","version":1,"arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}"#;
    let report = run_with(&lookup, proposal, &reader, None);
    assert!(
        matches!(report.decision, Decision::Allow(_)),
        "{:?}",
        report.decision
    );
    assert_eq!(report.facts.idempotency, Some(IdempotencyState::NotRequired));
    assert_eq!(report.facts.approval, Some(ApprovalState::NotRequired));
}

fn approval_for(report: &Report) -> ApprovalRecord {
    ApprovalRecord {
        id: "apr_1".into(),
        contract_id: report.contract_id,
        tenant: "acme".into(),
        payload_digest: report.facts.payload_digest.unwrap(),
        idempotency_key: Some("k-1".into()),
        expires_at: NOW + time::Duration::minutes(15),
        status: ApprovalStatus::Approved,
        proposer: Some("agent-7".into()),
        reviewer: Some("supervisor-1".into()),
    }
}

#[test]
fn approval_binds_to_the_exact_call() {
    let proposal = proposal_with(args());
    let base = approval_for(&run(&proposal));
    let check = |record: &ApprovalRecord, proposal: &str| {
        let report = run_with(&credit(), proposal.as_bytes(), &agent(), Some(record));
        let code = match &report.decision {
            Decision::Reject(r) => Some(r.code()),
            _ => None,
        };
        (report.facts.approval.unwrap(), report.decision.as_str(), code)
    };
    assert_eq!(
        check(&base, &proposal),
        (ApprovalState::BoundToCall, "ALLOW", None)
    );

    let changed = proposal_with(
        json!({"customer_id": "cus_8f3k2m9q", "amount_cents": 250000, "reason": "duplicate charge"}),
    );
    assert_eq!(
        check(&base, &changed),
        (
            ApprovalState::Mismatch,
            "REJECT",
            Some(RejectCode::ApprovalMismatch)
        ),
        "a changed payload needs a new approval"
    );
    let cases: Vec<(ApprovalRecord, ApprovalState, Option<RejectCode>)> = vec![
        (
            ApprovalRecord {
                tenant: "globex".into(),
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalNotFound),
        ),
        (
            ApprovalRecord {
                idempotency_key: Some("k-2".into()),
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalMismatch),
        ),
        (
            ApprovalRecord {
                idempotency_key: None,
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalMismatch),
        ),
        (
            ApprovalRecord {
                proposer: Some("agent-8".into()),
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalMismatch),
        ),
        (
            ApprovalRecord {
                reviewer: Some("agent-7".into()),
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalSelfApproved),
        ),
        (
            ApprovalRecord {
                expires_at: NOW,
                ..base.clone()
            },
            ApprovalState::Expired,
            Some(RejectCode::ApprovalExpired),
        ),
        (
            ApprovalRecord {
                status: ApprovalStatus::Expired,
                ..base.clone()
            },
            ApprovalState::Expired,
            Some(RejectCode::ApprovalExpired),
        ),
        // Consumed, presented again with its key: the same operation, bound at the decision;
        // the store answers its recorded outcome or refuses (it never runs twice).
        (
            ApprovalRecord {
                status: ApprovalStatus::Consumed,
                ..base.clone()
            },
            ApprovalState::BoundToCall,
            None,
        ),
        // Consumed by another operation (another key): refused.
        (
            ApprovalRecord {
                status: ApprovalStatus::Consumed,
                idempotency_key: Some("k-other".into()),
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalConsumed),
        ),
        (
            ApprovalRecord {
                status: ApprovalStatus::Rejected,
                ..base.clone()
            },
            ApprovalState::Mismatch,
            Some(RejectCode::ApprovalRejected),
        ),
        (
            ApprovalRecord {
                status: ApprovalStatus::Pending,
                ..base.clone()
            },
            ApprovalState::RequiredMissing,
            None,
        ),
    ];
    for (record, state, code) in cases {
        let (got_state, _, got_code) = check(&record, &proposal);
        assert_eq!((got_state, got_code), (state, code), "{record:?}");
    }
    let mut other_contract = base.clone();
    other_contract.contract_id =
        ContractId::parse(&format!("tool-contract@sha256:{}", "1".repeat(64))).unwrap();
    assert_eq!(check(&other_contract, &proposal).0, ApprovalState::Mismatch);

    // The proposal may name the approval it presents; it must be this one.
    let naming = json!({"tool": "create_support_credit", "version": 1, "arguments": args(),
                        "idempotency_key": "k-1", "approval": "apr_other"})
    .to_string();
    assert_eq!(check(&base, &naming).2, Some(RejectCode::ApprovalMismatch));
}

#[test]
fn approval_records_are_read_strictly() {
    let good = json!({
        "id": "apr_1", "contract_id": format!("tool-contract@sha256:{}", "a".repeat(64)),
        "tenant": "acme", "payload_digest": format!("sha256:{}", "b".repeat(64)),
        "idempotency_key": "k", "expires_at": "2026-11-29T12:15:00Z", "status": "approved",
        "reviewer": "supervisor-1"
    });
    assert!(ApprovalRecord::from_value(&good).is_ok());
    for (field, bad) in [
        ("status", json!("maybe")),
        ("expires_at", json!("tomorrow")),
        ("payload_digest", json!("sha256:xyz")),
        ("contract_id", json!("create_support_credit@1")),
        ("extra", json!(1)),
    ] {
        let mut doc = good.clone();
        doc[field] = bad;
        assert!(ApprovalRecord::from_value(&doc).is_err(), "{field}");
    }
}

#[test]
fn payload_digest_is_canonical() {
    let a = run(
        r#"{"tool":"create_support_credit","version":1,"idempotency_key":"k","arguments":{"reason":"r","amount_cents":25,"customer_id":"cus_8f3k2m9q"}}"#,
    );
    let b = run(
        r#"{ "arguments" : { "customer_id" : "cus_8f3k2m9q" , "amount_cents" : 25 , "reason" : "\u0072" }, "version": 1, "tool": "create_support_credit", "idempotency_key":"k" }"#,
    );
    assert!(a.facts.payload_digest.is_some());
    assert_eq!(a.facts.payload_digest, b.facts.payload_digest);
    let expected =
        warrant_core::canon::digest(&json!({"reason":"r","amount_cents":25,"customer_id":"cus_8f3k2m9q"}));
    assert_eq!(a.facts.payload_digest, Some(expected));
}

/// docs/proposals.md documents every code; this fails when a code is added without docs.
#[test]
fn every_code_is_documented() {
    let docs = include_str!("../docs/proposals.md");
    for code in RejectCode::ALL {
        assert!(
            docs.contains(&format!("`{}`", code.as_str())),
            "{code} is not in docs/proposals.md"
        );
    }
    for code in warrant_core::ToolErrorCode::ALL {
        assert!(
            docs.contains(&format!("`{}`", code.as_str())),
            "{code} is not in docs/proposals.md"
        );
    }
}
