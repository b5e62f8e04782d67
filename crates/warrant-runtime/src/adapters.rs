//! The adapters Warrant ships and the registry that builds one per contract binding.
//!
//! | kind | what it does |
//! |---|---|
//! | `http` | POSTs the canonical arguments to a tool endpoint ([`http`]) |
//! | `command` | runs an executable with the arguments on stdin ([`command`]) |
//! | `send_email` | sends one message over SMTP ([`email`]) |
//! | `structured_data_fetch` | GETs JSON from a URL behind the SSRF guard ([`fetch`]) |
//!
//! Every adapter gets only its own credential (from [`Secrets`]) and the attenuated scopes of
//! the call, and every outbound HTTP request goes through the one [`SafeClient`].

pub mod command;
pub mod email;
pub mod fetch;
pub mod http;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use warrant_core::contract::{ContractId, Namespace};
use warrant_core::{Contract, Sha256Digest};

use crate::adapter::{Adapter, BindingError, Failure, Reconciled};
use crate::net::SafeClient;
use crate::secrets::Secrets;

pub use email::{RelaySecurity, SmtpRelay};

/// The binding kinds Warrant ships (built by [`Adapters::for_contract`]); any other kind is a
/// registered [`AdapterFactory`]'s.
pub const BUILT_IN_KINDS: [&str; 4] = ["http", "command", "send_email", "structured_data_fetch"];

/// What adapters are built with.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// The SSRF-safe client every outbound HTTP request uses.
    pub client: SafeClient,
    /// Where credentials come from.
    pub secrets: Secrets,
    /// The SMTP relay `send_email` uses unless its binding names one.
    pub smtp: Option<SmtpRelay>,
    /// Directories `command` bindings may run programs from. Empty: the `command` adapter is
    /// off (a contract registered over the API must not be able to run arbitrary programs).
    pub command_roots: Vec<PathBuf>,
    /// The chat model workflows' `model` steps ask for proposals (none: such steps fail with
    /// `MODEL_NOT_CONFIGURED`).
    pub model: Option<crate::model::ModelEndpoint>,
}

/// Builds adapters of a kind Warrant does not ship (embedding applications, tests).
pub trait AdapterFactory: Send + Sync {
    /// Builds the adapter for `contract` from its binding document.
    ///
    /// # Errors
    /// The binding is unusable.
    fn build(
        &self,
        contract: &Contract,
        binding: &Value,
        config: &AdapterConfig,
    ) -> Result<Arc<dyn Adapter>, BindingError>;
}

/// An adapter built for a contract (found by the contract's content id). A built adapter is
/// specific to its contract's namespace and name too: credentials are granted by qualified
/// tool name, so the same document and binding in another namespace builds anew.
struct Built {
    namespace: Namespace,
    name: String,
    binding: Sha256Digest,
    adapter: Arc<dyn Adapter>,
}

impl Built {
    fn is_for(&self, contract: &Contract, binding: Sha256Digest) -> bool {
        self.binding == binding && self.namespace == *contract.namespace() && self.name == contract.name()
    }
}

/// The adapter registry: builds each contract's adapter once (per binding digest) and hands
/// out shared references.
pub struct Adapters {
    config: AdapterConfig,
    custom: RwLock<HashMap<String, Arc<dyn AdapterFactory>>>,
    /// By content id: found on every call without building a key (no allocation).
    built: RwLock<foldhash::HashMap<ContractId, Vec<Built>>>,
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Adapters {
    /// A registry with the built-in kinds.
    pub fn new(config: AdapterConfig) -> Self {
        Adapters {
            config,
            custom: RwLock::new(HashMap::new()),
            built: RwLock::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AdapterConfig {
        &self.config
    }

    /// Adds (or replaces) a kind.
    pub fn register(&self, kind: &str, factory: Arc<dyn AdapterFactory>) {
        if let Ok(mut custom) = self.custom.write() {
            custom.insert(kind.to_owned(), factory);
        }
        if let Ok(mut built) = self.built.write() {
            built.clear();
        }
    }

    /// Checks that `contract`'s binding builds (at registration, before any call needs it).
    ///
    /// # Errors
    /// Why it does not.
    pub fn validate(&self, contract: &Contract) -> Result<(), BindingError> {
        self.for_contract(contract).map(|_| ())
    }

    /// The adapter of `contract`.
    ///
    /// # Errors
    /// The contract has no binding, an unknown kind, a malformed binding or a missing
    /// credential.
    pub fn for_contract(&self, contract: &Contract) -> Result<Arc<dyn Adapter>, BindingError> {
        let binding = contract.adapter().ok_or(BindingError::Missing)?;
        let found = self.built.read().ok().and_then(|built| {
            let found = built
                .get(&contract.id())?
                .iter()
                .find(|b| b.is_for(contract, binding.digest()))?;
            Some(Arc::clone(&found.adapter))
        });
        if let Some(adapter) = found {
            return Ok(adapter);
        }
        let doc = binding.document();
        let adapter: Arc<dyn Adapter> = match binding.kind() {
            "http" => Arc::new(http::HttpAdapter::from_binding(contract, doc, &self.config)?),
            "command" => Arc::new(command::CommandAdapter::from_binding(
                contract,
                doc,
                &self.config,
            )?),
            "send_email" => Arc::new(email::EmailAdapter::from_binding(contract, doc, &self.config)?),
            "structured_data_fetch" => {
                Arc::new(fetch::FetchAdapter::from_binding(contract, doc, &self.config)?)
            }
            other => {
                let factory = self.custom.read().ok().and_then(|c| c.get(other).cloned());
                match factory {
                    Some(f) => f.build(contract, doc, &self.config)?,
                    None => return Err(BindingError::UnknownKind(other.to_owned())),
                }
            }
        };
        if let Ok(mut built) = self.built.write() {
            let same = built.entry(contract.id()).or_default();
            same.retain(|b| !b.is_for(contract, binding.digest()));
            same.push(Built {
                namespace: contract.namespace().clone(),
                name: contract.name().to_owned(),
                binding: binding.digest(),
                adapter: Arc::clone(&adapter),
            });
        }
        Ok(adapter)
    }
}

/// Reads a tool's answer about an operation, shared by every adapter that asks a status
/// endpoint or program: `{"status": "committed" | "not_committed" | "unknown", "result": …,
/// "effects": n}`.
///
/// # Errors
/// Anything else is `TOOL_UNCLASSIFIED`.
pub fn read_status(value: &Value) -> Result<Reconciled, Failure> {
    use warrant_core::ToolErrorCode;
    let bad = || Failure::new(ToolErrorCode::Unclassified, "malformed status answer");
    let status = value.get("status").and_then(Value::as_str).ok_or_else(bad)?;
    match status {
        "committed" => {
            let effects = match value.get("effects") {
                None => 1,
                Some(n) => n
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n >= 1)
                    .ok_or_else(bad)?,
            };
            Ok(Reconciled::Committed {
                result: value.get("result").cloned(),
                effects,
            })
        }
        "not_committed" => Ok(Reconciled::NotCommitted),
        "unknown" => Ok(Reconciled::Unknown),
        _ => Err(bad()),
    }
}

/// Replaces `{operation_id}` in a template.
pub(crate) fn with_operation(template: &str, operation: &str) -> String {
    template.replace("{operation_id}", operation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_answers() {
        assert_eq!(
            read_status(&json!({"status": "committed", "result": {"a": 1}, "effects": 2})),
            Ok(Reconciled::Committed {
                result: Some(json!({"a": 1})),
                effects: 2
            })
        );
        assert_eq!(
            read_status(&json!({"status": "not_committed"})),
            Ok(Reconciled::NotCommitted)
        );
        assert_eq!(
            read_status(&json!({"status": "unknown"})),
            Ok(Reconciled::Unknown)
        );
        for bad in [
            json!({}),
            json!({"status": "maybe"}),
            json!({"status": "committed", "effects": 0}),
            json!({"status": "committed", "effects": "2"}),
            json!([]),
        ] {
            assert!(read_status(&bad).is_err(), "{bad}");
        }
    }
}
