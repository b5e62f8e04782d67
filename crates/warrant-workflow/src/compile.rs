//! The compiler: a definition and a catalogue of contracts in, a pinned, checked workflow or
//! every violation out — each naming its rule, its step and, for a graph rule, the path that
//! proves it (`entry → draft → branch(b2: else) → credit`).
//!
//! **Gate A**, stated on walks (a walk is any path from the entry, steps may repeat). For each
//! tool step `T` whose effect class is in `review_required_for`, or whose contract says
//! `approval: per_call`, and every walk that ends at `T`: let `R` be the last review on the
//! walk that covers `T`. Then `R` must exist, the walk must leave `R` by `on_approve`, and
//! between `R` and `T` the walk must pass neither `T` itself nor any step whose value `T`'s
//! arguments bind — the reviewer approves the exact payload that runs, once. Each of the four
//! ways to fail is its own rule ([`Rule::UnreviewedPath`], [`Rule::RejectReachesTool`],
//! [`Rule::ReentryWithoutReview`], [`Rule::ValueAfterReview`]), found by a search over the
//! graph with the covering reviews removed; `tests/gate_a.rs` holds these searches to a
//! brute-force enumeration of walks on random graphs. In addition every producer of `T`'s
//! values must have run whenever a covering review is reached (it dominates the review), so
//! the review can show the payload; and every cycle must pass a step with `max_visits`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use serde_json::Value;
use warrant_core::contract::{ApprovalMode, CompiledSchema, DocumentFormat, lint_input_schema};
use warrant_core::{Contract, ContractId, Effect};

use crate::definition::{self, Arg, Definition, EffectClass, Exit, StepKind, ToolRef};
use crate::graph::{Graph, Hop};
use crate::template::{Reference, Root};
use crate::types::{self, Field, Types};

/// What a catalogue knows of a tool reference.
#[derive(Debug, Clone)]
pub enum Found {
    /// Registered and current.
    Active(Arc<Contract>),
    /// Registered, but retired: no new workflow may call it.
    Retired(Arc<Contract>),
    /// Never registered (or not visible to this tenant).
    Unknown,
}

/// Where the compiler looks tools up: the registry on a server, a directory offline.
pub trait Catalog {
    /// The contract a reference names.
    fn find(&self, tool: &ToolRef) -> Found;
}

/// A catalogue of a fixed set of contracts (offline compilation, tests).
#[derive(Debug, Clone, Default)]
pub struct StaticCatalog {
    contracts: Vec<Arc<Contract>>,
    retired: BTreeSet<ContractId>,
}

impl StaticCatalog {
    /// The catalogue of `contracts`.
    pub fn new(contracts: impl IntoIterator<Item = Arc<Contract>>) -> Self {
        StaticCatalog {
            contracts: contracts.into_iter().collect(),
            retired: BTreeSet::new(),
        }
    }

    /// Marks a contract retired.
    #[must_use]
    pub fn retire(mut self, id: ContractId) -> Self {
        self.retired.insert(id);
        self
    }
}

impl Catalog for StaticCatalog {
    fn find(&self, tool: &ToolRef) -> Found {
        let found = self.contracts.iter().find(|c| match tool {
            ToolRef::Version { name, version } => c.name() == name && c.version() == *version,
            ToolRef::Content(id) => c.id() == *id,
        });
        match found {
            Some(c) if self.retired.contains(&c.id()) => Found::Retired(c.clone()),
            Some(c) => Found::Active(c.clone()),
            None => Found::Unknown,
        }
    }
}

/// A catalogue of answers found beforehand (a server resolves each reference through its
/// registry, which is asynchronous, then compiles); a reference it lacks is unknown.
impl Catalog for BTreeMap<ToolRef, Found> {
    fn find(&self, tool: &ToolRef) -> Found {
        self.get(tool).cloned().unwrap_or(Found::Unknown)
    }
}

/// The rules a definition can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// The document does not follow the grammar.
    Grammar,
    /// The input schema is not closed (the contract input lint).
    InputSchema,
    /// An exit names no step.
    UnknownStep,
    /// A step no path reaches.
    Unreachable,
    /// A tool that is not registered (or not visible).
    UnknownTool,
    /// A retired tool.
    RetiredTool,
    /// A review covers something that is not a tool step.
    CoverNotTool,
    /// A binding to a field or step that does not exist or may not have run.
    Binding,
    /// A binding whose value does not fit its target, or may be absent where it is required.
    BindingType,
    /// A required tool input left unbound.
    UnboundInput,
    /// A value written in the definition that the tool's input schema refuses.
    StaticValue,
    /// A branch condition that is not valid CEL over `input` and `steps`.
    Condition,
    /// Gate A: a path reaches a tool that needs review without a covering review.
    UnreviewedPath,
    /// Gate A: a covering review's reject route reaches the tool.
    RejectReachesTool,
    /// Gate A: between the review and the tool, a step produces a value the tool binds (or the
    /// review cannot show the payload because such a step may not have run yet).
    ValueAfterReview,
    /// Gate A: the tool is entered again without passing its review again.
    ReentryWithoutReview,
    /// A cycle with no step that bounds it (`max_visits`).
    UnboundedCycle,
}

impl Rule {
    /// The rule's stable code.
    pub fn code(self) -> &'static str {
        match self {
            Rule::Grammar => "grammar",
            Rule::InputSchema => "input_schema",
            Rule::UnknownStep => "unknown_step",
            Rule::Unreachable => "unreachable_step",
            Rule::UnknownTool => "unknown_tool",
            Rule::RetiredTool => "retired_tool",
            Rule::CoverNotTool => "cover_not_tool",
            Rule::Binding => "binding",
            Rule::BindingType => "binding_type",
            Rule::UnboundInput => "unbound_input",
            Rule::StaticValue => "static_value",
            Rule::Condition => "condition",
            Rule::UnreviewedPath => "gate_a.unreviewed_path",
            Rule::RejectReachesTool => "gate_a.reject_reaches_tool",
            Rule::ValueAfterReview => "gate_a.value_after_review",
            Rule::ReentryWithoutReview => "gate_a.reentry_without_review",
            Rule::UnboundedCycle => "unbounded_cycle",
        }
    }

    /// Whether this is one of Gate A's rules.
    pub fn is_gate_a(self) -> bool {
        matches!(
            self,
            Rule::UnreviewedPath
                | Rule::RejectReachesTool
                | Rule::ValueAfterReview
                | Rule::ReentryWithoutReview
        )
    }
}

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which rule.
    pub rule: Rule,
    /// The step it concerns, if one.
    pub step: Option<String>,
    /// A JSON pointer into the definition.
    pub pointer: String,
    /// What is wrong, for people.
    pub message: String,
    /// The path that proves a graph rule, rendered.
    pub path: Option<String>,
}

impl Violation {
    /// The violation as the API and `workflow compile --format json` answer it:
    /// `{rule, step, pointer, message, path}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "rule": self.rule.code(),
            "step": self.step,
            "pointer": self.pointer,
            "message": self.message,
            "path": self.path,
        })
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "[{}] {at}: {}", self.rule.code(), self.message)?;
        if let Some(path) = &self.path {
            write!(f, "\n    path: {path}")?;
        }
        Ok(())
    }
}

/// How one tool step is governed in the compiled workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct Coverage {
    /// The tool step.
    pub step: String,
    /// `name@version` of its contract.
    pub tool: String,
    /// The pinned content id.
    pub content_id: ContractId,
    /// Its effect class.
    pub effect: Effect,
    /// Whether Gate A requires a covering review.
    pub review_required: bool,
    /// The reviews that cover it.
    pub reviews: Vec<String>,
}

/// A definition that passed every rule, with the contracts it calls pinned.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The definition.
    pub definition: Definition,
    /// Its graph.
    pub graph: Graph,
    /// The compiled input schema.
    pub input: CompiledSchema,
    /// The contract of each tool and model step, by step id (pinned by content id).
    pub contracts: BTreeMap<String, Arc<Contract>>,
    /// Each tool step's review coverage, in step order.
    pub coverage: Vec<Coverage>,
}

impl Compiled {
    /// The content id each tool or model step is pinned to.
    pub fn pinned(&self) -> BTreeMap<String, ContractId> {
        self.contracts.iter().map(|(s, c)| (s.clone(), c.id())).collect()
    }
}

/// Reads and compiles a definition's text.
///
/// # Errors
/// Every violation found (grammar problems first; the graph rules only run on a definition
/// that reads).
pub fn compile_text(
    text: &str,
    format: DocumentFormat,
    catalog: &dyn Catalog,
) -> Result<Compiled, Vec<Violation>> {
    let definition = definition::parse(text, format).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| Violation {
                rule: Rule::Grammar,
                step: None,
                pointer: p.pointer,
                message: p.message,
                path: None,
            })
            .collect::<Vec<_>>()
    })?;
    compile(definition, catalog)
}

/// Compiles a definition against `catalog`.
///
/// # Errors
/// Every violation found.
pub fn compile(definition: Definition, catalog: &dyn Catalog) -> Result<Compiled, Vec<Violation>> {
    let mut c = Checker {
        definition: &definition,
        violations: Vec::new(),
        contracts: BTreeMap::new(),
        graph: None,
    };
    let input = match lint_input_schema(&definition.input, "/input") {
        Ok(schema) => Some(schema),
        Err(problems) => {
            for p in problems {
                c.push(Rule::InputSchema, None, p.pointer(), p.message().to_owned(), None);
            }
            None
        }
    };
    c.resolve_tools(catalog);
    c.graph();
    c.covers();
    c.bindings();
    c.conditions();
    c.gate_a();
    c.cycles();
    let Checker {
        violations,
        contracts,
        graph,
        ..
    } = c;
    match (graph, input) {
        (Some(graph), Some(input)) if violations.is_empty() => {
            let coverage = coverage(&definition, &contracts);
            Ok(Compiled {
                definition,
                graph,
                input,
                contracts,
                coverage,
            })
        }
        _ => Err(violations),
    }
}

fn coverage(definition: &Definition, contracts: &BTreeMap<String, Arc<Contract>>) -> Vec<Coverage> {
    definition
        .steps
        .iter()
        .filter(|s| matches!(s.kind, StepKind::Tool(_)))
        .filter_map(|s| {
            let contract = contracts.get(&s.id)?;
            Some(Coverage {
                step: s.id.clone(),
                tool: format!("{}@{}", contract.qualified_name(), contract.version()),
                content_id: contract.id(),
                effect: contract.effect(),
                review_required: needs_review(definition, contract),
                reviews: definition
                    .steps
                    .iter()
                    .filter(|r| matches!(&r.kind, StepKind::Review(review) if review.covers.contains(&s.id)))
                    .map(|r| r.id.clone())
                    .collect(),
            })
        })
        .collect()
}

/// Whether Gate A applies to a call of `contract`.
fn needs_review(definition: &Definition, contract: &Contract) -> bool {
    definition
        .review_required_for
        .contains(&EffectClass::from(contract.effect()))
        || contract.approval() == ApprovalMode::PerCall
}

struct Checker<'d> {
    definition: &'d Definition,
    violations: Vec<Violation>,
    contracts: BTreeMap<String, Arc<Contract>>,
    graph: Option<Graph>,
}

fn step_pointer(index: usize) -> String {
    format!("/steps/{index}")
}

impl Checker<'_> {
    fn push(&mut self, rule: Rule, step: Option<&str>, pointer: &str, message: String, path: Option<String>) {
        self.violations.push(Violation {
            rule,
            step: step.map(str::to_owned),
            pointer: pointer.to_owned(),
            message,
            path,
        });
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.definition.steps.iter().position(|s| s.id == id)
    }

    fn resolve_tools(&mut self, catalog: &dyn Catalog) {
        for (i, step) in self.definition.steps.iter().enumerate() {
            let (tool, key) = match &step.kind {
                StepKind::Tool(t) => (&t.tool, "tool"),
                StepKind::Model(m) => (&m.propose, "model/propose"),
                _ => continue,
            };
            let pointer = format!("{}/{key}", step_pointer(i));
            match catalog.find(tool) {
                Found::Active(contract) => {
                    self.contracts.insert(step.id.clone(), contract);
                }
                Found::Retired(contract) => self.push(
                    Rule::RetiredTool,
                    Some(&step.id),
                    &pointer,
                    format!(
                        "step `{}` calls {tool} ({}), which is retired",
                        step.id,
                        contract.id()
                    ),
                    None,
                ),
                Found::Unknown => self.push(
                    Rule::UnknownTool,
                    Some(&step.id),
                    &pointer,
                    format!("step `{}` calls {tool}, which is not registered", step.id),
                    None,
                ),
            }
        }
    }

    fn graph(&mut self) {
        match Graph::of(&self.definition.steps) {
            Ok(graph) => {
                let reachable = graph.reachable();
                for (i, step) in self.definition.steps.iter().enumerate() {
                    if !reachable.get(i).copied().unwrap_or(false) {
                        self.push(
                            Rule::Unreachable,
                            Some(&step.id),
                            &step_pointer(i),
                            format!(
                                "step `{}` is not reachable from the entry (`{}`)",
                                step.id,
                                graph.id(0)
                            ),
                            None,
                        );
                    }
                }
                self.graph = Some(graph);
            }
            Err(missing) => {
                for (i, exit, target) in missing {
                    let id = self.definition.steps.get(i).map_or("?", |s| s.id.as_str());
                    self.push(
                        Rule::UnknownStep,
                        Some(id),
                        &step_pointer(i),
                        format!("step `{id}` leads ({exit:?}) to `{target}`, which is not a step"),
                        None,
                    );
                }
            }
        }
    }

    fn covers(&mut self) {
        for (i, step) in self.definition.steps.iter().enumerate() {
            let StepKind::Review(review) = &step.kind else {
                continue;
            };
            for (k, covered) in review.covers.iter().enumerate() {
                let is_tool = self
                    .index(covered)
                    .and_then(|j| self.definition.steps.get(j))
                    .is_some_and(|s| matches!(s.kind, StepKind::Tool(_)));
                if !is_tool {
                    self.push(
                        Rule::CoverNotTool,
                        Some(&step.id),
                        &format!("{}/review/covers/{k}", step_pointer(i)),
                        format!(
                            "review `{}` covers `{covered}`, which is not a tool step",
                            step.id
                        ),
                        None,
                    );
                }
            }
        }
    }

    /// The source of a reference read by step `consumer`, checked: it exists, it has run on
    /// every path to the consumer, and the field is one its schema can hold.
    fn source(&mut self, reference: &Reference, consumer: usize, pointer: &str) -> Option<Field> {
        let consumer_id = self
            .definition
            .steps
            .get(consumer)
            .map_or("?", |s| s.id.as_str())
            .to_owned();
        let (schema, what) = match &reference.root {
            Root::Input => (Some(&self.definition.input), "the workflow input".to_owned()),
            // Refused by the workflow grammar when the definition is read; refused here too.
            Root::Event | Root::Delivery => {
                self.push(
                    Rule::Binding,
                    Some(&consumer_id),
                    pointer,
                    format!("`${{{reference}}}` is not a workflow binding"),
                    None,
                );
                return None;
            }
            Root::Output(step) | Root::Arguments(step) => {
                let want_tool = matches!(reference.root, Root::Output(_));
                let kind_ok = self
                    .index(step)
                    .and_then(|j| self.definition.steps.get(j))
                    .is_some_and(|s| {
                        if want_tool {
                            matches!(s.kind, StepKind::Tool(_))
                        } else {
                            matches!(s.kind, StepKind::Model(_))
                        }
                    });
                if !kind_ok {
                    let expected = if want_tool {
                        "a tool step (`output`)"
                    } else {
                        "a model step (`arguments`)"
                    };
                    self.push(
                        Rule::Binding,
                        Some(&consumer_id),
                        pointer,
                        format!("`${{{reference}}}`: `{step}` is not {expected}"),
                        None,
                    );
                    return None;
                }
                let producer = self.index(step)?;
                if let Some(graph) = &self.graph
                    && (producer == consumer || !graph.dominates(producer, consumer))
                {
                    let path = graph
                        .path(0, consumer, false, &|v| v == producer)
                        .map(|p| graph.render(&p, true));
                    self.push(
                        Rule::Binding,
                        Some(&consumer_id),
                        pointer,
                        format!(
                            "`${{{reference}}}`: step `{step}` has not run on every path to `{consumer_id}`"
                        ),
                        path,
                    );
                    return None;
                }
                let contract = self.contracts.get(step)?;
                let doc = if want_tool {
                    contract.document().get("output")
                } else {
                    contract.input_document()
                };
                (
                    doc,
                    format!(
                        "the {} of step `{step}`",
                        if want_tool { "output" } else { "proposal" }
                    ),
                )
            }
        };
        let Some(schema) = schema else {
            return Some(Field::Unknown);
        };
        let field = types::field(schema, &reference.path);
        if field == Field::Missing {
            self.push(
                Rule::Binding,
                Some(&consumer_id),
                pointer,
                format!(
                    "`${{{reference}}}`: {what} has no field `{}`",
                    reference.path.join(".")
                ),
                None,
            );
            return None;
        }
        Some(field)
    }

    fn bindings(&mut self) {
        for (i, step) in self.definition.steps.iter().enumerate() {
            match &step.kind {
                StepKind::Model(m) => {
                    let pointer = format!("{}/model/prompt", step_pointer(i));
                    for reference in m.prompt.references() {
                        self.source(reference, i, &pointer);
                    }
                }
                StepKind::Tool(t) => self.tool_bindings(i, &step.id, &t.with),
                _ => {}
            }
        }
    }

    fn tool_bindings(&mut self, i: usize, id: &str, with: &BTreeMap<String, Arg>) {
        let Some(contract) = self.contracts.get(id).cloned() else {
            return;
        };
        let Some(input) = contract.input_document() else {
            return;
        };
        let base = format!("{}/with", step_pointer(i));
        // Every required input is bound.
        if let Some(required) = input.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !with.contains_key(name) {
                    self.push(
                        Rule::UnboundInput,
                        Some(id),
                        &base,
                        format!(
                            "step `{id}` leaves `{name}`, a required input of {}, unbound",
                            label(&contract)
                        ),
                        None,
                    );
                }
            }
        }
        let mut statics = serde_json::Map::new();
        for (field, arg) in with {
            let pointer = definition::child(&base, field);
            let target = types::field(input, std::slice::from_ref(field));
            if target == Field::Missing {
                self.push(
                    Rule::Binding,
                    Some(id),
                    &pointer,
                    format!("{} has no input field `{field}`", label(&contract)),
                    None,
                );
                continue;
            }
            let (target_types, target_required) = match target {
                Field::Known { types, .. } => (
                    Some(types),
                    input
                        .get("required")
                        .and_then(Value::as_array)
                        .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(field))),
                ),
                _ => (None, false),
            };
            match arg {
                Arg::Static(value) => {
                    statics.insert(field.clone(), value.clone());
                }
                Arg::Bound(reference) => {
                    let Some(source) = self.source(reference, i, &pointer) else {
                        continue;
                    };
                    if let Field::Known { types, required } = source {
                        if let Some(target_types) = target_types
                            && !types.within(target_types)
                        {
                            self.push(
                                Rule::BindingType,
                                Some(id),
                                &pointer,
                                format!(
                                    "`${{{reference}}}` is {types} but `{field}` of {} takes {target_types}",
                                    label(&contract)
                                ),
                                None,
                            );
                        } else if target_required && !required {
                            self.push(
                                Rule::BindingType,
                                Some(id),
                                &pointer,
                                format!(
                                    "`${{{reference}}}` may be absent but `{field}` is a required input of {}",
                                    label(&contract)
                                ),
                                None,
                            );
                        }
                    }
                }
                Arg::List(list) => {
                    if let Some(target_types) = target_types
                        && !Types::ARRAY.within(target_types)
                    {
                        self.push(
                            Rule::BindingType,
                            Some(id),
                            &pointer,
                            format!(
                                "a list, but `{field}` of {} takes {target_types}",
                                label(&contract)
                            ),
                            None,
                        );
                        continue;
                    }
                    let item_types = types::items(input, std::slice::from_ref(field));
                    for (k, item) in list.iter().enumerate() {
                        let at = format!("{pointer}/{k}");
                        let fits = |types: Types| item_types.is_none_or(|t| types.within(t));
                        match item {
                            Arg::Bound(reference) => {
                                if let Some(Field::Known { types, required }) = self.source(reference, i, &at)
                                    && (!fits(types) || !required)
                                {
                                    self.push(
                                            Rule::BindingType,
                                            Some(id),
                                            &at,
                                            format!(
                                                "`${{{reference}}}` is {types}{} but the items of `{field}` take {}",
                                                if required { "" } else { " and may be absent" },
                                                item_types.unwrap_or(Types::ANY)
                                            ),
                                            None,
                                        );
                                }
                            }
                            Arg::Text(template) => {
                                if !fits(Types::STRING) {
                                    self.push(
                                        Rule::BindingType,
                                        Some(id),
                                        &at,
                                        format!(
                                            "a text is a string but the items of `{field}` take {}",
                                            item_types.unwrap_or(Types::ANY)
                                        ),
                                        None,
                                    );
                                }
                                for reference in template.references() {
                                    self.source(reference, i, &at);
                                }
                            }
                            Arg::Static(value) => {
                                if !fits(Types::of(value)) {
                                    self.push(
                                        Rule::StaticValue,
                                        Some(id),
                                        &at,
                                        format!(
                                            "the items of `{field}` take {}",
                                            item_types.unwrap_or(Types::ANY)
                                        ),
                                        None,
                                    );
                                }
                            }
                            Arg::List(_) => {}
                        }
                    }
                }
                Arg::Text(template) => {
                    if let Some(target_types) = target_types
                        && !Types::STRING.within(target_types)
                    {
                        self.push(
                            Rule::BindingType,
                            Some(id),
                            &pointer,
                            format!(
                                "a text is a string but `{field}` of {} takes {target_types}",
                                label(&contract)
                            ),
                            None,
                        );
                    }
                    for reference in template.references() {
                        if let Some(Field::Known { types, .. }) = self.source(reference, i, &pointer)
                            && !types.within(Types::SCALAR)
                        {
                            self.push(
                                Rule::BindingType,
                                Some(id),
                                &pointer,
                                format!("`${{{reference}}}` is {types}; only strings, numbers and booleans go into text"),
                                None,
                            );
                        }
                    }
                }
            }
        }
        self.statics(i, id, &contract, input, statics);
    }

    /// The values written in the definition, validated against the input schema with the
    /// root's `required` lifted (the bound fields are checked when the step runs).
    fn statics(
        &mut self,
        i: usize,
        id: &str,
        contract: &Contract,
        input: &Value,
        statics: serde_json::Map<String, Value>,
    ) {
        if statics.is_empty() {
            return;
        }
        let mut relaxed = input.clone();
        if let Some(map) = relaxed.as_object_mut() {
            map.remove("required");
            map.remove("minProperties");
            map.remove("dependentRequired");
            map.remove("dependentSchemas");
        }
        let Ok(schema) = CompiledSchema::compile(&relaxed) else {
            return;
        };
        if let Err(rejection) = schema.check(&Value::Object(statics)) {
            let at = rejection.pointer().unwrap_or_default();
            self.push(
                Rule::StaticValue,
                Some(id),
                &format!("{}/with{at}", step_pointer(i)),
                format!(
                    "{} refuses the value written for `{}`: {}",
                    label(contract),
                    at.trim_start_matches('/'),
                    rejection.detail()
                ),
                None,
            );
        }
    }

    fn conditions(&mut self) {
        for (i, step) in self.definition.steps.iter().enumerate() {
            let StepKind::Branch(branch) = &step.kind else {
                continue;
            };
            for (k, case) in branch.cases.iter().enumerate() {
                let pointer = format!("{}/branch/cases/{k}/when", step_pointer(i));
                let program = match cel::Program::compile(&case.when) {
                    Ok(p) => p,
                    Err(e) => {
                        self.push(
                            Rule::Condition,
                            Some(&step.id),
                            &pointer,
                            format!("not a CEL expression: {}", first_line(&e.to_string())),
                            None,
                        );
                        continue;
                    }
                };
                let mut chains = Vec::new();
                collect_chains(program.expression(), &mut Vec::new(), &mut chains);
                for chain in chains {
                    match chain.split_first() {
                        Some((root, rest)) if root == "input" && !rest.is_empty() => {
                            let reference = Reference {
                                root: Root::Input,
                                path: rest.to_vec(),
                            };
                            self.source(&reference, i, &pointer);
                        }
                        Some((root, [stepid, part, rest @ ..])) if root == "steps" && (part == "output" || part == "arguments") => {
                            let root = if part == "output" {
                                Root::Output(stepid.clone())
                            } else {
                                Root::Arguments(stepid.clone())
                            };
                            let reference = Reference {
                                root,
                                path: rest.to_vec(),
                            };
                            self.source(&reference, i, &pointer);
                        }
                        _ => self.push(
                            Rule::Condition,
                            Some(&step.id),
                            &pointer,
                            format!(
                                "`{}`: a condition reads `input.<field>…` or `steps.<id>.output…` / `steps.<id>.arguments…`",
                                chain.join(".")
                            ),
                            None,
                        ),
                    }
                }
            }
        }
    }

    /// The steps whose values the tool step `t` binds.
    fn producers(&self, t: usize) -> BTreeSet<usize> {
        let Some(StepKind::Tool(tool)) = self.definition.steps.get(t).map(|s| &s.kind) else {
            return BTreeSet::new();
        };
        tool.with
            .values()
            .flat_map(Arg::references)
            .filter_map(|r| r.root.step())
            .filter_map(|s| self.index(s))
            .collect()
    }

    fn gate_a(&mut self) {
        let Some(graph) = self.graph.clone() else { return };
        let reachable = graph.reachable();
        for (t, step) in self.definition.steps.iter().enumerate() {
            if !matches!(step.kind, StepKind::Tool(_)) || !reachable.get(t).copied().unwrap_or(false) {
                continue;
            }
            let Some(contract) = self.contracts.get(&step.id).cloned() else {
                continue;
            };
            if !needs_review(self.definition, &contract) {
                continue;
            }
            let covering: BTreeSet<usize> = self
                .definition
                .steps
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(&s.kind, StepKind::Review(r) if r.covers.contains(&step.id)))
                .map(|(i, _)| i)
                .collect();
            let producers = self.producers(t);
            let why = if contract.approval() == ApprovalMode::PerCall {
                format!("{} requires a per-call approval", label(&contract))
            } else {
                format!(
                    "{} is `{}`, which `review_required_for` lists",
                    label(&contract),
                    contract.effect().as_str()
                )
            };
            for v in check_tool(&graph, t, &covering, &producers) {
                let message = match &v {
                    GateA::Unreviewed(_) => format!(
                        "tool step `{}` can be reached without a review that covers it ({why})",
                        step.id
                    ),
                    GateA::Reject { review, .. } => format!(
                        "the reject route of review `{}` reaches tool step `{}` without another covering review",
                        graph.id(*review),
                        step.id
                    ),
                    GateA::Reentry { review, .. } => format!(
                        "after review `{}` approves, tool step `{}` can run again without being reviewed again",
                        graph.id(*review),
                        step.id
                    ),
                    GateA::After { review, producer, .. } => format!(
                        "step `{}` runs after review `{}` approves and before tool step `{}`, whose arguments bind \
                         its value: the reviewer would not see the payload that runs",
                        graph.id(*producer),
                        graph.id(*review),
                        step.id
                    ),
                    GateA::NotYet { review, producer, .. } => format!(
                        "review `{}` can be reached before step `{}` has run, so it cannot show the exact payload of \
                         tool step `{}`, which binds its value",
                        graph.id(*review),
                        graph.id(*producer),
                        step.id
                    ),
                };
                let rule = v.rule();
                let path = graph.render(v.path(), true);
                self.push(rule, Some(&step.id), &step_pointer(t), message, Some(path));
            }
        }
    }

    fn cycles(&mut self) {
        let Some(graph) = &self.graph else { return };
        let bounded: Vec<bool> = self
            .definition
            .steps
            .iter()
            .map(|s| s.max_visits.is_some())
            .collect();
        if let Some(cycle) = graph.cycle(&|v| !bounded.get(v).copied().unwrap_or(false)) {
            let start = cycle.first().map_or(0, |h| h.node);
            let id = graph.id(start).to_owned();
            let path = graph.render(&cycle, false);
            self.push(
                Rule::UnboundedCycle,
                Some(&id),
                &step_pointer(start),
                "a cycle with no bound: give one of its steps `max_visits`".to_owned(),
                Some(path),
            );
        }
    }
}

/// A Gate A violation for one tool step, with its witness path from the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateA {
    /// Reached without a covering review.
    Unreviewed(Vec<Hop>),
    /// A covering review's reject route reaches the tool.
    Reject {
        /// The review.
        review: usize,
        /// The witness.
        path: Vec<Hop>,
    },
    /// Entered again after the review, without a new review.
    Reentry {
        /// The review.
        review: usize,
        /// The witness.
        path: Vec<Hop>,
    },
    /// A producer of a bound value runs between the review and the tool.
    After {
        /// The review.
        review: usize,
        /// The producing step.
        producer: usize,
        /// The witness.
        path: Vec<Hop>,
    },
    /// A producer may not have run when the review is reached.
    NotYet {
        /// The review.
        review: usize,
        /// The producing step.
        producer: usize,
        /// The witness.
        path: Vec<Hop>,
    },
}

impl GateA {
    /// The rule it breaks.
    pub fn rule(&self) -> Rule {
        match self {
            GateA::Unreviewed(_) => Rule::UnreviewedPath,
            GateA::Reject { .. } => Rule::RejectReachesTool,
            GateA::Reentry { .. } => Rule::ReentryWithoutReview,
            GateA::After { .. } | GateA::NotYet { .. } => Rule::ValueAfterReview,
        }
    }

    /// The witness path from the entry.
    pub fn path(&self) -> &[Hop] {
        match self {
            GateA::Unreviewed(path)
            | GateA::Reject { path, .. }
            | GateA::Reentry { path, .. }
            | GateA::After { path, .. }
            | GateA::NotYet { path, .. } => path,
        }
    }
}

/// Gate A for the tool step `tool`, covered by the reviews `covering`, whose arguments bind
/// the values of `producers`: every violation, each with a witness path from the entry.
pub fn check_tool(
    graph: &Graph,
    tool: usize,
    covering: &BTreeSet<usize>,
    producers: &BTreeSet<usize>,
) -> Vec<GateA> {
    let mut out = Vec::new();
    let blocked = |v: usize| covering.contains(&v);
    if let Some(path) = graph.path(0, tool, false, &blocked) {
        out.push(GateA::Unreviewed(path));
    }
    for &review in covering {
        // The walks that reach the review at all (through anything).
        let Some(prefix) = graph.path(0, review, false, &|_| false) else {
            continue;
        };
        let through = |exit: Exit, rest: &[Hop]| {
            let mut path = prefix.clone();
            if let Some(last) = path.last_mut() {
                last.exit = Some(exit);
            }
            path.extend_from_slice(rest);
            path
        };
        if let Some(reject) = graph.target(review, Exit::Reject)
            && let Some(rest) = graph.path(reject, tool, false, &blocked)
        {
            out.push(GateA::Reject {
                review,
                path: through(Exit::Reject, &rest),
            });
        }
        let Some(approve) = graph.target(review, Exit::Approve) else {
            continue;
        };
        // The tool itself, or a producer, between the approval and (another visit of) the tool.
        let between = std::iter::once(tool).chain(producers.iter().copied().filter(|&p| p != tool));
        for step in between {
            let Some(first) = graph.path(approve, step, false, &blocked) else {
                continue;
            };
            let Some(second) = graph.path(step, tool, true, &blocked) else {
                continue;
            };
            let mut rest = first;
            rest.pop();
            rest.extend(second);
            let path = through(Exit::Approve, &rest);
            out.push(if step == tool {
                GateA::Reentry { review, path }
            } else {
                GateA::After {
                    review,
                    producer: step,
                    path,
                }
            });
        }
        for &producer in producers.iter().filter(|&&p| p != tool) {
            if !graph.dominates(producer, review)
                && let Some(path) = graph.path(0, review, false, &|v| v == producer)
            {
                out.push(GateA::NotYet {
                    review,
                    producer,
                    path,
                });
            }
        }
    }
    out
}

fn label(contract: &Contract) -> String {
    format!("{}@{}", contract.qualified_name(), contract.version())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// The member chains a CEL expression reads (`steps.draft.output.amount` as its segments),
/// leaving out names bound by comprehensions (`x` in `list.exists(x, x > 1)`).
fn collect_chains(expr: &IdedExpr, bound: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(chain) = chain_of(&expr.expr) {
        if chain.first().is_some_and(|root| !bound.contains(root)) {
            out.push(chain);
        }
        return;
    }
    match &expr.expr {
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                collect_chains(target, bound, out);
            }
            for arg in &call.args {
                collect_chains(arg, bound, out);
            }
        }
        Expr::Select(select) => collect_chains(&select.operand, bound, out),
        Expr::List(list) => {
            for e in &list.elements {
                collect_chains(e, bound, out);
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    collect_chains(&e.key, bound, out);
                    collect_chains(&e.value, bound, out);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    collect_chains(&f.value, bound, out);
                }
            }
        }
        Expr::Comprehension(c) => {
            collect_chains(&c.iter_range, bound, out);
            let before = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            for e in [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                collect_chains(e, bound, out);
            }
            bound.truncate(before);
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// `a.b.c` as its segments, when the expression is exactly a chain of field selections on a
/// name (presence tests `has(a.b)` included).
fn chain_of(expr: &Expr) -> Option<Vec<String>> {
    match expr {
        Expr::Ident(name) => Some(vec![name.clone()]),
        Expr::Select(select) => {
            let mut chain = chain_of(&select.operand.expr)?;
            chain.push(select.field.clone());
            Some(chain)
        }
        _ => None,
    }
}
