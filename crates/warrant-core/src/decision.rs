//! The closed vocabulary of decisions: stages, rejection codes, tool error codes and outcomes
//! (PRODUCT §4). Every refusal anywhere in Warrant is one [`Rejection`]; its stage and code
//! are what the ledger records and what clients branch on, so both are stable strings.

use crate::authority::DelegatedScopes;
use crate::canon::Sha256Digest;
use crate::contract::{Contract, ContractId};
use crate::proposal::ValidatedProposal;
use crate::records::{AttemptClaims, IdempotencyRecord, IdempotencyScope, LedgerEntry};
use std::sync::Arc;

/// The pipeline stage that refused a proposal, in pipeline order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Bytes to envelope: JSON syntax, limits, the closed envelope shape.
    Parse,
    /// The proposal tried to carry identity, or identity does not bind.
    Identity,
    /// Resolving the named contract (name, version, content id, retirement).
    Contract,
    /// Validating the arguments against the contract's closed input schema.
    Schema,
    /// The policy engine's verdict.
    Policy,
    /// Scope attenuation: `grant ∩ contract.scopes` must cover the contract.
    Scope,
    /// Argument guards such as recipient allow-lists.
    Guard,
    /// Call and cost budgets.
    Budget,
    /// Human approval bound to the exact call.
    Approval,
    /// Idempotency key requirements and records.
    Idempotency,
}

impl Stage {
    /// The stable lowercase name (`parse`, `schema`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::Identity => "identity",
            Stage::Contract => "contract",
            Stage::Schema => "schema",
            Stage::Policy => "policy",
            Stage::Scope => "scope",
            Stage::Guard => "guard",
            Stage::Budget => "budget",
            Stage::Approval => "approval",
            Stage::Idempotency => "idempotency",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! reject_codes {
    ($( $(#[$doc:meta])* $variant:ident => $text:literal, $stage:ident; )*) => {
        /// Why a proposal was refused. Each code belongs to exactly one [`Stage`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RejectCode {
            $( $(#[$doc])* $variant, )*
        }

        impl RejectCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [RejectCode] = &[$(RejectCode::$variant,)*];

            /// The stable SCREAMING_SNAKE_CASE name.
            pub const fn as_str(self) -> &'static str {
                match self { $( RejectCode::$variant => $text, )* }
            }

            /// The stage this code is reported by.
            pub const fn stage(self) -> Stage {
                match self { $( RejectCode::$variant => Stage::$stage, )* }
            }

            /// Looks a code up by its stable name.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $( $text => Some(RejectCode::$variant), )* _ => None }
            }
        }
    };
}

reject_codes! {
    /// The proposal is larger than the size limit.
    PayloadTooLarge => "PAYLOAD_TOO_LARGE", Parse;
    /// The proposal is not valid UTF-8.
    InvalidUtf8 => "INVALID_UTF8", Parse;
    /// The proposal is not JSON.
    InvalidJson => "INVALID_JSON", Parse;
    /// An object names the same key twice.
    DuplicateKey => "DUPLICATE_KEY", Parse;
    /// Nesting is deeper than the limit.
    NestingTooDeep => "NESTING_TOO_DEEP", Parse;
    /// A number overflows, underflows or is an unsafe integer.
    NumberOutOfRange => "NUMBER_OUT_OF_RANGE", Parse;
    /// A string holds a lone UTF-16 surrogate.
    LoneSurrogate => "LONE_SURROGATE", Parse;
    /// The envelope is not an object, misses a field, or has a field of the wrong type.
    EnvelopeInvalid => "ENVELOPE_INVALID", Parse;
    /// The envelope has a field outside `{tool, version, contract, arguments, idempotency_key, approval}`.
    EnvelopeUnknownField => "ENVELOPE_UNKNOWN_FIELD", Parse;
    /// The proposal tries to state who is calling; identity comes from authentication only.
    IdentityInProposal => "IDENTITY_IN_PROPOSAL", Identity;
    /// No contract with that name is registered (or visible).
    ContractNotFound => "CONTRACT_NOT_FOUND", Contract;
    /// The proposal names a version that is not the one resolved.
    ContractVersionMismatch => "CONTRACT_VERSION_MISMATCH", Contract;
    /// The proposal names a content id that does not match the contract.
    ContractIdMismatch => "CONTRACT_ID_MISMATCH", Contract;
    /// The contract is retired and refuses new calls.
    ContractRetired => "CONTRACT_RETIRED", Contract;
    /// An argument has the wrong JSON type.
    SchemaTypeMismatch => "SCHEMA_TYPE_MISMATCH", Schema;
    /// A number with a fraction or exponent where the schema says integer.
    SchemaNotInteger => "SCHEMA_NOT_INTEGER", Schema;
    /// An argument the closed schema does not declare.
    SchemaUnknownField => "SCHEMA_UNKNOWN_FIELD", Schema;
    /// A required argument is missing.
    SchemaRequiredMissing => "SCHEMA_REQUIRED_MISSING", Schema;
    /// A string is longer than `maxLength`.
    SchemaStringTooLong => "SCHEMA_STRING_TOO_LONG", Schema;
    /// A string is shorter than `minLength`.
    SchemaStringTooShort => "SCHEMA_STRING_TOO_SHORT", Schema;
    /// A number is outside its bounds.
    SchemaOutOfRange => "SCHEMA_OUT_OF_RANGE", Schema;
    /// A string does not match its `pattern`.
    SchemaPatternMismatch => "SCHEMA_PATTERN_MISMATCH", Schema;
    /// A string does not match its `format`.
    SchemaFormatMismatch => "SCHEMA_FORMAT_MISMATCH", Schema;
    /// A value is not one of the allowed constants.
    SchemaEnumMismatch => "SCHEMA_ENUM_MISMATCH", Schema;
    /// An array has too many or too few items.
    SchemaArrayLength => "SCHEMA_ARRAY_LENGTH", Schema;
    /// Any other violation of the input schema.
    SchemaViolation => "SCHEMA_VIOLATION", Schema;
    /// The arguments nest too deep, or reach too many schema nodes, for the annotation walk
    /// (guards, redaction) to finish: refused rather than passed unchecked.
    ArgumentsTooComplex => "ARGUMENTS_TOO_COMPLEX", Schema;
    /// The policy engine denied the call.
    PolicyDenied => "POLICY_DENIED", Policy;
    /// The caller's grants do not cover a scope the contract requires.
    ScopeMissing => "SCOPE_MISSING", Scope;
    /// A recipient is outside the tenant's allow-list.
    RecipientNotAllowed => "RECIPIENT_NOT_ALLOWED", Guard;
    /// A call or cost budget is exhausted.
    BudgetExhausted => "BUDGET_EXHAUSTED", Budget;
    /// The approval does not belong to this exact call (contract, tenant, payload, key or proposer).
    ApprovalMismatch => "APPROVAL_MISMATCH", Approval;
    /// The approval has expired.
    ApprovalExpired => "APPROVAL_EXPIRED", Approval;
    /// The approval was already used by a call.
    ApprovalConsumed => "APPROVAL_CONSUMED", Approval;
    /// A reviewer rejected the call.
    ApprovalRejected => "APPROVAL_REJECTED", Approval;
    /// The approval was granted by the proposer itself.
    ApprovalSelfApproved => "APPROVAL_SELF_APPROVED", Approval;
    /// The referenced approval does not exist (or belongs to another tenant).
    ApprovalNotFound => "APPROVAL_NOT_FOUND", Approval;
    /// The contract's effect requires an idempotency key and none was given.
    IdempotencyKeyRequired => "IDEMPOTENCY_KEY_REQUIRED", Idempotency;
    /// The idempotency key is malformed.
    IdempotencyKeyInvalid => "IDEMPOTENCY_KEY_INVALID", Idempotency;
    /// The key was used before with a different payload.
    IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED", Idempotency;
    /// A call with the same key is still in flight.
    IdempotencyInFlight => "IDEMPOTENCY_IN_FLIGHT", Idempotency;
}

impl std::fmt::Display for RejectCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed refusal: the stage, a stable code, a human-readable detail and, where the
/// problem has a place in the proposal, an RFC 6901 pointer to it.
///
/// The detail never echoes argument values, so it is safe to log and to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    code: RejectCode,
    detail: String,
    pointer: Option<String>,
}

impl Rejection {
    /// A refusal with `code`; the stage follows from the code.
    pub fn new(code: RejectCode, detail: impl Into<String>) -> Self {
        Rejection {
            code,
            detail: detail.into(),
            pointer: None,
        }
    }

    /// Adds the pointer to the offending part of the proposal.
    pub fn at(mut self, pointer: impl Into<String>) -> Self {
        self.pointer = Some(pointer.into());
        self
    }

    /// The stage that refused.
    pub fn stage(&self) -> Stage {
        self.code.stage()
    }

    /// The stable code.
    pub fn code(&self) -> RejectCode {
        self.code
    }

    /// What went wrong, for humans.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// Where in the proposal, if anywhere.
    pub fn pointer(&self) -> Option<&str> {
        self.pointer.as_deref()
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.stage(), self.code, self.detail)?;
        if let Some(p) = &self.pointer {
            write!(f, " (at {p})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejection {}

/// Whether a tool error may be retried, and under which condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retryable {
    /// Never retried.
    No,
    /// Retried with the same idempotency token.
    Yes,
    /// Retried only where the tool honours idempotency; otherwise the outcome is `unknown`.
    OnlyIfIdempotent,
}

macro_rules! tool_error_codes {
    ($( $(#[$doc:meta])* $variant:ident => $text:literal, $retry:ident; )*) => {
        /// The closed set of errors an adapter may report (PRODUCT §4).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ToolErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        impl ToolErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ToolErrorCode] = &[$(ToolErrorCode::$variant,)*];

            /// The stable name.
            pub const fn as_str(self) -> &'static str {
                match self { $( ToolErrorCode::$variant => $text, )* }
            }

            /// The retry classification, as data.
            pub const fn retryable(self) -> Retryable {
                match self { $( ToolErrorCode::$variant => Retryable::$retry, )* }
            }

            /// Looks a code up by its stable name.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $( $text => Some(ToolErrorCode::$variant), )* _ => None }
            }
        }
    };
}

tool_error_codes! {
    /// The tool refused its input.
    InputInvalid => "TOOL_INPUT_INVALID", No;
    /// The tool's output does not match the contract's output schema.
    OutputInvalid => "TOOL_OUTPUT_INVALID", No;
    /// No answer in time.
    Timeout => "TOOL_TIMEOUT", OnlyIfIdempotent;
    /// The tool asked us to slow down (honour Retry-After).
    RateLimited => "TOOL_RATE_LIMITED", Yes;
    /// The tool or its upstream is unavailable.
    UpstreamUnavailable => "TOOL_UPSTREAM_UNAVAILABLE", Yes;
    /// The tool failed in a way a retry will not fix.
    PermanentFailure => "TOOL_PERMANENT_FAILURE", No;
    /// The tool's own authorization refused the call.
    PermissionDenied => "TOOL_PERMISSION_DENIED", No;
    /// A retry was due but the tool does not honour idempotency.
    RetryRequiresIdempotency => "TOOL_RETRY_REQUIRES_IDEMPOTENCY", No;
    /// Anything else.
    Unclassified => "TOOL_UNCLASSIFIED", No;
}

impl std::fmt::Display for ToolErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of an allowed call.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The effect happened; the result matches the output schema.
    Committed(serde_json::Value),
    /// The effect did not happen.
    Failed(ToolErrorCode),
    /// Nobody knows yet whether the effect happened; reconcile by operation id.
    Unknown(OperationId),
}

/// The identity of one logical operation across attempts and reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationId(String);

impl OperationId {
    /// Wraps an operation id.
    pub fn new(id: impl Into<String>) -> Self {
        OperationId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The state of approval for one call, as `warrant check` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    /// The contract does not ask for approval.
    NotRequired,
    /// Approval is required and no approved record was presented.
    RequiredMissing,
    /// An approved record matches this exact call.
    BoundToCall,
    /// A record was presented but belongs to another call (or was rejected, consumed or self-approved).
    Mismatch,
    /// A matching record was presented but has expired.
    Expired,
}

impl ApprovalState {
    /// The stable name (`BOUND_TO_CALL`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalState::NotRequired => "NOT_REQUIRED",
            ApprovalState::RequiredMissing => "REQUIRED_MISSING",
            ApprovalState::BoundToCall => "BOUND_TO_CALL",
            ApprovalState::Mismatch => "MISMATCH",
            ApprovalState::Expired => "EXPIRED",
        }
    }
}

/// Whether the call needs an idempotency key and has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdempotencyState {
    /// Read effects need no key.
    NotRequired,
    /// The effect needs a key and the proposal carries one.
    RequiredPresent,
    /// The effect needs a key and the proposal carries none.
    RequiredMissing,
}

impl IdempotencyState {
    /// The stable name (`REQUIRED_PRESENT`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            IdempotencyState::NotRequired => "NOT_REQUIRED",
            IdempotencyState::RequiredPresent => "REQUIRED_PRESENT",
            IdempotencyState::RequiredMissing => "REQUIRED_MISSING",
        }
    }
}

/// What an approval request is bound to (PRODUCT §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNeeded {
    /// The stored request's id, once the store has created one (offline checks have none).
    pub request_id: Option<String>,
    /// The contract the approval will be bound to.
    pub contract_id: ContractId,
    /// The payload digest the approval will be bound to.
    pub payload_digest: Sha256Digest,
    /// The idempotency key the approval will be bound to.
    pub idempotency_key: Option<String>,
    /// When the request expires, once stored.
    pub expires_at: Option<time::OffsetDateTime>,
}

/// The decision on one proposal (PRODUCT §4).
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The call has authority to cross the side-effect boundary.
    Allow(Box<Allowed>),
    /// The call needs a human approval bound to its exact payload.
    NeedsApproval(ApprovalNeeded),
    /// The call is refused.
    Reject(Rejection),
}

impl Decision {
    /// `ALLOW`, `NEEDS_APPROVAL` or `REJECT`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Allow(_) => "ALLOW",
            Decision::NeedsApproval(_) => "NEEDS_APPROVAL",
            Decision::Reject(_) => "REJECT",
        }
    }
}

/// An allowed call: everything the execution layer needs, and proof that every stage passed.
///
/// **Invariant:** fields are private and the constructor is crate-private, so an `Allowed`
/// exists only where the core's pipeline produced one.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowed {
    proposal: ValidatedProposal,
    delegated_scopes: DelegatedScopes,
    approval_id: Option<String>,
    idempotency: IdempotencyState,
    context: AllowedContext,
}

/// What the pipeline hands the runtime with an allowed call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AllowedContext {
    pub(crate) contract: Arc<Contract>,
    pub(crate) ledger: LedgerEntry,
    pub(crate) scope: Option<IdempotencyScope>,
    pub(crate) claims: AttemptClaims,
    pub(crate) replay: Option<IdempotencyRecord>,
}

impl Allowed {
    pub(crate) fn new(
        proposal: ValidatedProposal,
        delegated_scopes: DelegatedScopes,
        approval_id: Option<String>,
        idempotency: IdempotencyState,
        context: AllowedContext,
    ) -> Self {
        Allowed {
            proposal,
            delegated_scopes,
            approval_id,
            idempotency,
            context,
        }
    }

    /// The resolved contract.
    pub fn contract(&self) -> &Arc<Contract> {
        &self.context.contract
    }
    /// The ledger row to write (outcome `attempting`) when the attempt begins.
    pub fn ledger_entry(&self) -> &LedgerEntry {
        &self.context.ledger
    }
    /// The idempotency record key, when the call carries a key.
    pub fn idempotency_scope(&self) -> Option<&IdempotencyScope> {
        self.context.scope.as_ref()
    }
    /// What the call's write-ahead commit consumes and reserves: the approval bound to it and
    /// its budget counters. Nothing is spent by the decision itself; the runtime takes all of
    /// it in the one transaction that starts the attempt (or records the call), or none.
    pub fn claims(&self) -> &AttemptClaims {
        &self.context.claims
    }
    /// The record of an earlier attempt of this same call, if there is one: committed or
    /// permanently failed (a replay), or `unknown` (to be reconciled before anything runs).
    pub fn replay(&self) -> Option<&IdempotencyRecord> {
        self.context.replay.as_ref()
    }

    /// The validated proposal.
    pub fn proposal(&self) -> &ValidatedProposal {
        &self.proposal
    }
    /// `grant ∩ contract.scopes`.
    pub fn delegated_scopes(&self) -> &DelegatedScopes {
        &self.delegated_scopes
    }
    /// The approval the call is bound to, if it needed one.
    pub fn approval_id(&self) -> Option<&str> {
        self.approval_id.as_deref()
    }
    /// The idempotency state.
    pub fn idempotency(&self) -> IdempotencyState {
        self.idempotency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &code in RejectCode::ALL {
            assert!(seen.insert(code.as_str()));
            assert_eq!(RejectCode::parse(code.as_str()), Some(code));
        }
        for &code in ToolErrorCode::ALL {
            assert!(seen.insert(code.as_str()));
            assert_eq!(ToolErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ToolErrorCode::ALL.len(), 9);
    }

    #[test]
    fn retry_classification_is_the_spec_table() {
        use Retryable::*;
        use ToolErrorCode::*;
        let table = [
            (InputInvalid, No),
            (OutputInvalid, No),
            (Timeout, OnlyIfIdempotent),
            (RateLimited, Yes),
            (UpstreamUnavailable, Yes),
            (PermanentFailure, No),
            (PermissionDenied, No),
            (RetryRequiresIdempotency, No),
            (Unclassified, No),
        ];
        for (code, retry) in table {
            assert_eq!(code.retryable(), retry, "{code}");
        }
    }
}
