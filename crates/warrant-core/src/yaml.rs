//! YAML contract documents read into the JSON data model with the YAML 1.2 core schema.
//!
//! Built on the event stream of `saphyr-parser` rather than a serde front end so that the
//! mapping to JSON is exactly the one every conforming implementation computes (and therefore
//! the content id): plain scalars resolve per the 1.2 core schema (so `2027-06-30` stays a
//! string, `yes` is a string, `0o17` is 15), quoted scalars are strings, and anything that
//! has no JSON equivalent is refused rather than guessed: duplicate keys, aliases, unknown
//! tags, collection keys, `.nan`/`.inf`, integers outside ±(2^53 − 1) and multi-document
//! streams.

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};
use serde_json::{Map, Number, Value};

use crate::json::{Limits, MAX_SAFE_INTEGER};

/// A refused YAML document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    line: usize,
    column: usize,
    message: String,
}

impl YamlError {
    fn at(span: &Span, message: impl Into<String>) -> Self {
        YamlError {
            line: span.start.line(),
            column: span.start.col() + 1,
            message: message.into(),
        }
    }

    /// 1-based line of the problem.
    pub fn line(&self) -> usize {
        self.line
    }

    /// Human-readable description.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for YamlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {} column {}: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for YamlError {}

/// Reads one YAML document into a JSON value.
///
/// # Errors
/// Returns a [`YamlError`] naming the line of the first construct that has no exact JSON
/// equivalent, or of the first syntax error.
pub fn parse(text: &str, limits: Limits) -> Result<Value, YamlError> {
    if text.len() > limits.max_bytes {
        return Err(YamlError {
            line: 1,
            column: 1,
            message: format!("document is over the limit of {} bytes", limits.max_bytes),
        });
    }
    let mut reader = Reader {
        parser: Parser::new_from_str(text),
        max_depth: limits.max_depth.min(crate::json::MAX_DEPTH_CAP),
    };
    let mut document = None;
    loop {
        let (event, span) = reader.next()?;
        match event {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                if document.is_some() {
                    return Err(YamlError::at(&span, "only one YAML document is allowed"));
                }
                let (first, first_span) = reader.next()?;
                document = Some(reader.node(first, first_span, 1)?);
            }
            _ => return Err(YamlError::at(&span, "unexpected YAML event")),
        }
    }
    let document = document.ok_or_else(|| YamlError {
        line: 1,
        column: 1,
        message: "empty document".into(),
    })?;
    Ok(document)
}

struct Reader<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    max_depth: usize,
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.parser.next_event() {
            Some(Ok(pair)) => Ok(pair),
            Some(Err(e)) => Err(YamlError {
                line: e.marker().line(),
                column: e.marker().col() + 1,
                message: e.info().to_owned(),
            }),
            None => Err(YamlError {
                line: 0,
                column: 0,
                message: "unexpected end of YAML".into(),
            }),
        }
    }

    fn node(&mut self, event: Event<'a>, span: Span, depth: usize) -> Result<Value, YamlError> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                no_anchor(anchor, &span)?;
                scalar(&text, style, tag.as_deref(), &span)
            }
            Event::SequenceStart(anchor, tag) => {
                no_anchor(anchor, &span)?;
                check_collection_tag(tag.as_deref(), "seq", &span)?;
                self.enter(depth, &span)?;
                let mut items = Vec::new();
                loop {
                    let (event, item_span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        return Ok(Value::Array(items));
                    }
                    items.push(self.node(event, item_span, depth + 1)?);
                }
            }
            Event::MappingStart(anchor, tag) => {
                no_anchor(anchor, &span)?;
                check_collection_tag(tag.as_deref(), "map", &span)?;
                self.enter(depth, &span)?;
                let mut map = Map::new();
                loop {
                    let (event, key_span) = self.next()?;
                    let key = match event {
                        Event::MappingEnd => return Ok(Value::Object(map)),
                        Event::Scalar(text, _, anchor, tag) => {
                            no_anchor(anchor, &key_span)?;
                            if let Some(tag) = tag.as_deref()
                                && !(tag.is_yaml_core_schema() && tag.suffix == "str")
                            {
                                return Err(YamlError::at(&key_span, "mapping keys must be strings"));
                            }
                            text.into_owned()
                        }
                        Event::Alias(_) => {
                            return Err(YamlError::at(&key_span, "aliases are not supported"));
                        }
                        _ => {
                            return Err(YamlError::at(&key_span, "mapping keys must be scalars"));
                        }
                    };
                    if map.contains_key(&key) {
                        return Err(YamlError::at(&key_span, format!("duplicate key `{key}`")));
                    }
                    let (event, value_span) = self.next()?;
                    let value = self.node(event, value_span, depth + 1)?;
                    map.insert(key, value);
                }
            }
            Event::Alias(_) => Err(YamlError::at(&span, "aliases are not supported")),
            _ => Err(YamlError::at(&span, "unexpected YAML event")),
        }
    }

    fn enter(&self, depth: usize, span: &Span) -> Result<(), YamlError> {
        if depth > self.max_depth {
            Err(YamlError::at(
                span,
                format!("nesting exceeds {} levels", self.max_depth),
            ))
        } else {
            Ok(())
        }
    }
}

fn no_anchor(anchor: usize, span: &Span) -> Result<(), YamlError> {
    if anchor == 0 {
        Ok(())
    } else {
        Err(YamlError::at(span, "anchors are not supported"))
    }
}

fn check_collection_tag(tag: Option<&Tag>, expected: &str, span: &Span) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        Some(tag) if tag.is_yaml_core_schema() && tag.suffix == expected => Ok(()),
        Some(tag) => Err(YamlError::at(
            span,
            format!("unsupported tag `{}{}`", tag.handle, tag.suffix),
        )),
    }
}

fn scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>, span: &Span) -> Result<Value, YamlError> {
    let explicit = match tag {
        None => None,
        // The non-specific tag `!` forces a string.
        Some(tag) if tag.handle == "!" && tag.suffix.is_empty() => Some("str"),
        Some(tag) if tag.is_yaml_core_schema() => Some(tag.suffix.as_str()),
        Some(tag) => {
            return Err(YamlError::at(
                span,
                format!("unsupported tag `{}{}`", tag.handle, tag.suffix),
            ));
        }
    };
    let resolved = match explicit {
        Some("str") => return Ok(Value::String(text.to_owned())),
        Some("null") => resolve_null(text),
        Some("bool") => resolve_bool(text),
        Some("int") => resolve_int(text, span)?,
        Some("float") => resolve_float(text, span)?,
        Some(other) => return Err(YamlError::at(span, format!("unsupported tag `!!{other}`"))),
        None if style != ScalarStyle::Plain => return Ok(Value::String(text.to_owned())),
        None => {
            let plain = resolve_null(text)
                .or_else(|| resolve_bool(text))
                .map(Ok)
                .or_else(|| resolve_int(text, span).transpose())
                .or_else(|| resolve_float(text, span).transpose())
                .transpose()?;
            return Ok(plain.unwrap_or_else(|| Value::String(text.to_owned())));
        }
    };
    resolved.ok_or_else(|| {
        YamlError::at(
            span,
            format!("scalar does not match its tag `!!{}`", explicit.unwrap_or("")),
        )
    })
}

fn resolve_null(text: &str) -> Option<Value> {
    matches!(text, "" | "~" | "null" | "Null" | "NULL").then_some(Value::Null)
}

fn resolve_bool(text: &str) -> Option<Value> {
    match text {
        "true" | "True" | "TRUE" => Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => Some(Value::Bool(false)),
        _ => None,
    }
}

/// Core schema integers: `[-+]?[0-9]+`, `0o[0-7]+`, `0x[0-9a-fA-F]+`.
fn resolve_int(text: &str, span: &Span) -> Result<Option<Value>, YamlError> {
    let (radix, digits, negative) = if let Some(octal) = text.strip_prefix("0o") {
        (8, octal, false)
    } else if let Some(hexa) = text.strip_prefix("0x") {
        (16, hexa, false)
    } else {
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, text.get(1..).unwrap_or("")),
            Some(b'+') => (false, text.get(1..).unwrap_or("")),
            _ => (false, text),
        };
        (10, rest, negative)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Ok(None);
    }
    let magnitude = i128::from_str_radix(digits, radix).ok();
    let value = magnitude.map(|m| if negative { -m } else { m });
    match value {
        Some(v) if (-i128::from(MAX_SAFE_INTEGER)..=i128::from(MAX_SAFE_INTEGER)).contains(&v) => {
            Ok(i64::try_from(v).ok().map(|v| Value::Number(Number::from(v))))
        }
        _ => Err(YamlError::at(
            span,
            "integer outside the exactly representable range ±(2^53 - 1)",
        )),
    }
}

/// Core schema floats: `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`; the special
/// values `.inf` and `.nan` have no JSON form and are refused.
fn resolve_float(text: &str, span: &Span) -> Result<Option<Value>, YamlError> {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(body, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN") {
        return Err(YamlError::at(
            span,
            "infinity and NaN have no JSON representation",
        ));
    }
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (body.get(..i).unwrap_or(""), body.get(i + 1..)),
        None => (body, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => {
            (int.chars().all(|c| c.is_ascii_digit()) && frac.chars().all(|c| c.is_ascii_digit()))
                && (!int.is_empty() || !frac.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.chars().all(|c| c.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let digits = e.strip_prefix(['-', '+']).unwrap_or(e);
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
    });
    if !(mantissa_ok && exponent_ok) {
        return Ok(None);
    }
    // Rust's float parser does not accept a bare leading '.', so normalise it.
    let normalised = if mantissa.starts_with('.') {
        format!(
            "{}0{}",
            if text.starts_with('-') { "-" } else { "" },
            text.trim_start_matches(['-', '+'])
        )
    } else {
        text.trim_start_matches('+').to_owned()
    };
    let value: f64 = normalised
        .parse()
        .map_err(|_| YamlError::at(span, "malformed float"))?;
    if !value.is_finite() {
        return Err(YamlError::at(span, "number overflows a 64-bit float"));
    }
    if value == 0.0 && mantissa.chars().any(|c| c.is_ascii_digit() && c != '0') {
        return Err(YamlError::at(span, "number underflows to zero in a 64-bit float"));
    }
    Ok(Number::from_f64(value).map(Value::Number))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(text: &str) -> Value {
        parse(text, Limits::DOCUMENT).unwrap()
    }

    fn refuse(text: &str) -> String {
        parse(text, Limits::DOCUMENT).unwrap_err().to_string()
    }

    #[test]
    fn core_schema_resolution() {
        let v = load(
            "date: 2027-06-30\nyes: yes\non: off\nint: 42\nneg: -7\noct: 0o17\nhex: 0x1F\n\
             float: 1.5\nexp: 1e3\ndot: .5\nnull1: ~\nnull2:\nbool: True\nquoted: '12'\n\
             tagged: !!str 12\nlist: [a, 'b', 3]\n",
        );
        assert_eq!(
            v,
            json!({
                "date": "2027-06-30", "yes": "yes", "on": "off", "int": 42, "neg": -7, "oct": 15,
                "hex": 31, "float": 1.5, "exp": 1000.0, "dot": 0.5, "null1": null, "null2": null,
                "bool": true, "quoted": "12", "tagged": "12", "list": ["a", "b", 3]
            })
        );
        assert!(v["exp"].is_f64());
        assert!(v["int"].is_i64());
    }

    #[test]
    fn refuses_what_json_cannot_say() {
        assert!(refuse("a: 1\na: 2\n").contains("duplicate key"));
        assert!(refuse("a: &x 1\nb: *x\n").contains("anchors"));
        assert!(refuse("a: .nan\n").contains("NaN"));
        assert!(refuse("a: -.inf\n").contains("infinity"));
        assert!(refuse("a: 9007199254740992\n").contains("range"));
        assert!(refuse("a: !custom 1\n").contains("unsupported tag"));
        assert!(refuse("? [a]\n: 1\n").contains("scalars"));
        assert!(refuse("a: 1\n---\nb: 2\n").contains("one YAML document"));
        assert!(refuse("").contains("empty"));
        assert!(refuse("a: !!int abc\n").contains("does not match"));
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(refuse(&deep).contains("nesting"));
    }
}
