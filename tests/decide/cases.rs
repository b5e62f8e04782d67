//! `decide` end to end: each case runs against every store backend.

use std::sync::Arc;

use serde_json::{Value, json};
use time::Duration;
use warrant_core::decision::{ApprovalState, Decision};
use warrant_core::env::Env;
use warrant_core::pipeline::{Call, Decided, ReviewRefusal};
use warrant_core::records::*;
use warrant_core::{RejectCode, Stage};

use crate::support::*;

fn rejection(d: &Decided) -> (Stage, RejectCode) {
    match &d.decision {
        Decision::Reject(r) => (r.stage(), r.code()),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn approval_id(d: &Decided) -> String {
    match &d.decision {
        Decision::NeedsApproval(n) => n.request_id.clone().unwrap(),
        other => panic!("expected needs_approval, got {other:?}"),
    }
}

fn with_approval(mut proposal: Value, id: &str) -> Value {
    proposal["approval"] = json!(id);
    proposal
}

/// Simulates the runtime's write-ahead commit of an allowed call: its idempotency claim,
/// approval and budget, taken together or not at all.
async fn begin(h: &Harness, d: &Decided) -> AttemptStart {
    let allowed = match &d.decision {
        Decision::Allow(allowed) => allowed,
        // Decided while another attempt of the key was already in flight.
        Decision::Reject(r) if r.code() == RejectCode::IdempotencyInFlight => return AttemptStart::InFlight,
        // Decided after another attempt had consumed the approval.
        Decision::Reject(r) if r.code() == RejectCode::ApprovalConsumed => {
            return AttemptStart::ApprovalRefused(None);
        }
        other => panic!("not allowed: {other:?}"),
    };
    let entry = allowed.ledger_entry();
    h.store
        .begin_attempt(
            entry,
            allowed.idempotency_scope(),
            allowed.claims(),
            entry.created_at + Duration::hours(24),
        )
        .await
        .unwrap()
}

/// Simulates the runtime running the allowed call to completion.
async fn execute(h: &Harness, d: &Decided, result: Value) {
    let Decision::Allow(allowed) = &d.decision else {
        panic!("not allowed: {:?}", d.decision)
    };
    let entry = allowed.ledger_entry();
    assert_eq!(begin(h, d).await, AttemptStart::Started);
    let finish = AttemptFinish {
        outcome: Outcome::Committed,
        attempts: 1,
        error_code: None,
        result: Some(result),
        latency_ms: 1,
        cost: 1,
        detail: None,
        charges: Vec::new(),
    };
    h.store
        .finish_attempt(
            &entry.tenant,
            &entry.id,
            allowed.idempotency_scope(),
            &finish,
            entry.created_at,
        )
        .await
        .unwrap();
}

/// One proposal walked through the pipeline; each row shows the first boundary that stops it.
pub async fn stage_table(h: &Arc<Harness>) {
    let op = operator("acme");
    let email = |to: &str| {
        json!({"tool": "send_email", "version": 1, "idempotency_key": format!("mail-{to}"),
               "arguments": {"to": [to], "subject": "Credit applied", "body": "Hello"}})
    };
    let lookup = |order: &str| json!({"tool": "lookup_order", "version": 1, "idempotency_key": "look-1", "arguments": {"order_id": order}});
    let ping = json!({"tool": "ping", "version": 1, "arguments": {"n": 1}});

    // wrong type → schema
    let d = h
        .decide(
            &op,
            &json!({"tool": "create_support_credit", "version": 1, "idempotency_key": "k",
        "arguments": {"customer_id": "cus_8f3k2m9q", "amount_cents": "2500", "reason": "r"}}),
        )
        .await;
    assert_eq!(rejection(&d), (Stage::Schema, RejectCode::SchemaTypeMismatch));
    assert_eq!(d.facts.policy, None, "never reaches policy");

    // valid, but policy forbids (operators credit at most 50000 cents) → policy
    let d = h.decide(&op, &credit(60_000, "k-60000")).await;
    assert_eq!(rejection(&d), (Stage::Policy, RejectCode::PolicyDenied));
    assert_eq!(d.facts.delegated_scopes, None);

    // permitted, but the grant lacks the contract's scope → scope
    let no_scope = principal("agent-7", "acme", &["orders:read"], &["operator"]);
    let d = h.decide(&no_scope, &credit(2500, "k-scope")).await;
    assert_eq!(rejection(&d), (Stage::Scope, RejectCode::ScopeMissing));

    // recipient off the tenant's allow-list → guard
    let d = h.decide(&op, &email("eve@evil.example")).await;
    assert_eq!(rejection(&d), (Stage::Guard, RejectCode::RecipientNotAllowed));
    assert_eq!(
        d.facts.approval, None,
        "no approval requested for a refused recipient"
    );

    // budget spent → budget, refused by the write-ahead commit that would have spent it
    for _ in 0..2 {
        let d = h.decide(&op, &ping).await;
        assert_eq!(begin(h, &d).await, AttemptStart::Started);
    }
    let d = h.decide(&op, &ping).await;
    assert!(
        matches!(begin(h, &d).await, AttemptStart::BudgetExhausted { .. }),
        "the third ping has no budget"
    );

    // needs review → approval
    let d = h.decide(&op, &credit(2500, "k-review")).await;
    assert!(matches!(d.decision, Decision::NeedsApproval(_)));
    assert_eq!(d.facts.approval, Some(ApprovalState::RequiredMissing));
    let d = h.decide(&op, &email("alice@customer.example")).await;
    assert!(
        matches!(d.decision, Decision::NeedsApproval(_)),
        "an allowed recipient still needs review"
    );

    // key reused with a different payload → idempotency
    let first = h.decide(&op, &lookup("ord_AAAAAAAAAA")).await;
    execute(
        h,
        &first,
        json!({"order_id": "ord_AAAAAAAAAA", "status": "paid", "total_cents": 100, "currency": "EUR"}),
    )
    .await;
    // (No approval binds to the key of a lookup: the write-ahead commit reads it, in the
    // transaction that would claim it, takes nothing and records the refusal.)
    let d = h.decide(&op, &lookup("ord_BBBBBBBBBB")).await;
    assert_eq!(begin(h, &d).await, AttemptStart::KeyReused);
    // …and the same payload replays, spending nothing.
    let d = h.decide(&op, &lookup("ord_AAAAAAAAAA")).await;
    assert!(matches!(begin(h, &d).await, AttemptStart::Replay(_)));

    // Every refused or held proposal has its ledger row with stage and code.
    let rows = h
        .store
        .list_ledger(
            "acme",
            &LedgerFilter {
                limit: 100,
                ..LedgerFilter::default()
            },
        )
        .await
        .unwrap();
    let codes: Vec<Option<&str>> = rows
        .entries
        .iter()
        .rev()
        .map(|e| e.error_code.as_deref())
        .collect();
    assert_eq!(
        codes,
        vec![
            Some("SCHEMA_TYPE_MISMATCH"),
            Some("POLICY_DENIED"),
            Some("SCOPE_MISSING"),
            Some("RECIPIENT_NOT_ALLOWED"),
            None,
            None,
            Some("BUDGET_EXHAUSTED"),
            None,
            None,
            None,
            Some("IDEMPOTENCY_KEY_REUSED"),
            None,
        ],
        "held calls are recorded here, started, budget-refused, key-refused and replayed calls and the executed lookup by their begin_attempt, allowed-but-not-run calls nowhere"
    );
    // Arguments in the ledger are redacted where the contract says so.
    let held = rows
        .entries
        .iter()
        .find(|e| e.tool == "send_email" && e.decision == LedgerDecision::NeedsApproval)
        .unwrap();
    let body = held.arguments.as_ref().unwrap()["body"].as_str().unwrap();
    assert!(body.starts_with("hmac-sha256:"), "{body}");
}

pub async fn approvals_end_to_end(h: &Arc<Harness>) {
    let op = operator("acme");
    let boss = supervisor("acme");
    let proposal = credit(2500, "k-e2e");
    let held = h.decide(&op, &proposal).await;
    let id = approval_id(&held);
    // Proposing the same call again finds the same pending request.
    assert_eq!(approval_id(&h.decide(&op, &proposal).await), id);
    // Presented before a decision: still needs approval.
    assert!(matches!(
        h.decide(&op, &with_approval(proposal.clone(), &id))
            .await
            .decision,
        Decision::NeedsApproval(_)
    ));

    // Reviews: the proposer cannot approve itself; an operator may not review credits.
    let self_review = h
        .authority
        .review(&op, &id, Verdict::Approve, None)
        .await
        .unwrap();
    assert!(matches!(
        self_review,
        Err(ReviewRefusal::Forbidden(_)) | Err(ReviewRefusal::SelfReview)
    ));
    let as_proposer_supervisor = principal("agent-7", "acme", &[], &["supervisor"]);
    assert_eq!(
        h.authority
            .review(&as_proposer_supervisor, &id, Verdict::Approve, None)
            .await
            .unwrap()
            .unwrap_err(),
        ReviewRefusal::SelfReview
    );
    let other_operator = principal("agent-8", "acme", &[], &["operator"]);
    assert!(matches!(
        h.authority
            .review(&other_operator, &id, Verdict::Approve, None)
            .await
            .unwrap(),
        Err(ReviewRefusal::Forbidden(_))
    ));
    let approved = h
        .authority
        .review(
            &boss,
            &id,
            Verdict::Approve,
            Some("verified the duplicate charge"),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(approved.status, ApprovalStatus::Approved);

    // A changed payload does not bind.
    let changed = with_approval(credit(2600, "k-e2e"), &id);
    let d = h.decide(&op, &changed).await;
    assert_eq!(rejection(&d), (Stage::Approval, RejectCode::ApprovalMismatch));
    assert_eq!(d.facts.approval, Some(ApprovalState::Mismatch));
    // The approved call is allowed; the decision spends nothing, so presenting it twice before
    // it runs is allowed twice — and the write-ahead commit runs it once.
    let d = h.decide(&op, &with_approval(proposal.clone(), &id)).await;
    assert!(matches!(d.decision, Decision::Allow(_)), "{:?}", d.decision);
    assert_eq!(d.facts.approval, Some(ApprovalState::BoundToCall));
    let again = h.decide(&op, &with_approval(proposal.clone(), &id)).await;
    assert!(
        matches!(again.decision, Decision::Allow(_)),
        "{:?}",
        again.decision
    );
    assert_eq!(
        h.store
            .get_approval("acme", &id, h.env.now())
            .await
            .unwrap()
            .unwrap()
            .status,
        ApprovalStatus::Approved,
        "deciding does not consume"
    );
    // Once executed, the same call replays without a second approval.
    execute(h, &d, json!({"credit_id": "cr_1", "status": "applied"})).await;
    assert_eq!(
        h.store
            .get_approval("acme", &id, h.env.now())
            .await
            .unwrap()
            .unwrap()
            .status,
        ApprovalStatus::Consumed
    );
    assert!(matches!(begin(h, &again).await, AttemptStart::Replay(_)));
    let replay = h.decide(&op, &with_approval(proposal.clone(), &id)).await;
    let Decision::Allow(allowed) = &replay.decision else {
        panic!("{:?}", replay.decision)
    };
    assert_eq!(
        allowed.replay().unwrap().result,
        Some(json!({"credit_id": "cr_1", "status": "applied"}))
    );

    // Expiry: a request not used within its lifetime is refused as expired.
    let late = credit(3000, "k-late");
    let late_id = approval_id(&h.decide(&op, &late).await);
    h.authority
        .review(&boss, &late_id, Verdict::Approve, None)
        .await
        .unwrap()
        .unwrap();
    h.env.advance(Duration::minutes(16));
    let d = h.decide(&op, &with_approval(late, &late_id)).await;
    assert_eq!(rejection(&d), (Stage::Approval, RejectCode::ApprovalExpired));
    assert_eq!(d.facts.approval, Some(ApprovalState::Expired));

    // Rejected by the reviewer.
    let no = credit(4000, "k-no");
    let no_id = approval_id(&h.decide(&op, &no).await);
    h.authority
        .review(&boss, &no_id, Verdict::Reject, Some("not eligible"))
        .await
        .unwrap()
        .unwrap();
    let d = h.decide(&op, &with_approval(no, &no_id)).await;
    assert_eq!(rejection(&d), (Stage::Approval, RejectCode::ApprovalRejected));

    // A transport-supplied approval id works like the envelope field (MCP `_meta`).
    let t = credit(4100, "k-transport");
    let t_id = approval_id(&h.decide(&op, &t).await);
    h.authority
        .review(&boss, &t_id, Verdict::Approve, None)
        .await
        .unwrap()
        .unwrap();
    let bytes = t.to_string();
    let call = Call {
        bytes: bytes.as_bytes(),
        approval_id: Some(&t_id),
        trace_id: "t",
        ..Call::default()
    };
    let d = h.authority.decide(&op, &call).await.unwrap();
    assert!(matches!(d.decision, Decision::Allow(_)), "{:?}", d.decision);
}

pub async fn tenants_cannot_reach_each_other(h: &Arc<Harness>) {
    let a = operator("acme");
    let b_op = operator("globex");
    let b_boss = supervisor("globex");
    let proposal = credit(2500, "k-tenant");
    let id = approval_id(&h.decide(&a, &proposal).await);
    // B cannot see, approve or consume A's approval.
    assert_eq!(
        h.store.get_approval("globex", &id, h.env.now()).await.unwrap(),
        None
    );
    assert!(
        h.store
            .list_approvals("globex", None, 100, h.env.now())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        h.authority
            .review(&b_boss, &id, Verdict::Approve, None)
            .await
            .unwrap()
            .unwrap_err(),
        ReviewRefusal::NotFound
    );
    h.authority
        .review(&supervisor("acme"), &id, Verdict::Approve, None)
        .await
        .unwrap()
        .unwrap();
    let d = h.decide(&b_op, &with_approval(proposal.clone(), &id)).await;
    assert_eq!(rejection(&d), (Stage::Approval, RejectCode::ApprovalNotFound));
    // A's approval is still usable by A.
    assert!(matches!(
        h.decide(&a, &with_approval(proposal, &id)).await.decision,
        Decision::Allow(_)
    ));
    // Ledger rows are per tenant.
    let b_rows = h
        .store
        .list_ledger(
            "globex",
            &LedgerFilter {
                limit: 100,
                ..LedgerFilter::default()
            },
        )
        .await
        .unwrap();
    assert!(b_rows.entries.iter().all(|e| e.tenant == "globex"));
    assert_eq!(b_rows.entries.len(), 1);
    // B's recipients are B's list, not A's.
    let mail = json!({"tool": "send_email", "version": 1, "idempotency_key": "m",
                      "arguments": {"to": ["alice@customer.example"], "subject": "s", "body": "b"}});
    assert_eq!(
        rejection(&h.decide(&b_op, &mail).await),
        (Stage::Guard, RejectCode::RecipientNotAllowed)
    );
    // The same idempotency key in two tenants does not collide.
    let lookup = json!({"tool": "lookup_order", "version": 1, "idempotency_key": "same", "arguments": {"order_id": "ord_AAAAAAAAAA"}});
    let da = h.decide(&a, &lookup).await;
    execute(
        h,
        &da,
        json!({"order_id": "ord_AAAAAAAAAA", "status": "paid", "total_cents": 1, "currency": "EUR"}),
    )
    .await;
    let other = json!({"tool": "lookup_order", "version": 1, "idempotency_key": "same", "arguments": {"order_id": "ord_BBBBBBBBBB"}});
    let db = h.decide(&b_op, &other).await;
    let Decision::Allow(allowed) = &db.decision else {
        panic!("{:?}", db.decision)
    };
    assert!(allowed.replay().is_none());
}

pub async fn an_approval_is_consumed_once_under_concurrency(h: &Arc<Harness>) {
    let op = operator("acme");
    let proposal = credit(2500, "k-race");
    let id = approval_id(&h.decide(&op, &proposal).await);
    h.authority
        .review(&supervisor("acme"), &id, Verdict::Approve, None)
        .await
        .unwrap()
        .unwrap();
    let bytes = Arc::new(with_approval(proposal, &id).to_string());
    let authority = h.clone();
    let results = futures_join(16, |_| {
        let bytes = bytes.clone();
        let authority = authority.clone();
        let op = op.clone();
        async move {
            let d = authority.decide_bytes(&op, bytes.as_bytes()).await;
            let start = begin(&authority, &d).await;
            (d, start)
        }
    })
    .await;
    let mut started = Vec::new();
    for (d, start) in results {
        match start {
            AttemptStart::Started => started.push(d.ledger_id),
            AttemptStart::InFlight | AttemptStart::ApprovalRefused(_) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(started.len(), 1, "one write-ahead commit consumes the approval");
    assert_eq!(
        h.store
            .get_approval("acme", &id, h.env.now())
            .await
            .unwrap()
            .unwrap()
            .consumed_by,
        started.first().cloned()
    );
}

pub async fn budgets_hold_under_concurrency(h: &Arc<Harness>) {
    let op = operator("acme");
    let ping = Arc::new(json!({"tool": "ping", "version": 1, "arguments": {}}).to_string());
    let results = futures_join(12, |_| {
        let ping = ping.clone();
        let h2 = h.clone();
        let op = op.clone();
        async move {
            let d = h2.decide_bytes(&op, ping.as_bytes()).await;
            begin(&h2, &d).await
        }
    })
    .await;
    let started = results.iter().filter(|s| **s == AttemptStart::Started).count();
    assert_eq!(started, 2);
    assert!(
        results
            .iter()
            .all(|s| matches!(s, AttemptStart::Started | AttemptStart::BudgetExhausted { .. }))
    );
    assert_eq!(
        h.store
            .budget_used("acme", "calls_per_day:agent-7:ping:2026-11-29")
            .await
            .unwrap(),
        2
    );
    // A held call gives its reservation back.
    let before = h
        .store
        .budget_used("acme", "calls_per_day:agent-7:create_support_credit:2026-11-29")
        .await
        .unwrap();
    assert!(matches!(
        h.decide(&op, &credit(100, "k-held")).await.decision,
        Decision::NeedsApproval(_)
    ));
    let after = h
        .store
        .budget_used("acme", "calls_per_day:agent-7:create_support_credit:2026-11-29")
        .await
        .unwrap();
    assert_eq!(before, after);
}

pub async fn contracts_resolve_exactly(h: &Arc<Harness>) {
    let op = operator("acme");
    let mut stale =
        json!({"tool": "lookup_order", "version": 2, "arguments": {"order_id": "ord_AAAAAAAAAA"}});
    assert_eq!(
        rejection(&h.decide(&op, &stale).await),
        (Stage::Contract, RejectCode::ContractVersionMismatch)
    );
    let id = example("lookup_order").id().to_string();
    stale["version"] = json!(1);
    stale["contract"] = json!(id.clone());
    assert!(matches!(h.decide(&op, &stale).await.decision, Decision::Allow(_)));
    let by_id = json!({"tool": "lookup_order", "contract": id, "arguments": {"order_id": "ord_AAAAAAAAAA"}});
    assert!(matches!(h.decide(&op, &by_id).await.decision, Decision::Allow(_)));
    let wrong =
        json!({"tool": "lookup_order", "contract": example("send_email").id().to_string(), "arguments": {}});
    assert_eq!(
        rejection(&h.decide(&op, &wrong).await).1,
        RejectCode::ContractNotFound
    );
    assert_eq!(
        rejection(
            &h.decide(&op, &json!({"tool": "nope", "version": 1, "arguments": {}}))
                .await
        )
        .1,
        RejectCode::ContractNotFound
    );
    h.authority
        .registry()
        .retire(
            &warrant_core::contract::Namespace::Platform,
            &example("lookup_order").id().to_string(),
            h.env.now(),
        )
        .await
        .unwrap();
    assert_eq!(
        rejection(&h.decide(&op, &by_id).await),
        (Stage::Contract, RejectCode::ContractRetired)
    );
}

/// `Registry::load` (the contract sync's path) reuses what it compiled before and takes each
/// retirement from the listing it is given.
pub async fn reloading_reuses_compiled_contracts(h: &Arc<Harness>) {
    let registry = h.authority.registry();
    let stored = h.store.list_contracts().await.unwrap();
    let first = registry.load(&stored, h.env.now()).unwrap();
    let again = registry.load(&stored, h.env.now()).unwrap();
    assert_eq!(first.len(), stored.len());
    for ((a, b), s) in first.iter().zip(&again).zip(&stored) {
        assert!(Arc::ptr_eq(a, b), "{} compiled again", s.name);
        assert_eq!(a.id_str(), s.content_id);
    }
    let op = operator("acme");
    let lookup = json!({"tool": "lookup_order", "version": 1, "arguments": {"order_id": "ord_AAAAAAAAAA"}});
    assert!(matches!(
        h.decide(&op, &lookup).await.decision,
        Decision::Allow(_)
    ));
    let mut retired = stored.clone();
    for s in &mut retired {
        if s.name == "lookup_order" {
            s.retired_at = Some(h.env.now());
        }
    }
    registry.load(&retired, h.env.now()).unwrap();
    assert_eq!(
        rejection(&h.decide(&op, &lookup).await),
        (Stage::Contract, RejectCode::ContractRetired)
    );
}

/// With a complete listing younger than the registry's time-to-live (the contract sync's), a
/// contract the listing lacks is answered "not found" without reading the store — so the
/// tenant-namespace miss of every call to a platform contract costs no store round trip. Once
/// the listing is older than that, a miss is read from the store again (and a contract
/// registered by another node is found on first use); a new listing finds it at once.
pub async fn a_fresh_listing_answers_misses_without_the_store(h: &Arc<Harness>) {
    let registry = h.authority.registry();
    let now = h.env.now();
    registry
        .load(&h.store.list_contracts().await.unwrap(), now)
        .unwrap();
    // Registered by another node: in the store, not in this registry's listing.
    let pong = warrant_core::Contract::from_text(
        "name: pong\nversion: 1\ndescription: Pong.\nowner: test\neffect: read\nscopes: [ping:read]\n\
         input: { type: object, additionalProperties: false, properties: {} }\n\
         output: { type: object, additionalProperties: false, properties: {} }\n",
        warrant_core::contract::DocumentFormat::Yaml,
    )
    .unwrap();
    h.store.register_contract(&pong.to_stored(now)).await.unwrap();
    let op = operator("acme");
    let call = json!({"tool": "pong", "version": 1, "arguments": {}});
    assert_eq!(
        rejection(&h.decide(&op, &call).await),
        (Stage::Contract, RejectCode::ContractNotFound),
        "answered from the listing, not the store"
    );
    // A platform contract is still found past the caller's own (empty) namespace.
    let lookup = json!({"tool": "lookup_order", "version": 1, "arguments": {"order_id": "ord_AAAAAAAAAA"}});
    assert!(matches!(
        h.decide(&op, &lookup).await.decision,
        Decision::Allow(_)
    ));
    // The listing ages out: the miss is read from the store, which has it.
    h.env.advance(Duration::seconds(6));
    let decided = h.decide(&op, &call).await;
    assert!(
        !matches!(&decided.decision, Decision::Reject(r) if r.stage() == Stage::Contract),
        "{:?}",
        decided.decision
    );
    // And a new listing that holds it finds it while fresh.
    let registry_now = h.env.now();
    registry
        .load(&h.store.list_contracts().await.unwrap(), registry_now)
        .unwrap();
    let decided = h.decide(&op, &call).await;
    assert!(
        !matches!(&decided.decision, Decision::Reject(r) if r.stage() == Stage::Contract),
        "{:?}",
        decided.decision
    );
}

pub async fn hostile_proposals_stop_where_they_fail(h: &Arc<Harness>) {
    let op = operator("acme");
    let cases: Vec<(&[u8], Stage)> = vec![
        (b"", Stage::Parse),
        (b"\xff\xfe", Stage::Parse),
        (br#"{"tool":"create_support_credit","tool":"x","version":1,"arguments":{}}"#, Stage::Parse),
        (br#"{"tool":"create_support_credit","version":1,"arguments":{},"tenant":"globex"}"#, Stage::Identity),
        (br#"{"tool":"create_support_credit","version":1e400,"arguments":{}}"#, Stage::Parse),
        (br#"{"tool":"create_support_credit","version":99,"arguments":{}}"#, Stage::Contract),
        (br#"{"tool":"create_support_credit","version":1,"arguments":{"customer_id":"cus_8f3k2m9q","amount_cents":25.0,"reason":"r"},"idempotency_key":"k"}"#, Stage::Schema),
        (br#"{"tool":"create_support_credit","version":1,"arguments":{"customer_id":"cus_8f3k2m9q","amount_cents":1,"reason":"r","x":{}},"idempotency_key":"k"}"#, Stage::Schema),
        (br#"{"tool":"create_support_credit","version":1,"arguments":{"customer_id":"cus_8f3k2m9q","amount_cents":1,"reason":"r"}}"#, Stage::Idempotency),
        // `format: email` lets a display name through; the guard does not.
        (br#"{"tool":"send_email","version":1,"arguments":{"to":["Eve <alice@customer.example>"],"subject":"s","body":"b"},"idempotency_key":"k"}"#, Stage::Guard),
        (br#"{"tool":"send_email","version":1,"arguments":{"to":["alice@customer.example.evil.example"],"subject":"s","body":"b"},"idempotency_key":"k"}"#, Stage::Guard),
    ];
    for (bytes, stage) in cases {
        let d = h.decide_bytes(&op, bytes).await;
        let (got, _) = rejection(&d);
        assert_eq!(got, stage, "{}", String::from_utf8_lossy(bytes));
        if stage < Stage::Policy {
            assert_eq!(d.facts.policy, None);
        }
        if stage < Stage::Approval {
            assert_eq!(d.facts.approval, None);
        }
    }
    assert!(
        h.store
            .list_approvals("acme", None, 10, h.env.now())
            .await
            .unwrap()
            .is_empty(),
        "no hostile call reached approval"
    );
}

/// Runs `n` futures concurrently on the runtime and collects their results.
async fn futures_join<F, Fut, T>(n: usize, make: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

/// Regression (found by the `proposal` fuzz target): an `approval` field on a contract without
/// approvals must not come back as the call's approval.
pub async fn an_unrequired_approval_id_is_not_echoed(h: &Arc<Harness>) {
    let op = operator("acme");
    let bytes = include_bytes!("../../fuzz/regressions/proposal/approval-id-without-approval.json");
    let d = h.decide_bytes(&op, bytes).await;
    let Decision::Allow(allowed) = &d.decision else {
        panic!("{:?}", d.decision)
    };
    assert_eq!(allowed.approval_id(), None);
    assert_eq!(allowed.ledger_entry().approval_id, None);
}

/// The registry holds only what the store holds: a registration with a conflicting binding is
/// refused and caches nothing, one without a binding keeps the stored one, and a second node
/// resolves the same binding for the same contract.
pub async fn the_registry_caches_the_stored_binding(h: &Arc<Harness>) {
    use warrant_core::contract::Namespace;
    let registry = h.authority.registry();
    let doc = |url: Option<&str>| {
        let mut d = json!({
            "name": "bound_tool", "version": 1, "description": "d", "owner": "o",
            "effect": "read", "scopes": ["orders:read"],
            "input": {"type": "object", "additionalProperties": false, "properties": {}},
            "output": {"type": "object"},
        });
        if let Some(url) = url {
            d["adapter"] = json!({"kind": "http", "url": url});
        }
        warrant_core::Contract::from_document(d).unwrap()
    };
    let digest = |c: &warrant_core::Contract| c.adapter().map(|a| a.digest());
    let first = doc(Some("https://a.example/x"));
    registry.register(first.clone(), h.env.now()).await.unwrap();
    let evil = doc(Some("https://evil.example/x"));
    assert!(matches!(
        registry.register(evil, h.env.now()).await,
        Err(warrant_core::store::StoreError::Conflict(_))
    ));
    assert_eq!(
        registry.register(doc(None), h.env.now()).await.unwrap(),
        warrant_core::records::Registration::Unchanged
    );
    let envelope =
        |bytes: &str| warrant_core::proposal::Envelope::parse(bytes.as_bytes(), Default::default()).unwrap();
    let call = envelope(r#"{"tool": "bound_tool", "version": 1, "arguments": {}}"#);
    let here = registry
        .resolve(&call, "acme", h.env.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        digest(&here),
        digest(&first),
        "this node keeps the stored binding"
    );
    let other_node = warrant_core::registry::Registry::new(h.store.clone(), time::Duration::seconds(30));
    let there = other_node
        .resolve(&call, "acme", h.env.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        digest(&there),
        digest(&first),
        "another node resolves the same binding"
    );
    assert_eq!(here.namespace(), &Namespace::Platform);
}

/// A call that ran is replayed whatever its budget says since: a replay spends nothing. The
/// key of a call that needs no approval is read by the write-ahead commit, before any budget,
/// and the node's memory of an exhausted counter does not refuse such a call early.
pub async fn a_replay_is_answered_whatever_the_budget(h: &Arc<Harness>) {
    let op = operator("acme");
    let ping = |key: &str| json!({"tool": "ping", "version": 1, "idempotency_key": key, "arguments": {}});
    for key in ["p1", "p2"] {
        execute(h, &h.decide(&op, &ping(key)).await, json!({})).await;
    }
    let d = h.decide(&op, &ping("p3")).await;
    let AttemptStart::BudgetExhausted { key } = begin(h, &d).await else {
        panic!("the third ping has no budget")
    };
    let Decision::Allow(allowed) = &d.decision else {
        panic!("{:?}", d.decision)
    };
    note_exhausted(h, allowed, &key);
    // A new call is refused by the node at once…
    let d = h
        .decide(&op, &json!({"tool": "ping", "version": 1, "arguments": {}}))
        .await;
    assert_eq!(rejection(&d), (Stage::Budget, RejectCode::BudgetExhausted));
    // …the first call again is its replay.
    let d = h.decide(&op, &ping("p1")).await;
    assert!(
        matches!(begin(h, &d).await, AttemptStart::Replay(_)),
        "{:?}",
        d.decision
    );
    // And a new call with a key is refused by the commit, which takes nothing.
    let d = h.decide(&op, &ping("p4")).await;
    assert!(matches!(begin(h, &d).await, AttemptStart::BudgetExhausted { .. }));
}
