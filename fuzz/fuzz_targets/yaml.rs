//! The YAML 1.2 core-schema reader and the contract linter.
//!
//! For every UTF-8 input: `yaml::parse` with the document limits never panics; when it
//! yields a value, `Contract::from_document` never panics either. Beyond "no panic":
//! - the value contains only what JSON can say: every number is an integer within
//!   ±(2^53 − 1) or a finite float (checked by canonicalizing and re-reading it with the
//!   strict JSON parser and with `serde_json`, which must agree on the value), and the
//!   canonical bytes agree with the reference `serde_json_canonicalizer`;
//! - nesting stays within the depth limit;
//! - linting is deterministic, and a contract that lints has a content id equal to the
//!   SHA-256 of the canonical bytes of its stored document, and loads again, with the same
//!   id, from that canonical JSON text (YAML and JSON front ends agree).

#![no_main]

mod common;

use common::{check_canonical_oracle, same_json, show};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use warrant_core::Contract;
use warrant_core::canon::{Sha256Digest, canonical_bytes};
use warrant_core::contract::DocumentFormat;
use warrant_core::json::{self, Limits};
use warrant_core::yaml;

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn numbers_ok(v: &Value) -> bool {
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.unsigned_abs() <= json::MAX_SAFE_INTEGER as u64,
            None => n.is_f64() && n.as_f64().is_some_and(f64::is_finite),
        },
        Value::Array(a) => a.iter().all(numbers_ok),
        Value::Object(m) => m.values().all(numbers_ok),
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(value) = yaml::parse(text, Limits::DOCUMENT) else {
        return;
    };
    assert!(
        numbers_ok(&value),
        "YAML read a number JSON cannot hold: {}",
        show(data)
    );
    assert!(
        depth(&value) <= Limits::DOCUMENT.max_depth,
        "YAML nesting beyond the limit: {}",
        show(data)
    );

    let canonical = canonical_bytes(&value);
    check_canonical_oracle(&value, &canonical, data);
    match json::parse(
        &canonical,
        Limits {
            max_bytes: usize::MAX,
            ..Limits::DOCUMENT
        },
    ) {
        Ok(back) => assert!(
            same_json(&back, &value),
            "strict JSON re-read of the YAML value differs: {}",
            show(data)
        ),
        Err(e) => panic!(
            "strict JSON parser refuses the canonical form of a YAML value: {e}\n  input: {}\n  canonical: {}",
            show(data),
            show(&canonical)
        ),
    }
    match serde_json::from_slice::<Value>(&canonical) {
        Ok(back) => assert!(
            same_json(&back, &value),
            "serde_json re-read differs: {}",
            show(data)
        ),
        Err(e) => panic!(
            "serde_json refuses the canonical form of a YAML value: {e}: {}",
            show(data)
        ),
    }

    let first = Contract::from_document(value.clone());
    let second = Contract::from_document(value);
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert_eq!(a.id(), b.id(), "content id is not deterministic: {}", show(data)),
        (Err(a), Err(b)) => assert_eq!(a, b, "lint problems are not deterministic: {}", show(data)),
        _ => panic!("linting is not deterministic: {}", show(data)),
    }
    if let Ok(contract) = first {
        assert_eq!(
            contract.id().digest(),
            Sha256Digest::of_bytes(&canonical_bytes(contract.document())),
            "content id is not the digest of the stored document: {}",
            show(data)
        );
        let json_text = String::from_utf8(canonical_bytes(contract.document())).unwrap_or_default();
        match Contract::from_text(&json_text, DocumentFormat::Json) {
            Ok(again) => assert_eq!(
                again.id(),
                contract.id(),
                "JSON reload changes the id: {}",
                show(data)
            ),
            Err(e) => panic!(
                "contract does not reload from its canonical JSON ({e:?}): {}",
                show(data)
            ),
        }
    }
});
