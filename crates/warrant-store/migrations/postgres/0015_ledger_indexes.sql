-- The ledger's indexes, fewer pages written per row.
--
-- The listing indexes ascend. A descending key put every new row at the left edge of its
-- index, where each full leaf is split by redistributing it with its siblings: nearly two
-- pages written per row and index, and half-empty leaves. Ascending, a new row appends at the
-- right edge (one page, full leaves); the newest-first listings read the same index backwards.
-- The tool index ends with the id too, so a listing of one tool orders by it without a sort.
DROP INDEX ledger_tenant_created;
CREATE INDEX ledger_tenant_created ON ledger (tenant, created_at, id);
DROP INDEX ledger_tenant_tool;
CREATE INDEX ledger_tenant_tool ON ledger (tenant, tool, created_at, id);

-- One index of the unresolved rows, not two: `ledger_reconcile_due` holds the same rows, and
-- every query of them (the claim, the overdue sweep and count, the listing) reads the whole
-- unresolved set and orders it, whichever of the two it used. Each write's `attempting` row
-- was entered in both and removed from both when it finished: two pages per write.
DROP INDEX ledger_open_outcomes;
