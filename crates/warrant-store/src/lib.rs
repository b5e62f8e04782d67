//! Warrant's durable store: everything Warrant must not forget — the contract registry, the
//! invocation ledger, idempotency records, approval requests, budget counters, API keys and the
//! job outbox — behind one interface with two real backends: embedded SQLite (the default) and
//! PostgreSQL (shared by many nodes).
//!
//! **Tenant isolation is in the interface:** every method that reads or changes tenant data
//! takes the tenant, and every query filters on it. **Correctness lives in the database**:
//! uniqueness, single use and budget limits are enforced by constraints and conditional
//! updates inside transactions, never by in-memory locks, so several processes sharing one
//! PostgreSQL database stay exact.

mod error;
pub mod keys;
mod sql;

use async_trait::async_trait;
use time::OffsetDateTime;

pub use error::StoreError;
pub use sql::{DatabaseUrl, SqlStore, StoreOptions};
pub use warrant_core::records::*;

/// The store interface. Implemented by [`SqlStore`] for SQLite and PostgreSQL; the same
/// conformance suite runs against both.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Checks that the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    // ----- contracts (global, registered by operators) -----

    /// Registers a contract. The same body under the same name@version is a no-op; a
    /// different body is [`StoreError::Conflict`].
    async fn register_contract(&self, contract: &StoredContract) -> Result<Registration, StoreError>;
    /// A contract by name and version.
    async fn get_contract(&self, name: &str, version: u32) -> Result<Option<StoredContract>, StoreError>;
    /// A contract by content id.
    async fn get_contract_by_id(&self, content_id: &str) -> Result<Option<StoredContract>, StoreError>;
    /// Every registered contract, by name then version.
    async fn list_contracts(&self) -> Result<Vec<StoredContract>, StoreError>;
    /// Retires a contract; `false` if it does not exist. Retiring twice keeps the first time.
    async fn retire_contract(&self, content_id: &str, at: OffsetDateTime) -> Result<bool, StoreError>;

    // ----- ledger -----

    /// Records a proposal that did not reach execution (rejected or awaiting approval).
    async fn insert_ledger(&self, entry: &LedgerEntry) -> Result<(), StoreError>;
    /// One ledger row of `tenant`.
    async fn get_ledger(&self, tenant: &str, id: &str) -> Result<Option<LedgerEntry>, StoreError>;
    /// Ledger rows of `tenant`, newest first, filtered and paginated by cursor.
    async fn list_ledger(&self, tenant: &str, filter: &LedgerFilter) -> Result<LedgerPage, StoreError>;
    /// Rows whose outcome is `attempting` or `unknown` and untouched since `older_than`
    /// (what reconciliation must resolve), across tenants, oldest first.
    async fn list_unresolved(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<LedgerEntry>, StoreError>;

    // ----- write-ahead intent: idempotency claim + ledger row in one transaction -----

    /// Claims the idempotency record (when `scope` is given) and writes the ledger row in one
    /// transaction. On [`AttemptStart::Started`] the row says `attempting` and the record is
    /// `in_flight`; otherwise the row records the replay or the refusal.
    async fn begin_attempt(
        &self,
        entry: &LedgerEntry,
        scope: Option<&IdempotencyScope>,
        expires_at: OffsetDateTime,
    ) -> Result<AttemptStart, StoreError>;
    /// Records how an attempt ended, updating the ledger row and the idempotency record in one
    /// transaction. Only rows still `attempting` or `unknown` can be finished.
    async fn finish_attempt(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<(), StoreError>;
    /// An idempotency record.
    async fn get_idempotency(
        &self,
        scope: &IdempotencyScope,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    // ----- approvals -----

    /// Stores a new pending approval request.
    async fn create_approval(&self, approval: &NewApproval) -> Result<(), StoreError>;
    /// One approval of `tenant`.
    async fn get_approval(&self, tenant: &str, id: &str) -> Result<Option<ApprovalRequest>, StoreError>;
    /// Approvals of `tenant`, oldest first, optionally by status.
    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
    ) -> Result<Vec<ApprovalRequest>, StoreError>;
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

    // ----- jobs (outbox) -----

    /// Enqueues a job.
    async fn enqueue_job(&self, job: &NewJob) -> Result<(), StoreError>;
    /// Claims up to `limit` due jobs (pending, or running with an expired lease) for `worker`
    /// until `now + lease`. Two workers never claim the same job.
    async fn claim_jobs(
        &self,
        worker: &str,
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
    /// Dead jobs of `tenant` (the dead-letter queue).
    async fn list_dead_jobs(&self, tenant: &str, limit: u32) -> Result<Vec<Job>, StoreError>;

    // ----- sweeping -----

    /// Purges expired idempotency records and budget counters and expires stale approvals.
    async fn purge_expired(&self, now: OffsetDateTime) -> Result<PurgeCounts, StoreError>;
}

/// Runs [`Store::purge_expired`] every `interval` until the returned handle is aborted.
pub fn spawn_sweeper<S: Store + ?Sized>(
    store: std::sync::Arc<S>,
    interval: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A failed sweep is retried on the next tick. Nothing depends on it for
            // correctness: `begin_attempt` treats an expired idempotency record as free and
            // approvals are checked against their expiry when decided or consumed.
            let _ = store.purge_expired(OffsetDateTime::now_utc()).await;
        }
    })
}
