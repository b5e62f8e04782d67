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
use crate::contract::CompiledSchema;
use crate::contract::walk::Annotations;
use crate::decision::Rejection;

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

    /// A key for another purpose, derived from this one (HMAC-SHA256 over a domain-separated
    /// `label`): every node configured with the same key derives the same subkey, and no
    /// subkey reveals the key or another subkey.
    pub fn derive(&self, label: &str) -> [u8; 32] {
        let mut out = [0; 32];
        // INVARIANT: HMAC accepts keys of any length, so this never fails.
        if let Ok(mut mac) = HmacSha256::new_from_slice(&self.0) {
            mac.update(b"warrant-subkey-v1\0");
            mac.update(label.as_bytes());
            out.copy_from_slice(&mac.finalize().into_bytes());
        }
        out
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

/// Returns `arguments` (valid for `schema`) with every value a sensitive node applies to
/// replaced by its token: one walk ([`crate::contract::walk`]), then [`redact_annotated`].
///
/// # Errors
/// `reject(schema, ARGUMENTS_TOO_COMPLEX)` when the walk overflows: arguments that cannot be
/// walked are refused, never stored in clear.
pub fn redact_map(
    schema: &CompiledSchema,
    arguments: &Map<String, Value>,
    key: &RedactionKey,
) -> Result<Value, Rejection> {
    Ok(redact_annotated(&schema.annotations(arguments)?, arguments, key))
}

/// [`redact_map`] for any value valid for `schema`.
///
/// # Errors
/// `reject(schema, ARGUMENTS_TOO_COMPLEX)` when the walk overflows.
pub fn redact(schema: &CompiledSchema, value: &Value, key: &RedactionKey) -> Result<Value, Rejection> {
    let annotations = schema.walker().annotations_of(value).map_err(|o| o.rejection())?;
    let mut out = value.clone();
    replace_sensitive(&annotations, &mut out, key);
    Ok(out)
}

/// `arguments` with every value a sensitive node applies to (as the walk found them) replaced
/// by its token. Where sensitive values nest, the outermost is replaced, and its token is
/// always over the value as proposed, so equal values get equal tokens whatever nests in them.
pub fn redact_annotated(
    annotations: &Annotations<'_, '_>,
    arguments: &Map<String, Value>,
    key: &RedactionKey,
) -> Value {
    let mut out = Value::Object(arguments.clone());
    replace_sensitive(annotations, &mut out, key);
    out
}

fn replace_sensitive(annotations: &Annotations<'_, '_>, out: &mut Value, key: &RedactionKey) {
    let mut sensitive: Vec<_> = annotations
        .hits()
        .iter()
        .filter(|h| h.node().sensitive())
        .collect();
    sensitive.sort_by(|a, b| a.pointer().cmp(b.pointer()));
    let mut replaced: Vec<&str> = Vec::new();
    for hit in sensitive {
        let pointer = hit.pointer();
        let inside = |outer: &&str| {
            pointer == *outer
                || pointer
                    .strip_prefix(*outer)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        if replaced.iter().any(inside) {
            continue;
        }
        if let Some(slot) = out.pointer_mut(pointer) {
            *slot = Value::String(key.token(&hit.value().to_value()));
            replaced.push(pointer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> RedactionKey {
        RedactionKey::new(vec![7; 32]).unwrap()
    }

    fn compiled(schema: Value) -> CompiledSchema {
        CompiledSchema::compile(&schema).unwrap()
    }

    #[test]
    fn sensitive_values_become_keyed_tokens() {
        let schema = compiled(json!({
            "type": "object",
            "properties": {
                "to": {"type": "array", "items": {"type": "string", "x-warrant-sensitive": true}},
                "body": {"type": "string", "x-warrant-sensitive": true},
                "card": {"$ref": "#/$defs/card"},
                "subject": {"type": "string"}
            },
            "$defs": {"card": {"type": "object", "properties": {"number": {"type": "string", "x-warrant-sensitive": true}, "brand": {"type": "string"}}}}
        }));
        let args = json!({"to": ["a@x.example"], "body": "secret text", "subject": "hi",
                          "card": {"number": "4242424242424242", "brand": "visa"}});
        let out = redact(&schema, &args, &key()).unwrap();
        let text = out.to_string();
        assert!(
            !text.contains("secret text") && !text.contains("4242") && !text.contains("a@x.example"),
            "{text}"
        );
        assert_eq!(out["subject"], "hi");
        assert_eq!(out["card"]["brand"], "visa");
        assert!(out["body"].as_str().unwrap().starts_with("hmac-sha256:"));
        // Deterministic for one key, different under another.
        assert_eq!(out, redact(&schema, &args, &key()).unwrap());
        let other = RedactionKey::new(vec![8; 32]).unwrap();
        assert_ne!(out["body"], redact(&schema, &args, &other).unwrap()["body"]);
        assert!(RedactionKey::new(vec![0; 8]).is_none());
        assert_eq!(format!("{:?}", key()), "RedactionKey(..)");
        assert_eq!(
            redact_map(&schema, args.as_object().unwrap(), &key()).unwrap(),
            out
        );
    }

    #[test]
    fn schemas_that_cannot_redact_are_recognised() {
        let plain = compiled(json!({
            "type": "object",
            "properties": {
                "to": {"type": "array", "items": {"type": "string"}},
                "card": {"allOf": [{"type": "object", "properties": {"n": {"type": "string"}}}]},
                "flag": {"type": "boolean", "x-warrant-sensitive": false}
            }
        }));
        assert!(!plain.may_redact());
        let args = json!({"to": ["a"], "card": {"n": "4242"}, "flag": true});
        assert_eq!(redact(&plain, &args, &key()).unwrap(), args);
        assert!(compiled(json!({"properties": {"a": {"x-warrant-sensitive": true}}})).may_redact());
        // Recursion and depth alone no longer force the walk: only a sensitive node does.
        assert!(!compiled(json!({"items": {"$ref": "#"}})).may_redact());
        assert!(
            compiled(json!({"$defs": {"s": {"x-warrant-sensitive": true}}, "items": {"$ref": "#/$defs/s"}}))
                .may_redact()
        );
        assert!(!compiled(json!({"$defs": {"s": {"x-warrant-sensitive": true}}})).may_redact());
    }

    #[test]
    fn the_outermost_sensitive_value_is_hashed_as_proposed() {
        let schema = compiled(json!({
            "type": "object",
            "properties": {"card": {"x-warrant-sensitive": true, "type": "object",
                                    "properties": {"number": {"type": "string", "x-warrant-sensitive": true}}}}
        }));
        let args = json!({"card": {"number": "4242"}});
        let out = redact(&schema, &args, &key()).unwrap();
        assert_eq!(
            out["card"],
            Value::String(key().token(&json!({"number": "4242"})))
        );
    }

    #[test]
    fn recursive_schemas_terminate() {
        let schema = compiled(json!({"$ref": "#", "properties": {"a": {"x-warrant-sensitive": true}}}));
        let out = redact(&schema, &json!({"a": 1, "b": 2}), &key()).unwrap();
        assert!(out["a"].as_str().unwrap().starts_with("hmac-sha256:"));
        assert_eq!(out["b"], 2);
    }
}
