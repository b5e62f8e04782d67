//! Test databases for the conformance suite and the integration tests of other crates: a
//! fresh PostgreSQL schema per test, or a notice that PostgreSQL tests are skipped.
//!
//! `WARRANT_TEST_POSTGRES_URL` names the server (default
//! `postgres://postgres@127.0.0.1:5432/test`); with `WARRANT_REQUIRE_POSTGRES=1` (as `.ci/run`
//! sets) an unreachable server is a failure instead of a skip.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::Connection;
use warrant_core::store::StoreError;

use crate::{DatabaseUrl, SqlStore, StoreOptions};

/// The PostgreSQL URL tests use.
pub fn postgres_url() -> String {
    std::env::var("WARRANT_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Whether an unreachable PostgreSQL fails the tests.
pub fn postgres_required() -> bool {
    std::env::var("WARRANT_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

/// A PostgreSQL schema of its own for one test.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    schema: String,
}

/// Why no test database is available.
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL is required (WARRANT_REQUIRE_POSTGRES=1) but unreachable at {url}: {why}")]
pub struct Unreachable {
    url: String,
    why: String,
}

impl TestDatabase {
    /// A fresh schema, `Ok(None)` (after a notice on the real stderr, which the test harness
    /// does not capture) when the server is unreachable and not required.
    ///
    /// # Errors
    /// [`Unreachable`] when the server is required but unreachable.
    pub async fn postgres() -> Result<Option<TestDatabase>, Unreachable> {
        let url = postgres_url();
        let attempt = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url)).await;
        let why = match attempt {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                let schema = format!("warrant_t_{}", hex::encode(rand::random::<[u8; 6]>()));
                return Ok(Some(TestDatabase { url, schema }));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connection timed out".to_owned(),
        };
        if postgres_required() {
            return Err(Unreachable { url, why });
        }
        static NOTICE: OnceLock<()> = OnceLock::new();
        NOTICE.get_or_init(|| {
            let _ = writeln!(
                std::io::stderr(),
                "\nSKIPPED: PostgreSQL tests — server unreachable at {url} ({why}).\n\
                 Set WARRANT_TEST_POSTGRES_URL, or WARRANT_REQUIRE_POSTGRES=1 to make this an error.\n"
            );
        });
        Ok(None)
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// This test's schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Opens a store (a "node") on this schema; call it twice for two nodes.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn open(&self) -> Result<SqlStore, StoreError> {
        let options = StoreOptions {
            postgres_schema: Some(self.schema.clone()),
            max_connections: 20,
            ..StoreOptions::default()
        };
        SqlStore::open(&DatabaseUrl::Postgres(self.url.clone()), &options).await
    }

    /// Drops the schema.
    pub async fn drop_schema(self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.url).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                self.schema
            )))
            .execute(&mut conn)
            .await;
        }
    }
}
