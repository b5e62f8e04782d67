//! Reviewer notifications through the event outbox, on SQLite and PostgreSQL: a call held for
//! review commits its `approval.requested` event with the approval request; the event worker
//! emails the tenant's reviewers through the operator's relay (a real SMTP receiver on
//! loopback) once, with the console link and never the arguments; a tenant without reviewers
//! is told nothing; a relay that is down leaves the event to be retried.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

#[path = "../../warrant-runtime/tests/runtime/smtp.rs"]
mod smtp;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::records::{EVENT_JOB, NewApiKey};
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::{AdapterConfig, RelaySecurity, SmtpRelay};
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{Dispatched, OwnedCall, RuntimeSettings, Secrets};
use warrant_server::events::{ReviewMail, deliver_due};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::testing::TestDatabase;
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

const CREDIT: &str = "name: credit\nversion: 1\ndescription: Credit.\nowner: t\neffect: write\n\
scopes: [credits:write]\napproval: per_call\nidempotency: { honoured: true, retention: 1h }\n\
input:\n  type: object\n  additionalProperties: false\n  required: [customer_id]\n  properties:\n    \
customer_id: { type: string, maxLength: 36 }\noutput:\n  type: object\n  additionalProperties: false\n  \
properties: {}\nadapter: { kind: http, url: \"http://127.0.0.1:9/credit\" }\n";

async fn gateway(store: Arc<dyn Store>, dir: &std::path::Path, relay_port: u16) -> Gateway {
    std::fs::write(dir.join("credit.yaml"), CREDIT).unwrap();
    Gateway::start(GatewayConfig {
        store,
        contracts_dir: Some(dir.to_owned()),
        policies: vec![PolicySource::new(
            "all.cedar",
            "permit (principal, action, resource);",
        )],
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: RedactionKey::new(vec![3; 32]).unwrap(),
        adapters: AdapterConfig {
            client: SafeClient::new(NetPolicy {
                allow_hosts: vec!["127.0.0.1".into()],
                ..NetPolicy::default()
            }),
            secrets: Secrets::default(),
            smtp: Some(SmtpRelay {
                host: "127.0.0.1".into(),
                port: relay_port,
                security: RelaySecurity::Plain,
                login: None,
            }),
            command_roots: Vec::new(),
            model: None,
        },
        runtime: RuntimeSettings::default(),
        settings: Settings::default(),
        limits: HttpLimits::default(),
        public_url: "https://warrant.example".into(),
        first_tenant: "acme".into(),
        background: false,
        contract_sync_every: warrant_server::CONTRACT_SYNC_EVERY,
        review_mail: Some(ReviewMail {
            from: "warrant@example.com".into(),
            reviewers: BTreeMap::from([("acme".to_owned(), vec!["sup@acme.example".to_owned()])]),
        }),
    })
    .await
    .unwrap()
}

/// Holds a credit for review as `principal` of `tenant`; answers the approval id.
async fn held(gateway: &Gateway, tenant: &str, customer: &str) -> String {
    let state = &gateway.state;
    let principal =
        warrant_core::authority::Principal::new("agent-7", tenant, vec!["credits:write".into()]).unwrap();
    let call = OwnedCall {
        bytes: json!({"tool": "credit", "version": 1, "arguments": {"customer_id": customer}})
            .to_string()
            .into_bytes()
            .into(),
        idempotency_key: Some(format!("k-{customer}")),
        trace_id: "t".repeat(32),
        ..OwnedCall::default()
    };
    match warrant_runtime::submit(state.authority.clone(), state.runtime.clone(), principal, call)
        .await
        .unwrap()
    {
        Dispatched::NeedsApproval { needed, .. } => needed.request_id.unwrap(),
        other => panic!("not held: {other:?}"),
    }
}

async fn reviewers_are_emailed_once_per_request(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let (relay, sink) = smtp::start().await;
    let g = gateway(store.clone(), dir.path(), relay.port()).await;
    store
        .create_api_key(&NewApiKey {
            id: "key_g".into(),
            key_hash: "h_globex".into(),
            tenant: "globex".into(),
            principal: "agent-7".into(),
            grants: vec!["credits:write".into()],
            roles: Vec::new(),
            label: None,
            created_at: time::OffsetDateTime::now_utc(),
        })
        .await
        .unwrap();

    let approval = held(&g, "acme", "cus_1").await;
    // The same call again is the same request: one event.
    assert_eq!(held(&g, "acme", "cus_1").await, approval);
    held(&g, "globex", "cus_2").await;
    assert_eq!(deliver_due(&g.state, "w1").await.unwrap(), 2);
    let messages = sink.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let m = &messages[0];
    assert_eq!(m.recipients, ["sup@acme.example"]);
    assert_eq!(m.from, "warrant@example.com");
    assert!(
        m.data
            .contains(&format!("https://warrant.example/console/approvals/{approval}")),
        "{}",
        m.data
    );
    assert!(
        m.data.contains("Approval requested: credit by agent-7"),
        "{}",
        m.data
    );
    assert!(
        !m.data.contains("cus_1"),
        "the arguments stay in the console: {}",
        m.data
    );
    // Delivered: nothing left to claim.
    assert_eq!(deliver_due(&g.state, "w1").await.unwrap(), 0);
    assert_eq!(sink.messages.lock().unwrap().len(), 1);

    // The relay is down: the event stays, due later (retried with backoff), and is not lost.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir2 = tempfile::tempdir().unwrap();
    let down = gateway(store.clone(), dir2.path(), closed).await;
    let later = held(&down, "acme", "cus_3").await;
    assert_eq!(deliver_due(&down.state, "w2").await.unwrap(), 1);
    assert_eq!(
        deliver_due(&down.state, "w2").await.unwrap(),
        0,
        "retried later, not at once"
    );
    let soon = time::OffsetDateTime::now_utc() + time::Duration::minutes(5);
    let again = store
        .claim_jobs("w3", EVENT_JOB, 10, std::time::Duration::from_secs(60), soon)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job.payload["approval_id"], later.as_str());
    assert!(again[0].last_error.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reviewers_are_emailed_once_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqlStore::open(&DatabaseUrl::data_dir(dir.path()), &StoreOptions::default())
        .await
        .unwrap();
    reviewers_are_emailed_once_per_request(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reviewers_are_emailed_once_per_request() {
    let Some(db) = TestDatabase::postgres().await.unwrap() else {
        return;
    };
    reviewers_are_emailed_once_per_request(Arc::new(db.open().await.unwrap())).await;
    db.drop_schema().await;
}
