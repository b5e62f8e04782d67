-- Workflow runs: the run record, and one row per executed step. A step's row, the run's next
-- step and the next step's job commit together (`Store::advance_run`).

CREATE TABLE runs (
    id          TEXT    PRIMARY KEY,
    tenant      TEXT    NOT NULL,
    workflow    TEXT    NOT NULL,
    version     BIGINT  NOT NULL,
    digest      TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    input       TEXT    NOT NULL,
    principal   TEXT    NOT NULL,
    next_step   TEXT,
    next_seq    BIGINT  NOT NULL,
    cost        BIGINT  NOT NULL DEFAULT 0,
    error       TEXT,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL
);
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);

CREATE TABLE run_steps (
    run_id       TEXT    NOT NULL,
    seq          BIGINT  NOT NULL,
    step_id      TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    output       TEXT,
    ledger_id    TEXT,
    cost         BIGINT  NOT NULL DEFAULT 0,
    detail       TEXT,
    finished_at  BIGINT  NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE INDEX jobs_kind_ready ON jobs (kind, status, run_at);
