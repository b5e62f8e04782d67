-- Warrant store, version 1. Timestamps are Unix epoch milliseconds (BIGINT), JSON is canonical
-- text, so the SQLite and PostgreSQL schemas hold identical values.

CREATE TABLE contracts (
    name            TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    content_id      TEXT    NOT NULL UNIQUE,
    body            TEXT    NOT NULL,
    binding         TEXT,
    binding_digest  TEXT,
    registered_at   BIGINT  NOT NULL,
    retired_at      BIGINT,
    PRIMARY KEY (name, version)
);

CREATE TABLE ledger (
    id               TEXT    PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    principal        TEXT    NOT NULL,
    trace_id         TEXT    NOT NULL,
    run_id           TEXT,
    step_id          TEXT,
    tool             TEXT    NOT NULL,
    contract_id      TEXT,
    binding_digest   TEXT,
    payload_digest   TEXT,
    decision         TEXT    NOT NULL,
    stage            TEXT,
    error_code       TEXT,
    approval_id      TEXT,
    idempotency_key  TEXT,
    attempts         BIGINT  NOT NULL DEFAULT 0,
    outcome          TEXT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    latency_ms       BIGINT,
    cost             BIGINT  NOT NULL DEFAULT 0,
    arguments        TEXT,
    detail           TEXT
);
CREATE INDEX ledger_tenant_created ON ledger (tenant, created_at DESC, id DESC);
CREATE INDEX ledger_tenant_tool ON ledger (tenant, tool, created_at DESC);
CREATE INDEX ledger_open_outcomes ON ledger (outcome, updated_at) WHERE outcome IN ('attempting', 'unknown');

CREATE TABLE idempotency (
    tenant          TEXT    NOT NULL,
    principal       TEXT    NOT NULL,
    contract_id     TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    payload_digest  TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    result          TEXT,
    error_code      TEXT,
    ledger_id       TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL,
    expires_at      BIGINT  NOT NULL,
    PRIMARY KEY (tenant, principal, contract_id, key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at);

CREATE TABLE approvals (
    id               TEXT    PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    contract_id      TEXT    NOT NULL,
    tool             TEXT    NOT NULL,
    proposer         TEXT    NOT NULL,
    payload_digest   TEXT    NOT NULL,
    idempotency_key  TEXT,
    arguments        TEXT    NOT NULL,
    status           TEXT    NOT NULL,
    reviewer         TEXT,
    reason           TEXT,
    created_at       BIGINT  NOT NULL,
    expires_at       BIGINT  NOT NULL,
    decided_at       BIGINT,
    consumed_at      BIGINT,
    consumed_by      TEXT
);
CREATE INDEX approvals_tenant_status ON approvals (tenant, status, created_at);

CREATE TABLE budget_counters (
    tenant      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    used        BIGINT  NOT NULL,
    expires_at  BIGINT  NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX budget_counters_expiry ON budget_counters (expires_at);

CREATE TABLE api_keys (
    id          TEXT    PRIMARY KEY,
    key_hash    TEXT    NOT NULL UNIQUE,
    tenant      TEXT    NOT NULL,
    principal   TEXT    NOT NULL,
    grants      TEXT    NOT NULL,
    roles       TEXT    NOT NULL,
    label       TEXT,
    created_at  BIGINT  NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX api_keys_tenant ON api_keys (tenant, created_at);

CREATE TABLE jobs (
    id            TEXT    PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    payload       TEXT    NOT NULL,
    status        TEXT    NOT NULL,
    attempts      BIGINT  NOT NULL DEFAULT 0,
    max_attempts  BIGINT  NOT NULL,
    run_at        BIGINT  NOT NULL,
    locked_by     TEXT,
    locked_until  BIGINT,
    last_error    TEXT,
    created_at    BIGINT  NOT NULL,
    updated_at    BIGINT  NOT NULL
);
CREATE INDEX jobs_ready ON jobs (status, run_at);
