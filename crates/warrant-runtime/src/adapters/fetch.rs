//! The `structured_data_fetch` built-in: an HTTPS GET of JSON, validated by the runtime
//! against the contract's output schema, through the SSRF-safe client (every address
//! resolved and vetted, redirects re-checked, size and time capped; plain HTTP only to hosts
//! the operator allows).
//!
//! ```yaml
//! adapter:
//!   kind: structured_data_fetch
//!   url: https://api.example.com/v1/orders/{order_id}   # placeholders filled from the arguments
//!   # or: url_argument: url                           # the URL is the argument `url` itself
//!   credential: ORDERS_API_TOKEN                       # optional; `Authorization: Bearer …`,
//!                                                      # only to an origin the credential is pinned to
//!   timeout: 10s                                       # optional
//! ```
//!
//! A placeholder's value is percent-encoded as one path segment, so an argument cannot add
//! path segments, a query or another host. With `url_argument`, the URL may come from a model:
//! the SSRF guard is what keeps it off internal addresses, and the credential is only attached
//! when the chosen URL's origin is one the credential is pinned to (otherwise the call fails
//! with `TOOL_PERMISSION_DENIED` and nothing is sent).

use std::time::Duration;

use async_trait::async_trait;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;
use url::Url;
use warrant_core::{Contract, Effect, ToolErrorCode};

use super::AdapterConfig;
use super::http::{json_headers, net_failure, parse_body, status_failure};
use crate::adapter::{Adapter, BindingError, Failure, Inquiry, Invocation, Reconciled};
use crate::binding::Binding;
use crate::net::{OutboundRequest, SafeClient};
use crate::secrets::Credential;

/// Everything but RFC 3986 unreserved characters is encoded in a filled-in segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Where the URL comes from.
#[derive(Debug)]
enum Source {
    Template(String),
    Argument(String),
}

/// The `structured_data_fetch` adapter of one contract.
#[derive(Debug)]
pub struct FetchAdapter {
    client: SafeClient,
    source: Source,
    credential: Option<Credential>,
    timeout: Duration,
}

impl FetchAdapter {
    /// Builds the adapter from its binding.
    ///
    /// # Errors
    /// A malformed binding, a non-read contract, or a missing credential.
    pub fn from_binding(
        contract: &Contract,
        doc: &Value,
        config: &AdapterConfig,
    ) -> Result<Self, BindingError> {
        let kind = "structured_data_fetch";
        let b = Binding::open(kind, doc, &["url", "url_argument", "credential", "timeout"])?;
        if contract.effect() != Effect::Read {
            return Err(BindingError::invalid(
                kind,
                "a fetch is a read: the contract's effect must be `read`",
            ));
        }
        let credential = b
            .opt_string("credential")?
            .map(|n| config.secrets.grant(n, contract))
            .transpose()?;
        let source = match (b.opt_string("url")?, b.opt_string("url_argument")?) {
            (Some(t), None) => {
                let probe = Url::parse(&fill(t, &serde_json::Map::new(), true).unwrap_or_default())
                    .map_err(|e| BindingError::invalid(kind, format!("`url`: {e}")))?;
                if !matches!(probe.scheme(), "http" | "https") {
                    return Err(BindingError::invalid(kind, "`url` must be an http(s) URL"));
                }
                // A template whose origin is fixed is checked now; one with a placeholder in
                // its authority is checked on every call (in `json_headers`).
                let authority_fixed = t
                    .split_once("://")
                    .is_some_and(|(_, rest)| !rest.split('/').next().unwrap_or_default().contains('{'));
                if let (Some(credential), true) = (&credential, authority_fixed) {
                    credential.check_origin(&probe)?;
                }
                Source::Template(t.to_owned())
            }
            (None, Some(arg)) => Source::Argument(arg.to_owned()),
            _ => {
                return Err(BindingError::invalid(
                    kind,
                    "exactly one of `url` and `url_argument` is required",
                ));
            }
        };
        Ok(FetchAdapter {
            client: config.client.clone(),
            source,
            credential,
            timeout: b.duration("timeout", Duration::from_secs(10), Duration::from_secs(120))?,
        })
    }

    fn url(&self, args: &serde_json::Map<String, Value>) -> Result<Url, Failure> {
        let invalid = |why: &str| Failure::new(ToolErrorCode::InputInvalid, why.to_owned());
        let text = match &self.source {
            Source::Template(t) => {
                fill(t, args, false).ok_or_else(|| invalid("an argument the URL needs is missing"))?
            }
            Source::Argument(name) => args
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("the URL argument is missing"))?
                .to_owned(),
        };
        let url = Url::parse(&text).map_err(|_| invalid("not a URL"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("only http(s) URLs can be fetched"));
        }
        Ok(url)
    }
}

/// Fills `{name}` placeholders with percent-encoded argument values (strings, integers,
/// booleans). `lenient` fills unknown names with a dummy (to check the template's shape).
fn fill(template: &str, args: &serde_json::Map<String, Value>, lenient: bool) -> Option<String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let (before, after) = rest.split_at(open);
        out.push_str(before);
        let close = after.find('}')?;
        let name = after.get(1..close)?;
        let value = match args.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            _ if lenient => "x".to_owned(),
            _ => return None,
        };
        out.extend(utf8_percent_encode(&value, SEGMENT));
        rest = after.get(close + 1..)?;
    }
    out.push_str(rest);
    Some(out)
}

#[async_trait]
impl Adapter for FetchAdapter {
    async fn invoke(&self, call: &Invocation<'_>) -> Result<Value, Failure> {
        let url = self.url(call.arguments)?;
        let headers = json_headers(self.credential.as_ref(), &url)?;
        let request = OutboundRequest {
            headers,
            follow_redirects: true,
            timeout: Some(self.timeout.min(call.timeout)),
            ..OutboundRequest::get(url)
        };
        let response = self.client.send(request).await.map_err(net_failure)?;
        if let Some(failure) = status_failure(response.status, &response.headers) {
            return Err(failure);
        }
        parse_body(&response.body)
            .map_err(|why| Failure::new(ToolErrorCode::OutputInvalid, format!("the answer {why}")))
    }

    async fn reconcile(&self, _inquiry: &Inquiry<'_>) -> Result<Reconciled, Failure> {
        // A read has no effect to find.
        Ok(Reconciled::NotCommitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_are_one_encoded_segment() {
        let args = json!({"id": "a/../b?x=1#y", "n": 7})
            .as_object()
            .cloned()
            .unwrap();
        assert_eq!(
            fill("https://h.example/o/{id}/{n}", &args, false).unwrap(),
            "https://h.example/o/a%2F..%2Fb%3Fx%3D1%23y/7"
        );
        assert_eq!(fill("https://h.example/{missing}", &args, false), None);
        assert_eq!(fill("https://h.example/{id", &args, false), None);
    }
}
