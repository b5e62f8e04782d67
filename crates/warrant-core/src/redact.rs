//! Redaction of sensitive arguments before they reach the ledger or logs.
//!
//! A schema node marked `x-warrant-sensitive: true` has its value replaced by
//! `hmac-sha256:<hex>`, a keyed hash of the value's canonical form: equal values stay
//! comparable across ledger rows (for audits and correlation) while the value itself, and any
//! guess of it without the server's key, stays out of storage.

use hmac::{KeyInit, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

use crate::canon::canonical_bytes;

type HmacSha256 = hmac::Hmac<Sha256>;

/// Keys shorter than this are refused by [`RedactionKey::new`].
pub const MIN_KEY_LEN: usize = 32;

/// The server's redaction key.
#[derive(Clone)]
pub struct RedactionKey(Vec<u8>);

impl std::fmt::Debug for RedactionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedactionKey(..)")
    }
}

impl RedactionKey {
    /// Wraps key material (at least [`MIN_KEY_LEN`] bytes).
    pub fn new(bytes: Vec<u8>) -> Option<Self> {
        (bytes.len() >= MIN_KEY_LEN).then_some(RedactionKey(bytes))
    }

    /// `hmac-sha256:<hex>` of the canonical form of `value`.
    pub fn token(&self, value: &Value) -> String {
        // INVARIANT: HMAC accepts keys of any length, so this never fails.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mut mac) => {
                mac.update(&canonical_bytes(value));
                format!("hmac-sha256:{}", hex::encode(mac.finalize().into_bytes()))
            }
            Err(_) => "hmac-sha256:unavailable".to_owned(),
        }
    }
}

/// Returns `arguments` with every value under a sensitive schema node replaced by its token.
/// Follows `properties`, `items`, `prefixItems`, local `$ref`s and every branch of
/// `allOf`/`anyOf`/`oneOf` (a value sensitive in any branch is redacted).
pub fn redact(input_schema: &Value, arguments: &Value, key: &RedactionKey) -> Value {
    redact_at(input_schema, input_schema, arguments, key, 0)
}

/// [`redact`] for an arguments object.
pub fn redact_map(input_schema: &Value, arguments: &Map<String, Value>, key: &RedactionKey) -> Value {
    let Value::Object(node) = input_schema else {
        return Value::Object(arguments.clone());
    };
    if node.get("x-warrant-sensitive") == Some(&Value::Bool(true))
        || !subschemas(input_schema, node).is_empty()
    {
        return redact(input_schema, &Value::Object(arguments.clone()), key);
    }
    let mut members = arguments.clone();
    if let Some(Value::Object(properties)) = node.get("properties") {
        redact_members(input_schema, properties, &mut members, key, 0);
    }
    Value::Object(members)
}

/// Bounds `$ref` chasing (schemas may be recursive).
const MAX_DEPTH: usize = 64;

/// Whether [`redact`] can change any value under `input_schema`. `false` only when no node
/// is marked sensitive, no `$ref` can lead the walk around in circles, and the document nests
/// no deeper than the depth bound (each step of the walk goes at least one level deeper into
/// the document, so the walk then never reaches the bound, past which it would redact). For
/// such a schema redaction is the identity, and the walk can be skipped: contracts compute
/// this once ([`crate::contract::CompiledSchema::may_redact`]).
pub fn may_redact(input_schema: &Value) -> bool {
    fn walk(node: &Value, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return true;
        }
        match node {
            Value::Object(map) => map.iter().any(|(key, value)| {
                (key == "x-warrant-sensitive" && *value == Value::Bool(true))
                    || key == "$ref"
                    || walk(value, depth + 1)
            }),
            Value::Array(items) => items.iter().any(|item| walk(item, depth + 1)),
            _ => false,
        }
    }
    walk(input_schema, 0)
}

fn redact_at(root: &Value, schema: &Value, value: &Value, key: &RedactionKey, depth: usize) -> Value {
    let Value::Object(node) = schema else {
        return value.clone();
    };
    if depth > MAX_DEPTH || node.get("x-warrant-sensitive") == Some(&Value::Bool(true)) {
        // Past the depth bound, redact rather than risk leaking.
        return Value::String(key.token(value));
    }
    let mut out = value.clone();
    for sub in subschemas(root, node) {
        out = redact_at(root, sub, &out, key, depth + 1);
    }
    match &mut out {
        Value::Object(members) => {
            if let Some(Value::Object(properties)) = node.get("properties") {
                redact_members(root, properties, members, key, depth);
            }
        }
        Value::Array(items) => {
            let prefix = node.get("prefixItems").and_then(Value::as_array);
            for (i, item) in items.iter_mut().enumerate() {
                let item_schema = prefix.and_then(|p| p.get(i)).or_else(|| node.get("items"));
                if let Some(s) = item_schema {
                    *item = redact_at(root, s, item, key, depth + 1);
                }
            }
        }
        _ => {}
    }
    out
}

fn redact_members(
    root: &Value,
    properties: &Map<String, Value>,
    members: &mut Map<String, Value>,
    key: &RedactionKey,
    depth: usize,
) {
    for (name, member) in members.iter_mut() {
        if let Some(s) = properties.get(name) {
            *member = redact_at(root, s, member, key, depth + 1);
        }
    }
}

/// The schemas that apply to the same value: local `$ref` and composition branches.
fn subschemas<'a>(root: &'a Value, node: &'a Map<String, Value>) -> Vec<&'a Value> {
    let mut out = Vec::new();
    if let Some(target) = node
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        if let Some(resolved) = root.pointer(target) {
            out.push(resolved);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = node.get(key) {
            out.extend(branches.iter());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> RedactionKey {
        RedactionKey::new(vec![7; 32]).unwrap()
    }

    #[test]
    fn sensitive_values_become_keyed_tokens() {
        let schema = json!({
            "type": "object",
            "properties": {
                "to": {"type": "array", "items": {"type": "string", "x-warrant-sensitive": true}},
                "body": {"type": "string", "x-warrant-sensitive": true},
                "card": {"$ref": "#/$defs/card"},
                "subject": {"type": "string"}
            },
            "$defs": {"card": {"type": "object", "properties": {"number": {"type": "string", "x-warrant-sensitive": true}, "brand": {"type": "string"}}}}
        });
        let args = json!({"to": ["a@x.example"], "body": "secret text", "subject": "hi",
                          "card": {"number": "4242424242424242", "brand": "visa"}});
        let out = redact(&schema, &args, &key());
        let text = out.to_string();
        assert!(
            !text.contains("secret text") && !text.contains("4242") && !text.contains("a@x.example"),
            "{text}"
        );
        assert_eq!(out["subject"], "hi");
        assert_eq!(out["card"]["brand"], "visa");
        assert!(out["body"].as_str().unwrap().starts_with("hmac-sha256:"));
        // Deterministic for one key, different under another.
        assert_eq!(out, redact(&schema, &args, &key()));
        let other = RedactionKey::new(vec![8; 32]).unwrap();
        assert_ne!(out["body"], redact(&schema, &args, &other)["body"]);
        assert!(RedactionKey::new(vec![0; 8]).is_none());
        assert_eq!(format!("{:?}", key()), "RedactionKey(..)");
    }

    #[test]
    fn schemas_that_cannot_redact_are_recognised() {
        let plain = json!({
            "type": "object",
            "properties": {
                "to": {"type": "array", "items": {"type": "string"}},
                "card": {"allOf": [{"type": "object", "properties": {"n": {"type": "string"}}}]},
                "flag": {"type": "boolean", "x-warrant-sensitive": false}
            }
        });
        assert!(!may_redact(&plain));
        let args = json!({"to": ["a"], "card": {"n": "4242"}, "flag": true});
        assert_eq!(redact(&plain, &args, &key()), args);
        assert!(may_redact(
            &json!({"properties": {"a": {"x-warrant-sensitive": true}}})
        ));
        assert!(may_redact(&json!({"items": [{"$ref": "#"}]})));
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(may_redact(&deep));
    }

    #[test]
    fn recursive_schemas_terminate() {
        let schema = json!({"$ref": "#"});
        let out = redact(&schema, &json!({"a": 1}), &key());
        assert!(out.as_str().unwrap().starts_with("hmac-sha256:"));
    }
}
