//! The client's own bytes of a `tools/call`. The SDK decodes every message with `serde_json`
//! before a handler runs, and a decoded value has lost its spelling: `7.0` and `7` are the same
//! number, a duplicate key has been merged, `1e400` has become a float. So each message is
//! framed here, below the SDK, on both transports:
//!
//! - one pass of the strict parser ([`json::check_framed`]) checks everything in the message
//!   but `params.arguments`, which it only scans for its extent, and says where each member
//!   lies (a message that fails is a JSON-RPC parse error, as it is not a proposal);
//! - `params.arguments` of a `tools/call` is kept aside, byte for byte, as a [`RawCall`], and
//!   the SDK is handed the message with that value replaced by `{}`; the arguments of any
//!   other message are checked as strictly as the rest of it ([`json::check_hole`]);
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
use std::ops::Range;

use axum::body::Bytes;
use rmcp::model::RequestId;
use serde_json::Value;
use warrant_core::json::{self, JsonError, Limits, Shape};

/// The raw parts of one `tools/call`, kept for the handler (in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawCall {
    /// The JSON-RPC id of the message the parts came from.
    id: RequestId,
    /// `params.name` as decoded, to match the SDK's request against.
    name: String,
    /// `params.name` as written, when that is not the name in quotes (it has escapes).
    name_text: Option<String>,
    /// Other members of `params`: `"key":value,` each, values as written.
    members: Vec<u8>,
    /// The client's message, shared (not copied): `arguments` lie in it.
    message: Bytes,
    /// Where `params.arguments` lie in `message`, as written (absent: `{}`).
    arguments: Option<Range<usize>>,
}

impl RawCall {
    /// Whether these parts belong to the request `id` calling `name`.
    pub(crate) fn matches(&self, id: &RequestId, name: &str) -> bool {
        self.id == *id && self.name == name
    }

    /// The JSON-RPC id of the message.
    pub(crate) fn id(&self) -> &RequestId {
        &self.id
    }

    /// `params.name` as decoded.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `params.arguments` as written (`{}` when absent).
    pub(crate) fn arguments(&self) -> &[u8] {
        self.arguments
            .as_ref()
            .and_then(|range| self.message.get(range.clone()))
            .unwrap_or(b"{}")
    }

    /// The proposal: `{"tool": <name>, "version": <version>, <members>, <extra>, "arguments":
    /// <arguments>}` with every value the client wrote as it wrote it; `extra` are envelope
    /// members the lane adds (each `"key":value,`).
    pub(crate) fn proposal(&self, version: u32, extra: &[u8]) -> Vec<u8> {
        let arguments = self.arguments();
        let mut out = Vec::with_capacity(
            50 + self.name.len()
                + self.name_text.as_ref().map_or(0, String::len)
                + self.members.len()
                + extra.len()
                + arguments.len(),
        );
        out.extend_from_slice(b"{\"tool\":");
        match &self.name_text {
            Some(text) => out.extend_from_slice(text.as_bytes()),
            None => {
                out.push(b'"');
                out.extend_from_slice(self.name.as_bytes());
                out.push(b'"');
            }
        }
        out.extend_from_slice(b",\"version\":");
        // Written as `serde_json` writes a number (no formatter, no allocation); writing into
        // a vector cannot fail.
        serde_json::to_writer(&mut out, &version).unwrap_or(());
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
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Framed<'a> {
    /// The client's message.
    original: &'a [u8],
    /// Where `params.arguments` lie, when they were set aside for the proposal.
    set_aside: Option<Range<usize>>,
    /// The raw parts, when the message is a `tools/call` they could be located in.
    pub(crate) call: Option<RawCall>,
    /// Set when the `tools/call` is plain (see [`Plain`]).
    pub(crate) plain: Option<Plain>,
}

impl<'a> Framed<'a> {
    /// What the SDK decodes: the message, with `params.arguments` replaced by `{}`.
    pub(crate) fn message(&self) -> Cow<'a, [u8]> {
        let Some(range) = &self.set_aside else {
            return Cow::Borrowed(self.original);
        };
        let (before, after) = (
            self.original.get(..range.start).unwrap_or_default(),
            self.original.get(range.end..).unwrap_or_default(),
        );
        let mut sdk = Vec::with_capacity(before.len() + 2 + after.len());
        sdk.extend_from_slice(before);
        sdk.extend_from_slice(b"{}");
        sdk.extend_from_slice(after);
        Cow::Owned(sdk)
    }

    /// The client's message as it came.
    pub(crate) fn original(&self) -> &'a [u8] {
        self.original
    }
}

/// A `tools/call` with nothing but `jsonrpc` (written `"2.0"`), `id`, `method` and `params`,
/// whose `params` hold nothing but `name`, `arguments` and `_meta`: the message the SDK's
/// types decode to a call and nothing else, which the direct path may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plain {
    /// Where `params._meta` lies in the message.
    pub(crate) meta: Option<Range<usize>>,
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

/// Frames one message (see the module documentation) in one strict pass
/// ([`json::check_framed`]); `limits` bound the message as the SDK will see it (the arguments
/// are bounded by the proposal limits in `decide`).
///
/// # Errors
/// The message is not strict JSON outside the arguments, or is not one JSON object.
pub(crate) fn frame(bytes: &Bytes, limits: Limits) -> Result<Framed<'_>, Refused> {
    match frame_plainly(bytes, limits) {
        Some(framed) => Ok(framed),
        None => frame_generally(bytes, limits),
    }
}

/// [`frame`] of the usual `tools/call`, read in one pass ([`json::check_plain_request`]): a
/// [`Plain`] call whose arguments, when present, are an object set aside. `None` for any other
/// message, which [`frame_generally`] reads. The property
/// `a_plain_call_is_framed_as_the_general_framing_frames_it` holds the two to the same answer.
fn frame_plainly(bytes: &Bytes, limits: Limits) -> Option<Framed<'_>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let request = json::check_plain_request(text, limits, "tools/call")?;
    let id = request_id(text.get(request.id)?)?;
    let name = text.get(request.name)?.to_owned();
    Some(Framed {
        original: bytes.as_ref(),
        set_aside: request.arguments.clone(),
        call: Some(RawCall {
            id,
            name,
            name_text: None,
            members: Vec::new(),
            message: bytes.clone(),
            arguments: request.arguments,
        }),
        plain: Some(Plain { meta: request.meta }),
    })
}

/// [`frame`] of any message, in one strict pass ([`json::check_framed`]).
fn frame_generally(bytes: &Bytes, limits: Limits) -> Result<Framed<'_>, Refused> {
    let message = bytes.as_ref();
    let view = utf8_view(message);
    let id = || {
        serde_json::from_slice::<Value>(view.as_bytes())
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
    let (shape, framing) = match json::check_framed(&view, limits, "params", "arguments") {
        Ok(checked) => checked,
        Err(e) => return Err(Refused::parse(id(), &e)),
    };
    match shape {
        Shape::Object => {}
        Shape::Array => {
            return Err(Refused {
                id: None,
                code: -32600,
                message: "invalid request: batches are not accepted; send one message at a time".into(),
            });
        }
        Shape::Scalar => {
            return Err(Refused {
                id: None,
                code: -32600,
                message: "invalid request: a message is a JSON object".into(),
            });
        }
    }
    let located = locate(&view, &framing);
    let set_aside = match (&located, &framing.hole) {
        (Some(_), Some(hole)) if view.as_bytes().get(hole.clone()) != Some(b"null".as_slice()) => {
            Some(hole.clone())
        }
        // Not set aside: the arguments are the message's, and as strict as the rest of it.
        (_, Some(hole)) => {
            json::check_hole(view.as_bytes(), hole.clone(), limits).map_err(|e| Refused::parse(id(), &e))?;
            None
        }
        (_, None) => None,
    };
    // Invalid UTF-8 (read as `?` so far) is the proposal's problem inside the arguments set
    // aside, and the message's anywhere else.
    if let Cow::Owned(_) = view {
        let outside = match &set_aside {
            Some(range) => [
                message.get(..range.start).unwrap_or_default(),
                message.get(range.end..).unwrap_or_default(),
            ],
            None => [message, &[]],
        };
        for (part, base) in outside.iter().zip([0, set_aside.as_ref().map_or(0, |r| r.end)]) {
            if let Err(e) = std::str::from_utf8(part) {
                return Err(Refused {
                    id: id(),
                    code: -32700,
                    message: format!(
                        "parse error: document is not valid UTF-8 at byte {}",
                        base + e.valid_up_to()
                    ),
                });
            }
        }
    }
    let (call, plain) = match located {
        Some(Located { mut call, plain }) => {
            // The client's bytes, not the view's: invalid UTF-8 in them is for `decide` to refuse.
            call.message = bytes.clone();
            call.arguments.clone_from(&set_aside);
            (Some(call), plain)
        }
        None => (None, None),
    };
    Ok(Framed {
        original: message,
        set_aside,
        call,
        plain,
    })
}

/// `bytes` as text, with every byte of an invalid UTF-8 sequence replaced by `?` (so the
/// strict pass reads text it need not validate again).
fn utf8_view(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        out.extend(std::iter::repeat_n('?', chunk.invalid().len()));
    }
    Cow::Owned(out)
}

/// A located `tools/call`: its parts, and whether it is [`Plain`].
struct Located {
    call: RawCall,
    plain: Option<Plain>,
}

/// A JSON-RPC id as the SDK decodes it. The common spellings — digits that fit an `i64`, a
/// string without escapes — are read directly (the strict pass has checked the text: no
/// leading zeros, valid UTF-8); anything else goes through `serde_json` as the SDK's type.
fn request_id(text: &str) -> Option<RequestId> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.len() <= 18 && digits.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok().map(RequestId::Number);
    }
    if let Some(plain) = plain_string(text) {
        return Some(RequestId::String(plain.into()));
    }
    serde_json::from_str(text).ok()
}

/// The value of a JSON string written without escapes (what most names and ids are), as it is
/// decoded; `None` for any other text. The strict pass has checked the text is valid JSON, so
/// without a backslash the characters between the quotes are the string.
fn plain_string(text: &str) -> Option<&str> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// The parts of a `tools/call` in the message, from where the strict pass found its members;
/// `None` for any other message. One pass over each list of members (the strict pass has
/// refused repeated keys, so each key is seen at most once).
fn locate(view: &str, framing: &json::Framing<'_>) -> Option<Located> {
    let (mut method, mut id, mut jsonrpc, mut params) = (None, None, None, false);
    for (key, range) in &framing.members {
        match key.as_ref() {
            "method" => method = view.get(range.clone()),
            "id" => id = view.get(range.clone()),
            "jsonrpc" => jsonrpc = view.get(range.clone()),
            "params" => params = true,
            _ => {}
        }
    }
    let method = method?;
    if method != "\"tools/call\"" && serde_json::from_str::<String>(method).ok()? != "tools/call" {
        return None;
    }
    let id = request_id(id?)?;
    let (mut name_value, mut meta) = (None, None);
    let mut members = Vec::new();
    let mut plain = true;
    for (key, range) in &framing.inner {
        // A retry's `requestState` and `inputResponses` (MRTR) are the lane's, not the
        // proposal's: the SDK decodes them for the handler.
        match key.as_ref() {
            "name" => {
                name_value = view.get(range.clone());
                continue;
            }
            "arguments" => continue,
            "_meta" => {
                meta = Some(range.clone());
                continue;
            }
            "requestState" | "inputResponses" => {}
            _ => {
                members.extend_from_slice(serde_json::to_string(key).ok()?.as_bytes());
                members.push(b':');
                members.extend_from_slice(view.get(range.clone())?.as_bytes());
                members.push(b',');
            }
        }
        plain = false;
    }
    let name_value = name_value?;
    // A plain name is its text in quotes; any other spelling is kept as written.
    let (name, name_text) = match plain_string(name_value) {
        Some(plain) => (plain.to_owned(), None),
        None => (
            serde_json::from_str::<String>(name_value).ok()?,
            Some(name_value.to_owned()),
        ),
    };
    plain = plain && framing.members.len() == 4 && jsonrpc == Some("\"2.0\"") && params;
    Some(Located {
        call: RawCall {
            id,
            name,
            name_text,
            members,
            message: Bytes::new(),
            arguments: None,
        },
        plain: plain.then_some(Plain { meta }),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 36,
    };

    /// [`super::frame`] of a copy of `message` (kept for the test's length).
    fn frame(message: &[u8], limits: Limits) -> Result<Framed<'static>, Refused> {
        super::frame(Box::leak(Box::new(Bytes::copy_from_slice(message))), limits)
    }

    fn framed(message: &[u8]) -> (String, RawCall) {
        let framed = frame(message, LIMITS).unwrap();
        (
            String::from_utf8(framed.message().into_owned()).unwrap(),
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
    fn ids_and_names_read_directly_are_what_serde_reads() {
        for text in [
            "0",
            "7",
            "-1",
            "-0",
            "123456789012345",
            "-123456789012345",
            "1234567890123456",
            "123456789012345678",
            "1234567890123456789",
            "-9223372036854775808",
            "99999999999999999999",
            "1.5",
            "1e3",
            r#""""#,
            r#""req-é""#,
            r#""a\"b""#,
            r#""\u0061""#,
            r#""tools/call""#,
            "null",
            "true",
            "[]",
        ] {
            let serde = serde_json::from_slice::<RequestId>(text.as_bytes()).ok();
            assert_eq!(request_id(text), serde, "{text}");
            if let Some(plain) = plain_string(text) {
                assert_eq!(
                    Some(plain.to_owned()),
                    serde_json::from_str::<String>(text).ok(),
                    "{text}"
                );
            }
        }
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
    fn arguments_not_set_aside_are_as_strict_as_the_rest() {
        // Another method's arguments are the message's own.
        let message =
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"arguments":{"a":1,"a":2}}}"#;
        let refused = frame(message, LIMITS).unwrap_err();
        assert_eq!((refused.code, refused.id), (-32700, Some(serde_json::json!(2))));
        // So are those of a call that cannot be located (no name), and invalid UTF-8 in them.
        let message = b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"arguments\":{\"n\":\"\xff\"}}}";
        let refused = frame(message, LIMITS).unwrap_err();
        assert!(refused.message.contains("UTF-8"), "{}", refused.message);
        // `null` arguments stay in the message, as the SDK reads them (absent).
        let message =
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"pay","arguments":null}}"#;
        let (sdk, call) = framed(message);
        assert_eq!(sdk.as_bytes(), message);
        assert_eq!(call.arguments(), b"{}");
    }

    /// Messages whose every part may be plain or break a rule: the method, the id, the name,
    /// the arguments (repeated keys, number spellings, surrogates, broken grammar) and the other
    /// members.
    fn messages() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pick = |options: &'static [&'static str]| proptest::sample::select(options);
        (
            pick(&[r#""tools/call""#, r#""tools\/call""#, r#""tools/list""#, "7"]),
            pick(&["1", r#""a""#, "1e400", "1.5", "null"]),
            pick(&[r#""name":"pay","#, r#""name":"p\u0061y","#, r#""name":7,"#, "", r#""name":"\ud800","#]),
            pick(&[
                r#"{"a":1}"#,
                r#"{"a":1,"a":2}"#,
                r#"{"n":7.0,"m":1e400}"#,
                r#"{"s":"\ud800"}"#,
                "null",
                "[1,2]",
                r#"{"a":}"#,
                r#"{"a":[1,{"b":"x"}]}"#,
            ]),
            pick(&["", r#""_meta":{"k":"v"},"#, r#""_meta":{"k":1,"k":2},"#, r#""tenant":"t","#]),
            pick(&["", r#","extra":true"#, r#","id":2"#]),
        )
            .prop_map(|(method, id, name, arguments, more, tail)| {
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{{{name}{more}"arguments":{arguments}}}{tail}}}"#
                )
            })
    }

    proptest::proptest! {
        /// Whatever the framing lets through is strict outside the arguments it set aside, and
        /// those are the client's bytes; whatever it refuses, the strict parser refuses with the
        /// arguments replaced (or, when they are not set aside, as written).
        #[test]
        fn the_framing_is_the_strict_parser_around_the_arguments(message in messages()) {
            let start = message.find(r#""arguments":"#).unwrap() + r#""arguments":"#.len();
            match frame(message.as_bytes(), LIMITS) {
                Ok(framed) => {
                    let sdk = framed.message();
                    proptest::prop_assert!(json::check(&sdk, LIMITS).is_ok(), "{}", message);
                    if let Some(call) = &framed.call
                        && sdk.as_ref() != message.as_bytes()
                    {
                        let arguments = std::str::from_utf8(call.arguments()).unwrap();
                        proptest::prop_assert!(message[start..].starts_with(arguments), "{}", message);
                        proptest::prop_assert!(
                            String::from_utf8(sdk.into_owned()).unwrap().contains(r#""arguments":{}"#),
                            "{}",
                            message
                        );
                    }
                }
                Err(refused) => {
                    proptest::prop_assert!(json::check(message.as_bytes(), LIMITS).is_err(), "{}", message);
                    proptest::prop_assert_eq!(refused.code, -32700);
                }
            }
        }
    }

    /// Calls whose every part may be plain or not (the plain ones listed more often): the
    /// version, the method, the id, the name, the arguments, `_meta` and other members.
    fn calls() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pick = |options: &'static [&'static str]| proptest::sample::select(options);
        (
            pick(&[r#""2.0""#, r#""2.0""#, r#""2.0""#, r#""2.0""#, r#""1.0""#]),
            pick(&[
                r#""tools/call""#,
                r#""tools/call""#,
                r#""tools/call""#,
                r#""tools/call""#,
                r#""tools\/call""#,
                r#""tools/list""#,
            ]),
            pick(&[
                "1",
                "-0",
                r#""a""#,
                "123456789012345",
                r#""a\"b""#,
                "1234567890123456",
                "1e400",
                "1.5",
                "null",
            ]),
            pick(&[
                r#""name":"pay""#,
                r#""name":"pay""#,
                r#""name":"café 😀""#,
                r#""name":"""#,
                r#""name":"p\u0061y""#,
                r#""name":7"#,
                "",
                r#""name":"\ud800""#,
            ]),
            pick(&[
                r#""arguments":{"a":1}"#,
                r#""arguments":{"a":1,"a":2}"#,
                r#""arguments":{"n":7.0,"m":1e400}"#,
                r#""arguments":null"#,
                r#""arguments":[1]"#,
                "",
            ]),
            pick(&[
                "",
                "",
                r#""_meta":{"k":"v"}"#,
                r#""_meta":{"k":1,"k":2}"#,
                r#""_meta":[]"#,
                r#""tenant":"t""#,
            ]),
            pick(&["", "", "", "", r#""extra":true"#, r#""id":2"#]),
            any::<proptest::sample::Index>(),
            any::<proptest::sample::Index>(),
        )
            .prop_map(
                |(version, method, id, name, arguments, more, tail, outer, inner)| {
                    // Members in some order: each list turned by an index.
                    let mut params: Vec<&str> = [name, arguments, more]
                        .into_iter()
                        .filter(|p| !p.is_empty())
                        .collect();
                    let turn = inner.index(params.len().max(1)).min(params.len());
                    params.rotate_left(turn);
                    let params = format!(r#""params":{{{}}}"#, params.join(","));
                    let version = format!(r#""jsonrpc":{version}"#);
                    let id = format!(r#""id":{id}"#);
                    let method = format!(r#""method":{method}"#);
                    let mut members: Vec<&str> = vec![&version, &id, &method, &params];
                    if !tail.is_empty() {
                        members.push(tail);
                    }
                    let turn = outer.index(members.len());
                    members.rotate_left(turn);
                    format!("{{{}}}", members.join(","))
                },
            )
    }

    proptest::proptest! {
        // About one message in thirty is a plain call: enough cases for many of them.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Whatever is framed in one pass is framed so by the general framing too: the same
        /// call, the same arguments set aside, the same plainness.
        #[test]
        fn a_plain_call_is_framed_as_the_general_framing_frames_it(message in calls(), spaced in proptest::bool::ANY) {
            let message = if spaced {
                message.replace(':', " : ").replace(',', " ,\n").replace('{', "{ ").replace('}', "\t}")
            } else {
                message
            };
            let bytes = Bytes::from(message.clone());
            if let Some(plainly) = frame_plainly(&bytes, LIMITS) {
                proptest::prop_assert_eq!(Ok(plainly), frame_generally(&bytes, LIMITS), "{}", message);
            }
        }
    }

    #[test]
    fn the_usual_calls_are_framed_in_one_pass() {
        for message in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}}"#,
            r#"{"jsonrpc":"2.0","id":"r-1","method":"tools/call","params":{"name":"pay","arguments":{"a":7.0},"_meta":{"io.warrant/idempotency_key":"k"}}}"#,
            r#"{"method":"tools/call","params":{"name":"pay"},"id":0,"jsonrpc":"2.0"}"#,
        ] {
            let bytes = Bytes::from_static(message.as_bytes());
            let plainly = frame_plainly(&bytes, LIMITS).unwrap_or_else(|| panic!("{message}"));
            assert_eq!(Ok(plainly), frame_generally(&bytes, LIMITS));
        }
        // `null` arguments are the message's (not set aside): left to the general framing.
        let bytes = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"pay","arguments":null}}"#,
        );
        assert_eq!(frame_plainly(&bytes, LIMITS), None);
    }

    #[test]
    fn other_messages_pass_unchanged_without_raw_parts() {
        let message = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"arguments":{"a":1}}}"#;
        let framed = frame(message, LIMITS).unwrap();
        assert_eq!(&*framed.message(), message.as_slice());
        assert!(framed.call.is_none());
    }
}
