//! Backends for the conformance suite: a fresh SQLite data directory, or a fresh PostgreSQL
//! schema (so tests run in parallel), with a second pool on the same schema as a second node.

use std::io::Write;
use std::sync::{Arc, OnceLock};

use warrant_store::{DatabaseUrl, MemoryStore, SqlStore, Store, StoreOptions};

enum Nodes {
    Sql([Arc<SqlStore>; 2]),
    Memory(Arc<MemoryStore>),
}

/// The stores a test runs against: `node(0)` and `node(1)` share one database (on SQLite and in
/// memory they are the same store: one process owns the data).
pub struct Backend {
    nodes: Nodes,
    cleanup: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    pub fn store(&self) -> Arc<dyn Store> {
        self.node(0)
    }

    pub fn node(&self, i: usize) -> Arc<dyn Store> {
        match &self.nodes {
            Nodes::Sql(nodes) => nodes[i % 2].clone(),
            Nodes::Memory(store) => store.clone(),
        }
    }

    /// Closes every connection: later calls must fail with `Unavailable`.
    pub async fn close(&self) {
        match &self.nodes {
            Nodes::Sql(nodes) => {
                for node in nodes {
                    node.close().await;
                }
            }
            Nodes::Memory(store) => store.close(),
        }
    }

    pub async fn finish(self) {
        self.close().await;
        if let Some((url, schema)) = self.cleanup {
            if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE"
                )))
                .execute(&mut conn)
                .await;
            }
        }
    }
}

pub async fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
            .await
            .unwrap(),
    );
    Backend {
        nodes: Nodes::Sql([store.clone(), store]),
        cleanup: None,
        _dir: Some(dir),
    }
}

pub async fn memory() -> Backend {
    Backend {
        nodes: Nodes::Memory(Arc::new(MemoryStore::new())),
        cleanup: None,
        _dir: None,
    }
}

fn postgres_url() -> String {
    std::env::var("WARRANT_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn postgres_required() -> bool {
    std::env::var("WARRANT_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

/// A PostgreSQL backend in its own schema, or `None` (with a notice that is not captured by the
/// test harness) when the server is unreachable and not required.
pub async fn postgres() -> Option<Backend> {
    let url = postgres_url();
    let reachable = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        <sqlx::PgConnection as sqlx::Connection>::connect(&url),
    )
    .await;
    match reachable {
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
        }
        failure => {
            let why = match failure {
                Ok(Err(e)) => e.to_string(),
                _ => "connection timed out".to_owned(),
            };
            if postgres_required() {
                panic!("PostgreSQL is required (WARRANT_REQUIRE_POSTGRES=1) but unreachable at {url}: {why}");
            }
            static NOTICE: OnceLock<()> = OnceLock::new();
            NOTICE.get_or_init(|| {
                // Written to the real stderr, not through the captured `eprintln!`.
                let _ = writeln!(
                    std::io::stderr(),
                    "\nSKIPPED: PostgreSQL conformance tests — server unreachable at {url} ({why}).\n\
                     Set WARRANT_TEST_POSTGRES_URL, or WARRANT_REQUIRE_POSTGRES=1 to make this an error.\n"
                );
            });
            return None;
        }
    }
    let schema = format!("warrant_t_{}", hex::encode(rand::random::<[u8; 6]>()));
    let options = StoreOptions {
        postgres_schema: Some(schema.clone()),
        max_connections: 20,
        ..StoreOptions::default()
    };
    let db = DatabaseUrl::Postgres(url.clone());
    let a = Arc::new(SqlStore::open(&db, &options).await.unwrap());
    let b = Arc::new(SqlStore::open(&db, &options).await.unwrap());
    Some(Backend {
        nodes: Nodes::Sql([a, b]),
        cleanup: Some((url, schema)),
        _dir: None,
    })
}
