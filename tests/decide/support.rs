//! A complete pipeline over a chosen store backend, with the example contracts and policies,
//! a test contract with a tiny budget, a settable clock and sequential ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use time::macros::datetime;
use time::{Duration, OffsetDateTime};
use warrant_core::Contract;
use warrant_core::authority::Principal;
use warrant_core::budget::BudgetConfig;
use warrant_core::contract::DocumentFormat;
use warrant_core::env::Env;
use warrant_core::guard::{AllowList, Guards};
use warrant_core::pipeline::{Authority, Call, Decided, Settings};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::store::Store;
use warrant_policy::{CedarEngine, PolicySource};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, MemoryStore, SqlStore, StoreOptions};

pub const T0: OffsetDateTime = datetime!(2026-11-29 12:00 UTC);

pub struct TestEnv {
    now: Mutex<OffsetDateTime>,
    next: AtomicU64,
}

impl TestEnv {
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap() += by;
    }
}

impl Env for TestEnv {
    fn now(&self) -> OffsetDateTime {
        *self.now.lock().unwrap()
    }

    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}_{:08}", self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// A read-only test tool with a budget of two calls per day.
const PING: &str = r#"
name: ping
version: 1
description: Answer pong; allowed twice a day.
owner: test
effect: read
scopes: [ping:read]
budget: { calls_per_day: 2 }
input: { type: object, additionalProperties: false, properties: { n: { type: integer, minimum: 0, maximum: 100 } } }
output: { type: object, additionalProperties: false, properties: {} }
"#;

const PING_POLICY: &str = r#"
@id("test.ping")
permit (principal, action in Warrant::Action::"ping", resource);
"#;

pub struct Harness {
    pub authority: Authority,
    pub store: Arc<dyn Store>,
    pub env: Arc<TestEnv>,
    cleanup: Option<TestDatabase>,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Memory,
    Sqlite,
    Postgres,
}

fn contract(text: &str) -> Contract {
    Contract::from_text(text, DocumentFormat::Yaml).unwrap()
}

pub fn example(name: &str) -> Contract {
    let path = format!("{}/examples/contracts/{name}.v1.yaml", env!("CARGO_MANIFEST_DIR"));
    contract(&std::fs::read_to_string(path).unwrap())
}

impl Harness {
    /// `None` when the backend is PostgreSQL and the server is unreachable (and not required).
    pub async fn new(kind: Kind) -> Option<Harness> {
        let (store, cleanup, dir): (Arc<dyn Store>, _, _) = match kind {
            Kind::Memory => (Arc::new(MemoryStore::new()), None, None),
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let store = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
                    .await
                    .unwrap();
                (Arc::new(store), None, Some(dir))
            }
            Kind::Postgres => {
                let db = TestDatabase::postgres().await.unwrap()?;
                (Arc::new(db.open().await.unwrap()), Some(db), None)
            }
        };
        Some(Harness::over(store, cleanup, dir).await)
    }

    async fn over(
        store: Arc<dyn Store>,
        cleanup: Option<TestDatabase>,
        dir: Option<tempfile::TempDir>,
    ) -> Harness {
        let env = Arc::new(TestEnv {
            now: Mutex::new(T0),
            next: AtomicU64::new(1),
        });
        let registry = Arc::new(Registry::new(store.clone(), Duration::seconds(5)));
        let contracts = [
            example("create_support_credit"),
            example("send_email"),
            example("lookup_order"),
            contract(PING),
        ];
        for c in &contracts {
            registry.register(c.clone(), T0).await.unwrap();
        }
        let contracts: Vec<Arc<Contract>> = contracts.into_iter().map(Arc::new).collect();
        let mut sources = Vec::new();
        for file in ["support.cedar", "orders.cedar", "email.cedar", "guards.cedar"] {
            let path = format!("{}/examples/policies/{file}", env!("CARGO_MANIFEST_DIR"));
            if let Ok(text) = std::fs::read_to_string(path) {
                sources.push(PolicySource::new(file, text));
            }
        }
        sources.push(PolicySource::new("test.cedar", PING_POLICY));
        let policy = Arc::new(CedarEngine::new(&contracts, &sources).unwrap());
        let mut guards = Guards::new();
        guards.set(
            "acme",
            "email_recipients",
            AllowList::new(["alice@customer.example", "*@partner.example"]).unwrap(),
        );
        guards.set(
            "globex",
            "email_recipients",
            AllowList::new(["*@globex.example"]).unwrap(),
        );
        let authority = Authority::new(
            store.clone(),
            registry,
            policy,
            Arc::new(guards),
            BudgetConfig::default(),
            RedactionKey::new(vec![9; 32]).unwrap(),
            env.clone(),
            Settings::default(),
        );
        Harness {
            authority,
            store,
            env,
            cleanup,
            _dir: dir,
        }
    }

    pub async fn decide(&self, principal: &Principal, proposal: &Value) -> Decided {
        self.decide_bytes(principal, proposal.to_string().as_bytes())
            .await
    }

    pub async fn decide_bytes(&self, principal: &Principal, bytes: &[u8]) -> Decided {
        self.authority
            .decide(
                principal,
                &Call {
                    bytes,
                    trace_id: "trace-test",
                    ..Call::default()
                },
            )
            .await
            .unwrap()
    }

    pub async fn finish(self) {
        if let Some(db) = self.cleanup {
            db.drop_schema().await;
        }
    }
}

pub fn principal(id: &str, tenant: &str, grants: &[&str], roles: &[&str]) -> Principal {
    Principal::new(id, tenant, grants.iter().map(|g| (*g).to_owned()))
        .unwrap()
        .with_roles(roles.iter().map(|r| (*r).to_owned()))
        .unwrap()
}

/// An operator of `tenant` holding every example scope.
/// Tells the node that the counter `key` of `allowed` has no room, as the runtime does when the
/// write-ahead commit finds it exhausted.
pub fn note_exhausted(h: &Harness, allowed: &warrant_core::decision::Allowed, key: &str) {
    let counter = allowed
        .claims()
        .reservations
        .iter()
        .find(|r| r.key == key)
        .unwrap();
    h.authority.note_exhausted("acme", counter);
}

pub fn operator(tenant: &str) -> Principal {
    principal(
        "agent-7",
        tenant,
        &["support:credits:write", "email:send", "orders:read", "ping:read"],
        &["operator", "agent"],
    )
}

pub fn supervisor(tenant: &str) -> Principal {
    principal(
        "supervisor-1",
        tenant,
        &["support:credits:write"],
        &["supervisor"],
    )
}

pub fn credit(amount: i64, key: &str) -> Value {
    json!({
        "tool": "create_support_credit", "version": 1, "idempotency_key": key,
        "arguments": {"customer_id": "cus_8f3k2m9q", "amount_cents": amount, "reason": "duplicate charge"}
    })
}
