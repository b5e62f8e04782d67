//! Crash safety of the embedded store: a child process streams write-ahead attempts and
//! ledger rows into SQLite, announcing each acknowledged commit; the parent SIGKILLs it mid-
//! stream, reopens the store, and finds every acknowledged write intact and no torn row.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::json;
use time::OffsetDateTime;
use time::macros::datetime;
use warrant_store::*;

const CHILD_ENV: &str = "WARRANT_CRASH_CHILD_DIR";
const T0: OffsetDateTime = datetime!(2026-11-29 12:00 UTC);

/// The row the child writes for sequence number `n` (deterministic, so the parent can compare).
fn row(round: u32, n: u32) -> (LedgerEntry, IdempotencyScope) {
    let id = format!("led_{round}_{n:06}");
    let at = T0 + time::Duration::milliseconds(i64::from(n));
    let mut e = LedgerEntry::new(
        id.clone(),
        "acme",
        "agent-7",
        &format!("trace-{id}"),
        "create_support_credit",
        at,
    );
    e.decision = LedgerDecision::Allow;
    e.outcome = Some(Outcome::Attempting);
    e.contract_id = Some("tool-contract@sha256:aa".into());
    e.payload_digest = Some(format!("sha256:{n:064x}"));
    e.idempotency_key = Some(format!("key-{round}-{n}"));
    // Large enough to span pages, so a torn write would show.
    e.arguments = Some(json!({"n": n, "reason": "x".repeat(3000 + (n as usize % 2000))}));
    let scope = IdempotencyScope {
        tenant: "acme".into(),
        principal: "agent-7".into(),
        contract_id: "tool-contract@sha256:aa".into(),
        key: format!("key-{round}-{n}"),
    };
    (e, scope)
}

/// Runs only as the child process: writes until killed.
#[tokio::test]
async fn crash_writer_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let round: u32 = std::env::var("WARRANT_CRASH_ROUND").unwrap().parse().unwrap();
    let store = SqlStore::open(&DatabaseUrl::data_dir(&dir), &StoreOptions::default())
        .await
        .unwrap();
    let mut out = std::io::stdout().lock();
    for n in 0..1_000_000 {
        let (e, scope) = row(round, n);
        let start = store
            .begin_attempt(
                &e,
                Some(&scope),
                &AttemptClaims::NONE,
                T0 + time::Duration::hours(24),
            )
            .await
            .unwrap();
        assert_eq!(start, AttemptStart::Started);
        if n % 2 == 0 {
            let finish = AttemptFinish {
                outcome: Outcome::Committed,
                attempts: 1,
                error_code: None,
                result: Some(json!({"credit_id": format!("cr_{n}")})),
                latency_ms: 3,
                cost: 1,
                detail: None,
                charges: Vec::new(),
            };
            store
                .finish_attempt("acme", &e.id, Some(&scope), &finish, e.created_at)
                .await
                .unwrap();
        }
        // Acknowledged only after the commit returned.
        writeln!(out, "ack {n}").unwrap();
        out.flush().unwrap();
    }
}

#[tokio::test]
async fn sqlite_keeps_every_acknowledged_write_across_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for (round, kill_after) in [(0u32, 150u32), (1, 37), (2, 401)] {
        let mut child = Command::new(&exe)
            .args(["crash_writer_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .env("WARRANT_CRASH_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked = Vec::new();
        for line in lines.by_ref() {
            if let Some(n) = line.unwrap().strip_prefix("ack ") {
                acked.push(n.parse::<u32>().unwrap());
                if acked.len() as u32 == kill_after {
                    child.kill().unwrap(); // SIGKILL, mid-stream
                    break;
                }
            }
        }
        // Acknowledgements already in the pipe count as acknowledged too.
        for line in lines {
            if let Some(n) = line.unwrap().strip_prefix("ack ") {
                acked.push(n.parse().unwrap());
            }
        }
        child.wait().unwrap();
        assert!(
            acked.len() as u32 >= kill_after,
            "round {round}: child died early"
        );

        let store = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
            .await
            .unwrap();
        for &n in &acked {
            let (expected, scope) = row(round, n);
            let stored = store
                .get_ledger("acme", &expected.id)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: acknowledged row {} lost", expected.id));
            let record = store.get_idempotency(&scope).await.unwrap().unwrap();
            if n % 2 == 0 {
                assert_eq!(stored.outcome, Some(Outcome::Committed));
                assert_eq!(record.status, IdempotencyStatus::Committed);
                assert_eq!(record.result, Some(json!({"credit_id": format!("cr_{n}")})));
            } else {
                assert_eq!(stored, expected, "round {round}: row {n} differs");
                assert_eq!(record.status, IdempotencyStatus::InFlight);
            }
            assert_eq!(stored.arguments, expected.arguments);
        }
        // Every row in the file reads back whole (a torn row would fail to decode).
        let mut filter = LedgerFilter {
            limit: 500,
            ..LedgerFilter::default()
        };
        let mut total = 0;
        loop {
            let page = store.list_ledger("acme", &filter).await.unwrap();
            total += page.entries.len();
            match page.next_cursor {
                Some(c) => filter.cursor = Some(c),
                None => break,
            }
        }
        assert!(total >= acked.len());
        // The crash left `attempting` rows for reconciliation to find, never silent effects.
        let open = store
            .list_unresolved(T0 + time::Duration::days(1), 10_000)
            .await
            .unwrap();
        assert!(open.iter().all(|e| e.outcome == Some(Outcome::Attempting)));
        store.close().await;
    }
    // SQLite's own verdict on the file.
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!(
        "sqlite://{}",
        dir.path().join("warrant.db").display()
    ))
    .await
    .unwrap();
    let (verdict,): (String,) = sqlx::query_as("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(verdict, "ok");
}
