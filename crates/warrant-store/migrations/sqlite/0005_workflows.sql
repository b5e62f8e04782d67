-- Published workflows (PRODUCT §8): a tenant's definitions, immutable once published, each
-- with the content id every tool and model step is pinned to.

CREATE TABLE workflows (
    tenant        TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    version       BIGINT  NOT NULL,
    digest        TEXT    NOT NULL,
    document      TEXT    NOT NULL,
    pinned        TEXT    NOT NULL,
    published_by  TEXT    NOT NULL,
    published_at  BIGINT  NOT NULL,
    PRIMARY KEY (tenant, name, version)
);
