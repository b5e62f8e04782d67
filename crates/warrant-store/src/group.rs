//! Group commit for the embedded SQLite store: many write transactions, one `fsync`.
//!
//! With `synchronous=FULL` every commit waits for the disk, and with one writer connection the
//! commits queue: throughput is one `fsync` per write. Instead, writes that arrive while a
//! batch is open run as savepoints inside one outer `BEGIN IMMEDIATE` transaction, and the
//! last writer of the batch (the one that finds nobody queued behind it) commits it once.
//! Every writer waits for that commit before it returns, so **acknowledged still means
//! durable**, and each write still sees the writes before it (one connection, serial order),
//! exactly as if they had committed one by one.
//!
//! Written by hand because no crate does group commit over sqlx; the parts that keep it live
//! are: the queue counter is decremented by a drop guard (a cancelled writer cannot leave it
//! raised), and a waiter whose batch nobody committed within a few milliseconds (its last
//! writer was cancelled mid-way) commits it itself.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::sqlite::SqlitePool;
use sqlx::{Sqlite, Transaction};
use tokio::sync::{Mutex, MutexGuard, watch};
use warrant_core::store::StoreError;

use crate::error::Db;

/// The open batch.
#[derive(Default)]
pub(crate) struct Batch {
    /// The outer transaction, while a batch is open.
    open: Option<Transaction<'static, Sqlite>>,
    /// The number of the current (or last) batch.
    epoch: u64,
}

impl Batch {
    /// The outer transaction to open a savepoint in.
    pub(crate) fn outer(&mut self) -> Result<&mut Transaction<'static, Sqlite>, StoreError> {
        self.open
            .as_mut()
            .ok_or_else(|| StoreError::Database("no open batch".into()))
    }
}

/// What has been committed.
#[derive(Debug, Clone, Default)]
struct Done {
    /// Every batch up to this one is finished.
    through: u64,
    /// Recent batches whose commit failed, with the error.
    failed: VecDeque<(u64, String)>,
}

impl Done {
    fn outcome(&self, epoch: u64) -> Option<Result<(), StoreError>> {
        if self.through < epoch {
            return None;
        }
        Some(match self.failed.iter().find(|(e, _)| *e == epoch) {
            Some((_, why)) => Err(StoreError::Unavailable(format!("commit failed: {why}"))),
            None => Ok(()),
        })
    }
}

/// The group-commit coordinator of one SQLite writer connection.
pub(crate) struct GroupCommit {
    pool: SqlitePool,
    batch: Mutex<Batch>,
    /// Writers waiting for the batch lock; they will join the open batch.
    queued: AtomicUsize,
    done: watch::Sender<Done>,
}

/// Decrements the queue counter however the wait for the lock ends.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl GroupCommit {
    /// A coordinator over the (single-connection) writer pool.
    pub(crate) fn new(pool: SqlitePool) -> Self {
        GroupCommit {
            pool,
            batch: Mutex::new(Batch::default()),
            queued: AtomicUsize::new(0),
            done: watch::Sender::new(Done::default()),
        }
    }

    /// The writer pool.
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Waits for the batch lock and makes sure a batch is open; returns the lock and the
    /// batch's number.
    pub(crate) async fn enter(&self) -> Result<(MutexGuard<'_, Batch>, u64), StoreError> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let queued = Queued(&self.queued);
        let mut batch = self.batch.lock().await;
        drop(queued);
        if batch.open.is_none() {
            // BEGIN IMMEDIATE takes the write lock now, not at the first write.
            batch.open = Some(self.pool.begin_with("BEGIN IMMEDIATE").await.db()?);
            batch.epoch += 1;
        }
        let epoch = batch.epoch;
        Ok((batch, epoch))
    }

    /// After a writer's savepoint: commits the batch if nobody is queued behind, otherwise
    /// leaves it to them and waits until the batch is committed. Returns once this writer's
    /// work is durable (or the batch failed).
    pub(crate) async fn finish(
        &self,
        mut batch: MutexGuard<'_, Batch>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return self.commit(&mut batch, epoch).await;
        }
        let mut rx = self.done.subscribe();
        drop(batch);
        loop {
            if let Some(outcome) = rx.borrow_and_update().outcome(epoch) {
                return outcome;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return Err(StoreError::Unavailable("the store is closing".into()));
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(5)) => {
                    // Nobody committed our batch in time (its last writer may have been
                    // cancelled): commit it ourselves if it is still open.
                    let mut batch = self.batch.lock().await;
                    if batch.epoch == epoch && batch.open.is_some() {
                        return self.commit(&mut batch, epoch).await;
                    }
                }
            }
        }
    }

    async fn commit(&self, batch: &mut Batch, epoch: u64) -> Result<(), StoreError> {
        let Some(outer) = batch.open.take() else {
            // Already committed by someone else.
            return self.done.borrow().outcome(epoch).unwrap_or(Ok(()));
        };
        let result = outer.commit().await.db();
        self.done.send_modify(|done| {
            done.through = epoch;
            if let Err(e) = &result {
                done.failed.push_back((epoch, e.to_string()));
                if done.failed.len() > 64 {
                    done.failed.pop_front();
                }
            }
        });
        result
    }
}
