//! One strict pass over a message that carries a value judged elsewhere (the MCP lane's
//! `tools/call`, whose `params.arguments` are the proposal's, refused by `decide` with a
//! ledger row rather than by the message's framing).
//!
//! [`check_framed`] reads the message once: everything but that one value is checked exactly
//! as [`check`](super::check) checks it, and the value itself is only *scanned* — its grammar
//! is read (strings, escapes, numbers, nesting) so its extent is known, but not the limits
//! the proposal's parser enforces (duplicate keys, number ranges, lone surrogates, depth). The
//! caller gets where each top-level member and each member of the outer object lies, and
//! where the value lies. When the caller then decides the message is not one whose value is
//! judged elsewhere, [`check_hole`] checks that value strictly, as [`check`](super::check)
//! would have inside the message.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;

use super::{
    Check, FEW_MEMBERS, JsonError, JsonErrorKind, Limits, Parser, Shape, check_input, check_size,
    duplicate_key,
};

/// The members of an object: each key (decoded) and the byte range of its value.
pub type Spans<'a> = Vec<(Cow<'a, str>, Range<usize>)>;

/// Where the parts of a message checked by [`check_framed`] lie in it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Framing<'a> {
    /// The top-level object's members, in document order.
    pub members: Spans<'a>,
    /// The members of the top-level member `outer`, when it is an object.
    pub inner: Spans<'a>,
    /// Where the value of `outer.hole` lies, when there is one: scanned, not checked.
    pub hole: Option<Range<usize>>,
}

/// Checks `text` as [`check`](super::check) does, except for the value of the member `hole`
/// of the top-level member `outer` (both objects), which is only scanned (see the module
/// documentation). A document that is not an object is checked whole and has no framing.
///
/// The document is text already (the caller has read its bytes as UTF-8, and decides what
/// invalid bytes mean), so it is not validated a second time.
///
/// # Errors
/// As [`check`](super::check) for everything but that value; for it, only a syntax error
/// (a value whose extent cannot be read).
pub fn check_framed<'a>(
    text: &'a str,
    limits: Limits,
    outer: &str,
    hole: &str,
) -> Result<(Shape, Framing<'a>), JsonError> {
    check_size(text.as_bytes(), limits)?;
    // The usual message, read quickly; anything else (or anything wrong) is read again from
    // the start by the general reader, whose answer is the answer.
    let mut framing = Framing::default();
    if check_framed_quickly(text, limits, outer, hole, &mut framing) {
        Ok((Shape::Object, framing))
    } else {
        check_framed_generally(text, limits, outer, hole)
    }
}

/// [`check_framed`] by the quick reading alone ([`Parser::framed_quick`]): whether it read a
/// usual message, whose framing it wrote into `framing` (in place: the members are kept in
/// place, and each move of them is a copy); `false` for anything it leaves to the general
/// reader (`framing` then says nothing).
fn check_framed_quickly<'a>(
    text: &'a str,
    limits: Limits,
    outer: &str,
    hole: &str,
    framing: &mut Framing<'a>,
) -> bool {
    let mut quick = Parser::new(text, limits);
    quick.peek() == Some(b'{') && quick.framed_quick(outer, hole, framing).is_some() && quick.finish().is_ok()
}

/// [`check_framed`] by the general reader alone.
fn check_framed_generally<'a>(
    text: &'a str,
    limits: Limits,
    outer: &str,
    hole: &str,
) -> Result<(Shape, Framing<'a>), JsonError> {
    let mut parser = Parser::new(text, limits);
    let (shape, framing) = match parser.peek() {
        Some(b'{') => (Shape::Object, parser.framed(outer, hole)?),
        Some(b'[') => {
            parser.value::<Check>(0)?;
            (Shape::Array, Framing::default())
        }
        _ => {
            parser.value::<Check>(0)?;
            (Shape::Scalar, Framing::default())
        }
    };
    parser.finish()?;
    Ok((shape, framing))
}

/// Checks the value at `range` of a message read by [`check_framed`] strictly, as
/// [`check`](super::check) checks it at that place in the message (the hole sits two objects
/// deep); offsets in the error are the message's.
///
/// # Errors
/// As [`check`](super::check).
pub fn check_hole(input: &[u8], range: Range<usize>, limits: Limits) -> Result<(), JsonError> {
    let start = range.start;
    let part = input
        .get(range)
        .ok_or_else(|| JsonError::new(JsonErrorKind::Syntax, start, "the value is not in the message"))?;
    let at = |mut e: JsonError| {
        e.offset += start;
        e
    };
    let text = check_input(part, limits).map_err(at)?;
    let mut parser = Parser::new(text, limits);
    // The value is a member of a member of the top-level object: depth 2, as `framed` reads it.
    parser.value::<Check>(2).map_err(at)?;
    parser.finish().map_err(at)
}

/// The closers [`Parser::scan`] expects, innermost last: the first levels in place, deeper
/// ones in a vector, so the usual few levels of a tool's arguments allocate nothing.
#[derive(Default)]
struct Closers {
    shallow: [u8; SHALLOW],
    len: usize,
    deep: Vec<u8>,
}

/// The longest integer [`Parser::quick_integer`] reads: any integer this long is exact in
/// every number representation the strict reader checks.
const QUICK_DIGITS: usize = 15;

/// The levels [`Closers`] keeps in place.
const SHALLOW: usize = 32;

impl Closers {
    fn push(&mut self, closer: u8) {
        match self.shallow.get_mut(self.len) {
            Some(slot) => *slot = closer,
            None => self.deep.push(closer),
        }
        self.len += 1;
    }

    fn pop(&mut self) {
        if self.len > SHALLOW {
            self.deep.pop();
        }
        self.len = self.len.saturating_sub(1);
    }

    fn last(&self) -> Option<u8> {
        let top = self.len.checked_sub(1)?;
        match top.checked_sub(SHALLOW) {
            None => self.shallow.get(top).copied(),
            Some(_) => self.deep.last().copied(),
        }
    }
}

/// Adds a member to `spans`; gives the key back when the object already has it. While the
/// object has few members, a new key is compared with each; beyond [`FEW_MEMBERS`] they are
/// kept in a set as well (`seen`), so hostile objects with many keys stay linear.
fn add_span<'a>(
    spans: &mut Spans<'a>,
    seen: &mut Option<HashSet<Cow<'a, str>>>,
    key: Cow<'a, str>,
    range: Range<usize>,
) -> Result<(), String> {
    let repeated = match seen {
        Some(set) => !set.insert(key.clone()),
        None => spans.iter().any(|(k, _)| *k == key),
    };
    if repeated {
        return Err(key.into_owned());
    }
    spans.push((key, range));
    if seen.is_none() && spans.len() > FEW_MEMBERS {
        *seen = Some(spans.iter().map(|(k, _)| k.clone()).collect());
    }
    Ok(())
}

impl<'a> Parser<'a> {
    /// [`Parser::framed`] for the usual message, without the general reader's generality:
    /// keys without escapes, at most [`FEW_MEMBERS`] members an object, strings without
    /// escapes and short integers read directly, any other value by the general reader.
    /// `None` for anything else — a key with an escape, a repeated key, a value the general
    /// reader refuses — which [`Parser::framed`] then reads from the start, accepting or
    /// refusing it as it always has. The property `the_quick_reading_is_the_general_one`
    /// holds the two to the same answers.
    ///
    /// Written by hand, as the general reader is: with it `check_framed` takes about 2,300
    /// instructions for a usual `tools/call`, against 3,400 by the general reader alone.
    fn framed_quick(&mut self, outer: &str, hole: &str, framing: &mut Framing<'a>) -> Option<()> {
        let Framing {
            members,
            inner,
            hole: hole_span,
        } = framing;
        self.quick_object(1, members, |parser, key| {
            if key == outer && parser.peek() == Some(b'{') {
                inner.clear();
                parser.quick_object(2, inner, |parser, key| {
                    if key == hole {
                        let start = parser.pos;
                        parser.scan().ok()?;
                        *hole_span = Some(start..parser.pos);
                        Some(())
                    } else {
                        parser.quick_value(2)
                    }
                })
            } else {
                parser.quick_value(1)
            }
        })
    }

    /// An object at `depth` (the parser is at its `{`) whose members' values `value` reads,
    /// its members written into `members`; `None` as [`Parser::framed_quick`] says.
    fn quick_object(
        &mut self,
        depth: usize,
        members: &mut Spans<'a>,
        mut value: impl FnMut(&mut Self, &'a str) -> Option<()>,
    ) -> Option<()> {
        self.quick_members(depth, |parser| {
            let key = parser.quick_string()?;
            if members.len() >= FEW_MEMBERS || members.iter().any(|(k, _)| k == key) {
                return None;
            }
            parser.colon()?;
            let start = parser.pos;
            value(parser, key)?;
            members.push((Cow::Borrowed(key), start..parser.pos));
            Some(())
        })
    }

    /// The members of an object at `depth` (the parser is at it), each read by `member` from
    /// its key to the end of its value; `None` for anything else in the object's own grammar,
    /// or when `member` says `None`. The loop both quick readings share.
    fn quick_members(&mut self, depth: usize, mut member: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.peek() != Some(b'{') {
            return None;
        }
        self.enter(depth).ok()?;
        self.pos += 1;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Some(());
        }
        loop {
            self.skip_ws();
            member(self)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Moves past the `:` after a key, and the spaces around it.
    fn colon(&mut self) -> Option<()> {
        self.skip_ws();
        if self.peek() != Some(b':') {
            return None;
        }
        self.pos += 1;
        self.skip_ws();
        Some(())
    }

    /// A string without escapes (the parser is at its opening quote): its text.
    fn quick_string(&mut self) -> Option<&'a str> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.pos + 1;
        self.pos = start;
        self.skip_plain();
        if self.peek() != Some(b'"') {
            return None;
        }
        let text = self.text.get(start..self.pos)?;
        self.pos += 1;
        Some(text)
    }

    /// A member's value at `depth`: a string without escapes or an integer of at most
    /// [`QUICK_DIGITS`] digits read directly, anything else by the general reader.
    fn quick_value(&mut self, depth: usize) -> Option<()> {
        let start = self.pos;
        let quick = match self.peek() {
            Some(b'"') => self.quick_string().is_some(),
            Some(b'-' | b'0'..=b'9') => self.quick_integer(),
            _ => false,
        };
        if !quick {
            self.pos = start;
            self.value::<Check>(depth).ok()?;
        }
        Some(())
    }

    /// Moves past an integer of at most [`QUICK_DIGITS`] digits without a leading zero (but
    /// `0` itself), followed by neither a fraction nor an exponent; `false` for anything
    /// else (the position then says nothing).
    fn quick_integer(&mut self) -> bool {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let digits = self
            .bytes
            .get(self.pos..)
            .unwrap_or_default()
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let leading_zero = digits > 1 && self.peek() == Some(b'0');
        self.pos += digits;
        digits > 0
            && digits <= QUICK_DIGITS
            && !leading_zero
            && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))
    }

    /// Reads the top-level object (the parser is at its `{`), recording where each member
    /// lies; the member `outer`, when an object, is read the same way one level down, and
    /// its member `hole` is scanned.
    fn framed(&mut self, outer: &str, hole: &str) -> Result<Framing<'a>, JsonError> {
        let mut seen = None;
        let mut inner = Spans::new();
        let mut hole_span = None;
        let members = self.object_with(
            1,
            |_| Spans::new(),
            |parser, members, key, key_offset| {
                let start = parser.pos;
                let read = if key == outer && parser.peek() == Some(b'{') {
                    parser
                        .framed_inner(hole, &mut hole_span)
                        .map(|spans| inner = spans)
                } else {
                    parser.value::<Check>(1)
                };
                if let Err(e) = read {
                    return Err(e.within(key.into_owned()));
                }
                add_span(members, &mut seen, key, start..parser.pos)
                    .map_err(|key| duplicate_key(key_offset, key))
            },
        )?;
        Ok(Framing {
            members,
            inner,
            hole: hole_span,
        })
    }

    /// Reads the object `outer` (the parser is at its `{`), scanning `hole`.
    fn framed_inner(
        &mut self,
        hole: &str,
        hole_span: &mut Option<Range<usize>>,
    ) -> Result<Spans<'a>, JsonError> {
        let mut seen = None;
        self.object_with(
            2,
            |_| Spans::new(),
            |parser, members, key, key_offset| {
                let start = parser.pos;
                let read = if key == hole {
                    parser.scan()
                } else {
                    parser.value::<Check>(2)
                };
                if let Err(e) = read {
                    return Err(e.within(key.into_owned()));
                }
                if key == hole {
                    *hole_span = Some(start..parser.pos);
                }
                add_span(members, &mut seen, key, start..parser.pos)
                    .map_err(|key| duplicate_key(key_offset, key))
            },
        )
    }

    /// Moves past one value, reading its grammar only: no duplicate-key, number-range,
    /// surrogate or depth check. Iterative (a stack of the closers expected), so any nesting
    /// the input holds is read without recursing.
    fn scan(&mut self) -> Result<(), JsonError> {
        let mut open = Closers::default();
        loop {
            // At a value.
            self.skip_ws();
            match self.peek() {
                Some(b'{') => {
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                    } else {
                        open.push(b'}');
                        self.scan_key()?;
                        continue;
                    }
                }
                Some(b'[') => {
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                    } else {
                        open.push(b']');
                        continue;
                    }
                }
                Some(b'"') => self.scan_string()?,
                Some(b't') => self.literal("true", ())?,
                Some(b'f') => self.literal("false", ())?,
                Some(b'n') => self.literal("null", ())?,
                Some(b'-' | b'0'..=b'9') => {
                    self.number_grammar()?;
                }
                Some(_) => return Err(self.syntax("expected a JSON value")),
                None => return Err(self.syntax("unexpected end of document")),
            }
            // After a value: close what it ends, up to the next value.
            loop {
                let Some(closer) = open.last() else {
                    return Ok(());
                };
                self.skip_ws();
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if closer == b'}' {
                            self.skip_ws();
                            self.scan_key()?;
                        }
                        break;
                    }
                    Some(c) if c == closer => {
                        self.pos += 1;
                        open.pop();
                    }
                    _ if closer == b'}' => return Err(self.syntax("expected ',' or '}' in an object")),
                    _ => return Err(self.syntax("expected ',' or ']' in an array")),
                }
            }
        }
    }

    /// Moves past an object key and its `:` (the parser is at the key).
    fn scan_key(&mut self) -> Result<(), JsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.syntax("expected a string key"));
        }
        self.scan_string()?;
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(self.syntax("expected ':' after an object key"));
        }
        self.pos += 1;
        Ok(())
    }

    /// Moves past a string (the parser is at its opening quote): escapes are read for their
    /// extent (`\uXXXX` needs four hex digits), not decoded.
    fn scan_string(&mut self) -> Result<(), JsonError> {
        self.pos += 1;
        loop {
            self.skip_plain();
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.pos += 1,
                        Some(b'u') => {
                            self.pos += 1;
                            self.hex4()?;
                        }
                        _ => return Err(self.syntax("invalid escape sequence")),
                    }
                }
                Some(_) => return Err(self.syntax("control character in a string must be escaped")),
                None => return Err(self.syntax("unterminated string")),
            }
        }
    }
}

/// Where the parts of a plain JSON-RPC request lie in its text (see [`check_plain_request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainRequest {
    /// The value of `id` as written: an integer of at most 15 digits, or a string without
    /// escapes (its quotes included).
    pub id: Range<usize>,
    /// The text of `params.name`, between its quotes (it has no escapes).
    pub name: Range<usize>,
    /// `params.arguments`, an object, when present: scanned, not checked (see
    /// [`check_framed`]).
    pub arguments: Option<Range<usize>>,
    /// `params._meta`, an object, when present: checked, as the rest of the message.
    pub meta: Option<Range<usize>>,
}

/// The usual request for `method`, read in one pass that records only where its parts lie:
/// `{"jsonrpc":"2.0","id":…,"method":"<method>","params":{"name":"…","arguments":{…},
/// "_meta":{…}}}`, members in any order and spacing, `arguments` and `_meta` optional, keys and
/// `method` written without escapes, the `id` an integer of at most 15 digits or a string
/// without escapes, the name a string without escapes. Whatever it reads, [`check_framed`]
/// (with `params` and `arguments`) accepts, with the same parts, and checks as strictly: the
/// property `a_plain_request_is_framed_as_the_general_reader_frames_it` holds the two to that.
///
/// `None` for any other message, and for anything wrong, which the caller then reads with
/// [`check_framed`]: a plain request is most of a gateway's traffic, and for it this takes a
/// fraction of the general reading's instructions (no list of members, no key compared with
/// others, every key matched with the few it can be). Written by hand, as the rest of this
/// parser.
pub fn check_plain_request(text: &str, limits: Limits, method: &str) -> Option<PlainRequest> {
    check_size(text.as_bytes(), limits).ok()?;
    let mut parser = Parser::new(text, limits);
    let request = parser.plain_request(method)?;
    parser.finish().ok()?;
    Some(request)
}

/// The members of a plain request, and of its `params`, each a bit of a set.
const JSONRPC: u8 = 1;
const ID: u8 = 2;
const METHOD: u8 = 4;
const PARAMS: u8 = 8;
const NAME: u8 = 1;
const ARGUMENTS: u8 = 2;
const META: u8 = 4;

impl Parser<'_> {
    /// [`check_plain_request`] from the document's first value.
    fn plain_request(&mut self, method: &str) -> Option<PlainRequest> {
        let (mut id, mut params) = (None, None);
        let seen = self.plain_object(
            1,
            &[
                ("jsonrpc", JSONRPC),
                ("id", ID),
                ("method", METHOD),
                ("params", PARAMS),
            ],
            |parser, member| match member {
                JSONRPC => parser.exact_string("2.0"),
                ID => {
                    let start = parser.pos;
                    let read = match parser.peek() {
                        Some(b'"') => parser.quick_string().is_some(),
                        _ => parser.quick_integer(),
                    };
                    id = read.then_some(start..parser.pos);
                    read
                }
                METHOD => parser.exact_string(method),
                _ => {
                    params = parser.plain_params();
                    params.is_some()
                }
            },
        )?;
        let (name, arguments, meta) = params.filter(|_| seen == JSONRPC | ID | METHOD | PARAMS)?;
        Some(PlainRequest {
            id: id?,
            name,
            arguments,
            meta,
        })
    }

    /// The `params` of a plain request (the parser is at its value): the name's text, the
    /// arguments (scanned) and `_meta` (checked).
    #[allow(clippy::type_complexity, reason = "the three parts, named by the caller")]
    fn plain_params(&mut self) -> Option<(Range<usize>, Option<Range<usize>>, Option<Range<usize>>)> {
        let (mut name, mut arguments, mut meta) = (None, None, None);
        self.plain_object(
            2,
            &[("name", NAME), ("arguments", ARGUMENTS), ("_meta", META)],
            |parser, member| {
                let start = parser.pos;
                match member {
                    NAME => {
                        name = parser
                            .quick_string()
                            .map(|text| start + 1..start + 1 + text.len());
                        name.is_some()
                    }
                    // The arguments are scanned (as `check_framed` scans its hole), `_meta`
                    // checked; both only as objects (anything else is left to the general reader).
                    ARGUMENTS => {
                        let read = parser.peek() == Some(b'{') && parser.scan().is_ok();
                        arguments = read.then_some(start..parser.pos);
                        read
                    }
                    _ => {
                        let read = parser.peek() == Some(b'{') && parser.value::<Check>(2).is_ok();
                        meta = read.then_some(start..parser.pos);
                        read
                    }
                }
            },
        )?;
        Some((name?, arguments, meta))
    }

    /// An object at `depth` (the parser is at it) whose every key is one of `keys`, written
    /// without escapes, at most once: each member's value read by `value` (given the key's
    /// bit, `false` for a value it does not take). The set of the keys seen; `None` for any
    /// other object.
    fn plain_object(
        &mut self,
        depth: usize,
        keys: &[(&str, u8)],
        mut value: impl FnMut(&mut Self, u8) -> bool,
    ) -> Option<u8> {
        let mut seen = 0;
        self.quick_members(depth, |parser| {
            let member = parser.known_key(keys)?;
            if seen & member != 0 {
                return None;
            }
            seen |= member;
            parser.colon()?;
            value(parser, member).then_some(())
        })?;
        Some(seen)
    }

    /// The bit of the key the parser is at, when it is one of `keys` written without escapes
    /// (then the parser moves past it): the bytes between its quotes are the key itself.
    fn known_key(&mut self, keys: &[(&str, u8)]) -> Option<u8> {
        let at = self.bytes.get(self.pos..)?;
        let (&quote, rest) = at.split_first()?;
        let first = rest.first()?;
        if quote != b'"' {
            return None;
        }
        // The first byte rules out most keys before any is compared whole.
        let (key, bit) = keys.iter().find(|(key, _)| {
            key.as_bytes().first() == Some(first)
                && rest.get(..key.len()) == Some(key.as_bytes())
                && rest.get(key.len()) == Some(&b'"')
        })?;
        self.pos += key.len() + 2;
        Some(*bit)
    }

    /// Moves past the string `text` written without escapes (the parser is at a value);
    /// `false` for any other value.
    fn exact_string(&mut self, text: &str) -> bool {
        let Some(rest) = self.bytes.get(self.pos..) else {
            return false;
        };
        let exact = rest.first() == Some(&b'"')
            && rest.get(1..=text.len()) == Some(text.as_bytes())
            && rest.get(text.len() + 1) == Some(&b'"');
        if exact {
            self.pos += text.len() + 2;
        }
        exact
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

    use proptest::prelude::*;

    use super::*;
    use crate::json::check;

    const LIMITS: Limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 36,
    };

    fn framed(text: &str) -> Result<(Shape, Framing<'_>), JsonError> {
        check_framed(text, LIMITS, "params", "arguments")
    }

    fn at<'t>(text: &'t str, range: &Range<usize>) -> &'t str {
        &text[range.clone()]
    }

    #[test]
    fn members_and_the_hole_are_located() {
        let text = r#" {"id":7, "params" : {"name":"pay","arguments": {"a":1,"a":1e400,"s":"\ud800"} ,"_meta":{}},"method":"x"} "#;
        let (shape, framing) = framed(text).unwrap();
        assert_eq!(shape, Shape::Object);
        let keys: Vec<_> = framing.members.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(keys, ["id", "params", "method"]);
        assert_eq!(at(text, &framing.members[0].1), "7");
        assert_eq!(at(text, &framing.members[2].1), r#""x""#);
        let inner: Vec<_> = framing
            .inner
            .iter()
            .map(|(k, r)| (k.as_ref(), at(text, r)))
            .collect();
        assert_eq!(
            inner,
            [
                ("name", r#""pay""#),
                ("arguments", r#"{"a":1,"a":1e400,"s":"\ud800"}"#),
                ("_meta", "{}")
            ]
        );
        let hole = framing.hole.unwrap();
        assert_eq!(at(text, &hole), r#"{"a":1,"a":1e400,"s":"\ud800"}"#);
        // Strictly, the hole is what `check` refuses.
        let strict = check_hole(text.as_bytes(), hole.clone(), LIMITS).unwrap_err();
        assert_eq!(strict.kind(), JsonErrorKind::NumberOutOfRange);
        assert_eq!(strict.offset(), hole.start + r#"{"a":1,"a":"#.len());
    }

    #[test]
    fn everything_outside_the_hole_is_strict() {
        for (text, kind) in [
            (r#"{"id":1,"id":2}"#, JsonErrorKind::DuplicateKey),
            (
                r#"{"params":{"arguments":{},"arguments":{}}}"#,
                JsonErrorKind::DuplicateKey,
            ),
            (
                r#"{"params":{"name":"a","name":"b"}}"#,
                JsonErrorKind::DuplicateKey,
            ),
            (
                r#"{"params":{"_meta":{"k":1,"k":2}}}"#,
                JsonErrorKind::DuplicateKey,
            ),
            (r#"{"id":1e400}"#, JsonErrorKind::NumberOutOfRange),
            (r#"{"params":{"name":"\ud800"}}"#, JsonErrorKind::LoneSurrogate),
            (r#"{"params":1,"params":{}}"#, JsonErrorKind::DuplicateKey),
            (r#"{"params":{"arguments":{}}} x"#, JsonErrorKind::Syntax),
            (r#"{"params":{"arguments":{"a":}}}"#, JsonErrorKind::Syntax),
            (r#"{"params":{"arguments":[1,]}}"#, JsonErrorKind::Syntax),
            (r#"{"params":{"arguments":{"a":1]}}"#, JsonErrorKind::Syntax),
            (r#"{"params":{"arguments":"\x"}}"#, JsonErrorKind::Syntax),
            (r#"{"params":{"arguments":01}}"#, JsonErrorKind::Syntax),
        ] {
            assert_eq!(framed(text).unwrap_err().kind(), kind, "{text}");
        }
        // Depth counts outside the hole; inside it, only `decide` limits nesting.
        let deep = format!(
            r#"{{"params":{{"arguments":{}1{}}}}}"#,
            "[".repeat(300),
            "]".repeat(300)
        );
        assert!(framed(&deep).unwrap().1.hole.is_some());
        let deep = format!(
            r#"{{"params":{{"other":{}1{}}}}}"#,
            "[".repeat(40),
            "]".repeat(40)
        );
        assert_eq!(framed(&deep).unwrap_err().kind(), JsonErrorKind::TooDeep);
    }

    /// Both readings of `text`: the quick one (when it answers) and the general one.
    fn readings(text: &str) -> (Option<Framing<'_>>, Result<(Shape, Framing<'_>), JsonError>) {
        let mut quick = Framing::default();
        (
            check_framed_quickly(text, LIMITS, "params", "arguments", &mut quick).then_some(quick),
            check_framed_generally(text, LIMITS, "params", "arguments"),
        )
    }

    #[test]
    fn usual_messages_are_read_quickly_as_the_general_reader_reads_them() {
        for text in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}}"#,
            r#"{"jsonrpc":"2.0","id":-3,"method":"tools/call","params":{"name":"pay","arguments":{"a":[1,{"b":null}]},"_meta":{"io.warrant/idempotency_key":"k-1","progressToken":5}}}"#,
            // The order and spacing other SDKs write.
            "{\"method\": \"tools/call\", \"params\": {\"name\": \"pay\", \"arguments\": {}},\n \"jsonrpc\": \"2.0\", \"id\": \"req-\u{e9}\"}\n",
            r#"{"jsonrpc":"2.0","id":0,"method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"id":123456789012345,"params":{"arguments":1e400,"x":[true,false]}}"#,
            // Values the quick reading leaves to the general reader, in a message it reads.
            r#"{"id":1234567890123456,"params":{"name":"a\"b","x":1.5e3}}"#,
        ] {
            let (fast, general) = readings(text);
            let fast = fast.unwrap_or_else(|| panic!("not read quickly: {text}"));
            assert_eq!(general.unwrap(), (Shape::Object, fast.clone()), "{text}");
            assert_eq!(check_framed(text, LIMITS, "params", "arguments").unwrap().1, fast);
        }
    }

    #[test]
    fn the_quick_reading_leaves_the_rest_to_the_general_one() {
        for (text, kind) in [
            // An escaped key: read generally (and `\u0069d` is `id`, so this is a repeat).
            (r#"{"id":1,"\u0069d":2}"#, Some(JsonErrorKind::DuplicateKey)),
            (
                r#"{"id":1,"params":{"name":"a","name":"a"}}"#,
                Some(JsonErrorKind::DuplicateKey),
            ),
            (
                r#"{"id":99999999999999999999}"#,
                Some(JsonErrorKind::NumberOutOfRange),
            ),
            (r#"{"id":01}"#, Some(JsonErrorKind::Syntax)),
            (r#"{"id":-}"#, Some(JsonErrorKind::Syntax)),
            (
                r#"{"params":{"name":"\ud800"}}"#,
                Some(JsonErrorKind::LoneSurrogate),
            ),
            (r#"{"params":{"arguments":{"a":1]}}"#, Some(JsonErrorKind::Syntax)),
            (r#"{"id":1} x"#, Some(JsonErrorKind::Syntax)),
            ("{\"m\":\"a\tb\"}", Some(JsonErrorKind::Syntax)),
        ] {
            let (fast, general) = readings(text);
            assert!(fast.is_none(), "read quickly: {text}");
            assert_eq!(general.as_ref().err().map(JsonError::kind), kind, "{text}");
            assert_eq!(
                check_framed(text, LIMITS, "params", "arguments").map_err(|e| e.kind()),
                general.map_err(|e| e.kind()),
                "{text}"
            );
        }
        // More members than an object is read quickly with.
        let members: Vec<String> = (0..=FEW_MEMBERS).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let text = format!("{{{}}}", members.join(","));
        let (fast, general) = readings(&text);
        assert!(fast.is_none() && general.is_ok());
    }

    /// The framing [`check_framed`] gives a message [`check_plain_request`] reads as `request`:
    /// the four members, the three of `params` at most, and nothing else.
    fn expected_framing<'t>(text: &'t str, request: &PlainRequest) -> Vec<(&'t str, &'t str)> {
        let mut parts = vec![
            ("id", at(text, &request.id)),
            ("name", &text[request.name.start - 1..request.name.end + 1]),
        ];
        parts.extend(request.arguments.as_ref().map(|r| ("arguments", at(text, r))));
        parts.extend(request.meta.as_ref().map(|r| ("_meta", at(text, r))));
        parts.sort_unstable();
        parts
    }

    /// What the general reader framed of a message, as [`expected_framing`] lists it; `None`
    /// when its framing is not that of a plain request for `tools/call`.
    fn general_parts(text: &str) -> Option<Vec<(&str, &str)>> {
        let (shape, framing) = check_framed_generally(text, LIMITS, "params", "arguments").ok()?;
        let value =
            |spans: &Spans<'_>, key: &str| spans.iter().find(|(k, _)| k == key).map(|(_, r)| at(text, r));
        let plain = shape == Shape::Object
            && framing.members.len() == 4
            && value(&framing.members, "jsonrpc") == Some(r#""2.0""#)
            && value(&framing.members, "method") == Some(r#""tools/call""#)
            && value(&framing.members, "params").is_some()
            && framing
                .inner
                .iter()
                .all(|(k, _)| ["name", "arguments", "_meta"].contains(&k.as_ref()));
        let mut parts = vec![("id", value(&framing.members, "id")?)];
        for (key, range) in &framing.inner {
            let key: &str = match key.as_ref() {
                "name" => "name",
                "arguments" => "arguments",
                _ => "_meta",
            };
            parts.push((key, at(text, range)));
        }
        parts.sort_unstable();
        plain.then_some(parts)
    }

    /// Plain requests: members in the usual order and others, spacing, `_meta` nested, names
    /// and ids beyond ASCII.
    const PLAIN_REQUESTS: &[&str] = &[
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}}"#,
        r#"{"jsonrpc":"2.0","id":-3,"method":"tools/call","params":{"name":"pay","arguments":{"a":[1,{"b":null}],"a":1e400},"_meta":{"io.warrant/idempotency_key":"k-1","progressToken":5}}}"#,
        "{\"method\": \"tools/call\", \"params\": {\"_meta\": {}, \"name\": \"pay\"},\n \"jsonrpc\": \"2.0\", \"id\": \"req-\u{e9}\"}\n",
        r#"{"jsonrpc":"2.0","id":123456789012345,"method":"tools/call","params":{"name":"","arguments":{}}}"#,
        "{ \"params\" : { \"arguments\" : { \"k\" : [ ] } , \"name\" : \"caf\u{e9} \u{1f600}\" , \"_meta\" : { \"a\" : { \"b\" : [ 1 , 2.5 ] } } } , \"id\" : 0 , \"method\" : \"tools/call\" , \"jsonrpc\" : \"2.0\" }",
    ];

    #[test]
    fn plain_requests_are_read_in_one_pass() {
        for text in PLAIN_REQUESTS
            .iter()
            .copied()
            .chain([r#"{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"x"}}"#])
        {
            let request = check_plain_request(text, LIMITS, "tools/call")
                .unwrap_or_else(|| panic!("not read in one pass: {text}"));
            assert_eq!(
                general_parts(text),
                Some(expected_framing(text, &request)),
                "{text}"
            );
        }
    }

    #[test]
    fn anything_else_is_left_to_the_general_reader() {
        for text in [
            // Another method, another version, a spelling with an escape.
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"1.0","id":7,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools\/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","\u0069d":7,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"p\u0061y"}}"#,
            // A member missing, repeated or unknown.
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"id":8,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","task":{}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a"},"x":1}"#,
            // Values it does not take, right or wrong.
            r#"{"jsonrpc":"2.0","id":1234567890123456,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":01,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","arguments":null}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","arguments":{"a":}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","_meta":{"k":1,"k":2}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","_meta":[]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":[]}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a"}} x"#,
            "{\"jsonrpc\":\"2.0\",\"id\":\"a\tb\",\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
            "[]",
            "{}",
        ] {
            assert_eq!(check_plain_request(text, LIMITS, "tools/call"), None, "{text}");
        }
        // Under a depth limit the general reader refuses it by.
        let text =
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","_meta":{"k":{"j":1}}}}"#;
        for depth in 0..4 {
            let limits = Limits {
                max_depth: depth,
                ..LIMITS
            };
            assert_eq!(check_plain_request(text, limits, "tools/call"), None, "{depth}");
            assert!(check_framed_generally(text, limits, "params", "arguments").is_err());
        }
        let limits = Limits {
            max_depth: 4,
            ..LIMITS
        };
        assert!(check_plain_request(text, limits, "tools/call").is_some());
        // Over the size limit.
        let text = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a"}}"#;
        let small = Limits {
            max_bytes: text.len() - 1,
            ..LIMITS
        };
        assert!(check_plain_request(text, LIMITS, "tools/call").is_some());
        assert_eq!(check_plain_request(text, small, "tools/call"), None);
    }

    #[test]
    fn no_cut_of_a_plain_request_is_one() {
        let text = r#"{"jsonrpc":"2.0","id":-12,"method":"tools/call","params":{"name":"pay","arguments":{"a":[1,{"b":"c"}]},"_meta":{"k":"v"}}}"#;
        assert!(check_plain_request(text, LIMITS, "tools/call").is_some());
        for end in 0..text.len() {
            assert_eq!(
                check_plain_request(&text[..end], LIMITS, "tools/call"),
                None,
                "{end}"
            );
            let mut cut = text.to_owned();
            cut.remove(end);
            if let Some(request) = check_plain_request(&cut, LIMITS, "tools/call") {
                assert_eq!(
                    general_parts(&cut),
                    Some(expected_framing(&cut, &request)),
                    "{cut}"
                );
            }
        }
    }

    /// JSON-RPC requests whose every member may be plain or not: the version, the id, the
    /// method, the name, the arguments and `_meta` (values right and wrong), members missing,
    /// repeated or unknown, in any order, with any spacing.
    fn requests() -> impl Strategy<Value = String> {
        let pick = |options: &'static [&'static str]| proptest::sample::select(options);
        let space = pick(&["", " ", "\n\t "]);
        // Each member with the chance it is there; the plain values are listed more often.
        let member = |key: &'static str, values: &'static [&'static str], chance: f64| {
            (
                Just(key),
                proptest::sample::select(values),
                prop::bool::weighted(chance),
            )
        };
        let inner = (
            member(
                "name",
                &[
                    r#""pay""#,
                    r#""pay""#,
                    r#""pay""#,
                    r#""p\u0061y""#,
                    "7",
                    r#""\ud800""#,
                    "\"a\tb\"",
                ],
                0.9,
            ),
            member(
                "arguments",
                &[
                    "{}",
                    r#"{"a":1,"a":2}"#,
                    r#"{"n":1e400}"#,
                    "null",
                    "[1]",
                    r#"{"a":}"#,
                    r#"{"a":[1,{"b":"\ud800"}]}"#,
                ],
                0.7,
            ),
            member(
                "_meta",
                &[
                    "{}",
                    r#"{"k":"v"}"#,
                    r#"{"k":1,"k":2}"#,
                    "[]",
                    r#"{"k":[1e400]}"#,
                    r#"{"k":"\u00e9"}"#,
                ],
                0.5,
            ),
            member("task", &["{}"], 0.15),
        )
            .prop_map(|(a, b, c, d)| vec![a, b, c, d]);
        let object = |members: Vec<(&'static str, String, bool)>, space: &str| {
            let parts: Vec<String> = members
                .into_iter()
                .filter(|(_, _, present)| *present)
                .map(|(k, v, _)| format!("\"{k}\"{space}:{space}{v}"))
                .collect();
            format!("{{{space}{}{space}}}", parts.join(","))
        };
        (
            inner.prop_shuffle(),
            member(
                "jsonrpc",
                &[r#""2.0""#, r#""2.0""#, r#""2.0""#, r#""1.0""#, "2"],
                0.9,
            ),
            member(
                "id",
                &[
                    "7",
                    "-0",
                    "123456789012345",
                    "1234567890123456",
                    r#""a""#,
                    r#""a\"b""#,
                    "1.5",
                    "null",
                    "01",
                    "12",
                    r#""b""#,
                ],
                1.0,
            ),
            member(
                "method",
                &[
                    r#""tools/call""#,
                    r#""tools/call""#,
                    r#""tools/call""#,
                    r#""tools\/call""#,
                    r#""tools/list""#,
                ],
                1.0,
            ),
            member("id", &["8"], 0.2),
            any::<prop::sample::Index>(),
            space,
            pick(&["", " \n", "", " x"]),
        )
            .prop_map(move |(inner, jsonrpc, id, method, again, at, space, tail)| {
                let params = (
                    "params",
                    object(
                        inner.into_iter().map(|(k, v, p)| (k, v.to_owned(), p)).collect(),
                        space,
                    ),
                    true,
                );
                let mut members: Vec<(&'static str, String, bool)> = vec![
                    (jsonrpc.0, jsonrpc.1.to_owned(), jsonrpc.2),
                    (id.0, id.1.to_owned(), true),
                    (method.0, method.1.to_owned(), true),
                    params,
                ];
                // Now and then a member repeated, at some place.
                if again.2 {
                    members.insert(at.index(members.len()), (again.0, again.1.to_owned(), true));
                }
                let rotate = at.index(members.len());
                members.rotate_left(rotate);
                format!("{}{tail}", object(members, space))
            })
    }

    proptest! {
        // About one message in forty is a plain request: enough cases for a hundred of them.
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Whatever the one-pass reading takes, the general reader accepts with the same parts.
        #[test]
        fn a_plain_request_is_framed_as_the_general_reader_frames_it(text in requests()) {
            if let Some(request) = check_plain_request(&text, LIMITS, "tools/call") {
                prop_assert_eq!(general_parts(&text), Some(expected_framing(&text, &request)), "{}", text);
            }
        }

        /// A plain request with one byte changed, under any depth limit: read or left, never
        /// a panic; what is read is framed alike, and only what the general reader accepts.
        #[test]
        fn a_request_with_a_byte_changed_is_read_or_left(
            base in proptest::sample::select(PLAIN_REQUESTS),
            at in any::<prop::sample::Index>(),
            byte in proptest::sample::select(b"{}[]\":, \t\\0123456789-.eEnultrsfa_u\x01\xc3\xa9".to_vec()),
            depth in 0_usize..5,
        ) {
            let mut bytes = base.as_bytes().to_vec();
            let at = at.index(bytes.len());
            bytes[at] = byte;
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let limits = Limits { max_depth: depth, ..LIMITS };
                if let Some(request) = check_plain_request(text, limits, "tools/call") {
                    let (shape, general) = check_framed_generally(text, limits, "params", "arguments").unwrap();
                    prop_assert_eq!(shape, Shape::Object);
                    prop_assert_eq!(general_parts(text), Some(expected_framing(text, &request)), "{}", text);
                    prop_assert!(general.hole == request.arguments);
                }
            }
        }
    }

    /// JSON-RPC-like messages: the members a call has and others, keys plain and escaped,
    /// values of every kind the quick reading takes or leaves, spacing.
    fn messages() -> impl Strategy<Value = String> {
        let space = prop_oneof![Just(""), Just(" "), Just("\n\t ")];
        let scalar = prop_oneof![
            Just("0"),
            Just("-0"),
            Just("-12"),
            Just("01"),
            Just("-"),
            Just("123456789012345"),
            Just("1234567890123456"),
            Just("99999999999999999999"),
            Just("1.5"),
            Just("1e3"),
            Just("2E1"),
            Just("true"),
            Just("nul"),
            Just("null"),
            Just(r#""tools/call""#),
            Just(r#""2.0""#),
            Just(r#""a\"b""#),
            Just(r#""\ud800""#),
            Just("\"tab\there\""),
            Just(r#"{"k":1,"k":2}"#),
            Just(r#"{"k":[1,{"j":"\u00e9"}]}"#),
            Just("[1,]"),
            Just("{}"),
            Just("[]"),
        ]
        .prop_map(str::to_owned);
        let key = prop_oneof![
            Just("jsonrpc"),
            Just("id"),
            Just("method"),
            Just("params"),
            Just("name"),
            Just("arguments"),
            Just("_meta"),
            Just(r"\u0069d"),
            Just("x"),
        ];
        let object = |members: Vec<(&str, &str, String)>| {
            let members: Vec<String> = members
                .into_iter()
                .map(|(k, space, v)| format!("\"{k}\"{space}:{space}{v}"))
                .collect();
            format!("{{{}}}", members.join(","))
        };
        let inner =
            prop::collection::vec((key.clone(), space.clone(), scalar.clone()), 0..5).prop_map(object);
        let value = prop_oneof![scalar, inner];
        (
            prop::collection::vec((key, space, value), 0..6).prop_map(object),
            prop_oneof![Just(""), Just(" \n"), Just(" x")],
        )
            .prop_map(|(message, tail)| format!("{message}{tail}"))
    }

    proptest! {
        /// Whenever the quick reading answers, the general reader accepts the message with
        /// the same framing.
        #[test]
        fn the_quick_reading_is_the_general_one(text in prop_oneof![messages(), documents()]) {
            let (fast, general) = readings(&text);
            if let Some(fast) = fast {
                prop_assert_eq!(general, Ok((Shape::Object, fast)));
            }
        }
    }

    #[test]
    fn the_scan_matches_closers_at_every_depth() {
        // Objects and arrays alternate, around the levels the scan keeps in place and beyond.
        for depth in [1, 31, 32, 33, 34, 65, 200] {
            let (mut open, mut close) = (String::new(), String::new());
            for level in 0..depth {
                if level % 2 == 0 {
                    open.push_str(r#"{"k":"#);
                    close.insert(0, '}');
                } else {
                    open.push('[');
                    close.insert(0, ']');
                }
            }
            let arguments = format!("{open}1{close}");
            let text = format!(r#"{{"params":{{"arguments":{arguments},"name":"n"}}}}"#);
            let (_, framing) = framed(&text).unwrap();
            assert_eq!(at(&text, &framing.hole.unwrap()), arguments, "{depth}");
            // The wrong closer at any level is refused.
            for level in [0, depth / 2, depth - 1] {
                let mut wrong: Vec<char> = close.chars().collect();
                wrong[level] = if wrong[level] == '}' { ']' } else { '}' };
                let wrong: String = wrong.into_iter().collect();
                let text = format!(r#"{{"params":{{"arguments":{open}1{wrong}}}}}"#);
                assert_eq!(
                    framed(&text).unwrap_err().kind(),
                    JsonErrorKind::Syntax,
                    "{depth} {level}"
                );
            }
        }
    }

    #[test]
    fn many_members_are_checked_for_repeats() {
        let members: Vec<String> = (0..40).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let text = format!(r#"{{"params":{{{}}},{}}}"#, members.join(","), members.join(","));
        let (_, framing) = framed(&text).unwrap();
        assert_eq!((framing.members.len(), framing.inner.len()), (41, 40));
        for repeat in [r#""k3":0"#, r#""k39":0"#, r#""params":0"#] {
            let text = format!(
                r#"{{"params":{{{}}},{},{repeat}}}"#,
                members.join(","),
                members.join(",")
            );
            assert_eq!(
                framed(&text).unwrap_err().kind(),
                JsonErrorKind::DuplicateKey,
                "{repeat}"
            );
        }
        for repeat in [r#""k3":0"#, r#""k39":0"#] {
            let text = format!(r#"{{"params":{{{},{repeat}}}}}"#, members.join(","));
            assert_eq!(
                framed(&text).unwrap_err().kind(),
                JsonErrorKind::DuplicateKey,
                "{repeat}"
            );
        }
    }

    #[test]
    fn other_documents_are_checked_whole() {
        assert_eq!(framed("[1,2]").unwrap().0, Shape::Array);
        assert_eq!(framed("5").unwrap().0, Shape::Scalar);
        assert_eq!(
            framed(r#"[{"a":1,"a":2}]"#).unwrap_err().kind(),
            JsonErrorKind::DuplicateKey
        );
        // `params` that is not an object has no inner members and no hole.
        let (_, framing) = framed(r#"{"params":[{"arguments":1}]}"#).unwrap();
        assert!(framing.inner.is_empty() && framing.hole.is_none());
    }

    /// JSON text whose hole may hold anything a scan reads, and whose other parts may break
    /// any rule.
    fn documents() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("1".to_owned()),
            Just("-0.5e3".to_owned()),
            Just("1e400".to_owned()),
            Just("01".to_owned()),
            Just(r#""a\u00e9""#.to_owned()),
            Just(r#""\ud800""#.to_owned()),
            Just(r#""\q""#.to_owned()),
            Just("true".to_owned()),
            Just("nul".to_owned()),
        ];
        let value = leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(
                    (prop_oneof![Just("a"), Just("b"), Just("arguments")], inner),
                    0..4
                )
                .prop_map(|m| {
                    let members: Vec<String> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        });
        (value.clone(), value).prop_map(|(arguments, other)| {
            format!(r#"{{"id":1,"params":{{"name":"t","arguments":{arguments},"x":{other}}}}}"#)
        })
    }

    proptest! {
        /// Reading the message with its hole scanned, then the hole strictly, refuses exactly
        /// what `check` refuses; and the hole replaced by `{}` passes `check` exactly when the
        /// framed reading does.
        #[test]
        fn framing_then_the_hole_is_check(text in documents()) {
            let whole = check(text.as_bytes(), LIMITS);
            let framed = framed(&text);
            match &framed {
                Ok((_, framing)) => {
                    let hole = framing.hole.clone().unwrap();
                    let strict = check_hole(text.as_bytes(), hole.clone(), LIMITS);
                    prop_assert_eq!(strict.is_ok(), whole.is_ok(), "{}", text);
                    let mut replaced = text.clone();
                    replaced.replace_range(hole, "{}");
                    prop_assert!(check(replaced.as_bytes(), LIMITS).is_ok(), "{}", replaced);
                }
                Err(_) => prop_assert!(whole.is_err(), "{}", text),
            }
        }
    }
}
