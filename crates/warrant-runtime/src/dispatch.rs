//! `dispatch`: the one function every lane calls with an authenticated principal and an
//! untrusted proposal — `decide`, then, on `allow`, `execute`. HTTP, MCP, workflows and
//! inbound webhooks differ only in how they carry the call and present the answer.
//!
//! **Ownership.** A lane hands its call over with [`submit`]: the call then runs in a task
//! the runtime owns (and tracks, so a graceful shutdown waits for it), from decision to a
//! terminal, recorded state, whatever happens to the caller. A client that disconnects, or a
//! timeout that drops the request, only stops the lane from *waiting*: it cannot cut a call
//! between its write-ahead commit and its outcome.

use std::sync::Arc;

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
        Decision::Allow(allowed) => {
            let execution = runtime.execute(allowed).await?;
            if let Some(counter) = &execution.exhausted {
                authority.note_exhausted(principal.tenant(), counter);
            }
            Dispatched::Executed(execution)
        }
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

/// A call as a lane hands it to the runtime: owned, so it outlives the lane's request.
#[derive(Debug, Clone, Default)]
pub struct OwnedCall {
    /// The untrusted proposal bytes, as the client sent them.
    pub bytes: bytes::Bytes,
    /// An idempotency key carried by the transport.
    pub idempotency_key: Option<String>,
    /// An approval id carried by the transport.
    pub approval_id: Option<String>,
    /// The trace id of this proposal.
    pub trace_id: String,
    /// The workflow run, if the call is a workflow step.
    pub run_id: Option<String>,
    /// The workflow step.
    pub step_id: Option<String>,
}

impl OwnedCall {
    /// The call as `decide` reads it.
    pub fn as_call(&self) -> Call<'_> {
        Call {
            bytes: &self.bytes,
            idempotency_key: self.idempotency_key.as_deref(),
            approval_id: self.approval_id.as_deref(),
            trace_id: &self.trace_id,
            run_id: self.run_id.as_deref(),
            step_id: self.step_id.as_deref(),
        }
    }
}

/// Hands `call` to the runtime and waits for its answer: [`dispatch`] in a task the runtime
/// owns (see the module documentation). Dropping the returned future stops only the wait.
///
/// # Errors
/// A store failure before anything ran (as [`dispatch`]), or
/// [`StoreError::Unavailable`] when the call's task ended abnormally (a bug: it is logged).
pub async fn submit(
    authority: Arc<Authority>,
    runtime: Runtime,
    principal: Principal,
    call: OwnedCall,
) -> Result<Dispatched, StoreError> {
    let owner = runtime.clone();
    let task = owner.spawn(async move {
        dispatch(&authority, &runtime, &principal, &call.as_call())
            .await
            .map(|(dispatched, _)| dispatched)
    });
    match task.await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::error!(%error, "a call's task ended abnormally");
            Err(StoreError::Unavailable("the call's task ended abnormally".into()))
        }
    }
}
