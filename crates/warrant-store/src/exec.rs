//! The one executor interface every SQL statement of the store goes through.
//!
//! Each store operation is written once, as an `async fn` generic over [`Exec`], and runs on
//! either backend: PostgreSQL through sqlx ([`PgTx`], [`PgRead`]), SQLite through rusqlite on
//! the store's own threads (`sqlite.rs`). Values are bound as [`Arg`]s, always as parameters;
//! statements use `$1, $2, …` placeholders, which both backends bind by number.

use std::future::Future;

use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row, Transaction};
use warrant_core::store::StoreError;

use crate::error::Db;

/// One bound parameter. NULLs are typed so PostgreSQL can infer the column type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A 64-bit integer.
    Int(i64),
    /// Text.
    Text(&'a str),
    /// A NULL integer.
    NullInt,
    /// A NULL text.
    NullText,
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        v.map_or(Arg::NullInt, Arg::Int)
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        v.map_or(Arg::NullText, Arg::Text)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(v: &'a Option<String>) -> Self {
        v.as_deref().map_or(Arg::NullText, Arg::Text)
    }
}

/// `args![a, b, …]`: a parameter list, each value converted with `Arg::from`.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        [$($crate::exec::Arg::from($value)),*]
    };
}
pub(crate) use args;

/// Uniform, typed column access for the rows of both backends.
pub(crate) trait RowExt {
    fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError>;
    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError>;

    fn text(&self, column: &str) -> Result<String, StoreError> {
        self.opt_text(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("`{column}` is NULL")))
    }

    fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.opt_int(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("`{column}` is NULL")))
    }
}

/// Runs statements: a transaction (writes) or a read connection (reads).
///
/// No `Send` bound on the trait or its futures: SQLite's runs on the thread that owns its
/// connection, holding statements that borrow it (`sqlite::Prepared`), and never leaves that
/// thread; PostgreSQL's futures are `Send`, which callers see through the concrete types.
pub(crate) trait Exec {
    /// The row type the backend returns.
    type Row: RowExt + Send;

    /// Runs a statement and answers the number of rows it changed.
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> impl Future<Output = Result<u64, StoreError>>;

    /// Runs a query and answers its first row, if any.
    fn fetch_optional(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Option<Self::Row>, StoreError>>;

    /// Runs a query and answers all its rows.
    fn fetch_all(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Vec<Self::Row>, StoreError>>;

    /// Discards the transaction's changes when the operation returns (instead of committing
    /// them); the operation's answer is still returned. A no-op on read connections.
    fn rollback(&mut self);
}

/// A sqlx query for PostgreSQL with `args` bound in order.
fn pg_query<'q>(sql: &'q str, args: &[Arg<'q>]) -> Query<'q, Postgres, PgArguments> {
    // Every statement of the store is built from fixed text in this crate; values only ever
    // arrive as bound parameters.
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for arg in args {
        query = match *arg {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
            Arg::NullInt => query.bind(None::<i64>),
            Arg::NullText => query.bind(None::<&str>),
        };
    }
    query
}

/// A PostgreSQL write transaction.
pub(crate) struct PgTx {
    tx: Transaction<'static, Postgres>,
    rollback: bool,
}

impl PgTx {
    /// Opens a transaction.
    pub(crate) async fn begin(pool: &PgPool) -> Result<PgTx, StoreError> {
        Ok(PgTx {
            tx: pool.begin().await.db()?,
            rollback: false,
        })
    }

    /// Commits when the operation succeeded (and did not ask for a rollback), rolls back
    /// otherwise, and answers the operation's result.
    pub(crate) async fn finish<R>(self, result: Result<R, StoreError>) -> Result<R, StoreError> {
        match (&result, self.rollback) {
            (Ok(_), false) => self.tx.commit().await.db()?,
            _ => self.tx.rollback().await.db()?,
        }
        result
    }
}

impl Exec for PgTx {
    type Row = PgRow;

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        Ok(pg_query(sql, args)
            .execute(&mut *self.tx)
            .await
            .db()?
            .rows_affected())
    }

    async fn fetch_optional(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<PgRow>, StoreError> {
        pg_query(sql, args).fetch_optional(&mut *self.tx).await.db()
    }

    async fn fetch_all(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<PgRow>, StoreError> {
        pg_query(sql, args).fetch_all(&mut *self.tx).await.db()
    }

    fn rollback(&mut self) {
        self.rollback = true;
    }
}

/// PostgreSQL reads, straight on the pool.
pub(crate) struct PgRead<'p>(pub(crate) &'p PgPool);

impl Exec for PgRead<'_> {
    type Row = PgRow;

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        Ok(pg_query(sql, args).execute(self.0).await.db()?.rows_affected())
    }

    async fn fetch_optional(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<PgRow>, StoreError> {
        pg_query(sql, args).fetch_optional(self.0).await.db()
    }

    async fn fetch_all(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<PgRow>, StoreError> {
        pg_query(sql, args).fetch_all(self.0).await.db()
    }

    fn rollback(&mut self) {}
}

impl RowExt for PgRow {
    fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        self.try_get::<Option<String>, _>(column).db()
    }
    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.try_get::<Option<i64>, _>(column).db()
    }
}
