//! The Cedar engine against the example contracts and policies: decisions, load-time
//! refusals, the generated schema and the context mapping.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use warrant_core::Contract;
use warrant_core::authority::Principal;
use warrant_core::contract::DocumentFormat;
use warrant_core::policy::{PolicyAction, PolicyEngine, PolicyRequest, PolicyVerdict};
use warrant_policy::{CedarEngine, PolicyLoadError, PolicySource};

const CREDIT: &str = include_str!("../../../examples/contracts/create_support_credit.v1.yaml");
const LOOKUP: &str = include_str!("../../../examples/contracts/lookup_order.v1.yaml");
const EMAIL: &str = include_str!("../../../examples/contracts/send_email.v1.yaml");
const VALIDATOR: &str = include_str!("../../../examples/contracts/workflow_validator.v1.yaml");
const SUPPORT_POLICIES: &str = include_str!("../../../examples/policies/support.cedar");
const EMAIL_POLICIES: &str = include_str!("../../../examples/policies/email.cedar");
const GUARD_POLICIES: &str = include_str!("../../../examples/policies/guards.cedar");

fn contract(text: &str) -> Arc<Contract> {
    Arc::new(Contract::from_text(text, DocumentFormat::Yaml).unwrap())
}

fn contracts() -> Vec<Arc<Contract>> {
    vec![
        contract(CREDIT),
        contract(LOOKUP),
        contract(EMAIL),
        contract(VALIDATOR),
    ]
}

fn policies_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/policies")
}

fn engine() -> CedarEngine {
    CedarEngine::load_dir(&contracts(), &policies_dir()).unwrap()
}

/// The example contracts with one extra policy file.
fn engine_with(extra: &str) -> Result<CedarEngine, PolicyLoadError> {
    CedarEngine::new(
        &contracts(),
        &[
            PolicySource::new("support.cedar", SUPPORT_POLICIES),
            PolicySource::new(
                "orders.cedar",
                include_str!("../../../examples/policies/orders.cedar"),
            ),
            PolicySource::new("extra.cedar", extra),
        ],
    )
}

fn principal(id: &str, tenant: &str, roles: &[&str]) -> Principal {
    Principal::new(id, tenant, Vec::new())
        .unwrap()
        .with_roles(roles.iter().map(|r| (*r).to_owned()))
        .unwrap()
}

fn ask(
    engine: &CedarEngine,
    who: &Principal,
    action: PolicyAction,
    contract: &Contract,
    args: Value,
) -> PolicyVerdict {
    let arguments = args.as_object().unwrap();
    engine.authorize(&PolicyRequest {
        principal: who,
        action,
        contract,
        arguments,
    })
}

fn credit_args(amount: i64) -> Value {
    json!({ "customer_id": "cus_abcdefgh", "amount_cents": amount, "reason": "late delivery" })
}

fn email_args() -> Value {
    json!({ "to": ["ann@example.com"], "subject": "hello", "body": "text" })
}

fn default_deny() -> PolicyVerdict {
    PolicyVerdict::Deny {
        policies: Vec::new(),
        errors: Vec::new(),
    }
}

fn problems(error: PolicyLoadError) -> Vec<(Option<String>, String)> {
    match error {
        PolicyLoadError::Invalid(problems) => problems.into_iter().map(|p| (p.file, p.message)).collect(),
        other => panic!("expected invalid policies, got {other}"),
    }
}

#[test]
fn engine_is_send_sync_and_cheap_to_clone() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<CedarEngine>();
}

#[test]
fn examples_load_with_annotated_ids_in_file_order() {
    let engine = engine();
    assert_eq!(
        engine.policy_ids(),
        [
            "email.send",
            "email.supervisor-review",
            "email.supervisor-reveal",
            "guard.suspended",
            "guard.irreversible-own-tenant",
            "orders.agent-lookup",
            "support.operator-credit",
            "support.supervisor-credit",
            "support.supervisor-review-credit",
            "tenants.own-contracts",
            "workflows.agent-validate",
        ]
    );
}

#[test]
fn operators_credit_up_to_50000() {
    let engine = engine();
    let credit = contract(CREDIT);
    let operator = principal("op-1", "acme", &["operator"]);
    let invoke = PolicyAction::Invoke;
    assert_eq!(
        ask(&engine, &operator, invoke, &credit, credit_args(50000)),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask(&engine, &operator, invoke, &credit, credit_args(1)),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask(&engine, &operator, invoke, &credit, credit_args(50001)),
        default_deny()
    );
}

#[test]
fn supervisors_credit_any_amount() {
    let engine = engine();
    let credit = contract(CREDIT);
    let supervisor = principal("sup-1", "acme", &["supervisor"]);
    let verdict = ask(
        &engine,
        &supervisor,
        PolicyAction::Invoke,
        &credit,
        credit_args(400_000),
    );
    assert_eq!(verdict, PolicyVerdict::Allow);
}

#[test]
fn agents_cannot_credit_but_can_look_up_orders() {
    let engine = engine();
    let agent = principal("agent-7", "acme", &["agent"]);
    let credit = contract(CREDIT);
    let lookup = contract(LOOKUP);
    assert_eq!(
        ask(&engine, &agent, PolicyAction::Invoke, &credit, credit_args(100)),
        default_deny()
    );
    let order = json!({ "order_id": "ord_ABCDEFGH" });
    assert_eq!(
        ask(&engine, &agent, PolicyAction::Invoke, &lookup, order),
        PolicyVerdict::Allow
    );
    let operator = principal("op-1", "acme", &["operator"]);
    let order = json!({ "order_id": "ord_ABCDEFGH" });
    assert_eq!(
        ask(&engine, &operator, PolicyAction::Invoke, &lookup, order),
        default_deny()
    );
}

#[test]
fn review_permissions() {
    let engine = engine();
    let credit = contract(CREDIT);
    let email = contract(EMAIL);
    let supervisor = principal("sup-1", "acme", &["supervisor"]);
    let operator = principal("op-1", "acme", &["operator"]);
    let agent = principal("agent-7", "acme", &["agent"]);
    let review = PolicyAction::Review;
    assert_eq!(
        ask(&engine, &supervisor, review, &credit, credit_args(400_000)),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask(&engine, &supervisor, review, &email, email_args()),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask(&engine, &operator, review, &credit, credit_args(10)),
        default_deny()
    );
    assert_eq!(ask(&engine, &agent, review, &email, email_args()), default_deny());
    // Invoking and reviewing are different actions: a reviewer does not get to send.
    assert_eq!(
        ask(&engine, &supervisor, PolicyAction::Invoke, &email, email_args()),
        default_deny()
    );
    assert_eq!(
        ask(&engine, &agent, PolicyAction::Invoke, &email, email_args()),
        PolicyVerdict::Allow
    );
}

#[test]
fn forbid_wins_and_is_reported_by_id() {
    let engine = engine();
    let credit = contract(CREDIT);
    let suspended = principal("sup-2", "acme", &["supervisor", "suspended"]);
    for action in [PolicyAction::Invoke, PolicyAction::Review] {
        assert_eq!(
            ask(&engine, &suspended, action, &credit, credit_args(10)),
            PolicyVerdict::Deny {
                policies: vec!["guard.suspended".into()],
                errors: Vec::new(),
            }
        );
    }
}

#[test]
fn unannotated_policies_get_file_and_index_ids() {
    let engine = engine_with(
        r#"permit (principal in Warrant::Role::"auditor", action, resource);
           forbid (principal in Warrant::Role::"auditor", action in Warrant::Action::"review", resource);"#,
    )
    .unwrap();
    assert!(engine.policy_ids().iter().any(|id| id == "extra.cedar#0"));
    let auditor = principal("aud-1", "acme", &["auditor"]);
    let credit = contract(CREDIT);
    assert_eq!(
        ask(&engine, &auditor, PolicyAction::Review, &credit, credit_args(10)),
        PolicyVerdict::Deny {
            policies: vec!["extra.cedar#1".into()],
            errors: Vec::new(),
        }
    );
    assert_eq!(
        ask(&engine, &auditor, PolicyAction::Invoke, &credit, credit_args(10)),
        PolicyVerdict::Allow
    );
}

#[test]
fn the_invoke_group_covers_every_tool() {
    let engine = engine_with(
        r#"@id("auditor.read-anything")
           permit (principal in Warrant::Role::"auditor", action in Warrant::Action::"invoke", resource)
           when { resource.effect == "read" };"#,
    )
    .unwrap();
    let auditor = principal("aud-1", "acme", &["auditor"]);
    let lookup = contract(LOOKUP);
    let credit = contract(CREDIT);
    let order = json!({ "order_id": "ord_ABCDEFGH", "include_items": true });
    assert_eq!(
        ask(&engine, &auditor, PolicyAction::Invoke, &lookup, order),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask(&engine, &auditor, PolicyAction::Invoke, &credit, credit_args(1)),
        default_deny()
    );
    // `invoke` does not contain the review actions.
    let order = json!({ "order_id": "ord_ABCDEFGH" });
    assert_eq!(
        ask(&engine, &auditor, PolicyAction::Review, &lookup, order),
        default_deny()
    );
}

#[test]
fn principal_and_tool_attributes_are_visible() {
    let engine = engine_with(
        r#"@id("acme.owner")
           permit (
               principal,
               action == Warrant::Action::"lookup_order@1",
               resource == Warrant::Tool::"lookup_order@1"
           )
           when {
               principal == Warrant::Principal::"acme/bob" && principal.id == "bob" &&
               principal.tenant == "acme" && principal.roles.contains("clerk") &&
               resource.name == "lookup_order" && resource.version == 1 &&
               resource.owner == "commerce-platform" && resource.tenant == "acme"
           };"#,
    )
    .unwrap();
    let lookup = contract(LOOKUP);
    let order = || json!({ "order_id": "ord_ABCDEFGH" });
    let bob = principal("bob", "acme", &["clerk"]);
    assert_eq!(
        ask(&engine, &bob, PolicyAction::Invoke, &lookup, order()),
        PolicyVerdict::Allow
    );
    let other_tenant = principal("bob", "globex", &["clerk"]);
    assert_eq!(
        ask(&engine, &other_tenant, PolicyAction::Invoke, &lookup, order()),
        default_deny()
    );
}

#[test]
fn unknown_context_field_is_refused_at_load() {
    let error = engine_with(
        r#"@id("typo")
           permit (principal, action == Warrant::Action::"create_support_credit@1", resource)
           when { context.amount <= 100 };"#,
    )
    .unwrap_err();
    let text = error.to_string();
    let problems = problems(error);
    assert_eq!(problems.len(), 1, "{problems:?}");
    let (file, message) = &problems[0];
    assert_eq!(file.as_deref(), Some("extra.cedar"));
    assert!(message.contains("amount"), "{message}");
    assert!(text.contains("extra.cedar: "), "{text}");
}

#[test]
fn wrong_types_and_unknown_entities_are_refused_at_load() {
    for (policy, needle) in [
        (
            r#"permit (principal, action == Warrant::Action::"create_support_credit@1", resource)
               when { context.amount_cents == "50000" };"#,
            "",
        ),
        (
            r#"permit (principal, action == Warrant::Action::"create_support_credit@2", resource);"#,
            "create_support_credit@2",
        ),
        (
            r#"permit (principal in Warrant::Group::"x", action, resource);"#,
            "Group",
        ),
        // Optional attributes need `has`.
        (
            r#"permit (principal, action == Warrant::Action::"lookup_order@1", resource)
               when { context.include_items };"#,
            "include_items",
        ),
        // A context field of another tool, reached through a group that spans tools.
        (
            r#"permit (principal, action in Warrant::Action::"invoke", resource)
               when { context.amount_cents < 5 };"#,
            "amount_cents",
        ),
    ] {
        let problems = problems(engine_with(policy).unwrap_err());
        assert!(
            problems
                .iter()
                .all(|(file, _)| file.as_deref() == Some("extra.cedar"))
        );
        assert!(
            problems.iter().any(|(_, message)| message.contains(needle)),
            "{problems:?} lack {needle}"
        );
    }
}

#[test]
fn impossible_policies_are_refused_at_load() {
    let problems =
        problems(engine_with(r#"permit (principal == Warrant::Role::"x", action, resource);"#).unwrap_err());
    assert!(!problems.is_empty());
    assert!(
        problems
            .iter()
            .all(|(file, _)| file.as_deref() == Some("extra.cedar"))
    );
}

#[test]
fn syntax_errors_are_refused_with_the_file_name() {
    let error = CedarEngine::new(
        &contracts(),
        &[
            PolicySource::new("good.cedar", SUPPORT_POLICIES),
            PolicySource::new("broken.cedar", "permit (principal, action, resource) when { ;"),
        ],
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("broken.cedar: syntax error"),
        "{error}"
    );
    let problems = problems(error);
    assert!(
        problems
            .iter()
            .all(|(file, _)| file.as_deref() == Some("broken.cedar"))
    );
}

#[test]
fn duplicate_ids_templates_and_empty_ids_are_refused() {
    let duplicate = r#"@id("support.operator-credit") permit (principal, action, resource);"#;
    let problems_found = problems(engine_with(duplicate).unwrap_err());
    assert_eq!(
        problems_found,
        vec![(
            Some("extra.cedar".into()),
            "policy id `support.operator-credit` is also used in support.cedar".into()
        )]
    );
    let template = r#"permit (principal == ?principal, action, resource);"#;
    let problems_found = problems(engine_with(template).unwrap_err());
    assert!(problems_found[0].1.contains("templates"), "{problems_found:?}");
    let empty = r#"@id("") permit (principal, action, resource);"#;
    let problems_found = problems(engine_with(empty).unwrap_err());
    assert_eq!(problems_found[0].1, "policy #0 has an empty `@id`");
}

#[test]
fn every_problem_is_listed() {
    let error = CedarEngine::new(
        &contracts(),
        &[
            PolicySource::new(
                "a.cedar",
                "permit (principal, action, resource) when { context.x };",
            ),
            PolicySource::new(
                "b.cedar",
                r#"permit (principal in Warrant::Nope::"x", action, resource);"#,
            ),
            PolicySource::new("c.cedar", "permit (principal, action, resource"),
        ],
    )
    .unwrap_err();
    let files: Vec<Option<String>> = problems(error).into_iter().map(|(file, _)| file).collect();
    for name in ["a.cedar", "b.cedar", "c.cedar"] {
        assert!(files.contains(&Some(name.into())), "{files:?} lacks {name}");
    }
}

#[test]
fn contract_missing_from_the_schema_is_denied() {
    let engine = CedarEngine::new(
        &[contract(CREDIT), contract(LOOKUP)],
        &[PolicySource::new("support.cedar", SUPPORT_POLICIES)],
    )
    .unwrap();
    let agent = principal("agent-7", "acme", &["agent"]);
    let email = contract(EMAIL);
    assert_eq!(
        ask(&engine, &agent, PolicyAction::Invoke, &email, email_args()),
        PolicyVerdict::Deny {
            policies: Vec::new(),
            errors: vec!["contract send_email@1 is not in the policy schema; reload policies".into()],
        }
    );
}

#[test]
fn a_changed_contract_under_the_same_version_is_denied() {
    let engine = engine();
    let changed = contract(&LOOKUP.replace("Look up one order", "Look up an order"));
    let agent = principal("agent-7", "acme", &["agent"]);
    let verdict = ask(
        &engine,
        &agent,
        PolicyAction::Invoke,
        &changed,
        json!({ "order_id": "ord_ABCDEFGH" }),
    );
    assert_eq!(
        verdict,
        PolicyVerdict::Deny {
            policies: Vec::new(),
            errors: vec![
                "contract lookup_order@1 is not the one the policies were loaded with; reload policies"
                    .into()
            ],
        }
    );
}

#[test]
fn policies_for_a_contract_that_is_not_registered_are_refused() {
    let error = CedarEngine::new(
        &[contract(CREDIT), contract(LOOKUP)],
        &[PolicySource::new("email.cedar", EMAIL_POLICIES)],
    )
    .unwrap_err();
    let problems = problems(error);
    assert!(!problems.is_empty());
    assert!(
        problems
            .iter()
            .all(|(file, _)| file.as_deref() == Some("email.cedar"))
    );
}

#[test]
fn contracts_named_like_action_groups_are_refused() {
    let invoke = contract(&LOOKUP.replace("name: lookup_order", "name: invoke"));
    let error = CedarEngine::new(&[invoke], &[]).unwrap_err();
    assert_eq!(
        problems(error),
        vec![(
            None,
            "contract invoke@1 cannot be named in policies: `invoke` is the name of an action group".into()
        )]
    );
}

#[test]
fn wrong_argument_types_are_denied_not_coerced() {
    // Arguments are validated against the contract before the policy stage; if a caller skips
    // that, the engine still refuses a wrong type or a missing field instead of guessing.
    let engine = engine();
    let credit = contract(CREDIT);
    let supervisor = principal("sup-1", "acme", &["supervisor"]);
    let wrong = json!({ "customer_id": "cus_abcdefgh", "amount_cents": "400000", "reason": "x" });
    assert_eq!(
        ask(&engine, &supervisor, PolicyAction::Invoke, &credit, wrong),
        PolicyVerdict::Deny {
            policies: Vec::new(),
            errors: vec!["argument `amount_cents` does not fit its policy type".into()],
        }
    );
    let missing = json!({ "customer_id": "cus_abcdefgh", "reason": "x" });
    assert_eq!(
        ask(&engine, &supervisor, PolicyAction::Invoke, &credit, missing),
        PolicyVerdict::Deny {
            policies: Vec::new(),
            errors: vec!["required argument `amount_cents` is missing from the policy context".into()],
        }
    );
}

#[test]
fn evaluation_errors_are_reported_without_values() {
    let engine = engine_with(
        r#"@id("overflow")
           permit (principal, action == Warrant::Action::"create_support_credit@1", resource)
           when { context.amount_cents * 9223372036854775807 > 0 };"#,
    )
    .unwrap();
    let nobody = principal("n-1", "acme", &[]);
    assert_eq!(
        ask(
            &engine,
            &nobody,
            PolicyAction::Invoke,
            &contract(CREDIT),
            credit_args(2)
        ),
        PolicyVerdict::Deny {
            policies: Vec::new(),
            errors: vec!["policy `overflow` could not be evaluated: integer overflow".into()],
        }
    );
}

#[test]
fn arrays_become_sets() {
    let engine = engine_with(
        r#"@id("email.internal-only")
           permit (principal in Warrant::Role::"clerk", action == Warrant::Action::"send_email@1", resource)
           when {
               context.to.containsAll(["ann@example.com"]) &&
               !(context has cc && !context.cc.isEmpty()) &&
               context.subject like "re: *"
           };"#,
    )
    .unwrap();
    let clerk = principal("clerk-1", "acme", &["clerk"]);
    let email = contract(EMAIL);
    let send = |args: Value| ask(&engine, &clerk, PolicyAction::Invoke, &email, args);
    let base =
        || json!({ "to": ["bob@example.com", "ann@example.com"], "subject": "re: order", "body": "x" });
    assert_eq!(send(base()), PolicyVerdict::Allow);
    let mut with_empty_cc = base();
    with_empty_cc["cc"] = json!([]);
    assert_eq!(send(with_empty_cc), PolicyVerdict::Allow);
    let mut with_cc = base();
    with_cc["cc"] = json!(["carl@example.com"]);
    assert_eq!(send(with_cc), default_deny());
    let mut other = base();
    other["to"] = json!(["bob@example.com"]);
    assert_eq!(send(other), default_deny());
}

#[test]
fn optional_fields_need_has_and_nulls_are_absent() {
    let engine = engine_with(
        r#"@id("lookup.no-items")
           permit (principal in Warrant::Role::"clerk", action == Warrant::Action::"lookup_order@1", resource)
           unless { context has include_items && context.include_items };"#,
    )
    .unwrap();
    let clerk = principal("clerk-1", "acme", &["clerk"]);
    let lookup = contract(LOOKUP);
    let ask_with = |args: Value| ask(&engine, &clerk, PolicyAction::Invoke, &lookup, args);
    assert_eq!(
        ask_with(json!({ "order_id": "ord_ABCDEFGH" })),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask_with(json!({ "order_id": "ord_ABCDEFGH", "include_items": false })),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask_with(json!({ "order_id": "ord_ABCDEFGH", "include_items": null })),
        PolicyVerdict::Allow
    );
    assert_eq!(
        ask_with(json!({ "order_id": "ord_ABCDEFGH", "include_items": true })),
        default_deny()
    );
}

#[test]
fn unmappable_fields_are_left_out_of_type_and_value() {
    let with_ratio = LOOKUP.replace(
        "    include_items: { type: boolean }\n",
        "    include_items: { type: boolean }\n    ratio: { type: number, minimum: 0, maximum: 1 }\n",
    );
    assert_ne!(with_ratio, LOOKUP);
    let lookup = contract(&with_ratio);
    let schema = CedarEngine::schema_json(&[Arc::clone(&lookup)]);
    let context = &schema["Warrant"]["actions"]["lookup_order@1"]["appliesTo"]["context"]["attributes"];
    assert!(context.get("ratio").is_none(), "{context}");
    assert!(context.get("order_id").is_some(), "{context}");
    let refer = r#"permit (principal, action == Warrant::Action::"lookup_order@1", resource)
                   when { context has ratio };"#;
    let error =
        CedarEngine::new(&[Arc::clone(&lookup)], &[PolicySource::new("ratio.cedar", refer)]).unwrap_err();
    assert!(error.to_string().contains("ratio.cedar"), "{error}");
    let engine = CedarEngine::new(
        &[Arc::clone(&lookup)],
        &[PolicySource::new(
            "lookup.cedar",
            r#"permit (principal, action == Warrant::Action::"lookup_order@1", resource);"#,
        )],
    )
    .unwrap();
    let anyone = principal("a", "acme", &[]);
    let args = json!({ "order_id": "ord_ABCDEFGH", "ratio": 0.5 });
    assert_eq!(
        ask(&engine, &anyone, PolicyAction::Invoke, &lookup, args),
        PolicyVerdict::Allow
    );
}

#[test]
fn generated_schema_for_the_examples() {
    let schema = CedarEngine::schema_json(&contracts());
    let ns = &schema["Warrant"];
    assert_eq!(
        ns["entityTypes"]["Principal"],
        json!({
            "memberOfTypes": ["Role"],
            "shape": { "type": "Record", "attributes": {
                "id": { "type": "String", "required": true },
                "tenant": { "type": "String", "required": true },
                "roles": { "type": "Set", "element": { "type": "String" }, "required": true },
            }},
        })
    );
    assert_eq!(ns["entityTypes"]["Role"], json!({}));
    assert_eq!(
        ns["entityTypes"]["Tool"]["shape"]["attributes"]["version"],
        json!({ "type": "Long", "required": true })
    );
    let actions = ns["actions"].as_object().unwrap();
    let mut names: Vec<&str> = actions.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "create_support_credit",
            "create_support_credit@1",
            "invoke",
            "lookup_order",
            "lookup_order@1",
            "reveal",
            "reveal:create_support_credit",
            "reveal:create_support_credit@1",
            "reveal:lookup_order",
            "reveal:lookup_order@1",
            "reveal:send_email",
            "reveal:send_email@1",
            "reveal:workflow_validator",
            "reveal:workflow_validator@1",
            "review",
            "review:create_support_credit",
            "review:create_support_credit@1",
            "review:lookup_order",
            "review:lookup_order@1",
            "review:send_email",
            "review:send_email@1",
            "review:workflow_validator",
            "review:workflow_validator@1",
            "send_email",
            "send_email@1",
            "workflow_validator",
            "workflow_validator@1",
        ]
    );
    assert_eq!(actions["invoke"], json!({}));
    assert_eq!(
        actions["create_support_credit"],
        json!({ "memberOf": [{ "id": "invoke" }] })
    );
    assert_eq!(
        actions["review:create_support_credit"],
        json!({ "memberOf": [{ "id": "review" }] })
    );
    let credit = &actions["create_support_credit@1"];
    assert_eq!(
        credit["memberOf"],
        json!([{ "id": "create_support_credit" }, { "id": "invoke" }])
    );
    assert_eq!(credit["appliesTo"]["principalTypes"], json!(["Principal"]));
    assert_eq!(credit["appliesTo"]["resourceTypes"], json!(["Tool"]));
    assert_eq!(
        credit["appliesTo"]["context"],
        json!({ "type": "Record", "attributes": {
            "amount_cents": { "type": "Long", "required": true },
            "customer_id": { "type": "String", "required": true },
            "reason": { "type": "String", "required": true },
        }})
    );
    assert_eq!(
        actions["review:create_support_credit@1"]["memberOf"],
        json!([{ "id": "review:create_support_credit" }, { "id": "review" }])
    );
    assert_eq!(
        actions["review:create_support_credit@1"]["appliesTo"],
        credit["appliesTo"]
    );
    assert_eq!(
        actions["send_email@1"]["appliesTo"]["context"]["attributes"],
        json!({
            "body": { "type": "String", "required": true },
            "cc": { "type": "Set", "element": { "type": "String" }, "required": false },
            "subject": { "type": "String", "required": true },
            "to": { "type": "Set", "element": { "type": "String" }, "required": true },
        })
    );
    assert_eq!(
        actions["lookup_order@1"]["appliesTo"]["context"]["attributes"],
        json!({
            "include_items": { "type": "Boolean", "required": false },
            "order_id": { "type": "String", "required": true },
        })
    );
}

#[test]
fn load_dir_reports_unreadable_directories() {
    let missing = policies_dir().join("does-not-exist");
    let error = CedarEngine::load_dir(&contracts(), &missing).unwrap_err();
    assert!(matches!(error, PolicyLoadError::Io { .. }), "{error}");
}

#[test]
fn guards_load_on_their_own() {
    let engine =
        CedarEngine::new(&contracts(), &[PolicySource::new("guards.cedar", GUARD_POLICIES)]).unwrap();
    let anyone = principal("a", "acme", &["agent"]);
    assert_eq!(
        ask(
            &engine,
            &anyone,
            PolicyAction::Invoke,
            &contract(EMAIL),
            email_args()
        ),
        default_deny()
    );
}

#[test]
fn a_forbid_that_cannot_be_evaluated_denies_beside_a_permit() {
    // A supervisor is permitted any credit (`support.supervisor-credit`); the forbid beside it
    // overflows on every amount. Cedar skips a policy that errors, so the permit alone would
    // allow the call: the engine must deny instead, and name the policy that failed.
    let engine = engine_with(
        r#"@id("credit.no-overflow")
           forbid (
               principal,
               action in [Warrant::Action::"create_support_credit@1", Warrant::Action::"review:create_support_credit@1"],
               resource
           )
           when { context.amount_cents * 9223372036854775807 > 0 };"#,
    )
    .unwrap();
    let supervisor = principal("sup-1", "acme", &["supervisor"]);
    let credit = contract(CREDIT);
    for action in [PolicyAction::Invoke, PolicyAction::Review] {
        let verdict = ask(&engine, &supervisor, action, &credit, credit_args(2));
        assert_eq!(
            verdict,
            PolicyVerdict::Deny {
                policies: Vec::new(),
                errors: vec!["policy `credit.no-overflow` could not be evaluated: integer overflow".into()],
            },
            "{action:?}"
        );
    }
}

#[test]
fn a_permit_that_cannot_be_evaluated_denies_beside_another_permit() {
    // Any evaluation error denies, whatever the effect of the policy that failed: a policy
    // set is only trusted when every policy in it could be evaluated.
    let engine = engine_with(
        r#"@id("credit.broken-permit")
           permit (principal in Warrant::Role::"supervisor", action, resource)
           when { context has amount_cents && context.amount_cents + 9223372036854775807 > 0 };"#,
    )
    .unwrap();
    let supervisor = principal("sup-1", "acme", &["supervisor"]);
    assert_eq!(
        ask(
            &engine,
            &supervisor,
            PolicyAction::Invoke,
            &contract(CREDIT),
            credit_args(2)
        ),
        PolicyVerdict::Deny {
            policies: Vec::new(),
            errors: vec!["policy `credit.broken-permit` could not be evaluated: integer overflow".into()],
        }
    );
}

#[test]
fn a_forbid_that_fires_is_named_beside_one_that_errors() {
    let engine = engine_with(
        r#"@id("credit.no-overflow")
           forbid (principal, action == Warrant::Action::"create_support_credit@1", resource)
           when { context.amount_cents * 9223372036854775807 > 0 };
           @id("credit.suspended")
           forbid (principal in Warrant::Role::"suspended", action, resource);"#,
    )
    .unwrap();
    let suspended = principal("sup-2", "acme", &["supervisor", "suspended"]);
    assert_eq!(
        ask(
            &engine,
            &suspended,
            PolicyAction::Invoke,
            &contract(CREDIT),
            credit_args(2)
        ),
        PolicyVerdict::Deny {
            policies: vec!["credit.suspended".into()],
            errors: vec!["policy `credit.no-overflow` could not be evaluated: integer overflow".into()],
        }
    );
}

#[test]
fn reviews_decide_without_sensitive_fields() {
    // An approval stores sensitive values only as keyed hashes, and a review is decided on the
    // stored arguments: a review policy cannot name a sensitive field (it would compare a
    // hash), while an invoke policy, decided on the call's own arguments, can.
    let invoke = r#"@id("email.no-secrets") forbid (principal, action == Warrant::Action::"send_email@1", resource)
                    when { context.body like "*password*" };"#;
    assert!(engine_with(invoke).is_ok());
    let review = r#"@id("email.review-body") permit (principal, action == Warrant::Action::"review:send_email@1", resource)
                    when { context.body like "*hello*" };"#;
    let refused = problems(engine_with(review).unwrap_err());
    assert!(
        refused
            .iter()
            .any(|(file, message)| file.as_deref() == Some("extra.cedar")
                && message.contains("email.review-body")),
        "{refused:?}"
    );
    let schema = CedarEngine::schema_json(&contracts());
    let actions = &schema["Warrant"]["actions"];
    let invoke_context = &actions["send_email@1"]["appliesTo"]["context"]["attributes"];
    let review_context = &actions["review:send_email@1"]["appliesTo"]["context"]["attributes"];
    assert!(invoke_context.get("body").is_some(), "{invoke_context}");
    assert!(review_context.get("body").is_none(), "{review_context}");
    assert!(review_context.get("subject").is_some(), "{review_context}");

    // The stored arguments (the body as its keyed hash) are reviewed like the call's own.
    let engine = engine_with(
        r#"@id("email.review-subject") permit (principal in Warrant::Role::"clerk", action == Warrant::Action::"review:send_email@1", resource)
           when { context.subject like "re: *" };"#,
    )
    .unwrap();
    let clerk = principal("clerk-1", "acme", &["clerk"]);
    let stored = json!({ "to": ["ann@example.com"], "subject": "re: order", "body": "hmac-sha256:00ff" });
    assert_eq!(
        ask(&engine, &clerk, PolicyAction::Review, &contract(EMAIL), stored),
        PolicyVerdict::Allow
    );
}

#[test]
fn revealing_sensitive_values_is_its_own_permission() {
    // The examples let supervisors review and reveal sends; reviewing credits does not let
    // them reveal credits, and an agent reveals nothing.
    let engine = engine();
    let supervisor = principal("sup-1", "acme", &["supervisor"]);
    let agent = principal("agent-1", "acme", &["agent"]);
    let stored = json!({ "to": ["ann@example.com"], "subject": "s", "body": "hmac-sha256:00ff" });
    let email = contract(EMAIL);
    assert_eq!(
        ask(&engine, &supervisor, PolicyAction::Reveal, &email, stored.clone()),
        PolicyVerdict::Allow
    );
    assert!(matches!(
        ask(&engine, &agent, PolicyAction::Reveal, &email, stored),
        PolicyVerdict::Deny { .. }
    ));
    let credit = json!({ "customer_id": "cus_12345678", "amount_cents": 100, "reason": "r" });
    let credits = contract(CREDIT);
    assert_eq!(
        ask(
            &engine,
            &supervisor,
            PolicyAction::Review,
            &credits,
            credit.clone()
        ),
        PolicyVerdict::Allow
    );
    assert!(matches!(
        ask(&engine, &supervisor, PolicyAction::Reveal, &credits, credit),
        PolicyVerdict::Deny { .. }
    ));
    // A reveal is asked with the review's context: a policy naming a sensitive field is refused.
    let body = r#"@id("email.reveal-body") permit (principal, action == Warrant::Action::"reveal:send_email@1", resource)
                  when { context.body like "*x*" };"#;
    assert!(engine_with(body).is_err());
    // Its actions' context is the review's.
    let schema = CedarEngine::schema_json(&contracts());
    let actions = &schema["Warrant"]["actions"];
    assert_eq!(
        actions["reveal:send_email@1"]["appliesTo"],
        actions["review:send_email@1"]["appliesTo"]
    );
    assert_eq!(
        actions["reveal:send_email@1"]["memberOf"],
        json!([{ "id": "reveal:send_email" }, { "id": "reveal" }])
    );
}
