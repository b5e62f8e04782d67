//! Untrusted proposals: the closed envelope, and [`ValidatedProposal`], the only form in which
//! a proposal moves past the schema stage.
//!
//! An envelope is exactly `{tool, version | contract, arguments, idempotency_key?, approval?}`.
//! Fields that try to state identity (principal, tenant, scopes, …) are refused at the
//! identity stage; any other extra field at the parse stage.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::canon::{Sha256Digest, canonical_bytes_of_map};
use crate::contract::{Contract, ContractId};
use crate::decision::{RejectCode, Rejection};
use crate::json::{self, JsonErrorKind, Limits};

/// Envelope fields that would let a caller claim an identity. Identity comes from
/// authentication only (PRODUCT §3, §6).
const IDENTITY_FIELDS: &[&str] = &[
    "principal",
    "principal_id",
    "tenant",
    "tenant_id",
    "scopes",
    "grants",
    "roles",
    "role",
    "user",
    "user_id",
    "subject",
    "sub",
    "identity",
    "on_behalf_of",
    "actor",
    "api_key",
    "authorization",
    "credentials",
    "token",
];

const ENVELOPE_FIELDS: &[&str] = &[
    "tool",
    "version",
    "contract",
    "arguments",
    "idempotency_key",
    "approval",
];

/// The envelope's values, taken out of the parsed object.
#[derive(Default)]
struct Fields {
    tool: Option<Value>,
    version: Option<Value>,
    contract: Option<Value>,
    arguments: Option<Value>,
    idempotency_key: Option<Value>,
    approval: Option<Value>,
}

/// The parse-stage refusal of a strict-parser error, its pointer under `prefix`.
fn parse_rejection(e: &json::JsonError, prefix: &str) -> Rejection {
    let code = match e.kind() {
        JsonErrorKind::TooLarge => RejectCode::PayloadTooLarge,
        JsonErrorKind::InvalidUtf8 => RejectCode::InvalidUtf8,
        JsonErrorKind::Syntax => RejectCode::InvalidJson,
        JsonErrorKind::DuplicateKey => RejectCode::DuplicateKey,
        JsonErrorKind::TooDeep => RejectCode::NestingTooDeep,
        JsonErrorKind::NumberOutOfRange => RejectCode::NumberOutOfRange,
        JsonErrorKind::LoneSurrogate => RejectCode::LoneSurrogate,
    };
    Rejection::new(code, format!("{} at byte {}", e.message(), e.offset()))
        .at(format!("{prefix}{}", e.pointer()))
}

/// Longest accepted idempotency key.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// A parsed but not yet validated proposal.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    tool: String,
    version: Option<u32>,
    contract: Option<ContractId>,
    arguments: Value,
    idempotency_key: Option<String>,
    approval: Option<String>,
}

impl Envelope {
    /// Parses untrusted bytes with the strict parser and the closed envelope rules.
    ///
    /// # Errors
    /// A parse- or identity-stage [`Rejection`], or an idempotency-stage one for a malformed key.
    pub fn parse(bytes: &[u8], limits: Limits) -> Result<Envelope, Rejection> {
        let top = json::parse_top_level(bytes, limits).map_err(|e| parse_rejection(&e, ""))?;
        match top {
            json::TopLevel::Object(members) => Envelope::from_members(members),
            json::TopLevel::Other(_) => Err(not_an_object()),
        }
    }

    /// The proposal of a call to `contract` whose arguments are untrusted bytes on their own
    /// (a chat model's `function.arguments` string): the bytes are parsed alone with the strict
    /// parser — so they can only ever be the `arguments` member, never add an envelope field
    /// such as an idempotency key or an approval — and the envelope rules then apply (the
    /// arguments must be an object).
    ///
    /// # Errors
    /// A parse-stage [`Rejection`] pointing into `/arguments`, or the envelope rules'.
    pub fn for_arguments(
        tool: &str,
        contract: ContractId,
        arguments: &[u8],
        limits: Limits,
    ) -> Result<Envelope, Rejection> {
        let value = json::parse(arguments, limits).map_err(|e| parse_rejection(&e, "/arguments"))?;
        Envelope::from_value(serde_json::json!({
            "tool": tool,
            "contract": contract.to_string(),
            "arguments": value,
        }))
    }

    /// Applies the envelope rules to an already strictly parsed value.
    ///
    /// # Errors
    /// As [`Envelope::parse`].
    pub fn from_value(value: Value) -> Result<Envelope, Rejection> {
        match value {
            Value::Object(map) => {
                Envelope::from_members(map.into_iter().map(|(k, v)| (k.into(), v)).collect())
            }
            _ => Err(not_an_object()),
        }
    }

    /// The envelope rules over the members of the proposal object (keys unique).
    fn from_members(map: Vec<(Cow<'_, str>, Value)>) -> Result<Envelope, Rejection> {
        // An identity field anywhere is reported before any unknown field. No envelope field
        // is an identity field, so only the others need the (case-insensitive) comparison.
        let mut unknown = None;
        for key in map.iter().map(|(key, _)| key.as_ref()) {
            if ENVELOPE_FIELDS.contains(&key) {
                continue;
            }
            if IDENTITY_FIELDS.iter().any(|f| f.eq_ignore_ascii_case(key)) {
                return Err(Rejection::new(
                    RejectCode::IdentityInProposal,
                    format!("a proposal cannot carry `{key}`: identity comes from authentication only"),
                )
                .at(format!("/{}", pointer_token(key))));
            }
            unknown = unknown.or(Some(key));
        }
        if let Some(field) = unknown {
            return Err(Rejection::new(
                RejectCode::EnvelopeUnknownField,
                format!(
                    "unknown proposal field `{}` (allowed: tool, version, contract, arguments, idempotency_key, approval)",
                    short(field)
                ),
            )
            .at(format!("/{}", pointer_token(field))));
        }
        // Every key is an envelope field now; take the values in one pass, without lookups.
        let mut fields = Fields::default();
        for (key, value) in map {
            let slot = match key.as_ref() {
                "tool" => &mut fields.tool,
                "version" => &mut fields.version,
                "contract" => &mut fields.contract,
                "arguments" => &mut fields.arguments,
                "idempotency_key" => &mut fields.idempotency_key,
                // `approval`, the only envelope field left.
                _ => &mut fields.approval,
            };
            *slot = Some(value);
        }
        let Fields {
            tool,
            version,
            contract,
            arguments,
            idempotency_key,
            approval,
        } = fields;
        let tool = match tool {
            Some(Value::String(s)) if !s.is_empty() => s,
            Some(_) => return Err(invalid("/tool", "`tool` must be a non-empty string")),
            None => return Err(invalid("/tool", "`tool` is required")),
        };
        let version = match version {
            None => None,
            Some(Value::Number(n)) if !n.is_f64() => match n.as_u64().and_then(|v| u32::try_from(v).ok()) {
                Some(v @ 1..) => Some(v),
                _ => return Err(invalid("/version", "`version` must be a positive integer")),
            },
            Some(_) => return Err(invalid("/version", "`version` must be a positive integer")),
        };
        let contract = match contract {
            None => None,
            Some(Value::String(s)) => match ContractId::parse(&s) {
                Some(id) => Some(id),
                None => {
                    return Err(invalid(
                        "/contract",
                        "`contract` must be a content id `tool-contract@sha256:<64 hex>`",
                    ));
                }
            },
            Some(_) => return Err(invalid("/contract", "`contract` must be a content id string")),
        };
        if version.is_none() && contract.is_none() {
            return Err(invalid(
                "",
                "a proposal must name the contract `version` or its content id `contract`",
            ));
        }
        let arguments = match arguments {
            Some(Value::Object(args)) => Value::Object(args),
            Some(_) => return Err(invalid("/arguments", "`arguments` must be an object")),
            None => return Err(invalid("/arguments", "`arguments` is required")),
        };
        let idempotency_key = match idempotency_key {
            None | Some(Value::Null) => None,
            Some(Value::String(key)) => Some(check_idempotency_key(&key).map(|()| key)?),
            Some(_) => {
                return Err(Rejection::new(
                    RejectCode::IdempotencyKeyInvalid,
                    "`idempotency_key` must be a string",
                )
                .at("/idempotency_key"));
            }
        };
        let approval = match approval {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) if is_valid_id(&id) => Some(id),
            Some(_) => {
                return Err(invalid(
                    "/approval",
                    "`approval` must be an approval id (1-128 of A-Z a-z 0-9 _ - . :)",
                ));
            }
        };
        Ok(Envelope {
            tool,
            version,
            contract,
            arguments,
            idempotency_key,
            approval,
        })
    }

    /// The tool name as proposed.
    pub fn tool(&self) -> &str {
        &self.tool
    }
    /// The pinned version, if any.
    pub fn version(&self) -> Option<u32> {
        self.version
    }
    /// The pinned content id, if any.
    pub fn contract(&self) -> Option<ContractId> {
        self.contract
    }
    /// The (unvalidated) arguments.
    pub fn arguments(&self) -> &Value {
        &self.arguments
    }
    /// The idempotency key, if the proposal carries one.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }
    /// The approval id, if the proposal carries one.
    pub fn approval(&self) -> Option<&str> {
        self.approval.as_deref()
    }

    /// Supplies the idempotency key from the transport (an `Idempotency-Key` header or MCP
    /// `_meta`); a key in the envelope itself must agree with it.
    ///
    /// # Errors
    /// An idempotency-stage rejection when the key is malformed or disagrees with the envelope.
    pub fn with_transport_key(mut self, key: &str) -> Result<Envelope, Rejection> {
        check_idempotency_key(key)?;
        match &self.idempotency_key {
            Some(existing) if existing != key => Err(Rejection::new(
                RejectCode::IdempotencyKeyInvalid,
                "the idempotency key in the proposal differs from the one sent by the transport",
            )
            .at("/idempotency_key")),
            _ => {
                self.idempotency_key = Some(key.to_owned());
                Ok(self)
            }
        }
    }
}

impl Envelope {
    /// Supplies the approval id from the transport (MCP `_meta`, an offline audit's approval
    /// file); an approval id in the envelope itself must agree with it.
    ///
    /// # Errors
    /// An approval-stage rejection when the ids differ or the id is malformed.
    pub fn with_transport_approval(mut self, id: &str) -> Result<Envelope, Rejection> {
        if !is_valid_id(id) {
            return Err(invalid(
                "/approval",
                "an approval id is 1-128 of A-Z a-z 0-9 _ - . :",
            ));
        }
        match &self.approval {
            Some(existing) if existing != id => Err(Rejection::new(
                RejectCode::ApprovalMismatch,
                "the approval id in the proposal differs from the one sent by the transport",
            )
            .at("/approval")),
            _ => {
                self.approval = Some(id.to_owned());
                Ok(self)
            }
        }
    }
}

fn not_an_object() -> Rejection {
    Rejection::new(RejectCode::EnvelopeInvalid, "a proposal must be a JSON object")
}

fn invalid(pointer: &str, detail: &str) -> Rejection {
    Rejection::new(RejectCode::EnvelopeInvalid, detail).at(pointer)
}

/// An idempotency key is 1..=255 visible ASCII characters.
fn check_idempotency_key(key: &str) -> Result<(), Rejection> {
    if !key.is_empty() && key.len() <= MAX_IDEMPOTENCY_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(Rejection::new(
            RejectCode::IdempotencyKeyInvalid,
            format!("an idempotency key is 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"),
        )
        .at("/idempotency_key"))
    }
}

/// Ids (approval ids and the like): 1..=128 of `A-Z a-z 0-9 _ - . :`.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

fn pointer_token(field: &str) -> String {
    let mut out = String::new();
    json::push_pointer_segment(&mut out, &short(field));
    out
}

fn short(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Checks that the envelope names `contract`: same tool, and the pinned version or content
/// id (when given) match. Registries call this after picking a candidate by name.
///
/// # Errors
/// A contract-stage rejection naming the mismatch.
pub fn check_selector(envelope: &Envelope, contract: &Contract) -> Result<(), Rejection> {
    if envelope.tool != contract.name() {
        return Err(Rejection::new(
            RejectCode::ContractNotFound,
            format!("no contract named `{}`", short(&envelope.tool)),
        )
        .at("/tool"));
    }
    if let Some(v) = envelope.version
        && v != contract.version()
    {
        return Err(Rejection::new(
            RejectCode::ContractVersionMismatch,
            format!(
                "proposal names version {v} but the contract is version {}",
                contract.version()
            ),
        )
        .at("/version"));
    }
    if let Some(id) = envelope.contract
        && id != contract.id()
    {
        return Err(Rejection::new(
            RejectCode::ContractIdMismatch,
            format!("proposal pins {id} but the contract is {}", contract.id()),
        )
        .at("/contract"));
    }
    Ok(())
}

/// A proposal whose contract is resolved and whose arguments passed the closed schema.
///
/// **Invariant:** only [`ValidatedProposal::validate`] builds this type, so holding one proves
/// the arguments are valid for the contract and the digest is of their canonical form.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedProposal {
    contract_id: ContractId,
    tool: String,
    version: u32,
    arguments: Map<String, Value>,
    canonical_arguments: Vec<u8>,
    payload_digest: Sha256Digest,
    idempotency_key: Option<String>,
    approval: Option<String>,
}

impl ValidatedProposal {
    /// Checks the envelope against `contract` (selector, then closed input schema with the
    /// strict integer rule) and computes the payload digest over the canonical arguments.
    ///
    /// # Errors
    /// A contract- or schema-stage rejection.
    pub fn validate(envelope: Envelope, contract: &Contract) -> Result<ValidatedProposal, Rejection> {
        check_selector(&envelope, contract)?;
        contract
            .input_schema()
            .check(&envelope.arguments)
            .map_err(|r| prefix_pointer(r, "/arguments"))?;
        let Value::Object(arguments) = envelope.arguments else {
            return Err(invalid("/arguments", "`arguments` must be an object"));
        };
        let canonical_arguments = canonical_bytes_of_map(&arguments);
        let payload_digest = Sha256Digest::of_bytes(&canonical_arguments);
        Ok(ValidatedProposal {
            contract_id: contract.id(),
            tool: envelope.tool,
            version: contract.version(),
            arguments,
            canonical_arguments,
            payload_digest,
            idempotency_key: envelope.idempotency_key,
            approval: envelope.approval,
        })
    }

    /// The resolved contract's id.
    pub fn contract_id(&self) -> ContractId {
        self.contract_id
    }
    /// The tool name.
    pub fn tool(&self) -> &str {
        &self.tool
    }
    /// The resolved version.
    pub fn version(&self) -> u32 {
        self.version
    }
    /// The validated arguments.
    pub fn arguments(&self) -> &Map<String, Value> {
        &self.arguments
    }
    /// RFC 8785 canonical bytes of the arguments.
    pub fn canonical_arguments(&self) -> &[u8] {
        &self.canonical_arguments
    }
    /// SHA-256 of the canonical arguments: what approvals and idempotency bind to.
    pub fn payload_digest(&self) -> Sha256Digest {
        self.payload_digest
    }
    /// The idempotency key, if any.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }
    /// The approval id the proposal presents, if any.
    pub fn approval(&self) -> Option<&str> {
        self.approval.as_deref()
    }
}

fn prefix_pointer(rejection: Rejection, prefix: &str) -> Rejection {
    let pointer = format!("{prefix}{}", rejection.pointer().unwrap_or(""));
    rejection.at(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Envelope, Rejection> {
        Envelope::parse(text.as_bytes(), Limits::PROPOSAL)
    }

    fn code(text: &str) -> RejectCode {
        parse(text).unwrap_err().code()
    }

    /// A model's argument bytes are only ever the `arguments` member: a string crafted to close
    /// the object and add an envelope field is refused by the strict parser, not spliced in.
    #[test]
    fn model_arguments_cannot_reach_the_envelope() {
        let id = ContractId::parse(&format!("tool-contract@sha256:{}", "a".repeat(64))).unwrap();
        let of = |bytes: &str| Envelope::for_arguments("t", id, bytes.as_bytes(), Limits::PROPOSAL);
        let ok = of(r#"{"amount": 5}"#).unwrap();
        assert_eq!(ok.arguments(), &serde_json::json!({"amount": 5}));
        assert!(ok.idempotency_key().is_none() && ok.approval().is_none());
        assert_eq!(ok.contract(), Some(id));
        for (bytes, want) in [
            (
                r#"{"amount": 5}, "idempotency_key": "k""#,
                RejectCode::InvalidJson,
            ),
            (r#"{"amount": 5, "amount": 6}"#, RejectCode::DuplicateKey),
            (r#"[1]"#, RejectCode::EnvelopeInvalid),
            (r#""{}""#, RejectCode::EnvelopeInvalid),
            ("", RejectCode::InvalidJson),
        ] {
            let err = of(bytes).unwrap_err();
            assert_eq!(err.code(), want, "{bytes}");
        }
        assert_eq!(
            of(r#"{"a": {"b": 1, "b": 2}}"#).unwrap_err().pointer(),
            Some("/arguments/a/b")
        );
    }

    #[test]
    fn envelope_is_closed() {
        assert!(parse(r#"{"tool":"t","version":1,"arguments":{}}"#).is_ok());
        assert_eq!(
            code(r#"{"tool":"t","version":1,"arguments":{},"extra":1}"#),
            RejectCode::EnvelopeUnknownField
        );
        assert_eq!(
            code(r#"{"tool":"t","version":1,"arguments":{},"tenant":"b"}"#),
            RejectCode::IdentityInProposal
        );
        assert_eq!(
            code(r#"{"tool":"t","version":1,"arguments":{},"Principal":"b"}"#),
            RejectCode::IdentityInProposal
        );
        assert_eq!(
            code(r#"{"tool":"t","arguments":{}}"#),
            RejectCode::EnvelopeInvalid
        );
        assert_eq!(
            code(r#"{"tool":"t","version":1.0,"arguments":{}}"#),
            RejectCode::EnvelopeInvalid
        );
        assert_eq!(
            code(r#"{"tool":"t","version":1,"arguments":[]}"#),
            RejectCode::EnvelopeInvalid
        );
        assert_eq!(
            code(r#"{"tool":"t","contract":"sha256:00","arguments":{}}"#),
            RejectCode::EnvelopeInvalid
        );
        assert_eq!(code(r#"[]"#), RejectCode::EnvelopeInvalid);
        assert_eq!(
            code(r#"{"tool":"t","version":1,"arguments":{},"idempotency_key":""}"#),
            RejectCode::IdempotencyKeyInvalid
        );
        assert_eq!(
            code(r#"{"tool":"t","version":1,"arguments":{},"idempotency_key":"a b"}"#),
            RejectCode::IdempotencyKeyInvalid
        );
    }

    #[test]
    fn transport_key_must_agree() {
        let e = parse(r#"{"tool":"t","version":1,"arguments":{},"idempotency_key":"k1"}"#).unwrap();
        assert!(e.clone().with_transport_key("k1").is_ok());
        assert_eq!(
            e.with_transport_key("k2").unwrap_err().code(),
            RejectCode::IdempotencyKeyInvalid
        );
    }
}
