//! What every request handler shares: the pipeline, the runtime, the store, and the policy
//! engine behind a lock so a registered contract can extend it without a restart.

use std::sync::{Arc, RwLock};

use warrant_core::Contract;
use warrant_core::env::Env;
use warrant_core::pipeline::Authority;
use warrant_core::policy::{PolicyEngine, PolicyRequest, PolicyVerdict};
use warrant_core::registry::Registry;
use warrant_core::store::Store;
use warrant_policy::{CedarEngine, PolicyLoadError, PolicySource};
use warrant_runtime::{Adapters, Runtime};

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
    /// Time and ids.
    pub env: Arc<dyn Env>,
    /// Renders `/metrics`, when a recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The base URL clients reach this server at (for console links).
    pub public_url: String,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}
