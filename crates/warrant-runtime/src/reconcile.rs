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

use std::sync::Arc;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use warrant_core::records::{self, AttemptFinish, LedgerEntry};
use warrant_core::store::StoreError;
use warrant_core::{Contract, Effect};

use crate::adapter::{Adapter, Inquiry, Reconciled};
use crate::execute::{Runtime, elapsed_ms, metric, operation_id, scope_of, spend};

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
        let now = self.env.now();
        let contract = match row.contract_id.as_deref() {
            Some(id) => self.registry.by_id(&row.tenant, id, now).await?,
            None => None,
        };
        let Some(contract) = contract else {
            return self
                .mark_unknown(row, "reconciliation: the contract is not registered")
                .await;
        };
        match self.adapters.for_contract(&contract) {
            Ok(adapter) => self.reconcile_with(row, &contract, adapter.as_ref()).await,
            Err(e) => self.mark_unknown(row, &format!("reconciliation: {e}")).await,
        }
    }

    /// Reconciles one row with an adapter already at hand.
    pub(crate) async fn reconcile_with(
        &self,
        row: &LedgerEntry,
        contract: &Arc<Contract>,
        adapter: &dyn Adapter,
    ) -> Result<Resolution, StoreError> {
        if row.outcome.is_none_or(records::Outcome::is_final) {
            return Ok(Resolution::AlreadyResolved);
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
        let answer = if contract.effect() == Effect::Read {
            // A read has no effect to find.
            Reconciled::NotCommitted
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
                return self
                    .mark_unknown(
                        row,
                        &format!("reconciliation could not tell ({})", operation.as_str()),
                    )
                    .await;
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
                Ok(resolution)
            }
            // Someone else finished it between our read and our write.
            Err(StoreError::Conflict(_)) => Ok(Resolution::AlreadyResolved),
            Err(e) => Err(e),
        }
    }

    async fn ask(&self, adapter: &dyn Adapter, inquiry: &Inquiry<'_>, ledger: &str) -> Reconciled {
        match tokio::time::timeout(self.settings.inquiry_timeout, adapter.reconcile(inquiry)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(failure)) => {
                tracing::warn!(ledger, operation = inquiry.operation_id.as_str(), %failure, "reconciliation failed");
                Reconciled::Unknown
            }
            Err(_) => Reconciled::Unknown,
        }
    }

    /// Leaves an `attempting` row `unknown` (so it is visibly unresolved, not in progress);
    /// an `unknown` row stays as it is.
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
            detail: Some(why.to_owned()),
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

    /// Reconciles every unresolved row untouched since `older_than` (up to `limit`).
    ///
    /// # Errors
    /// A store failure (rows already resolved stay resolved).
    pub async fn reconcile_older_than(
        &self,
        older_than: OffsetDateTime,
        limit: u32,
    ) -> Result<ReconcileReport, StoreError> {
        let rows = self.store.list_unresolved(older_than, limit).await?;
        let mut report = ReconcileReport::default();
        for row in rows {
            report.examined += 1;
            match self.reconcile(&row).await? {
                Resolution::Committed { effects } => {
                    report.committed += 1;
                    if effects > 1 {
                        report.duplicates += 1;
                    }
                }
                Resolution::NotCommitted => report.not_committed += 1,
                Resolution::StillUnknown | Resolution::Unreachable => report.unknown += 1,
                Resolution::AlreadyResolved => {}
            }
        }
        Ok(report)
    }

    /// One pass of the background reconciler: rows older than `stale_after`.
    ///
    /// # Errors
    /// A store failure.
    pub async fn reconcile_stale(&self, limit: u32) -> Result<ReconcileReport, StoreError> {
        let stale = time::Duration::try_from(self.settings.stale_after).unwrap_or(time::Duration::MAX);
        self.reconcile_older_than(self.env.now() - stale, limit).await
    }
}

/// Runs [`Runtime::reconcile_stale`] every `interval` until the handle is aborted.
pub fn spawn_reconciler(runtime: Runtime, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A failed pass is retried on the next tick; rows stay unresolved meanwhile.
            if let Err(e) = runtime.reconcile_stale(100).await {
                tracing::warn!(error = %e, "reconciliation pass failed");
            }
        }
    })
}
