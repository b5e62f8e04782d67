//! `decide`: the single entry point every lane calls (PRODUCT §1).
//!
//! ```text
//! parse → contract (registry) → schema → canonical digest → identity → policy → scopes
//!   → guards → idempotency key rule → budget → approval → idempotency record → Decision
//! ```
//!
//! Every refusal is a typed `reject(stage, code, detail)` and every refused or held call
//! writes its ledger row here; an allowed call's row is written by the runtime's write-ahead
//! `begin_attempt`, from the template the [`Allowed`] carries. A store failure is returned as
//! an error and nothing is allowed (fail closed).
//!
//! Two details of ordering are deliberate:
//! - the idempotency-key rule runs before budget and approval, because an approval binds to
//!   the key;
//! - for a call that needs approval, the idempotency record is read before the approval stage:
//!   an idempotent replay of a committed call needs no second approval (no new effect
//!   happens), while a conflicting record (key reused with another payload, or in flight) is
//!   reported at the idempotency stage before any approval is requested or spent: such a call
//!   cannot run. For any other call with a key the record is read by the runtime's
//!   write-ahead commit, in the transaction that claims the key, before it spends anything: a
//!   replay, a conflict or an operation in flight takes nothing there and is answered as it
//!   would be here (an unknown one is reconciled first, then replayed if that finished it).
//!   Reading it here too cost every such call a second trip to the store (a reader
//!   connection's wake-ups, and its page cache read again after every commit: about a fifth of
//!   the CPU of a write with a key).
//!   Nothing is spent here: the approval and the budget are taken by the runtime's
//!   write-ahead commit, together with the idempotency claim, or not at all.

use std::sync::Arc;

use serde_json::Value;
use time::{Duration, OffsetDateTime};

use crate::authority::{
    ApprovalBinding, ApprovalRecord, Principal, attenuate, bind_approval, idempotency_requirement,
};
use crate::budget::{BudgetConfig, ExhaustedBudgets, plan};
use crate::contract::{ApprovalMode, Contract};
use crate::decision::{
    Allowed, ApprovalNeeded, ApprovalState, Decision, IdempotencyState, RejectCode, Rejection, Stage,
};
use crate::env::Env;
use crate::guard::Guards;
use crate::json::Limits;
use crate::policy::{PolicyAction, PolicyEngine, PolicyRequest, PolicyVerdict};
use crate::proposal::{Envelope, ValidatedProposal};
use crate::records::*;
use crate::redact::{RedactionKey, redact_annotated};
use crate::registry::Registry;
use crate::seal::ArgumentSeal;
use crate::store::{Store, StoreError};

/// Pipeline settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Size and nesting limits for proposals.
    pub limits: Limits,
    /// How long an approval request stays valid (default 15 minutes).
    pub approval_ttl: Duration,
    /// How long after a reviewer rejected a call the identical call (same proposer, contract,
    /// payload and key) is answered with that rejection instead of asking a reviewer again
    /// (default 15 minutes; zero asks again at once).
    pub rejection_window: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Limits::PROPOSAL,
            approval_ttl: Duration::minutes(15),
            rejection_window: Duration::minutes(15),
        }
    }
}

/// The values of `warrant_decisions_total`'s `decision` label, as [`Decision::as_str`] gives them.
const DECISION_LABELS: [&str; 3] = ["ALLOW", "NEEDS_APPROVAL", "REJECT"];

/// Everything `decide` needs; built once at start and shared by every lane.
pub struct Authority {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    policy: Arc<dyn PolicyEngine>,
    guards: Arc<Guards>,
    budgets: BudgetConfig,
    redaction: RedactionKey,
    env: Arc<dyn Env>,
    settings: Settings,
    exhausted: ExhaustedBudgets,
    seal: Option<Arc<dyn ArgumentSeal>>,
    /// `warrant_decisions_total`'s handles for `ALLOW`, `NEEDS_APPROVAL` and `REJECT`, resolved
    /// on the first decision: `counter!` with a label builds, hashes and looks up its key in
    /// the recorder on every use (about 600 instructions).
    decisions: std::sync::OnceLock<[metrics::Counter; 3]>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// One call as a lane received it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Call<'a> {
    /// The untrusted proposal bytes.
    pub bytes: &'a [u8],
    /// An idempotency key carried by the transport (`Idempotency-Key` header, MCP `_meta`).
    pub idempotency_key: Option<&'a str>,
    /// An approval id carried by the transport.
    pub approval_id: Option<&'a str>,
    /// The trace id of this proposal.
    pub trace_id: &'a str,
    /// The workflow run, if the call is a workflow step.
    pub run_id: Option<&'a str>,
    /// The workflow step.
    pub step_id: Option<&'a str>,
    /// Held for a human approval whatever the contract's approval mode: a workflow step whose
    /// workflow requires review of this call (its review step asks for the approval, and the
    /// tool step presents it), through the same approval records and binding as a per-call
    /// contract.
    pub review: bool,
    /// How long an approval this call asks for stays valid (a workflow review's `expires_in`);
    /// [`Settings::approval_ttl`] when `None`.
    pub review_ttl: Option<Duration>,
    /// Who may decide the approval this call asks for, beyond policy (a workflow review's
    /// `reviewers`).
    pub reviewers: Option<&'a ReviewerRule>,
    /// A note the call's ledger row carries in its `detail` unless a refusal or a failure
    /// says more (a reviewer's edit: who edited which request, from which digest, and why).
    /// Set by Warrant's own lanes, never from a caller's bytes.
    pub note: Option<&'a str>,
}

/// The prefix of a workflow run's idempotency keys (`<run id>.<step>.<visit>`, run ids being
/// `run_…`): reserved for calls that belong to a run ([`Call::run_id`]).
pub const RUN_KEY_PREFIX: &str = "run_";

/// How a call is approved: per call when its contract says so, or when a workflow's review
/// requires it ([`Call::review`]).
fn approval_mode(contract: &Contract, call: &Call<'_>) -> ApprovalMode {
    if call.review {
        ApprovalMode::PerCall
    } else {
        contract.approval()
    }
}

/// What the stages established, for reports (`warrant check`) and responses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// The schema verdict, once reached.
    pub schema: Option<bool>,
    /// The payload digest, once the arguments validated.
    pub payload_digest: Option<crate::canon::Sha256Digest>,
    /// The policy verdict, once reached.
    pub policy: Option<PolicyVerdict>,
    /// `grant ∩ contract.scopes`, once attenuated.
    pub delegated_scopes: Option<Vec<String>>,
    /// The idempotency state, once checked.
    pub idempotency: Option<IdempotencyState>,
    /// The approval state, once checked.
    pub approval: Option<ApprovalState>,
}

/// The decision with its ledger id and facts.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The decision.
    pub decision: Decision,
    /// The ledger row of this proposal (written here unless the decision is `allow`).
    pub ledger_id: String,
    /// What the stages established.
    pub facts: Facts,
}

/// Why a review was not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewRefusal {
    /// No such approval in the reviewer's tenant.
    NotFound,
    /// Policy does not let this principal review this tool (ids of deciding policies).
    Forbidden(Vec<String>),
    /// The reviewer proposed the call.
    SelfReview,
    /// Already decided or consumed.
    NotPending(ApprovalStatus),
    /// The request expired.
    Expired,
}

/// What the approval stage decided for a call that needs approval.
enum ApprovalStep {
    /// The call presents an approved approval bound to it: the runtime consumes it.
    Proceed(ApprovalClaim),
    /// The call waits for (or is newly held for) a reviewer.
    Hold(Decision),
}

/// One proposal in progress: the ledger row being built and the facts so far.
struct Progress {
    row: LedgerEntry,
    facts: Facts,
}

mod metric {
    pub const DECISIONS: &str = "warrant_decisions_total";
    pub const REJECTIONS: &str = "warrant_rejections_total";
    pub const SCHEMA: &str = "warrant_schema_rejections_total";
    pub const POLICY: &str = "warrant_policy_denials_total";
    pub const GUARD: &str = "warrant_guard_refusals_total";
    pub const APPROVAL_REQUESTS: &str = "warrant_approval_requests_total";
    pub const APPROVAL_EXPIRIES: &str = "warrant_approval_expiries_total";
    pub const BUDGET: &str = "warrant_budget_exhausted_total";
    pub const IDEMPOTENCY: &str = "warrant_idempotency_conflicts_total";
    pub const REVIEWS: &str = "warrant_reviews_total";
}

/// Counts a refusal by stage and code (and in its stage's own counter): for the refusals of
/// the decision, and of the runtime's write-ahead commit alike.
pub fn count_rejection(rejection: &Rejection) {
    let stage = rejection.stage();
    metrics::counter!(metric::REJECTIONS, "stage" => stage.as_str(), "code" => rejection.code().as_str())
        .increment(1);
    let specific = match (stage, rejection.code()) {
        (Stage::Schema, _) => Some(metric::SCHEMA),
        (Stage::Policy, _) => Some(metric::POLICY),
        (Stage::Guard, _) => Some(metric::GUARD),
        (Stage::Budget, _) => Some(metric::BUDGET),
        (_, RejectCode::ApprovalExpired) => Some(metric::APPROVAL_EXPIRIES),
        (_, RejectCode::IdempotencyKeyReused | RejectCode::IdempotencyInFlight) => Some(metric::IDEMPOTENCY),
        _ => None,
    };
    if let Some(name) = specific {
        metrics::counter!(name).increment(1);
    }
}

impl Authority {
    /// Assembles the pipeline.
    #[allow(clippy::too_many_arguments, reason = "a constructor wiring every port once")]
    pub fn new(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        policy: Arc<dyn PolicyEngine>,
        guards: Arc<Guards>,
        budgets: BudgetConfig,
        redaction: RedactionKey,
        env: Arc<dyn Env>,
        settings: Settings,
    ) -> Self {
        Authority {
            store,
            registry,
            policy,
            guards,
            budgets,
            redaction,
            env,
            settings,
            exhausted: ExhaustedBudgets::default(),
            seal: None,
            decisions: std::sync::OnceLock::new(),
        }
    }

    /// Counts a decision by its label ([`Decision::as_str`], one of [`DECISION_LABELS`]).
    fn count_decision(&self, label: &'static str) {
        let counters = self.decisions.get_or_init(|| {
            DECISION_LABELS.map(|label| metrics::counter!(metric::DECISIONS, "decision" => label))
        });
        match DECISION_LABELS
            .iter()
            .position(|l| *l == label)
            .and_then(|i| counters.get(i))
        {
            Some(counter) => counter.increment(1),
            None => metrics::counter!(metric::DECISIONS, "decision" => label).increment(1),
        }
    }

    /// Keeps a sealed copy of the exact arguments of each held call whose contract has a
    /// sensitive field (see [`crate::seal`]); without it, such a call is stored only redacted.
    #[must_use]
    pub fn with_seal(mut self, seal: Arc<dyn ArgumentSeal>) -> Self {
        self.seal = Some(seal);
        self
    }

    /// The exact arguments of `request` from its sealed copy, when it has one that opens and
    /// is exactly the payload it is bound to.
    pub fn unsealed_arguments(&self, request: &ApprovalRequest) -> Option<serde_json::Map<String, Value>> {
        let r = &request.request;
        crate::seal::open_arguments(
            self.seal.as_deref()?,
            r.sealed_arguments.as_deref()?,
            &r.tenant,
            &r.id,
            &r.payload_digest,
        )
    }

    /// Notes that the runtime found `tenant`'s counter of `reservation` without room for a
    /// call this pipeline allowed (see [`ExhaustedBudgets`]).
    pub fn note_exhausted(&self, tenant: &str, reservation: &BudgetReservation) {
        self.exhausted.note(tenant, reservation);
    }

    /// The store this pipeline writes to.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The contract registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The environment (clock and ids).
    pub fn env(&self) -> &Arc<dyn Env> {
        &self.env
    }

    /// A proposal's ledger row as it starts: its id, the principal, trace, run and step.
    fn progress(&self, principal: &Principal, call: &Call<'_>, now: OffsetDateTime) -> (String, Progress) {
        let ledger_id = self.env.new_id("led");
        let mut row = LedgerEntry::new(
            ledger_id.clone(),
            principal.tenant(),
            principal.id(),
            call.trace_id,
            "",
            now,
        );
        row.run_id = call.run_id.map(str::to_owned);
        row.step_id = call.step_id.map(str::to_owned);
        row.detail = call.note.map(str::to_owned);
        (
            ledger_id,
            Progress {
                row,
                facts: Facts::default(),
            },
        )
    }

    /// Decides one proposal for an authenticated principal.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot record or answer; nothing is allowed then.
    pub async fn decide(&self, principal: &Principal, call: &Call<'_>) -> Result<Decided, StoreError> {
        let now = self.env.now();
        let (ledger_id, mut p) = self.progress(principal, call, now);
        let decision = match self.stages(principal, call, now, &mut p).await? {
            Ok(decision) => decision,
            Err(rejection) => Decision::Reject(rejection),
        };
        self.count_decision(decision.as_str());
        match &decision {
            Decision::Reject(rejection) => {
                count_rejection(rejection);
                p.row.refuse(rejection);
                self.store.insert_ledger(&p.row).await?;
            }
            Decision::NeedsApproval(needed) => {
                p.row.decision = LedgerDecision::NeedsApproval;
                p.row.approval_id = needed.request_id.clone();
                self.store.insert_ledger(&p.row).await?;
            }
            // Written by the runtime's `begin_attempt`, atomically with the idempotency claim.
            Decision::Allow(_) => {}
        }
        Ok(Decided {
            decision,
            ledger_id,
            facts: p.facts,
        })
    }

    /// The stages in order. `Ok(Err(rejection))` is a refusal; `Err` a store failure.
    async fn stages(
        &self,
        principal: &Principal,
        call: &Call<'_>,
        now: OffsetDateTime,
        p: &mut Progress,
    ) -> Result<Result<Decision, Rejection>, StoreError> {
        macro_rules! reject {
            ($r:expr) => {
                return Ok(Err($r))
            };
        }
        // parse (+ identity: the envelope refuses identity fields)
        let mut envelope = match Envelope::parse(call.bytes, self.settings.limits) {
            Ok(e) => e,
            Err(r) => reject!(r),
        };
        p.row.tool = truncated(envelope.tool(), 64).to_owned();
        if let Some(key) = call.idempotency_key {
            envelope = match envelope.with_transport_key(key) {
                Ok(e) => e,
                Err(r) => reject!(r),
            };
        }
        if let Some(id) = call.approval_id {
            envelope = match envelope.with_transport_approval(id) {
                Ok(e) => e,
                Err(r) => {
                    p.facts.approval = Some(ApprovalState::Mismatch);
                    reject!(r)
                }
            };
        }
        p.row.idempotency_key = envelope.idempotency_key().map(str::to_owned);
        // A workflow run's steps carry keys `<run id>.<step>.<visit>`, and the server reads the
        // run from them (waking it on a decision, keeping its reviews out of edits): no other
        // call may use one.
        if call.run_id.is_none()
            && envelope
                .idempotency_key()
                .is_some_and(|k| k.starts_with(RUN_KEY_PREFIX))
        {
            reject!(
                Rejection::new(
                    RejectCode::IdempotencyKeyInvalid,
                    format!(
                        "idempotency keys starting with `{RUN_KEY_PREFIX}` are reserved for workflow runs"
                    ),
                )
                .at("/idempotency_key")
            );
        }
        let (contract, proposal, scopes) = match self.front(principal, envelope, now, p).await? {
            Ok(front) => front,
            Err(r) => reject!(r),
        };

        // idempotency key rule (before any approval is requested: the approval binds to it)
        let idempotency = match idempotency_requirement(&contract, &proposal) {
            Ok(state) => state,
            Err(r) => {
                p.facts.idempotency = Some(IdempotencyState::RequiredMissing);
                reject!(r)
            }
        };
        p.facts.idempotency = Some(idempotency);
        let scope = proposal.idempotency_key().map(|key| IdempotencyScope {
            tenant: principal.tenant().to_owned(),
            principal: principal.id().to_owned(),
            contract_id: contract.id_str().to_owned(),
            key: key.to_owned(),
        });

        // idempotency record, read now for a call that needs approval (see the module
        // documentation); for any other call the write-ahead commit reads it, in the
        // transaction that would claim the key.
        // An expired record is free only once its operation finished; an expired record still
        // in flight or unknown is reconciled first, like an unknown one.
        let mode = approval_mode(&contract, call);
        let claimed_later = scope.is_some() && mode == ApprovalMode::None;
        let existing = match &scope {
            Some(scope) if !claimed_later => self
                .store
                .get_idempotency(scope)
                .await?
                .filter(|r| !crate::store::may_take_over(r, now)),
            _ => None,
        };
        let digest = p.row.payload_digest.as_deref().unwrap_or_default();
        let conflict = match &existing {
            Some(r) if r.payload_digest != digest => Some(
                Rejection::new(
                    RejectCode::IdempotencyKeyReused,
                    "the idempotency key was used with a different payload",
                )
                .at("/idempotency_key"),
            ),
            // An `unknown` record of the same call is not a conflict: it continues below like a
            // replay, and the runtime reconciles it before anything else runs.
            Some(r) if r.status == IdempotencyStatus::InFlight && r.expires_at > now => Some(
                Rejection::new(
                    RejectCode::IdempotencyInFlight,
                    "a call with this idempotency key is in flight",
                )
                .at("/idempotency_key"),
            ),
            _ => None,
        };
        if let Some(record) = existing.filter(|_| conflict.is_none()) {
            // A replay of a call that already ran (or whose outcome is being reconciled): the
            // same operation, so no new budget or approval.
            p.facts.approval = Some(match mode {
                ApprovalMode::None => ApprovalState::NotRequired,
                ApprovalMode::PerCall => ApprovalState::BoundToCall,
            });
            return Ok(Ok(self.allow(
                contract,
                proposal,
                scopes,
                idempotency,
                scope,
                AttemptClaims::default(),
                Some(record),
                p,
            )));
        }

        // budget: planned here, reserved by the runtime in the call's write-ahead commit. A
        // counter this node already saw refuse the same amount (at the same limit, within its
        // window) refuses the call now, so an exhausted budget does not keep admitting reads
        // that are only refused once they ran.
        // (Not for a call whose key is claimed later: it may be the replay of a call that ran,
        // which is answered whatever the budget; the write-ahead commit reads the key first.)
        let reservations = plan(&self.budgets, &contract, principal, call.run_id, now);
        if !claimed_later && let Some(key) = self.exhausted.refuses(principal.tenant(), &reservations, now) {
            reject!(crate::budget::exhausted(&key))
        }
        let approval = match mode {
            ApprovalMode::None => {
                p.facts.approval = Some(ApprovalState::NotRequired);
                if let Some(rejection) = conflict {
                    reject!(rejection)
                }
                None
            }
            // Boxed: the approval stage's state is large and only this path needs it, so the
            // future of every other call stays small (it is moved whenever it is polled
            // from a new place).
            ApprovalMode::PerCall => {
                match Box::pin(self.approval_stage(principal, &contract, &proposal, conflict, call, now, p))
                    .await?
                {
                    Ok(ApprovalStep::Proceed(claim)) => Some(claim),
                    Ok(ApprovalStep::Hold(decision)) => return Ok(Ok(decision)),
                    Err(rejection) => reject!(rejection),
                }
            }
        };
        Ok(Ok(self.allow(
            contract,
            proposal,
            scopes,
            idempotency,
            scope,
            AttemptClaims {
                approval,
                reservations,
            },
            None,
            p,
        )))
    }

    /// The stages every proposal passes before anything is held or claimed: the contract,
    /// the schema and canonical digest, the arguments as the ledger stores them, policy, scope
    /// attenuation and guards.
    async fn front(
        &self,
        principal: &Principal,
        envelope: Envelope,
        now: OffsetDateTime,
        p: &mut Progress,
    ) -> Result<
        Result<
            (
                Arc<Contract>,
                ValidatedProposal,
                crate::authority::DelegatedScopes,
            ),
            Rejection,
        >,
        StoreError,
    > {
        macro_rules! reject {
            ($r:expr) => {
                return Ok(Err($r))
            };
        }
        // contract
        let contract = match self.registry.resolve(&envelope, principal.tenant(), now).await? {
            Ok(c) => c,
            Err(r) => reject!(r),
        };
        p.row.contract_id = Some(contract.id_str().to_owned());
        p.row.binding_digest = contract.adapter().map(|a| a.digest().text());

        // schema + canonical digest
        let proposal = match ValidatedProposal::validate(envelope, &contract) {
            Ok(v) => v,
            Err(r) => {
                p.facts.schema = Some(r.stage() != Stage::Schema);
                reject!(r)
            }
        };
        p.facts.schema = Some(true);
        p.facts.payload_digest = Some(proposal.payload_digest());
        p.row.payload_digest = Some(proposal.payload_digest().text());
        // One walk of the schema's annotations serves redaction now and the guards below; a
        // walk that overflows refuses the call (its arguments are then not stored at all).
        let annotations = match contract.input_schema().annotations(proposal.arguments()) {
            Ok(a) => a,
            Err(r) => reject!(r),
        };
        p.row.arguments = Some(if annotations.any_sensitive() {
            redact_annotated(&annotations, proposal.arguments(), &self.redaction)
        } else {
            Value::Object(proposal.arguments().clone())
        });

        // identity: the principal comes from authentication; the tenant of every record
        // written below is the principal's.

        // policy
        let verdict = self.policy.authorize(&PolicyRequest {
            principal,
            action: PolicyAction::Invoke,
            contract: &contract,
            arguments: proposal.arguments(),
        });
        p.facts.policy = Some(verdict.clone());
        if let PolicyVerdict::Deny { policies, errors } = &verdict {
            reject!(policy_denial(policies, errors))
        }

        // scope attenuation
        let scopes = match attenuate(principal, &contract) {
            Ok(s) => s,
            Err(r) => reject!(r),
        };
        p.facts.delegated_scopes = Some(scopes.iter().map(str::to_owned).collect());

        // guards
        if let Err(r) = self.guards.check_annotations(principal.tenant(), &annotations) {
            reject!(r)
        }

        Ok(Ok((contract, proposal, scopes)))
    }

    /// Vets a proposal a workflow's model step made: the stages of [`Authority::decide`] up to
    /// and including the guards — the strict parse of the model's argument bytes (by
    /// [`Envelope::for_arguments`]), the contract, schema, policy, scopes and guards — and
    /// nothing that holds or claims (no idempotency record, budget or approval: the tool step
    /// that later makes the call decides it whole). A refusal is written to the ledger like any
    /// other; an accepted proposal is recorded by its step.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot record or answer.
    pub async fn vet(
        &self,
        principal: &Principal,
        envelope: Result<Envelope, Rejection>,
        call: &Call<'_>,
    ) -> Result<Result<ValidatedProposal, (Rejection, String)>, StoreError> {
        let now = self.env.now();
        let (ledger_id, mut p) = self.progress(principal, call, now);
        let rejection = match envelope {
            Ok(envelope) => {
                p.row.tool = truncated(envelope.tool(), 64).to_owned();
                match self.front(principal, envelope, now, &mut p).await? {
                    Ok((_, proposal, _)) => return Ok(Ok(proposal)),
                    Err(r) => r,
                }
            }
            Err(r) => r,
        };
        self.count_decision("REJECT");
        count_rejection(&rejection);
        p.row.refuse(&rejection);
        self.store.insert_ledger(&p.row).await?;
        Ok(Err((rejection, ledger_id)))
    }

    /// The approval stage of a contract with per-call approval, after the idempotency
    /// conflict (a contract without approvals needs only the conflict check, done by the
    /// caller): the hold of a call without a usable approval, or the claim on the approval
    /// the call presents, bound to it. The approval is consumed by the runtime's write-ahead
    /// commit, not here.
    #[allow(clippy::too_many_arguments, reason = "the call's parts the stage reads")]
    async fn approval_stage(
        &self,
        principal: &Principal,
        contract: &Contract,
        proposal: &ValidatedProposal,
        conflict: Option<Rejection>,
        call: &Call<'_>,
        now: OffsetDateTime,
        p: &mut Progress,
    ) -> Result<Result<ApprovalStep, Rejection>, StoreError> {
        let tenant = principal.tenant();
        // A key bound to another payload can never run, and a key in flight is the same
        // operation already running (its approval consumed by it): either answer comes before
        // asking a reviewer or spending an approval.
        if let Some(rejection) = conflict {
            // The key was taken by an edited version of this call (approve with edits): say
            // so, naming the approval that replaced the one presented.
            if rejection.code() == RejectCode::IdempotencyKeyReused
                && let Some(id) = proposal.approval()
                && let Some(request) = self.store.get_approval(tenant, id, now).await?
                && request.superseded_by.is_some()
                && let ApprovalBinding::Refused(state, replaced) = bind(&request, proposal, principal, now)
            {
                p.row.approval_id = Some(id.to_owned());
                p.facts.approval = Some(state);
                return Ok(Err(replaced.at("/approval")));
            }
            p.facts.approval = Some(match proposal.approval() {
                None => ApprovalState::RequiredMissing,
                Some(_) => ApprovalState::Mismatch,
            });
            return Ok(Err(rejection));
        }
        let request = match proposal.approval() {
            None => {
                p.facts.approval = Some(ApprovalState::RequiredMissing);
                return Ok(self
                    .request_approval(principal, contract, proposal, call, now, p)
                    .await?
                    .map(ApprovalStep::Hold));
            }
            Some(id) => {
                let Some(request) = self.store.get_approval(tenant, id, now).await? else {
                    p.facts.approval = Some(ApprovalState::Mismatch);
                    return Ok(Err(Rejection::new(
                        RejectCode::ApprovalNotFound,
                        "no such approval in this tenant",
                    )
                    .at("/approval")));
                };
                p.row.approval_id = Some(id.to_owned());
                match bind(&request, proposal, principal, now) {
                    ApprovalBinding::Bound => request,
                    ApprovalBinding::Pending => {
                        p.facts.approval = Some(ApprovalState::RequiredMissing);
                        return Ok(Ok(ApprovalStep::Hold(needed(contract, proposal, &request))));
                    }
                    ApprovalBinding::Refused(state, rejection) => {
                        p.facts.approval = Some(state);
                        return Ok(Err(rejection.at("/approval")));
                    }
                }
            }
        };
        let claim = ApprovalClaim {
            approval_id: request.request.id.clone(),
            contract_id: contract.id_str().to_owned(),
            payload_digest: proposal.payload_digest().text(),
            idempotency_key: proposal.idempotency_key().map(str::to_owned),
            principal: principal.id().to_owned(),
            ledger_id: p.row.id.clone(),
        };
        p.facts.approval = Some(ApprovalState::BoundToCall);
        Ok(Ok(ApprovalStep::Proceed(claim)))
    }

    /// Creates (or finds the pending) approval request for this exact call.
    async fn request_approval(
        &self,
        principal: &Principal,
        contract: &Contract,
        proposal: &ValidatedProposal,
        call: &Call<'_>,
        now: OffsetDateTime,
        p: &mut Progress,
    ) -> Result<Result<Decision, Rejection>, StoreError> {
        let lookup = ApprovalLookup {
            proposer: principal.id().to_owned(),
            contract_id: contract.id_str().to_owned(),
            payload_digest: proposal.payload_digest().text(),
            idempotency_key: proposal.idempotency_key().map(str::to_owned),
            now,
        };
        let request = match self
            .store
            .find_pending_approval(principal.tenant(), &lookup)
            .await?
        {
            Some(existing) => existing,
            None => {
                if self.settings.rejection_window > Duration::ZERO
                    && let Some(rejected) = self
                        .store
                        .find_rejected_approval(
                            principal.tenant(),
                            &lookup,
                            now - self.settings.rejection_window,
                        )
                        .await?
                {
                    p.row.approval_id = Some(rejected.request.id.clone());
                    return Ok(Err(recently_rejected(&rejected, self.settings.rejection_window)));
                }
                let id = self.env.new_id("apr");
                let sealed_arguments = match &self.seal {
                    Some(seal) if contract.has_sensitive_fields() => Some(seal.seal(
                        proposal.canonical_arguments(),
                        &crate::seal::approval_aad(principal.tenant(), &id),
                    )),
                    _ => None,
                };
                let new = NewApproval {
                    id,
                    tenant: principal.tenant().to_owned(),
                    contract_id: lookup.contract_id.clone(),
                    tool: contract.name().to_owned(),
                    proposer: lookup.proposer.clone(),
                    payload_digest: lookup.payload_digest.clone(),
                    idempotency_key: lookup.idempotency_key.clone(),
                    // Exactly the ledger's copy: sensitive values as their keyed hashes, so the
                    // approval keeps no more than the ledger does. Nothing binds to it: the
                    // approval binds to `payload_digest`, computed over the call's own canonical
                    // arguments before redaction, and a review is decided on this copy with a
                    // context that has no sensitive field (`warrant-policy`).
                    arguments: p
                        .row
                        .arguments
                        .clone()
                        .unwrap_or_else(|| Value::Object(proposal.arguments().clone())),
                    sealed_arguments,
                    created_at: now,
                    expires_at: now + call.review_ttl.unwrap_or(self.settings.approval_ttl),
                    reviewers: call.reviewers.cloned(),
                };
                self.store.create_approval(&new).await?;
                metrics::counter!(metric::APPROVAL_REQUESTS).increment(1);
                ApprovalRequest::pending(new)
            }
        };
        p.row.approval_id = Some(request.request.id.clone());
        Ok(Ok(needed(contract, proposal, &request)))
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "assembles the one value that proves every stage passed"
    )]
    fn allow(
        &self,
        contract: Arc<Contract>,
        proposal: ValidatedProposal,
        scopes: crate::authority::DelegatedScopes,
        idempotency: IdempotencyState,
        scope: Option<IdempotencyScope>,
        claims: AttemptClaims,
        replay: Option<IdempotencyRecord>,
        p: &mut Progress,
    ) -> Decision {
        // The row is not needed after an `allow` (only refusals and holds are written here).
        let mut row = std::mem::take(&mut p.row);
        row.decision = LedgerDecision::Allow;
        row.outcome = Some(Outcome::Attempting);
        // Only an approval the approval stage looked up, bound and consumed is the call's;
        // an `approval` field on a contract without approvals is not (fuzzing found that).
        let approval_id = row.approval_id.clone();
        Decision::Allow(Box::new(Allowed::new(
            proposal,
            scopes,
            approval_id,
            idempotency,
            crate::decision::AllowedContext {
                contract,
                ledger: row,
                scope,
                claims,
                replay,
            },
        )))
    }

    /// Records a reviewer's verdict on an approval request of the reviewer's tenant, if
    /// policy lets the reviewer review that tool and the reviewer did not propose the call.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn review(
        &self,
        reviewer: &Principal,
        approval_id: &str,
        verdict: Verdict,
        reason: Option<&str>,
    ) -> Result<Result<ApprovalRequest, ReviewRefusal>, StoreError> {
        let now = self.env.now();
        let tenant = reviewer.tenant();
        let Some(request) = self.store.get_approval(tenant, approval_id, now).await? else {
            return Ok(Err(ReviewRefusal::NotFound));
        };
        match self.review_verdict(reviewer, &request, now).await? {
            None => return Ok(Err(ReviewRefusal::NotFound)),
            Some(PolicyVerdict::Deny { policies, .. }) => return Ok(Err(ReviewRefusal::Forbidden(policies))),
            Some(PolicyVerdict::Allow) => {}
        }
        let result = self
            .store
            .decide_approval(tenant, approval_id, reviewer.id(), verdict, reason, now)
            .await?;
        let label = match (&result, verdict) {
            (Ok(_), Verdict::Approve) => "approved",
            (Ok(_), Verdict::Reject) => "rejected",
            (Err(_), _) => "refused",
        };
        metrics::counter!(metric::REVIEWS, "result" => label).increment(1);
        Ok(result.map_err(|refusal| match refusal {
            DecideRefusal::NotFound => ReviewRefusal::NotFound,
            DecideRefusal::SelfReview => ReviewRefusal::SelfReview,
            DecideRefusal::NotPending(status) => ReviewRefusal::NotPending(status),
            DecideRefusal::Expired => {
                metrics::counter!(metric::APPROVAL_EXPIRIES).increment(1);
                ReviewRefusal::Expired
            }
        }))
    }

    /// Whether policy lets `reviewer` review this approval request: who may see an approval
    /// is who may decide it (the proposer included, if policy lets it review the tool; it
    /// still cannot decide its own call). A request of another tenant, or of a contract the
    /// registry no longer knows, is never reviewable.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn may_review(
        &self,
        reviewer: &Principal,
        request: &ApprovalRequest,
    ) -> Result<bool, StoreError> {
        if request.request.tenant != reviewer.tenant() {
            return Ok(false);
        }
        let now = self.env.now();
        Ok(matches!(
            self.review_verdict(reviewer, request, now).await?,
            Some(PolicyVerdict::Allow)
        ))
    }

    /// The exact arguments of `request`, sensitive values in clear, for `viewer` — only when
    /// policy lets `viewer` **reveal** the tool's sensitive values (the `reveal` action, asked
    /// with the stored, redacted arguments as its context, like a review), and the request
    /// still holds its sealed copy (pending or approved and unexpired: the store drops the
    /// copy when the request is consumed, rejected or expired). `None` otherwise: the viewer
    /// sees the keyed hashes.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn revealed_arguments(
        &self,
        viewer: &Principal,
        request: &ApprovalRequest,
    ) -> Result<Option<serde_json::Map<String, Value>>, StoreError> {
        let now = self.env.now();
        let live = matches!(request.status, ApprovalStatus::Pending | ApprovalStatus::Approved)
            && !request.lapsed(now);
        if request.request.tenant != viewer.tenant() || request.request.sealed_arguments.is_none() || !live {
            return Ok(None);
        }
        match self
            .stored_verdict(viewer, PolicyAction::Reveal, request, now)
            .await?
        {
            Some(PolicyVerdict::Allow) => Ok(self.unsealed_arguments(request)),
            _ => Ok(None),
        }
    }

    /// The requests of `requests` that `reviewer` may review ([`Authority::may_review`]), in
    /// their order.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn reviewable(
        &self,
        reviewer: &Principal,
        requests: Vec<ApprovalRequest>,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let mut out = Vec::with_capacity(requests.len());
        for request in requests {
            if self.may_review(reviewer, &request).await? {
                out.push(request);
            }
        }
        Ok(out)
    }

    /// Policy's verdict on `action` (a review or a reveal) by `principal` on a stored request,
    /// asked with its stored arguments (redacted like the ledger's); `None` when its contract
    /// is unknown.
    async fn stored_verdict(
        &self,
        principal: &Principal,
        action: PolicyAction,
        request: &ApprovalRequest,
        now: OffsetDateTime,
    ) -> Result<Option<PolicyVerdict>, StoreError> {
        let Some(contract) = self
            .registry
            .by_id(&request.request.tenant, &request.request.contract_id, now)
            .await?
        else {
            return Ok(None);
        };
        let empty = serde_json::Map::new();
        Ok(Some(self.policy.authorize(&PolicyRequest {
            principal,
            action,
            contract: &contract,
            arguments: request.request.arguments.as_object().unwrap_or(&empty),
        })))
    }

    /// The review policy's verdict on a stored request (decided on its stored arguments,
    /// which are redacted like the ledger's); `None` when its contract is unknown.
    async fn review_verdict(
        &self,
        reviewer: &Principal,
        request: &ApprovalRequest,
        now: OffsetDateTime,
    ) -> Result<Option<PolicyVerdict>, StoreError> {
        let Some(verdict) = self
            .stored_verdict(reviewer, PolicyAction::Review, request, now)
            .await?
        else {
            return Ok(None);
        };
        // A workflow review's `reviewers` narrows who policy allows; it never widens it.
        if verdict == PolicyVerdict::Allow
            && let Some(rule) = &request.request.reviewers
            && !rule.admits(reviewer)
        {
            return Ok(Some(PolicyVerdict::Deny {
                policies: vec!["workflow.reviewers".to_owned()],
                errors: Vec::new(),
            }));
        }
        Ok(Some(verdict))
    }
}

fn bind(
    request: &ApprovalRequest,
    proposal: &ValidatedProposal,
    principal: &Principal,
    now: OffsetDateTime,
) -> ApprovalBinding {
    if let (ApprovalStatus::Rejected, Some(by)) = (request.status, &request.superseded_by) {
        return ApprovalBinding::Refused(
            ApprovalState::Mismatch,
            Rejection::new(
                RejectCode::ApprovalRejected,
                format!(
                    "a reviewer approved an edited version of this call (approval {by}); the \
                     edited call runs instead, under this call's idempotency key, and this one \
                     never runs"
                ),
            ),
        );
    }
    match ApprovalRecord::from_request(request) {
        // The same operation presented again with its consumed approval (its key): bound when
        // everything else binds, and the store then answers the recorded outcome, or refuses
        // when none is recorded (consuming a consumed approval fails atomically) — it never
        // runs twice. This is how a call executed on the reviewer's decision reaches the
        // proposer's later retry. (The offline check, `bind_approval` alone, still says
        // consumed: it cannot see the recorded outcome.)
        Some(record)
            if record.status == ApprovalStatus::Consumed
                && record.idempotency_key.is_some()
                && record.idempotency_key.as_deref() == proposal.idempotency_key() =>
        {
            let as_approved = ApprovalRecord {
                status: ApprovalStatus::Approved,
                expires_at: record.expires_at.max(now + time::Duration::SECOND),
                ..record
            };
            bind_approval(&as_approved, proposal, principal, now)
        }
        Some(record) => match bind_approval(&record, proposal, principal, now) {
            // With the reviewer's reason, as the same call proposed again gets it.
            ApprovalBinding::Refused(state, refusal) if refusal.code() == RejectCode::ApprovalRejected => {
                ApprovalBinding::Refused(
                    state,
                    Rejection::new(RejectCode::ApprovalRejected, crate::store::rejected_call(request))
                        .at("/approval"),
                )
            }
            binding => binding,
        },
        None => ApprovalBinding::Refused(
            ApprovalState::Mismatch,
            Rejection::new(
                RejectCode::ApprovalMismatch,
                "the approval is bound to another call",
            ),
        ),
    }
}

/// The answer to a call a reviewer rejected within the rejection window: the rejection and
/// its reason, not a new request.
fn recently_rejected(rejected: &ApprovalRequest, window: Duration) -> Rejection {
    let until = rejected
        .decided_at
        .map(|at| at + window)
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .map(|t| format!("; the same call is not sent for review again before {t}"))
        .unwrap_or_default();
    Rejection::new(
        RejectCode::ApprovalRejected,
        format!("{}{until}", crate::store::rejected_call(rejected)),
    )
    .at("/approval")
}

fn needed(contract: &Contract, proposal: &ValidatedProposal, request: &ApprovalRequest) -> Decision {
    Decision::NeedsApproval(ApprovalNeeded {
        request_id: Some(request.request.id.clone()),
        contract_id: contract.id(),
        payload_digest: proposal.payload_digest(),
        idempotency_key: proposal.idempotency_key().map(str::to_owned),
        expires_at: Some(request.request.expires_at),
    })
}

/// The longest prefix of `text` with at most `max` characters.
fn truncated(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => text.get(..end).unwrap_or(text),
        None => text,
    }
}

/// The rejection of a denied call: the forbids that held, and every policy that could not
/// be evaluated (any evaluation error denies). Engines word their errors by policy id and
/// kind, never with argument values, so the detail is safe to store and return.
fn policy_denial(policies: &[String], errors: &[String]) -> Rejection {
    /// Errors named in the detail; a policy set in which many fail says how many more.
    const NAMED: usize = 3;
    let mut named: Vec<&str> = errors.iter().take(NAMED).map(String::as_str).collect();
    let more = errors.len().saturating_sub(NAMED);
    let more = format!("{more} more");
    if errors.len() > NAMED {
        named.push(&more);
    }
    let errors = named.join("; ");
    let detail = match (policies.is_empty(), errors.is_empty()) {
        (true, true) => "no policy permits this call".to_owned(),
        (true, false) => format!("denied: {errors}"),
        (false, true) => format!("forbidden by policy {}", policies.join(", ")),
        (false, false) => format!("forbidden by policy {} ({errors})", policies.join(", ")),
    };
    Rejection::new(RejectCode::PolicyDenied, detail)
}
