//! Helpers shared by the fuzz targets (included with `mod common;`).

#![allow(dead_code)]

use serde_json::Value;

/// JSON data-model equality that ignores how a number is *represented*.
///
/// `serde_json::Value`'s own `==` says `5` (an integer `Number`) differs from `5.0` (a float
/// `Number`). RFC 8785 deliberately erases that distinction — both serialize as `5` — so a
/// round trip through canonical bytes can only promise that every number keeps its
/// *value*. Warrant's strict parser keeps integers within ±(2^53 − 1), so every integer is
/// exactly representable as an `f64` and comparing the `f64` views is exact.
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_f64(), y.as_f64()) {
                (Some(f), Some(g)) => f == g,
                _ => false,
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same_json(p, q)))
        }
        _ => false,
    }
}

/// Input bytes rendered for a panic message: escaped, and cut to keep the message short.
pub fn show(data: &[u8]) -> String {
    let cut = &data[..data.len().min(512)];
    format!(
        "{:?}{}",
        String::from_utf8_lossy(cut),
        if data.len() > 512 { "…" } else { "" }
    )
}

/// Checks `warrant_core::canon` against the reference implementation
/// `serde_json_canonicalizer` (byte for byte), and the map entry point against the value one.
pub fn check_canonical_oracle(value: &Value, canonical: &[u8], data: &[u8]) {
    match serde_json_canonicalizer::to_vec(value) {
        Ok(reference) => assert!(
            reference == canonical,
            "canonical bytes differ from serde_json_canonicalizer\n  input:     {}\n  warrant:   {}\n  reference: {}",
            show(data),
            show(canonical),
            show(&reference)
        ),
        Err(e) => panic!(
            "serde_json_canonicalizer refuses a parsed value ({e}): {}",
            show(data)
        ),
    }
    if let Value::Object(map) = value {
        assert!(
            warrant_core::canon::canonical_bytes_of_map(map) == canonical,
            "canonical_bytes_of_map differs from canonical_bytes: {}",
            show(data)
        );
    }
}
