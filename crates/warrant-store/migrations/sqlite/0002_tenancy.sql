-- Warrant store, version 2: contracts live in a namespace (the platform, or one tenant), and
-- tenants are records of their own. `tenant` is '' for a platform contract. SQLite cannot change
-- a primary key in place, so the table is rebuilt; every contract stored before was the
-- platform's (only operators and admins of the one tenant could register).

CREATE TABLE contracts_v2 (
    tenant          TEXT    NOT NULL DEFAULT '',
    name            TEXT    NOT NULL,
    version         INTEGER  NOT NULL,
    content_id      TEXT    NOT NULL,
    body            TEXT    NOT NULL,
    binding         TEXT,
    binding_digest  TEXT,
    registered_at   INTEGER  NOT NULL,
    retired_at      INTEGER,
    PRIMARY KEY (tenant, name, version),
    UNIQUE (tenant, content_id)
);
INSERT INTO contracts_v2 (tenant, name, version, content_id, body, binding, binding_digest, registered_at, retired_at)
    SELECT '', name, version, content_id, body, binding, binding_digest, registered_at, retired_at FROM contracts;
DROP TABLE contracts;
ALTER TABLE contracts_v2 RENAME TO contracts;
CREATE INDEX contracts_name ON contracts (name, tenant);

CREATE TABLE tenants (
    id          TEXT    PRIMARY KEY,
    label       TEXT,
    created_at  INTEGER  NOT NULL
);
INSERT INTO tenants (id, created_at)
    SELECT tenant, MIN(created_at) FROM api_keys GROUP BY tenant;
