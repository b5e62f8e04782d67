//! `execute`: what happens after `allow` (PRODUCT §4, §5).
//!
//! ```text
//! Allowed ─► (unknown earlier attempt? reconcile it first)
//!   ─► begin_attempt: claim the idempotency record + ledger row `attempting`, one transaction
//!        └─ replay / key reused / in flight ─► answered from the store, no adapter call
//!   ─► attempts: adapter.invoke with the same operation id, capped, backoff with full jitter,
//!        Retry-After honoured, one overall deadline
//!   ─► output validated against the contract's output schema
//!   ─► finish_attempt: outcome + stored result + committed spend, one transaction
//! ```
//!
//! **Invariant:** the ledger row says `attempting` before the adapter is called, so a crash
//! at any point leaves a row that reconciliation resolves, never a silent effect.
//! **Invariant:** there is no fallback to another tool anywhere in this module.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use time::OffsetDateTime;
use warrant_core::decision::{Allowed, OperationId, Outcome};
use warrant_core::env::Env;
use warrant_core::records::{
    self, Advanced, AttemptFinish, AttemptStart, BudgetOutcome, BudgetReservation, Charge, IdempotencyRecord,
    IdempotencyScope, IdempotencyStatus, LateOutcome, LedgerEntry, StepFollowUp,
};
use warrant_core::registry::Registry;
use warrant_core::store::{Store, StoreError};
use warrant_core::{Contract, Effect, RejectCode, Rejection, ToolErrorCode};

use crate::adapter::{Adapter, Failure, Invocation};
use crate::adapters::Adapters;
use crate::retry::{self, Next, RetrySettings};

/// Metric names this module and reconciliation emit.
pub mod metric {
    /// Adapter attempts, by adapter kind.
    pub const ATTEMPTS: &str = "warrant_attempts_total";
    /// Retries (attempts after the first), by adapter kind.
    pub const RETRIES: &str = "warrant_retries_total";
    /// Typed tool errors, by code.
    pub const TOOL_ERRORS: &str = "warrant_tool_errors_total";
    /// Outcomes of executed calls, by outcome.
    pub const OUTCOMES: &str = "warrant_outcomes_total";
    /// Calls whose outcome became unknown.
    pub const UNKNOWN: &str = "warrant_unknown_outcomes_total";
    /// Replays answered from the idempotency record.
    pub const REPLAYS: &str = "warrant_replays_total";
    /// Reconciliations, by result.
    pub const RECONCILIATIONS: &str = "warrant_reconciliations_total";
    /// Effects reconciliation found committed more than once.
    pub const DUPLICATES: &str = "warrant_confirmed_duplicates_total";
    /// Adapter latency per attempt in seconds, by adapter kind.
    pub const ADAPTER_LATENCY: &str = "warrant_adapter_latency_seconds";
    /// Outcomes a tool gave after reconciliation had recorded no effect (the row is corrected).
    pub const LATE_COMMITS: &str = "warrant_late_commits_total";
    /// Outcomes that could not be recorded after the tool was called (left to reconciliation).
    pub const UNRECORDED: &str = "warrant_unrecorded_outcomes_total";
}

/// Runtime settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeSettings {
    /// Backoff and the overall deadline of one call.
    pub retry: RetrySettings,
    /// How old an `attempting` row must be before reconciliation treats it as abandoned
    /// (longer than any call can run).
    pub stale_after: Duration,
    /// How long one reconciliation inquiry may take.
    pub inquiry_timeout: Duration,
    /// Idempotency retention for calls whose contract declares none (reads with a key).
    pub default_retention: Duration,
    /// How long a row may stay unresolved before the background reconciler marks it as
    /// needing an operator ([`crate::reconcile::ReconcileSchedule::overdue_after`]).
    pub overdue_after: Duration,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        let retry = RetrySettings::default();
        RuntimeSettings {
            retry,
            stale_after: retry.deadline + Duration::from_secs(30),
            inquiry_timeout: Duration::from_secs(10),
            default_retention: Duration::from_secs(24 * 3600),
            overdue_after: Duration::from_secs(60 * 60),
        }
    }
}

/// What `execute` did with an allowed call.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// The call's ledger row.
    pub ledger_id: String,
    /// The operation's identity (the idempotency token the tool saw).
    pub operation_id: OperationId,
    /// Adapter attempts made by this call (0 for a replay or a refusal).
    pub attempts: u32,
    /// Whether the answer came from the idempotency record rather than the tool.
    pub replayed: bool,
    /// The outcome, or why the call's write-ahead commit refused to start it (key reused with
    /// another payload, in flight, unknown and not yet reconcilable, budget exhausted, the
    /// approval no longer usable) or, for a read recorded after it ran, why its result was
    /// withheld (budget exhausted).
    pub result: Result<Outcome, Rejection>,
    /// What went wrong, for a failed or unknown outcome: the tool error's detail, safe to
    /// show the caller (it never carries a credential or an argument value).
    pub detail: Option<String>,
    /// The budget counter that refused the call, when one did.
    pub exhausted: Option<BudgetReservation>,
    /// The tool was called but its outcome could not be recorded (the store failed after
    /// the effect may have happened): the result is `unknown`, the ledger row still says
    /// `attempting`, and reconciliation resolves it. Distinct from a store failure before
    /// anything ran, which `execute` returns as an error.
    pub unrecorded: bool,
    /// A workflow step's record, when it committed with the call's outcome
    /// ([`Runtime::execute_then`]): what `Store::finish_step_attempt` did.
    pub followed: Option<Advanced>,
}

impl Execution {
    fn refused(ledger_id: &str, operation_id: &OperationId, rejection: Rejection) -> Self {
        warrant_core::pipeline::count_rejection(&rejection);
        Execution {
            ledger_id: ledger_id.to_owned(),
            operation_id: operation_id.clone(),
            attempts: 0,
            replayed: false,
            result: Err(rejection),
            detail: None,
            exhausted: None,
            unrecorded: false,
            followed: None,
        }
    }
}

/// What [`Runtime::execute_decided`] did with an allowed call.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per call and unwrapped at once; a box would allocate on every call"
)]
pub enum Executed {
    /// Executed, replayed, or refused as it began.
    Done(Execution),
    /// Allowed as the replay of an earlier operation, which turned out not to have finished:
    /// it had no effect, so this call is a new attempt, and must be decided again — a replay
    /// spends no approval and no budget, and a new attempt needs both. Nothing was claimed and
    /// no row was written for it.
    Redecide,
}

/// Why a call allowed as a replay was refused when its operation turned out to have had no
/// effect (and the call could not be decided again where it ran).
const UNFINISHED_REPLAY: &str = "the earlier attempt under this idempotency key had no effect; send the call again for a decision of its own";

/// The execution runtime: one per process, shared by every lane.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) env: Arc<dyn Env>,
    pub(crate) adapters: Arc<Adapters>,
    pub(crate) settings: RuntimeSettings,
    /// The calls handed to this runtime ([`crate::dispatch::submit`]), for a graceful drain.
    tasks: tokio_util::task::TaskTracker,
    /// The per-call metrics' handles, resolved on the first call ([`Meters`]); shared by
    /// the runtime's clones (one per call).
    meters: Arc<std::sync::OnceLock<Meters>>,
}

/// The handles of the metrics every call updates, by their labels' values. `counter!` with
/// labels builds the key, hashes it and looks it up in the recorder's registry on each use:
/// about 600 instructions a metric, four metrics a call. Resolved on a runtime's first call
/// (the server installs its recorder before it serves), once per runtime rather than once per
/// process, so a runtime made before a recorder existed does not keep it from a later one.
struct Meters {
    /// [`metric::ATTEMPTS`] by built-in adapter kind ([`crate::adapters::BUILT_IN_KINDS`]).
    attempts: Vec<metrics::Counter>,
    /// [`metric::ADAPTER_LATENCY`] by built-in adapter kind.
    latency: Vec<metrics::Histogram>,
    /// [`metric::OUTCOMES`]: committed, failed, unknown.
    outcomes: [metrics::Counter; 3],
    /// [`metric::UNKNOWN`].
    unknown: metrics::Counter,
}

impl Meters {
    fn new() -> Self {
        let kinds = crate::adapters::BUILT_IN_KINDS;
        Meters {
            attempts: kinds
                .iter()
                .map(|kind| metrics::counter!(metric::ATTEMPTS, "adapter" => *kind))
                .collect(),
            latency: kinds
                .iter()
                .map(|kind| metrics::histogram!(metric::ADAPTER_LATENCY, "adapter" => *kind))
                .collect(),
            outcomes: ["committed", "failed", "unknown"]
                .map(|label| metrics::counter!(metric::OUTCOMES, "outcome" => label)),
            unknown: metrics::counter!(metric::UNKNOWN),
        }
    }

    /// Counts an attempt of an adapter of `kind`.
    fn attempt(&self, kind: &str) {
        match built_in(kind).and_then(|i| self.attempts.get(i)) {
            Some(counter) => counter.increment(1),
            None => metrics::counter!(metric::ATTEMPTS, "adapter" => adapter_label(kind)).increment(1),
        }
    }

    /// Records how long an attempt of an adapter of `kind` took.
    fn latency(&self, kind: &str, seconds: f64) {
        match built_in(kind).and_then(|i| self.latency.get(i)) {
            Some(histogram) => histogram.record(seconds),
            None => {
                metrics::histogram!(metric::ADAPTER_LATENCY, "adapter" => adapter_label(kind)).record(seconds)
            }
        }
    }

    /// Counts an executed call's outcome.
    fn outcome(&self, outcome: &Outcome) {
        let [committed, failed, unknown] = &self.outcomes;
        match outcome {
            Outcome::Committed(_) => committed.increment(1),
            Outcome::Failed(_) => failed.increment(1),
            Outcome::Unknown(_) => {
                self.unknown.increment(1);
                unknown.increment(1);
            }
        }
    }
}

/// The index of a built-in adapter kind.
fn built_in(kind: &str) -> Option<usize> {
    crate::adapters::BUILT_IN_KINDS.iter().position(|k| *k == kind)
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime over the same store, registry and environment as the decision pipeline.
    pub fn new(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        env: Arc<dyn Env>,
        adapters: Arc<Adapters>,
        settings: RuntimeSettings,
    ) -> Self {
        Runtime {
            store,
            registry,
            env,
            adapters,
            settings,
            tasks: tokio_util::task::TaskTracker::new(),
            meters: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// The per-call metrics' handles.
    fn meters(&self) -> &Meters {
        self.meters.get_or_init(Meters::new)
    }

    /// Takes `work` into this runtime's ownership: it runs in the task that awaits it, and
    /// to its end in a task of its own if that one stops awaiting it first
    /// ([`crate::dispatch::Owned`]); [`Runtime::drain`] waits for it either way.
    pub fn own<F>(&self, work: F) -> crate::dispatch::Owned<F>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        crate::dispatch::Owned::new(&self.tasks, work)
    }

    /// The longest a call handed to the runtime runs: an inquiry about the operation its key
    /// names, when that is reconciled first (an `unknown` record, a replay that finds no
    /// effect), then its attempts, up to the call deadline. What a graceful shutdown waits for.
    pub fn longest_call(&self) -> std::time::Duration {
        self.settings.inquiry_timeout + self.settings.retry.deadline
    }

    /// How many handed-over calls are still running.
    pub fn in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Waits until every call handed to this runtime has finished, or `deadline` passed
    /// (graceful shutdown: the listener is closed first, so no new call arrives). `true` when
    /// all finished. A call still running at the deadline keeps its `attempting` row, which
    /// reconciliation resolves after a restart.
    pub async fn drain(&self, deadline: Duration) -> bool {
        self.tasks.close();
        let drained = tokio::time::timeout(deadline, self.tasks.wait()).await.is_ok();
        self.tasks.reopen();
        drained
    }

    /// The settings.
    pub fn settings(&self) -> &RuntimeSettings {
        &self.settings
    }

    /// The adapters.
    pub fn adapters(&self) -> &Arc<Adapters> {
        &self.adapters
    }

    /// Executes an allowed call. Only `decide` makes an [`Allowed`], and this consumes it.
    ///
    /// The call's write-ahead commit takes its idempotency claim, consumes its approval,
    /// reserves its budget and writes its `attempting` row in one transaction, or takes none of
    /// it and records why. A read without idempotency key or approval has nothing to claim and
    /// no effect to reconcile: its row is written once, with its outcome and its budget, after
    /// the call.
    ///
    /// # Errors
    /// A store failure before the tool was called (nothing happened; the caller may retry).
    /// A store failure after the tool was called is not an error: the outcome is `unknown`
    /// and [`Execution::unrecorded`] is set (the `attempting` row stays for reconciliation).
    /// A read without idempotency key whose row cannot be written is an error too: it had no
    /// effect, and it is missing from the ledger.
    pub async fn execute(&self, allowed: Box<Allowed>) -> Result<Execution, StoreError> {
        self.execute_then(allowed, None).await
    }

    /// [`Runtime::execute`], and, when the call commits, `then` — a workflow step's record and
    /// what follows it — in the transaction that records the outcome
    /// ([`Execution::followed`]).
    ///
    /// # Errors
    /// As [`Runtime::execute`].
    pub async fn execute_then(
        &self,
        allowed: Box<Allowed>,
        then: Option<&StepFollowUp>,
    ) -> Result<Execution, StoreError> {
        match self.execute_decided(allowed, then, false).await? {
            Executed::Done(done) => Ok(done),
            // Not asked for: `execute_decided` answers a refusal instead.
            Executed::Redecide => Err(StoreError::Invalid("a replay was left undecided".into())),
        }
    }

    /// [`Runtime::execute_then`] for a caller that can decide the call again
    /// (`may_redecide`; [`crate::dispatch::dispatch_then`]): a call allowed as the replay of an
    /// earlier operation that turns out not to have finished is answered
    /// [`Executed::Redecide`] rather than refused (see [`Executed::Redecide`]).
    ///
    /// # Errors
    /// As [`Runtime::execute`].
    pub async fn execute_decided(
        &self,
        allowed: Box<Allowed>,
        then: Option<&StepFollowUp>,
        may_redecide: bool,
    ) -> Result<Executed, StoreError> {
        let started = Instant::now();
        let contract = Arc::clone(allowed.contract());
        let entry = allowed.ledger_entry();
        let scope = allowed.idempotency_scope();
        let claims = allowed.claims();
        let operation_id = operation_id(entry, scope);

        let adapter = match self.adapters.for_contract(&contract) {
            Ok(adapter) => adapter,
            Err(e) => {
                // A call whose key names a finished operation (still kept) is that operation's
                // replay, whatever became of the binding since: it sends nothing, and the
                // client learns what happened rather than a failure
                // (`a_finished_call_is_replayed_though_its_binding_became_unusable`).
                // Read as the write-ahead commit reads it (`may_take_over`, `classify_existing`).
                if let Some(scope) = scope
                    && let Some(record) = self.store.get_idempotency(scope).await?
                    && !warrant_core::store::may_take_over(&record, entry.created_at)
                    && let AttemptStart::Replay(record) = warrant_core::store::classify_existing(
                        record,
                        entry.payload_digest.as_deref(),
                        entry.created_at,
                    )
                {
                    return self.replay(record, entry, scope).await.map(Executed::Done);
                }
                // Otherwise nothing was claimed, consumed, reserved or sent: record the
                // failure and keep the key free.
                tracing::error!(contract = contract.id_str(), error = %e, "adapter binding unusable");
                let detail = format!("adapter unavailable: {e}");
                let mut row = entry.clone();
                row.outcome = Some(records::Outcome::Failed);
                row.error_code = Some(ToolErrorCode::Unclassified.as_str().to_owned());
                row.detail = Some(detail.clone());
                row.latency_ms = Some(elapsed_ms(started));
                self.store.insert_ledger(&row).await?;
                self.meters()
                    .outcome(&Outcome::Failed(ToolErrorCode::Unclassified));
                return Ok(Executed::Done(Execution {
                    ledger_id: row.id,
                    operation_id,
                    attempts: 0,
                    replayed: false,
                    result: Ok(Outcome::Failed(ToolErrorCode::Unclassified)),
                    detail: Some(detail),
                    exhausted: None,
                    unrecorded: false,
                    followed: None,
                }));
            }
        };

        // Allowed as the replay of an earlier operation: `decide` read the record of a call that
        // needs approval, found this same call, and passed it without an approval or budget,
        // since a replay spends neither. So it never starts an attempt. An operation whose
        // outcome is unknown — or whose record expired while still in flight — is reconciled
        // first; finished, this call is its replay (even when the record's retention ran out
        // meanwhile: this call is the one that was waiting for it). Found not to have finished
        // (no effect, and the key freed), this call is a new attempt after all, which needs
        // what a new attempt needs: it is decided again, or refused.
        if let Some(record) = allowed.replay() {
            if needs_reconciling(record, entry.created_at) {
                self.reconcile_record(record, &contract, adapter.as_ref()).await?;
            }
            if let Some(done) = self.replay_if_finished(record, entry).await? {
                return Ok(Executed::Done(done));
            }
            if may_redecide {
                return Ok(Executed::Redecide);
            }
            return self.unfinished_replay(&allowed, record).await.map(Executed::Done);
        }

        let now = self.env.now();
        // The key is kept at least as long as its call may run (`stale_after`), however short
        // the contract's retention: a record still in flight whose retention ran out is taken
        // for abandoned and reconciled by the next call with the key — and while the call
        // still runs, its effect may not have landed yet, so reconciliation would find none,
        // free the key, and let a second effect through.
        let retention = contract
            .idempotency()
            .map_or(self.settings.default_retention, |i| i.retention)
            .max(self.settings.stale_after);
        let expires_at = now + retention;
        let write_ahead = scope.is_some() || contract.effect() != Effect::Read || claims.approval.is_some();
        if write_ahead {
            let mut start = self.store.begin_attempt(entry, scope, claims, expires_at).await?;
            // Found by the write-ahead commit, which took nothing and wrote no row: the
            // operation is reconciled first; this call is its replay if that finished it, and
            // otherwise tries the commit once more, with the claims of a new attempt
            // (reconciliation may have freed the key). Still unknown, its row records the
            // refusal.
            if let AttemptStart::Unknown(record) = &start {
                let record = record.clone();
                self.reconcile_record(&record, &contract, adapter.as_ref())
                    .await?;
                if let Some(done) = self.replay_if_finished(&record, entry).await? {
                    return Ok(Executed::Done(done));
                }
                start = self.store.begin_attempt(entry, scope, claims, expires_at).await?;
            }
            if let AttemptStart::Unknown(_) = &start {
                self.store
                    .insert_ledger(&warrant_core::store::attempt_row(entry, &start))
                    .await?;
            }
            if let Some(done) = self.not_started(&allowed, entry, &mut start) {
                return Ok(Executed::Done(done));
            }
        }
        self.run(&allowed, entry, adapter.as_ref(), write_ahead, then, started)
            .await
            .map(Executed::Done)
    }

    /// The refusal of a call allowed as the replay of `earlier` when that operation turned out
    /// not to have finished and the call cannot be decided again here: its outcome is still
    /// unknown, or it had no effect and this call needs a decision of its own (which the same
    /// call sent again gets). Its row records the refusal.
    async fn unfinished_replay(
        &self,
        allowed: &Allowed,
        earlier: &IdempotencyRecord,
    ) -> Result<Execution, StoreError> {
        let entry = allowed.ledger_entry();
        if let Some(record) = self.store.get_idempotency(&earlier.scope).await?
            && record.ledger_id == earlier.ledger_id
        {
            // Still unknown: refused as the write-ahead commit refuses it.
            let mut start = AttemptStart::Unknown(record);
            self.store
                .insert_ledger(&warrant_core::store::attempt_row(entry, &start))
                .await?;
            return self
                .not_started(allowed, entry, &mut start)
                .ok_or_else(|| StoreError::Invalid("an unfinished replay started".into()));
        }
        let rejection =
            Rejection::new(RejectCode::IdempotencyInFlight, UNFINISHED_REPLAY).at("/idempotency_key");
        let mut row = entry.clone();
        row.refuse(&rejection);
        self.store.insert_ledger(&row).await?;
        let operation_id = operation_id(entry, allowed.idempotency_scope());
        Ok(Execution::refused(&entry.id, &operation_id, rejection))
    }

    /// The answer to a write-ahead commit that did not start the attempt, or `None` when it
    /// started.
    fn not_started(
        &self,
        allowed: &Allowed,
        entry: &LedgerEntry,
        start: &mut AttemptStart,
    ) -> Option<Execution> {
        let operation_id = operation_id(entry, allowed.idempotency_scope());
        let at_key = |code: RejectCode, detail: String| Rejection::new(code, detail).at("/idempotency_key");
        let rejection = match std::mem::replace(start, AttemptStart::Started) {
            AttemptStart::Started => return None,
            AttemptStart::Replay(record) => {
                metrics::counter!(metric::REPLAYS).increment(1);
                return Some(Execution {
                    ledger_id: entry.id.clone(),
                    operation_id,
                    attempts: 0,
                    replayed: true,
                    detail: None,
                    result: Ok(replayed_outcome(&record)),
                    exhausted: None,
                    unrecorded: false,
                    followed: None,
                });
            }
            AttemptStart::KeyReused => at_key(
                RejectCode::IdempotencyKeyReused,
                "the idempotency key was used with a different payload".into(),
            ),
            AttemptStart::InFlight => at_key(
                RejectCode::IdempotencyInFlight,
                "a call with this idempotency key is in flight".into(),
            ),
            AttemptStart::Unknown(record) => at_key(
                RejectCode::IdempotencyInFlight,
                format!(
                    "the outcome of {} is unknown and being reconciled",
                    record.ledger_id
                ),
            ),
            AttemptStart::ApprovalRefused(current) => {
                warrant_core::store::approval_refusal(current.as_ref(), entry.created_at)
            }
            AttemptStart::BudgetExhausted { key } => {
                let mut done =
                    Execution::refused(&entry.id, &operation_id, warrant_core::budget::exhausted(&key));
                done.exhausted = allowed
                    .claims()
                    .reservations
                    .iter()
                    .find(|r| r.key == key)
                    .cloned();
                return Some(done);
            }
        };
        Some(Execution::refused(&entry.id, &operation_id, rejection))
    }

    /// After reconciling `earlier`: when its record now holds a finished outcome of the same
    /// payload, this call's row records the replay and the stored outcome is the answer.
    async fn replay_if_finished(
        &self,
        earlier: &IdempotencyRecord,
        entry: &LedgerEntry,
    ) -> Result<Option<Execution>, StoreError> {
        let Some(record) = self.store.get_idempotency(&earlier.scope).await? else {
            return Ok(None);
        };
        let finished = matches!(
            record.status,
            IdempotencyStatus::Committed | IdempotencyStatus::Failed
        );
        if !finished
            || record.ledger_id != earlier.ledger_id
            || Some(record.payload_digest.as_str()) != entry.payload_digest.as_deref()
        {
            return Ok(None);
        }
        self.replay(record, entry, &earlier.scope).await.map(Some)
    }

    /// Records `entry` as the replay of the finished operation `record` holds, and answers it.
    async fn replay(
        &self,
        record: IdempotencyRecord,
        entry: &LedgerEntry,
        scope: &IdempotencyScope,
    ) -> Result<Execution, StoreError> {
        let result = Ok(replayed_outcome(&record));
        self.store
            .insert_ledger(&warrant_core::store::attempt_row(
                entry,
                &AttemptStart::Replay(record),
            ))
            .await?;
        metrics::counter!(metric::REPLAYS).increment(1);
        Ok(Execution {
            ledger_id: entry.id.clone(),
            operation_id: operation_id(entry, Some(scope)),
            attempts: 0,
            replayed: true,
            result,
            detail: None,
            exhausted: None,
            unrecorded: false,
            followed: None,
        })
    }

    /// Reconciles the operation an idempotency record names, by its ledger row.
    async fn reconcile_record(
        &self,
        record: &IdempotencyRecord,
        contract: &Arc<Contract>,
        adapter: &dyn Adapter,
    ) -> Result<(), StoreError> {
        if let Some(row) = self
            .store
            .get_ledger(&record.scope.tenant, &record.ledger_id)
            .await?
        {
            self.reconcile_with(&row, contract, adapter).await?;
        }
        Ok(())
    }

    /// Calls the tool (the attempt has started, or is a read recorded afterwards) and records
    /// the outcome.
    async fn run(
        &self,
        allowed: &Allowed,
        entry: &LedgerEntry,
        adapter: &dyn Adapter,
        write_ahead: bool,
        then: Option<&StepFollowUp>,
        started: Instant,
    ) -> Result<Execution, StoreError> {
        let contract = allowed.contract();
        let scope = allowed.idempotency_scope();
        let operation_id = operation_id(entry, scope);
        // INVARIANT: with `write_ahead`, the ledger row says `attempting` from here on.
        let scopes: Vec<String> = allowed.delegated_scopes().iter().map(str::to_owned).collect();
        let proposal = allowed.proposal();
        let ended = self
            .attempts(
                contract,
                adapter,
                &Invocation {
                    operation_id: &operation_id,
                    contract,
                    arguments: proposal.arguments(),
                    canonical: proposal.canonical_arguments(),
                    scopes: &scopes,
                    tenant: &entry.tenant,
                    principal: &entry.principal,
                    attempt: 1,
                    timeout: self.settings.retry.deadline,
                },
                started,
            )
            .await;
        let finish = self.finish_for(contract, entry, &ended, elapsed_ms(started), write_ahead);
        let mut done = Execution {
            ledger_id: entry.id.clone(),
            operation_id,
            attempts: ended.attempts,
            replayed: false,
            result: Ok(ended.outcome),
            detail: ended.detail,
            exhausted: None,
            unrecorded: false,
            followed: None,
        };
        if !write_ahead {
            let reservations = &allowed.claims().reservations;
            if let BudgetOutcome::Exhausted { key } = self
                .store
                .record_attempt(entry, reservations, &finish, self.env.now())
                .await?
            {
                let mut refused = Execution::refused(
                    &entry.id,
                    &done.operation_id,
                    warrant_core::budget::exhausted(&key),
                );
                refused.attempts = done.attempts;
                refused.exhausted = reservations.iter().find(|r| r.key == key).cloned();
                return Ok(refused);
            }
            if let Ok(outcome) = &done.result {
                self.meters().outcome(outcome);
            }
            return Ok(done);
        }
        let now = self.env.now();
        let finished = match then {
            Some(then) => self
                .store
                .finish_step_attempt(&entry.tenant, &entry.id, scope, &finish, now, then)
                .await
                .map(|followed| done.followed = followed),
            None => {
                self.store
                    .finish_attempt(&entry.tenant, &entry.id, scope, &finish, now)
                    .await
            }
        };
        match finished {
            Ok(()) => {}
            // A reconciler took the row for abandoned (the call outlived `stale_after`) and
            // resolved it first. If it found no effect and the tool has now committed, the row
            // is corrected; otherwise its record stands. The caller learns what the tool said.
            Err(StoreError::Conflict(_)) => self.late_outcome(entry, scope, &finish).await,
            // The tool was called but its outcome is not on disk (a full disk, a lost
            // database): the effect may have happened, so the answer is `unknown`, not "retry
            // later"; the row stays `attempting` and reconciliation resolves it.
            Err(e) => {
                tracing::error!(ledger = entry.id, error = %e, "the outcome of a call could not be recorded");
                metrics::counter!(metric::UNRECORDED).increment(1);
                done.result = Ok(Outcome::Unknown(done.operation_id.clone()));
                done.detail = Some("the outcome could not be recorded; it will be reconciled".to_owned());
                done.unrecorded = true;
            }
        }
        if let Ok(outcome) = &done.result {
            self.meters().outcome(outcome);
        }
        Ok(done)
    }

    /// Records an outcome that arrived after reconciliation resolved the row.
    async fn late_outcome(
        &self,
        entry: &LedgerEntry,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
    ) {
        match self
            .store
            .record_late_outcome(&entry.tenant, &entry.id, scope, finish, self.env.now())
            .await
        {
            Ok(LateOutcome::Corrected { key_retaken }) => {
                metrics::counter!(metric::LATE_COMMITS).increment(1);
                tracing::warn!(
                    ledger = entry.id,
                    key_retaken,
                    "the tool committed after reconciliation had recorded no effect; the ledger row is corrected"
                );
            }
            Ok(LateOutcome::Kept(outcome)) => {
                tracing::warn!(
                    ledger = entry.id,
                    recorded = %outcome,
                    late = %finish.outcome,
                    "the row was reconciled while the call was running; the reconciled outcome stands"
                );
            }
            Err(e) => {
                metrics::counter!(metric::UNRECORDED).increment(1);
                tracing::error!(ledger = entry.id, error = %e, "a late outcome could not be recorded");
            }
        }
    }

    /// Runs attempts until one commits, the retry rule stops, or the deadline passes.
    async fn attempts(
        &self,
        contract: &Contract,
        adapter: &dyn Adapter,
        first: &Invocation<'_>,
        started: Instant,
    ) -> Ended {
        let deadline = started + self.settings.retry.deadline;
        let kind = contract.adapter().map_or("none", |a| a.kind());
        let meters = self.meters();
        let mut ambiguous = false;
        let mut attempt = 1u32;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let call = Invocation {
                attempt,
                timeout: left,
                ..*first
            };
            meters.attempt(kind);
            if attempt > 1 {
                metrics::counter!(metric::RETRIES, "adapter" => adapter_label(kind)).increment(1);
            }
            let t0 = Instant::now();
            let result = match tokio::time::timeout(left, adapter.invoke(&call)).await {
                Ok(result) => result,
                Err(_) => Err(Failure::ambiguous(
                    ToolErrorCode::Timeout,
                    "no answer before the call's deadline",
                )),
            };
            meters.latency(kind, t0.elapsed().as_secs_f64());
            let failure = match result {
                Ok(value) => return Self::judge_output(contract, value, first.operation_id, attempt),
                Err(failure) => failure,
            };
            metrics::counter!(metric::TOOL_ERRORS, "code" => failure.code().as_str()).increment(1);
            tracing::info!(
                operation = first.operation_id.as_str(),
                attempt,
                code = failure.code().as_str(),
                ambiguous = failure.is_ambiguous(),
                detail = failure.detail(),
                "attempt failed"
            );
            ambiguous |= failure.is_ambiguous();
            let left = deadline.saturating_duration_since(Instant::now());
            match retry::next(
                contract,
                &failure,
                attempt,
                ambiguous,
                left,
                &self.settings.retry,
                retry::jitter(),
            ) {
                Next::RetryAfter(wait) => {
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Next::Fail(code) => {
                    let detail = if code == failure.code() {
                        failure.detail().to_owned()
                    } else {
                        format!("{failure} (a retry was due but the tool does not honour idempotency)")
                    };
                    return Ended {
                        outcome: Outcome::Failed(code),
                        attempts: attempt,
                        code: Some(code),
                        detail: Some(detail),
                    };
                }
                Next::Unknown(code) => {
                    return Ended {
                        outcome: Outcome::Unknown(first.operation_id.clone()),
                        attempts: attempt,
                        code: Some(code),
                        detail: Some(failure.detail().to_owned()),
                    };
                }
            }
        }
    }

    /// A tool's answer, checked against the output schema. An invalid answer of a read is
    /// `TOOL_OUTPUT_INVALID`; of anything else it is `unknown` (the effect may have happened).
    fn judge_output(contract: &Contract, value: Value, operation: &OperationId, attempts: u32) -> Ended {
        if contract.output_schema().is_valid(&value) {
            return Ended {
                outcome: Outcome::Committed(value),
                attempts,
                code: None,
                detail: None,
            };
        }
        let code = ToolErrorCode::OutputInvalid;
        metrics::counter!(metric::TOOL_ERRORS, "code" => code.as_str()).increment(1);
        Ended {
            outcome: if contract.effect() == Effect::Read {
                Outcome::Failed(code)
            } else {
                Outcome::Unknown(operation.clone())
            },
            attempts,
            code: Some(code),
            detail: Some("the result does not match the output schema".to_owned()),
        }
    }

    /// The store's record of how the attempt ended, with committed spend. `keep_result`: the
    /// result goes with it (to an idempotency record or a workflow step); a read recorded after
    /// it ran keeps none, and its result is not copied.
    fn finish_for(
        &self,
        contract: &Contract,
        entry: &LedgerEntry,
        ended: &Ended,
        latency_ms: u64,
        keep_result: bool,
    ) -> AttemptFinish {
        let (stored, result) = match &ended.outcome {
            Outcome::Committed(value) => (records::Outcome::Committed, keep_result.then(|| value.clone())),
            Outcome::Failed(_) => (records::Outcome::Failed, None),
            Outcome::Unknown(_) => (records::Outcome::Unknown, None),
        };
        let cost = if stored == records::Outcome::Committed {
            contract.cost_per_call()
        } else {
            0
        };
        AttemptFinish {
            outcome: stored,
            attempts: ended.attempts,
            error_code: ended.code.map(|c| c.as_str().to_owned()),
            result,
            latency_ms,
            cost,
            detail: ended.detail.clone(),
            charges: spend(entry, cost, self.env.now()),
        }
    }
}

/// How a run of attempts ended.
#[derive(Debug)]
struct Ended {
    outcome: Outcome,
    attempts: u32,
    /// The tool error behind a failed or unknown outcome.
    code: Option<ToolErrorCode>,
    detail: Option<String>,
}

/// The counters a committed call's cost adds to: its workflow run and its tenant's day.
pub(crate) fn spend(entry: &LedgerEntry, cost: u64, now: OffsetDateTime) -> Vec<Charge> {
    if cost == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(2);
    if let Some(run) = &entry.run_id {
        out.push(Charge {
            key: format!("cost_spent:run:{run}"),
            amount: cost,
            expires_at: now + time::Duration::days(30),
        });
    }
    out.push(Charge {
        key: format!("cost_spent:tenant:{}", now.date()),
        amount: cost,
        expires_at: now + time::Duration::days(400),
    });
    out
}

/// The operation id of a call: derived from its idempotency scope (so every attempt, every
/// re-presentation and reconciliation agree on it, and two principals' equal keys never
/// collide at the tool), or the ledger id for a call without a key.
pub fn operation_id(entry: &LedgerEntry, scope: Option<&IdempotencyScope>) -> OperationId {
    use sha2::Digest as _;
    match scope {
        Some(s) => {
            let mut h = sha2::Sha256::new();
            for part in [&s.tenant, &s.principal, &s.contract_id, &s.key] {
                h.update(part.as_bytes());
                h.update([0u8]);
            }
            let digest = h.finalize();
            OperationId::new(format!(
                "op_{}",
                warrant_core::canon::hex_lower(digest.get(..16).unwrap_or_default())
            ))
        }
        None => OperationId::new(entry.id.clone()),
    }
}

/// The idempotency scope a ledger row was recorded under, if it carried a key.
pub fn scope_of(entry: &LedgerEntry) -> Option<IdempotencyScope> {
    Some(IdempotencyScope {
        tenant: entry.tenant.clone(),
        principal: entry.principal.clone(),
        contract_id: entry.contract_id.clone()?,
        key: entry.idempotency_key.clone()?,
    })
}

/// Whether a record found for a new attempt names an operation to reconcile first: unknown,
/// or still in flight past its expiry (its caller is gone).
fn needs_reconciling(record: &IdempotencyRecord, now: OffsetDateTime) -> bool {
    match record.status {
        IdempotencyStatus::Unknown => true,
        IdempotencyStatus::InFlight => record.expires_at <= now,
        IdempotencyStatus::Committed | IdempotencyStatus::Failed => false,
    }
}

fn replayed_outcome(record: &IdempotencyRecord) -> Outcome {
    match record.status {
        IdempotencyStatus::Failed => Outcome::Failed(
            record
                .error_code
                .as_deref()
                .and_then(ToolErrorCode::parse)
                .unwrap_or(ToolErrorCode::Unclassified),
        ),
        _ => Outcome::Committed(record.result.clone().unwrap_or(Value::Null)),
    }
}

pub(crate) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The `adapter` label of the execution metrics. The built-in kinds are static text: a label
/// made from an owned string is an allocation and a copy for each of the three metrics of every
/// attempt.
fn adapter_label(kind: &str) -> metrics::SharedString {
    match built_in(kind).and_then(|i| crate::adapters::BUILT_IN_KINDS.get(i)) {
        Some(built_in) => metrics::SharedString::const_str(built_in),
        None => metrics::SharedString::from(kind.to_owned()),
    }
}
