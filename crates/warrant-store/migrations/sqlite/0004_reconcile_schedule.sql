-- Warrant store, version 4: reconciliation is scheduled per ledger row, in the store, so any
-- node can claim the rows that are due and no unresolvable row hides another.
--
-- reconcile_at          when the row is next due (ms); NULL: never scheduled, due once the
--                       row is `stale_after` old (its `updated_at`). A claim pushes it to the
--                       end of the claimer's lease; an inquiry that could not tell pushes it
--                       out by the row's backoff.
-- reconcile_attempts    inquiries that left the row unresolved (the backoff's exponent).
-- reconcile_owner       the node holding the current lease.
-- reconcile_note        what the last inquiry answered (why the row is still unresolved).
-- reconcile_overdue_at  when the row was found unresolved past the alert threshold (set once:
--                       the alert is raised once per row).
--
-- Existing rows get NULL / 0: due as before.

ALTER TABLE ledger ADD COLUMN reconcile_at INTEGER;
ALTER TABLE ledger ADD COLUMN reconcile_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ledger ADD COLUMN reconcile_owner TEXT;
ALTER TABLE ledger ADD COLUMN reconcile_note TEXT;
ALTER TABLE ledger ADD COLUMN reconcile_overdue_at INTEGER;

-- Only unresolved rows are ever claimed; the index stays as small as the backlog.
CREATE INDEX ledger_reconcile_due ON ledger (reconcile_at, updated_at)
    WHERE outcome IN ('attempting', 'unknown');
