//! What every request handler shares: the pipeline, the runtime, the store, and the policy
//! engine behind a lock so a registered contract can extend it without a restart; and the one
//! way the registry and the policy engine follow the stored contracts
//! ([`AppState::sync_contracts`]), used by the contract routes after a change made here and by
//! the background task that picks up changes made by other nodes ([`spawn_contract_sync`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use warrant_core::Contract;
use warrant_core::contract::Namespace;
use warrant_core::env::Env;
use warrant_core::pipeline::Authority;
use warrant_core::policy::{PolicyEngine, PolicyRequest, PolicyVerdict};
use warrant_core::records::{ContractState, StoredContract};
use warrant_core::registry::Registry;
use warrant_core::store::{Store, StoreError};
use warrant_policy::{CedarEngine, PolicyLoadError, PolicySource};
use warrant_runtime::{Adapters, Runtime};

use crate::mcp::tools::Index;

/// The policy engine, rebuilt when the set of contracts changes (the Cedar schema is
/// generated from them, so a new contract needs a new schema and a re-validation of the
/// policies). Requests take a cheap `Arc` clone of the current engine.
pub struct ReloadablePolicy {
    sources: Vec<PolicySource>,
    engine: RwLock<Arc<CedarEngine>>,
}

impl std::fmt::Debug for ReloadablePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadablePolicy")
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

impl ReloadablePolicy {
    /// Builds the engine for `contracts` from `sources`.
    ///
    /// # Errors
    /// The policies do not validate against the contracts' schema.
    pub fn new(contracts: &[Arc<Contract>], sources: Vec<PolicySource>) -> Result<Self, PolicyLoadError> {
        let engine = CedarEngine::new(contracts, &sources)?;
        Ok(ReloadablePolicy {
            sources,
            engine: RwLock::new(Arc::new(engine)),
        })
    }

    /// Rebuilds the engine for a new set of contracts; the old one stays if that fails.
    ///
    /// # Errors
    /// The policies do not validate against the new schema.
    pub fn reload(&self, contracts: &[Arc<Contract>]) -> Result<(), PolicyLoadError> {
        let engine = Arc::new(CedarEngine::new(contracts, &self.sources)?);
        if let Ok(mut slot) = self.engine.write() {
            *slot = engine;
        }
        Ok(())
    }

    fn current(&self) -> Option<Arc<CedarEngine>> {
        self.engine.read().ok().map(|e| Arc::clone(&e))
    }
}

impl PolicyEngine for ReloadablePolicy {
    fn authorize(&self, request: &PolicyRequest<'_>) -> PolicyVerdict {
        match self.current() {
            Some(engine) => engine.authorize(request),
            // A poisoned lock fails closed.
            None => PolicyVerdict::Deny {
                policies: Vec::new(),
                errors: vec!["the policy engine is unavailable".into()],
            },
        }
    }
}

/// The gateway's shared state.
#[derive(Clone)]
pub struct AppState {
    /// The decision pipeline.
    pub authority: Arc<Authority>,
    /// The execution runtime.
    pub runtime: Runtime,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The contract registry.
    pub registry: Arc<Registry>,
    /// The policy engine.
    pub policy: Arc<ReloadablePolicy>,
    /// The adapters (to validate bindings at registration).
    pub adapters: Arc<Adapters>,
    /// Wakes this node's workflow runner: a run started or a step made due here.
    pub runs_due: Arc<tokio::sync::Notify>,
    /// This node's runner, when one runs: a run started here is handed to it with its first
    /// step already claimed (`runs::start`).
    pub(crate) local_runner: Arc<std::sync::Mutex<Option<crate::runs::LocalRunner>>>,
    /// (tenant, principal) a run's step saw holding a key that is not revoked, and when:
    /// trusted for [`crate::auth::KEY_CACHE_TTL`] like a cached key, and forgotten at once
    /// when a key is revoked through this node.
    pub live_principals: Arc<std::sync::Mutex<LivePrincipals>>,
    /// Published workflows this node compiled, by (tenant, definition digest): a published
    /// version and the contracts it pinned never change.
    pub compiled_workflows: Arc<std::sync::Mutex<CompiledWorkflows>>,
    /// Runs that ended on this node (run id, final status), for whoever listens (benchmarks
    /// today; a lost message only means a listener polls the store instead).
    pub runs_ended: tokio::sync::broadcast::Sender<(String, warrant_core::records::RunStatus)>,
    /// The chat model of workflows' `model` steps, when the operator configured one.
    pub model: Option<warrant_runtime::model::ModelClient>,
    /// Time and ids.
    pub env: Arc<dyn Env>,
    /// Renders `/metrics`, when a recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The base URL clients reach this server at (for console links).
    pub public_url: String,
    /// The stored contracts the registry and the policy engine were last built from; held
    /// while they are rebuilt, so rebuilds apply in the order their store reads were made.
    pub(crate) applied: Arc<tokio::sync::Mutex<ContractSet>>,
    /// Recently resolved API keys.
    pub keys: Arc<crate::auth::KeyCache>,
    /// The contracts as MCP tools, rebuilt with the registry (see [`AppState::sync_contracts`]).
    pub(crate) tools: Arc<RwLock<Arc<Index>>>,
    /// Seals and opens MCP `requestState`s (a key derived from the server's secret).
    pub(crate) mcp_sealer: crate::mcp::Sealer,
    /// Emails reviewers when an approval is requested, when the operator configured it.
    pub(crate) review_mail: Option<Arc<crate::events::Notifier>>,
    /// Seals and opens webhook endpoints' signing secrets at rest (and inbound sources').
    pub(crate) webhook_secrets: crate::webhooks::SecretBox,
    /// Seals and opens held calls' exact arguments at rest (the pipeline's approval copies,
    /// and the proposals MCP tasks keep for a contract with a sensitive field).
    pub(crate) argument_seal: crate::webhooks::SecretBox,
    /// Wakes the inbound worker when this node accepted an event.
    pub(crate) inbound_due: Arc<tokio::sync::Notify>,
    /// Cancelled when the gateway shuts down ([`crate::shutdown`]): the workers that start
    /// calls on their own (the workflow runner, the inbound worker) claim nothing more and
    /// finish what they hold, instead of being aborted mid-step.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
    /// The requests this server is answering now (the HTTP lanes counted at their edge, an MCP
    /// stdio session by its transport):
    /// the embedded store writes on the request thread itself when it answers only one
    /// (`warrant_store::write_here_when_alone`).
    pub requests_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// How many refused inbound deliveries per source are written to its record.
    pub(crate) inbound_refusals: Arc<governor::DefaultKeyedRateLimiter<String>>,
}

/// One stored contract as the sync compares it: where it lives, its content id and its binding
/// (an operator binding a tenant's contract changes only the binding).
type ContractKey = (Namespace, String, Option<String>);

/// What the registry and the policy engine were built from: each stored contract's namespace,
/// content id and binding digest, and whether it is retired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContractSet(BTreeMap<ContractKey, bool>);

impl ContractSet {
    /// The set `stored` (as read from the store) describes.
    pub(crate) fn of(stored: &[StoredContract]) -> Self {
        ContractSet(
            stored
                .iter()
                .map(|c| {
                    (
                        (
                            c.namespace.clone(),
                            c.content_id.clone(),
                            c.binding_digest.clone(),
                        ),
                        c.retired_at.is_some(),
                    )
                })
                .collect(),
        )
    }

    /// The set the states of the stored contracts describe.
    fn of_states(states: &[ContractState]) -> Self {
        ContractSet(
            states
                .iter()
                .map(|c| {
                    (
                        (
                            c.namespace.clone(),
                            c.content_id.clone(),
                            c.binding_digest.clone(),
                        ),
                        c.retired_at.is_some(),
                    )
                })
                .collect(),
        )
    }

    /// Whether both hold the same contracts (retired or not): the policy engine is built from
    /// every contract, so only a change here needs a new one.
    fn same_contracts(&self, other: &ContractSet) -> bool {
        self.0.keys().eq(other.0.keys())
    }
}

/// What [`AppState::sync_contracts`] found changed in the store, as `name@version` labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContractChanges {
    /// Contracts registered since the last sync.
    pub registered: Vec<String>,
    /// Contracts retired since the last sync.
    pub retired: Vec<String>,
}

impl ContractChanges {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.registered.is_empty() && self.retired.is_empty()
    }

    /// What `stored` (the contracts now) adds to or retires in `old`, as `name@version`.
    fn between(old: &ContractSet, stored: &[StoredContract]) -> Self {
        let mut changes = ContractChanges::default();
        for c in stored {
            let label = || format!("{}@{}", c.namespace.qualify(&c.name), c.version);
            let retired = c.retired_at.is_some();
            let key = (
                c.namespace.clone(),
                c.content_id.clone(),
                c.binding_digest.clone(),
            );
            match old.0.get(&key) {
                None => {
                    changes.registered.push(label());
                    if retired {
                        changes.retired.push(label());
                    }
                }
                Some(was_retired) if retired && !was_retired => changes.retired.push(label()),
                Some(_) => {}
            }
        }
        changes
    }
}

impl AppState {
    /// The contracts as MCP tools, as last applied.
    pub(crate) fn tool_index(&self) -> Arc<Index> {
        match self.tools.read() {
            Ok(index) => index.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_tool_index(&self, index: Index) {
        let mut slot = match self.tools.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        *slot = Arc::new(index);
    }

    /// Brings the registry and the policy engine up to the contracts stored now: the one path
    /// by which a registration or retirement takes effect, whether it was made through this
    /// gateway's routes or by another node on the same database. Reads the contracts' ids and
    /// retirements and does nothing more when they are as last applied; otherwise reads the
    /// contracts, caches them all (with their retirements) in the registry and, when the set
    /// of contracts changed, rebuilds the policy engine. Policies that do not validate against the new set keep the old engine (logged):
    /// calls to the new contracts are then denied by policy until the policies are fixed.
    ///
    /// # Errors
    /// The store's errors, or [`StoreError::Corrupt`] for a stored contract that no longer lints
    /// (nothing is applied then).
    pub async fn sync_contracts(&self) -> Result<ContractChanges, StoreError> {
        let mut applied = self.applied.lock().await;
        if ContractSet::of_states(&self.store.list_contract_states().await?) == *applied {
            // The registry's entries are as stored: no need to re-read them on use.
            self.registry.confirm(self.env.now());
            return Ok(ContractChanges::default());
        }
        // Something changed: the contracts themselves (which may have changed again since).
        let stored = self.store.list_contracts().await?;
        let set = ContractSet::of(&stored);
        let now = self.env.now();
        let contracts = self.registry.load(&stored, now)?;
        self.set_tool_index(Index::of(&stored, &contracts, now));
        let added: Vec<Arc<Contract>> = contracts
            .iter()
            .filter(|c| {
                let key = (
                    c.namespace().clone(),
                    c.id_str().to_owned(),
                    c.adapter().map(|a| a.digest().text()),
                );
                !applied.0.contains_key(&key)
            })
            .cloned()
            .collect();
        warn_unusable_bindings(&self.adapters, &added);
        if !set.same_contracts(&applied)
            && let Err(e) = self.policy.reload(&contracts)
        {
            tracing::warn!(
                error = %e,
                "the policies do not validate against the new contract set; kept the previous policy engine"
            );
        }
        let changes = ContractChanges::between(&applied, &stored);
        *applied = set;
        Ok(changes)
    }
}

/// A registered contract whose adapter binding this node cannot use: its calls fail (with the
/// binding's error code) until the configuration provides what the binding needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnusableBinding {
    /// `name@version` (with `tenant/` for a tenant's contract).
    pub contract: String,
    /// The content id.
    pub id: String,
    /// Why the adapters cannot use it (a missing credential, relay, allowed host, …).
    pub reason: String,
}

/// The contracts of `contracts` whose adapter binding the adapters cannot use.
pub(crate) fn unusable_bindings(adapters: &Adapters, contracts: &[Arc<Contract>]) -> Vec<UnusableBinding> {
    contracts
        .iter()
        .filter(|c| c.adapter().is_some())
        .filter_map(|c| {
            adapters.validate(c).err().map(|e| UnusableBinding {
                contract: format!("{}@{}", c.qualified_name(), c.version()),
                id: c.id_str().to_owned(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// Logs each contract whose adapter binding the adapters cannot use (its calls will fail):
/// for every contract the node applies after its start (the start's are in
/// [`crate::Gateway::unusable_bindings`], which `warrant serve` prints).
pub(crate) fn warn_unusable_bindings(adapters: &Adapters, contracts: &[Arc<Contract>]) {
    for u in unusable_bindings(adapters, contracts) {
        tracing::warn!(contract = u.id, error = %u.reason, "adapter binding unusable; its calls will fail");
    }
}

/// Starts the task that applies contracts registered or retired by other nodes on the same
/// store: every `interval` it runs [`AppState::sync_contracts`] (one listing of the contracts'
/// ids and retirements when nothing changed) and logs what it applied. A failure is logged once and retried on the
/// next tick.
pub fn spawn_contract_sync(state: Arc<AppState>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing: Option<String> = None;
        loop {
            ticker.tick().await;
            match state.sync_contracts().await {
                Ok(changes) => {
                    if failing.take().is_some() {
                        tracing::info!("contract sync recovered");
                    }
                    if !changes.is_empty() {
                        tracing::info!(
                            registered = ?changes.registered,
                            retired = ?changes.retired,
                            "applied contract changes made by another node"
                        );
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    if failing.as_deref() != Some(message.as_str()) {
                        tracing::warn!(error = %message, "contract sync failed; retrying");
                        failing = Some(message);
                    }
                }
            }
        }
    })
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

/// (tenant, principal) → when a run's step last saw it holding a key that is not revoked.
pub type LivePrincipals = std::collections::HashMap<(String, String), std::time::Instant>;

/// (tenant, definition digest) → the published workflow compiled against its pinned contracts.
pub type CompiledWorkflows =
    std::collections::HashMap<(String, String), Arc<warrant_workflow::compile::Compiled>>;
