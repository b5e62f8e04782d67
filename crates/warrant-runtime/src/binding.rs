//! Reading an adapter binding (the contract's `adapter:` section): a closed set of keys per
//! kind, typed getters, and the duration syntax contracts use elsewhere (`500ms`, `10s`, `2m`).

use std::time::Duration;

use serde_json::{Map, Value};

use crate::adapter::BindingError;

/// A binding document being read by the adapter of `kind`.
#[derive(Debug)]
pub struct Binding<'a> {
    kind: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Binding<'a> {
    /// Opens `doc` for an adapter that understands exactly `keys` (besides `kind`).
    ///
    /// # Errors
    /// The document is not an object or has a key the adapter does not know.
    pub fn open(kind: &'a str, doc: &'a Value, keys: &[&str]) -> Result<Self, BindingError> {
        let Value::Object(map) = doc else {
            return Err(BindingError::invalid(kind, "the binding must be an object"));
        };
        if let Some(unknown) = map
            .keys()
            .find(|k| k.as_str() != "kind" && !keys.contains(&k.as_str()))
        {
            return Err(BindingError::invalid(
                kind,
                format!("unknown key `{unknown}` (known: {})", keys.join(", ")),
            ));
        }
        Ok(Binding { kind, map })
    }

    /// The adapter kind.
    pub fn kind(&self) -> &str {
        self.kind
    }

    /// A required string.
    ///
    /// # Errors
    /// Missing or not a string.
    pub fn string(&self, key: &str) -> Result<&'a str, BindingError> {
        self.opt_string(key)?
            .ok_or_else(|| BindingError::invalid(self.kind, format!("`{key}` is required")))
    }

    /// An optional string.
    ///
    /// # Errors
    /// Present but not a string.
    pub fn opt_string(&self, key: &str) -> Result<Option<&'a str>, BindingError> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(BindingError::invalid(
                self.kind,
                format!("`{key}` must be a string"),
            )),
        }
    }

    /// An optional list of strings (empty when absent).
    ///
    /// # Errors
    /// Present but not an array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&'a str>, BindingError> {
        match self.map.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().ok_or_else(|| {
                        BindingError::invalid(self.kind, format!("`{key}` must be a list of strings"))
                    })
                })
                .collect(),
            Some(_) => Err(BindingError::invalid(
                self.kind,
                format!("`{key}` must be a list of strings"),
            )),
        }
    }

    /// An optional duration (`250ms`, `10s`, `2m`), or `default`.
    ///
    /// # Errors
    /// Present but not a duration within `1ms..=max`.
    pub fn duration(&self, key: &str, default: Duration, max: Duration) -> Result<Duration, BindingError> {
        let Some(text) = self.opt_string(key)? else {
            return Ok(default);
        };
        let d = parse_duration(text).ok_or_else(|| {
            BindingError::invalid(
                self.kind,
                format!("`{key}` must be a duration such as 500ms or 10s"),
            )
        })?;
        if d.is_zero() || d > max {
            return Err(BindingError::invalid(
                self.kind,
                format!("`{key}` must be between 1ms and {}s", max.as_secs()),
            ));
        }
        Ok(d)
    }

    /// An optional nested object.
    ///
    /// # Errors
    /// Present but not an object.
    pub fn object(&self, key: &str) -> Result<Option<&'a Value>, BindingError> {
        match self.map.get(key) {
            None => Ok(None),
            Some(v @ Value::Object(_)) => Ok(Some(v)),
            Some(_) => Err(BindingError::invalid(
                self.kind,
                format!("`{key}` must be an object"),
            )),
        }
    }
}

/// Parses a duration: `<n>ms`, or what contracts accept elsewhere (`<n>s`, `<n>m`, `<n>h`,
/// `<n>d`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    match text.strip_suffix("ms") {
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            digits.parse().ok().map(Duration::from_millis)
        }
        Some(_) => None,
        None => warrant_core::contract::parse_duration(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bindings_are_closed_and_typed() {
        let doc = json!({"kind": "http", "url": "https://x", "timeout": "2s", "scopes": ["a"]});
        let b = Binding::open("http", &doc, &["url", "timeout", "scopes"]).unwrap();
        assert_eq!(b.string("url").unwrap(), "https://x");
        assert_eq!(
            b.duration("timeout", Duration::from_secs(9), Duration::from_secs(60))
                .unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(b.strings("scopes").unwrap(), vec!["a"]);
        assert!(b.string("missing").is_err());
        let err = Binding::open("http", &doc, &["url"]).unwrap_err();
        assert!(err.to_string().contains("unknown key `timeout`"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("3m"), Some(Duration::from_secs(180)));
        for bad in ["", "s", "ms", "10", "1.5s", "-1s", "10 s", "10w"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
