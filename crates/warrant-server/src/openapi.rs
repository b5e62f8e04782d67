//! The OpenAPI document of the HTTP API, generated from the route annotations (`utoipa`) and
//! served at `GET /v1/openapi.json`. The committed copy (`docs/openapi.json`) is checked
//! against this in the tests, so the API cannot drift from its description.
//!
//! The types here describe wire shapes only; handlers build the same shapes from the domain
//! types (see `routes/*`).

#![allow(dead_code, reason = "documentation types: read by the OpenAPI generator only")]

use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// The error every failure answers with.
#[derive(ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    error: ErrorDetail,
    /// The proposal's ledger row (proposal routes only).
    ledger_id: Option<String>,
    /// `reject` or `allow` (proposal routes only).
    decision: Option<String>,
    /// The proposal's trace id (proposal routes only).
    trace_id: Option<String>,
}

/// One error.
#[derive(ToSchema)]
pub struct ErrorDetail {
    /// `parse`, `identity`, `contract`, `schema`, `policy`, `scope`, `guard`, `budget`,
    /// `approval`, `idempotency`, `execute`, `auth`, `request`, `route` or `internal`.
    stage: String,
    /// A stable SCREAMING_SNAKE_CASE code.
    code: String,
    /// A human-readable message (never argument values).
    message: String,
    /// A JSON pointer into the proposal, where one applies.
    pointer: Option<String>,
}

/// A proposal: the closed envelope (see docs/proposals.md). Identity fields are refused.
#[derive(ToSchema)]
pub struct Proposal {
    /// The tool (contract name).
    tool: String,
    /// The exact contract version.
    version: Option<u32>,
    /// Or the exact content id, `tool-contract@sha256:<hex>`.
    contract: Option<String>,
    /// The arguments, validated against the contract's closed input schema.
    #[schema(value_type = Object)]
    arguments: Value,
    /// The idempotency key (or the `Idempotency-Key` header).
    idempotency_key: Option<String>,
    /// An approval id (or the `Warrant-Approval` header).
    approval: Option<String>,
}

/// What became of a proposal.
#[derive(ToSchema)]
pub struct ProposalAnswer {
    /// The proposal's ledger row.
    ledger_id: String,
    /// `allow`, `needs_approval` or `reject`.
    decision: String,
    /// The trace id.
    trace_id: String,
    /// `committed`, `replayed`, `failed` or `unknown` (allowed calls).
    outcome: Option<String>,
    /// The tool's result (committed or replayed).
    #[schema(value_type = Option<Object>)]
    result: Option<Value>,
    /// The operation id the tool saw as its idempotency token.
    operation_id: Option<String>,
    /// Adapter attempts.
    attempts: Option<u32>,
    /// Whether the result came from the idempotency record.
    replayed: Option<bool>,
    /// The approval the call waits for.
    approval: Option<ApprovalHold>,
    /// The tool error of a failed call.
    error: Option<ErrorDetail>,
}

/// An approval a held call waits for.
#[derive(ToSchema)]
pub struct ApprovalHold {
    /// The approval id.
    id: String,
    /// The contract it is bound to.
    contract_id: String,
    /// The payload digest it is bound to.
    payload_digest: String,
    /// The idempotency key it is bound to.
    idempotency_key: Option<String>,
    /// When it expires (RFC 3339).
    expires_at: Option<String>,
    /// Where a reviewer sees it.
    review_url: String,
}

/// A registered contract.
#[derive(ToSchema)]
pub struct ContractSummary {
    /// `tool-contract@sha256:<hex>`.
    id: String,
    /// The tenant that owns it; absent for a platform contract.
    tenant: Option<String>,
    /// Name.
    name: String,
    /// Version.
    version: u32,
    /// Description.
    description: Option<String>,
    /// `read`, `write`, `irreversible` or `async`.
    effect: Option<String>,
    /// Scopes the contract needs.
    scopes: Option<Vec<String>>,
    /// `none` or `per_call`.
    approval: Option<String>,
    /// The adapter binding's digest.
    binding_digest: Option<String>,
    /// Registered (RFC 3339).
    registered_at: String,
    /// Retired (RFC 3339).
    retired_at: Option<String>,
    /// The document the id covers (single-contract reads only).
    #[schema(value_type = Option<Object>)]
    document: Option<Value>,
}

/// Contracts.
#[derive(ToSchema)]
pub struct ContractList {
    /// Every registered contract.
    contracts: Vec<ContractSummary>,
}

/// A registration.
#[derive(ToSchema)]
pub struct Registered {
    /// The content id.
    id: String,
    /// The tenant that owns it; absent for a platform contract.
    tenant: Option<String>,
    /// Name.
    name: String,
    /// Version.
    version: u32,
}

/// A retirement.
#[derive(ToSchema)]
pub struct Retired {
    /// The content id.
    id: String,
    /// Always true.
    retired: bool,
}

/// An approval request.
#[derive(ToSchema)]
pub struct Approval {
    /// Id.
    id: String,
    /// `pending`, `approved`, `rejected`, `expired` or `consumed`.
    status: String,
    /// The tool.
    tool: String,
    /// The contract id it is bound to.
    contract_id: String,
    /// The proposing principal.
    proposer: String,
    /// The payload digest it is bound to.
    payload_digest: String,
    /// The idempotency key it is bound to.
    idempotency_key: Option<String>,
    /// The arguments, sensitive values as their keyed hashes (`hmac-sha256:<hex>`).
    #[schema(value_type = Object)]
    arguments: Value,
    /// Created (RFC 3339).
    created_at: String,
    /// Expires (RFC 3339).
    expires_at: String,
    /// Who decided.
    reviewer: Option<String>,
    /// The reviewer's reason.
    reason: Option<String>,
    /// Decided (RFC 3339).
    decided_at: Option<String>,
    /// Consumed (RFC 3339).
    consumed_at: Option<String>,
    /// Who may decide beyond policy, for an approval a workflow review asked for:
    /// `{"role": …}` or `{"principals": […]}`.
    #[schema(value_type = Option<Object>)]
    reviewers: Option<serde_json::Value>,
}

/// Approvals.
#[derive(ToSchema)]
pub struct ApprovalList {
    /// Oldest first.
    approvals: Vec<Approval>,
}

/// A reviewer's verdict.
#[derive(ToSchema)]
pub struct ReviewBody {
    /// Why (up to 1000 characters; required with `arguments`).
    reason: Option<String>,
    /// Approve with edits (approve only): the edited arguments, proposed again as the proposer
    /// through the whole pipeline and bound to their own digest; the original request is
    /// rejected and never runs; the edited call runs at once.
    #[schema(value_type = Option<Object>)]
    arguments: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A one-time console sign-in link (`POST /v1/console/links`).
#[derive(ToSchema)]
pub struct ConsoleLink {
    /// Opens the console signed in as the caller, once (the token in it is shown only here).
    url: String,
    /// When the link stops working (15 minutes after it was made).
    expires_at: String,
    /// Who the link signs in as.
    principal: String,
    /// Their tenant.
    tenant: String,
}

/// One ledger row.
#[derive(ToSchema)]
pub struct LedgerRow {
    /// Id.
    id: String,
    /// Tenant.
    tenant: String,
    /// Principal.
    principal: String,
    /// Trace id.
    trace_id: String,
    /// Workflow run.
    run_id: Option<String>,
    /// Workflow step.
    step_id: Option<String>,
    /// The tool as proposed.
    tool: String,
    /// The resolved contract.
    contract_id: Option<String>,
    /// The adapter binding digest.
    binding_digest: Option<String>,
    /// The payload digest.
    payload_digest: Option<String>,
    /// `allow`, `needs_approval` or `reject`.
    decision: String,
    /// The refusing stage.
    stage: Option<String>,
    /// The rejection or tool error code.
    error_code: Option<String>,
    /// Detail (never argument values).
    detail: Option<String>,
    /// The approval requested or consumed.
    approval_id: Option<String>,
    /// The idempotency key.
    idempotency_key: Option<String>,
    /// Adapter attempts.
    attempts: u32,
    /// `attempting`, `committed`, `failed`, `unknown`, `reconciled_committed`,
    /// `reconciled_not_committed` or `replayed`.
    outcome: Option<String>,
    /// Created (RFC 3339).
    created_at: String,
    /// Updated (RFC 3339).
    updated_at: String,
    /// End-to-end latency.
    latency_ms: Option<u64>,
    /// Cost units charged.
    cost: u64,
    /// Arguments, sensitive fields replaced by keyed hashes.
    #[schema(value_type = Option<Object>)]
    arguments: Option<Value>,
}

/// A page of the ledger.
#[derive(ToSchema)]
pub struct LedgerPage {
    /// Newest first.
    entries: Vec<LedgerRow>,
    /// Continue with `?cursor=`.
    next_cursor: Option<String>,
}

/// A key to create.
#[derive(ToSchema)]
pub struct CreateKey {
    /// The principal it authenticates.
    principal: String,
    /// Granted scopes.
    grants: Option<Vec<String>>,
    /// Roles.
    roles: Option<Vec<String>>,
    /// A label.
    label: Option<String>,
}

/// A new tenant.
#[derive(ToSchema)]
pub struct CreateTenant {
    /// The tenant id (1-128 of A-Z a-z 0-9 _ - . :; not `platform`).
    id: String,
    /// A label.
    label: Option<String>,
    /// The principal of its first admin key (default `admin`).
    admin: Option<String>,
}

/// A tenant.
#[derive(ToSchema)]
pub struct Tenant {
    /// The tenant id.
    id: String,
    /// A label.
    label: Option<String>,
    /// Created (RFC 3339).
    created_at: String,
}

/// How one tool step of a published workflow is reviewed.
#[derive(ToSchema)]
pub struct WorkflowCoverage {
    /// The tool step.
    step: String,
    /// `name@version` of the contract it calls.
    tool: String,
    /// The pinned content id.
    content_id: String,
    /// The contract's effect class.
    effect: String,
    /// Whether Gate A requires a covering review.
    review_required: bool,
    /// The reviews that cover it.
    reviews: Vec<String>,
}

/// A published workflow.
#[derive(ToSchema)]
pub struct PublishedWorkflow {
    /// Its name.
    name: String,
    /// Its version.
    version: u32,
    /// `sha256:<hex>` of the canonical definition.
    digest: String,
    /// Its description.
    description: Option<String>,
    /// Step id → the content id it calls or proposes.
    pinned: std::collections::BTreeMap<String, String>,
    /// The principal that published it.
    published_by: String,
    /// When (RFC 3339).
    published_at: String,
    /// Each tool step's review coverage (on publication).
    coverage: Option<Vec<WorkflowCoverage>>,
    /// The definition (on `GET /v1/workflows/{name}/{version}`).
    #[schema(value_type = Option<Object>)]
    definition: Option<serde_json::Value>,
}

/// One executed step of a run.
#[derive(ToSchema)]
pub struct RunStepView {
    /// Its place in the run.
    seq: u32,
    /// The step id.
    step: String,
    /// The step kind.
    kind: String,
    /// `completed` or `failed`.
    status: String,
    /// What it produced.
    #[schema(value_type = Option<Object>)]
    output: Option<serde_json::Value>,
    /// The ledger row of its call.
    ledger_id: Option<String>,
    /// Its cost.
    cost: u64,
    /// A detail (an error code, the exit taken).
    detail: Option<String>,
    /// When it finished (RFC 3339).
    finished_at: String,
}

/// A workflow run.
#[derive(ToSchema)]
pub struct RunView {
    /// `run_…`
    id: String,
    /// The workflow's name.
    workflow: String,
    /// Its version.
    version: u32,
    /// `running`, `waiting`, `completed`, `failed` or `cancelled`.
    status: String,
    /// The step due next.
    next_step: Option<String>,
    /// The cost of its steps so far.
    cost: u64,
    /// Why it failed.
    error: Option<String>,
    /// The principal it acts as.
    started_by: String,
    /// Started (RFC 3339).
    created_at: String,
    /// Last changed (RFC 3339).
    updated_at: String,
    /// The executed steps, in order (empty in lists).
    steps: Vec<RunStepView>,
}

/// Runs.
#[derive(ToSchema)]
pub struct RunList {
    /// The newest runs.
    runs: Vec<RunView>,
}

/// The tenant's workflows.
#[derive(ToSchema)]
pub struct WorkflowList {
    /// Each published workflow.
    workflows: Vec<PublishedWorkflow>,
}

/// A created tenant with its first admin key (shown once).
#[derive(ToSchema)]
pub struct CreatedTenant {
    /// The tenant id.
    id: String,
    /// A label.
    label: Option<String>,
    /// Created (RFC 3339).
    created_at: String,
    /// The first admin key.
    admin_key: CreatedKey,
}

/// Tenants.
#[derive(ToSchema)]
pub struct TenantList {
    /// Every tenant.
    tenants: Vec<Tenant>,
}

/// A created key (shown once).
#[derive(ToSchema)]
pub struct CreatedKey {
    /// The key id.
    id: String,
    /// The key: `wrn_<id>_<secret>`.
    key: String,
    /// Tenant.
    tenant: String,
    /// Principal.
    principal: String,
    /// Granted scopes.
    grants: Vec<String>,
    /// Roles.
    roles: Vec<String>,
    /// Label.
    label: Option<String>,
}

/// A stored key, as listed: never the key or its hash.
#[derive(ToSchema)]
pub struct KeySummary {
    /// The key id.
    id: String,
    /// Tenant.
    tenant: String,
    /// Principal.
    principal: String,
    /// Granted scopes.
    grants: Vec<String>,
    /// Roles.
    roles: Vec<String>,
    /// Label.
    label: Option<String>,
    /// Created (RFC 3339).
    created_at: String,
    /// Revoked (RFC 3339), if it was.
    revoked_at: Option<String>,
}

/// The keys of a tenant.
#[derive(ToSchema)]
pub struct KeyList {
    /// Oldest first.
    keys: Vec<KeySummary>,
}

struct BearerKeys;

impl Modify for BearerKeys {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "api_key",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .bearer_format("wrn_<id>_<secret>")
                        .build(),
                ),
            );
        }
    }
}

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Warrant",
        description = "Typed authority for AI tool calls: decide, approve, execute and record.",
        license(name = "Apache-2.0"),
        version = "1"
    ),
    paths(
        crate::routes::proposals::propose,
        crate::routes::contracts::list,
        crate::routes::contracts::show,
        crate::routes::contracts::register,
        crate::routes::contracts::retire,
        crate::routes::approvals::list,
        crate::routes::approvals::show,
        crate::routes::approvals::approve,
        crate::routes::approvals::reject,
        crate::routes::ledger::list,
        crate::routes::ledger::show,
        crate::routes::keys::list,
        crate::routes::keys::create,
        crate::routes::keys::revoke,
        crate::routes::tenants::create,
        crate::routes::tenants::list,
        crate::routes::tenants::create_tenant_key,
        crate::routes::workflows::publish,
        crate::routes::workflows::list,
        crate::routes::workflows::show,
        crate::routes::workflows::start_run,
        crate::routes::workflows::list_runs,
        crate::routes::workflows::show_run,
        crate::routes::workflows::cancel_run,
        crate::routes::health::healthz,
        crate::routes::health::ready,
        crate::routes::health::metrics,
        crate::routes::health::openapi_json,
        crate::console::session::create_link,
        crate::routes::webhooks::create,
        crate::routes::webhooks::list,
        crate::routes::webhooks::rotate,
        crate::routes::webhooks::disable,
        crate::routes::webhooks::enable,
        crate::routes::webhooks::deliveries,
        crate::routes::webhooks::dead,
        crate::routes::webhooks::replay,
        crate::routes::inbound::receive,
        crate::routes::inbound::create,
        crate::routes::inbound::list,
        crate::routes::inbound::rotate,
        crate::routes::inbound::disable,
        crate::routes::inbound::enable,
        crate::routes::inbound::events,
        crate::routes::inbound::event,
    ),
    components(schemas(
        ErrorBody, ErrorDetail, Proposal, ProposalAnswer, ApprovalHold, ContractSummary, ContractList,
        Registered, Retired, Approval, ApprovalList, ReviewBody, LedgerRow, LedgerPage, CreateKey, CreatedKey, KeySummary, KeyList,
        CreateTenant, CreatedTenant, Tenant, TenantList, WorkflowCoverage, PublishedWorkflow, WorkflowList, RunStepView, RunView, RunList, ConsoleLink
    )),
    modifiers(&BearerKeys),
    security(("api_key" = []))
)]
pub struct ApiDoc;

/// The document as pretty JSON with a final newline (the committed form).
pub fn document() -> String {
    let mut text = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}
