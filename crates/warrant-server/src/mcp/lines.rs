//! The stdio transport: newline-delimited JSON-RPC, each line framed by [`raw::frame`] before
//! the SDK decodes it (held to the strict parser, the raw arguments of a `tools/call` kept in
//! the request's extensions for the handler). Written here rather than using the SDK's own line
//! codec because that one hands lines straight to `serde_json`, which keeps the last of
//! duplicate keys and forgets how numbers were written.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use rmcp::RoleServer;
use rmcp::model::GetExtensions;
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, RequestId, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;
use warrant_core::json::Limits;

use super::raw;
use crate::InFlight;

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
        }
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
                        }
                        ClientJsonRpcMessage::Notification(notification) => {
                            if let ClientNotification::CancelledNotification(cancelled) =
                                &notification.notification
                                && let Some(id) = &cancelled.params.request_id
                            {
                                self.open.remove(id);
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
