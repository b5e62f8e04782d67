-- Inbound webhook sources of each tenant: outside systems that start governed work with signed
-- events. The secrets are sealed by the gateway; the store never reads them. Ids are unique
-- across tenants (the receiving URL carries only the id).
CREATE TABLE inbound_sources (
    id               TEXT    NOT NULL PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    provider         TEXT    NOT NULL,
    secret           TEXT    NOT NULL,
    previous_secret  TEXT,
    previous_until   BIGINT,
    key_id           TEXT    NOT NULL,
    action           TEXT    NOT NULL,
    description      TEXT,
    enabled          BIGINT NOT NULL,
    refusals         BIGINT NOT NULL,
    last_refusal     TEXT,
    last_refusal_at  BIGINT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX inbound_sources_tenant ON inbound_sources (tenant, created_at);

-- Verified inbound events, one per source and provider event id: the deduplication record,
-- and the trace of what each event did.
CREATE TABLE inbound_events (
    source_id    TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    tenant       TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    body_digest  TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    deliveries   BIGINT NOT NULL,
    detail       TEXT,
    received_at  BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (source_id, event_id)
);
CREATE INDEX inbound_events_listing ON inbound_events (tenant, source_id, received_at);
CREATE INDEX inbound_events_age ON inbound_events (received_at);
