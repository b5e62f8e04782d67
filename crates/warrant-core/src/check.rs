//! The storage-free part of the decision pipeline, and the report `warrant check` prints.
//!
//! Order (PRODUCT §1): parse → identity → contract → schema → canonical digest → scope
//! attenuation → idempotency-key rule → approval binding. The idempotency-key rule runs
//! before approval because an approval binds to the key. Each stage that refuses stops the
//! pipeline; the report records the facts established up to that point.

use time::OffsetDateTime;

use crate::authority::{
    ApprovalBinding, ApprovalRecord, Principal, attenuate, bind_approval, idempotency_requirement,
};
use crate::canon::Sha256Digest;
use crate::contract::{ApprovalMode, Contract, ContractId, Effect};
use crate::decision::{Allowed, ApprovalNeeded, ApprovalState, Decision, IdempotencyState, Rejection};
use crate::json::Limits;
use crate::proposal::{Envelope, ValidatedProposal};

/// Everything one offline decision needs.
#[derive(Debug, Clone, Copy)]
pub struct CheckInput<'a> {
    /// The contract the proposal must resolve to.
    pub contract: &'a Contract,
    /// The untrusted proposal bytes.
    pub proposal: &'a [u8],
    /// The authenticated caller.
    pub principal: &'a Principal,
    /// An approval record presented with the call, if any.
    pub approval: Option<&'a ApprovalRecord>,
    /// The current time (for approval expiry).
    pub now: OffsetDateTime,
    /// Size and nesting limits for the proposal.
    pub limits: Limits,
}

/// Whether the arguments passed the schema stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaState {
    /// The arguments are valid.
    Valid,
    /// The schema stage refused the arguments.
    Invalid,
}

impl SchemaState {
    /// `VALID` or `INVALID`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SchemaState::Valid => "VALID",
            SchemaState::Invalid => "INVALID",
        }
    }
}

/// The facts of one decision, as far as the pipeline got.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The contract's content id.
    pub contract_id: ContractId,
    /// The contract's tool name.
    pub tool: String,
    /// The contract's version.
    pub version: u32,
    /// The contract's effect.
    pub effect: Effect,
    /// What the stages established before the decision.
    pub facts: Facts,
    /// The decision.
    pub decision: Decision,
}

/// Facts established by the stages that ran.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Facts {
    /// The schema stage's verdict, once reached.
    pub schema: Option<SchemaState>,
    /// The payload digest, once the arguments validated.
    pub payload_digest: Option<Sha256Digest>,
    /// `grant ∩ contract.scopes`, once attenuated.
    pub delegated_scopes: Option<Vec<String>>,
    /// The idempotency state, once checked.
    pub idempotency: Option<IdempotencyState>,
    /// The approval state, once checked.
    pub approval: Option<ApprovalState>,
}

/// Runs the storage-free pipeline on one proposal.
pub fn evaluate(input: &CheckInput<'_>) -> Report {
    let contract = input.contract;
    let mut facts = Facts::default();
    let decision = run(input, &mut facts).unwrap_or_else(Decision::Reject);
    Report {
        contract_id: contract.id(),
        tool: contract.name().to_owned(),
        version: contract.version(),
        effect: contract.effect(),
        facts,
        decision,
    }
}

fn run(input: &CheckInput<'_>, report: &mut Facts) -> Result<Decision, Rejection> {
    let contract = input.contract;
    let envelope = Envelope::parse(input.proposal, input.limits)?;
    let proposal = match ValidatedProposal::validate(envelope, contract) {
        Ok(p) => {
            report.schema = Some(SchemaState::Valid);
            p
        }
        Err(rejection) => {
            if rejection.stage() == crate::Stage::Schema {
                report.schema = Some(SchemaState::Invalid);
            }
            return Err(rejection);
        }
    };
    report.payload_digest = Some(proposal.payload_digest());

    let scopes = attenuate(input.principal, contract)?;
    report.delegated_scopes = Some(scopes.iter().map(str::to_owned).collect());

    let idempotency = match idempotency_requirement(contract, &proposal) {
        Ok(state) => state,
        Err(rejection) => {
            report.idempotency = Some(IdempotencyState::RequiredMissing);
            return Err(rejection);
        }
    };
    report.idempotency = Some(idempotency);

    let approval_id = match contract.approval() {
        ApprovalMode::None => {
            report.approval = Some(ApprovalState::NotRequired);
            None
        }
        ApprovalMode::PerCall => {
            let needed = || {
                Decision::NeedsApproval(ApprovalNeeded {
                    request_id: None,
                    contract_id: contract.id(),
                    payload_digest: proposal.payload_digest(),
                    idempotency_key: proposal.idempotency_key().map(str::to_owned),
                    expires_at: None,
                })
            };
            let Some(record) = input.approval else {
                report.approval = Some(ApprovalState::RequiredMissing);
                return Ok(needed());
            };
            match bind_approval(record, &proposal, input.principal, input.now) {
                ApprovalBinding::Bound => {
                    report.approval = Some(ApprovalState::BoundToCall);
                    Some(record.id.clone())
                }
                ApprovalBinding::Pending => {
                    report.approval = Some(ApprovalState::RequiredMissing);
                    return Ok(needed());
                }
                ApprovalBinding::Refused(state, rejection) => {
                    report.approval = Some(state);
                    return Err(rejection);
                }
            }
        }
    };
    Ok(Decision::Allow(Allowed::new(
        proposal,
        scopes,
        approval_id,
        idempotency,
    )))
}
