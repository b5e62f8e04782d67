//! The decision counters: each refusal kind has its own counter (PRODUCT §10).

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;
use warrant_core::decision::Decision;
use warrant_core::records::{AttemptClaims, AttemptStart, IdempotencyScope, Verdict};

use crate::support::*;

#[test]
fn every_refusal_kind_is_counted_separately() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let h = Harness::new(Kind::Memory).await.unwrap();
            let op = operator("acme");
            let bad_type = json!({"tool": "create_support_credit", "version": 1, "idempotency_key": "k",
                "arguments": {"customer_id": "cus_8f3k2m9q", "amount_cents": "1", "reason": "r"}});
            h.decide(&op, &bad_type).await;
            h.decide(&op, &credit(60_000, "k-big")).await;
            let mail = json!({"tool": "send_email", "version": 1, "idempotency_key": "m",
                "arguments": {"to": ["eve@evil.example"], "subject": "s", "body": "b"}});
            h.decide(&op, &mail).await;
            // The budget is spent by the write-ahead commit; once it refused a counter, the
            // decision refuses the next call of that counter itself (and counts it).
            let ping = json!({"tool": "ping", "version": 1, "arguments": {}});
            for _ in 0..3 {
                let d = h.decide(&op, &ping).await;
                let Decision::Allow(allowed) = &d.decision else {
                    panic!("{:?}", d.decision)
                };
                let entry = allowed.ledger_entry();
                let start = h
                    .store
                    .begin_attempt(
                        entry,
                        None,
                        allowed.claims(),
                        entry.created_at + time::Duration::hours(1),
                    )
                    .await
                    .unwrap();
                if let AttemptStart::BudgetExhausted { key } = start {
                    note_exhausted(&h, allowed, &key);
                }
            }
            let refused = h.decide(&op, &ping).await;
            assert!(
                matches!(refused.decision, Decision::Reject(_)),
                "{:?}",
                refused.decision
            );
            let held = h.decide(&op, &credit(100, "k-held")).await;
            let Decision::NeedsApproval(needed) = held.decision else {
                panic!()
            };
            let credit_contract = needed.contract_id.to_string();
            let id = needed.request_id.unwrap();
            h.authority
                .review(&supervisor("acme"), &id, Verdict::Approve, None)
                .await
                .unwrap()
                .unwrap();
            h.env.advance(time::Duration::minutes(30));
            let mut late = credit(100, "k-held");
            late["approval"] = json!(id);
            h.decide(&op, &late).await;
            // A call that needs approval has its key read by `decide` (an approval binds to
            // it): a key already taken by another payload is refused there. (Any other call
            // finds it in its write-ahead commit, which the runtime counts the same way.)
            let lookup = json!({"tool": "lookup_order", "version": 1, "idempotency_key": "same",
                "arguments": {"order_id": "ord_AAAAAAAAAA"}});
            let first = h.decide(&op, &lookup).await;
            let Decision::Allow(allowed) = &first.decision else {
                panic!()
            };
            let entry = allowed.ledger_entry();
            let taken = IdempotencyScope {
                contract_id: credit_contract,
                key: "k-taken".into(),
                ..allowed.idempotency_scope().unwrap().clone()
            };
            h.store
                .begin_attempt(
                    entry,
                    Some(&taken),
                    &AttemptClaims::NONE,
                    entry.created_at + time::Duration::hours(1),
                )
                .await
                .unwrap();
            let conflict = h.decide(&op, &credit(100, "k-taken")).await;
            assert!(
                matches!(&conflict.decision, Decision::Reject(r)
                    if r.code() == warrant_core::RejectCode::IdempotencyKeyReused),
                "{:?}",
                conflict.decision
            );
        });
    });
    let counters: HashMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .fold(HashMap::new(), |mut acc, (name, n)| {
            *acc.entry(name).or_default() += n;
            acc
        });
    for (name, expected) in [
        ("warrant_schema_rejections_total", 1),
        ("warrant_policy_denials_total", 1),
        ("warrant_guard_refusals_total", 1),
        ("warrant_budget_exhausted_total", 1),
        ("warrant_approval_requests_total", 1),
        ("warrant_approval_expiries_total", 1),
        ("warrant_idempotency_conflicts_total", 1),
    ] {
        assert_eq!(
            counters.get(name).copied(),
            Some(expected),
            "{name}: {counters:?}"
        );
    }
    assert!(counters.get("warrant_decisions_total").copied().unwrap_or(0) >= 9);
}
