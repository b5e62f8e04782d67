//! Contract loading, the registration lint (PRODUCT §2) and content ids.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use warrant_core::Contract;
use warrant_core::contract::{ContractError, DocumentFormat};

const CREDIT: &str = include_str!("../../../examples/contracts/create_support_credit.v1.yaml");
const EMAIL: &str = include_str!("../../../examples/contracts/send_email.v1.yaml");
const LOOKUP: &str = include_str!("../../../examples/contracts/lookup_order.v1.yaml");

fn load(text: &str) -> Contract {
    Contract::from_text(text, DocumentFormat::Yaml).unwrap()
}

/// Lints `text` and returns `pointer: message` lines.
fn problems(text: &str) -> Vec<String> {
    match Contract::from_text(text, DocumentFormat::Yaml) {
        Ok(_) => Vec::new(),
        Err(ContractError::Lint(problems)) => problems.iter().map(ToString::to_string).collect(),
        Err(ContractError::Syntax(message)) => vec![format!("syntax: {message}")],
    }
}

/// The example contract with `from` replaced by `to` (which must occur exactly once).
fn credit_with(from: &str, to: &str) -> String {
    assert_eq!(CREDIT.matches(from).count(), 1, "{from:?} must occur once");
    CREDIT.replace(from, to)
}

#[test]
fn example_contracts_load() {
    let credit = load(CREDIT);
    assert_eq!(credit.name(), "create_support_credit");
    assert_eq!(credit.version(), 1);
    assert_eq!(credit.retry().max_attempts(), 3);
    assert_eq!(credit.budget().calls_per_day, Some(200));
    assert_eq!(credit.cost_per_call(), 1);
    assert_eq!(
        credit.retire_after().map(|d| d.to_string()).as_deref(),
        Some("2027-06-30")
    );
    // The date stays a string in the document the id is computed over.
    assert_eq!(credit.document()["retire_after"], "2027-06-30");
    assert!(credit.adapter().is_none());
    let email = load(EMAIL);
    assert_eq!(email.adapter().unwrap().kind(), "send_email");
    assert!(load(LOOKUP).idempotency().is_none());
}

/// Content ids cross-checked with an independent implementation (Python: ruamel.yaml with
/// dates kept as written, and the `rfc8785` package), see docs/contracts.md.
#[test]
fn content_ids_match_an_independent_jcs_implementation() {
    assert_eq!(
        load(CREDIT).id().to_string(),
        "tool-contract@sha256:1dc2e13f57dcd2df3cea165e96a0ea631117b3ab0cfd2c26eb3b10600c2f73fb"
    );
    assert_eq!(
        load(LOOKUP).id().to_string(),
        "tool-contract@sha256:9bcc68773f4450ff17956fc7644f31008e65692ab1c5cb3974d70751d2c2f525"
    );
    assert_eq!(
        load(EMAIL).id().to_string(),
        "tool-contract@sha256:2dc5f295f219f46dc1b58225e6ed833d565d15730d6f1af7feab491657381710"
    );
    assert_eq!(
        load(EMAIL).adapter().unwrap().digest().to_string(),
        "sha256:7a3e9626f9f177d2213c529f0726a436d7ea0577e3e4df57b4abae3b5eb97093"
    );
}

#[test]
fn id_ignores_formatting_and_the_adapter_binding_but_not_content() {
    let base = load(CREDIT).id();
    // Same data written as JSON, in another key order: same id.
    let as_json = serde_json::to_string(load(CREDIT).document()).unwrap();
    assert_eq!(
        Contract::from_text(&as_json, DocumentFormat::Json).unwrap().id(),
        base
    );
    // Comments and flow/block style do not matter.
    let restyled = credit_with(
        "scopes: [support:credits:write]",
        "scopes:\n  - support:credits:write # the only one",
    );
    assert_eq!(load(&restyled).id(), base);
    // Adding an adapter binding leaves the id alone but gives the binding a digest.
    let bound = format!("{CREDIT}adapter:\n  kind: http\n  url: https://credits.internal.example/\n");
    let bound = load(&bound);
    assert_eq!(bound.id(), base);
    assert!(bound.adapter().is_some());
    // Any change of content changes the id.
    assert_ne!(
        load(&credit_with("calls_per_day: 200", "calls_per_day: 201")).id(),
        base
    );
}

#[test]
fn every_rule_is_reported_with_its_pointer() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "reason: { type: string, minLength: 1, maxLength: 500 }",
            "reason: { type: string, minLength: 1 }",
            "/input/properties/reason: string schema must set `maxLength`",
        ),
        (
            "amount_cents: { type: integer, minimum: 1, maximum: 500000 }",
            "amount_cents: { type: integer, minimum: 1 }",
            "/input/properties/amount_cents: integer schema must set `maximum` or `exclusiveMaximum`",
        ),
        (
            "amount_cents: { type: integer, minimum: 1, maximum: 500000 }",
            "amount_cents: { type: number, maximum: 5 }",
            "/input/properties/amount_cents: number schema must set `minimum` or `exclusiveMinimum`",
        ),
        (
            "reason: { type: string, minLength: 1, maxLength: 500 }",
            "reason: { type: array, items: { type: string, maxLength: 5 } }",
            "/input/properties/reason: array schema must set `maxItems`",
        ),
        (
            "reason: { type: string, minLength: 1, maxLength: 500 }",
            "reason: { type: object, properties: {} }",
            "/input/properties/reason: object schema must set `additionalProperties: false`",
        ),
        (
            "reason: { type: string, minLength: 1, maxLength: 500 }",
            "reason: {}",
            "/input/properties/reason: schema accepts any value: declare `type`, `enum` or `const`",
        ),
        (
            "reason: { type: string, minLength: 1, maxLength: 500 }",
            "reason: { type: string, maxLenght: 500 }",
            "/input/properties/reason/maxLenght: unknown schema keyword `maxLenght` (annotations must start with `x-`)",
        ),
        (
            "reason: { type: string, minLength: 1, maxLength: 500 }",
            "reason: { $ref: 'https://example.com/s.json' }",
            "/input/properties/reason/$ref: only local references (`#/...`) are allowed",
        ),
        (
            "max_attempts: 3",
            "max_attempts: 11",
            "/retry/max_attempts: max_attempts must be an integer from 1 to 10",
        ),
        (
            "max_attempts: 3",
            "max_attempts: 0",
            "/retry/max_attempts: max_attempts must be an integer from 1 to 10",
        ),
        (
            "idempotency: { honoured: true, retention: 24h }\n",
            "",
            "/: a write, irreversible or async effect must declare `idempotency`",
        ),
        (
            "effect: write ",
            "effect: delete ",
            "/effect: effect must be one of read, write, irreversible, async",
        ),
        (
            "version: 1",
            "version: 1.5",
            "/version: version must be a positive integer",
        ),
        (
            "retire_after: 2027-06-30",
            "retire_after: soon",
            "/retire_after: retire_after must be a date written YYYY-MM-DD",
        ),
        ("owner: support-platform\n", "", "/owner: `owner` is required"),
        (
            "owner: support-platform\n",
            "owner: support-platform\nowners: [x]\n",
            "/owners: unknown contract field `owners`",
        ),
        (
            "cost: { per_call: 1 }",
            "cost: { per_call: -1 }",
            "/cost/per_call: per_call must be a non-negative integer",
        ),
    ];
    for (from, to, expected) in cases {
        let found = problems(&credit_with(from, to));
        assert!(
            found.iter().any(|p| p == expected),
            "for {to:?} expected {expected:?}, got {found:#?}"
        );
    }
}

#[test]
fn several_problems_are_all_reported() {
    let text = credit_with("max_attempts: 3", "max_attempts: 20")
        .replace("maxLength: 500", "maxLenght: 500")
        .replace("maxLength: 36", "x-note: none");
    let found = problems(&text);
    assert_eq!(found.len(), 4, "{found:#?}");
}

#[test]
fn duplicate_keys_and_open_documents_are_refused() {
    let dup = credit_with("owner: support-platform", "owner: support-platform\nowner: other");
    assert!(problems(&dup)[0].contains("duplicate key `owner`"));
    let dup_json = r#"{"name":"a","name":"b"}"#;
    assert!(matches!(
        Contract::from_text(dup_json, DocumentFormat::Json),
        Err(ContractError::Syntax(_))
    ));
    let root_true = CREDIT.replace("input:\n  type: object", "input_:\n  type: object");
    assert!(!problems(&root_true).is_empty());
}

#[test]
fn nested_schemas_are_linted_everywhere_values_are_defined() {
    let nested = credit_with(
        "reason: { type: string, minLength: 1, maxLength: 500 }",
        "reason:\n      anyOf:\n        - { type: string, maxLength: 5 }\n        - type: array\n          maxItems: 2\n          items: { type: string }\n",
    );
    assert_eq!(
        problems(&nested),
        vec!["/input/properties/reason/anyOf/1/items: string schema must set `maxLength`".to_owned()]
    );
}

/// `execute_on_approval` is a boolean, only with per-call approval, off by default, and part
/// of the content id.
#[test]
fn execute_on_approval_needs_per_call_approval() {
    let plain = load(CREDIT);
    assert!(!plain.execute_on_approval());
    let on = load(&credit_with(
        "approval: per_call",
        "approval: per_call\nexecute_on_approval: true",
    ));
    assert!(on.execute_on_approval());
    assert_ne!(on.id(), plain.id());
    assert_eq!(
        problems(&credit_with(
            "approval: per_call",
            "approval: per_call\nexecute_on_approval: \"yes\""
        )),
        ["/execute_on_approval: execute_on_approval must be true or false"]
    );
    assert_eq!(
        problems(&credit_with(
            "approval: per_call",
            "approval: none\nexecute_on_approval: true"
        )),
        ["/execute_on_approval: execute_on_approval needs `approval: per_call`"]
    );
    let read = LOOKUP.replace("approval: none", "approval: per_call\nexecute_on_approval: true");
    assert_eq!(
        problems(&read),
        [
            "/execute_on_approval: execute_on_approval needs a write, irreversible or async effect (a read carries no idempotency key to answer the retry from)"
        ]
    );
}
