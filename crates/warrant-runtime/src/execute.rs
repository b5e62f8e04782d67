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
    self, AttemptFinish, AttemptStart, Charge, IdempotencyRecord, IdempotencyScope, IdempotencyStatus,
    LedgerEntry,
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
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        let retry = RetrySettings::default();
        RuntimeSettings {
            retry,
            stale_after: retry.deadline + Duration::from_secs(30),
            inquiry_timeout: Duration::from_secs(10),
            default_retention: Duration::from_secs(24 * 3600),
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
    /// The outcome, or why the store refused to start the attempt (key reused with another
    /// payload, in flight, or unknown and not yet reconcilable).
    pub result: Result<Outcome, Rejection>,
}

/// The execution runtime: one per process, shared by every lane.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) env: Arc<dyn Env>,
    pub(crate) adapters: Arc<Adapters>,
    pub(crate) settings: RuntimeSettings,
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
        }
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
    /// # Errors
    /// A store failure. If it happens after the adapter was called, a call recorded
    /// write-ahead keeps its `attempting` row and reconciliation resolves it; a read without
    /// idempotency key (recorded only after the call) is then missing from the ledger — it
    /// had no effect to reconcile.
    pub async fn execute(&self, allowed: Box<Allowed>) -> Result<Execution, StoreError> {
        let started = Instant::now();
        let contract = Arc::clone(allowed.contract());
        let entry = allowed.ledger_entry();
        let scope = allowed.idempotency_scope();
        let operation_id = operation_id(entry, scope);

        let adapter = match self.adapters.for_contract(&contract) {
            Ok(adapter) => adapter,
            Err(e) => {
                // Nothing was claimed or sent: record the failure and keep the key free.
                tracing::error!(contract = contract.id_str(), error = %e, "adapter binding unusable");
                let mut row = entry.clone();
                row.outcome = Some(records::Outcome::Failed);
                row.error_code = Some(ToolErrorCode::Unclassified.as_str().to_owned());
                row.detail = Some(format!("adapter unavailable: {e}"));
                row.latency_ms = Some(elapsed_ms(started));
                self.store.insert_ledger(&row).await?;
                return Ok(Execution {
                    ledger_id: row.id,
                    operation_id,
                    attempts: 0,
                    replayed: false,
                    result: Ok(Outcome::Failed(ToolErrorCode::Unclassified)),
                });
            }
        };

        // A new attempt on an operation whose outcome is unknown reconciles it first.
        if let Some(record) = allowed
            .replay()
            .filter(|r| r.status == IdempotencyStatus::Unknown)
            && let Some(row) = self
                .store
                .get_ledger(&record.scope.tenant, &record.ledger_id)
                .await?
        {
            self.reconcile_with(&row, &contract, adapter.as_ref()).await?;
        }

        let now = self.env.now();
        let retention = contract
            .idempotency()
            .map_or(self.settings.default_retention, |i| i.retention);
        let expires_at = now + retention;
        // A read without an idempotency key has nothing to claim and no effect to reconcile:
        // its row is written once, with its outcome, after the call (one commit, not two).
        // Every answered call is still in the ledger before the caller learns its outcome.
        let write_ahead = scope.is_some() || contract.effect() != Effect::Read;
        let start = if write_ahead {
            self.store.begin_attempt(entry, scope, expires_at).await?
        } else {
            AttemptStart::Started
        };
        let refused = |code: RejectCode, detail: String| Execution {
            ledger_id: entry.id.clone(),
            operation_id: operation_id.clone(),
            attempts: 0,
            replayed: false,
            result: Err(Rejection::new(code, detail).at("/idempotency_key")),
        };
        match start {
            AttemptStart::Started => {}
            AttemptStart::Replay(record) => {
                metrics::counter!(metric::REPLAYS).increment(1);
                return Ok(Execution {
                    ledger_id: entry.id.clone(),
                    operation_id,
                    attempts: 0,
                    replayed: true,
                    result: Ok(replayed_outcome(&record)),
                });
            }
            AttemptStart::KeyReused => {
                return Ok(refused(
                    RejectCode::IdempotencyKeyReused,
                    "the idempotency key was used with a different payload".into(),
                ));
            }
            AttemptStart::InFlight => {
                return Ok(refused(
                    RejectCode::IdempotencyInFlight,
                    "a call with this idempotency key is in flight".into(),
                ));
            }
            AttemptStart::Unknown(record) => {
                return Ok(refused(
                    RejectCode::IdempotencyInFlight,
                    format!(
                        "the outcome of {} is unknown and being reconciled",
                        record.ledger_id
                    ),
                ));
            }
        }

        // INVARIANT: with `write_ahead`, the ledger row says `attempting` from here on.
        let scopes: Vec<String> = allowed.delegated_scopes().iter().map(str::to_owned).collect();
        let proposal = allowed.proposal();
        let ended = self
            .attempts(
                &contract,
                adapter.as_ref(),
                &Invocation {
                    operation_id: &operation_id,
                    contract: &contract,
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
        let finish = self.finish_for(&contract, entry, &ended, elapsed_ms(started));
        let recorded = if write_ahead {
            self.store
                .finish_attempt(&entry.tenant, &entry.id, scope, &finish, self.env.now())
                .await
        } else {
            self.store.record_attempt(entry, &finish, self.env.now()).await
        };
        match recorded {
            Ok(()) => {}
            // A reconciler took the row for abandoned (the call outlived `stale_after`) and
            // resolved it first; its record stands, and this caller still learns what it saw.
            Err(StoreError::Conflict(_)) if write_ahead => {
                tracing::warn!(
                    ledger = entry.id,
                    "the row was reconciled while the call was running"
                );
            }
            Err(e) => return Err(e),
        }
        count_outcome(&ended.outcome);
        Ok(Execution {
            ledger_id: entry.id.clone(),
            operation_id,
            attempts: ended.attempts,
            replayed: false,
            result: Ok(ended.outcome),
        })
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
        let kind = contract.adapter().map_or("none", |a| a.kind()).to_owned();
        let mut ambiguous = false;
        let mut attempt = 1u32;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let call = Invocation {
                attempt,
                timeout: left,
                ..*first
            };
            metrics::counter!(metric::ATTEMPTS, "adapter" => kind.clone()).increment(1);
            if attempt > 1 {
                metrics::counter!(metric::RETRIES, "adapter" => kind.clone()).increment(1);
            }
            let t0 = Instant::now();
            let result = match tokio::time::timeout(left, adapter.invoke(&call)).await {
                Ok(result) => result,
                Err(_) => Err(Failure::ambiguous(
                    ToolErrorCode::Timeout,
                    "no answer before the call's deadline",
                )),
            };
            metrics::histogram!(metric::ADAPTER_LATENCY, "adapter" => kind.clone())
                .record(t0.elapsed().as_secs_f64());
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

    /// The store's record of how the attempt ended, with committed spend.
    fn finish_for(
        &self,
        contract: &Contract,
        entry: &LedgerEntry,
        ended: &Ended,
        latency_ms: u64,
    ) -> AttemptFinish {
        let (stored, result) = match &ended.outcome {
            Outcome::Committed(value) => (records::Outcome::Committed, Some(value.clone())),
            Outcome::Failed(_) => (records::Outcome::Failed, None),
            Outcome::Unknown(_) => (records::Outcome::Unknown, None),
        };
        let cost = if result.is_some() {
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
                hex::encode(digest.get(..16).unwrap_or_default())
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

fn count_outcome(outcome: &Outcome) {
    let label = match outcome {
        Outcome::Committed(_) => "committed",
        Outcome::Failed(_) => "failed",
        Outcome::Unknown(_) => {
            metrics::counter!(metric::UNKNOWN).increment(1);
            "unknown"
        }
    };
    metrics::counter!(metric::OUTCOMES, "outcome" => label).increment(1);
}

pub(crate) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
