//! Bindings: `${input.x}`, `${steps.ID.output.x}`, `${steps.ID.arguments.x}`, alone (a typed
//! value) or inside text (a string). `$${` writes a literal `${`.
//!
//! The syntax is closed: a root other than `input` or `steps`, a step part other than `output`
//! or `arguments`, an empty or malformed segment, or an unclosed `${` is refused.
//!
//! The same syntax maps an inbound webhook event to a workflow's input or a call's arguments
//! ([`Grammar::Inbound`]): there the roots are `event` (the event's body) and `delivery` (its
//! `id` and `type`), and nothing else.

use serde_json::Value;

/// Where a bound value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Root {
    /// The run's input.
    Input,
    /// A tool step's output (typed by its contract's output schema).
    Output(String),
    /// A model step's proposal (typed by the proposed contract's input schema).
    Arguments(String),
    /// An inbound event's body (inbound mappings only).
    Event,
    /// An inbound delivery's `id` and `type` (inbound mappings only).
    Delivery,
}

/// Which roots a template may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grammar {
    /// A workflow step's bindings: `input` and `steps`.
    Workflow,
    /// An inbound source's mapping: `event` and `delivery`.
    Inbound,
}

impl Root {
    /// The step this root reads, if any.
    pub fn step(&self) -> Option<&str> {
        match self {
            Root::Input | Root::Event | Root::Delivery => None,
            Root::Output(s) | Root::Arguments(s) => Some(s),
        }
    }
}

/// One binding: a root and a path of member names below it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    /// Where the value comes from.
    pub root: Root,
    /// Member names below the root (may be empty for a whole output or proposal).
    pub path: Vec<String>,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.root {
            Root::Input => f.write_str("input")?,
            Root::Event => f.write_str("event")?,
            Root::Delivery => f.write_str("delivery")?,
            Root::Output(s) => write!(f, "steps.{s}.output")?,
            Root::Arguments(s) => write!(f, "steps.{s}.arguments")?,
        }
        for segment in &self.path {
            write!(f, ".{segment}")?;
        }
        Ok(())
    }
}

impl Reference {
    /// Reads the text between `${` and `}`.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::parse_in(text, Grammar::Workflow)
    }

    /// Reads the text between `${` and `}` under `grammar`.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse_in(text: &str, grammar: Grammar) -> Result<Self, String> {
        let segments: Vec<&str> = text.split('.').collect();
        if let Some(bad) = segments.iter().find(|s| !is_segment(s)) {
            return Err(format!(
                "`${{{text}}}`: `{bad}` is not a member name (letters, digits, `_` and `-`)"
            ));
        }
        let owned = |rest: &[&str]| rest.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        if grammar == Grammar::Inbound {
            return match segments.as_slice() {
                ["event", rest @ ..] => Ok(Reference {
                    root: Root::Event,
                    path: owned(rest),
                }),
                ["delivery", field @ ("id" | "type")] => Ok(Reference {
                    root: Root::Delivery,
                    path: owned(&[field]),
                }),
                _ => Err(format!(
                    "`${{{text}}}` is not a binding: use `event[.<field>…]`, `delivery.id` or `delivery.type`"
                )),
            };
        }
        match segments.as_slice() {
            ["input", rest @ ..] if !rest.is_empty() => Ok(Reference {
                root: Root::Input,
                path: owned(rest),
            }),
            ["steps", step, "output", rest @ ..] => Ok(Reference {
                root: Root::Output((*step).to_owned()),
                path: owned(rest),
            }),
            ["steps", step, "arguments", rest @ ..] => Ok(Reference {
                root: Root::Arguments((*step).to_owned()),
                path: owned(rest),
            }),
            _ => Err(format!(
                "`${{{text}}}` is not a binding: use `input.<field>`, `steps.<id>.output[.<field>…]` or \
                 `steps.<id>.arguments[.<field>…]`"
            )),
        }
    }

    /// The value this reference names in `scope` (`{"input": …, "steps": {id: {"output": …,
    /// "arguments": …}}}`), if present.
    pub fn lookup<'v>(&self, scope: &'v Value) -> Option<&'v Value> {
        let mut value = match &self.root {
            Root::Input => scope.get("input")?,
            Root::Output(s) => scope.get("steps")?.get(s)?.get("output")?,
            Root::Arguments(s) => scope.get("steps")?.get(s)?.get("arguments")?,
            Root::Event => scope.get("event")?,
            Root::Delivery => scope.get("delivery")?,
        };
        for segment in &self.path {
            value = match value {
                Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
                _ => value.get(segment)?,
            };
        }
        Some(value)
    }
}

fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A text with bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Literal text.
    Text(String),
    /// A bound value.
    Ref(Reference),
}

impl Template {
    /// Reads a text with `${…}` bindings.
    ///
    /// # Errors
    /// An unclosed `${` or a malformed binding.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::parse_in(text, Grammar::Workflow)
    }

    /// Reads a text with `${…}` bindings under `grammar`.
    ///
    /// # Errors
    /// An unclosed `${` or a malformed binding.
    pub fn parse_in(text: &str, grammar: Grammar) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            let (before, from) = rest.split_at(at);
            literal.push_str(before);
            if let Some(after) = from.strip_prefix("$${") {
                literal.push_str("${");
                rest = after;
            } else if let Some(after) = from.strip_prefix("${") {
                let end = after
                    .find('}')
                    .ok_or_else(|| format!("an unclosed `${{` in `{text}`"))?;
                let (inner, tail) = after.split_at(end);
                if !literal.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut literal)));
                }
                parts.push(Part::Ref(Reference::parse_in(inner.trim(), grammar)?));
                rest = tail.get(1..).unwrap_or_default();
            } else {
                literal.push('$');
                rest = from.get(1..).unwrap_or_default();
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The references, in order.
    pub fn references(&self) -> impl Iterator<Item = &Reference> {
        self.parts.iter().filter_map(|p| match p {
            Part::Ref(r) => Some(r),
            Part::Text(_) => None,
        })
    }

    /// The one reference, when the template is exactly one binding and nothing else.
    pub fn single(&self) -> Option<&Reference> {
        match self.parts.as_slice() {
            [Part::Ref(r)] => Some(r),
            _ => None,
        }
    }

    /// The text of a template without bindings (escapes resolved).
    pub fn literal(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                Part::Ref(_) => "",
            })
            .collect()
    }

    /// The text with every binding replaced by its value in `scope` (a string as is, any other
    /// value as compact JSON), or the first reference that has no value.
    ///
    /// # Errors
    /// The reference with no value in `scope`.
    pub fn render(&self, scope: &Value) -> Result<String, Reference> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Ref(r) => match r.lookup(scope) {
                    Some(Value::String(s)) => out.push_str(s),
                    Some(other) => out.push_str(&other.to_string()),
                    None => return Err(r.clone()),
                },
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn bindings_parse_and_render() {
        let t =
            Template::parse("Credit ${steps.credit.output.credit_id} for ${ input.email }, $${literal} $5")
                .unwrap();
        assert_eq!(t.references().count(), 2);
        let scope =
            json!({"input": {"email": "a@b"}, "steps": {"credit": {"output": {"credit_id": "cr_1"}}}});
        assert_eq!(t.render(&scope).unwrap(), "Credit cr_1 for a@b, ${literal} $5");
        let single = Template::parse("${steps.draft.arguments.amount_cents}").unwrap();
        assert_eq!(
            single.single(),
            Some(&Reference {
                root: Root::Arguments("draft".into()),
                path: vec!["amount_cents".into()]
            })
        );
    }

    #[test]
    fn malformed_bindings_are_refused() {
        for bad in [
            "${input}",
            "${inputs.x}",
            "${steps.a.result.x}",
            "${steps..output}",
            "${input.a b}",
            "${input.x",
            "${}",
            "${steps.a}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Any text parses or is refused without panicking; a text without `$` is itself.
        #[test]
        fn parsing_never_panics(text in ".{0,64}") {
            if let Ok(t) = Template::parse(&text)
                && !text.contains('$')
            {
                prop_assert_eq!(t.literal(), text);
            }
        }

        /// Rendering a template of literal pieces and references yields the pieces and values.
        #[test]
        fn rendering_round_trips(pieces in proptest::collection::vec(("[a-z ]{0,6}", "[a-z]{1,4}"), 1..5)) {
            let mut text = String::new();
            let mut expected = String::new();
            let mut input = serde_json::Map::new();
            for (literal, field) in &pieces {
                text.push_str(literal);
                text.push_str(&format!("${{input.{field}}}"));
                expected.push_str(literal);
                expected.push_str(&format!("<{field}>"));
                input.insert(field.clone(), json!(format!("<{field}>")));
            }
            let t = Template::parse(&text).unwrap();
            prop_assert_eq!(t.render(&json!({"input": input})).unwrap(), expected);
        }
    }
}
