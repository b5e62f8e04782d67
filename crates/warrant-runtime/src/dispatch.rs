//! `dispatch`: the one function every lane calls with an authenticated principal and an
//! untrusted proposal — `decide`, then, on `allow`, `execute`. HTTP, MCP, workflows and
//! inbound webhooks differ only in how they carry the call and present the answer.

use warrant_core::Rejection;
use warrant_core::authority::Principal;
use warrant_core::decision::{ApprovalNeeded, Decision};
use warrant_core::pipeline::{Authority, Call, Facts};
use warrant_core::store::StoreError;

use crate::execute::{Execution, Runtime};

/// What became of one proposal.
#[derive(Debug, Clone, PartialEq)]
pub enum Dispatched {
    /// Allowed and executed (or replayed, or refused by the idempotency record as it began).
    Executed(Execution),
    /// Held for a human approval bound to the exact payload.
    NeedsApproval {
        /// The ledger row of this proposal.
        ledger_id: String,
        /// What the approval is bound to.
        needed: ApprovalNeeded,
    },
    /// Refused at a decision stage.
    Rejected {
        /// The ledger row of this proposal.
        ledger_id: String,
        /// Why.
        rejection: Rejection,
    },
}

impl Dispatched {
    /// The ledger row of this proposal.
    pub fn ledger_id(&self) -> &str {
        match self {
            Dispatched::Executed(e) => &e.ledger_id,
            Dispatched::NeedsApproval { ledger_id, .. } | Dispatched::Rejected { ledger_id, .. } => ledger_id,
        }
    }
}

/// Decides `call` for `principal` and executes it when allowed. Returns the facts the
/// decision established too (for reports).
///
/// # Errors
/// A store failure (nothing is allowed on a store failure: fail closed).
pub async fn dispatch(
    authority: &Authority,
    runtime: &Runtime,
    principal: &Principal,
    call: &Call<'_>,
) -> Result<(Dispatched, Facts), StoreError> {
    let decided = authority.decide(principal, call).await?;
    let dispatched = match decided.decision {
        Decision::Allow(allowed) => Dispatched::Executed(runtime.execute(allowed).await?),
        Decision::NeedsApproval(needed) => Dispatched::NeedsApproval {
            ledger_id: decided.ledger_id,
            needed,
        },
        Decision::Reject(rejection) => Dispatched::Rejected {
            ledger_id: decided.ledger_id,
            rejection,
        },
    };
    Ok((dispatched, decided.facts))
}
