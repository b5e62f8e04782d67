-- Reviewer console sign-ins: sessions (a cookie) and one-time sign-in links. Only the hash of
-- a token is stored; the principal is re-read from its API key (by the key's hash) on every
-- request, so a revoked key ends its sessions.
CREATE TABLE console_sessions (
    token_hash  TEXT    PRIMARY KEY,
    kind        TEXT    NOT NULL,
    key_hash    TEXT    NOT NULL,
    csrf        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

-- The ledger rows of an approval request (its proposal, its consumption), for the approval page.
CREATE INDEX ledger_tenant_approval ON ledger (tenant, approval_id) WHERE approval_id IS NOT NULL;
