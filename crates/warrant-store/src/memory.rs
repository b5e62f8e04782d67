//! [`MemoryStore`]: the store port held in process memory, for offline audits
//! (`warrant check`), benchmarks and tests. Every operation takes one mutex for its whole
//! duration, which makes each method atomic exactly like a database transaction — but nothing
//! survives the process, and two processes never share it: `warrant serve` uses [`crate::SqlStore`].
//!
//! It passes the same conformance suite as the SQL backends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;
use warrant_core::contract::Namespace;
use warrant_core::records::*;
use warrant_core::store::{
    RegistrationPlan, Store, StoreError, approval_page, attempt_row, classify_existing, correction_note,
    late_outcome_corrects, ledger_page, may_take_over, parse_ledger_cursor, plan_registration,
    review_refusal, status_after, withheld_row,
};

#[derive(Default)]
struct State {
    closed: bool,
    contracts: BTreeMap<(Namespace, String, u32), StoredContract>,
    tenants: BTreeMap<String, TenantRecord>,
    workflows: BTreeMap<(String, String, u32), WorkflowRecord>,
    runs: BTreeMap<String, RunRecord>,
    run_steps: BTreeMap<(String, u32), RunStep>,
    ledger: HashMap<String, LedgerEntry>,
    idempotency: HashMap<IdempotencyScope, IdempotencyRecord>,
    approvals: HashMap<String, ApprovalRequest>,
    /// tenant → counter key → (used, expiry); nested so lookups borrow instead of allocating.
    budgets: HashMap<String, HashMap<String, (u64, OffsetDateTime)>>,
    keys: BTreeMap<String, ApiKeyRecord>,
    console: HashMap<String, ConsoleSession>,
    /// (scope, tenant, id) → when the spent token is forgotten.
    tokens: HashMap<(String, String, String), OffsetDateTime>,
    /// (tenant, id) → agent task.
    tasks: HashMap<(String, String), TaskRecord>,
    /// (tenant, id) → webhook endpoint.
    webhooks: BTreeMap<(String, String), WebhookEndpoint>,
    /// Webhook delivery attempts, in the order recorded.
    attempts: Vec<WebhookAttempt>,
    jobs: BTreeMap<String, Job>,
    /// id → inbound source.
    inbound_sources: BTreeMap<String, InboundSource>,
    /// (source id, event id) → inbound event.
    inbound_events: BTreeMap<(String, String), InboundEvent>,
    /// ledger id → its reconciliation schedule (the SQL backends' `reconcile_*` columns).
    schedules: HashMap<String, Schedule>,
}

impl State {
    /// Enqueues a webhook-only event when an enabled endpoint of its tenant subscribes to it
    /// (as the SQL backends do), at most once per id.
    fn notify(&mut self, n: &Notice) {
        let subscribed = self.webhooks.values().any(|w| {
            w.tenant == n.job.tenant
                && w.enabled
                && (w.events.is_empty() || w.events.iter().any(|e| e == n.kind))
        });
        if subscribed && !self.jobs.contains_key(&n.job.id) {
            let _ = self.enqueue(&n.job);
        }
    }

    fn enqueue(&mut self, j: &NewJob) -> Result<(), StoreError> {
        if self.jobs.contains_key(&j.id) {
            return Err(StoreError::Conflict(format!("job {} exists", j.id)));
        }
        let mut job = j.clone();
        job.run_at = trunc(job.run_at);
        job.max_attempts = job.max_attempts.max(1);
        self.jobs.insert(
            j.id.clone(),
            Job {
                job,
                status: JobStatus::Pending,
                attempts: 0,
                locked_by: None,
                locked_until: None,
                last_error: None,
            },
        );
        Ok(())
    }
}

/// A ledger row's reconciliation schedule (see migration 0004).
#[derive(Default)]
struct Schedule {
    at: Option<OffsetDateTime>,
    attempts: u32,
    owner: Option<String>,
    note: Option<String>,
    overdue_at: Option<OffsetDateTime>,
}

fn unresolved(e: &LedgerEntry) -> bool {
    matches!(e.outcome, Some(Outcome::Attempting | Outcome::Unknown))
}

/// The in-memory store (see the module documentation).
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryStore")
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Makes every later call fail with [`StoreError::Unavailable`] (as a closed pool does).
    pub fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.closed = true;
        }
    }

    /// Inserts an approval in whatever state it is in (to seed an offline audit with an
    /// approval record from a file; the store interface only creates pending requests).
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the id exists.
    pub fn insert_approval(&self, approval: ApprovalRequest) -> Result<(), StoreError> {
        self.with(|s| {
            if s.approvals.contains_key(&approval.request.id) {
                return Err(StoreError::Conflict(format!(
                    "approval {} exists",
                    approval.request.id
                )));
            }
            s.approvals.insert(approval.request.id.clone(), approval);
            Ok(())
        })
    }

    /// Runs `f` on the state under the lock: one method, one atomic step.
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| StoreError::Unavailable("in-memory store poisoned by a panic".into()))?;
        if state.closed {
            return Err(StoreError::Unavailable("store closed".into()));
        }
        f(&mut state)
    }
}

/// Whether `a` is an approval of the call `call` describes, in `tenant`: the same proposer,
/// contract, payload digest and idempotency key.
fn of_call(a: &ApprovalRequest, tenant: &str, call: &ApprovalLookup) -> bool {
    let r = &a.request;
    r.tenant == tenant
        && r.proposer == call.proposer
        && r.contract_id == call.contract_id
        && r.payload_digest == call.payload_digest
        && r.idempotency_key == call.idempotency_key
}

/// Finishes the `attempting` (or `unknown`) row `ledger_id`: its outcome, the charges, and the
/// idempotency record it holds, if any. Checks the row before changing anything.
fn finish_in(
    s: &mut State,
    tenant: &str,
    ledger_id: &str,
    scope: Option<&IdempotencyScope>,
    finish: &AttemptFinish,
    status: Option<IdempotencyStatus>,
    now: OffsetDateTime,
) -> Result<(), StoreError> {
    let row = s
        .ledger
        .get_mut(ledger_id)
        .filter(|e| e.tenant == tenant && matches!(e.outcome, Some(Outcome::Attempting | Outcome::Unknown)))
        .ok_or_else(|| StoreError::Conflict(format!("ledger row {ledger_id} is not awaiting an outcome")))?;
    row.outcome = Some(finish.outcome);
    row.attempts = finish.attempts;
    row.error_code = finish.error_code.clone();
    row.latency_ms = Some(finish.latency_ms);
    row.cost = finish.cost;
    row.updated_at = trunc(now);
    if let Some(detail) = &finish.detail {
        row.detail = Some(detail.clone());
    }
    if let Some(notice) = Notice::invocation(tenant, ledger_id, finish.outcome, now) {
        s.notify(&notice);
    }
    charge(s, tenant, &finish.charges);
    if let Some(scope) = scope
        && s.idempotency.get(scope).is_some_and(|r| r.ledger_id == ledger_id)
    {
        match status {
            Some(status) => {
                if let Some(record) = s.idempotency.get_mut(scope) {
                    record.status = status;
                    record.result = finish.result.clone();
                    record.error_code = finish.error_code.clone();
                    // A finished record is kept a retention from when its outcome is known
                    // (as `sql::finish_in`).
                    let kept = trunc(now + (record.expires_at - record.created_at));
                    let finished = matches!(status, IdempotencyStatus::Committed | IdempotencyStatus::Failed);
                    if finished && kept > record.expires_at {
                        record.expires_at = kept;
                    }
                }
            }
            None => {
                s.idempotency.remove(scope);
            }
        }
    }
    Ok(())
}

fn ms(t: OffsetDateTime) -> i128 {
    t.unix_timestamp_nanos() / 1_000_000
}

/// Timestamps are kept at millisecond precision, as the SQL backends store them.
fn trunc(t: OffsetDateTime) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(ms(t) * 1_000_000).unwrap_or(t)
}

fn trunc_entry(mut e: LedgerEntry) -> LedgerEntry {
    e.created_at = trunc(e.created_at);
    e.updated_at = trunc(e.updated_at);
    e
}

/// Adds an outcome's committed spend to `tenant`'s counters (no limit: spend is recorded).
fn charge(s: &mut State, tenant: &str, charges: &[Charge]) {
    if charges.is_empty() {
        return;
    }
    let counters = s.budgets.entry(tenant.to_owned()).or_default();
    for c in charges {
        let slot = counters.entry(c.key.clone()).or_insert((0, trunc(c.expires_at)));
        slot.0 = slot.0.saturating_add(c.amount);
    }
}

/// How long an idempotency record restored by a late commit is kept (the original
/// retention is not known any more; a day covers any client retry).
const LATE_RECORD_RETENTION: time::Duration = time::Duration::days(1);

/// Why `claim` may not consume its approval at `now`: `Some(current record, or None when it
/// is gone)`; `None` when it may.
fn approval_refused(
    s: &State,
    tenant: &str,
    claim: &ApprovalClaim,
    now: OffsetDateTime,
) -> Option<Option<ApprovalRequest>> {
    let Some(a) = s
        .approvals
        .get(&claim.approval_id)
        .filter(|a| a.request.tenant == tenant)
    else {
        return Some(None);
    };
    let r = &a.request;
    let bound = a.status == ApprovalStatus::Approved
        && ms(r.expires_at) > ms(now)
        && r.contract_id == claim.contract_id
        && r.payload_digest == claim.payload_digest
        && r.idempotency_key == claim.idempotency_key
        && r.proposer == claim.principal;
    if bound { None } else { Some(Some(a.clone())) }
}

/// Consumes an approval [`approval_refused`] admitted.
fn approval_take(
    s: &mut State,
    claim: &ApprovalClaim,
    now: OffsetDateTime,
) -> Result<ApprovalRequest, StoreError> {
    let a = s
        .approvals
        .get_mut(&claim.approval_id)
        .ok_or(StoreError::NotFound)?;
    a.status = ApprovalStatus::Consumed;
    a.request.sealed_arguments = None;
    a.consumed_at = Some(trunc(now));
    a.consumed_by = Some(claim.ledger_id.clone());
    Ok(a.clone())
}

/// The first counter of `reservations` without room for its amount, if any.
fn budget_refusal(s: &State, tenant: &str, reservations: &[BudgetReservation]) -> Option<String> {
    let counters = s.budgets.get(tenant);
    reservations
        .iter()
        .find(|r| {
            let used = counters.and_then(|c| c.get(&r.key)).map_or(0, |(u, _)| *u);
            r.amount > r.limit || used.saturating_add(r.amount) > r.limit
        })
        .map(|r| r.key.clone())
}

/// Takes `reservations` ([`budget_refusal`] found room for each).
fn budget_take(s: &mut State, tenant: &str, reservations: &[BudgetReservation]) {
    if reservations.is_empty() {
        return;
    }
    let counters = s.budgets.entry(tenant.to_owned()).or_default();
    for r in reservations {
        match counters.get_mut(&r.key) {
            Some(slot) => slot.0 = slot.0.saturating_add(r.amount),
            None => {
                counters.insert(r.key.clone(), (r.amount, trunc(r.expires_at)));
            }
        }
    }
}

/// Why the approval or the budget of `claims` cannot be taken at `now`, if either cannot.
fn claims_refusal(
    s: &State,
    tenant: &str,
    claims: &AttemptClaims,
    now: OffsetDateTime,
) -> Option<AttemptStart> {
    if let Some(claim) = &claims.approval
        && let Some(current) = approval_refused(s, tenant, claim, now)
    {
        return Some(AttemptStart::ApprovalRefused(current));
    }
    budget_refusal(s, tenant, &claims.reservations).map(|key| AttemptStart::BudgetExhausted { key })
}

#[async_trait]
impl Store for MemoryStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.with(|_| Ok(()))
    }

    async fn probe_write(&self, _at: OffsetDateTime) -> Result<(), StoreError> {
        self.with(|_| Ok(()))
    }

    async fn register_contract(&self, c: &StoredContract) -> Result<Registration, StoreError> {
        self.with(|s| {
            let key = (c.namespace.clone(), c.name.clone(), c.version);
            let platform_uses_name = s
                .contracts
                .keys()
                .any(|(ns, name, _)| *ns == Namespace::Platform && *name == c.name);
            match plan_registration(s.contracts.get(&key), c, platform_uses_name)? {
                RegistrationPlan::Unchanged => Ok(Registration::Unchanged),
                RegistrationPlan::Bind => {
                    if let Some(existing) = s.contracts.get_mut(&key) {
                        existing.binding = c.binding.clone();
                        existing.binding_digest = c.binding_digest.clone();
                    }
                    Ok(Registration::Bound)
                }
                RegistrationPlan::Insert => {
                    if s.contracts
                        .iter()
                        .any(|((ns, _, _), e)| *ns == c.namespace && e.content_id == c.content_id)
                    {
                        return Err(StoreError::Conflict(format!(
                            "{} is already registered",
                            c.content_id
                        )));
                    }
                    let mut stored = c.clone();
                    stored.registered_at = trunc(stored.registered_at);
                    s.contracts.insert(key, stored);
                    if let Some(owner) = c.namespace.tenant() {
                        s.notify(&Notice::contract(
                            owner,
                            &c.name,
                            c.version,
                            &c.content_id,
                            false,
                            c.registered_at,
                        ));
                    }
                    Ok(Registration::Registered)
                }
            }
        })
    }

    async fn get_contract(
        &self,
        namespace: &Namespace,
        name: &str,
        version: u32,
    ) -> Result<Option<StoredContract>, StoreError> {
        self.with(|s| {
            Ok(s.contracts
                .get(&(namespace.clone(), name.to_owned(), version))
                .cloned())
        })
    }

    async fn get_contract_by_id(
        &self,
        namespace: &Namespace,
        content_id: &str,
    ) -> Result<Option<StoredContract>, StoreError> {
        self.with(|s| {
            Ok(s.contracts
                .values()
                .find(|c| c.namespace == *namespace && c.content_id == content_id)
                .cloned())
        })
    }

    async fn list_contracts(&self) -> Result<Vec<StoredContract>, StoreError> {
        self.with(|s| Ok(s.contracts.values().cloned().collect()))
    }

    async fn list_contract_states(&self) -> Result<Vec<ContractState>, StoreError> {
        self.with(|s| {
            Ok(s.contracts
                .values()
                .map(|c| ContractState {
                    namespace: c.namespace.clone(),
                    content_id: c.content_id.clone(),
                    binding_digest: c.binding_digest.clone(),
                    retired_at: c.retired_at,
                })
                .collect())
        })
    }

    async fn retire_contract(
        &self,
        namespace: &Namespace,
        content_id: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        self.with(|s| {
            match s
                .contracts
                .values_mut()
                .find(|c| c.namespace == *namespace && c.content_id == content_id)
            {
                Some(c) => {
                    c.retired_at.get_or_insert(trunc(at));
                    if let Some(owner) = c.namespace.tenant() {
                        let notice = Notice::contract(owner, &c.name, c.version, content_id, true, at);
                        s.notify(&notice);
                    }
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }

    async fn create_tenant(&self, tenant: &TenantRecord) -> Result<bool, StoreError> {
        self.with(|s| {
            if s.tenants.contains_key(&tenant.id) {
                return Ok(false);
            }
            let mut t = tenant.clone();
            t.created_at = trunc(t.created_at);
            s.tenants.insert(t.id.clone(), t);
            Ok(true)
        })
    }

    async fn publish_workflow(&self, workflow: &WorkflowRecord) -> Result<Publication, StoreError> {
        self.with(|s| {
            let key = (workflow.tenant.clone(), workflow.name.clone(), workflow.version);
            match s.workflows.get(&key) {
                Some(existing) if existing.digest == workflow.digest => Ok(Publication::Unchanged),
                Some(_) => Err(StoreError::Conflict(format!(
                    "workflow {}@{} is already published with another definition",
                    workflow.name, workflow.version
                ))),
                None => {
                    let mut w = workflow.clone();
                    w.published_at = trunc(w.published_at);
                    s.workflows.insert(key, w);
                    Ok(Publication::Published)
                }
            }
        })
    }

    async fn get_workflow(
        &self,
        tenant: &str,
        name: &str,
        version: u32,
    ) -> Result<Option<WorkflowRecord>, StoreError> {
        self.with(|s| {
            Ok(s.workflows
                .get(&(tenant.to_owned(), name.to_owned(), version))
                .cloned())
        })
    }

    async fn list_workflows(&self, tenant: &str) -> Result<Vec<WorkflowRecord>, StoreError> {
        self.with(|s| {
            Ok(s.workflows
                .values()
                .filter(|w| w.tenant == tenant)
                .cloned()
                .collect())
        })
    }

    async fn start_run(&self, run: &RunRecord, job: &NewJob) -> Result<(), StoreError> {
        self.with(|s| {
            if s.runs.contains_key(&run.id) || s.jobs.contains_key(&job.id) {
                return Err(StoreError::Conflict(format!("run {} exists", run.id)));
            }
            let mut r = run.clone();
            r.created_at = trunc(r.created_at);
            r.updated_at = trunc(r.updated_at);
            s.enqueue(job)?;
            s.notify(&run_event(&r.tenant, &r.id, "run.started", r.created_at));
            s.runs.insert(r.id.clone(), r);
            Ok(())
        })
    }

    async fn start_run_claimed(
        &self,
        run: &RunRecord,
        job: &NewJob,
        worker: &str,
        lease_until: OffsetDateTime,
    ) -> Result<Job, StoreError> {
        self.start_run(run, job).await?;
        self.with(|s| {
            let j = s
                .jobs
                .get_mut(&job.id)
                .ok_or_else(|| StoreError::Conflict(format!("job {} is gone", job.id)))?;
            j.status = JobStatus::Running;
            j.attempts = 1;
            j.locked_by = Some(worker.to_owned());
            j.locked_until = Some(trunc(lease_until));
            Ok(j.clone())
        })
    }

    async fn advance_run(
        &self,
        tenant: &str,
        step: &RunStep,
        advance: &RunAdvance,
        handoff: Option<&Handoff>,
        now: OffsetDateTime,
    ) -> Result<Advanced, StoreError> {
        self.with(|s| {
            let expected = s.runs.get(&step.run_id).is_some_and(|r| {
                r.tenant == tenant
                    && r.next_seq == step.seq
                    && matches!(r.status, RunStatus::Running | RunStatus::Waiting)
            });
            if !expected {
                return Ok(Advanced::Stale);
            }
            let held = |s: &mut State, h: &Handoff| {
                s.jobs
                    .get_mut(&h.job_id)
                    .filter(|j| {
                        j.status == JobStatus::Running && j.locked_by.as_deref() == Some(h.worker.as_str())
                    })
                    .map(|j| j.job.id.clone())
            };
            let finish = |s: &mut State, h: &Handoff| {
                if let Some(id) = held(s, h)
                    && let Some(j) = s.jobs.get_mut(&id)
                {
                    j.status = JobStatus::Done;
                    j.locked_by = None;
                    j.locked_until = None;
                }
            };
            let mut next = None;
            match (advance.job(), handoff) {
                // The step's own job carries the next step when it is handed on at once.
                (Some(job), Some(h)) if job.run_at <= now => {
                    let id = match held(s, h) {
                        Some(id) => id,
                        None => {
                            s.enqueue(job)?;
                            job.id.clone()
                        }
                    };
                    if let Some(j) = s.jobs.get_mut(&id) {
                        j.job.payload = job.payload.clone();
                        j.status = JobStatus::Running;
                        j.attempts = 1;
                        j.locked_by = Some(h.worker.clone());
                        j.locked_until = Some(trunc(h.lease_until));
                        j.last_error = None;
                        next = Some(Box::new(j.clone()));
                    }
                }
                (Some(job), h) => {
                    if let Some(h) = h {
                        finish(s, h);
                    }
                    s.enqueue(job)?;
                }
                (None, Some(h)) => finish(s, h),
                (None, None) => {}
            }
            let (status, next_step, error) = advance.outcome();
            if let Some(event) = run_advance_event(tenant, &step.run_id, step.seq, status, now) {
                s.notify(&event);
            }
            let Some(run) = s.runs.get_mut(&step.run_id) else {
                return Ok(Advanced::Stale);
            };
            run.status = status;
            run.next_step = next_step;
            run.next_seq += advance.steps();
            run.cost = run.cost.saturating_add(step.cost);
            run.error = error;
            run.updated_at = trunc(now);
            let mut recorded = step.clone();
            recorded.finished_at = trunc(recorded.finished_at);
            s.run_steps.insert((step.run_id.clone(), step.seq), recorded);
            if let Some(mut end) = advance.end_record(step) {
                end.finished_at = trunc(end.finished_at);
                s.run_steps.insert((end.run_id.clone(), end.seq), end);
            }
            Ok(Advanced::Recorded { next })
        })
    }

    async fn cancel_run(&self, tenant: &str, id: &str, now: OffsetDateTime) -> Result<bool, StoreError> {
        self.with(|s| match s.runs.get_mut(id) {
            Some(run) if run.tenant == tenant && !run.status.is_final() => {
                run.status = RunStatus::Cancelled;
                run.next_step = None;
                run.error = Some("cancelled".into());
                run.updated_at = trunc(now);
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.with(|s| Ok(s.runs.get(id).filter(|r| r.tenant == tenant).cloned()))
    }

    async fn run_steps(&self, tenant: &str, id: &str) -> Result<Vec<RunStep>, StoreError> {
        self.with(|s| {
            if s.runs.get(id).is_none_or(|r| r.tenant != tenant) {
                return Ok(Vec::new());
            }
            Ok(s.run_steps
                .range((id.to_owned(), 0)..=(id.to_owned(), u32::MAX))
                .map(|(_, step)| step.clone())
                .collect())
        })
    }

    async fn list_runs(&self, tenant: &str, limit: u32) -> Result<Vec<RunRecord>, StoreError> {
        self.with(|s| {
            let mut runs: Vec<RunRecord> = s.runs.values().filter(|r| r.tenant == tenant).cloned().collect();
            runs.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
            runs.truncate(limit.clamp(1, 1000) as usize);
            Ok(runs)
        })
    }

    async fn list_tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        self.with(|s| Ok(s.tenants.values().cloned().collect()))
    }

    async fn insert_ledger(&self, entry: &LedgerEntry) -> Result<(), StoreError> {
        self.with(|s| {
            if s.ledger.contains_key(&entry.id) {
                return Err(StoreError::Conflict(format!("ledger row {} exists", entry.id)));
            }
            s.ledger.insert(entry.id.clone(), trunc_entry(entry.clone()));
            Ok(())
        })
    }

    async fn get_ledger(&self, tenant: &str, id: &str) -> Result<Option<LedgerEntry>, StoreError> {
        self.with(|s| Ok(s.ledger.get(id).filter(|e| e.tenant == tenant).cloned()))
    }

    async fn list_ledger(&self, tenant: &str, filter: &LedgerFilter) -> Result<LedgerPage, StoreError> {
        let limit = filter.limit.clamp(1, 500) as usize;
        let cursor = filter.cursor.as_deref().map(parse_ledger_cursor).transpose()?;
        self.with(|s| {
            let mut rows: Vec<&LedgerEntry> = s
                .ledger
                .values()
                .filter(|e| e.tenant == tenant)
                .filter(|e| filter.tool.as_ref().is_none_or(|t| &e.tool == t))
                .filter(|e| filter.outcome.is_none_or(|o| e.outcome == Some(o)))
                .filter(|e| filter.principal.as_ref().is_none_or(|p| &e.principal == p))
                .filter(|e| filter.since.is_none_or(|t| ms(e.created_at) >= ms(t)))
                .filter(|e| filter.until.is_none_or(|t| ms(e.created_at) < ms(t)))
                .filter(|e| filter.trace_id.as_ref().is_none_or(|t| &e.trace_id == t))
                .filter(|e| {
                    filter
                        .approval_id
                        .as_ref()
                        .is_none_or(|a| e.approval_id.as_ref() == Some(a))
                })
                .filter(|e| {
                    cursor
                        .as_ref()
                        .is_none_or(|(at, id)| (ms(e.created_at), &e.id) < (i128::from(*at), id))
                })
                .collect();
            rows.sort_by(|a, b| (ms(b.created_at), &b.id).cmp(&(ms(a.created_at), &a.id)));
            Ok(ledger_page(
                rows.into_iter().take(limit + 1).cloned().collect(),
                limit,
            ))
        })
    }

    async fn list_unresolved(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<LedgerEntry>, StoreError> {
        self.with(|s| {
            let mut rows: Vec<LedgerEntry> = s
                .ledger
                .values()
                .filter(|e| matches!(e.outcome, Some(Outcome::Attempting | Outcome::Unknown)))
                .filter(|e| ms(e.updated_at) <= ms(older_than))
                .cloned()
                .collect();
            rows.sort_by_key(|e| ms(e.updated_at));
            rows.truncate(limit as usize);
            Ok(rows)
        })
    }

    async fn claim_unresolved(
        &self,
        worker: &str,
        now: OffsetDateTime,
        scheduled_by: OffsetDateTime,
        older_than: OffsetDateTime,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<ClaimedRow>, StoreError> {
        let until = trunc(
            time::Duration::try_from(lease)
                .ok()
                .and_then(|lease| now.checked_add(lease))
                .unwrap_or(now),
        );
        let shift = (ms(now) - ms(older_than)).max(0);
        self.with(|s| {
            let mut due: Vec<(i128, String)> = s
                .ledger
                .values()
                .filter(|e| unresolved(e))
                .filter_map(|e| {
                    match s
                        .schedules
                        .get(&e.id)
                        .and_then(|sc| Some((sc.at?, sc.owner.is_some())))
                    {
                        Some((at, held)) => (ms(at) <= ms(now) || (!held && ms(at) <= ms(scheduled_by)))
                            .then(|| (ms(at), e.id.clone())),
                        None => (ms(e.updated_at) <= ms(older_than))
                            .then(|| (ms(e.updated_at) + shift, e.id.clone())),
                    }
                })
                .collect();
            due.sort();
            due.truncate(limit.clamp(1, 1000) as usize);
            let mut out = Vec::with_capacity(due.len());
            for (_, id) in due {
                let Some(entry) = s.ledger.get(&id).cloned() else {
                    continue;
                };
                let schedule = s.schedules.entry(id).or_default();
                schedule.at = Some(until);
                schedule.owner = Some(worker.to_owned());
                out.push(ClaimedRow {
                    entry,
                    reconcile_attempts: schedule.attempts,
                    reconcile_note: schedule.note.clone(),
                });
            }
            Ok(out)
        })
    }

    async fn reschedule_unresolved(
        &self,
        tenant: &str,
        id: &str,
        worker: &str,
        next_at: OffsetDateTime,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.with(|s| {
            if !s
                .ledger
                .get(id)
                .is_some_and(|e| e.tenant == tenant && unresolved(e))
            {
                return Ok(false);
            }
            let Some(schedule) = s.schedules.get_mut(id) else {
                return Ok(false);
            };
            if schedule.owner.as_deref() != Some(worker) {
                return Ok(false);
            }
            schedule.at = Some(trunc(next_at));
            schedule.owner = None;
            schedule.attempts = schedule.attempts.saturating_add(1);
            schedule.note = Some(note.to_owned());
            Ok(true)
        })
    }

    async fn mark_overdue(
        &self,
        created_before: OffsetDateTime,
        now: OffsetDateTime,
        note: &str,
        limit: u32,
    ) -> Result<OverdueSweep, StoreError> {
        self.with(|s| {
            let mut due: Vec<(i128, String)> = s
                .ledger
                .values()
                .filter(|e| unresolved(e) && ms(e.created_at) <= ms(created_before))
                .filter(|e| s.schedules.get(&e.id).is_none_or(|sc| sc.overdue_at.is_none()))
                .map(|e| (ms(e.created_at), e.id.clone()))
                .collect();
            due.sort();
            due.truncate(limit.clamp(1, 10_000) as usize);
            let mut newly = Vec::with_capacity(due.len());
            for (_, id) in due {
                let Some(entry) = s.ledger.get_mut(&id) else {
                    continue;
                };
                entry.detail = Some(crate::sql::overdue_detail(note, entry.detail.as_deref()));
                newly.push(entry.clone());
                s.schedules.entry(id).or_default().overdue_at = Some(trunc(now));
            }
            let overdue = s
                .ledger
                .values()
                .filter(|e| unresolved(e))
                .filter(|e| s.schedules.get(&e.id).is_some_and(|sc| sc.overdue_at.is_some()))
                .count() as u64;
            Ok(OverdueSweep { newly, overdue })
        })
    }

    async fn begin_attempt(
        &self,
        entry: &LedgerEntry,
        scope: Option<&IdempotencyScope>,
        claims: &AttemptClaims,
        expires_at: OffsetDateTime,
    ) -> Result<AttemptStart, StoreError> {
        self.with(|s| {
            if s.ledger.contains_key(&entry.id) {
                return Err(StoreError::Conflict(format!("ledger row {} exists", entry.id)));
            }
            let now = trunc(entry.created_at);
            // Every check before any change: the operation is then all or nothing.
            let held = scope.and_then(|scope| {
                s.idempotency
                    .get(scope)
                    .filter(|existing| !may_take_over(existing, now))
                    .map(|existing| classify_existing(existing.clone(), entry.payload_digest.as_deref(), now))
            });
            let start = match held {
                Some(start) => start,
                None => match claims_refusal(s, &entry.tenant, claims, now) {
                    Some(refusal) => {
                        if let AttemptStart::BudgetExhausted { key } = &refusal {
                            s.notify(&Notice::budget(&entry.tenant, key, &entry.id, entry.created_at));
                        }
                        refusal
                    }
                    None => {
                        if let Some(claim) = &claims.approval {
                            approval_take(s, claim, now)?;
                        }
                        budget_take(s, &entry.tenant, &claims.reservations);
                        if let Some(scope) = scope {
                            s.idempotency.insert(
                                scope.clone(),
                                IdempotencyRecord {
                                    scope: scope.clone(),
                                    payload_digest: entry.payload_digest.clone().unwrap_or_default(),
                                    status: IdempotencyStatus::InFlight,
                                    result: None,
                                    error_code: None,
                                    ledger_id: entry.id.clone(),
                                    created_at: now,
                                    expires_at: trunc(expires_at),
                                },
                            );
                        }
                        AttemptStart::Started
                    }
                },
            };
            // An unknown operation is the runtime's to reconcile before this call's row says
            // how it ended (see `Store::begin_attempt`).
            if !matches!(start, AttemptStart::Unknown(_)) {
                let row = attempt_row(entry, &start).into_owned();
                s.ledger.insert(row.id.clone(), trunc_entry(row));
            }
            Ok(start)
        })
    }

    async fn finish_attempt(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let status = status_after(finish)?;
        self.with(|s| finish_in(s, tenant, ledger_id, scope, finish, status, now))
    }

    async fn record_late_outcome(
        &self,
        tenant: &str,
        ledger_id: &str,
        scope: Option<&IdempotencyScope>,
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<LateOutcome, StoreError> {
        self.with(|s| {
            let row = s
                .ledger
                .get_mut(ledger_id)
                .filter(|e| e.tenant == tenant)
                .ok_or(StoreError::NotFound)?;
            let resolved = row.outcome;
            if !late_outcome_corrects(resolved, finish.outcome) {
                return Ok(LateOutcome::Kept(resolved.unwrap_or(Outcome::Attempting)));
            }
            row.outcome = Some(Outcome::Committed);
            row.attempts = row.attempts.max(finish.attempts);
            row.error_code = None;
            row.cost = finish.cost;
            row.updated_at = trunc(now);
            row.detail = Some(correction_note(ledger_id));
            s.notify(&Notice::correction(tenant, ledger_id, now));
            charge(s, tenant, &finish.charges);
            let mut key_retaken = false;
            if let Some(scope) = scope {
                match s.idempotency.get_mut(scope) {
                    Some(record) if record.ledger_id != ledger_id => key_retaken = true,
                    Some(record) => {
                        record.status = IdempotencyStatus::Committed;
                        record.result = finish.result.clone();
                        record.error_code = None;
                    }
                    None => {
                        let digest = s
                            .ledger
                            .get(ledger_id)
                            .and_then(|e| e.payload_digest.clone())
                            .unwrap_or_default();
                        s.idempotency.insert(
                            scope.clone(),
                            IdempotencyRecord {
                                scope: scope.clone(),
                                payload_digest: digest,
                                status: IdempotencyStatus::Committed,
                                result: finish.result.clone(),
                                error_code: None,
                                ledger_id: ledger_id.to_owned(),
                                created_at: trunc(now),
                                expires_at: trunc(now + LATE_RECORD_RETENTION),
                            },
                        );
                    }
                }
            }
            Ok(LateOutcome::Corrected { key_retaken })
        })
    }

    async fn record_attempt(
        &self,
        entry: &LedgerEntry,
        reservations: &[BudgetReservation],
        finish: &AttemptFinish,
        now: OffsetDateTime,
    ) -> Result<BudgetOutcome, StoreError> {
        let status = status_after(finish)?;
        self.with(|s| {
            if s.ledger.contains_key(&entry.id) {
                return Err(StoreError::Conflict(format!("ledger row {} exists", entry.id)));
            }
            if let Some(key) = budget_refusal(s, &entry.tenant, reservations) {
                let row = withheld_row(entry.clone(), &key, finish);
                s.notify(&Notice::budget(&row.tenant, &key, &row.id, now));
                s.ledger.insert(row.id.clone(), trunc_entry(row));
                return Ok(BudgetOutcome::Exhausted { key });
            }
            s.ledger.insert(entry.id.clone(), trunc_entry(entry.clone()));
            // Without a scope, `finish_in` changes nothing before its last check can fail:
            // removing the row undoes the whole operation (the budget is taken after it).
            finish_in(s, &entry.tenant, &entry.id, None, finish, status, now).inspect_err(|_| {
                s.ledger.remove(&entry.id);
            })?;
            budget_take(s, &entry.tenant, reservations);
            Ok(BudgetOutcome::Granted)
        })
    }

    async fn get_idempotency(
        &self,
        scope: &IdempotencyScope,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.with(|s| Ok(s.idempotency.get(scope).cloned()))
    }

    async fn create_approval(&self, a: &NewApproval) -> Result<(), StoreError> {
        self.with(|s| {
            if s.approvals.contains_key(&a.id) {
                return Err(StoreError::Conflict(format!("approval {} exists", a.id)));
            }
            let mut request = a.clone();
            request.created_at = trunc(request.created_at);
            request.expires_at = trunc(request.expires_at);
            s.enqueue(&a.requested_event())?;
            s.approvals
                .insert(a.id.clone(), ApprovalRequest::pending(request));
            Ok(())
        })
    }

    async fn get_approval(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        self.with(|s| {
            Ok(s.approvals
                .get(id)
                .filter(|a| a.request.tenant == tenant)
                .map(|a| a.clone().as_of(trunc(now))))
        })
    }

    async fn find_pending_approval(
        &self,
        tenant: &str,
        call: &ApprovalLookup,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        self.with(|s| {
            let mut found: Vec<&ApprovalRequest> = s
                .approvals
                .values()
                .filter(|a| {
                    of_call(a, tenant, call)
                        && a.status == ApprovalStatus::Pending
                        && ms(a.request.expires_at) > ms(call.now)
                })
                .collect();
            found.sort_by(|a, b| {
                (ms(a.request.created_at), &a.request.id).cmp(&(ms(b.request.created_at), &b.request.id))
            });
            Ok(found.first().map(|a| (*a).clone()))
        })
    }

    async fn find_rejected_approval(
        &self,
        tenant: &str,
        call: &ApprovalLookup,
        since: OffsetDateTime,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        self.with(|s| {
            let found = s
                .approvals
                .values()
                .filter(|a| {
                    of_call(a, tenant, call)
                        && a.status == ApprovalStatus::Rejected
                        && a.decided_at.is_some_and(|at| ms(at) >= ms(since))
                })
                .max_by(|a, b| {
                    (a.decided_at.map(ms), &a.request.id).cmp(&(b.decided_at.map(ms), &b.request.id))
                });
            Ok(found.cloned())
        })
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
        now: OffsetDateTime,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let now = trunc(now);
        self.with(|s| {
            let mut rows: Vec<ApprovalRequest> = s
                .approvals
                .values()
                .filter(|a| a.request.tenant == tenant)
                .map(|a| a.clone().as_of(now))
                .filter(|a| status.is_none_or(|st| a.status == st))
                .collect();
            rows.sort_by(|a, b| {
                (ms(a.request.created_at), &a.request.id).cmp(&(ms(b.request.created_at), &b.request.id))
            });
            rows.truncate(limit.clamp(1, 1000) as usize);
            Ok(rows)
        })
    }

    async fn page_approvals(
        &self,
        tenant: &str,
        filter: &ApprovalFilter,
        now: OffsetDateTime,
    ) -> Result<ApprovalPage, StoreError> {
        let limit = filter.limit.clamp(1, 500) as usize;
        let cursor = filter.cursor.as_deref().map(parse_ledger_cursor).transpose()?;
        let now = trunc(now);
        self.with(|s| {
            let mut rows: Vec<ApprovalRequest> = s
                .approvals
                .values()
                .filter(|a| a.request.tenant == tenant)
                .map(|a| a.clone().as_of(now))
                .filter(|a| filter.status.is_none_or(|st| a.status == st))
                .filter(|a| filter.tool.as_ref().is_none_or(|t| &a.request.tool == t))
                .filter(|a| filter.proposer.as_ref().is_none_or(|p| &a.request.proposer == p))
                .filter(|a| {
                    cursor.as_ref().is_none_or(|(at, id)| {
                        (ms(a.request.created_at), &a.request.id) < (i128::from(*at), id)
                    })
                })
                .collect();
            rows.sort_by(|a, b| {
                (ms(b.request.created_at), &b.request.id).cmp(&(ms(a.request.created_at), &a.request.id))
            });
            rows.truncate(limit + 1);
            Ok(approval_page(rows, limit))
        })
    }

    async fn count_approvals(
        &self,
        tenant: &str,
        status: ApprovalStatus,
        now: OffsetDateTime,
        at_most: u32,
    ) -> Result<u64, StoreError> {
        let now = trunc(now);
        self.with(|s| {
            Ok(s.approvals
                .values()
                .filter(|a| a.request.tenant == tenant && (*a).clone().as_of(now).status == status)
                .take(at_most as usize)
                .count() as u64)
        })
    }

    async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        reviewer: &str,
        verdict: Verdict,
        reason: Option<&str>,
        now: OffsetDateTime,
    ) -> Result<Result<ApprovalRequest, DecideRefusal>, StoreError> {
        self.with(|s| {
            let current = s.approvals.get_mut(id).filter(|a| a.request.tenant == tenant);
            if let Some(refusal) = review_refusal(current.as_deref(), reviewer, now) {
                return Ok(Err(refusal));
            }
            let Some(a) = current else {
                return Ok(Err(DecideRefusal::NotFound));
            };
            a.status = match verdict {
                Verdict::Approve => ApprovalStatus::Approved,
                Verdict::Reject => ApprovalStatus::Rejected,
            };
            if a.status == ApprovalStatus::Rejected {
                a.request.sealed_arguments = None;
            }
            a.reviewer = Some(reviewer.to_owned());
            a.reason = reason.map(str::to_owned);
            a.decided_at = Some(trunc(now));
            let decided = a.clone();
            s.enqueue(&approval_event(tenant, id, "approval.decided", now))?;
            Ok(Ok(decided))
        })
    }

    async fn supersede_approval(
        &self,
        tenant: &str,
        id: &str,
        by: &str,
        reviewer: &str,
        reason: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let now = trunc(now);
        self.with(|s| match s.approvals.get_mut(id) {
            Some(a)
                if a.request.tenant == tenant
                    && a.status == ApprovalStatus::Pending
                    && a.request.expires_at > now
                    && a.request.proposer != reviewer =>
            {
                a.status = ApprovalStatus::Rejected;
                a.request.sealed_arguments = None;
                a.superseded_by = Some(by.to_owned());
                a.reviewer = Some(reviewer.to_owned());
                a.reason = Some(reason.to_owned());
                a.decided_at = Some(now);
                s.enqueue(&approval_event(tenant, id, "approval.decided", now))?;
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn consume_approval(
        &self,
        tenant: &str,
        claim: &ApprovalClaim,
        now: OffsetDateTime,
    ) -> Result<ConsumeOutcome, StoreError> {
        self.with(|s| {
            if let Some(current) = approval_refused(s, tenant, claim, now) {
                return Ok(ConsumeOutcome::Refused(current));
            }
            Ok(ConsumeOutcome::Consumed(approval_take(s, claim, now)?))
        })
    }

    async fn reserve_budget(
        &self,
        tenant: &str,
        reservations: &[BudgetReservation],
    ) -> Result<BudgetOutcome, StoreError> {
        self.with(|s| {
            if let Some(key) = budget_refusal(s, tenant, reservations) {
                return Ok(BudgetOutcome::Exhausted { key });
            }
            budget_take(s, tenant, reservations);
            Ok(BudgetOutcome::Granted)
        })
    }

    async fn release_budget(
        &self,
        tenant: &str,
        reservations: &[BudgetReservation],
    ) -> Result<(), StoreError> {
        self.with(|s| {
            for r in reservations {
                if let Some(slot) = s.budgets.get_mut(tenant).and_then(|t| t.get_mut(&r.key)) {
                    slot.0 = slot.0.saturating_sub(r.amount);
                }
            }
            Ok(())
        })
    }

    async fn budget_used(&self, tenant: &str, key: &str) -> Result<u64, StoreError> {
        self.with(|s| {
            Ok(s.budgets
                .get(tenant)
                .and_then(|t| t.get(key))
                .map_or(0, |(u, _)| *u))
        })
    }

    async fn create_api_key(&self, k: &NewApiKey) -> Result<(), StoreError> {
        self.with(|s| {
            if s.keys.contains_key(&k.id) || s.keys.values().any(|e| e.key.key_hash == k.key_hash) {
                return Err(StoreError::Conflict("api key exists".into()));
            }
            let mut key = k.clone();
            key.created_at = trunc(key.created_at);
            s.keys.insert(
                k.id.clone(),
                ApiKeyRecord {
                    key,
                    revoked_at: None,
                },
            );
            Ok(())
        })
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        self.with(|s| Ok(s.keys.values().find(|k| k.key.key_hash == key_hash).cloned()))
    }

    async fn list_api_keys(&self, tenant: &str) -> Result<Vec<ApiKeyRecord>, StoreError> {
        self.with(|s| {
            let mut keys: Vec<ApiKeyRecord> = s
                .keys
                .values()
                .filter(|k| k.key.tenant == tenant)
                .cloned()
                .collect();
            keys.sort_by(|a, b| (ms(a.key.created_at), &a.key.id).cmp(&(ms(b.key.created_at), &b.key.id)));
            Ok(keys)
        })
    }

    async fn revoke_api_key(&self, tenant: &str, id: &str, at: OffsetDateTime) -> Result<bool, StoreError> {
        self.with(|s| {
            match s
                .keys
                .get_mut(id)
                .filter(|k| k.key.tenant == tenant && k.revoked_at.is_none())
            {
                Some(k) => {
                    k.revoked_at = Some(trunc(at));
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }

    async fn create_console_session(&self, c: &ConsoleSession) -> Result<(), StoreError> {
        self.with(|s| {
            if s.console.contains_key(&c.token_hash) {
                return Err(StoreError::Conflict("console session exists".into()));
            }
            let mut c = c.clone();
            c.created_at = trunc(c.created_at);
            c.expires_at = trunc(c.expires_at);
            s.console.insert(c.token_hash.clone(), c);
            Ok(())
        })
    }

    async fn get_console_session(
        &self,
        token_hash: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        self.with(|s| {
            Ok(s.console
                .get(token_hash)
                .filter(|c| c.kind == ConsoleSessionKind::Session && c.expires_at > now)
                .cloned())
        })
    }

    async fn take_console_link(
        &self,
        token_hash: &str,
        now: OffsetDateTime,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        self.with(|s| {
            let valid = s
                .console
                .get(token_hash)
                .is_some_and(|c| c.kind == ConsoleSessionKind::Link && c.expires_at > now);
            Ok(if valid { s.console.remove(token_hash) } else { None })
        })
    }

    async fn delete_console_session(&self, token_hash: &str) -> Result<bool, StoreError> {
        self.with(|s| Ok(s.console.remove(token_hash).is_some()))
    }

    async fn spend_token(
        &self,
        scope: &str,
        tenant: &str,
        id: &str,
        expires_at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        self.with(|s| {
            let key = (scope.to_owned(), tenant.to_owned(), id.to_owned());
            if s.tokens.contains_key(&key) {
                return Ok(false);
            }
            s.tokens.insert(key, trunc(expires_at));
            Ok(true)
        })
    }

    async fn create_task(&self, t: &TaskRecord) -> Result<(), StoreError> {
        self.with(|s| {
            let key = (t.tenant.clone(), t.id.clone());
            if s.tasks.contains_key(&key) {
                return Err(StoreError::Conflict("task exists".into()));
            }
            let mut t = t.clone();
            t.created_at = trunc(t.created_at);
            t.updated_at = trunc(t.updated_at);
            t.expires_at = trunc(t.expires_at);
            s.tasks.insert(key, t);
            Ok(())
        })
    }

    async fn get_task(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<TaskRecord>, StoreError> {
        self.with(|s| {
            Ok(s.tasks
                .get(&(tenant.to_owned(), id.to_owned()))
                .filter(|t| t.expires_at > now)
                .cloned())
        })
    }

    async fn end_task(
        &self,
        tenant: &str,
        id: &str,
        status: TaskStatus,
        result: &serde_json::Value,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        if !status.is_terminal() {
            return Err(StoreError::Invalid("a task ends with a terminal status".into()));
        }
        self.with(|s| match s.tasks.get_mut(&(tenant.to_owned(), id.to_owned())) {
            Some(t) if t.status == TaskStatus::Working => {
                t.status = status;
                t.result = Some(result.clone());
                t.updated_at = trunc(now);
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn create_webhook(&self, w: &WebhookEndpoint) -> Result<(), StoreError> {
        self.with(|s| {
            let key = (w.tenant.clone(), w.id.clone());
            if s.webhooks.contains_key(&key) {
                return Err(StoreError::Conflict("webhook endpoint exists".into()));
            }
            s.webhooks.insert(key, webhook_stored(w));
            Ok(())
        })
    }

    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookEndpoint>, StoreError> {
        self.with(|s| {
            let mut all: Vec<WebhookEndpoint> = s
                .webhooks
                .values()
                .filter(|w| w.tenant == tenant)
                .cloned()
                .collect();
            all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
            Ok(all)
        })
    }

    async fn get_webhook(&self, tenant: &str, id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
        self.with(|s| Ok(s.webhooks.get(&(tenant.to_owned(), id.to_owned())).cloned()))
    }

    async fn update_webhook(&self, w: &WebhookEndpoint) -> Result<bool, StoreError> {
        self.with(|s| match s.webhooks.get_mut(&(w.tenant.clone(), w.id.clone())) {
            Some(stored) => {
                let created_at = stored.created_at;
                *stored = webhook_stored(w);
                stored.created_at = created_at;
                Ok(true)
            }
            None => Ok(false),
        })
    }

    async fn record_webhook_attempt(&self, a: &WebhookAttempt) -> Result<(), StoreError> {
        self.with(|s| {
            if s.attempts
                .iter()
                .any(|x| x.message_id == a.message_id && x.attempt == a.attempt)
            {
                return Err(StoreError::Conflict("webhook attempt exists".into()));
            }
            let mut a = a.clone();
            a.at = trunc(a.at);
            s.attempts.push(a);
            Ok(())
        })
    }

    async fn list_webhook_attempts(
        &self,
        tenant: &str,
        message_id: Option<&str>,
        endpoint_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WebhookAttempt>, StoreError> {
        self.with(|s| {
            let mut found: Vec<WebhookAttempt> = s
                .attempts
                .iter()
                .filter(|a| {
                    a.tenant == tenant
                        && message_id.is_none_or(|m| a.message_id == m)
                        && endpoint_id.is_none_or(|e| a.endpoint_id == e)
                })
                .cloned()
                .collect();
            found.sort_by(|a, b| (b.at, &b.message_id, b.attempt).cmp(&(a.at, &a.message_id, a.attempt)));
            found.truncate(limit.clamp(1, 1000) as usize);
            Ok(found)
        })
    }

    async fn requeue_dead_job(
        &self,
        tenant: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        self.with(|s| match s.jobs.get_mut(id) {
            Some(j) if j.job.tenant == tenant && j.status == JobStatus::Dead => {
                j.status = JobStatus::Pending;
                j.attempts = 0;
                j.job.run_at = trunc(now);
                j.locked_by = None;
                j.locked_until = None;
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn has_api_keys(&self) -> Result<bool, StoreError> {
        self.with(|s| Ok(!s.keys.is_empty()))
    }

    async fn create_inbound_source(&self, i: &InboundSource) -> Result<(), StoreError> {
        self.with(|s| {
            if s.inbound_sources.contains_key(&i.id) {
                return Err(StoreError::Conflict("inbound source exists".into()));
            }
            s.inbound_sources.insert(i.id.clone(), inbound_source_stored(i));
            Ok(())
        })
    }

    async fn list_inbound_sources(&self, tenant: &str) -> Result<Vec<InboundSource>, StoreError> {
        self.with(|s| {
            let mut all: Vec<InboundSource> = s
                .inbound_sources
                .values()
                .filter(|i| i.tenant == tenant)
                .cloned()
                .collect();
            all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
            Ok(all)
        })
    }

    async fn get_inbound_source(&self, id: &str) -> Result<Option<InboundSource>, StoreError> {
        self.with(|s| Ok(s.inbound_sources.get(id).cloned()))
    }

    async fn update_inbound_source(&self, i: &InboundSource) -> Result<bool, StoreError> {
        self.with(|s| match s.inbound_sources.get_mut(&i.id) {
            Some(stored) if stored.tenant == i.tenant => {
                let i = inbound_source_stored(i);
                stored.secret = i.secret;
                stored.previous_secret = i.previous_secret;
                stored.previous_until = i.previous_until;
                stored.action = i.action;
                stored.description = i.description;
                stored.enabled = i.enabled;
                stored.updated_at = i.updated_at;
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn note_inbound_refusal(
        &self,
        id: &str,
        reason: &str,
        at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        self.with(|s| {
            if let Some(stored) = s.inbound_sources.get_mut(id) {
                stored.refusals += 1;
                stored.last_refusal = Some(reason.to_owned());
                stored.last_refusal_at = Some(trunc(at));
            }
            Ok(())
        })
    }

    async fn accept_inbound(&self, e: &InboundEvent, job: &NewJob) -> Result<bool, StoreError> {
        self.with(|s| {
            let key = (e.source_id.clone(), e.event_id.clone());
            if let Some(stored) = s.inbound_events.get_mut(&key) {
                stored.deliveries = stored.deliveries.saturating_add(1);
                return Ok(false);
            }
            s.enqueue(job)?;
            let mut stored = e.clone();
            stored.deliveries = stored.deliveries.max(1);
            stored.received_at = trunc(e.received_at);
            stored.updated_at = stored.received_at;
            s.inbound_events.insert(key, stored);
            Ok(true)
        })
    }

    async fn finish_inbound(
        &self,
        tenant: &str,
        source_id: &str,
        event_id: &str,
        status: InboundStatus,
        detail: &serde_json::Value,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        if status == InboundStatus::Queued {
            return Err(StoreError::Invalid(
                "an inbound event finishes with another status".into(),
            ));
        }
        self.with(|s| {
            match s
                .inbound_events
                .get_mut(&(source_id.to_owned(), event_id.to_owned()))
            {
                Some(e) if e.tenant == tenant && e.status == InboundStatus::Queued => {
                    e.status = status;
                    e.detail = Some(detail.clone());
                    e.updated_at = trunc(now);
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }

    async fn get_inbound_event(
        &self,
        tenant: &str,
        source_id: &str,
        event_id: &str,
    ) -> Result<Option<InboundEvent>, StoreError> {
        self.with(|s| {
            Ok(s.inbound_events
                .get(&(source_id.to_owned(), event_id.to_owned()))
                .filter(|e| e.tenant == tenant)
                .cloned())
        })
    }

    async fn list_inbound_events(
        &self,
        tenant: &str,
        source_id: &str,
        limit: u32,
    ) -> Result<Vec<InboundEvent>, StoreError> {
        self.with(|s| {
            let mut all: Vec<InboundEvent> = s
                .inbound_events
                .values()
                .filter(|e| e.tenant == tenant && e.source_id == source_id)
                .cloned()
                .collect();
            all.sort_by(|a, b| (b.received_at, &b.event_id).cmp(&(a.received_at, &a.event_id)));
            all.truncate(usize::try_from(limit.clamp(1, 1000)).unwrap_or(1000));
            Ok(all)
        })
    }

    async fn enqueue_job(&self, j: &NewJob) -> Result<(), StoreError> {
        self.with(|s| s.enqueue(j))
    }

    async fn claim_jobs(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        lease: Duration,
        now: OffsetDateTime,
    ) -> Result<Vec<Job>, StoreError> {
        let until = trunc(now + lease);
        self.with(|s| {
            let mut due: Vec<(i128, String)> = s
                .jobs
                .values()
                .filter(|j| j.job.kind == kind)
                .filter(|j| match j.status {
                    JobStatus::Pending => ms(j.job.run_at) <= ms(now),
                    JobStatus::Running => j.locked_until.is_some_and(|t| ms(t) <= ms(now)),
                    _ => false,
                })
                .map(|j| (ms(j.job.run_at), j.job.id.clone()))
                .collect();
            due.sort();
            due.truncate(limit.clamp(1, 1000) as usize);
            let mut out = Vec::new();
            for (_, id) in due {
                if let Some(j) = s.jobs.get_mut(&id) {
                    j.status = JobStatus::Running;
                    j.locked_by = Some(worker.to_owned());
                    j.locked_until = Some(until);
                    j.attempts += 1;
                    out.push(j.clone());
                }
            }
            Ok(out)
        })
    }

    async fn renew_job(&self, id: &str, worker: &str, until: OffsetDateTime) -> Result<bool, StoreError> {
        self.with(|s| {
            match s
                .jobs
                .get_mut(id)
                .filter(|j| j.status == JobStatus::Running && j.locked_by.as_deref() == Some(worker))
            {
                Some(j) => {
                    j.locked_until = Some(trunc(until));
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }

    async fn complete_job(
        &self,
        id: &str,
        worker: &str,
        completion: &JobCompletion,
        _now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        self.with(|s| {
            let Some(j) = s
                .jobs
                .get_mut(id)
                .filter(|j| j.status == JobStatus::Running && j.locked_by.as_deref() == Some(worker))
            else {
                return Ok(false);
            };
            match completion {
                JobCompletion::Done => j.status = JobStatus::Done,
                JobCompletion::Retry { run_at, error } => {
                    j.status = if j.attempts >= j.job.max_attempts {
                        JobStatus::Dead
                    } else {
                        JobStatus::Pending
                    };
                    j.job.run_at = trunc(*run_at);
                    j.last_error = Some(error.clone());
                }
                JobCompletion::Dead { error } => {
                    j.status = JobStatus::Dead;
                    j.last_error = Some(error.clone());
                }
            }
            j.locked_by = None;
            j.locked_until = None;
            Ok(true)
        })
    }

    async fn list_dead_jobs(&self, tenant: &str, limit: u32) -> Result<Vec<Job>, StoreError> {
        self.with(|s| {
            Ok(s.jobs
                .values()
                .filter(|j| j.job.tenant == tenant && j.status == JobStatus::Dead)
                .take(limit.clamp(1, 1000) as usize)
                .cloned()
                .collect())
        })
    }

    async fn purge_expired(&self, now: OffsetDateTime) -> Result<PurgeCounts, StoreError> {
        self.with(|s| {
            let now_ms = ms(now);
            let before = s.idempotency.len();
            s.idempotency.retain(|_, r| {
                !(ms(r.expires_at) <= now_ms
                    && matches!(r.status, IdempotencyStatus::Committed | IdempotencyStatus::Failed))
            });
            let idempotency = (before - s.idempotency.len()) as u64;
            let mut budget_counters = 0;
            for counters in s.budgets.values_mut() {
                let before = counters.len();
                counters.retain(|_, (_, exp)| ms(*exp) > now_ms);
                budget_counters += (before - counters.len()) as u64;
            }
            let mut expired = Vec::new();
            for a in s.approvals.values_mut() {
                if matches!(a.status, ApprovalStatus::Pending | ApprovalStatus::Approved)
                    && ms(a.request.expires_at) <= now_ms
                {
                    a.status = ApprovalStatus::Expired;
                    a.request.sealed_arguments = None;
                    expired.push((a.request.tenant.clone(), a.request.id.clone()));
                }
            }
            let approvals_expired = expired.len() as u64;
            for (tenant, id) in &expired {
                s.enqueue(&approval_event(tenant, id, "approval.expired", now))?;
            }
            let sessions = s.console.len();
            s.console.retain(|_, c| ms(c.expires_at) > now_ms);
            let held = s.tokens.len() + s.tasks.len();
            s.tokens.retain(|_, at| ms(*at) > now_ms);
            s.tasks.retain(|_, t| ms(t.expires_at) > now_ms);
            Ok(PurgeCounts {
                idempotency,
                budget_counters,
                approvals_expired,
                console_sessions: (sessions - s.console.len()) as u64,
                tokens_and_tasks: (held - s.tokens.len() - s.tasks.len()) as u64,
                done_jobs: {
                    let before = s.jobs.len();
                    let horizon = now_ms - DONE_JOB_RETENTION.whole_milliseconds();
                    s.jobs
                        .retain(|_, j| !(j.status == JobStatus::Done && ms(j.job.run_at) <= horizon));
                    (before - s.jobs.len()) as u64
                },
                inbound_events: {
                    let before = s.inbound_events.len();
                    let horizon = now_ms - INBOUND_RETENTION.whole_milliseconds();
                    s.inbound_events
                        .retain(|_, e| !(e.status != InboundStatus::Queued && ms(e.received_at) <= horizon));
                    (before - s.inbound_events.len()) as u64
                },
            })
        })
    }
}

/// A source as the SQL backends read it back (timestamps at millisecond precision).
fn inbound_source_stored(i: &InboundSource) -> InboundSource {
    let mut i = i.clone();
    i.created_at = trunc(i.created_at);
    i.updated_at = trunc(i.updated_at);
    i.previous_until = i.previous_until.map(trunc);
    i.last_refusal_at = i.last_refusal_at.map(trunc);
    i
}

/// An endpoint as the SQL backends read it back (timestamps at millisecond precision).
fn webhook_stored(w: &WebhookEndpoint) -> WebhookEndpoint {
    let mut w = w.clone();
    w.created_at = trunc(w.created_at);
    w.updated_at = trunc(w.updated_at);
    w.previous_until = w.previous_until.map(trunc);
    w
}
