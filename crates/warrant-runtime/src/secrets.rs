//! Adapter credentials: the platform operator's explicit credential map.
//!
//! A binding names its credential (`credential: ORDERS_API_TOKEN`). The value comes only from
//! the map the operator configured (`[credentials.NAME]` in `warrant.toml`: a named environment
//! variable or a key of the secrets file) — never from an arbitrary environment variable — and
//! each credential is **granted** to named tools and **pinned** to the origins it may be sent
//! to. So a binding can only use a credential granted to its own tool, and an adapter only
//! attaches it to a request whose origin is pinned, whoever chose the URL (a model, through a
//! URL argument, or a template). A [`Secret`] never prints its value, so it cannot reach a log
//! line, the ledger or an answer by accident; an unknown name and an ungranted one are refused
//! with the same error, so a refusal does not tell which credentials exist.

use std::collections::BTreeMap;
use std::sync::Arc;

use url::Url;
use warrant_core::Contract;

use crate::adapter::BindingError;

/// A credential value. `Debug` prints `Secret(***)`; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it (a header, a child's environment).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A tool a credential is granted to: `name`, `name@version`, `tenant/name` or
/// `tenant/name@version` (a bare name is a platform contract's; a tenant's contract is named
/// with its tenant, as policies name it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolGrant {
    qualified_name: String,
    version: Option<u32>,
}

impl ToolGrant {
    /// Parses a grant.
    ///
    /// # Errors
    /// Not of one of the four forms.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad =
            || format!("`{text}` is not a tool (name, name@version, tenant/name or tenant/name@version)");
        let (qualified, version) = match text.split_once('@') {
            Some((q, v)) => (q, Some(v.parse::<u32>().map_err(|_| bad())?)),
            None => (text, None),
        };
        let name = qualified.rsplit('/').next().unwrap_or_default();
        let tenant_ok = qualified
            .strip_suffix(name)
            .and_then(|rest| rest.strip_suffix('/'))
            .is_none_or(|tenant| {
                !tenant.is_empty()
                    && !tenant.contains('/')
                    && tenant
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
            });
        let name_ok = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !(tenant_ok && name_ok) {
            return Err(bad());
        }
        Ok(ToolGrant {
            qualified_name: qualified.to_owned(),
            version,
        })
    }

    fn covers(&self, contract: &Contract) -> bool {
        self.version.is_none_or(|v| v == contract.version())
            && self.qualified_name == contract.qualified_name()
    }
}

/// One credential of the map: its value, the tools it is granted to and the origins it may be
/// sent to.
#[derive(Clone)]
pub struct CredentialSpec {
    value: Secret,
    tools: Vec<ToolGrant>,
    origins: Vec<url::Origin>,
}

impl std::fmt::Debug for CredentialSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSpec")
            .field("tools", &self.tools)
            .field(
                "origins",
                &self
                    .origins
                    .iter()
                    .map(url::Origin::ascii_serialization)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl CredentialSpec {
    /// A credential with this value, granted to no tool and pinned to no origin yet.
    pub fn new(value: impl Into<String>) -> Self {
        CredentialSpec {
            value: Secret::new(value),
            tools: Vec::new(),
            origins: Vec::new(),
        }
    }

    /// Grants it to these tools (see [`ToolGrant::parse`]).
    ///
    /// # Errors
    /// A grant that does not parse.
    pub fn for_tools<I, S>(mut self, tools: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for tool in tools {
            self.tools.push(ToolGrant::parse(tool.as_ref())?);
        }
        Ok(self)
    }

    /// Pins it to these origins (`https://host[:port]`, or `http://…` for a host the network
    /// rules allow over plain HTTP). A credential with no origin is only usable where nothing
    /// is sent over the network by Warrant itself (a `command` tool's environment).
    ///
    /// # Errors
    /// An entry that is not an origin (a path, query or credentials are refused, so a pin
    /// cannot be mistaken for a narrower rule than it is).
    pub fn to_origins<I, S>(mut self, origins: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for text in origins {
            let text = text.as_ref();
            let url = Url::parse(text).map_err(|e| format!("origin `{text}`: {e}"))?;
            let bare = url.path() == "/" && url.query().is_none() && url.fragment().is_none();
            if !matches!(url.scheme(), "http" | "https")
                || !bare
                || !url.username().is_empty()
                || url.password().is_some()
            {
                return Err(format!(
                    "origin `{text}` must be scheme://host[:port] with an http or https scheme"
                ));
            }
            self.origins.push(url.origin());
        }
        Ok(self)
    }
}

/// A credential granted to one binding: the value and where it may be sent.
#[derive(Clone)]
pub struct Credential {
    name: String,
    secret: Secret,
    origins: Arc<[url::Origin]>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// The credential's name in the map.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value, for the one place that sends it.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// Whether the credential may be sent to `url` (its origin is pinned).
    pub fn may_reach(&self, url: &Url) -> bool {
        let origin = url.origin();
        self.origins.contains(&origin)
    }

    /// Refuses `url` unless the credential may reach it (a binding's fixed URL, checked when
    /// the binding is built).
    ///
    /// # Errors
    /// [`BindingError::CredentialOrigin`].
    pub fn check_origin(&self, url: &Url) -> Result<(), BindingError> {
        if self.may_reach(url) {
            Ok(())
        } else {
            Err(BindingError::CredentialOrigin {
                credential: self.name.clone(),
                origin: url.origin().ascii_serialization(),
            })
        }
    }
}

/// The operator's credential map.
#[derive(Clone, Default)]
pub struct Secrets {
    map: BTreeMap<String, CredentialSpec>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.map.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// Adds (or replaces) the credential `name`.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, spec: CredentialSpec) -> Self {
        self.map.insert(name.into(), spec);
        self
    }

    /// The names configured (for start-up reports; never the values).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    /// The value of credential `name` whatever it is granted to — for the operator's own
    /// configuration only (the SMTP relay login), never for a binding.
    pub fn value_of(&self, name: &str) -> Option<&Secret> {
        self.map.get(name).map(|s| &s.value)
    }

    /// Reads a secrets file: a strict JSON object of names to string values (the values a
    /// `[credentials.NAME] secret = "…"` entry refers to).
    ///
    /// # Errors
    /// The file cannot be read or is not such an object (the message never quotes values).
    pub fn read_file(path: &std::path::Path) -> Result<BTreeMap<String, Secret>, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let value = warrant_core::json::parse(&bytes, warrant_core::json::Limits::default())
            .map_err(|e| format!("{}: not strict JSON ({})", path.display(), e.message()))?;
        let serde_json::Value::Object(map) = value else {
            return Err(format!(
                "{}: must be a JSON object of names to strings",
                path.display()
            ));
        };
        map.into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(s) => Ok((name, Secret::new(s))),
                _ => Err(format!("{}: `{name}` must be a string", path.display())),
            })
            .collect()
    }

    /// The credential `name` for `contract`'s binding.
    ///
    /// # Errors
    /// [`BindingError::MissingCredential`] when the map has no such credential or it is not
    /// granted to this tool — the same error, so a binding cannot probe which names exist.
    pub fn grant(&self, name: &str, contract: &Contract) -> Result<Credential, BindingError> {
        let missing = || BindingError::MissingCredential(name.to_owned());
        let spec = self.map.get(name).ok_or_else(missing)?;
        if !spec.tools.iter().any(|t| t.covers(contract)) {
            return Err(missing());
        }
        Ok(Credential {
            name: name.to_owned(),
            secret: spec.value.clone(),
            origins: spec.origins.clone().into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(name: &str, version: u32) -> Contract {
        let doc = serde_json::json!({
            "name": name, "version": version, "description": "d", "owner": "o",
            "effect": "read", "scopes": ["s"],
            "input": {"type": "object", "additionalProperties": false, "properties": {}},
            "output": {"type": "object"},
        });
        Contract::from_document(doc).unwrap()
    }

    fn secrets() -> Secrets {
        Secrets::default().with(
            "ORDERS",
            CredentialSpec::new("hunter2")
                .for_tools(["lookup_order@1", "acme/sync"])
                .unwrap()
                .to_origins(["https://orders.example", "http://127.0.0.1:9000"])
                .unwrap(),
        )
    }

    #[test]
    fn secrets_never_print_their_value() {
        let s = secrets();
        let granted = s.grant("ORDERS", &contract("lookup_order", 1)).unwrap();
        assert_eq!(granted.secret().expose(), "hunter2");
        assert!(!format!("{granted:?} {s:?} {:?}", granted.secret()).contains("hunter2"));
    }

    #[test]
    fn a_credential_is_only_granted_to_its_tools() {
        let s = secrets();
        assert!(s.grant("ORDERS", &contract("lookup_order", 1)).is_ok());
        let missing = Err(BindingError::MissingCredential("ORDERS".into()));
        assert_eq!(
            s.grant("ORDERS", &contract("lookup_order", 2)).map(|_| ()),
            missing
        );
        assert_eq!(s.grant("ORDERS", &contract("send_email", 1)).map(|_| ()), missing);
        assert_eq!(
            s.grant("ORDERS", &contract("sync", 1)).map(|_| ()),
            missing,
            "a platform contract named like the tenant's grant"
        );
        let tenant =
            contract("sync", 3).in_namespace(warrant_core::contract::Namespace::Tenant("acme".into()));
        assert!(s.grant("ORDERS", &tenant).is_ok());
        let other =
            contract("sync", 3).in_namespace(warrant_core::contract::Namespace::Tenant("beta".into()));
        assert!(s.grant("ORDERS", &other).is_err());
        // No fallback to the environment, whatever exists there.
        assert_eq!(
            s.grant("HOME", &contract("lookup_order", 1)).map(|_| ()),
            Err(BindingError::MissingCredential("HOME".into()))
        );
        assert_eq!(
            s.grant("PATH", &contract("lookup_order", 1)).map(|_| ()),
            Err(BindingError::MissingCredential("PATH".into()))
        );
    }

    #[test]
    fn a_credential_reaches_only_its_origins() {
        let granted = secrets().grant("ORDERS", &contract("lookup_order", 1)).unwrap();
        for ok in [
            "https://orders.example/v1/x?y=1",
            "https://ORDERS.example:443/",
            "http://127.0.0.1:9000/status",
        ] {
            assert!(granted.may_reach(&Url::parse(ok).unwrap()), "{ok}");
        }
        for bad in [
            "http://orders.example/",
            "https://orders.example:8443/",
            "https://orders.example.evil.test/",
            "https://evil.test/?https://orders.example",
            "https://user@evil.test/",
            "http://127.0.0.1:9001/",
        ] {
            assert!(!granted.may_reach(&Url::parse(bad).unwrap()), "{bad}");
        }
    }

    #[test]
    fn grants_and_origins_are_validated() {
        for bad in ["", "Lookup", "a@x", "/a", "acme/", "a/b/c", "acme/Name"] {
            assert!(ToolGrant::parse(bad).is_err(), "{bad}");
        }
        for ok in ["a", "lookup_order@2", "acme/sync", "acme-1.x:y/sync@9"] {
            assert!(ToolGrant::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "orders.example",
            "https://orders.example/v1",
            "ftp://x",
            "https://u:p@x",
            "https://x/?q",
        ] {
            assert!(CredentialSpec::new("v").to_origins([bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_secrets_file_is_a_strict_object_of_strings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.json");
        std::fs::write(&path, br#"{"A": "1", "B": "2"}"#).unwrap();
        let s = Secrets::read_file(&path).unwrap();
        assert_eq!(s["B"].expose(), "2");
        std::fs::write(&path, br#"{"A": "1", "A": "2"}"#).unwrap();
        assert!(Secrets::read_file(&path).is_err());
        std::fs::write(&path, br#"{"A": 1}"#).unwrap();
        let err = Secrets::read_file(&path).unwrap_err();
        assert!(err.contains("`A` must be a string"));
    }
}
