//! Tool contracts (PRODUCT §2): the document format, the registration lint, and content ids.
//!
//! A contract document is read (YAML 1.2 core schema or strict JSON) into the JSON data
//! model, then converted field by field into a [`Contract`]; the conversion is the lint, and
//! it reports every problem at once, each with the JSON pointer of the offending node.
//!
//! **Identity.** `tool-contract@sha256:<hex>` is SHA-256 over the RFC 8785 canonical form of
//! the document as authored, minus its `adapter` binding, which gets its own digest.

mod schema;
pub mod walk;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Map, Value};

pub use schema::{CompiledSchema, DRAFT_2020_12};

use crate::canon::{Sha256Digest, canonical_bytes};
use crate::json::{self, Limits, push_pointer_segment};
use crate::records::StoredContract;
use crate::yaml;

/// `tool-contract@sha256:<64 hex>`: the content id of a contract document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContractId(Sha256Digest);

impl ContractId {
    const PREFIX: &'static str = "tool-contract@";

    /// The underlying digest.
    pub fn digest(&self) -> Sha256Digest {
        self.0
    }

    /// Parses `tool-contract@sha256:<64 lowercase hex>`.
    pub fn parse(text: &str) -> Option<Self> {
        Sha256Digest::parse(text.strip_prefix(Self::PREFIX)?).map(ContractId)
    }
}

impl std::fmt::Display for ContractId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.0)
    }
}

/// What a tool does to the world, which decides idempotency and approval requirements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// No side effect.
    Read,
    /// A side effect that can be undone or overwritten.
    Write,
    /// A side effect that cannot be undone (money moved, email sent).
    Irreversible,
    /// A side effect that completes later.
    Async,
}

impl Effect {
    /// The lowercase name used in documents.
    pub const fn as_str(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::Irreversible => "irreversible",
            Effect::Async => "async",
        }
    }

    /// The effect class a document names (`read`, `write`, `irreversible`, `async`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Effect::Read),
            "write" => Some(Effect::Write),
            "irreversible" => Some(Effect::Irreversible),
            "async" => Some(Effect::Async),
            _ => None,
        }
    }

    /// Whether calls must carry an idempotency key (every effect but `read`).
    pub const fn requires_idempotency_key(self) -> bool {
        !matches!(self, Effect::Read)
    }
}

/// Whether calls need a human approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalMode {
    /// No approval.
    None,
    /// Every call needs its own approval, bound to its payload digest.
    PerCall,
}

impl ApprovalMode {
    /// The name used in documents.
    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::None => "none",
            ApprovalMode::PerCall => "per_call",
        }
    }
}

/// The contract's idempotency declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency {
    /// Whether the tool itself deduplicates calls carrying the same key.
    pub honoured: bool,
    /// How long idempotency records are kept.
    pub retention: Duration,
}

/// Retry semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, 1..=10.
    max_attempts: u8,
    /// Whether a tool that does not honour idempotency may still be retried.
    pub tolerate_duplicates: bool,
}

impl RetryPolicy {
    /// The hard ceiling on attempts, checked at registration and again at run time.
    pub const MAX_ATTEMPTS: u8 = 10;

    /// Attempts in total (never above [`RetryPolicy::MAX_ATTEMPTS`]).
    pub fn max_attempts(&self) -> u8 {
        self.max_attempts.min(Self::MAX_ATTEMPTS)
    }
}

/// Call budgets declared by the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    /// Calls per workflow run.
    pub calls_per_run: Option<u64>,
    /// Calls per principal per day.
    pub calls_per_day: Option<u64>,
}

/// The adapter binding: how the tool is executed. Not part of the content id.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterBinding {
    kind: String,
    document: Value,
    digest: Sha256Digest,
}

impl AdapterBinding {
    /// The adapter kind (`http`, `command`, `send_email`, …).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The binding as authored.
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// SHA-256 of the binding's canonical form.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }
}

/// Where a registered contract lives: who may change it and whose calls may use it.
///
/// Platform contracts are registered by the platform operator (its contracts directory or an
/// operator key) and callable by every tenant; a tenant's contracts are registered by that
/// tenant's admin and visible and callable only in that tenant. A tenant sees its own
/// contracts first, then the platform's (a tenant cannot take a name the platform uses).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Namespace {
    /// Registered by the platform operator; callable in every tenant.
    #[default]
    Platform,
    /// Owned by one tenant: visible and callable only there.
    Tenant(String),
}

impl Namespace {
    /// The tenant that owns the contract, if it is a tenant's.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Namespace::Platform => None,
            Namespace::Tenant(t) => Some(t),
        }
    }

    /// How the store keeps it: the empty string for the platform, else the tenant id (tenant
    /// ids are never empty).
    pub fn as_stored(&self) -> &str {
        self.tenant().unwrap_or("")
    }

    /// The inverse of [`Namespace::as_stored`].
    pub fn from_stored(text: &str) -> Self {
        if text.is_empty() {
            Namespace::Platform
        } else {
            Namespace::Tenant(text.to_owned())
        }
    }

    /// Whether a caller of `tenant` may see and call contracts of this namespace.
    pub fn visible_to(&self, tenant: &str) -> bool {
        self.tenant().is_none_or(|t| t == tenant)
    }

    /// `name` qualified by the namespace: `name` for the platform, `tenant/name` for a tenant
    /// (tenant ids cannot contain `/` and names are `[a-z][a-z0-9_]*`, so these never collide).
    pub fn qualify(&self, name: &str) -> String {
        match self {
            Namespace::Platform => name.to_owned(),
            Namespace::Tenant(t) => format!("{t}/{name}"),
        }
    }
}

/// A registered-quality tool contract: every rule of PRODUCT §2 holds.
#[derive(Debug, Clone)]
pub struct Contract {
    id: ContractId,
    namespace: Namespace,
    name: String,
    version: u32,
    description: String,
    owner: String,
    retire_after: Option<time::Date>,
    effect: Effect,
    scopes: BTreeSet<String>,
    approval: ApprovalMode,
    execute_on_approval: bool,
    idempotency: Option<Idempotency>,
    retry: RetryPolicy,
    budget: Budget,
    cost_per_call: u64,
    input: CompiledSchema,
    output: CompiledSchema,
    adapter: Option<AdapterBinding>,
    document: Value,
    guarded: bool,
    /// Whether the input schema marks a field `x-warrant-sensitive`.
    sensitive: bool,
    id_text: String,
}

/// Two contracts are equal when their namespaces, content ids and adapter bindings are: the id
/// is the digest of everything else.
impl PartialEq for Contract {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.namespace == other.namespace
            && self.adapter.as_ref().map(|a| a.digest) == other.adapter.as_ref().map(|a| a.digest)
    }
}

impl Contract {
    /// The content id.
    pub fn id(&self) -> ContractId {
        self.id
    }
    /// The content id as text (`tool-contract@sha256:…`), formatted once.
    pub fn id_str(&self) -> &str {
        &self.id_text
    }
    /// Where the contract is registered (the platform, or one tenant).
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }
    /// The same contract in `namespace` (a registration decides where a linted document lives).
    #[must_use]
    pub fn in_namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }
    /// The name qualified by the namespace (`name`, or `tenant/name`): unique across tenants.
    pub fn qualified_name(&self) -> String {
        self.namespace.qualify(&self.name)
    }
    /// The tool name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The version (immutable once registered).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// What the tool does, for models and reviewers.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// The owning team.
    pub fn owner(&self) -> &str {
        &self.owner
    }
    /// The planned retirement date, if any.
    pub fn retire_after(&self) -> Option<time::Date> {
        self.retire_after
    }
    /// The effect class.
    pub fn effect(&self) -> Effect {
        self.effect
    }
    /// The scopes a caller must hold.
    pub fn scopes(&self) -> &BTreeSet<String> {
        &self.scopes
    }
    /// Whether calls need approval.
    pub fn approval(&self) -> ApprovalMode {
        self.approval
    }
    /// The idempotency declaration (always present for non-read effects).
    pub fn idempotency(&self) -> Option<Idempotency> {
        self.idempotency
    }
    /// Retry semantics.
    pub fn retry(&self) -> RetryPolicy {
        self.retry
    }
    /// Call budgets.
    pub fn budget(&self) -> Budget {
        self.budget
    }
    /// Whether Warrant executes an approved call on the reviewer's decision (the proposer's
    /// later retry answers the stored result) instead of waiting for the proposer to call again.
    pub fn execute_on_approval(&self) -> bool {
        self.execute_on_approval
    }
    /// Cost units charged per committed call.
    pub fn cost_per_call(&self) -> u64 {
        self.cost_per_call
    }
    /// The compiled input schema.
    pub fn input_schema(&self) -> &CompiledSchema {
        &self.input
    }
    /// The compiled output schema.
    pub fn output_schema(&self) -> &CompiledSchema {
        &self.output
    }
    /// The adapter binding, if the document has one.
    pub fn adapter(&self) -> Option<&AdapterBinding> {
        self.adapter.as_ref()
    }
    /// The document as authored, without its adapter binding (what the id is computed over).
    pub fn document(&self) -> &Value {
        &self.document
    }
    /// The authored input schema.
    pub fn input_document(&self) -> Option<&Value> {
        self.document.get("input")
    }
    /// Whether any input field is marked `x-warrant-allowlist` (so guards apply).
    pub fn has_allowlists(&self) -> bool {
        self.guarded
    }
    /// Whether any input field is marked `x-warrant-sensitive`: stored calls then hold only
    /// its keyed hash, so a call cannot be rebuilt (or stored to run later) from them.
    pub fn has_sensitive_fields(&self) -> bool {
        self.sensitive
    }

    /// The record the registry stores.
    pub fn to_stored(&self, registered_at: time::OffsetDateTime) -> StoredContract {
        StoredContract {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            version: self.version,
            content_id: self.id.to_string(),
            body: self.document.clone(),
            binding: self.adapter.as_ref().map(|a| a.document.clone()),
            binding_digest: self.adapter.as_ref().map(|a| a.digest.to_string()),
            registered_at,
            retired_at: None,
        }
    }

    /// Rebuilds (and re-lints) a contract from its stored record, checking that the stored
    /// content id is the one its body hashes to.
    ///
    /// # Errors
    /// The lint problems, or a problem saying the record does not match its id.
    pub fn from_stored(stored: &StoredContract) -> Result<Contract, Vec<LintProblem>> {
        let mut document = stored.body.clone();
        if let (Some(binding), Value::Object(map)) = (&stored.binding, &mut document) {
            map.insert("adapter".to_owned(), binding.clone());
        }
        let contract = Contract::read(document, Rules::Stored)?.in_namespace(stored.namespace.clone());
        if contract.id.to_string() != stored.content_id {
            return Err(vec![LintProblem::new(
                "",
                "the stored contract does not hash to its content id",
            )]);
        }
        Ok(contract)
    }

    /// Reads and lints a contract from its text; `.json` documents are parsed as strict JSON,
    /// anything else as YAML 1.2.
    ///
    /// # Errors
    /// [`ContractError::Syntax`] when the text cannot be read, [`ContractError::Lint`] with
    /// every problem when the document breaks a rule.
    pub fn from_text(text: &str, format: DocumentFormat) -> Result<Contract, ContractError> {
        let document = read_document(text, format)?;
        Contract::from_document(document).map_err(ContractError::Lint)
    }

    /// Lints a contract document already in the JSON data model.
    ///
    /// # Errors
    /// Every problem found, each with the pointer of the offending node.
    pub fn from_document(document: Value) -> Result<Contract, Vec<LintProblem>> {
        Contract::read(document, Rules::Registration)
    }

    fn read(mut document: Value, rules: Rules) -> Result<Contract, Vec<LintProblem>> {
        let mut p = Problems::default();
        let Value::Object(map) = &mut document else {
            return Err(vec![LintProblem::new(
                "",
                "a contract must be a mapping of fields",
            )]);
        };
        let adapter_doc = map.remove("adapter");
        for key in map.keys() {
            if !TOP_LEVEL.contains(&key.as_str()) && !key.starts_with("x-") {
                p.push(
                    &format!("/{}", escape(key)),
                    &format!("unknown contract field `{key}`"),
                );
            }
        }
        let map: &Map<String, Value> = map;
        let mut f = Fields {
            map,
            problems: &mut p,
        };
        let name = f.required_str("name").and_then(|(s, ptr)| {
            if is_identifier(s, 64) {
                Some(s.to_owned())
            } else {
                f.problems.push(
                    &ptr,
                    "name must start with a lowercase letter and use only a-z, 0-9 and `_` (at most 64)",
                );
                None
            }
        });
        let version = f.required("version").and_then(|v| match v.as_u64() {
            Some(n @ 1..) => u32::try_from(n).ok(),
            _ => {
                f.problems.push("/version", "version must be a positive integer");
                None
            }
        });
        let description = f
            .required_str("description")
            .and_then(|(s, ptr)| non_empty_bounded(s, 2048, &ptr, f.problems).map(str::to_owned));
        let owner = f
            .required_str("owner")
            .and_then(|(s, ptr)| non_empty_bounded(s, 256, &ptr, f.problems).map(str::to_owned));
        let retire_after = f.optional("retire_after").and_then(|v| {
            let parsed = v.as_str().and_then(|s| {
                time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]")).ok()
            });
            if parsed.is_none() {
                f.problems
                    .push("/retire_after", "retire_after must be a date written YYYY-MM-DD");
            }
            parsed
        });
        let effect = f.required_str("effect").and_then(|(s, ptr)| {
            let e = Effect::parse(s);
            if e.is_none() {
                f.problems
                    .push(&ptr, "effect must be one of read, write, irreversible, async");
            }
            e
        });
        let scopes = f.required("scopes").and_then(|v| parse_scopes(v, f.problems));
        let approval = match f.optional("approval") {
            None => Some(ApprovalMode::None),
            Some(Value::String(s)) if s == "none" => Some(ApprovalMode::None),
            Some(Value::String(s)) if s == "per_call" => Some(ApprovalMode::PerCall),
            Some(_) => {
                f.problems
                    .push("/approval", "approval must be `none` or `per_call`");
                None
            }
        };
        let execute_on_approval = match f.optional("execute_on_approval") {
            None => Some(false),
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                f.problems.push(
                    "/execute_on_approval",
                    "execute_on_approval must be true or false",
                );
                None
            }
        };
        if execute_on_approval == Some(true) && approval == Some(ApprovalMode::None) {
            f.problems.push(
                "/execute_on_approval",
                "execute_on_approval needs `approval: per_call`",
            );
        }
        // A call run for its proposer answers the proposer's retry from its idempotency
        // record: only effects that always carry a key.
        if execute_on_approval == Some(true) && effect == Some(Effect::Read) {
            f.problems.push(
                "/execute_on_approval",
                "execute_on_approval needs a write, irreversible or async effect (a read carries no idempotency key to answer the retry from)",
            );
        }
        let idempotency = match f.optional("idempotency") {
            None => {
                if effect.is_some_and(Effect::requires_idempotency_key) {
                    f.problems.push(
                        "",
                        "a write, irreversible or async effect must declare `idempotency`",
                    );
                }
                None
            }
            Some(v) => parse_idempotency(v, f.problems),
        };
        let retry = match f.optional("retry") {
            None => Some(RetryPolicy {
                max_attempts: 1,
                tolerate_duplicates: false,
            }),
            Some(v) => parse_retry(v, f.problems),
        };
        let budget = match f.optional("budget") {
            None => Some(Budget::default()),
            Some(v) => parse_budget(v, f.problems),
        };
        let cost_per_call = match f.optional("cost") {
            None => Some(0),
            Some(v) => parse_cost(v, f.problems),
        };
        let input_doc = f.required("input");
        if let Some(input) = input_doc {
            schema::lint_input(input, "/input", f.problems);
            if rules == Rules::Registration {
                schema::lint_in_place_cycles(input, "/input", f.problems);
            }
        }
        let output_doc = f.required("output");
        let p = f.problems;
        // Compile only what linted clean, so compile errors are not reported twice.
        let input = input_doc
            .filter(|_| p.is_empty())
            .and_then(|s| compile(s, "/input", p));
        let before = p.0.len();
        if let Some(output) = output_doc.filter(|_| rules == Rules::Registration) {
            schema::lint_in_place_cycles(output, "/output", p);
        }
        let output = output_doc
            .filter(|_| p.0.len() == before)
            .and_then(|s| compile(s, "/output", p));
        let adapter = adapter_doc.and_then(|doc| parse_adapter(doc, p));

        let problems = std::mem::take(&mut p.0);
        match (
            name,
            version,
            description,
            owner,
            effect,
            scopes,
            approval,
            execute_on_approval,
            retry,
            budget,
            cost_per_call,
            input,
            output,
        ) {
            (
                Some(name),
                Some(version),
                Some(description),
                Some(owner),
                Some(effect),
                Some(scopes),
                Some(approval),
                Some(execute_on_approval),
                Some(retry),
                Some(budget),
                Some(cost_per_call),
                Some(input),
                Some(output),
            ) if problems.is_empty() => {
                let id = ContractId(Sha256Digest::of_bytes(&canonical_bytes(&document)));
                let guarded = document
                    .get("input")
                    .is_some_and(|i| mentions(i, "x-warrant-allowlist"));
                let sensitive = document
                    .get("input")
                    .is_some_and(|i| mentions(i, "x-warrant-sensitive"));
                Ok(Contract {
                    id_text: id.to_string(),
                    guarded,
                    sensitive,
                    id,
                    namespace: Namespace::Platform,
                    name,
                    version,
                    description,
                    owner,
                    retire_after,
                    effect,
                    scopes,
                    approval,
                    execute_on_approval,
                    idempotency,
                    retry,
                    budget,
                    cost_per_call,
                    input,
                    output,
                    adapter,
                    document,
                })
            }
            _ => Err(if problems.is_empty() {
                vec![LintProblem::new("", "the contract is incomplete")]
            } else {
                problems
            }),
        }
    }
}

/// How a contract document is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentFormat {
    /// Strict JSON.
    Json,
    /// YAML 1.2, core schema.
    Yaml,
}

impl DocumentFormat {
    /// `.json` files are JSON; everything else is read as YAML.
    pub fn from_path(path: &str) -> Self {
        if path.to_ascii_lowercase().ends_with(".json") {
            DocumentFormat::Json
        } else {
            DocumentFormat::Yaml
        }
    }
}

/// Reads a document into the JSON data model (no linting).
///
/// # Errors
/// [`ContractError::Syntax`] with the position of the problem.
pub fn read_document(text: &str, format: DocumentFormat) -> Result<Value, ContractError> {
    match format {
        DocumentFormat::Json => {
            json::parse(text.as_bytes(), Limits::DOCUMENT).map_err(|e| ContractError::Syntax(e.to_string()))
        }
        DocumentFormat::Yaml => {
            yaml::parse(text, Limits::DOCUMENT).map_err(|e| ContractError::Syntax(e.to_string()))
        }
    }
}

/// Why a contract could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// The text is not a readable YAML or JSON document.
    #[error("cannot read the document: {0}")]
    Syntax(String),
    /// The document breaks one or more contract rules.
    #[error("{} problem(s) in the contract", .0.len())]
    Lint(Vec<LintProblem>),
}

/// Which rules a contract document is read under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// Every rule: a contract being registered.
    Registration,
    /// A contract already registered, read back from the store: the rules it was registered
    /// under, without those added since (a schema that applies itself in place), so that a
    /// server keeps loading, with unchanged behaviour, what an earlier version accepted. Its
    /// content id is checked as always.
    Stored,
}

/// One registration problem: where (a JSON pointer into the document) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LintProblem {
    pointer: String,
    message: String,
}

impl LintProblem {
    fn new(pointer: &str, message: &str) -> Self {
        LintProblem {
            pointer: pointer.to_owned(),
            message: message.to_owned(),
        }
    }

    /// RFC 6901 pointer to the offending node (empty for the whole document).
    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for LintProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "{at}: {}", self.message)
    }
}

/// Lints a schema that closes untrusted input the way a contract's `input` is closed (PRODUCT
/// §2: `type: object`, every object closed, known keywords only, annotations where the walk
/// applies them), rooted at `pointer`; used for a workflow's `input`. Returns every problem,
/// or compiles the schema when there are none.
///
/// # Errors
/// The problems, each with the pointer of the offending node.
pub fn lint_input_schema(schema: &Value, pointer: &str) -> Result<CompiledSchema, Vec<LintProblem>> {
    let mut problems = Problems::default();
    schema::lint_input(schema, pointer, &mut problems);
    schema::lint_in_place_cycles(schema, pointer, &mut problems);
    if !problems.is_empty() {
        return Err(problems.0);
    }
    CompiledSchema::compile(schema).map_err(|e| vec![LintProblem::new(pointer, &e)])
}

#[derive(Default)]
struct Problems(Vec<LintProblem>);

impl Problems {
    fn push(&mut self, pointer: &str, message: &str) {
        self.0.push(LintProblem::new(pointer, message));
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const TOP_LEVEL: &[&str] = &[
    "name",
    "version",
    "description",
    "owner",
    "retire_after",
    "effect",
    "scopes",
    "approval",
    "execute_on_approval",
    "idempotency",
    "retry",
    "budget",
    "cost",
    "input",
    "output",
];

struct Fields<'a> {
    map: &'a Map<String, Value>,
    problems: &'a mut Problems,
}

impl<'a> Fields<'a> {
    fn optional(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    fn required(&mut self, key: &str) -> Option<&'a Value> {
        let v = self.map.get(key);
        if v.is_none() {
            self.problems
                .push(&format!("/{key}"), &format!("`{key}` is required"));
        }
        v
    }

    fn required_str(&mut self, key: &str) -> Option<(&'a str, String)> {
        let ptr = format!("/{key}");
        match self.required(key) {
            Some(Value::String(s)) => Some((s.as_str(), ptr)),
            Some(_) => {
                self.problems.push(&ptr, &format!("`{key}` must be a string"));
                None
            }
            None => None,
        }
    }
}

/// Whether `schema` uses the keyword `keyword` anywhere.
fn mentions(schema: &Value, keyword: &str) -> bool {
    match schema {
        Value::Object(map) => map.iter().any(|(k, v)| k == keyword || mentions(v, keyword)),
        Value::Array(items) => items.iter().any(|v| mentions(v, keyword)),
        _ => false,
    }
}

fn escape(key: &str) -> String {
    let mut s = String::new();
    push_pointer_segment(&mut s, key);
    s
}

/// `^[a-z][a-z0-9_]*$`, at most `max` characters.
pub(crate) fn is_identifier(s: &str, max: usize) -> bool {
    let mut chars = s.chars();
    s.len() <= max
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn non_empty_bounded<'a>(s: &'a str, max: usize, ptr: &str, p: &mut Problems) -> Option<&'a str> {
    if s.trim().is_empty() || s.chars().count() > max {
        p.push(
            ptr,
            &format!("must be a non-empty string of at most {max} characters"),
        );
        None
    } else {
        Some(s)
    }
}

/// A scope is 1..=128 printable ASCII characters without whitespace or commas.
pub fn is_valid_scope(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic() && b != b',')
}

fn parse_scopes(v: &Value, p: &mut Problems) -> Option<BTreeSet<String>> {
    let Value::Array(items) = v else {
        p.push("/scopes", "scopes must be a list of scope names");
        return None;
    };
    let mut out = BTreeSet::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some(s) if is_valid_scope(s) => {
                if !out.insert(s.to_owned()) {
                    p.push(&format!("/scopes/{i}"), "duplicate scope");
                    ok = false;
                }
            }
            _ => {
                p.push(
                    &format!("/scopes/{i}"),
                    "a scope is 1 to 128 printable characters without spaces or commas",
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn closed_object<'a>(
    v: &'a Value,
    ptr: &str,
    allowed: &[&str],
    p: &mut Problems,
) -> Option<&'a Map<String, Value>> {
    let Value::Object(map) = v else {
        p.push(ptr, "must be a mapping");
        return None;
    };
    let mut ok = true;
    for key in map.keys() {
        if !allowed.contains(&key.as_str()) {
            p.push(
                &format!("{ptr}/{}", escape(key)),
                &format!("unknown field `{key}`"),
            );
            ok = false;
        }
    }
    ok.then_some(map)
}

fn parse_idempotency(v: &Value, p: &mut Problems) -> Option<Idempotency> {
    let map = closed_object(v, "/idempotency", &["honoured", "retention"], p)?;
    let honoured = match map.get("honoured") {
        Some(Value::Bool(b)) => Some(*b),
        _ => {
            p.push("/idempotency/honoured", "honoured must be true or false");
            None
        }
    };
    let retention = match map.get("retention") {
        None => Some(Duration::from_secs(24 * 3600)),
        Some(Value::String(s)) => {
            let d =
                parse_duration(s).filter(|d| *d > Duration::ZERO && *d <= Duration::from_secs(366 * 86_400));
            if d.is_none() {
                p.push(
                    "/idempotency/retention",
                    "retention must be a duration such as 30m, 24h or 7d, at most 366d",
                );
            }
            d
        }
        Some(_) => {
            p.push(
                "/idempotency/retention",
                "retention must be a duration such as 30m, 24h or 7d",
            );
            None
        }
    };
    Some(Idempotency {
        honoured: honoured?,
        retention: retention?,
    })
}

/// Parses `<n>s`, `<n>m`, `<n>h` or `<n>d`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let unit = text.chars().last()?;
    let digits = text.get(..text.len() - unit.len_utf8())?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let secs = match unit {
        's' => Some(n),
        'm' => n.checked_mul(60),
        'h' => n.checked_mul(3600),
        'd' => n.checked_mul(86_400),
        _ => None,
    }?;
    Some(Duration::from_secs(secs))
}

fn parse_retry(v: &Value, p: &mut Problems) -> Option<RetryPolicy> {
    let map = closed_object(v, "/retry", &["max_attempts", "tolerate_duplicates"], p)?;
    let max_attempts = match map.get("max_attempts").and_then(Value::as_u64) {
        Some(n @ 1..=10) => u8::try_from(n).ok(),
        _ => {
            p.push(
                "/retry/max_attempts",
                "max_attempts must be an integer from 1 to 10",
            );
            None
        }
    };
    let tolerate_duplicates = match map.get("tolerate_duplicates") {
        None => Some(false),
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            p.push(
                "/retry/tolerate_duplicates",
                "tolerate_duplicates must be true or false",
            );
            None
        }
    };
    Some(RetryPolicy {
        max_attempts: max_attempts?,
        tolerate_duplicates: tolerate_duplicates?,
    })
}

fn positive(map: &Map<String, Value>, key: &str, ptr: &str, p: &mut Problems) -> Result<Option<u64>, ()> {
    match map.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n @ 1..) => Ok(Some(n)),
            _ => {
                p.push(
                    &format!("{ptr}/{key}"),
                    &format!("{key} must be a positive integer"),
                );
                Err(())
            }
        },
    }
}

fn parse_budget(v: &Value, p: &mut Problems) -> Option<Budget> {
    let map = closed_object(v, "/budget", &["calls_per_run", "calls_per_day"], p)?;
    let calls_per_run = positive(map, "calls_per_run", "/budget", p);
    let calls_per_day = positive(map, "calls_per_day", "/budget", p);
    Some(Budget {
        calls_per_run: calls_per_run.ok()?,
        calls_per_day: calls_per_day.ok()?,
    })
}

fn parse_cost(v: &Value, p: &mut Problems) -> Option<u64> {
    let map = closed_object(v, "/cost", &["per_call"], p)?;
    match map.get("per_call") {
        Some(v) if v.is_u64() => v.as_u64(),
        _ => {
            p.push("/cost/per_call", "per_call must be a non-negative integer");
            None
        }
    }
}

fn compile(schema: &Value, ptr: &str, p: &mut Problems) -> Option<CompiledSchema> {
    match CompiledSchema::compile(schema) {
        Ok(c) => Some(c),
        Err(message) => {
            p.push(ptr, &format!("invalid JSON Schema: {message}"));
            None
        }
    }
}

fn parse_adapter(doc: Value, p: &mut Problems) -> Option<AdapterBinding> {
    let kind = match doc.get("kind") {
        Some(Value::String(k)) if is_identifier(k, 64) => k.clone(),
        _ => {
            p.push(
                "/adapter/kind",
                "an adapter binding must name its `kind` (for example http, command, send_email)",
            );
            return None;
        }
    };
    let digest = Sha256Digest::of_bytes(&canonical_bytes(&doc));
    Some(AdapterBinding {
        kind,
        document: doc,
        digest,
    })
}
