//! The stdio transport: newline-delimited JSON-RPC, each line framed by [`raw::frame`] before
//! the SDK decodes it (held to the strict parser, the raw arguments of a `tools/call` kept in
//! the request's extensions for the handler). Written here rather than using the SDK's own line
//! codec because that one hands lines straight to `serde_json`, which keeps the last of
//! duplicate keys and forgets how numbers were written.
//!
//! Once the session's handshake allows it, a plain `tools/call` is answered here, as the HTTP
//! lane answers one ([`Direct`]), and never reaches the SDK.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rmcp::RoleServer;
use rmcp::model::GetExtensions;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;
use tokio_util::task::TaskTracker;
use warrant_core::json::Limits;

use super::{direct, raw};
use crate::InFlight;
use crate::state::AppState;

/// The longest line accepted; longer ones are skipped up to their newline and answered with
/// a parse error.
const MAX_LINE_BYTES: usize = 1024 * 1024;

fn error_line(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// Newline-delimited JSON-RPC over a reader and a writer.
pub(crate) struct StrictLines<R, W> {
    reader: BufReader<R>,
    writer: Arc<Mutex<W>>,
    /// The line read so far. It lives here, not in `read_line`, because the SDK drops a
    /// pending `receive` whenever it has something else to do: a line that arrives in several
    /// reads must survive that (cancellation safety), or its tail would be read as a message.
    line: Vec<u8>,
    /// Whether the line read so far is over [`MAX_LINE_BYTES`] (its bytes are dropped).
    too_long: bool,
    /// The requests read and not yet answered, by id, each counted on the server's gauge of
    /// requests in flight (`AppState::requests_in_flight`, which the HTTP lanes count at their
    /// edge) from the line that brings it to its answer, or to the client's
    /// `notifications/cancelled` for it (a cancelled request gets no answer). Dropped with the
    /// session, whatever it left open stops counting.
    open: HashMap<RequestId, InFlight>,
    /// That gauge.
    in_flight: Arc<AtomicUsize>,
    /// The session's plain `tools/call`s answered here, when on.
    direct: Option<Direct>,
}

/// A session's plain `tools/call`s answered by the transport, as the HTTP lane answers them
/// (`super::direct`), from the same framing, through the same handler, in the same words.
///
/// For each request the SDK decodes the whole message with `serde_json` (the arguments into a
/// map the handler does not read: it reads the client's own bytes), spawns the handler and a
/// task to send its answer, makes a cancellation token, passes the answer through a channel,
/// and encodes it field by field. Here a plain call is spawned once and its answer written
/// from its parts.
///
/// Taken only where the SDK would have served the call as the HTTP lane's direct path serves
/// one: after the session's `initialize` was answered with a version before `2026-07-28` (no
/// negotiation per request), to a client that declared no tasks extension (so a call held for
/// review is answered with the tool error, `Native::default()`). Before that handshake, after
/// any other, and for every other message, the SDK serves the session.
struct Direct {
    state: Arc<AppState>,
    /// The session's API key, checked on every call as the SDK's handler checks it.
    key: Arc<str>,
    /// The calls being answered, for the session's end to wait for.
    tasks: TaskTracker,
    handshake: Handshake,
    /// The calls being answered, by id, each with the flag its `notifications/cancelled`
    /// raises: a cancelled request gets no answer (as from the SDK). Pruned of calls answered
    /// whenever a call is added.
    calls: HashMap<RequestId, Arc<AtomicBool>>,
}

/// Where the session's handshake stands, as far as answering calls here goes.
#[derive(Debug, PartialEq, Eq)]
enum Handshake {
    /// No `initialize` yet.
    Awaiting,
    /// The client's `initialize` was read and goes to the SDK: its id, and whether the client
    /// declared the tasks extension.
    Asked { id: RequestId, tasks: bool },
    /// The SDK answered it with a version and to a client this path serves as the SDK would.
    Answered,
    /// Anything else (another version, tasks, a second `initialize`, a session begun without
    /// one): every message goes to the SDK.
    Sdk,
}

enum Line {
    Complete(Vec<u8>),
    TooLong,
    Eof,
}

impl<R, W> StrictLines<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// The transport over `reader` and `writer`, counting the requests it is answering on
    /// `in_flight`.
    pub(crate) fn new(reader: R, writer: W, in_flight: Arc<AtomicUsize>) -> Self {
        StrictLines {
            reader: BufReader::new(reader),
            writer: Arc::new(Mutex::new(writer)),
            line: Vec::new(),
            too_long: false,
            open: HashMap::new(),
            in_flight,
            direct: None,
        }
    }

    /// Answers the session's plain `tools/call`s in the transport once its handshake allows
    /// (see [`Direct`]), as the holder of `key`. The tracker returned holds the calls being
    /// answered: the session's end waits for it, so a call read before the client closed its
    /// end is still answered.
    pub(crate) fn answer_calls(&mut self, state: Arc<AppState>, key: &str) -> TaskTracker {
        let tasks = TaskTracker::new();
        self.direct = Some(Direct {
            state,
            key: Arc::from(key),
            tasks: tasks.clone(),
            handshake: Handshake::Awaiting,
            calls: HashMap::new(),
        });
        tasks
    }

    /// Reads one line (without its newline), keeping at most [`MAX_LINE_BYTES`]. Cancel-safe:
    /// what was read before a cancellation stays in `self.line` for the next call.
    async fn read_line(&mut self) -> std::io::Result<Line> {
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                let too_long = std::mem::take(&mut self.too_long);
                let line = std::mem::take(&mut self.line);
                return Ok(if too_long {
                    Line::TooLong
                } else if line.is_empty() {
                    Line::Eof
                } else {
                    Line::Complete(line)
                });
            }
            let (chunk, used, done) = match available.iter().position(|b| *b == b'\n') {
                Some(at) => (available.get(..at).unwrap_or_default(), at + 1, true),
                None => (available, available.len(), false),
            };
            if !self.too_long && self.line.len() + chunk.len() <= MAX_LINE_BYTES {
                self.line.extend_from_slice(chunk);
            } else {
                self.too_long = true;
                self.line.clear();
            }
            self.reader.consume(used);
            if done {
                let too_long = std::mem::take(&mut self.too_long);
                let line = std::mem::take(&mut self.line);
                return Ok(if too_long {
                    Line::TooLong
                } else {
                    Line::Complete(line)
                });
            }
        }
    }

    async fn reply(&mut self, line: String) {
        let mut writer = self.writer.lock().await;
        let written = async {
            writer.write_all(line.as_bytes()).await?;
            writer.write_all(b"\n").await?;
            writer.flush().await
        };
        if let Err(e) = written.await {
            tracing::warn!(error = %e, "mcp stdio: cannot write an error reply");
        }
    }
}

impl Direct {
    /// Follows the handshake through a request read for the SDK.
    fn read(&mut self, id: &RequestId, request: &ClientRequest) {
        self.handshake = match (&self.handshake, request) {
            (Handshake::Awaiting, ClientRequest::InitializeRequest(initialize)) => Handshake::Asked {
                id: id.clone(),
                tasks: initialize.params.capabilities.supports_tasks(),
            },
            // A ping may come before `initialize`.
            (_, ClientRequest::PingRequest(_)) => return,
            // A second `initialize`, or a request before any (a session the SDK begins from
            // the request's own metadata).
            (Handshake::Awaiting | Handshake::Asked { .. }, _) | (_, ClientRequest::InitializeRequest(_)) => {
                Handshake::Sdk
            }
            (Handshake::Answered | Handshake::Sdk, _) => return,
        };
    }

    /// Follows the handshake through a message the SDK sends: the answer to `initialize`.
    fn sent(&mut self, message: &ServerJsonRpcMessage) {
        let Handshake::Asked { id, tasks } = &self.handshake else {
            return;
        };
        self.handshake = match message {
            ServerJsonRpcMessage::Response(response) if response.id == *id => match &response.result {
                ServerResult::InitializeResult(result)
                    if !tasks && direct::serves_version(result.protocol_version.as_str()) =>
                {
                    Handshake::Answered
                }
                _ => Handshake::Sdk,
            },
            ServerJsonRpcMessage::Error(error) if error.id.as_ref() == Some(id) => Handshake::Sdk,
            _ => return,
        };
    }

    /// Answers a plain call in a task of its own, counted on the gauge (`counted`) until its
    /// answer is written.
    fn answer<W>(
        &mut self,
        raw: raw::RawCall,
        call: direct::DirectCall,
        counted: InFlight,
        writer: Arc<Mutex<W>>,
    ) where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        // Only a call still being answered shares its flag.
        self.calls.retain(|_, cancelled| Arc::strong_count(cancelled) > 1);
        let cancelled = Arc::new(AtomicBool::new(false));
        self.calls.insert(call.id.clone(), Arc::clone(&cancelled));
        let (state, key) = (Arc::clone(&self.state), Arc::clone(&self.key));
        self.tasks.spawn(async move {
            let trace = super::trace_of(call.meta.view(), None);
            let answer = match super::key_holder(&state, &key).await {
                Ok(principal) => super::answer_directly(&state, principal, trace, &raw, &call).await,
                Err(refused) => {
                    serde_json::to_vec(&ServerJsonRpcMessage::error(refused, Some(call.id.clone())))
                }
            };
            let mut line = answer.unwrap_or_else(|e| {
                tracing::error!(error = %e, "mcp stdio: cannot encode an answer");
                let id = serde_json::to_value(&call.id).unwrap_or_default();
                error_line(&id, -32603, "internal error").into_bytes()
            });
            line.push(b'\n');
            if !cancelled.load(Ordering::Acquire) {
                let mut writer = writer.lock().await;
                let written = async {
                    writer.write_all(&line).await?;
                    writer.flush().await
                };
                if let Err(e) = written.await {
                    tracing::warn!(error = %e, "mcp stdio: cannot write an answer");
                }
            }
            drop(counted);
        });
    }
}

impl<R, W> Transport<RoleServer> for StrictLines<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let writer = self.writer.clone();
        let answered = match &item {
            ServerJsonRpcMessage::Response(response) => Some(response.id.clone()),
            ServerJsonRpcMessage::Error(error) => error.id.clone(),
            ServerJsonRpcMessage::Request(_) | ServerJsonRpcMessage::Notification(_) => None,
        };
        if let Some(id) = answered {
            self.open.remove(&id);
        }
        if let Some(direct) = &mut self.direct {
            direct.sent(&item);
        }
        async move {
            let mut line = serde_json::to_vec(&item)?;
            line.push(b'\n');
            let mut writer = writer.lock().await;
            writer.write_all(&line).await?;
            writer.flush().await
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let line = match self.read_line().await {
                Ok(Line::Eof) => return None,
                Err(e) => {
                    tracing::warn!(error = %e, "mcp stdio: cannot read");
                    return None;
                }
                Ok(Line::TooLong) => {
                    self.reply(error_line(
                        &Value::Null,
                        -32700,
                        "parse error: the message is too long",
                    ))
                    .await;
                    continue;
                }
                Ok(Line::Complete(line)) => line,
            };
            // Shared, not copied: a call's raw parts keep the line they lie in.
            let mut line = axum::body::Bytes::from(line);
            if line.starts_with(b"\xEF\xBB\xBF") {
                line = line.slice(3..);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let limits = Limits {
                max_bytes: MAX_LINE_BYTES,
                max_depth: super::MESSAGE_MAX_DEPTH,
            };
            // Lines that are not JSON, and notifications, get no answer (as with the SDK's
            // codec: answering garbage can start an error storm).
            let framed = match raw::frame(&line, limits) {
                Ok(framed) => framed,
                Err(refused) => {
                    if refused.id.is_some() {
                        self.reply(refused.line()).await;
                    } else {
                        tracing::debug!(message = refused.message, "mcp stdio: skipped a line");
                    }
                    continue;
                }
            };
            if let Some(direct) = &mut self.direct
                && direct.handshake == Handshake::Answered
                && let Some(call) = direct::call_of(&framed)
                && let Some(raw) = framed.call
            {
                let counted = InFlight::count(&self.in_flight);
                direct.answer(raw, call, counted, Arc::clone(&self.writer));
                continue;
            }
            let sdk = framed.message();
            match serde_json::from_slice::<ClientJsonRpcMessage>(&sdk) {
                Ok(mut message) => {
                    // The raw parts travel with the request to its handler.
                    if let (ClientJsonRpcMessage::Request(request), Some(call)) = (&mut message, framed.call)
                    {
                        request.request.extensions_mut().insert(call);
                    }
                    match &message {
                        ClientJsonRpcMessage::Request(request) => {
                            if let Entry::Vacant(open) = self.open.entry(request.id.clone()) {
                                open.insert(InFlight::count(&self.in_flight));
                            }
                            if let Some(direct) = &mut self.direct {
                                direct.read(&request.id, &request.request);
                            }
                        }
                        ClientJsonRpcMessage::Notification(notification) => {
                            if let ClientNotification::CancelledNotification(cancelled) =
                                &notification.notification
                                && let Some(id) = &cancelled.params.request_id
                            {
                                self.open.remove(id);
                                if let Some(cancelled) = self.direct.as_mut().and_then(|d| d.calls.remove(id))
                                {
                                    cancelled.store(true, Ordering::Release);
                                }
                            }
                        }
                        ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_) => {}
                    }
                    return Some(message);
                }
                Err(e) => {
                    let id = serde_json::from_slice::<Value>(&sdk)
                        .ok()
                        .and_then(|v| v.get("id").cloned());
                    if let Some(id) = id {
                        self.reply(error_line(&id, -32600, "invalid request")).await;
                    } else {
                        tracing::debug!(error = %e, "mcp stdio: skipped an unknown message");
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.writer.lock().await.flush().await
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        reason = "tests"
    )]

    use super::*;

    #[tokio::test]
    async fn strict_lines_refuse_duplicate_keys_and_skip_garbage() {
        let input = concat!(
            "not json\n",
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\",\"method\":\"ping\"}\n",
            "\n",
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"ping\"}\n",
        );
        let (mut client, server_out) = tokio::io::duplex(4096);
        let mut lines = StrictLines::new(input.as_bytes(), server_out, Arc::default());
        let message = lines.receive().await.expect("the valid ping");
        assert!(serde_json::to_string(&message).unwrap().contains("\"id\":8"));
        assert!(lines.receive().await.is_none());
        drop(lines);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client, &mut out)
            .await
            .unwrap();
        let replies: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(replies.len(), 1, "{out}");
        assert_eq!(replies[0]["id"], 7);
        assert_eq!(replies[0]["error"]["code"], -32700);
    }

    /// The SDK drops a pending `receive` whenever it has something else to do; a line that
    /// arrives in parts must still be read whole afterwards (its tail was once read as a
    /// message of its own, and the call was never answered).
    #[tokio::test]
    async fn a_line_read_in_parts_survives_a_cancelled_receive() {
        let (mut input, server_in) = tokio::io::duplex(1 << 16);
        let (_client, server_out) = tokio::io::duplex(1 << 16);
        let mut lines = StrictLines::new(server_in, server_out, Arc::default());
        let message = b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\"}\n";
        let (head, tail) = message.split_at(20);
        tokio::io::AsyncWriteExt::write_all(&mut input, head)
            .await
            .unwrap();
        let cancelled = tokio::time::timeout(std::time::Duration::from_millis(50), lines.receive()).await;
        assert!(cancelled.is_err(), "nothing complete yet");
        tokio::io::AsyncWriteExt::write_all(&mut input, tail)
            .await
            .unwrap();
        let message = tokio::time::timeout(std::time::Duration::from_secs(5), lines.receive())
            .await
            .expect("an answer, not a wait")
            .expect("the whole ping");
        assert!(serde_json::to_string(&message).unwrap().contains("\"id\":9"));
    }

    #[tokio::test]
    async fn a_request_counts_as_in_flight_until_its_answer_or_its_cancellation() {
        let gauge = Arc::new(AtomicUsize::new(0));
        let input = concat!(
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":\"two\",\"method\":\"ping\"}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":\"two\"}}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\n",
        );
        let (_client, server_out) = tokio::io::duplex(1 << 16);
        let mut lines = StrictLines::new(input.as_bytes(), server_out, Arc::clone(&gauge));
        let in_flight = || gauge.load(std::sync::atomic::Ordering::SeqCst);
        let answer = |id: i64| {
            ServerJsonRpcMessage::response(rmcp::model::ServerResult::empty(()), RequestId::Number(id))
        };
        lines.receive().await.unwrap();
        assert_eq!(in_flight(), 1);
        lines.receive().await.unwrap();
        assert_eq!(in_flight(), 2);
        // A notification is not a request.
        lines.receive().await.unwrap();
        assert_eq!(in_flight(), 2);
        // A cancelled request gets no answer: it stops counting when cancelled.
        lines.receive().await.unwrap();
        assert_eq!(in_flight(), 1);
        lines.send(answer(1)).await.unwrap();
        assert_eq!(in_flight(), 0);
        // An answer to nothing open counts nothing.
        lines.send(answer(1)).await.unwrap();
        assert_eq!(in_flight(), 0);
        lines.receive().await.unwrap();
        assert_eq!(in_flight(), 1);
        // The session ends with a request unanswered: it no longer counts.
        drop(lines);
        assert_eq!(in_flight(), 0);
    }

    /// Writes `lines` as a client does, each ended by its newline.
    async fn write_lines(to: &mut (impl AsyncWrite + Unpin), lines: &[&str]) {
        to.write_all((lines.join("\n") + "\n").as_bytes()).await.unwrap();
    }

    /// After a handshake the transport serves, a plain call is answered by the transport and
    /// never reaches the SDK (the next message the SDK receives is the ping after it); after
    /// one it does not serve (a client with the tasks extension), the call goes to the SDK.
    #[tokio::test]
    async fn plain_calls_are_answered_here_once_the_handshake_allows() {
        let dir = tempfile::tempdir().unwrap();
        let (gateway, key) = super::super::tests::gateway(dir.path()).await;
        let tasks = r#"{"extensions":{"io.modelcontextprotocol/tasks":{}}}"#;
        for (capabilities, answered_here) in [("{}", true), (tasks, false)] {
            let (client, server) = tokio::io::duplex(1 << 16);
            let (read, write) = tokio::io::split(server);
            let (client_read, mut client_write) = tokio::io::split(client);
            let mut lines = StrictLines::new(read, write, Arc::default());
            let calls = lines.answer_calls(gateway.state.clone(), &key);
            let initialize = format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{capabilities},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
            );
            let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{"n":3}}}"#;
            let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
            write_lines(&mut client_write, &[&initialize]).await;
            let ClientJsonRpcMessage::Request(first) = lines.receive().await.unwrap() else {
                panic!("the initialize request");
            };
            assert!(matches!(first.request, ClientRequest::InitializeRequest(_)));
            let mut result = rmcp::model::ServerConfig::new(Default::default());
            result.protocol_version = rmcp::model::ProtocolVersion::V_2025_06_18;
            lines
                .send(ServerJsonRpcMessage::response(
                    ServerResult::InitializeResult(result),
                    RequestId::Number(0),
                ))
                .await
                .unwrap();
            write_lines(&mut client_write, &[call, ping]).await;
            let ClientJsonRpcMessage::Request(next) = lines.receive().await.unwrap() else {
                panic!("a request");
            };
            assert_eq!(next.id, RequestId::Number(if answered_here { 2 } else { 1 }));
            if answered_here {
                // A call cancelled as it is read gets no answer; the SDK sees the cancellation.
                let call = call.replace(r#""id":1"#, r#""id":3"#);
                let cancel =
                    r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}"#;
                write_lines(&mut client_write, &[&call, cancel]).await;
                let next = lines.receive().await.unwrap();
                assert!(matches!(next, ClientJsonRpcMessage::Notification(_)));
            }
            calls.close();
            calls.wait().await;
            drop(lines);
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut tokio::io::BufReader::new(client_read), &mut out)
                .await
                .unwrap();
            let answers: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            assert_eq!(answers[0]["id"], 0);
            if answered_here {
                assert_eq!(answers.len(), 2, "{out}");
                assert_eq!(answers[1]["id"], 1);
                // Decided and recorded (the tool's loopback address is refused).
                let answer = &answers[1]["result"]["structuredContent"];
                assert!(answer["ledger_id"].is_string(), "{out}");
                assert_eq!(answer["code"], "TOOL_PERMANENT_FAILURE", "{out}");
            } else {
                assert_eq!(answers.len(), 1, "{out}");
            }
        }
    }

    #[tokio::test]
    async fn overlong_lines_are_refused_and_skipped() {
        let mut input = vec![b'x'; MAX_LINE_BYTES + 10];
        input.push(b'\n');
        input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
        let (mut client, server_out) = tokio::io::duplex(1 << 16);
        let mut lines = StrictLines::new(std::io::Cursor::new(input), server_out, Arc::default());
        assert!(lines.receive().await.is_some());
        drop(lines);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client, &mut out)
            .await
            .unwrap();
        assert!(out.contains("too long"), "{out}");
    }
}
