//! The workflow grammar: a YAML (or JSON) document read strictly into typed steps.
//!
//! The reader is closed like the contract reader: an unknown key, a value of the wrong type, a
//! tool named without a version or content id, a duplicate step id or a malformed binding is a
//! [`Problem`] with the JSON pointer of the offending node, and every problem is reported (not
//! only the first). The document is read with the YAML 1.2 core schema (duplicate keys, aliases
//! and tags refused) by `warrant_core::yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Map, Value};
use warrant_core::contract::{DocumentFormat, parse_duration, read_document};
use warrant_core::{ContractId, Effect};

use crate::template::{Reference, Template};

/// One problem found while reading a definition: where (a JSON pointer) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// RFC 6901 pointer to the offending node (empty for the whole document).
    pub pointer: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "{at}: {}", self.message)
    }
}

/// A workflow definition as authored: the first step is the entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// The workflow's name (`[a-z][a-z0-9_]*`).
    pub name: String,
    /// Its version (≥ 1).
    pub version: u32,
    /// What it does, for people.
    pub description: String,
    /// The closed JSON Schema of a run's input (linted like a contract's input).
    pub input: Value,
    /// The effect classes whose tool steps need a covering review (Gate A). Default: `write`
    /// and `irreversible`.
    pub review_required_for: BTreeSet<EffectClass>,
    /// The steps; the first is the entry.
    pub steps: Vec<Step>,
}

impl Definition {
    /// Every tool reference the steps make (tools called and tools proposed), once each.
    pub fn tool_refs(&self) -> BTreeSet<&ToolRef> {
        self.steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Tool(t) => Some(&t.tool),
                StepKind::Model(m) => Some(&m.propose),
                _ => None,
            })
            .collect()
    }
}

/// An effect class as `review_required_for` names it (ordered, unlike [`Effect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EffectClass {
    /// `read`
    Read,
    /// `write`
    Write,
    /// `irreversible`
    Irreversible,
    /// `async`
    Async,
}

impl From<Effect> for EffectClass {
    fn from(effect: Effect) -> Self {
        match effect {
            Effect::Read => EffectClass::Read,
            Effect::Write => EffectClass::Write,
            Effect::Irreversible => EffectClass::Irreversible,
            Effect::Async => EffectClass::Async,
        }
    }
}

impl EffectClass {
    /// The name used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::Read => "read",
            EffectClass::Write => "write",
            EffectClass::Irreversible => "irreversible",
            EffectClass::Async => "async",
        }
    }
}

/// One step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Unique within the workflow (`[a-z][a-z0-9_]*`).
    pub id: String,
    /// How many times a run may enter this step; a cycle is bounded only through a step
    /// that has this bound.
    pub max_visits: Option<u32>,
    /// What the step does.
    pub kind: StepKind,
}

/// The five step kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// A model proposes a tool's arguments.
    Model(ModelStep),
    /// A governed tool call (through the same pipeline as every lane).
    Tool(ToolStep),
    /// A human review of the exact payload of the tool steps it covers.
    Review(ReviewStep),
    /// A choice by CEL conditions.
    Branch(BranchStep),
    /// The end of a run.
    End(EndStep),
}

impl StepKind {
    /// The kind's name, as the grammar spells its key.
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Model(_) => "model",
            StepKind::Tool(_) => "tool",
            StepKind::Review(_) => "review",
            StepKind::Branch(_) => "branch",
            StepKind::End(_) => "end",
        }
    }
}

/// A tool as a workflow names it: always pinned to one version or one content id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolRef {
    /// `name@version`
    Version {
        /// The contract's name (as registered; a tenant's own may be `tenant/name`).
        name: String,
        /// Its version.
        version: u32,
    },
    /// `tool-contract@sha256:…`
    Content(ContractId),
}

impl std::fmt::Display for ToolRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolRef::Version { name, version } => write!(f, "{name}@{version}"),
            ToolRef::Content(id) => write!(f, "{id}"),
        }
    }
}

impl ToolRef {
    /// Reads `name@version` or a content id; a bare name is refused.
    ///
    /// # Errors
    /// What is wrong with the text.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.starts_with("tool-contract@") {
            return ContractId::parse(text)
                .map(ToolRef::Content)
                .ok_or_else(|| format!("`{text}` is not a content id (tool-contract@sha256:<64 hex>)"));
        }
        match text.rsplit_once('@') {
            Some((name, version)) if !name.is_empty() => {
                let version = version
                    .parse::<u32>()
                    .ok()
                    .filter(|v| *v >= 1 && !version.starts_with('0'))
                    .ok_or_else(|| format!("`{text}`: the version after `@` must be a positive integer"))?;
                Ok(ToolRef::Version {
                    name: name.to_owned(),
                    version,
                })
            }
            _ => Err(format!(
                "`{text}` names a tool without a version or content id: write `{text}@<version>` or \
                 `tool-contract@sha256:…` (a published workflow pins what it calls)"
            )),
        }
    }
}

/// `model`: a chat model proposes the arguments of `propose`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelStep {
    /// The contract whose arguments the model proposes (its input schema types
    /// `${steps.ID.arguments.…}`).
    pub propose: ToolRef,
    /// The prompt, with bindings.
    pub prompt: Template,
    /// The next step.
    pub next: String,
}

/// `tool`: one governed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolStep {
    /// The contract called.
    pub tool: ToolRef,
    /// Its arguments: top-level fields, each static or bound.
    pub with: BTreeMap<String, Arg>,
    /// The next step.
    pub next: String,
}

/// One argument of a tool step.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// A value written in the definition.
    Static(Value),
    /// Exactly one binding: the bound value, with its type.
    Bound(Reference),
    /// A string with text around bindings (each bound value must be a scalar).
    Text(Template),
    /// A list whose items are written or bound (one level: `to: ["${input.email}"]`).
    List(Vec<Arg>),
}

impl Arg {
    /// The references this argument reads.
    pub fn references(&self) -> Vec<&Reference> {
        match self {
            Arg::Static(_) => Vec::new(),
            Arg::Bound(r) => vec![r],
            Arg::Text(t) => t.references().collect(),
            Arg::List(items) => items.iter().flat_map(Arg::references).collect(),
        }
    }
}

/// `review`: a human decides on the exact payload of the covered tool steps.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewStep {
    /// The tool steps whose payload this review approves.
    pub covers: Vec<String>,
    /// Who may decide.
    pub reviewers: Reviewers,
    /// How long the approval waits.
    pub expires_in: Duration,
    /// What expiry does: follow `on_reject` (the default) or fail the run.
    pub on_expiry: OnExpiry,
    /// Where an approval leads.
    pub on_approve: String,
    /// Where a rejection (or expiry) leads.
    pub on_reject: String,
}

/// What a review's expiry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExpiry {
    /// Follow `on_reject`, as a rejection would.
    #[default]
    Reject,
    /// End the run as failed.
    Fail,
}

/// Who may decide a review (policy decides too: the `review` action).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reviewers {
    /// Principals with this role.
    Role(String),
    /// These principals.
    Principals(Vec<String>),
}

/// `branch`: the first case whose condition holds, else `otherwise`.
#[derive(Debug, Clone, PartialEq)]
pub struct BranchStep {
    /// The cases, in order.
    pub cases: Vec<Case>,
    /// Where no case holds.
    pub otherwise: String,
}

/// One case of a branch.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// A CEL expression over `input` and `steps` that yields a boolean.
    pub when: String,
    /// Where it leads.
    pub next: String,
}

/// `end`: how the run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndStatus {
    /// `completed`
    Completed,
    /// `failed`
    Failed,
}

/// `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndStep {
    /// The run's final status.
    pub status: EndStatus,
}

/// How an edge leaves its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Exit {
    /// The only way on (`next`).
    Next,
    /// A review approved.
    Approve,
    /// A review rejected (or expired).
    Reject,
    /// A branch case held (0-based).
    Case(usize),
    /// No branch case held.
    Else,
}

impl Step {
    /// The step's ways on, in a fixed order.
    pub fn exits(&self) -> Vec<(Exit, &str)> {
        match &self.kind {
            StepKind::Model(m) => vec![(Exit::Next, m.next.as_str())],
            StepKind::Tool(t) => vec![(Exit::Next, t.next.as_str())],
            StepKind::Review(r) => vec![
                (Exit::Approve, r.on_approve.as_str()),
                (Exit::Reject, r.on_reject.as_str()),
            ],
            StepKind::Branch(b) => b
                .cases
                .iter()
                .enumerate()
                .map(|(i, c)| (Exit::Case(i), c.next.as_str()))
                .chain(std::iter::once((Exit::Else, b.otherwise.as_str())))
                .collect(),
            StepKind::End(_) => Vec::new(),
        }
    }
}

const TOP_LEVEL: &[&str] = &[
    "name",
    "version",
    "description",
    "input",
    "review_required_for",
    "steps",
];
const KINDS: &[&str] = &["model", "tool", "review", "branch", "end"];
/// Largest accepted definition (the same bound as a contract document).
const MAX_STEPS: usize = 256;

/// Whether `text` is a workflow or step name: `[a-z][a-z0-9_]*`, at most 64 bytes.
pub fn is_identifier(text: &str) -> bool {
    let mut bytes = text.bytes();
    text.len() <= 64
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Reads a definition from YAML or JSON text.
///
/// # Errors
/// Every problem found, each with its pointer (a syntax error has the pointer of the whole
/// document and names the line).
pub fn parse(text: &str, format: DocumentFormat) -> Result<Definition, Vec<Problem>> {
    let document = read_document(text, format).map_err(|e| {
        vec![Problem {
            pointer: String::new(),
            message: e.to_string(),
        }]
    })?;
    from_document(&document)
}

/// Reads a definition from its JSON data model.
///
/// # Errors
/// Every problem found, each with its pointer.
pub fn from_document(document: &Value) -> Result<Definition, Vec<Problem>> {
    let mut r = Reader::default();
    let definition = r.definition(document);
    match definition {
        Some(d) if r.problems.is_empty() => Ok(d),
        _ => Err(r.problems),
    }
}

#[derive(Default)]
struct Reader {
    problems: Vec<Problem>,
}

impl Reader {
    fn push(&mut self, pointer: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            pointer: pointer.to_owned(),
            message: message.into(),
        });
    }

    /// An object whose keys are all in `known`.
    fn object<'v>(
        &mut self,
        value: &'v Value,
        pointer: &str,
        known: &[&str],
    ) -> Option<&'v Map<String, Value>> {
        let Some(map) = value.as_object() else {
            self.push(pointer, "must be a mapping");
            return None;
        };
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.push(
                    &child(pointer, key),
                    format!("unknown key `{key}` (expected one of: {})", known.join(", ")),
                );
            }
        }
        Some(map)
    }

    fn string(&mut self, map: &Map<String, Value>, key: &str, pointer: &str) -> Option<String> {
        match map.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.push(&child(pointer, key), "must be a string");
                None
            }
            None => {
                self.push(pointer, format!("`{key}` is required"));
                None
            }
        }
    }

    fn step_name(&mut self, map: &Map<String, Value>, key: &str, pointer: &str) -> Option<String> {
        let name = self.string(map, key, pointer)?;
        if is_identifier(&name) {
            Some(name)
        } else {
            self.push(
                &child(pointer, key),
                format!("`{name}` is not a step id ([a-z][a-z0-9_]*)"),
            );
            None
        }
    }

    fn positive(&mut self, value: Option<&Value>, pointer: &str, what: &str) -> Option<u32> {
        match value.and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()) {
            Some(v) if v >= 1 => Some(v),
            _ => {
                self.push(pointer, format!("{what} must be a positive integer"));
                None
            }
        }
    }

    fn tool_ref(&mut self, map: &Map<String, Value>, key: &str, pointer: &str) -> Option<ToolRef> {
        let text = self.string(map, key, pointer)?;
        match ToolRef::parse(&text) {
            Ok(r) => Some(r),
            Err(e) => {
                self.push(&child(pointer, key), e);
                None
            }
        }
    }

    fn template(&mut self, text: &str, pointer: &str) -> Option<Template> {
        match Template::parse(text) {
            Ok(t) => Some(t),
            Err(e) => {
                self.push(pointer, e);
                None
            }
        }
    }

    fn definition(&mut self, document: &Value) -> Option<Definition> {
        let map = self.object(document, "", TOP_LEVEL)?;
        let name = self.string(map, "name", "");
        if let Some(n) = &name
            && !is_identifier(n)
        {
            self.push("/name", format!("`{n}` is not a workflow name ([a-z][a-z0-9_]*)"));
        }
        let version = self.positive(map.get("version"), "/version", "`version`");
        let description = self.string(map, "description", "");
        let input = match map.get("input") {
            Some(v) => Some(v.clone()),
            None => {
                self.push(
                    "",
                    "`input` is required (a closed JSON Schema of the run's input)",
                );
                None
            }
        };
        let review_required_for = self.review_required_for(map.get("review_required_for"));
        let steps = self.steps(map.get("steps"));
        Some(Definition {
            name: name?,
            version: version?,
            description: description?,
            input: input?,
            review_required_for,
            steps: steps?,
        })
    }

    fn review_required_for(&mut self, value: Option<&Value>) -> BTreeSet<EffectClass> {
        let Some(value) = value else {
            return BTreeSet::from([EffectClass::Write, EffectClass::Irreversible]);
        };
        let Some(items) = value.as_array() else {
            self.push("/review_required_for", "must be a list of effect classes");
            return BTreeSet::new();
        };
        let mut classes = BTreeSet::new();
        for (i, item) in items.iter().enumerate() {
            match item.as_str().and_then(Effect::parse) {
                Some(e) => {
                    if !classes.insert(EffectClass::from(e)) {
                        self.push(&format!("/review_required_for/{i}"), "listed twice");
                    }
                }
                None => self.push(
                    &format!("/review_required_for/{i}"),
                    "must be one of read, write, irreversible, async",
                ),
            }
        }
        classes
    }

    fn steps(&mut self, value: Option<&Value>) -> Option<Vec<Step>> {
        let Some(items) = value.and_then(Value::as_array) else {
            self.push(
                "",
                "`steps` is required: a list of steps, the first being the entry",
            );
            return None;
        };
        if items.is_empty() || items.len() > MAX_STEPS {
            self.push("/steps", format!("must hold 1 to {MAX_STEPS} steps"));
            return None;
        }
        let mut seen = BTreeSet::new();
        let mut steps = Vec::with_capacity(items.len());
        let mut complete = true;
        for (i, item) in items.iter().enumerate() {
            let pointer = format!("/steps/{i}");
            match self.step(item, &pointer) {
                Some(step) => {
                    if !seen.insert(step.id.clone()) {
                        self.push(
                            &format!("{pointer}/id"),
                            format!("step id `{}` is used twice", step.id),
                        );
                    }
                    steps.push(step);
                }
                None => complete = false,
            }
        }
        complete.then_some(steps)
    }

    fn step(&mut self, value: &Value, pointer: &str) -> Option<Step> {
        let Some(map) = value.as_object() else {
            self.push(pointer, "a step must be a mapping");
            return None;
        };
        let kinds: Vec<&str> = KINDS.iter().copied().filter(|k| map.contains_key(*k)).collect();
        let kind = match kinds.as_slice() {
            [kind] => *kind,
            [] => {
                self.push(
                    pointer,
                    format!("a step needs exactly one of: {}", KINDS.join(", ")),
                );
                return None;
            }
            _ => {
                self.push(
                    pointer,
                    format!("a step has one kind, not {}", kinds.join(" and ")),
                );
                return None;
            }
        };
        let known: &[&str] = match kind {
            "model" | "tool" => &["id", "max_visits", "model", "tool", "with", "next"],
            "review" => &["id", "max_visits", "review", "on_approve", "on_reject"],
            "branch" => &["id", "max_visits", "branch"],
            _ => &["id", "max_visits", "end"],
        };
        // `model` and `tool` share a key list; the other kind's key is refused below.
        let map = self.object(value, pointer, known)?;
        let id = self.step_name(map, "id", pointer);
        let max_visits = match map.get("max_visits") {
            None => None,
            Some(v) => Some(self.positive(Some(v), &child(pointer, "max_visits"), "`max_visits`")?),
        };
        let kind = match kind {
            "model" => self.model(map, pointer).map(StepKind::Model),
            "tool" => self.tool(map, pointer).map(StepKind::Tool),
            "review" => self.review(map, pointer).map(StepKind::Review),
            "branch" => self.branch(map, pointer).map(StepKind::Branch),
            _ => self.end(map, pointer).map(StepKind::End),
        };
        Some(Step {
            id: id?,
            max_visits,
            kind: kind?,
        })
    }

    fn model(&mut self, map: &Map<String, Value>, pointer: &str) -> Option<ModelStep> {
        if map.contains_key("with") {
            self.push(
                &child(pointer, "with"),
                "a model step proposes arguments; it takes no `with`",
            );
        }
        let at = child(pointer, "model");
        let inner = self.object(map.get("model")?, &at, &["propose", "prompt"])?;
        let propose = self.tool_ref(inner, "propose", &at);
        let prompt = self
            .string(inner, "prompt", &at)
            .and_then(|p| self.template(&p, &child(&at, "prompt")));
        let next = self.step_name(map, "next", pointer);
        Some(ModelStep {
            propose: propose?,
            prompt: prompt?,
            next: next?,
        })
    }

    fn tool(&mut self, map: &Map<String, Value>, pointer: &str) -> Option<ToolStep> {
        let tool = self.tool_ref(map, "tool", pointer);
        let mut with = BTreeMap::new();
        let mut complete = true;
        match map.get("with") {
            None => {}
            Some(Value::Object(fields)) => {
                for (field, value) in fields {
                    let at = child(&child(pointer, "with"), field);
                    match self.arg(value, &at) {
                        Some(arg) => {
                            with.insert(field.clone(), arg);
                        }
                        None => complete = false,
                    }
                }
            }
            Some(_) => {
                self.push(
                    &child(pointer, "with"),
                    "must be a mapping of the tool's input fields",
                );
                complete = false;
            }
        }
        let next = self.step_name(map, "next", pointer);
        if !complete {
            return None;
        }
        Some(ToolStep {
            tool: tool?,
            with,
            next: next?,
        })
    }

    fn arg(&mut self, value: &Value, pointer: &str) -> Option<Arg> {
        match value {
            Value::String(text) => {
                let template = self.template(text, pointer)?;
                Some(match template.single() {
                    Some(reference) => Arg::Bound(reference.clone()),
                    None if template.references().next().is_none() => {
                        Arg::Static(Value::String(template.literal()))
                    }
                    None => Arg::Text(template),
                })
            }
            Value::Array(items) if contains_binding(value) => {
                let mut list = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{pointer}/{i}");
                    if !matches!(item, Value::Array(_) | Value::Object(_)) {
                        list.push(self.arg(item, &at)?);
                    } else if contains_binding(item) {
                        self.push(
                            &at,
                            "bindings (`${…}`) go one level deep: a field, or an item of a list field",
                        );
                        return None;
                    } else {
                        list.push(Arg::Static(item.clone()));
                    }
                }
                Some(Arg::List(list))
            }
            Value::Array(_) | Value::Object(_) => {
                if contains_binding(value) {
                    self.push(
                        pointer,
                        "bindings (`${…}`) go one level deep: a field, or an item of a list field",
                    );
                    return None;
                }
                Some(Arg::Static(value.clone()))
            }
            _ => Some(Arg::Static(value.clone())),
        }
    }

    fn review(&mut self, map: &Map<String, Value>, pointer: &str) -> Option<ReviewStep> {
        let at = child(pointer, "review");
        let inner = self.object(
            map.get("review")?,
            &at,
            &["covers", "reviewers", "expires_in", "on_expiry"],
        )?;
        let covers = match inner.get("covers").and_then(Value::as_array) {
            Some(items) if !items.is_empty() => {
                let mut covers = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match item.as_str().filter(|s| is_identifier(s)) {
                        Some(s) if !covers.iter().any(|c| c == s) => covers.push(s.to_owned()),
                        Some(s) => self.push(&format!("{at}/covers/{i}"), format!("`{s}` is listed twice")),
                        None => self.push(&format!("{at}/covers/{i}"), "must be a step id"),
                    }
                }
                Some(covers)
            }
            _ => {
                self.push(
                    &at,
                    "`covers` is required: the tool steps whose payload this review approves",
                );
                None
            }
        };
        let reviewers = self.reviewers(inner.get("reviewers"), &child(&at, "reviewers"));
        let expires_in = match inner.get("expires_in") {
            None => Some(Duration::from_secs(24 * 3600)),
            Some(Value::String(s)) => match parse_duration(s).filter(|d| !d.is_zero()) {
                Some(d) => Some(d),
                None => {
                    self.push(
                        &child(&at, "expires_in"),
                        format!("`{s}` is not a duration (e.g. 30m, 24h, 7d)"),
                    );
                    None
                }
            },
            Some(_) => {
                self.push(&child(&at, "expires_in"), "must be a duration such as `24h`");
                None
            }
        };
        let on_expiry = match inner.get("on_expiry").map(|v| v.as_str()) {
            None | Some(Some("reject")) => Some(OnExpiry::Reject),
            Some(Some("fail")) => Some(OnExpiry::Fail),
            Some(_) => {
                self.push(
                    &child(&at, "on_expiry"),
                    "must be `reject` (follow on_reject) or `fail`",
                );
                None
            }
        };
        let on_approve = self.step_name(map, "on_approve", pointer);
        let on_reject = self.step_name(map, "on_reject", pointer);
        Some(ReviewStep {
            covers: covers?,
            reviewers: reviewers?,
            expires_in: expires_in?,
            on_expiry: on_expiry?,
            on_approve: on_approve?,
            on_reject: on_reject?,
        })
    }

    fn reviewers(&mut self, value: Option<&Value>, pointer: &str) -> Option<Reviewers> {
        let Some(value) = value else {
            self.push(
                pointer,
                "`reviewers` is required: `{ role: … }` or `{ principals: [ … ] }`",
            );
            return None;
        };
        let map = self.object(value, pointer, &["role", "principals"])?;
        match (map.get("role"), map.get("principals")) {
            (Some(Value::String(role)), None) if !role.is_empty() => Some(Reviewers::Role(role.clone())),
            (None, Some(Value::Array(items))) if !items.is_empty() => {
                let names: Option<Vec<String>> = items
                    .iter()
                    .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
                    .collect();
                if names.is_none() {
                    self.push(&child(pointer, "principals"), "must be a list of principal ids");
                }
                names.map(Reviewers::Principals)
            }
            _ => {
                self.push(
                    pointer,
                    "give either `role` (a string) or `principals` (a non-empty list)",
                );
                None
            }
        }
    }

    fn branch(&mut self, map: &Map<String, Value>, pointer: &str) -> Option<BranchStep> {
        let at = child(pointer, "branch");
        let inner = self.object(map.get("branch")?, &at, &["cases", "else"])?;
        let mut cases = Vec::new();
        let mut complete = true;
        match inner.get("cases").and_then(Value::as_array) {
            Some(items) if !items.is_empty() => {
                for (i, item) in items.iter().enumerate() {
                    let case_at = format!("{at}/cases/{i}");
                    let Some(case) = self.object(item, &case_at, &["when", "next"]) else {
                        complete = false;
                        continue;
                    };
                    let when = self.string(case, "when", &case_at);
                    let next = self.step_name(case, "next", &case_at);
                    match (when, next) {
                        (Some(when), Some(next)) => cases.push(Case { when, next }),
                        _ => complete = false,
                    }
                }
            }
            _ => {
                self.push(
                    &at,
                    "`cases` is required: a list of `{ when: <CEL>, next: <step> }`",
                );
                complete = false;
            }
        }
        let otherwise = self.step_name(inner, "else", &at);
        if !complete {
            return None;
        }
        Some(BranchStep {
            cases,
            otherwise: otherwise?,
        })
    }

    fn end(&mut self, map: &Map<String, Value>, pointer: &str) -> Option<EndStep> {
        let at = child(pointer, "end");
        let inner = self.object(map.get("end")?, &at, &["status"])?;
        let status = match inner.get("status").and_then(Value::as_str) {
            Some("completed") => EndStatus::Completed,
            Some("failed") => EndStatus::Failed,
            _ => {
                self.push(&child(&at, "status"), "must be `completed` or `failed`");
                return None;
            }
        };
        Some(EndStep { status })
    }
}

fn contains_binding(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains("${"),
        Value::Array(items) => items.iter().any(contains_binding),
        Value::Object(map) => map.values().any(contains_binding),
        _ => false,
    }
}

/// `pointer` extended by one member name (RFC 6901 escaping).
pub(crate) fn child(pointer: &str, segment: &str) -> String {
    let mut out = String::with_capacity(pointer.len() + segment.len() + 1);
    out.push_str(pointer);
    out.push('/');
    out.push_str(&segment.replace('~', "~0").replace('/', "~1"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_references_are_pinned() {
        assert_eq!(
            ToolRef::parse("send_email@1"),
            Ok(ToolRef::Version {
                name: "send_email".into(),
                version: 1
            })
        );
        assert!(ToolRef::parse("send_email").is_err());
        assert!(ToolRef::parse("send_email@").is_err());
        assert!(ToolRef::parse("send_email@0").is_err());
        assert!(ToolRef::parse("send_email@01").is_err());
        assert!(ToolRef::parse("@1").is_err());
        assert!(ToolRef::parse("tool-contract@sha256:abc").is_err());
        let id = format!("tool-contract@sha256:{}", "a".repeat(64));
        assert!(matches!(ToolRef::parse(&id), Ok(ToolRef::Content(_))));
    }

    #[test]
    fn unknown_keys_and_two_kinds_are_refused_with_pointers() {
        let doc = serde_json::json!({
            "name": "w", "version": 1, "description": "d",
            "input": {"type": "object", "additionalProperties": false},
            "steps": [
                {"id": "a", "tool": "t@1", "next": "b", "retries": 3},
                {"id": "b", "tool": "t@1", "end": {"status": "completed"}},
            ],
            "owner": "x"
        });
        let problems = from_document(&doc).unwrap_err();
        let pointers: Vec<&str> = problems.iter().map(|p| p.pointer.as_str()).collect();
        assert!(pointers.contains(&"/owner"), "{problems:?}");
        assert!(pointers.contains(&"/steps/0/retries"), "{problems:?}");
        assert!(pointers.contains(&"/steps/1"), "{problems:?}");
    }

    #[test]
    fn arguments_are_static_bound_or_text() {
        let doc = serde_json::json!({
            "name": "w", "version": 1, "description": "d",
            "input": {"type": "object", "additionalProperties": false},
            "steps": [
                {"id": "a", "tool": "t@1", "next": "z", "with": {
                    "n": 3, "s": "plain", "b": "${input.x}", "t": "id ${input.x}!", "o": {"k": [1]}
                }},
                {"id": "z", "end": {"status": "completed"}},
            ]
        });
        let d = from_document(&doc).unwrap();
        let StepKind::Tool(t) = &d.steps[0].kind else {
            panic!()
        };
        assert!(matches!(t.with["n"], Arg::Static(_)));
        assert_eq!(t.with["s"], Arg::Static(Value::String("plain".into())));
        assert!(matches!(t.with["b"], Arg::Bound(_)));
        assert!(matches!(t.with["t"], Arg::Text(_)));
        assert!(matches!(t.with["o"], Arg::Static(_)));
        assert_eq!(
            d.review_required_for,
            BTreeSet::from([EffectClass::Write, EffectClass::Irreversible])
        );
    }

    #[test]
    fn a_binding_nested_in_a_static_value_is_refused() {
        let doc = serde_json::json!({
            "name": "w", "version": 1, "description": "d",
            "input": {"type": "object", "additionalProperties": false},
            "steps": [
                {"id": "a", "tool": "t@1", "next": "z", "with": {"o": {"k": "${input.x}"}}},
                {"id": "z", "end": {"status": "completed"}},
            ]
        });
        let problems = from_document(&doc).unwrap_err();
        assert_eq!(problems[0].pointer, "/steps/0/with/o");
    }
}
