//! RFC 8785 (JCS) canonical JSON and the SHA-256 digests built on it.
//!
//! Every digest Warrant binds anything to — contract ids, adapter-binding digests, payload
//! digests that approvals and idempotency records hold — is SHA-256 over the canonical bytes
//! produced here, so any conforming JCS implementation in another language computes the same
//! value from the same document. Canonicalization itself is delegated to
//! `serde_json_canonicalizer`, which passes the RFC's test vectors (kept as tests below).

use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// A `sha256:<64 lowercase hex>` digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256Digest([u8; 32]);

impl Sha256Digest {
    /// The digest of raw bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Sha256Digest(Sha256::digest(bytes).into())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex characters, without the `sha256:` prefix.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses `sha256:<64 lowercase hex>`; anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let hex_part = text.strip_prefix("sha256:")?;
        if hex_part.len() != 64 || hex_part.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).ok()?;
        Some(Sha256Digest(out))
    }
}

impl std::fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

/// The RFC 8785 canonical form of a JSON value.
///
/// A [`Value`] cannot hold NaN or infinities, the only inputs JCS refuses, so this cannot fail.
pub fn canonical_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    // INVARIANT: serde_json_canonicalizer only errors on non-finite floats and on I/O errors
    // of the writer; a `Value` has no non-finite floats and a `Vec` writer cannot fail.
    match serde_json_canonicalizer::to_writer(value, &mut out) {
        Ok(()) => out,
        Err(_) => {
            // Unreachable by the invariant above; fall back to an encoding that can never
            // collide with a canonical document (canonical JSON never starts with a NUL byte).
            vec![0]
        }
    }
}

/// The canonical form as a string (canonical JSON is always valid UTF-8).
pub fn canonical_string(value: &Value) -> String {
    String::from_utf8(canonical_bytes(value)).unwrap_or_default()
}

/// SHA-256 of the canonical form of `value`.
pub fn digest(value: &Value) -> Sha256Digest {
    Sha256Digest::of_bytes(&canonical_bytes(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{Limits, parse};

    fn canon(text: &str) -> String {
        canonical_string(&parse(text.as_bytes(), Limits::DOCUMENT).unwrap())
    }

    /// The examples of RFC 8785 §3.2.2 and appendix B.
    #[test]
    fn rfc8785_vectors() {
        assert_eq!(
            canon(
                r#"{
                  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                  "literals": [null, true, false]
                }"#
            ),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        // UTF-16 code unit ordering of keys (RFC 8785 §3.2.3).
        assert_eq!(
            canon(
                r#"{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
                    "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}"#
            ),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    /// Number serialization vectors from RFC 8785 appendix B (IEEE-754 bit patterns).
    #[test]
    fn rfc8785_number_vectors() {
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, expected) in cases {
            let value = Value::from(f64::from_bits(bits));
            assert_eq!(canonical_string(&value), expected, "bits {bits:#x}");
        }
    }

    #[test]
    fn digest_round_trips_through_text() {
        let d = digest(&parse(br#"{"b":1,"a":2}"#, Limits::DOCUMENT).unwrap());
        assert_eq!(Sha256Digest::parse(&d.to_string()), Some(d));
        assert_eq!(
            d,
            digest(&parse(br#"{ "a": 2, "b": 1.0 }"#, Limits::DOCUMENT).unwrap())
        );
        assert_eq!(Sha256Digest::parse("sha256:ABC"), None);
        assert_eq!(Sha256Digest::parse(&d.to_string().to_uppercase()), None);
    }
}
