//! The cases, each run on every backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warrant_core::ToolErrorCode;
use warrant_core::decision::{Decision, Outcome};
use warrant_core::records::{self, AttemptClaims, LedgerEntry, LedgerFilter};
use warrant_core::{RejectCode, Rejection};
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::execute::operation_id;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::reconcile::Resolution;
use warrant_runtime::{Adapters, Execution, Invocation, Runtime, RuntimeSettings, Secrets};

use crate::support::{Harness, committed};

async fn row(h: &Harness, e: &Execution) -> LedgerEntry {
    h.store.get_ledger("acme", &e.ledger_id).await.unwrap().unwrap()
}

fn failed(e: &Execution) -> ToolErrorCode {
    match &e.result {
        Ok(Outcome::Failed(code)) => *code,
        other => panic!("expected failed, got {other:?}"),
    }
}

fn unknown(e: &Execution) {
    assert!(
        matches!(&e.result, Ok(Outcome::Unknown(op)) if *op == e.operation_id),
        "{:?}",
        e.result
    );
}

fn rejected(d: Decision) -> Rejection {
    match d {
        Decision::Reject(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

pub async fn commits_once_and_replays(h: &Arc<Harness>) {
    let e = h.run("credit", json!({"mode": "ok"}), Some("k1")).await;
    let result = committed(&e).clone();
    assert_eq!((e.attempts, e.replayed), (1, false));
    let op = e.operation_id.as_str();
    assert!(op.starts_with("op_"));
    assert_eq!(h.faults.effects(op), 1);
    // The tool saw the operation id as its idempotency key, its own credential and the
    // attenuated scopes.
    assert_eq!(h.faults.header(op, "idempotency-key").as_deref(), Some(op));
    assert_eq!(
        h.faults.header(op, "authorization").as_deref(),
        Some("Bearer tok-credit-secret")
    );
    assert_eq!(
        h.faults.header(op, "warrant-scopes").as_deref(),
        Some("faults:write")
    );
    let first = row(h, &e).await;
    assert_eq!(first.outcome, Some(records::Outcome::Committed));
    assert_eq!((first.attempts, first.cost), (1, 2));
    assert!(!format!("{first:?}").contains("tok-credit-secret"));

    // The same call again: the stored result, no new effect, a `replayed` row.
    let again = h.run("credit", json!({"mode": "ok"}), Some("k1")).await;
    assert!(again.replayed);
    assert_eq!(committed(&again), &result);
    assert_eq!(again.operation_id, e.operation_id);
    assert_eq!((h.faults.effects(op), h.faults.requests(op)), (1, 1));
    let replay = row(h, &again).await;
    assert_eq!(replay.outcome, Some(records::Outcome::Replayed));
    assert_eq!(replay.cost, 0);

    // The key with another payload is refused before anything runs (by the write-ahead
    // commit, which reads the key of a call that needs no approval).
    let reused = h.run("credit", json!({"mode": "ok", "n": 2}), Some("k1")).await;
    let Err(refusal) = &reused.result else {
        panic!("{reused:?}")
    };
    assert_eq!(refusal.code(), RejectCode::IdempotencyKeyReused);
    assert_eq!(
        row(h, &reused).await.error_code.as_deref(),
        Some("IDEMPOTENCY_KEY_REUSED")
    );
    assert_eq!(h.faults.requests(op), 1);
}

pub async fn every_status_takes_its_path(h: &Arc<Harness>) {
    use ToolErrorCode::*;
    // (tool, mode, failed code or None for unknown, attempts)
    let table: &[(&str, &str, Option<ToolErrorCode>, u32)] = &[
        ("credit", "400", Some(InputInvalid), 1),
        ("credit", "422", Some(InputInvalid), 1),
        ("credit", "401", Some(PermissionDenied), 1),
        ("credit", "403", Some(PermissionDenied), 1),
        ("credit", "404", Some(PermanentFailure), 1),
        ("credit", "409", Some(PermanentFailure), 1),
        ("credit", "429", Some(RateLimited), 3),
        ("credit", "408", Some(Timeout), 3),
        // The effect may have happened: unknown, never failed. A 5xx does not prove the write
        // did not happen (the tool honours idempotency, so it is retried with the same key
        // first).
        ("credit", "500", None, 3),
        ("credit", "502", None, 3),
        ("credit", "503", None, 3),
        ("credit", "504", None, 3),
        // The tool does not honour idempotency: not retried, unknown at once.
        ("note", "500", None, 1),
        ("credit", "hang", None, 3),
        ("credit", "reset", None, 3),
        ("credit", "bad_output", None, 1),
        // Nothing listens there: certainly not sent, so failed.
        ("refused", "ok", Some(UpstreamUnavailable), 2),
        // A read has no effect: never unknown.
        ("lookup", "hang", Some(Timeout), 2),
        ("lookup", "reset", Some(UpstreamUnavailable), 2),
        ("lookup", "bad_output", Some(OutputInvalid), 1),
        ("lookup", "503", Some(UpstreamUnavailable), 2),
    ];
    for (i, (tool, mode, code, attempts)) in table.iter().enumerate() {
        let key = format!("k-{i}");
        let e = h.run(tool, json!({"mode": mode}), Some(&key)).await;
        let r = row(h, &e).await;
        match code {
            Some(code) => {
                assert_eq!(failed(&e), *code, "{tool} {mode}");
                assert_eq!(r.outcome, Some(records::Outcome::Failed), "{tool} {mode}");
                assert_eq!(r.error_code.as_deref(), Some(code.as_str()), "{tool} {mode}");
            }
            None => {
                unknown(&e);
                assert_eq!(r.outcome, Some(records::Outcome::Unknown), "{tool} {mode}");
            }
        }
        assert_eq!(e.attempts, *attempts, "{tool} {mode}");
        assert_eq!(r.attempts, *attempts, "{tool} {mode}");
        if *tool != "refused" {
            assert_eq!(
                h.faults.requests(e.operation_id.as_str()),
                *attempts,
                "{tool} {mode}"
            );
        }
    }
    // An answer that does not match the output schema is recorded as such.
    let e = h
        .run("credit", json!({"mode": "bad_output"}), Some("k-bad"))
        .await;
    assert_eq!(
        row(h, &e).await.error_code.as_deref(),
        Some("TOOL_OUTPUT_INVALID")
    );
}

pub async fn retries_are_capped_and_honour_retry_after(h: &Arc<Harness>) {
    let e = h.run("credit", json!({"mode": "flaky2"}), Some("f2")).await;
    committed(&e);
    let op = e.operation_id.as_str();
    assert_eq!(
        (e.attempts, h.faults.requests(op), h.faults.effects(op)),
        (3, 3, 1)
    );

    // A write answered 503 every time: retried with the same key, then unknown (a 503 does
    // not prove the effect did not happen), reconciled later.
    let e = h.run("credit", json!({"mode": "flaky5"}), Some("f5")).await;
    unknown(&e);
    assert_eq!(
        row(h, &e).await.error_code.as_deref(),
        Some("TOOL_UPSTREAM_UNAVAILABLE")
    );
    assert_eq!((e.attempts, h.faults.requests(e.operation_id.as_str())), (3, 3));

    let t0 = Instant::now();
    let e = h.run("credit", json!({"mode": "limited_once"}), Some("l1")).await;
    committed(&e);
    assert_eq!(e.attempts, 2);
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was not honoured"
    );
}

pub async fn a_tool_without_idempotency_is_not_retried(h: &Arc<Harness>) {
    // A 503 of a write proves nothing: not retried, unknown.
    let e = h.run("note", json!({"mode": "503"}), Some("n-503")).await;
    unknown(&e);
    assert_eq!((e.attempts, h.faults.requests(e.operation_id.as_str())), (1, 1));
    for (mode, code) in [
        ("429", ToolErrorCode::RetryRequiresIdempotency),
        ("400", ToolErrorCode::InputInvalid),
    ] {
        let e = h
            .run("note", json!({"mode": mode}), Some(&format!("n-{mode}")))
            .await;
        assert_eq!(failed(&e), code, "{mode}");
        assert_eq!(
            (e.attempts, h.faults.requests(e.operation_id.as_str())),
            (1, 1),
            "{mode}"
        );
    }
    // A timeout may have taken effect: unknown, and not retried.
    let e = h.run("note", json!({"mode": "hang"}), Some("n-hang")).await;
    unknown(&e);
    assert_eq!(h.faults.requests(e.operation_id.as_str()), 1);
    assert_eq!(row(h, &e).await.error_code.as_deref(), Some("TOOL_TIMEOUT"));
}

pub async fn lost_answers_are_unknown_and_reconciled(h: &Arc<Harness>) {
    // Committed, then the answer was lost: unknown; reconciliation finds one effect.
    let e = h.run("note", json!({"mode": "commit_drop"}), Some("cd")).await;
    unknown(&e);
    let op = e.operation_id.as_str().to_owned();
    assert_eq!(h.faults.effects(&op), 1);
    let r = row(h, &e).await;
    assert_eq!(
        h.runtime.reconcile(&r).await.unwrap(),
        Resolution::Committed { effects: 1 }
    );
    let r = row(h, &e).await;
    assert_eq!(r.outcome, Some(records::Outcome::ReconciledCommitted));
    assert_eq!(r.cost, 1);
    // Reconciling again changes nothing.
    assert_eq!(
        h.runtime.reconcile(&r).await.unwrap(),
        Resolution::AlreadyResolved
    );
    // The same call now replays the reconciled result: one effect, not two.
    let again = h.run("note", json!({"mode": "commit_drop"}), Some("cd")).await;
    assert!(again.replayed);
    assert_eq!(committed(&again)["status"], "applied");
    assert_eq!((h.faults.effects(&op), h.faults.requests(&op)), (1, 1));

    // Dropped before committing: reconciliation finds nothing and frees the key.
    let e = h.run("note", json!({"mode": "reset"}), Some("rs")).await;
    unknown(&e);
    let r = row(h, &e).await;
    assert_eq!(h.runtime.reconcile(&r).await.unwrap(), Resolution::NotCommitted);
    assert_eq!(
        row(h, &e).await.outcome,
        Some(records::Outcome::ReconciledNotCommitted)
    );
    let again = h.run("note", json!({"mode": "reset"}), Some("rs")).await;
    assert!(!again.replayed);
    assert_eq!(h.faults.requests(e.operation_id.as_str()), 2);

    // An idempotent tool is retried with the same key: it deduplicates, one effect.
    let e = h.run("credit", json!({"mode": "commit_drop"}), Some("cd2")).await;
    unknown(&e);
    let op = e.operation_id.as_str();
    assert_eq!((h.faults.requests(op), h.faults.effects(op)), (3, 1));
    let r = row(h, &e).await;
    assert_eq!(
        h.runtime.reconcile(&r).await.unwrap(),
        Resolution::Committed { effects: 1 }
    );

    // A tool that cannot be asked stays unknown.
    let e = h.run("blind", json!({"mode": "commit_drop"}), Some("bl")).await;
    unknown(&e);
    let r = row(h, &e).await;
    assert_eq!(h.runtime.reconcile(&r).await.unwrap(), Resolution::StillUnknown);
    assert_eq!(row(h, &e).await.outcome, Some(records::Outcome::Unknown));
}

/// A call that needs approval, whose attempt was lost before it committed: the same call sent
/// again is decided as the replay of that operation (a replay spends no approval), but the
/// operation turns out to have had no effect, so the call is a new attempt after all. It does
/// not run on the approval the first attempt consumed: it is decided again (through
/// `dispatch`), or refused (`execute` alone).
pub async fn a_replay_that_finds_no_effect_needs_an_approval_of_its_own(h: &Arc<Harness>) {
    let now = time::OffsetDateTime::now_utc();
    let proposal =
        json!({"tool": "gated", "version": 1, "arguments": {"mode": "reset"}, "idempotency_key": "gated-rs"});
    let Err(Decision::NeedsApproval(needed)) = h.allow(&proposal).await else {
        panic!("expected a hold");
    };
    let id = needed.request_id.unwrap();
    h.store
        .decide_approval("acme", &id, "reviewer-1", records::Verdict::Approve, None, now)
        .await
        .unwrap()
        .unwrap();
    let mut approved = proposal.clone();
    approved["approval"] = json!(id);
    let e = h
        .runtime
        .execute(h.allow(&approved).await.unwrap())
        .await
        .unwrap();
    unknown(&e);
    let op = e.operation_id.as_str().to_owned();
    assert_eq!(h.faults.requests(&op), 1);

    // Sent again as it was: allowed as the replay, reconciled (no effect, key freed), and
    // refused rather than run without an approval.
    let again = h
        .runtime
        .execute(h.allow(&approved).await.unwrap())
        .await
        .unwrap();
    let Err(refusal) = &again.result else {
        panic!("ran without an approval: {again:?}");
    };
    assert_eq!(refusal.code(), RejectCode::IdempotencyInFlight, "{refusal:?}");
    assert_eq!(h.faults.requests(&op), 1, "no second attempt");
    assert_eq!(
        row(h, &e).await.outcome,
        Some(records::Outcome::ReconciledNotCommitted)
    );

    // Through `dispatch`, the lanes' path, the call is decided afresh: the approval it
    // presents was consumed by the first attempt, so its write-ahead commit refuses it.
    let bytes = approved.to_string();
    let call = warrant_core::pipeline::Call {
        bytes: bytes.as_bytes(),
        trace_id: "trace-test",
        ..warrant_core::pipeline::Call::default()
    };
    let (dispatched, _) =
        warrant_runtime::dispatch(&h.authority, &h.runtime, &crate::support::agent(), &call)
            .await
            .unwrap();
    assert!(
        matches!(&dispatched, warrant_runtime::Dispatched::Executed(Execution { result: Err(r), attempts: 0, .. })
            if r.code() == RejectCode::ApprovalConsumed),
        "{dispatched:?}"
    );
    // Without the spent approval, it is held for a new one.
    let (dispatched, _) = warrant_runtime::dispatch(
        &h.authority,
        &h.runtime,
        &crate::support::agent(),
        &warrant_core::pipeline::Call {
            bytes: proposal.to_string().as_bytes(),
            trace_id: "trace-test",
            ..warrant_core::pipeline::Call::default()
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(dispatched, warrant_runtime::Dispatched::NeedsApproval { .. }),
        "{dispatched:?}"
    );
    assert_eq!(h.faults.requests(&op), 1, "still one attempt");
}

/// A key outlives the call it claims, however short the contract's retention: an in-flight
/// record past its expiry is taken for abandoned by the next call with the key, which
/// reconciles it — and a call still running may not have made its effect yet, so that would
/// find none, free the key, and let a second effect through.
pub async fn a_key_is_kept_as_long_as_its_call_may_run(h: &Arc<Harness>) {
    let e = h
        .run("brief", json!({"mode": "commit_hang"}), Some("brief-1"))
        .await;
    unknown(&e);
    let r = row(h, &e).await;
    let scope = records::IdempotencyScope {
        tenant: "acme".into(),
        principal: "agent-7".into(),
        contract_id: r.contract_id.clone().unwrap(),
        key: "brief-1".into(),
    };
    let record = h.store.get_idempotency(&scope).await.unwrap().unwrap();
    // The harness's `stale_after` is 10 s; the contract's retention 1 s.
    assert!(
        record.expires_at - record.created_at >= time::Duration::seconds(10),
        "kept {} only",
        record.expires_at - record.created_at
    );
    // So the same call a moment later, past the retention, finds it unknown (reconciled
    // first, and replayed: it committed), not free.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = h
        .run("brief", json!({"mode": "commit_hang"}), Some("brief-1"))
        .await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(h.faults.requests(e.operation_id.as_str()), 1);
}

pub async fn a_new_attempt_reconciles_an_unknown_first(h: &Arc<Harness>) {
    let e = h.run("note", json!({"mode": "commit_hang"}), Some("ch")).await;
    unknown(&e);
    let op = e.operation_id.as_str().to_owned();
    assert_eq!(h.faults.effects(&op), 1);
    // Presented again: decided as the same operation, reconciled before anything runs, and
    // answered with the committed result. The tool is not called again.
    let again = h.run("note", json!({"mode": "commit_hang"}), Some("ch")).await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(committed(&again)["status"], "applied");
    assert_eq!((h.faults.effects(&op), h.faults.requests(&op)), (1, 1));
    assert_eq!(
        row(h, &e).await.outcome,
        Some(records::Outcome::ReconciledCommitted)
    );

    // Dropped before it committed: the call presented again finds it unknown, reconciles it
    // (no effect), and runs it, now that the key is free.
    let e = h.run("note", json!({"mode": "reset"}), Some("rs-again")).await;
    unknown(&e);
    let again = h.run("note", json!({"mode": "reset"}), Some("rs-again")).await;
    assert!(!again.replayed, "{again:?}");
    assert_eq!(
        row(h, &e).await.outcome,
        Some(records::Outcome::ReconciledNotCommitted)
    );
    assert_eq!(
        h.faults.requests(e.operation_id.as_str()),
        2,
        "run once more, not refused"
    );
    assert!(
        row(h, &again)
            .await
            .outcome
            .is_some_and(|o| o != records::Outcome::Replayed)
    );
}

pub async fn confirmed_duplicates_are_counted_and_recorded(h: &Arc<Harness>) {
    let e = h.run("note", json!({"mode": "dup"}), Some("dup")).await;
    unknown(&e);
    let later = time::OffsetDateTime::now_utc() + time::Duration::seconds(5);
    let report = h.runtime.reconcile_older_than(later, 100).await.unwrap();
    assert_eq!((report.committed, report.duplicates), (1, 1));
    let r = row(h, &e).await;
    assert_eq!(r.outcome, Some(records::Outcome::ReconciledCommitted));
    assert!(
        r.detail
            .as_deref()
            .unwrap()
            .contains("confirmed duplicate effect, committed 2 times"),
        "{:?}",
        r.detail
    );
}

pub async fn stale_attempting_rows_are_reconciled(h: &Arc<Harness>) {
    // Plays a process that crashed mid-execution: the write-ahead row is `attempting`; one
    // call's effect reached the tool before the crash, the other's did not.
    let mut ops = Vec::new();
    for (key, deliver) in [("crash-a", true), ("crash-b", false)] {
        let proposal =
            json!({"tool": "credit", "version": 1, "idempotency_key": key, "arguments": {"mode": "ok"}});
        let allowed = h.allow(&proposal).await.unwrap();
        let exp = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        h.store
            .begin_attempt(
                allowed.ledger_entry(),
                allowed.idempotency_scope(),
                &AttemptClaims::NONE,
                exp,
            )
            .await
            .unwrap();
        let op = operation_id(allowed.ledger_entry(), allowed.idempotency_scope());
        if deliver {
            let adapter = h.runtime.adapters().for_contract(allowed.contract()).unwrap();
            let scopes = vec!["faults:write".to_owned()];
            adapter
                .invoke(&Invocation {
                    operation_id: &op,
                    contract: allowed.contract(),
                    arguments: allowed.proposal().arguments(),
                    canonical: allowed.proposal().canonical_arguments(),
                    scopes: &scopes,
                    tenant: "acme",
                    principal: "agent-7",
                    attempt: 1,
                    timeout: Duration::from_secs(2),
                })
                .await
                .unwrap();
        }
        ops.push((allowed.ledger_entry().id.clone(), op));
    }
    // A row younger than the stale threshold is left alone (it may still be running).
    assert_eq!(h.runtime.reconcile_stale(100).await.unwrap().examined, 0);
    let later = time::OffsetDateTime::now_utc() + time::Duration::seconds(5);
    let report = h.runtime.reconcile_older_than(later, 100).await.unwrap();
    assert_eq!(
        (report.committed, report.not_committed, report.unknown),
        (1, 1, 0)
    );
    let far = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    assert!(h.store.list_unresolved(far, 100).await.unwrap().is_empty());
    assert_eq!(h.faults.effects(ops[0].1.as_str()), 1);
    assert_eq!(h.faults.effects(ops[1].1.as_str()), 0);
    // The committed one replays; the other runs now, once.
    let a = h.run("credit", json!({"mode": "ok"}), Some("crash-a")).await;
    assert!(a.replayed);
    let b = h.run("credit", json!({"mode": "ok"}), Some("crash-b")).await;
    assert!(!b.replayed);
    committed(&b);
    assert_eq!(h.faults.effects(ops[1].1.as_str()), 1);
}

/// Presents one call until it is answered with a committed result, reconciling unknowns.
async fn until_committed(h: &Harness, key: &str) -> Value {
    for _ in 0..400 {
        match h.try_run("credit", json!({"mode": "random"}), Some(key)).await {
            Ok(Execution {
                result: Ok(Outcome::Committed(v)),
                ..
            }) => return v,
            Ok(
                e @ Execution {
                    result: Ok(Outcome::Unknown(_)),
                    ..
                },
            ) => {
                let r = row(h, &e).await;
                h.runtime.reconcile(&r).await.unwrap();
            }
            // Failed without effect, or in flight elsewhere: present it again.
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("{key} never committed");
}

pub async fn concurrent_executions_make_one_effect(h: &Arc<Harness>) {
    // 32 callers present the same idempotent write while the tool times out, drops answers
    // and fails at random.
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move { until_committed(&h, "same").await }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert!(
        results.windows(2).all(|w| w[0] == w[1]),
        "every caller sees the one result"
    );
    // 32 different operations the same way: each committed exactly once.
    let mut tasks = Vec::new();
    for i in 0..32 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            until_committed(&h, &format!("op-{i}")).await
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let seen = h.faults.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 33);
    for (op, s) in &seen {
        assert_eq!(s.effects, 1, "{op}: {s:?}");
    }
    // No row is left in progress or unknown.
    let page = h
        .store
        .list_ledger(
            "acme",
            &LedgerFilter {
                limit: 500,
                ..LedgerFilter::default()
            },
        )
        .await
        .unwrap();
    let mut cursor = page.next_cursor.clone();
    let mut rows = page.entries;
    while let Some(c) = cursor {
        let next = h
            .store
            .list_ledger(
                "acme",
                &LedgerFilter {
                    limit: 500,
                    cursor: Some(c),
                    ..LedgerFilter::default()
                },
            )
            .await
            .unwrap();
        cursor = next.next_cursor;
        rows.extend(next.entries);
    }
    assert!(rows.len() >= 64);
    for r in rows {
        assert!(r.outcome.is_none_or(records::Outcome::is_final), "{r:?}");
    }
}

pub async fn command_adapter(h: &Arc<Harness>) {
    let e = h.run("script", json!({"mode": "ok"}), Some("c-ok")).await;
    assert_eq!(committed(&e)["credit_id"], "cr_sh");

    // The child's environment holds only its own variables.
    let e = h.run("script", json!({"mode": "env"}), Some("c-env")).await;
    committed(&e);
    let env = std::fs::read_to_string(h.tools.join("env.txt")).unwrap();
    assert!(
        env.contains(&format!("WARRANT_OPERATION_ID={}", e.operation_id.as_str())),
        "{env}"
    );
    assert!(env.contains("WARRANT_TENANT=acme"));
    assert!(env.contains("WARRANT_SCOPES=faults:write"));
    for leaked in ["HOME=", "CARGO", "RUST", "USER="] {
        assert!(!env.contains(leaked), "{leaked} leaked into the child: {env}");
    }

    use ToolErrorCode::*;
    for (mode, code, attempts) in [
        ("exit64", Some(InputInvalid), 1),
        ("exit65", Some(InputInvalid), 1),
        ("exit69", Some(UpstreamUnavailable), 2),
        ("exit75", Some(RateLimited), 2),
        ("exit77", Some(PermissionDenied), 1),
        ("exit78", Some(PermanentFailure), 1),
        // Outside sysexits: the write may have happened.
        ("exit3", None, 1),
        ("exit124", None, 2),
        ("garbage", None, 1),
    ] {
        let e = h
            .run("script", json!({"mode": mode}), Some(&format!("c-{mode}")))
            .await;
        match code {
            Some(code) => assert_eq!(failed(&e), code, "{mode}"),
            None => unknown(&e),
        }
        assert_eq!(e.attempts, attempts, "{mode}");
    }

    // A hard timeout kills the whole process group, grandchildren included.
    let e = h.run("script", json!({"mode": "sleep"}), Some("c-sleep")).await;
    unknown(&e);
    let pid = std::fs::read_to_string(h.tools.join("grandchild.pid")).unwrap();
    let stat = format!("/proc/{}/stat", pid.trim());
    let mut alive = true;
    for _ in 0..50 {
        alive = std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z "));
        if !alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive, "the grandchild outlived the timeout");

    // A program outside the configured roots is refused when the binding is built.
    let doc = json!({
        "name": "escape", "version": 1, "description": "d", "owner": "o", "effect": "read",
        "scopes": [], "approval": "none",
        "input": {"type": "object", "additionalProperties": false, "properties": {}},
        "output": {"type": "object", "additionalProperties": false, "properties": {}},
        "adapter": {"kind": "command", "program": "/bin/sh"},
    });
    let c = warrant_core::Contract::from_document(doc).unwrap();
    let err = h.runtime.adapters().validate(&c).unwrap_err();
    assert!(
        err.to_string().contains("outside the configured command roots"),
        "{err}"
    );
}

pub async fn send_email_reaches_exactly_the_recipients(h: &Arc<Harness>) {
    let args = json!({
        "to": ["alice@customer.example"], "cc": ["bob@partner.example"], "bcc": ["carol@partner.example"],
        "subject": "Your refund", "body": "Hello Alice"
    });
    let e = h.run("mail", args, Some("m1")).await;
    let result = committed(&e).clone();
    let id = format!("<{}@acme.example>", e.operation_id.as_str());
    assert_eq!(result["message_id"], id);
    let messages = h.sink.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!(m.from, "support@acme.example");
    assert_eq!(
        m.recipients,
        [
            "alice@customer.example",
            "bob@partner.example",
            "carol@partner.example"
        ]
    );
    assert!(m.data.contains(&format!("Message-ID: {id}")), "{}", m.data);
    assert!(!m.data.contains("carol"), "bcc must not be in the headers");
    assert!(m.data.contains("Hello Alice"));

    // A recipient off the tenant's list is refused by the guard: nothing is sent.
    let d = h
        .try_run(
            "mail",
            json!({"to": ["mallory@evil.example"], "subject": "x", "body": "y"}),
            Some("m2"),
        )
        .await
        .unwrap_err();
    assert_eq!(rejected(d).code(), RejectCode::RecipientNotAllowed);
    assert_eq!(h.sink.messages.lock().unwrap().len(), 1);
}

/// `send_email` reads `to`, `cc` and `bcc` whatever the contract says: a binding is refused at
/// registration unless each one the input schema admits is allow-listed on a node that applies
/// to it in every valid call.
pub async fn a_send_email_binding_needs_every_recipient_field_guarded(h: &Arc<Harness>) {
    let list = |extra: Value| {
        let mut node =
            json!({"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 254}});
        for (k, v) in extra.as_object().unwrap() {
            node[k] = v.clone();
        }
        node
    };
    let guarded = || list(json!({"x-warrant-allowlist": "email_recipients"}));
    let mail = |input: Value| {
        warrant_core::Contract::from_document(json!({
            "name": "mail_check", "version": 1, "description": "send mail", "owner": "test",
            "effect": "irreversible", "scopes": ["email:send"], "approval": "none",
            "idempotency": {"honoured": false, "retention": "1h"},
            "input": input,
            "output": {"type": "object", "additionalProperties": false},
            "adapter": {"kind": "send_email", "from": "support@acme.example"},
        }))
        .unwrap()
    };
    let closed = |properties: Value| json!({"type": "object", "additionalProperties": false, "required": ["to"], "properties": properties});
    let adapters = h.runtime.adapters();
    let refused = |input: Value, field: &str| {
        let err = adapters.validate(&mail(input.clone())).unwrap_err();
        assert!(err.to_string().contains(&format!("`{field}`")), "{input}: {err}");
    };
    // `bcc` is admitted but not guarded.
    refused(closed(json!({"to": guarded(), "bcc": list(json!({}))})), "bcc");
    // `to` is guarded only when `then` applies.
    let mut conditional = closed(json!({"to": list(json!({})), "kind": {"enum": ["a", "b"]}}));
    conditional["if"] = json!({"properties": {"kind": {"const": "a"}}});
    conditional["then"] = closed(json!({"to": guarded(), "kind": {"enum": ["a"]}}));
    refused(conditional, "to");
    // `to` is guarded only when `cc` is present.
    let mut dependent = closed(json!({"to": list(json!({})), "cc": guarded()}));
    dependent["dependentSchemas"] = json!({"cc": {"properties": {"to": guarded()}}});
    refused(dependent, "to");
    // `to` is guarded in one `anyOf` branch only.
    refused(
        closed(json!({"to": {"anyOf": [guarded(), list(json!({}))]}})),
        "to",
    );

    // Guarded directly, through `$ref` and `allOf`; `cc`/`bcc` refused by the closed root.
    adapters
        .validate(&mail(closed(
            json!({"to": guarded(), "cc": guarded(), "bcc": guarded()}),
        )))
        .unwrap();
    let mut by_ref = closed(json!({"to": {"$ref": "#/$defs/recipients"}, "cc": {"allOf": [guarded()]}}));
    by_ref["$defs"] = json!({"recipients": guarded()});
    adapters.validate(&mail(by_ref)).unwrap();
    adapters
        .validate(&mail(closed(json!({"to": guarded(), "bcc": false}))))
        .unwrap();
}

pub async fn structured_data_fetch(h: &Arc<Harness>) {
    let e = h.run("fetch_order", json!({"name": "order"}), None).await;
    assert_eq!(committed(&e)["status"], "paid");
    use ToolErrorCode::*;
    for (name, code) in [
        ("garbage", OutputInvalid),
        ("big", OutputInvalid),
        ("missing", PermanentFailure),
        ("../honoured", PermanentFailure),
    ] {
        let e = h.run("fetch_order", json!({"name": name}), None).await;
        assert_eq!(failed(&e), code, "{name}");
    }

    // Without the operator's allowance, loopback is refused before anything is sent.
    let before = h.faults.seen.lock().unwrap().len();
    let runtime = without_credentials(h, NetPolicy::default());
    let proposal = json!({"tool": "fetch_order", "version": 1, "arguments": {"name": "order"}});
    let allowed = h.allow(&proposal).await.unwrap();
    let e = runtime.execute(allowed).await.unwrap();
    assert_eq!(failed(&e), PermanentFailure);
    assert!(row(h, &e).await.detail.unwrap().contains("refused"));
    assert_eq!(h.faults.seen.lock().unwrap().len(), before);
}

/// A call sent again with the key of an operation that finished is that operation's replay,
/// even when its binding has since become unusable (the operator removed its credential): the
/// client learns the effect happened, not that the call failed. A new key fails, unsent.
pub async fn a_finished_call_is_replayed_though_its_binding_became_unusable(h: &Arc<Harness>) {
    let first = h.run("credit", json!({"mode": "ok"}), Some("bind-gone")).await;
    committed(&first);
    let op = first.operation_id.as_str().to_owned();
    // The same store and contracts, without the credential the credit tool's binding names.
    let runtime = without_credentials(
        h,
        NetPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            ..NetPolicy::default()
        },
    );
    let proposal = json!({"tool": "credit", "version": 1, "arguments": {"mode": "ok"},
        "idempotency_key": "bind-gone"});
    let again = runtime.execute(h.allow(&proposal).await.unwrap()).await.unwrap();
    assert!(again.replayed, "{:?} {:?}", again.result, again.detail);
    assert_eq!(committed(&again), committed(&first));
    assert_eq!(h.faults.effects(&op), 1);
    let other = json!({"tool": "credit", "version": 1, "arguments": {"mode": "ok"},
        "idempotency_key": "bind-gone-2"});
    let e = runtime.execute(h.allow(&other).await.unwrap()).await.unwrap();
    assert_eq!(failed(&e), ToolErrorCode::Unclassified);
}

/// A crash-abandoned `attempting` row past the alert threshold, which reconciliation cannot
/// resolve, keeps the ledger note that it needs an operator: the pass that marks it overdue
/// and then leaves it `unknown` puts the reason after the note, not in its place.
pub async fn an_abandoned_row_marked_overdue_keeps_its_note(h: &Arc<Harness>) {
    let proposal =
        json!({"tool": "blind", "version": 1, "idempotency_key": "old-blind", "arguments": {"mode": "ok"}});
    let allowed = h.allow(&proposal).await.unwrap();
    // Written two hours ago by a process that then died.
    let mut entry = allowed.ledger_entry().clone();
    entry.created_at -= time::Duration::hours(2);
    entry.updated_at = entry.created_at;
    h.store
        .begin_attempt(
            &entry,
            allowed.idempotency_scope(),
            &AttemptClaims::NONE,
            time::OffsetDateTime::now_utc() + time::Duration::hours(1),
        )
        .await
        .unwrap();
    let schedule = warrant_runtime::reconcile::ReconcileSchedule {
        overdue_after: Duration::from_secs(3600),
        ..Default::default()
    };
    let pass = h
        .runtime
        .reconcile_pass(time::OffsetDateTime::now_utc(), 100, &schedule)
        .await
        .unwrap();
    assert_eq!(pass.newly_overdue, 1);
    let row = h.store.get_ledger("acme", &entry.id).await.unwrap().unwrap();
    assert_eq!(row.outcome, Some(records::Outcome::Unknown));
    let detail = row.detail.unwrap_or_default();
    assert!(detail.starts_with("needs an operator"), "{detail}");
    assert!(
        detail.contains("; reconciliation could not tell") && detail.contains("no status endpoint"),
        "and the reason after it: {detail}"
    );
}

/// A read without an idempotency key (recorded after the call, in one transaction) leaves
/// exactly one ledger row per call, with its outcome and attempts, whatever the outcome.
pub async fn a_keyless_read_is_one_ledger_row(h: &Arc<Harness>) {
    let ok = h.run("lookup", json!({"mode": "ok"}), None).await;
    committed(&ok);
    let failed_read = h.run("lookup", json!({"mode": "bad_output"}), None).await;
    assert_eq!(failed(&failed_read), ToolErrorCode::OutputInvalid);
    let filter = LedgerFilter {
        tool: Some("lookup".to_owned()),
        limit: 100,
        ..LedgerFilter::default()
    };
    let page = h.store.list_ledger("acme", &filter).await.unwrap();
    let mut outcomes: Vec<_> = page
        .entries
        .iter()
        .map(|r| (r.id.clone(), r.outcome, r.attempts))
        .collect();
    outcomes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected = vec![
        (ok.ledger_id.clone(), Some(records::Outcome::Committed), 1),
        (failed_read.ledger_id.clone(), Some(records::Outcome::Failed), 1),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(outcomes, expected);
}

pub async fn committed_spend_is_charged(h: &Arc<Harness>) {
    let key = format!("cost_spent:tenant:{}", time::OffsetDateTime::now_utc().date());
    h.run("credit", json!({"mode": "ok"}), Some("s1")).await;
    h.run("credit", json!({"mode": "ok"}), Some("s2")).await;
    // A replay and a failure cost nothing.
    h.run("credit", json!({"mode": "ok"}), Some("s2")).await;
    h.run("credit", json!({"mode": "400"}), Some("s3")).await;
    assert_eq!(h.store.budget_used("acme", &key).await.unwrap(), 4);
}

pub async fn the_background_reconciler_resolves_on_its_own(h: &Arc<Harness>) {
    let rt = eager_reconciler(h);
    let e = h.run("note", json!({"mode": "commit_drop"}), Some("bg")).await;
    unknown(&e);
    let task = warrant_runtime::reconcile::spawn_reconciler(rt, Duration::from_millis(50));
    let mut outcome = None;
    for _ in 0..100 {
        outcome = row(h, &e).await.outcome;
        if outcome == Some(records::Outcome::ReconciledCommitted) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
    assert_eq!(outcome, Some(records::Outcome::ReconciledCommitted));
}

/// A credential goes only where the operator pinned it: a model-chosen URL at another origin
/// fails with `TOOL_PERMISSION_DENIED` and nothing is sent; a binding cannot name a credential
/// that is not granted to its tool (an environment variable, another tool's), and a fixed URL
/// outside the pins is refused when the binding is built.
pub async fn credentials_reach_only_their_tools_and_origins(h: &Arc<Harness>) {
    let addr = h.faults_addr;
    let e = h
        .run(
            "fetch_any",
            json!({"url": format!("http://{addr}/json/order")}),
            None,
        )
        .await;
    assert_eq!(committed(&e)["status"], "paid");
    assert_eq!(
        h.faults.header("fetch:order", "authorization").as_deref(),
        Some("Bearer tok-fetch-secret")
    );
    // Another origin (another port of the same host): refused before anything is sent.
    let other = format!(
        "http://127.0.0.1:{}/json/elsewhere",
        addr.port().wrapping_add(1).max(1)
    );
    let e = h.run("fetch_any", json!({"url": other}), None).await;
    assert_eq!(failed(&e), ToolErrorCode::PermissionDenied);
    assert_eq!(h.faults.requests("fetch:elsewhere"), 0);

    let adapters = Adapters::new(AdapterConfig {
        client: SafeClient::new(NetPolicy::default()),
        secrets: crate::support::secrets(addr),
        smtp: None,
        command_roots: Vec::new(),
        model: None,
    });
    let bind = |name: &str, adapter: serde_json::Value| {
        let doc = json!({
            "name": name, "version": 1, "description": "d", "owner": "o",
            "effect": "read", "scopes": ["s"],
            "input": {"type": "object", "additionalProperties": false, "properties": {}},
            "output": {"type": "object"},
            "adapter": adapter,
        });
        warrant_core::Contract::from_document(doc).unwrap()
    };
    for credential in ["HOME", "PATH", "WARRANT_REDACTION_KEY", "CREDIT_TOKEN"] {
        let c = bind(
            "probe",
            json!({"kind": "http", "url": format!("http://{addr}/honoured"), "credential": credential}),
        );
        assert_eq!(
            adapters.validate(&c),
            Err(warrant_runtime::BindingError::MissingCredential(
                credential.into()
            )),
            "{credential}"
        );
    }
    // The credit tool's own credential, at an origin it is not pinned to.
    let c = bind(
        "credit",
        json!({"kind": "http", "url": "https://elsewhere.example/credits", "credential": "CREDIT_TOKEN"}),
    );
    assert!(matches!(
        adapters.validate(&c),
        Err(warrant_runtime::BindingError::CredentialOrigin { .. })
    ));
}

/// The SMTP relay is reached through the outbound guard: without the operator allowing the
/// relay's host, a loopback relay is refused and nothing is sent; a login without TLS is
/// refused outright.
pub async fn the_smtp_relay_goes_through_the_outbound_guard(h: &Arc<Harness>) {
    let before = h.sink.messages.lock().unwrap().len();
    let guarded = Arc::new(Adapters::new(AdapterConfig {
        client: SafeClient::new(NetPolicy::default()),
        secrets: Secrets::default(),
        smtp: Some(h.runtime.adapters().config().smtp.clone().unwrap()),
        command_roots: Vec::new(),
        model: None,
    }));
    let runtime = Runtime::new(
        h.store.clone(),
        h.authority.registry().clone(),
        h.authority.env().clone(),
        guarded,
        *h.runtime.settings(),
    );
    let proposal = json!({"tool": "mail", "version": 1, "idempotency_key": "guarded-mail",
        "arguments": {"to": ["alice@customer.example"], "subject": "s", "body": "b"}});
    let allowed = h.allow(&proposal).await.unwrap();
    let e = runtime.execute(allowed).await.unwrap();
    assert_eq!(failed(&e), ToolErrorCode::PermanentFailure);
    assert_eq!(
        h.sink.messages.lock().unwrap().len(),
        before,
        "nothing reached the relay"
    );
    let plain_login = warrant_runtime::adapters::SmtpRelay {
        host: "127.0.0.1".into(),
        port: 25,
        security: warrant_runtime::adapters::RelaySecurity::Plain,
        login: Some(warrant_runtime::Secret::new("user:password")),
    };
    assert!(plain_login.check().is_err());
}

/// An idempotency record that expired while its operation was still in flight is not taken
/// over by a new call: the operation is reconciled first (here it had committed at the tool,
/// so the new call replays it instead of repeating the effect).
pub async fn an_expired_in_flight_operation_is_reconciled_first(h: &Arc<Harness>) {
    let proposal =
        json!({"tool": "note", "version": 1, "arguments": {"mode": "ok"}, "idempotency_key": "exp-1"});
    let first = h.allow(&proposal).await.unwrap();
    let op = operation_id(first.ledger_entry(), first.idempotency_scope());
    let expired = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    h.store
        .begin_attempt(
            first.ledger_entry(),
            first.idempotency_scope(),
            &AttemptClaims::NONE,
            expired,
        )
        .await
        .unwrap();
    // The abandoned attempt reached the tool before its caller went away.
    let adapter = h.runtime.adapters().for_contract(first.contract()).unwrap();
    adapter
        .invoke(&Invocation {
            operation_id: &op,
            contract: first.contract(),
            arguments: first.proposal().arguments(),
            canonical: first.proposal().canonical_arguments(),
            scopes: &[],
            tenant: &first.ledger_entry().tenant,
            principal: &first.ledger_entry().principal,
            attempt: 1,
            timeout: std::time::Duration::from_secs(5),
        })
        .await
        .unwrap();
    assert_eq!(h.faults.effects(op.as_str()), 1);

    let again = h.run("note", json!({"mode": "ok"}), Some("exp-1")).await;
    assert_eq!(again.operation_id, op);
    assert_eq!(committed(&again)["status"], "applied");
    assert_eq!(h.faults.effects(op.as_str()), 1, "the effect must not repeat");
    let old = h
        .store
        .get_ledger("acme", &first.ledger_entry().id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.outcome, Some(records::Outcome::ReconciledCommitted));
}

/// An unknown call that reconciliation finds committed only after its key's retention ran out
/// (a reconciler that reached it late): its record is kept for a retention from then, so the
/// same call sent again — as its `unknown` answer tells the client to — replays the effect
/// instead of running it a second time, even after the sweeper has passed.
pub async fn a_key_resolved_after_its_retention_is_kept_from_then(h: &Arc<Harness>) {
    // A runtime that keeps a key no longer than its contract says (`stale_after` zero), as a
    // short retention with a short `stale_after` does.
    let runtime = eager_reconciler(h);
    let proposal = json!({"tool": "brief", "version": 1, "arguments": {"mode": "commit_drop"},
        "idempotency_key": "brief-late"});
    let e = runtime.execute(h.allow(&proposal).await.unwrap()).await.unwrap();
    unknown(&e);
    let op = e.operation_id.as_str().to_owned();
    assert_eq!(h.faults.effects(&op), 1);
    // The key's retention (1 s) runs out while the call is unknown.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let r = row(h, &e).await;
    assert_eq!(
        runtime.reconcile(&r).await.unwrap(),
        Resolution::Committed { effects: 1 }
    );
    // The sweeper passes: it forgets keys past their retention, not this one.
    h.store
        .purge_expired(time::OffsetDateTime::now_utc())
        .await
        .unwrap();
    let again = runtime.execute(h.allow(&proposal).await.unwrap()).await.unwrap();
    assert!(again.replayed, "{:?}", again.result);
    assert_eq!(h.faults.effects(&op), 1, "the effect must not repeat");
}

/// A call whose row was resolved by reconciliation as "no effect" while it was still running
/// (it outlived `stale_after`), and that then commits, corrects the row: the ledger ends up
/// saying what happened, and a retry with the key replays instead of running again.
pub async fn a_commit_after_reconciliation_corrects_the_ledger(h: &Arc<Harness>) {
    let proposal =
        json!({"tool": "credit", "version": 1, "arguments": {"mode": "slow"}, "idempotency_key": "late-1"});
    let allowed = h.allow(&proposal).await.unwrap();
    let ledger_id = allowed.ledger_entry().id.clone();
    let scope = allowed.idempotency_scope().cloned();
    let runtime = h.runtime.clone();
    let call = tokio::spawn(async move { runtime.execute(allowed).await.unwrap() });
    // While the tool works (150 ms), a reconciler resolves the row as not committed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let row = h.store.get_ledger("acme", &ledger_id).await.unwrap();
        if row.is_some_and(|r| r.outcome == Some(records::Outcome::Attempting)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the attempt never started");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let not = records::AttemptFinish {
        outcome: records::Outcome::ReconciledNotCommitted,
        attempts: 1,
        error_code: None,
        result: None,
        latency_ms: 0,
        cost: 0,
        detail: Some("the tool has no record of the operation".into()),
        charges: Vec::new(),
    };
    h.store
        .finish_attempt(
            "acme",
            &ledger_id,
            scope.as_ref(),
            &not,
            time::OffsetDateTime::now_utc(),
        )
        .await
        .unwrap();
    let e = call.await.unwrap();
    assert_eq!(committed(&e)["status"], "applied");
    let r = row(h, &e).await;
    assert_eq!(r.outcome, Some(records::Outcome::Committed), "{r:?}");
    assert!(
        r.detail.as_deref().unwrap_or_default().contains("corrected"),
        "{:?}",
        r.detail
    );
    let again = h.run("credit", json!({"mode": "slow"}), Some("late-1")).await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(h.faults.effects(e.operation_id.as_str()), 1);
}

/// Starvation: 1,000 `unknown` rows whose tool has no status endpoint (so every inquiry
/// answers "cannot tell") are older than one crash-abandoned `attempting` row whose tool can
/// be asked. Passes of 100 rows each reach the resolvable row within a bounded number of
/// passes: rows that stayed unresolved are rescheduled (with backoff), not re-read first.
/// A pass asks about a claimed row only with time left in its lease for the whole inquiry:
/// once the lease ends another worker may claim the row, and the two would ask at once.
pub async fn a_pass_asks_only_within_its_lease(h: &Arc<Harness>) {
    let e = h
        .run("blind", json!({"mode": "commit_drop"}), Some("lease-1"))
        .await;
    unknown(&e);
    let far = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    let short = warrant_runtime::reconcile::ReconcileSchedule {
        lease: Duration::from_secs(1),
        ask_all_now: true,
        ..warrant_runtime::reconcile::ReconcileSchedule::default()
    };
    // A one-second lease leaves no time for a ten-second inquiry: claimed, not asked.
    let pass = h.runtime.reconcile_pass(far, 10, &short).await.unwrap();
    assert_eq!((pass.totals.examined, pass.left), (0, 1), "{pass:?}");
    // Due again once that lease ends, for any worker.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let normal = warrant_runtime::reconcile::ReconcileSchedule {
        ask_all_now: true,
        ..warrant_runtime::reconcile::ReconcileSchedule::default()
    };
    let pass = h.runtime.reconcile_pass(far, 10, &normal).await.unwrap();
    assert_eq!((pass.totals.examined, pass.left), (1, 0), "{pass:?}");
}

pub async fn a_thousand_unresolvable_rows_do_not_hide_one_behind_them(h: &Arc<Harness>) {
    const BLIND: usize = 1_000;
    let blind = h
        .allow(&json!({"tool": "blind", "version": 1, "idempotency_key": "blind-template", "arguments": {"mode": "ok"}}))
        .await
        .unwrap();
    let template = blind.ledger_entry().clone();
    let mut tasks = tokio::task::JoinSet::new();
    let exp = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    for i in 0..BLIND {
        let store = h.store.clone();
        let mut entry = template.clone();
        entry.id = format!("led_blind_{i:05}");
        entry.idempotency_key = None;
        entry.created_at -= time::Duration::minutes(10);
        entry.updated_at = entry.created_at;
        tasks.spawn(async move {
            store
                .begin_attempt(&entry, None, &AttemptClaims::NONE, exp)
                .await
                .unwrap();
            let finish = records::AttemptFinish {
                outcome: records::Outcome::Unknown,
                attempts: 1,
                error_code: Some("TOOL_TIMEOUT".into()),
                result: None,
                latency_ms: 1,
                cost: 0,
                detail: Some("lost answer".into()),
                charges: Vec::new(),
            };
            let at = entry.created_at;
            store
                .finish_attempt(&entry.tenant, &entry.id, None, &finish, at)
                .await
                .unwrap();
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // Behind them: a crash left this write `attempting`; its tool can tell it never ran.
    let proposal =
        json!({"tool": "credit", "version": 1, "idempotency_key": "behind", "arguments": {"mode": "ok"}});
    let allowed = h.allow(&proposal).await.unwrap();
    h.store
        .begin_attempt(
            allowed.ledger_entry(),
            allowed.idempotency_scope(),
            &AttemptClaims::NONE,
            exp,
        )
        .await
        .unwrap();
    let behind = allowed.ledger_entry().id.clone();
    let rt = eager_reconciler(h);
    let mut reached = None;
    for pass in 1..=15 {
        rt.reconcile_stale(100).await.unwrap();
        let row = h.store.get_ledger("acme", &behind).await.unwrap().unwrap();
        if row.outcome == Some(records::Outcome::ReconciledNotCommitted) {
            reached = Some(pass);
            break;
        }
    }
    assert!(
        reached.is_some_and(|p| p <= 11),
        "the resolvable row was not reached in 15 passes of 100 ({reached:?})"
    );
    // Each unresolvable row says why, for the operator.
    let far = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    let claimed = h
        .store
        .claim_unresolved("inspector", far, far, far, 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(claimed[0].reconcile_attempts, 1);
    assert_eq!(
        claimed[0].reconcile_note.as_deref(),
        Some("no status endpoint: the `http` binding has no `status_url`, so no one can be asked")
    );
}

/// The tool committed, but the store went away before the outcome was written (a lost
/// database, a full disk): the answer is `unknown` and marked unrecorded — never `failed`,
/// never "nothing ran, retry later" — and the row the write-ahead commit wrote stays
/// `attempting` for reconciliation.
pub async fn an_outcome_that_cannot_be_recorded_is_unknown(h: &Arc<Harness>) {
    let key = "unrecorded-1";
    let proposal =
        json!({"tool": "credit", "version": 1, "arguments": {"mode": "slow"}, "idempotency_key": key});
    let allowed = h.allow(&proposal).await.unwrap();
    let ledger_id = allowed.ledger_entry().id.clone();
    let runtime = h.runtime.clone();
    let running = tokio::spawn(async move { runtime.execute(allowed).await });
    // `slow` commits, then answers 150 ms later: the store is closed in between.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let effects = || {
        h.faults
            .seen
            .lock()
            .unwrap()
            .values()
            .map(|s| s.effects)
            .sum::<u32>()
    };
    while effects() == 0 {
        assert!(std::time::Instant::now() < until, "the tool was never called");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    h.sql.close().await;
    let execution = running.await.unwrap().unwrap();
    assert!(execution.unrecorded, "{execution:?}");
    assert!(
        matches!(execution.result, Ok(Outcome::Unknown(_))),
        "{:?}",
        execution.result
    );
    assert_eq!(execution.ledger_id, ledger_id);
    assert_eq!(effects(), 1);
}

/// A runtime over the harness's store and registry whose adapters have no credentials, no
/// relay and no command roots, and reach the network as `net` lets them.
fn without_credentials(h: &Harness, net: NetPolicy) -> Runtime {
    let adapters = Arc::new(Adapters::new(AdapterConfig {
        client: SafeClient::new(net),
        secrets: Secrets::default(),
        smtp: None,
        command_roots: Vec::new(),
        model: None,
    }));
    Runtime::new(
        h.store.clone(),
        h.authority.registry().clone(),
        h.authority.env().clone(),
        adapters,
        *h.runtime.settings(),
    )
}

/// A runtime over the harness's store, registry and adapters that takes every `attempting` row
/// for abandoned at once (`stale_after` zero), as a reconciler long after a crash would.
fn eager_reconciler(h: &Harness) -> Runtime {
    let settings = RuntimeSettings {
        stale_after: Duration::ZERO,
        ..*h.runtime.settings()
    };
    Runtime::new(
        h.store.clone(),
        h.authority.registry().clone(),
        h.authority.env().clone(),
        h.runtime.adapters().clone(),
        settings,
    )
}
