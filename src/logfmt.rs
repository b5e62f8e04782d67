//! The text log's fields, written as tracing-subscriber's default writes them without colours,
//! for less.
//!
//! Every request opens a span with three fields (`method`, `route`, `trace_id`), and the
//! formatter writes a span's fields into text when the span opens. The default field
//! formatter writes each plain field through one `write!` of its painted name, a painted `=`
//! and the value (the painting is a no-op without colours, but still three formatting
//! arguments through `nu-ansi-term`): about 1,200 instructions a field, 3,500 a request.
//! [`PlainFields`] writes a plain field's name, `=` and value directly, and hands everything
//! else (the `message` with its escaping of terminal controls, `&str` values, errors and their
//! sources, `log.` metadata) to the default visitor, so the text is the same byte for byte
//! (`the_text_is_the_default_formatters`). Written here because tracing-subscriber offers no
//! cheaper formatter of its own.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// The default field format without colours, plain fields written directly.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PlainFields;

impl<'writer> FormatFields<'writer> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = PlainVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'a> {
    writer: Writer<'a>,
    /// Nothing written yet (no separating space before the next field).
    is_empty: bool,
    result: fmt::Result,
}

impl PlainVisitor<'_> {
    /// Has the default visitor record one field, as the default formatter would.
    fn default_visitor(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.result = visitor.finish();
        self.is_empty = false;
    }

    /// Whether nothing is written for this field: an earlier write failed, or it is the `log`
    /// crate's metadata (already in the line's target), which the default formatter skips.
    fn skipped(&self, field: &Field) -> bool {
        self.result.is_err() || field.name().starts_with("log.")
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.skipped(field) {
            self.default_visitor(|v| v.record_str(field, value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if !self.skipped(field) {
            self.default_visitor(|v| v.record_error(field, value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.skipped(field) {
            return;
        }
        let name = field.name();
        if name == "message" || name.starts_with("r#") {
            return self.default_visitor(|v| v.record_debug(field, value));
        }
        let pad = if self.is_empty { "" } else { " " };
        self.is_empty = false;
        self.result = (|| {
            self.writer.write_str(pad)?;
            self.writer.write_str(name)?;
            self.writer.write_char('=')?;
            write!(self.writer, "{value:?}")
        })();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    #[derive(Debug)]
    struct Failed(Option<Box<Failed>>);

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(if self.0.is_some() {
                "outer \u{1b}[31m"
            } else {
                "inner"
            })
        }
    }

    impl std::error::Error for Failed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.0.as_deref().map(|e| e as _)
        }
    }

    /// What a gateway logs: a request span with displayed fields, events with a message
    /// (hostile too), strings, numbers, debug values, errors with sources, raw names.
    fn log_some() {
        let span = tracing::info_span!("request", method = %"POST", route = %"/mcp", trace_id = %"4bf92f35");
        let _entered = span.enter();
        tracing::warn!(
            contract = "ops.restart",
            attempt = 2,
            ok = true,
            "binding \u{1b}[2J unusable"
        );
        tracing::warn!(
            error = &Failed(Some(Box::new(Failed(None)))) as &dyn std::error::Error,
            "failed"
        );
        let r#type = "x";
        tracing::warn!(r#type, list = ?[1, 2], shown = %"a b", "\u{9b}controls\u{7}");
        let inner = tracing::info_span!("step", n = 3);
        inner.in_scope(|| tracing::error!(detail = %"quote \" here", empty = ""));
        tracing::warn!(message = "a message field", extra = 1.5);
    }

    fn text(plain: bool) -> String {
        let buffer = Buffer::default();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(buffer.clone());
        if plain {
            tracing::subscriber::with_default(builder.fmt_fields(PlainFields).finish(), log_some);
        } else {
            tracing::subscriber::with_default(builder.finish(), log_some);
        }
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn the_text_is_the_default_formatters() {
        let ours = text(true);
        assert_eq!(ours, text(false));
        // The test sees what it means to: the span's fields, and the controls escaped.
        assert!(
            ours.contains("request{method=POST route=/mcp trace_id=4bf92f35}"),
            "{ours}"
        );
        assert!(ours.contains("binding \\x1b[2J unusable"), "{ours}");
        assert_eq!(ours.lines().count(), 5, "{ours}");
    }
}
