//! `tools/call` over streamable HTTP, answered without the SDK's per-request machinery.
//!
//! For every stateless request the SDK builds a service, spawns its serve loop, spawns the
//! handler, spawns a task that waits for the loop, and passes the request and the answer
//! through channels between them: four tasks and their wake-ups for one request and one
//! answer. For the one message that is most of the traffic — a `tools/call` — this module
//! takes the request after the lane's own framing ([`super::raw`]) and answers it directly:
//! the call as the SDK's types decode it (the id and name the framing read; `_meta` decoded
//! as its string members when plain, [`plain_meta`], else as the SDK's `RequestMetaObject`), the
//! same handler code ([`super::tools::call`]), the same answer (the SDK's
//! `ServerJsonRpcMessage`, serialized as the SDK does).
//!
//! It takes a request only when the SDK would have served it through that same path; every
//! other request — any other method, a notification, a message with members the SDK's call
//! type does not have ([`raw::Plain`]), an `Origin` header, a `Host` not plainly allowed, an
//! `Accept` or `Content-Type` it does not read exactly as the SDK does, a repeated header, a
//! protocol version that negotiates per request (`2026-07-28` and later, `_meta` protocol
//! fields, standard headers) — goes to the SDK, which accepts or refuses it as it always has.
//! So this path can only answer what the SDK would have answered the same way; the test
//! `the_direct_path_answers_as_the_sdk_does` holds the two to the same answers.

use std::collections::BTreeMap;

use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use rmcp::model::{
    CallToolResponse, JsonObject, JsonRpcMessage, RequestId, RequestMetaObject, ServerJsonRpcMessage,
    ServerResult,
};
use serde_json::Value;
use warrant_runtime::Execution;

use super::raw;

/// Protocol versions whose requests the SDK serves through its one-shot stateless path (the
/// versions before per-request negotiation), as the `MCP-Protocol-Version` header names them.
const ONE_SHOT_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Whether a session that negotiated `version` at its `initialize` is served as the SDK serves
/// these versions' one-shot requests (the stdio lane's direct answers, `lines`).
pub(crate) fn serves_version(version: &str) -> bool {
    ONE_SHOT_VERSIONS.contains(&version)
}

/// The `_meta` keys reserved by the protocol (`io.modelcontextprotocol/…`): a request that
/// carries any goes to the SDK, which reads them.
const PROTOCOL_META_PREFIX: &str = "io.modelcontextprotocol/";

/// Whether the headers of a POST to `/mcp` are ones the SDK accepts and serves through its
/// one-shot path, read the way the SDK reads them; `false` hands the request to the SDK.
///
/// One pass over the headers, matching each name against the few that matter: a lookup per
/// name hashes the name and probes the map each time (about 3,000 instructions for the seven
/// names, against under 1,000 for the pass).
pub(crate) fn headers_allow(parts: &Parts, allowed_hosts: &AllowedHosts) -> bool {
    let (mut host, mut accept, mut version) = (Seen::Absent, Seen::Absent, Seen::Absent);
    let mut content_type = None;
    for (name, value) in &parts.headers {
        // A standard name is compared as the constant it is stored as; only other names are
        // compared as text (stored in lower case). The `mcp-*` headers are per-request
        // negotiation, which the SDK handles.
        if name == header::HOST {
            host.see(value);
        } else if name == header::ACCEPT {
            accept.see(value);
        } else if name == header::CONTENT_TYPE {
            // The SDK reads the first value.
            content_type.get_or_insert(value);
        } else if name == header::ORIGIN {
            return false;
        } else {
            match name.as_str() {
                "mcp-protocol-version" => version.see(value),
                "mcp-method" | "mcp-name" => return false,
                _ => {}
            }
        }
    }
    // Values are compared as bytes where that says enough: `HeaderValue::to_str` checks every
    // byte of a value again.
    let version_allows = match version {
        Seen::Absent => true,
        Seen::Once(v) => ONE_SHOT_VERSIONS
            .iter()
            .any(|known| v.as_bytes() == known.as_bytes()),
        Seen::Many => false,
    };
    version_allows
        && host.text().is_some_and(|h| host_is_allowed(h, allowed_hosts))
        && accept
            .value()
            .is_some_and(|a| a.as_bytes() == USUAL_ACCEPT || a.to_str().is_ok_and(accepts_json_and_sse))
        && content_type.is_some_and(is_json)
}

/// The `Accept` clients send (the specification's own example).
const USUAL_ACCEPT: &[u8] = b"application/json, text/event-stream";

/// A header's values, as far as the SDK's reading of it goes.
enum Seen<'a> {
    Absent,
    Once(&'a HeaderValue),
    Many,
}

impl<'a> Seen<'a> {
    fn see(&mut self, value: &'a HeaderValue) {
        *self = match self {
            Seen::Absent => Seen::Once(value),
            Seen::Once(_) | Seen::Many => Seen::Many,
        };
    }

    /// The one value; `None` when absent or repeated.
    fn value(&self) -> Option<&'a HeaderValue> {
        match self {
            Seen::Once(value) => Some(value),
            Seen::Absent | Seen::Many => None,
        }
    }

    /// The one value as text; `None` when absent, repeated or not text.
    fn text(&self) -> Option<&'a str> {
        self.value().and_then(|value| value.to_str().ok())
    }
}

/// A `tools/call` decoded as the SDK decodes it: its id and `_meta` (its name is the raw
/// call's; a plain call's parameters hold nothing else the handler reads).
pub(crate) struct DirectCall {
    pub(crate) id: RequestId,
    pub(crate) meta: DirectMeta,
}

/// A direct call's `_meta`: read plainly when it is plain ([`plain_meta`]), else decoded with
/// the SDK's type.
pub(crate) enum DirectMeta {
    /// Every value a string: the members as text.
    Plain(BTreeMap<String, String>),
    /// Anything else, as the SDK decodes it.
    Object(JsonObject),
}

impl DirectMeta {
    /// As the handler reads it.
    pub(crate) fn view(&self) -> super::tools::Meta<'_> {
        match self {
            DirectMeta::Plain(members) => super::tools::Meta::Plain(members),
            DirectMeta::Object(object) => super::tools::Meta::Object(object),
        }
    }
}

/// The framed message as a `tools/call` this path answers, or `None` for anything the SDK is
/// to handle. The framing's one strict pass has read the message ([`raw::frame`]): a plain
/// call ([`raw::Plain`]) is what the SDK's types decode to a call and nothing else, so only
/// its `_meta` is read here (plainly, or with the SDK's own type); the id and the name are the
/// framing's.
pub(crate) fn call_of(framed: &raw::Framed<'_>) -> Option<DirectCall> {
    let (plain, raw) = (framed.plain.as_ref()?, framed.call.as_ref()?);
    let meta = match &plain.meta {
        Some(range) => {
            let text = framed.original().get(range.clone())?;
            match plain_meta(text) {
                Some(members) => DirectMeta::Plain(members),
                None => DirectMeta::Object(serde_json::from_slice::<RequestMetaObject>(text).ok()?.0.0),
            }
        }
        None => DirectMeta::Plain(BTreeMap::new()),
    };
    let reserved = |k: &str| k.starts_with(PROTOCOL_META_PREFIX);
    let protocol = match &meta {
        DirectMeta::Plain(members) => members.keys().any(|k| reserved(k)),
        DirectMeta::Object(object) => object.keys().any(|k| reserved(k)),
    };
    if protocol {
        return None;
    }
    Some(DirectCall {
        id: raw.id().clone(),
        meta,
    })
}

/// The members of a `_meta` object whose every value is a string (the usual
/// `{"io.warrant/idempotency_key": "…"}`), decoded as the SDK's type decodes them; `None` for
/// any other `_meta`, which the SDK's type decodes. An ordered map, not the SDK's (a SipHash
/// per key stored and per key looked up); the strict pass has refused a repeated key.
fn plain_meta(text: &[u8]) -> Option<BTreeMap<String, String>> {
    serde_json::from_slice(text).ok()
}

/// The body of the answer: the SDK's JSON-RPC response carrying the tool result, in the
/// shape the SDK gives a peer of the versions this path takes (before `2026-07-28`: no
/// `resultType`, object-only structured content).
pub(crate) fn answer(
    id: RequestId,
    result: rmcp::model::CallToolResult,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut result = ServerResult::from(CallToolResponse::from(result));
    result.strip_result_type_for_legacy_peer();
    result.strip_non_object_output_for_legacy_peer();
    let message: ServerJsonRpcMessage = JsonRpcMessage::response(result, id);
    serde_json::to_vec(&message)
}

/// The body of the answer to a call that committed `result`, written from borrowed parts:
/// byte for byte what [`answer`] gives for `tools::committed` of the same call (the test
/// `a_committed_answer_is_written_as_the_sdk_writes_it`), without building the SDK's result,
/// its maps and a second copy of `result`.
///
/// The fixed parts — every key, `"jsonrpc":"2.0"`, the decision — are written as the literal
/// bytes they always serialize to; `serde_json` writes only the values that vary (the id, the
/// text, the structured content, the ledger and operation ids, the trace id), escaped as
/// always. Derived `Serialize` structs escaped each of the eighteen keys again for every
/// answer: about 30,000 instructions an answer, against a few thousand now.
pub(crate) fn committed(
    id: &RequestId,
    execution: &Execution,
    result: &Value,
    trace: &str,
) -> Result<Vec<u8>, serde_json::Error> {
    // Written by `serde_json`'s serializer, not through `Display` (which formats the same
    // bytes through `fmt::Write`, about twice the instructions).
    let text = serde_json::to_string(result)?;
    let mut out = Vec::with_capacity(320 + 2 * text.len() + execution.ledger_id.len());
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut out, id)?;
    out.extend_from_slice(br#","result":{"content":[{"type":"text","text":"#);
    serde_json::to_writer(&mut out, &text)?;
    out.extend_from_slice(br#"}],"structuredContent":"#);
    // `text` is the result as `serde_json` writes it (compact): the structured content is
    // the same bytes, copied rather than serialised a second time.
    if result.is_object() {
        out.extend_from_slice(text.as_bytes());
    } else {
        out.extend_from_slice(br#"{"result":"#);
        out.extend_from_slice(text.as_bytes());
        out.push(b'}');
    }
    out.extend_from_slice(
        br#","isError":false,"_meta":{"io.warrant/decision":"allow","io.warrant/ledger_id":"#,
    );
    serde_json::to_writer(&mut out, &execution.ledger_id)?;
    out.extend_from_slice(br#","io.warrant/operation_id":"#);
    serde_json::to_writer(&mut out, execution.operation_id.as_str())?;
    out.extend_from_slice(br#","io.warrant/attempts":"#);
    serde_json::to_writer(&mut out, &execution.attempts)?;
    out.extend_from_slice(if execution.replayed {
        br#","io.warrant/replayed":true,"io.warrant/trace_id":"#
    } else {
        br#","io.warrant/replayed":false,"io.warrant/trace_id":"#
    });
    serde_json::to_writer(&mut out, trace)?;
    out.extend_from_slice(br#","io.warrant/outcome":"#);
    serde_json::to_writer(
        &mut out,
        crate::routes::proposals::committed_outcome(execution.replayed),
    )?;
    out.extend_from_slice(b"}}}");
    Ok(out)
}

/// The hosts the SDK's DNS-rebinding check allows, read once (as the SDK reads each entry on
/// every request): the host in lower case, and the port when the entry names one.
pub(crate) struct AllowedHosts(Vec<(String, Option<u16>)>);

impl AllowedHosts {
    /// The entries as the SDK's configuration lists them.
    pub(crate) fn new(entries: &[String]) -> Self {
        let normalized = |h: &str| h.trim_matches(['[', ']']).to_ascii_lowercase();
        Self(
            entries
                .iter()
                .map(|entry| entry.trim())
                .filter_map(|entry| match entry.parse::<axum::http::uri::Authority>() {
                    Ok(a) => Some((normalized(a.host()), a.port_u16())),
                    Err(_) => (!entry.is_empty()).then(|| (normalized(entry), None)),
                })
                .collect(),
        )
    }
}

/// The SDK's DNS-rebinding check, positive case only: a `Host` whose name (and port, when the
/// allowed entry names one) matches an allowed entry. The header is read without allocating
/// and only in its plain forms (`name`, `name:port`, `[v6]`, `[v6]:port`, the name of letters,
/// digits, `.` and `-`): anything else is left to the SDK, which parses it as an authority.
fn host_is_allowed(host: &str, allowed: &AllowedHosts) -> bool {
    let Some((name, port)) = plain_host(host) else {
        return false;
    };
    allowed
        .0
        .iter()
        .any(|(host, only)| host.eq_ignore_ascii_case(name) && only.is_none_or(|p| port == Some(p)))
}

/// A `Host` value's name (brackets removed) and port, when it has one of the plain forms.
fn plain_host(value: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = match value.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            if inside.is_empty()
                || !inside
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            {
                return None;
            }
            (inside, after)
        }
        None => {
            let end = value.bytes().position(|b| b == b':').unwrap_or(value.len());
            let (name, after) = value.split_at(end);
            let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-';
            if name.is_empty() || !name.bytes().all(plain) {
                return None;
            }
            (name, after)
        }
    };
    let port = match port.strip_prefix(':') {
        None if port.is_empty() => None,
        Some(digits)
            if !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(digits.parse::<u16>().ok()?)
        }
        _ => return None,
    };
    Some((name, port))
}

/// `Accept` lists both `application/json` and `text/event-stream`, each plainly (no
/// parameters, so no weight that could exclude it), in one header value.
fn accepts_json_and_sse(accept: &str) -> bool {
    if accept.bytes().any(|b| b == b'"' || b == b';') {
        return false;
    }
    let mut json = false;
    let mut sse = false;
    for essence in accept.split(',').map(str::trim) {
        json |= essence.eq_ignore_ascii_case("application/json");
        sse |= essence.eq_ignore_ascii_case("text/event-stream");
    }
    json && sse
}

/// `Content-Type` is `application/json` (parameters allowed), as the SDK checks it.
fn is_json(content_type: &HeaderValue) -> bool {
    content_type.as_bytes() == b"application/json"
        || content_type.to_str().is_ok_and(|ct| {
            ct.split_once(';')
                .map_or(ct, |(essence, _)| essence)
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

/// The `Content-Type` of the answer.
pub(crate) const JSON: HeaderValue = HeaderValue::from_static("application/json");

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = axum::http::Request::post("/mcp");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(()).unwrap().into_parts().0
    }

    const PLAIN: [(&str, &str); 3] = [
        ("host", "127.0.0.1:8080"),
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];

    #[test]
    fn only_plain_requests_are_taken() {
        let hosts = AllowedHosts::new(&["localhost".to_owned(), "127.0.0.1".to_owned()]);
        assert!(headers_allow(&parts(&PLAIN), &hosts));
        let with = |extra: (&str, &str)| {
            let mut h = PLAIN.to_vec();
            h.retain(|(k, _)| *k != extra.0);
            h.push(extra);
            headers_allow(&parts(&h), &hosts)
        };
        assert!(with(("mcp-protocol-version", "2025-06-18")));
        assert!(with(("content-type", "application/json; charset=utf-8")));
        assert!(with(("host", "LOCALHOST")));
        for handed_over in [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-protocol-version", "1999-01-01"),
            ("origin", "http://localhost"),
            ("host", "evil.example"),
            ("accept", "application/json"),
            ("accept", "application/json, text/event-stream;q=0"),
            ("content-type", "text/plain"),
            ("mcp-method", "tools/call"),
        ] {
            assert!(!with(handed_over), "{handed_over:?}");
        }
        // A repeated header is not read as one value: the SDK may read either.
        for (name, value) in [
            ("mcp-protocol-version", "2025-06-18"),
            ("host", "127.0.0.1:8080"),
            ("accept", "application/json, text/event-stream"),
        ] {
            let mut h = PLAIN.to_vec();
            h.retain(|(k, _)| *k != name);
            h.extend([(name, value), (name, value)]);
            assert!(!headers_allow(&parts(&h), &hosts), "{name}");
        }
        let ported = AllowedHosts::new(&["gw.example:8443".to_owned()]);
        assert!(!headers_allow(&parts(&PLAIN), &ported));
        let mut h = PLAIN.to_vec();
        h[0] = ("host", "gw.example:8443");
        assert!(headers_allow(&parts(&h), &ported));
        h[0] = ("host", "gw.example:9000");
        assert!(!headers_allow(&parts(&h), &ported));
    }

    #[test]
    fn a_host_is_read_plainly_or_left_to_the_sdk() {
        let hosts = AllowedHosts::new(&["localhost".to_owned(), "::1".to_owned(), "[::1]".to_owned()]);
        let allows = |host: &str| {
            let mut h = PLAIN.to_vec();
            h[0] = ("host", host);
            headers_allow(&parts(&h), &hosts)
        };
        for taken in ["localhost", "LocalHost:8080", "[::1]", "[::1]:80"] {
            assert!(allows(taken), "{taken}");
        }
        for left in [
            "::1",
            "localhost:",
            "localhost:+80",
            "localhost:99999",
            "local host",
            "localhost.:80x",
            "[::1",
            "[]:80",
            "user@localhost",
        ] {
            assert!(!allows(left), "{left}");
        }
        // Whatever the plain reading accepts, the SDK's parse reads the same way.
        let alphabet = [
            "a", "Z", "0", "9", ".", "-", ":", "[", "]", "1", "f", "@", "+", " ",
        ];
        let mut inputs = vec![String::new()];
        for _ in 0..4 {
            inputs = inputs
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            for input in &inputs {
                if let Some((name, port)) = plain_host(input) {
                    let parsed = input.parse::<axum::http::uri::Authority>().unwrap();
                    assert_eq!(parsed.host().trim_matches(['[', ']']), name, "{input}");
                    assert_eq!(parsed.port_u16(), port, "{input}");
                }
            }
        }
    }

    #[test]
    fn a_committed_answer_is_written_as_the_sdk_writes_it() {
        use serde_json::json;
        use warrant_core::decision::{OperationId, Outcome};
        for (result, replayed, id) in [
            (
                json!({"order_id": "ord_1", "total_cents": 1200, "note": "a \"quoted\" line\n"}),
                false,
                RequestId::Number(7),
            ),
            (json!({}), true, RequestId::String("req-é".into())),
            (json!([1, 2.5, null, "x"]), false, RequestId::Number(-1)),
            (json!("plain text"), true, RequestId::Number(0)),
            (
                json!({"nested": {"b": [true, false], "a": 1e300}}),
                false,
                RequestId::String("".into()),
            ),
        ] {
            let execution = Execution {
                ledger_id: if replayed {
                    "led_\"01\"JX".into()
                } else {
                    "led_01JX".into()
                },
                operation_id: OperationId::new("op_1"),
                attempts: 2,
                replayed,
                result: Ok(Outcome::Committed(result.clone())),
                detail: None,
                exhausted: None,
                unrecorded: false,
                followed: None,
            };
            let base = crate::mcp::tools::executed_base(&execution, "4bf92f3577b34da6a3ce929d0e0e4736");
            let sdk = answer(
                id.clone(),
                crate::mcp::tools::committed(result.clone(), base, replayed),
            )
            .unwrap();
            let direct = committed(&id, &execution, &result, "4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
            assert_eq!(
                String::from_utf8(direct).unwrap(),
                String::from_utf8(sdk).unwrap()
            );
        }
    }

    #[test]
    fn only_plain_tool_calls_without_protocol_meta_are_taken() {
        let limits = warrant_core::json::Limits {
            max_bytes: 1 << 20,
            max_depth: 36,
        };
        let direct = |message: &[u8]| {
            raw::frame(&axum::body::Bytes::copy_from_slice(message), limits)
                .ok()
                .and_then(|framed| call_of(&framed))
        };
        let framed_name = |message: &[u8]| {
            raw::frame(&axum::body::Bytes::copy_from_slice(message), limits)
                .ok()
                .and_then(|framed| framed.call)
                .map(|call| call.name().to_owned())
                .unwrap_or_default()
        };
        let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{},"_meta":{"idempotency_key":"k"}}}"#;
        let taken = direct(call).unwrap();
        assert_eq!(taken.id, RequestId::Number(7));
        assert_eq!(framed_name(call), "t");
        assert_eq!(taken.meta.view().text("idempotency_key"), Some("k"));
        let escaped = br#"{"params":{"arguments":{"a":1.0},"name":"t1"},"method":"tools\/call","id":"x","jsonrpc":"2.0"}"#;
        let taken = direct(escaped).unwrap();
        assert_eq!(taken.id, RequestId::String("x".into()));
        assert_eq!(framed_name(escaped), "t1");
        assert!(taken.meta.view().is_empty());
        for other in [
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.as_slice(),
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","requestState":"s"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","tenant":"other"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":[]}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"},"extra":1}"#,
            br#"{"jsonrpc":"2.\u0030","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            br#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"t"}}"#,
            b"[]",
        ] {
            assert!(direct(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
    }

    /// The plain reading of `_meta` holds exactly the members the SDK's type decodes, and
    /// leaves to it every `_meta` it does not read.
    #[test]
    fn a_plain_meta_is_read_as_the_sdk_reads_it() {
        for text in [
            r#"{}"#,
            r#" { } "#,
            r#"{"io.warrant/idempotency_key":"k-1"}"#,
            r#"{ "idempotency_key" : "k" , "approval_id":"apr_1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }"#,
            r#"{"note":"é ü"}"#,
            r#"{"io.modelcontextprotocol/logLevel":"debug"}"#,
            r#"{"k":"a\"b"}"#,
            r#"{"k\u0061":"v\u00e9"}"#,
        ] {
            let plain = plain_meta(text.as_bytes()).unwrap_or_else(|| panic!("not plain: {text}"));
            let sdk = serde_json::from_str::<RequestMetaObject>(text).unwrap().0.0;
            assert_eq!(plain.len(), sdk.len(), "{text}");
            for (key, value) in &plain {
                assert_eq!(
                    sdk.get(key).and_then(Value::as_str),
                    Some(value.as_str()),
                    "{text}"
                );
            }
        }
        for text in [
            r#"{"k":1}"#,
            r#"{"k":null}"#,
            r#"{"k":["v"]}"#,
            r#"{"k":{"v":"w"}}"#,
            r#"[]"#,
            r#""s""#,
        ] {
            assert!(plain_meta(text.as_bytes()).is_none(), "{text}");
        }
    }
}
