//! The decision pipeline and the runtime over a chosen store backend, with test tools bound
//! to the loopback fault server, an SMTP sink and a command root.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use time::Duration;
use warrant_core::Contract;
use warrant_core::authority::Principal;
use warrant_core::budget::BudgetConfig;
use warrant_core::decision::{Allowed, Decision, Outcome};
use warrant_core::guard::{AllowList, Guards};
use warrant_core::pipeline::{Authority, Call, Settings};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::store::Store;
use warrant_policy::{CedarEngine, PolicySource};
use warrant_runtime::adapters::{AdapterConfig, RelaySecurity, SmtpRelay};
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::retry::RetrySettings;
use warrant_runtime::{Adapters, CredentialSpec, Execution, Runtime, RuntimeSettings, Secrets};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions, SystemEnv};

use crate::faults::{self, Faults};
use crate::smtp::{self, Sink};

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Sqlite,
    Postgres,
}

pub struct Harness {
    pub authority: Authority,
    pub runtime: Runtime,
    pub store: Arc<dyn Store>,
    /// The same store, as itself (to close it under a running call).
    pub sql: Arc<SqlStore>,
    pub faults: Arc<Faults>,
    pub faults_addr: SocketAddr,
    pub sink: Arc<Sink>,
    pub tools: PathBuf,
    cleanup: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

fn input(extra: &str) -> String {
    format!(
        r#"{{ "type": "object", "additionalProperties": false, "required": ["mode"],
             "properties": {{ "mode": {{ "type": "string", "maxLength": 32 }},
                             "n": {{ "type": "integer", "minimum": 0, "maximum": 1000000 }} {extra} }} }}"#
    )
}

const CREDIT_OUT: &str = r#"{ "type": "object", "additionalProperties": false, "required": ["credit_id", "status"],
    "properties": { "credit_id": { "type": "string", "maxLength": 64 }, "status": { "enum": ["applied", "pending"] } } }"#;

/// The test tools, bound to the fault server at `addr`.
fn contracts(addr: SocketAddr, tools: &std::path::Path) -> Vec<Contract> {
    let base = format!("http://{addr}");
    let write = |name: &str, honoured: bool, max: u8, binding: Value, cost: u64| {
        let doc = json!({
            "name": name, "version": 1, "description": "a test tool", "owner": "test",
            "effect": "write", "scopes": ["faults:write"], "approval": "none",
            "idempotency": {"honoured": honoured, "retention": "1h"},
            "retry": {"max_attempts": max},
            "cost": {"per_call": cost},
            "input": serde_json::from_str::<Value>(&input("")).unwrap(),
            "output": serde_json::from_str::<Value>(CREDIT_OUT).unwrap(),
            "adapter": binding,
        });
        Contract::from_document(doc).unwrap()
    };
    let status = format!("{base}/status/{{operation_id}}");
    let mut out = vec![
        write(
            "credit",
            true,
            3,
            json!({"kind": "http", "url": format!("{base}/honoured"), "timeout": "300ms",
                   "status_url": status, "credential": "CREDIT_TOKEN"}),
            2,
        ),
        write(
            "note",
            false,
            3,
            json!({"kind": "http", "url": format!("{base}/plain"), "timeout": "300ms", "status_url": status}),
            1,
        ),
        write(
            "blind",
            false,
            3,
            json!({"kind": "http", "url": format!("{base}/plain"), "timeout": "300ms"}),
            1,
        ),
        write(
            "refused",
            true,
            2,
            json!({"kind": "http", "url": "http://127.0.0.1:9/nothing", "timeout": "300ms"}),
            1,
        ),
        write(
            "script",
            true,
            2,
            json!({"kind": "command", "program": tools.join("tool.sh").to_str().unwrap(), "timeout": "2s"}),
            1,
        ),
    ];
    // A write whose key is kept one second.
    let brief = json!({
        "name": "brief", "version": 1, "description": "a write with a short retention", "owner": "test",
        "effect": "write", "scopes": ["faults:write"], "approval": "none",
        "idempotency": {"honoured": false, "retention": "1s"},
        "retry": {"max_attempts": 1},
        "input": serde_json::from_str::<Value>(&input("")).unwrap(),
        "output": serde_json::from_str::<Value>(CREDIT_OUT).unwrap(),
        "adapter": {"kind": "http", "url": format!("{base}/plain"), "timeout": "300ms", "status_url": status},
    });
    out.push(Contract::from_document(brief).unwrap());
    // A write a reviewer approves, call by call.
    let gated = json!({
        "name": "gated", "version": 1, "description": "an approved write", "owner": "test",
        "effect": "write", "scopes": ["faults:write"], "approval": "per_call",
        "idempotency": {"honoured": false, "retention": "1h"},
        "retry": {"max_attempts": 3},
        "cost": {"per_call": 1},
        "input": serde_json::from_str::<Value>(&input("")).unwrap(),
        "output": serde_json::from_str::<Value>(CREDIT_OUT).unwrap(),
        "adapter": {"kind": "http", "url": format!("{base}/plain"), "timeout": "300ms", "status_url": status},
    });
    out.push(Contract::from_document(gated).unwrap());
    let read = json!({
        "name": "lookup", "version": 1, "description": "a read", "owner": "test",
        "effect": "read", "scopes": ["faults:read"], "approval": "none",
        "retry": {"max_attempts": 2},
        "input": serde_json::from_str::<Value>(&input("")).unwrap(),
        "output": serde_json::from_str::<Value>(CREDIT_OUT).unwrap(),
        "adapter": {"kind": "http", "url": format!("{base}/honoured"), "timeout": "300ms"},
    });
    out.push(Contract::from_document(read).unwrap());
    let fetch = json!({
        "name": "fetch_order", "version": 1, "description": "a fetch", "owner": "test",
        "effect": "read", "scopes": ["faults:read"], "approval": "none",
        "input": {"type": "object", "additionalProperties": false, "required": ["name"],
                  "properties": {"name": {"type": "string", "maxLength": 64}}},
        "output": {"type": "object", "additionalProperties": false,
                   "required": ["order_id", "status", "total_cents", "currency"],
                   "properties": {"order_id": {"type": "string", "maxLength": 36},
                                  "status": {"type": "string", "maxLength": 16},
                                  "total_cents": {"type": "integer", "minimum": 0, "maximum": 100000000},
                                  "currency": {"type": "string", "maxLength": 3}}},
        "adapter": {"kind": "structured_data_fetch", "url": format!("{base}/json/{{name}}")},
    });
    out.push(Contract::from_document(fetch).unwrap());
    // A fetch of a URL the model chooses, with a credential pinned to the fault server's origin.
    let fetch_any = json!({
        "name": "fetch_any", "version": 1, "description": "a fetch of any URL", "owner": "test",
        "effect": "read", "scopes": ["faults:read"], "approval": "none",
        "input": {"type": "object", "additionalProperties": false, "required": ["url"],
                  "properties": {"url": {"type": "string", "maxLength": 256}}},
        "output": {"type": "object", "additionalProperties": false,
                   "required": ["order_id", "status", "total_cents", "currency"],
                   "properties": {"order_id": {"type": "string", "maxLength": 36},
                                  "status": {"type": "string", "maxLength": 16},
                                  "total_cents": {"type": "integer", "minimum": 0, "maximum": 100000000},
                                  "currency": {"type": "string", "maxLength": 3}}},
        "adapter": {"kind": "structured_data_fetch", "url_argument": "url", "credential": "FETCH_TOKEN"},
    });
    out.push(Contract::from_document(fetch_any).unwrap());
    let mail = json!({
        "name": "mail", "version": 1, "description": "send mail", "owner": "test",
        "effect": "irreversible", "scopes": ["email:send"], "approval": "none",
        "idempotency": {"honoured": false, "retention": "1h"},
        "retry": {"max_attempts": 1},
        "input": {"type": "object", "additionalProperties": false, "required": ["to", "subject", "body"],
            "properties": {
                "to": {"type": "array", "minItems": 1, "maxItems": 10, "x-warrant-allowlist": "email_recipients",
                       "items": {"type": "string", "format": "email", "maxLength": 254}},
                "cc": {"type": "array", "maxItems": 10, "x-warrant-allowlist": "email_recipients",
                       "items": {"type": "string", "format": "email", "maxLength": 254}},
                "bcc": {"type": "array", "maxItems": 10, "x-warrant-allowlist": "email_recipients",
                       "items": {"type": "string", "format": "email", "maxLength": 254}},
                "subject": {"type": "string", "minLength": 1, "maxLength": 200},
                "body": {"type": "string", "minLength": 1, "maxLength": 20000}}},
        "output": {"type": "object", "additionalProperties": false, "required": ["message_id", "status"],
            "properties": {"message_id": {"type": "string", "maxLength": 256}, "status": {"enum": ["sent", "queued"]}}},
        "adapter": {"kind": "send_email", "from": "support@acme.example"},
    });
    out.push(Contract::from_document(mail).unwrap());
    out
}

/// The operator's credentials of the test tools: each granted to one tool and pinned to the
/// fault server's origin.
pub fn secrets(addr: SocketAddr) -> Secrets {
    let origin = format!("http://{addr}");
    let spec = |value: &str, tool: &str| {
        CredentialSpec::new(value)
            .for_tools([tool])
            .unwrap()
            .to_origins([origin.as_str()])
            .unwrap()
    };
    Secrets::default()
        .with("CREDIT_TOKEN", spec("tok-credit-secret", "credit"))
        .with("FETCH_TOKEN", spec("tok-fetch-secret", "fetch_any"))
}

const POLICY: &str = r#"permit (principal, action, resource);"#;

/// The script the `script` tool runs: behaviour chosen by `mode`.
const TOOL_SH: &str = r#"#!/bin/sh
input=$(cat)
case "$input" in
  *'"mode":"ok"'*) printf '{"credit_id":"cr_sh","status":"applied"}' ;;
  *'"mode":"env"'*) env | sort > "$(dirname "$0")/env.txt"; printf '{"credit_id":"cr_env","status":"applied"}' ;;
  *'"mode":"garbage"'*) printf 'not json' ;;
  *'"mode":"sleep"'*) sh -c 'echo $$ > "$0/grandchild.pid"; exec sleep 30' "$(dirname "$0")" & sleep 30 ;;
  *'"mode":"exit'*) code=$(printf '%s' "$input" | sed 's/.*"mode":"exit\([0-9]*\)".*/\1/'); exit "$code" ;;
  *) exit 1 ;;
esac
"#;

impl Harness {
    pub async fn new(kind: Kind) -> Option<Harness> {
        let dir = tempfile::tempdir().unwrap();
        let (sql, cleanup): (Arc<SqlStore>, _) = match kind {
            Kind::Sqlite => {
                let store = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
                    .await
                    .unwrap();
                (Arc::new(store), None)
            }
            Kind::Postgres => {
                let db = TestDatabase::postgres().await.unwrap()?;
                (Arc::new(db.open().await.unwrap()), Some(db))
            }
        };
        let store: Arc<dyn Store> = sql.clone();
        let (addr, faults) = faults::start().await;
        let (smtp_addr, sink) = smtp::start().await;
        let tools = dir.path().join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        let script = tools.join("tool.sh");
        std::fs::write(&script, TOOL_SH).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

        let env = Arc::new(SystemEnv);
        let now = time::OffsetDateTime::now_utc();
        let registry = Arc::new(Registry::new(store.clone(), Duration::seconds(5)));
        let contracts = contracts(addr, &tools);
        for c in &contracts {
            registry.register(c.clone(), now).await.unwrap();
        }
        let contracts: Vec<Arc<Contract>> = contracts.into_iter().map(Arc::new).collect();
        let policy =
            Arc::new(CedarEngine::new(&contracts, &[PolicySource::new("test.cedar", POLICY)]).unwrap());
        let mut guards = Guards::new();
        guards.set(
            "acme",
            "email_recipients",
            AllowList::new(["alice@customer.example", "*@partner.example"]).unwrap(),
        );
        let authority = Authority::new(
            store.clone(),
            registry.clone(),
            policy,
            Arc::new(guards),
            BudgetConfig::default(),
            RedactionKey::new(vec![9; 32]).unwrap(),
            env.clone(),
            Settings::default(),
        );
        let client = SafeClient::new(NetPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            ..NetPolicy::default()
        });
        let adapters = Arc::new(Adapters::new(AdapterConfig {
            client,
            secrets: secrets(addr),
            smtp: Some(SmtpRelay {
                host: "127.0.0.1".into(),
                port: smtp_addr.port(),
                security: RelaySecurity::Plain,
                login: None,
            }),
            command_roots: vec![tools.clone()],
            model: None,
        }));
        let settings = RuntimeSettings {
            retry: RetrySettings {
                base: std::time::Duration::from_millis(10),
                cap: std::time::Duration::from_millis(100),
                deadline: std::time::Duration::from_secs(5),
            },
            stale_after: std::time::Duration::from_secs(10),
            ..RuntimeSettings::default()
        };
        let runtime = Runtime::new(store.clone(), registry, env, adapters, settings);
        Some(Harness {
            authority,
            runtime,
            store,
            sql,
            faults,
            faults_addr: addr,
            sink,
            tools,
            cleanup,
            _dir: dir,
        })
    }

    /// Decides and, when allowed, executes. Panics on anything but `allow`.
    pub async fn run(&self, tool: &str, arguments: Value, key: Option<&str>) -> Execution {
        self.try_run(tool, arguments, key)
            .await
            .unwrap_or_else(|d| panic!("not allowed: {d:?}"))
    }

    pub async fn try_run(
        &self,
        tool: &str,
        arguments: Value,
        key: Option<&str>,
    ) -> Result<Execution, Decision> {
        let mut proposal = json!({"tool": tool, "version": 1, "arguments": arguments});
        if let Some(key) = key {
            proposal["idempotency_key"] = json!(key);
        }
        let allowed = self.allow(&proposal).await?;
        Ok(self.runtime.execute(allowed).await.unwrap())
    }

    /// The decision on `proposal` by the test agent: the `Allowed`, or what was decided instead.
    pub async fn allow(&self, proposal: &Value) -> Result<Box<Allowed>, Decision> {
        let bytes = proposal.to_string();
        let decided = self
            .authority
            .decide(
                &agent(),
                &Call {
                    bytes: bytes.as_bytes(),
                    trace_id: "trace-test",
                    ..Call::default()
                },
            )
            .await
            .unwrap();
        match decided.decision {
            Decision::Allow(allowed) => Ok(allowed),
            other => Err(other),
        }
    }

    pub async fn finish(self) {
        if let Some(db) = self.cleanup {
            db.drop_schema().await;
        }
    }
}

pub fn agent() -> Principal {
    Principal::new(
        "agent-7",
        "acme",
        ["faults:write", "faults:read", "email:send"].map(str::to_owned),
    )
    .unwrap()
    .with_roles(["agent".to_owned()])
    .unwrap()
}

pub fn committed(e: &Execution) -> &Value {
    match &e.result {
        Ok(Outcome::Committed(v)) => v,
        other => panic!("expected committed, got {other:?}"),
    }
}
