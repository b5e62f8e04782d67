//! The decision pipeline on untrusted bytes: `pipeline::Authority::decide`, the single entry
//! point every lane calls, over a fresh in-memory store per input (what `warrant check` does).
//!
//! Setup (built once): the three example contracts registered, a principal `agent-7` of
//! tenant `acme` holding every scope they need, no policy engine, the allow-list
//! `email_recipients = *@customer.example, ops@partner.example` for `acme`, and the approved
//! example approval `apr_01JDEMO…` (bound to the example `create_support_credit` call).
//! The input bytes are the proposal; no transport key or approval id is added.
//!
//! Invariants checked on every input:
//! - `decide` never panics and never fails (the memory store does not fail);
//! - anything that got past the parse stage is valid UTF-8 and valid JSON for `serde_json`,
//!   which reads the same value as the strict parser, and is an object;
//! - no contract is resolved before the contract stage; a schema-stage refusal records the
//!   schema as invalid and no digest; a payload digest is SHA-256 of the RFC 8785 canonical
//!   bytes of `arguments`;
//! - SCOPE_MISSING and POLICY_DENIED never happen (full grants, no policy);
//! - guard: once past the guard stage, every `to`/`cc` recipient of `send_email` is on the
//!   allow-list by an independent check (one `@`, domain or exact address match);
//! - ledger: every REJECT and NEEDS_APPROVAL has its ledger row (same stage, code, digest,
//!   tenant, principal), with the sensitive `body` redacted; ALLOW writes none here;
//! - NEEDS_APPROVAL: a pending approval request exists for exactly this contract, payload
//!   digest and idempotency key;
//! - ALLOW: canonical arguments and digest agree with the input, delegated scopes are the
//!   contract's; an approval-bound ALLOW uses the example approval, whose contract, payload
//!   digest and key are exactly the call's, and consumes it.

#![no_main]

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Waker};

use common::{same_json, show};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use time::{Duration, OffsetDateTime};
use warrant_core::authority::{ApprovalRecord, ApprovalStatus, Principal};
use warrant_core::budget::BudgetConfig;
use warrant_core::canon::{Sha256Digest, canonical_bytes};
use warrant_core::contract::{ApprovalMode, DocumentFormat};
use warrant_core::decision::Decision;
use warrant_core::env::Env;
use warrant_core::guard::{AllowList, Guards};
use warrant_core::json::{self, Limits};
use warrant_core::pipeline::{Authority, Call, Decided, Settings};
use warrant_core::policy::NoPolicy;
use warrant_core::records::{ApprovalRequest, LedgerDecision, NewApproval};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::store::Store;
use warrant_core::{Contract, RejectCode, Stage};
use warrant_store::MemoryStore;

const TENANT: &str = "acme";
const PRINCIPAL_ID: &str = "agent-7";

/// Before every example contract's `retire_after` and the example approval's expiry.
static NOW: LazyLock<OffsetDateTime> = LazyLock::new(|| OffsetDateTime::UNIX_EPOCH + Duration::days(20_000));

fn load(text: &str) -> Contract {
    match Contract::from_text(text, DocumentFormat::Yaml) {
        Ok(c) => c,
        Err(e) => panic!("example contract does not load: {e:?}"),
    }
}

static CONTRACTS: LazyLock<Vec<Contract>> = LazyLock::new(|| {
    vec![
        load(include_str!(
            "../../examples/contracts/create_support_credit.v1.yaml"
        )),
        load(include_str!("../../examples/contracts/lookup_order.v1.yaml")),
        load(include_str!("../../examples/contracts/send_email.v1.yaml")),
    ]
});

static PRINCIPAL: LazyLock<Principal> = LazyLock::new(|| {
    let grants = ["support:credits:write", "orders:read", "email:send"].map(str::to_owned);
    match Principal::new(PRINCIPAL_ID, TENANT, grants) {
        Ok(p) => p,
        Err(e) => panic!("principal: {e}"),
    }
});

const ALLOWED_DOMAIN: &str = "customer.example";
const ALLOWED_EXACT: &str = "ops@partner.example";

static GUARDS: LazyLock<Arc<Guards>> = LazyLock::new(|| {
    let list = match AllowList::new([format!("*@{ALLOWED_DOMAIN}").as_str(), ALLOWED_EXACT]) {
        Ok(l) => l,
        Err(e) => panic!("allow-list: {e}"),
    };
    let mut guards = Guards::new();
    guards.set(TENANT, "email_recipients", list);
    Arc::new(guards)
});

static APPROVAL: LazyLock<ApprovalRecord> = LazyLock::new(|| {
    let text = include_bytes!("../../examples/approvals/create_support_credit.approved.json");
    let value = match json::parse(text, Limits::DOCUMENT) {
        Ok(v) => v,
        Err(e) => panic!("example approval: {e}"),
    };
    match ApprovalRecord::from_value(&value) {
        Ok(r) => r,
        Err(e) => panic!("example approval: {e}"),
    }
});

/// The stored form of the example approval (as `warrant check --approval` stores it).
fn approval_request(record: &ApprovalRecord) -> ApprovalRequest {
    ApprovalRequest {
        request: NewApproval {
            id: record.id.clone(),
            tenant: record.tenant.clone(),
            contract_id: record.contract_id.to_string(),
            tool: "create_support_credit".to_owned(),
            proposer: record.proposer.clone().unwrap_or_else(|| PRINCIPAL_ID.to_owned()),
            payload_digest: record.payload_digest.to_string(),
            idempotency_key: record.idempotency_key.clone(),
            arguments: Value::Null,
            created_at: record.expires_at - Duration::minutes(15),
            expires_at: record.expires_at,
        },
        status: record.status,
        reviewer: record.reviewer.clone(),
        reason: None,
        decided_at: None,
        consumed_at: None,
        consumed_by: None,
    }
}

/// A fixed clock and sequential ids: every run is reproducible.
struct FixedEnv {
    next: AtomicU64,
}

impl Env for FixedEnv {
    fn now(&self) -> OffsetDateTime {
        *NOW
    }
    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}_fuzz{:06}", self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// Drives a future that never really waits (the memory store answers at once).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("a pipeline future kept waiting: the harness needs a store that never blocks")
}

struct World {
    store: Arc<MemoryStore>,
    authority: Authority,
}

fn world() -> World {
    let store = Arc::new(MemoryStore::new());
    let registry = Arc::new(Registry::new(store.clone(), Duration::days(1)));
    for contract in CONTRACTS.iter() {
        if let Err(e) = block_on(registry.register(contract.clone(), *NOW)) {
            panic!("register {}: {e}", contract.name());
        }
    }
    if let Err(e) = store.insert_approval(approval_request(&APPROVAL)) {
        panic!("insert approval: {e}");
    }
    let Some(redaction) = RedactionKey::new(vec![0x5a; 32]) else {
        panic!("redaction key")
    };
    let authority = Authority::new(
        store.clone(),
        registry,
        Arc::new(NoPolicy),
        GUARDS.clone(),
        BudgetConfig::default(),
        redaction,
        Arc::new(FixedEnv {
            next: AtomicU64::new(1),
        }),
        Settings {
            limits: Limits::PROPOSAL,
            ..Settings::default()
        },
    );
    World { store, authority }
}

fuzz_target!(|data: &[u8]| {
    let world = world();
    let call = Call {
        bytes: data,
        trace_id: "fuzz",
        ..Call::default()
    };
    let decided = match block_on(world.authority.decide(&PRINCIPAL, &call)) {
        Ok(d) => d,
        Err(e) => panic!("decide failed on the memory store ({e}) for {}", show(data)),
    };
    if *TRACE {
        eprintln!(
            "{} {:?} ledger={}",
            decided.decision.as_str(),
            decided.decision,
            decided.ledger_id
        );
    }
    check(&world, data, &decided);
});

/// Reported findings not fixed yet can be skipped to keep fuzzing past them:
/// `WARRANT_FUZZ_SKIP=name[,name…]`. Every check runs by default.
static SKIP: LazyLock<Vec<String>> = LazyLock::new(|| {
    std::env::var("WARRANT_FUZZ_SKIP")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
});

fn skipped(name: &str) -> bool {
    SKIP.iter().any(|s| s == name)
}

/// docs/fuzzing.md finding 1: an `approval` id in a proposal for a contract with
/// `approval: none` comes back, unchecked, as `Allowed::approval_id()`.
const APPROVAL_ID_WITHOUT_APPROVAL: &str = "approval-id-without-approval";

/// `WARRANT_FUZZ_TRACE=1` prints each decision (for replaying a corpus or a crash by hand).
static TRACE: LazyLock<bool> = LazyLock::new(|| std::env::var_os("WARRANT_FUZZ_TRACE").is_some());

/// The guard's oracle, written independently of `guard.rs`: exactly one `@`, a non-empty
/// local part, and the domain (or the whole address) on the list, compared case-insensitively.
fn on_allow_list(address: &str) -> bool {
    let mut parts = address.split('@');
    let (Some(local), Some(domain), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !local.is_empty() && (domain.to_lowercase() == ALLOWED_DOMAIN || address.to_lowercase() == ALLOWED_EXACT)
}

fn check(world: &World, data: &[u8], decided: &Decided) {
    let facts = &decided.facts;
    let decision = &decided.decision;
    let ctx = || format!("decision {}, input {}", decision.as_str(), show(data));
    let stage = match decision {
        Decision::Reject(r) => Some(r.stage()),
        _ => None,
    };

    // Ledger: every refusal and hold is recorded here; an allowed call is not (yet).
    let row = match block_on(world.store.get_ledger(TENANT, &decided.ledger_id)) {
        Ok(row) => row,
        Err(e) => panic!("get_ledger: {e}"),
    };
    match (decision, &row) {
        (Decision::Allow(_), None) => {}
        (Decision::Allow(_), Some(_)) => panic!("ALLOW wrote its ledger row before the attempt: {}", ctx()),
        (_, None) => panic!("no ledger row for a {}: {}", decision.as_str(), ctx()),
        (Decision::Reject(r), Some(row)) => {
            assert_eq!(row.decision, LedgerDecision::Reject, "{}", ctx());
            assert_eq!(row.stage.as_deref(), Some(r.stage().as_str()), "{}", ctx());
            assert_eq!(row.error_code.as_deref(), Some(r.code().as_str()), "{}", ctx());
        }
        (Decision::NeedsApproval(n), Some(row)) => {
            assert_eq!(row.decision, LedgerDecision::NeedsApproval, "{}", ctx());
            assert_eq!(row.approval_id, n.request_id, "{}", ctx());
        }
    }
    if let Some(row) = &row {
        assert_eq!(row.tenant, TENANT, "{}", ctx());
        assert_eq!(row.principal, PRINCIPAL_ID, "{}", ctx());
        assert_eq!(
            row.payload_digest,
            facts.payload_digest.map(|d| d.to_string()),
            "{}",
            ctx()
        );
    }

    if stage == Some(Stage::Parse) {
        assert!(
            facts.contract.is_none(),
            "contract resolved before a parse refusal: {}",
            ctx()
        );
        return;
    }

    // Past the parse stage: the bytes are UTF-8 JSON for an independent parser as well.
    assert!(
        std::str::from_utf8(data).is_ok(),
        "non-UTF-8 input got past the parse stage: {}",
        ctx()
    );
    let independent: Value = match serde_json::from_slice(data) {
        Ok(v) => v,
        Err(e) => panic!(
            "input serde_json refuses ({e}) got past the parse stage: {}",
            ctx()
        ),
    };
    let strict = match json::parse(data, Limits::PROPOSAL) {
        Ok(v) => v,
        Err(e) => panic!(
            "strict parser refuses ({e}) an input that got past the parse stage: {}",
            ctx()
        ),
    };
    assert!(
        same_json(&independent, &strict),
        "serde_json and the strict parser disagree: {}",
        ctx()
    );
    assert!(
        strict.is_object(),
        "a non-object got past the parse stage: {}",
        ctx()
    );

    if matches!(stage, Some(Stage::Identity | Stage::Contract)) {
        assert!(
            facts.schema.is_none(),
            "schema verdict before the schema stage: {}",
            ctx()
        );
    }
    if let Decision::Reject(r) = decision {
        assert!(
            r.code() != RejectCode::ScopeMissing,
            "SCOPE_MISSING with full grants: {}",
            ctx()
        );
        assert!(
            r.code() != RejectCode::PolicyDenied,
            "POLICY_DENIED without a policy: {}",
            ctx()
        );
        if r.stage() == Stage::Schema {
            assert_eq!(facts.schema, Some(false), "{}", ctx());
            assert!(facts.payload_digest.is_none(), "{}", ctx());
        }
    }
    let Some(contract) = facts.contract.as_ref() else {
        assert!(
            matches!(
                stage,
                Some(Stage::Identity | Stage::Contract | Stage::Idempotency)
            ),
            "no contract resolved, yet the decision is {}: {}",
            decision.as_str(),
            ctx()
        );
        return;
    };
    assert_eq!(
        strict.get("tool").and_then(Value::as_str),
        Some(contract.name()),
        "{}",
        ctx()
    );

    // The payload digest is SHA-256 of the canonical arguments as the strict parser read them.
    let arguments = strict.get("arguments");
    if let Some(digest) = facts.payload_digest {
        assert_eq!(facts.schema, Some(true), "{}", ctx());
        let expected = arguments.map(|a| Sha256Digest::of_bytes(&canonical_bytes(a)));
        assert_eq!(
            Some(digest),
            expected,
            "payload digest is not SHA-256 of the canonical arguments: {}",
            ctx()
        );
    }

    // Redaction: the sensitive `body` never reaches the ledger as written.
    if let (Some(row), Some(body)) = (&row, arguments.and_then(|a| a.get("body")))
        && let Some(logged) = row.arguments.as_ref().and_then(|a| a.get("body"))
    {
        assert!(
            logged != body,
            "the sensitive body reached the ledger unredacted: {}",
            ctx()
        );
    }

    // Guard: once the guard stage has passed, every recipient is on the allow-list.
    let past_guard = facts.delegated_scopes.is_some() && stage != Some(Stage::Guard);
    if past_guard && contract.name() == "send_email" {
        for field in ["to", "cc"] {
            let values = arguments.and_then(|a| a.get(field)).and_then(Value::as_array);
            for address in values.into_iter().flatten() {
                let address = address.as_str().unwrap_or_default();
                assert!(
                    on_allow_list(address),
                    "recipient {address:?} passed the guard: {}",
                    ctx()
                );
            }
        }
    }

    match decision {
        Decision::Reject(_) => {}
        Decision::NeedsApproval(needed) => {
            assert_eq!(contract.approval(), ApprovalMode::PerCall, "{}", ctx());
            assert_eq!(needed.contract_id, contract.id(), "{}", ctx());
            assert_eq!(Some(needed.payload_digest), facts.payload_digest, "{}", ctx());
            let key = strict.get("idempotency_key").and_then(Value::as_str);
            assert_eq!(
                needed.idempotency_key.as_deref(),
                key,
                "approval binds another key: {}",
                ctx()
            );
            let Some(id) = needed.request_id.as_deref() else {
                panic!("NEEDS_APPROVAL without a stored request: {}", ctx())
            };
            let request = match block_on(world.store.get_approval(TENANT, id, *NOW)) {
                Ok(Some(r)) => r,
                other => panic!("approval request {id} not stored ({other:?}): {}", ctx()),
            };
            assert_eq!(request.status, ApprovalStatus::Pending, "{}", ctx());
            assert_eq!(
                request.request.contract_id,
                contract.id().to_string(),
                "{}",
                ctx()
            );
            assert_eq!(
                request.request.payload_digest,
                needed.payload_digest.to_string(),
                "{}",
                ctx()
            );
            assert_eq!(request.request.idempotency_key.as_deref(), key, "{}", ctx());
            assert_eq!(request.request.proposer, PRINCIPAL_ID, "{}", ctx());
        }
        Decision::Allow(allowed) => {
            let proposal = allowed.proposal();
            let canonical = arguments.map(canonical_bytes);
            assert_eq!(
                Some(proposal.canonical_arguments()),
                canonical.as_deref(),
                "{}",
                ctx()
            );
            assert_eq!(Some(proposal.payload_digest()), facts.payload_digest, "{}", ctx());
            assert_eq!(proposal.contract_id(), contract.id(), "{}", ctx());
            assert_eq!(allowed.contract().id(), contract.id(), "{}", ctx());
            let scopes: Vec<&str> = allowed.delegated_scopes().iter().collect();
            let expected: Vec<&str> = contract.scopes().iter().map(String::as_str).collect();
            assert_eq!(
                scopes,
                expected,
                "delegated scopes are not grant ∩ contract: {}",
                ctx()
            );
            if !skipped(APPROVAL_ID_WITHOUT_APPROVAL) {
                assert_eq!(
                    allowed.approval_id(),
                    allowed.ledger_entry().approval_id.as_deref(),
                    "the ALLOW's approval id differs from its ledger row's: {}",
                    ctx()
                );
            }
            match contract.approval() {
                ApprovalMode::None => assert!(
                    skipped(APPROVAL_ID_WITHOUT_APPROVAL) || allowed.approval_id().is_none(),
                    "ALLOW of an approval-less contract reports approval {:?}: {}",
                    allowed.approval_id(),
                    ctx()
                ),
                ApprovalMode::PerCall => {
                    let record = &*APPROVAL;
                    assert_eq!(allowed.approval_id(), Some(record.id.as_str()), "{}", ctx());
                    assert_eq!(
                        record.contract_id,
                        contract.id(),
                        "approval of another contract: {}",
                        ctx()
                    );
                    assert_eq!(
                        record.payload_digest,
                        proposal.payload_digest(),
                        "approval bound to another payload: {}",
                        ctx()
                    );
                    assert_eq!(
                        record.idempotency_key.as_deref(),
                        proposal.idempotency_key(),
                        "approval bound to another idempotency key: {}",
                        ctx()
                    );
                    match block_on(world.store.get_approval(TENANT, &record.id, *NOW)) {
                        Ok(Some(r)) => assert_eq!(r.status, ApprovalStatus::Consumed, "{}", ctx()),
                        other => panic!("approval vanished ({other:?}): {}", ctx()),
                    }
                }
            }
        }
    }
}
