//! Adapter credentials. A binding names its credential (`credential: ORDERS_API_TOKEN`); the
//! value comes from a secrets file named in the configuration or from the process
//! environment, and is handed to that one adapter only. A [`Secret`] never prints its value,
//! so it cannot reach a log line or the ledger by accident.

use std::collections::BTreeMap;
use std::path::Path;

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

/// Where credentials come from: a secrets file first, then (unless disabled) the environment.
#[derive(Clone, Default)]
pub struct Secrets {
    file: BTreeMap<String, Secret>,
    from_env: bool,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.file.keys().collect::<Vec<_>>())
            .field("from_env", &self.from_env)
            .finish()
    }
}

impl Secrets {
    /// Credentials from the process environment only.
    pub fn from_env() -> Self {
        Secrets {
            file: BTreeMap::new(),
            from_env: true,
        }
    }

    /// Exactly these credentials (tests, embedding), without the environment.
    pub fn fixed<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Secrets {
            file: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), Secret::new(v)))
                .collect(),
            from_env: false,
        }
    }

    /// Adds the credentials of a secrets file: a JSON object of names to string values. The
    /// file's values win over the environment.
    ///
    /// # Errors
    /// The file cannot be read or is not such an object (the message never quotes values).
    pub fn with_file(mut self, path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let value = warrant_core::json::parse(&bytes, warrant_core::json::Limits::default())
            .map_err(|e| format!("{}: not strict JSON ({})", path.display(), e.message()))?;
        let serde_json::Value::Object(map) = value else {
            return Err(format!(
                "{}: must be a JSON object of names to strings",
                path.display()
            ));
        };
        for (name, value) in map {
            match value {
                serde_json::Value::String(s) => {
                    self.file.insert(name, Secret::new(s));
                }
                _ => return Err(format!("{}: `{name}` must be a string", path.display())),
            }
        }
        Ok(self)
    }

    /// Looks a credential up.
    ///
    /// # Errors
    /// [`BindingError::MissingCredential`] when neither source has it.
    pub fn get(&self, name: &str) -> Result<Secret, BindingError> {
        if let Some(secret) = self.file.get(name) {
            return Ok(secret.clone());
        }
        if self.from_env
            && let Ok(value) = std::env::var(name)
        {
            return Ok(Secret::new(value));
        }
        Err(BindingError::MissingCredential(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print_their_value() {
        let s = Secrets::fixed([("TOKEN", "hunter2")]);
        let secret = s.get("TOKEN").unwrap();
        assert_eq!(secret.expose(), "hunter2");
        assert!(!format!("{secret:?} {s:?}").contains("hunter2"));
        assert_eq!(
            s.get("OTHER"),
            Err(BindingError::MissingCredential("OTHER".into()))
        );
    }

    #[test]
    fn a_secrets_file_is_a_strict_object_of_strings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.json");
        std::fs::write(&path, br#"{"A": "1", "B": "2"}"#).unwrap();
        let s = Secrets::default().with_file(&path).unwrap();
        assert_eq!(s.get("B").unwrap().expose(), "2");
        std::fs::write(&path, br#"{"A": "1", "A": "2"}"#).unwrap();
        assert!(Secrets::default().with_file(&path).is_err());
        std::fs::write(&path, br#"{"A": 1}"#).unwrap();
        let err = Secrets::default().with_file(&path).unwrap_err();
        assert!(err.contains("`A` must be a string"));
    }
}
