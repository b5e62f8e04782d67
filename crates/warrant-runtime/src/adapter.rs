//! The adapter port: how one attempt of an allowed call reaches the world, and how the
//! runtime later asks what became of it. Adapters map every failure onto the closed
//! [`ToolErrorCode`]s; they never decide about retries (the runtime does, from the contract).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use warrant_core::decision::OperationId;
use warrant_core::{Contract, ToolErrorCode};

/// One attempt of an allowed call, as an adapter sees it. Everything here is already
/// authorized: the arguments passed the schema, the guards and the policy.
#[derive(Debug)]
pub struct Invocation<'a> {
    /// The identity of the operation across attempts and reconciliation; adapters send it as
    /// the idempotency token (e.g. the `Idempotency-Key` header), unchanged on every attempt.
    pub operation_id: &'a OperationId,
    /// The contract being executed.
    pub contract: &'a Contract,
    /// The validated arguments.
    pub arguments: &'a serde_json::Map<String, Value>,
    /// The RFC 8785 canonical bytes of the arguments (what the payload digest covers).
    pub canonical: &'a [u8],
    /// `grant ∩ contract.scopes`: the only scopes the adapter may pass on.
    pub scopes: &'a [String],
    /// The tenant the call runs in.
    pub tenant: &'a str,
    /// The authenticated principal.
    pub principal: &'a str,
    /// 1-based attempt number.
    pub attempt: u32,
    /// How long this attempt may take (what is left of the call's deadline).
    pub timeout: Duration,
}

/// What reconciliation asks about.
#[derive(Debug)]
pub struct Inquiry<'a> {
    /// The operation in question.
    pub operation_id: &'a OperationId,
    /// Its contract.
    pub contract: &'a Contract,
    /// The tenant the call ran in.
    pub tenant: &'a str,
    /// How long the inquiry may take.
    pub timeout: Duration,
}

/// What an adapter found out about an operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// The effect happened, `effects` times (more than one is a confirmed duplicate).
    Committed {
        /// The tool's result, when it can tell (validated against the output schema).
        result: Option<Value>,
        /// How many times the effect was committed.
        effects: u32,
    },
    /// The effect did not happen (and will not: the operation is over).
    NotCommitted,
    /// The adapter cannot tell (yet).
    Unknown,
}

/// A failed attempt, classified.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    code: ToolErrorCode,
    ambiguous: bool,
    retry_after: Option<Duration>,
    detail: String,
}

impl Failure {
    /// A failure the tool answered (or that happened before anything was sent): no effect.
    pub fn new(code: ToolErrorCode, detail: impl Into<String>) -> Self {
        Failure {
            code,
            ambiguous: false,
            retry_after: None,
            detail: detail.into(),
        }
    }

    /// A failure after the request may have reached the tool, with no answer saying what
    /// happened (a timeout, a lost response): the effect may have happened.
    pub fn ambiguous(code: ToolErrorCode, detail: impl Into<String>) -> Self {
        Failure {
            ambiguous: true,
            ..Failure::new(code, detail)
        }
    }

    /// The tool asked to wait this long before trying again (`Retry-After`).
    #[must_use]
    pub fn retry_after(mut self, wait: Option<Duration>) -> Self {
        self.retry_after = wait;
        self
    }

    /// The closed code.
    pub fn code(&self) -> ToolErrorCode {
        self.code
    }

    /// Whether the effect may have happened.
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }

    /// The same failure, marked as one after which the effect may have happened.
    #[must_use]
    pub fn into_ambiguous(self) -> Self {
        Failure {
            ambiguous: true,
            ..self
        }
    }

    /// The wait the tool asked for.
    pub fn wait(&self) -> Option<Duration> {
        self.retry_after
    }

    /// A description for logs and the ledger (never argument values or credentials).
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

/// An executable binding of one contract.
#[async_trait]
pub trait Adapter: Send + Sync + std::fmt::Debug {
    /// Makes one attempt. On success returns the tool's result (the runtime validates it
    /// against the output schema).
    async fn invoke(&self, call: &Invocation<'_>) -> Result<Value, Failure>;

    /// Asks what became of an operation whose outcome is unknown.
    async fn reconcile(&self, inquiry: &Inquiry<'_>) -> Result<Reconciled, Failure>;
}

/// Why a contract's adapter binding cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// The contract has no `adapter` section.
    #[error("the contract has no adapter binding")]
    Missing,
    /// No adapter of this kind exists.
    #[error("unknown adapter kind `{0}`")]
    UnknownKind(String),
    /// The binding is malformed.
    #[error("invalid `{kind}` binding: {message}")]
    Invalid {
        /// The adapter kind.
        kind: String,
        /// What is wrong.
        message: String,
    },
    /// A credential the binding names is not in the operator's credential map, or is not
    /// granted to this tool (one error for both, so a binding cannot probe which names exist).
    #[error("credential `{0}` is not configured for this tool")]
    MissingCredential(String),
    /// The binding would send a credential to an origin it is not pinned to.
    #[error("credential `{credential}` may not be sent to {origin}")]
    CredentialOrigin {
        /// The credential's name.
        credential: String,
        /// The origin the binding would send it to.
        origin: String,
    },
}

impl BindingError {
    /// An invalid-binding error.
    pub fn invalid(kind: &str, message: impl Into<String>) -> Self {
        BindingError::Invalid {
            kind: kind.to_owned(),
            message: message.into(),
        }
    }
}
