//! Strict JSON parser + RFC 8785 canonicalization.
//!
//! For every input the strict parser accepts (with the proposal limits):
//! 1. its canonical bytes are valid UTF-8 and re-parse with the strict parser (same depth
//!    limit; the size limit is lifted because canonical numbers can be longer than written,
//!    `1e20` becomes `100000000000000000000`);
//! 2. canonicalization is idempotent: the re-parsed value canonicalizes to identical bytes;
//! 3. the canonical bytes parse with `serde_json` (an independent parser) to a value equal
//!    to the original one, numbers compared by value (JCS writes `5.0` as `5`);
//! 4. the strict re-parse is that same value as well;
//! 5. `serde_json` accepts the original input too and reads the same value (the strict
//!    parser only ever refuses *more* than RFC 8259 does, never reads differently);
//! 6. the hand-written canonicalizer agrees byte for byte with the reference implementation
//!    `serde_json_canonicalizer`, and `canonical_bytes_of_map` with `canonical_bytes`.

#![no_main]

mod common;

use common::{check_canonical_oracle, same_json, show};
use libfuzzer_sys::fuzz_target;
use warrant_core::canon::canonical_bytes;
use warrant_core::json::{self, Limits};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = json::parse(data, Limits::PROPOSAL) else {
        return;
    };
    let canonical = canonical_bytes(&value);
    check_canonical_oracle(&value, &canonical, data);
    assert!(
        std::str::from_utf8(&canonical).is_ok(),
        "canonical bytes are not UTF-8 for input {}",
        show(data)
    );

    let relaxed = Limits {
        max_bytes: usize::MAX,
        ..Limits::PROPOSAL
    };
    let reparsed = match json::parse(&canonical, relaxed) {
        Ok(v) => v,
        Err(e) => panic!(
            "strict parser refuses canonical output: {e} ({:?})\n  input:     {}\n  canonical: {}",
            e.kind(),
            show(data),
            show(&canonical)
        ),
    };
    let recanonical = canonical_bytes(&reparsed);
    assert!(
        recanonical == canonical,
        "canonicalization is not idempotent\n  input:     {}\n  canonical: {}\n  again:     {}",
        show(data),
        show(&canonical),
        show(&recanonical)
    );
    assert!(
        same_json(&reparsed, &value),
        "strict re-parse of canonical bytes changed the value\n  input: {}\n  canonical: {}",
        show(data),
        show(&canonical)
    );

    let independent: serde_json::Value = match serde_json::from_slice(&canonical) {
        Ok(v) => v,
        Err(e) => panic!(
            "serde_json refuses canonical output: {e}\n  input:     {}\n  canonical: {}",
            show(data),
            show(&canonical)
        ),
    };
    assert!(
        same_json(&independent, &value),
        "serde_json reads the canonical bytes as a different value\n  input: {}\n  canonical: {}\n  serde_json: {independent}",
        show(data),
        show(&canonical)
    );

    match serde_json::from_slice::<serde_json::Value>(data) {
        Ok(direct) => assert!(
            same_json(&direct, &value),
            "strict parser and serde_json read the input differently\n  input: {}\n  strict: {value}\n  serde_json: {direct}",
            show(data)
        ),
        Err(e) => panic!(
            "strict parser accepts what serde_json refuses ({e}): {}",
            show(data)
        ),
    }
});
