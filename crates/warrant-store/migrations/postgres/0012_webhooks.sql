-- Outbound webhook endpoints of each tenant (Standard Webhooks). The secrets are sealed by the
-- gateway; the store never reads them.
CREATE TABLE webhook_endpoints (
    tenant           TEXT    NOT NULL,
    id               TEXT    NOT NULL,
    url              TEXT    NOT NULL,
    events           TEXT    NOT NULL,
    secret           TEXT    NOT NULL,
    previous_secret  TEXT,
    previous_until   BIGINT,
    description      TEXT,
    enabled          BIGINT NOT NULL,
    disabled_reason  TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- Every delivery attempt of a webhook message (its job), for the dead-letter queue's detail.
CREATE TABLE webhook_attempts (
    tenant       TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    endpoint_id  TEXT    NOT NULL,
    attempt      BIGINT NOT NULL,
    at           BIGINT NOT NULL,
    status       BIGINT,
    latency_ms   BIGINT NOT NULL,
    response     TEXT,
    error        TEXT,
    PRIMARY KEY (message_id, attempt)
);
CREATE INDEX webhook_attempts_endpoint ON webhook_attempts (tenant, endpoint_id, at);
CREATE INDEX webhook_attempts_tenant ON webhook_attempts (tenant, at);
