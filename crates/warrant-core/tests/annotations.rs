//! Annotations reached through every applicator the lint accepts: guards check them, redaction
//! hides them, and a walk that cannot finish refuses.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use serde_json::{Map, Value, json};
use warrant_core::guard::{AllowList, Guards};
use warrant_core::redact::{RedactionKey, redact_map};
use warrant_core::{Contract, RejectCode};

fn contract(input: Value) -> Contract {
    Contract::from_document(json!({
        "name": "notify", "version": 1, "description": "d", "owner": "o", "effect": "read",
        "scopes": ["s"], "input": input,
        "output": {"type": "object", "additionalProperties": false},
    }))
    .unwrap_or_else(|p| panic!("{p:?}"))
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn guards() -> Guards {
    let mut g = Guards::new();
    g.set(
        "acme",
        "email_recipients",
        AllowList::new(["*@acme.example"]).unwrap(),
    );
    g
}

fn recipients() -> Value {
    json!({"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 254}})
}

fn guarded_recipients() -> Value {
    json!({"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 254},
           "x-warrant-allowlist": "email_recipients"})
}

/// `to` is allow-listed only in `then` (when `kind` is `external`).
fn through_then() -> Value {
    json!({
        "type": "object", "additionalProperties": false,
        "properties": {"kind": {"enum": ["internal", "external"]}, "to": recipients()},
        "if": {"properties": {"kind": {"const": "external"}}},
        "then": {"type": "object", "additionalProperties": false,
                 "properties": {"kind": {"enum": ["external"]}, "to": guarded_recipients()}},
    })
}

/// `to` is allow-listed only when `cc` is present.
fn through_dependent_schemas() -> Value {
    json!({
        "type": "object", "additionalProperties": false,
        "properties": {"to": recipients(), "cc": recipients()},
        "dependentSchemas": {"cc": {"properties": {"to": guarded_recipients()}}},
    })
}

fn check(input: &Value, arguments: Value) -> Result<(), warrant_core::Rejection> {
    let c = contract(input.clone());
    assert!(c.has_allowlists());
    guards().check("acme", c.input_schema(), &args(arguments))
}

#[test]
fn a_guard_reached_through_then_is_checked() {
    let schema = through_then();
    let refused = check(&schema, json!({"kind": "external", "to": ["eve@evil.example"]})).unwrap_err();
    assert_eq!(refused.code(), RejectCode::RecipientNotAllowed);
    assert_eq!(refused.pointer(), Some("/arguments/to/0"));
    check(&schema, json!({"kind": "external", "to": ["bob@acme.example"]})).unwrap();
    // `if` fails: `then` does not apply, and nothing else guards `to`.
    check(&schema, json!({"kind": "internal", "to": ["eve@evil.example"]})).unwrap();
}

#[test]
fn a_guard_reached_through_else_is_checked() {
    let mut schema = through_then();
    let then = schema.as_object_mut().unwrap().remove("then").unwrap();
    schema["else"] = then;
    let refused = check(&schema, json!({"kind": "internal", "to": ["eve@evil.example"]})).unwrap_err();
    assert_eq!(refused.code(), RejectCode::RecipientNotAllowed);
}

#[test]
fn a_guard_reached_through_dependent_schemas_is_checked() {
    let schema = through_dependent_schemas();
    let refused = check(&schema, json!({"to": ["eve@evil.example"], "cc": []})).unwrap_err();
    assert_eq!(refused.code(), RejectCode::RecipientNotAllowed);
    assert_eq!(refused.pointer(), Some("/arguments/to/0"));
    check(&schema, json!({"to": ["eve@evil.example"]})).unwrap();
}

#[test]
fn a_guard_nested_deeper_than_sixty_four_in_place_levels_is_checked() {
    let mut to = guarded_recipients();
    for _ in 0..70 {
        to = json!({"allOf": [to]});
    }
    let schema = json!({"type": "object", "additionalProperties": false, "properties": {"to": to}});
    let refused = check(&schema, json!({"to": ["eve@evil.example"]})).unwrap_err();
    assert_eq!(refused.code(), RejectCode::RecipientNotAllowed);
}

#[test]
fn a_sensitive_field_under_then_is_redacted() {
    let schema = json!({
        "type": "object", "additionalProperties": false,
        "properties": {"kind": {"enum": ["card", "note"]}, "text": {"type": "string", "maxLength": 64}},
        "if": {"properties": {"kind": {"const": "card"}}},
        "then": {"type": "object", "additionalProperties": false,
                 "properties": {"kind": {"enum": ["card"]},
                                "text": {"type": "string", "maxLength": 64, "x-warrant-sensitive": true}}},
    });
    let c = contract(schema);
    let key = RedactionKey::new(vec![7; 32]).unwrap();
    let out = redact_map(
        c.input_schema(),
        &args(json!({"kind": "card", "text": "4242424242424242"})),
        &key,
    )
    .unwrap();
    assert!(!out.to_string().contains("4242"), "{out}");
    assert!(out["text"].as_str().unwrap().starts_with("hmac-sha256:"));
    let out = redact_map(
        c.input_schema(),
        &args(json!({"kind": "note", "text": "hello"})),
        &key,
    )
    .unwrap();
    assert_eq!(out["text"], "hello");
}

#[test]
fn a_sensitive_field_under_dependent_schemas_is_redacted() {
    let schema = json!({
        "type": "object", "additionalProperties": false,
        "properties": {"card": {"type": "string", "maxLength": 64}, "cvc": {"type": "string", "maxLength": 4}},
        "dependentSchemas": {"cvc": {"properties": {"card": {"x-warrant-sensitive": true, "type": "string", "maxLength": 64}}}},
    });
    let c = contract(schema);
    let key = RedactionKey::new(vec![7; 32]).unwrap();
    let out = redact_map(
        c.input_schema(),
        &args(json!({"card": "4242424242424242", "cvc": "123"})),
        &key,
    )
    .unwrap();
    assert!(!out.to_string().contains("4242"), "{out}");
}

#[test]
fn the_lint_refuses_annotations_the_walk_cannot_reach() {
    let marked = json!({"type": "string", "maxLength": 9, "x-warrant-allowlist": "email_recipients"});
    let sensitive = json!({"type": "string", "maxLength": 9, "x-warrant-sensitive": true});
    let base = || {
        json!({"type": "object", "additionalProperties": false,
                         "properties": {"to": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 9}}}})
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            {
                let mut s = base();
                s["properties"]["to"]["not"] = marked.clone();
                s
            },
            "/input/properties/to/not/x-warrant-allowlist",
        ),
        (
            {
                let mut s = base();
                s["properties"]["to"]["contains"] = marked.clone();
                s
            },
            "/input/properties/to/contains/x-warrant-allowlist",
        ),
        (
            {
                let mut s = base();
                s["propertyNames"] = marked.clone();
                s
            },
            "/input/propertyNames/x-warrant-allowlist",
        ),
        (
            {
                let mut s = base();
                s["if"] = json!({"properties": {"to": marked.clone()}});
                s["then"] = base();
                s
            },
            "/input/if/properties/to/x-warrant-allowlist",
        ),
        (
            {
                let mut s = base();
                s["properties"]["to"]["unevaluatedItems"] = sensitive.clone();
                s
            },
            "/input/properties/to/unevaluatedItems/x-warrant-sensitive",
        ),
        (
            {
                let mut s = base();
                s["$defs"] = json!({"unused": sensitive.clone()});
                s
            },
            "/input/$defs/unused/x-warrant-sensitive",
        ),
    ];
    for (input, pointer) in cases {
        let problems = Contract::from_document(json!({
            "name": "notify", "version": 1, "description": "d", "owner": "o", "effect": "read",
            "scopes": ["s"], "input": input,
            "output": {"type": "object", "additionalProperties": false},
        }))
        .expect_err(pointer);
        assert!(
            problems
                .iter()
                .any(|p| p.pointer() == pointer && p.message().contains("never applies")),
            "{pointer}: {problems:?}"
        );
    }
}

#[test]
fn a_walk_past_the_depth_bound_refuses() {
    let schema = json!({
        "type": "object", "additionalProperties": false,
        "properties": {"next": {"$ref": "#"}, "to": guarded_recipients()},
    });
    let mut deep = json!({"to": ["eve@evil.example"]});
    for _ in 0..70 {
        deep = json!({"next": deep});
    }
    let refused = check(&schema, deep).unwrap_err();
    assert_eq!(refused.code().as_str(), "ARGUMENTS_TOO_COMPLEX");
}

#[test]
fn a_member_is_guarded_only_when_a_guard_always_applies_to_it() {
    let email = Contract::from_text(
        include_str!("../../../examples/contracts/send_email.v1.yaml"),
        warrant_core::contract::DocumentFormat::Yaml,
    )
    .unwrap();
    let walker = email.input_schema().walker();
    // `to` and `cc` carry the list; `bcc` is refused by the closed root.
    assert!(walker.guards_member("to") && walker.guards_member("cc") && walker.guards_member("bcc"));
    assert!(!walker.guards_member("subject"));
    for (schema, to) in [
        (through_then(), false),
        (through_dependent_schemas(), false),
        (
            json!({"type": "object", "additionalProperties": false,
                "properties": {"to": {"anyOf": [guarded_recipients(), recipients()]}}}),
            false,
        ),
        (
            json!({"type": "object", "additionalProperties": false,
                "properties": {"to": {"type": "array", "maxItems": 5,
                                      "items": {"type": "string", "maxLength": 9, "x-warrant-allowlist": "email_recipients"}}}}),
            false,
        ),
        (
            json!({"type": "object", "additionalProperties": false, "$defs": {"r": guarded_recipients()},
                "properties": {"to": {"allOf": [{"$ref": "#/$defs/r"}]}}}),
            true,
        ),
        (
            json!({"type": "object", "additionalProperties": false, "properties": {"to": false}}),
            true,
        ),
    ] {
        assert_eq!(
            contract(schema.clone())
                .input_schema()
                .walker()
                .guards_member("to"),
            to,
            "{schema}"
        );
    }
}
