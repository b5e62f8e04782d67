//! Authority checks that need no storage (PRODUCT §6): the authenticated principal, scope
//! attenuation, the idempotency-key rule and approval binding.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use time::OffsetDateTime;

use crate::canon::Sha256Digest;
use crate::contract::{Contract, ContractId, is_valid_scope};
use crate::decision::{ApprovalState, IdempotencyState, RejectCode, Rejection};
use crate::proposal::{ValidatedProposal, is_valid_id};
pub use crate::records::ApprovalStatus;

/// Who is calling, as established by authentication — never by the proposal.
///
/// Shared, not copied: a call hands its principal to the decision, the runtime and the store
/// (each keeps it for the call's life), so a clone is a reference count, not four
/// allocations per id and set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(Arc<Identity>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    id: String,
    tenant: String,
    grants: BTreeSet<String>,
    roles: BTreeSet<String>,
}

/// A principal, tenant or grant that is not well formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdentityError(String);

impl Principal {
    /// Builds an authenticated identity. Ids are 1..=128 of `A-Z a-z 0-9 _ - . :`; grants
    /// are scope names.
    ///
    /// # Errors
    /// [`IdentityError`] naming the malformed part.
    pub fn new(
        id: &str,
        tenant: &str,
        grants: impl IntoIterator<Item = String>,
    ) -> Result<Principal, IdentityError> {
        if !is_valid_id(id) {
            return Err(IdentityError(
                "principal ids are 1-128 of A-Z a-z 0-9 _ - . :".into(),
            ));
        }
        if !is_valid_id(tenant) {
            return Err(IdentityError(
                "tenant ids are 1-128 of A-Z a-z 0-9 _ - . :".into(),
            ));
        }
        let grants: BTreeSet<String> = grants.into_iter().collect();
        if let Some(bad) = grants.iter().find(|g| !is_valid_scope(g)) {
            return Err(IdentityError(format!("`{bad}` is not a valid scope")));
        }
        Ok(Principal(Arc::new(Identity {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            grants,
            roles: BTreeSet::new(),
        })))
    }

    /// The same principal with `roles` (e.g. `operator`, `supervisor`, `admin`); role names
    /// follow the id rules.
    ///
    /// # Errors
    /// [`IdentityError`] naming a malformed role.
    pub fn with_roles(mut self, roles: impl IntoIterator<Item = String>) -> Result<Principal, IdentityError> {
        for role in roles {
            if !is_valid_id(&role) {
                return Err(IdentityError(format!("`{role}` is not a valid role name")));
            }
            Arc::make_mut(&mut self.0).roles.insert(role);
        }
        Ok(self)
    }

    /// The principal id.
    pub fn id(&self) -> &str {
        &self.0.id
    }
    /// The tenant the principal belongs to.
    pub fn tenant(&self) -> &str {
        &self.0.tenant
    }
    /// The scopes granted to the principal.
    pub fn grants(&self) -> &BTreeSet<String> {
        &self.0.grants
    }
    /// The principal's roles in its tenant.
    pub fn roles(&self) -> &BTreeSet<String> {
        &self.0.roles
    }
}

/// `grant ∩ contract.scopes`: all an adapter ever receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegatedScopes(BTreeSet<String>);

impl DelegatedScopes {
    /// The delegated scope names, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// Attenuates the principal's grants to the contract's scopes; a scope the contract requires
/// and the principal lacks is a denial.
///
/// # Errors
/// `reject(scope, SCOPE_MISSING)` naming the missing scopes.
pub fn attenuate(principal: &Principal, contract: &Contract) -> Result<DelegatedScopes, Rejection> {
    let missing: Vec<&str> = contract
        .scopes()
        .iter()
        .filter(|s| !principal.0.grants.contains(*s))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(Rejection::new(
            RejectCode::ScopeMissing,
            format!("missing required scope(s): {}", missing.join(", ")),
        ));
    }
    Ok(DelegatedScopes(contract.scopes().clone()))
}

/// The idempotency rule: write, irreversible and async effects require a key. Checked before
/// any approval is requested, because the approval binds to the key.
///
/// # Errors
/// `reject(idempotency, IDEMPOTENCY_KEY_REQUIRED)` when a key is required and missing.
pub fn idempotency_requirement(
    contract: &Contract,
    proposal: &ValidatedProposal,
) -> Result<IdempotencyState, Rejection> {
    if !contract.effect().requires_idempotency_key() {
        return Ok(IdempotencyState::NotRequired);
    }
    if proposal.idempotency_key().is_some() {
        Ok(IdempotencyState::RequiredPresent)
    } else {
        Err(Rejection::new(
            RejectCode::IdempotencyKeyRequired,
            format!(
                "a {} effect requires an idempotency key",
                contract.effect().as_str()
            ),
        )
        .at("/idempotency_key"))
    }
}

/// An approval as recorded: what exact call it is bound to, and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRecord {
    /// The approval id.
    pub id: String,
    /// The contract the approved call resolves to.
    pub contract_id: ContractId,
    /// The tenant of the approved call.
    pub tenant: String,
    /// The digest of the approved arguments.
    pub payload_digest: Sha256Digest,
    /// The idempotency key the approved call carries.
    pub idempotency_key: Option<String>,
    /// When the approval stops being usable.
    pub expires_at: OffsetDateTime,
    /// Lifecycle state.
    pub status: ApprovalStatus,
    /// Who proposed the call, if recorded.
    pub proposer: Option<String>,
    /// Who approved (or rejected) it.
    pub reviewer: Option<String>,
}

impl ApprovalRecord {
    /// Reads an approval record document (the `--approval FILE` of `warrant check`):
    /// `{id, contract_id, tenant, payload_digest, idempotency_key?, expires_at, status,
    /// proposer?, reviewer?}` with `expires_at` in RFC 3339. Unknown fields are refused.
    ///
    /// # Errors
    /// A message naming the first malformed field.
    pub fn from_value(value: &Value) -> Result<ApprovalRecord, String> {
        const FIELDS: &[&str] = &[
            "id",
            "contract_id",
            "tenant",
            "payload_digest",
            "idempotency_key",
            "expires_at",
            "status",
            "proposer",
            "reviewer",
        ];
        let map = value
            .as_object()
            .ok_or("an approval record must be a JSON object")?;
        if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(format!("unknown approval field `{k}`"));
        }
        let text = |key: &str| -> Result<Option<&str>, String> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_str())),
                Some(_) => Err(format!("`{key}` must be a string")),
            }
        };
        let required =
            |key: &str| -> Result<&str, String> { text(key)?.ok_or_else(|| format!("`{key}` is required")) };
        let id = required("id")?;
        if !is_valid_id(id) {
            return Err("`id` must be 1-128 of A-Z a-z 0-9 _ - . :".into());
        }
        let contract_id = ContractId::parse(required("contract_id")?)
            .ok_or("`contract_id` must be `tool-contract@sha256:<64 hex>`")?;
        let payload_digest = Sha256Digest::parse(required("payload_digest")?)
            .ok_or("`payload_digest` must be `sha256:<64 hex>`")?;
        let expires_at = OffsetDateTime::parse(
            required("expires_at")?,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|_| "`expires_at` must be an RFC 3339 timestamp".to_owned())?;
        let status = ApprovalStatus::parse(required("status")?)
            .ok_or("`status` must be pending, approved, rejected, expired or consumed")?;
        Ok(ApprovalRecord {
            id: id.to_owned(),
            contract_id,
            tenant: required("tenant")?.to_owned(),
            payload_digest,
            idempotency_key: text("idempotency_key")?.map(str::to_owned),
            expires_at,
            status,
            proposer: text("proposer")?.map(str::to_owned),
            reviewer: text("reviewer")?.map(str::to_owned),
        })
    }
}

impl ApprovalRecord {
    /// The stored form of a record read from a file (an offline audit seeds its in-memory store
    /// with it): `tool` names the contract, an absent proposer is `default_proposer`.
    pub fn to_request(&self, tool: &str, default_proposer: &str) -> crate::records::ApprovalRequest {
        crate::records::ApprovalRequest {
            request: crate::records::NewApproval {
                id: self.id.clone(),
                tenant: self.tenant.clone(),
                contract_id: self.contract_id.to_string(),
                tool: tool.to_owned(),
                proposer: self
                    .proposer
                    .clone()
                    .unwrap_or_else(|| default_proposer.to_owned()),
                payload_digest: self.payload_digest.to_string(),
                idempotency_key: self.idempotency_key.clone(),
                arguments: Value::Null,
                sealed_arguments: None,
                created_at: self.expires_at - time::Duration::minutes(15),
                expires_at: self.expires_at,
                reviewers: None,
            },
            status: self.status,
            reviewer: self.reviewer.clone(),
            reason: None,
            decided_at: None,
            consumed_at: None,
            consumed_by: None,
            superseded_by: None,
        }
    }

    /// The binding view of a stored approval request (`None` if its ids are malformed).
    pub fn from_request(request: &crate::records::ApprovalRequest) -> Option<ApprovalRecord> {
        let r = &request.request;
        Some(ApprovalRecord {
            id: r.id.clone(),
            contract_id: ContractId::parse(&r.contract_id)?,
            tenant: r.tenant.clone(),
            payload_digest: Sha256Digest::parse(&r.payload_digest)?,
            idempotency_key: r.idempotency_key.clone(),
            expires_at: r.expires_at,
            status: request.status,
            proposer: Some(r.proposer.clone()),
            reviewer: request.reviewer.clone(),
        })
    }
}

/// The result of binding a presented approval to a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalBinding {
    /// The approval authorizes exactly this call.
    Bound,
    /// The approval is still pending: the call needs approval.
    Pending,
    /// The approval cannot authorize this call.
    Refused(ApprovalState, Rejection),
}

/// Binds `record` to the call: it must be approved, for the same contract, tenant, payload
/// digest and idempotency key (and proposer, when recorded), not approved by the proposer
/// itself, and unexpired at `now`.
pub fn bind_approval(
    record: &ApprovalRecord,
    proposal: &ValidatedProposal,
    principal: &Principal,
    now: OffsetDateTime,
) -> ApprovalBinding {
    use ApprovalBinding::Refused;
    let mismatch = |what: &str| {
        Refused(
            ApprovalState::Mismatch,
            Rejection::new(
                RejectCode::ApprovalMismatch,
                format!("the approval is bound to another {what}"),
            ),
        )
    };
    if let Some(presented) = proposal.approval()
        && presented != record.id
    {
        return mismatch("approval id than the one the proposal presents");
    }
    if record.tenant != principal.tenant() {
        return mismatch("tenant");
    }
    match record.status {
        ApprovalStatus::Pending => return ApprovalBinding::Pending,
        ApprovalStatus::Rejected => {
            return Refused(
                ApprovalState::Mismatch,
                Rejection::new(RejectCode::ApprovalRejected, "a reviewer rejected this call"),
            );
        }
        ApprovalStatus::Consumed => {
            return Refused(
                ApprovalState::Mismatch,
                Rejection::new(RejectCode::ApprovalConsumed, "the approval was already used"),
            );
        }
        ApprovalStatus::Expired => {
            return Refused(
                ApprovalState::Expired,
                Rejection::new(RejectCode::ApprovalExpired, "the approval has expired"),
            );
        }
        ApprovalStatus::Approved => {}
    }
    if record.contract_id != proposal.contract_id() {
        return mismatch("contract");
    }
    if record.payload_digest != proposal.payload_digest() {
        return mismatch("payload (the arguments changed since approval)");
    }
    if record.idempotency_key.as_deref() != proposal.idempotency_key() {
        return mismatch("idempotency key");
    }
    if record.proposer.as_deref().is_some_and(|p| p != principal.id()) {
        return mismatch("proposer");
    }
    if record.reviewer.as_deref() == Some(principal.id()) {
        return Refused(
            ApprovalState::Mismatch,
            Rejection::new(
                RejectCode::ApprovalSelfApproved,
                "the proposer cannot approve its own call",
            ),
        );
    }
    if now >= record.expires_at {
        return Refused(
            ApprovalState::Expired,
            Rejection::new(RejectCode::ApprovalExpired, "the approval has expired"),
        );
    }
    ApprovalBinding::Bound
}
