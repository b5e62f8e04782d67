-- Warrant store, version 2: contracts live in a namespace (the platform, or one tenant), and
-- tenants are records of their own. `tenant` is '' for a platform contract; every contract
-- stored before was the platform's.

ALTER TABLE contracts ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
ALTER TABLE contracts DROP CONSTRAINT contracts_pkey;
ALTER TABLE contracts DROP CONSTRAINT contracts_content_id_key;
ALTER TABLE contracts ADD PRIMARY KEY (tenant, name, version);
ALTER TABLE contracts ADD CONSTRAINT contracts_tenant_content_id_key UNIQUE (tenant, content_id);
CREATE INDEX contracts_name ON contracts (name, tenant);

CREATE TABLE tenants (
    id          TEXT    PRIMARY KEY,
    label       TEXT,
    created_at  BIGINT  NOT NULL
);
INSERT INTO tenants (id, created_at)
    SELECT tenant, MIN(created_at) FROM api_keys GROUP BY tenant;
