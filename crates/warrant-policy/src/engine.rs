//! `CedarEngine`: loading (parse, id assignment, strict validation against the generated
//! schema) and answering one request from pre-built parts.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use cedar_policy::{
    ActionConstraint, AuthorizationError, Authorizer, Decision, Entities, Entity, EntityId, EntityTypeName,
    EntityUid, EvaluationError, Policy, PolicyId, PolicySet, PrincipalConstraint, Request,
    RequestValidationError, RestrictedExpression, Schema, ValidationMode, Validator,
};
use serde_json::Value;
use warrant_core::policy::{PolicyAction, PolicyEngine, PolicyRequest, PolicyVerdict};
use warrant_core::{Contract, ContractId};

use crate::mapping::{self, Attribute};
use crate::schema::{self, NAMESPACE, ToolShape};

/// The text of one policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySource {
    /// The file name, used in default policy ids (`<name>#<index>`) and in messages.
    pub name: String,
    /// The policies, in Cedar's text syntax.
    pub text: String,
}

impl PolicySource {
    /// A named policy text.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        PolicySource {
            name: name.into(),
            text: text.into(),
        }
    }

    /// Every `*.cedar` file of `dir`, sorted by file name (the name is the source's name).
    ///
    /// # Errors
    /// [`PolicyLoadError::Io`] when the directory or a file cannot be read.
    pub fn read_dir(dir: &Path) -> Result<Vec<PolicySource>, PolicyLoadError> {
        let io = |path: &Path, e: std::io::Error| PolicyLoadError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
            let entry = entry.map_err(|e| io(dir, e))?;
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "cedar") && path.is_file() {
                files.push((entry.file_name().to_string_lossy().into_owned(), path));
            }
        }
        files.sort();
        let mut sources = Vec::with_capacity(files.len());
        for (name, path) in files {
            let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
            sources.push(PolicySource { name, text });
        }
        Ok(sources)
    }
}

/// One reason a set of policies was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyProblem {
    /// The policy file at fault; `None` for problems of the contracts or the generated schema.
    pub file: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for PolicyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{file}: {}", self.message),
            None => write!(f, "schema: {}", self.message),
        }
    }
}

/// Why policies could not be loaded. Nothing is half-loaded: any problem refuses the set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyLoadError {
    /// The policy directory or one of its files could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The path that could not be read.
        path: String,
        /// The operating system's reason.
        message: String,
    },
    /// Problems in the policies or in the schema generated from the contracts, every one.
    #[error("{} problem(s) in the policies:{}", .0.len(), join(.0))]
    Invalid(Vec<PolicyProblem>),
}

/// One problem a line, each under the count.
fn join(problems: &[PolicyProblem]) -> String {
    problems.iter().map(|p| format!("\n  - {p}")).collect()
}

/// Cedar policies validated against the schema generated from a set of contracts, ready to
/// answer [`PolicyRequest`]s. Cheap to clone (one `Arc`); everything a request needs besides
/// the principal, the tenant and the arguments is built at load.
#[derive(Clone)]
pub struct CedarEngine {
    inner: Arc<Inner>,
}

struct Inner {
    authorizer: Authorizer,
    principal_type: EntityTypeName,
    role_type: EntityTypeName,
    /// qualified name (`name`, or `tenant/name` for a tenant's contract) → version → tool.
    tools: HashMap<String, HashMap<u32, Tool>>,
    policy_ids: Vec<String>,
    /// Entity stores per (contract, action, principal): building one costs more than the
    /// evaluation itself, and a principal calls the same tools over and over.
    /// Keyed by a hash of [`EntitiesKey`]; entries keep their key and are compared on a hit,
    /// so a lookup allocates nothing and a hash collision can never return another's store.
    entities: RwLock<HashMap<u64, Bucket, BuildHasherDefault<Prehashed>>>,
    /// The hasher of [`EntitiesKey`]s (seeded per engine).
    entities_hasher: foldhash::fast::RandomState,
}

/// The hasher of a map whose keys are already hashes: hashing them again only costs time.
#[derive(Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `u64` keys (`write_u64` below); a plain fold for completeness.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Per (contract, action, principal): the principal's uid, the entity store, and the
/// policies whose principal scope can match.
type Prepared = (EntityUid, Entities, PolicySet);

/// The prepared entries whose keys share one hash.
type Bucket = Vec<(EntitiesKey, Arc<Prepared>)>;

/// What an entity store depends on: the action's hierarchy, the tool, and the principal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EntitiesKey {
    contract: ContractId,
    action: PolicyAction,
    tenant: String,
    principal: String,
    roles: Vec<String>,
}

impl EntitiesKey {
    fn matches(
        &self,
        contract: ContractId,
        action: PolicyAction,
        p: &warrant_core::authority::Principal,
    ) -> bool {
        self.contract == contract
            && self.action == action
            && self.tenant == p.tenant()
            && self.principal == p.id()
            && self.roles.iter().eq(p.roles().iter())
    }
}

fn entities_hash(
    hasher: &foldhash::fast::RandomState,
    contract: ContractId,
    action: PolicyAction,
    p: &warrant_core::authority::Principal,
) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = hasher.build_hasher();
    contract.hash(&mut h);
    action.hash(&mut h);
    p.tenant().hash(&mut h);
    p.id().hash(&mut h);
    for role in p.roles() {
        role.hash(&mut h);
    }
    h.finish()
}

/// Bound on cached entity stores; the cache starts over when it is full.
const ENTITIES_CACHE: usize = 4096;

/// Everything about one contract that does not depend on the request.
struct Tool {
    id: ContractId,
    label: String,
    uid: EntityUid,
    /// `name`, `version`, `effect`, `owner`, `platform` (the `tenant` is the caller's).
    attributes: Vec<(String, RestrictedExpression)>,
    /// The invoke actions' context attributes.
    context: Vec<Attribute>,
    /// The review actions' context attributes (no sensitive field).
    review_context: Vec<Attribute>,
    invoke: Action,
    review: Action,
    reveal: Action,
}

impl Tool {
    /// The action `action` names on this tool, and its context attributes (a reveal is asked
    /// with a review's context).
    fn action(&self, action: PolicyAction) -> (&Action, &[Attribute]) {
        match action {
            PolicyAction::Invoke => (&self.invoke, &self.context),
            PolicyAction::Review => (&self.review, &self.review_context),
            PolicyAction::Reveal => (&self.reveal, &self.review_context),
        }
    }
}

/// One action of one contract.
struct Action {
    uid: EntityUid,
    /// The action and its groups with their hierarchy closed, so `action in` works; each
    /// request adds its principal and tool to a clone (only those two get their closure
    /// computed, which is cheaper than building the store from scratch).
    entities: Entities,
    /// The policies whose action scope matches this action (the others cannot apply).
    policies: Vec<Scoped>,
}

/// A policy whose action scope matches its action, prepared for evaluation.
///
/// Which policies apply to a request is decided by their principal and action scopes, and
/// for one action and one principal that answer never changes: the action's scope is decided
/// once here and the principal's once per principal ([`Inner::policies_for`]), both exactly
/// (see there). Cedar then evaluates `lifted`: the same policy (id, effect, annotations,
/// resource scope, conditions) with its principal and action scopes lifted to `principal`
/// and `action`, which is equivalent for every request it is used for, and spares each call
/// evaluating the scopes again (building the `action in [...]` set, the entity and ancestor
/// look-ups): that was a third of Cedar's time per call.
struct Scoped {
    /// The policy's principal scope, as written.
    principal: PrincipalConstraint,
    /// The policy with its principal and action scopes lifted.
    lifted: Policy,
}

/// `policy` with its principal and action scopes replaced by `principal` and `action`
/// (nothing else changes: the id is kept, annotations, resource scope and conditions are
/// carried over by Cedar's own JSON form).
fn lift_scopes(policy: &Policy) -> Result<Policy, String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot prepare policy `{}`: {e}", policy.id());
    let mut est = policy.to_json().map_err(|e| fail(&e))?;
    let Some(fields) = est.as_object_mut() else {
        return Err(fail(&"unexpected JSON form"));
    };
    for scope in ["principal", "action"] {
        fields.insert(scope.to_owned(), serde_json::json!({ "op": "All" }));
    }
    Policy::from_json(Some(policy.id().clone()), est).map_err(|e| fail(&e))
}

/// The entity type names, parsed once.
struct Types {
    principal: EntityTypeName,
    role: EntityTypeName,
    tool: EntityTypeName,
    action: EntityTypeName,
}

impl Types {
    fn new() -> Result<Types, String> {
        let parse = |name: &str| {
            EntityTypeName::from_str(&format!("{NAMESPACE}::{name}"))
                .map_err(|e| format!("cannot name the entity type {name}: {e}"))
        };
        Ok(Types {
            principal: parse("Principal")?,
            role: parse("Role")?,
            tool: parse("Tool")?,
            action: parse("Action")?,
        })
    }
}

impl std::fmt::Debug for CedarEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut tools: Vec<String> = self
            .inner
            .tools
            .values()
            .flat_map(|versions| versions.values().map(|t| t.label.clone()))
            .collect();
        tools.sort();
        f.debug_struct("CedarEngine")
            .field("tools", &tools)
            .field("policies", &self.inner.policy_ids)
            .finish()
    }
}

impl CedarEngine {
    /// Generates the schema from `contracts`, parses every policy (Cedar text syntax) and
    /// validates the set in strict mode. Policy ids are the `@id("...")` annotation, else
    /// `<file name>#<index>` (the index counts policies from 0 within the file).
    ///
    /// # Errors
    /// [`PolicyLoadError::Invalid`] listing every problem, each with its file name: syntax
    /// errors, templates, duplicate ids, validation errors and warnings, and contracts that
    /// cannot be represented (a name taken by an action group).
    pub fn new(contracts: &[Arc<Contract>], sources: &[PolicySource]) -> Result<Self, PolicyLoadError> {
        let types = Types::new()
            .map_err(|message| PolicyLoadError::Invalid(vec![PolicyProblem { file: None, message }]))?;
        let (tools, contract_problems) = schema::collect(contracts);
        // Without a sound schema there is nothing to validate against; otherwise the policies
        // that parsed are validated even when another file did not, so every problem is listed.
        let schema_is_sound = contract_problems.is_empty();
        let mut problems: Vec<PolicyProblem> = contract_problems
            .into_iter()
            .map(|message| PolicyProblem { file: None, message })
            .collect();
        let (policies, files) = parse_sources(sources, &mut problems);
        let mut validated = false;
        if schema_is_sound {
            match Schema::from_json_value(schema::schema_json(&tools)) {
                Ok(generated) => {
                    match PolicySet::from_policies(policies.iter().cloned()) {
                        Ok(set) => problems.extend(validate(&generated, &set, &files)),
                        Err(e) => problems.push(set_problem(&e)),
                    }
                    validated = true;
                }
                Err(e) => problems.push(PolicyProblem {
                    file: None,
                    message: format!("the generated schema is invalid: {e}"),
                }),
            }
        }
        if !validated || !problems.is_empty() {
            return Err(PolicyLoadError::Invalid(problems));
        }
        let mut by_name: HashMap<String, HashMap<u32, Tool>> = HashMap::new();
        for shape in tools {
            let name = shape.contract.qualified_name();
            let version = shape.contract.version();
            let tool = build_tool(shape, &types, &policies)?;
            by_name.entry(name).or_default().insert(version, tool);
        }
        Ok(CedarEngine {
            inner: Arc::new(Inner {
                authorizer: Authorizer::new(),
                principal_type: types.principal,
                role_type: types.role,
                tools: by_name,
                policy_ids: policies.iter().map(|p| p.id().to_string()).collect(),
                entities: RwLock::default(),
                entities_hasher: foldhash::fast::RandomState::default(),
            }),
        })
    }

    /// Reads every `*.cedar` file of `dir`, sorted by file name, and loads them with
    /// [`CedarEngine::new`]. The only I/O of the crate. An empty directory loads no policy
    /// (every request is then denied by default).
    ///
    /// # Errors
    /// [`PolicyLoadError::Io`] when the directory or a file cannot be read, otherwise as
    /// [`CedarEngine::new`].
    pub fn load_dir(contracts: &[Arc<Contract>], dir: &Path) -> Result<Self, PolicyLoadError> {
        CedarEngine::new(contracts, &PolicySource::read_dir(dir)?)
    }

    /// The Cedar schema generated for `contracts`, in Cedar's JSON schema format (for `docs`
    /// and debugging). Policies are validated against exactly this schema.
    pub fn schema_json(contracts: &[Arc<Contract>]) -> Value {
        schema::schema_json(&schema::collect(contracts).0)
    }

    /// The ids of the loaded policies, in load order (sources as given — by file name for
    /// [`CedarEngine::load_dir`] — and policies by position).
    pub fn policy_ids(&self) -> &[String] {
        &self.inner.policy_ids
    }
}

/// Parses every source, assigns the policy ids and records syntax problems, templates and
/// duplicate ids. Returns the policies and the file of each id.
fn parse_sources(
    sources: &[PolicySource],
    problems: &mut Vec<PolicyProblem>,
) -> (Vec<Policy>, HashMap<String, String>) {
    let mut policies = Vec::new();
    let mut files: HashMap<String, String> = HashMap::new();
    for source in sources {
        let problem = |message: String| PolicyProblem {
            file: Some(source.name.clone()),
            message,
        };
        let set = match PolicySet::from_str(&source.text) {
            Ok(set) => set,
            Err(errors) => {
                problems.extend(errors.iter().map(|e| problem(format!("syntax error: {e}"))));
                continue;
            }
        };
        if set.templates().next().is_some() {
            problems.push(problem(
                "templates (policies with `?principal` or `?resource` slots) are not supported".into(),
            ));
        }
        let mut parsed: Vec<(usize, &Policy)> = set
            .policies()
            .enumerate()
            .map(|(i, p)| (parser_index(p.id()).unwrap_or(i), p))
            .collect();
        parsed.sort_by_key(|(index, _)| *index);
        for (index, policy) in parsed {
            let id = match policy.annotation("id") {
                Some("") => {
                    problems.push(problem(format!("policy #{index} has an empty `@id`")));
                    continue;
                }
                Some(id) => id.to_owned(),
                None => format!("{}#{index}", source.name),
            };
            if let Some(other) = files.get(&id) {
                problems.push(problem(format!("policy id `{id}` is also used in {other}")));
                continue;
            }
            files.insert(id.clone(), source.name.clone());
            policies.push(policy.new_id(PolicyId::new(&id)));
        }
    }
    (policies, files)
}

/// The position of a policy in its file, from the id the parser gives it (`policy<N>`).
fn parser_index(id: &PolicyId) -> Option<usize> {
    id.to_string().strip_prefix("policy")?.parse().ok()
}

/// Strict validation; warnings (a policy that can never apply, confusable text) refuse the
/// set too, because a policy that silently never matches is a mistake.
fn validate(schema: &Schema, set: &PolicySet, files: &HashMap<String, String>) -> Vec<PolicyProblem> {
    let result = Validator::new(schema.clone()).validate(set, ValidationMode::Strict);
    let problem = |id: &PolicyId, message: String| {
        // Cedar prefixes most (not all) messages with the policy; say it once, the same way.
        let prefix = format!("for policy `{id}`, ");
        let message = message.strip_prefix(&prefix).unwrap_or(&message);
        PolicyProblem {
            file: files.get(AsRef::<str>::as_ref(id)).cloned(),
            message: format!("policy `{id}`: {message}"),
        }
    };
    let mut problems: Vec<PolicyProblem> = result
        .validation_errors()
        .map(|e| problem(e.policy_id(), e.to_string()))
        .chain(
            result
                .validation_warnings()
                .map(|w| problem(w.policy_id(), w.to_string())),
        )
        .collect();
    problems.sort_by(|a, b| (&a.file, &a.message).cmp(&(&b.file, &b.message)));
    problems
}

fn build_tool(shape: ToolShape, types: &Types, policies: &[Policy]) -> Result<Tool, PolicyLoadError> {
    let contract = shape.contract;
    let label = schema::label(&contract);
    let uid = EntityUid::from_type_name_and_id(types.tool.clone(), EntityId::new(&label));
    let attributes = vec![
        (
            "name".to_owned(),
            RestrictedExpression::new_string(contract.name().to_owned()),
        ),
        (
            "version".to_owned(),
            RestrictedExpression::new_long(i64::from(contract.version())),
        ),
        (
            "effect".to_owned(),
            RestrictedExpression::new_string(contract.effect().as_str().to_owned()),
        ),
        (
            "owner".to_owned(),
            RestrictedExpression::new_string(contract.owner().to_owned()),
        ),
        (
            "platform".to_owned(),
            RestrictedExpression::new_bool(contract.namespace().tenant().is_none()),
        ),
    ];
    let invoke = build_action(schema::invoke_chain(&contract), types, policies)?;
    let review = build_action(schema::review_chain(&contract), types, policies)?;
    let reveal = build_action(schema::reveal_chain(&contract), types, policies)?;
    Ok(Tool {
        id: contract.id(),
        label,
        uid,
        attributes,
        context: shape.context,
        review_context: shape.review_context,
        invoke,
        review,
        reveal,
    })
}

/// The action `chain[0]` with its groups `chain[1]` ⊂ `chain[2]`, and the policies whose
/// action scope can match it.
fn build_action(chain: [String; 3], types: &Types, policies: &[Policy]) -> Result<Action, PolicyLoadError> {
    let [uid, group, root] =
        chain.map(|id| EntityUid::from_type_name_and_id(types.action.clone(), EntityId::new(id)));
    let entities = Entities::from_entities(
        [
            Entity::new_no_attrs(uid.clone(), HashSet::from([group.clone(), root.clone()])),
            Entity::new_no_attrs(group.clone(), HashSet::from([root.clone()])),
            Entity::new_no_attrs(root.clone(), HashSet::new()),
        ],
        None,
    )
    .map_err(|e| {
        PolicyLoadError::Invalid(vec![PolicyProblem {
            file: None,
            message: format!("cannot build the action entities: {e}"),
        }])
    })?;
    // Exactly Cedar's `action == …` and `action in […]` for this action: its only ancestors
    // are its two groups (the store above), and `in` also holds for the action itself.
    let ancestors = [&uid, &group, &root];
    let applicable = policies.iter().filter(|p| match p.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(action) => action == uid,
        ActionConstraint::In(groups) => groups.iter().any(|g| ancestors.contains(&g)),
    });
    let policies = applicable
        .map(|policy| {
            Ok(Scoped {
                principal: policy.principal_constraint(),
                lifted: lift_scopes(policy)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(|message| PolicyLoadError::Invalid(vec![PolicyProblem { file: None, message }]))?;
    Ok(Action {
        uid,
        entities,
        policies,
    })
}

fn set_problem(error: &cedar_policy::PolicySetError) -> PolicyProblem {
    PolicyProblem {
        file: None,
        message: error.to_string(),
    }
}

fn deny(errors: Vec<String>) -> PolicyVerdict {
    PolicyVerdict::Deny {
        policies: Vec::new(),
        errors,
    }
}

impl Inner {
    /// The entity store of one request: the action hierarchy, the tool (with the caller's
    /// tenant) and the principal with its roles; cached.
    fn entities(
        &self,
        tool: &Tool,
        action: &Action,
        request: &PolicyRequest<'_>,
    ) -> Result<Arc<Prepared>, String> {
        let p = request.principal;
        let hash = entities_hash(&self.entities_hasher, tool.id, request.action, p);
        let hit = self.entities.read().ok().and_then(|m| {
            m.get(&hash)?
                .iter()
                .find(|(k, _)| k.matches(tool.id, request.action, p))
                .map(|(_, e)| e.clone())
        });
        if let Some(hit) = hit {
            return Ok(hit);
        }
        let (principal_uid, principal) = self.principal(p)?;
        let tenant = (
            "tenant".to_owned(),
            RestrictedExpression::new_string(p.tenant().to_owned()),
        );
        let resource = Entity::new_with_tags(
            tool.uid.clone(),
            tool.attributes.iter().cloned().chain([tenant]),
            [],
            [],
        )
        .map_err(|e| format!("cannot build the tool entity: {e}"))?;
        let entities = action
            .entities
            .clone()
            .add_entities([principal, resource], None)
            .map_err(|e| format!("cannot build the entities: {e}"))?;
        let policies = self.policies_for(&action.policies, &principal_uid, p)?;
        let built = Arc::new((principal_uid, entities, policies));
        let key = EntitiesKey {
            contract: tool.id,
            action: request.action,
            tenant: p.tenant().to_owned(),
            principal: p.id().to_owned(),
            roles: p.roles().iter().cloned().collect(),
        };
        if let Ok(mut map) = self.entities.write() {
            if map.len() >= ENTITIES_CACHE {
                map.clear();
            }
            map.entry(hash).or_default().push((key, built.clone()));
        }
        Ok(built)
    }

    /// The policies of an action whose principal scope matches this principal, scopes lifted
    /// (see [`Scoped`]). Exactly Cedar's answer, not a heuristic: the principal entity's only
    /// ancestors are its roles (role entities are never in the store, so they have none), so
    /// `principal in Role::"x"` holds exactly for a holder of role x, `principal == …` only
    /// for that principal, `principal is T` for its type. Evaluation cost grows with the
    /// policies evaluated.
    fn policies_for(
        &self,
        all: &[Scoped],
        uid: &EntityUid,
        principal: &warrant_core::authority::Principal,
    ) -> Result<PolicySet, String> {
        let roles: HashSet<EntityUid> = principal
            .roles()
            .iter()
            .map(|r| EntityUid::from_type_name_and_id(self.role_type.clone(), EntityId::new(r)))
            .collect();
        let member = |u: &EntityUid| u == uid || roles.contains(u);
        let mut out = PolicySet::new();
        for scoped in all {
            let applies = match &scoped.principal {
                PrincipalConstraint::Any => true,
                PrincipalConstraint::Eq(u) => u == uid,
                PrincipalConstraint::In(u) => member(u),
                PrincipalConstraint::Is(t) => *t == self.principal_type,
                PrincipalConstraint::IsIn(t, u) => *t == self.principal_type && member(u),
            };
            if applies {
                out.add(scoped.lifted.clone())
                    .map_err(|e| format!("cannot prepare the policies: {e}"))?;
            }
        }
        Ok(out)
    }

    fn principal(
        &self,
        principal: &warrant_core::authority::Principal,
    ) -> Result<(EntityUid, Entity), String> {
        let uid = EntityUid::from_type_name_and_id(
            self.principal_type.clone(),
            EntityId::new(format!("{}/{}", principal.tenant(), principal.id())),
        );
        let roles = principal.roles();
        let attributes = [
            (
                "id".to_owned(),
                RestrictedExpression::new_string(principal.id().to_owned()),
            ),
            (
                "tenant".to_owned(),
                RestrictedExpression::new_string(principal.tenant().to_owned()),
            ),
            (
                "roles".to_owned(),
                RestrictedExpression::new_set(
                    roles.iter().map(|r| RestrictedExpression::new_string(r.clone())),
                ),
            ),
        ];
        let parents = roles
            .iter()
            .map(|r| EntityUid::from_type_name_and_id(self.role_type.clone(), EntityId::new(r)));
        let entity = Entity::new_with_tags(uid.clone(), attributes, parents, [])
            .map_err(|e| format!("cannot build the principal entity: {e}"))?;
        Ok((uid, entity))
    }

    fn authorize(&self, request: &PolicyRequest<'_>) -> Result<PolicyVerdict, String> {
        let contract = request.contract;
        // Platform contracts are keyed by their bare name (no allocation on the hot path).
        let name = match contract.namespace().tenant() {
            None => std::borrow::Cow::Borrowed(contract.name()),
            Some(_) => std::borrow::Cow::Owned(contract.qualified_name()),
        };
        let Some(tool) = self
            .tools
            .get(name.as_ref())
            .and_then(|versions| versions.get(&contract.version()))
        else {
            return Err(format!(
                "contract {} is not in the policy schema; reload policies",
                schema::label(contract)
            ));
        };
        if tool.id != contract.id() {
            return Err(format!(
                "contract {} is not the one the policies were loaded with; reload policies",
                tool.label
            ));
        }
        let (action, attributes) = tool.action(request.action);
        let context = mapping::context(attributes, request.arguments).map_err(|e| e.0)?;
        let stored = self.entities(tool, action, request)?;
        let (principal_uid, entities, policies) = &*stored;
        // The request is not validated against the schema, in any build: it is valid by
        // construction. The principal, action and resource uids are built from the types and
        // actions of the generated schema, and the context from the same typed tree that
        // generated its context type (`mapping::context` refuses a missing required attribute
        // and any value of another type, and emits no attribute the type does not list), so
        // validating it again on every call would check the same guarantee twice. The unit test
        // `mapped_contexts_are_exactly_the_valid_ones` holds the mapping to Cedar's own request
        // validation.
        let cedar_request = Request::new(
            principal_uid.clone(),
            action.uid.clone(),
            tool.uid.clone(),
            context,
            None,
        )
        .map_err(|e| request_error(&e, &tool.label))?;
        let response = self.authorizer.is_authorized(&cedar_request, policies, entities);
        Ok(verdict(&response))
    }
}

/// Cedar's answer as a verdict. Cedar skips a policy whose evaluation errors and decides
/// with the others, so a forbid that errors would let a permit allow the call: here any
/// evaluation error denies, whatever the effect of the policy that failed, and the errors
/// name those policies.
fn verdict(response: &cedar_policy::Response) -> PolicyVerdict {
    let diagnostics = response.diagnostics();
    let mut errors: Vec<String> = diagnostics.errors().map(evaluation_error).collect();
    let allowed = response.decision() == Decision::Allow;
    if allowed && errors.is_empty() {
        return PolicyVerdict::Allow;
    }
    errors.sort();
    // Under a denial the reasons are the forbids that held; under an allow they are the
    // permits, which are no reason to deny and are not named.
    let mut policies: Vec<String> = if allowed {
        Vec::new()
    } else {
        diagnostics.reason().map(ToString::to_string).collect()
    };
    policies.sort();
    PolicyVerdict::Deny { policies, errors }
}

/// A request the schema refuses. The context error is reworded: Cedar's message prints the
/// context, and details never echo argument values.
fn request_error(error: &RequestValidationError, label: &str) -> String {
    match error {
        RequestValidationError::InvalidContext(_) => {
            format!("the arguments of {label} do not match its policy context type")
        }
        other => format!("the request does not match the policy schema: {other}"),
    }
}

/// An evaluation error by policy id and kind only (Cedar's messages can quote values).
fn evaluation_error(error: &AuthorizationError) -> String {
    let AuthorizationError::PolicyEvaluationError(error) = error;
    let kind = match error.inner() {
        EvaluationError::EntityDoesNotExist(_) => "an entity does not exist",
        EvaluationError::EntityAttrDoesNotExist(_) => "an entity attribute does not exist",
        EvaluationError::RecordAttrDoesNotExist(_) => "a record attribute does not exist",
        EvaluationError::TypeError(_) => "type error",
        EvaluationError::IntegerOverflow(_) => "integer overflow",
        EvaluationError::RecursionLimit(_) => "recursion limit reached",
        _ => "evaluation error",
    };
    format!("policy `{}` could not be evaluated: {kind}", error.policy_id())
}

impl PolicyEngine for CedarEngine {
    fn authorize(&self, request: &PolicyRequest<'_>) -> PolicyVerdict {
        self.inner
            .authorize(request)
            .unwrap_or_else(|error| deny(vec![error]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use warrant_core::authority::Principal;
    use warrant_core::contract::DocumentFormat;

    const CREDIT: &str = include_str!("../../../examples/contracts/create_support_credit.v1.yaml");
    const LOOKUP: &str = include_str!("../../../examples/contracts/lookup_order.v1.yaml");

    /// Every form of principal and action scope, permits and forbids, and an evaluation error.
    const SCOPES: &str = r#"
        @id("p-any") permit (principal, action, resource)
            when { context has amount_cents && context.amount_cents == 7 };
        @id("p-role") permit (
            principal in Warrant::Role::"operator",
            action in Warrant::Action::"create_support_credit",
            resource
        ) when { resource.tenant == principal.tenant && context.amount_cents <= 50000 };
        @id("p-eq") permit (
            principal == Warrant::Principal::"acme/p1",
            action == Warrant::Action::"review:create_support_credit@1",
            resource
        );
        @id("p-is") permit (
            principal is Warrant::Principal,
            action in [Warrant::Action::"review", Warrant::Action::"lookup_order"],
            resource
        ) when { principal.tenant == "acme" };
        @id("p-is-in") permit (
            principal is Warrant::Principal in Warrant::Role::"auditor",
            action in Warrant::Action::"invoke",
            resource is Warrant::Tool
        ) when { resource.effect == "read" };
        @id("p-group") permit (principal in Warrant::Role::"supervisor", action in Warrant::Action::"invoke", resource);
        @id("f-role") forbid (principal in Warrant::Role::"suspended", action, resource);
        @id("f-eq-action") forbid (principal, action == Warrant::Action::"create_support_credit@1", resource)
            when { context.amount_cents > 400000 };
        @id("f-overflow") forbid (
            principal in Warrant::Role::"flaky",
            action in Warrant::Action::"create_support_credit",
            resource
        ) when { context.amount_cents * 100000000000000 > 0 };
    "#;

    /// The verdict plain Cedar gives: the original policies, all of them, scopes and all.
    fn reference(
        engine: &CedarEngine,
        schema: &Schema,
        original: &PolicySet,
        request: &PolicyRequest<'_>,
    ) -> PolicyVerdict {
        let inner = &engine.inner;
        let tool = &inner.tools[&request.contract.qualified_name()][&request.contract.version()];
        let (action, attributes) = tool.action(request.action);
        let (principal_uid, principal) = inner.principal(request.principal).unwrap();
        let tenant = (
            "tenant".to_owned(),
            RestrictedExpression::new_string(request.principal.tenant().to_owned()),
        );
        let resource = Entity::new_with_tags(
            tool.uid.clone(),
            tool.attributes.iter().cloned().chain([tenant]),
            [],
            [],
        )
        .unwrap();
        let entities = action
            .entities
            .clone()
            .add_entities([principal, resource], None)
            .unwrap();
        let context = mapping::context(attributes, request.arguments).unwrap();
        let cedar_request = Request::new(
            principal_uid,
            action.uid.clone(),
            tool.uid.clone(),
            context,
            Some(schema),
        )
        .unwrap();
        verdict(&Authorizer::new().is_authorized(&cedar_request, original, &entities))
    }

    #[test]
    fn lifted_scopes_decide_exactly_as_the_written_policies() {
        let contracts = [
            Arc::new(Contract::from_text(CREDIT, DocumentFormat::Yaml).unwrap()),
            Arc::new(Contract::from_text(LOOKUP, DocumentFormat::Yaml).unwrap()),
        ];
        let sources = [PolicySource::new("scopes.cedar", SCOPES)];
        let engine = CedarEngine::new(&contracts, &sources).unwrap();
        let mut problems = Vec::new();
        let (policies, _) = parse_sources(&sources, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let original = PolicySet::from_policies(policies).unwrap();
        let schema = Schema::from_json_value(CedarEngine::schema_json(&contracts)).unwrap();

        let roles: [&[&str]; 7] = [
            &[],
            &["operator"],
            &["operator", "suspended"],
            &["auditor"],
            &["supervisor"],
            &["supervisor", "flaky"],
            &["flaky", "operator"],
        ];
        let credit = [7, 2500, 50001, 100_000, 450_000]
            .map(|a| json!({ "customer_id": "cus_12345678", "amount_cents": a, "reason": "r" }));
        let lookup = [
            json!({ "order_id": "ord_12345678" }),
            json!({ "order_id": "ord_12345678", "include_items": true }),
        ];
        let mut outcomes = std::collections::BTreeSet::new();
        for (tenant, id) in [("acme", "p1"), ("acme", "p2"), ("other", "p1")] {
            for roles in roles {
                let principal = Principal::new(id, tenant, Vec::new())
                    .unwrap()
                    .with_roles(roles.iter().map(|r| (*r).to_owned()))
                    .unwrap();
                for (contract, cases) in [(&contracts[0], &credit[..]), (&contracts[1], &lookup[..])] {
                    for action in [PolicyAction::Invoke, PolicyAction::Review, PolicyAction::Reveal] {
                        for args in cases {
                            let request = PolicyRequest {
                                principal: &principal,
                                action,
                                contract,
                                arguments: args.as_object().unwrap(),
                            };
                            let got = engine.authorize(&request);
                            assert_eq!(
                                got,
                                reference(&engine, &schema, &original, &request),
                                "{tenant}/{id} {roles:?} {:?} {} {args}",
                                action,
                                contract.name()
                            );
                            outcomes.insert(format!("{got:?}"));
                        }
                    }
                }
            }
        }
        // The matrix reaches allows, forbids, default denies and evaluation errors.
        assert!(outcomes.iter().any(|o| o == "Allow"));
        assert!(outcomes.iter().any(|o| o.contains("f-role")));
        assert!(outcomes.iter().any(|o| o.contains("f-eq-action")));
        assert!(outcomes.iter().any(|o| o.contains("f-overflow")));
        assert!(outcomes.iter().any(|o| o.contains("policies: [], errors: []")));
    }

    const EMAIL: &str = include_str!("../../../examples/contracts/send_email.v1.yaml");

    /// The context of a call is built without asking Cedar to validate it (see
    /// `Inner::authorize`): the mapping must accept exactly the arguments Cedar's own
    /// schema-driven parsing and request validation accept, and build the same context.
    #[test]
    fn mapped_contexts_are_exactly_the_valid_ones() {
        let contracts = [CREDIT, LOOKUP, EMAIL]
            .map(|text| Arc::new(Contract::from_text(text, DocumentFormat::Yaml).unwrap()));
        let engine = CedarEngine::new(&contracts, &[]).unwrap();
        let schema = Schema::from_json_value(CedarEngine::schema_json(&contracts)).unwrap();
        let inner = &engine.inner;
        let cases: [(&str, Value); 14] = [
            (
                "create_support_credit",
                json!({ "customer_id": "cus_12345678", "amount_cents": 5, "reason": "r" }),
            ),
            (
                "create_support_credit",
                json!({ "customer_id": "cus_12345678", "reason": "r" }),
            ),
            ("create_support_credit", json!({ "amount_cents": 5 })),
            ("create_support_credit", json!({})),
            (
                "create_support_credit",
                json!({ "customer_id": "c", "amount_cents": "5", "reason": "r" }),
            ),
            (
                "create_support_credit",
                json!({ "customer_id": "c", "amount_cents": true, "reason": "r" }),
            ),
            (
                "create_support_credit",
                json!({ "customer_id": 1, "amount_cents": 5, "reason": "r" }),
            ),
            ("lookup_order", json!({ "order_id": "ord_12345678" })),
            (
                "lookup_order",
                json!({ "order_id": "ord_12345678", "include_items": false }),
            ),
            (
                "lookup_order",
                json!({ "order_id": "ord_12345678", "include_items": "yes" }),
            ),
            ("lookup_order", json!({ "include_items": true })),
            (
                "send_email",
                json!({ "to": ["a@b.example"], "subject": "s", "body": "b" }),
            ),
            (
                "send_email",
                json!({ "to": ["a@b.example"], "cc": [], "subject": "s", "body": "b" }),
            ),
            (
                "send_email",
                json!({ "to": "a@b.example", "subject": "s", "body": "b" }),
            ),
        ];
        let mut accepted = 0;
        for (name, args) in &cases {
            let tool = &inner.tools[*name][&1];
            for (action, attributes) in [
                (&tool.invoke, &tool.context),
                (&tool.review, &tool.review_context),
                (&tool.reveal, &tool.review_context),
            ] {
                let arguments = args.as_object().unwrap();
                // Cedar's own reading of the same arguments: the attributes of the context
                // type only (a review's has no sensitive field), parsed against the schema.
                let names: Vec<&str> = attributes.iter().map(|a| a.name.as_str()).collect();
                let typed: serde_json::Map<String, Value> = arguments
                    .iter()
                    .filter(|(k, _)| names.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let (principal_uid, _) = inner
                    .principal(&Principal::new("p", "acme", Vec::new()).unwrap())
                    .unwrap();
                let validated = |context| {
                    Request::new(
                        principal_uid.clone(),
                        action.uid.clone(),
                        tool.uid.clone(),
                        context,
                        Some(&schema),
                    )
                    .is_ok()
                };
                let theirs = cedar_policy::Context::from_json_value(
                    Value::Object(typed),
                    Some((&schema, &action.uid)),
                )
                .ok()
                .filter(|context| validated(context.clone()));
                let ours = mapping::context(attributes, arguments);
                assert_eq!(
                    ours.is_ok(),
                    theirs.is_some(),
                    "{name} {args} {ours:?} {theirs:?}"
                );
                if let (Ok(ours), Some(theirs)) = (ours, theirs) {
                    assert_eq!(ours, theirs, "{name} {args}");
                    accepted += 1;
                }
            }
        }
        assert_eq!(accepted, 15, "valid cases, each for invoke, review and reveal");
    }
}
