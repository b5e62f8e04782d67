//! The one schema walk: which nodes of an input schema apply to which parts of a valid
//! instance. Every consumer of Warrant's schema annotations (`x-warrant-allowlist`,
//! `x-warrant-sensitive`) goes through it: the guard, the redaction, the registration lint's
//! placement check, and the registration check of adapters that read particular fields
//! (`send_email`'s recipients).
//!
//! **Semantics.** Those of JSON Schema 2020-12 annotation collection, which the property tests
//! hold against `jsonschema`'s own evaluation: a node applies at an instance location when it is
//! evaluated there and it, and every schema on the way to it, validates. For a valid instance:
//! - `properties`, `additionalProperties` (the members `properties` does not name),
//!   `prefixItems` and `items` (the indices past `prefixItems`) descend into the value;
//! - a local `$ref`, every `allOf` branch, and each `dependentSchemas` entry whose member is
//!   present apply to the same value;
//! - `anyOf`/`oneOf`: the branches that validate the value, and `if`/`then`/`else`: `then` when
//!   `if` validates the value, `else` otherwise — both decided by `jsonschema` itself, with the
//!   same options (strict integers included) as the contract's validator.
//!
//! Everything else is never followed, and the lint refuses an annotation there: `not` (a
//! passing `not` has a failing subschema, which collects nothing), `if` itself, `contains`,
//! `propertyNames` (it sees keys, not values), `unevaluatedItems`, `unevaluatedProperties`,
//! `contentSchema`, and any `$defs` entry no `$ref` reaches.
//!
//! *Why the branches that validate, not every branch:* checking a value against a branch that
//! does not describe it would refuse legitimate calls (one allow-list per branch of a
//! discriminated union), while the walk still never skips a node that applies; adapters that
//! need a field guarded in *every* valid call ask [`Walker::guards_member`] at registration.
//!
//! **Fail closed.** The walk is bounded ([`MAX_DEPTH`] levels of instance nesting,
//! [`MAX_STEPS`] node applications); past either it is a [`WalkOverflow`], which callers turn
//! into a refusal, never into success. A node reached twice at one location (two branches
//! naming one definition) is walked once: its applications there are the same both times.
//! Registration refuses a schema whose references apply a node in place to the value it is
//! already applied to (its meaning is undefined); the walk still terminates on one.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde_json::{Map, Value};

use crate::decision::{RejectCode, Rejection};
use crate::json::push_pointer_segment;

/// Instance nesting the walk follows under annotated nodes (proposals nest at most 32 deep).
pub const MAX_DEPTH: usize = 64;

/// Node applications one walk may make before it refuses.
pub const MAX_STEPS: usize = 100_000;

/// The annotation that guards a field with a tenant allow-list.
pub const ALLOWLIST: &str = "x-warrant-allowlist";

/// The annotation that keeps a field's value out of storage.
pub const SENSITIVE: &str = "x-warrant-sensitive";

/// Characters escaped when a JSON pointer becomes a URI fragment (RFC 3986 `fragment`).
const FRAGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Whether a subschema validates a value: the contract's own validator options, compiled for
/// the subschema at a pointer of the input schema.
pub type Test = Arc<jsonschema::Validator>;

/// How an in-place applicator decides whether its subschema applies.
#[derive(Debug, Clone)]
enum InPlace {
    /// `$ref`, an `allOf` branch: always.
    Always(usize),
    /// An `anyOf` or `oneOf` branch: when it validates the value.
    IfValid { node: usize, test: Option<Test> },
    /// `if`/`then`/`else`: `then` when the `if` subschema (at `test_at`) validates the value.
    Condition {
        test_at: String,
        test: Option<Test>,
        then: Option<usize>,
        otherwise: Option<usize>,
    },
    /// A `dependentSchemas` entry: when the member is present.
    Dependent { member: String, node: usize },
}

/// One node of the input schema, as the walk sees it.
#[derive(Debug, Clone)]
pub struct SchemaNode {
    pointer: String,
    allowlist: Option<String>,
    sensitive: bool,
    annotated: bool,
    /// `additionalProperties: false` or the schema `false` (members it does not name are refused).
    closed: bool,
    is_false: bool,
    in_place: Vec<InPlace>,
    /// Sorted by name.
    properties: Vec<(String, usize)>,
    additional: Option<usize>,
    prefix: Vec<usize>,
    items: Option<usize>,
    /// Whether an annotated node can be reached from here (the walk skips the rest).
    reaches: bool,
}

impl SchemaNode {
    fn new(pointer: String) -> Self {
        SchemaNode {
            pointer,
            allowlist: None,
            sensitive: false,
            annotated: false,
            closed: false,
            is_false: false,
            in_place: Vec::new(),
            properties: Vec::new(),
            additional: None,
            prefix: Vec::new(),
            items: None,
            reaches: false,
        }
    }

    /// The RFC 6901 pointer of the node within the input schema (`""` for its root).
    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    /// The allow-list named by `x-warrant-allowlist`, if any.
    pub fn allowlist(&self) -> Option<&str> {
        self.allowlist.as_deref()
    }

    /// Whether the node is marked `x-warrant-sensitive: true`.
    pub fn sensitive(&self) -> bool {
        self.sensitive
    }

    fn property(&self, name: &str) -> Option<usize> {
        self.properties
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .and_then(|i| self.properties.get(i))
            .map(|(_, id)| *id)
    }

    /// The nodes this one applies directly to `name`'s value (`properties`, else
    /// `additionalProperties`).
    fn member(&self, name: &str) -> Option<usize> {
        self.property(name).or(self.additional)
    }

    fn edges(&self) -> impl Iterator<Item = usize> + '_ {
        let in_place = self.in_place.iter().flat_map(|step| {
            let (a, b) = match step {
                InPlace::Always(n)
                | InPlace::IfValid { node: n, .. }
                | InPlace::Dependent { node: n, .. } => (Some(*n), None),
                InPlace::Condition { then, otherwise, .. } => (*then, *otherwise),
            };
            a.into_iter().chain(b)
        });
        in_place
            .chain(self.properties.iter().map(|(_, id)| *id))
            .chain(self.additional)
            .chain(self.prefix.iter().copied())
            .chain(self.items)
    }
}

/// A problem found while reading the schema's applicators, at a pointer within the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanProblem {
    /// Where (within the input schema).
    pub pointer: String,
    /// What.
    pub message: String,
}

/// A `$ref` of the schema: where it is written and the node it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The pointer of the `$ref` keyword.
    pub at: String,
    /// The canonical pointer of its target.
    pub target: String,
}

/// The walk over one input schema.
#[derive(Debug, Clone)]
pub struct Walker {
    nodes: Vec<SchemaNode>,
    references: Vec<Reference>,
    sensitive: bool,
    allowlisted: bool,
}

/// The value a schema node applies to.
#[derive(Debug, Clone, Copy)]
pub enum Instance<'v> {
    /// The arguments object itself (the root of the input schema).
    Arguments(&'v Map<String, Value>),
    /// A value inside it.
    Value(&'v Value),
}

impl<'v> Instance<'v> {
    /// The value as a JSON value (the arguments object is copied).
    pub fn to_value(self) -> Cow<'v, Value> {
        match self {
            Instance::Arguments(map) => Cow::Owned(Value::Object(map.clone())),
            Instance::Value(v) => Cow::Borrowed(v),
        }
    }

    fn as_object(self) -> Option<&'v Map<String, Value>> {
        match self {
            Instance::Arguments(map) => Some(map),
            Instance::Value(v) => v.as_object(),
        }
    }

    fn as_array(self) -> Option<&'v Vec<Value>> {
        match self {
            Instance::Arguments(_) => None,
            Instance::Value(v) => v.as_array(),
        }
    }
}

/// One annotated node applied to one value.
#[derive(Debug, Clone)]
pub struct Hit<'w, 'v> {
    pointer: String,
    node: &'w SchemaNode,
    value: Instance<'v>,
}

impl<'w, 'v> Hit<'w, 'v> {
    /// Where in the instance (RFC 6901, relative to the walked value).
    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    /// The schema node.
    pub fn node(&self) -> &'w SchemaNode {
        self.node
    }

    /// The value it applies to.
    pub fn value(&self) -> Instance<'v> {
        self.value
    }
}

/// Every annotated node applied to a valid instance, in walk order.
#[derive(Debug, Clone, Default)]
pub struct Annotations<'w, 'v> {
    hits: Vec<Hit<'w, 'v>>,
}

impl<'w, 'v> Annotations<'w, 'v> {
    /// No annotation applies.
    pub fn is_empty(&self) -> bool {
        self.hits.is_empty()
    }

    /// Every hit, in walk order.
    pub fn hits(&self) -> &[Hit<'w, 'v>] {
        &self.hits
    }

    /// Whether a sensitive node applies anywhere.
    pub fn any_sensitive(&self) -> bool {
        self.hits.iter().any(|h| h.node.sensitive)
    }
}

/// Why a walk stopped: callers refuse the call (the walk never ends in a silent success).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkOverflow {
    /// The instance nests deeper than [`MAX_DEPTH`] under annotated nodes.
    #[error("the arguments nest deeper than {MAX_DEPTH} levels under annotated schema nodes")]
    TooDeep {
        /// Where the walk stopped.
        pointer: String,
    },
    /// More than [`MAX_STEPS`] node applications.
    #[error("the arguments need more than {MAX_STEPS} schema node applications to check")]
    TooLarge {
        /// Where the walk stopped.
        pointer: String,
    },
}

impl WalkOverflow {
    /// The refusal of a call whose arguments overflowed the walk (`reject(schema,
    /// ARGUMENTS_TOO_COMPLEX)`), at the place it stopped.
    pub fn rejection(&self) -> Rejection {
        let (WalkOverflow::TooDeep { pointer } | WalkOverflow::TooLarge { pointer }) = self;
        Rejection::new(RejectCode::ArgumentsTooComplex, self.to_string()).at(format!("/arguments{pointer}"))
    }
}

impl Walker {
    /// Reads the applicators of `schema` (no validators: [`Walker::compile_tests`] adds them).
    ///
    /// # Errors
    /// Every `$ref` that is not local or does not resolve to a node of `schema`.
    pub fn plan(schema: &Value) -> Result<Walker, Vec<PlanProblem>> {
        Builder::new(schema).build()
    }

    /// Compiles the validators that decide `anyOf`/`oneOf` branches and `if` on the way to an
    /// annotated node, with `compile(pointer)` (the contract's validator options, for the
    /// subschema at that pointer of the input schema).
    ///
    /// # Errors
    /// The first subschema that does not compile.
    pub fn compile_tests(
        &mut self,
        compile: &mut dyn FnMut(&str) -> Result<Test, String>,
    ) -> Result<(), String> {
        let reaches: Vec<bool> = self.nodes.iter().map(|n| n.reaches).collect();
        let pointers: Vec<String> = self.nodes.iter().map(|n| n.pointer.clone()).collect();
        let wanted = |id: &Option<usize>| id.and_then(|i| reaches.get(i).copied()).unwrap_or(false);
        for node in &mut self.nodes {
            for step in &mut node.in_place {
                match step {
                    InPlace::IfValid { node: target, test } if wanted(&Some(*target)) => {
                        let at = pointers.get(*target).map(String::as_str).unwrap_or_default();
                        *test = Some(compile(at)?);
                    }
                    InPlace::Condition {
                        test_at,
                        test,
                        then,
                        otherwise,
                    } if wanted(then) || wanted(otherwise) => {
                        *test = Some(compile(test_at)?);
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Whether a branch or condition on the way to an annotated node must be decided (so
    /// [`Walker::compile_tests`] has something to compile).
    pub fn needs_tests(&self) -> bool {
        let reaches = |id: Option<usize>| id.and_then(|i| self.nodes.get(i)).is_some_and(|n| n.reaches);
        self.nodes.iter().filter(|n| n.reaches).any(|n| {
            n.in_place.iter().any(|step| match step {
                InPlace::IfValid { node, .. } => reaches(Some(*node)),
                InPlace::Condition { then, otherwise, .. } => reaches(*then) || reaches(*otherwise),
                InPlace::Always(_) | InPlace::Dependent { .. } => false,
            })
        })
    }

    /// Whether any reachable node is marked sensitive (when not, redaction is the identity).
    pub fn has_sensitive(&self) -> bool {
        self.sensitive
    }

    /// Whether any reachable node names an allow-list.
    pub fn has_allowlists(&self) -> bool {
        self.allowlisted
    }

    /// Every node the walk can reach, the root first.
    pub fn nodes(&self) -> impl Iterator<Item = &SchemaNode> {
        self.nodes.iter()
    }

    /// Every `$ref` the walk can follow.
    pub fn references(&self) -> &[Reference] {
        &self.references
    }

    /// The URI fragment of a pointer of the input schema (for `$ref`s built around it).
    pub fn fragment(pointer: &str) -> String {
        utf8_percent_encode(pointer, FRAGMENT).to_string()
    }

    /// Whether every valid arguments object either has no member `name` or has it checked by
    /// an allow-list: the root refuses the member (a closed root, or a closed node that always
    /// applies there, that does not name it), or a node that always applies to the member's
    /// value (through `properties` of a node always applying at the root, then `$ref` and
    /// `allOf`) carries `x-warrant-allowlist`. Conditional applicators (`anyOf`, `oneOf`,
    /// `then`, `else`, `dependentSchemas`) never count: they may not apply.
    pub fn guards_member(&self, name: &str) -> bool {
        let at_root = self.always(0);
        let refused = at_root.iter().any(|&id| {
            self.nodes.get(id).is_some_and(|n| {
                n.is_false
                    || (n.closed
                        && n.property(name)
                            .is_none_or(|p| self.nodes.get(p).is_some_and(|p| p.is_false)))
            })
        });
        refused
            || at_root.iter().any(|&id| {
                self.nodes
                    .get(id)
                    .and_then(|n| n.property(name))
                    .is_some_and(|member| {
                        self.always(member)
                            .iter()
                            .any(|&m| self.nodes.get(m).is_some_and(|n| n.allowlist.is_some()))
                    })
            })
    }

    /// The nodes that always apply wherever `start` does (`$ref`, `allOf`).
    fn always(&self, start: usize) -> Vec<usize> {
        let mut seen = vec![start];
        let mut work = vec![start];
        while let Some(id) = work.pop() {
            for step in self
                .nodes
                .get(id)
                .map(|n| n.in_place.as_slice())
                .unwrap_or_default()
            {
                if let InPlace::Always(next) = step
                    && !seen.contains(next)
                {
                    seen.push(*next);
                    work.push(*next);
                }
            }
        }
        seen
    }

    /// Every annotated node that applies to `arguments` (which must be valid for the schema),
    /// with where it applies.
    ///
    /// # Errors
    /// [`WalkOverflow`] past [`MAX_DEPTH`] or [`MAX_STEPS`].
    pub fn annotations<'w, 'v>(
        &'w self,
        arguments: &'v Map<String, Value>,
    ) -> Result<Annotations<'w, 'v>, WalkOverflow> {
        self.walk(Instance::Arguments(arguments))
    }

    /// [`Walker::annotations`] for any valid instance.
    ///
    /// # Errors
    /// [`WalkOverflow`] past [`MAX_DEPTH`] or [`MAX_STEPS`].
    pub fn annotations_of<'w, 'v>(
        &'w self,
        instance: &'v Value,
    ) -> Result<Annotations<'w, 'v>, WalkOverflow> {
        self.walk(Instance::Value(instance))
    }

    fn walk<'w, 'v>(&'w self, instance: Instance<'v>) -> Result<Annotations<'w, 'v>, WalkOverflow> {
        let mut out = Annotations::default();
        if !self.nodes.first().is_some_and(|n| n.reaches) {
            return Ok(out);
        }
        let mut walk = Walk {
            walker: self,
            steps: 0,
            pointer: String::new(),
            out: &mut out.hits,
        };
        walk.location(vec![0], instance, 0)?;
        Ok(out)
    }
}

struct Walk<'w, 'v, 'o> {
    walker: &'w Walker,
    steps: usize,
    pointer: String,
    out: &'o mut Vec<Hit<'w, 'v>>,
}

impl<'w, 'v> Walk<'w, 'v, '_> {
    fn node(&self, id: usize) -> Option<&'w SchemaNode> {
        self.walker.nodes.get(id).filter(|n| n.reaches)
    }

    /// Applies `start` (and everything they apply in place) to `here`, then descends.
    fn location(&mut self, start: Vec<usize>, here: Instance<'v>, depth: usize) -> Result<(), WalkOverflow> {
        if depth > MAX_DEPTH {
            return Err(WalkOverflow::TooDeep {
                pointer: self.pointer.clone(),
            });
        }
        let mut applied: Vec<&'w SchemaNode> = Vec::new();
        let mut seen: Vec<usize> = Vec::new();
        let mut work = start;
        let mut as_value: Option<Cow<'v, Value>> = None;
        while let Some(id) = work.pop() {
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            let Some(node) = self.node(id) else { continue };
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(WalkOverflow::TooLarge {
                    pointer: self.pointer.clone(),
                });
            }
            if node.annotated {
                self.out.push(Hit {
                    pointer: self.pointer.clone(),
                    node,
                    value: here,
                });
            }
            applied.push(node);
            for step in &node.in_place {
                let mut passes = |test: &Option<Test>| {
                    // INVARIANT: `compile_tests` compiled every test on the way to an annotated
                    // node; a missing one (never expected) counts as passing, which applies
                    // more annotations, never fewer.
                    test.as_ref()
                        .is_none_or(|t| t.is_valid(as_value.get_or_insert_with(|| here.to_value())))
                };
                match step {
                    InPlace::Always(next) => work.push(*next),
                    InPlace::IfValid { node: next, test } => {
                        if self.node(*next).is_some() && passes(test) {
                            work.push(*next);
                        }
                    }
                    InPlace::Condition {
                        test,
                        then,
                        otherwise,
                        ..
                    } => {
                        let wanted = |b: &Option<usize>| b.is_some_and(|b| self.node(b).is_some());
                        if wanted(then) || wanted(otherwise) {
                            let branch = if passes(test) { then } else { otherwise };
                            work.extend(*branch);
                        }
                    }
                    InPlace::Dependent { member, node: next } => {
                        if here.as_object().is_some_and(|m| m.contains_key(member)) {
                            work.push(*next);
                        }
                    }
                }
            }
        }
        if let Some(members) = here.as_object() {
            for (name, value) in members {
                let next: Vec<usize> = applied
                    .iter()
                    .filter_map(|n| n.member(name))
                    .filter(|&id| self.node(id).is_some())
                    .collect();
                if !next.is_empty() {
                    let len = self.pointer.len();
                    self.pointer.push('/');
                    push_pointer_segment(&mut self.pointer, name);
                    self.location(next, Instance::Value(value), depth + 1)?;
                    self.pointer.truncate(len);
                }
            }
        } else if let Some(items) = here.as_array() {
            for (i, item) in items.iter().enumerate() {
                let next: Vec<usize> = applied
                    .iter()
                    .filter_map(|n| n.prefix.get(i).copied().or(n.items))
                    .filter(|&id| self.node(id).is_some())
                    .collect();
                if !next.is_empty() {
                    let len = self.pointer.len();
                    self.pointer.push('/');
                    self.pointer.push_str(&i.to_string());
                    self.location(next, Instance::Value(item), depth + 1)?;
                    self.pointer.truncate(len);
                }
            }
        }
        Ok(())
    }
}

/// Reads a schema into [`SchemaNode`]s, each schema position once (iteratively: `$ref` chains
/// may be long).
struct Builder<'a> {
    root: &'a Value,
    nodes: Vec<SchemaNode>,
    index: HashMap<String, usize>,
    queue: VecDeque<(usize, &'a Value)>,
    references: Vec<Reference>,
    problems: Vec<PlanProblem>,
}

impl<'a> Builder<'a> {
    fn new(root: &'a Value) -> Self {
        Builder {
            root,
            nodes: Vec::new(),
            index: HashMap::new(),
            queue: VecDeque::new(),
            references: Vec::new(),
            problems: Vec::new(),
        }
    }

    fn id(&mut self, pointer: String, schema: &'a Value) -> usize {
        if let Some(id) = self.index.get(&pointer) {
            return *id;
        }
        let id = self.nodes.len();
        self.index.insert(pointer.clone(), id);
        self.nodes.push(SchemaNode::new(pointer));
        self.queue.push_back((id, schema));
        id
    }

    fn child(&mut self, parent: &str, path: &[&str], schema: &'a Value) -> usize {
        let mut pointer = parent.to_owned();
        for segment in path {
            pointer.push('/');
            push_pointer_segment(&mut pointer, segment);
        }
        self.id(pointer, schema)
    }

    fn build(mut self) -> Result<Walker, Vec<PlanProblem>> {
        self.id(String::new(), self.root);
        while let Some((id, schema)) = self.queue.pop_front() {
            let pointer = self.nodes.get(id).map(|n| n.pointer.clone()).unwrap_or_default();
            let mut node = self.read(&pointer, schema);
            node.pointer = pointer;
            if let Some(slot) = self.nodes.get_mut(id) {
                *slot = node;
            }
        }
        if !self.problems.is_empty() {
            return Err(self.problems);
        }
        let mut nodes = self.nodes;
        mark_reaching(&mut nodes);
        let reachable = |n: &&SchemaNode| n.reaches;
        let sensitive = nodes.iter().filter(reachable).any(|n| n.sensitive);
        let allowlisted = nodes.iter().filter(reachable).any(|n| n.allowlist.is_some());
        Ok(Walker {
            nodes,
            references: self.references,
            sensitive,
            allowlisted,
        })
    }

    fn read(&mut self, pointer: &str, schema: &'a Value) -> SchemaNode {
        let mut node = SchemaNode::new(String::new());
        let map = match schema {
            Value::Object(map) => map,
            Value::Bool(b) => {
                node.is_false = !b;
                node.closed = !b;
                return node;
            }
            _ => return node,
        };
        node.sensitive = map.get(SENSITIVE) == Some(&Value::Bool(true));
        node.allowlist = map.get(ALLOWLIST).and_then(Value::as_str).map(str::to_owned);
        node.annotated = map.contains_key(SENSITIVE) || map.contains_key(ALLOWLIST);
        node.closed = map.get("additionalProperties") == Some(&Value::Bool(false));
        // A `$ref` that is not local is the lint's own problem (and jsonschema's).
        if let Some(reference) = map
            .get("$ref")
            .and_then(Value::as_str)
            .filter(|r| r.starts_with('#'))
        {
            let at = format!("{pointer}/$ref");
            match self.resolve(reference) {
                Some((target, value)) => {
                    self.references.push(Reference {
                        at,
                        target: target.clone(),
                    });
                    let id = self.id(target, value);
                    node.in_place.push(InPlace::Always(id));
                }
                None => self.problems.push(PlanProblem {
                    pointer: at,
                    message: "`$ref` does not resolve to a node of this schema".to_owned(),
                }),
            }
        }
        if let Some(Value::Array(branches)) = map.get("allOf") {
            for (i, b) in branches.iter().enumerate() {
                let id = self.child(pointer, &["allOf", &i.to_string()], b);
                node.in_place.push(InPlace::Always(id));
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = map.get(key) {
                for (i, b) in branches.iter().enumerate() {
                    let id = self.child(pointer, &[key, &i.to_string()], b);
                    node.in_place.push(InPlace::IfValid { node: id, test: None });
                }
            }
        }
        if map.contains_key("if") {
            let then = map.get("then").map(|s| self.child(pointer, &["then"], s));
            let otherwise = map.get("else").map(|s| self.child(pointer, &["else"], s));
            if then.is_some() || otherwise.is_some() {
                let mut test_at = pointer.to_owned();
                test_at.push_str("/if");
                node.in_place.push(InPlace::Condition {
                    test_at,
                    test: None,
                    then,
                    otherwise,
                });
            }
        }
        if let Some(Value::Object(entries)) = map.get("dependentSchemas") {
            for (member, s) in entries {
                let id = self.child(pointer, &["dependentSchemas", member], s);
                node.in_place.push(InPlace::Dependent {
                    member: member.clone(),
                    node: id,
                });
            }
        }
        if let Some(Value::Object(properties)) = map.get("properties") {
            for (name, s) in properties {
                let id = self.child(pointer, &["properties", name], s);
                node.properties.push((name.clone(), id));
            }
            node.properties.sort_by(|a, b| a.0.cmp(&b.0));
        }
        if let Some(s) = map.get("additionalProperties") {
            node.additional = Some(self.child(pointer, &["additionalProperties"], s));
        }
        if let Some(Value::Array(prefix)) = map.get("prefixItems") {
            for (i, s) in prefix.iter().enumerate() {
                let id = self.child(pointer, &["prefixItems", &i.to_string()], s);
                node.prefix.push(id);
            }
        }
        if let Some(s) = map.get("items") {
            node.items = Some(self.child(pointer, &["items"], s));
        }
        node
    }

    fn resolve(&self, reference: &str) -> Option<(String, &'a Value)> {
        resolve_local(self.root, reference)
    }
}

/// A local `$ref` (`#`, `#/...`, percent-encoded or not) to the canonical pointer of its
/// target within `root`, and the target.
pub(super) fn resolve_local<'a>(root: &'a Value, reference: &str) -> Option<(String, &'a Value)> {
    let fragment = reference.strip_prefix('#')?;
    let decoded = percent_decode_str(fragment).decode_utf8().ok()?;
    if decoded.is_empty() {
        return Some((String::new(), root));
    }
    let mut at = root;
    let mut canonical = String::new();
    for raw in decoded.strip_prefix('/')?.split('/') {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        at = match at {
            Value::Object(map) => map.get(&segment)?,
            Value::Array(items) => {
                let canonical_index = segment == "0" || !segment.starts_with('0');
                items.get(segment.parse::<usize>().ok().filter(|_| canonical_index)?)?
            }
            _ => return None,
        };
        canonical.push('/');
        push_pointer_segment(&mut canonical, &segment);
    }
    Some((canonical, at))
}

/// Marks every node from which an annotated node can be reached (backwards from them).
fn mark_reaching(nodes: &mut [SchemaNode]) {
    let mut back: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (from, node) in nodes.iter().enumerate() {
        for to in node.edges() {
            if let Some(list) = back.get_mut(to) {
                list.push(from);
            }
        }
    }
    let mut work: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes.get(i).is_some_and(|n| n.annotated))
        .collect();
    while let Some(id) = work.pop() {
        match nodes.get_mut(id) {
            Some(node) if !node.reaches => node.reaches = true,
            _ => continue,
        }
        work.extend(back.get(id).into_iter().flatten().copied());
    }
}
