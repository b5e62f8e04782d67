//! Property tests: hostile input never panics, canonicalization is a fixed point, digests do
//! not depend on formatting, and nothing reaches a later stage than the one that refused it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};
use warrant_core::canon::{canonical_bytes, digest};
use warrant_core::contract::DocumentFormat;
use warrant_core::json::{self, JsonErrorKind, Limits};
use warrant_core::proposal::{Envelope, ValidatedProposal};
use warrant_core::{Contract, RejectCode, Stage, yaml};

const CREDIT: &str = include_str!("../../../examples/contracts/create_support_credit.v1.yaml");

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-json::MAX_SAFE_INTEGER..=json::MAX_SAFE_INTEGER).prop_map(|n| Value::Number(n.into())),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Value::Number(Number::from_f64(f).unwrap())),
        any::<String>().prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// JSON text for `v` with object members in reverse order and random-ish whitespace,
/// so formatting and key order differ from the canonical form.
fn reformat(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            out.push_str("{ ");
            for (i, (k, v)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(" :\t");
                reformat(v, out);
            }
            out.push_str(" }");
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                reformat(v, out);
            }
            out.push(']');
        }
        // Floats in exponent form exercise the number parser on every spelling.
        Value::Number(n) if n.is_f64() => out.push_str(&format!("{:e}", n.as_f64().unwrap())),
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

proptest! {
    // `PROPTEST_CASES` draws more for a longer search.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn strict_parser_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = json::parse(&bytes, Limits::PROPOSAL);
        let _ = Envelope::parse(&bytes, Limits::PROPOSAL);
    }

    #[test]
    fn strict_parser_agrees_with_serde_on_valid_json(v in value()) {
        let text = serde_json::to_string(&v).unwrap();
        let parsed = json::parse(text.as_bytes(), Limits::DOCUMENT).unwrap();
        // Equal as canonical forms (serde_json writes integral floats as `1.0`, which the
        // strict parser keeps as a float; both canonicalize to the same number).
        prop_assert_eq!(canonical_bytes(&parsed), canonical_bytes(&v));
    }

    #[test]
    fn canonical_form_is_a_fixed_point(v in value()) {
        let canonical = canonical_bytes(&v);
        let reparsed = json::parse(&canonical, Limits::DOCUMENT).unwrap();
        prop_assert_eq!(canonical_bytes(&reparsed), canonical.clone());
        // And it is plain JSON any parser reads back to the same value.
        let via_serde: Value = serde_json::from_slice(&canonical).unwrap();
        prop_assert_eq!(canonical_bytes(&via_serde), canonical.clone());
        // And it is exactly what the reference implementation produces.
        prop_assert_eq!(serde_json_canonicalizer::to_vec(&v).unwrap(), canonical);
    }

    #[test]
    fn digest_ignores_formatting_and_key_order(v in value()) {
        let mut text = String::new();
        reformat(&v, &mut text);
        let parsed = json::parse(text.as_bytes(), Limits::DOCUMENT).unwrap();
        prop_assert_eq!(digest(&parsed), digest(&v));
    }

    /// `json::check` is `json::parse` without the value: the same documents refused with the
    /// same error (kind, offset, pointer), on random bytes and on valid documents with one
    /// byte changed, removed or added (duplicate keys among many members included).
    #[test]
    fn check_refuses_what_parse_refuses(
        v in value(),
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b'{'), Just(b'}'), Just(b'['),
            Just(b']'), Just(b':'), Just(b'e'), Just(b'0'), Just(b'-'), Just(b'.'), Just(0xff), any::<u8>()],
        edit in 0u8..3,
        width in 0usize..40,
    ) {
        let agree = |input: &[u8]| -> Result<(), TestCaseError> {
            let parsed = json::parse(input, Limits::PROPOSAL);
            let checked = json::check(input, Limits::PROPOSAL);
            let shape = parsed.as_ref().map(|v| match v {
                Value::Object(_) => json::Shape::Object,
                Value::Array(_) => json::Shape::Array,
                _ => json::Shape::Scalar,
            });
            prop_assert_eq!(checked, shape.map_err(Clone::clone));
            Ok(())
        };
        agree(&bytes)?;
        let mut text = serde_json::to_string(&v).unwrap().into_bytes();
        agree(&text)?;
        let i = at.index(text.len() + 1);
        match edit {
            0 if i < text.len() => text[i] = byte,
            1 if i < text.len() => { text.remove(i); }
            _ => text.insert(i, byte),
        }
        agree(&text)?;
        // Many members, one repeated: past the list into the set.
        let members: Vec<String> = (0..width).map(|n| format!("\"k{}\":{n}", n % (width / 2 + 1))).collect();
        agree(format!("[{{{}}}]", members.join(",")).as_bytes())?;
    }

    #[test]
    fn duplicate_keys_are_always_refused(
        key in any::<String>(),
        a in leaf(),
        b in leaf(),
        depth in 0usize..5,
    ) {
        let k = serde_json::to_string(&key).unwrap();
        let mut text = format!("{{{k}:{a},{k}:{b}}}");
        for _ in 0..depth {
            text = format!("{{\"x\":{text}}}");
        }
        let err = json::parse(text.as_bytes(), Limits::PROPOSAL).unwrap_err();
        prop_assert_eq!(err.kind(), JsonErrorKind::DuplicateKey);
    }

    #[test]
    fn yaml_loader_never_panics(text in ".{0,300}") {
        if let Ok(doc) = yaml::parse(&text, Limits::DOCUMENT) {
            let _ = Contract::from_document(doc);
        }
    }

    #[test]
    fn hostile_arguments_stop_at_the_first_refusing_stage(args in value(), key in prop::option::of("[ -~]{0,300}")) {
        let contract = Contract::from_text(CREDIT, DocumentFormat::Yaml).unwrap();
        let mut envelope = json!({"tool": "create_support_credit", "version": 1, "arguments": args});
        if let Some(key) = key {
            envelope["idempotency_key"] = Value::String(key);
        }
        let bytes = serde_json::to_vec(&envelope).unwrap();
        let validated = Envelope::parse(&bytes, Limits::PROPOSAL)
            .and_then(|e| ValidatedProposal::validate(e, &contract));
        match validated {
            Err(r) => prop_assert!(r.stage() <= Stage::Schema || r.code() == RejectCode::IdempotencyKeyInvalid),
            Ok(p) => {
                prop_assert!(contract.input_schema().is_valid(&envelope["arguments"]));
                prop_assert_eq!(p.payload_digest(), digest(&envelope["arguments"]));
            }
        }
    }
}

// Valid argument objects (drawn from the schema's own constraints) always pass and digest
// to the canonical form, and one wrong field always fails at the schema stage.
proptest! {
    #[test]
    fn schema_accepts_exactly_the_declared_shapes(
        id in "cus_[a-z0-9]{8,32}",
        amount in 1i64..=500_000,
        reason in "[^\u{0}]{1,100}",
        as_float in any::<bool>(),
    ) {
        let contract = Contract::from_text(CREDIT, DocumentFormat::Yaml).unwrap();
        let amount_text = if as_float { format!("{amount}.0") } else { amount.to_string() };
        let text = format!(
            r#"{{"customer_id":{},"amount_cents":{amount_text},"reason":{}}}"#,
            serde_json::to_string(&id).unwrap(),
            serde_json::to_string(&reason).unwrap()
        );
        let args = json::parse(text.as_bytes(), Limits::PROPOSAL).unwrap();
        let verdict = contract.input_schema().check(&args);
        if as_float {
            prop_assert_eq!(verdict.unwrap_err().code(), warrant_core::RejectCode::SchemaNotInteger);
        } else {
            prop_assert!(verdict.is_ok());
        }
    }
}
