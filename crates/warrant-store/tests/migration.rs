//! Migrations apply to a database that already holds rows: a store at version 3 (before the
//! per-row reconciliation schedule) with unresolved ledger rows is opened by this version, and
//! its rows are claimable, due as before.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests"
)]

use std::path::Path;
use std::time::Duration;

use sqlx::Connection;
use time::OffsetDateTime;
use warrant_store::testing::TestDatabase;
use warrant_store::*;

/// A migrator of the migrations before version 4 only.
async fn version_3(backend: &str, dir: &Path) -> sqlx::migrate::Migrator {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    for name in ["0001_initial.sql", "0002_tenancy.sql", "0003_write_probe.sql"] {
        std::fs::copy(source.join(name), dir.join(name)).unwrap();
    }
    sqlx::migrate::Migrator::new(dir).await.unwrap()
}

const INSERT: &str = "INSERT INTO ledger (id, tenant, principal, trace_id, tool, contract_id, decision, \
                      attempts, outcome, created_at, updated_at, cost) VALUES \
                      ('led_old_1', 'acme', 'agent-7', 't1', 'credit', 'credit@sha256:aa', 'allow', 1, 'unknown', 1000, 1000, 0), \
                      ('led_old_2', 'acme', 'agent-7', 't2', 'credit', 'credit@sha256:aa', 'allow', 0, 'attempting', 2000, 2000, 0), \
                      ('led_old_3', 'acme', 'agent-7', 't3', 'credit', 'credit@sha256:aa', 'allow', 1, 'committed', 500, 500, 0)";

/// An idempotency record of a finished call, which every later migration must keep.
const INSERT_IDEMPOTENCY: &str = "INSERT INTO idempotency (tenant, principal, contract_id, key, payload_digest, \
                                  status, result, error_code, ledger_id, created_at, updated_at, expires_at) VALUES \
                                  ('acme', 'agent-7', 'credit@sha256:aa', 'k-1', 'sha256:p1', 'committed', \
                                  '{\"credit_id\":\"cr_1\"}', NULL, 'led_old_3', 500, 600, 4102444800000)";

async fn the_old_rows_are_claimable(store: &SqlStore) {
    let now = OffsetDateTime::now_utc();
    let rows = store
        .claim_unresolved("w1", now, now, now, 10, Duration::from_secs(60))
        .await
        .unwrap();
    let ids: Vec<_> = rows.iter().map(|r| r.entry.id.as_str()).collect();
    assert_eq!(ids, ["led_old_1", "led_old_2"]);
    assert!(
        rows.iter()
            .all(|r| r.reconcile_attempts == 0 && r.reconcile_note.is_none())
    );
    let old = store.get_ledger("acme", "led_old_3").await.unwrap().unwrap();
    assert_eq!(old.outcome, Some(Outcome::Committed));
    let scope = IdempotencyScope {
        tenant: "acme".into(),
        principal: "agent-7".into(),
        contract_id: "credit@sha256:aa".into(),
        key: "k-1".into(),
    };
    let kept = store.get_idempotency(&scope).await.unwrap().unwrap();
    assert_eq!(kept.status, IdempotencyStatus::Committed);
    assert_eq!(kept.result, Some(serde_json::json!({"credit_id": "cr_1"})));
    assert_eq!(kept.ledger_id, "led_old_3");
}

#[tokio::test]
async fn sqlite_version_3_with_rows_migrates() {
    let dir = tempfile::tempdir().unwrap();
    let migrations = dir.path().join("m");
    std::fs::create_dir_all(&migrations).unwrap();
    let db = dir.path().join("warrant.db");
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
        version_3("sqlite", &migrations)
            .await
            .run(&mut conn)
            .await
            .unwrap();
        sqlx::query(INSERT).execute(&mut conn).await.unwrap();
        sqlx::query(INSERT_IDEMPOTENCY).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    }
    let store = SqlStore::open(&DatabaseUrl::Sqlite(db.clone()), &StoreOptions::default())
        .await
        .unwrap();
    the_old_rows_are_claimable(&store).await;
    store.close().await;
    // It keeps the page size it was created with (SQLite's default then), which only
    // rewriting the file could change; new databases get smaller pages.
    let page: u32 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .unwrap();
    assert_eq!(page, 4096);
    assert_ne!(page, NEW_DATABASE_PAGE_BYTES);
}

#[tokio::test]
async fn postgres_version_3_with_rows_migrates() {
    let Some(db) = TestDatabase::postgres().await.unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    {
        let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {}", db.schema())))
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("SET search_path TO {}", db.schema())))
            .execute(&mut conn)
            .await
            .unwrap();
        version_3("postgres", dir.path())
            .await
            .run(&mut conn)
            .await
            .unwrap();
        sqlx::query(INSERT).execute(&mut conn).await.unwrap();
        sqlx::query(INSERT_IDEMPOTENCY).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    }
    let store = db.open().await.unwrap();
    the_old_rows_are_claimable(&store).await;
    store.close().await;
    db.drop_schema().await;
}

/// A ledger row as a call writes it, the `n`th of a run started at `start`.
fn call_row(n: i64, start: OffsetDateTime) -> LedgerEntry {
    let at = start + time::Duration::milliseconds(n);
    let mut entry = LedgerEntry::new(
        format!("led_{n:08}"),
        "acme",
        "agent-7",
        &format!("trace-{n}"),
        "lookup_order",
        at,
    );
    entry.contract_id = Some("lookup_order@sha256:aa".into());
    entry.decision = LedgerDecision::Allow;
    entry.outcome = Some(Outcome::Committed);
    entry.arguments = Some(serde_json::json!({"order_id": format!("ord_{n}")}));
    entry
}

/// A new SQLite store (its directory, database file and first row's time) with `rows` ledger
/// rows written as calls write them.
async fn a_new_store_with_rows(
    rows: i64,
) -> (tempfile::TempDir, std::path::PathBuf, SqlStore, OffsetDateTime) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("warrant.db");
    let store = SqlStore::open(&DatabaseUrl::Sqlite(db.clone()), &StoreOptions::default())
        .await
        .unwrap();
    let start = OffsetDateTime::now_utc();
    for n in 0..rows {
        store.insert_ledger(&call_row(n, start)).await.unwrap();
    }
    (dir, db, store, start)
}

/// The page size of the WAL of `db`, and of its frames since it last started over how many
/// there are and how many end a commit (read from the frames' headers: a frame of the current
/// pass carries the WAL header's salts; a commit's last frame, the database's size).
fn wal_pass(db: &Path) -> (u32, usize, usize) {
    let wal = std::fs::read(db.with_extension("db-wal")).unwrap();
    let word = |at: usize| u32::from_be_bytes(wal[at..at + 4].try_into().unwrap());
    let page = word(8);
    let frame = 24 + page as usize;
    let (mut frames, mut commits) = (0, 0);
    let mut at = 32;
    while at + frame <= wal.len() && wal[at + 8..at + 16] == wal[16..24] {
        frames += 1;
        if word(at + 4) != 0 {
            commits += 1;
        }
        at += frame;
    }
    (page, frames, commits)
}

/// What a call's commit writes: every page it changed, whole, to the WAL — a page of each
/// b-tree its ledger row enters (the ledger, its key index, its two listing indexes). A new
/// database has pages of `NEW_DATABASE_PAGE_BYTES`, so a row's commit logs under 12 KiB
/// (10 KiB; at SQLite's default 4 KiB pages, 18 KiB).
#[tokio::test]
async fn a_ledger_rows_commit_logs_under_12_kib_to_a_new_database() {
    let (_dir, db, store, start) = a_new_store_with_rows(300).await;
    // A reader in a transaction keeps the WAL from starting over (at most once more, at the
    // next commit, if it reads the database file alone), so the commits below stay in it.
    let reader = rusqlite::Connection::open(&db).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM ledger", [], |row| row.get(0))
        .unwrap();
    for n in 300..800 {
        store.insert_ledger(&call_row(n, start)).await.unwrap();
    }
    let (page, frames, commits) = wal_pass(&db);
    drop(reader);
    store.close().await;
    assert_eq!(page, NEW_DATABASE_PAGE_BYTES);
    assert!(commits >= 499, "{commits} commits in the WAL");
    let bytes = frames * (24 + page as usize) / commits;
    assert!(
        bytes < 12 * 1024,
        "{bytes} bytes logged a commit ({frames} frames of {page}-byte pages, {commits} commits)"
    );
}

/// The pages a call's ledger row is written to: its listing indexes and its index of
/// unresolved rows.
///
/// Ledger rows arrive in time order, so each listing index must take them at its right edge:
/// one leaf written per row and leaves left full. With a descending key (before migration 15)
/// every row went to the left edge, where a full leaf is split by sharing it with its
/// siblings: about two pages written per row and index, and leaves left half empty, which is
/// what this reads (SQLite's `dbstat`).
#[tokio::test]
async fn a_ledger_row_is_written_to_as_few_pages_as_its_queries_need() {
    let (_dir, db, store, _) = a_new_store_with_rows(1_500).await;
    store.close().await;
    let conn = rusqlite::Connection::open(&db).unwrap();
    // A write's `attempting` row enters every index of unresolved rows and leaves it when it
    // finishes: one such index, two pages per write (there were two).
    let unresolved: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'ledger' AND sql LIKE '%WHERE outcome IN%'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(unresolved, ["ledger_reconcile_due"]);
    for index in ["ledger_tenant_created", "ledger_tenant_tool"] {
        let (leaves, unused, size): (i64, i64, i64) = conn
            .query_row(
                "SELECT count(*), sum(unused), sum(pgsize) FROM dbstat WHERE name = ?1 AND pagetype = 'leaf'",
                [index],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .unwrap();
        assert!(leaves > 2, "{index}: {leaves} leaves");
        assert!(
            unused * 5 < size,
            "{index}: {unused} of {size} bytes of its {leaves} leaves unused"
        );
    }
}
