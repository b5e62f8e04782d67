//! A process killed mid-execution leaves `attempting` rows; `warrant reconcile` afterwards
//! resolves every one of them by asking the tool, and no effect happens twice.
//!
//! The child (this test binary, re-run with an environment variable) executes writes of a
//! tool that does not deduplicate, each committing at the loopback fault server and answering
//! 150 ms later, from 8 concurrent callers; the parent SIGKILLs it while calls are in flight,
//! runs the real `warrant reconcile`, and compares the ledger with the server's effects.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

#[path = "../crates/warrant-runtime/tests/runtime/faults.rs"]
#[allow(dead_code, reason = "shared with the runtime's tests")]
mod faults;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use warrant_core::Contract;
use warrant_core::authority::Principal;
use warrant_core::budget::BudgetConfig;
use warrant_core::decision::{Decision, Outcome};
use warrant_core::guard::Guards;
use warrant_core::pipeline::{Authority, Call, Settings};
use warrant_core::records;
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_policy::{CedarEngine, PolicySource};
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::execute::{operation_id, scope_of};
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{Adapters, Runtime, RuntimeSettings, Secrets};
use warrant_store::{DatabaseUrl, LedgerFilter, SqlStore, Store, StoreOptions, SystemEnv};

const CHILD_DIR: &str = "WARRANT_EXEC_CRASH_DIR";
const CHILD_ADDR: &str = "WARRANT_EXEC_CRASH_ADDR";

fn contract(addr: &str) -> Contract {
    Contract::from_document(json!({
        "name": "note", "version": 1, "description": "a write that is not deduplicated", "owner": "test",
        "effect": "write", "scopes": ["notes:write"], "approval": "none",
        "idempotency": {"honoured": false, "retention": "1h"}, "retry": {"max_attempts": 1},
        "input": {"type": "object", "additionalProperties": false, "required": ["mode"],
                  "properties": {"mode": {"type": "string", "maxLength": 16},
                                 "n": {"type": "integer", "minimum": 0, "maximum": 1000000}}},
        "output": {"type": "object", "additionalProperties": false, "required": ["credit_id", "status"],
                   "properties": {"credit_id": {"type": "string", "maxLength": 64},
                                  "status": {"enum": ["applied", "pending"]}}},
        "adapter": {"kind": "http", "url": format!("http://{addr}/plain"), "timeout": "5s",
                    "status_url": format!("http://{addr}/status/{{operation_id}}")},
    }))
    .unwrap()
}

/// Runs only as the child: executes calls until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_executor_child() {
    let (Ok(dir), Ok(addr)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_ADDR)) else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(
        SqlStore::open(&DatabaseUrl::data_dir(&dir), &StoreOptions::default())
            .await
            .unwrap(),
    );
    let env = Arc::new(SystemEnv);
    let registry = Arc::new(Registry::new(store.clone(), time::Duration::seconds(60)));
    let c = contract(&addr);
    registry
        .register(c.clone(), time::OffsetDateTime::now_utc())
        .await
        .unwrap();
    let policy = CedarEngine::new(
        &[Arc::new(c)],
        &[PolicySource::new(
            "p.cedar",
            "permit (principal, action, resource);",
        )],
    )
    .unwrap();
    let authority = Arc::new(Authority::new(
        store.clone(),
        registry.clone(),
        Arc::new(policy),
        Arc::new(Guards::new()),
        BudgetConfig::default(),
        RedactionKey::new(vec![7; 32]).unwrap(),
        env.clone(),
        Settings::default(),
    ));
    let adapters = Arc::new(Adapters::new(AdapterConfig {
        client: SafeClient::new(NetPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            ..NetPolicy::default()
        }),
        secrets: Secrets::default(),
        smtp: None,
        command_roots: Vec::new(),
        model: None,
    }));
    let runtime = Arc::new(Runtime::new(
        store,
        registry,
        env,
        adapters,
        RuntimeSettings::default(),
    ));
    let principal = Principal::new("agent-1", "acme", ["notes:write".to_owned()]).unwrap();
    let mut workers = Vec::new();
    for w in 0..8u32 {
        let (authority, runtime, principal) = (authority.clone(), runtime.clone(), principal.clone());
        workers.push(tokio::spawn(async move {
            for i in 0..100_000u32 {
                let key = format!("w{w}-{i}");
                let bytes = json!({"tool": "note", "version": 1, "idempotency_key": key,
                                   "arguments": {"mode": "slow", "n": i}})
                .to_string();
                let decided = authority
                    .decide(
                        &principal,
                        &Call {
                            bytes: bytes.as_bytes(),
                            trace_id: "crash",
                            ..Call::default()
                        },
                    )
                    .await
                    .unwrap();
                let Decision::Allow(allowed) = decided.decision else {
                    panic!("{:?}", decided.decision)
                };
                let done = runtime.execute(allowed).await.unwrap();
                assert!(matches!(done.result, Ok(Outcome::Committed(_))), "{done:?}");
                println!("done {key}");
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_after_a_crash_mid_execution_leaves_nothing_attempting_and_no_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, faults) = faults::start().await;
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(&exe)
        .args([
            "crash_executor_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .env(CHILD_ADDR, addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut done = 0;
        for line in BufReader::new(stdout).lines() {
            if line.unwrap().starts_with("done ") {
                done += 1;
            }
        }
        done
    });
    // Wait until calls have completed and more are in flight (committed at the tool, not yet
    // recorded), then kill.
    let mut waited = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
        let effects: u32 = faults.seen.lock().unwrap().values().map(|s| s.effects).sum();
        if effects >= 40 || waited > 600 {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL, mid-execution
    child.wait().unwrap();
    let acknowledged = reader.join().unwrap();
    assert!(
        acknowledged >= 8,
        "the child finished too few calls before the kill: {acknowledged}"
    );

    // Before: the crash left rows in progress.
    let store = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
        .await
        .unwrap();
    let far = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    let open = store.list_unresolved(far, 10_000).await.unwrap();
    assert!(
        !open.is_empty(),
        "the kill landed between calls; nothing to reconcile"
    );
    assert!(
        open.iter()
            .all(|r| r.outcome == Some(records::Outcome::Attempting))
    );
    store.close().await;

    let out = Command::new(env!("CARGO_BIN_EXE_warrant"))
        .args([
            "reconcile",
            "--older-than",
            "0s",
            "--allow-host",
            "127.0.0.1",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("examined={}", open.len())), "{text}");
    assert!(
        text.contains("unknown=0") && text.contains("duplicates=0"),
        "{text}"
    );

    // After: nothing in progress, and the ledger agrees with the tool, one effect per call.
    let store = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
        .await
        .unwrap();
    assert!(store.list_unresolved(far, 10_000).await.unwrap().is_empty());
    let mut filter = LedgerFilter {
        limit: 500,
        ..LedgerFilter::default()
    };
    let mut rows = Vec::new();
    loop {
        let page = store.list_ledger("acme", &filter).await.unwrap();
        rows.extend(page.entries);
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    let seen = faults.seen.lock().unwrap().clone();
    let mut committed = 0;
    for r in &rows {
        let op = operation_id(r, scope_of(r).as_ref());
        let effects = seen.get(op.as_str()).map_or(0, |s| s.effects);
        match r.outcome {
            Some(records::Outcome::Committed | records::Outcome::ReconciledCommitted) => {
                committed += 1;
                assert_eq!(effects, 1, "{r:?}");
            }
            Some(records::Outcome::ReconciledNotCommitted) => assert_eq!(effects, 0, "{r:?}"),
            other => panic!("unexpected outcome {other:?}: {r:?}"),
        }
    }
    // Every effect the tool holds belongs to exactly one committed row.
    let total: u32 = seen.values().map(|s| s.effects).sum();
    assert_eq!(total, committed);
    assert!(seen.values().all(|s| s.effects <= 1));
    store.close().await;
}
