//! Assembling a gateway: open the store, register the contracts of a directory, load the
//! policies, build the pipeline and the runtime, start the background sweeper, reconciler and
//! contract sync, and create the first keys of an empty store.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use warrant_core::Contract;
use warrant_core::budget::BudgetConfig;
use warrant_core::contract::DocumentFormat;
use warrant_core::env::Env;
use warrant_core::guard::Guards;
use warrant_core::pipeline::{Authority, Settings};
use warrant_core::records::{NewApiKey, TenantRecord};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_core::store::{Store, StoreError};
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::{Adapters, Runtime, RuntimeSettings};
use warrant_store::{SystemEnv, keys};

use crate::state::{AppState, ContractSet, ReloadablePolicy};

/// Limits applied to every HTTP connection and request (`[limits]` in `warrant.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// The largest request body (default 256 KiB; proposals are capped at 64 KiB by the parser).
    pub body_bytes: usize,
    /// The longest a request may take (default 60 s, above the runtime's 30 s deadline).
    pub request_timeout: Duration,
    /// Requests in flight at once, across every route; more are refused with 503 (default
    /// 512). Health probes are not counted.
    pub concurrency: usize,
    /// How long a connection may take to send a request head, counted from when the server
    /// starts waiting for one: the connection was opened, or the previous response was sent.
    /// So it is also the keep-alive idle timeout. Default 10 s.
    pub header_timeout: Duration,
    /// How long a request may take to send its body once its head has arrived; a slower body
    /// is cut off with 408 (default 10 s).
    pub body_timeout: Duration,
    /// Open connections at once (default 512); past it a few more are kept for health probes
    /// (anything else on them is answered 503 at once) and the rest are closed as they are
    /// accepted. Keep it well below the process's open-file limit.
    pub connections: usize,
    /// Failed authentications one client address may make per minute, in a burst or spread
    /// out; past it, requests with keys the gateway has not just seen are answered 429 with
    /// `Retry-After` (default 60).
    pub auth_failures_per_minute: u32,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            body_bytes: 256 * 1024,
            request_timeout: Duration::from_secs(60),
            concurrency: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            connections: 512,
            auth_failures_per_minute: 60,
        }
    }
}

/// Everything a gateway is built from.
pub struct GatewayConfig {
    /// The store (already open).
    pub store: Arc<dyn Store>,
    /// Contract files (`*.yaml`, `*.yml`, `*.json`) registered at start.
    pub contracts_dir: Option<PathBuf>,
    /// Cedar policy files.
    pub policies: Vec<PolicySource>,
    /// Argument allow-lists per tenant.
    pub guards: Guards,
    /// Tenant cost budgets.
    pub budgets: BudgetConfig,
    /// The key that redacts sensitive arguments in the ledger.
    pub redaction: RedactionKey,
    /// Adapter configuration (network policy, credentials, relay, command roots).
    pub adapters: AdapterConfig,
    /// Runtime settings.
    pub runtime: RuntimeSettings,
    /// Pipeline settings.
    pub settings: Settings,
    /// HTTP limits.
    pub limits: HttpLimits,
    /// The URL clients reach the server at.
    pub public_url: String,
    /// The tenant of the first keys of an empty store.
    pub first_tenant: String,
    /// Start the background sweeper, reconciler and contract sync.
    pub background: bool,
    /// Who is emailed when an approval is requested (`[console.notify]`); `None`: nobody.
    pub review_mail: Option<crate::events::ReviewMail>,
    /// How often the background contract sync looks for contracts registered or retired by
    /// other nodes on the same store (default [`crate::CONTRACT_SYNC_EVERY`]); zero turns it off.
    pub contract_sync_every: Duration,
    /// The gauge of requests being answered, counted at the edge
    /// ([`crate::AppState::requests_in_flight`]). Made by the caller, so that threads started
    /// before the gateway — a multi-thread runtime's workers — can be given it; a fresh
    /// `Default::default()` where nothing else reads it.
    pub requests_in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("contracts_dir", &self.contracts_dir)
            .field("policies", &self.policies.len())
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

/// Why a gateway did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store failed. (Its error is shown in this one's message and not also as its
    /// source, so that a report of the error chain does not print it twice.)
    #[error("store: {0}")]
    Store(StoreError),
    /// A contract file cannot be read or does not lint.
    #[error("contract {path}: {message}")]
    Contract {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The policies do not load (shown once, as `Store`).
    #[error("policies: {0}")]
    Policy(warrant_policy::PolicyLoadError),
    /// A part of the configuration cannot be used (e.g. reviewer mail without a relay).
    #[error("configuration: {0}")]
    Config(String),
}

impl From<StoreError> for StartError {
    fn from(e: StoreError) -> Self {
        StartError::Store(e)
    }
}

impl From<warrant_policy::PolicyLoadError> for StartError {
    fn from(e: warrant_policy::PolicyLoadError) -> Self {
        StartError::Policy(e)
    }
}

/// The keys created on the first start of an empty store (shown once).
#[derive(Debug, Clone)]
pub struct FirstKeys {
    /// The platform operator's key (an admin of the reserved tenant `platform`).
    pub operator: String,
    /// An admin and reviewer key of the first tenant.
    pub admin: String,
    /// A demo agent key holding every registered scope.
    pub agent: String,
}

/// A started gateway.
#[derive(Debug)]
pub struct Gateway {
    /// The shared state.
    pub state: Arc<AppState>,
    /// HTTP limits.
    pub limits: HttpLimits,
    /// Keys created on this start, if the store had none.
    pub first_keys: Option<FirstKeys>,
    /// The registered contracts whose adapter binding this node cannot use, found at start
    /// (not logged here: the caller reports them, as `warrant serve` does in its banner;
    /// contracts applied later are logged when applied).
    pub unusable_bindings: Vec<crate::state::UnusableBinding>,
    /// Background tasks that start no call: aborted when the gateway is dropped.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The workers that start calls on their own (the workflow runner, the inbound worker):
    /// stopped by [`crate::shutdown`], which lets them finish what they hold.
    pub(crate) callers: Vec<tokio::task::JoinHandle<()>>,
}

impl Gateway {
    /// Whether the workers that start calls on their own have stopped (after
    /// [`crate::shutdown`]; always, for a gateway without background work).
    pub fn callers_stopped(&self) -> bool {
        self.callers.iter().all(tokio::task::JoinHandle::is_finished)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(&self.callers) {
            t.abort();
        }
    }
}

/// How often the recorder's histograms are drained into their buckets.
const METRICS_UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Drains the recorder's histograms every `every`. The recorder keeps every histogram sample
/// until it is drained (by a scrape of `/metrics` or by upkeep), so a gateway that nobody
/// scrapes would otherwise grow by two samples per call without bound.
fn spawn_metrics_upkeep(handle: PrometheusHandle, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            handle.run_upkeep();
        }
    })
}

/// The process's Prometheus recorder, installed once (several gateways in one process, as in
/// tests, share it).
fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            Some(handle)
        })
        .clone()
}

/// Reads every contract file of `dir`, sorted by name.
///
/// # Errors
/// A file that cannot be read or does not lint.
pub fn read_contracts(dir: &Path) -> Result<Vec<Contract>, StartError> {
    let err = |path: &Path, message: String| StartError::Contract {
        path: path.display().to_string(),
        message,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| err(dir, e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(|e| err(&path, e.to_string()))?;
        let format = DocumentFormat::from_path(&path.to_string_lossy());
        let contract = Contract::from_text(&text, format).map_err(|e| match e {
            warrant_core::contract::ContractError::Lint(problems) => err(
                &path,
                problems
                    .iter()
                    .map(|p| format!("{}: {}", p.pointer(), p.message()))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            other => err(&path, other.to_string()),
        })?;
        out.push(contract);
    }
    Ok(out)
}

impl Gateway {
    /// Builds and starts a gateway.
    ///
    /// # Errors
    /// The store, a contract or the policies fail.
    pub async fn start(config: GatewayConfig) -> Result<Gateway, StartError> {
        let env: Arc<dyn Env> = Arc::new(SystemEnv);
        let now = env.now();
        let store = config.store.clone();
        let registry = Arc::new(Registry::new(store.clone(), time::Duration::seconds(30)));
        if let Some(dir) = &config.contracts_dir {
            for contract in read_contracts(dir)? {
                let name = format!("{}@{}", contract.name(), contract.version());
                match registry.register(contract, now).await {
                    Ok(_) => {}
                    // A changed file under a registered name@version: keep the registered one.
                    Err(StoreError::Conflict(_)) => {
                        tracing::warn!(
                            contract = name,
                            "a different body is registered under this version; kept it"
                        );
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let stored = store.list_contracts().await?;
        let contracts = registry.load(&stored, now)?;
        let policy = Arc::new(ReloadablePolicy::new(&contracts, config.policies)?);
        let mcp_sealer = crate::mcp::Sealer::new(config.redaction.derive("mcp-request-state"));
        let webhook_secrets = crate::webhooks::SecretBox::new(config.redaction.derive("webhook-secrets"));
        let review_mail = match &config.review_mail {
            Some(mail) => Some(Arc::new(
                crate::events::Notifier::new(mail, &config.adapters).map_err(StartError::Config)?,
            )),
            None => None,
        };
        let argument_seal = crate::webhooks::SecretBox::new(config.redaction.derive("approval-arguments"));
        let authority = Arc::new(
            Authority::new(
                store.clone(),
                registry.clone(),
                policy.clone(),
                Arc::new(config.guards),
                config.budgets,
                config.redaction,
                env.clone(),
                config.settings,
            )
            .with_seal(Arc::new(argument_seal.clone())),
        );
        let model = config.adapters.model.clone().map(|endpoint| {
            // Its own client: the same outbound rules, with the model's (longer) timeout.
            let policy = warrant_runtime::net::NetPolicy {
                timeout: endpoint.timeout,
                ..config.adapters.client.policy().clone()
            };
            warrant_runtime::model::ModelClient::new(endpoint, warrant_runtime::net::SafeClient::new(policy))
        });
        let adapters = Arc::new(Adapters::new(config.adapters));
        adapters.register(
            crate::authoring::VALIDATOR_KIND,
            Arc::new(crate::authoring::ValidatorFactory {
                registry: registry.clone(),
            }),
        );
        let unusable_bindings = crate::state::unusable_bindings(&adapters, &contracts);
        let runtime = Runtime::new(
            store.clone(),
            registry.clone(),
            env.clone(),
            adapters.clone(),
            config.runtime,
        );
        let first_keys = first_keys(store.as_ref(), &config.first_tenant, &contracts, env.as_ref()).await?;
        let mut tasks = Vec::new();
        if config.background {
            tasks.push(warrant_store::spawn_sweeper(
                store.clone(),
                Duration::from_secs(60),
            ));
            tasks.push(warrant_runtime::reconcile::spawn_reconciler_with(
                runtime.clone(),
                crate::RECONCILE_EVERY,
                warrant_runtime::reconcile::ReconcileSchedule {
                    overdue_after: runtime.settings().overdue_after,
                    ..Default::default()
                },
            ));
        }
        let metrics = metrics_handle();
        if config.background
            && let Some(handle) = metrics.clone()
        {
            tasks.push(spawn_metrics_upkeep(handle, METRICS_UPKEEP_EVERY));
        }
        let state = Arc::new(AppState {
            authority,
            runtime,
            store,
            registry,
            policy,
            adapters,
            runs_due: Arc::new(tokio::sync::Notify::new()),
            local_runner: Arc::default(),
            runs_ended: tokio::sync::broadcast::channel(1024).0,
            live_principals: Arc::default(),
            compiled_workflows: Arc::default(),
            model,
            env,
            metrics,
            public_url: config.public_url,
            applied: Arc::new(tokio::sync::Mutex::new(ContractSet::of(&stored))),
            tools: Arc::new(std::sync::RwLock::new(Arc::new(crate::mcp::tools::Index::of(
                &stored, &contracts, now,
            )))),
            keys: Arc::new(crate::auth::KeyCache::new(crate::auth::KEY_CACHE_TTL)),
            mcp_sealer,
            review_mail,
            webhook_secrets,
            argument_seal,
            inbound_due: Arc::new(tokio::sync::Notify::new()),
            stopping: tokio_util::sync::CancellationToken::new(),
            requests_in_flight: config.requests_in_flight,
            inbound_refusals: Arc::new(governor::RateLimiter::keyed(crate::inbound::refusals_quota())),
        });
        if config.background && !config.contract_sync_every.is_zero() {
            tasks.push(crate::state::spawn_contract_sync(
                state.clone(),
                config.contract_sync_every,
            ));
        }
        let mut callers = Vec::new();
        if config.background {
            callers.push(crate::runs::spawn_runner(state.clone()));
            tasks.push(crate::events::spawn_worker(state.clone()));
            tasks.push(crate::webhooks::spawn_worker(state.clone()));
            callers.push(crate::inbound::spawn_worker(state.clone()));
        }
        Ok(Gateway {
            state,
            limits: config.limits,
            first_keys,
            unusable_bindings,
            tasks,
            callers,
        })
    }
}

/// On a store without keys: an admin key and a demo agent key holding every registered scope.
async fn first_keys(
    store: &dyn Store,
    tenant: &str,
    contracts: &[Arc<Contract>],
    env: &dyn Env,
) -> Result<Option<FirstKeys>, StoreError> {
    if store.has_api_keys().await? {
        return Ok(None);
    }
    if tenant == crate::auth::PLATFORM_TENANT {
        return Err(StoreError::Invalid(format!(
            "the first tenant cannot be `{tenant}`, the platform operator's reserved tenant"
        )));
    }
    for (id, label) in [
        (crate::auth::PLATFORM_TENANT, "the platform operator"),
        (tenant, "the first tenant"),
    ] {
        store
            .create_tenant(&TenantRecord {
                id: id.to_owned(),
                label: Some(label.to_owned()),
                created_at: env.now(),
            })
            .await?;
    }
    let mut scopes: Vec<String> = contracts
        .iter()
        .flat_map(|c| c.scopes().iter().cloned())
        .collect();
    scopes.sort();
    scopes.dedup();
    let make_in = async |tenant: &str, principal: &str, grants: Vec<String>, roles: &[&str], label: &str| {
        let generated = keys::generate();
        store
            .create_api_key(&NewApiKey {
                id: generated.id,
                key_hash: generated.hash,
                tenant: tenant.to_owned(),
                principal: principal.to_owned(),
                grants,
                roles: roles.iter().map(|r| (*r).to_owned()).collect(),
                label: Some(label.to_owned()),
                created_at: env.now(),
            })
            .await
            .map(|()| generated.key)
    };
    let make = async |principal: &str, grants: Vec<String>, roles: &[&str], label: &str| {
        make_in(tenant, principal, grants, roles, label).await
    };
    let operator = make_in(
        crate::auth::PLATFORM_TENANT,
        "operator",
        Vec::new(),
        &[crate::auth::ADMIN_ROLE],
        "platform operator key",
    )
    .await?;
    let admin = make(
        "admin",
        Vec::new(),
        &["admin", "reviewer", "supervisor"],
        "first admin key",
    )
    .await?;
    let agent = make("demo-agent", scopes, &["agent", "operator"], "demo agent key").await?;
    Ok(Some(FirstKeys {
        operator,
        admin,
        agent,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start error says what went wrong once: its cause is in its message and is not also
    /// its source, which a report of the chain (`{:#}`) would print a second time. The
    /// policies' problems come one a line.
    #[test]
    fn a_start_error_says_its_cause_once() {
        let problem = |file: &str| warrant_policy::PolicyProblem {
            file: Some(file.to_owned()),
            message: "unknown entity type".to_owned(),
        };
        let error = StartError::from(warrant_policy::PolicyLoadError::Invalid(vec![
            problem("a.cedar"),
            problem("b.cedar"),
        ]));
        assert!(std::error::Error::source(&error).is_none());
        assert_eq!(
            error.to_string(),
            "policies: 2 problem(s) in the policies:\n  - a.cedar: unknown entity type\n  - b.cedar: unknown entity type"
        );
        let error = StartError::from(StoreError::Unavailable("disk full".into()));
        assert!(std::error::Error::source(&error).is_none());
        assert_eq!(error.to_string().matches("disk full").count(), 1);
    }
}
