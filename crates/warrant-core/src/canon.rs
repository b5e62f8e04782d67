//! RFC 8785 (JCS) canonical JSON and the SHA-256 digests built on it.
//!
//! Every digest Warrant binds anything to — contract ids, adapter-binding digests, payload
//! digests that approvals and idempotency records hold — is SHA-256 over the canonical bytes
//! produced here, so any conforming JCS implementation in another language computes the same
//! value from the same document. The serializer is checked against the RFC's test vectors
//! and, as an oracle, against `serde_json_canonicalizer` (tests below and property tests).

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
        hex_lower(&self.0)
    }

    /// `sha256:<64 lowercase hex>`, as `to_string` writes it, in one allocation of the
    /// exact size (records take a digest as text on every call).
    pub fn text(&self) -> String {
        let mut text = [0u8; 64];
        encode_hex(&self.0, &mut text);
        let mut out = String::with_capacity(71);
        out.push_str("sha256:");
        out.push_str(std::str::from_utf8(&text).unwrap_or_default());
        out
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
        let mut text = [0u8; 64];
        // Encoding into a stack buffer: digests are formatted several times per call.
        encode_hex(&self.0, &mut text);
        f.write_str("sha256:")?;
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

/// `bytes` as lowercase hex, written in one pass into one allocation of the exact size.
/// `hex::encode` collects its text a `char` at a time, about 35 instructions a character;
/// keys, digests and trace ids are written this way on every call.
pub fn hex_lower(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    encode_hex(bytes, &mut out);
    // Always ASCII: the fallback is never taken.
    String::from_utf8(out).unwrap_or_default()
}

/// Each byte's two lowercase hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: [u8; 16] = *b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        #[allow(clippy::indexing_slicing, reason = "in bounds: a byte's nibbles, and 0..256")]
        {
            pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 0xf]];
        }
        byte += 1;
    }
    pairs
};

/// `bytes` as lowercase hex into `out`, two digits a byte (`out` is twice as long as `bytes`;
/// a shorter one takes the first bytes that fit).
///
/// Written by hand, a table lookup a byte: `hex::encode_to_slice` works out each nibble's
/// digit and index (about 20 instructions a byte, against 4 here), and every call writes two
/// or three digests and a trace id this way. `hex_lower_is_hex_encode` holds it to `hex`.
fn encode_hex(bytes: &[u8], out: &mut [u8]) {
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        if let Some(digits) = HEX_PAIRS.get(usize::from(*byte)) {
            pair.copy_from_slice(digits);
        }
    }
}

/// The RFC 8785 canonical form of a JSON value.
///
/// Written by hand (rather than calling `serde_json_canonicalizer`, which stays the test
/// oracle below) because it sits on every call's hot path: the crate re-parses every object
/// key to sort it, which made canonicalization the largest share of the offline decision. The
/// rules are short: object members sorted by the UTF-16 code units of their names, strings
/// escaped as ECMAScript's `JSON.stringify` does, numbers formatted as ECMAScript's
/// `Number.prototype.toString` (via `ryu-js`), no whitespace.
pub fn canonical_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_value(&mut out, value);
    out
}

/// The canonical form of an object given as a map (no `Value` wrapper needed).
pub fn canonical_bytes_of_map(map: &serde_json::Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_object(&mut out, map);
    out
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(out, map),
    }
}

fn write_object(out: &mut Vec<u8>, map: &serde_json::Map<String, Value>) {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    // UTF-16 code unit order (RFC 8785 §3.2.3). For ASCII names it equals byte order, which
    // is the common case and cheaper to compare.
    members.sort_by(|(a, _), (b, _)| {
        if a.is_ascii() && b.is_ascii() {
            a.as_bytes().cmp(b.as_bytes())
        } else {
            a.encode_utf16().cmp(b.encode_utf16())
        }
    });
    out.push(b'{');
    for (i, (key, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, key);
        out.push(b':');
        write_value(out, value);
    }
    out.push(b'}');
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut rest = s.as_bytes();
    // Runs that need no escaping are copied whole; each ends at a byte to escape, or at the end.
    loop {
        let (plain, tail) = rest
            .split_at_checked(crate::json::plain_prefix_len(rest))
            .unwrap_or((rest, &[]));
        out.extend_from_slice(plain);
        let Some((&b, after)) = tail.split_first() else {
            break;
        };
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'));
                out.push(HEX.get(usize::from(b & 0xf)).copied().unwrap_or(b'0'));
            }
        }
        rest = after;
    }
    out.push(b'"');
}

fn write_number(out: &mut Vec<u8>, n: &serde_json::Number) {
    const SAFE: u64 = 1 << 53;
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= SAFE) {
        if i < 0 {
            out.push(b'-');
        }
        write_digits(out, i.unsigned_abs());
    } else if let Some(u) = n.as_u64().filter(|u| *u <= SAFE) {
        write_digits(out, u);
    } else {
        // Beyond 2^53 an integer is what every other implementation sees: the nearest double.
        let f = n.as_f64().unwrap_or(0.0);
        let mut buffer = ryu_js::Buffer::new();
        out.extend_from_slice(buffer.format_finite(f).as_bytes());
    }
}

/// The decimal digits of `n` (no allocation: integers are on every call's path).
fn write_digits(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut len = 0;
    for slot in digits.iter_mut() {
        *slot = b'0' + u8::try_from(n % 10).unwrap_or(0);
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits.iter().take(len).rev());
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

    #[test]
    fn hex_lower_is_hex_encode() {
        for bytes in [&[][..], &[0u8], &[0xff, 0x0a, 0x5c], &[0xab; 33]] {
            assert_eq!(hex_lower(bytes), hex::encode(bytes));
        }
        let every: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_lower(&every), hex::encode(&every));
        let digest = Sha256Digest::of_bytes(b"warrant");
        let expected = format!("sha256:{}", hex::encode(digest.as_bytes()));
        assert_eq!(digest.text(), expected);
        assert_eq!(digest.to_string(), expected);
        assert_eq!(digest.hex(), expected.trim_start_matches("sha256:"));
    }

    fn canon(text: &str) -> String {
        canonical_string(&parse(text.as_bytes(), Limits::DOCUMENT).unwrap())
    }

    #[test]
    fn digest_text_is_its_display() {
        let d = Sha256Digest::of_bytes(b"x");
        assert_eq!(d.text(), d.to_string());
        assert_eq!(Sha256Digest::parse(&d.text()), Some(d));
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

    /// The hand-written serializer agrees with `serde_json_canonicalizer` (the oracle).
    #[test]
    fn agrees_with_the_reference_canonicalizer() {
        let samples = [
            r#"{"b":[1,2.5,-0.0,1e21,1e-7,123456789012345680000],"a":{"\u00e9":"\u0000\u001f\u007f\u2028","\ud83d\ude00":true,"\ue000":null},"":""}"#,
            r#"["\"\\\b\f\n\r\t/", 9007199254740991, -9007199254740991, 0.1, 5e-324, 1.7976931348623157e308]"#,
        ];
        for sample in samples {
            let v = parse(sample.as_bytes(), Limits::DOCUMENT).unwrap();
            assert_eq!(
                canonical_bytes(&v),
                serde_json_canonicalizer::to_vec(&v).unwrap(),
                "{sample}"
            );
        }
        let big = serde_json::json!([u64::MAX, i64::MIN, 9007199254740993u64]);
        assert_eq!(
            canonical_bytes(&big),
            serde_json_canonicalizer::to_vec(&big).unwrap()
        );
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
