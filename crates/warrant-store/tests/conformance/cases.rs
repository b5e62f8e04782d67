//! The conformance cases: each runs unchanged against every backend.

use std::time::Duration;

use serde_json::json;
use time::OffsetDateTime;
use time::macros::datetime;
use warrant_core::contract::Namespace;
use warrant_store::*;

use crate::support::Backend;

const T0: OffsetDateTime = datetime!(2026-11-29 12:00 UTC);

fn secs(n: i64) -> time::Duration {
    time::Duration::seconds(n)
}

fn contract(name: &str, version: u32, id: &str) -> StoredContract {
    StoredContract {
        namespace: Namespace::Platform,
        name: name.into(),
        version,
        content_id: id.into(),
        body: json!({"name": name, "version": version, "effect": "write"}),
        binding: Some(json!({"kind": "http", "url": "https://x.example"})),
        binding_digest: Some("sha256:bb".into()),
        registered_at: T0,
        retired_at: None,
    }
}

fn entry(id: &str, tenant: &str, at: OffsetDateTime) -> LedgerEntry {
    let mut e = LedgerEntry::new(
        id.into(),
        tenant,
        "agent-7",
        &format!("trace-{id}"),
        "create_support_credit",
        at,
    );
    e.contract_id = Some("tool-contract@sha256:aa".into());
    e.payload_digest = Some("sha256:p1".into());
    e.decision = LedgerDecision::Allow;
    e.outcome = Some(Outcome::Attempting);
    e.idempotency_key = Some("k-1".into());
    e.arguments = Some(json!({"amount_cents": 2500, "reason": "hmac:ab12"}));
    e
}

fn scope(tenant: &str, key: &str) -> IdempotencyScope {
    IdempotencyScope {
        tenant: tenant.into(),
        principal: "agent-7".into(),
        contract_id: "tool-contract@sha256:aa".into(),
        key: key.into(),
    }
}

fn committed(result: serde_json::Value) -> AttemptFinish {
    AttemptFinish {
        outcome: Outcome::Committed,
        attempts: 1,
        error_code: None,
        result: Some(result),
        latency_ms: 12,
        cost: 1,
        detail: None,
        charges: Vec::new(),
    }
}

fn failed(code: &str) -> AttemptFinish {
    AttemptFinish {
        outcome: Outcome::Failed,
        attempts: 3,
        error_code: Some(code.into()),
        result: None,
        latency_ms: 40,
        cost: 0,
        detail: None,
        charges: Vec::new(),
    }
}

pub async fn contracts_are_immutable(b: &Backend) {
    let s = b.store();
    let c = contract("create_support_credit", 1, "tool-contract@sha256:aa");
    assert_eq!(s.register_contract(&c).await.unwrap(), Registration::Registered);
    assert_eq!(s.register_contract(&c).await.unwrap(), Registration::Unchanged);
    let changed = StoredContract {
        content_id: "tool-contract@sha256:cc".into(),
        ..c.clone()
    };
    assert!(matches!(
        s.register_contract(&changed).await,
        Err(StoreError::Conflict(_))
    ));
    let v2 = contract("create_support_credit", 2, "tool-contract@sha256:dd");
    assert_eq!(s.register_contract(&v2).await.unwrap(), Registration::Registered);

    let p = Namespace::Platform;
    assert_eq!(
        s.get_contract(&p, "create_support_credit", 1).await.unwrap(),
        Some(c.clone())
    );
    assert_eq!(
        s.get_contract_by_id(&p, "tool-contract@sha256:dd")
            .await
            .unwrap()
            .unwrap()
            .version,
        2
    );
    assert_eq!(
        s.get_contract(&p, "create_support_credit", 3).await.unwrap(),
        None
    );
    let all = s.list_contracts().await.unwrap();
    assert_eq!(all.iter().map(|c| c.version).collect::<Vec<_>>(), vec![1, 2]);

    assert!(
        s.retire_contract(&p, "tool-contract@sha256:aa", T0 + secs(5))
            .await
            .unwrap()
    );
    assert!(
        s.retire_contract(&p, "tool-contract@sha256:aa", T0 + secs(9))
            .await
            .unwrap()
    );
    let retired = s
        .get_contract(&p, "create_support_credit", 1)
        .await
        .unwrap()
        .unwrap();
    let mut states = s.list_contract_states().await.unwrap();
    states.sort_by(|a, b| a.content_id.cmp(&b.content_id));
    assert_eq!(
        states,
        vec![
            ContractState {
                namespace: Namespace::Platform,
                content_id: "tool-contract@sha256:aa".into(),
                binding_digest: Some("sha256:bb".into()),
                retired_at: Some(T0 + secs(5)),
            },
            ContractState {
                namespace: Namespace::Platform,
                content_id: "tool-contract@sha256:dd".into(),
                binding_digest: Some("sha256:bb".into()),
                retired_at: None,
            },
        ]
    );
    assert_eq!(
        retired.retired_at,
        Some(T0 + secs(5)),
        "retiring twice keeps the first time"
    );
    assert!(
        !s.retire_contract(&p, "tool-contract@sha256:zz", T0)
            .await
            .unwrap()
    );
}

/// Tenants' contracts live apart: one tenant cannot retire, squat or see into another's
/// namespace, nor take a platform name; the same document may live in several namespaces.
pub async fn contracts_are_namespaced_by_tenant(b: &Backend) {
    let s = b.store();
    let acme = Namespace::Tenant("acme".into());
    let beta = Namespace::Tenant("beta".into());
    let of = |ns: &Namespace, name: &str, v: u32, id: &str| StoredContract {
        namespace: ns.clone(),
        binding: None,
        binding_digest: None,
        ..contract(name, v, id)
    };
    let a = of(&acme, "billing", 1, "tool-contract@sha256:a1");
    assert_eq!(s.register_contract(&a).await.unwrap(), Registration::Registered);
    // The same name@version in another tenant is that tenant's own (no squatting), even with
    // another body, and the same body too.
    let b1 = of(&beta, "billing", 1, "tool-contract@sha256:b1");
    assert_eq!(s.register_contract(&b1).await.unwrap(), Registration::Registered);
    let same_doc = of(&beta, "billing", 2, "tool-contract@sha256:a1");
    assert_eq!(
        s.register_contract(&same_doc).await.unwrap(),
        Registration::Registered
    );
    assert_eq!(
        s.get_contract(&acme, "billing", 1)
            .await
            .unwrap()
            .unwrap()
            .content_id,
        "tool-contract@sha256:a1"
    );
    assert_eq!(
        s.get_contract(&beta, "billing", 1)
            .await
            .unwrap()
            .unwrap()
            .content_id,
        "tool-contract@sha256:b1"
    );
    assert_eq!(
        s.get_contract(&Namespace::Platform, "billing", 1).await.unwrap(),
        None
    );
    assert_eq!(
        s.get_contract_by_id(&beta, "tool-contract@sha256:a1")
            .await
            .unwrap()
            .unwrap()
            .version,
        2
    );
    // Beta retiring acme's content id retires only its own copy.
    assert!(
        !s.retire_contract(&beta, "tool-contract@sha256:b9", T0)
            .await
            .unwrap()
    );
    assert!(
        s.retire_contract(&beta, "tool-contract@sha256:a1", T0 + secs(1))
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_contract(&acme, "billing", 1)
            .await
            .unwrap()
            .unwrap()
            .retired_at,
        None
    );
    // A tenant cannot take a platform contract's name.
    let platform = contract("send_email", 1, "tool-contract@sha256:e1");
    assert_eq!(
        s.register_contract(&platform).await.unwrap(),
        Registration::Registered
    );
    assert!(matches!(
        s.register_contract(&of(&acme, "send_email", 7, "tool-contract@sha256:e7"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    let listed = s.list_contracts().await.unwrap();
    assert_eq!(listed.len(), 4);
    let states = s.list_contract_states().await.unwrap();
    assert_eq!(states.len(), 4);
    assert!(states.iter().any(|c| c.namespace == acme));
}

/// A stored binding wins: a registration without one changes nothing, one with a binding sets
/// it where none is stored, and a different binding never replaces it.
pub async fn a_stored_binding_is_never_replaced(b: &Backend) {
    let s = b.store();
    let acme = Namespace::Tenant("acme".into());
    let bare = StoredContract {
        namespace: acme.clone(),
        binding: None,
        binding_digest: None,
        ..contract("sync", 1, "tool-contract@sha256:51")
    };
    assert_eq!(
        s.register_contract(&bare).await.unwrap(),
        Registration::Registered
    );
    let bound = StoredContract {
        binding: Some(json!({"kind": "http", "url": "https://sync.example"})),
        binding_digest: Some("sha256:b1".into()),
        ..bare.clone()
    };
    assert_eq!(s.register_contract(&bound).await.unwrap(), Registration::Bound);
    assert_eq!(
        s.register_contract(&bound).await.unwrap(),
        Registration::Unchanged
    );
    assert_eq!(s.register_contract(&bare).await.unwrap(), Registration::Unchanged);
    let other = StoredContract {
        binding: Some(json!({"kind": "http", "url": "https://evil.example"})),
        binding_digest: Some("sha256:e1".into()),
        ..bare.clone()
    };
    assert!(matches!(
        s.register_contract(&other).await,
        Err(StoreError::Conflict(_))
    ));
    let stored = s.get_contract(&acme, "sync", 1).await.unwrap().unwrap();
    assert_eq!(stored.binding_digest.as_deref(), Some("sha256:b1"));
    assert_eq!(stored.binding, bound.binding);
    let states = s.list_contract_states().await.unwrap();
    assert_eq!(states[0].binding_digest.as_deref(), Some("sha256:b1"));
}

/// Tenants are records of their own, created once.
pub async fn tenants_are_created_once(b: &Backend) {
    let s = b.store();
    let t = TenantRecord {
        id: "acme".into(),
        label: Some("Acme".into()),
        created_at: T0,
    };
    assert!(s.create_tenant(&t).await.unwrap());
    assert!(
        !s.create_tenant(&TenantRecord {
            label: None,
            ..t.clone()
        })
        .await
        .unwrap()
    );
    let beta = TenantRecord {
        id: "beta".into(),
        label: None,
        created_at: T0 + secs(1),
    };
    assert!(s.create_tenant(&beta).await.unwrap());
    assert_eq!(s.list_tenants().await.unwrap(), vec![t, beta]);
}

pub async fn ledger_round_trips_and_paginates(b: &Backend) {
    let s = b.store();
    for i in 0..25 {
        let mut e = entry(&format!("led_{i:03}"), "acme", T0 + secs(i));
        if i % 5 == 0 {
            e.decision = LedgerDecision::Reject;
            e.stage = Some("schema".into());
            e.error_code = Some("SCHEMA_TYPE_MISMATCH".into());
            e.outcome = None;
            e.tool = "lookup_order".into();
        }
        s.insert_ledger(&e).await.unwrap();
    }
    s.insert_ledger(&entry("led_other", "globex", T0)).await.unwrap();

    let one = s.get_ledger("acme", "led_003").await.unwrap().unwrap();
    assert_eq!(one, entry("led_003", "acme", T0 + secs(3)));

    let mut seen = Vec::new();
    let mut filter = LedgerFilter {
        limit: 7,
        ..LedgerFilter::default()
    };
    loop {
        let page = s.list_ledger("acme", &filter).await.unwrap();
        seen.extend(page.entries.iter().map(|e| e.id.clone()));
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).rev().map(|i| format!("led_{i:03}")).collect();
    assert_eq!(
        seen, expected,
        "newest first, every row once, nothing of another tenant"
    );

    let rejected = s
        .list_ledger(
            "acme",
            &LedgerFilter {
                tool: Some("lookup_order".into()),
                limit: 100,
                ..LedgerFilter::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(rejected.entries.len(), 5);
    let attempting = s
        .list_ledger(
            "acme",
            &LedgerFilter {
                outcome: Some(Outcome::Attempting),
                since: Some(T0 + secs(10)),
                until: Some(T0 + secs(20)),
                principal: Some("agent-7".into()),
                limit: 100,
                ..LedgerFilter::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(attempting.entries.len(), 8, "10..20 minus 10 and 15");
    assert!(matches!(
        s.list_ledger(
            "acme",
            &LedgerFilter {
                cursor: Some("garbage".into()),
                limit: 5,
                ..LedgerFilter::default()
            }
        )
        .await,
        Err(StoreError::Invalid(_))
    ));
}

pub async fn tenants_are_isolated(b: &Backend) {
    let s = b.store();
    s.insert_ledger(&entry("led_a", "acme", T0)).await.unwrap();
    assert_eq!(s.get_ledger("globex", "led_a").await.unwrap(), None);
    assert!(
        s.list_ledger(
            "globex",
            &LedgerFilter {
                limit: 10,
                ..LedgerFilter::default()
            }
        )
        .await
        .unwrap()
        .entries
        .is_empty()
    );

    s.create_approval(&approval("apr_a", "acme", T0)).await.unwrap();
    assert_eq!(s.get_approval("globex", "apr_a", T0).await.unwrap(), None);
    assert!(s.list_approvals("globex", None, 10, T0).await.unwrap().is_empty());
    let decided = s
        .decide_approval("globex", "apr_a", "boss", Verdict::Approve, None, T0)
        .await
        .unwrap();
    assert_eq!(decided, Err(DecideRefusal::NotFound));
    s.decide_approval("acme", "apr_a", "boss", Verdict::Approve, None, T0)
        .await
        .unwrap()
        .unwrap();
    let claim = claim_for("apr_a");
    assert_eq!(
        s.consume_approval("globex", &claim, T0).await.unwrap(),
        ConsumeOutcome::Refused(None)
    );

    // The same idempotency key in two tenants is two records.
    let mut e = entry("led_b1", "acme", T0);
    assert_eq!(
        s.begin_attempt(&e, Some(&scope("acme", "k")), &AttemptClaims::NONE, T0 + secs(60))
            .await
            .unwrap(),
        AttemptStart::Started
    );
    e.id = "led_b2".into();
    e.tenant = "globex".into();
    assert_eq!(
        s.begin_attempt(
            &e,
            Some(&scope("globex", "k")),
            &AttemptClaims::NONE,
            T0 + secs(60)
        )
        .await
        .unwrap(),
        AttemptStart::Started
    );

    let key = api_key("key_a", "acme");
    s.create_api_key(&key).await.unwrap();
    assert!(s.list_api_keys("globex").await.unwrap().is_empty());
    assert!(!s.revoke_api_key("globex", "key_a", T0).await.unwrap());
    assert_eq!(s.budget_used("globex", "k").await.unwrap(), 0);
}

pub async fn idempotency_claims_replays_and_refuses(b: &Backend) {
    let s = b.store();
    let sc = scope("acme", "k-1");
    let exp = T0 + secs(3600);
    let first = entry("led_1", "acme", T0);
    assert_eq!(
        s.begin_attempt(&first, Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Started
    );
    let rec = s.get_idempotency(&sc).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.ledger_id.as_str()),
        (IdempotencyStatus::InFlight, "led_1")
    );

    // Same key while in flight.
    let second = entry("led_2", "acme", T0 + secs(1));
    assert_eq!(
        s.begin_attempt(&second, Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::InFlight
    );
    let row = s.get_ledger("acme", "led_2").await.unwrap().unwrap();
    assert_eq!(
        (row.decision, row.error_code.as_deref(), row.stage.as_deref()),
        (
            LedgerDecision::Reject,
            Some("IDEMPOTENCY_IN_FLIGHT"),
            Some("idempotency")
        )
    );

    s.finish_attempt(
        "acme",
        "led_1",
        Some(&sc),
        &committed(json!({"credit_id": "cr_1", "status": "applied"})),
        T0 + secs(2),
    )
    .await
    .unwrap();
    let row = s.get_ledger("acme", "led_1").await.unwrap().unwrap();
    assert_eq!(
        (row.outcome, row.attempts, row.cost, row.latency_ms),
        (Some(Outcome::Committed), 1, 1, Some(12))
    );
    // Finishing twice is refused: the outcome is final.
    assert!(matches!(
        s.finish_attempt("acme", "led_1", Some(&sc), &committed(json!({})), T0 + secs(3))
            .await,
        Err(StoreError::Conflict(_))
    ));

    // Same key, same payload: replay of the stored result.
    let third = entry("led_3", "acme", T0 + secs(4));
    match s
        .begin_attempt(&third, Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap()
    {
        AttemptStart::Replay(r) => {
            assert_eq!(r.result, Some(json!({"credit_id": "cr_1", "status": "applied"})));
            assert_eq!(r.ledger_id, "led_1");
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let row = s.get_ledger("acme", "led_3").await.unwrap().unwrap();
    assert_eq!(
        (row.decision, row.outcome, row.cost),
        (LedgerDecision::Allow, Some(Outcome::Replayed), 0)
    );

    // Same key, different payload.
    let mut fourth = entry("led_4", "acme", T0 + secs(5));
    fourth.payload_digest = Some("sha256:p2".into());
    assert_eq!(
        s.begin_attempt(&fourth, Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::KeyReused
    );
    let row = s.get_ledger("acme", "led_4").await.unwrap().unwrap();
    assert_eq!(row.error_code.as_deref(), Some("IDEMPOTENCY_KEY_REUSED"));

    // Another principal has its own key space.
    let other = IdempotencyScope {
        principal: "agent-8".into(),
        ..sc.clone()
    };
    let mut fifth = entry("led_5", "acme", T0 + secs(6));
    fifth.principal = "agent-8".into();
    fifth.payload_digest = Some("sha256:p2".into());
    assert_eq!(
        s.begin_attempt(&fifth, Some(&other), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Started
    );

    // Without a scope (read effects) nothing is claimed.
    let sixth = entry("led_6", "acme", T0 + secs(7));
    assert_eq!(
        s.begin_attempt(&sixth, None, &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Started
    );
}

pub async fn idempotency_failures_and_unknowns(b: &Backend) {
    let s = b.store();
    let exp = T0 + secs(3600);
    // A permanent failure is replayed.
    let sc = scope("acme", "perm");
    s.begin_attempt(&entry("led_p1", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    s.finish_attempt("acme", "led_p1", Some(&sc), &failed("TOOL_PERMANENT_FAILURE"), T0)
        .await
        .unwrap();
    match s
        .begin_attempt(&entry("led_p2", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap()
    {
        AttemptStart::Replay(r) => assert_eq!(r.error_code.as_deref(), Some("TOOL_PERMANENT_FAILURE")),
        other => panic!("{other:?}"),
    }
    // A retryable failure releases the key.
    let sc = scope("acme", "retry");
    s.begin_attempt(&entry("led_r1", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    s.finish_attempt(
        "acme",
        "led_r1",
        Some(&sc),
        &failed("TOOL_UPSTREAM_UNAVAILABLE"),
        T0,
    )
    .await
    .unwrap();
    assert_eq!(
        s.begin_attempt(&entry("led_r2", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Started
    );

    // An unknown outcome blocks new attempts until reconciled.
    let sc = scope("acme", "unknown");
    s.begin_attempt(&entry("led_u1", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    let unknown = AttemptFinish {
        outcome: Outcome::Unknown,
        error_code: Some("TOOL_TIMEOUT".into()),
        ..failed("x")
    };
    s.finish_attempt("acme", "led_u1", Some(&sc), &unknown, T0 + secs(1))
        .await
        .unwrap();
    assert!(matches!(
        s.begin_attempt(&entry("led_u2", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Unknown(_)
    ));
    let open = s.list_unresolved(T0 + secs(10), 100).await.unwrap();
    assert!(open.iter().any(|e| e.id == "led_u1"));
    assert!(!open.iter().any(|e| e.id == "led_p1"));
    let reconciled = AttemptFinish {
        outcome: Outcome::ReconciledCommitted,
        detail: Some("confirmed duplicate effect: committed 2 times".into()),
        charges: vec![
            Charge {
                key: "cost_spent:run:r1".into(),
                amount: 3,
                expires_at: exp,
            },
            Charge {
                key: "cost_spent:tenant:day".into(),
                amount: 3,
                expires_at: exp,
            },
        ],
        ..committed(json!({"credit_id": "cr_9"}))
    };
    s.finish_attempt("acme", "led_u1", Some(&sc), &reconciled, T0 + secs(2))
        .await
        .unwrap();
    // The note and the spend land with the outcome; spend has no limit and adds up.
    let row = s.get_ledger("acme", "led_u1").await.unwrap().unwrap();
    assert_eq!(row.outcome, Some(Outcome::ReconciledCommitted));
    assert_eq!(
        row.detail.as_deref(),
        Some("confirmed duplicate effect: committed 2 times")
    );
    assert_eq!(s.budget_used("acme", "cost_spent:run:r1").await.unwrap(), 3);
    assert_eq!(s.budget_used("acme", "cost_spent:tenant:day").await.unwrap(), 3);
    assert_eq!(s.budget_used("globex", "cost_spent:run:r1").await.unwrap(), 0);
    assert!(matches!(
        s.begin_attempt(&entry("led_u3", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Replay(_)
    ));

    // Reconciled as not committed: the key is free again.
    let sc = scope("acme", "nothing");
    s.begin_attempt(&entry("led_n1", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    s.finish_attempt("acme", "led_n1", Some(&sc), &unknown, T0)
        .await
        .unwrap();
    let not = AttemptFinish {
        outcome: Outcome::ReconciledNotCommitted,
        ..failed("TOOL_TIMEOUT")
    };
    s.finish_attempt("acme", "led_n1", Some(&sc), &not, T0)
        .await
        .unwrap();
    assert_eq!(
        s.begin_attempt(&entry("led_n2", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
            .await
            .unwrap(),
        AttemptStart::Started
    );

    // `attempting` is not an ending.
    let bad = AttemptFinish {
        outcome: Outcome::Attempting,
        ..failed("x")
    };
    assert!(matches!(
        s.finish_attempt("acme", "led_n2", Some(&sc), &bad, T0).await,
        Err(StoreError::Invalid(_))
    ));
}

pub async fn expired_idempotency_records_are_free_and_purged(b: &Backend) {
    let s = b.store();
    let sc = scope("acme", "old");
    s.begin_attempt(
        &entry("led_o1", "acme", T0),
        Some(&sc),
        &AttemptClaims::NONE,
        T0 + secs(60),
    )
    .await
    .unwrap();
    s.finish_attempt("acme", "led_o1", Some(&sc), &committed(json!({"a": 1})), T0)
        .await
        .unwrap();
    // After expiry a different payload may use the key.
    let mut later = entry("led_o2", "acme", T0 + secs(61));
    later.payload_digest = Some("sha256:other".into());
    assert_eq!(
        s.begin_attempt(&later, Some(&sc), &AttemptClaims::NONE, T0 + secs(200))
            .await
            .unwrap(),
        AttemptStart::Started
    );

    let sc2 = scope("acme", "purge-me");
    s.begin_attempt(
        &entry("led_o3", "acme", T0),
        Some(&sc2),
        &AttemptClaims::NONE,
        T0 + secs(60),
    )
    .await
    .unwrap();
    s.finish_attempt("acme", "led_o3", Some(&sc2), &committed(json!({})), T0)
        .await
        .unwrap();
    let counts = s.purge_expired(T0 + secs(100)).await.unwrap();
    assert_eq!(
        counts.idempotency, 1,
        "only the committed expired record; in-flight ones wait for reconciliation"
    );
    assert_eq!(s.get_idempotency(&sc2).await.unwrap(), None);
    assert!(s.get_idempotency(&sc).await.unwrap().is_some());
}

pub async fn concurrent_claims_have_one_winner(b: &Backend) {
    let mut tasks = Vec::new();
    for i in 0..64 {
        let s = b.node(i);
        tasks.push(tokio::spawn(async move {
            let e = entry(&format!("led_c{i:02}"), "acme", T0);
            s.begin_attempt(
                &e,
                Some(&scope("acme", "contended")),
                &AttemptClaims::NONE,
                T0 + secs(60),
            )
            .await
            .unwrap()
        }));
    }
    let mut started = 0;
    for t in tasks {
        match t.await.unwrap() {
            AttemptStart::Started => started += 1,
            AttemptStart::InFlight => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(started, 1);
    let rows = b
        .store()
        .list_ledger(
            "acme",
            &LedgerFilter {
                limit: 500,
                ..LedgerFilter::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(rows.entries.len(), 64, "every proposal has its ledger row");
    assert_eq!(
        rows.entries
            .iter()
            .filter(|e| e.outcome == Some(Outcome::Attempting))
            .count(),
        1
    );
}

fn approval(id: &str, tenant: &str, at: OffsetDateTime) -> NewApproval {
    NewApproval {
        id: id.into(),
        tenant: tenant.into(),
        contract_id: "tool-contract@sha256:aa".into(),
        tool: "create_support_credit".into(),
        proposer: "agent-7".into(),
        payload_digest: "sha256:p1".into(),
        idempotency_key: Some("k-1".into()),
        arguments: json!({"customer_id": "cus_8f3k2m9q", "amount_cents": 2500}),
        sealed_arguments: None,
        created_at: at,
        expires_at: at + secs(900),
        reviewers: None,
    }
}

fn claim_for(id: &str) -> ApprovalClaim {
    ApprovalClaim {
        approval_id: id.into(),
        contract_id: "tool-contract@sha256:aa".into(),
        payload_digest: "sha256:p1".into(),
        idempotency_key: Some("k-1".into()),
        principal: "agent-7".into(),
        ledger_id: "led_consumer".into(),
    }
}

pub async fn approvals_follow_their_lifecycle(b: &Backend) {
    let s = b.store();
    s.create_approval(&approval("apr_1", "acme", T0)).await.unwrap();
    s.create_approval(&approval("apr_2", "acme", T0 + secs(1)))
        .await
        .unwrap();
    let pending = s
        .list_approvals("acme", Some(ApprovalStatus::Pending), 10, T0)
        .await
        .unwrap();
    assert_eq!(
        pending.iter().map(|a| a.request.id.as_str()).collect::<Vec<_>>(),
        vec!["apr_1", "apr_2"]
    );

    // Not approved yet: cannot be consumed.
    assert!(matches!(
        s.consume_approval("acme", &claim_for("apr_1"), T0).await.unwrap(),
        ConsumeOutcome::Refused(Some(_))
    ));
    // The proposer cannot review its own call.
    let own = s
        .decide_approval("acme", "apr_1", "agent-7", Verdict::Approve, None, T0)
        .await
        .unwrap();
    assert_eq!(own, Err(DecideRefusal::SelfReview));
    let ok = s
        .decide_approval(
            "acme",
            "apr_1",
            "supervisor-1",
            Verdict::Approve,
            Some("fine"),
            T0 + secs(5),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (ok.status, ok.reviewer.as_deref(), ok.reason.as_deref()),
        (ApprovalStatus::Approved, Some("supervisor-1"), Some("fine"))
    );
    let again = s
        .decide_approval(
            "acme",
            "apr_1",
            "supervisor-2",
            Verdict::Reject,
            None,
            T0 + secs(6),
        )
        .await
        .unwrap();
    assert_eq!(again, Err(DecideRefusal::NotPending(ApprovalStatus::Approved)));

    // A changed payload, key or proposer does not consume it.
    for bad in [
        ApprovalClaim {
            payload_digest: "sha256:p2".into(),
            ..claim_for("apr_1")
        },
        ApprovalClaim {
            idempotency_key: None,
            ..claim_for("apr_1")
        },
        ApprovalClaim {
            idempotency_key: Some("k-2".into()),
            ..claim_for("apr_1")
        },
        ApprovalClaim {
            principal: "agent-8".into(),
            ..claim_for("apr_1")
        },
        ApprovalClaim {
            contract_id: "tool-contract@sha256:zz".into(),
            ..claim_for("apr_1")
        },
    ] {
        assert!(matches!(
            s.consume_approval("acme", &bad, T0 + secs(7)).await.unwrap(),
            ConsumeOutcome::Refused(Some(_))
        ));
    }
    // Consumed exactly once.
    match s
        .consume_approval("acme", &claim_for("apr_1"), T0 + secs(8))
        .await
        .unwrap()
    {
        ConsumeOutcome::Consumed(a) => {
            assert_eq!(
                (a.status, a.consumed_by.as_deref()),
                (ApprovalStatus::Consumed, Some("led_consumer"))
            )
        }
        other => panic!("{other:?}"),
    }
    match s
        .consume_approval("acme", &claim_for("apr_1"), T0 + secs(9))
        .await
        .unwrap()
    {
        ConsumeOutcome::Refused(Some(a)) => assert_eq!(a.status, ApprovalStatus::Consumed),
        other => panic!("{other:?}"),
    }

    // Rejected approvals are never consumed; expired ones cannot be decided or consumed.
    s.decide_approval(
        "acme",
        "apr_2",
        "supervisor-1",
        Verdict::Reject,
        Some("too much"),
        T0 + secs(2),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(
        s.consume_approval("acme", &claim_for("apr_2"), T0 + secs(3))
            .await
            .unwrap(),
        ConsumeOutcome::Refused(_)
    ));
    s.create_approval(&approval("apr_3", "acme", T0)).await.unwrap();
    let late = s
        .decide_approval(
            "acme",
            "apr_3",
            "supervisor-1",
            Verdict::Approve,
            None,
            T0 + secs(901),
        )
        .await
        .unwrap();
    assert_eq!(late, Err(DecideRefusal::Expired));
    s.create_approval(&approval("apr_4", "acme", T0)).await.unwrap();
    s.decide_approval(
        "acme",
        "apr_4",
        "supervisor-1",
        Verdict::Approve,
        None,
        T0 + secs(10),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(
        s.consume_approval("acme", &claim_for("apr_4"), T0 + secs(900))
            .await
            .unwrap(),
        ConsumeOutcome::Refused(_)
    ));
    let counts = s.purge_expired(T0 + secs(1000)).await.unwrap();
    assert_eq!(counts.approvals_expired, 2);
    assert_eq!(
        s.get_approval("acme", "apr_4", T0).await.unwrap().unwrap().status,
        ApprovalStatus::Expired
    );
    assert_eq!(
        s.get_approval("acme", "apr_1", T0).await.unwrap().unwrap().status,
        ApprovalStatus::Consumed
    );
    assert_eq!(
        s.decide_approval("acme", "apr_none", "x", Verdict::Approve, None, T0)
            .await
            .unwrap(),
        Err(DecideRefusal::NotFound)
    );
}

/// A request past its expiry reads as `expired` at once, before the sweeper writes it: by id,
/// in a listing, and under the `expired` filter (and no longer under `pending` or
/// `approved`); a decided or consumed request keeps its status.
pub async fn lapsed_approvals_read_as_expired(b: &Backend) {
    let s = b.store();
    let ids = |rows: Vec<ApprovalRequest>| {
        rows.into_iter()
            .map(|a| (a.request.id, a.status))
            .collect::<Vec<_>>()
    };
    // apr_p stays pending, apr_a is approved, apr_r rejected, apr_c consumed; all expire at
    // T0 + 900 s. apr_n is created later and is still pending at T0 + 900 s. (Listed oldest
    // first, then by id.)
    for id in ["apr_p", "apr_a", "apr_r", "apr_c"] {
        s.create_approval(&approval(id, "acme", T0)).await.unwrap();
    }
    s.create_approval(&approval("apr_n", "acme", T0 + secs(1)))
        .await
        .unwrap();
    for (id, verdict) in [
        ("apr_a", Verdict::Approve),
        ("apr_r", Verdict::Reject),
        ("apr_c", Verdict::Approve),
    ] {
        s.decide_approval("acme", id, "supervisor-1", verdict, None, T0 + secs(1))
            .await
            .unwrap()
            .unwrap();
    }
    assert!(matches!(
        s.consume_approval("acme", &claim_for("apr_c"), T0 + secs(2))
            .await
            .unwrap(),
        ConsumeOutcome::Consumed(_)
    ));
    use ApprovalStatus::{Approved, Consumed, Expired, Pending, Rejected};
    // Just before the expiry: as stored.
    let before = T0 + secs(900) - time::Duration::milliseconds(1);
    assert_eq!(
        ids(s.list_approvals("acme", None, 10, before).await.unwrap()),
        vec![
            ("apr_a".into(), Approved),
            ("apr_c".into(), Consumed),
            ("apr_p".into(), Pending),
            ("apr_r".into(), Rejected),
            ("apr_n".into(), Pending),
        ]
    );
    // At the expiry (the sweeper has not run): lapsed.
    let at = T0 + secs(900);
    assert_eq!(
        ids(s.list_approvals("acme", None, 10, at).await.unwrap()),
        vec![
            ("apr_a".into(), Expired),
            ("apr_c".into(), Consumed),
            ("apr_p".into(), Expired),
            ("apr_r".into(), Rejected),
            ("apr_n".into(), Pending),
        ]
    );
    assert_eq!(
        ids(s.list_approvals("acme", Some(Expired), 10, at).await.unwrap()),
        vec![("apr_a".into(), Expired), ("apr_p".into(), Expired)]
    );
    assert_eq!(
        ids(s.list_approvals("acme", Some(Pending), 10, at).await.unwrap()),
        vec![("apr_n".into(), Pending)]
    );
    assert!(
        s.list_approvals("acme", Some(Approved), 10, at)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ids(s.list_approvals("acme", Some(Rejected), 10, at).await.unwrap()),
        vec![("apr_r".into(), Rejected)]
    );
    let st = &s;
    let status = |id: &'static str, now| async move {
        st.get_approval("acme", id, now).await.unwrap().unwrap().status
    };
    assert_eq!(status("apr_p", before).await, Pending);
    assert_eq!(status("apr_p", at).await, Expired);
    assert_eq!(status("apr_a", at).await, Expired);
    assert_eq!(status("apr_c", at).await, Consumed);
    assert_eq!(status("apr_n", at).await, Pending);
    // The sweeper writes what the reads already said; the reads do not change.
    assert_eq!(s.purge_expired(at).await.unwrap().approvals_expired, 2);
    assert_eq!(
        ids(s.list_approvals("acme", Some(Expired), 10, at).await.unwrap()),
        vec![("apr_a".into(), Expired), ("apr_p".into(), Expired)]
    );
    // The stored status, read at a time before the expiry, is the sweeper's.
    assert_eq!(status("apr_p", before).await, Expired);
}

pub async fn concurrent_consumption_happens_once(b: &Backend) {
    let s = b.store();
    for round in 0..10 {
        let id = format!("apr_c{round}");
        s.create_approval(&approval(&id, "acme", T0)).await.unwrap();
        s.decide_approval("acme", &id, "supervisor-1", Verdict::Approve, None, T0)
            .await
            .unwrap()
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..2 {
            let node = b.node(i);
            let claim = ApprovalClaim {
                ledger_id: format!("led_{round}_{i}"),
                ..claim_for(&id)
            };
            tasks.push(tokio::spawn(async move {
                node.consume_approval("acme", &claim, T0 + secs(1)).await.unwrap()
            }));
        }
        let mut consumed = 0;
        for t in tasks {
            if matches!(t.await.unwrap(), ConsumeOutcome::Consumed(_)) {
                consumed += 1;
            }
        }
        assert_eq!(consumed, 1, "round {round}");
    }
}

pub async fn budgets_are_exact_under_concurrency(b: &Backend) {
    let reservation = |key: &str, limit| BudgetReservation {
        key: key.into(),
        amount: 1,
        limit,
        expires_at: T0 + secs(86_400),
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let s = b.node(i);
        let r = reservation("calls_per_day:agent-7:credit:2026-11-29", 50);
        tasks.push(tokio::spawn(async move {
            s.reserve_budget("acme", &[r]).await.unwrap()
        }));
    }
    let mut granted = 0;
    for t in tasks {
        if t.await.unwrap() == BudgetOutcome::Granted {
            granted += 1;
        }
    }
    assert_eq!(granted, 50);
    assert_eq!(
        b.store()
            .budget_used("acme", "calls_per_day:agent-7:credit:2026-11-29")
            .await
            .unwrap(),
        50
    );
}

pub async fn budgets_are_all_or_nothing(b: &Backend) {
    let s = b.store();
    let r = |key: &str, amount, limit| BudgetReservation {
        key: key.into(),
        amount,
        limit,
        expires_at: T0 + secs(60),
    };
    assert_eq!(
        s.reserve_budget("acme", &[r("run", 1, 2), r("day", 1, 5)])
            .await
            .unwrap(),
        BudgetOutcome::Granted
    );
    assert_eq!(
        s.reserve_budget("acme", &[r("run", 1, 2), r("day", 1, 5)])
            .await
            .unwrap(),
        BudgetOutcome::Granted
    );
    // `run` is full: nothing is taken from `day`.
    assert_eq!(
        s.reserve_budget("acme", &[r("day", 1, 5), r("run", 1, 2)])
            .await
            .unwrap(),
        BudgetOutcome::Exhausted { key: "run".into() }
    );
    assert_eq!(s.budget_used("acme", "day").await.unwrap(), 2);
    // An amount larger than the limit never fits, even on an empty counter.
    assert_eq!(
        s.reserve_budget("acme", &[r("cost", 10, 5)]).await.unwrap(),
        BudgetOutcome::Exhausted { key: "cost".into() }
    );
    assert_eq!(s.budget_used("acme", "cost").await.unwrap(), 0);
    s.release_budget("acme", &[r("run", 1, 2)]).await.unwrap();
    assert_eq!(s.budget_used("acme", "run").await.unwrap(), 1);
    assert_eq!(s.budget_used("globex", "run").await.unwrap(), 0);
    assert_eq!(s.purge_expired(T0 + secs(61)).await.unwrap().budget_counters, 2);
}

fn api_key(id: &str, tenant: &str) -> NewApiKey {
    NewApiKey {
        id: id.into(),
        key_hash: format!("hash-of-{id}"),
        tenant: tenant.into(),
        principal: "agent-7".into(),
        grants: vec!["support:credits:write".into(), "orders:read".into()],
        roles: vec!["agent".into()],
        label: Some("demo".into()),
        created_at: T0,
    }
}

pub async fn api_keys_are_stored_hashed_and_revocable(b: &Backend) {
    let s = b.store();
    assert!(!s.has_api_keys().await.unwrap());
    let generated = warrant_store::keys::generate();
    let key = NewApiKey {
        id: generated.id.clone(),
        key_hash: generated.hash.clone(),
        ..api_key("x", "acme")
    };
    s.create_api_key(&key).await.unwrap();
    assert!(s.has_api_keys().await.unwrap());
    let found = s
        .find_api_key(&warrant_store::keys::hash_presented(&generated.key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.key, key);
    assert_eq!(found.revoked_at, None);
    // The key itself is nowhere in the stored record.
    assert!(!format!("{found:?}").contains(&generated.key));
    assert!(matches!(
        s.create_api_key(&key).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(s.list_api_keys("acme").await.unwrap().len(), 1);
    assert!(s.revoke_api_key("acme", &generated.id, T0).await.unwrap());
    assert!(!s.revoke_api_key("acme", &generated.id, T0).await.unwrap());
    assert_eq!(
        s.find_api_key(&generated.hash).await.unwrap().unwrap().revoked_at,
        Some(T0)
    );
    assert_eq!(s.find_api_key("nope").await.unwrap(), None);
}

fn job(id: &str, at: OffsetDateTime, max_attempts: u32) -> NewJob {
    NewJob {
        id: id.into(),
        tenant: "acme".into(),
        kind: "webhook.deliver".into(),
        payload: json!({"n": id}),
        run_at: at,
        max_attempts,
    }
}

pub async fn jobs_are_claimed_once_retried_and_dead_lettered(b: &Backend) {
    let s = b.store();
    s.enqueue_job(&job("job_1", T0, 2)).await.unwrap();
    s.enqueue_job(&job("job_2", T0 + secs(30), 2)).await.unwrap();
    let lease = Duration::from_secs(10);
    let other = NewJob {
        kind: "workflow.step".into(),
        ..job("job_other", T0, 2)
    };
    s.enqueue_job(&other).await.unwrap();
    let claimed = s
        .claim_jobs("w1", "webhook.deliver", 10, lease, T0)
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.job.id.as_str()).collect::<Vec<_>>(),
        vec!["job_1"],
        "job_2 is not due"
    );
    assert_eq!((claimed[0].attempts, claimed[0].status), (1, JobStatus::Running));
    assert!(
        s.claim_jobs("w2", "webhook.deliver", 10, lease, T0 + secs(1))
            .await
            .unwrap()
            .is_empty(),
        "held by w1"
    );
    // w1 fails; the retry is due later.
    let retry = JobCompletion::Retry {
        run_at: T0 + secs(5),
        error: "503".into(),
    };
    assert!(s.complete_job("job_1", "w1", &retry, T0 + secs(1)).await.unwrap());
    assert!(
        !s.complete_job("job_1", "w1", &JobCompletion::Done, T0 + secs(1))
            .await
            .unwrap(),
        "no longer held"
    );
    // The lease of a crashed worker expires and another worker takes the job over.
    let again = s
        .claim_jobs("w2", "webhook.deliver", 10, lease, T0 + secs(5))
        .await
        .unwrap();
    assert_eq!(again[0].attempts, 2);
    let reclaimed = s
        .claim_jobs("w3", "webhook.deliver", 10, lease, T0 + secs(16))
        .await
        .unwrap();
    assert_eq!(reclaimed.len(), 1, "w2's lease expired");
    assert!(
        !s.complete_job("job_1", "w2", &JobCompletion::Done, T0 + secs(17))
            .await
            .unwrap(),
        "w2 lost it"
    );
    // Out of attempts: a retry becomes dead.
    assert!(
        s.complete_job("job_1", "w3", &retry, T0 + secs(17))
            .await
            .unwrap()
    );
    let dead = s.list_dead_jobs("acme", 10).await.unwrap();
    assert_eq!(
        dead.iter().map(|j| j.job.id.as_str()).collect::<Vec<_>>(),
        vec!["job_1"]
    );
    assert_eq!(dead[0].last_error.as_deref(), Some("503"));
    let due = s
        .claim_jobs("w1", "webhook.deliver", 10, lease, T0 + secs(30))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert!(
        s.complete_job("job_2", "w1", &JobCompletion::Done, T0 + secs(31))
            .await
            .unwrap()
    );
    assert!(
        s.claim_jobs("w1", "webhook.deliver", 10, lease, T0 + secs(1000))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.list_dead_jobs("globex", 10).await.unwrap().is_empty());
}

pub async fn concurrent_workers_never_share_a_job(b: &Backend) {
    let s = b.store();
    for i in 0..200 {
        s.enqueue_job(&job(&format!("job_{i:03}"), T0, 3)).await.unwrap();
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let node = b.node(w);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let jobs = node
                    .claim_jobs(
                        &format!("w{w}"),
                        "webhook.deliver",
                        7,
                        Duration::from_secs(60),
                        T0,
                    )
                    .await
                    .unwrap();
                if jobs.is_empty() {
                    return mine;
                }
                mine.extend(jobs.into_iter().map(|j| j.job.id));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!((total, all.len()), (200, 200));
}

pub async fn a_closed_store_fails_closed(b: &Backend) {
    let s = b.store();
    s.ping().await.unwrap();
    // The write probe commits (twice: it rewrites its one row) on every node.
    s.probe_write(T0).await.unwrap();
    b.node(1).probe_write(T0).await.unwrap();
    b.close().await;
    assert!(matches!(s.ping().await, Err(StoreError::Unavailable(_))));
    assert!(matches!(s.probe_write(T0).await, Err(StoreError::Unavailable(_))));
    let e = entry("led_x", "acme", T0);
    assert!(matches!(
        s.begin_attempt(&e, Some(&scope("acme", "k")), &AttemptClaims::NONE, T0)
            .await,
        Err(StoreError::Unavailable(_))
    ));
}

pub async fn a_read_is_recorded_once_with_its_outcome(b: &Backend) {
    let s = b.store();
    let mut read = entry("led_r1", "acme", T0);
    read.idempotency_key = None;
    let mut finish = committed(json!({"status": "paid"}));
    finish.cost = 2;
    finish.charges = vec![Charge {
        key: "cost_spent:tenant:day".into(),
        amount: 2,
        expires_at: T0 + secs(86_400),
    }];
    s.record_attempt(&read, &[], &finish, T0 + secs(1)).await.unwrap();
    let row = s.get_ledger("acme", "led_r1").await.unwrap().unwrap();
    assert_eq!(
        (row.decision, row.outcome, row.attempts, row.cost, row.latency_ms),
        (LedgerDecision::Allow, Some(Outcome::Committed), 1, 2, Some(12))
    );
    assert_eq!(row.updated_at, T0 + secs(1));
    assert_eq!(s.budget_used("acme", "cost_spent:tenant:day").await.unwrap(), 2);
    // The same row twice is refused, and charges nothing more.
    assert!(matches!(
        s.record_attempt(&read, &[], &finish, T0 + secs(2)).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(s.budget_used("acme", "cost_spent:tenant:day").await.unwrap(), 2);
    // Another tenant sees nothing of it.
    assert!(s.get_ledger("globex", "led_r1").await.unwrap().is_none());
    // A finish that is refused after the row went in (the row is not awaiting an outcome)
    // leaves neither the row nor a charge: one transaction.
    let mut finished = entry("led_r2", "acme", T0);
    finished.idempotency_key = None;
    finished.outcome = Some(Outcome::Committed);
    assert!(matches!(
        s.record_attempt(&finished, &[], &finish, T0 + secs(3)).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(s.get_ledger("acme", "led_r2").await.unwrap().is_none());
    assert_eq!(s.budget_used("acme", "cost_spent:tenant:day").await.unwrap(), 2);
}

fn day_budget(limit: u64) -> BudgetReservation {
    BudgetReservation {
        key: "calls_per_day:agent-7:create_support_credit:2026-11-29".into(),
        amount: 1,
        limit,
        expires_at: T0 + secs(86_400),
    }
}

const DAY_KEY: &str = "calls_per_day:agent-7:create_support_credit:2026-11-29";

/// `e`, under idempotency key `key`, is refused by the day budget (limit 1, already spent).
async fn assert_over_day_budget(
    s: &std::sync::Arc<dyn Store>,
    e: &LedgerEntry,
    key: &str,
    exp: OffsetDateTime,
) {
    let claims = AttemptClaims {
        approval: None,
        reservations: vec![day_budget(1)],
    };
    assert_eq!(
        s.begin_attempt(e, Some(&scope("acme", key)), &claims, exp)
            .await
            .unwrap(),
        AttemptStart::BudgetExhausted { key: DAY_KEY.into() }
    );
}

/// A call's write-ahead commit takes its idempotency claim, its approval and its budget
/// together, or none of them: a refusal by any leaves the others untouched.
pub async fn the_write_ahead_commit_spends_all_or_nothing(b: &Backend) {
    let s = b.store();
    s.create_approval(&approval("apr_w1", "acme", T0)).await.unwrap();
    s.decide_approval(
        "acme",
        "apr_w1",
        "supervisor-1",
        Verdict::Approve,
        None,
        T0 + secs(1),
    )
    .await
    .unwrap()
    .unwrap();
    let exp = T0 + secs(3600);
    let mut claim = claim_for("apr_w1");
    claim.ledger_id = "led_w1".into();
    let claims = AttemptClaims {
        approval: Some(claim.clone()),
        reservations: vec![day_budget(1)],
    };
    // Everything is taken at once.
    let first = entry("led_w1", "acme", T0 + secs(2));
    assert_eq!(
        s.begin_attempt(&first, Some(&scope("acme", "k-1")), &claims, exp)
            .await
            .unwrap(),
        AttemptStart::Started
    );
    let approval = s.get_approval("acme", "apr_w1", T0).await.unwrap().unwrap();
    assert_eq!(approval.status, ApprovalStatus::Consumed);
    assert_eq!(approval.consumed_by.as_deref(), Some("led_w1"));
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);

    // The same key again (in flight): nothing is spent, not even the budget.
    let again = entry("led_w2", "acme", T0 + secs(3));
    let budget_only = AttemptClaims {
        approval: None,
        reservations: vec![day_budget(5)],
    };
    assert_eq!(
        s.begin_attempt(&again, Some(&scope("acme", "k-1")), &budget_only, exp)
            .await
            .unwrap(),
        AttemptStart::InFlight
    );
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);

    // The budget refuses: no idempotency record is left behind and the row says why.
    let over = entry("led_w3", "acme", T0 + secs(4));
    assert_over_day_budget(&s, &over, "k-over", exp).await;
    assert_eq!(s.get_idempotency(&scope("acme", "k-over")).await.unwrap(), None);
    let row = s.get_ledger("acme", "led_w3").await.unwrap().unwrap();
    assert_eq!(
        (row.decision, row.error_code.as_deref(), row.outcome),
        (LedgerDecision::Reject, Some("BUDGET_EXHAUSTED"), None)
    );
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);

    // The approval was used meanwhile: neither the key nor the budget is taken.
    let late = entry("led_w4", "acme", T0 + secs(5));
    let mut used = claim;
    used.ledger_id = "led_w4".into();
    let start = s
        .begin_attempt(
            &late,
            Some(&scope("acme", "k-late")),
            &AttemptClaims {
                approval: Some(used),
                reservations: vec![day_budget(5)],
            },
            exp,
        )
        .await
        .unwrap();
    assert!(
        matches!(&start, AttemptStart::ApprovalRefused(Some(a)) if a.status == ApprovalStatus::Consumed),
        "{start:?}"
    );
    assert_eq!(s.get_idempotency(&scope("acme", "k-late")).await.unwrap(), None);
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);
    let row = s.get_ledger("acme", "led_w4").await.unwrap().unwrap();
    assert_eq!(row.error_code.as_deref(), Some("APPROVAL_CONSUMED"));
    assert_eq!(
        s.get_approval("acme", "apr_w1", T0)
            .await
            .unwrap()
            .unwrap()
            .consumed_by
            .as_deref(),
        Some("led_w1")
    );

    // An expired, finished record is taken over, then the budget refuses: the record is left
    // as it was.
    let old = entry("led_w5", "acme", T0 + secs(6));
    let no_claims = AttemptClaims::NONE;
    let short = T0 + secs(7);
    assert_eq!(
        s.begin_attempt(&old, Some(&scope("acme", "k-old")), &no_claims, short)
            .await
            .unwrap(),
        AttemptStart::Started
    );
    s.finish_attempt(
        "acme",
        "led_w5",
        Some(&scope("acme", "k-old")),
        &committed(json!({"ok": true})),
        T0 + secs(6),
    )
    .await
    .unwrap();
    let kept = s.get_idempotency(&scope("acme", "k-old")).await.unwrap();
    assert_eq!(kept.as_ref().map(|r| r.ledger_id.as_str()), Some("led_w5"));
    let retry = entry("led_w6", "acme", T0 + secs(10));
    assert_over_day_budget(&s, &retry, "k-old", exp).await;
    assert_eq!(s.get_idempotency(&scope("acme", "k-old")).await.unwrap(), kept);
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);
}

/// An idempotency record that expired while its operation was in flight or unknown is not
/// taken over: the operation may have had its effect and is reconciled first.
pub async fn an_expired_unfinished_record_is_not_taken_over(b: &Backend) {
    let s = b.store();
    let exp = T0 + secs(60);
    let sc = scope("acme", "k-stuck");
    s.begin_attempt(&entry("led_x1", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    let after = entry("led_x2", "acme", T0 + secs(61));
    let start = s
        .begin_attempt(&after, Some(&sc), &AttemptClaims::NONE, T0 + secs(200))
        .await
        .unwrap();
    assert!(
        matches!(&start, AttemptStart::Unknown(r) if r.ledger_id == "led_x1"),
        "{start:?}"
    );
    assert_eq!(s.get_idempotency(&sc).await.unwrap().unwrap().ledger_id, "led_x1");

    let unknown = AttemptFinish {
        outcome: Outcome::Unknown,
        error_code: Some("TOOL_TIMEOUT".into()),
        result: None,
        ..committed(json!({}))
    };
    s.finish_attempt("acme", "led_x1", Some(&sc), &unknown, T0 + secs(62))
        .await
        .unwrap();
    let start = s
        .begin_attempt(
            &entry("led_x3", "acme", T0 + secs(63)),
            Some(&sc),
            &AttemptClaims::NONE,
            T0 + secs(200),
        )
        .await
        .unwrap();
    assert!(
        matches!(&start, AttemptStart::Unknown(r) if r.ledger_id == "led_x1"),
        "{start:?}"
    );
    // Once reconciled as not committed, the key is free.
    let not = AttemptFinish {
        outcome: Outcome::ReconciledNotCommitted,
        ..unknown
    };
    s.finish_attempt("acme", "led_x1", Some(&sc), &not, T0 + secs(64))
        .await
        .unwrap();
    assert_eq!(
        s.begin_attempt(
            &entry("led_x4", "acme", T0 + secs(65)),
            Some(&sc),
            &AttemptClaims::NONE,
            T0 + secs(200)
        )
        .await
        .unwrap(),
        AttemptStart::Started
    );
}

/// A record whose operation finishes after the record's retention ran out (an unknown call
/// reconciled late) is kept a retention from then: not taken over by a new attempt, not purged.
/// One that finishes in time keeps the expiry its claim gave it.
pub async fn a_record_finished_late_is_kept_a_retention_from_then(b: &Backend) {
    let s = b.store();
    let sc = scope("acme", "k-late");
    // Claimed at T0, kept 60 s.
    s.begin_attempt(
        &entry("led_l1", "acme", T0),
        Some(&sc),
        &AttemptClaims::NONE,
        T0 + secs(60),
    )
    .await
    .unwrap();
    let unknown = AttemptFinish {
        outcome: Outcome::Unknown,
        error_code: Some("TOOL_TIMEOUT".into()),
        result: None,
        ..committed(json!({}))
    };
    s.finish_attempt("acme", "led_l1", Some(&sc), &unknown, T0 + secs(1))
        .await
        .unwrap();
    // Resolved as committed at T0 + 100 s, past the claim's expiry.
    let resolved = AttemptFinish {
        outcome: Outcome::ReconciledCommitted,
        ..committed(json!({"ok": true}))
    };
    s.finish_attempt("acme", "led_l1", Some(&sc), &resolved, T0 + secs(100))
        .await
        .unwrap();
    let record = s.get_idempotency(&sc).await.unwrap().unwrap();
    assert_eq!(
        record.expires_at,
        T0 + secs(160),
        "a retention from the resolution"
    );
    s.purge_expired(T0 + secs(120)).await.unwrap();
    let start = s
        .begin_attempt(
            &entry("led_l2", "acme", T0 + secs(121)),
            Some(&sc),
            &AttemptClaims::NONE,
            T0 + secs(181),
        )
        .await
        .unwrap();
    assert!(
        matches!(&start, AttemptStart::Replay(r) if r.ledger_id == "led_l1"),
        "{start:?}"
    );
    // Finished within its retention: the claim's expiry stands (give or take the finish's
    // own delay, which only lengthens it).
    let sc = scope("acme", "k-prompt");
    s.begin_attempt(
        &entry("led_p1", "acme", T0),
        Some(&sc),
        &AttemptClaims::NONE,
        T0 + secs(60),
    )
    .await
    .unwrap();
    s.finish_attempt("acme", "led_p1", Some(&sc), &committed(json!({})), T0)
        .await
        .unwrap();
    assert_eq!(
        s.get_idempotency(&sc).await.unwrap().unwrap().expires_at,
        T0 + secs(60)
    );
}

/// A tool that commits after reconciliation recorded no effect corrects the row and holds the
/// key again; an outcome reconciliation already proved stands.
pub async fn a_late_commit_corrects_the_ledger(b: &Backend) {
    let s = b.store();
    let exp = T0 + secs(3600);
    let not = AttemptFinish {
        outcome: Outcome::ReconciledNotCommitted,
        result: None,
        ..committed(json!({}))
    };
    let sc = scope("acme", "k-slow");
    s.begin_attempt(&entry("led_l1", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    s.finish_attempt("acme", "led_l1", Some(&sc), &not, T0 + secs(1))
        .await
        .unwrap();
    assert_eq!(s.get_idempotency(&sc).await.unwrap(), None);
    let late = committed(json!({"credit_id": "cr_1"}));
    assert!(matches!(
        s.finish_attempt("acme", "led_l1", Some(&sc), &late, T0 + secs(2))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        s.record_late_outcome("acme", "led_l1", Some(&sc), &late, T0 + secs(2))
            .await
            .unwrap(),
        LateOutcome::Corrected { key_retaken: false }
    );
    let row = s.get_ledger("acme", "led_l1").await.unwrap().unwrap();
    assert_eq!(row.outcome, Some(Outcome::Committed));
    assert!(
        row.detail.as_deref().unwrap_or_default().contains("corrected"),
        "{:?}",
        row.detail
    );
    let record = s.get_idempotency(&sc).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.result, record.ledger_id.as_str()),
        (
            IdempotencyStatus::Committed,
            Some(json!({"credit_id": "cr_1"})),
            "led_l1"
        )
    );
    // A retry with the key now replays instead of running again.
    assert!(matches!(
        s.begin_attempt(
            &entry("led_l2", "acme", T0 + secs(3)),
            Some(&sc),
            &AttemptClaims::NONE,
            exp
        )
        .await
        .unwrap(),
        AttemptStart::Replay(_)
    ));

    // Reconciliation proved the commit: a late failure does not change it.
    let sc2 = scope("acme", "k-proved");
    s.begin_attempt(
        &entry("led_l3", "acme", T0),
        Some(&sc2),
        &AttemptClaims::NONE,
        exp,
    )
    .await
    .unwrap();
    let proved = AttemptFinish {
        outcome: Outcome::ReconciledCommitted,
        ..committed(json!({"credit_id": "cr_2"}))
    };
    s.finish_attempt("acme", "led_l3", Some(&sc2), &proved, T0 + secs(1))
        .await
        .unwrap();
    assert_eq!(
        s.record_late_outcome(
            "acme",
            "led_l3",
            Some(&sc2),
            &failed("TOOL_TIMEOUT"),
            T0 + secs(2)
        )
        .await
        .unwrap(),
        LateOutcome::Kept(Outcome::ReconciledCommitted)
    );

    // The freed key was taken by a new attempt before the late commit: the row is corrected,
    // and the new attempt keeps the key.
    let sc3 = scope("acme", "k-retaken");
    s.begin_attempt(
        &entry("led_l4", "acme", T0),
        Some(&sc3),
        &AttemptClaims::NONE,
        exp,
    )
    .await
    .unwrap();
    s.finish_attempt("acme", "led_l4", Some(&sc3), &not, T0 + secs(1))
        .await
        .unwrap();
    s.begin_attempt(
        &entry("led_l5", "acme", T0 + secs(2)),
        Some(&sc3),
        &AttemptClaims::NONE,
        exp,
    )
    .await
    .unwrap();
    assert_eq!(
        s.record_late_outcome("acme", "led_l4", Some(&sc3), &late, T0 + secs(3))
            .await
            .unwrap(),
        LateOutcome::Corrected { key_retaken: true }
    );
    assert_eq!(
        s.get_idempotency(&sc3).await.unwrap().unwrap().ledger_id,
        "led_l5"
    );
}

/// A read recorded after it ran takes its budget in the same commit; when the budget has no
/// room, the row records the refusal and nothing is spent.
pub async fn a_read_takes_its_budget_when_it_is_recorded(b: &Backend) {
    let s = b.store();
    let read = |id: &str| {
        let mut e = entry(id, "acme", T0);
        e.idempotency_key = None;
        e
    };
    let finish = committed(json!({"status": "paid"}));
    assert_eq!(
        s.record_attempt(&read("led_b1"), &[day_budget(1)], &finish, T0 + secs(1))
            .await
            .unwrap(),
        BudgetOutcome::Granted
    );
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);
    assert_eq!(
        s.record_attempt(&read("led_b2"), &[day_budget(1)], &finish, T0 + secs(2))
            .await
            .unwrap(),
        BudgetOutcome::Exhausted { key: DAY_KEY.into() }
    );
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);
    assert_eq!(s.budget_used("acme", "cost_spent:tenant:day").await.unwrap(), 0);
    let row = s.get_ledger("acme", "led_b2").await.unwrap().unwrap();
    assert_eq!(
        (row.decision, row.error_code.as_deref(), row.outcome, row.cost),
        (LedgerDecision::Reject, Some("BUDGET_EXHAUSTED"), None, 0)
    );
    assert!(row.detail.as_deref().unwrap_or_default().contains("withheld"));
    // Several counters: all or none. The first has room, the second does not; the first is
    // left as it was.
    let hourly = BudgetReservation {
        key: "calls_per_hour:agent-7:create_support_credit:2026-11-29T00".into(),
        ..day_budget(5)
    };
    assert_eq!(
        s.record_attempt(
            &read("led_b3"),
            &[hourly.clone(), day_budget(1)],
            &finish,
            T0 + secs(3)
        )
        .await
        .unwrap(),
        BudgetOutcome::Exhausted { key: DAY_KEY.into() }
    );
    assert_eq!(s.budget_used("acme", &hourly.key).await.unwrap(), 0);
    assert_eq!(s.budget_used("acme", DAY_KEY).await.unwrap(), 1);
}

// ----- reconciliation schedule -----

fn unresolved_entry(id: &str, at: OffsetDateTime) -> LedgerEntry {
    let mut e = entry(id, "acme", at);
    e.idempotency_key = None;
    e
}

fn ids(rows: &[ClaimedRow]) -> Vec<&str> {
    rows.iter().map(|r| r.entry.id.as_str()).collect()
}

pub async fn unresolved_rows_are_claimed_in_due_order_and_rescheduled(b: &Backend) {
    let s = b.store();
    let exp = T0 + secs(3600);
    for (id, at) in [
        ("led_a", T0),
        ("led_b", T0 + secs(1)),
        ("led_c", T0 + secs(2)),
        ("led_done", T0),
    ] {
        s.begin_attempt(&unresolved_entry(id, at), None, &AttemptClaims::NONE, exp)
            .await
            .unwrap();
    }
    let unknown = AttemptFinish {
        outcome: Outcome::Unknown,
        error_code: Some("TOOL_TIMEOUT".into()),
        ..failed("x")
    };
    s.finish_attempt("acme", "led_b", None, &unknown, T0 + secs(3))
        .await
        .unwrap();
    s.finish_attempt("acme", "led_done", None, &committed(json!({})), T0 + secs(1))
        .await
        .unwrap();
    let lease = Duration::from_secs(60);
    // Due: never-scheduled rows untouched since `older_than`, earliest first; one at a time.
    let now = T0 + secs(100);
    let first = s
        .claim_unresolved("w1", now, now, T0 + secs(2), 1, lease)
        .await
        .unwrap();
    assert_eq!(ids(&first), ["led_a"]);
    assert_eq!(
        (first[0].reconcile_attempts, first[0].reconcile_note.as_deref()),
        (0, None)
    );
    assert_eq!(first[0].entry.outcome, Some(Outcome::Attempting));
    // Another worker does not get a leased row; led_b was touched after `older_than`.
    let second = b
        .node(1)
        .claim_unresolved("w2", now, now, T0 + secs(2), 10, lease)
        .await
        .unwrap();
    assert_eq!(ids(&second), ["led_c"]);
    assert!(
        s.claim_unresolved("w3", now, now, T0 + secs(2), 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    // A pass that asks about every scheduled row at once (an operator's `warrant reconcile`)
    // still leaves a row held under a live lease to its holder.
    assert!(
        s.claim_unresolved("w3", now, T0 + secs(100_000), T0 + secs(2), 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    // Only the holder reschedules.
    assert!(
        !s.reschedule_unresolved("acme", "led_a", "w2", T0 + secs(130), "x")
            .await
            .unwrap(),
        "w2 does not hold led_a"
    );
    assert!(
        !s.reschedule_unresolved("globex", "led_a", "w1", T0 + secs(130), "x")
            .await
            .unwrap(),
        "another tenant's row"
    );
    assert!(
        s.reschedule_unresolved("acme", "led_a", "w1", T0 + secs(130), "no status endpoint")
            .await
            .unwrap()
    );
    // led_a is not due before its time; led_b is (never scheduled, old enough now).
    let third = s
        .claim_unresolved("w1", T0 + secs(120), T0 + secs(120), T0 + secs(50), 10, lease)
        .await
        .unwrap();
    assert_eq!(ids(&third), ["led_b"]);
    assert_eq!(third[0].entry.outcome, Some(Outcome::Unknown));
    // Later: led_a (due at 130), led_c (w2's lease ran out at 160), led_b (w1's at 180).
    let fourth = s
        .claim_unresolved("w4", T0 + secs(200), T0 + secs(200), T0 + secs(150), 10, lease)
        .await
        .unwrap();
    assert_eq!(ids(&fourth), ["led_a", "led_c", "led_b"]);
    assert_eq!(fourth[0].reconcile_attempts, 1);
    assert_eq!(fourth[0].reconcile_note.as_deref(), Some("no status endpoint"));
    assert!(
        !s.reschedule_unresolved("acme", "led_c", "w2", T0 + secs(300), "x")
            .await
            .unwrap(),
        "w2 lost it"
    );
    // Resolution is `finish_attempt`: the row leaves the schedule.
    let resolved = AttemptFinish {
        outcome: Outcome::ReconciledNotCommitted,
        ..failed("x")
    };
    s.finish_attempt("acme", "led_a", None, &resolved, T0 + secs(201))
        .await
        .unwrap();
    assert!(
        !s.reschedule_unresolved("acme", "led_a", "w4", T0 + secs(300), "x")
            .await
            .unwrap()
    );
    for id in ["led_b", "led_c"] {
        assert!(
            s.reschedule_unresolved("acme", id, "w4", T0 + secs(300), "x")
                .await
                .unwrap()
        );
    }
    let far = T0 + secs(100_000);
    let rest = s.claim_unresolved("w5", far, far, far, 10, lease).await.unwrap();
    assert_eq!(ids(&rest), ["led_b", "led_c"]);
    assert_eq!(rest[0].reconcile_attempts, 1);
    // The ledger row itself is unchanged by scheduling.
    let row = s.get_ledger("acme", "led_b").await.unwrap().unwrap();
    assert_eq!(
        (row.outcome, row.updated_at),
        (Some(Outcome::Unknown), T0 + secs(3))
    );
}

pub async fn concurrent_reconcilers_never_claim_the_same_row(b: &Backend) {
    let s = b.store();
    let exp = T0 + secs(3600);
    for i in 0..300 {
        s.begin_attempt(
            &unresolved_entry(&format!("led_{i:03}"), T0),
            None,
            &AttemptClaims::NONE,
            exp,
        )
        .await
        .unwrap();
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let node = b.node(w);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let rows = node
                    .claim_unresolved(
                        &format!("w{w}"),
                        T0 + secs(60),
                        T0 + secs(60),
                        T0 + secs(30),
                        7,
                        Duration::from_secs(60),
                    )
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return mine;
                }
                mine.extend(rows.into_iter().map(|r| r.entry.id));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!((total, all.len()), (300, 300));
}

pub async fn overdue_rows_are_marked_once(b: &Backend) {
    let s = b.store();
    let exp = T0 + secs(7200);
    let unknown = AttemptFinish {
        outcome: Outcome::Unknown,
        detail: Some("lost answer".into()),
        ..failed("x")
    };
    s.begin_attempt(&unresolved_entry("led_o1", T0), None, &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    s.finish_attempt("acme", "led_o1", None, &unknown, T0 + secs(1))
        .await
        .unwrap();
    s.begin_attempt(
        &unresolved_entry("led_o2", T0 + secs(1800)),
        None,
        &AttemptClaims::NONE,
        exp,
    )
    .await
    .unwrap();
    s.begin_attempt(&unresolved_entry("led_o3", T0), None, &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    s.finish_attempt("acme", "led_o3", None, &committed(json!({})), T0 + secs(1))
        .await
        .unwrap();
    let note = "needs an operator: unresolved for more than 1h";
    let now = T0 + secs(3600);
    let sweep = s.mark_overdue(T0 + secs(600), now, note, 100).await.unwrap();
    assert_eq!(
        (
            sweep.newly.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            sweep.overdue
        ),
        (vec!["led_o1"], 1)
    );
    let row = s.get_ledger("acme", "led_o1").await.unwrap().unwrap();
    assert_eq!(
        row.detail.as_deref(),
        Some("needs an operator: unresolved for more than 1h; lost answer")
    );
    assert_eq!(row.outcome, Some(Outcome::Unknown));
    // Once per row, whichever node sweeps.
    let again = b
        .node(1)
        .mark_overdue(T0 + secs(600), now, note, 100)
        .await
        .unwrap();
    assert_eq!((again.newly.len(), again.overdue), (0, 1));
    let later = s.mark_overdue(T0 + secs(2400), now, note, 100).await.unwrap();
    assert_eq!(
        (
            later.newly.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            later.overdue
        ),
        (vec!["led_o2"], 2)
    );
    assert_eq!(
        s.get_ledger("acme", "led_o2")
            .await
            .unwrap()
            .unwrap()
            .detail
            .as_deref(),
        Some(note)
    );
    // A resolved row is no longer counted; its resolution's detail replaces the note.
    let resolved = AttemptFinish {
        outcome: Outcome::ReconciledNotCommitted,
        detail: Some("reconciled: no effect".into()),
        ..failed("x")
    };
    s.finish_attempt("acme", "led_o1", None, &resolved, now)
        .await
        .unwrap();
    let after = s.mark_overdue(T0 + secs(2400), now, note, 100).await.unwrap();
    assert_eq!((after.newly.len(), after.overdue), (0, 1));
    // Two nodes sweeping at once mark each row once.
    for i in 0..40 {
        s.begin_attempt(
            &unresolved_entry(&format!("led_m{i:02}"), T0),
            None,
            &AttemptClaims::NONE,
            exp,
        )
        .await
        .unwrap();
    }
    let sweeps: Vec<_> = (0..4)
        .map(|n| {
            let node = b.node(n);
            tokio::spawn(async move { node.mark_overdue(T0 + secs(600), now, note, 7).await.unwrap() })
        })
        .collect();
    let mut marked = Vec::new();
    for t in sweeps {
        marked.extend(t.await.unwrap().newly.into_iter().map(|e| e.id));
    }
    loop {
        let more = s.mark_overdue(T0 + secs(600), now, note, 7).await.unwrap();
        if more.newly.is_empty() {
            assert_eq!(more.overdue, 41);
            break;
        }
        marked.extend(more.newly.into_iter().map(|e| e.id));
    }
    let total = marked.len();
    marked.sort();
    marked.dedup();
    assert_eq!((total, marked.len()), (40, 40));
}

pub async fn workflows_are_immutable_and_tenant_scoped(b: &Backend) {
    let s = b.store();
    let at = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let w = WorkflowRecord {
        tenant: "acme".into(),
        name: "credit_after_review".into(),
        version: 1,
        digest: "sha256:aa".into(),
        document: serde_json::json!({"name": "credit_after_review", "version": 1, "steps": [{"id": "done", "end": {"status": "completed"}}]}),
        pinned: [("credit".to_owned(), "tool-contract@sha256:bb".to_owned())]
            .into_iter()
            .collect(),
        published_by: "admin-1".into(),
        published_at: at,
    };
    assert_eq!(s.publish_workflow(&w).await.unwrap(), Publication::Published);
    assert_eq!(s.publish_workflow(&w).await.unwrap(), Publication::Unchanged);
    let changed = WorkflowRecord {
        digest: "sha256:cc".into(),
        ..w.clone()
    };
    assert!(matches!(
        s.publish_workflow(&changed).await,
        Err(StoreError::Conflict(_))
    ));
    let v2 = WorkflowRecord {
        version: 2,
        digest: "sha256:dd".into(),
        ..w.clone()
    };
    assert_eq!(s.publish_workflow(&v2).await.unwrap(), Publication::Published);
    // Another tenant may use the same name and version; neither sees the other's.
    let other = WorkflowRecord {
        tenant: "globex".into(),
        digest: "sha256:ee".into(),
        ..w.clone()
    };
    assert_eq!(s.publish_workflow(&other).await.unwrap(), Publication::Published);

    assert_eq!(
        s.get_workflow("acme", "credit_after_review", 1).await.unwrap(),
        Some(w.clone())
    );
    assert_eq!(
        s.get_workflow("acme", "credit_after_review", 3).await.unwrap(),
        None
    );
    assert_eq!(
        s.get_workflow("initech", "credit_after_review", 1).await.unwrap(),
        None
    );
    let listed: Vec<(String, u32)> = s
        .list_workflows("acme")
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.digest, w.version))
        .collect();
    assert_eq!(listed, vec![("sha256:aa".into(), 1), ("sha256:dd".into(), 2)]);
    assert_eq!(s.list_workflows("globex").await.unwrap().len(), 1);
}

pub async fn runs_advance_one_step_at_a_time(b: &Backend) {
    let s = b.store();
    // An endpoint that takes every event (without one, run events are not enqueued).
    let mut all = endpoint("acme", "whe_runs", T0);
    all.events = Vec::new();
    s.create_webhook(&all).await.unwrap();
    let step_job = |id: &str, seq: u32| NewJob {
        id: id.into(),
        tenant: "acme".into(),
        kind: "workflow.step".into(),
        payload: json!({"run_id": "run_1", "seq": seq}),
        run_at: T0,
        max_attempts: 5,
    };
    let run = RunRecord {
        id: "run_1".into(),
        tenant: "acme".into(),
        workflow: "refund".into(),
        version: 1,
        digest: "sha256:aa".into(),
        status: RunStatus::Running,
        input: json!({"order_id": "ord_1"}),
        principal: json!({"id": "agent-7", "tenant": "acme", "grants": [], "roles": []}),
        next_step: Some("look".into()),
        next_seq: 0,
        cost: 0,
        error: None,
        created_at: T0,
        updated_at: T0,
    };
    s.start_run(&run, &step_job("job_r1_0", 0)).await.unwrap();
    assert_eq!(s.get_run("acme", "run_1").await.unwrap(), Some(run.clone()));
    assert_eq!(s.get_run("globex", "run_1").await.unwrap(), None);
    // The first step's job was enqueued with the run.
    let claimed = s
        .claim_jobs("w1", "workflow.step", 10, Duration::from_secs(30), T0)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job.payload, json!({"run_id": "run_1", "seq": 0}));

    let step = RunStep {
        run_id: "run_1".into(),
        seq: 0,
        step_id: "look".into(),
        kind: "tool".into(),
        status: "completed".into(),
        output: Some(json!({"status": "paid"})),
        ledger_id: Some("led_1".into()),
        cost: 3,
        detail: None,
        finished_at: T0 + secs(1),
    };
    let next = RunAdvance::Next {
        step: "done".into(),
        job: step_job("job_r1_1", 1),
    };
    assert!(
        s.advance_run("acme", &step, &next, None, T0 + secs(1))
            .await
            .unwrap()
            .recorded()
    );
    // The same step again (a second worker): refused, nothing recorded twice.
    assert!(
        !s.advance_run("acme", &step, &next, None, T0 + secs(2))
            .await
            .unwrap()
            .recorded()
    );
    // Another tenant cannot advance it.
    let end_step = RunStep {
        seq: 1,
        step_id: "done".into(),
        kind: "end".into(),
        output: None,
        ledger_id: None,
        cost: 0,
        ..step.clone()
    };
    let end = RunAdvance::End {
        status: RunStatus::Completed,
        error: None,
    };
    assert!(
        !s.advance_run("globex", &end_step, &end, None, T0 + secs(2))
            .await
            .unwrap()
            .recorded()
    );
    assert!(
        s.advance_run("acme", &end_step, &end, None, T0 + secs(2))
            .await
            .unwrap()
            .recorded()
    );
    // An ended run takes no further step.
    let late = RunStep {
        seq: 2,
        ..end_step.clone()
    };
    assert!(
        !s.advance_run("acme", &late, &end, None, T0 + secs(3))
            .await
            .unwrap()
            .recorded()
    );

    let done = s.get_run("acme", "run_1").await.unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!((done.next_seq, done.next_step, done.cost), (2, None, 3));
    // The start and the end each committed their event, once.
    let events = s
        .claim_jobs("w9", EVENT_JOB, 10, Duration::from_secs(30), T0 + secs(3))
        .await
        .unwrap();
    let mut kinds: Vec<String> = events
        .iter()
        .map(|j| {
            format!(
                "{} {}",
                j.job.payload["type"].as_str().unwrap(),
                j.job.payload["run_id"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["run.completed run_1", "run.started run_1"]);
    let steps = s.run_steps("acme", "run_1").await.unwrap();
    assert_eq!(steps, vec![step.clone(), end_step]);
    assert!(s.run_steps("globex", "run_1").await.unwrap().is_empty());
    // Exactly one job per step was enqueued.
    let jobs = s
        .claim_jobs("w2", "workflow.step", 10, Duration::from_secs(30), T0 + secs(5))
        .await
        .unwrap();
    assert_eq!(
        jobs.iter().map(|j| j.job.id.as_str()).collect::<Vec<_>>(),
        vec!["job_r1_1"]
    );
    assert_eq!(s.list_runs("acme", 10).await.unwrap().len(), 1);
    assert!(s.list_runs("globex", 10).await.unwrap().is_empty());

    // Cancelling: only a run that has not ended, only in its tenant; a cancelled run takes no
    // further step.
    assert!(!s.cancel_run("acme", "run_1", T0 + secs(6)).await.unwrap());
    let second = RunRecord {
        id: "run_2".into(),
        ..run.clone()
    };
    s.start_run(&second, &step_job("job_r2_0", 0)).await.unwrap();
    assert!(!s.cancel_run("globex", "run_2", T0 + secs(6)).await.unwrap());
    assert!(s.cancel_run("acme", "run_2", T0 + secs(6)).await.unwrap());
    assert!(!s.cancel_run("acme", "run_2", T0 + secs(7)).await.unwrap());
    let cancelled = s.get_run("acme", "run_2").await.unwrap().unwrap();
    assert_eq!(
        (cancelled.status, cancelled.next_step),
        (RunStatus::Cancelled, None)
    );
    let first_step = RunStep {
        run_id: "run_2".into(),
        ..step.clone()
    };
    assert!(
        !s.advance_run("acme", &first_step, &next, None, T0 + secs(8))
            .await
            .unwrap()
            .recorded()
    );
}

/// A worker that records a step hands its job on in the same transaction: the step's job is
/// done, and the next step's job — due now — is already its own (no other worker claims it);
/// a next step due later is only enqueued. A stale step hands nothing on.
pub async fn a_recorded_step_hands_its_job_on(b: &Backend) {
    let s = b.store();
    let job = |id: &str, seq: u32, at: OffsetDateTime| NewJob {
        id: id.into(),
        tenant: "acme".into(),
        kind: "workflow.step".into(),
        payload: json!({"run_id": "run_h", "seq": seq}),
        run_at: at,
        max_attempts: 5,
    };
    let run = running("run_h");
    s.start_run(&run, &job("job_h0", 0, T0)).await.unwrap();
    let lease = Duration::from_secs(30);
    let claimed = s.claim_jobs("w1", "workflow.step", 10, lease, T0).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let step = |seq: u32, id: &str| RunStep {
        run_id: "run_h".into(),
        seq,
        step_id: id.into(),
        kind: "tool".into(),
        status: "completed".into(),
        output: Some(json!({})),
        ledger_id: None,
        cost: 0,
        detail: None,
        finished_at: T0 + secs(1),
    };
    let handoff = Handoff {
        worker: "w1".into(),
        job_id: "job_h0".into(),
        lease_until: T0 + secs(31),
    };
    let next = RunAdvance::Next {
        step: "two".into(),
        job: job("job_h1", 1, T0 + secs(1)),
    };
    let advanced = s
        .advance_run("acme", &step(0, "one"), &next, Some(&handoff), T0 + secs(1))
        .await
        .unwrap();
    let Advanced::Recorded { next: Some(handed) } = advanced else {
        panic!("not handed on: {advanced:?}");
    };
    // The step's own job carries the next step (one row, its lease renewed).
    assert_eq!(handed.job.id, "job_h0");
    assert_eq!(handed.job.payload["seq"], 1);
    assert_eq!(handed.locked_by.as_deref(), Some("w1"));
    assert_eq!(handed.attempts, 1);
    // Nobody else claims it.
    assert!(
        s.claim_jobs("w2", "workflow.step", 10, lease, T0 + secs(2))
            .await
            .unwrap()
            .is_empty()
    );
    // The next step due later is only enqueued, and the step's job is done; a stale step
    // hands nothing on.
    let handoff = Handoff {
        worker: "w1".into(),
        job_id: "job_h0".into(),
        lease_until: T0 + secs(32),
    };
    let later = RunAdvance::Wait {
        step: "two".into(),
        job: job("job_h2", 2, T0 + secs(60)),
    };
    let advanced = s
        .advance_run("acme", &step(1, "two"), &later, Some(&handoff), T0 + secs(2))
        .await
        .unwrap();
    assert_eq!(advanced, Advanced::Recorded { next: None });
    assert!(
        s.claim_jobs("w2", "workflow.step", 10, lease, T0 + secs(3))
            .await
            .unwrap()
            .is_empty()
    );
    let due = s
        .claim_jobs("w2", "workflow.step", 10, lease, T0 + secs(61))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].job.id, "job_h2");
    assert!(
        !s.complete_job("job_h0", "w1", &JobCompletion::Done, T0 + secs(61))
            .await
            .unwrap(),
        "done with the step it carried"
    );
    let stale = s
        .advance_run("acme", &step(1, "two"), &later, Some(&handoff), T0 + secs(62))
        .await
        .unwrap();
    assert_eq!(stale, Advanced::Stale);
}

/// A workflow's tool call that commits records its step, completes the step's job and hands
/// the next step's job on in the transaction that records the call's outcome; a call that
/// does not commit records its outcome alone; a stale step leaves the outcome recorded.
pub async fn a_committed_step_call_records_its_step_with_its_outcome(b: &Backend) {
    let s = b.store();
    let lease = Duration::from_secs(30);
    let job = |id: &str, run: &str, seq: u32| NewJob {
        id: id.into(),
        tenant: "acme".into(),
        kind: "workflow.step".into(),
        payload: json!({"run_id": run, "seq": seq}),
        run_at: T0,
        max_attempts: 5,
    };
    let run = running;
    let follow = |run: &str, job_id: &str, next_job: &str| StepFollowUp {
        tenant: "acme".into(),
        step: RunStep {
            run_id: run.into(),
            seq: 0,
            step_id: "one".into(),
            kind: "tool".into(),
            status: "completed".into(),
            output: None,
            ledger_id: None,
            cost: 2,
            detail: None,
            finished_at: T0,
        },
        advance: RunAdvance::Next {
            step: "two".into(),
            job: job(next_job, run, 1),
        },
        handoff: Some(Handoff {
            worker: "w1".into(),
            job_id: job_id.into(),
            lease_until: T0 + secs(31),
        }),
    };
    let exp = T0 + secs(3600);

    // Committed: the outcome, the step (with the result and the ledger row), the job handed on.
    s.start_run(&run("run_c"), &job("job_c0", "run_c", 0))
        .await
        .unwrap();
    assert_eq!(
        s.claim_jobs("w1", "workflow.step", 10, lease, T0)
            .await
            .unwrap()
            .len(),
        1
    );
    let sc = scope("acme", "run_c.one");
    s.begin_attempt(&entry("led_c", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    let then = follow("run_c", "job_c0", "job_c1");
    let done = committed(json!({"credit_id": "cr_9"}));
    let advanced = s
        .finish_step_attempt("acme", "led_c", Some(&sc), &done, T0 + secs(1), &then)
        .await
        .unwrap();
    let Some(Advanced::Recorded { next: Some(handed) }) = advanced else {
        panic!("not recorded and handed on: {advanced:?}");
    };
    assert_eq!(
        (handed.job.id.as_str(), handed.locked_by.as_deref()),
        ("job_c0", Some("w1")),
        "the step's job carries the next step"
    );
    let row = s.get_ledger("acme", "led_c").await.unwrap().unwrap();
    assert_eq!(row.outcome, Some(Outcome::Committed));
    let steps = s.run_steps("acme", "run_c").await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (
            steps[0].output.clone(),
            steps[0].ledger_id.as_deref(),
            steps[0].finished_at
        ),
        (Some(json!({"credit_id": "cr_9"})), Some("led_c"), T0 + secs(1))
    );
    let ran = s.get_run("acme", "run_c").await.unwrap().unwrap();
    assert_eq!(
        (ran.next_seq, ran.next_step.as_deref(), ran.cost),
        (1, Some("two"), 2)
    );
    // The job is still w1's, now for step two.
    assert!(s.renew_job("job_c0", "w1", T0 + secs(40)).await.unwrap());

    // Failed: the outcome alone; the step is the caller's to record.
    s.start_run(&run("run_f"), &job("job_f0", "run_f", 0))
        .await
        .unwrap();
    let sc = scope("acme", "run_f.one");
    s.begin_attempt(&entry("led_f", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    let advanced = s
        .finish_step_attempt(
            "acme",
            "led_f",
            Some(&sc),
            &failed("UPSTREAM_4XX"),
            T0 + secs(1),
            &follow("run_f", "job_f0", "job_f1"),
        )
        .await
        .unwrap();
    assert_eq!(advanced, None);
    assert_eq!(
        s.get_ledger("acme", "led_f").await.unwrap().unwrap().outcome,
        Some(Outcome::Failed)
    );
    assert!(s.run_steps("acme", "run_f").await.unwrap().is_empty());
    assert_eq!(s.get_run("acme", "run_f").await.unwrap().unwrap().next_seq, 0);

    // Stale (the run was cancelled during the call): the outcome stands, no step, no job.
    s.start_run(&run("run_s"), &job("job_s0", "run_s", 0))
        .await
        .unwrap();
    let sc = scope("acme", "run_s.one");
    s.begin_attempt(&entry("led_s", "acme", T0), Some(&sc), &AttemptClaims::NONE, exp)
        .await
        .unwrap();
    assert!(s.cancel_run("acme", "run_s", T0).await.unwrap());
    let advanced = s
        .finish_step_attempt(
            "acme",
            "led_s",
            Some(&sc),
            &done,
            T0 + secs(1),
            &follow("run_s", "job_s0", "job_s1"),
        )
        .await
        .unwrap();
    assert_eq!(advanced, Some(Advanced::Stale));
    assert_eq!(
        s.get_ledger("acme", "led_s").await.unwrap().unwrap().outcome,
        Some(Outcome::Committed)
    );
    assert_eq!(
        s.get_idempotency(&sc).await.unwrap().map(|r| r.status),
        Some(IdempotencyStatus::Committed)
    );
    assert!(s.run_steps("acme", "run_s").await.unwrap().is_empty());
}

/// Console sign-ins: a session is found by its token's hash until it ends or is deleted; a
/// one-time link is taken once, only while valid, and is never a session; the sweeper removes
/// what has ended.
pub async fn console_sessions_end_and_links_are_taken_once(b: &Backend) {
    let s = b.store();
    let session = |hash: &str, kind: ConsoleSessionKind, ends: OffsetDateTime| ConsoleSession {
        token_hash: hash.into(),
        kind,
        key_hash: "keyhash_1".into(),
        csrf: "csrf_1".into(),
        created_at: T0,
        expires_at: ends,
    };
    let live = session("h_session", ConsoleSessionKind::Session, T0 + secs(600));
    s.create_console_session(&live).await.unwrap();
    assert!(s.create_console_session(&live).await.is_err());
    assert_eq!(
        s.get_console_session("h_session", T0 + secs(1)).await.unwrap(),
        Some(live.clone())
    );
    assert_eq!(
        s.get_console_session("h_session", T0 + secs(600)).await.unwrap(),
        None
    );
    assert_eq!(s.get_console_session("h_other", T0).await.unwrap(), None);
    // A session is not a link.
    assert_eq!(s.take_console_link("h_session", T0).await.unwrap(), None);
    assert!(s.delete_console_session("h_session").await.unwrap());
    assert!(!s.delete_console_session("h_session").await.unwrap());
    assert_eq!(
        s.get_console_session("h_session", T0 + secs(1)).await.unwrap(),
        None
    );

    let link = session("h_link", ConsoleSessionKind::Link, T0 + secs(300));
    s.create_console_session(&link).await.unwrap();
    // A link is not a session.
    assert_eq!(s.get_console_session("h_link", T0).await.unwrap(), None);
    let (a, b2) = tokio::join!(
        s.take_console_link("h_link", T0 + secs(1)),
        s.take_console_link("h_link", T0 + secs(1))
    );
    let taken: Vec<_> = [a.unwrap(), b2.unwrap()].into_iter().flatten().collect();
    assert_eq!(taken, vec![link]);
    let late = session("h_late", ConsoleSessionKind::Link, T0 + secs(300));
    s.create_console_session(&late).await.unwrap();
    assert_eq!(s.take_console_link("h_late", T0 + secs(300)).await.unwrap(), None);

    let ending = session("h_ending", ConsoleSessionKind::Session, T0 + secs(10));
    s.create_console_session(&ending).await.unwrap();
    let counts = s.purge_expired(T0 + secs(400)).await.unwrap();
    assert_eq!(counts.console_sessions, 2);
}

/// The ledger is listed by trace and by approval request, within the tenant only.
pub async fn ledger_lists_by_trace_and_approval(b: &Backend) {
    let s = b.store();
    let row = |id: &str, tenant: &str, trace: &str, approval: Option<&str>| LedgerEntry {
        trace_id: trace.into(),
        approval_id: approval.map(str::to_owned),
        ..entry(id, tenant, T0)
    };
    for r in [
        row("led_t1", "acme", "trace_a", Some("apr_1")),
        row("led_t2", "acme", "trace_a", None),
        row("led_t3", "acme", "trace_b", Some("apr_1")),
        row("led_t4", "globex", "trace_a", Some("apr_1")),
    ] {
        s.insert_ledger(&r).await.unwrap();
    }
    let ids = |page: LedgerPage| {
        let mut ids: Vec<String> = page.entries.into_iter().map(|e| e.id).collect();
        ids.sort();
        ids
    };
    let by_trace = LedgerFilter {
        trace_id: Some("trace_a".into()),
        limit: 10,
        ..LedgerFilter::default()
    };
    assert_eq!(
        ids(s.list_ledger("acme", &by_trace).await.unwrap()),
        ["led_t1", "led_t2"]
    );
    let by_approval = LedgerFilter {
        approval_id: Some("apr_1".into()),
        limit: 10,
        ..LedgerFilter::default()
    };
    assert_eq!(
        ids(s.list_ledger("acme", &by_approval).await.unwrap()),
        ["led_t1", "led_t3"]
    );
    assert_eq!(
        ids(s.list_ledger("globex", &by_approval).await.unwrap()),
        ["led_t4"]
    );
}

/// The inbox's page: newest first, by effective status, tool and proposer, continued by its
/// cursor, within the tenant; the count agrees.
pub async fn approvals_are_paged_newest_first(b: &Backend) {
    let s = b.store();
    for i in 0..7 {
        let mut a = approval(&format!("apr_p{i}"), "acme", T0 + secs(i));
        if i % 2 == 1 {
            a.tool = "send_email".into();
        }
        if i == 6 {
            a.proposer = "agent-9".into();
        }
        s.create_approval(&a).await.unwrap();
    }
    // One lapsed (pending in the store, expired in effect) and one of another tenant.
    let mut old = approval("apr_old", "acme", T0 - secs(1000));
    old.expires_at = T0 - secs(100);
    s.create_approval(&old).await.unwrap();
    s.create_approval(&approval("apr_globex", "globex", T0 + secs(3)))
        .await
        .unwrap();

    let now = T0 + secs(10);
    let ids = |page: &ApprovalPage| {
        page.approvals
            .iter()
            .map(|a| a.request.id.clone())
            .collect::<Vec<_>>()
    };
    let pending = ApprovalFilter {
        status: Some(ApprovalStatus::Pending),
        limit: 3,
        ..ApprovalFilter::default()
    };
    let first = s.page_approvals("acme", &pending, now).await.unwrap();
    assert_eq!(ids(&first), ["apr_p6", "apr_p5", "apr_p4"]);
    let second = s
        .page_approvals(
            "acme",
            &ApprovalFilter {
                cursor: first.next_cursor.clone(),
                ..pending.clone()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(ids(&second), ["apr_p3", "apr_p2", "apr_p1"]);
    let third = s
        .page_approvals(
            "acme",
            &ApprovalFilter {
                cursor: second.next_cursor.clone(),
                ..pending.clone()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(
        (ids(&third), third.next_cursor),
        (vec!["apr_p0".to_owned()], None)
    );
    let emails = ApprovalFilter {
        tool: Some("send_email".into()),
        limit: 10,
        ..pending.clone()
    };
    assert_eq!(
        ids(&s.page_approvals("acme", &emails, now).await.unwrap()),
        ["apr_p5", "apr_p3", "apr_p1"]
    );
    let by = ApprovalFilter {
        proposer: Some("agent-9".into()),
        limit: 10,
        ..pending.clone()
    };
    assert_eq!(
        ids(&s.page_approvals("acme", &by, now).await.unwrap()),
        ["apr_p6"]
    );
    let expired = ApprovalFilter {
        status: Some(ApprovalStatus::Expired),
        limit: 10,
        ..ApprovalFilter::default()
    };
    let lapsed = s.page_approvals("acme", &expired, now).await.unwrap();
    assert_eq!(ids(&lapsed), ["apr_old"]);
    assert_eq!(lapsed.approvals[0].status, ApprovalStatus::Expired);
    assert_eq!(
        s.count_approvals("acme", ApprovalStatus::Pending, now, 100)
            .await
            .unwrap(),
        7
    );
    assert_eq!(
        s.count_approvals("acme", ApprovalStatus::Expired, now, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.count_approvals("globex", ApprovalStatus::Pending, now, 100)
            .await
            .unwrap(),
        1
    );
    // The count stops at its bound.
    assert_eq!(
        s.count_approvals("acme", ApprovalStatus::Pending, now, 3)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        ids(&s.page_approvals("globex", &pending, now).await.unwrap()),
        ["apr_globex"]
    );
}

/// A single-use token is spent once per (scope, tenant), also under concurrent spends; an
/// agent task is read back as written, ends once (a second end and a cancel after completion
/// change nothing), is invisible to another tenant and after it expires, and the sweeper
/// removes what has ended.
pub async fn tokens_are_spent_once_and_tasks_end_once(b: &Backend) {
    let s = b.store();
    let until = T0 + secs(600);
    let (one, two) = tokio::join!(
        s.spend_token("mrtr", "acme", "tok_1", until),
        s.spend_token("mrtr", "acme", "tok_1", until)
    );
    assert_eq!(
        [one.unwrap(), two.unwrap()].iter().filter(|x| **x).count(),
        1,
        "exactly one concurrent spend wins"
    );
    assert!(!s.spend_token("mrtr", "acme", "tok_1", until).await.unwrap());
    assert!(s.spend_token("mrtr", "globex", "tok_1", until).await.unwrap());
    assert!(s.spend_token("inbound", "acme", "tok_1", until).await.unwrap());

    let task = TaskRecord {
        id: "task_1".into(),
        tenant: "acme".into(),
        principal: "agent".into(),
        approval_id: "apr_1".into(),
        call: serde_json::json!({"bytes": "{}", "idempotency_key": "k"}),
        status: TaskStatus::Working,
        result: None,
        created_at: T0,
        updated_at: T0,
        expires_at: T0 + secs(3600),
    };
    s.create_task(&task).await.unwrap();
    assert!(
        s.create_task(&task).await.is_err(),
        "an existing id is a conflict"
    );
    assert_eq!(
        s.get_task("acme", "task_1", T0 + secs(1)).await.unwrap(),
        Some(task.clone())
    );
    assert_eq!(s.get_task("globex", "task_1", T0).await.unwrap(), None);
    assert_eq!(s.get_task("acme", "task_1", T0 + secs(3600)).await.unwrap(), None);
    assert!(
        s.end_task("acme", "task_1", TaskStatus::Working, &serde_json::json!({}), T0)
            .await
            .is_err(),
        "working is not an end"
    );
    let result = serde_json::json!({"content": [], "isError": false});
    let empty = serde_json::json!({});
    let (a, b2) = tokio::join!(
        s.end_task("acme", "task_1", TaskStatus::Completed, &result, T0 + secs(5)),
        s.end_task("acme", "task_1", TaskStatus::Cancelled, &empty, T0 + secs(5))
    );
    assert_eq!(
        [a.unwrap(), b2.unwrap()].iter().filter(|x| **x).count(),
        1,
        "a task ends once"
    );
    let ended = s.get_task("acme", "task_1", T0 + secs(6)).await.unwrap().unwrap();
    assert!(ended.status.is_terminal());
    assert_eq!(ended.updated_at, T0 + secs(5));
    assert!(ended.result.is_some());
    assert!(
        !s.end_task("globex", "task_1", TaskStatus::Failed, &result, T0 + secs(7))
            .await
            .unwrap()
    );

    let purged = s.purge_expired(T0 + secs(3600)).await.unwrap();
    assert_eq!(purged.tokens_and_tasks, 4, "three tokens and the task");
    assert!(
        s.spend_token("mrtr", "acme", "tok_1", T0 + secs(7200))
            .await
            .unwrap()
    );
}

/// Approve with edits links the original request to the edited one while it is pending, once,
/// within its tenant; the link is read back with the request after it is rejected.
pub async fn a_pending_approval_is_superseded_once(b: &Backend) {
    let s = b.store();
    s.create_approval(&approval("apr_orig", "acme", T0))
        .await
        .unwrap();
    s.create_approval(&approval("apr_other", "acme", T0))
        .await
        .unwrap();
    s.create_approval(&approval("apr_late", "acme", T0))
        .await
        .unwrap();
    let at = T0 + secs(1);
    let supersede = |id: &'static str, by: &'static str, who: &'static str, at| {
        s.supersede_approval("acme", id, by, who, "edited", at)
    };
    assert!(
        !s.supersede_approval("globex", "apr_orig", "apr_new", "sup", "edited", at)
            .await
            .unwrap()
    );
    assert!(!supersede("apr_none", "apr_new", "sup", at).await.unwrap());
    assert!(
        !supersede("apr_orig", "apr_new", "agent-7", at).await.unwrap(),
        "not by its proposer"
    );
    assert!(
        !supersede("apr_late", "apr_new", "sup", T0 + secs(900))
            .await
            .unwrap(),
        "not once expired"
    );
    let (a, b2) = tokio::join!(
        supersede("apr_orig", "apr_new", "sup", at),
        s.decide_approval("acme", "apr_orig", "sup-2", Verdict::Approve, None, at)
    );
    let superseded = a.unwrap();
    let approved = b2.unwrap().is_ok();
    assert!(superseded != approved, "one decision wins");
    let read = s
        .get_approval("acme", "apr_orig", T0 + secs(2))
        .await
        .unwrap()
        .unwrap();
    if superseded {
        assert_eq!(
            (
                read.status,
                read.superseded_by.as_deref(),
                read.reviewer.as_deref(),
                read.reason.as_deref()
            ),
            (
                ApprovalStatus::Rejected,
                Some("apr_new"),
                Some("sup"),
                Some("edited")
            )
        );
        assert_eq!(read.decided_at, Some(at));
    } else {
        assert_eq!(
            (read.status, read.superseded_by),
            (ApprovalStatus::Approved, None)
        );
    }
    assert!(!supersede("apr_orig", "apr_newer", "sup", at).await.unwrap());
    // A decided request is not superseded.
    s.decide_approval("acme", "apr_other", "sup", Verdict::Approve, None, at)
        .await
        .unwrap()
        .unwrap();
    assert!(!supersede("apr_other", "apr_new", "sup", at).await.unwrap());
    let other = s
        .get_approval("acme", "apr_other", T0 + secs(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(other.superseded_by, None);
}

/// An approval request and its `approval.requested` event commit together (the outbox): the
/// event is claimable as soon as the request exists, once, in the request's tenant.
pub async fn an_approval_request_commits_with_its_event(b: &Backend) {
    let s = b.store();
    s.create_approval(&approval("apr_evt", "acme", T0)).await.unwrap();
    assert!(s.create_approval(&approval("apr_evt", "acme", T0)).await.is_err());
    let claimed = s
        .claim_jobs("w", EVENT_JOB, 10, Duration::from_secs(60), T0 + secs(1))
        .await
        .unwrap();
    // Not done yet: the sweeper keeps it.
    assert_eq!(s.purge_expired(T0 + secs(2)).await.unwrap().done_jobs, 0);
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let job = &claimed[0].job;
    assert_eq!((job.id.as_str(), job.tenant.as_str()), ("evt_apr_evt", "acme"));
    assert_eq!(
        job.payload,
        json!({"type": "approval.requested", "approval_id": "apr_evt"})
    );
    assert!(
        s.claim_jobs("w2", EVENT_JOB, 10, Duration::from_secs(60), T0 + secs(2))
            .await
            .unwrap()
            .is_empty()
    );
    // Delivered: kept a day after it was due, then swept.
    assert!(
        s.complete_job("evt_apr_evt", "w", &JobCompletion::Done, T0 + secs(3))
            .await
            .unwrap()
    );
    // A decision and an expiry each commit their own event.
    s.decide_approval("acme", "apr_evt", "sup", Verdict::Approve, None, T0 + secs(4))
        .await
        .unwrap()
        .unwrap();
    s.create_approval(&approval("apr_lapse", "acme", T0))
        .await
        .unwrap();
    let events = s
        .claim_jobs("w3", EVENT_JOB, 10, Duration::from_secs(60), T0 + secs(5))
        .await
        .unwrap();
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|j| {
            (
                j.job.payload["type"].as_str().unwrap(),
                j.job.payload["approval_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(kinds.contains(&("approval.decided", "apr_evt")), "{kinds:?}");
    assert!(kinds.contains(&("approval.requested", "apr_lapse")), "{kinds:?}");
    for j in &events {
        s.complete_job(&j.job.id, "w3", &JobCompletion::Done, T0 + secs(5))
            .await
            .unwrap();
    }
    assert_eq!(s.purge_expired(T0 + secs(3600)).await.unwrap().done_jobs, 0);
    let lapsed = s
        .claim_jobs("w4", EVENT_JOB, 10, Duration::from_secs(60), T0 + secs(3601))
        .await
        .unwrap();
    assert_eq!(lapsed.len(), 2, "each approval that lapsed: {lapsed:?}");
    assert!(lapsed.iter().all(|j| j.job.payload["type"] == "approval.expired"));
    // Done and due over a day ago: the two requests and the decision (the expiries still run).
    assert_eq!(s.purge_expired(T0 + secs(86_410)).await.unwrap().done_jobs, 3);
}

fn endpoint(tenant: &str, id: &str, at: OffsetDateTime) -> WebhookEndpoint {
    WebhookEndpoint {
        tenant: tenant.into(),
        id: id.into(),
        url: "https://hooks.example/in".into(),
        events: vec!["approval.requested".into(), "invocation.completed".into()],
        secret: "sealed:abc".into(),
        previous_secret: None,
        previous_until: None,
        description: Some("billing".into()),
        enabled: true,
        disabled_reason: None,
        created_at: at,
        updated_at: at,
    }
}

/// Webhook endpoints are read back as written, per tenant, oldest first; an update replaces
/// what may change and keeps the creation time; attempts are listed newest first, by message
/// or endpoint, never across tenants.
pub async fn webhook_endpoints_and_attempts_are_tenant_scoped(b: &Backend) {
    let s = b.store();
    let first = endpoint("acme", "whe_1", T0);
    s.create_webhook(&first).await.unwrap();
    assert!(s.create_webhook(&first).await.is_err());
    s.create_webhook(&endpoint("acme", "whe_2", T0 + secs(1)))
        .await
        .unwrap();
    s.create_webhook(&endpoint("globex", "whe_3", T0)).await.unwrap();
    let listed = s.list_webhooks("acme").await.unwrap();
    assert_eq!(
        listed.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        ["whe_1", "whe_2"]
    );
    assert_eq!(listed[0], first);
    assert_eq!(s.get_webhook("globex", "whe_1").await.unwrap(), None);

    let mut rotated = first.clone();
    rotated.secret = "sealed:new".into();
    rotated.previous_secret = Some("sealed:abc".into());
    rotated.previous_until = Some(T0 + secs(86_400));
    rotated.enabled = false;
    rotated.disabled_reason = Some("410 Gone".into());
    rotated.events = Vec::new();
    rotated.updated_at = T0 + secs(5);
    rotated.created_at = T0 + secs(99);
    assert!(s.update_webhook(&rotated).await.unwrap());
    let read = s.get_webhook("acme", "whe_1").await.unwrap().unwrap();
    assert_eq!(
        read,
        WebhookEndpoint {
            created_at: T0,
            ..rotated.clone()
        }
    );
    let mut foreign = rotated.clone();
    foreign.tenant = "initech".into();
    assert!(!s.update_webhook(&foreign).await.unwrap());

    let attempt = |message: &str, n: u32, tenant: &str, at| WebhookAttempt {
        tenant: tenant.into(),
        message_id: message.into(),
        endpoint_id: "whe_1".into(),
        attempt: n,
        at,
        status: (n > 1).then_some(200),
        latency_ms: 12,
        response: Some("ok".into()),
        error: (n == 1).then(|| "timed out".to_owned()),
    };
    s.record_webhook_attempt(&attempt("msg_1", 1, "acme", T0 + secs(1)))
        .await
        .unwrap();
    s.record_webhook_attempt(&attempt("msg_1", 2, "acme", T0 + secs(6)))
        .await
        .unwrap();
    assert!(
        s.record_webhook_attempt(&attempt("msg_1", 2, "acme", T0 + secs(7)))
            .await
            .is_err()
    );
    s.record_webhook_attempt(&attempt("msg_2", 1, "acme", T0 + secs(3)))
        .await
        .unwrap();
    s.record_webhook_attempt(&attempt("msg_9", 1, "globex", T0 + secs(3)))
        .await
        .unwrap();
    let of_msg = s
        .list_webhook_attempts("acme", Some("msg_1"), None, 10)
        .await
        .unwrap();
    assert_eq!(of_msg.iter().map(|a| a.attempt).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(of_msg[1], attempt("msg_1", 1, "acme", T0 + secs(1)));
    let of_endpoint = s
        .list_webhook_attempts("acme", None, Some("whe_1"), 2)
        .await
        .unwrap();
    assert_eq!(
        of_endpoint
            .iter()
            .map(|a| (a.message_id.as_str(), a.attempt))
            .collect::<Vec<_>>(),
        [("msg_1", 2), ("msg_2", 1)]
    );
    assert!(
        s.list_webhook_attempts("globex", Some("msg_1"), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A dead job is put back in the queue once, in its tenant only, with its attempts reset.
pub async fn a_dead_job_is_replayed_once(b: &Backend) {
    let s = b.store();
    s.enqueue_job(&NewJob {
        id: "job_dead".into(),
        tenant: "acme".into(),
        kind: WEBHOOK_JOB.into(),
        payload: json!({"event": "evt_1"}),
        run_at: T0,
        max_attempts: 1,
    })
    .await
    .unwrap();
    let claimed = s
        .claim_jobs("w", WEBHOOK_JOB, 5, Duration::from_secs(60), T0)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(
        !s.requeue_dead_job("acme", "job_dead", T0).await.unwrap(),
        "running, not dead"
    );
    assert!(
        s.complete_job(
            "job_dead",
            "w",
            &JobCompletion::Dead { error: "410".into() },
            T0 + secs(1)
        )
        .await
        .unwrap()
    );
    assert_eq!(s.list_dead_jobs("acme", 10).await.unwrap().len(), 1);
    assert!(
        !s.requeue_dead_job("globex", "job_dead", T0 + secs(2))
            .await
            .unwrap()
    );
    assert!(
        s.requeue_dead_job("acme", "job_dead", T0 + secs(2))
            .await
            .unwrap()
    );
    assert!(
        !s.requeue_dead_job("acme", "job_dead", T0 + secs(2))
            .await
            .unwrap()
    );
    assert!(s.list_dead_jobs("acme", 10).await.unwrap().is_empty());
    let again = s
        .claim_jobs("w2", WEBHOOK_JOB, 5, Duration::from_secs(60), T0 + secs(2))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 1);
}

fn inbound_source(tenant: &str, id: &str, at: OffsetDateTime) -> InboundSource {
    InboundSource {
        tenant: tenant.into(),
        id: id.into(),
        provider: warrant_core::inbound::Provider::Stripe,
        secret: "sealed:abc".into(),
        previous_secret: None,
        previous_until: None,
        key_id: "key_1".into(),
        action: json!({"workflow": "refund@1", "input": {"charge": "${event.data.object.id}"}}),
        description: Some("billing".into()),
        enabled: true,
        refusals: 0,
        last_refusal: None,
        last_refusal_at: None,
        created_at: at,
        updated_at: at,
    }
}

fn inbound_event(source: &str, event: &str, at: OffsetDateTime) -> (InboundEvent, NewJob) {
    (
        InboundEvent {
            tenant: "acme".into(),
            source_id: source.into(),
            event_id: event.into(),
            body: json!({"id": event, "type": "charge.refunded"}),
            body_digest: "ab".repeat(32),
            status: InboundStatus::Queued,
            deliveries: 1,
            detail: None,
            received_at: at,
            updated_at: at,
        },
        NewJob {
            id: format!("inb_{source}_{event}"),
            tenant: "acme".into(),
            kind: INBOUND_JOB.into(),
            payload: json!({"source_id": source, "event_id": event}),
            run_at: at,
            max_attempts: 5,
        },
    )
}

/// Inbound sources are found by id alone and listed per tenant; a refusal is counted on its
/// source; an event is stored with its job once — of concurrent deliveries on two nodes exactly
/// one is accepted, the others are counted — it finishes once, and it is kept for the
/// retention (then purged once handled).
pub async fn inbound_events_are_accepted_once_with_their_job(b: &Backend) {
    let s = b.store();
    let source = inbound_source("acme", "ins_1", T0);
    s.create_inbound_source(&source).await.unwrap();
    assert!(s.create_inbound_source(&source).await.is_err());
    s.create_inbound_source(&inbound_source("globex", "ins_2", T0))
        .await
        .unwrap();
    assert_eq!(s.get_inbound_source("ins_1").await.unwrap(), Some(source.clone()));
    assert_eq!(
        s.list_inbound_sources("acme")
            .await
            .unwrap()
            .iter()
            .map(|i| i.id.as_str())
            .collect::<Vec<_>>(),
        ["ins_1"]
    );
    s.note_inbound_refusal("ins_1", "no signature matches", T0 + secs(1))
        .await
        .unwrap();
    let refused = s.get_inbound_source("ins_1").await.unwrap().unwrap();
    assert_eq!(refused.refusals, 1);
    assert_eq!(refused.last_refusal.as_deref(), Some("no signature matches"));
    assert_eq!(refused.last_refusal_at, Some(T0 + secs(1)));
    let mut rotated = refused.clone();
    rotated.secret = "sealed:new".into();
    rotated.previous_secret = Some("sealed:abc".into());
    rotated.previous_until = Some(T0 + secs(86_400));
    rotated.enabled = false;
    rotated.updated_at = T0 + secs(2);
    assert!(s.update_inbound_source(&rotated).await.unwrap());
    assert_eq!(
        s.get_inbound_source("ins_1").await.unwrap(),
        Some(rotated.clone())
    );
    let mut foreign = rotated.clone();
    foreign.tenant = "globex".into();
    assert!(!s.update_inbound_source(&foreign).await.unwrap());

    // Three deliveries of one event at once, through both nodes: one is accepted.
    let mut racing = Vec::new();
    for i in 0..3 {
        let store = b.node(i);
        racing.push(tokio::spawn(async move {
            let (event, job) = inbound_event("ins_1", "evt_1", T0 + secs(3));
            store.accept_inbound(&event, &job).await.unwrap()
        }));
    }
    let mut accepted = 0;
    for r in racing {
        accepted += usize::from(r.await.unwrap());
    }
    assert_eq!(accepted, 1);
    let stored = s
        .get_inbound_event("acme", "ins_1", "evt_1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.deliveries, 3);
    assert_eq!(stored.status, InboundStatus::Queued);
    assert_eq!(stored.body["type"], "charge.refunded");
    assert_eq!(
        s.get_inbound_event("globex", "ins_1", "evt_1").await.unwrap(),
        None
    );
    let jobs = s
        .claim_jobs("w1", INBOUND_JOB, 10, Duration::from_secs(30), T0 + secs(3))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "one job for one event");

    let (second, job) = inbound_event("ins_1", "evt_2", T0 + secs(4));
    assert!(s.accept_inbound(&second, &job).await.unwrap());
    let listed = s.list_inbound_events("acme", "ins_1", 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(),
        ["evt_2", "evt_1"]
    );

    let detail = json!({"run_id": "run_1"});
    assert!(
        s.finish_inbound(
            "acme",
            "ins_1",
            "evt_1",
            InboundStatus::Started,
            &detail,
            T0 + secs(5)
        )
        .await
        .unwrap()
    );
    assert!(
        !s.finish_inbound(
            "acme",
            "ins_1",
            "evt_1",
            InboundStatus::Failed,
            &detail,
            T0 + secs(6)
        )
        .await
        .unwrap(),
        "an event finishes once"
    );
    assert!(
        !s.finish_inbound(
            "globex",
            "ins_1",
            "evt_2",
            InboundStatus::Done,
            &detail,
            T0 + secs(6)
        )
        .await
        .unwrap()
    );
    let finished = s
        .get_inbound_event("acme", "ins_1", "evt_1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (finished.status, finished.detail),
        (InboundStatus::Started, Some(detail))
    );

    // Kept (and so deduplicated) for the retention; then a handled event is purged, a queued
    // one kept.
    let within = T0 + INBOUND_RETENTION - secs(60);
    assert_eq!(s.purge_expired(within).await.unwrap().inbound_events, 0);
    let (again, job) = inbound_event("ins_1", "evt_1", within);
    assert!(!s.accept_inbound(&again, &job).await.unwrap());
    let after = T0 + INBOUND_RETENTION + secs(60);
    assert_eq!(s.purge_expired(after).await.unwrap().inbound_events, 1);
    assert!(
        s.get_inbound_event("acme", "ins_1", "evt_2")
            .await
            .unwrap()
            .is_some()
    );
}

/// The event jobs waiting, claimed: id and event type of each, sorted.
async fn events(s: std::sync::Arc<dyn Store>) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String)> = s
        .claim_jobs("w", EVENT_JOB, 100, Duration::from_secs(60), T0 + secs(3600))
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.job.id, j.job.payload["type"].as_str().unwrap().to_owned()))
        .collect();
    seen.sort();
    seen
}

/// The events only webhook endpoints consume commit with the record that causes them, and only
/// when an enabled endpoint of the tenant subscribes to their type: a call's outcome
/// (`invocation.completed`, `invocation.reconciled`), an exhausted budget counter (once per
/// counter), a tenant contract registered or retired.
pub async fn webhook_only_events_commit_with_their_record_when_subscribed(b: &Backend) {
    let s = b.store();
    let read = |id: &str, tenant: &str| {
        let mut e = entry(id, tenant, T0);
        e.idempotency_key = None;
        e
    };
    // No endpoint: nothing.
    s.record_attempt(&read("led_1", "acme"), &[], &committed(json!({})), T0)
        .await
        .unwrap();
    assert!(events(s.clone()).await.is_empty());

    s.create_webhook(&endpoint("acme", "whe_1", T0)).await.unwrap();
    let mut other = endpoint("globex", "whe_2", T0);
    other.events = vec!["run.completed".into()];
    s.create_webhook(&other).await.unwrap();
    s.record_attempt(&read("led_2", "acme"), &[], &committed(json!({})), T0)
        .await
        .unwrap();
    s.record_attempt(&read("led_3", "globex"), &[], &committed(json!({})), T0)
        .await
        .unwrap();
    // A budget refusal: acme's endpoint does not take `budget.exhausted`.
    let exhausted = |id: &str| {
        let s = s.clone();
        let e = read(id, "acme");
        async move {
            s.record_attempt(&e, &[day_budget(0)], &committed(json!({})), T0)
                .await
                .unwrap()
        }
    };
    assert!(matches!(
        exhausted("led_4").await,
        BudgetOutcome::Exhausted { .. }
    ));
    assert_eq!(
        events(s.clone()).await,
        [(
            "evt_committed_led_2".to_owned(),
            "invocation.completed".to_owned()
        )]
    );

    // An endpoint of every type: the counter's exhaustion is one event, however many calls
    // it refuses; a write that ends unknown, then reconciled; a tenant contract.
    let mut all = endpoint("acme", "whe_3", T0);
    all.events = Vec::new();
    s.create_webhook(&all).await.unwrap();
    exhausted("led_5").await;
    exhausted("led_6").await;
    let write = entry("led_7", "acme", T0);
    let start = s
        .begin_attempt(
            &write,
            Some(&scope("acme", "k-7")),
            &AttemptClaims::NONE,
            T0 + secs(3600),
        )
        .await
        .unwrap();
    assert_eq!(start, AttemptStart::Started);
    let mut unknown = failed("TIMEOUT");
    unknown.outcome = Outcome::Unknown;
    s.finish_attempt(
        "acme",
        "led_7",
        Some(&scope("acme", "k-7")),
        &unknown,
        T0 + secs(1),
    )
    .await
    .unwrap();
    let mut reconciled = failed("TIMEOUT");
    reconciled.outcome = Outcome::ReconciledNotCommitted;
    s.finish_attempt(
        "acme",
        "led_7",
        Some(&scope("acme", "k-7")),
        &reconciled,
        T0 + secs(2),
    )
    .await
    .unwrap();
    let mut mine = contract("refund", 1, "tool-contract@sha256:cc");
    mine.namespace = Namespace::Tenant("acme".into());
    s.register_contract(&mine).await.unwrap();
    assert!(
        s.retire_contract(&mine.namespace, "tool-contract@sha256:cc", T0 + secs(5))
            .await
            .unwrap()
    );
    assert!(
        s.retire_contract(&mine.namespace, "tool-contract@sha256:cc", T0 + secs(6))
            .await
            .unwrap()
    );
    let seen = events(s.clone()).await;
    let kinds: Vec<&str> = seen.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "budget.exhausted",
            "invocation.reconciled",
            "contract.registered",
            "contract.retired",
            "invocation.completed",
        ],
        "{seen:?}"
    );
    assert!(seen[0].0.starts_with("evt_budget_acme_calls_per_day"), "{seen:?}");
    assert_eq!(seen[1].0, "evt_reconciled_not_committed_led_7");
    assert_eq!(seen[4].0, "evt_unknown_led_7");
}

/// A write refused by its budget in its write-ahead commit leaves nothing of its claims, but
/// the counter's `budget.exhausted` event commits with its row, as a read's does.
pub async fn a_write_refused_by_its_budget_notifies_subscribers(b: &Backend) {
    let s = b.store();
    let mut all = endpoint("acme", "whe_b", T0);
    all.events = Vec::new();
    s.create_webhook(&all).await.unwrap();
    let start = s
        .begin_attempt(
            &entry("led_b1", "acme", T0),
            Some(&scope("acme", "k-b1")),
            &AttemptClaims {
                approval: None,
                reservations: vec![day_budget(0)],
            },
            T0 + secs(3600),
        )
        .await
        .unwrap();
    assert_eq!(start, AttemptStart::BudgetExhausted { key: DAY_KEY.into() });
    assert_eq!(s.get_idempotency(&scope("acme", "k-b1")).await.unwrap(), None);
    let seen = events(s).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].1, "budget.exhausted");
    assert!(seen[0].0.starts_with("evt_budget_acme_calls_per_day"), "{seen:?}");
}

/// A worker that renews its lease keeps its job past the first lease; once it stops renewing
/// another worker takes the job over, and the first can no longer renew (or complete) it.
pub async fn a_renewed_lease_is_not_taken_over(b: &Backend) {
    let s = b.store();
    s.enqueue_job(&job("job_r", T0, 3)).await.unwrap();
    let lease = Duration::from_secs(10);
    assert_eq!(
        s.claim_jobs("w1", "webhook.deliver", 1, lease, T0)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(s.renew_job("job_r", "w1", T0 + secs(30)).await.unwrap());
    assert!(
        !s.renew_job("job_r", "w2", T0 + secs(60)).await.unwrap(),
        "not w2's"
    );
    assert!(
        b.node(1)
            .claim_jobs("w2", "webhook.deliver", 1, lease, T0 + secs(16))
            .await
            .unwrap()
            .is_empty(),
        "renewed past the first lease"
    );
    let taken = b
        .node(1)
        .claim_jobs("w2", "webhook.deliver", 1, lease, T0 + secs(31))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "the renewal lapsed");
    assert!(
        !s.renew_job("job_r", "w1", T0 + secs(60)).await.unwrap(),
        "w1 lost it"
    );
    assert!(
        !s.complete_job("job_r", "w1", &JobCompletion::Done, T0 + secs(32))
            .await
            .unwrap()
    );
    assert!(
        s.complete_job("job_r", "w2", &JobCompletion::Done, T0 + secs(32))
            .await
            .unwrap()
    );
}

/// A run started with its first step claimed is the claiming worker's until the lease lapses;
/// a tool step followed by an `end` records both steps and ends the run in one advance.
pub async fn a_run_handed_on_start_ends_with_its_last_tool_step(b: &Backend) {
    let s = b.store();
    let run = running("run_e");
    let first = NewJob {
        id: "job_e0".into(),
        tenant: "acme".into(),
        kind: "workflow.step".into(),
        payload: json!({"run_id": "run_e", "seq": 0}),
        run_at: T0,
        max_attempts: 5,
    };
    let held = s
        .start_run_claimed(&run, &first, "w1", T0 + secs(30))
        .await
        .unwrap();
    assert_eq!(
        (held.status, held.attempts, held.locked_by.as_deref()),
        (JobStatus::Running, 1, Some("w1"))
    );
    assert!(
        s.start_run_claimed(&run, &first, "w1", T0 + secs(30))
            .await
            .is_err(),
        "one run per id"
    );
    let lease = Duration::from_secs(30);
    assert!(
        b.node(1)
            .claim_jobs("w2", "workflow.step", 10, lease, T0 + secs(1))
            .await
            .unwrap()
            .is_empty(),
        "handed: w1's"
    );
    let step = RunStep {
        run_id: "run_e".into(),
        seq: 0,
        step_id: "one".into(),
        kind: "tool".into(),
        status: "completed".into(),
        output: Some(json!({"ok": true})),
        ledger_id: Some("led_1".into()),
        cost: 2,
        detail: None,
        finished_at: T0 + secs(1),
    };
    let end = RunAdvance::EndAt {
        step: "done".into(),
        status: RunStatus::Completed,
        error: None,
    };
    let handoff = Handoff {
        worker: "w1".into(),
        job_id: "job_e0".into(),
        lease_until: T0 + secs(31),
    };
    let advanced = s
        .advance_run("acme", &step, &end, Some(&handoff), T0 + secs(1))
        .await
        .unwrap();
    assert_eq!(advanced, Advanced::Recorded { next: None });
    let ended = s.get_run("acme", "run_e").await.unwrap().unwrap();
    assert_eq!(
        (ended.status, ended.next_seq, ended.cost, ended.next_step),
        (RunStatus::Completed, 2, 2, None)
    );
    let steps = s.run_steps("acme", "run_e").await.unwrap();
    assert_eq!(
        steps
            .iter()
            .map(|s| (s.seq, s.step_id.as_str(), s.kind.as_str()))
            .collect::<Vec<_>>(),
        [(0, "one", "tool"), (1, "done", "end")]
    );
    assert!(
        s.claim_jobs("w3", "workflow.step", 10, lease, T0 + secs(100))
            .await
            .unwrap()
            .is_empty(),
        "the handed job is done"
    );
    assert!(
        s.claim_jobs("w3", EVENT_JOB, 10, lease, T0 + secs(100))
            .await
            .unwrap()
            .is_empty(),
        "no endpoint of the tenant: no run events"
    );
}

/// A run of acme's `refund@1` that has just started (its next step `one`).
fn running(id: &str) -> RunRecord {
    RunRecord {
        id: id.into(),
        tenant: "acme".into(),
        workflow: "refund".into(),
        version: 1,
        digest: "sha256:aa".into(),
        status: RunStatus::Running,
        input: json!({}),
        principal: json!({"id": "agent-7", "tenant": "acme", "grants": [], "roles": []}),
        next_step: Some("one".into()),
        next_seq: 0,
        cost: 0,
        error: None,
        created_at: T0,
        updated_at: T0,
    }
}

/// A request's sealed copy of its exact arguments is kept while it can be decided or executed,
/// and dropped when it is consumed, rejected (or superseded) or expired by the sweeper.
pub async fn sealed_arguments_are_kept_only_while_a_request_is_live(b: &Backend) {
    let s = b.store();
    let sealed = |id: &str, at| NewApproval {
        sealed_arguments: Some(format!("s1.nonce.{id}")),
        ..approval(id, "acme", at)
    };
    for id in ["apr_c", "apr_r", "apr_s", "apr_e"] {
        s.create_approval(&sealed(id, T0)).await.unwrap();
    }
    let at = T0 + secs(1);
    let kept = |id: &'static str, when| {
        let s = s.clone();
        async move {
            s.get_approval("acme", id, when)
                .await
                .unwrap()
                .unwrap()
                .request
                .sealed_arguments
        }
    };
    assert_eq!(kept("apr_c", at).await.as_deref(), Some("s1.nonce.apr_c"));
    // Approved: still kept (the call may be executed on the decision).
    let approved = s
        .decide_approval("acme", "apr_c", "sup", Verdict::Approve, None, at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        approved.request.sealed_arguments.as_deref(),
        Some("s1.nonce.apr_c")
    );
    assert_eq!(kept("apr_c", at).await.as_deref(), Some("s1.nonce.apr_c"));
    // Consumed: dropped.
    assert!(matches!(
        s.consume_approval("acme", &claim_for("apr_c"), at).await.unwrap(),
        ConsumeOutcome::Consumed(_)
    ));
    assert_eq!(kept("apr_c", at).await, None);
    // Rejected: dropped.
    s.decide_approval("acme", "apr_r", "sup", Verdict::Reject, None, at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept("apr_r", at).await, None);
    // Superseded by an edit: dropped.
    assert!(
        s.supersede_approval("acme", "apr_s", "apr_new", "sup", "edited", at)
            .await
            .unwrap()
    );
    assert_eq!(kept("apr_s", at).await, None);
    // Expired by the sweeper: dropped.
    let after = T0 + secs(901);
    assert_eq!(kept("apr_e", at).await.as_deref(), Some("s1.nonce.apr_e"));
    assert_eq!(s.purge_expired(after).await.unwrap().approvals_expired, 1);
    assert_eq!(kept("apr_e", after).await, None);
}
