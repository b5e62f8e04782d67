//! Reconciliation: resolving calls whose outcome is `unknown`, and `attempting` rows a crash
//! left behind, by asking the adapter what became of the operation (PRODUCT §4, §5).
//!
//! - committed → `reconciled_committed`, the result stored for replays, the cost charged; more
//!   than one effect is a confirmed duplicate, counted and written into the ledger row;
//! - not committed → `reconciled_not_committed`, and the idempotency key is free again;
//! - the adapter cannot tell → the row is (or stays) `unknown`, for the next pass.
//!
//! Three callers: `execute` (before a new attempt on an unknown operation), the background
//! reconciler, and `warrant reconcile`.
//!
//! **Scheduled per row, in the store.** A pass claims the rows that are due
//! ([`warrant_core::store::Store::claim_unresolved`]: never-scheduled rows `stale_after` old,
//! or rows whose next attempt time has come), earliest due first, under a lease, so any node
//! can run passes and two never ask about the same row at once. A row an inquiry could not
//! resolve is rescheduled with its own backoff ([`next_inquiry_in`]: 15 s doubling to 1 h) and
//! what the inquiry answered, so rows that cannot be resolved never hide the rows behind them.
//! Rows still unresolved past [`ReconcileSchedule::overdue_after`] (1 h) are marked on the
//! ledger as needing an operator, logged (WARN) and counted, once per row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use warrant_core::records::{self, AttemptFinish, LedgerEntry};
use warrant_core::store::StoreError;
use warrant_core::{Contract, Effect};

use crate::adapter::{Adapter, Inquiry, Reconciled};
use crate::execute::{Runtime, elapsed_ms, metric, operation_id, scope_of, spend};

/// Rows found unresolved past [`ReconcileSchedule::overdue_after`] (each counted once).
pub const OVERDUE_TOTAL: &str = "warrant_unresolved_overdue_total";
/// Unresolved rows currently past [`ReconcileSchedule::overdue_after`] (a gauge).
pub const OVERDUE: &str = "warrant_unresolved_overdue";

/// How reconciliation schedules rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileSchedule {
    /// The wait after the first inquiry that could not tell (doubled after each further one).
    pub backoff_base: Duration,
    /// The longest wait between two inquiries about one row.
    pub backoff_cap: Duration,
    /// How long a claimed row is held by the pass that claimed it (a pass that dies leaves
    /// its rows due again after this).
    pub lease: Duration,
    /// How long a row may stay unresolved (since its call) before it is marked as needing an
    /// operator.
    pub overdue_after: Duration,
    /// An operator's manual pass (`warrant reconcile`): every unresolved row older than the
    /// cutoff is asked now, whatever its next inquiry time (rows it cannot resolve are then
    /// rescheduled as usual).
    pub ask_all_now: bool,
}

impl Default for ReconcileSchedule {
    fn default() -> Self {
        ReconcileSchedule {
            backoff_base: Duration::from_secs(15),
            backoff_cap: Duration::from_secs(60 * 60),
            lease: Duration::from_secs(5 * 60),
            overdue_after: Duration::from_secs(60 * 60),
            ask_all_now: false,
        }
    }
}

/// The wait before the next inquiry about a row that `attempts` inquiries left unresolved:
/// `base · 2^attempts`, at most `cap`.
pub fn next_inquiry_in(attempts: u32, base: Duration, cap: Duration) -> Duration {
    let factor = 1_u32.checked_shl(attempts.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(cap).min(cap)
}

/// A row a pass left unresolved, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The ledger row.
    pub ledger_id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its tool.
    pub tool: String,
    /// What the inquiry answered (no status endpoint, the inquiry failed with …).
    pub why: String,
    /// Inquiries that left it unresolved, this one included.
    pub attempts: u32,
    /// When it is asked about next.
    pub next_at: OffsetDateTime,
}

/// What one reconciliation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// The totals.
    pub totals: ReconcileReport,
    /// Each row left unresolved, with the reason.
    pub unresolved: Vec<Unresolved>,
    /// Rows this pass found unresolved past the threshold for the first time.
    pub newly_overdue: u32,
    /// Unresolved rows past the threshold, in total.
    pub overdue: u64,
    /// Rows claimed but not asked about: too little of the pass's lease was left for their
    /// inquiry. They fall due again when the lease ends.
    pub left: u32,
}

/// Time kept in a reconciliation lease beyond one inquiry's timeout, for the store's writes
/// around it (the claim's answer, the row's resolution or its rescheduling).
const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// What reconciling one row found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened (`effects` times; more than one is a confirmed duplicate).
    Committed {
        /// How many times.
        effects: u32,
    },
    /// The effect did not happen; the key is free.
    NotCommitted,
    /// The adapter could not tell; the row is `unknown`.
    StillUnknown,
    /// Another node (or an earlier pass) resolved it first.
    AlreadyResolved,
    /// The row's contract or adapter cannot be loaded; the row is `unknown`.
    Unreachable,
}

/// Totals of a reconciliation pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Rows examined.
    pub examined: u32,
    /// Found committed.
    pub committed: u32,
    /// Found not committed.
    pub not_committed: u32,
    /// Still unknown (including unreachable adapters).
    pub unknown: u32,
    /// Found committed more than once.
    pub duplicates: u32,
}

impl Runtime {
    /// Reconciles one ledger row whose outcome is `attempting` or `unknown`.
    ///
    /// # Errors
    /// A store failure.
    pub async fn reconcile(&self, row: &LedgerEntry) -> Result<Resolution, StoreError> {
        Ok(self.reconcile_explained(row).await?.0)
    }

    /// [`Runtime::reconcile`], with what the inquiry answered when the row stays unresolved.
    ///
    /// # Errors
    /// A store failure.
    pub async fn reconcile_explained(
        &self,
        row: &LedgerEntry,
    ) -> Result<(Resolution, Option<String>), StoreError> {
        let now = self.env.now();
        let contract = match row.contract_id.as_deref() {
            Some(id) => self.registry.by_id(&row.tenant, id, now).await?,
            None => None,
        };
        let Some(contract) = contract else {
            let why = "the contract is not registered";
            let resolution = self.mark_unknown(row, &format!("reconciliation: {why}")).await?;
            return Ok((resolution, Some(why.to_owned())));
        };
        match self.adapters.for_contract(&contract) {
            Ok(adapter) => self.reconcile_with_why(row, &contract, adapter.as_ref()).await,
            Err(e) => {
                let why = format!("the adapter cannot be built: {e}");
                let resolution = self.mark_unknown(row, &format!("reconciliation: {e}")).await?;
                Ok((resolution, Some(why)))
            }
        }
    }

    /// Reconciles one row with an adapter already at hand.
    pub(crate) async fn reconcile_with(
        &self,
        row: &LedgerEntry,
        contract: &Arc<Contract>,
        adapter: &dyn Adapter,
    ) -> Result<Resolution, StoreError> {
        Ok(self.reconcile_with_why(row, contract, adapter).await?.0)
    }

    /// [`Runtime::reconcile_with`], with what the inquiry answered when the row stays
    /// unresolved.
    async fn reconcile_with_why(
        &self,
        row: &LedgerEntry,
        contract: &Arc<Contract>,
        adapter: &dyn Adapter,
    ) -> Result<(Resolution, Option<String>), StoreError> {
        if row.outcome.is_none_or(records::Outcome::is_final) {
            return Ok((Resolution::AlreadyResolved, None));
        }
        let started = Instant::now();
        let scope = scope_of(row);
        let operation = operation_id(row, scope.as_ref());
        let inquiry = Inquiry {
            operation_id: &operation,
            contract,
            tenant: &row.tenant,
            timeout: self.settings.inquiry_timeout,
        };
        let (answer, why) = if contract.effect() == Effect::Read {
            // A read has no effect to find.
            (Reconciled::NotCommitted, None)
        } else {
            self.ask(adapter, &inquiry, &row.id).await
        };
        let now = self.env.now();
        let (finish, resolution) = match answer {
            Reconciled::Committed { result, effects } => {
                let effects = effects.max(1);
                let result = result.filter(|r| contract.output_schema().is_valid(r));
                let mut detail = format!("reconciled: committed ({})", operation.as_str());
                if effects > 1 {
                    metrics::counter!(metric::DUPLICATES).increment(u64::from(effects - 1));
                    detail = format!(
                        "reconciled: confirmed duplicate effect, committed {effects} times ({})",
                        operation.as_str()
                    );
                    tracing::error!(
                        ledger = row.id,
                        operation = operation.as_str(),
                        effects,
                        "duplicate effect"
                    );
                }
                let cost = contract.cost_per_call();
                (
                    AttemptFinish {
                        outcome: records::Outcome::ReconciledCommitted,
                        attempts: row.attempts.max(1),
                        error_code: None,
                        result,
                        latency_ms: row.latency_ms.unwrap_or(0),
                        cost,
                        detail: Some(detail),
                        charges: spend(row, cost, now),
                    },
                    Resolution::Committed { effects },
                )
            }
            Reconciled::NotCommitted => (
                AttemptFinish {
                    outcome: records::Outcome::ReconciledNotCommitted,
                    attempts: row.attempts,
                    error_code: row.error_code.clone(),
                    result: None,
                    latency_ms: row.latency_ms.unwrap_or(0),
                    cost: 0,
                    detail: Some(format!("reconciled: no effect ({})", operation.as_str())),
                    charges: Vec::new(),
                },
                Resolution::NotCommitted,
            ),
            Reconciled::Unknown => {
                let why = why.unwrap_or_else(|| cannot_tell(contract));
                let resolution = self
                    .mark_unknown(
                        row,
                        &format!("reconciliation could not tell ({}): {why}", operation.as_str()),
                    )
                    .await?;
                return Ok((resolution, Some(why)));
            }
        };
        let label = match resolution {
            Resolution::Committed { .. } => "committed",
            _ => "not_committed",
        };
        tracing::info!(
            ledger = row.id,
            operation = operation.as_str(),
            result = label,
            ms = elapsed_ms(started),
            "reconciled"
        );
        match self
            .store
            .finish_attempt(&row.tenant, &row.id, scope.as_ref(), &finish, now)
            .await
        {
            Ok(()) => {
                metrics::counter!(metric::RECONCILIATIONS, "result" => label).increment(1);
                Ok((resolution, None))
            }
            // Someone else finished it between our read and our write.
            Err(StoreError::Conflict(_)) => Ok((Resolution::AlreadyResolved, None)),
            Err(e) => Err(e),
        }
    }

    /// The adapter's answer, and when it is "unknown" because the inquiry failed, why.
    async fn ask(
        &self,
        adapter: &dyn Adapter,
        inquiry: &Inquiry<'_>,
        ledger: &str,
    ) -> (Reconciled, Option<String>) {
        match tokio::time::timeout(self.settings.inquiry_timeout, adapter.reconcile(inquiry)).await {
            Ok(Ok(answer)) => (answer, None),
            Ok(Err(failure)) => {
                tracing::warn!(ledger, operation = inquiry.operation_id.as_str(), %failure, "reconciliation failed");
                (
                    Reconciled::Unknown,
                    Some(format!("the inquiry failed: {failure}")),
                )
            }
            Err(_) => (
                Reconciled::Unknown,
                Some(format!(
                    "the inquiry took longer than {} ms",
                    self.settings.inquiry_timeout.as_millis()
                )),
            ),
        }
    }

    /// Leaves an `attempting` row `unknown` (so it is visibly unresolved, not in progress);
    /// an `unknown` row stays as it is. A row marked overdue keeps its note before the reason
    /// (`an_abandoned_row_marked_overdue_keeps_its_note`).
    async fn mark_unknown(&self, row: &LedgerEntry, why: &str) -> Result<Resolution, StoreError> {
        metrics::counter!(metric::RECONCILIATIONS, "result" => "unknown").increment(1);
        if row.outcome != Some(records::Outcome::Attempting) {
            return Ok(Resolution::StillUnknown);
        }
        metrics::counter!(metric::UNKNOWN).increment(1);
        let finish = AttemptFinish {
            outcome: records::Outcome::Unknown,
            attempts: row.attempts,
            error_code: row.error_code.clone(),
            result: None,
            latency_ms: row.latency_ms.unwrap_or(0),
            cost: 0,
            detail: Some(after_overdue_note(row.detail.as_deref(), why)),
            charges: Vec::new(),
        };
        match self
            .store
            .finish_attempt(
                &row.tenant,
                &row.id,
                scope_of(row).as_ref(),
                &finish,
                self.env.now(),
            )
            .await
        {
            Ok(()) => Ok(Resolution::StillUnknown),
            Err(StoreError::Conflict(_)) => Ok(Resolution::AlreadyResolved),
            Err(e) => Err(e),
        }
    }

    /// Reconciles the unresolved rows that are due (never-scheduled rows untouched since
    /// `older_than`, and rows whose next attempt has come), up to `limit`, on the default
    /// [`ReconcileSchedule`].
    ///
    /// # Errors
    /// A store failure (rows already resolved stay resolved).
    pub async fn reconcile_older_than(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
    ) -> Result<ReconcileReport, StoreError> {
        Ok(self
            .reconcile_pass(older_than, limit, &ReconcileSchedule::default())
            .await?
            .totals)
    }

    /// One reconciliation pass: marks the rows unresolved past `schedule.overdue_after`
    /// (alerting once per row), claims up to `limit` due rows (see
    /// [`Runtime::reconcile_older_than`]) under a lease, asks about each, and reschedules
    /// the ones that stay unresolved with their backoff and the reason.
    ///
    /// # Errors
    /// A store failure (rows already resolved stay resolved; claimed rows fall due again when
    /// their lease ends).
    pub async fn reconcile_pass(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
        schedule: &ReconcileSchedule,
    ) -> Result<PassReport, StoreError> {
        let mut report = PassReport::default();
        let now = self.env.now();
        self.flag_overdue(now, schedule, &mut report).await?;
        // One worker id per pass: the lease is only needed between claim and reschedule.
        let worker = self.env.new_id("rcn");
        // A manual pass claims as if every scheduled inquiry were due (each row it cannot
        // resolve is rescheduled from the real time below) — but never a row another worker
        // holds under a live lease: the store leaves those to their holder.
        let scheduled_by = if schedule.ask_all_now {
            now + schedule.backoff_cap + schedule.lease
        } else {
            now
        };
        let rows = self
            .store
            .claim_unresolved(&worker, now, scheduled_by, older_than, limit, schedule.lease)
            .await?;
        // The rows are this pass's only while its lease lasts: a row is asked about only with
        // time left in the lease for its whole inquiry, so no other worker, finding the lease
        // ended, asks about it at the same time. The rows left fall due again when the lease
        // ends, for whichever worker claims them first.
        let lease_ends = now + schedule.lease;
        let inquiry = self.settings.inquiry_timeout + LEASE_MARGIN;
        for claimed in rows {
            if self.env.now() + inquiry > lease_ends {
                report.left = report.left.saturating_add(1);
                continue;
            }
            let row = &claimed.entry;
            report.totals.examined += 1;
            // A row whose inquiry fails in the store (a row that cannot be read back, a write
            // refused) is rescheduled like one that stays unknown, with the failure as its
            // note: the rows after it in this pass are still asked about.
            let (resolution, why) = match self.reconcile_explained(row).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(ledger_id = %row.id, error = %e, "reconciliation: the inquiry failed in the store");
                    (
                        Resolution::StillUnknown,
                        Some(format!("the inquiry failed in the store: {e}")),
                    )
                }
            };
            match resolution {
                Resolution::Committed { effects } => {
                    report.totals.committed += 1;
                    if effects > 1 {
                        report.totals.duplicates += 1;
                    }
                }
                Resolution::NotCommitted => report.totals.not_committed += 1,
                Resolution::StillUnknown | Resolution::Unreachable => {
                    report.totals.unknown += 1;
                    let why = why.unwrap_or_else(|| "the adapter could not tell".to_owned());
                    let wait = next_inquiry_in(
                        claimed.reconcile_attempts,
                        schedule.backoff_base,
                        schedule.backoff_cap,
                    );
                    let next_at = self.env.now() + wait;
                    self.store
                        .reschedule_unresolved(&row.tenant, &row.id, &worker, next_at, &why)
                        .await?;
                    report.unresolved.push(Unresolved {
                        ledger_id: row.id.clone(),
                        tenant: row.tenant.clone(),
                        tool: row.tool.clone(),
                        why,
                        attempts: claimed.reconcile_attempts.saturating_add(1),
                        next_at,
                    });
                }
                Resolution::AlreadyResolved => {}
            }
        }
        Ok(report)
    }

    /// Marks rows unresolved past the threshold: a note on each row, a WARN line and a count,
    /// once per row; the gauge of how many there are.
    async fn flag_overdue(
        &self,
        now: OffsetDateTime,
        schedule: &ReconcileSchedule,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        let threshold = time::Duration::try_from(schedule.overdue_after).unwrap_or(time::Duration::MAX);
        let Some(created_before) = now.checked_sub(threshold) else {
            return Ok(());
        };
        let note = format!(
            "{OVERDUE_NOTE_START}: unresolved for more than {}; {OVERDUE_NOTE_END}",
            human(schedule.overdue_after)
        );
        let sweep = self.store.mark_overdue(created_before, now, &note, 1000).await?;
        for row in &sweep.newly {
            metrics::counter!(OVERDUE_TOTAL).increment(1);
            tracing::warn!(
                ledger = row.id,
                tenant = row.tenant,
                tool = row.tool,
                outcome = row.outcome.map(records::Outcome::as_str),
                "a call's outcome is still unresolved past the alert threshold; it needs an operator"
            );
        }
        metrics::gauge!(OVERDUE).set(sweep.overdue as f64);
        report.newly_overdue = u32::try_from(sweep.newly.len()).unwrap_or(u32::MAX);
        report.overdue = sweep.overdue;
        Ok(())
    }

    /// One pass of the background reconciler: rows older than `stale_after`, on the default
    /// [`ReconcileSchedule`].
    ///
    /// # Errors
    /// A store failure.
    pub async fn reconcile_stale(&self, limit: u32) -> Result<ReconcileReport, StoreError> {
        Ok(self
            .reconcile_stale_with(limit, &ReconcileSchedule::default())
            .await?
            .totals)
    }

    /// [`Runtime::reconcile_stale`] on `schedule`.
    ///
    /// # Errors
    /// A store failure.
    pub async fn reconcile_stale_with(
        &self,
        limit: u32,
        schedule: &ReconcileSchedule,
    ) -> Result<PassReport, StoreError> {
        let stale = time::Duration::try_from(self.settings.stale_after).unwrap_or(time::Duration::MAX);
        let now = self.env.now();
        let older_than = now.checked_sub(stale).unwrap_or(now);
        self.reconcile_pass(older_than, limit, schedule).await
    }
}

/// Why an adapter that answered "unknown" could not tell: whether its binding names a status
/// endpoint at all (`status_url` for `http` and `send_email`, `status` for `command`).
fn cannot_tell(contract: &Contract) -> String {
    let Some(binding) = contract.adapter() else {
        return "the contract has no adapter binding".to_owned();
    };
    let kind = binding.kind();
    let field = match kind {
        "http" | "send_email" => "status_url",
        "command" => "status",
        _ => return format!("the `{kind}` adapter could not tell"),
    };
    if binding.document().get(field).is_some() {
        format!("the status endpoint (`{field}`) could not tell")
    } else {
        format!("no status endpoint: the `{kind}` binding has no `{field}`, so no one can be asked")
    }
}

/// A duration as an operator writes it (`1h`, `30m`, `45s`).
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs > 0 && secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs > 0 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// Runs [`Runtime::reconcile_stale`] every `interval` until the handle is aborted.
pub fn spawn_reconciler(runtime: Runtime, interval: Duration) -> tokio::task::JoinHandle<()> {
    spawn_reconciler_with(runtime, interval, ReconcileSchedule::default())
}

/// Runs [`Runtime::reconcile_stale_with`] on `schedule` every `interval` until the handle is
/// aborted.
pub fn spawn_reconciler_with(
    runtime: Runtime,
    interval: Duration,
    schedule: ReconcileSchedule,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A failed pass is retried on the next tick; rows stay unresolved meanwhile.
            if let Err(e) = runtime.reconcile_stale_with(100, &schedule).await {
                tracing::warn!(error = %e, "reconciliation pass failed");
            }
        }
    })
}

/// How the note [`Runtime::reconcile_pass`] puts before an overdue row's detail begins, and
/// how it ends (the detail it was put before follows, after `"; "`).
const OVERDUE_NOTE_START: &str = "needs an operator";
const OVERDUE_NOTE_END: &str = "reconciliation keeps asking";

/// A row's new detail `why`, after the overdue note its `current` detail begins with, if any:
/// the ledger keeps saying the row needs an operator.
fn after_overdue_note(current: Option<&str>, why: &str) -> String {
    let note = current
        .filter(|d| d.starts_with(OVERDUE_NOTE_START))
        .and_then(|d| {
            d.find(OVERDUE_NOTE_END)
                .and_then(|at| d.get(..at + OVERDUE_NOTE_END.len()))
        });
    match note {
        Some(note) => format!("{note}; {why}"),
        None => why.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_the_base_up_to_the_cap() {
        let (base, cap) = (Duration::from_secs(15), Duration::from_secs(3600));
        let waits: Vec<u64> = (0..10).map(|n| next_inquiry_in(n, base, cap).as_secs()).collect();
        assert_eq!(waits, [15, 30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(next_inquiry_in(u32::MAX, base, cap), cap);
        assert_eq!(next_inquiry_in(40, Duration::MAX, cap), cap);
    }

    #[test]
    fn durations_read_as_an_operator_writes_them() {
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(1800)), "30m");
        assert_eq!(human(Duration::from_secs(45)), "45s");
    }
}
