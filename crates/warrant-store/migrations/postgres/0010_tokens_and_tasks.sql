-- Single-use tokens (an MCP requestState, an inbound event id): a row is the spend; a second
-- insert of the same (scope, tenant, id) fails, whichever node tries.
CREATE TABLE spent_tokens (
    scope       TEXT    NOT NULL,
    tenant      TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    expires_at  BIGINT  NOT NULL,
    PRIMARY KEY (scope, tenant, id)
);
CREATE INDEX spent_tokens_expiry ON spent_tokens (expires_at);

-- Durable agent tasks (MCP tasks extension) for calls held for review.
CREATE TABLE agent_tasks (
    tenant       TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    principal    TEXT    NOT NULL,
    approval_id  TEXT    NOT NULL,
    call         TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    result       TEXT,
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX agent_tasks_expiry ON agent_tasks (expires_at);
