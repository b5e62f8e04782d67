-- The readiness probe's one row: `/readyz` rewrites it to show that the store accepts writes
-- (`Store::probe_write`). Nothing else reads it.

CREATE TABLE write_probe (
    id         BIGINT  PRIMARY KEY CHECK (id = 1),
    probed_at  BIGINT  NOT NULL
);
