//! The store port: everything the decision pipeline and the runtime persist, as one async
//! interface. The core only defines it; `warrant-store` implements it for SQLite and
//! PostgreSQL (and in memory), and one conformance suite holds every implementation to it.
//!
//! **Tenant isolation is in the interface:** every method that reads or changes tenant data
//! takes the tenant.

use async_trait::async_trait;
use serde_json::Value;
use time::OffsetDateTime;

use crate::contract::Namespace;
use crate::decision::Retryable;
use crate::records::*;
use crate::{RejectCode, Rejection, ToolErrorCode};

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool exhausted, I/O error).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A uniqueness rule refused the write (e.g. name@version registered with another body).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The addressed record does not exist (in this tenant).
    #[error("not found")]
    NotFound,
    /// A stored row cannot be read back (unknown enum text, malformed JSON, bad timestamp).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The caller passed a value the store cannot hold (e.g. a number beyond i64).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// Applying the schema migrations failed.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Database(String),
    /// The store's queue for this kind of work is full; nothing was done. Answered at once
    /// instead of queueing without bound: the caller retries later.
    #[error("store overloaded: {0}")]
    Overloaded(String),
}

/// The store interface. Implemented in `warrant-store`; the same conformance
/// suite runs against every implementation.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Checks that the database answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// Checks that the database accepts a write: it commits one row of its own (a table that
    /// holds nothing else), so a full disk, a read-only file or a write lock held elsewhere
    /// shows here, where a [`Store::ping`] (a read) still succeeds.
    async fn probe_write(&self, at: OffsetDateTime) -> Result<(), StoreError>;

    // ----- contracts (the platform's, registered by the operator, and each tenant's own) -----

    /// Registers a contract in its namespace. The same body under the same name@version is a
    /// no-op ([`Registration::Unchanged`]; a stored binding wins over a registration without
    /// one); the same body with a binding where none is stored gets it
    /// ([`Registration::Bound`]); a different body, or a different binding than the stored one,
    /// is [`StoreError::Conflict`]. A tenant's contract may not take a name the platform uses
    /// ([`StoreError::Conflict`]), checked in the same transaction.
    async fn register_contract(&self, contract: &StoredContract) -> Result<Registration, StoreError>;
    /// A contract of exactly `namespace` by name and version.
    async fn get_contract(
        &self,
        namespace: &Namespace,
        name: &str,
        version: u32,
    ) -> Result<Option<StoredContract>, StoreError>;
    /// A contract of exactly `namespace` by content id.
    async fn get_contract_by_id(
        &self,
        namespace: &Namespace,
        content_id: &str,
    ) -> Result<Option<StoredContract>, StoreError>;
    /// Every registered contract of every namespace, by namespace, name, then version (what a
    /// node loads; routes filter it to what the caller may see).
    async fn list_contracts(&self) -> Result<Vec<StoredContract>, StoreError>;
    /// The namespace, content id and retirement of every registered contract (no documents):
    /// cheap enough to poll.
    async fn list_contract_states(&self) -> Result<Vec<ContractState>, StoreError>;
    /// Retires a contract of `namespace`; `false` if it does not exist there. Retiring twice
    /// keeps the first time.
    async fn retire_contract(
        &self,
        namespace: &Namespace,
        content_id: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError>;

    // ----- tenants -----

    /// Records a tenant; `false` if it already exists.
    async fn create_tenant(&self, tenant: &TenantRecord) -> Result<bool, StoreError>;

    /// Publishes a workflow in its tenant. The same name@version again with the same digest is
    /// a no-op ([`Publication::Unchanged`]); with another digest it is a
    /// [`StoreError::Conflict`]: a published version never changes.
    async fn publish_workflow(&self, workflow: &WorkflowRecord) -> Result<Publication, StoreError>;
    /// One published workflow of `tenant`.
    async fn get_workflow(
        &self,
        tenant: &str,
        name: &str,
        version: u32,
    ) -> Result<Option<WorkflowRecord>, StoreError>;
    /// Every published workflow of `tenant`, by name then version.
    async fn list_workflows(&self, tenant: &str) -> Result<Vec<WorkflowRecord>, StoreError>;

    /// Starts a run: its record and the job of its first step, in one transaction.
    async fn start_run(&self, run: &RunRecord, job: &NewJob) -> Result<(), StoreError>;
    /// [`Store::start_run`] with the first step's job already claimed by `worker` until
    /// `lease_until` (a node hands a run it starts to its own runner: no claim of its own);
    /// answers that job as claimed.
    async fn start_run_claimed(
        &self,
        run: &RunRecord,
        job: &NewJob,
        worker: &str,
        lease_until: OffsetDateTime,
    ) -> Result<Job, StoreError>;
    /// Records step `step.seq` of a run and what follows it, in one transaction — only while
    /// the run is running and expects that step (`next_seq == step.seq`); [`Advanced::Stale`]
    /// when it does not (another worker recorded it, or the run ended). With a `handoff`, the
    /// same transaction completes the step's job (held by the handoff's worker) and inserts the
    /// next step's job — when it is due by `now` — already claimed by that worker, which runs
    /// it next without a claim of its own.
    async fn advance_run(
        &self,
        tenant: &str,
        step: &RunStep,
        advance: &RunAdvance,
        handoff: Option<&Handoff>,
        now: OffsetDateTime,
    ) -> Result<Advanced, StoreError>;
    /// One run of `tenant`.
    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError>;
    /// The recorded steps of a run of `tenant`, in order.
    async fn run_steps(&self, tenant: &str, id: &str) -> Result<Vec<RunStep>, StoreError>;
    /// Cancels a run of `tenant` that has not ended: `false` when there is none, or it ended.
    /// A step already calling its tool finishes its call (the runtime owns it) but is not
    /// recorded on the run.
    async fn cancel_run(&self, tenant: &str, id: &str, now: OffsetDateTime) -> Result<bool, StoreError>;
    /// The newest runs of `tenant`.
    async fn list_runs(&self, tenant: &str, limit: u32) -> Result<Vec<RunRecord>, StoreError>;
    /// Every tenant, by id.
    async fn list_tenants(&self) -> Result<Vec<TenantRecord>, StoreError>;

    // ----- ledger -----

    /// Records a proposal that did not reach execution (rejected or awaiting approval).
    async fn insert_ledger(&self, entry: &LedgerEntry) -> Result<(), StoreError>;
    /// One ledger row of `tenant`.
    async fn get_ledger(&self, tenant: &str, id: &str) -> Result<Option<LedgerEntry>, StoreError>;
    /// Ledger rows of `tenant`, newest first, filtered and paginated by cursor.
    async fn list_ledger(&self, tenant: &str, filter: &LedgerFilter) -> Result<LedgerPage, StoreError>;
    /// Rows whose outcome is `attempting` or `unknown` and untouched since `older_than`,
    /// across tenants, oldest first: an inspection (tests, `warrant store check`). The
    /// reconciler does not read this; it claims with [`Store::claim_unresolved`].
    async fn list_unresolved(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<LedgerEntry>, StoreError>;

    // ----- reconciliation schedule (per row, claimable by any node) -----

    /// Claims up to `limit` unresolved rows (`attempting` or `unknown`) that are due, for
    /// `worker`, in one transaction: a row never scheduled is due once its `updated_at` is at
    /// or before `older_than`; a scheduled one once its next attempt time is at or before
    /// `scheduled_by` (`now`, or later for a pass that asks about every scheduled row at
    /// once); a row another worker holds only once its lease ran out at `now` (its claimer
    /// died or gave up), whatever `scheduled_by` says. Rows are taken in order of due time (a
    /// never-scheduled row is due at `updated_at + (now - older_than)`), then id, and their
    /// next attempt time is pushed to `now + lease` with `worker` as owner, so two workers
    /// never claim the same row within a lease (PostgreSQL: `FOR UPDATE SKIP LOCKED`).
    async fn claim_unresolved(
        &self,
        worker: &str,
        now: OffsetDateTime,
        scheduled_by: OffsetDateTime,
        older_than: OffsetDateTime,
        limit: u32,
        lease: std::time::Duration,
    ) -> Result<Vec<ClaimedRow>, StoreError>;
    /// Records an inquiry that left a claimed row unresolved: its next attempt at `next_at`,
    /// one more reconciliation attempt, and `note` (what the inquiry answered); the lease is
    /// released. `false` when `worker` no longer holds the row or the row is resolved.
    /// (Resolution itself is [`Store::finish_attempt`]: the row leaves the schedule.)
    async fn reschedule_unresolved(
        &self,
        tenant: &str,
        id: &str,
        worker: &str,
        next_at: OffsetDateTime,
        note: &str,
    ) -> Result<bool, StoreError>;
    /// Marks unresolved rows created at or before `created_before` that are not marked yet as
    /// overdue (at most `limit` of them, oldest first), in one transaction: each gets its
    /// marker and `note` put before its detail (the ledger says it needs an operator). Each
    /// row is marked, and so returned, once, whichever node sweeps. Also counts every
    /// unresolved row marked overdue.
    async fn mark_overdue(
        &self,
        created_before: OffsetDateTime,
        now: OffsetDateTime,
        note: &str,
        limit: u32,
    ) -> Result<OverdueSweep, StoreError>;

    // ----- write-ahead intent: idempotency claim + ledger row in one transaction -----

    /// The write-ahead commit of a call, in one transaction: claims the idempotency record
    /// (when `scope` is given), consumes the approval and reserves the budget of `claims`, and
    /// writes the ledger row. Either all of it happens and the answer is
    /// [`AttemptStart::Started`] (the row says `attempting`, the record is `in_flight`), or
    /// none of it and the row records why (a replay, a conflict, an exhausted budget, an
    /// approval no longer usable). The idempotency record is checked first, so a replay or a
    /// conflict spends nothing. An expired record is taken over only once it is finished
    /// (committed or failed); a record whose operation is `unknown`, or that expired still
    /// `in_flight`, answers [`AttemptStart::Unknown`] and writes no row: its operation must be
    /// reconciled first, and the caller then writes this call's row (a replay if that finished
    /// the operation, else the refusal [`attempt_row`] gives).
    async fn begin_attempt(
        &self,
        entry: &LedgerEntry,
        scope: Option<&IdempotencyScope>,
        claims: &AttemptClaims,
        expires_at: OffsetDateTime,
    ) -> Result<AttemptStart, StoreError>;
    /// Records how an attempt ended, updating the ledger row and the idempotency record in one
    /// transaction. Only rows still `attempting` or `unknown` can be finished; any other row
    /// is [`StoreError::Conflict`] (see [`Store::record_late_outcome`]).
    async fn finish_attempt(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<(), StoreError>;
    /// [`Store::finish_attempt`], and — when `finish` says the call committed and the finish is
    /// recorded — `then`'s step and what follows it ([`Store::advance_run`], with the committed
    /// result as the step's output), in the same transaction. `None` when the step was not
    /// recorded (the call did not commit): the caller records the step itself. A stale step
    /// (the run ended or moved on) leaves the call's outcome recorded and answers
    /// `Some(Advanced::Stale)`.
    ///
    /// The default records the two one after the other (for stores without transactions).
    async fn finish_step_attempt(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
        then: &StepFollowUp,
    ) -> Result<Option<Advanced>, StoreError> {
        self.finish_attempt(tenant, ledger_id, scope, finish, now).await?;
        let Some(step) = then.committed_step(finish, ledger_id, now) else {
            return Ok(None);
        };
        let advanced = self
            .advance_run(&then.tenant, &step, &then.advance, then.handoff.as_ref(), now)
            .await?;
        Ok(Some(advanced))
    }
    /// Records an attempt's outcome that arrived after reconciliation resolved its row (the
    /// call outlived `stale_after`): when reconciliation recorded that the effect did not
    /// happen and `finish` says it committed, the row is corrected (outcome `committed`, the
    /// earlier verdict kept in its note) and the idempotency record holds the result again,
    /// in one transaction; otherwise what reconciliation recorded stands.
    async fn record_late_outcome(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<LateOutcome, StoreError>;
    /// Records a call that ran without an `attempting` row first — a read without idempotency
    /// key or approval, which has no effect to reconcile — as `entry` (whose outcome is
    /// `attempting`) finished by `finish`, with its budget `reservations` taken in the same
    /// transaction (one commit per read call). When a counter has no room, the row records
    /// the call as refused at the budget stage (its result withheld) and nothing is spent:
    /// [`BudgetOutcome::Exhausted`]. When the finish is refused, nothing is recorded.
    async fn record_attempt(
        &self,
        entry: &LedgerEntry,
        reservations: &[BudgetReservation],
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<BudgetOutcome, StoreError>;
    /// An idempotency record.
    async fn get_idempotency(
        &self,
        scope: &IdempotencyScope,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    // ----- approvals -----

    /// Stores a new pending approval request and its `approval.requested` event job
    /// ([`NewApproval::requested_event`]) in one transaction: both or neither.
    async fn create_approval(&self, approval: &NewApproval) -> Result<(), StoreError>;
    /// One approval of `tenant`, with its effective status at `now`
    /// ([`ApprovalRequest::as_of`]: pending or approved past its expiry is `expired`, whether
    /// or not the sweeper has written that yet).
    async fn get_approval(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ApprovalRequest>, StoreError>;
    /// The oldest pending, unexpired request of `tenant` for exactly this call, if any.
    async fn find_pending_approval(
        &self,
        tenant: &str,
        call: &ApprovalLookup,
    ) -> Result<Option<ApprovalRequest>, StoreError>;
    /// The most recently decided rejected request of `tenant` for exactly this call, decided
    /// at or after `since`, if any (an identical call within the rejection window is answered
    /// with that rejection instead of a new request).
    async fn find_rejected_approval(
        &self,
        tenant: &str,
        call: &ApprovalLookup,
        since: OffsetDateTime,
    ) -> Result<Option<ApprovalRequest>, StoreError>;
    /// Approvals of `tenant`, oldest first, optionally by status, each with its effective
    /// status at `now` (as [`get_approval`](Self::get_approval)); the filter applies to that
    /// status, so `expired` finds the requests that lapsed before the sweeper ran.
    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
        now: OffsetDateTime,
    ) -> Result<Vec<ApprovalRequest>, StoreError>;
    /// A page of `tenant`'s approval requests matching `filter`, newest first, each with its
    /// effective status at `now`.
    async fn page_approvals(
        &self,
        tenant: &str,
        filter: &ApprovalFilter,
        now: OffsetDateTime,
    ) -> Result<ApprovalPage, StoreError>;
    /// How many of `tenant`'s approval requests have the effective `status` at `now`, counting
    /// up to `at_most` (the cost is bounded by it, whatever the backlog).
    async fn count_approvals(
        &self,
        tenant: &str,
        status: ApprovalStatus,
        now: OffsetDateTime,
        at_most: u32,
    ) -> Result<u64, StoreError>;
    /// Records a reviewer's verdict on a pending, unexpired approval the reviewer did not
    /// propose; atomically, so two reviewers cannot both decide.
    async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        reviewer: &str,
        verdict: Verdict,
        reason: Option<&str>,
        now: OffsetDateTime,
    ) -> Result<Result<ApprovalRequest, DecideRefusal>, StoreError>;
    /// Rejects the pending, unexpired request `id` as `reviewer` (not its proposer) with
    /// `reason` and links it to `by`, the request a reviewer's edit replaced it with, in one
    /// write: a waiting agent never sees the rejection without the link, and a request decided
    /// meanwhile is left alone (`false`).
    async fn supersede_approval(
        &self,
        tenant: &str,
        id: &str,
        by: &str,
        reviewer: &str,
        reason: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Consumes an approved, unexpired approval bound to exactly this call; single use is
    /// enforced atomically.
    async fn consume_approval(
        &self,
        tenant: &str,
        claim: &ApprovalClaim,
        now: OffsetDateTime,
    ) -> Result<ConsumeOutcome, StoreError>;

    // ----- budgets -----

    /// Reserves every counter or none, atomically.
    async fn reserve_budget(
        &self,
        tenant: &str,
        reservations: &[BudgetReservation],
    ) -> Result<BudgetOutcome, StoreError>;
    /// Gives back what a reservation took (when a later stage refused the call).
    async fn release_budget(
        &self,
        tenant: &str,
        reservations: &[BudgetReservation],
    ) -> Result<(), StoreError>;
    /// The current value of a counter.
    async fn budget_used(&self, tenant: &str, key: &str) -> Result<u64, StoreError>;

    // ----- API keys -----

    /// Stores a new key (its hash only).
    async fn create_api_key(&self, key: &NewApiKey) -> Result<(), StoreError>;
    /// Authentication lookup by key hash (the only lookup not scoped by tenant: the tenant is
    /// what it finds).
    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError>;
    /// Keys of `tenant`.
    async fn list_api_keys(&self, tenant: &str) -> Result<Vec<ApiKeyRecord>, StoreError>;
    /// Revokes a key of `tenant`; `false` if there is no such active key.
    async fn revoke_api_key(&self, tenant: &str, id: &str, at: OffsetDateTime) -> Result<bool, StoreError>;
    /// Whether any key exists (first start creates the admin key).
    async fn has_api_keys(&self) -> Result<bool, StoreError>;

    // ----- console sessions -----

    /// Stores a console session or sign-in link.
    async fn create_console_session(&self, session: &ConsoleSession) -> Result<(), StoreError>;
    /// The console session whose token hashes to `token_hash`, while it has not ended.
    async fn get_console_session(
        &self,
        token_hash: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ConsoleSession>, StoreError>;
    /// Takes (removes and returns) the one-time sign-in link whose token hashes to
    /// `token_hash`, while it is valid: at most one caller gets it.
    async fn take_console_link(
        &self,
        token_hash: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ConsoleSession>, StoreError>;
    /// Ends a console session (sign-out); whether there was one.
    async fn delete_console_session(&self, token_hash: &str) -> Result<bool, StoreError>;

    // ----- single-use tokens and agent tasks -----

    /// Spends the single-use token `id` of `tenant` in `scope` (an MCP `requestState`, an
    /// inbound event id): `true` the first time, `false` on every later spend until
    /// `expires_at`, whichever node asks; atomically.
    async fn spend_token(
        &self,
        scope: &str,
        tenant: &str,
        id: &str,
        expires_at: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Stores a new agent task (an existing id is a conflict).
    async fn create_task(&self, task: &TaskRecord) -> Result<(), StoreError>;
    /// One task of `tenant`, unless it has expired by `now`.
    async fn get_task(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<TaskRecord>, StoreError>;
    /// Ends a working task with `status` and `result`, once: `true` when this call ended it,
    /// `false` when it had already ended (or does not exist). `status` must be terminal.
    async fn end_task(
        &self,
        tenant: &str,
        id: &str,
        status: TaskStatus,
        result: &Value,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;

    // ----- webhooks -----

    /// Stores a new endpoint (an existing id is a conflict).
    async fn create_webhook(&self, endpoint: &WebhookEndpoint) -> Result<(), StoreError>;
    /// The endpoints of `tenant`, oldest first.
    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookEndpoint>, StoreError>;
    /// One endpoint of `tenant`.
    async fn get_webhook(&self, tenant: &str, id: &str) -> Result<Option<WebhookEndpoint>, StoreError>;
    /// Replaces the mutable fields of an existing endpoint (url, events, secrets, description,
    /// enabled, reason, updated); `false` when there is none.
    async fn update_webhook(&self, endpoint: &WebhookEndpoint) -> Result<bool, StoreError>;
    /// Records one delivery attempt.
    async fn record_webhook_attempt(&self, attempt: &WebhookAttempt) -> Result<(), StoreError>;
    /// The attempts of `tenant`'s deliveries, newest first: of one message, or of one
    /// endpoint, at most `limit`.
    async fn list_webhook_attempts(
        &self,
        tenant: &str,
        message_id: Option<&str>,
        endpoint_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WebhookAttempt>, StoreError>;
    /// Puts a dead job of `tenant` back in the queue, due at `now` with its attempts reset (a
    /// dead-letter replay); `false` when it is not dead (or not there).
    async fn requeue_dead_job(&self, tenant: &str, id: &str, now: OffsetDateTime)
    -> Result<bool, StoreError>;

    // ----- inbound webhooks -----

    /// Stores a new inbound source (an existing id is a conflict).
    async fn create_inbound_source(&self, source: &InboundSource) -> Result<(), StoreError>;
    /// The inbound sources of `tenant`, oldest first.
    async fn list_inbound_sources(&self, tenant: &str) -> Result<Vec<InboundSource>, StoreError>;
    /// One inbound source by its id alone (the receiving route knows nothing else; ids are
    /// unique across tenants).
    async fn get_inbound_source(&self, id: &str) -> Result<Option<InboundSource>, StoreError>;
    /// Replaces the mutable fields of an existing source (secrets, action, description,
    /// enabled, updated); `false` when there is none.
    async fn update_inbound_source(&self, source: &InboundSource) -> Result<bool, StoreError>;
    /// Counts a refused delivery to source `id` and records why.
    async fn note_inbound_refusal(
        &self,
        id: &str,
        reason: &str,
        at: OffsetDateTime,
    ) -> Result<(), StoreError>;
    /// Stores a verified event with the job that acts on it, in one transaction: `true`; or,
    /// when its source already has an event of that id, counts the redelivery and stores
    /// nothing else: `false`. Of any number of concurrent deliveries, exactly one is `true`.
    async fn accept_inbound(&self, event: &InboundEvent, job: &NewJob) -> Result<bool, StoreError>;
    /// Records what a queued event did (`status` is not `queued`); `false` when it was not
    /// queued (already finished, or not there).
    async fn finish_inbound(
        &self,
        tenant: &str,
        source_id: &str,
        event_id: &str,
        status: InboundStatus,
        detail: &Value,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// One event of a source of `tenant`.
    async fn get_inbound_event(
        &self,
        tenant: &str,
        source_id: &str,
        event_id: &str,
    ) -> Result<Option<InboundEvent>, StoreError>;
    /// The events of a source of `tenant`, newest first, at most `limit`.
    async fn list_inbound_events(
        &self,
        tenant: &str,
        source_id: &str,
        limit: u32,
    ) -> Result<Vec<InboundEvent>, StoreError>;

    // ----- jobs (outbox) -----

    /// Enqueues a job.
    async fn enqueue_job(&self, job: &NewJob) -> Result<(), StoreError>;
    /// Claims up to `limit` due jobs of `kind` (pending, or running with an expired lease) for `worker`
    /// until `now + lease`. Two workers never claim the same job.
    async fn claim_jobs(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        lease: std::time::Duration,
        now: OffsetDateTime,
    ) -> Result<Vec<Job>, StoreError>;
    /// Finishes a job held by `worker`; `false` if the worker no longer holds it.
    async fn complete_job(
        &self,
        id: &str,
        worker: &str,
        completion: &JobCompletion,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Extends the lease of a job `worker` holds to `until` (a worker renews while it works, so
    /// a long job is not taken over while its node lives); `false` when the worker no longer
    /// holds it (its lease lapsed and another worker claimed it, or it finished).
    async fn renew_job(&self, id: &str, worker: &str, until: OffsetDateTime) -> Result<bool, StoreError>;
    /// Dead jobs of `tenant` (the dead-letter queue).
    async fn list_dead_jobs(&self, tenant: &str, limit: u32) -> Result<Vec<Job>, StoreError>;

    // ----- sweeping -----

    /// Purges expired idempotency records, budget counters, sessions, spent tokens, tasks and
    /// done jobs past [`DONE_JOB_RETENTION`], handled inbound events past
    /// [`INBOUND_RETENTION`], and expires stale approvals.
    async fn purge_expired(&self, now: OffsetDateTime) -> Result<PurgeCounts, StoreError>;
}

/// What registering a contract does, decided from what its namespace already holds under its
/// name@version. Shared by every store implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationPlan {
    /// Nothing is stored there: insert it.
    Insert,
    /// The same body (and no different binding) is stored: nothing changes.
    Unchanged,
    /// The same body is stored without a binding and this registration carries one: set it.
    Bind,
}

/// Decides a registration (see [`Store::register_contract`]): `existing` is the contract stored
/// under the same namespace and name@version, `platform_uses_name` whether a platform contract
/// has the name (only consulted for a tenant's registration).
///
/// # Errors
/// [`StoreError::Conflict`] for another body, another binding, or a tenant taking a platform
/// name.
pub fn plan_registration(
    existing: Option<&StoredContract>,
    new: &StoredContract,
    platform_uses_name: bool,
) -> Result<RegistrationPlan, StoreError> {
    if new.namespace.tenant().is_some() && platform_uses_name {
        return Err(StoreError::Conflict(format!(
            "the name `{}` is a platform contract's; choose another name",
            new.name
        )));
    }
    let Some(existing) = existing else {
        return Ok(RegistrationPlan::Insert);
    };
    if existing.content_id != new.content_id {
        return Err(StoreError::Conflict(format!(
            "{}@{} is already registered as {}; a changed contract needs a new version",
            new.name, new.version, existing.content_id
        )));
    }
    match (&existing.binding_digest, &new.binding_digest) {
        (_, None) => Ok(RegistrationPlan::Unchanged),
        (None, Some(_)) => Ok(RegistrationPlan::Bind),
        (Some(a), Some(b)) if a == b => Ok(RegistrationPlan::Unchanged),
        (Some(_), Some(_)) => Err(StoreError::Conflict(format!(
            "{}@{} is bound to another adapter binding; a stored binding is never replaced",
            new.name, new.version
        ))),
    }
}

/// The ledger row `begin_attempt` records for `entry` given what it found: the entry itself
/// when the attempt starts (borrowed: no copy on the path every call takes), a `replayed` row
/// for a replay, a rejection otherwise. Shared by every store implementation so they record
/// exactly the same rows.
pub fn attempt_row<'e>(entry: &'e LedgerEntry, start: &AttemptStart) -> std::borrow::Cow<'e, LedgerEntry> {
    let reject = |row: &mut LedgerEntry, code: RejectCode, detail: &str| {
        row.refuse(&Rejection::new(code, detail));
    };
    let mut row = std::borrow::Cow::Borrowed(entry);
    match start {
        AttemptStart::Started => {}
        AttemptStart::Replay(record) => {
            let row = row.to_mut();
            row.decision = LedgerDecision::Allow;
            row.outcome = Some(Outcome::Replayed);
            row.error_code = record.error_code.clone();
            row.detail = Some(format!("replay of {}", record.ledger_id));
            row.attempts = 0;
            row.cost = 0;
        }
        AttemptStart::KeyReused => reject(
            row.to_mut(),
            RejectCode::IdempotencyKeyReused,
            "the idempotency key was used with a different payload",
        ),
        AttemptStart::InFlight => reject(
            row.to_mut(),
            RejectCode::IdempotencyInFlight,
            "a call with this idempotency key is in flight",
        ),
        AttemptStart::Unknown(record) => reject(
            row.to_mut(),
            RejectCode::IdempotencyInFlight,
            &format!(
                "the outcome of {} is unknown and being reconciled",
                record.ledger_id
            ),
        ),
        AttemptStart::BudgetExhausted { key } => {
            row.to_mut().refuse(&crate::budget::exhausted(key));
        }
        AttemptStart::ApprovalRefused(current) => {
            row.to_mut()
                .refuse(&approval_refusal(current.as_ref(), entry.created_at));
        }
    }
    row
}

/// Why an approval the decision bound to a call could not be consumed by it: it was used,
/// rejected or expired meanwhile, or is gone. Shared by every store implementation and the
/// runtime, so the row and the answer say the same.
pub fn approval_refusal(current: Option<&ApprovalRequest>, now: OffsetDateTime) -> Rejection {
    let (code, detail) = match current {
        None => (RejectCode::ApprovalNotFound, "no such approval in this tenant"),
        Some(a) if a.status == ApprovalStatus::Consumed => {
            (RejectCode::ApprovalConsumed, "the approval was already used")
        }
        Some(a) if a.status == ApprovalStatus::Rejected => {
            return Rejection::new(RejectCode::ApprovalRejected, rejected_call(a)).at("/approval");
        }
        Some(a) if a.status == ApprovalStatus::Expired || a.request.expires_at <= now => {
            (RejectCode::ApprovalExpired, "the approval has expired")
        }
        Some(_) => (
            RejectCode::ApprovalMismatch,
            "the approval is bound to another call",
        ),
    };
    Rejection::new(code, detail).at("/approval")
}

/// What the refusal of a call whose approval a reviewer rejected says: the approval, and the
/// reviewer's reason (at most 200 characters), so an agent retrying with the approval learns
/// why as one proposing the call again does.
pub fn rejected_call(rejected: &ApprovalRequest) -> String {
    let reason = rejected
        .reason
        .as_deref()
        .map(|r| match r.char_indices().nth(200) {
            Some((end, _)) => format!(": {}", r.get(..end).unwrap_or(r)),
            None => format!(": {r}"),
        })
        .unwrap_or_default();
    format!(
        "a reviewer rejected this call (approval {}){reason}",
        rejected.request.id
    )
}

/// The ledger row `record_attempt` writes for a read whose budget had no room after it ran:
/// refused at the budget stage, its result withheld, nothing spent.
pub fn withheld_row(mut row: LedgerEntry, key: &str, finish: &AttemptFinish) -> LedgerEntry {
    let rejection = crate::budget::exhausted(key);
    row.refuse(&rejection);
    row.detail = Some(format!(
        "{} (the read ran; its result was withheld)",
        rejection.detail()
    ));
    row.attempts = finish.attempts;
    row.latency_ms = Some(finish.latency_ms);
    row.cost = 0;
    row
}

/// [`withheld_row`] of the entry, made of the row [`finished_row`] made of it, whose update
/// time was `entered` (a store that makes the finished row before it knows the budget's answer
/// keeps no second copy of the entry). Of the fields `finished_row` sets, `withheld_row` sets
/// all but the update time (`a_withheld_row_is_the_same_of_the_entry_or_its_finished_row`).
pub fn withheld_of_finished(
    finished: LedgerEntry,
    entered: OffsetDateTime,
    key: &str,
    finish: &AttemptFinish,
) -> LedgerEntry {
    let mut row = withheld_row(finished, key, finish);
    row.updated_at = entered;
    row
}

/// The ledger row `record_attempt` writes for an attempt recorded whole after it ran: `row`
/// as `finish` leaves it at `now` — exactly what `finish_attempt` makes of an `attempting`
/// row (outcome, attempts, error code, latency, cost, update time; a note replaces the row's
/// only when there is one). Written at once, the row never passes through `attempting`.
///
/// # Errors
/// [`StoreError::Conflict`] when `row` is not awaiting an outcome (as `finish_attempt` refuses
/// such a row).
pub fn finished_row(
    mut row: LedgerEntry,
    finish: &AttemptFinish,
    now: OffsetDateTime,
) -> Result<LedgerEntry, StoreError> {
    if row.outcome.is_none_or(Outcome::is_final) {
        return Err(StoreError::Conflict(format!(
            "ledger row {} is not awaiting an outcome",
            row.id
        )));
    }
    row.outcome = Some(finish.outcome);
    row.attempts = finish.attempts;
    row.error_code.clone_from(&finish.error_code);
    row.latency_ms = Some(finish.latency_ms);
    row.cost = finish.cost;
    row.updated_at = now;
    if let Some(detail) = &finish.detail {
        row.detail = Some(detail.clone());
    }
    Ok(row)
}

/// What a late outcome does to a row reconciliation resolved as `resolved` (see
/// [`Store::record_late_outcome`]): `true` when it must be corrected to `committed`.
pub fn late_outcome_corrects(resolved: Option<Outcome>, late: Outcome) -> bool {
    resolved == Some(Outcome::ReconciledNotCommitted) && late == Outcome::Committed
}

/// The note a corrected row carries.
pub fn correction_note(ledger_id: &str) -> String {
    format!(
        "corrected: the tool committed {ledger_id} after reconciliation had recorded `reconciled_not_committed`"
    )
}

/// The idempotency status an attempt's outcome leaves behind; `None` releases the key (no
/// effect happened and a retry may run again). Shared by every store implementation.
///
/// # Errors
/// [`StoreError::Invalid`] for outcomes that do not end an attempt.
pub fn status_after(finish: &AttemptFinish) -> Result<Option<IdempotencyStatus>, StoreError> {
    Ok(match finish.outcome {
        Outcome::Committed | Outcome::ReconciledCommitted => Some(IdempotencyStatus::Committed),
        Outcome::Unknown => Some(IdempotencyStatus::Unknown),
        Outcome::ReconciledNotCommitted => None,
        Outcome::Failed => {
            let retryable = finish
                .error_code
                .as_deref()
                .and_then(ToolErrorCode::parse)
                .is_some_and(|c| c.retryable() != Retryable::No);
            // A failure a later retry could fix releases the key; a permanent one is replayed.
            if retryable {
                None
            } else {
                Some(IdempotencyStatus::Failed)
            }
        }
        Outcome::Attempting | Outcome::Replayed => {
            return Err(StoreError::Invalid(format!(
                "`{}` does not finish an attempt",
                finish.outcome
            )));
        }
    })
}

/// Whether `begin_attempt` may take over `existing` at `now`: only an expired record whose
/// operation is finished (committed or failed). An expired record still `in_flight` or
/// `unknown` names an operation that may have had its effect; it is reconciled first. Shared
/// by every store implementation.
pub fn may_take_over(existing: &IdempotencyRecord, now: OffsetDateTime) -> bool {
    existing.expires_at <= now
        && matches!(
            existing.status,
            IdempotencyStatus::Committed | IdempotencyStatus::Failed
        )
}

/// What `begin_attempt` answers when a record holds the key and may not be taken over (see
/// [`may_take_over`]). Shared by every store implementation.
pub fn classify_existing(
    existing: IdempotencyRecord,
    payload_digest: Option<&str>,
    now: OffsetDateTime,
) -> AttemptStart {
    if existing.expires_at <= now
        && matches!(
            existing.status,
            IdempotencyStatus::InFlight | IdempotencyStatus::Unknown
        )
    {
        return AttemptStart::Unknown(existing);
    }
    if Some(existing.payload_digest.as_str()) != payload_digest {
        return AttemptStart::KeyReused;
    }
    match existing.status {
        IdempotencyStatus::InFlight => AttemptStart::InFlight,
        IdempotencyStatus::Committed | IdempotencyStatus::Failed => AttemptStart::Replay(existing),
        IdempotencyStatus::Unknown => AttemptStart::Unknown(existing),
    }
}

/// The ledger listing's keyset cursor, `<created_at in ms>:<id>`, parsed.
///
/// # Errors
/// [`StoreError::Invalid`] for anything else.
pub fn parse_ledger_cursor(text: &str) -> Result<(i64, String), StoreError> {
    text.split_once(':')
        .and_then(|(at, id)| Some((at.parse::<i64>().ok()?, id.to_owned())))
        .ok_or_else(|| StoreError::Invalid("malformed cursor".into()))
}

/// One page from rows fetched newest first with one row more than `limit`: the extra row
/// only says that a next page exists; the cursor points after the page's last row.
pub fn ledger_page(mut entries: Vec<LedgerEntry>, limit: usize) -> LedgerPage {
    let more = entries.len() > limit;
    entries.truncate(limit);
    let next_cursor = if more {
        entries.last().map(|e| {
            let ms = e.created_at.unix_timestamp_nanos() / 1_000_000;
            format!("{ms}:{}", e.id)
        })
    } else {
        None
    };
    LedgerPage { entries, next_cursor }
}

/// The cursor that continues a newest-first listing of approval requests after `a`.
pub fn approval_cursor(a: &ApprovalRequest) -> String {
    let ms = a.request.created_at.unix_timestamp_nanos() / 1_000_000;
    format!("{ms}:{}", a.request.id)
}

/// One page from approval requests fetched newest first with one more than `limit` (see
/// [`ledger_page`]).
pub fn approval_page(mut approvals: Vec<ApprovalRequest>, limit: usize) -> ApprovalPage {
    let more = approvals.len() > limit;
    approvals.truncate(limit);
    let next_cursor = if more {
        approvals.last().map(approval_cursor)
    } else {
        None
    };
    ApprovalPage {
        approvals,
        next_cursor,
    }
}

/// Why `reviewer` may not decide `current` at `now` — not found, not pending, the proposer,
/// expired, checked in that order — or `None` when they may. Shared by every store
/// implementation so they refuse reviews alike.
pub fn review_refusal(
    current: Option<&ApprovalRequest>,
    reviewer: &str,
    now: OffsetDateTime,
) -> Option<DecideRefusal> {
    match current {
        None => Some(DecideRefusal::NotFound),
        Some(a) if a.status != ApprovalStatus::Pending => Some(DecideRefusal::NotPending(a.status)),
        Some(a) if a.request.proposer == reviewer => Some(DecideRefusal::SelfReview),
        Some(a) if a.request.expires_at <= now => Some(DecideRefusal::Expired),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    /// The SQL stores make a read's finished row before they know the budget's answer and,
    /// when it refuses, the withheld row of that: the same row the entry itself gives.
    #[test]
    fn a_withheld_row_is_the_same_of_the_entry_or_its_finished_row() {
        let created = OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(1_000);
        let mut entry = LedgerEntry::new(
            "led_1".into(),
            "acme",
            "agent-7",
            "trace",
            "lookup_order",
            created,
        );
        entry.outcome = Some(Outcome::Attempting);
        entry.detail = Some("before".into());
        entry.error_code = Some("BEFORE".into());
        entry.attempts = 0;
        entry.cost = 9;
        let finish = AttemptFinish {
            outcome: Outcome::Committed,
            attempts: 2,
            error_code: Some("AFTER".into()),
            result: None,
            latency_ms: 17,
            cost: 3,
            detail: Some("after".into()),
            charges: Vec::new(),
        };
        let now = created + time::Duration::seconds(5);
        let finished = finished_row(entry.clone(), &finish, now).unwrap();
        assert_ne!(finished, entry);
        let key = "calls_per_day:agent-7:lookup_order:1970-01-01";
        assert_eq!(
            withheld_of_finished(finished, entry.updated_at, key, &finish),
            withheld_row(entry, key, &finish)
        );
    }
}
