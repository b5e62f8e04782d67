-- The inbox reads pending approvals of a tenant newest first and counts them: one index serves
-- both, its expiry column deciding the effective status without reading the rows.
DROP INDEX approvals_tenant_status;
CREATE INDEX approvals_tenant_status_created ON approvals (tenant, status, created_at, expires_at);
