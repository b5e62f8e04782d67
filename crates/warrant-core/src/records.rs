//! The records Warrant keeps — ledger rows, idempotency records, approval requests, budget
//! counters, API keys, jobs, registered contracts — as plain domain types shared by the
//! decision pipeline (which writes them through its ports) and the store (which persists them).
//! Text forms of enums are the stable strings stored in the database.

use serde_json::Value;
use time::OffsetDateTime;

macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $( $(#[$vmeta])* $variant, )* }

        impl $name {
            /// The stored text form.
            pub const fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $text, )* }
            }

            /// Parses the stored text form.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $( $text => Some($name::$variant), )* _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum! {
    /// The decision recorded for a proposal.
    LedgerDecision {
        /// Allowed (and then executed, or replayed).
        Allow => "allow",
        /// Waiting for a human approval.
        NeedsApproval => "needs_approval",
        /// Refused at some stage.
        Reject => "reject",
    }
}

text_enum! {
    /// What happened to an allowed call.
    Outcome {
        /// Recorded before the adapter is called (write-ahead intent).
        Attempting => "attempting",
        /// The effect happened.
        Committed => "committed",
        /// The effect did not happen.
        Failed => "failed",
        /// Nobody knows yet; to be reconciled.
        Unknown => "unknown",
        /// Reconciliation found the effect committed.
        ReconciledCommitted => "reconciled_committed",
        /// Reconciliation found no effect.
        ReconciledNotCommitted => "reconciled_not_committed",
        /// An idempotent replay: the stored result was returned, nothing was executed.
        Replayed => "replayed",
    }
}

impl Outcome {
    /// Whether the outcome is final (no reconciliation pending).
    pub const fn is_final(self) -> bool {
        !matches!(self, Outcome::Attempting | Outcome::Unknown)
    }
}

/// One row of the tool invocation ledger: every proposal, allowed or not.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEntry {
    /// Unique id (ULID: sortable by creation time).
    pub id: String,
    /// The tenant the call was made in.
    pub tenant: String,
    /// The authenticated principal.
    pub principal: String,
    /// One trace id per proposal.
    pub trace_id: String,
    /// The workflow run, if any.
    pub run_id: Option<String>,
    /// The workflow step, if any.
    pub step_id: Option<String>,
    /// The tool named by the proposal (as proposed, truncated), for filtering.
    pub tool: String,
    /// The resolved contract, if resolution got that far.
    pub contract_id: Option<String>,
    /// The adapter binding digest used.
    pub binding_digest: Option<String>,
    /// The payload digest, if the arguments validated.
    pub payload_digest: Option<String>,
    /// The decision.
    pub decision: LedgerDecision,
    /// The refusing stage (`parse`, `schema`, …), for rejections.
    pub stage: Option<String>,
    /// The rejection code or tool error code.
    pub error_code: Option<String>,
    /// A human-readable detail (never argument values).
    pub detail: Option<String>,
    /// The approval the call requested or consumed.
    pub approval_id: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// Adapter attempts made.
    pub attempts: u32,
    /// The outcome of an allowed call.
    pub outcome: Option<Outcome>,
    /// When the proposal arrived.
    pub created_at: OffsetDateTime,
    /// Last change.
    pub updated_at: OffsetDateTime,
    /// End-to-end latency, once finished.
    pub latency_ms: Option<u64>,
    /// Cost units charged.
    pub cost: u64,
    /// The arguments with sensitive fields replaced by keyed hashes; never secrets.
    pub arguments: Option<Value>,
}

impl Default for LedgerEntry {
    fn default() -> Self {
        LedgerEntry::new(String::new(), "", "", "", "", OffsetDateTime::UNIX_EPOCH)
    }
}

impl LedgerEntry {
    /// A minimal entry; callers fill in what their stage established.
    pub fn new(
        id: String,
        tenant: &str,
        principal: &str,
        trace_id: &str,
        tool: &str,
        now: OffsetDateTime,
    ) -> Self {
        LedgerEntry {
            id,
            tenant: tenant.to_owned(),
            principal: principal.to_owned(),
            trace_id: trace_id.to_owned(),
            run_id: None,
            step_id: None,
            tool: tool.to_owned(),
            contract_id: None,
            binding_digest: None,
            payload_digest: None,
            decision: LedgerDecision::Reject,
            stage: None,
            error_code: None,
            detail: None,
            approval_id: None,
            idempotency_key: None,
            attempts: 0,
            outcome: None,
            created_at: now,
            updated_at: now,
            latency_ms: None,
            cost: 0,
            arguments: None,
        }
    }

    /// Records this row as refused by `rejection`: its stage, code and detail, no outcome, no
    /// attempt. The one mapping of a refusal to its row, for every stage and store.
    pub fn refuse(&mut self, rejection: &crate::decision::Rejection) {
        self.decision = LedgerDecision::Reject;
        self.stage = Some(rejection.stage().as_str().to_owned());
        self.error_code = Some(rejection.code().as_str().to_owned());
        self.detail = Some(rejection.detail().to_owned());
        self.outcome = None;
        self.attempts = 0;
    }

    /// A copy without the arguments (which a store writes from their text, serialised once):
    /// the arguments' tree is not copied.
    pub fn without_arguments(&self) -> LedgerEntry {
        LedgerEntry {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            principal: self.principal.clone(),
            trace_id: self.trace_id.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            tool: self.tool.clone(),
            contract_id: self.contract_id.clone(),
            binding_digest: self.binding_digest.clone(),
            payload_digest: self.payload_digest.clone(),
            decision: self.decision,
            stage: self.stage.clone(),
            error_code: self.error_code.clone(),
            detail: self.detail.clone(),
            approval_id: self.approval_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            attempts: self.attempts,
            outcome: self.outcome,
            created_at: self.created_at,
            updated_at: self.updated_at,
            latency_ms: self.latency_ms,
            cost: self.cost,
            arguments: None,
        }
    }
}

/// Filters for listing the ledger of one tenant (newest first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerFilter {
    /// Only this tool.
    pub tool: Option<String>,
    /// Only this outcome.
    pub outcome: Option<Outcome>,
    /// Only this principal.
    pub principal: Option<String>,
    /// Only rows created at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Only rows created before this time.
    pub until: Option<OffsetDateTime>,
    /// Only the rows of this trace (read within the other conditions: no index of its own,
    /// so narrow it with a time window on a large ledger).
    pub trace_id: Option<String>,
    /// Only the rows of this approval request (its proposal, its consumption).
    pub approval_id: Option<String>,
    /// Continue after this cursor (from a previous page).
    pub cursor: Option<String>,
    /// Page size (capped at 500).
    pub limit: u32,
}

/// Filters for a page of one tenant's approval requests (newest first), on their effective
/// status ([`ApprovalRequest::as_of`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApprovalFilter {
    /// Only this status.
    pub status: Option<ApprovalStatus>,
    /// Only this tool.
    pub tool: Option<String>,
    /// Only this proposer.
    pub proposer: Option<String>,
    /// Continue after this cursor (from a previous page).
    pub cursor: Option<String>,
    /// Page size (capped at 500).
    pub limit: u32,
}

/// One page of approval requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalPage {
    /// The requests, newest first.
    pub approvals: Vec<ApprovalRequest>,
    /// The cursor of the next page, if there is one.
    pub next_cursor: Option<String>,
}

/// One page of ledger rows.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerPage {
    /// Rows, newest first.
    pub entries: Vec<LedgerEntry>,
    /// Cursor for the next page, if there may be one.
    pub next_cursor: Option<String>,
}

/// The key of an idempotency record: (tenant, principal, contract id, key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyScope {
    /// Tenant.
    pub tenant: String,
    /// Principal.
    pub principal: String,
    /// Contract id.
    pub contract_id: String,
    /// The caller's (or derived) key.
    pub key: String,
}

text_enum! {
    /// The state of an idempotency record.
    IdempotencyStatus {
        /// An attempt is running.
        InFlight => "in_flight",
        /// Committed; the stored result is replayed.
        Committed => "committed",
        /// Failed without effect; the stored error is replayed.
        Failed => "failed",
        /// Outcome unknown; reconcile before anything else.
        Unknown => "unknown",
    }
}

/// A stored idempotency record.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotencyRecord {
    /// The key.
    pub scope: IdempotencyScope,
    /// The digest of the payload first seen with the key.
    pub payload_digest: String,
    /// State.
    pub status: IdempotencyStatus,
    /// The stored result, once committed.
    pub result: Option<Value>,
    /// The stored tool error code, once failed.
    pub error_code: Option<String>,
    /// The ledger row of the first attempt.
    pub ledger_id: String,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Purged after this time.
    pub expires_at: OffsetDateTime,
}

/// What `begin_attempt` found.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptStart {
    /// The key was free (or expired): the record is claimed and the ledger row says
    /// `attempting`. Call the adapter.
    Started,
    /// The key was committed or failed before with the same payload: return the stored
    /// record; the new ledger row says `replayed`.
    Replay(IdempotencyRecord),
    /// The key was used with another payload; the new ledger row is a rejection.
    KeyReused,
    /// An attempt with the key is still running; the new ledger row is a rejection.
    InFlight,
    /// The earlier attempt's outcome is unknown (or it was in flight and its record expired):
    /// reconcile it first. The new ledger row is a rejection with code `IDEMPOTENCY_IN_FLIGHT`.
    Unknown(IdempotencyRecord),
    /// A budget counter had no room; nothing was claimed or spent. The new ledger row is a
    /// rejection with code `BUDGET_EXHAUSTED`.
    BudgetExhausted {
        /// The counter that refused.
        key: String,
    },
    /// The approval could no longer be consumed (used, expired or changed since the decision);
    /// nothing was claimed or spent. The current record says why (`None`: gone from this
    /// tenant). The new ledger row is the matching approval rejection.
    ApprovalRefused(Option<ApprovalRequest>),
}

/// What the write-ahead commit of a call spends, in the same transaction as its idempotency
/// claim and its `attempting` row: the approval it consumes and the budget it reserves. Either
/// all of it is taken and the attempt starts, or none of it and the row records why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptClaims {
    /// The approval bound to the call, consumed by it (single use).
    pub approval: Option<ApprovalClaim>,
    /// The budget counters the call must fit into.
    pub reservations: Vec<BudgetReservation>,
}

impl AttemptClaims {
    /// Nothing to consume or reserve.
    pub const NONE: AttemptClaims = AttemptClaims {
        approval: None,
        reservations: Vec::new(),
    };

    /// Whether there is nothing to consume or reserve.
    pub fn is_empty(&self) -> bool {
        self.approval.is_none() && self.reservations.is_empty()
    }
}

/// What recording an outcome found when the row was no longer awaiting one: a late outcome
/// after reconciliation had resolved the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateOutcome {
    /// Reconciliation had recorded that the effect did not happen, and the tool has now
    /// answered that it did: the row is corrected to `committed` (its note keeps what was
    /// recorded before) and the idempotency record holds the result again.
    Corrected {
        /// Whether another attempt had claimed the freed key in between (that attempt may have
        /// repeated the effect).
        key_retaken: bool,
    },
    /// What reconciliation recorded stands (it agrees, or it has proof the late answer lacks).
    Kept(Outcome),
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFinish {
    /// The outcome.
    pub outcome: Outcome,
    /// Attempts made.
    pub attempts: u32,
    /// The tool error code, if it failed or is unknown.
    pub error_code: Option<String>,
    /// The result, if committed.
    pub result: Option<Value>,
    /// End-to-end latency.
    pub latency_ms: u64,
    /// Cost units charged.
    pub cost: u64,
    /// A note for the ledger row (e.g. what reconciliation found); `None` keeps the row's.
    pub detail: Option<String>,
    /// Counters the outcome adds to, unconditionally and in the same transaction (committed
    /// spend per run and per tenant).
    pub charges: Vec<Charge>,
}

/// An amount an outcome adds to a counter (no limit: spend is recorded, not admitted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The counter (e.g. `cost_spent:tenant:2026-11-29`).
    pub key: String,
    /// How much to add.
    pub amount: u64,
    /// When the counter may be purged.
    pub expires_at: OffsetDateTime,
}

text_enum! {
    /// The lifecycle of an approval request.
    ApprovalStatus {
        /// Waiting for a reviewer.
        Pending => "pending",
        /// Approved, not yet used.
        Approved => "approved",
        /// Rejected by a reviewer.
        Rejected => "rejected",
        /// Expired before a decision or before use.
        Expired => "expired",
        /// Used by exactly one call.
        Consumed => "consumed",
    }
}

/// Who may decide an approval, on top of what policy's `review` action allows: a workflow
/// review's `reviewers`. Policy must allow the reviewer too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewerRule {
    /// Principals holding this role.
    Role(String),
    /// These principals.
    Principals(Vec<String>),
}

impl ReviewerRule {
    /// Whether `reviewer` is one this rule admits.
    #[must_use]
    pub fn admits(&self, reviewer: &crate::authority::Principal) -> bool {
        match self {
            ReviewerRule::Role(role) => reviewer.roles().contains(role),
            ReviewerRule::Principals(ids) => ids.iter().any(|id| id == reviewer.id()),
        }
    }

    /// `{"role": …}` or `{"principals": […]}`, as stored and shown.
    #[must_use]
    pub fn to_json(&self) -> Value {
        match self {
            ReviewerRule::Role(role) => serde_json::json!({ "role": role }),
            ReviewerRule::Principals(ids) => serde_json::json!({ "principals": ids }),
        }
    }

    /// The rule of [`ReviewerRule::to_json`]'s form.
    #[must_use]
    pub fn from_json(value: &Value) -> Option<Self> {
        if let Some(role) = value.get("role").and_then(Value::as_str) {
            return Some(ReviewerRule::Role(role.to_owned()));
        }
        let ids = value.get("principals")?.as_array()?;
        ids.iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(ReviewerRule::Principals)
    }
}

/// A new approval request, bound to the exact call.
#[derive(Debug, Clone, PartialEq)]
pub struct NewApproval {
    /// Id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// The contract the call resolved to.
    pub contract_id: String,
    /// The tool name.
    pub tool: String,
    /// The proposing principal.
    pub proposer: String,
    /// Digest of the canonical arguments.
    pub payload_digest: String,
    /// The call's idempotency key.
    pub idempotency_key: Option<String>,
    /// The exact arguments, for the reviewer (sensitive values as their keyed hashes, as in
    /// the ledger).
    pub arguments: Value,
    /// The exact canonical arguments sealed at rest (`crate::seal`), when the contract has a
    /// sensitive field and the node seals: kept only while the request may still be decided or
    /// executed, for a reviewer policy lets reveal them and for executing it on the decision.
    pub sealed_arguments: Option<String>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Expires.
    pub expires_at: OffsetDateTime,
    /// Who may decide, beyond policy (a workflow review's `reviewers`); anyone policy allows
    /// when `None`.
    pub reviewers: Option<ReviewerRule>,
}

/// The kind of the jobs that carry events (the outbox): each committed with the record that
/// causes it, delivered by the gateway's event worker.
pub const EVENT_JOB: &str = "event";

impl NewApproval {
    /// The `approval.requested` event job of this request, committed with it: id
    /// `evt_<approval id>`, kind [`EVENT_JOB`], due at once.
    pub fn requested_event(&self) -> NewJob {
        NewJob {
            id: format!("evt_{}", self.id),
            tenant: self.tenant.clone(),
            kind: EVENT_JOB.to_owned(),
            payload: serde_json::json!({"type": "approval.requested", "approval_id": self.id}),
            run_at: self.created_at,
            max_attempts: 8,
        }
    }
}

/// An event job about approval `id` of `tenant` (`approval.decided`, `approval.expired`),
/// committed with the change it reports: id `evt_<kind>_<approval id>` (one per change).
pub fn approval_event(tenant: &str, id: &str, kind: &str, at: OffsetDateTime) -> NewJob {
    NewJob {
        id: format!("evt_{}_{id}", kind.trim_start_matches("approval.")),
        tenant: tenant.to_owned(),
        kind: EVENT_JOB.to_owned(),
        payload: serde_json::json!({"type": kind, "approval_id": id}),
        run_at: at,
        max_attempts: 8,
    }
}

/// The event about run `id` of `tenant` (`run.started`, `run.completed`, `run.failed`),
/// committed with the change it reports: id `evt_<kind>_<run id>` (each happens once per run).
pub fn run_event(tenant: &str, id: &str, kind: &'static str, at: OffsetDateTime) -> Notice {
    Notice::new(
        tenant,
        format!("evt_{}_{id}", kind.trim_start_matches("run.")),
        kind,
        serde_json::json!({"run_id": id}),
        at,
    )
}

/// The event a run's new status reports, committed with the step that moves the run there, if
/// any: its end (`run.completed`, `run.failed`; once per run), or a wait for a review or a
/// reconciliation (`run.waiting`; once per step `seq` that parks it).
pub fn run_advance_event(
    tenant: &str,
    run_id: &str,
    seq: u32,
    status: RunStatus,
    at: OffsetDateTime,
) -> Option<Notice> {
    match status {
        RunStatus::Completed => Some(run_event(tenant, run_id, "run.completed", at)),
        RunStatus::Failed => Some(run_event(tenant, run_id, "run.failed", at)),
        RunStatus::Waiting => {
            let mut notice = run_event(tenant, run_id, "run.waiting", at);
            notice.job.id = format!("evt_waiting_{run_id}_{seq}");
            Some(notice)
        }
        RunStatus::Running | RunStatus::Cancelled => None,
    }
}

/// The events only webhook endpoints consume (every event but `approval.requested`, which also
/// mails reviewers): the store enqueues one only when an enabled endpoint of its tenant
/// subscribes to its type when it commits (so a tenant without endpoints pays nothing on the
/// hot path), and at most once per id.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The event's type (what endpoints subscribe to).
    pub kind: &'static str,
    /// The event job.
    pub job: NewJob,
}

impl Notice {
    fn new(tenant: &str, id: String, kind: &'static str, payload: Value, at: OffsetDateTime) -> Self {
        let mut payload = payload;
        if let Value::Object(map) = &mut payload {
            map.insert("type".into(), Value::String(kind.to_owned()));
        }
        Notice {
            kind,
            job: NewJob {
                id,
                tenant: tenant.to_owned(),
                kind: EVENT_JOB.to_owned(),
                payload,
                run_at: at,
                max_attempts: 8,
            },
        }
    }

    /// A ledger row's new outcome: `invocation.completed` (committed, failed, unknown) or
    /// `invocation.reconciled` (what reconciliation found); one per row and outcome.
    pub fn invocation(tenant: &str, ledger_id: &str, outcome: Outcome, at: OffsetDateTime) -> Option<Self> {
        let kind = Self::invocation_kind(outcome)?;
        Some(Self::new(
            tenant,
            format!("evt_{}_{ledger_id}", outcome.as_str()),
            kind,
            serde_json::json!({"ledger_id": ledger_id}),
            at,
        ))
    }

    /// The event type [`Notice::invocation`] gives for `outcome` (`None`: no notice), known
    /// before the notice is built, so a store can look for a subscriber first.
    pub fn invocation_kind(outcome: Outcome) -> Option<&'static str> {
        match outcome {
            Outcome::Committed | Outcome::Failed | Outcome::Unknown => Some("invocation.completed"),
            Outcome::ReconciledCommitted | Outcome::ReconciledNotCommitted => Some("invocation.reconciled"),
            Outcome::Attempting | Outcome::Replayed => None,
        }
    }

    /// A late outcome that corrected a reconciled row to committed (`invocation.reconciled`).
    pub fn correction(tenant: &str, ledger_id: &str, at: OffsetDateTime) -> Self {
        Self::new(
            tenant,
            format!("evt_corrected_{ledger_id}"),
            "invocation.reconciled",
            serde_json::json!({"ledger_id": ledger_id}),
            at,
        )
    }

    /// A budget counter refused a call (`budget.exhausted`): once per counter (whose key names
    /// its window), with the first refused call's ledger row.
    pub fn budget(tenant: &str, key: &str, ledger_id: &str, at: OffsetDateTime) -> Self {
        Self::new(
            tenant,
            format!("evt_budget_{tenant}_{key}"),
            "budget.exhausted",
            serde_json::json!({"counter": key, "ledger_id": ledger_id}),
            at,
        )
    }

    /// A tenant's contract was registered or retired (`contract.registered`,
    /// `contract.retired`).
    pub fn contract(
        tenant: &str,
        name: &str,
        version: u32,
        content_id: &str,
        retired: bool,
        at: OffsetDateTime,
    ) -> Self {
        let (kind, label) = if retired {
            ("contract.retired", "retired")
        } else {
            ("contract.registered", "registered")
        };
        Self::new(
            tenant,
            format!("evt_{label}_{tenant}_{content_id}"),
            kind,
            serde_json::json!({"name": name, "version": version, "content_id": content_id}),
            at,
        )
    }

    /// What an endpoint's stored event list (a JSON array of strings) contains when it
    /// subscribes to the event type `kind` (a notice's [`Notice::kind`]): the type, quoted.
    pub fn subscription_needle(kind: &str) -> String {
        // Pushed, not `format!`ted: made on every call's commit (900 instructions through
        // the formatting machinery, about 60 this way).
        let mut needle = String::with_capacity(kind.len() + 2);
        needle.push('"');
        needle.push_str(kind);
        needle.push('"');
        needle
    }
}

/// A stored approval request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// What was requested.
    pub request: NewApproval,
    /// Current state.
    pub status: ApprovalStatus,
    /// Who decided.
    pub reviewer: Option<String>,
    /// The reviewer's reason.
    pub reason: Option<String>,
    /// When it was decided.
    pub decided_at: Option<OffsetDateTime>,
    /// When it was consumed.
    pub consumed_at: Option<OffsetDateTime>,
    /// The ledger row of the consuming call.
    pub consumed_by: Option<String>,
    /// The request a reviewer's edit replaced this one with (approve with edits): the call
    /// that runs instead of this one, whose result answers this request's waiting agent.
    pub superseded_by: Option<String>,
}

impl ApprovalRequest {
    /// A new request, pending review.
    pub fn pending(request: NewApproval) -> Self {
        ApprovalRequest {
            request,
            status: ApprovalStatus::Pending,
            reviewer: None,
            reason: None,
            decided_at: None,
            consumed_at: None,
            consumed_by: None,
            superseded_by: None,
        }
    }

    /// Whether the request has lapsed by `now`: pending or approved, and past its expiry
    /// (the sweeper writes `expired` for these later; until then the stored row still says
    /// `pending` or `approved`).
    pub fn lapsed(&self, now: OffsetDateTime) -> bool {
        matches!(self.status, ApprovalStatus::Pending | ApprovalStatus::Approved)
            && self.request.expires_at <= now
    }

    /// The request with its effective status at `now`: `expired` once it has
    /// [lapsed](Self::lapsed), else as stored. Every read of an approval answers this.
    #[must_use]
    pub fn as_of(mut self, now: OffsetDateTime) -> Self {
        if self.lapsed(now) {
            self.status = ApprovalStatus::Expired;
        }
        self
    }
}

/// A reviewer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Approve the call.
    Approve,
    /// Reject the call.
    Reject,
}

/// Why a reviewer's decision was not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideRefusal {
    /// No such approval in this tenant.
    NotFound,
    /// The reviewer proposed the call.
    SelfReview,
    /// Already decided (or consumed).
    NotPending(ApprovalStatus),
    /// Expired before the decision.
    Expired,
}

/// The exact call a pending approval request is looked up for (to reuse it rather than
/// create a duplicate when the same call is proposed again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalLookup {
    /// The proposing principal.
    pub proposer: String,
    /// The contract the call resolved to.
    pub contract_id: String,
    /// The call's payload digest.
    pub payload_digest: String,
    /// The call's idempotency key.
    pub idempotency_key: Option<String>,
    /// Only requests unexpired at this time.
    pub now: OffsetDateTime,
}

/// What a call presenting an approval expects it to be bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalClaim {
    /// The approval id presented.
    pub approval_id: String,
    /// The contract the call resolved to.
    pub contract_id: String,
    /// The call's payload digest.
    pub payload_digest: String,
    /// The call's idempotency key.
    pub idempotency_key: Option<String>,
    /// The calling principal (must be the proposer).
    pub principal: String,
    /// The ledger row consuming it.
    pub ledger_id: String,
}

/// The result of trying to consume an approval.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumeOutcome {
    /// Consumed by this call (exactly once).
    Consumed(ApprovalRequest),
    /// Not consumed; the current record explains why (or `None`: not in this tenant).
    Refused(Option<ApprovalRequest>),
}

/// One counter a call must fit into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetReservation {
    /// The counter (e.g. `calls_per_day:<principal>:<contract>:<date>`).
    pub key: String,
    /// How much to reserve.
    pub amount: u64,
    /// The limit the counter may not exceed.
    pub limit: u64,
    /// When the counter may be purged.
    pub expires_at: OffsetDateTime,
}

/// The result of a budget reservation (all counters or none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetOutcome {
    /// Every counter had room; all were incremented.
    Granted,
    /// This counter had no room; nothing was incremented.
    Exhausted {
        /// The counter that refused.
        key: String,
    },
}

/// A new API key (the key itself is never stored, only its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    /// Public id (part of the key string).
    pub id: String,
    /// SHA-256 of the full key string, hex.
    pub key_hash: String,
    /// Tenant.
    pub tenant: String,
    /// Principal.
    pub principal: String,
    /// Granted scopes.
    pub grants: Vec<String>,
    /// Roles (`admin`, `reviewer`, `agent`, …).
    pub roles: Vec<String>,
    /// Free label.
    pub label: Option<String>,
    /// Created.
    pub created_at: OffsetDateTime,
}

/// A stored API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// What was created.
    pub key: NewApiKey,
    /// When it was revoked, if it was.
    pub revoked_at: Option<OffsetDateTime>,
}

text_enum! {
    /// The state of a job.
    JobStatus {
        /// Waiting to run at `run_at`.
        Pending => "pending",
        /// Claimed by a worker until `locked_until`.
        Running => "running",
        /// Finished.
        Done => "done",
        /// Failed for good (dead letter).
        Dead => "dead",
    }
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// Id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// What to do (e.g. `webhook.deliver`).
    pub kind: String,
    /// Parameters.
    pub payload: Value,
    /// Not before.
    pub run_at: OffsetDateTime,
    /// Attempts before the job is dead.
    pub max_attempts: u32,
}

/// A claimed job.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// What was enqueued.
    pub job: NewJob,
    /// Status.
    pub status: JobStatus,
    /// Attempts so far (including this claim).
    pub attempts: u32,
    /// The worker holding it.
    pub locked_by: Option<String>,
    /// Lease end.
    pub locked_until: Option<OffsetDateTime>,
    /// The last error.
    pub last_error: Option<String>,
}

/// A step's job handed on by the worker that records the step (`Store::advance_run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// The worker holding the step's job.
    pub worker: String,
    /// The step's job: completed with the step.
    pub job_id: String,
    /// The lease of the next step's job, claimed by the same worker when it is due.
    pub lease_until: OffsetDateTime,
}

/// What a workflow's tool step records when its call commits, in the transaction that
/// records the call's outcome (`Store::finish_step_attempt`): the step (its `output` is the
/// call's committed result) and what follows it. A step costs its call's writes and nothing more.
#[derive(Debug, Clone, PartialEq)]
pub struct StepFollowUp {
    /// The tenant of the run.
    pub tenant: String,
    /// The step's record as it reads once the call commits (`output`, `ledger_id` and
    /// `finished_at` are filled in then).
    pub step: RunStep,
    /// What follows the step.
    pub advance: RunAdvance,
    /// The step's job, handed on (see `Store::advance_run`).
    pub handoff: Option<Handoff>,
}

impl StepFollowUp {
    /// The step's record when `finish` is a commit of the call recorded as `ledger_id` (its
    /// result is the step's output), finished `now`; `None` for any other outcome, which the
    /// step records itself.
    #[must_use]
    pub fn committed_step(
        &self,
        finish: &AttemptFinish,
        ledger_id: &str,
        now: OffsetDateTime,
    ) -> Option<RunStep> {
        match (finish.outcome, &finish.result) {
            (Outcome::Committed, Some(result)) => Some(RunStep {
                output: Some(result.clone()),
                ledger_id: Some(ledger_id.to_owned()),
                finished_at: now,
                ..self.step.clone()
            }),
            _ => None,
        }
    }
}

/// What `Store::advance_run` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Advanced {
    /// Nothing: the run does not expect this step (recorded by another worker, or ended).
    Stale,
    /// The step is recorded, with what follows it.
    Recorded {
        /// The next step's job, already claimed by the handoff's worker.
        next: Option<Box<Job>>,
    },
}

impl Advanced {
    /// Whether the step was recorded.
    #[must_use]
    pub fn recorded(&self) -> bool {
        matches!(self, Advanced::Recorded { .. })
    }
}

/// How a worker finished a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobCompletion {
    /// Done.
    Done,
    /// Failed; run again at this time (or dead when out of attempts).
    Retry {
        /// Not before.
        run_at: OffsetDateTime,
        /// Why it failed.
        error: String,
    },
    /// Failed for good.
    Dead {
        /// Why.
        error: String,
    },
}

/// A registered contract.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredContract {
    /// Where it is registered: the platform, or the tenant that owns it.
    pub namespace: crate::contract::Namespace,
    /// Name.
    pub name: String,
    /// Version.
    pub version: u32,
    /// Content id.
    pub content_id: String,
    /// The document as authored (without its binding).
    pub body: Value,
    /// The adapter binding.
    pub binding: Option<Value>,
    /// The binding's digest.
    pub binding_digest: Option<String>,
    /// Registered.
    pub registered_at: OffsetDateTime,
    /// Retired, if it was.
    pub retired_at: Option<OffsetDateTime>,
}

/// Whether a registered contract is retired, without its document: what a node compares to
/// notice contracts registered or retired elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractState {
    /// Where it is registered.
    pub namespace: crate::contract::Namespace,
    /// Content id.
    pub content_id: String,
    /// The binding's digest (set once, by the operator).
    pub binding_digest: Option<String>,
    /// Retired, if it was.
    pub retired_at: Option<OffsetDateTime>,
}

/// A tenant the platform operator created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRecord {
    /// The tenant id (the `tenant` of its keys and records).
    pub id: String,
    /// Free label.
    pub label: Option<String>,
    /// Created.
    pub created_at: OffsetDateTime,
}

/// The result of registering a contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Newly registered.
    Registered,
    /// The same body was already registered under this name@version: nothing changed.
    Unchanged,
    /// The same body was registered without a binding, and the operator's registration gave it
    /// one (a stored binding is never replaced: a different one is a conflict).
    Bound,
}

/// A published workflow: its definition as authored (JSON data model), the content id each
/// tool and model step is pinned to, and who published it. Immutable once published.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    /// The tenant that owns it.
    pub tenant: String,
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: u32,
    /// `sha256:<hex>` of the canonical definition: the same name@version may be published
    /// again only with the same digest.
    pub digest: String,
    /// The definition.
    pub document: Value,
    /// Step id → the content id (`tool-contract@sha256:…`) it calls or proposes.
    pub pinned: std::collections::BTreeMap<String, String>,
    /// The principal that published it.
    pub published_by: String,
    /// When.
    pub published_at: OffsetDateTime,
}

/// The result of publishing a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication {
    /// Newly published.
    Published,
    /// The same definition was already published under this name@version: nothing changed.
    Unchanged,
}

/// Where a workflow run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// A step is due or running.
    Running,
    /// Parked (a review, an outcome being reconciled).
    Waiting,
    /// Ended at an `end: completed` step.
    Completed,
    /// Ended at an `end: failed` step, or by a step that failed.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl RunStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Reads a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => RunStatus::Running,
            "waiting" => RunStatus::Waiting,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }

    /// Whether the run has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// A workflow run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// `run_<ulid>`.
    pub id: String,
    /// The tenant it runs in.
    pub tenant: String,
    /// The workflow's name.
    pub workflow: String,
    /// Its version.
    pub version: u32,
    /// The published definition's digest (what runs).
    pub digest: String,
    /// Where it stands.
    pub status: RunStatus,
    /// The validated input.
    pub input: Value,
    /// The principal it acts as: `{id, tenant, grants, roles}` of the key that started it.
    pub principal: Value,
    /// The step due next (none once the run ended).
    pub next_step: Option<String>,
    /// The sequence number the next step record takes (steps are numbered from 0).
    pub next_seq: u32,
    /// The cost of its steps so far.
    pub cost: u64,
    /// Why it failed.
    pub error: Option<String>,
    /// Started.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

/// One executed step of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStep {
    /// The run.
    pub run_id: String,
    /// Its place in the run (0, 1, …).
    pub seq: u32,
    /// The step id.
    pub step_id: String,
    /// The step kind (`tool`, `branch`, `end`, …).
    pub kind: String,
    /// `completed` or `failed`.
    pub status: String,
    /// What it produced (a tool's result; a branch's choice).
    pub output: Option<Value>,
    /// The ledger row of its call, for a tool step.
    pub ledger_id: Option<String>,
    /// Its cost.
    pub cost: u64,
    /// A detail (an error code, the exit taken).
    pub detail: Option<String>,
    /// When it finished.
    pub finished_at: OffsetDateTime,
}

/// What follows a step: the next step's job, or the end of the run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunAdvance {
    /// The run goes on at `step`, through `job`.
    Next {
        /// The next step's id.
        step: String,
        /// Its job.
        job: NewJob,
    },
    /// The run waits (a review's decision) and looks again at `step` through `job`.
    Wait {
        /// The step that looks again.
        step: String,
        /// Its job (due when it next looks).
        job: NewJob,
    },
    /// The run ends.
    End {
        /// `Completed`, `Failed` or `Cancelled`.
        status: RunStatus,
        /// Why, when it failed.
        error: Option<String>,
    },
    /// The run ends at the `end` step `step` that directly follows the recorded one: the two
    /// steps are recorded in one transaction (a tool step followed by an `end` costs its call's
    /// writes and nothing more).
    EndAt {
        /// The `end` step's id.
        step: String,
        /// `Completed` or `Failed`.
        status: RunStatus,
        /// Why, when it failed.
        error: Option<String>,
    },
}

impl RunAdvance {
    /// What the run becomes: its status, its next step and its error.
    pub fn outcome(&self) -> (RunStatus, Option<String>, Option<String>) {
        match self {
            RunAdvance::Next { step, .. } => (RunStatus::Running, Some(step.clone()), None),
            RunAdvance::Wait { step, .. } => (RunStatus::Waiting, Some(step.clone()), None),
            RunAdvance::End { status, error } | RunAdvance::EndAt { status, error, .. } => {
                (*status, None, error.clone())
            }
        }
    }

    /// The job it enqueues, if the run goes on.
    pub fn job(&self) -> Option<&NewJob> {
        match self {
            RunAdvance::Next { job, .. } | RunAdvance::Wait { job, .. } => Some(job),
            RunAdvance::End { .. } | RunAdvance::EndAt { .. } => None,
        }
    }

    /// How the run ends, when this advance ends it.
    pub fn ends(&self) -> Option<RunStatus> {
        match self {
            RunAdvance::End { status, .. } | RunAdvance::EndAt { status, .. } => Some(*status),
            RunAdvance::Next { .. } | RunAdvance::Wait { .. } => None,
        }
    }

    /// How many steps this advance records: the step, and the `end` an [`RunAdvance::EndAt`]
    /// records after it.
    pub fn steps(&self) -> u32 {
        match self {
            RunAdvance::EndAt { .. } => 2,
            _ => 1,
        }
    }

    /// The record of the `end` step an [`RunAdvance::EndAt`] records after `after`.
    pub fn end_record(&self, after: &RunStep) -> Option<RunStep> {
        match self {
            RunAdvance::EndAt { step, .. } => Some(RunStep {
                run_id: after.run_id.clone(),
                seq: after.seq.saturating_add(1),
                step_id: step.clone(),
                kind: "end".into(),
                status: "completed".into(),
                output: None,
                ledger_id: None,
                cost: 0,
                detail: None,
                finished_at: after.finished_at,
            }),
            _ => None,
        }
    }
}

text_enum! {
    /// What a console sign-in record is.
    ConsoleSessionKind {
        /// A signed-in reviewer's session (its token is the session cookie).
        Session => "session",
        /// A one-time sign-in link (`warrant console link`), exchanged for a session once.
        Link => "link",
    }
}

/// A reviewer console sign-in: a session or a one-time link. Its token is never stored, only
/// its hash; the principal is the API key's (by the key's hash), read again on every request,
/// so revoking the key ends the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// SHA-256 (hex) of the token.
    pub token_hash: String,
    /// Session or link.
    pub kind: ConsoleSessionKind,
    /// The hash of the API key the reviewer signed in with.
    pub key_hash: String,
    /// The session's anti-forgery token, in every form it serves.
    pub csrf: String,
    /// Created.
    pub created_at: OffsetDateTime,
    /// The server-side end of the session (or of the link's validity).
    pub expires_at: OffsetDateTime,
}

/// The state of an agent's durable task (the MCP tasks extension) for a call held for review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// The call waits for a reviewer (or its execution is under way).
    Working,
    /// The call ran; the task holds its result (which may be a typed refusal of the run).
    Completed,
    /// The call will not run (rejected, expired, refused); the task holds the typed refusal.
    Failed,
    /// The agent cancelled the task before the call ran.
    Cancelled,
}

impl TaskStatus {
    /// The stored name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "working" => TaskStatus::Working,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }

    /// Whether the task has ended (its result no longer changes).
    pub const fn is_terminal(self) -> bool {
        !matches!(self, TaskStatus::Working)
    }
}

/// A durable task an agent polls for a call held for review (MCP tasks extension): created
/// before its id is returned, readable from any node, ended once with its result.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// The task id (random, unguessable).
    pub id: String,
    /// The tenant.
    pub tenant: String,
    /// The principal that created the task; only it may read or cancel it.
    pub principal: String,
    /// The approval request the call waits on.
    pub approval_id: String,
    /// What runs once the call is approved (the proposal as the agent sent it, its key and
    /// trace), as the lane that created the task wrote it.
    pub call: Value,
    /// Where the task stands.
    pub status: TaskStatus,
    /// The result, once the task has ended.
    pub result: Option<Value>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
    /// When the task and its result are forgotten.
    pub expires_at: OffsetDateTime,
}

/// The kind of the jobs that deliver one event to one webhook endpoint (a message).
pub const WEBHOOK_JOB: &str = "webhook.deliver";

/// A tenant's outbound webhook endpoint (Standard Webhooks).
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookEndpoint {
    /// The tenant.
    pub tenant: String,
    /// The id (`whe_…`).
    pub id: String,
    /// Where events are posted.
    pub url: String,
    /// The event types delivered (empty: every type).
    pub events: Vec<String>,
    /// The signing secret, sealed by the gateway (the store never reads it).
    pub secret: String,
    /// The secret before the last rotation, still signing beside the new one until
    /// `previous_until`.
    pub previous_secret: Option<String>,
    /// When the previous secret stops signing.
    pub previous_until: Option<OffsetDateTime>,
    /// Free text.
    pub description: Option<String>,
    /// Whether events are delivered.
    pub enabled: bool,
    /// Why it was disabled (by its admin, or by a `410 Gone`).
    pub disabled_reason: Option<String>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

/// One delivery attempt of a webhook message.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookAttempt {
    /// The tenant.
    pub tenant: String,
    /// The message (its delivery job's id; the `webhook-id` receivers see is the event's).
    pub message_id: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// When it was made.
    pub at: OffsetDateTime,
    /// The answer's status, when one came.
    pub status: Option<u16>,
    /// How long it took.
    pub latency_ms: u64,
    /// The first bytes of the answer's body.
    pub response: Option<String>,
    /// What went wrong, when no answer came (or it was not a success).
    pub error: Option<String>,
}

/// The kind of the jobs that act on one verified inbound event (start its source's workflow,
/// or make its source's call), enqueued with the event's record.
pub const INBOUND_JOB: &str = "inbound.event";

/// How long a handled inbound event is kept — and so deduplicated — after it arrived (at least
/// the 72 hours providers redeliver for).
pub const INBOUND_RETENTION: time::Duration = time::Duration::days(7);

/// A tenant's inbound webhook source: an outside system that may start governed work by
/// posting signed events to `/v1/inbound/<id>`.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundSource {
    /// The tenant.
    pub tenant: String,
    /// The id (`ins_…`), the last segment of the source's URL.
    pub id: String,
    /// How the source signs its deliveries.
    pub provider: crate::inbound::Provider,
    /// The verifying secret, sealed by the gateway (the store never reads it).
    pub secret: String,
    /// The secret before the last rotation, still accepted until `previous_until`.
    pub previous_secret: Option<String>,
    /// When the previous secret stops being accepted.
    pub previous_until: Option<OffsetDateTime>,
    /// The API key whose principal (and grants) the source's work acts as.
    pub key_id: String,
    /// What a verified event does (`{"workflow": …, "input": …}` or `{"tool": …,
    /// "arguments": …}`), checked by the gateway when the source is made.
    pub action: Value,
    /// Free text.
    pub description: Option<String>,
    /// Whether deliveries are accepted.
    pub enabled: bool,
    /// Deliveries refused so far (bad, missing or stale signatures).
    pub refusals: u64,
    /// Why the last refused delivery was refused.
    pub last_refusal: Option<String>,
    /// When.
    pub last_refusal_at: Option<OffsetDateTime>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

/// Where a verified inbound event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundStatus {
    /// Stored; its job has not acted yet.
    Queued,
    /// Its workflow run was started.
    Started,
    /// Its call was made (whatever the call's outcome: see the event's detail and ledger row).
    Done,
    /// It could not act (its detail says why).
    Failed,
}

impl InboundStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            InboundStatus::Queued => "queued",
            InboundStatus::Started => "started",
            InboundStatus::Done => "done",
            InboundStatus::Failed => "failed",
        }
    }

    /// Reads a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            InboundStatus::Queued,
            InboundStatus::Started,
            InboundStatus::Done,
            InboundStatus::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// One verified inbound event, kept for [`INBOUND_RETENTION`]: its source and provider event id
/// are unique, so a redelivery is counted and starts nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundEvent {
    /// The tenant.
    pub tenant: String,
    /// The source.
    pub source_id: String,
    /// The provider's event id.
    pub event_id: String,
    /// The body, parsed after its signature was verified.
    pub body: Value,
    /// SHA-256 of the raw body, hex.
    pub body_digest: String,
    /// Where it stands.
    pub status: InboundStatus,
    /// How many times it was delivered (1, plus each redelivery).
    pub deliveries: u32,
    /// What it did: the run started, the call's ledger row and outcome, or why it failed.
    pub detail: Option<Value>,
    /// When it first arrived.
    pub received_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

/// What the sweeper removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeCounts {
    /// Expired idempotency records.
    pub idempotency: u64,
    /// Expired budget counters.
    pub budget_counters: u64,
    /// Approvals moved from pending/approved to expired.
    pub approvals_expired: u64,
    /// Console sessions and sign-in links past their end.
    pub console_sessions: u64,
    /// Spent single-use tokens and agent tasks past their end.
    pub tokens_and_tasks: u64,
    /// Jobs done (delivered events, recorded steps) and due more than [`DONE_JOB_RETENTION`]
    /// ago.
    pub done_jobs: u64,
    /// Inbound events handled and received more than [`INBOUND_RETENTION`] ago.
    pub inbound_events: u64,
}

/// How long a done job is kept after it was due (for inspection), before the sweeper removes it.
pub const DONE_JOB_RETENTION: time::Duration = time::Duration::days(1);

/// An unresolved ledger row (`attempting` or `unknown`) a reconciler claimed with
/// [`crate::store::Store::claim_unresolved`], with its reconciliation schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedRow {
    /// The ledger row.
    pub entry: LedgerEntry,
    /// Inquiries that left the row unresolved so far (the backoff's exponent).
    pub reconcile_attempts: u32,
    /// What the last inquiry answered, if one was made.
    pub reconcile_note: Option<String>,
}

/// What [`crate::store::Store::mark_overdue`] found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OverdueSweep {
    /// Rows marked overdue by this sweep (each is marked, and so reported, once).
    pub newly: Vec<LedgerEntry>,
    /// Unresolved rows marked overdue, in total (this sweep's included).
    pub overdue: u64,
}
