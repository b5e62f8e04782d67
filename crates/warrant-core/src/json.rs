//! Strict JSON: the only way untrusted bytes become a [`serde_json::Value`] inside Warrant.
//!
//! Written by hand rather than on top of `serde_json::from_slice` because serde_json, by
//! design, merges duplicate keys, turns integers above `u64::MAX` into floats and silently
//! rounds `0.1e-400` to `0.0`; upstream declined to make any of that an error. This parser is
//! RFC 8259 exact and refuses, with a stable code and a JSON pointer:
//!
//! - duplicate object keys at any depth (compared after unescaping),
//! - integers outside the interoperable range ±(2^53 − 1) (RFC 7493 §2.2),
//! - numbers that overflow to infinity or underflow to zero,
//! - lone UTF-16 surrogates in `\u` escapes and invalid UTF-8,
//! - nesting deeper than the configured limit and documents over the size limit.
//!
//! Numbers written without a fraction or exponent become integer [`serde_json::Number`]s;
//! numbers written with one become floats, even when their value is integral. The strict
//! integer rule of the schema stage relies on that distinction (`5.0` is not an integer).
//!
//! The parser recurses once per nesting level and the depth limit is capped at
//! [`MAX_DEPTH_CAP`], so hostile input cannot exhaust the stack.

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

mod frame;

pub use frame::{Framing, PlainRequest, Spans, check_framed, check_hole, check_plain_request};

/// Largest integer every JSON implementation represents exactly (2^53 − 1).
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;

/// Hard ceiling on the nesting limit, whatever the configuration asks for.
pub const MAX_DEPTH_CAP: usize = 256;

/// Size and nesting limits for one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted document, in bytes.
    pub max_bytes: usize,
    /// Deepest accepted nesting of arrays and objects (the top-level container is depth 1).
    pub max_depth: usize,
}

impl Limits {
    /// The limits for untrusted proposals: 64 KiB and 32 levels (PRODUCT §3).
    pub const PROPOSAL: Limits = Limits {
        max_bytes: 64 * 1024,
        max_depth: 32,
    };

    /// Generous limits for operator-supplied documents (contracts, `warrant canon` input).
    pub const DOCUMENT: Limits = Limits {
        max_bytes: 16 * 1024 * 1024,
        max_depth: 128,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::PROPOSAL
    }
}

/// Why a document was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonErrorKind {
    /// The document is larger than the size limit.
    TooLarge,
    /// The bytes are not valid UTF-8.
    InvalidUtf8,
    /// The text is not JSON (syntax error, trailing data, control character in a string…).
    Syntax,
    /// An object names the same key twice.
    DuplicateKey,
    /// Arrays and objects nest deeper than the limit.
    TooDeep,
    /// A number overflows, underflows to zero, or is an integer outside ±(2^53 − 1).
    NumberOutOfRange,
    /// A `\u` escape encodes half of a surrogate pair.
    LoneSurrogate,
}

/// A refused document: what went wrong, where in the text, and where in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    kind: JsonErrorKind,
    offset: usize,
    message: String,
    /// Path segments from the innermost outwards; reversed when the pointer is built.
    path_rev: Vec<String>,
}

impl JsonError {
    fn new(kind: JsonErrorKind, offset: usize, message: impl Into<String>) -> Self {
        JsonError {
            kind,
            offset,
            message: message.into(),
            path_rev: Vec::new(),
        }
    }

    fn within(mut self, segment: impl Into<String>) -> Self {
        self.path_rev.push(segment.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> JsonErrorKind {
        self.kind
    }

    /// Byte offset in the input where the problem was found.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Human-readable description (never echoes the offending value).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// RFC 6901 pointer to the value being read when the problem was found.
    pub fn pointer(&self) -> String {
        let mut out = String::new();
        for segment in self.path_rev.iter().rev() {
            out.push('/');
            push_pointer_segment(&mut out, segment);
        }
        out
    }
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.offset)?;
        let pointer = self.pointer();
        if !pointer.is_empty() {
            write!(f, " (at {pointer})")?;
        }
        Ok(())
    }
}

impl std::error::Error for JsonError {}

/// Appends one RFC 6901 reference token, escaping `~` and `/`.
pub fn push_pointer_segment(out: &mut String, segment: &str) {
    for c in segment.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

/// Parses `input` as one strict JSON document.
///
/// # Errors
/// Returns a [`JsonError`] for every refusal listed in the module documentation.
pub fn parse(input: &[u8], limits: Limits) -> Result<Value, JsonError> {
    let text = check_input(input, limits)?;
    let mut parser = Parser::new(text, limits);
    let value = parser.value::<Tree>(0)?;
    parser.finish()?;
    Ok(value)
}

/// What kind of value a document checked by [`check`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// An object.
    Object,
    /// An array.
    Array,
    /// A string, number, boolean or null.
    Scalar,
}

/// Checks `input` as [`parse`] does — exactly the same documents are refused, with the same
/// errors — without building the value: for callers that only need to know the document is
/// strict JSON (the MCP lane's framing of a message it hands on). It allocates only each
/// object's list of keys and the text of a string with escapes.
///
/// # Errors
/// As [`parse`].
pub fn check(input: &[u8], limits: Limits) -> Result<Shape, JsonError> {
    let text = check_input(input, limits)?;
    let mut parser = Parser::new(text, limits);
    let shape = match parser.peek() {
        Some(b'{') => Shape::Object,
        Some(b'[') => Shape::Array,
        _ => Shape::Scalar,
    };
    parser.value::<Check>(0)?;
    parser.finish()?;
    Ok(shape)
}

/// A document read by [`parse_top_level`].
#[derive(Debug, Clone, PartialEq)]
pub enum TopLevel<'a> {
    /// The document is an object: its members in document order, keys unique (borrowed
    /// from the input unless they had escapes).
    Object(Vec<(Cow<'a, str>, Value)>),
    /// Any other value.
    Other(Value),
}

/// [`parse`], with the members of a top-level object handed over as a list rather than a
/// map, for callers that take them apart (the proposal envelope): no map is built for them.
/// Exactly the same documents are refused, with the same errors.
///
/// # Errors
/// As [`parse`].
pub fn parse_top_level(input: &[u8], limits: Limits) -> Result<TopLevel<'_>, JsonError> {
    let text = check_input(input, limits)?;
    let mut parser = Parser::new(text, limits);
    let top = if parser.peek() == Some(b'{') {
        TopLevel::Object(parser.members::<Tree>(1)?.into_list())
    } else {
        TopLevel::Other(parser.value::<Tree>(0)?)
    };
    parser.finish()?;
    Ok(top)
}

/// The length of the longest prefix of `bytes` holding no `"`, no `\` and no control
/// character: string content that needs no attention, in the parser and in the canonical form.
///
/// Eight bytes at a time (SWAR): string content is most of a proposal's bytes, and a search a
/// byte at a time cost about four instructions a byte. Written by hand because `memchr`
/// finds given bytes, not a range (`< 0x20`). Per word, each test sets the high bit of a byte
/// that matches; a borrow only moves up, so a test never marks a byte below its first match,
/// and the lowest bit set is the first byte that matches any of them
/// (`plain_prefixes_are_found_as_a_byte_at_a_time`).
pub(crate) fn plain_prefix_len(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut chunks = bytes.chunks_exact(8);
    let mut done = 0;
    for chunk in &mut chunks {
        let mut word = [0_u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let found = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w))
            & HIGHS;
        if found != 0 {
            // The byte whose high bit is the lowest set (little-endian: the first byte).
            return done + (found.trailing_zeros() / 8) as usize;
        }
        done += 8;
    }
    let rest = chunks.remainder();
    done + rest
        .iter()
        .position(|&b| needs_attention(b))
        .unwrap_or(rest.len())
}

/// Whether a byte of a string's content is a quote, a backslash or a control character.
fn needs_attention(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// The size limit and the UTF-8 check, before any parsing.
fn check_input(input: &[u8], limits: Limits) -> Result<&str, JsonError> {
    check_size(input, limits)?;
    std::str::from_utf8(input).map_err(|e| {
        JsonError::new(
            JsonErrorKind::InvalidUtf8,
            e.valid_up_to(),
            "document is not valid UTF-8",
        )
    })
}

/// `input` is within `limits.max_bytes`.
fn check_size(input: &[u8], limits: Limits) -> Result<(), JsonError> {
    if input.len() > limits.max_bytes {
        return Err(JsonError::new(
            JsonErrorKind::TooLarge,
            limits.max_bytes,
            format!(
                "document is {} bytes, over the limit of {} bytes",
                input.len(),
                limits.max_bytes
            ),
        ));
    }
    Ok(())
}

/// Up to this many members, an object being read is a list: a duplicate check by comparing
/// keys is cheaper than hashing them, and the map is then built once at its final size.
/// Beyond it the members move into a map, so hostile objects with many keys stay linear.
const FEW_MEMBERS: usize = 16;

/// The members of an object being read (see [`FEW_MEMBERS`]); keys stay borrowed from the
/// input until the object becomes a map (the envelope's never do).
enum Members<'a> {
    Few(Vec<(Cow<'a, str>, Value)>),
    Many(Map<String, Value>),
}

impl<'a> Members<'a> {
    /// Adds a member; gives the key back when the object already has it.
    fn add(&mut self, key: Cow<'a, str>, value: Value) -> Result<(), String> {
        match self {
            Members::Few(list) => {
                if list.iter().any(|(k, _)| *k == key) {
                    return Err(key.into_owned());
                }
                if list.len() < FEW_MEMBERS {
                    list.push((key, value));
                } else {
                    let mut map = owned(std::mem::take(list));
                    map.insert(key.into_owned(), value);
                    *self = Members::Many(map);
                }
                Ok(())
            }
            Members::Many(map) => match map.entry(key.into_owned()) {
                serde_json::map::Entry::Vacant(slot) => {
                    slot.insert(value);
                    Ok(())
                }
                serde_json::map::Entry::Occupied(slot) => Err(slot.key().clone()),
            },
        }
    }

    fn into_map(self) -> Map<String, Value> {
        match self {
            Members::Few(list) => owned(list),
            Members::Many(map) => map,
        }
    }

    fn into_list(self) -> Vec<(Cow<'a, str>, Value)> {
        match self {
            Members::Few(list) => list,
            Members::Many(map) => map.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect(),
        }
    }
}

fn owned(list: Vec<(Cow<'_, str>, Value)>) -> Map<String, Value> {
    list.into_iter().map(|(k, v)| (k.into_owned(), v)).collect()
}

/// What the parser makes of what it reads. One parser, two builders: [`Tree`] builds the
/// [`Value`], [`Check`] builds nothing; every check and every error is the parser's, so the two
/// refuse exactly the same documents (the property `check_refuses_what_parse_refuses`).
trait Build<'a> {
    /// A value read.
    type Value;
    /// An object being read.
    type Object;
    /// An array being read.
    type Array;
    fn string(text: Cow<'a, str>) -> Self::Value;
    fn number(number: Number) -> Self::Value;
    fn boolean(value: bool) -> Self::Value;
    fn null() -> Self::Value;
    /// An object with no member yet (`members` says whether any follow).
    fn object(members: bool) -> Self::Object;
    /// Adds a member; gives the key back when the object already has it.
    fn add(object: &mut Self::Object, key: Cow<'a, str>, value: Self::Value) -> Result<(), String>;
    fn end_object(object: Self::Object) -> Self::Value;
    fn array() -> Self::Array;
    fn push(array: &mut Self::Array, value: Self::Value);
    /// Items so far (for the error's pointer).
    fn len(array: &Self::Array) -> usize;
    fn end_array(array: Self::Array) -> Self::Value;
}

/// The error for a key an object already has.
fn duplicate_key(key_offset: usize, key: String) -> JsonError {
    JsonError::new(JsonErrorKind::DuplicateKey, key_offset, "duplicate object key").within(key)
}

/// Builds the [`Value`].
enum Tree {}

impl<'a> Build<'a> for Tree {
    type Value = Value;
    type Object = Members<'a>;
    type Array = Vec<Value>;
    fn string(text: Cow<'a, str>) -> Value {
        Value::String(text.into_owned())
    }
    fn number(number: Number) -> Value {
        Value::Number(number)
    }
    fn boolean(value: bool) -> Value {
        Value::Bool(value)
    }
    fn null() -> Value {
        Value::Null
    }
    fn object(members: bool) -> Members<'a> {
        Members::Few(if members {
            Vec::with_capacity(4)
        } else {
            Vec::new()
        })
    }
    fn add(object: &mut Members<'a>, key: Cow<'a, str>, value: Value) -> Result<(), String> {
        object.add(key, value)
    }
    fn end_object(object: Members<'a>) -> Value {
        Value::Object(object.into_map())
    }
    fn array() -> Vec<Value> {
        Vec::new()
    }
    fn push(array: &mut Vec<Value>, value: Value) {
        array.push(value);
    }
    fn len(array: &Vec<Value>) -> usize {
        array.len()
    }
    fn end_array(array: Vec<Value>) -> Value {
        Value::Array(array)
    }
}

/// Builds nothing: keeps only an object's keys, for the duplicate check.
enum Check {}

/// The keys of an object being checked (as [`Members`]: a list up to [`FEW_MEMBERS`], then a
/// set).
enum Keys<'a> {
    Few(Vec<Cow<'a, str>>),
    Many(std::collections::HashSet<String>),
}

impl<'a> Build<'a> for Check {
    type Value = ();
    type Object = Keys<'a>;
    type Array = usize;
    fn string(_: Cow<'a, str>) {}
    fn number(_: Number) {}
    fn boolean(_: bool) {}
    fn null() {}
    fn object(members: bool) -> Keys<'a> {
        Keys::Few(if members {
            Vec::with_capacity(4)
        } else {
            Vec::new()
        })
    }
    fn add(object: &mut Keys<'a>, key: Cow<'a, str>, (): ()) -> Result<(), String> {
        match object {
            Keys::Few(list) => {
                if list.contains(&key) {
                    return Err(key.into_owned());
                }
                if list.len() < FEW_MEMBERS {
                    list.push(key);
                } else {
                    let mut set: std::collections::HashSet<String> =
                        list.drain(..).map(Cow::into_owned).collect();
                    set.insert(key.into_owned());
                    *object = Keys::Many(set);
                }
                Ok(())
            }
            Keys::Many(set) => {
                if set.contains(key.as_ref()) {
                    Err(key.into_owned())
                } else {
                    set.insert(key.into_owned());
                    Ok(())
                }
            }
        }
    }
    fn end_object(_: Keys<'a>) {}
    fn array() -> usize {
        0
    }
    fn push(array: &mut usize, (): ()) {
        *array += 1;
    }
    fn len(array: &usize) -> usize {
        *array
    }
    fn end_array(_: usize) {}
}

struct Parser<'a> {
    /// The document, valid UTF-8 (checked before parsing starts), so any slice between
    /// ASCII delimiters is valid UTF-8 as well: slicing checks char boundaries only.
    text: &'a str,
    /// `text` as bytes.
    bytes: &'a [u8],
    pos: usize,
    max_depth: usize,
    scratch: String,
}

impl<'a> Parser<'a> {
    /// A parser positioned at the document's first value.
    fn new(text: &'a str, limits: Limits) -> Self {
        let mut parser = Parser {
            text,
            bytes: text.as_bytes(),
            pos: 0,
            max_depth: limits.max_depth.min(MAX_DEPTH_CAP),
            scratch: String::new(),
        };
        parser.skip_ws();
        parser
    }

    /// Only whitespace may follow the document.
    fn finish(&mut self) -> Result<(), JsonError> {
        self.skip_ws();
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(self.syntax("unexpected data after the document"))
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn syntax(&self, message: &str) -> JsonError {
        JsonError::new(JsonErrorKind::Syntax, self.pos, message)
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value<B: Build<'a>>(&mut self, depth: usize) -> Result<B::Value, JsonError> {
        match self.peek() {
            Some(b'{') => Ok(B::end_object(self.members::<B>(depth + 1)?)),
            Some(b'[') => self.array::<B>(depth + 1),
            Some(b'"') => Ok(B::string(self.text()?)),
            Some(b't') => self.literal("true", B::boolean(true)),
            Some(b'f') => self.literal("false", B::boolean(false)),
            Some(b'n') => self.literal("null", B::null()),
            Some(b'-' | b'0'..=b'9') => self.number().map(B::number),
            Some(_) => Err(self.syntax("expected a JSON value")),
            None => Err(self.syntax("unexpected end of document")),
        }
    }

    fn literal<V>(&mut self, word: &str, value: V) -> Result<V, JsonError> {
        let end = self.pos + word.len();
        if self.bytes.get(self.pos..end) == Some(word.as_bytes()) {
            self.pos = end;
            Ok(value)
        } else {
            Err(self.syntax("expected a JSON value"))
        }
    }

    fn enter(&self, depth: usize) -> Result<(), JsonError> {
        if depth > self.max_depth {
            Err(JsonError::new(
                JsonErrorKind::TooDeep,
                self.pos,
                format!("nesting exceeds the limit of {} levels", self.max_depth),
            ))
        } else {
            Ok(())
        }
    }

    /// Reads an object (the parser is at its `{`).
    fn members<B: Build<'a>>(&mut self, depth: usize) -> Result<B::Object, JsonError> {
        self.object_with(depth, B::object, |parser, members, key, key_offset| {
            let value = match parser.value::<B>(depth) {
                Ok(value) => value,
                Err(e) => return Err(e.within(key.into_owned())),
            };
            B::add(members, key, value).map_err(|key| duplicate_key(key_offset, key))
        })
    }

    /// Reads an object (the parser is at its `{`) member by member: `empty(any)` makes the
    /// object (`any`: whether members follow), and `member` reads the value of each (the
    /// parser is at it) and adds it under its key (at `key_offset`).
    fn object_with<O>(
        &mut self,
        depth: usize,
        empty: impl FnOnce(bool) -> O,
        mut member: impl FnMut(&mut Self, &mut O, Cow<'a, str>, usize) -> Result<(), JsonError>,
    ) -> Result<O, JsonError> {
        self.enter(depth)?;
        self.pos += 1; // '{'
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(empty(false));
        }
        let mut object = empty(true);
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected a string key"));
            }
            let key_offset = self.pos;
            let key = self.text()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self
                    .syntax("expected ':' after an object key")
                    .within(key.into_owned()));
            }
            self.pos += 1;
            self.skip_ws();
            member(self, &mut object, key, key_offset)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(object);
                }
                _ => return Err(self.syntax("expected ',' or '}' in an object")),
            }
        }
    }

    fn array<B: Build<'a>>(&mut self, depth: usize) -> Result<B::Value, JsonError> {
        self.enter(depth)?;
        self.pos += 1; // '['
        let mut items = B::array();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(B::end_array(items));
        }
        loop {
            self.skip_ws();
            match self.value::<B>(depth) {
                Ok(value) => B::push(&mut items, value),
                Err(e) => return Err(e.within(B::len(&items).to_string())),
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(B::end_array(items));
                }
                _ => return Err(self.syntax("expected ',' or ']' in an array")),
            }
        }
    }

    /// A string's text: a slice of the input when it has no escapes.
    fn text(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.pos += 1; // opening quote
        let start = self.pos;
        // Fast path: no escapes, so the string is a slice of the (valid UTF-8) input.
        self.skip_plain();
        match self.peek() {
            Some(b'"') => {
                let s = self.slice_str(start, self.pos)?;
                self.pos += 1;
                return Ok(Cow::Borrowed(s));
            }
            Some(b'\\') => {}
            Some(_) => {
                return Err(self.syntax("control character in a string must be escaped"));
            }
            None => return Err(self.syntax("unterminated string")),
        }
        self.scratch.clear();
        let prefix = self.slice_str(start, self.pos)?;
        self.scratch.push_str(prefix);
        loop {
            let run_start = self.pos;
            self.skip_plain();
            let run = self.slice_str(run_start, self.pos)?;
            self.scratch.push_str(run);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(std::mem::take(&mut self.scratch)));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape()?;
                }
                Some(_) => {
                    return Err(self.syntax("control character in a string must be escaped"));
                }
                None => return Err(self.syntax("unterminated string")),
            }
        }
    }

    /// Advances over string content that needs no attention: anything but `"`, `\\` and
    /// control characters.
    fn skip_plain(&mut self) {
        self.pos += plain_prefix_len(self.bytes.get(self.pos..).unwrap_or_default());
    }

    /// The text between two byte offsets (ASCII delimiters, hence char boundaries).
    fn slice_str(&self, start: usize, end: usize) -> Result<&'a str, JsonError> {
        self.text
            .get(start..end)
            .ok_or_else(|| JsonError::new(JsonErrorKind::InvalidUtf8, start, "invalid UTF-8"))
    }

    fn escape(&mut self) -> Result<(), JsonError> {
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                let unit = self.hex4()?;
                let c = match unit {
                    0xD800..=0xDBFF => {
                        if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            return Err(self.lone_surrogate());
                        }
                        self.pos += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(self.lone_surrogate());
                        }
                        let code = 0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                        char::from_u32(code).ok_or_else(|| self.lone_surrogate())?
                    }
                    0xDC00..=0xDFFF => return Err(self.lone_surrogate()),
                    unit => char::from_u32(u32::from(unit)).ok_or_else(|| self.lone_surrogate())?,
                };
                self.scratch.push(c);
                return Ok(());
            }
            _ => return Err(self.syntax("invalid escape sequence")),
        };
        self.pos += 1;
        self.scratch.push(c);
        Ok(())
    }

    fn lone_surrogate(&self) -> JsonError {
        JsonError::new(
            JsonErrorKind::LoneSurrogate,
            self.pos,
            "lone UTF-16 surrogate in a \\u escape",
        )
    }

    fn hex4(&mut self) -> Result<u16, JsonError> {
        let digits = self
            .bytes
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.syntax("truncated \\u escape"))?;
        let mut unit: u16 = 0;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(self.syntax("invalid \\u escape")),
            };
            unit = (unit << 4) | u16::from(v);
        }
        self.pos += 4;
        Ok(unit)
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// Moves past a number, checking its grammar only (RFC 8259 §6): where it starts, whether
    /// it has a fraction or an exponent, and whether its mantissa has a non-zero digit.
    fn number_grammar(&mut self) -> Result<(usize, bool, bool), JsonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.digits() {
            0 => return Err(self.syntax("expected digits in a number")),
            n if n > 1 && self.bytes.get(int_start) == Some(&b'0') => {
                return Err(JsonError::new(
                    JsonErrorKind::Syntax,
                    int_start,
                    "leading zeros are not allowed in a number",
                ));
            }
            _ => {}
        }
        let mut is_float = false;
        let mut nonzero_mantissa = self
            .bytes
            .get(int_start..self.pos)
            .is_some_and(|d| d.iter().any(|&b| b != b'0'));
        if self.peek() == Some(b'.') {
            self.pos += 1;
            is_float = true;
            let frac_start = self.pos;
            if self.digits() == 0 {
                return Err(self.syntax("expected digits after the decimal point"));
            }
            nonzero_mantissa |= self
                .bytes
                .get(frac_start..self.pos)
                .is_some_and(|d| d.iter().any(|&b| b != b'0'));
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            is_float = true;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.syntax("expected digits in the exponent"));
            }
        }
        Ok((start, is_float, nonzero_mantissa))
    }

    fn number(&mut self) -> Result<Number, JsonError> {
        let (start, is_float, nonzero_mantissa) = self.number_grammar()?;
        let text = self.slice_str(start, self.pos)?;
        if !is_float {
            if let Ok(n) = text.parse::<i64>()
                && (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&n)
            {
                return Ok(Number::from(n));
            }
            // Beyond ±(2^53 - 1) an integer literal is only accepted when it is exactly the
            // shortest (RFC 8785 / ECMAScript) spelling of a 64-bit float, so nothing is lost
            // and canonical output (which writes 1e20 as 100000000000000000000) reads back.
            // It becomes a float, which the strict integer rule then refuses for integers.
            let exact = text
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .and_then(Number::from_f64)
                .filter(|n| crate::canon::canonical_string(&Value::Number(n.clone())) == text);
            return exact.ok_or_else(|| {
                JsonError::new(
                    JsonErrorKind::NumberOutOfRange,
                    start,
                    "integer literal cannot be represented exactly (beyond ±(2^53 - 1))",
                )
            });
        }
        let value: f64 = text
            .parse()
            .map_err(|_| JsonError::new(JsonErrorKind::Syntax, start, "malformed number"))?;
        if !value.is_finite() {
            return Err(JsonError::new(
                JsonErrorKind::NumberOutOfRange,
                start,
                "number overflows a 64-bit float",
            ));
        }
        if value == 0.0 && nonzero_mantissa {
            return Err(JsonError::new(
                JsonErrorKind::NumberOutOfRange,
                start,
                "number underflows to zero in a 64-bit float",
            ));
        }
        Number::from_f64(value)
            .ok_or_else(|| JsonError::new(JsonErrorKind::NumberOutOfRange, start, "not finite"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(input: &str) -> JsonErrorKind {
        parse(input.as_bytes(), Limits::PROPOSAL).unwrap_err().kind()
    }

    #[test]
    fn plain_prefixes_are_found_as_a_byte_at_a_time() {
        let naive = |bytes: &[u8]| {
            bytes
                .iter()
                .position(|&b| needs_attention(b))
                .unwrap_or(bytes.len())
        };
        let specials: &[u8] = &[b'"', b'\\', 0x00, 0x1f, b'\n'];
        let others: &[u8] = &[
            b'a', b' ', 0x20, 0x21, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xe2, 0xff,
        ];
        // Every length up to three words, every special byte at every place, behind every
        // other byte, and a second special byte later on.
        for len in 0..=24 {
            for &other in others {
                let mut bytes = vec![other; len];
                assert_eq!(plain_prefix_len(&bytes), naive(&bytes));
                for at in 0..len {
                    for &special in specials {
                        bytes[at] = special;
                        assert_eq!(plain_prefix_len(&bytes), naive(&bytes), "{bytes:?}");
                        if at + 3 < len {
                            bytes[at + 3] = b'"';
                            assert_eq!(plain_prefix_len(&bytes), naive(&bytes), "{bytes:?}");
                            bytes[at + 3] = other;
                        }
                        bytes[at] = other;
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_have_the_plain_prefix_a_byte_search_finds(bytes in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::prelude::any::<u8>(),
                proptest::sample::select(vec![b'"', b'\\', 0x1f, 0x20, 0x21, 0x80]),
            ],
            0..64,
        )) {
            let naive = bytes.iter().position(|&b| needs_attention(b)).unwrap_or(bytes.len());
            proptest::prop_assert_eq!(plain_prefix_len(&bytes), naive);
        }
    }

    #[test]
    fn accepts_ordinary_documents() {
        let v = parse(
            br#" {"a": [1, -2.5, "x\u00e9\ud83d\ude00", true, null], "b": {}} "#,
            Limits::PROPOSAL,
        )
        .unwrap();
        assert_eq!(v["a"][2], "xé😀");
        assert!(v["a"][0].is_i64());
        assert!(v["a"][1].is_f64());
    }

    #[test]
    fn large_objects_keep_order_and_refuse_duplicates() {
        let keys: Vec<String> = (0..40).map(|i| format!("k{}", (i * 7) % 40)).collect();
        let body: Vec<String> = keys.iter().map(|k| format!("\"{k}\":1")).collect();
        let text = format!("{{{}}}", body.join(","));
        let v = parse(text.as_bytes(), Limits::PROPOSAL).unwrap();
        // (The map's order is serde_json's: document order or sorted, by feature.)
        let mut got: Vec<&String> = v.as_object().unwrap().keys().collect();
        let mut want: Vec<&String> = keys.iter().collect();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        for at in [3, FEW_MEMBERS, FEW_MEMBERS + 1, 39] {
            let mut dup = body.clone();
            dup.insert(at, format!("\"{}\":2", keys[at / 2]));
            let text = format!("{{\"x\":{{{}}}}}", dup.join(","));
            let e = parse(text.as_bytes(), Limits::PROPOSAL).unwrap_err();
            assert_eq!(e.kind(), JsonErrorKind::DuplicateKey, "{at}");
            assert_eq!(e.pointer(), format!("/x/{}", keys[at / 2]));
        }
    }

    #[test]
    fn top_level_members_match_the_parsed_document() {
        for text in [
            r#"{"b":1,"a":{"z":[1,{"y":null}]},"c":"\u00e9"}"#,
            " { } ",
            "[1, 2]",
            "\"x\"",
            "3",
        ] {
            let value = parse(text.as_bytes(), Limits::PROPOSAL).unwrap();
            let top = parse_top_level(text.as_bytes(), Limits::PROPOSAL).unwrap();
            match (top, value) {
                (TopLevel::Object(members), Value::Object(map)) => {
                    let mut members = members;
                    members.sort_by(|a, b| a.0.cmp(&b.0));
                    let mut expected: Vec<(Cow<'_, str>, Value)> =
                        map.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect();
                    expected.sort_by(|a, b| a.0.cmp(&b.0));
                    assert_eq!(members, expected);
                }
                (TopLevel::Other(other), value) => assert_eq!(other, value),
                (top, value) => panic!("{top:?} vs {value:?}"),
            }
        }
        for text in [r#"{"a":1,"a":2}"#, r#"{"a":1} x"#, r#"{"a":"#, &"[".repeat(40)] {
            assert_eq!(
                parse(text.as_bytes(), Limits::PROPOSAL).unwrap_err(),
                parse_top_level(text.as_bytes(), Limits::PROPOSAL).unwrap_err()
            );
        }
    }

    #[test]
    fn integral_floats_stay_floats() {
        let v = parse(b"[5.0, 5e0, 5]", Limits::PROPOSAL).unwrap();
        assert!(v[0].is_f64());
        assert!(v[1].is_f64());
        assert!(v[2].is_i64());
    }

    #[test]
    fn refuses_duplicate_keys_with_pointer() {
        let e = parse(br#"{"a":{"b":1,"\u0062":2}}"#, Limits::PROPOSAL).unwrap_err();
        assert_eq!(e.kind(), JsonErrorKind::DuplicateKey);
        assert_eq!(e.pointer(), "/a/b");
    }

    #[test]
    fn refuses_numbers_that_do_not_fit() {
        assert_eq!(kind("9007199254740993"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind("-9007199254740993"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind("12345678901234567890"), JsonErrorKind::NumberOutOfRange);
        // Exactly the shortest spelling of a double: accepted, as a float.
        let big = parse(
            b"[9007199254740992, 295147905179352830000, -100000000000000000000]",
            Limits::PROPOSAL,
        )
        .unwrap();
        assert!(big[0].is_f64() && big[1].is_f64() && big[2].is_f64());
        assert_eq!(kind("295147905179352825856"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind("18446744073709551616"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind("1e400"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind("-1e400"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind("0.1e-400"), JsonErrorKind::NumberOutOfRange);
        assert!(parse(b"9007199254740991", Limits::PROPOSAL).is_ok());
        assert!(parse(b"0.0e-400", Limits::PROPOSAL).is_ok());
        assert!(parse(b"5e-324", Limits::PROPOSAL).is_ok());
    }

    #[test]
    fn refuses_non_json_numbers() {
        for bad in ["01", "+1", ".5", "1.", "1e", "NaN", "Infinity", "-", "0x10"] {
            assert_eq!(kind(bad), JsonErrorKind::Syntax, "{bad}");
        }
    }

    #[test]
    fn refuses_lone_surrogates_and_bad_utf8() {
        assert_eq!(kind(r#""\ud800""#), JsonErrorKind::LoneSurrogate);
        assert_eq!(kind(r#""\udc00""#), JsonErrorKind::LoneSurrogate);
        assert_eq!(kind(r#""\ud800\u0041""#), JsonErrorKind::LoneSurrogate);
        let e = parse(b"\"\xff\"", Limits::PROPOSAL).unwrap_err();
        assert_eq!(e.kind(), JsonErrorKind::InvalidUtf8);
    }

    #[test]
    fn refuses_deep_nesting_and_large_documents() {
        let deep = "[".repeat(33) + &"]".repeat(33);
        assert_eq!(kind(&deep), JsonErrorKind::TooDeep);
        let ok = "[".repeat(32) + &"]".repeat(32);
        assert!(parse(ok.as_bytes(), Limits::PROPOSAL).is_ok());
        let big = format!("\"{}\"", "a".repeat(64 * 1024));
        assert_eq!(kind(&big), JsonErrorKind::TooLarge);
        // The cap protects the stack even when a caller configures an absurd limit.
        let very_deep = "[".repeat(100_000);
        let limits = Limits {
            max_bytes: usize::MAX,
            max_depth: usize::MAX,
        };
        assert_eq!(
            parse(very_deep.as_bytes(), limits).unwrap_err().kind(),
            JsonErrorKind::TooDeep
        );
    }

    #[test]
    fn refuses_syntax_errors() {
        for bad in [
            "",
            " ",
            "{",
            "{\"a\"}",
            "{\"a\":1,}",
            "[1,]",
            "\"a\nb\"",
            "\u{feff}{}",
            "{} {}",
            "tru",
            "'a'",
        ] {
            assert_eq!(kind(bad), JsonErrorKind::Syntax, "{bad:?}");
        }
    }

    #[test]
    fn pointer_escapes_tokens() {
        let e = parse(br#"{"a/b":{"c~d":[0,01]}}"#, Limits::PROPOSAL).unwrap_err();
        assert_eq!(e.pointer(), "/a~1b/c~0d/1");
    }
}
