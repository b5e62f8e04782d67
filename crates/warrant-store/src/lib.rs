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
mod exec;
pub mod keys;
mod memory;
mod sql;
mod sqlite;
pub mod testing;

use time::OffsetDateTime;

pub use memory::MemoryStore;
pub use sql::{DatabaseUrl, NEW_DATABASE_PAGE_BYTES, SqlStore, StoreOptions};
pub use sqlite::{OVERLOADED_METRIC, deliver_answers_here, write_here_when_alone, writes_here_when_alone};
pub use warrant_core::records::*;
pub use warrant_core::store::{Store, StoreError};

/// The system clock and ULID ids: the production [`warrant_core::env::Env`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemEnv;

impl warrant_core::env::Env for SystemEnv {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    fn new_id(&self, prefix: &str) -> String {
        // Encoded into a buffer and lowered in place: one allocation per id, not four (every
        // call makes one or two).
        let mut buffer = [0u8; ulid::ULID_LEN];
        let ulid = ulid::Ulid::new().array_to_str(&mut buffer);
        ulid.make_ascii_lowercase();
        let mut id = String::with_capacity(prefix.len() + 1 + ulid::ULID_LEN);
        id.push_str(prefix);
        id.push('_');
        id.push_str(ulid);
        id
    }
}

/// The counter of sweeps ([`Store::purge_expired`]) that failed.
pub const SWEEP_ERRORS_METRIC: &str = "warrant_sweep_errors_total";

/// Runs [`Store::purge_expired`] every `interval` until the returned handle is aborted. A
/// failed sweep is logged (WARN) and counted in [`SWEEP_ERRORS_METRIC`].
pub fn spawn_sweeper<S: Store + ?Sized>(
    store: std::sync::Arc<S>,
    interval: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            sweep_once(store.as_ref()).await;
        }
    })
}

/// One sweep: purges what expired; a failure is logged and counted, then left to the next
/// tick. Nothing depends on the sweep for correctness: `begin_attempt` treats an expired
/// idempotency record as free and approvals are checked against their expiry when decided or
/// consumed; but a sweep that keeps failing lets expired rows pile up, so it is visible.
pub async fn sweep_once<S: Store + ?Sized>(store: &S) -> Option<PurgeCounts> {
    match store.purge_expired(OffsetDateTime::now_utc()).await {
        Ok(counts) => Some(counts),
        Err(e) => {
            metrics::counter!(SWEEP_ERRORS_METRIC).increment(1);
            tracing::warn!(error = %e, "sweep of expired records failed; retried on the next tick");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

    use warrant_core::env::Env;

    use super::SystemEnv;

    #[test]
    fn ids_are_the_prefix_and_a_lower_case_ulid() {
        let a = SystemEnv.new_id("led");
        let b = SystemEnv.new_id("led");
        assert_ne!(a, b);
        for id in [&a, &b] {
            let (prefix, ulid) = id.split_once('_').unwrap();
            assert_eq!(prefix, "led");
            assert_eq!(ulid.len(), 26);
            assert!(
                ulid.bytes().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()),
                "{id}"
            );
            assert_eq!(
                ulid.to_uppercase()
                    .parse::<ulid::Ulid>()
                    .unwrap()
                    .to_string()
                    .to_lowercase(),
                ulid
            );
        }
    }
}
