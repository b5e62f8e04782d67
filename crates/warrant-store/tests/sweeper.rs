//! The background sweeper purges expired idempotency records and budget counters and expires
//! stale approvals, on its own, on every tick.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use time::OffsetDateTime;
use warrant_store::*;

#[tokio::test]
async fn the_sweeper_purges_what_expired() {
    let store = Arc::new(MemoryStore::new());
    let past = OffsetDateTime::now_utc() - time::Duration::hours(2);
    let scope = IdempotencyScope {
        tenant: "acme".into(),
        principal: "agent-7".into(),
        contract_id: "tool-contract@sha256:aa".into(),
        key: "old".into(),
    };
    let mut entry = LedgerEntry::new("led_1".into(), "acme", "agent-7", "t", "tool", past);
    entry.payload_digest = Some("sha256:p".into());
    entry.outcome = Some(Outcome::Attempting);
    store
        .begin_attempt(
            &entry,
            Some(&scope),
            &AttemptClaims::NONE,
            past + time::Duration::minutes(1),
        )
        .await
        .unwrap();
    let done = AttemptFinish {
        outcome: Outcome::Committed,
        attempts: 1,
        error_code: None,
        result: Some(json!({})),
        latency_ms: 1,
        cost: 0,
        detail: None,
        charges: Vec::new(),
    };
    store
        .finish_attempt("acme", "led_1", Some(&scope), &done, past)
        .await
        .unwrap();
    let reservation = BudgetReservation {
        key: "k".into(),
        amount: 1,
        limit: 5,
        expires_at: past,
    };
    store.reserve_budget("acme", &[reservation]).await.unwrap();
    store
        .create_approval(&NewApproval {
            id: "apr_1".into(),
            tenant: "acme".into(),
            contract_id: "tool-contract@sha256:aa".into(),
            tool: "tool".into(),
            proposer: "agent-7".into(),
            payload_digest: "sha256:p".into(),
            idempotency_key: None,
            arguments: json!({}),
            sealed_arguments: None,
            created_at: past,
            expires_at: past + time::Duration::minutes(15),
            reviewers: None,
        })
        .await
        .unwrap();

    let sweeper = spawn_sweeper(store.clone(), Duration::from_millis(20));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let purged = store.get_idempotency(&scope).await.unwrap().is_none()
            && store.budget_used("acme", "k").await.unwrap() == 0
            && store
                .get_approval("acme", "apr_1", past)
                .await
                .unwrap()
                .unwrap()
                .status
                == ApprovalStatus::Expired;
        if purged {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sweeper did not purge within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sweeper.abort();
}

#[test]
fn a_failed_sweep_is_counted_not_swallowed() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let store = MemoryStore::new();
    store.close();
    let swept = metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(sweep_once(&store))
    });
    assert_eq!(swept, None);
    let failures: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == SWEEP_ERRORS_METRIC)
        .map(|(.., value)| value)
        .collect();
    assert_eq!(failures, vec![DebugValue::Counter(1)]);
}
