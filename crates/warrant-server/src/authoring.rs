//! Compiling an authored workflow against a tenant's registry: what publishing does
//! (`POST /v1/workflows`) and what the built-in `workflow_validator` tool answers, so an agent
//! that authors workflows gets exactly the refusals publishing would give.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use warrant_core::ToolErrorCode;
use warrant_core::contract::{DocumentFormat, read_document};
use warrant_core::registry::{Pin, Registry};
use warrant_core::store::StoreError;
use warrant_runtime::adapter::{Adapter, BindingError, Failure, Inquiry, Invocation, Reconciled};
use warrant_runtime::adapters::{AdapterConfig, AdapterFactory};
use warrant_workflow::compile::{Compiled, Found, Violation};
use warrant_workflow::definition::{self, ToolRef};

/// Why a definition was not compiled.
#[derive(Debug)]
pub enum Refusal {
    /// Not a YAML or JSON document.
    Syntax(String),
    /// The grammar refuses it (`WORKFLOW_INVALID`), every problem listed.
    Invalid(Vec<Violation>),
    /// The compiler refuses it (`WORKFLOW_REFUSED`): unknown tools, bindings, Gate A.
    Refused(Vec<Violation>),
    /// The registry could not be read.
    Store(StoreError),
}

impl Refusal {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Syntax(_) => "WORKFLOW_SYNTAX",
            Refusal::Invalid(_) => "WORKFLOW_INVALID",
            Refusal::Refused(_) => "WORKFLOW_REFUSED",
            Refusal::Store(_) => "INTERNAL",
        }
    }
}

/// Reads `text` and compiles it against the contracts `tenant`'s calls resolve to (its own
/// namespace, then the platform's): the document as read, and the compiled workflow.
///
/// # Errors
/// A [`Refusal`].
pub async fn compile_text(
    registry: &Registry,
    tenant: &str,
    text: &str,
    format: DocumentFormat,
    now: time::OffsetDateTime,
) -> Result<(Value, Compiled), Refusal> {
    let document = read_document(text, format).map_err(|e| Refusal::Syntax(e.to_string()))?;
    let definition = definition::from_document(&document).map_err(|problems| {
        Refusal::Invalid(
            problems
                .into_iter()
                .map(|p| Violation {
                    rule: warrant_workflow::Rule::Grammar,
                    step: None,
                    pointer: p.pointer,
                    message: p.message,
                    path: None,
                })
                .collect(),
        )
    })?;
    // The registry is asynchronous and the compiler is not: resolve every reference first.
    let mut catalog: BTreeMap<ToolRef, Found> = BTreeMap::new();
    for tool in definition.tool_refs() {
        let content_id;
        let pin = match tool {
            ToolRef::Version { name, version } => Pin::Version(name, *version),
            ToolRef::Content(id) => {
                content_id = id.to_string();
                Pin::ContentId(&content_id)
            }
        };
        let found = match registry
            .find_pinned(tenant, pin, now)
            .await
            .map_err(Refusal::Store)?
        {
            Some((contract, false)) => Found::Active(contract),
            Some((contract, true)) => Found::Retired(contract),
            None => Found::Unknown,
        };
        catalog.insert(tool.clone(), found);
    }
    let compiled = warrant_workflow::compile(definition, &catalog).map_err(Refusal::Refused)?;
    Ok((document, compiled))
}

/// Each tool step's review coverage, as the API and the validator answer it.
#[must_use]
pub fn coverage(compiled: &Compiled) -> Value {
    Value::Array(
        compiled
            .coverage
            .iter()
            .map(|c| {
                json!({
                    "step": c.step,
                    "tool": c.tool,
                    "content_id": c.content_id.to_string(),
                    "effect": c.effect.as_str(),
                    "review_required": c.review_required,
                    "reviews": c.reviews,
                })
            })
            .collect(),
    )
}

/// The violations as JSON.
#[must_use]
pub fn violations(list: &[Violation]) -> Value {
    Value::Array(list.iter().map(Violation::to_json).collect())
}

/// The adapter kind of the built-in validator.
pub const VALIDATOR_KIND: &str = "workflow_validator";

/// The `workflow_validator` adapter: compiles `arguments.definition` (YAML or JSON text) for
/// the caller's tenant and answers the verdict — `{valid, name?, version?, coverage,
/// violations}`. It reads the registry and nothing else: no effect, nothing to reconcile.
#[derive(Debug)]
pub struct Validator {
    registry: Arc<Registry>,
}

#[async_trait]
impl Adapter for Validator {
    async fn invoke(&self, call: &Invocation<'_>) -> Result<Value, Failure> {
        let text = call
            .arguments
            .get("definition")
            .and_then(Value::as_str)
            .ok_or_else(|| Failure::new(ToolErrorCode::InputInvalid, "`definition` is not a string"))?;
        let now = time::OffsetDateTime::now_utc();
        let verdict = compile_text(&self.registry, call.tenant, text, DocumentFormat::Yaml, now).await;
        Ok(match verdict {
            Ok((_, compiled)) => json!({
                "valid": true,
                "code": null,
                "name": compiled.definition.name,
                "version": compiled.definition.version,
                "coverage": coverage(&compiled),
                "violations": [],
            }),
            Err(Refusal::Store(e)) => {
                return Err(Failure::new(ToolErrorCode::UpstreamUnavailable, e.to_string()));
            }
            Err(refusal) => {
                let list = match &refusal {
                    Refusal::Syntax(message) => vec![Violation {
                        rule: warrant_workflow::Rule::Grammar,
                        step: None,
                        pointer: String::new(),
                        message: message.clone(),
                        path: None,
                    }],
                    Refusal::Invalid(list) | Refusal::Refused(list) => list.clone(),
                    Refusal::Store(_) => Vec::new(),
                };
                json!({
                    "valid": false,
                    "code": refusal.code(),
                    "coverage": [],
                    "violations": violations(&list),
                })
            }
        })
    }

    async fn reconcile(&self, _inquiry: &Inquiry<'_>) -> Result<Reconciled, Failure> {
        Ok(Reconciled::NotCommitted)
    }
}

/// Builds [`Validator`]s: a binding is `{kind: workflow_validator}` and nothing else.
#[derive(Debug)]
pub struct ValidatorFactory {
    /// The registry the validator compiles against.
    pub registry: Arc<Registry>,
}

impl AdapterFactory for ValidatorFactory {
    fn build(
        &self,
        _contract: &warrant_core::Contract,
        binding: &Value,
        _config: &AdapterConfig,
    ) -> Result<Arc<dyn Adapter>, BindingError> {
        if let Some(key) = binding
            .as_object()
            .and_then(|m| m.keys().find(|k| k.as_str() != "kind"))
        {
            return Err(BindingError::Invalid {
                kind: VALIDATOR_KIND.to_owned(),
                message: format!("unknown field `{key}`"),
            });
        }
        Ok(Arc::new(Validator {
            registry: self.registry.clone(),
        }))
    }
}
