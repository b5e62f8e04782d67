//! The client's own bytes of a `tools/call`. The SDK decodes every message with `serde_json`
//! before a handler runs, and a decoded value has lost its spelling: `7.0` and `7` are the same
//! number, a duplicate key has been merged, `1e400` has become a float. So each message is
//! framed here, below the SDK, on both transports:
//!
//! - `params.arguments` of a `tools/call` is located in the raw message (`serde_json`'s
//!   `RawValue`, which keeps a value's text) and kept aside, byte for byte, as a [`RawCall`];
//! - the SDK is handed the message with that value replaced by `{}`, after the strict parser
//!   has checked everything else in it (a message that fails is a JSON-RPC parse error, as it is
//!   not a proposal);
//! - the handler builds the proposal from the [`RawCall`] (`{"tool", "version", …,
//!   "arguments"}`) and gives those bytes to `decide`, whose strict parser refuses what it
//!   refuses over HTTP — duplicate keys, number spellings, depth, size, surrogates, invalid
//!   UTF-8 — with the same stage and code and a ledger row.
//!
//! Other members of `params` (besides `name`, `arguments` and `_meta`) go into the proposal as
//! envelope members, so an identity field or an unknown field is refused as over HTTP.
//!
//! Locating is done on a copy whose invalid UTF-8 bytes are replaced by `?` (same length, never
//! a quote or a backslash, so the structure and every offset stay the same): invalid UTF-8
//! inside the arguments is then the proposal's problem (`INVALID_UTF8`, with a ledger row),
//! while anywhere else the strict check of the message refuses it.
//!
//! A batch (a JSON array) is refused; a `tools/call` whose arguments cannot be located is left
//! without a [`RawCall`] and is refused by the handler, never answered from the SDK's value.

use std::borrow::Cow;
use std::fmt;

use rmcp::model::RequestId;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use warrant_core::json::{self, JsonError, Limits, Shape};

/// The raw parts of one `tools/call`, kept for the handler (in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawCall {
    /// The JSON-RPC id of the message the parts came from.
    id: RequestId,
    /// `params.name` as decoded, to match the SDK's request against.
    name: String,
    /// `params.name` as written.
    name_text: String,
    /// Other members of `params`: `"key":value,` each, values as written.
    members: Vec<u8>,
    /// `params.arguments` as written (absent: `{}`).
    arguments: Option<Vec<u8>>,
}

impl RawCall {
    /// Whether these parts belong to the request `id` calling `name`.
    pub(crate) fn matches(&self, id: &RequestId, name: &str) -> bool {
        self.id == *id && self.name == name
    }

    /// `params.arguments` as written (`{}` when absent).
    pub(crate) fn arguments(&self) -> &[u8] {
        self.arguments.as_deref().unwrap_or(b"{}")
    }

    /// The proposal: `{"tool": <name>, "version": <version>, <members>, <extra>, "arguments":
    /// <arguments>}` with every value the client wrote as it wrote it; `extra` are envelope
    /// members the lane adds (each `"key":value,`).
    pub(crate) fn proposal(&self, version: u32, extra: &[u8]) -> Vec<u8> {
        let arguments = self.arguments.as_deref().unwrap_or(b"{}");
        let mut out = Vec::with_capacity(
            48 + self.name_text.len() + self.members.len() + extra.len() + arguments.len(),
        );
        out.extend_from_slice(b"{\"tool\":");
        out.extend_from_slice(self.name_text.as_bytes());
        out.extend_from_slice(b",\"version\":");
        out.extend_from_slice(version.to_string().as_bytes());
        out.push(b',');
        out.extend_from_slice(&self.members);
        out.extend_from_slice(extra);
        out.extend_from_slice(b"\"arguments\":");
        out.extend_from_slice(arguments);
        out.push(b'}');
        out
    }
}

/// A message ready for the SDK, and the raw parts of its `tools/call`.
#[derive(Debug)]
pub(crate) struct Framed<'a> {
    /// What the SDK decodes: the message, with `params.arguments` replaced by `{}`.
    pub(crate) message: Cow<'a, [u8]>,
    /// The raw parts, when the message is a `tools/call` they could be located in.
    pub(crate) call: Option<RawCall>,
}

/// A message refused before the SDK: a JSON-RPC error, answered when the message has an id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refused {
    /// The message's id, when it could be read.
    pub(crate) id: Option<Value>,
    /// `-32700` (not strict JSON) or `-32600` (not one request object).
    pub(crate) code: i64,
    /// What was wrong.
    pub(crate) message: String,
}

impl Refused {
    fn parse(id: Option<Value>, error: &JsonError) -> Self {
        Refused {
            id,
            code: -32700,
            message: format!("parse error: {} at byte {}", error.message(), error.offset()),
        }
    }

    /// The JSON-RPC error message.
    pub(crate) fn line(&self) -> String {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id.clone().unwrap_or(Value::Null),
            "error": {"code": self.code, "message": self.message},
        })
        .to_string()
    }
}

/// Frames one message (see the module documentation); `limits` bound the message as the SDK
/// will see it (the arguments are bounded by the proposal limits in `decide`).
///
/// # Errors
/// The message is not strict JSON outside the arguments, or is not one JSON object.
pub(crate) fn frame(message: &[u8], limits: Limits) -> Result<Framed<'_>, Refused> {
    let view = utf8_view(message);
    let text = std::str::from_utf8(&view).unwrap_or_default();
    let id = || {
        serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v.get("id").cloned())
    };
    if message.len() > limits.max_bytes {
        return Err(Refused {
            id: id(),
            code: -32700,
            message: format!(
                "parse error: the message is over the limit of {} bytes",
                limits.max_bytes
            ),
        });
    }
    let located = locate(text);
    let (sdk, call) = match located {
        Some(Located {
            mut call,
            arguments: Some((start, end)),
        }) => {
            // The client's bytes, not the view's: invalid UTF-8 in them is for `decide` to refuse.
            call.arguments = Some(message.get(start..end).unwrap_or_default().to_vec());
            let mut sdk = Vec::with_capacity(message.len() + 2 - (end - start));
            sdk.extend_from_slice(message.get(..start).unwrap_or_default());
            sdk.extend_from_slice(b"{}");
            sdk.extend_from_slice(message.get(end..).unwrap_or_default());
            (Cow::Owned(sdk), Some(call))
        }
        Some(Located {
            call,
            arguments: None,
        }) => (Cow::Borrowed(message), Some(call)),
        None => (Cow::Borrowed(message), None),
    };
    // Checked, not built: the SDK decodes the message itself.
    match json::check(&sdk, limits) {
        Err(e) => Err(Refused::parse(id(), &e)),
        Ok(Shape::Object) => Ok(Framed { message: sdk, call }),
        Ok(Shape::Array) => Err(Refused {
            id: None,
            code: -32600,
            message: "invalid request: batches are not accepted; send one message at a time".into(),
        }),
        Ok(Shape::Scalar) => Err(Refused {
            id: None,
            code: -32600,
            message: "invalid request: a message is a JSON object".into(),
        }),
    }
}

/// `bytes` with every byte of an invalid UTF-8 sequence replaced by `?`.
fn utf8_view(bytes: &[u8]) -> Cow<'_, [u8]> {
    if std::str::from_utf8(bytes).is_ok() {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.extend_from_slice(chunk.valid().as_bytes());
        out.extend(std::iter::repeat_n(b'?', chunk.invalid().len()));
    }
    Cow::Owned(out)
}

/// A located `tools/call`: its parts, and where its arguments are (byte offsets).
struct Located {
    call: RawCall,
    arguments: Option<(usize, usize)>,
}

/// The members of an object in document order, values as written (keys decoded).
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

impl<'a> Members<'a> {
    /// The one member named `key`; `Err` when it appears more than once.
    fn one(&self, key: &str) -> Result<Option<&'a RawValue>, ()> {
        let mut found = self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| *v);
        match (found.next(), found.next()) {
            (first, None) => Ok(first),
            (Some(_), Some(_)) | (None, Some(_)) => Err(()),
        }
    }
}

/// The parts of a `tools/call` in `text`; `None` for any other message, or one whose parts are
/// ambiguous (a repeated member), which the strict check then refuses.
fn locate(text: &str) -> Option<Located> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let top: Members<'_> = serde_json::from_str(text).ok()?;
    let method: String = serde_json::from_str(top.one("method").ok()??.get()).ok()?;
    if method != "tools/call" {
        return None;
    }
    let id: RequestId = serde_json::from_str(top.one("id").ok()??.get()).ok()?;
    let params: Members<'_> = serde_json::from_str(top.one("params").ok()??.get()).ok()?;
    let name_value = params.one("name").ok()??;
    let name: String = serde_json::from_str(name_value.get()).ok()?;
    let arguments = params.one("arguments").ok()?;
    let span = match arguments {
        Some(raw) if raw.get() != "null" => Some(span_of(text, raw.get())?),
        _ => None,
    };
    let mut members = Vec::new();
    for (key, value) in &params.0 {
        // A retry's `requestState` and `inputResponses` (MRTR) are the lane's, not the
        // proposal's: the SDK decodes them for the handler.
        if matches!(
            key.as_str(),
            "name" | "arguments" | "_meta" | "requestState" | "inputResponses"
        ) {
            continue;
        }
        members.extend_from_slice(serde_json::to_string(key).ok()?.as_bytes());
        members.push(b':');
        members.extend_from_slice(value.get().as_bytes());
        members.push(b',');
    }
    Some(Located {
        call: RawCall {
            id,
            name,
            name_text: name_value.get().to_owned(),
            members,
            arguments: None,
        },
        arguments: span,
    })
}

/// Where `part` (a slice of `text`) lies in `text`.
fn span_of(text: &str, part: &str) -> Option<(usize, usize)> {
    let start = part.as_ptr().addr().checked_sub(text.as_ptr().addr())?;
    let end = start.checked_add(part.len())?;
    (text.get(start..end)? == part).then_some((start, end))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 36,
    };

    fn framed(message: &[u8]) -> (String, RawCall) {
        let framed = frame(message, LIMITS).unwrap();
        (
            String::from_utf8(framed.message.into_owned()).unwrap(),
            framed.call.unwrap(),
        )
    }

    #[test]
    fn arguments_are_kept_as_written_and_the_sdk_sees_an_empty_object() {
        let message = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay", "arguments" : {"amount_cents":7.0,"a":1,"a":25e2} ,"_meta":{"k":"v"}}}"#;
        let (sdk, call) = framed(message);
        assert_eq!(
            sdk,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay", "arguments" : {} ,"_meta":{"k":"v"}}}"#
        );
        assert!(call.matches(&RequestId::Number(7), "pay"));
        assert!(!call.matches(&RequestId::Number(8), "pay"));
        assert!(!call.matches(&RequestId::Number(7), "other"));
        assert_eq!(
            String::from_utf8(call.proposal(3, b"")).unwrap(),
            r#"{"tool":"pay","version":3,"arguments":{"amount_cents":7.0,"a":1,"a":25e2}}"#
        );
    }

    #[test]
    fn other_params_members_become_envelope_members() {
        let message = br#"{"jsonrpc":"2.0","id":"x","method":"tools\/call","params":{"tenant":"other","name":"p\u0061y","colour":[1.0]}}"#;
        let (sdk, call) = framed(message);
        assert_eq!(sdk.as_bytes(), message, "nothing to replace without arguments");
        assert!(call.matches(&RequestId::String("x".into()), "pay"));
        assert_eq!(
            String::from_utf8(call.proposal(1, b"\"approval\":5,")).unwrap(),
            r#"{"tool":"p\u0061y","version":1,"tenant":"other","colour":[1.0],"approval":5,"arguments":{}}"#
        );
    }

    #[test]
    fn invalid_utf8_in_the_arguments_is_kept_for_decide() {
        let message = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"pay\",\"arguments\":{\"note\":\"\xff\"}}}";
        let (sdk, call) = framed(message);
        assert!(sdk.contains(r#""arguments":{}"#), "{sdk}");
        let proposal = call.proposal(1, b"");
        assert!(proposal.windows(1).any(|w| w == b"\xff"));
        // Elsewhere it is the message's fault.
        let message = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"p\xffy\",\"arguments\":{}}}";
        let refused = frame(message, LIMITS).unwrap_err();
        assert_eq!((refused.code, refused.id), (-32700, Some(serde_json::json!(1))));
    }

    #[test]
    fn deep_arguments_are_located() {
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let message = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"pay","arguments":{{"d":{deep}}}}}}}"#
        );
        let (sdk, call) = framed(message.as_bytes());
        assert!(sdk.contains(r#""arguments":{}"#), "{sdk}");
        assert!(call.proposal(1, b"").len() > 600);
    }

    #[test]
    fn the_rest_of_the_message_is_strict() {
        for message in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/call","params":{"name":"pay","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","name":"other","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{},"arguments":{"a":1}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{},"_meta":{"k":1,"k":2}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\ud800","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1e400,"method":"tools/call","params":{"name":"pay","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{}}} trailing"#,
        ] {
            let refused = frame(message.as_bytes(), LIMITS).unwrap_err();
            assert_eq!(refused.code, -32700, "{message}");
        }
    }

    #[test]
    fn batches_and_non_objects_are_refused() {
        let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{"a":7.0}}}]"#;
        assert_eq!(frame(batch.as_bytes(), LIMITS).unwrap_err().code, -32600);
        assert_eq!(frame(b"5", LIMITS).unwrap_err().code, -32600);
        let big = vec![b' '; LIMITS.max_bytes + 1];
        assert_eq!(frame(&big, LIMITS).unwrap_err().code, -32700);
    }

    #[test]
    fn other_messages_pass_unchanged_without_raw_parts() {
        let message = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"arguments":{"a":1}}}"#;
        let framed = frame(message, LIMITS).unwrap();
        assert_eq!(&*framed.message, message.as_slice());
        assert!(framed.call.is_none());
    }
}
