//! Backends for the conformance suite: a fresh SQLite data directory, or a fresh PostgreSQL
//! schema (so tests run in parallel), with a second pool on the same schema as a second node.

use std::sync::Arc;

use warrant_store::{DatabaseUrl, MemoryStore, SqlStore, Store, StoreOptions};

enum Nodes {
    Sql([Arc<SqlStore>; 2]),
    Memory(Arc<MemoryStore>),
}

/// The stores a test runs against: `node(0)` and `node(1)` share one database (on SQLite and in
/// memory they are the same store: one process owns the data).
pub struct Backend {
    nodes: Nodes,
    cleanup: Option<warrant_store::testing::TestDatabase>,
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
        if let Some(db) = self.cleanup {
            db.drop_schema().await;
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

/// A PostgreSQL backend in its own schema with two pools as two nodes, or `None` when the
/// server is unreachable and not required.
pub async fn postgres() -> Option<Backend> {
    let db = warrant_store::testing::TestDatabase::postgres().await.unwrap()?;
    let a = Arc::new(db.open().await.unwrap());
    let b = Arc::new(db.open().await.unwrap());
    Some(Backend {
        nodes: Nodes::Sql([a, b]),
        cleanup: Some(db),
        _dir: None,
    })
}
