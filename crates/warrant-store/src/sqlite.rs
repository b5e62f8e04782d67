//! The embedded SQLite backend: rusqlite connections on the store's own threads, and group
//! commit.
//!
//! **One hop per operation.** A store operation (all its statements) is sent as one closure to
//! the thread that owns a connection and runs there synchronously; the caller awaits a single
//! answer. (A driver that sends every statement to a connection thread separately pays a
//! thread round trip per `BEGIN`, savepoint, statement and `COMMIT`: about ten per gateway
//! call, which is what dominated its CPU.)
//!
//! **Group commit.** One writer thread owns the only read-write connection. It takes the first
//! waiting write, opens `BEGIN IMMEDIATE`, runs it, then runs every further write already
//! queued (up to [`MAX_BATCH`]), and commits once. Each caller is answered only after that
//! `COMMIT` returned, so **acknowledged means durable** (`synchronous=FULL`), while writes
//! arriving during one `fsync` share the next. A write whose operation fails (or asks for a
//! rollback, or panics) leaves the rest of the batch alone: the first of a batch is rolled
//! back with the transaction, which holds only it; a later one, which ran without a savepoint
//! (writes that fail are rare, and a savepoint copies every page its write touches), has the
//! transaction rolled back and begun again with the writes before it run again, each in a
//! savepoint, as every write after it then runs (`replay`). An operation may therefore run
//! more than once (`FnMut`); its answer is that of its last run. A failed `COMMIT` fails
//! every write of the batch.
//!
//! **Reads** run on a few reader threads, each with a read-only connection (WAL: readers never
//! wait for the writer), pulling operations from one queue.
//!
//! **Bounded queues.** The writer's and the readers' queues hold at most
//! `StoreOptions::queue_capacity` operations each; an operation that finds its queue full is
//! answered [`StoreError::Overloaded`] at once (counted in `warrant_store_overloaded_total`,
//! by queue) instead of waiting behind an unbounded backlog, and the server answers `503` with
//! `Retry-After`. Each queued operation carries its caller's tracing span, entered on the
//! store thread while it runs.
//!
//! Written by hand because no crate does group commit over rusqlite; the operations themselves
//! are the shared ones of `sql.rs`, run through [`SqliteExec`].

use std::cell::RefCell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;
use warrant_core::store::StoreError;

use crate::exec::{Arg, Exec, RowExt};

/// The most writes one commit takes; the rest wait for the next batch.
const MAX_BATCH: usize = 512;

/// Operations each queue (the writer's, the readers') holds by default before answering
/// [`StoreError::Overloaded`]: several batches of writes, far more than a healthy disk
/// leaves waiting.
pub(crate) const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// The counter of operations refused because their queue was full, by `queue`.
pub const OVERLOADED_METRIC: &str = "warrant_store_overloaded_total";

/// Page cache per reader connection, in KiB (as a negative `cache_size`).
const READER_CACHE_KIB: i64 = -512;

/// Page cache of the writer connection, in KiB (as a negative `cache_size`). The writer's
/// working set is the right edge of the ledger and its indexes, the budget and idempotency rows:
/// 1 MiB holds it with a million ledger rows (docs/benchmarks.md); SQLite's default, 2 MiB,
/// fills with cold leaves and stays resident.
const WRITER_CACHE_KIB: i64 = -1024;

/// Statements against one connection, on the thread that owns it or holds it.
pub(crate) struct SqliteExec<'e, 'c> {
    prepared: Statements<'e, 'c>,
    rollback: bool,
}

/// Where a connection's statements are kept: by its store thread ([`Prepared`]), or inside
/// the connection itself, for the inline writer that any request thread may hold ([`Cached`]).
#[derive(Clone, Copy)]
pub(crate) enum Statements<'e, 'c> {
    Kept(&'e Prepared<'c>),
    Cached(&'e Cached),
}

impl<'e, 'c> From<&'e Prepared<'c>> for Statements<'e, 'c> {
    fn from(prepared: &'e Prepared<'c>) -> Self {
        Statements::Kept(prepared)
    }
}

impl Statements<'_, '_> {
    /// Runs `run` with the statement of `sql` and its parameters bound to `args`.
    fn with<R>(
        self,
        sql: &str,
        args: &[Arg<'_>],
        run: impl FnOnce(&mut rusqlite::Statement<'_>, &Arc<[String]>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        match self {
            Statements::Kept(prepared) => prepared.with(sql, args, run),
            Statements::Cached(cached) => cached.with(sql, args, run),
        }
    }
}

/// A row read into owned values.
pub(crate) struct SqliteRow {
    columns: Arc<[String]>,
    values: Vec<Value>,
}

impl SqliteRow {
    fn value(&self, column: &str) -> Result<&Value, StoreError> {
        self.columns
            .iter()
            .position(|c| c == column)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| StoreError::Corrupt(format!("no column `{column}`")))
    }
}

impl RowExt for SqliteRow {
    fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            _ => Err(StoreError::Corrupt(format!("`{column}` is not text"))),
        }
    }

    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Integer(v) => Ok(Some(*v)),
            _ => Err(StoreError::Corrupt(format!("`{column}` is not an integer"))),
        }
    }
}

/// The number `N` of a placeholder named `$N`.
fn placeholder(name: &str) -> Option<usize> {
    let digits = name.strip_prefix('$')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Binds `args` to a statement's `$N` placeholders: `$N` takes `args[N - 1]`. SQLite numbers
/// named parameters by first appearance, not by their digits (`$2 … $1` has `$2` first), so
/// each parameter is bound by its name's number (`numbers`, from [`parameter_numbers`]); a
/// placeholder past the end of `args` stays NULL (every binding is cleared after a run).
fn bind(stmt: &mut rusqlite::Statement<'_>, numbers: &[usize], args: &[Arg<'_>]) -> Result<(), StoreError> {
    for (index, number) in (1..).zip(numbers) {
        let Some(arg) = number.checked_sub(1).and_then(|at| args.get(at)) else {
            continue;
        };
        match *arg {
            Arg::Int(v) => stmt.raw_bind_parameter(index, v),
            Arg::Text(v) => stmt.raw_bind_parameter(index, v),
            Arg::NullInt | Arg::NullText => stmt.raw_bind_parameter(index, rusqlite::types::Null),
        }
        .map_err(from_rusqlite)?;
    }
    Ok(())
}

/// A statement's text as SQLite is given it: `LIMIT $N` becomes `LIMIT +$N`. SQLite reads a
/// bound `LIMIT` to plan with its value, and then prepares the statement again every time
/// that parameter is bound anew — every run: the job and reconciliation claims, the ledger
/// and run listings were each parsed again on every execution (about 290,000 instructions
/// each time; the job claim is polled about four times a second, busy or idle). A unary plus
/// is the same value, and SQLite plans without looking at it. The test
/// `a_bound_limit_does_not_prepare_the_statement_again` holds it.
fn sqlite_text(sql: &str) -> String {
    sql.replace("LIMIT $", "LIMIT +$")
}

/// Distinct statements a store thread keeps ([`Prepared`]; the store has about forty; past
/// this they are all finalized and prepared again as they come, so statements built at run
/// time cannot grow the list).
const KEPT_STATEMENTS: usize = 256;

/// The statements one store thread has prepared on its connection, kept for as long as the
/// thread runs, with what follows from each one's text.
///
/// Kept here rather than in rusqlite's statement cache, which hashes a statement's whole text
/// to take it out and again to put it back, trims it, and keeps it in an LRU list, behind a
/// map of this store's own: about 7,000 instructions a gateway call on the writer alone (a
/// tenth of its work per call). Here a statement is found by its text's length and bytes in a
/// short list.
/// Hand-written because the cache is rusqlite's only way to keep statements beyond one borrow
/// of the connection.
pub(crate) struct Prepared<'c> {
    conn: &'c Connection,
    kept: RefCell<Vec<Kept<'c>>>,
}

/// One statement a store thread keeps (see [`Prepared`]).
struct Kept<'c> {
    /// The statement as the store wrote it.
    text: Box<str>,
    /// Prepared from its text as SQLite is given it ([`sqlite_text`]).
    stmt: rusqlite::Statement<'c>,
    /// The `$N` of each parameter, in SQLite's order ([`parameter_numbers`]).
    numbers: Box<[usize]>,
    /// The names of its result's columns, shared by the rows it returns (read once: reading
    /// and copying them for every query cost about 1,700 instructions a query).
    columns: Arc<[String]>,
}

impl<'c> Prepared<'c> {
    /// Nothing prepared yet on `conn`.
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Self {
            conn,
            kept: RefCell::new(Vec::new()),
        }
    }

    /// Runs `run` with the statement of `sql` (prepared the first time this thread runs that
    /// text) and its parameters bound to `args`. It is prepared as written: SQLite reads
    /// PostgreSQL's `$1` as a *named* parameter, `"$1"` (see [`bind`]); translating every
    /// statement to `?1` first cost a copy of its text per call.
    fn with<R>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        run: impl FnOnce(&mut rusqlite::Statement<'_>, &Arc<[String]>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut kept = borrow_kept(&self.kept)?;
        let Kept {
            stmt,
            numbers,
            columns,
            ..
        } = find_or_keep(
            &mut kept,
            |k| &k.text,
            sql,
            || {
                // Persistent: SQLite then allocates the statement outside the connection's
                // lookaside slots, which a few dozen kept statements would otherwise fill for
                // good, sending every later small allocation of the connection to `malloc`
                // (rusqlite's cache prepares its statements so too).
                let stmt = self
                    .conn
                    .prepare_with_flags(&sqlite_text(sql), rusqlite::PrepFlags::SQLITE_PREPARE_PERSISTENT)
                    .map_err(from_rusqlite)?;
                let (numbers, columns) = describe(&stmt)?;
                Ok(Kept {
                    text: sql.into(),
                    stmt,
                    numbers,
                    columns,
                })
            },
        )?;
        run_bound(stmt, numbers, columns, args, run)
    }

    /// How many statements this thread keeps.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.borrow().len()
    }
}

/// The inline writer's connection with its statements ([`Sqlite::write`]): kept in rusqlite's
/// own cache, inside the connection, so that the connection moves to whichever thread holds it
/// (a statement of rusqlite cannot leave its thread, so [`Prepared`] cannot serve here). What
/// follows from each statement's text is kept beside it, found as in [`Prepared`].
pub(crate) struct Cached {
    conn: Connection,
    kept: RefCell<Vec<CachedText>>,
}

/// What [`Cached`] keeps of one statement's text.
struct CachedText {
    /// The statement as the store wrote it.
    text: Box<str>,
    /// As SQLite is given it ([`sqlite_text`]), the key of rusqlite's cache.
    sqlite: Box<str>,
    /// The `$N` of each parameter, in SQLite's order ([`parameter_numbers`]).
    numbers: Box<[usize]>,
    /// The names of its result's columns.
    columns: Arc<[String]>,
}

impl Cached {
    fn new(conn: Connection) -> Self {
        conn.set_prepared_statement_cache_capacity(KEPT_STATEMENTS);
        Self {
            conn,
            kept: RefCell::new(Vec::new()),
        }
    }

    /// As [`Prepared::with`], with the statement taken from rusqlite's cache.
    fn with<R>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        run: impl FnOnce(&mut rusqlite::Statement<'_>, &Arc<[String]>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut kept = borrow_kept(&self.kept)?;
        let CachedText {
            sqlite,
            numbers,
            columns,
            ..
        } = find_or_keep(
            &mut kept,
            |k| &k.text,
            sql,
            || {
                let sqlite = sqlite_text(sql);
                let (numbers, columns) =
                    describe(&*self.conn.prepare_cached(&sqlite).map_err(from_rusqlite)?)?;
                Ok(CachedText {
                    text: sql.into(),
                    sqlite: sqlite.into(),
                    numbers,
                    columns,
                })
            },
        )?;
        let mut stmt = self.conn.prepare_cached(sqlite).map_err(from_rusqlite)?;
        run_bound(&mut stmt, numbers, columns, args, run)
    }
}

/// Runs `run` with `stmt`'s parameters (numbered `numbers`) bound to `args`, then clears them:
/// bound text is a copy SQLite holds until the binding is cleared, and left bound in a kept
/// statement those copies would hold lookaside slots between runs.
fn run_bound<R>(
    stmt: &mut rusqlite::Statement<'_>,
    numbers: &[usize],
    columns: &Arc<[String]>,
    args: &[Arg<'_>],
    run: impl FnOnce(&mut rusqlite::Statement<'_>, &Arc<[String]>) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    let ran = bind(stmt, numbers, args).and_then(|()| run(stmt, columns));
    stmt.clear_bindings();
    ran
}

/// A store thread's list of what it keeps per statement text, borrowed. Statements run one
/// after another on a store thread: one is never run from inside another's `run`, so the list
/// is never borrowed twice.
fn borrow_kept<T>(kept: &RefCell<Vec<T>>) -> Result<std::cell::RefMut<'_, Vec<T>>, StoreError> {
    kept.try_borrow_mut()
        .map_err(|_| StoreError::Database("a statement was run inside another".into()))
}

/// Where `sql`'s entry is in `kept`, found by its text (`text_of`), made by `make` the first
/// time. Past [`KEPT_STATEMENTS`] the list starts over, so statements built at run time
/// cannot grow it without bound.
fn find_or_keep<'k, T>(
    kept: &'k mut Vec<T>,
    text_of: impl Fn(&T) -> &str,
    sql: &str,
    make: impl FnOnce() -> Result<T, StoreError>,
) -> Result<&'k mut T, StoreError> {
    let at = match kept.iter().position(|k| text_of(k) == sql) {
        Some(at) => at,
        None => {
            let made = make()?;
            if kept.len() >= KEPT_STATEMENTS {
                kept.clear();
            }
            kept.push(made);
            kept.len() - 1
        }
    };
    kept.get_mut(at)
        .ok_or_else(|| StoreError::Database("a kept statement went missing".into()))
}

/// What follows from a statement's text: its parameters' `$N`, in SQLite's order, and the
/// names of its result's columns.
type Described = (Box<[usize]>, Arc<[String]>);

/// What follows from a prepared statement's text ([`Described`]).
fn describe(stmt: &rusqlite::Statement<'_>) -> Result<Described, StoreError> {
    let numbers = parameter_numbers(stmt)?;
    let columns = stmt.column_names().into_iter().map(str::to_owned).collect();
    Ok((numbers, columns))
}

/// The `$N` of each of the statement's parameters, in SQLite's order (see [`bind`]): read from
/// the statement the first time this thread runs its text, then kept. Reading them for every
/// bind cost about 5,000 instructions per gateway call (thirty parameter names fetched,
/// measured and parsed).
fn parameter_numbers(stmt: &rusqlite::Statement<'_>) -> Result<Box<[usize]>, StoreError> {
    (1..=stmt.parameter_count())
        .map(|index| {
            let name = stmt.parameter_name(index).unwrap_or_default();
            placeholder(name)
                .ok_or_else(|| StoreError::Database(format!("the SQL parameter `{name}` is not `$N`")))
        })
        .collect()
}

/// Runs a query to its end, keeping at most `keep` rows.
fn query<'e, 'c: 'e>(
    prepared: impl Into<Statements<'e, 'c>>,
    sql: &str,
    args: &[Arg<'_>],
    keep: usize,
) -> Result<Vec<SqliteRow>, StoreError> {
    prepared
        .into()
        .with(sql, args, |stmt, columns| read_rows(stmt, columns, keep))
}

/// The rows of a bound statement, stepped to the end; at most `keep` of them kept.
fn read_rows(
    stmt: &mut rusqlite::Statement<'_>,
    columns: &Arc<[String]>,
    keep: usize,
) -> Result<Vec<SqliteRow>, StoreError> {
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    // Stepped to the end even when only one row is kept, so a statement with side effects
    // (`UPDATE … RETURNING`) always completes.
    while let Some(row) = rows.next().map_err(from_rusqlite)? {
        if out.len() < keep {
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                let value = row.get_ref(i).map_err(from_rusqlite)?;
                values.push(
                    Value::try_from(value).map_err(|_| StoreError::Corrupt("text is not UTF-8".into()))?,
                );
            }
            out.push(SqliteRow {
                columns: Arc::clone(columns),
                values,
            });
        }
    }
    Ok(out)
}

impl Exec for SqliteExec<'_, '_> {
    type Row = SqliteRow;

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let changed = self
            .prepared
            .with(sql, args, |stmt, _| stmt.raw_execute().map_err(from_rusqlite))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    async fn fetch_optional(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<SqliteRow>, StoreError> {
        Ok(query(self.prepared, sql, args, 1)?.into_iter().next())
    }

    async fn fetch_all(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<SqliteRow>, StoreError> {
        query(self.prepared, sql, args, usize::MAX)
    }

    fn rollback(&mut self) {
        self.rollback = true;
    }
}

#[cfg(test)]
impl SqliteExec<'_, '_> {
    /// How often the kept statement of `sql` was prepared again since it was first prepared
    /// (SQLite's `SQLITE_STMTSTATUS_REPREPARE`).
    fn reprepares(&self, sql: &str) -> i32 {
        self.prepared
            .with(sql, &[], |stmt, _| {
                Ok(stmt.get_status(rusqlite::StatementStatus::RePrepare))
            })
            .unwrap_or(-1)
    }
}

/// Runs an operation written as an `async fn` over [`Exec`] to completion on this thread.
/// SQLite statements never wait, so the future is ready on its first poll; one that is not
/// is refused rather than blocked on.
pub(crate) fn now<T>(operation: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    let mut operation = pin!(operation);
    match operation.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => Err(StoreError::Database(
            "a SQLite operation did not complete synchronously".into(),
        )),
    }
}

/// The typed error for a SQLite error.
pub(crate) fn from_rusqlite(error: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match &error {
        rusqlite::Error::SqliteFailure(failure, message) => {
            let text = message.clone().unwrap_or_else(|| error.to_string());
            match failure.code {
                ErrorCode::ConstraintViolation
                    if failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                        || failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
                {
                    StoreError::Conflict(text)
                }
                ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::CannotOpen
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::OutOfMemory
                | ErrorCode::FileLockingProtocolFailed => StoreError::Unavailable(text),
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => StoreError::Corrupt(text),
                _ => StoreError::Database(text),
            }
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnIndex(_)
        | rusqlite::Error::InvalidColumnName(_)
        | rusqlite::Error::InvalidColumnType(..) => StoreError::Corrupt(error.to_string()),
        _ => StoreError::Database(error.to_string()),
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the store is closed".into())
}

/// One queued write: its operation, then its answer once the batch's fate is known.
trait WriteJob: Send {
    /// Runs the operation; answers whether its changes are to be kept. A write that was kept
    /// may run again, once its batch's transaction was rolled back ([`replay`]): its answer
    /// is that of its last run.
    fn run(&mut self, ex: &mut SqliteExec<'_, '_>) -> bool;
    /// Answers the caller: the operation's result if the batch committed, else `error`.
    fn reply(self: Box<Self>, commit: Result<(), StoreError>);
    /// The inbox of the caller's thread, if it has one ([`deliver_answers_here`]).
    fn take_inbox(&mut self) -> Option<Arc<Inbox>>;
}

struct Job<R, F> {
    operation: F,
    result: Option<Result<R, StoreError>>,
    answer: oneshot::Sender<Result<R, StoreError>>,
    /// The caller's span, entered while the operation runs on the writer thread.
    span: tracing::Span,
    /// Where the answer goes, if the caller's thread has an inbox.
    inbox: Option<Arc<Inbox>>,
}

fn guarded<R>(operation: impl FnOnce() -> Result<R, StoreError>) -> Result<R, StoreError> {
    // A panicking operation must not take the connection's thread (and every later caller)
    // down with it.
    catch_unwind(AssertUnwindSafe(operation))
        .unwrap_or_else(|_| Err(StoreError::Database("a store operation panicked".into())))
}

impl<R, F> WriteJob for Job<R, F>
where
    R: Send,
    F: FnMut(&mut SqliteExec<'_, '_>) -> Result<R, StoreError> + Send,
{
    fn run(&mut self, ex: &mut SqliteExec<'_, '_>) -> bool {
        let _entered = self.span.enter();
        let operation = &mut self.operation;
        let result = guarded(|| operation(ex));
        let keep = result.is_ok() && !ex.rollback;
        self.result = Some(result);
        keep
    }

    fn reply(self: Box<Self>, commit: Result<(), StoreError>) {
        let answer = match (self.result, commit) {
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Err(e)), _) | (Some(Ok(_)), Err(e)) => Err(e),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(StoreError::Database("the write was not run".into())),
        };
        // The caller may have gone away; the write's fate is in the ledger either way.
        let _ = self.answer.send(answer);
    }

    fn take_inbox(&mut self) -> Option<Arc<Inbox>> {
        self.inbox.take()
    }
}

/// A write answered, waiting in an [`Inbox`].
type Answer = (Box<dyn WriteJob>, Result<(), StoreError>);

/// The writer's answers for the tasks of one thread, delivered there by one task
/// ([`deliver_answers_here`]).
///
/// Every answer sent to a task from another thread wakes its runtime: for tokio's
/// current-thread runtime, a write to its eventfd, one system call per answer, while one
/// commit answers several calls at once. Through an inbox the writer wakes one task per commit
/// (and none while that task has answers still to deliver), and that task wakes the callers
/// from their own thread, which costs no system call.
pub(crate) struct Inbox {
    pending: Mutex<Pending>,
    /// Times the delivering task was woken (for tests).
    wakes: AtomicU64,
}

#[derive(Default)]
struct Pending {
    answers: Vec<Answer>,
    /// The delivering task, when it waits with nothing to deliver (taken by the post that
    /// wakes it: later posts find none and only add their answers, which it delivers before
    /// it waits again).
    waiting: Option<Waker>,
    /// The delivering task is gone (its runtime shut down): answers are sent directly.
    closed: bool,
}

thread_local! {
    /// This thread's inbox, once [`deliver_answers_here`] made it.
    static INBOX: RefCell<Option<Arc<Inbox>>> = const { RefCell::new(None) };
}

/// Delivers the SQLite writer's answers to the tasks of this thread through one task of this
/// thread's runtime, woken once per commit rather than once per answer. Call it once, from
/// inside a current-thread runtime, on a thread that runs no other runtime while that one
/// lives (a server's request thread). Without it, each answer wakes its task directly; after
/// the runtime shuts down, answers go directly again.
///
/// # Panics
/// Outside a tokio runtime (it spawns the delivering task).
pub fn deliver_answers_here() {
    let inbox = Arc::new(Inbox {
        pending: Mutex::new(Pending::default()),
        wakes: AtomicU64::new(0),
    });
    tokio::spawn(deliver(Arc::clone(&inbox)));
    INBOX.with(|current| *current.borrow_mut() = Some(inbox));
}

/// The delivering task: answers everything posted, then waits for more.
async fn deliver(inbox: Arc<Inbox>) {
    let closing = Closing(inbox);
    std::future::poll_fn(|cx| {
        loop {
            let answers = {
                let mut pending = closing.0.lock();
                if pending.answers.is_empty() {
                    pending.waiting = Some(cx.waker().clone());
                    return Poll::<()>::Pending;
                }
                std::mem::take(&mut pending.answers)
            };
            for (job, commit) in answers {
                job.reply(commit);
            }
        }
    })
    .await;
}

/// Closes the inbox when its task is dropped, and answers what was waiting.
struct Closing(Arc<Inbox>);

impl Drop for Closing {
    fn drop(&mut self) {
        let answers = {
            let mut pending = self.0.lock();
            pending.closed = true;
            pending.waiting = None;
            std::mem::take(&mut pending.answers)
        };
        for (job, commit) in answers {
            job.reply(commit);
        }
    }
}

impl Inbox {
    /// The current thread's inbox, if any.
    fn current() -> Option<Arc<Inbox>> {
        INBOX.with(|current| current.borrow().clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands a commit's answers to the delivering task, waking it if it waits; answers them
    /// here if it is gone, or if they are one answer and the task waits (waking the caller
    /// costs the same one wake as waking the task, without the task's turn in between: at
    /// one connection every commit is one answer).
    fn post(&self, mut answers: Vec<Answer>) {
        let mut pending = self.lock();
        if pending.closed || (answers.len() == 1 && pending.waiting.is_some()) {
            drop(pending);
            for (job, commit) in answers {
                job.reply(commit);
            }
            return;
        }
        if pending.answers.is_empty() {
            std::mem::swap(&mut pending.answers, &mut answers);
        } else {
            pending.answers.append(&mut answers);
        }
        let waiting = pending.waiting.take();
        drop(pending);
        if let Some(task) = waiting {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            task.wake();
        }
    }
}

/// Answers a batch's writes: through their threads' inboxes, one post per inbox, or directly.
fn answer_batch(batch: &mut Vec<Box<dyn WriteJob>>, commit: &Result<(), StoreError>) {
    let mut routed: Vec<(Arc<Inbox>, Vec<Answer>)> = Vec::new();
    for mut job in batch.drain(..) {
        let Some(inbox) = job.take_inbox() else {
            job.reply(commit.clone());
            continue;
        };
        match routed.iter_mut().find(|(to, _)| Arc::ptr_eq(to, &inbox)) {
            Some((_, answers)) => answers.push((job, commit.clone())),
            None => routed.push((inbox, vec![(job, commit.clone())])),
        }
    }
    for (inbox, answers) in routed {
        inbox.post(answers);
    }
}

enum WriteMsg {
    Job(Box<dyn WriteJob>),
    Stop(oneshot::Sender<()>),
}

type ReadJob = Box<dyn FnOnce(&mut SqliteExec<'_, '_>) + Send>;

enum ReadMsg {
    Job(ReadJob),
    Stop(oneshot::Sender<()>),
}

/// What the checkpointer is told.
enum CheckpointMsg {
    /// The writer committed: there is something to copy back.
    Committed,
    /// Checkpoint once more and stop.
    Stop(oneshot::Sender<()>),
}

/// The SQLite backend's connections and threads.
pub(crate) struct Sqlite {
    writer: SyncSender<WriteMsg>,
    readers: SyncSender<ReadMsg>,
    reader_count: usize,
    /// The checkpointer's queue, and what the writer tells it.
    nudge: Arc<Nudge>,
    /// Who writes: the writer thread or, on an idle store, the caller ([`Sqlite::write`]).
    gate: Arc<Gate>,
}

/// The one right to run a write transaction, and the inline writer's connection behind it.
///
/// The writer thread holds [`Gate::token`] for each batch, from its `BEGIN` to its `COMMIT`; a
/// caller that writes inline holds it for its one write. So the two connections never both
/// write, and neither waits on SQLite's busy handler for the other.
struct Gate {
    /// The inline writer's connection (`None` once the store is closed).
    token: Mutex<Option<Cached>>,
    /// Writes handed to the writer thread and not yet answered.
    queued: AtomicUsize,
    /// When the store opened: the origin of `busy_at`.
    opened: Instant,
    /// When a caller that may write inline last handed its write over because it was not
    /// alone: microseconds since `opened`, plus one (0: never).
    busy_at: AtomicU64,
}

impl Gate {
    fn new(inline: Cached) -> Self {
        Gate {
            token: Mutex::new(Some(inline)),
            queued: AtomicUsize::new(0),
            opened: Instant::now(),
            busy_at: AtomicU64::new(0),
        }
    }

    fn micros(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// A caller that may write inline hands its write over: the store is busy.
    fn busy(&self) {
        self.busy_at.store(self.micros(), Ordering::Relaxed);
    }

    /// Whether a [`BUSY_SPELL`] has passed since the store was last busy.
    fn quiet(&self) -> bool {
        let at = self.busy_at.load(Ordering::Relaxed);
        let spell = u64::try_from(BUSY_SPELL.as_micros()).unwrap_or(u64::MAX);
        at == 0 || self.micros().saturating_sub(at) >= spell
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Cached>> {
        self.token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How long a store that handed a write to its writer thread because its caller was not alone
/// keeps handing writes over before it writes inline again ([`write_here_when_alone`]).
const BUSY_SPELL: Duration = if cfg!(test) {
    Duration::from_millis(50)
} else {
    Duration::from_millis(10)
};

/// A write run inline ([`Sqlite::write_inline`]), or handed back to be queued.
enum Inline<R, F> {
    Done(Result<R, StoreError>),
    Queue(F),
}

thread_local! {
    /// The gauge of requests in flight of this thread's server, once
    /// [`write_here_when_alone`] gave it.
    static ALONE: RefCell<Option<Arc<AtomicUsize>>> = const { RefCell::new(None) };
}

/// Lets the SQLite store run a write on this thread, inside the caller's own call, instead of
/// handing it to the writer thread and waiting to be woken, when nothing else waits for it:
/// no other write is queued or running and `requests_in_flight` (the server's gauge of the
/// requests it is answering) is at most one, the caller's own.
///
/// At one request at a time the two thread hops of a write (the writer woken to take it, the
/// caller woken by its answer) cost more than the write itself on a virtual machine: each
/// wakes an idle core. Under load, writes still go to the writer thread and share its group
/// commits, and no request waits behind another's `fsync` on this thread: not in the moments
/// of load when only one request is in flight either, since a store that handed a write over
/// for not being alone writes inline again only after a quiet spell. Call it on each of a
/// server's request threads: the one thread of a current-thread runtime, or every worker of a
/// multi-thread one as it starts, all given the same gauge.
pub fn write_here_when_alone(requests_in_flight: Arc<AtomicUsize>) {
    ALONE.with(|alone| *alone.borrow_mut() = Some(requests_in_flight));
}

/// Whether this thread was given a gauge by [`write_here_when_alone`], and so may write on an
/// idle store itself.
#[must_use]
pub fn writes_here_when_alone() -> bool {
    ALONE.with(|alone| alone.borrow().is_some())
}

/// Whether this thread's server answers at most one request now (see
/// [`write_here_when_alone`]); `None` on a thread that did not opt in.
fn alone_here() -> Option<bool> {
    ALONE.with(|alone| {
        alone
            .borrow()
            .as_ref()
            .map(|requests| requests.load(Ordering::Acquire) <= 1)
    })
}

/// How the writer tells the checkpointer there is something to copy back: a message for the
/// first commit after a checkpoint, and for the commits after it only a flag. A message for
/// every commit woke the checkpointer thread at every commit (about 2,500 context switches a
/// second at 7,000 calls/s), only for it to go back to waiting for its interval.
struct Nudge {
    /// The checkpointer's queue.
    checkpointer: SyncSender<CheckpointMsg>,
    /// A commit is waiting for the next checkpoint, and the checkpointer knows.
    pending: AtomicBool,
    /// Messages sent (for tests).
    sent: AtomicU64,
    /// Read-backs of the WAL finished ([`WalWarmth`]; for tests).
    warmed: Arc<AtomicU64>,
}

impl Nudge {
    fn new(checkpointer: SyncSender<CheckpointMsg>) -> Self {
        Nudge {
            checkpointer,
            pending: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            warmed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// After a commit: tells the checkpointer unless it already knows of an earlier one.
    fn committed(&self) {
        if self.pending.load(Ordering::Acquire) || self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        // Full: a nudge is already waiting for the checkpointer.
        let _ = self.checkpointer.try_send(CheckpointMsg::Committed);
    }

    /// Before a checkpoint: a commit from now on needs a new message (the checkpoint about to
    /// run may or may not copy it).
    fn taken(&self) {
        self.pending.store(false, Ordering::Release);
    }
}

/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// WAL frames after which the writer checkpoints by itself, inside the commit that crosses
/// them (SQLite's default is 1000).
///
/// Under sustained writes this is the checkpoint that starts the WAL over, and a stall of
/// every call in flight. The checkpointer's passive checkpoints rarely copy every frame (the
/// writer commits meanwhile), and SQLite syncs the database file, and lets the WAL start over,
/// only after one that does. So the WAL grows to this many frames, and then the writer's own
/// checkpoint copies what is left and syncs everything copied since the last database sync,
/// its commits waiting.
///
/// How often that happens is what this sets, and how long (the more frames, the more copied
/// pages to sync). Traced at 16 connections (HTTP write with a key; docs/benchmarks.md,
/// "2026-12-07 (last)"): at 16,000 frames 26 stalls of 3.7 ms (95 ms in all), the write
/// p99; at 32,000, 13 of 6 ms (73 ms), p99 0.85–0.98× in every round against 16,000; at
/// 64,000, 5 of 12 ms (50 ms), p99 no lower than at 32,000 but each stall twice as long. The
/// cost: a WAL of up to 66 MB at 2 KiB pages while writes go on (kept until the store
/// closes), which recovery reads whole after a crash (40 ms from the page cache, 60 ms from
/// the disk, on the machines of docs/benchmarks.md).
const WRITER_AUTOCHECKPOINT: i64 = 32_000;

/// Opens a connection with the store's settings.
fn connect(path: &Path, read_only: bool) -> Result<Connection, StoreError> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(from_rusqlite)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(from_rusqlite)?;
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(from_rusqlite)?;
    if !read_only {
        // WAL: readers proceed while the writer writes. FULL: a commit is on disk (WAL and
        // its fsync) before it is acknowledged, even across power loss.
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(from_rusqlite)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!(
                "{} cannot use the WAL journal (got {mode})",
                path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(from_rusqlite)?;
        // Checkpoints run on their own thread (`checkpoint_loop`), not inside a commit that
        // callers wait for.
        conn.pragma_update(None, "wal_autocheckpoint", WRITER_AUTOCHECKPOINT)
            .map_err(from_rusqlite)?;
        conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)
            .map_err(from_rusqlite)?;
    } else {
        // Readers find the pages in the operating system's cache; a small cache of their own
        // keeps the process small (SQLite's default is 2 MiB per connection).
        conn.pragma_update(None, "cache_size", READER_CACHE_KIB)
            .map_err(from_rusqlite)?;
    }
    Ok(conn)
}

impl Sqlite {
    /// Opens the writer and `readers` reader connections (the schema must be in place) and
    /// starts their threads.
    pub(crate) fn open(path: &Path, readers: usize, queue_capacity: usize) -> Result<Self, StoreError> {
        let capacity = queue_capacity.max(1);
        let writer_conn = connect(path, false)?;
        let inline_conn = connect(path, false)?;
        // Never waits on SQLite's busy handler: a write lock held by another process sends the
        // write to the writer thread, which waits for it without holding up a request thread.
        inline_conn.busy_timeout(Duration::ZERO).map_err(from_rusqlite)?;
        let gate = Arc::new(Gate::new(Cached::new(inline_conn)));
        let checkpoint_conn = connect(path, false)?;
        let reader_conns = (0..readers.max(1))
            .map(|_| connect(path, true))
            .collect::<Result<Vec<_>, _>>()?;
        let (writer, write_rx) = mpsc::sync_channel(capacity);
        // One pending nudge is enough: it stands for every commit until the next checkpoint.
        let (checkpointer, nudges) = mpsc::sync_channel(1);
        let nudge = Arc::new(Nudge::new(checkpointer));
        let writer_nudge = Arc::clone(&nudge);
        let writer_gate = Arc::clone(&gate);
        spawn("warrant-sqlite-w", move || {
            write_loop(writer_conn, &write_rx, &writer_nudge, &writer_gate)
        })?;
        let (reader_tx, read_rx) = mpsc::sync_channel(capacity);
        let read_rx = Arc::new(Mutex::new(read_rx));
        let reader_count = reader_conns.len();
        for conn in reader_conns {
            let rx = Arc::clone(&read_rx);
            spawn("warrant-sqlite-r", move || read_loop(conn, &rx))?;
        }
        let checkpoint_nudge = Arc::clone(&nudge);
        spawn("warrant-sqlite-c", move || {
            checkpoint_loop(&checkpoint_conn, &nudges, &checkpoint_nudge)
        })?;
        Ok(Sqlite {
            writer,
            readers: reader_tx,
            reader_count,
            nudge,
            gate,
        })
    }

    /// Runs a write operation in the next batch; answers once the batch is durable. On an
    /// idle store, on a thread that opted in, it runs here instead
    /// ([`write_here_when_alone`]).
    pub(crate) async fn write<R, F>(&self, operation: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut SqliteExec<'_, '_>) -> Result<R, StoreError> + Send + 'static,
    {
        let operation = match self.write_inline(operation) {
            Inline::Done(result) => return result,
            Inline::Queue(operation) => operation,
        };
        self.gate.queued.fetch_add(1, Ordering::AcqRel);
        let (answer, wait) = oneshot::channel();
        let job = Job {
            operation,
            result: None,
            answer,
            span: tracing::Span::current(),
            inbox: Inbox::current(),
        };
        if let Err(e) = queue(&self.writer, WriteMsg::Job(Box::new(job)), "write") {
            self.gate.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        wait.await.map_err(|_| closed())?
    }

    /// Runs a write here, as the only write of its transaction (as the first write of a
    /// batch runs on the writer thread: no savepoint; discarded, it rolls the transaction
    /// back), when this thread opted in and is alone, no write is queued or running, no write
    /// was handed over for not being alone in the last [`BUSY_SPELL`], and the write lock is
    /// free; else hands the operation back to be queued.
    ///
    /// The spell: under load, the moments a server answers one request come and go between
    /// the others' (about ten a second at 16 connections, measured), and a write run inline
    /// in one holds the request thread, so every other connection's request, through its
    /// `fsync` (0.3 ms, up to 1.7 ms while a checkpoint syncs the database file).
    fn write_inline<R, F>(&self, mut operation: F) -> Inline<R, F>
    where
        F: FnMut(&mut SqliteExec<'_, '_>) -> Result<R, StoreError>,
    {
        match alone_here() {
            None => return Inline::Queue(operation),
            Some(alone) if !alone || self.gate.queued.load(Ordering::Acquire) != 0 => {
                self.gate.busy();
                return Inline::Queue(operation);
            }
            Some(_) if !self.gate.quiet() => return Inline::Queue(operation),
            Some(_) => {}
        }
        let token = match self.gate.token.try_lock() {
            Ok(token) => token,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Inline::Queue(operation),
        };
        let Some(cached) = token.as_ref() else {
            return Inline::Queue(operation);
        };
        let statements = Statements::Cached(cached);
        // Busy (another process writes) or failing: the writer thread takes it from here.
        if step(statements, "BEGIN IMMEDIATE").is_err() {
            return Inline::Queue(operation);
        }
        let mut ex = SqliteExec {
            prepared: statements,
            rollback: false,
        };
        let result = guarded(|| operation(&mut ex));
        let keep = result.is_ok() && !ex.rollback;
        let end = step(statements, if keep { "COMMIT" } else { "ROLLBACK" });
        if end.is_err() {
            let _ = step(statements, "ROLLBACK");
        }
        drop(token);
        Inline::Done(match end {
            Ok(()) => {
                if keep {
                    self.nudge.committed();
                }
                result
            }
            Err(e) => Err(e),
        })
    }

    /// Runs a read operation on a reader connection.
    pub(crate) async fn read<R, F>(&self, operation: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut SqliteExec<'_, '_>) -> Result<R, StoreError> + Send + 'static,
    {
        let (answer, wait) = oneshot::channel();
        let span = tracing::Span::current();
        let job: ReadJob = Box::new(move |ex| {
            let _entered = span.enter();
            let _ = answer.send(guarded(|| operation(ex)));
        });
        queue(&self.readers, ReadMsg::Job(job), "read")?;
        wait.await.map_err(|_| closed())?
    }

    /// Finishes the queued work, closes every connection and stops the threads. Later
    /// operations fail as unavailable.
    pub(crate) async fn close(&self) {
        let mut acks = Vec::new();
        let (ack, done) = oneshot::channel();
        if stop(&self.writer, WriteMsg::Stop(ack)).await {
            acks.push(done);
        }
        for _ in 0..self.reader_count {
            let (ack, done) = oneshot::channel();
            if stop(&self.readers, ReadMsg::Stop(ack)).await {
                acks.push(done);
            }
        }
        let (ack, done) = oneshot::channel();
        if stop(&self.nudge.checkpointer, CheckpointMsg::Stop(ack)).await {
            acks.push(done);
        }
        for done in acks {
            let _ = done.await;
        }
        // The inline writer's connection: closed, and no write runs inline after this.
        drop(self.gate.lock().take());
    }
}

/// Queues an operation, or answers at once: [`StoreError::Overloaded`] when the queue is full
/// (counted), unavailable when the store is closed.
fn queue<M>(queue: &SyncSender<M>, msg: M, name: &'static str) -> Result<(), StoreError> {
    match queue.try_send(msg) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(_)) => {
            metrics::counter!(OVERLOADED_METRIC, "queue" => name).increment(1);
            Err(StoreError::Overloaded(format!("the SQLite {name} queue is full")))
        }
        Err(TrySendError::Disconnected(_)) => Err(closed()),
    }
}

/// Queues a stop message behind the work already queued, waiting (without blocking the
/// runtime) while the queue is full; `false` when the thread is gone.
async fn stop<M>(queue: &SyncSender<M>, mut msg: M) -> bool {
    loop {
        match queue.try_send(msg) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                msg = back;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// The checkpointer thread: after a commit, a passive checkpoint once [`CHECKPOINT_EVERY`] has
/// passed (it copies what it can without waiting for readers or blocking the writer; the
/// commits of that interval share it, and send nothing: see [`Nudge`]), and one more when
/// stopped. Without commits it sleeps: an idle gateway's store wakes no thread (it used to
/// check every 250 ms, each time preparing the checkpoint statement again).
///
/// After a quiet spell it has the WAL read back into the page cache ahead of the commits
/// ([`WalWarmth`]).
fn checkpoint_loop(conn: &Connection, nudges: &Receiver<CheckpointMsg>, nudge: &Nudge) {
    let prepared = Prepared::new(conn);
    let mut wal = WalWarmth::of(conn, Arc::clone(&nudge.warmed));
    // The frames in the WAL when it ran and the frames it had copied, if it ran. A failed
    // checkpoint is retried after the next commit; the writer's own autocheckpoint is the
    // backstop.
    let checkpoint = || {
        let rows = query(&prepared, "PRAGMA wal_checkpoint(PASSIVE)", &[], 1).ok()?;
        let row = rows.first()?;
        // A busy checkpoint answers -1: `None`.
        let count = |column| u64::try_from(row.int(column).ok()?).ok();
        Some((count("log")?, count("checkpointed")?))
    };
    // Changes when another connection has committed changes since the last reading (a
    // transaction that changed nothing leaves it alone).
    let data_version = || {
        query(&prepared, "PRAGMA data_version", &[], 1)
            .ok()?
            .first()?
            .int("data_version")
            .ok()
    };
    let stopped = |ack: oneshot::Sender<()>| {
        checkpoint();
        let _ = ack.send(());
    };
    loop {
        match nudges.recv() {
            Ok(CheckpointMsg::Committed) => {}
            Ok(CheckpointMsg::Stop(ack)) => return stopped(ack),
            Err(_) => return,
        }
        if let Some(version) = data_version() {
            wal.committed(version);
        }
        let due = Instant::now() + CHECKPOINT_EVERY;
        loop {
            match nudges.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(CheckpointMsg::Committed) => {}
                Ok(CheckpointMsg::Stop(ack)) => return stopped(ack),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    checkpoint();
                    return;
                }
            }
        }
        nudge.taken();
        if let Some((frames, copied)) = checkpoint() {
            wal.checkpointed(frames, copied);
        }
    }
}

/// Bytes of the WAL's header, before its first frame.
const WAL_HEADER_BYTES: u64 = 32;
/// Bytes of a WAL frame's header, before its page.
const WAL_FRAME_HEADER_BYTES: u64 = 24;
/// A spell without commits that changed the database after which the WAL may have left the
/// page cache (shorter in tests, which cannot wait that long).
const WAL_QUIET: Duration = if cfg!(test) {
    Duration::from_secs(1)
} else {
    Duration::from_secs(10)
};
/// The fewest frames planned for, read back twice over: 256 frames (1 MiB at 2 KiB pages,
/// 2 MiB at 4 KiB).
const WAL_MIN_FRAMES: u64 = 256;

/// Has the WAL read back into the page cache after a quiet spell, ahead of the commits.
///
/// A WAL frame is a 24-byte header and a page, so frames do not fall on the file's pages: a
/// commit writes parts of pages, and the kernel must read a page it no longer caches before
/// it can write part of it — a synchronous disk read inside the commit. Pages written go on
/// looking used to the kernel, but after a quiet spell whatever evicts cold page cache evicts
/// the WAL: memory pressure, or a proactive reclaimer such as DAMON's, which virtual machines
/// run to hand idle memory back to the host (on the machines of docs/benchmarks.md it pages
/// out what went a minute unused). Then every commit of the first pass over the WAL waited
/// for reads: 1.5–2.2 reads of 4 KiB a call at one connection, for the 3,000 calls after a
/// 90-second pause.
///
/// So at the first commit that changes the database after a quiet spell (its nudge; the
/// gateway's timers commit transactions that change nothing, which `PRAGMA data_version`
/// does not count) the checkpointer has the stretch the commits are likely to write read back,
/// in the background, by a thread of its own ([`read_back`]): from where they write next (the
/// WAL's start when the last checkpoint copied every frame, else its end), twice the most
/// frames it held at a checkpoint of the last busy spell, at most the file. Pages still
/// cached cost a lookup each. Busy, nothing is done; idle, nothing runs. Written by hand:
/// SQLite has no such setting.
struct WalWarmth {
    /// The WAL file (`None` for a database without a file).
    path: Option<std::path::PathBuf>,
    /// Bytes of one frame.
    frame: u64,
    /// The most frames the WAL held at a checkpoint since the last quiet spell.
    peak: u64,
    /// Where the next commit writes in the WAL, as the last checkpoint left it (bytes).
    next: u64,
    /// The database's `data_version` at the last nudge.
    version: Option<i64>,
    /// When a nudge last found the database changed.
    changed: Instant,
    /// A read-back is under way.
    reading: Arc<AtomicBool>,
    /// Read-backs finished (for tests).
    finished: Arc<AtomicU64>,
}

impl WalWarmth {
    /// For the WAL of `conn`'s database.
    fn of(conn: &Connection, finished: Arc<AtomicU64>) -> Self {
        let page = conn
            .query_row("PRAGMA page_size", [], |row| row.get::<_, i64>(0))
            .ok()
            .and_then(|page| u64::try_from(page).ok())
            .unwrap_or(4096);
        WalWarmth {
            path: conn
                .path()
                .filter(|path| !path.is_empty())
                .map(|path| format!("{path}-wal").into()),
            frame: WAL_FRAME_HEADER_BYTES + page,
            peak: 0,
            next: 0,
            version: None,
            changed: Instant::now(),
            reading: Arc::new(AtomicBool::new(false)),
            finished,
        }
    }

    /// A nudge, with the database's `data_version` then: when it changed after a quiet
    /// spell, the stretch the commits are likely to write is read back.
    fn committed(&mut self, version: i64) {
        if self.version.replace(version) == Some(version) {
            return;
        }
        let quiet = self.changed.elapsed() >= WAL_QUIET;
        self.changed = Instant::now();
        if !quiet || self.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        let frames = std::mem::take(&mut self.peak).max(WAL_MIN_FRAMES);
        let stretch = frames.saturating_mul(2).saturating_mul(self.frame);
        // Opened each time: SQLite creates and removes the file as it needs. Closing it
        // releases no lock of SQLite's: closing any handle drops the process's POSIX locks on
        // that file, but SQLite locks only the database file and the `-shm` file, never the
        // WAL.
        let Some(file) = self.path.as_ref().and_then(|path| std::fs::File::open(path).ok()) else {
            self.reading.store(false, Ordering::Release);
            return;
        };
        let length = file.metadata().map_or(0, |m| m.len());
        let from = self.next.min(length);
        let bytes = stretch.min(length - from);
        let reading = Arc::clone(&self.reading);
        let finished = Arc::clone(&self.finished);
        // A thread of its own, so that a slow disk does not hold up the checkpoints.
        let started = spawn("warrant-sqlite-wal", move || {
            read_back(&file, from, bytes);
            finished.fetch_add(1, Ordering::Relaxed);
            reading.store(false, Ordering::Release);
        });
        if started.is_err() {
            self.reading.store(false, Ordering::Release);
        }
    }

    /// A checkpoint left `frames` in the WAL, `copied` of them copied back.
    fn checkpointed(&mut self, frames: u64, copied: u64) {
        self.peak = self.peak.max(frames);
        // Every frame copied: the next commit starts the WAL over (unless a reader still
        // reads it, when it writes at the end as otherwise).
        self.next = if copied >= frames {
            0
        } else {
            WAL_HEADER_BYTES.saturating_add(frames.saturating_mul(self.frame))
        };
    }
}

/// Reads `bytes` of `file` from `offset` into the page cache, one part at a time; best effort.
///
/// Each part is asked for (`POSIX_FADV_WILLNEED`: a read of what is not cached, nothing
/// copied) and waited for (a one-byte read of its last byte waits until the part's read has
/// landed), so the commits' writes and flushes never queue behind more than one part. Asked
/// all at once, as a first version did, the whole stretch — up to the 66 MB of a WAL after
/// sustained load — was queued at once, and the disk's scheduler, which serves reads before
/// writes, held the commits of the calls right after the quiet spell behind it for
/// milliseconds. For the same reason the kernel's own read-ahead is turned off on this handle
/// (`POSIX_FADV_RANDOM`), so that no read of ours grows into megabytes read ahead.
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn read_back(file: &std::fs::File, offset: u64, bytes: u64) {
    /// Bytes per part: one request of the disk's, about 0.25 ms of reading on the machines of
    /// docs/benchmarks.md.
    const PART: u64 = 128 << 10;
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Random);
    let end = offset.saturating_add(bytes);
    let mut at = offset;
    let mut last = [0_u8; 1];
    while at < end {
        let part = PART.min(end - at);
        let asked = rustix::fs::fadvise(
            file,
            at,
            std::num::NonZeroU64::new(part),
            rustix::fs::Advice::WillNeed,
        );
        if asked.is_err() || std::os::unix::fs::FileExt::read_at(file, &mut last, at + part - 1).is_err() {
            return;
        }
        at += part;
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
fn read_back(_file: &std::fs::File, _offset: u64, _bytes: u64) {}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(body)
        .map(drop)
        .map_err(|e| StoreError::Unavailable(format!("cannot start a store thread: {e}")))
}

/// The writer thread: batches, savepoints, one commit per batch.
fn write_loop(conn: Connection, queue: &Receiver<WriteMsg>, nudge: &Nudge, gate: &Gate) {
    let prepared = Prepared::new(&conn);
    let mut batch: Vec<Box<dyn WriteJob>> = Vec::new();
    let mut stop = None;
    while stop.is_none() {
        match queue.recv() {
            Ok(WriteMsg::Job(job)) => batch.push(job),
            Ok(WriteMsg::Stop(ack)) => stop = Some(ack),
            Err(_) => break,
        }
        if batch.is_empty() {
            continue;
        }
        // Waits while a caller writes inline: at most that one write.
        let token = gate.lock();
        if let Err(e) = step(&prepared, "BEGIN IMMEDIATE") {
            drop(token);
            gate.queued.fetch_sub(batch.len(), Ordering::AcqRel);
            answer_batch(&mut batch, &Err(e));
            continue;
        }
        let mut broken = None;
        let mut discarded = false;
        // Until a write of this batch is not to be kept, none runs in a savepoint: a savepoint
        // copies every page its write touches into the statement journal and costs two more
        // statements, for every write after the first, while writes that fail are rare. When
        // one fails, the transaction is rolled back and begun again with the writes before it,
        // run again, each in a savepoint from then on ([`replay`]).
        let mut savepoints = false;
        let mut next = 0;
        while let Some(job) = batch.get_mut(next) {
            let ran = if savepoints {
                run_in_savepoint(&prepared, job.as_mut())
            } else {
                Ok(run_alone(&prepared, job.as_mut()))
            };
            match ran {
                // The first write alone: the transaction holds nothing else, and is rolled
                // back whole.
                Ok(false) if next == 0 => {
                    discarded = true;
                    break;
                }
                Ok(false) if !savepoints => {
                    let (before, _) = batch.split_at_mut(next);
                    if let Err(e) = replay(&prepared, before) {
                        broken = Some(e);
                        break;
                    }
                    savepoints = true;
                }
                Ok(_) => {}
                Err(e) => {
                    // The savepoint machinery itself failed: the batch cannot be trusted.
                    broken = Some(e);
                    break;
                }
            }
            next += 1;
            if next == batch.len() && batch.len() < MAX_BATCH && stop.is_none() {
                match queue.try_recv() {
                    Ok(WriteMsg::Job(job)) => batch.push(job),
                    Ok(WriteMsg::Stop(ack)) => stop = Some(ack),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
                }
            }
        }
        let commit = match broken {
            Some(e) => Err(e),
            None if discarded => step(&prepared, "ROLLBACK"),
            None => step(&prepared, "COMMIT"),
        };
        if commit.is_err() {
            let _ = step(&prepared, "ROLLBACK");
        }
        drop(token);
        gate.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        answer_batch(&mut batch, &commit);
        if commit.is_ok() && !discarded {
            nudge.committed();
        }
    }
    drop(prepared);
    drop(conn);
    if let Some(ack) = stop {
        let _ = ack.send(());
    }
}

/// Runs one statement without parameters, prepared once per connection ([`Prepared`]), not
/// parsed again for every batch and write.
fn step<'e, 'c: 'e>(prepared: impl Into<Statements<'e, 'c>>, sql: &str) -> Result<(), StoreError> {
    prepared.into().with(sql, &[], |stmt, _| {
        stmt.raw_execute().map(drop).map_err(from_rusqlite)
    })
}

/// Runs a write as the first of its transaction; answers whether it is to be kept (if not,
/// the caller rolls the transaction back).
fn run_alone(prepared: &Prepared<'_>, job: &mut dyn WriteJob) -> bool {
    let mut ex = SqliteExec {
        prepared: prepared.into(),
        rollback: false,
    };
    job.run(&mut ex)
}

/// Starts a batch's transaction over after a write that ran without a savepoint was not to be
/// kept (its changes are mixed with the others'): rolls it back, begins it again and runs
/// `kept`, the writes that ran before it, again, each in a savepoint. They run on the same
/// state as the first time, unless another process wrote in between; what they answer is
/// what this run answers.
fn replay(prepared: &Prepared<'_>, kept: &mut [Box<dyn WriteJob>]) -> Result<(), StoreError> {
    step(prepared, "ROLLBACK")?;
    step(prepared, "BEGIN IMMEDIATE")?;
    for job in kept {
        run_in_savepoint(prepared, job.as_mut())?;
    }
    Ok(())
}

/// Runs a write after others in its own savepoint, rolled back to if the write is not to be
/// kept; answers whether it was kept.
fn run_in_savepoint(prepared: &Prepared<'_>, job: &mut dyn WriteJob) -> Result<bool, StoreError> {
    step(prepared, "SAVEPOINT op")?;
    let keep = run_alone(prepared, job);
    if !keep {
        step(prepared, "ROLLBACK TO op")?;
    }
    step(prepared, "RELEASE op")?;
    Ok(keep)
}

/// A reader thread: takes the next read from the shared queue until told to stop.
fn read_loop(conn: Connection, queue: &Mutex<Receiver<ReadMsg>>) {
    let prepared = Prepared::new(&conn);
    loop {
        let msg = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        match msg {
            Ok(ReadMsg::Job(job)) => {
                let mut ex = SqliteExec {
                    prepared: (&prepared).into(),
                    rollback: false,
                };
                job(&mut ex);
            }
            Ok(ReadMsg::Stop(ack)) => {
                drop(prepared);
                drop(conn);
                let _ = ack.send(());
                return;
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

    use super::*;
    use crate::exec::args;

    #[test]
    fn each_dollar_placeholder_takes_the_argument_of_its_number() {
        let conn = Connection::open_in_memory().unwrap();
        let conn = Prepared::new(&conn);
        // `$2` appears first, `$2` twice, `'$1'` is text, `$3` has no argument.
        let sql = "SELECT $2 AS a, $1 AS b, $2 AS c, '$1' AS d, $3 AS e";
        let runs: [(&str, i64, &[Arg<'_>], Option<&str>); 2] = [
            ("one", 2, &[Arg::Text("three")], Some("three")),
            // The same statement again, kept: it keeps no earlier binding.
            ("uno", 20, &[], None),
        ];
        for (one, two, more, three) in runs {
            let args: Vec<Arg<'_>> = [Arg::Text(one), Arg::Int(two)]
                .into_iter()
                .chain(more.iter().copied())
                .collect();
            let rows = query(&conn, sql, &args, usize::MAX).unwrap();
            let row = rows.first().unwrap();
            assert_eq!(row.opt_int("a").unwrap(), Some(two));
            assert_eq!(row.opt_text("b").unwrap().as_deref(), Some(one));
            assert_eq!(row.opt_int("c").unwrap(), Some(two));
            assert_eq!(row.opt_text("d").unwrap().as_deref(), Some("$1"));
            assert_eq!(row.opt_text("e").unwrap().as_deref(), three);
        }
        // A placeholder that is not `$N` is the store's own mistake, refused.
        for sql in ["SELECT ?", "SELECT :name", "SELECT $x"] {
            assert!(query(&conn, sql, &[Arg::Int(1)], 1).is_err(), "{sql}");
        }
    }

    #[test]
    fn kept_parameter_numbers_follow_the_text_not_its_address() {
        let conn = Connection::open_in_memory().unwrap();
        let conn = Prepared::new(&conn);
        // Texts built at run time, of one length, each dropped before the next is built: the
        // allocator hands out the same address again, and the kept numbers must not be reused
        // for another text found there.
        for round in 0..20 {
            let sql = if round % 2 == 0 {
                String::from("SELECT $1 AS a, $2 AS b")
            } else {
                String::from("SELECT $2 AS a, $1 AS b")
            };
            let rows = query(&conn, &sql, &[Arg::Int(1), Arg::Int(2)], 1).unwrap();
            let row = rows.first().unwrap();
            let (a, b) = if round % 2 == 0 { (1, 2) } else { (2, 1) };
            assert_eq!(row.opt_int("a").unwrap(), Some(a), "{sql}");
            assert_eq!(row.opt_int("b").unwrap(), Some(b), "{sql}");
        }
        // Statements built at run time cannot grow the list without bound.
        for n in 0..(KEPT_STATEMENTS * 2) {
            let sql = format!("SELECT $1 AS a, {n} AS n");
            query(&conn, &sql, &[Arg::Int(1)], 1).unwrap();
        }
        assert!(conn.len() <= KEPT_STATEMENTS);
    }

    #[test]
    fn a_bound_limit_does_not_prepare_the_statement_again() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER); INSERT INTO t VALUES (1), (2), (3);")
            .unwrap();
        let conn = Prepared::new(&conn);
        let sql = "SELECT k FROM t ORDER BY k LIMIT $1";
        for limit in [1, 2, 3, 1, 2] {
            assert_eq!(
                query(&conn, sql, &[Arg::Int(limit)], usize::MAX).unwrap().len(),
                usize::try_from(limit).unwrap()
            );
        }
        let ex = SqliteExec {
            prepared: (&conn).into(),
            rollback: false,
        };
        assert_eq!(ex.reprepares(sql), 0, "the statement was prepared again");
        // One statement kept for the five runs, not one per run.
        assert_eq!(conn.len(), 1);
    }

    async fn store() -> (tempfile::TempDir, Arc<Sqlite>) {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Sqlite::open(&dir.path().join("t.db"), 2, DEFAULT_QUEUE_CAPACITY).unwrap();
        sqlite
            .write(|ex| {
                now(async {
                    ex.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)", &[])
                        .await
                })
            })
            .await
            .unwrap();
        (dir, Arc::new(sqlite))
    }

    fn insert(
        k: String,
        v: i64,
    ) -> impl FnMut(&mut SqliteExec<'_, '_>) -> Result<u64, StoreError> + Send + 'static {
        move |ex| {
            now(async {
                ex.execute("INSERT INTO t (k, v) VALUES ($1, $2)", &args![&k, v])
                    .await
            })
        }
    }

    /// The rows of `t` in the database file alone, as a copy without the WAL sees them.
    fn rows_in_the_database_file(dir: &Path) -> i64 {
        let copy = dir.join("copy.db");
        std::fs::copy(dir.join("t.db"), &copy).unwrap();
        let conn = Connection::open(&copy).unwrap();
        let rows = conn
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap_or(-1);
        drop(conn);
        std::fs::remove_file(&copy).unwrap();
        rows
    }

    #[tokio::test]
    async fn a_commit_reaches_the_database_file_by_the_next_checkpoint() {
        let (dir, sqlite) = store().await;
        tokio::time::sleep(CHECKPOINT_EVERY * 2).await;
        assert_eq!(
            rows_in_the_database_file(dir.path()),
            0,
            "the table, checkpointed"
        );
        sqlite.write(insert("a".into(), 1)).await.unwrap();
        // No later commit nudges it: the checkpointer copies this one by itself.
        tokio::time::sleep(CHECKPOINT_EVERY * 4).await;
        assert_eq!(rows_in_the_database_file(dir.path()), 1);
        // Stopping checkpoints what came since the last checkpoint.
        sqlite.write(insert("b".into(), 2)).await.unwrap();
        sqlite.close().await;
        assert_eq!(rows_in_the_database_file(dir.path()), 2);
    }

    /// Bytes this thread has had read from the disk (`read_bytes` of `/proc/thread-self/io`).
    #[cfg(target_os = "linux")]
    fn disk_reads_of_this_thread() -> Option<u64> {
        let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
        io.lines()
            .find_map(|line| line.strip_prefix("read_bytes: "))
            .and_then(|n| n.trim().parse().ok())
    }

    /// Drops `file` from the page cache, as a reclaimer makes it leave; answers whether reading
    /// it then reads the disk, as this thread's counts show (probed at `probe_at`, and dropped
    /// again). `false` without per-thread counts or on a file system that keeps files in
    /// memory: the tests that need it skip.
    #[cfg(target_os = "linux")]
    fn evicted(file: &std::fs::File, probe_at: u64) -> bool {
        let evict = || rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        evict();
        let Some(before) = disk_reads_of_this_thread() else {
            return false;
        };
        let mut probe = [0_u8; 64];
        std::os::unix::fs::FileExt::read_at(file, &mut probe, probe_at).unwrap();
        let reads = disk_reads_of_this_thread() != Some(before);
        evict();
        reads
    }

    /// A write of a row of 3,000 bytes.
    #[cfg(target_os = "linux")]
    fn insert_wide(
        k: String,
    ) -> impl FnMut(&mut SqliteExec<'_, '_>) -> Result<u64, StoreError> + Send + 'static {
        move |ex| {
            now(async {
                ex.execute("INSERT INTO t (k, v) VALUES ($1, randomblob(3000))", &args![&k])
                    .await
            })
        }
    }

    /// Commits after a quiet spell read nothing from the disk when the WAL they write has
    /// left the page cache meanwhile: at the spell's first commit the checkpointer has read
    /// back the stretch the last busy spell wrote, twice over ([`WalWarmth`]). That first
    /// commit, before anything was asked, shows what each would do otherwise: wait for reads
    /// of the pages it writes part of (without the read-back, the 2,500 commits after it read
    /// 43 MB). The commits run on this thread ([`write_here_when_alone`]), so this thread's
    /// disk reads are theirs; the read-back runs on a thread of its own ([`read_back`]).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn commits_after_a_quiet_spell_do_not_read_the_wal_back_from_the_disk() {
        let (dir, sqlite) = store().await;
        write_here_when_alone(Arc::new(AtomicUsize::new(1)));
        // A busy spell: a WAL of several MiB.
        for i in 0..3000 {
            sqlite.write(insert_wide(format!("a{i}"))).await.unwrap();
        }
        tokio::time::sleep(CHECKPOINT_EVERY * 2).await;
        // The WAL leaves the page cache.
        let wal = std::fs::File::open(dir.path().join("t.db-wal")).unwrap();
        if !evicted(&wal, wal.metadata().unwrap().len() - 64) {
            eprintln!("skipped: no per-thread disk reads, or the WAL stays in memory");
            return;
        }
        tokio::time::sleep(WAL_QUIET).await;
        let warmed = sqlite.nudge.warmed.load(Ordering::Relaxed);
        // The spell's first commit reads the pages it writes part of.
        let before = disk_reads_of_this_thread().unwrap();
        sqlite.write(insert_wide("b".into())).await.unwrap();
        let first = disk_reads_of_this_thread().unwrap() - before;
        assert!(first > 0, "the first commit after eviction read nothing");
        // Its nudge has the WAL read back.
        let asked = Instant::now();
        while sqlite.nudge.warmed.load(Ordering::Relaxed) == warmed {
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "the WAL was not read back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A burst over most of the old WAL.
        let before = disk_reads_of_this_thread().unwrap();
        for i in 0..2500 {
            sqlite.write(insert_wide(format!("c{i}"))).await.unwrap();
        }
        // Without the read-back the burst read 43 MB. With it, next to nothing: on most hosts
        // less than the first commit alone (about 20 KiB), but on a slow host 100–320 KiB of
        // stray blocks in some runs (3 of 7 at `62d8019`). Under 1 MiB holds the read-back
        // to its purpose without failing on those.
        let read = disk_reads_of_this_thread().unwrap() - before;
        assert!(
            read < 1 << 20,
            "2,500 commits had {read} bytes read from the disk, the first commit alone {first}"
        );
    }

    /// The read-back reads its stretch into the page cache, and nothing ahead of it (the
    /// kernel's read-ahead would queue megabytes more in front of the commits' writes; a
    /// first try that read its parts with `pread` and left read-ahead on read 7.6 MB for
    /// these 2 MiB).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_read_back_reads_its_stretch_and_nothing_ahead_of_it() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let bytes: Vec<u8> = (0..16 * MIB).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        file.sync_all().unwrap();
        if !evicted(&file, 15 * MIB) {
            eprintln!("skipped: no per-thread disk reads, or the file stays in memory");
            return;
        }
        let before = disk_reads_of_this_thread().unwrap();
        read_back(&std::fs::File::open(&path).unwrap(), MIB, 2 * MIB);
        let read = disk_reads_of_this_thread().unwrap() - before;
        assert!(
            (2 * MIB..2 * MIB + 64 * 1024).contains(&read),
            "a read-back of 2 MiB read {read} bytes from the disk"
        );
        // What it read is cached: reading it again reads nothing from the disk.
        let before = disk_reads_of_this_thread().unwrap();
        let mut again = vec![0_u8; usize::try_from(2 * MIB).unwrap()];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut again, MIB).unwrap();
        assert_eq!(disk_reads_of_this_thread().unwrap(), before);
        assert_eq!(
            again.as_slice(),
            &bytes[usize::try_from(MIB).unwrap()..usize::try_from(3 * MIB).unwrap()]
        );
    }

    #[tokio::test]
    async fn commits_between_two_checkpoints_wake_the_checkpointer_once() {
        let (dir, sqlite) = store().await;
        tokio::time::sleep(CHECKPOINT_EVERY * 2).await;
        let before = sqlite.nudge.sent.load(Ordering::Relaxed);
        let started = Instant::now();
        for i in 0..40 {
            sqlite.write(insert(format!("k{i}"), i)).await.unwrap();
        }
        let intervals = started.elapsed().as_millis() / CHECKPOINT_EVERY.as_millis();
        let sent = sqlite.nudge.sent.load(Ordering::Relaxed) - before;
        // One message for the first commit after each checkpoint, not one per commit (40).
        assert!(
            u128::from(sent) <= intervals + 1,
            "{sent} nudges for 40 commits over {intervals} checkpoint intervals"
        );
        // And the last of them still reaches the database file without another commit.
        tokio::time::sleep(CHECKPOINT_EVERY * 4).await;
        assert_eq!(rows_in_the_database_file(dir.path()), 40);
    }

    /// The webhook subscriber probe runs in every call's commit: it is prepared once per
    /// connection and never again, and it matches whole event types only. (As a `LIKE` with a
    /// bound pattern it was prepared again on every binding: a parse per call.)
    #[tokio::test]
    async fn the_per_call_subscriber_probe_is_prepared_once() {
        let (_dir, sqlite) = store().await;
        sqlite
            .write(|ex| {
                now(async {
                    ex.execute(
                        "CREATE TABLE webhook_endpoints (tenant TEXT NOT NULL, enabled INTEGER NOT NULL, \
                         events TEXT NOT NULL)",
                        &[],
                    )
                    .await?;
                    ex.execute(
                        "INSERT INTO webhook_endpoints VALUES ('t', 1, '[\"run.finished\"]')",
                        &[],
                    )
                    .await
                })
            })
            .await
            .unwrap();
        let (found, reprepares) = sqlite
            .write(|ex| {
                now(async move {
                    let mut found = Vec::new();
                    for kind in [
                        "invocation.committed",
                        "run.finished",
                        "run_finished",
                        "run.finished",
                    ] {
                        let needle = warrant_core::records::Notice::subscription_needle(kind);
                        let row = ex
                            .fetch_optional(crate::sql::SUBSCRIBER_PROBE, &args!["t", &needle])
                            .await?;
                        found.push(row.is_some());
                    }
                    Ok((found, ex.reprepares(crate::sql::SUBSCRIBER_PROBE)))
                })
            })
            .await
            .unwrap();
        assert_eq!(found, [false, true, false, true]);
        assert_eq!(reprepares, 0, "the probe was prepared again");
    }

    async fn count(sqlite: &Sqlite) -> i64 {
        sqlite
            .read(|ex| {
                now(async {
                    let row = ex.fetch_optional("SELECT COUNT(*) AS n FROM t", &[]).await?;
                    row.map_or(Ok(0), |r| r.int("n"))
                })
            })
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_batches_and_a_failed_one_leaves_the_others() {
        let (_dir, sqlite) = store().await;
        let mut tasks = Vec::new();
        for i in 0..200 {
            let sqlite = Arc::clone(&sqlite);
            // Every tenth write reuses a key and fails on the primary key; its batch commits
            // the others.
            let key = if i % 10 == 9 {
                format!("k{}", i - 1)
            } else {
                format!("k{i}")
            };
            tasks.push(tokio::spawn(async move { sqlite.write(insert(key, i)).await }));
        }
        let mut ok = 0;
        let mut conflicts = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(1) => ok += 1,
                Err(StoreError::Conflict(_)) => conflicts += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((ok, conflicts), (180, 20));
        assert_eq!(count(&sqlite).await, 180);
    }

    /// The writes after the first of a batch run without savepoints. When one is not to be
    /// kept, the batch starts over with the writes before it, each run again in a savepoint,
    /// and the writes after it run in savepoints: every kept write is committed once, answered
    /// by its last run, and nothing of a discarded one stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_discarded_write_in_a_batch_starts_it_over_with_the_writes_before_it() {
        let (_dir, sqlite) = store().await;
        let (release, running, blocked) = hold_writer(&sqlite);
        running.await.unwrap();
        let runs: Arc<[AtomicU64; 6]> = Arc::default();
        let mut queued = Vec::new();
        for i in 0..6_u64 {
            let runs = Arc::clone(&runs);
            let mut w = Box::pin(sqlite.write(move |ex| {
                let run = runs[i as usize].fetch_add(1, Ordering::SeqCst) + 1;
                now(async {
                    let k = format!("w{i}");
                    ex.execute("INSERT INTO t (k, v) VALUES ($1, $2)", &args![&k, run as i64])
                        .await?;
                    match i {
                        2 => ex.rollback(),
                        4 => panic!("an operation that panics"),
                        _ => {}
                    }
                    Ok(run)
                })
            }));
            assert!(tokio::time::timeout(Duration::ZERO, &mut w).await.is_err());
            queued.push(w);
        }
        release.send(()).unwrap();
        // The held write runs again too: its second wait ends at once.
        drop(release);
        assert_eq!(blocked.await.unwrap().unwrap(), 1);
        let mut answers = Vec::new();
        for w in queued {
            answers.push(w.await.map_err(|e| e.to_string()));
        }
        let runs: Vec<u64> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
        // Writes 0 and 1 ran again after 2 was discarded; 3–5 ran once, in savepoints.
        assert_eq!(runs, [2, 2, 1, 1, 1, 1]);
        assert_eq!(answers[0], Ok(2));
        assert_eq!(answers[1], Ok(2));
        assert_eq!(
            answers[2],
            Ok(1),
            "a write rolled back by its operation answers its result"
        );
        assert_eq!(answers[3], Ok(1));
        assert!(
            answers[4].as_ref().is_err_and(|e| e.contains("panicked")),
            "{:?}",
            answers[4]
        );
        assert_eq!(answers[5], Ok(1));
        let kept = sqlite
            .read(|ex| {
                now(async {
                    let rows = ex.fetch_all("SELECT k, v FROM t ORDER BY k", &[]).await?;
                    rows.iter()
                        .map(|r| Ok((r.opt_text("k")?.unwrap_or_default(), r.opt_int("v")?.unwrap_or(0))))
                        .collect::<Result<Vec<_>, StoreError>>()
                })
            })
            .await
            .unwrap();
        let expected = [("held", 0), ("w0", 2), ("w1", 2), ("w3", 1), ("w5", 1)];
        let expected: Vec<(String, i64)> = expected.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        assert_eq!(kept, expected);
    }

    /// Holds the writer thread inside one write (inserting `held`) until the sender is used;
    /// the receiver answers once it is held.
    fn hold_writer(
        sqlite: &Arc<Sqlite>,
    ) -> (
        mpsc::Sender<()>,
        oneshot::Receiver<()>,
        tokio::task::JoinHandle<Result<u64, StoreError>>,
    ) {
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = oneshot::channel();
        let mut started = Some(started);
        let sqlite = Arc::clone(sqlite);
        let blocked = tokio::spawn(async move {
            sqlite
                .write(move |ex| {
                    if let Some(started) = started.take() {
                        let _ = started.send(());
                    }
                    let _ = held.recv();
                    now(async { ex.execute("INSERT INTO t (k, v) VALUES ('held', 0)", &[]).await })
                })
                .await
        });
        (release, running, blocked)
    }

    /// Holds the writer, queues `n` writes behind it (each still pending), runs `then`,
    /// releases the writer and checks that every write is answered: `n + 1` writes committed
    /// in one batch.
    async fn in_one_batch(sqlite: &Arc<Sqlite>, prefix: &str, n: i64, then: impl FnOnce()) {
        let (release, running, blocked) = hold_writer(sqlite);
        running.await.unwrap();
        let mut queued = Vec::new();
        for i in 0..n {
            let mut w = Box::pin(sqlite.write(insert(format!("{prefix}{i}"), i)));
            assert!(tokio::time::timeout(Duration::ZERO, &mut w).await.is_err());
            queued.push(w);
        }
        then();
        release.send(()).unwrap();
        assert_eq!(blocked.await.unwrap().unwrap(), 1);
        for w in queued {
            assert_eq!(w.await.unwrap(), 1);
        }
    }

    #[test]
    fn a_commits_answers_reach_their_thread_with_one_wake() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        runtime().block_on(async {
            deliver_answers_here();
            let inbox = Inbox::current().unwrap();
            let (_dir, sqlite) = store().await;
            // The writer is held inside one write while twenty more queue behind it; released,
            // it commits the twenty-one in one batch.
            let mut before = 0;
            in_one_batch(&sqlite, "q", 20, || before = inbox.wakes.load(Ordering::Relaxed)).await;
            let wakes = inbox.wakes.load(Ordering::Relaxed) - before;
            assert_eq!(wakes, 1, "21 answers of one commit woke the thread {wakes} times");
            assert_eq!(count(&sqlite).await, 21);
        });
        // The runtime that delivered is gone: a later runtime on this thread is answered
        // directly (it would wait forever for a task that no longer runs), a commit of several
        // answers too (a single answer goes directly whenever the task waits).
        let later = async {
            let (_dir, sqlite) = store().await;
            in_one_batch(&sqlite, "after", 3, || {}).await;
        };
        runtime().block_on(async {
            tokio::time::timeout(Duration::from_secs(10), later)
                .await
                .expect("every write answered");
        });
    }

    #[test]
    fn no_answer_waits_for_a_later_commit() {
        // Sixteen callers on one request thread, each writing in a loop: if a commit's
        // answers could miss the delivering task's wake, all sixteen would soon wait for a
        // commit that none of them can make.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            deliver_answers_here();
            let (_dir, sqlite) = store().await;
            let mut callers = Vec::new();
            for c in 0..16 {
                let sqlite = Arc::clone(&sqlite);
                callers.push(tokio::spawn(async move {
                    for i in 0..300 {
                        let write = sqlite.write(insert(format!("c{c}-{i}"), i));
                        tokio::time::timeout(Duration::from_secs(5), write)
                            .await
                            .expect("a write was answered")
                            .unwrap();
                    }
                }));
            }
            for caller in callers {
                caller.await.unwrap();
            }
            assert_eq!(count(&sqlite).await, 16 * 300);
        });
    }

    #[tokio::test]
    async fn a_rollback_or_a_panic_discards_only_that_write() {
        let (_dir, sqlite) = store().await;
        let rolled_back = sqlite.write(|ex| {
            now(async {
                ex.execute("INSERT INTO t (k, v) VALUES ('a', 1)", &[]).await?;
                ex.rollback();
                Ok("answered")
            })
        });
        let panicked = sqlite.write(|ex| -> Result<u64, StoreError> {
            let _ = now(async { ex.execute("INSERT INTO t (k, v) VALUES ('b', 2)", &[]).await });
            panic!("an operation that panics");
        });
        let kept = sqlite.write(insert("c".into(), 3));
        let (rolled_back, panicked, kept) = tokio::join!(rolled_back, panicked, kept);
        assert_eq!(rolled_back.unwrap(), "answered");
        assert!(matches!(panicked, Err(StoreError::Database(_))), "{panicked:?}");
        assert_eq!(kept.unwrap(), 1);
        assert_eq!(count(&sqlite).await, 1);
        // The writer thread is still there.
        assert_eq!(sqlite.write(insert("d".into(), 4)).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn the_first_write_of_a_batch_is_discarded_whole_and_alone() {
        discarded_whole_and_alone(false).await;
    }

    /// A write run inline ([`write_here_when_alone`]) is kept, discarded or failed exactly as
    /// the first write of a batch on the writer thread.
    #[tokio::test]
    async fn a_write_run_inline_is_discarded_whole_and_alone() {
        discarded_whole_and_alone(true).await;
    }

    /// The caller's thread opted in (`inline`) or not.
    async fn discarded_whole_and_alone(inline: bool) {
        // Each awaited on its own: each is the first (and only) write of its batch, run
        // without a savepoint, so a discarded one rolls back the whole transaction.
        let (_dir, sqlite) = store().await;
        if inline {
            write_here_when_alone(Arc::new(AtomicUsize::new(1)));
        }
        sqlite.write(insert("before".into(), 0)).await.unwrap();
        let rolled_back = sqlite
            .write(|ex| {
                now(async {
                    ex.execute("INSERT INTO t (k, v) VALUES ('a', 1)", &[]).await?;
                    ex.execute("INSERT INTO t (k, v) VALUES ('b', 2)", &[]).await?;
                    ex.rollback();
                    Ok("answered")
                })
            })
            .await;
        assert_eq!(rolled_back.unwrap(), "answered");
        let failed = sqlite
            .write(|ex| {
                now(async {
                    ex.execute("INSERT INTO t (k, v) VALUES ('c', 3)", &[]).await?;
                    ex.execute("INSERT INTO t (k, v) VALUES ('before', 4)", &[]).await
                })
            })
            .await;
        assert!(matches!(failed, Err(StoreError::Conflict(_))), "{failed:?}");
        let panicked = sqlite
            .write(|ex| -> Result<u64, StoreError> {
                let _ = now(async { ex.execute("INSERT INTO t (k, v) VALUES ('d', 5)", &[]).await });
                panic!("an operation that panics");
            })
            .await;
        assert!(matches!(panicked, Err(StoreError::Database(_))), "{panicked:?}");
        // Only the write before them, and the writer goes on.
        assert_eq!(count(&sqlite).await, 1);
        assert_eq!(sqlite.write(insert("after".into(), 6)).await.unwrap(), 1);
        assert_eq!(count(&sqlite).await, 2);
    }

    fn this_thread() -> Option<String> {
        std::thread::current().name().map(str::to_owned)
    }

    /// Holds the writer thread in a write handed over while a second request was in flight,
    /// waits `wait`, then, alone again (`requests` at one), writes from this thread: the write
    /// waits behind the held one, in its batch. Answers the thread it ran on.
    async fn behind_the_held_writer(
        sqlite: &Arc<Sqlite>,
        requests: &AtomicUsize,
        wait: Duration,
    ) -> Option<String> {
        requests.store(2, Ordering::SeqCst);
        let (release, running, blocked) = hold_writer(sqlite);
        running.await.unwrap();
        tokio::time::sleep(wait).await;
        requests.store(1, Ordering::SeqCst);
        let mut queued = Box::pin(sqlite.write(|_| Ok(this_thread())));
        assert!(tokio::time::timeout(Duration::ZERO, &mut queued).await.is_err());
        release.send(()).unwrap();
        assert_eq!(blocked.await.unwrap().unwrap(), 1);
        queued.await.unwrap()
    }

    #[tokio::test]
    async fn an_idle_store_writes_on_the_callers_thread_and_a_busy_one_on_its_writer() {
        let (_dir, sqlite) = store().await;
        // A thread that did not opt in hands every write to the writer thread.
        let ran_on = sqlite.write(|_| Ok(this_thread())).await.unwrap();
        assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
        let requests = Arc::new(AtomicUsize::new(1));
        write_here_when_alone(Arc::clone(&requests));
        // Alone: the write runs here, and is committed like any other.
        let ran_on = sqlite
            .write(|ex| {
                now(async { ex.execute("INSERT INTO t (k, v) VALUES ('here', 1)", &[]).await })?;
                Ok(this_thread())
            })
            .await
            .unwrap();
        assert_eq!(ran_on, this_thread());
        assert_eq!(count(&sqlite).await, 1);
        // Another request in flight: this thread has other work, the writer thread writes.
        requests.store(2, Ordering::SeqCst);
        let ran_on = sqlite.write(|_| Ok(this_thread())).await.unwrap();
        assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
        // Alone again, with a write queued: the next one waits behind it, in its batch.
        let ran_on = behind_the_held_writer(&sqlite, &requests, Duration::ZERO).await;
        assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
        // Answered, nothing queued, and a busy spell without writes handed over: inline again.
        tokio::time::sleep(BUSY_SPELL).await;
        assert_eq!(sqlite.write(|_| Ok(this_thread())).await.unwrap(), this_thread());
        // Closed: no write runs anywhere.
        sqlite.close().await;
        assert!(matches!(
            sqlite.write(|_| Ok(this_thread())).await,
            Err(StoreError::Unavailable(_))
        ));
    }

    /// Under load, the moments a server answers only one request come and go between the
    /// others' (about ten a second at 16 connections): a write run inline in such a moment
    /// holds the request thread, and every other connection's request, through its `fsync`
    /// (0.3 ms, up to 1.7 ms measured). A store that handed a write to its writer thread
    /// because its caller was not alone keeps doing so for a busy spell, and writes inline
    /// again only after a spell in which it handed none over.
    #[tokio::test]
    async fn a_store_just_busy_keeps_its_writes_on_its_writer_until_a_quiet_spell() {
        let (_dir, sqlite) = store().await;
        let requests = Arc::new(AtomicUsize::new(1));
        write_here_when_alone(Arc::clone(&requests));
        assert_eq!(sqlite.write(|_| Ok(this_thread())).await.unwrap(), this_thread());
        // Another request in flight: the writer thread writes.
        requests.store(2, Ordering::SeqCst);
        let ran_on = sqlite.write(|_| Ok(this_thread())).await.unwrap();
        assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
        // Alone for a moment, within the spell: still the writer thread, each time.
        requests.store(1, Ordering::SeqCst);
        for _ in 0..3 {
            let ran_on = sqlite.write(|_| Ok(this_thread())).await.unwrap();
            assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
        }
        // A spell with nothing handed over: inline again.
        tokio::time::sleep(BUSY_SPELL).await;
        assert_eq!(sqlite.write(|_| Ok(this_thread())).await.unwrap(), this_thread());
        // Busy again, with a write queued (the writer held by a write handed over while
        // another request was in flight, a spell ago): the spell starts over.
        let ran_on = behind_the_held_writer(&sqlite, &requests, BUSY_SPELL).await;
        assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
        let ran_on = sqlite.write(|_| Ok(this_thread())).await.unwrap();
        assert_eq!(ran_on.as_deref(), Some("warrant-sqlite-w"));
    }

    #[tokio::test]
    async fn a_write_lock_held_by_another_process_sends_the_write_to_the_writer_thread() {
        let (dir, sqlite) = store().await;
        write_here_when_alone(Arc::new(AtomicUsize::new(1)));
        let other = Connection::open(dir.path().join("t.db")).unwrap();
        other
            .execute_batch("BEGIN IMMEDIATE; INSERT INTO t (k, v) VALUES ('other', 0);")
            .unwrap();
        let mut write = Box::pin(sqlite.write(|ex| {
            now(async { ex.execute("INSERT INTO t (k, v) VALUES ('mine', 1)", &[]).await })?;
            Ok(this_thread())
        }));
        // The request thread did not wait for the lock: the write waits on the writer thread.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut write)
                .await
                .is_err()
        );
        other.execute_batch("COMMIT").unwrap();
        assert_eq!(write.await.unwrap().as_deref(), Some("warrant-sqlite-w"));
        assert_eq!(count(&sqlite).await, 2);
    }

    #[tokio::test]
    async fn a_write_whose_caller_went_away_still_commits() {
        let (_dir, sqlite) = store().await;
        let abandoned = sqlite.write(insert("gone".into(), 1));
        // Polled once (queued), then dropped.
        let _ = tokio::time::timeout(std::time::Duration::ZERO, abandoned).await;
        assert_eq!(sqlite.write(insert("next".into(), 2)).await.unwrap(), 1);
        assert_eq!(count(&sqlite).await, 2);
    }

    #[tokio::test]
    async fn a_closed_store_refuses_work() {
        let (_dir, sqlite) = store().await;
        sqlite.write(insert("x".into(), 1)).await.unwrap();
        sqlite.close().await;
        assert!(matches!(
            sqlite.write(insert("y".into(), 2)).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            sqlite
                .read(|ex| now(async { ex.execute("SELECT 1", &[]).await }))
                .await,
            Err(StoreError::Unavailable(_))
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_answers_overloaded_at_once_and_drains_after() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Arc::new(Sqlite::open(&dir.path().join("t.db"), 1, 2).unwrap());
        sqlite
            .write(|ex| {
                now(async {
                    ex.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)", &[])
                        .await
                })
            })
            .await
            .unwrap();
        // The writer thread is held inside one write; the reader inside one read.
        let (release_w, running_w, blocked_write) = hold_writer(&sqlite);
        let (release_r, held_r) = mpsc::channel::<()>();
        let (started_r, running_r) = oneshot::channel();
        let blocked_read = tokio::spawn({
            let sqlite = Arc::clone(&sqlite);
            async move {
                sqlite
                    .read(move |_| {
                        let _ = started_r.send(());
                        let _ = held_r.recv();
                        Ok(())
                    })
                    .await
            }
        });
        running_w.await.unwrap();
        running_r.await.unwrap();
        // Two more of each fill the queues (capacity 2)...
        let mut queued_writes = Vec::new();
        let mut queued_reads = Vec::new();
        for i in 0..2 {
            let mut w = Box::pin(sqlite.write(insert(format!("q{i}"), i)));
            assert!(tokio::time::timeout(Duration::ZERO, &mut w).await.is_err());
            queued_writes.push(w);
            let mut r = Box::pin(sqlite.read(|_| Ok(1_u8)));
            assert!(tokio::time::timeout(Duration::ZERO, &mut r).await.is_err());
            queued_reads.push(r);
        }
        // ...and the next is refused at once with the typed error.
        let refused = sqlite.write(insert("over".into(), 9)).await;
        assert!(matches!(refused, Err(StoreError::Overloaded(_))), "{refused:?}");
        let refused = sqlite.read(|_| Ok(1_u8)).await;
        assert!(matches!(refused, Err(StoreError::Overloaded(_))), "{refused:?}");
        // Released, everything queued completes and the queue takes work again.
        release_w.send(()).unwrap();
        release_r.send(()).unwrap();
        assert_eq!(blocked_write.await.unwrap().unwrap(), 1);
        blocked_read.await.unwrap().unwrap();
        for w in queued_writes {
            assert_eq!(w.await.unwrap(), 1);
        }
        for r in queued_reads {
            assert_eq!(r.await.unwrap(), 1);
        }
        assert_eq!(sqlite.write(insert("after".into(), 3)).await.unwrap(), 1);
        assert_eq!(count(&sqlite).await, 4);
    }

    #[tokio::test]
    async fn an_operation_runs_in_its_callers_span() {
        use tracing::Instrument as _;
        // A registry (global: the store threads are other threads) tracks each thread's span.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        let (_dir, sqlite) = store().await;
        let name = || tracing::Span::current().metadata().map(|m| m.name());
        let written = sqlite
            .write(move |_| Ok(name()))
            .instrument(tracing::info_span!("caller_span"))
            .await
            .unwrap();
        assert_eq!(written, Some("caller_span"));
        let read = sqlite
            .read(move |_| Ok(name()))
            .instrument(tracing::info_span!("reader_span"))
            .await
            .unwrap();
        assert_eq!(read, Some("reader_span"));
        // Without a span at the caller, none on the thread.
        assert_eq!(sqlite.read(move |_| Ok(name())).await.unwrap(), None);
    }

    #[test]
    fn placeholders_bind_by_number_in_any_order() {
        let dir = tempfile::tempdir().unwrap();
        let conn = connect(&dir.path().join("p.db"), false).unwrap();
        let prepared = Prepared::new(&conn);
        let mut ex = SqliteExec {
            prepared: (&prepared).into(),
            rollback: false,
        };
        let row = now(ex.fetch_optional(
            "SELECT $3 AS c, $1 AS a, $2 AS b, $3 AS c2",
            &args!["one", 2, "three"],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(row.text("a").unwrap(), "one");
        assert_eq!(row.int("b").unwrap(), 2);
        assert_eq!(row.text("c").unwrap(), "three");
        assert_eq!(row.text("c2").unwrap(), "three");
    }
}
