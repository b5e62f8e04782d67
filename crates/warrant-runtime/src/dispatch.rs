//! `dispatch`: the one function every lane calls with an authenticated principal and an
//! untrusted proposal — `decide`, then, on `allow`, `execute`. HTTP, MCP, workflows and
//! inbound webhooks differ only in how they carry the call and present the answer.
//!
//! **Ownership.** A lane hands its call over with [`submit`]: the runtime then owns the call
//! (and tracks it, so a graceful shutdown waits for it) from decision to a terminal, recorded
//! state, whatever happens to the caller. A client that disconnects, or a timeout that drops
//! the request, only stops the lane from *waiting*: it cannot cut a call between its
//! write-ahead commit and its outcome. While the lane waits, the call runs in the lane's own
//! task (no hand-off to another task and thread for every call); if the lane stops waiting
//! first, the unfinished call moves to a task of its own and runs to its end there
//! ([`Owned`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use warrant_core::Rejection;
use warrant_core::authority::Principal;
use warrant_core::decision::{ApprovalNeeded, Decision};
use warrant_core::pipeline::{Authority, Call, Facts};
use warrant_core::records::StepFollowUp;
use warrant_core::store::StoreError;

use crate::execute::{Executed, Execution, Runtime};

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
    dispatch_then(authority, runtime, principal, call, None).await
}

/// [`dispatch`], with a workflow step's record committed with the call's outcome when the
/// call commits ([`Runtime::execute_then`]).
///
/// # Errors
/// As [`dispatch`].
pub async fn dispatch_then(
    authority: &Authority,
    runtime: &Runtime,
    principal: &Principal,
    call: &Call<'_>,
    then: Option<&StepFollowUp>,
) -> Result<(Dispatched, Facts), StoreError> {
    let mut decided = authority.decide(principal, call).await?;
    // Allowed as the replay of an operation that turned out not to have finished: decided
    // again, once, now that its record is reconciled (see `Executed::Redecide`).
    if let Decision::Allow(allowed) = decided.decision {
        match runtime.execute_decided(allowed, then, true).await? {
            Executed::Done(execution) => {
                return Ok((executed(authority, principal, execution), decided.facts));
            }
            Executed::Redecide => decided = authority.decide(principal, call).await?,
        }
    }
    let dispatched = match decided.decision {
        Decision::Allow(allowed) => {
            let execution = runtime.execute_then(allowed, then).await?;
            executed(authority, principal, execution)
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

/// An executed call's answer; a budget counter that refused it is noted, so that the next
/// decisions refuse at once.
fn executed(authority: &Authority, principal: &Principal, execution: Execution) -> Dispatched {
    if let Some(counter) = &execution.exhausted {
        authority.note_exhausted(principal.tenant(), counter);
    }
    Dispatched::Executed(execution)
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
    /// Held for approval whatever the contract says (a workflow's review: [`Call::review`]).
    pub review: bool,
    /// How long an approval this call asks for stays valid ([`Call::review_ttl`]).
    pub review_ttl: Option<time::Duration>,
    /// Who may decide the approval this call asks for, beyond policy ([`Call::reviewers`]).
    pub reviewers: Option<warrant_core::records::ReviewerRule>,
    /// A workflow step's record, committed with the call's outcome when it commits
    /// ([`dispatch_then`]).
    pub then: Option<Arc<StepFollowUp>>,
    /// A note for the call's ledger row (`Call::note`).
    pub note: Option<String>,
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
            review: self.review,
            review_ttl: self.review_ttl,
            reviewers: self.reviewers.as_ref(),
            note: self.note.as_deref(),
        }
    }
}

/// Hands `call` to the runtime and waits for its answer: [`dispatch`], owned by the runtime
/// (see the module documentation). The runtime owns the call from here, not from the first
/// poll: the returned future only waits, and dropping it (even unpolled) stops only the wait.
///
/// Not an `async fn`: one would hold its arguments and the work (about 800 bytes) in every
/// caller's future, which each lane moves several times on its way; this future holds the
/// owned work's box.
///
/// # Errors
/// A store failure before anything ran (as [`dispatch`]), or
/// [`StoreError::Unavailable`] when the call ended abnormally (a panic: a bug, logged).
pub fn submit(
    authority: Arc<Authority>,
    runtime: Runtime,
    principal: Principal,
    call: OwnedCall,
) -> impl Future<Output = Result<Dispatched, StoreError>> + Send + 'static {
    let owner = runtime.clone();
    let work = async move {
        dispatch_then(
            &authority,
            &runtime,
            &principal,
            &call.as_call(),
            call.then.as_deref(),
        )
        .await
        .map(|(dispatched, _)| dispatched)
    };
    let owned = owner.own(work);
    async move {
        match owned.await {
            Ok(answer) => answer,
            Err(Panicked) => {
                tracing::error!("a call ended abnormally (it panicked)");
                Err(StoreError::Unavailable("the call ended abnormally".into()))
            }
        }
    }
}

/// A call's work ended in a panic (caught, so the lane can answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panicked;

/// Work the runtime owns (from [`Runtime::own`]): polled in the task that awaits it, and
/// counted among the runtime's calls in flight. Dropped before it finished, it is not
/// cancelled: the rest of the work is spawned as a task of the runtime's and runs to its end.
///
/// Written by hand: a `JoinHandle` gives this ownership only by spawning every call (a task, a
/// wake-up and often a hop to another worker thread per call, even when nobody goes away), and
/// no crate offers "run here, detach on drop".
#[must_use = "work that is never awaited runs only once it is dropped"]
pub struct Owned<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    work: Option<Pin<Box<tokio_util::task::task_tracker::TrackedFuture<F>>>>,
}

impl<F> Owned<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// `work`, counted by `tasks` until it ends.
    pub(crate) fn new(tasks: &tokio_util::task::TaskTracker, work: F) -> Self {
        Owned {
            work: Some(Box::pin(tasks.track_future(work))),
        }
    }
}

impl<F> Future for Owned<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `None` once the work answered or panicked: polled again after that (a caller's bug),
        // there is nothing to run and no output left to give.
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(Panicked));
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.work = None;
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                // A panicked future is never polled again.
                self.work = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F> Drop for Owned<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // Outside a Tokio runtime (it is shutting down), nothing can run the rest: the call
        // keeps its `attempting` row, which reconciliation resolves.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn(Detached(work))),
            Err(_) => tracing::warn!("a call was dropped outside the runtime; reconciliation resolves it"),
        }
    }
}

/// The rest of an [`Owned`] call, in a task of its own: its output is not awaited.
struct Detached<F: Future>(Pin<Box<tokio_util::task::task_tracker::TrackedFuture<F>>>);

impl<F: Future> Future for Detached<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx).map(drop)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    fn tracker() -> tokio_util::task::TaskTracker {
        tokio_util::task::TaskTracker::new()
    }

    /// Work whose waiter is dropped halfway runs to its end in a task of its own, and the
    /// tracker counts it until then (so a drain waits for it).
    #[tokio::test]
    async fn dropped_work_runs_to_its_end() {
        let tasks = tracker();
        let done = Arc::new(AtomicBool::new(false));
        let (started, running) = tokio::sync::oneshot::channel();
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let owned = Owned::new(&tasks, {
            let done = done.clone();
            async move {
                let _ = started.send(());
                let _ = held.await;
                done.store(true, Ordering::SeqCst);
            }
        });
        let waiter = tokio::spawn(owned);
        running.await.unwrap();
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(tasks.len(), 1, "still counted after its waiter went away");
        assert!(!done.load(Ordering::SeqCst));
        release.send(()).unwrap();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .unwrap();
        assert!(done.load(Ordering::SeqCst), "the work ran to its end");
    }

    /// Awaited to the end, the work runs in the awaiting task itself (the same Tokio task id,
    /// not a spawned one) and answers its output; a panic inside it is answered as
    /// `Panicked`, not propagated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn awaited_work_answers_here_and_panics_are_caught() {
        let tasks = tracker();
        let (awaiting, ran_in) = tokio::spawn({
            let tasks = tasks.clone();
            async move {
                let ran_in = Owned::new(&tasks, async { tokio::task::id() }).await.unwrap();
                (tokio::task::id(), ran_in)
            }
        })
        .await
        .unwrap();
        assert_eq!(ran_in, awaiting, "the work ran in another task");
        assert_eq!(tasks.len(), 0);
        let panicked = Owned::new(&tasks, async {
            if std::hint::black_box(true) {
                panic!("a bug");
            }
        })
        .await;
        assert_eq!(panicked, Err(Panicked));
        assert_eq!(tasks.len(), 0);
    }
}
