//! [`SqlStore`]: the SQLite and PostgreSQL backends behind one implementation.
//!
//! Both backends share the schema (BIGINT epoch milliseconds, TEXT for ids and canonical JSON)
//! and every statement: placeholders are written `$1, $2, …`, which both backends bind by
//! number. Each operation is written once, against the [`Exec`] interface (`exec.rs`), and
//! the `write_op!` / `read_op!` macros run it on either backend — PostgreSQL through sqlx,
//! SQLite through rusqlite on the store's own threads (`sqlite.rs`) — so the two cannot drift
//! apart. The only dialect differences — connection setup and `FOR UPDATE SKIP LOCKED` on
//! PostgreSQL — are visible at their single place of use.
//!
//! **SQLite durability:** WAL journal, `synchronous=FULL` (a commit is on disk before it is
//! acknowledged, even across power loss), one writer connection (writes are serialized in the
//! process; no `SQLITE_BUSY` between our own writers), `BEGIN IMMEDIATE` so a transaction
//! holds the write lock from its first statement, and a few read-only connections that read
//! concurrently with the writer. Concurrent writes share one commit (group commit, in
//! `sqlite.rs`): each runs in a batch's transaction and is answered once the batch is on
//! disk.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};
use time::OffsetDateTime;
use warrant_core::canon::canonical_string;

use crate::error::Db;
use crate::exec::{Arg, Exec, PgRead, PgTx, RowExt, args};
use crate::sqlite::{Sqlite, SqliteExec};
use warrant_core::contract::Namespace;
use warrant_core::records::*;
use warrant_core::store::{
    RegistrationPlan, Store, StoreError, approval_page, attempt_row, classify_existing, correction_note,
    finished_row, late_outcome_corrects, ledger_page, parse_ledger_cursor, plan_registration, review_refusal,
    status_after, withheld_of_finished,
};

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// An SQLite database file (created on first use, with its directory).
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL.
    Postgres(String),
}

impl DatabaseUrl {
    /// The SQLite database inside a data directory (`<dir>/warrant.db`).
    pub fn data_dir(dir: impl AsRef<Path>) -> Self {
        DatabaseUrl::Sqlite(dir.as_ref().join("warrant.db"))
    }

    /// Parses `sqlite://<path>` (a file, or a directory to hold `warrant.db`), `sqlite:<path>`,
    /// or `postgres://…` / `postgresql://…`.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for anything else.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(text.to_owned()));
        }
        let path = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
            .ok_or_else(|| {
                StoreError::Invalid("database URL must start with sqlite:// or postgres://".into())
            })?;
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(StoreError::Invalid("sqlite URL needs a path".into()));
        }
        let path = PathBuf::from(path);
        if path.is_dir() || path.extension().is_none() {
            Ok(DatabaseUrl::data_dir(path))
        } else {
            Ok(DatabaseUrl::Sqlite(path))
        }
    }

    /// A description safe to print: a PostgreSQL URL's password is masked, whether in its
    /// user information or as a query parameter (`?password=`, `sslpassword=`, any spelling
    /// of a key naming a password).
    pub fn redacted(&self) -> String {
        match self {
            DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
            DatabaseUrl::Postgres(url) => redact_postgres(url),
        }
    }
}

/// `url` with its passwords masked (see [`DatabaseUrl::redacted`]). Written by hand rather
/// than through a URL parser: a PostgreSQL URL may name several hosts (`h1:5432,h2:5433`),
/// which URL parsers refuse, and an unparsable URL must still print without its password.
fn redact_postgres(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = match (head.find("://"), head.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = head.get(scheme + 3..at).unwrap_or_default();
            match creds.split_once(':') {
                Some((user, _)) => format!(
                    "{}{user}:***{}",
                    head.get(..scheme + 3).unwrap_or_default(),
                    head.get(at..).unwrap_or_default()
                ),
                None => head.to_owned(),
            }
        }
        _ => head.to_owned(),
    };
    if let Some(query) = query {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((key, _)) if names_a_password(key) => {
                    out.push_str(key);
                    out.push_str("=***");
                }
                _ => out.push_str(pair),
            }
        }
    }
    out
}

/// Whether a URL query key, percent-decoded, names a password.
fn names_a_password(key: &str) -> bool {
    let bytes = key.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            _ => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    decoded.to_ascii_lowercase().windows(8).any(|w| w == b"password")
}

/// Connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Connections in the pool (PostgreSQL), or at most this many reader threads (SQLite,
    /// which also caps them by cores: see `sqlite_readers`).
    pub max_connections: u32,
    /// How long to wait for a pooled connection before [`StoreError::Unavailable`]
    /// (PostgreSQL; SQLite operations queue for their thread, up to `queue_capacity`).
    pub acquire_timeout: Duration,
    /// PostgreSQL schema to use (created if missing); `None` uses the default search path.
    pub postgres_schema: Option<String>,
    /// SQLite: how many operations the writer's queue, and the readers' queue, hold; an
    /// operation that finds its queue full is answered [`StoreError::Overloaded`] at once.
    pub queue_capacity: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            postgres_schema: None,
            queue_capacity: crate::sqlite::DEFAULT_QUEUE_CAPACITY,
        }
    }
}

enum Backend {
    Sqlite(Sqlite),
    Postgres(PgPool),
}

/// The SQL store (see the module documentation).
pub struct SqlStore {
    backend: Backend,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.backend_name())
            .finish()
    }
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The page size of a database the store creates, in bytes (SQLite's default is 4,096).
///
/// A commit logs every page it changed, whole, to the WAL, and a call's commit changes a page
/// of each b-tree its ledger row enters: the ledger, its key index, its two listing indexes,
/// and the budget counter it charges — five or six pages for a row of a few hundred bytes.
/// Halving the page nearly halves what each commit writes, checksums and has synced (a read
/// call's row and its budget charge: 24 KiB at 4 KiB pages, 14 KiB at 2 KiB), and that
/// writing is most of a commit's cost: 0.89–0.98× the server CPU per call in the load bench,
/// most at one connection (with a million rows more, the same as before at 16 connections;
/// docs/benchmarks.md). Rows of a few hundred bytes still fit five to a leaf, so the file
/// grows 6% more per row; 1 KiB pages wrote less again but left a third of each table leaf
/// empty, and cost no less. A database created before keeps its page size: SQLite changes it
/// only by rewriting the file (docs/store.md).
pub const NEW_DATABASE_PAGE_BYTES: u32 = 2048;

/// SQLite reader threads: reads are short and the writer is the bottleneck, so a few suffice:
/// `max_connections`, capped by the cores clamped to 2..=4.
fn sqlite_readers(options: &StoreOptions) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    (options.max_connections.max(1) as usize).min(cores.clamp(2, 4))
}

impl SqlStore {
    /// Opens (creating on first use) the store and applies pending migrations.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be reached, [`StoreError::Migration`]
    /// when the schema cannot be brought up to date.
    pub async fn open(url: &DatabaseUrl, options: &StoreOptions) -> Result<Self, StoreError> {
        match url {
            DatabaseUrl::Sqlite(path) => Self::open_sqlite(path, options).await,
            DatabaseUrl::Postgres(url) => Self::open_postgres(url, options).await,
        }
    }

    async fn open_sqlite(path: &Path, options: &StoreOptions) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", dir.display())))?;
        }
        // The schema is brought up to date through sqlx's migrator (its bookkeeping table is
        // the one existing databases have); the store then runs on its own connections.
        let mut conn = SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .create_if_missing(true)
            .page_size(NEW_DATABASE_PAGE_BYTES)
            .disable_statement_logging()
            .connect()
            .await
            .db()?;
        SQLITE_MIGRATIONS.run(&mut conn).await.db()?;
        conn.close().await.db()?;
        let readers = sqlite_readers(options);
        let path = path.to_owned();
        let capacity = options.queue_capacity;
        let sqlite = tokio::task::spawn_blocking(move || Sqlite::open(&path, readers, capacity))
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot open the store: {e}")))??;
        Ok(SqlStore {
            backend: Backend::Sqlite(sqlite),
        })
    }
    async fn open_postgres(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let mut connect = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad PostgreSQL URL: {e}")))?
            .disable_statement_logging();
        if let Some(schema) = &options.postgres_schema {
            if !schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                || schema.is_empty()
            {
                return Err(StoreError::Invalid(
                    "schema names are lowercase letters, digits and `_`".into(),
                ));
            }
            let mut conn = sqlx::PgConnection::connect_with(&connect).await.db()?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}"
            )))
            .execute(&mut conn)
            .await
            .db()?;
            conn.close().await.db()?;
            connect = connect.options([("search_path", schema.as_str())]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(2))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await
            .db()?;
        POSTGRES_MIGRATIONS.run(&pool).await.db()?;
        Ok(SqlStore {
            backend: Backend::Postgres(pool),
        })
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite { .. } => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Closes every connection (after the queued work, on SQLite; waits for checked-out
    /// connections on PostgreSQL).
    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite(sqlite) => sqlite.close().await,
            Backend::Postgres(pool) => pool.close().await,
        }
    }
}

/// Runs `$body` as one write transaction, written once for both backends. `$ex` is the
/// transaction ([`Exec`]); the `[name = value]` list makes the owned copies the body uses
/// (SQLite runs it on the writer thread, which cannot borrow from the caller). The
/// transaction commits when the body answers `Ok` (unless it called `rollback`).
///
/// The PostgreSQL branch is boxed: sqlx's futures are large, and an operation's future is as
/// large as its largest branch, so unboxed every SQLite operation's future was too — about
/// 15 KB that `async_trait` copied into its box on every call (docs/benchmarks.md, "2026-12-04
/// (night)", "Two more copies and formats per call").
macro_rules! write_op {
    ($self:ident, [$($owned:ident = $value:expr),* $(,)?], |$ex:ident| $body:expr) => {
        match &$self.backend {
            Backend::Sqlite(sqlite) => {
                $(let $owned = $value;)*
                sqlite
                    .write(move |$ex: &mut SqliteExec<'_, '_>| crate::sqlite::now(async { $body }))
                    .await
            }
            Backend::Postgres(pool) => {
                $(let $owned = $value;)*
                Box::pin(async move {
                    let mut tx = PgTx::begin(pool).await?;
                    let result = {
                        let $ex = &mut tx;
                        async move { $body }.await
                    };
                    tx.finish(result).await
                })
                .await
            }
        }
    };
}

/// Runs `$body` as a read, written once for both backends (see [`write_op!`]).
macro_rules! read_op {
    ($self:ident, [$($owned:ident = $value:expr),* $(,)?], |$ex:ident| $body:expr) => {
        match &$self.backend {
            Backend::Sqlite(sqlite) => {
                $(let $owned = $value;)*
                sqlite
                    .read(move |$ex: &mut SqliteExec<'_, '_>| crate::sqlite::now(async move { $body }))
                    .await
            }
            Backend::Postgres(pool) => {
                $(let $owned = $value;)*
                let mut read = PgRead(pool);
                let $ex = &mut read;
                // Boxed, as in `write_op!`.
                Box::pin(async move { $body }).await
            }
        }
    };
}

// ----- value conversions -----

fn ms(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

fn from_ms(v: i64) -> Result<OffsetDateTime, StoreError> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(v) * 1_000_000)
        .map_err(|_| StoreError::Corrupt(format!("timestamp {v} out of range")))
}

fn opt_from_ms(v: Option<i64>) -> Result<Option<OffsetDateTime>, StoreError> {
    v.map(from_ms).transpose()
}

fn int(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Invalid(format!("{v} does not fit a 64-bit signed integer")))
}

fn uint(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative counter {v}")))
}

fn u32_of(v: i64) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} out of range")))
}

const SELECT_RUN: &str = "SELECT id, tenant, workflow, version, digest, status, input, principal, next_step, \
                          next_seq, cost, error, created_at, updated_at FROM runs";

fn run_of(row: &impl RowExt) -> Result<RunRecord, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("run {what}"));
    Ok(RunRecord {
        id: row.text("id")?,
        tenant: row.text("tenant")?,
        workflow: row.text("workflow")?,
        version: u32::try_from(row.int("version")?).map_err(|_| corrupt("version"))?,
        digest: row.text("digest")?,
        status: RunStatus::parse(&row.text("status")?).ok_or_else(|| corrupt("status"))?,
        input: json_of(&row.text("input")?)?,
        principal: json_of(&row.text("principal")?)?,
        next_step: row.opt_text("next_step")?,
        next_seq: u32::try_from(row.int("next_seq")?).map_err(|_| corrupt("sequence"))?,
        cost: u64::try_from(row.int("cost")?).map_err(|_| corrupt("cost"))?,
        error: row.opt_text("error")?,
        created_at: from_ms(row.int("created_at")?)?,
        updated_at: from_ms(row.int("updated_at")?)?,
    })
}

const SELECT_WORKFLOW: &str =
    "SELECT tenant, name, version, digest, document, pinned, published_by, published_at FROM workflows";

fn workflow_of(row: &impl RowExt) -> Result<WorkflowRecord, StoreError> {
    let pinned = serde_json::from_str(&row.text("pinned")?)
        .map_err(|e| StoreError::Corrupt(format!("workflow pins: {e}")))?;
    Ok(WorkflowRecord {
        tenant: row.text("tenant")?,
        name: row.text("name")?,
        version: u32::try_from(row.int("version")?)
            .map_err(|_| StoreError::Corrupt("workflow version".into()))?,
        digest: row.text("digest")?,
        document: json_of(&row.text("document")?)?,
        pinned,
        published_by: row.text("published_by")?,
        published_at: from_ms(row.int("published_at")?)?,
    })
}

fn json_text(v: &Value) -> String {
    canonical_string(v)
}

fn json_of(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
}

fn opt_json_of(text: Option<String>) -> Result<Option<Value>, StoreError> {
    text.as_deref().map(json_of).transpose()
}

fn list_text(items: &[String]) -> String {
    json_text(&Value::Array(items.iter().cloned().map(Value::String).collect()))
}

fn list_of(text: &str) -> Result<Vec<String>, StoreError> {
    match json_of(text)? {
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(StoreError::Corrupt("list of strings expected".into())),
            })
            .collect(),
        _ => Err(StoreError::Corrupt("list expected".into())),
    }
}

fn parse_enum<T>(text: &str, parse: fn(&str) -> Option<T>, what: &str) -> Result<T, StoreError> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown {what} `{text}`")))
}

// ----- row decoders -----

macro_rules! ledger_columns {
    () => {
        "id, tenant, principal, trace_id, run_id, step_id, tool, contract_id, binding_digest, \
     payload_digest, decision, stage, error_code, detail, approval_id, idempotency_key, attempts, outcome, \
     created_at, updated_at, latency_ms, cost, arguments"
    };
}

fn ledger_of(row: &impl RowExt) -> Result<LedgerEntry, StoreError> {
    Ok(LedgerEntry {
        id: row.text("id")?,
        tenant: row.text("tenant")?,
        principal: row.text("principal")?,
        trace_id: row.text("trace_id")?,
        run_id: row.opt_text("run_id")?,
        step_id: row.opt_text("step_id")?,
        tool: row.text("tool")?,
        contract_id: row.opt_text("contract_id")?,
        binding_digest: row.opt_text("binding_digest")?,
        payload_digest: row.opt_text("payload_digest")?,
        decision: parse_enum(&row.text("decision")?, LedgerDecision::parse, "decision")?,
        stage: row.opt_text("stage")?,
        error_code: row.opt_text("error_code")?,
        detail: row.opt_text("detail")?,
        approval_id: row.opt_text("approval_id")?,
        idempotency_key: row.opt_text("idempotency_key")?,
        attempts: u32_of(row.int("attempts")?)?,
        outcome: row
            .opt_text("outcome")?
            .map(|o| parse_enum(&o, Outcome::parse, "outcome"))
            .transpose()?,
        created_at: from_ms(row.int("created_at")?)?,
        updated_at: from_ms(row.int("updated_at")?)?,
        latency_ms: row.opt_int("latency_ms")?.map(uint).transpose()?,
        cost: uint(row.int("cost")?)?,
        arguments: opt_json_of(row.opt_text("arguments")?)?,
    })
}

/// The detail of a row marked overdue: the operator's note first, then what it said before.
pub(crate) fn overdue_detail(note: &str, detail: Option<&str>) -> String {
    match detail {
        Some(d) if !d.is_empty() => format!("{note}; {d}"),
        _ => note.to_owned(),
    }
}

macro_rules! idempotency_columns {
    () => {
        "tenant, principal, contract_id, key, payload_digest, status, result, error_code, \
     ledger_id, created_at, updated_at, expires_at"
    };
}

fn idempotency_of(row: &impl RowExt) -> Result<IdempotencyRecord, StoreError> {
    Ok(IdempotencyRecord {
        scope: IdempotencyScope {
            tenant: row.text("tenant")?,
            principal: row.text("principal")?,
            contract_id: row.text("contract_id")?,
            key: row.text("key")?,
        },
        payload_digest: row.text("payload_digest")?,
        status: parse_enum(
            &row.text("status")?,
            IdempotencyStatus::parse,
            "idempotency status",
        )?,
        result: opt_json_of(row.opt_text("result")?)?,
        error_code: row.opt_text("error_code")?,
        ledger_id: row.text("ledger_id")?,
        created_at: from_ms(row.int("created_at")?)?,
        expires_at: from_ms(row.int("expires_at")?)?,
    })
}

macro_rules! approval_columns {
    () => {
        "id, tenant, contract_id, tool, proposer, payload_digest, idempotency_key, arguments, \
     status, reviewer, reason, created_at, expires_at, decided_at, consumed_at, consumed_by, reviewers, superseded_by, \
     sealed_arguments"
    };
}

const SELECT_APPROVAL: &str = concat!(
    "SELECT ",
    approval_columns!(),
    " FROM approvals WHERE tenant = $1 AND id = $2"
);

fn approval_of(row: &impl RowExt) -> Result<ApprovalRequest, StoreError> {
    Ok(ApprovalRequest {
        request: NewApproval {
            id: row.text("id")?,
            tenant: row.text("tenant")?,
            contract_id: row.text("contract_id")?,
            tool: row.text("tool")?,
            proposer: row.text("proposer")?,
            payload_digest: row.text("payload_digest")?,
            idempotency_key: row.opt_text("idempotency_key")?,
            arguments: json_of(&row.text("arguments")?)?,
            sealed_arguments: row.opt_text("sealed_arguments")?,
            created_at: from_ms(row.int("created_at")?)?,
            expires_at: from_ms(row.int("expires_at")?)?,
            reviewers: match opt_json_of(row.opt_text("reviewers")?)? {
                None => None,
                Some(v) => Some(
                    ReviewerRule::from_json(&v)
                        .ok_or_else(|| StoreError::Corrupt("approval reviewers".into()))?,
                ),
            },
        },
        status: parse_enum(&row.text("status")?, ApprovalStatus::parse, "approval status")?,
        reviewer: row.opt_text("reviewer")?,
        reason: row.opt_text("reason")?,
        decided_at: opt_from_ms(row.opt_int("decided_at")?)?,
        consumed_at: opt_from_ms(row.opt_int("consumed_at")?)?,
        consumed_by: row.opt_text("consumed_by")?,
        superseded_by: row.opt_text("superseded_by")?,
    })
}

macro_rules! key_columns {
    () => {
        "id, key_hash, tenant, principal, grants, roles, label, created_at, revoked_at"
    };
}

fn key_of(row: &impl RowExt) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        key: NewApiKey {
            id: row.text("id")?,
            key_hash: row.text("key_hash")?,
            tenant: row.text("tenant")?,
            principal: row.text("principal")?,
            grants: list_of(&row.text("grants")?)?,
            roles: list_of(&row.text("roles")?)?,
            label: row.opt_text("label")?,
            created_at: from_ms(row.int("created_at")?)?,
        },
        revoked_at: opt_from_ms(row.opt_int("revoked_at")?)?,
    })
}

/// A value bound to a query parameter, owned so the query can move into a store operation.
#[derive(Debug, Clone)]
enum Bound {
    Text(String),
    Int(i64),
}

/// A newest-first page of one tenant's rows (`created_at DESC, id DESC`): only the conditions
/// in use are added, each with its value, numbered in order; every value is a bound parameter.
#[derive(Debug, Clone)]
struct PageQuery {
    sql: String,
    values: Vec<Bound>,
}

impl PageQuery {
    /// `select` already refers to `values` as `$1…$n`.
    fn new(select: &str, values: Vec<Bound>) -> Self {
        PageQuery {
            sql: select.to_owned(),
            values,
        }
    }

    /// Adds `condition` (with one `?`) when there is a `value` for it.
    fn and(&mut self, condition: &str, value: Option<Bound>) {
        if let Some(value) = value {
            self.values.push(value);
            let n = self.values.len();
            self.sql.push_str(&condition.replace('?', &format!("${n}")));
        }
    }

    /// Continues after `cursor` (`created_at` in ms, id), newest first, with one row more than
    /// `limit` (which says whether a next page exists).
    fn newest_first(mut self, cursor: Option<(i64, String)>, limit: u32) -> Self {
        if let Some((at, id)) = cursor {
            self.values.push(Bound::Int(at));
            let at = self.values.len();
            self.values.push(Bound::Text(id));
            let id = self.values.len();
            self.sql.push_str(&format!(
                " AND (created_at < ${at} OR (created_at = ${at} AND id < ${id}))"
            ));
        }
        self.sql
            .push_str(&format!(" ORDER BY created_at DESC, id DESC LIMIT {}", limit + 1));
        self
    }

    fn args(&self) -> Vec<Arg<'_>> {
        self.values
            .iter()
            .map(|v| match v {
                Bound::Text(t) => Arg::Text(t),
                Bound::Int(i) => Arg::Int(*i),
            })
            .collect()
    }
}

/// The condition on an approval's effective status (`ApprovalRequest::as_of`), with `now` as
/// `$2`: a pending or approved request past its expiry is `expired` before the sweeper writes
/// it. Each keeps the (tenant, status, created_at) index usable.
fn effective_status(status: ApprovalStatus) -> &'static str {
    match status {
        ApprovalStatus::Pending => " AND status = 'pending' AND expires_at > $2",
        ApprovalStatus::Approved => " AND status = 'approved' AND expires_at > $2",
        ApprovalStatus::Expired => {
            " AND (status = 'expired' OR (status IN ('pending', 'approved') AND expires_at <= $2))"
        }
        ApprovalStatus::Rejected => " AND status = 'rejected'",
        ApprovalStatus::Consumed => " AND status = 'consumed'",
    }
}

macro_rules! webhook_columns {
    () => {
        "tenant, id, url, events, secret, previous_secret, previous_until, description, enabled, \
         disabled_reason, created_at, updated_at"
    };
}

fn webhook_of(row: &impl RowExt) -> Result<WebhookEndpoint, StoreError> {
    let events: Vec<String> = serde_json::from_str(&row.text("events")?)
        .map_err(|e| StoreError::Corrupt(format!("webhook events: {e}")))?;
    Ok(WebhookEndpoint {
        tenant: row.text("tenant")?,
        id: row.text("id")?,
        url: row.text("url")?,
        events,
        secret: row.text("secret")?,
        previous_secret: row.opt_text("previous_secret")?,
        previous_until: opt_from_ms(row.opt_int("previous_until")?)?,
        description: row.opt_text("description")?,
        enabled: row.int("enabled")? != 0,
        disabled_reason: row.opt_text("disabled_reason")?,
        created_at: from_ms(row.int("created_at")?)?,
        updated_at: from_ms(row.int("updated_at")?)?,
    })
}

macro_rules! inbound_source_columns {
    () => {
        "id, tenant, provider, secret, previous_secret, previous_until, key_id, action, description, enabled, \
         refusals, last_refusal, last_refusal_at, created_at, updated_at"
    };
}

fn inbound_source_of(row: &impl RowExt) -> Result<InboundSource, StoreError> {
    let provider = row.text("provider")?;
    Ok(InboundSource {
        id: row.text("id")?,
        tenant: row.text("tenant")?,
        provider: warrant_core::inbound::Provider::parse(&provider)
            .ok_or_else(|| StoreError::Corrupt(format!("inbound provider `{provider}`")))?,
        secret: row.text("secret")?,
        previous_secret: row.opt_text("previous_secret")?,
        previous_until: opt_from_ms(row.opt_int("previous_until")?)?,
        key_id: row.text("key_id")?,
        action: json_of(&row.text("action")?)?,
        description: row.opt_text("description")?,
        enabled: row.int("enabled")? != 0,
        refusals: uint(row.int("refusals")?)?,
        last_refusal: row.opt_text("last_refusal")?,
        last_refusal_at: opt_from_ms(row.opt_int("last_refusal_at")?)?,
        created_at: from_ms(row.int("created_at")?)?,
        updated_at: from_ms(row.int("updated_at")?)?,
    })
}

macro_rules! inbound_event_columns {
    () => {
        "source_id, event_id, tenant, body, body_digest, status, deliveries, detail, received_at, updated_at"
    };
}

fn inbound_event_of(row: &impl RowExt) -> Result<InboundEvent, StoreError> {
    let status = row.text("status")?;
    Ok(InboundEvent {
        source_id: row.text("source_id")?,
        event_id: row.text("event_id")?,
        tenant: row.text("tenant")?,
        body: json_of(&row.text("body")?)?,
        body_digest: row.text("body_digest")?,
        status: InboundStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("inbound event status `{status}`")))?,
        deliveries: u32::try_from(row.int("deliveries")?).unwrap_or(u32::MAX),
        detail: row.opt_text("detail")?.as_deref().map(json_of).transpose()?,
        received_at: from_ms(row.int("received_at")?)?,
        updated_at: from_ms(row.int("updated_at")?)?,
    })
}

fn webhook_attempt_of(row: &impl RowExt) -> Result<WebhookAttempt, StoreError> {
    Ok(WebhookAttempt {
        tenant: row.text("tenant")?,
        message_id: row.text("message_id")?,
        endpoint_id: row.text("endpoint_id")?,
        attempt: u32::try_from(row.int("attempt")?)
            .map_err(|_| StoreError::Corrupt("webhook attempt number".into()))?,
        at: from_ms(row.int("at")?)?,
        status: row
            .opt_int("status")?
            .map(|s| u16::try_from(s).map_err(|_| StoreError::Corrupt("webhook attempt status".into())))
            .transpose()?,
        latency_ms: u64::try_from(row.int("latency_ms")?).unwrap_or(0),
        response: row.opt_text("response")?,
        error: row.opt_text("error")?,
    })
}

fn task_of(row: &impl RowExt) -> Result<TaskRecord, StoreError> {
    let status = row.text("status")?;
    Ok(TaskRecord {
        tenant: row.text("tenant")?,
        id: row.text("id")?,
        principal: row.text("principal")?,
        approval_id: row.text("approval_id")?,
        call: json_of(&row.text("call")?)?,
        status: TaskStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown task status `{status}`")))?,
        result: row.opt_text("result")?.map(|r| json_of(&r)).transpose()?,
        created_at: from_ms(row.int("created_at")?)?,
        updated_at: from_ms(row.int("updated_at")?)?,
        expires_at: from_ms(row.int("expires_at")?)?,
    })
}

fn console_session_of(row: &impl RowExt) -> Result<ConsoleSession, StoreError> {
    let kind = row.text("kind")?;
    Ok(ConsoleSession {
        token_hash: row.text("token_hash")?,
        kind: ConsoleSessionKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown console session kind `{kind}`")))?,
        key_hash: row.text("key_hash")?,
        csrf: row.text("csrf")?,
        created_at: from_ms(row.int("created_at")?)?,
        expires_at: from_ms(row.int("expires_at")?)?,
    })
}

macro_rules! job_columns {
    () => {
        "id, tenant, kind, payload, status, attempts, max_attempts, run_at, locked_by, locked_until, last_error"
    };
}

fn job_of(row: &impl RowExt) -> Result<Job, StoreError> {
    Ok(Job {
        job: NewJob {
            id: row.text("id")?,
            tenant: row.text("tenant")?,
            kind: row.text("kind")?,
            payload: json_of(&row.text("payload")?)?,
            run_at: from_ms(row.int("run_at")?)?,
            max_attempts: u32_of(row.int("max_attempts")?)?,
        },
        status: parse_enum(&row.text("status")?, JobStatus::parse, "job status")?,
        attempts: u32_of(row.int("attempts")?)?,
        locked_by: row.opt_text("locked_by")?,
        locked_until: opt_from_ms(row.opt_int("locked_until")?)?,
        last_error: row.opt_text("last_error")?,
    })
}

macro_rules! contract_columns {
    () => {
        "tenant, name, version, content_id, body, binding, binding_digest, registered_at, retired_at"
    };
}

/// One stored contract of a namespace by name and version.
const SELECT_CONTRACT: &str = concat!(
    "SELECT ",
    contract_columns!(),
    " FROM contracts WHERE tenant = $1 AND name = $2 AND version = $3"
);

fn contract_of(row: &impl RowExt) -> Result<StoredContract, StoreError> {
    Ok(StoredContract {
        namespace: Namespace::from_stored(&row.text("tenant")?),
        name: row.text("name")?,
        version: u32_of(row.int("version")?)?,
        content_id: row.text("content_id")?,
        body: json_of(&row.text("body")?)?,
        binding: opt_json_of(row.opt_text("binding")?)?,
        binding_digest: row.opt_text("binding_digest")?,
        registered_at: from_ms(row.int("registered_at")?)?,
        retired_at: opt_from_ms(row.opt_int("retired_at")?)?,
    })
}

const INSERT_LEDGER: &str = "INSERT INTO ledger (id, tenant, principal, trace_id, run_id, step_id, tool, contract_id, \
     binding_digest, payload_digest, decision, stage, error_code, detail, approval_id, idempotency_key, attempts, \
     outcome, created_at, updated_at, latency_ms, cost, arguments) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)";

/// The canonical JSON text of an entry's arguments, as stored (made before an operation is
/// queued, so the SQLite writer thread does not serialise).
fn arguments_text(e: &LedgerEntry) -> Option<String> {
    e.arguments.as_ref().map(json_text)
}

/// The parameters of `INSERT_LEDGER` for one entry, whose arguments are `arguments`
/// (from [`arguments_text`]).
fn ledger_args<'a>(e: &'a LedgerEntry, arguments: &'a Option<String>) -> Result<[Arg<'a>; 23], StoreError> {
    Ok(args![
        &e.id,
        &e.tenant,
        &e.principal,
        &e.trace_id,
        &e.run_id,
        &e.step_id,
        &e.tool,
        &e.contract_id,
        &e.binding_digest,
        &e.payload_digest,
        e.decision.as_str(),
        &e.stage,
        &e.error_code,
        &e.detail,
        &e.approval_id,
        &e.idempotency_key,
        i64::from(e.attempts),
        e.outcome.map(Outcome::as_str),
        ms(e.created_at),
        ms(e.updated_at),
        e.latency_ms.map(int).transpose()?,
        int(e.cost)?,
        arguments,
    ])
}

/// How often a write-ahead commit tries to claim a key whose record vanished between the
/// claim and the read (see `begin_attempt`).
const CLAIM_TRIES: usize = 3;

const SELECT_IDEMPOTENCY: &str = concat!(
    "SELECT ",
    idempotency_columns!(),
    " FROM idempotency WHERE tenant = $1 AND principal = $2 AND contract_id = $3 AND key = $4"
);

/// How an attempt ended, as bound values (see `finish_in`).
struct Finishing {
    outcome: Outcome,
    attempts: i64,
    error_code: Option<String>,
    latency: i64,
    cost: i64,
    detail: Option<String>,
    result: Option<String>,
    status: Option<IdempotencyStatus>,
    charges: Vec<(String, i64, i64)>,
    now: i64,
}

impl Finishing {
    /// `with_result`: whether an idempotency record will keep the result (only then is it
    /// serialised).
    fn of(finish: &AttemptFinish, now: OffsetDateTime, with_result: bool) -> Result<Self, StoreError> {
        Ok(Finishing {
            outcome: finish.outcome,
            attempts: i64::from(finish.attempts),
            error_code: finish.error_code.clone(),
            latency: int(finish.latency_ms)?,
            cost: int(finish.cost)?,
            detail: finish.detail.clone(),
            result: finish.result.as_ref().filter(|_| with_result).map(json_text),
            status: status_after(finish)?,
            charges: finish
                .charges
                .iter()
                .map(|c| Ok((c.key.clone(), int(c.amount)?, ms(c.expires_at))))
                .collect::<Result<Vec<_>, StoreError>>()?,
            now: ms(now),
        })
    }
}

/// Adds committed spend to a counter (no limit: spend is recorded, not admitted).
const CHARGE: &str = "INSERT INTO budget_counters (tenant, key, used, expires_at) VALUES ($1, $2, $3, $4) \
                      ON CONFLICT (tenant, key) DO UPDATE SET used = budget_counters.used + excluded.used";

/// Inserts a new run and its `run.started` event, in the caller's transaction (`input` and
/// `principal` are its JSON texts, made before the operation is queued).
async fn insert_run_in<E: Exec>(
    ex: &mut E,
    r: &RunRecord,
    input: &str,
    principal: &str,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO runs (id, tenant, workflow, version, digest, status, input, principal, next_step, \
               next_seq, cost, error, created_at, updated_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";
    let params = args![
        &r.id,
        &r.tenant,
        &r.workflow,
        i64::from(r.version),
        &r.digest,
        r.status.as_str(),
        input,
        principal,
        &r.next_step,
        i64::from(r.next_seq),
        i64::try_from(r.cost).unwrap_or(i64::MAX),
        &r.error,
        ms(r.created_at),
        ms(r.updated_at),
    ];
    ex.execute(sql, &params).await?;
    notify_in(ex, &run_event(&r.tenant, &r.id, "run.started", r.created_at)).await
}

/// Inserts a job already claimed by `worker` until `lease_until` (a handoff: no claim of its
/// own), in the caller's transaction; answers it as claimed.
async fn claim_new_in<E: Exec>(
    ex: &mut E,
    job: &NewJob,
    worker: &str,
    lease_until: OffsetDateTime,
) -> Result<Job, StoreError> {
    let sql = "INSERT INTO jobs (id, tenant, kind, payload, status, attempts, max_attempts, run_at, locked_by, \
               locked_until, created_at, updated_at) VALUES ($1, $2, $3, $4, 'running', 1, $5, $6, $7, $8, $6, $6)";
    let payload = json_text(&job.payload);
    let params = args![
        &job.id,
        &job.tenant,
        &job.kind,
        &payload,
        i64::from(job.max_attempts.max(1)),
        ms(job.run_at),
        worker,
        ms(lease_until),
    ];
    ex.execute(sql, &params).await?;
    Ok(Job {
        job: NewJob {
            run_at: from_ms(ms(job.run_at))?,
            max_attempts: job.max_attempts.max(1),
            ..job.clone()
        },
        status: JobStatus::Running,
        attempts: 1,
        locked_by: Some(worker.to_owned()),
        locked_until: Some(from_ms(ms(lease_until))?),
        last_error: None,
    })
}

/// The insert of a new job, `$tail` after its values.
macro_rules! insert_job {
    ($tail:literal) => {
        concat!(
            "INSERT INTO jobs (id, tenant, kind, payload, status, attempts, max_attempts, run_at, created_at, ",
            "updated_at) VALUES ($1, $2, $3, $4, 'pending', 0, $5, $6, $6, $6)",
            $tail
        )
    };
}

/// Enqueues a job in the caller's transaction (the outbox: the job commits with the record
/// that causes it).
async fn enqueue_in<E: Exec>(ex: &mut E, j: &NewJob) -> Result<(), StoreError> {
    insert_job_in(ex, j, insert_job!("")).await
}

/// Runs `sql` (an [`insert_job!`]) for `j`.
async fn insert_job_in<E: Exec>(ex: &mut E, j: &NewJob, sql: &str) -> Result<(), StoreError> {
    let payload = json_text(&j.payload);
    let params = args![
        &j.id,
        &j.tenant,
        &j.kind,
        &payload,
        i64::from(j.max_attempts.max(1)),
        ms(j.run_at),
    ];
    ex.execute(sql, &params).await?;
    Ok(())
}

/// Whether an enabled endpoint of tenant `$1` subscribes to the event type `$2`
/// ([`Notice::subscription_needle`]: the type quoted, as the stored JSON array holds it).
///
/// Matched with `replace`, which both SQLite and PostgreSQL have, not with `LIKE`: SQLite
/// re-prepares a statement every time a `LIKE` pattern is bound anew (its plan may depend on
/// the pattern), which parsed this statement again on every call (6% of the gateway's CPU per
/// call), and `_` in a pattern matches any character.
pub(crate) const SUBSCRIBER_PROBE: &str = "SELECT 1 AS one FROM webhook_endpoints WHERE tenant = $1 AND enabled = 1 \
                                           AND (events = '[]' OR replace(events, $2, '') <> events) LIMIT 1";

/// Enqueues a webhook-only event in the caller's transaction when an enabled endpoint of its
/// tenant subscribes to its type (one indexed probe of `webhook_endpoints` otherwise), at most
/// once per id.
async fn notify_in<E: Exec>(ex: &mut E, n: &Notice) -> Result<(), StoreError> {
    if subscribed(ex, &n.job.tenant, n.kind).await? {
        enqueue_notice_in(ex, n).await?;
    }
    Ok(())
}

/// [`notify_in`] for a ledger row's new outcome ([`Notice::invocation`]), looking for a
/// subscriber before the notice is built: most tenants have none, and the notice (its id,
/// payload and envelope) was built on every call's commit for nothing.
async fn notify_invocation_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    ledger_id: &str,
    outcome: Outcome,
    at: OffsetDateTime,
) -> Result<(), StoreError> {
    let Some(kind) = Notice::invocation_kind(outcome) else {
        return Ok(());
    };
    if subscribed(ex, tenant, kind).await?
        && let Some(notice) = Notice::invocation(tenant, ledger_id, outcome, at)
    {
        enqueue_notice_in(ex, &notice).await?;
    }
    Ok(())
}

/// Whether an enabled endpoint of `tenant` subscribes to the event type `kind`. A read first:
/// far cheaper than an `INSERT … SELECT` that finds no subscriber (which opens the jobs table
/// and its indexes for writing on every call).
async fn subscribed<E: Exec>(ex: &mut E, tenant: &str, kind: &str) -> Result<bool, StoreError> {
    let needle = Notice::subscription_needle(kind);
    Ok(ex
        .fetch_optional(SUBSCRIBER_PROBE, &args![tenant, &needle])
        .await?
        .is_some())
}

/// Enqueues a notice's job, at most once per id.
async fn enqueue_notice_in<E: Exec>(ex: &mut E, n: &Notice) -> Result<(), StoreError> {
    insert_job_in(ex, &n.job, insert_job!(" ON CONFLICT (id) DO NOTHING")).await
}

/// Adds committed spend to its counters, in the caller's transaction.
async fn charge_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    charges: &[(String, i64, i64)],
) -> Result<(), StoreError> {
    for (key, amount, expires) in charges {
        ex.execute(CHARGE, &args![tenant, key, *amount, *expires]).await?;
    }
    Ok(())
}

/// Records a step of a run and what follows it (see `Store::advance_run`).
async fn advance_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    step: &RunStep,
    advance: &RunAdvance,
    handoff: Option<&Handoff>,
    now: OffsetDateTime,
) -> Result<Advanced, StoreError> {
    let update = "UPDATE runs SET status = $1, next_step = $2, next_seq = next_seq + $9, cost = cost + $3, \
                      error = $4, updated_at = $5 WHERE tenant = $6 AND id = $7 AND next_seq = $8 \
                      AND status IN ('running', 'waiting')";
    let insert = "INSERT INTO run_steps (run_id, seq, step_id, kind, status, output, ledger_id, cost, detail, \
                      finished_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
    let done = "UPDATE jobs SET status = 'done', locked_by = NULL, locked_until = NULL, updated_at = $1 \
                    WHERE id = $2 AND locked_by = $3 AND status = 'running'";
    let output = step.output.as_ref().map(json_text);
    let (status, next, error) = advance.outcome();
    let cost = i64::try_from(step.cost).unwrap_or(i64::MAX);
    let params = args![
        status.as_str(),
        &next,
        cost,
        &error,
        ms(now),
        tenant,
        &step.run_id,
        i64::from(step.seq),
        i64::from(advance.steps()),
    ];
    if ex.execute(update, &params).await? != 1 {
        return Ok(Advanced::Stale);
    }
    if let Some(event) = run_advance_event(tenant, &step.run_id, step.seq, status, now) {
        notify_in(ex, &event).await?;
    }
    let params = args![
        &step.run_id,
        i64::from(step.seq),
        &step.step_id,
        &step.kind,
        &step.status,
        &output,
        &step.ledger_id,
        cost,
        &step.detail,
        ms(step.finished_at),
    ];
    ex.execute(insert, &params).await?;
    if let Some(end) = advance.end_record(step) {
        let none: Option<String> = None;
        let params = args![
            &end.run_id,
            i64::from(end.seq),
            &end.step_id,
            &end.kind,
            &end.status,
            &none,
            &none,
            0i64,
            &none,
            ms(end.finished_at),
        ];
        ex.execute(insert, &params).await?;
    }
    // The step's own job row carries the next step when it is handed on at once (one update of
    // unindexed columns, instead of completing one row and inserting another).
    let carry = "UPDATE jobs SET payload = $1, attempts = 1, locked_until = $2, last_error = NULL, updated_at = $3 \
                 WHERE id = $4 AND locked_by = $5 AND status = 'running'";
    let mut next = None;
    match (advance.job(), handoff) {
        (Some(job), Some(h)) if job.run_at <= now => {
            let payload = json_text(&job.payload);
            let params = args![&payload, ms(h.lease_until), ms(now), &h.job_id, &h.worker];
            let handed = if ex.execute(carry, &params).await? == 1 {
                let carried = NewJob {
                    id: h.job_id.clone(),
                    ..job.clone()
                };
                Job {
                    job: NewJob {
                        run_at: from_ms(ms(carried.run_at))?,
                        max_attempts: carried.max_attempts.max(1),
                        ..carried
                    },
                    status: JobStatus::Running,
                    attempts: 1,
                    locked_by: Some(h.worker.clone()),
                    locked_until: Some(from_ms(ms(h.lease_until))?),
                    last_error: None,
                }
            } else {
                // The worker lost the step's job meanwhile: the next step gets a job of its own.
                claim_new_in(ex, job, &h.worker, h.lease_until).await?
            };
            next = Some(Box::new(handed));
        }
        (Some(job), h) => {
            if let Some(h) = h {
                ex.execute(done, &args![ms(now), &h.job_id, &h.worker]).await?;
            }
            enqueue_in(ex, job).await?;
        }
        (None, Some(h)) => {
            ex.execute(done, &args![ms(now), &h.job_id, &h.worker]).await?;
        }
        (None, None) => {}
    }
    Ok(Advanced::Recorded { next })
}

/// The statements that finish an attempt, in the caller's transaction: the ledger row's
/// outcome (only a row still `attempting` or `unknown`) and its `invocation.*` event, the
/// committed spend, and the idempotency record (kept with its result, or released).
async fn finish_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    ledger_id: &str,
    scope: Option<&IdempotencyScope>,
    f: &Finishing,
) -> Result<(), StoreError> {
    let ledger = "UPDATE ledger SET outcome = $1, attempts = $2, error_code = $3, latency_ms = $4, cost = $5, \
                  updated_at = $6, detail = COALESCE($9, detail) \
                  WHERE tenant = $7 AND id = $8 AND outcome IN ('attempting', 'unknown')";
    // A finished record is kept a retention from when its outcome is known, not only from its
    // claim (an unknown one is never taken over nor purged, and keeps its claim's span):
    // an operation resolved late (a reconciler that reached it after its retention) is still
    // replayed to the client its `unknown` answer told to send it again, not swept and run anew
    // (`a_key_resolved_after_its_retention_is_kept_from_then`).
    let update = "UPDATE idempotency SET status = $1, result = $2, error_code = $3, updated_at = $4, \
                  expires_at = CASE WHEN $1 IN ('committed', 'failed') \
                  AND $4 + (expires_at - created_at) > expires_at \
                  THEN $4 + (expires_at - created_at) ELSE expires_at END \
                  WHERE tenant = $5 AND principal = $6 AND contract_id = $7 AND key = $8 AND ledger_id = $9";
    let row = args![
        f.outcome.as_str(),
        f.attempts,
        &f.error_code,
        f.latency,
        f.cost,
        f.now,
        tenant,
        ledger_id,
        &f.detail,
    ];
    if ex.execute(ledger, &row).await? != 1 {
        return Err(StoreError::Conflict(format!(
            "ledger row {ledger_id} is not awaiting an outcome"
        )));
    }
    notify_invocation_in(ex, tenant, ledger_id, f.outcome, from_ms(f.now)?).await?;
    charge_in(ex, tenant, &f.charges).await?;
    if let Some(scope) = scope {
        match f.status {
            Some(status) => {
                let params = args![
                    status.as_str(),
                    &f.result,
                    &f.error_code,
                    f.now,
                    &scope.tenant,
                    &scope.principal,
                    &scope.contract_id,
                    &scope.key,
                    ledger_id,
                ];
                ex.execute(update, &params).await?;
            }
            None => {
                let params = args![
                    &scope.tenant,
                    &scope.principal,
                    &scope.contract_id,
                    &scope.key,
                    ledger_id
                ];
                ex.execute(RELEASE_KEY, &params).await?;
            }
        }
    }
    Ok(())
}

/// Consumes an approved, unexpired approval bound to exactly `claim`, in the caller's
/// transaction; the current record (or `None`) explains a refusal.
async fn consume_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    claim: &ApprovalClaim,
    now: i64,
) -> Result<ConsumeOutcome, StoreError> {
    let update = concat!(
        "UPDATE approvals SET status = 'consumed', consumed_at = $1, consumed_by = $2, sealed_arguments = NULL \
         WHERE tenant = $3 AND id = $4 AND status = 'approved' AND expires_at > $1 AND contract_id = $5 \
         AND payload_digest = $6 AND idempotency_key IS NOT DISTINCT FROM $7 AND proposer = $8 \
         RETURNING ",
        approval_columns!()
    );
    let params = args![
        now,
        &claim.ledger_id,
        tenant,
        &claim.approval_id,
        &claim.contract_id,
        &claim.payload_digest,
        &claim.idempotency_key,
        &claim.principal,
    ];
    Ok(match ex.fetch_optional(update, &params).await? {
        Some(row) => ConsumeOutcome::Consumed(approval_of(&row)?),
        None => {
            let current = ex
                .fetch_optional(SELECT_APPROVAL, &args![tenant, &claim.approval_id])
                .await?;
            ConsumeOutcome::Refused(current.map(|r| approval_of(&r)).transpose()?)
        }
    })
}

/// A budget reservation as bound: key, amount, expiry (ms), limit, and whether the amount
/// fits the limit at all.
type Planned = (String, i64, i64, i64, bool);

fn planned(reservations: &[BudgetReservation]) -> Result<Vec<Planned>, StoreError> {
    reservations
        .iter()
        .map(|r| {
            Ok((
                r.key.clone(),
                int(r.amount)?,
                ms(r.expires_at),
                int(r.limit)?,
                r.amount <= r.limit,
            ))
        })
        .collect()
}

/// Adds each reservation to its counter while the sum stays within the limit, in the
/// caller's transaction, stopping at the first counter without room: its key. Counters
/// before it are already incremented: the caller rolls back (the transaction or a savepoint).
async fn reserve_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    planned: &[Planned],
) -> Result<Option<String>, StoreError> {
    // Inserts the counter or adds to it, but only while the sum stays within the limit; no
    // row changed means the counter had no room. Counted, not `RETURNING`: SQLite answers a
    // `RETURNING` through a temporary table it opens and closes for every statement.
    let sql = "INSERT INTO budget_counters (tenant, key, used, expires_at) VALUES ($1, $2, $3, $4) \
               ON CONFLICT (tenant, key) DO UPDATE SET used = budget_counters.used + excluded.used \
               WHERE budget_counters.used + excluded.used <= $5";
    for (key, amount, expires, limit, within) in planned {
        let fits = *within
            && ex
                .execute(sql, &args![tenant, key, *amount, *expires, *limit])
                .await?
                == 1;
        if !fits {
            return Ok(Some(key.clone()));
        }
    }
    Ok(None)
}

/// [`reserve_in`] as one step: every counter or none. Several counters are taken inside a
/// savepoint that undoes those taken before the one without room; a single counter either
/// takes the call or is left as it was, so it needs no savepoint (two statements fewer on
/// every read that has a budget).
async fn reserve_all_in<E: Exec>(
    ex: &mut E,
    tenant: &str,
    planned: &[Planned],
) -> Result<Option<String>, StoreError> {
    if planned.len() <= 1 {
        return reserve_in(ex, tenant, planned).await;
    }
    ex.execute(CLAIMS, &[]).await?;
    let refused = reserve_in(ex, tenant, planned).await?;
    if refused.is_some() {
        ex.execute(CLAIMS_UNDO, &[]).await?;
    }
    ex.execute(CLAIMS_DONE, &[]).await?;
    Ok(refused)
}

/// Frees a call's idempotency key: the record its ledger row holds.
const RELEASE_KEY: &str = "DELETE FROM idempotency \
                           WHERE tenant = $1 AND principal = $2 AND contract_id = $3 AND key = $4 AND ledger_id = $5";

/// The savepoint that makes a call's claims all or nothing inside its write-ahead commit.
const CLAIMS: &str = "SAVEPOINT warrant_claims";
const CLAIMS_UNDO: &str = "ROLLBACK TO SAVEPOINT warrant_claims";
const CLAIMS_DONE: &str = "RELEASE SAVEPOINT warrant_claims";

impl SqlStore {
    /// The approval of one call (`tenant`, and the proposer, contract, payload digest and
    /// idempotency key of `call`) that `sql` selects, with `$6` bound to `bound` (a time in ms).
    async fn approval_of_call(
        &self,
        sql: &'static str,
        tenant: &str,
        call: &ApprovalLookup,
        bound: i64,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        read_op!(self, [tenant = tenant.to_owned(), call = call.clone()], |ex| {
            let params = args![
                &tenant,
                &call.proposer,
                &call.contract_id,
                &call.payload_digest,
                &call.idempotency_key,
                bound,
            ];
            let row = ex.fetch_optional(sql, &params).await?;
            row.map(|r| approval_of(&r)).transpose()
        })
    }
}

#[async_trait]
impl Store for SqlStore {
    async fn ping(&self) -> Result<(), StoreError> {
        read_op!(self, [], |ex| {
            ex.fetch_optional("SELECT 1 AS one", &[]).await?;
            Ok(())
        })
    }

    async fn probe_write(&self, at: OffsetDateTime) -> Result<(), StoreError> {
        let sql = "INSERT INTO write_probe (id, probed_at) VALUES (1, $1) \
                   ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at";
        write_op!(self, [], |ex| {
            ex.execute(sql, &args![ms(at)]).await?;
            Ok(())
        })
    }

    async fn register_contract(&self, c: &StoredContract) -> Result<Registration, StoreError> {
        let insert = "INSERT INTO contracts (tenant, name, version, content_id, body, binding, binding_digest, \
                      registered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
        let bind = "UPDATE contracts SET binding = $1, binding_digest = $2 \
                    WHERE tenant = $3 AND name = $4 AND version = $5 AND binding_digest IS NULL";
        let platform_name = "SELECT 1 AS one FROM contracts WHERE tenant = '' AND name = $1 LIMIT 1";
        let body = json_text(&c.body);
        let binding = c.binding.as_ref().map(json_text);
        write_op!(self, [c = c.clone()], |ex| {
            let version = i64::from(c.version);
            let tenant = c.namespace.as_stored();
            let existing = ex
                .fetch_optional(SELECT_CONTRACT, &args![tenant, &c.name, version])
                .await?
                .map(|r| contract_of(&r))
                .transpose()?;
            let platform_uses_name = c.namespace.tenant().is_some()
                && ex.fetch_optional(platform_name, &args![&c.name]).await?.is_some();
            match plan_registration(existing.as_ref(), &c, platform_uses_name)? {
                RegistrationPlan::Unchanged => Ok(Registration::Unchanged),
                RegistrationPlan::Bind => {
                    let args = args![&binding, &c.binding_digest, tenant, &c.name, version];
                    if ex.execute(bind, &args).await? == 1 {
                        Ok(Registration::Bound)
                    } else {
                        Err(StoreError::Conflict(format!(
                            "{}@{} was bound meanwhile",
                            c.name, c.version
                        )))
                    }
                }
                RegistrationPlan::Insert => {
                    let args = args![
                        tenant,
                        &c.name,
                        version,
                        &c.content_id,
                        &body,
                        &binding,
                        &c.binding_digest,
                        ms(c.registered_at),
                    ];
                    // A unique violation (the same body under another name@version of this
                    // namespace, or a concurrent registration) maps onto `Conflict`.
                    ex.execute(insert, &args).await?;
                    if let Some(owner) = c.namespace.tenant() {
                        let notice = Notice::contract(
                            owner,
                            &c.name,
                            c.version,
                            &c.content_id,
                            false,
                            c.registered_at,
                        );
                        notify_in(ex, &notice).await?;
                    }
                    Ok(Registration::Registered)
                }
            }
        })
    }

    async fn get_contract(
        &self,
        namespace: &Namespace,
        name: &str,
        version: u32,
    ) -> Result<Option<StoredContract>, StoreError> {
        read_op!(
            self,
            [tenant = namespace.as_stored().to_owned(), name = name.to_owned()],
            |ex| {
                let row = ex
                    .fetch_optional(SELECT_CONTRACT, &args![&tenant, &name, i64::from(version)])
                    .await?;
                row.map(|r| contract_of(&r)).transpose()
            }
        )
    }

    async fn get_contract_by_id(
        &self,
        namespace: &Namespace,
        content_id: &str,
    ) -> Result<Option<StoredContract>, StoreError> {
        let sql = concat!(
            "SELECT ",
            contract_columns!(),
            " FROM contracts WHERE tenant = $1 AND content_id = $2"
        );
        read_op!(
            self,
            [
                tenant = namespace.as_stored().to_owned(),
                content_id = content_id.to_owned()
            ],
            |ex| {
                let row = ex.fetch_optional(sql, &args![&tenant, &content_id]).await?;
                row.map(|r| contract_of(&r)).transpose()
            }
        )
    }

    async fn list_contracts(&self) -> Result<Vec<StoredContract>, StoreError> {
        let sql = concat!(
            "SELECT ",
            contract_columns!(),
            " FROM contracts ORDER BY tenant, name, version"
        );
        read_op!(self, [], |ex| {
            let rows = ex.fetch_all(sql, &[]).await?;
            rows.iter().map(contract_of).collect()
        })
    }

    async fn list_contract_states(&self) -> Result<Vec<ContractState>, StoreError> {
        read_op!(self, [], |ex| {
            let rows = ex
                .fetch_all(
                    "SELECT tenant, content_id, binding_digest, retired_at FROM contracts",
                    &[],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(ContractState {
                        namespace: Namespace::from_stored(&row.text("tenant")?),
                        content_id: row.text("content_id")?,
                        binding_digest: row.opt_text("binding_digest")?,
                        retired_at: opt_from_ms(row.opt_int("retired_at")?)?,
                    })
                })
                .collect()
        })
    }

    async fn retire_contract(
        &self,
        namespace: &Namespace,
        content_id: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE contracts SET retired_at = COALESCE(retired_at, $1) WHERE tenant = $2 AND content_id = $3 \
                   RETURNING name, version";
        write_op!(
            self,
            [
                owner = namespace.tenant().map(str::to_owned),
                tenant = namespace.as_stored().to_owned(),
                content_id = content_id.to_owned()
            ],
            |ex| {
                let Some(row) = ex
                    .fetch_optional(sql, &args![ms(at), &tenant, &content_id])
                    .await?
                else {
                    return Ok(false);
                };
                if let Some(owner) = &owner {
                    let version = u32_of(row.int("version")?)?;
                    let notice = Notice::contract(owner, &row.text("name")?, version, &content_id, true, at);
                    notify_in(ex, &notice).await?;
                }
                Ok(true)
            }
        )
    }

    async fn create_tenant(&self, t: &TenantRecord) -> Result<bool, StoreError> {
        let sql = "INSERT INTO tenants (id, label, created_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
        write_op!(self, [t = t.clone()], |ex| {
            Ok(ex.execute(sql, &args![&t.id, &t.label, ms(t.created_at)]).await? == 1)
        })
    }

    async fn publish_workflow(&self, w: &WorkflowRecord) -> Result<Publication, StoreError> {
        let insert = "INSERT INTO workflows (tenant, name, version, digest, document, pinned, published_by, \
                      published_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING";
        let existing = "SELECT digest FROM workflows WHERE tenant = $1 AND name = $2 AND version = $3";
        let document = json_text(&w.document);
        let pinned = serde_json::to_string(&w.pinned).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        write_op!(self, [w = w.clone()], |ex| {
            let version = i64::from(w.version);
            let args = args![
                &w.tenant,
                &w.name,
                version,
                &w.digest,
                &document,
                &pinned,
                &w.published_by,
                ms(w.published_at),
            ];
            if ex.execute(insert, &args).await? == 1 {
                return Ok(Publication::Published);
            }
            let row = ex
                .fetch_optional(existing, &args![&w.tenant, &w.name, version])
                .await?
                .ok_or(StoreError::NotFound)?;
            if row.text("digest")? == w.digest {
                Ok(Publication::Unchanged)
            } else {
                Err(StoreError::Conflict(format!(
                    "workflow {}@{} is already published with another definition",
                    w.name, w.version
                )))
            }
        })
    }

    async fn get_workflow(
        &self,
        tenant: &str,
        name: &str,
        version: u32,
    ) -> Result<Option<WorkflowRecord>, StoreError> {
        read_op!(self, [tenant = tenant.to_owned(), name = name.to_owned()], |ex| {
            let row = ex
                .fetch_optional(
                    &format!("{SELECT_WORKFLOW} WHERE tenant = $1 AND name = $2 AND version = $3"),
                    &args![&tenant, &name, i64::from(version)],
                )
                .await?;
            row.map(|r| workflow_of(&r)).transpose()
        })
    }

    async fn list_workflows(&self, tenant: &str) -> Result<Vec<WorkflowRecord>, StoreError> {
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let rows = ex
                .fetch_all(
                    &format!("{SELECT_WORKFLOW} WHERE tenant = $1 ORDER BY name, version"),
                    &args![&tenant],
                )
                .await?;
            rows.iter().map(workflow_of).collect()
        })
    }

    async fn start_run(&self, run: &RunRecord, job: &NewJob) -> Result<(), StoreError> {
        let (input, principal) = (json_text(&run.input), json_text(&run.principal));
        write_op!(self, [r = run.clone(), job = job.clone()], |ex| {
            insert_run_in(ex, &r, &input, &principal).await?;
            enqueue_in(ex, &job).await
        })
    }

    async fn start_run_claimed(
        &self,
        run: &RunRecord,
        job: &NewJob,
        worker: &str,
        lease_until: OffsetDateTime,
    ) -> Result<Job, StoreError> {
        let (input, principal) = (json_text(&run.input), json_text(&run.principal));
        write_op!(
            self,
            [r = run.clone(), job = job.clone(), worker = worker.to_owned()],
            |ex| {
                insert_run_in(ex, &r, &input, &principal).await?;
                claim_new_in(ex, &job, &worker, lease_until).await
            }
        )
    }

    async fn advance_run(
        &self,
        tenant: &str,
        step: &RunStep,
        advance: &RunAdvance,
        handoff: Option<&Handoff>,
        now: OffsetDateTime,
    ) -> Result<Advanced, StoreError> {
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                step = step.clone(),
                advance = advance.clone(),
                handoff = handoff.cloned()
            ],
            |ex| advance_in(ex, &tenant, &step, &advance, handoff.as_ref(), now).await
        )
    }

    async fn cancel_run(&self, tenant: &str, id: &str, now: OffsetDateTime) -> Result<bool, StoreError> {
        let sql = "UPDATE runs SET status = 'cancelled', next_step = NULL, error = 'cancelled', updated_at = $1 \
                   WHERE tenant = $2 AND id = $3 AND status IN ('running', 'waiting')";
        write_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            Ok(ex.execute(sql, &args![ms(now), &tenant, &id]).await? == 1)
        })
    }

    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError> {
        read_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            let row = ex
                .fetch_optional(
                    &format!("{SELECT_RUN} WHERE tenant = $1 AND id = $2"),
                    &args![&tenant, &id],
                )
                .await?;
            row.map(|r| run_of(&r)).transpose()
        })
    }

    async fn run_steps(&self, tenant: &str, id: &str) -> Result<Vec<RunStep>, StoreError> {
        let sql = "SELECT s.run_id, s.seq, s.step_id, s.kind, s.status, s.output, s.ledger_id, s.cost, s.detail, \
                   s.finished_at FROM run_steps s JOIN runs r ON r.id = s.run_id \
                   WHERE r.tenant = $1 AND s.run_id = $2 ORDER BY s.seq";
        read_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            let rows = ex.fetch_all(sql, &args![&tenant, &id]).await?;
            rows.iter()
                .map(|row| {
                    Ok(RunStep {
                        run_id: row.text("run_id")?,
                        seq: u32::try_from(row.int("seq")?)
                            .map_err(|_| StoreError::Corrupt("step seq".into()))?,
                        step_id: row.text("step_id")?,
                        kind: row.text("kind")?,
                        status: row.text("status")?,
                        output: row.opt_text("output")?.as_deref().map(json_of).transpose()?,
                        ledger_id: row.opt_text("ledger_id")?,
                        cost: u64::try_from(row.int("cost")?).unwrap_or_default(),
                        detail: row.opt_text("detail")?,
                        finished_at: from_ms(row.int("finished_at")?)?,
                    })
                })
                .collect()
        })
    }

    async fn list_runs(&self, tenant: &str, limit: u32) -> Result<Vec<RunRecord>, StoreError> {
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let rows = ex
                .fetch_all(
                    &format!("{SELECT_RUN} WHERE tenant = $1 ORDER BY created_at DESC, id DESC LIMIT $2"),
                    &args![&tenant, i64::from(limit.clamp(1, 1000))],
                )
                .await?;
            rows.iter().map(run_of).collect()
        })
    }

    async fn list_tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        read_op!(self, [], |ex| {
            let rows = ex
                .fetch_all("SELECT id, label, created_at FROM tenants ORDER BY id", &[])
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(TenantRecord {
                        id: row.text("id")?,
                        label: row.opt_text("label")?,
                        created_at: from_ms(row.int("created_at")?)?,
                    })
                })
                .collect()
        })
    }

    async fn insert_ledger(&self, entry: &LedgerEntry) -> Result<(), StoreError> {
        let arguments = arguments_text(entry);
        write_op!(self, [entry = entry.without_arguments()], |ex| {
            ex.execute(INSERT_LEDGER, &ledger_args(&entry, &arguments)?)
                .await?;
            Ok(())
        })
    }

    async fn get_ledger(&self, tenant: &str, id: &str) -> Result<Option<LedgerEntry>, StoreError> {
        let sql = concat!(
            "SELECT ",
            ledger_columns!(),
            " FROM ledger WHERE tenant = $1 AND id = $2"
        );
        read_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&tenant, &id]).await?;
            row.map(|r| ledger_of(&r)).transpose()
        })
    }

    async fn list_ledger(&self, tenant: &str, filter: &LedgerFilter) -> Result<LedgerPage, StoreError> {
        let limit = filter.limit.clamp(1, 500);
        let cursor = filter.cursor.as_deref().map(parse_ledger_cursor).transpose()?;
        let mut q = PageQuery::new(
            concat!("SELECT ", ledger_columns!(), " FROM ledger WHERE tenant = $1"),
            vec![Bound::Text(tenant.to_owned())],
        );
        let text = |v: &Option<String>| v.clone().map(Bound::Text);
        q.and(" AND tool = ?", text(&filter.tool));
        q.and(
            " AND outcome = ?",
            filter.outcome.map(|o| Bound::Text(o.as_str().to_owned())),
        );
        q.and(" AND principal = ?", text(&filter.principal));
        q.and(" AND created_at >= ?", filter.since.map(|t| Bound::Int(ms(t))));
        q.and(" AND created_at < ?", filter.until.map(|t| Bound::Int(ms(t))));
        q.and(" AND trace_id = ?", text(&filter.trace_id));
        q.and(" AND approval_id = ?", text(&filter.approval_id));
        let q = q.newest_first(cursor, limit);
        read_op!(self, [query = q], |ex| {
            let rows = ex.fetch_all(&query.sql, &query.args()).await?;
            let entries = rows.iter().map(ledger_of).collect::<Result<Vec<_>, _>>()?;
            Ok(ledger_page(entries, limit as usize))
        })
    }

    async fn list_unresolved(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<LedgerEntry>, StoreError> {
        let sql = concat!(
            "SELECT ",
            ledger_columns!(),
            " FROM ledger WHERE outcome IN ('attempting', 'unknown') AND updated_at <= $1 \
             ORDER BY updated_at LIMIT $2"
        );
        read_op!(self, [], |ex| {
            let rows = ex
                .fetch_all(sql, &args![ms(older_than), i64::from(limit)])
                .await?;
            rows.iter().map(ledger_of).collect()
        })
    }

    async fn claim_unresolved(
        &self,
        worker: &str,
        now: OffsetDateTime,
        scheduled_by: OffsetDateTime,
        older_than: OffsetDateTime,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<ClaimedRow>, StoreError> {
        // The due rows, earliest due first. PostgreSQL: concurrent claimers skip each other's
        // locked rows (and a row another claimer committed meanwhile is re-checked against the
        // condition, so it is no longer due). SQLite: the single writer serializes claims.
        macro_rules! due {
            ($lock:literal) => {
                concat!(
                    "SELECT ",
                    ledger_columns!(),
                    ", reconcile_attempts, reconcile_note FROM ledger \
                     WHERE outcome IN ('attempting', 'unknown') \
                     AND ((reconcile_at IS NULL AND updated_at <= $1) OR reconcile_at <= $5 \
                          OR (reconcile_owner IS NULL AND reconcile_at <= $2)) \
                     ORDER BY COALESCE(reconcile_at, updated_at + $3), id LIMIT $4",
                    $lock
                )
            };
        }
        let select = match self.backend {
            Backend::Sqlite(_) => due!(""),
            Backend::Postgres(_) => due!(" FOR UPDATE SKIP LOCKED"),
        };
        let take = "UPDATE ledger SET reconcile_at = $1, reconcile_owner = $2 WHERE id = $3";
        let (now, older_than) = (ms(now), ms(older_than));
        let until = now.saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
        let shift = now.saturating_sub(older_than).max(0);
        write_op!(self, [worker = worker.to_owned()], |ex| {
            let params = args![
                older_than,
                ms(scheduled_by).max(now),
                shift,
                i64::from(limit.clamp(1, 1000)),
                now
            ];
            let rows = ex.fetch_all(select, &params).await?;
            let mut claimed = Vec::with_capacity(rows.len());
            for row in &rows {
                let entry = ledger_of(row)?;
                ex.execute(take, &args![until, &worker, &entry.id]).await?;
                claimed.push(ClaimedRow {
                    entry,
                    reconcile_attempts: u32_of(row.int("reconcile_attempts")?)?,
                    reconcile_note: row.opt_text("reconcile_note")?,
                });
            }
            Ok(claimed)
        })
    }

    async fn reschedule_unresolved(
        &self,
        tenant: &str,
        id: &str,
        worker: &str,
        next_at: OffsetDateTime,
        note: &str,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE ledger SET reconcile_at = $1, reconcile_owner = NULL, \
                   reconcile_attempts = reconcile_attempts + 1, reconcile_note = $2 \
                   WHERE tenant = $3 AND id = $4 AND reconcile_owner = $5 \
                   AND outcome IN ('attempting', 'unknown')";
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                id = id.to_owned(),
                worker = worker.to_owned(),
                note = note.to_owned(),
            ],
            |ex| {
                let params = args![ms(next_at), &note, &tenant, &id, &worker];
                Ok(ex.execute(sql, &params).await? == 1)
            }
        )
    }

    async fn mark_overdue(
        &self,
        created_before: OffsetDateTime,
        now: OffsetDateTime,
        note: &str,
        limit: u32,
    ) -> Result<OverdueSweep, StoreError> {
        macro_rules! unmarked {
            ($lock:literal) => {
                concat!(
                    "SELECT ",
                    ledger_columns!(),
                    " FROM ledger WHERE outcome IN ('attempting', 'unknown') \
                     AND reconcile_overdue_at IS NULL AND created_at <= $1 \
                     ORDER BY created_at, id LIMIT $2",
                    $lock
                )
            };
        }
        let select = match self.backend {
            Backend::Sqlite(_) => unmarked!(""),
            Backend::Postgres(_) => unmarked!(" FOR UPDATE SKIP LOCKED"),
        };
        let mark = "UPDATE ledger SET reconcile_overdue_at = $1, detail = $2 \
                    WHERE id = $3 AND reconcile_overdue_at IS NULL";
        let count = "SELECT COUNT(*) AS n FROM ledger WHERE outcome IN ('attempting', 'unknown') \
                     AND reconcile_overdue_at IS NOT NULL";
        write_op!(self, [note = note.to_owned()], |ex| {
            let params = args![ms(created_before), i64::from(limit.clamp(1, 10_000))];
            let rows = ex.fetch_all(select, &params).await?;
            let mut newly = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut entry = ledger_of(row)?;
                let detail = overdue_detail(&note, entry.detail.as_deref());
                if ex.execute(mark, &args![ms(now), &detail, &entry.id]).await? == 1 {
                    entry.detail = Some(detail);
                    newly.push(entry);
                }
            }
            let overdue = match ex.fetch_optional(count, &[]).await? {
                Some(row) => uint(row.int("n")?)?,
                None => 0,
            };
            Ok(OverdueSweep { newly, overdue })
        })
    }

    async fn begin_attempt(
        &self,
        entry: &LedgerEntry,
        scope: Option<&IdempotencyScope>,
        claims: &AttemptClaims,
        expires_at: OffsetDateTime,
    ) -> Result<AttemptStart, StoreError> {
        let insert = "INSERT INTO idempotency (tenant, principal, contract_id, key, payload_digest, status, ledger_id, \
                      created_at, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5, 'in_flight', $6, $7, $7, $8) \
                      ON CONFLICT (tenant, principal, contract_id, key) DO NOTHING";
        // An expired record whose operation finished is free: take it over in place. One still
        // in flight or unknown is not (`classify_existing` answers `Unknown`).
        let take_over = "UPDATE idempotency SET payload_digest = $5, status = 'in_flight', result = NULL, \
                         error_code = NULL, ledger_id = $6, created_at = $7, updated_at = $7, expires_at = $8 \
                         WHERE tenant = $1 AND principal = $2 AND contract_id = $3 AND key = $4 AND expires_at <= $7 \
                         AND status IN ('committed', 'failed')";
        let now = ms(entry.created_at);
        let arguments = arguments_text(entry);
        let budget = planned(&claims.reservations)?;
        write_op!(
            self,
            [
                entry = entry.without_arguments(),
                scope = scope.cloned(),
                approval = claims.approval.clone()
            ],
            |ex| {
                // A refusal undoes the claims taken before it. The savepoint that does so is
                // opened at once when an approval or several budget counters are claimed;
                // otherwise the one refusal that can follow a key's claim is its one budget
                // counter's, and the savepoint is opened only before an expired record is
                // taken over: a key claimed by its insert is given back by deleting that row.
                // (A savepoint copies every page the claims touch and costs two statements.)
                let mut guarded = approval.is_some() || budget.len() > 1;
                if guarded {
                    ex.execute(CLAIMS, &[]).await?;
                }
                let mut inserted = false;
                let mut start = match &scope {
                    None => AttemptStart::Started,
                    Some(scope) => {
                        let digest = entry.payload_digest.as_deref().unwrap_or_default();
                        let claim = args![
                            &scope.tenant,
                            &scope.principal,
                            &scope.contract_id,
                            &scope.key,
                            digest,
                            &entry.id,
                            now,
                            ms(expires_at),
                        ];
                        let key = args![&scope.tenant, &scope.principal, &scope.contract_id, &scope.key];
                        // The record that kept the claim out can be gone by the time it is read
                        // (PostgreSQL reads each statement afresh: reconciliation may have freed
                        // the key meanwhile); then the key is free and the claim is tried again.
                        let mut found = None;
                        for _ in 0..CLAIM_TRIES {
                            if ex.execute(insert, &claim).await? == 1 {
                                inserted = true;
                                found = Some(AttemptStart::Started);
                                break;
                            }
                            if !guarded && !budget.is_empty() {
                                ex.execute(CLAIMS, &[]).await?;
                                guarded = true;
                            }
                            if ex.execute(take_over, &claim).await? == 1 {
                                found = Some(AttemptStart::Started);
                                break;
                            }
                            if let Some(row) = ex.fetch_optional(SELECT_IDEMPOTENCY, &key).await? {
                                found = Some(classify_existing(
                                    idempotency_of(&row)?,
                                    entry.payload_digest.as_deref(),
                                    entry.created_at,
                                ));
                                break;
                            }
                        }
                        found.ok_or(StoreError::NotFound)?
                    }
                };
                if start == AttemptStart::Started
                    && let Some(claim) = &approval
                    && let ConsumeOutcome::Refused(current) =
                        consume_in(ex, &entry.tenant, claim, now).await?
                {
                    start = AttemptStart::ApprovalRefused(current);
                }
                if start == AttemptStart::Started
                    && let Some(key) = reserve_in(ex, &entry.tenant, &budget).await?
                {
                    start = AttemptStart::BudgetExhausted { key };
                }
                // Nothing of a refused call is claimed or spent.
                if guarded {
                    if start != AttemptStart::Started {
                        ex.execute(CLAIMS_UNDO, &[]).await?;
                    }
                    ex.execute(CLAIMS_DONE, &[]).await?;
                } else if inserted
                    && start != AttemptStart::Started
                    && let Some(scope) = &scope
                {
                    let key = args![
                        &scope.tenant,
                        &scope.principal,
                        &scope.contract_id,
                        &scope.key,
                        &entry.id
                    ];
                    ex.execute(RELEASE_KEY, &key).await?;
                }
                // The counter's event, once nothing of the call is left to undo (inside the
                // savepoint it was undone with the claims).
                if let AttemptStart::BudgetExhausted { key } = &start {
                    let notice = Notice::budget(&entry.tenant, key, &entry.id, entry.created_at);
                    notify_in(ex, &notice).await?;
                }
                // An unknown operation is the runtime's to reconcile before this call's row
                // says how it ended (see `Store::begin_attempt`).
                if !matches!(start, AttemptStart::Unknown(_)) {
                    let row = attempt_row(&entry, &start);
                    ex.execute(INSERT_LEDGER, &ledger_args(&row, &arguments)?).await?;
                }
                Ok(start)
            }
        )
    }

    async fn finish_attempt(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let finishing = Finishing::of(finish, now, scope.is_some())?;
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                ledger_id = ledger_id.to_owned(),
                scope = scope.cloned(),
            ],
            |ex| finish_in(ex, &tenant, &ledger_id, scope.as_ref(), &finishing).await
        )
    }

    async fn finish_step_attempt(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
        then: &StepFollowUp,
    ) -> Result<Option<Advanced>, StoreError> {
        let finishing = Finishing::of(finish, now, scope.is_some())?;
        let step = then.committed_step(finish, ledger_id, now);
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                ledger_id = ledger_id.to_owned(),
                scope = scope.cloned(),
                then = then.clone(),
            ],
            |ex| {
                finish_in(ex, &tenant, &ledger_id, scope.as_ref(), &finishing).await?;
                match &step {
                    Some(step) => {
                        let advanced =
                            advance_in(ex, &then.tenant, step, &then.advance, then.handoff.as_ref(), now)
                                .await?;
                        Ok(Some(advanced))
                    }
                    None => Ok(None),
                }
            }
        )
    }

    async fn record_late_outcome(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<LateOutcome, StoreError> {
        let finishing = Finishing::of(finish, now, true)?;
        let correct = "UPDATE ledger SET outcome = 'committed', attempts = CASE WHEN attempts > $1 THEN attempts ELSE $1 END, \
                       error_code = NULL, cost = $2, updated_at = $3, detail = $4 \
                       WHERE tenant = $5 AND id = $6 AND outcome = 'reconciled_not_committed'";
        let restore = "INSERT INTO idempotency (tenant, principal, contract_id, key, payload_digest, status, result, \
                       ledger_id, created_at, updated_at, expires_at) \
                       SELECT $1, $2, $3, $4, COALESCE(payload_digest, ''), 'committed', $5, $6, $7, $7, $8 \
                       FROM ledger WHERE tenant = $1 AND id = $6 \
                       ON CONFLICT (tenant, principal, contract_id, key) DO UPDATE SET status = 'committed', \
                       result = excluded.result, error_code = NULL, updated_at = excluded.updated_at \
                       WHERE idempotency.ledger_id = excluded.ledger_id";
        let retention = ms(now + time::Duration::days(1));
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                ledger_id = ledger_id.to_owned(),
                scope = scope.cloned(),
                committed = finish.outcome,
            ],
            |ex| {
                let row = ex
                    .fetch_optional(
                        "SELECT outcome FROM ledger WHERE tenant = $1 AND id = $2",
                        &args![&tenant, &ledger_id],
                    )
                    .await?
                    .ok_or(StoreError::NotFound)?;
                let resolved = row
                    .opt_text("outcome")?
                    .map(|o| parse_enum(&o, Outcome::parse, "outcome"))
                    .transpose()?;
                if !late_outcome_corrects(resolved, committed) {
                    return Ok(LateOutcome::Kept(resolved.unwrap_or(Outcome::Attempting)));
                }
                let note = correction_note(&ledger_id);
                let params = args![
                    finishing.attempts,
                    finishing.cost,
                    finishing.now,
                    &note,
                    &tenant,
                    &ledger_id
                ];
                if ex.execute(correct, &params).await? != 1 {
                    return Err(StoreError::Conflict(format!(
                        "ledger row {ledger_id} changed meanwhile"
                    )));
                }
                notify_in(ex, &Notice::correction(&tenant, &ledger_id, now)).await?;
                for (key, amount, expires) in &finishing.charges {
                    ex.execute(CHARGE, &args![&tenant, key, *amount, *expires])
                        .await?;
                }
                let mut key_retaken = false;
                if let Some(scope) = &scope {
                    let params = args![
                        &scope.tenant,
                        &scope.principal,
                        &scope.contract_id,
                        &scope.key,
                        &finishing.result,
                        &ledger_id,
                        finishing.now,
                        retention,
                    ];
                    key_retaken = ex.execute(restore, &params).await? == 0;
                }
                Ok(LateOutcome::Corrected { key_retaken })
            }
        )
    }

    async fn record_attempt(
        &self,
        entry: &LedgerEntry,
        reservations: &[BudgetReservation],
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<BudgetOutcome, StoreError> {
        let finishing = Finishing::of(finish, now, false)?;
        let arguments = arguments_text(entry);
        let budget = planned(reservations)?;
        // The row as it ends, made before the write is queued (an operation may run again,
        // so it does not consume what it captures), written in one insert: never `attempting`
        // (a row that passes through the unresolved indexes costs two more pages in every
        // commit). The arguments go in as `arguments` (serialised once): the row is made
        // without their tree.
        let finished = finished_row(entry.without_arguments(), finish, now);
        let entered = entry.updated_at;
        write_op!(self, [finish = finish.clone()], |ex| {
            let row = finished.as_ref().map_err(Clone::clone)?;
            if let Some(key) = reserve_all_in(ex, &row.tenant, &budget).await? {
                let row = withheld_of_finished(row.clone(), entered, &key, &finish);
                ex.execute(INSERT_LEDGER, &ledger_args(&row, &arguments)?).await?;
                notify_in(ex, &Notice::budget(&row.tenant, &key, &row.id, now)).await?;
                return Ok(BudgetOutcome::Exhausted { key });
            }
            ex.execute(INSERT_LEDGER, &ledger_args(row, &arguments)?).await?;
            notify_invocation_in(ex, &row.tenant, &row.id, finish.outcome, now).await?;
            charge_in(ex, &row.tenant, &finishing.charges).await?;
            Ok(BudgetOutcome::Granted)
        })
    }

    async fn get_idempotency(
        &self,
        scope: &IdempotencyScope,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        read_op!(self, [scope = scope.clone()], |ex| {
            let key = args![&scope.tenant, &scope.principal, &scope.contract_id, &scope.key];
            let row = ex.fetch_optional(SELECT_IDEMPOTENCY, &key).await?;
            row.map(|r| idempotency_of(&r)).transpose()
        })
    }

    async fn create_approval(&self, a: &NewApproval) -> Result<(), StoreError> {
        let sql = "INSERT INTO approvals (id, tenant, contract_id, tool, proposer, payload_digest, idempotency_key, \
                   arguments, status, created_at, expires_at, reviewers, sealed_arguments) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9, $10, $11, $12)";
        let arguments = json_text(&a.arguments);
        let reviewers = a.reviewers.as_ref().map(|r| json_text(&r.to_json()));
        write_op!(self, [a = a.clone()], |ex| {
            let params = args![
                &a.id,
                &a.tenant,
                &a.contract_id,
                &a.tool,
                &a.proposer,
                &a.payload_digest,
                &a.idempotency_key,
                &arguments,
                ms(a.created_at),
                ms(a.expires_at),
                &reviewers,
                &a.sealed_arguments,
            ];
            ex.execute(sql, &params).await?;
            enqueue_in(ex, &a.requested_event()).await
        })
    }

    async fn get_approval(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        read_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            let row = ex.fetch_optional(SELECT_APPROVAL, &args![&tenant, &id]).await?;
            row.map(|r| approval_of(&r).map(|a| a.as_of(now))).transpose()
        })
    }

    async fn find_pending_approval(
        &self,
        tenant: &str,
        call: &ApprovalLookup,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        let sql = concat!(
            "SELECT ",
            approval_columns!(),
            " FROM approvals WHERE tenant = $1 AND status = 'pending' AND proposer = $2 AND contract_id = $3 ",
            "AND payload_digest = $4 AND idempotency_key IS NOT DISTINCT FROM $5 AND expires_at > $6 ",
            "ORDER BY created_at, id LIMIT 1"
        );
        self.approval_of_call(sql, tenant, call, ms(call.now)).await
    }

    async fn find_rejected_approval(
        &self,
        tenant: &str,
        call: &ApprovalLookup,
        since: OffsetDateTime,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        let sql = concat!(
            "SELECT ",
            approval_columns!(),
            " FROM approvals WHERE tenant = $1 AND status = 'rejected' AND proposer = $2 AND contract_id = $3 ",
            "AND payload_digest = $4 AND idempotency_key IS NOT DISTINCT FROM $5 AND decided_at >= $6 ",
            "ORDER BY decided_at DESC, id DESC LIMIT 1"
        );
        self.approval_of_call(sql, tenant, call, ms(since)).await
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
        now: OffsetDateTime,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        // The filter is on the effective status (`ApprovalRequest::as_of`): a pending or
        // approved request past its expiry is `expired` before the sweeper writes it. The
        // first condition keeps the (tenant, status) index usable.
        let sql = concat!(
            "SELECT ",
            approval_columns!(),
            " FROM approvals WHERE tenant = $1 AND ($2 = '' OR ( \
               (status = $2 OR ($2 = 'expired' AND status IN ('pending', 'approved'))) \
               AND (CASE WHEN status IN ('pending', 'approved') AND expires_at <= $4 \
                    THEN 'expired' ELSE status END) = $2)) \
             ORDER BY created_at, id LIMIT $3"
        );
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let params = args![
                &tenant,
                status.map_or("", ApprovalStatus::as_str),
                i64::from(limit.clamp(1, 1000)),
                ms(now),
            ];
            let rows = ex.fetch_all(sql, &params).await?;
            rows.iter()
                .map(|r| approval_of(r).map(|a| a.as_of(now)))
                .collect()
        })
    }

    async fn page_approvals(
        &self,
        tenant: &str,
        filter: &ApprovalFilter,
        now: OffsetDateTime,
    ) -> Result<ApprovalPage, StoreError> {
        let limit = filter.limit.clamp(1, 500);
        let cursor = filter.cursor.as_deref().map(parse_ledger_cursor).transpose()?;
        // `$2` is `now`, for the effective status.
        let mut q = PageQuery::new(
            concat!(
                "SELECT ",
                approval_columns!(),
                " FROM approvals WHERE tenant = $1 AND $2 = $2"
            ),
            vec![Bound::Text(tenant.to_owned()), Bound::Int(ms(now))],
        );
        if let Some(status) = filter.status {
            q.sql.push_str(effective_status(status));
        }
        q.and(" AND tool = ?", filter.tool.clone().map(Bound::Text));
        q.and(" AND proposer = ?", filter.proposer.clone().map(Bound::Text));
        let q = q.newest_first(cursor, limit);
        read_op!(self, [query = q], |ex| {
            let rows = ex.fetch_all(&query.sql, &query.args()).await?;
            let approvals = rows
                .iter()
                .map(|r| approval_of(r).map(|a| a.as_of(now)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(approval_page(approvals, limit as usize))
        })
    }

    async fn count_approvals(
        &self,
        tenant: &str,
        status: ApprovalStatus,
        now: OffsetDateTime,
        at_most: u32,
    ) -> Result<u64, StoreError> {
        let sql = format!(
            "SELECT COUNT(*) AS n FROM (SELECT 1 FROM approvals WHERE tenant = $1 AND $2 = $2{} LIMIT $3) AS counted",
            effective_status(status)
        );
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let row = ex
                .fetch_optional(&sql, &args![&tenant, ms(now), i64::from(at_most)])
                .await?;
            let n = match row {
                Some(r) => r.int("n")?,
                None => 0,
            };
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        reviewer: &str,
        verdict: Verdict,
        reason: Option<&str>,
        now: OffsetDateTime,
    ) -> Result<Result<ApprovalRequest, DecideRefusal>, StoreError> {
        let status = match verdict {
            Verdict::Approve => ApprovalStatus::Approved,
            Verdict::Reject => ApprovalStatus::Rejected,
        };
        let update = concat!(
            "UPDATE approvals SET status = $1, reviewer = $2, reason = $3, decided_at = $4, \
             sealed_arguments = CASE WHEN $1 = 'rejected' THEN NULL ELSE sealed_arguments END \
             WHERE tenant = $5 AND id = $6 AND status = 'pending' AND expires_at > $4 AND proposer <> $2 \
             RETURNING ",
            approval_columns!()
        );
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                id = id.to_owned(),
                reviewer = reviewer.to_owned(),
                reason = reason.map(str::to_owned),
            ],
            |ex| {
                let params = args![status.as_str(), &reviewer, &reason, ms(now), &tenant, &id];
                match ex.fetch_optional(update, &params).await? {
                    Some(row) => {
                        // The decision and its event commit together.
                        enqueue_in(ex, &approval_event(&tenant, &id, "approval.decided", now)).await?;
                        Ok(Ok(approval_of(&row)?))
                    }
                    None => {
                        let current = ex.fetch_optional(SELECT_APPROVAL, &args![&tenant, &id]).await?;
                        let current = current.map(|r| approval_of(&r)).transpose()?;
                        // `None` means another reviewer won the race since the update.
                        Ok(Err(review_refusal(current.as_ref(), &reviewer, now)
                            .unwrap_or_else(|| {
                                current
                                    .map_or(DecideRefusal::NotFound, |a| DecideRefusal::NotPending(a.status))
                            })))
                    }
                }
            }
        )
    }

    async fn supersede_approval(
        &self,
        tenant: &str,
        id: &str,
        by: &str,
        reviewer: &str,
        reason: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE approvals SET status = 'rejected', superseded_by = $1, reviewer = $2, reason = $3, \
                   decided_at = $4, sealed_arguments = NULL WHERE tenant = $5 AND id = $6 AND status = 'pending' AND expires_at > $4 \
                   AND proposer <> $2";
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                id = id.to_owned(),
                by = by.to_owned(),
                reviewer = reviewer.to_owned(),
                reason = reason.to_owned()
            ],
            |ex| {
                let params = args![&by, &reviewer, &reason, ms(now), &tenant, &id];
                if ex.execute(sql, &params).await? != 1 {
                    return Ok(false);
                }
                enqueue_in(ex, &approval_event(&tenant, &id, "approval.decided", now)).await?;
                Ok(true)
            }
        )
    }

    async fn consume_approval(
        &self,
        tenant: &str,
        claim: &ApprovalClaim,
        now: OffsetDateTime,
    ) -> Result<ConsumeOutcome, StoreError> {
        write_op!(self, [tenant = tenant.to_owned(), claim = claim.clone()], |ex| {
            consume_in(ex, &tenant, &claim, ms(now)).await
        })
    }

    async fn reserve_budget(
        &self,
        tenant: &str,
        reservations: &[BudgetReservation],
    ) -> Result<BudgetOutcome, StoreError> {
        let planned = planned(reservations)?;
        write_op!(self, [tenant = tenant.to_owned()], |ex| {
            Ok(match reserve_in(ex, &tenant, &planned).await? {
                Some(key) => {
                    ex.rollback();
                    BudgetOutcome::Exhausted { key }
                }
                None => BudgetOutcome::Granted,
            })
        })
    }

    async fn release_budget(
        &self,
        tenant: &str,
        reservations: &[BudgetReservation],
    ) -> Result<(), StoreError> {
        let sql = "UPDATE budget_counters SET used = CASE WHEN used > $1 THEN used - $1 ELSE 0 END \
                   WHERE tenant = $2 AND key = $3";
        let planned = reservations
            .iter()
            .map(|r| Ok((r.key.clone(), int(r.amount)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        write_op!(self, [tenant = tenant.to_owned()], |ex| {
            for (key, amount) in &planned {
                ex.execute(sql, &args![*amount, &tenant, key]).await?;
            }
            Ok(())
        })
    }

    async fn budget_used(&self, tenant: &str, key: &str) -> Result<u64, StoreError> {
        let sql = "SELECT used FROM budget_counters WHERE tenant = $1 AND key = $2";
        read_op!(self, [tenant = tenant.to_owned(), key = key.to_owned()], |ex| {
            match ex.fetch_optional(sql, &args![&tenant, &key]).await? {
                Some(row) => uint(row.int("used")?),
                None => Ok(0),
            }
        })
    }

    async fn create_api_key(&self, k: &NewApiKey) -> Result<(), StoreError> {
        let sql = "INSERT INTO api_keys (id, key_hash, tenant, principal, grants, roles, label, created_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
        let grants = list_text(&k.grants);
        let roles = list_text(&k.roles);
        write_op!(self, [k = k.clone()], |ex| {
            let params = args![
                &k.id,
                &k.key_hash,
                &k.tenant,
                &k.principal,
                &grants,
                &roles,
                &k.label,
                ms(k.created_at),
            ];
            ex.execute(sql, &params).await?;
            Ok(())
        })
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = concat!("SELECT ", key_columns!(), " FROM api_keys WHERE key_hash = $1");
        read_op!(self, [key_hash = key_hash.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&key_hash]).await?;
            row.map(|r| key_of(&r)).transpose()
        })
    }

    async fn list_api_keys(&self, tenant: &str) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let sql = concat!(
            "SELECT ",
            key_columns!(),
            " FROM api_keys WHERE tenant = $1 ORDER BY created_at, id"
        );
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let rows = ex.fetch_all(sql, &args![&tenant]).await?;
            rows.iter().map(key_of).collect()
        })
    }

    async fn revoke_api_key(&self, tenant: &str, id: &str, at: OffsetDateTime) -> Result<bool, StoreError> {
        let sql = "UPDATE api_keys SET revoked_at = $1 WHERE tenant = $2 AND id = $3 AND revoked_at IS NULL";
        write_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            Ok(ex.execute(sql, &args![ms(at), &tenant, &id]).await? == 1)
        })
    }

    async fn create_console_session(&self, c: &ConsoleSession) -> Result<(), StoreError> {
        let sql = "INSERT INTO console_sessions (token_hash, kind, key_hash, csrf, created_at, expires_at) \
                   VALUES ($1, $2, $3, $4, $5, $6)";
        write_op!(self, [c = c.clone()], |ex| {
            let params = args![
                &c.token_hash,
                c.kind.as_str(),
                &c.key_hash,
                &c.csrf,
                ms(c.created_at),
                ms(c.expires_at),
            ];
            ex.execute(sql, &params).await?;
            Ok(())
        })
    }

    async fn get_console_session(
        &self,
        token_hash: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        let sql = "SELECT token_hash, kind, key_hash, csrf, created_at, expires_at FROM console_sessions \
                   WHERE token_hash = $1 AND kind = 'session' AND expires_at > $2";
        read_op!(self, [token_hash = token_hash.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&token_hash, ms(now)]).await?;
            row.map(|r| console_session_of(&r)).transpose()
        })
    }

    async fn take_console_link(
        &self,
        token_hash: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        let sql = "DELETE FROM console_sessions WHERE token_hash = $1 AND kind = 'link' AND expires_at > $2 \
                   RETURNING token_hash, kind, key_hash, csrf, created_at, expires_at";
        write_op!(self, [token_hash = token_hash.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&token_hash, ms(now)]).await?;
            row.map(|r| console_session_of(&r)).transpose()
        })
    }

    async fn delete_console_session(&self, token_hash: &str) -> Result<bool, StoreError> {
        let sql = "DELETE FROM console_sessions WHERE token_hash = $1";
        write_op!(self, [token_hash = token_hash.to_owned()], |ex| {
            Ok(ex.execute(sql, &args![&token_hash]).await? == 1)
        })
    }

    async fn spend_token(
        &self,
        scope: &str,
        tenant: &str,
        id: &str,
        expires_at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let sql = "INSERT INTO spent_tokens (scope, tenant, id, expires_at) VALUES ($1, $2, $3, $4) \
                   ON CONFLICT (scope, tenant, id) DO NOTHING";
        write_op!(
            self,
            [
                scope = scope.to_owned(),
                tenant = tenant.to_owned(),
                id = id.to_owned()
            ],
            |ex| Ok(ex
                .execute(sql, &args![&scope, &tenant, &id, ms(expires_at)])
                .await?
                == 1)
        )
    }

    async fn create_task(&self, t: &TaskRecord) -> Result<(), StoreError> {
        let sql = "INSERT INTO agent_tasks (tenant, id, principal, approval_id, call, status, result, \
                   created_at, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
        write_op!(self, [t = t.clone()], |ex| {
            let result = t.result.as_ref().map(json_text);
            let call = json_text(&t.call);
            let params = args![
                &t.tenant,
                &t.id,
                &t.principal,
                &t.approval_id,
                &call,
                t.status.as_str(),
                &result,
                ms(t.created_at),
                ms(t.updated_at),
                ms(t.expires_at),
            ];
            ex.execute(sql, &params).await?;
            Ok(())
        })
    }

    async fn get_task(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let sql = "SELECT tenant, id, principal, approval_id, call, status, result, created_at, updated_at, \
                   expires_at FROM agent_tasks WHERE tenant = $1 AND id = $2 AND expires_at > $3";
        read_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&tenant, &id, ms(now)]).await?;
            row.map(|r| task_of(&r)).transpose()
        })
    }

    async fn end_task(
        &self,
        tenant: &str,
        id: &str,
        status: TaskStatus,
        result: &Value,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        if !status.is_terminal() {
            return Err(StoreError::Invalid("a task ends with a terminal status".into()));
        }
        let sql = "UPDATE agent_tasks SET status = $1, result = $2, updated_at = $3 \
                   WHERE tenant = $4 AND id = $5 AND status = 'working'";
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                id = id.to_owned(),
                result = json_text(result)
            ],
            |ex| {
                let params = args![status.as_str(), &result, ms(now), &tenant, &id];
                Ok(ex.execute(sql, &params).await? == 1)
            }
        )
    }

    async fn create_webhook(&self, w: &WebhookEndpoint) -> Result<(), StoreError> {
        let sql = concat!(
            "INSERT INTO webhook_endpoints (",
            webhook_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        );
        let events = serde_json::to_string(&w.events).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_op!(self, [w = w.clone()], |ex| {
            let params = args![
                &w.tenant,
                &w.id,
                &w.url,
                &events,
                &w.secret,
                &w.previous_secret,
                w.previous_until.map(ms),
                &w.description,
                i64::from(w.enabled),
                &w.disabled_reason,
                ms(w.created_at),
                ms(w.updated_at),
            ];
            ex.execute(sql, &params).await?;
            Ok(())
        })
    }

    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookEndpoint>, StoreError> {
        let sql = concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhook_endpoints WHERE tenant = $1 ORDER BY created_at, id"
        );
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let rows = ex.fetch_all(sql, &args![&tenant]).await?;
            rows.iter().map(webhook_of).collect()
        })
    }

    async fn get_webhook(&self, tenant: &str, id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
        let sql = concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhook_endpoints WHERE tenant = $1 AND id = $2"
        );
        read_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&tenant, &id]).await?;
            row.map(|r| webhook_of(&r)).transpose()
        })
    }

    async fn update_webhook(&self, w: &WebhookEndpoint) -> Result<bool, StoreError> {
        let sql = "UPDATE webhook_endpoints SET url = $1, events = $2, secret = $3, previous_secret = $4, \
                   previous_until = $5, description = $6, enabled = $7, disabled_reason = $8, updated_at = $9 \
                   WHERE tenant = $10 AND id = $11";
        let events = serde_json::to_string(&w.events).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_op!(self, [w = w.clone()], |ex| {
            let params = args![
                &w.url,
                &events,
                &w.secret,
                &w.previous_secret,
                w.previous_until.map(ms),
                &w.description,
                i64::from(w.enabled),
                &w.disabled_reason,
                ms(w.updated_at),
                &w.tenant,
                &w.id,
            ];
            Ok(ex.execute(sql, &params).await? == 1)
        })
    }

    async fn record_webhook_attempt(&self, a: &WebhookAttempt) -> Result<(), StoreError> {
        let sql = "INSERT INTO webhook_attempts (tenant, message_id, endpoint_id, attempt, at, status, latency_ms, \
                   response, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        write_op!(self, [a = a.clone()], |ex| {
            let params = args![
                &a.tenant,
                &a.message_id,
                &a.endpoint_id,
                i64::from(a.attempt),
                ms(a.at),
                a.status.map(i64::from),
                i64::try_from(a.latency_ms).unwrap_or(i64::MAX),
                &a.response,
                &a.error,
            ];
            ex.execute(sql, &params).await?;
            Ok(())
        })
    }

    async fn list_webhook_attempts(
        &self,
        tenant: &str,
        message_id: Option<&str>,
        endpoint_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WebhookAttempt>, StoreError> {
        let sql = "SELECT tenant, message_id, endpoint_id, attempt, at, status, latency_ms, response, error \
                   FROM webhook_attempts WHERE tenant = $1 AND ($2 IS NULL OR message_id = $2) \
                   AND ($3 IS NULL OR endpoint_id = $3) ORDER BY at DESC, message_id DESC, attempt DESC LIMIT $4";
        read_op!(
            self,
            [
                tenant = tenant.to_owned(),
                message_id = message_id.map(str::to_owned),
                endpoint_id = endpoint_id.map(str::to_owned)
            ],
            |ex| {
                let params = args![
                    &tenant,
                    &message_id,
                    &endpoint_id,
                    i64::from(limit.clamp(1, 1000))
                ];
                let rows = ex.fetch_all(sql, &params).await?;
                rows.iter().map(webhook_attempt_of).collect()
            }
        )
    }

    async fn requeue_dead_job(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE jobs SET status = 'pending', attempts = 0, run_at = $1, locked_by = NULL, \
                   locked_until = NULL, updated_at = $1 WHERE tenant = $2 AND id = $3 AND status = 'dead'";
        write_op!(self, [tenant = tenant.to_owned(), id = id.to_owned()], |ex| {
            Ok(ex.execute(sql, &args![ms(now), &tenant, &id]).await? == 1)
        })
    }

    async fn has_api_keys(&self) -> Result<bool, StoreError> {
        read_op!(self, [], |ex| {
            let row = ex
                .fetch_optional("SELECT 1 AS one FROM api_keys LIMIT 1", &[])
                .await?;
            Ok(row.is_some())
        })
    }

    async fn create_inbound_source(&self, i: &InboundSource) -> Result<(), StoreError> {
        let sql = concat!(
            "INSERT INTO inbound_sources (",
            inbound_source_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        );
        write_op!(self, [i = i.clone()], |ex| {
            let action = json_text(&i.action);
            let params = args![
                &i.id,
                &i.tenant,
                i.provider.as_str(),
                &i.secret,
                &i.previous_secret,
                i.previous_until.map(ms),
                &i.key_id,
                &action,
                &i.description,
                i64::from(i.enabled),
                int(i.refusals)?,
                &i.last_refusal,
                i.last_refusal_at.map(ms),
                ms(i.created_at),
                ms(i.updated_at),
            ];
            ex.execute(sql, &params).await?;
            Ok(())
        })
    }

    async fn list_inbound_sources(&self, tenant: &str) -> Result<Vec<InboundSource>, StoreError> {
        let sql = concat!(
            "SELECT ",
            inbound_source_columns!(),
            " FROM inbound_sources WHERE tenant = $1 ORDER BY created_at, id"
        );
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let rows = ex.fetch_all(sql, &args![&tenant]).await?;
            rows.iter().map(inbound_source_of).collect()
        })
    }

    async fn get_inbound_source(&self, id: &str) -> Result<Option<InboundSource>, StoreError> {
        let sql = concat!(
            "SELECT ",
            inbound_source_columns!(),
            " FROM inbound_sources WHERE id = $1"
        );
        read_op!(self, [id = id.to_owned()], |ex| {
            let row = ex.fetch_optional(sql, &args![&id]).await?;
            row.map(|r| inbound_source_of(&r)).transpose()
        })
    }

    async fn update_inbound_source(&self, i: &InboundSource) -> Result<bool, StoreError> {
        let sql = "UPDATE inbound_sources SET secret = $1, previous_secret = $2, previous_until = $3, action = $4, \
                   description = $5, enabled = $6, updated_at = $7 WHERE tenant = $8 AND id = $9";
        write_op!(self, [i = i.clone()], |ex| {
            let action = json_text(&i.action);
            let params = args![
                &i.secret,
                &i.previous_secret,
                i.previous_until.map(ms),
                &action,
                &i.description,
                i64::from(i.enabled),
                ms(i.updated_at),
                &i.tenant,
                &i.id,
            ];
            Ok(ex.execute(sql, &params).await? == 1)
        })
    }

    async fn note_inbound_refusal(
        &self,
        id: &str,
        reason: &str,
        at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE inbound_sources SET refusals = refusals + 1, last_refusal = $1, last_refusal_at = $2 \
                   WHERE id = $3";
        write_op!(self, [id = id.to_owned(), reason = reason.to_owned()], |ex| {
            ex.execute(sql, &args![&reason, ms(at), &id]).await?;
            Ok(())
        })
    }

    async fn accept_inbound(&self, e: &InboundEvent, job: &NewJob) -> Result<bool, StoreError> {
        let insert = "INSERT INTO inbound_events (source_id, event_id, tenant, body, body_digest, status, deliveries, \
                      detail, received_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) \
                      ON CONFLICT (source_id, event_id) DO NOTHING";
        let again =
            "UPDATE inbound_events SET deliveries = deliveries + 1 WHERE source_id = $1 AND event_id = $2";
        write_op!(self, [e = e.clone(), job = job.clone()], |ex| {
            let body = json_text(&e.body);
            let detail = e.detail.as_ref().map(json_text);
            let params = args![
                &e.source_id,
                &e.event_id,
                &e.tenant,
                &body,
                &e.body_digest,
                e.status.as_str(),
                i64::from(e.deliveries.max(1)),
                &detail,
                ms(e.received_at),
            ];
            if ex.execute(insert, &params).await? == 1 {
                enqueue_in(ex, &job).await?;
                Ok(true)
            } else {
                ex.execute(again, &args![&e.source_id, &e.event_id]).await?;
                Ok(false)
            }
        })
    }

    async fn finish_inbound(
        &self,
        tenant: &str,
        source_id: &str,
        event_id: &str,
        status: InboundStatus,
        detail: &Value,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        if status == InboundStatus::Queued {
            return Err(StoreError::Invalid(
                "an inbound event finishes with another status".into(),
            ));
        }
        let sql = "UPDATE inbound_events SET status = $1, detail = $2, updated_at = $3 \
                   WHERE tenant = $4 AND source_id = $5 AND event_id = $6 AND status = 'queued'";
        write_op!(
            self,
            [
                tenant = tenant.to_owned(),
                source_id = source_id.to_owned(),
                event_id = event_id.to_owned(),
                detail = json_text(detail)
            ],
            |ex| {
                let params = args![status.as_str(), &detail, ms(now), &tenant, &source_id, &event_id];
                Ok(ex.execute(sql, &params).await? == 1)
            }
        )
    }

    async fn get_inbound_event(
        &self,
        tenant: &str,
        source_id: &str,
        event_id: &str,
    ) -> Result<Option<InboundEvent>, StoreError> {
        let sql = concat!(
            "SELECT ",
            inbound_event_columns!(),
            " FROM inbound_events WHERE tenant = $1 AND source_id = $2 AND event_id = $3"
        );
        read_op!(
            self,
            [
                tenant = tenant.to_owned(),
                source_id = source_id.to_owned(),
                event_id = event_id.to_owned()
            ],
            |ex| {
                let row = ex
                    .fetch_optional(sql, &args![&tenant, &source_id, &event_id])
                    .await?;
                row.map(|r| inbound_event_of(&r)).transpose()
            }
        )
    }

    async fn list_inbound_events(
        &self,
        tenant: &str,
        source_id: &str,
        limit: u32,
    ) -> Result<Vec<InboundEvent>, StoreError> {
        let sql = concat!(
            "SELECT ",
            inbound_event_columns!(),
            " FROM inbound_events WHERE tenant = $1 AND source_id = $2 ORDER BY received_at DESC, event_id DESC LIMIT $3"
        );
        read_op!(
            self,
            [tenant = tenant.to_owned(), source_id = source_id.to_owned()],
            |ex| {
                let params = args![&tenant, &source_id, i64::from(limit.clamp(1, 1000))];
                let rows = ex.fetch_all(sql, &params).await?;
                rows.iter().map(inbound_event_of).collect()
            }
        )
    }

    async fn enqueue_job(&self, j: &NewJob) -> Result<(), StoreError> {
        write_op!(self, [j = j.clone()], |ex| enqueue_in(ex, &j).await)
    }

    async fn claim_jobs(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        lease: Duration,
        now: OffsetDateTime,
    ) -> Result<Vec<Job>, StoreError> {
        // PostgreSQL: concurrent claimers skip each other's locked rows. SQLite: the single
        // writer connection serializes claims, so the subquery needs no lock.
        macro_rules! claim {
            ($lock:literal) => {
                concat!(
                    "UPDATE jobs SET status = 'running', locked_by = $1, locked_until = $2, ",
                    "attempts = attempts + 1, updated_at = $3 WHERE id IN (SELECT id FROM jobs ",
                    "WHERE kind = $5 AND ((status = 'pending' AND run_at <= $3) OR (status = 'running' AND locked_until <= $3)) ",
                    "ORDER BY run_at, id LIMIT $4",
                    $lock,
                    ") RETURNING ",
                    job_columns!()
                )
            };
        }
        let sql = match self.backend {
            Backend::Sqlite(_) => claim!(""),
            Backend::Postgres(_) => claim!(" FOR UPDATE SKIP LOCKED"),
        };
        let until = now + lease;
        write_op!(self, [worker = worker.to_owned(), kind = kind.to_owned()], |ex| {
            let params = args![
                &worker,
                ms(until),
                ms(now),
                i64::from(limit.clamp(1, 1000)),
                &kind
            ];
            let rows = ex.fetch_all(sql, &params).await?;
            let mut jobs = rows.iter().map(job_of).collect::<Result<Vec<_>, _>>()?;
            jobs.sort_by(|a, b| (a.job.run_at, &a.job.id).cmp(&(b.job.run_at, &b.job.id)));
            Ok(jobs)
        })
    }

    async fn complete_job(
        &self,
        id: &str,
        worker: &str,
        completion: &JobCompletion,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let (status, run_at, error) = match completion {
            JobCompletion::Done => (JobStatus::Done, None, None),
            JobCompletion::Retry { run_at, error } => {
                (JobStatus::Pending, Some(ms(*run_at)), Some(error.clone()))
            }
            JobCompletion::Dead { error } => (JobStatus::Dead, None, Some(error.clone())),
        };
        // A retry out of attempts becomes dead.
        let sql = "UPDATE jobs SET status = CASE WHEN $1 = 'pending' AND attempts >= max_attempts THEN 'dead' ELSE $1 END, \
                   run_at = COALESCE($2, run_at), last_error = COALESCE($3, last_error), locked_by = NULL, \
                   locked_until = NULL, updated_at = $4 WHERE id = $5 AND locked_by = $6 AND status = 'running'";
        write_op!(self, [id = id.to_owned(), worker = worker.to_owned()], |ex| {
            let params = args![status.as_str(), run_at, &error, ms(now), &id, &worker];
            Ok(ex.execute(sql, &params).await? == 1)
        })
    }

    async fn renew_job(&self, id: &str, worker: &str, until: OffsetDateTime) -> Result<bool, StoreError> {
        let sql = "UPDATE jobs SET locked_until = $1 WHERE id = $2 AND locked_by = $3 AND status = 'running'";
        write_op!(self, [id = id.to_owned(), worker = worker.to_owned()], |ex| {
            Ok(ex.execute(sql, &args![ms(until), &id, &worker]).await? == 1)
        })
    }

    async fn list_dead_jobs(&self, tenant: &str, limit: u32) -> Result<Vec<Job>, StoreError> {
        let sql = concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE tenant = $1 AND status = 'dead' ORDER BY updated_at, id LIMIT $2"
        );
        read_op!(self, [tenant = tenant.to_owned()], |ex| {
            let rows = ex
                .fetch_all(sql, &args![&tenant, i64::from(limit.clamp(1, 1000))])
                .await?;
            rows.iter().map(job_of).collect()
        })
    }

    async fn purge_expired(&self, now: OffsetDateTime) -> Result<PurgeCounts, StoreError> {
        let now = ms(now);
        write_op!(self, [], |ex| {
            // In-flight and unknown records are kept until reconciled, whatever their age.
            let idempotency = ex
                .execute(
                    "DELETE FROM idempotency WHERE expires_at <= $1 AND status IN ('committed', 'failed')",
                    &args![now],
                )
                .await?;
            let budget_counters = ex
                .execute("DELETE FROM budget_counters WHERE expires_at <= $1", &args![now])
                .await?;
            // Each expiry and its `approval.expired` event commit together.
            let expired = ex
                .fetch_all(
                    "UPDATE approvals SET status = 'expired', sealed_arguments = NULL WHERE status IN ('pending', 'approved') \
                     AND expires_at <= $1 RETURNING tenant, id",
                    &args![now],
                )
                .await?;
            let at = from_ms(now)?;
            for row in &expired {
                let event = approval_event(&row.text("tenant")?, &row.text("id")?, "approval.expired", at);
                enqueue_in(ex, &event).await?;
            }
            let approvals_expired = expired.len() as u64;
            let console_sessions = ex
                .execute("DELETE FROM console_sessions WHERE expires_at <= $1", &args![now])
                .await?;
            let tokens = ex
                .execute("DELETE FROM spent_tokens WHERE expires_at <= $1", &args![now])
                .await?;
            let tasks = ex
                .execute("DELETE FROM agent_tasks WHERE expires_at <= $1", &args![now])
                .await?;
            let done_jobs = ex
                .execute(
                    "DELETE FROM jobs WHERE status = 'done' AND run_at <= $1",
                    &args![now - i64::try_from(DONE_JOB_RETENTION.whole_milliseconds()).unwrap_or(i64::MAX)],
                )
                .await?;
            let inbound_events = ex
                .execute(
                    "DELETE FROM inbound_events WHERE received_at <= $1 AND status <> 'queued'",
                    &args![now - i64::try_from(INBOUND_RETENTION.whole_milliseconds()).unwrap_or(i64::MAX)],
                )
                .await?;
            Ok(PurgeCounts {
                idempotency,
                budget_counters,
                approvals_expired,
                console_sessions,
                tokens_and_tasks: tokens + tasks,
                done_jobs,
                inbound_events,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::DatabaseUrl;

    #[test]
    fn a_printed_database_url_never_shows_a_password() {
        let cases = [
            ("postgres://u:topsecret@db:5432/x", "postgres://u:***@db:5432/x"),
            (
                "postgres://db/x?user=u&password=topsecret",
                "postgres://db/x?user=u&password=***",
            ),
            (
                "postgresql://db/x?PassWord=topsecret&sslmode=require",
                "postgresql://db/x?PassWord=***&sslmode=require",
            ),
            (
                "postgres://db/x?pass%77ord=topsecret",
                "postgres://db/x?pass%77ord=***",
            ),
            (
                "postgres://db/x?sslpassword=topsecret&options=a@b",
                "postgres://db/x?sslpassword=***&options=a@b",
            ),
            (
                "postgres://u:topsecret@h1:5432,h2:5433/x",
                "postgres://u:***@h1:5432,h2:5433/x",
            ),
            // No password: nothing to mask.
            ("postgres://nobody@db/x", "postgres://nobody@db/x"),
        ];
        for (url, shown) in cases {
            let redacted = DatabaseUrl::parse(url).unwrap().redacted();
            assert_eq!(redacted, shown);
            assert!(!redacted.contains("topsecret"), "{redacted}");
        }
    }
}
