//! The policy port: what the decision pipeline asks a policy engine, and what it gets back.
//! The Cedar implementation lives in `warrant-policy`; the core only knows this interface.

use serde_json::{Map, Value};

use crate::authority::Principal;
use crate::contract::Contract;

/// What the principal wants to do with the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyAction {
    /// Invoke the tool with these arguments.
    Invoke,
    /// Approve or reject someone else's call of the tool with these arguments.
    Review,
    /// See the sensitive values of someone else's held call of the tool (asked with the
    /// call's stored arguments, which hold no sensitive value, like a review).
    Reveal,
}

/// One authorization question.
#[derive(Debug, Clone, Copy)]
pub struct PolicyRequest<'a> {
    /// The authenticated principal (id, tenant, roles).
    pub principal: &'a Principal,
    /// Invoke or review.
    pub action: PolicyAction,
    /// The resolved contract (the resource).
    pub contract: &'a Contract,
    /// The validated, typed arguments (the context).
    pub arguments: &'a Map<String, Value>,
}

/// The engine's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyVerdict {
    /// A policy permits the request and none forbids it.
    Allow,
    /// Denied: by default (no permit) or by a forbid.
    Deny {
        /// The ids of the policies that decided (empty for the default deny).
        policies: Vec<String>,
        /// Why policies or the request could not be evaluated, each naming its policy. Any
        /// error denies, whatever the effect of the policy that failed: a forbid that cannot
        /// be evaluated must not let a permit through.
        errors: Vec<String>,
    },
}

/// A policy engine. Implementations are pre-compiled and cheap to call; `authorize` never
/// parses policy text.
pub trait PolicyEngine: Send + Sync {
    /// Answers one request. Must be deterministic for the same request.
    fn authorize(&self, request: &PolicyRequest<'_>) -> PolicyVerdict;
}

/// Permits everything. Only for tests and fuzzing of the other stages; no lane uses it (the
/// server and `warrant check` without policies deny every call).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPolicy;

impl PolicyEngine for NoPolicy {
    fn authorize(&self, _request: &PolicyRequest<'_>) -> PolicyVerdict {
        PolicyVerdict::Allow
    }
}
