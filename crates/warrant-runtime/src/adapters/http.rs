//! The `http` adapter: POSTs the canonical arguments as JSON to the tool's endpoint with the
//! operation id in an `Idempotency-Key` header, and maps the answer onto the closed codes.
//!
//! ```yaml
//! adapter:
//!   kind: http
//!   url: https://credits.internal.example/v1/credits
//!   credential: CREDITS_API_TOKEN      # sent as `Authorization: Bearer …`; optional; must be
//!                                      # granted to this tool and pinned to the URL's origin
//!   timeout: 10s                       # per attempt; optional
//!   status_url: https://credits.internal.example/v1/operations/{operation_id}   # optional
//! ```
//!
//! | answer | code |
//! |---|---|
//! | 2xx with a JSON body | success (validated against the output schema by the runtime) |
//! | 408, 504, no answer in time | `TOOL_TIMEOUT` (504 and no answer: the effect may have happened) |
//! | 429 | `TOOL_RATE_LIMITED`, `Retry-After` honoured |
//! | 500, 502, 503, connection refused, name not resolved | `TOOL_UPSTREAM_UNAVAILABLE`, `Retry-After` honoured |
//! | connection lost after the request was sent | `TOOL_UPSTREAM_UNAVAILABLE`, effect may have happened |
//! | 401, 403 | `TOOL_PERMISSION_DENIED` |
//! | 400, 422 | `TOOL_INPUT_INVALID` |
//! | other 4xx, 501, 505, destination refused by the network guard | `TOOL_PERMANENT_FAILURE` |
//! | anything else | `TOOL_UNCLASSIFIED` |
//!
//! **What proves no effect happened.** A 4xx (and 501, 505) is the server refusing before it
//! acted. Any other 5xx proves nothing: for a `write`, `irreversible` or `async`
//! tool it means *the effect may have happened* — the call is retried with the same
//! idempotency key where the tool honours one, and is otherwise `unknown` until
//! reconciliation asks `status_url`. Only a `read` treats a 5xx as a plain failure.
//!
//! Reconciliation GETs `status_url` and reads the status answer of [`super::read_status`]; a
//! 404 there means the operation never happened.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use serde_json::Value;
use url::Url;
use warrant_core::{Contract, Effect, ToolErrorCode};

use super::{AdapterConfig, read_status, with_operation};
use crate::adapter::{Adapter, BindingError, Failure, Inquiry, Invocation, Reconciled};
use crate::binding::Binding;
use crate::net::{NetError, OutboundRequest, SafeClient};
use crate::secrets::Credential;

/// The longest per-attempt timeout a binding may ask for.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// The `http` adapter of one contract.
#[derive(Debug)]
pub struct HttpAdapter {
    client: SafeClient,
    url: Url,
    status_url: Option<String>,
    credential: Option<Credential>,
    /// The credential's `Authorization` header for `url`, made once with the adapter.
    authorization: Option<HeaderValue>,
    timeout: Duration,
}

impl HttpAdapter {
    /// Builds the adapter from its binding.
    ///
    /// # Errors
    /// A malformed binding, or a credential that is missing, not granted to this tool or not
    /// pinned to the endpoint's origin.
    pub fn from_binding(
        contract: &Contract,
        doc: &Value,
        config: &AdapterConfig,
    ) -> Result<Self, BindingError> {
        let b = Binding::open("http", doc, &["url", "credential", "timeout", "status_url"])?;
        let url = parse_url(&b, b.string("url")?)?;
        let status_url = check_status_url(&b)?;
        let credential = b
            .opt_string("credential")?
            .map(|n| config.secrets.grant(n, contract))
            .transpose()?;
        if let Some(credential) = &credential {
            credential.check_origin(&url)?;
            if let Some(template) = &status_url {
                credential.check_origin(&parse_url(&b, &with_operation(template, "op_0"))?)?;
            }
        }
        let timeout = b.duration("timeout", Duration::from_secs(10), MAX_TIMEOUT)?;
        let authorization = match json_headers(credential.as_ref(), &url) {
            Ok(mut headers) => headers.remove(header::AUTHORIZATION),
            Err(failure) => return Err(BindingError::invalid("http", failure.detail())),
        };
        Ok(HttpAdapter {
            client: config.client.clone(),
            url,
            status_url,
            credential,
            authorization,
            timeout,
        })
    }

    pub(crate) fn headers(
        &self,
        url: &Url,
        call_scopes: &[String],
        tenant: &str,
    ) -> Result<HeaderMap, Failure> {
        // The endpoint was checked against the credential, and its header made, with the
        // adapter; another URL (a status URL) is checked now.
        let mut headers = if *url == self.url {
            let mut headers = HeaderMap::with_capacity(8);
            headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
            if let Some(authorization) = &self.authorization {
                headers.insert(header::AUTHORIZATION, authorization.clone());
            }
            headers
        } else {
            json_headers(self.credential.as_ref(), url)?
        };
        if let Ok(v) = HeaderValue::from_str(tenant) {
            headers.insert(TENANT_HEADER, v);
        }
        let scopes = match call_scopes {
            [] => Ok(HeaderValue::from_static("")),
            [one] => HeaderValue::from_str(one),
            many => HeaderValue::from_str(&many.join(" ")),
        };
        if let Ok(v) = scopes {
            headers.insert(SCOPES_HEADER, v);
        }
        Ok(headers)
    }
}

/// The tenant a call is made for.
const TENANT_HEADER: HeaderName = HeaderName::from_static("warrant-tenant");
/// The call's scopes, space-separated.
const SCOPES_HEADER: HeaderName = HeaderName::from_static("warrant-scopes");
/// The call's operation id, which the tool may use to make a retry safe.
const IDEMPOTENCY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

#[async_trait]
impl Adapter for HttpAdapter {
    async fn invoke(&self, call: &Invocation<'_>) -> Result<Value, Failure> {
        let mut headers = self.headers(&self.url, call.scopes, call.tenant)?;
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let key = HeaderValue::from_str(call.operation_id.as_str()).map_err(|_| {
            Failure::new(
                ToolErrorCode::PermanentFailure,
                "the operation id is not a header value",
            )
        })?;
        headers.insert(IDEMPOTENCY_HEADER, key);
        let request = OutboundRequest {
            headers,
            timeout: Some(self.timeout.min(call.timeout)),
            ..OutboundRequest::post(self.url.clone(), Bytes::copy_from_slice(call.canonical))
        };
        let response = self.client.send(request).await.map_err(net_failure)?;
        if let Some(failure) = status_failure(response.status, &response.headers) {
            return Err(effect_unproven(failure, response.status, call.contract.effect()));
        }
        parse_body(&response.body)
            .map_err(|why| Failure::ambiguous(ToolErrorCode::OutputInvalid, format!("the 2xx answer {why}")))
    }

    async fn reconcile(&self, inquiry: &Inquiry<'_>) -> Result<Reconciled, Failure> {
        match &self.status_url {
            Some(template) => {
                let url = status_url(template, inquiry)?;
                let headers = self.headers(&url, &[], inquiry.tenant)?;
                ask_status(&self.client, url, headers, inquiry).await
            }
            None => Ok(Reconciled::Unknown),
        }
    }
}

/// A `status_url` template with `{operation_id}` filled in.
pub(crate) fn status_url(template: &str, inquiry: &Inquiry<'_>) -> Result<Url, Failure> {
    Url::parse(&with_operation(template, inquiry.operation_id.as_str()))
        .map_err(|_| Failure::new(ToolErrorCode::PermanentFailure, "status_url is not a URL"))
}

/// Asks a status endpoint what became of an operation: GET `url` (see [`status_url`]); 404
/// means it never happened, 200 carries a status answer.
pub(crate) async fn ask_status(
    client: &SafeClient,
    url: Url,
    headers: HeaderMap,
    inquiry: &Inquiry<'_>,
) -> Result<Reconciled, Failure> {
    let request = OutboundRequest {
        headers,
        timeout: Some(inquiry.timeout),
        ..OutboundRequest::get(url)
    };
    let response = client.send(request).await.map_err(net_failure)?;
    if response.status == StatusCode::NOT_FOUND {
        return Ok(Reconciled::NotCommitted);
    }
    if let Some(failure) = status_failure(response.status, &response.headers) {
        return Err(failure);
    }
    let value = parse_body(&response.body)
        .map_err(|why| Failure::new(ToolErrorCode::Unclassified, format!("the status answer {why}")))?;
    read_status(&value)
}

/// Checks a `status_url` template at binding time.
pub(crate) fn check_status_url(b: &Binding<'_>) -> Result<Option<String>, BindingError> {
    let status_url = b.opt_string("status_url")?.map(str::to_owned);
    if let Some(template) = &status_url {
        parse_url(b, &with_operation(template, "op_0"))?;
    }
    Ok(status_url)
}

fn parse_url(b: &Binding<'_>, text: &str) -> Result<Url, BindingError> {
    let url = Url::parse(text).map_err(|e| BindingError::invalid(b.kind(), format!("`{text}`: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(BindingError::invalid(
            b.kind(),
            format!("`{text}` is not an http(s) URL"),
        ));
    }
    Ok(url)
}

/// `Accept: application/json`, and the adapter's own credential as a bearer token (marked
/// sensitive, so no debug output shows it) for a request to `url`.
///
/// INVARIANT: this is the one place a credential is put on an outbound request, and it is put
/// there only when `url`'s origin is one the credential is pinned to — whoever chose the URL.
/// (Redirects to another origin drop it: see `SafeClient`.)
pub(crate) fn json_headers(credential: Option<&Credential>, url: &Url) -> Result<HeaderMap, Failure> {
    // Room for every header a call sends (accept, authorization, tenant, scopes, content type,
    // idempotency key) without growing the map.
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    if let Some(credential) = credential {
        if !credential.may_reach(url) {
            return Err(Failure::new(
                ToolErrorCode::PermissionDenied,
                format!(
                    "credential `{}` may not be sent to {}",
                    credential.name(),
                    url.origin().ascii_serialization()
                ),
            ));
        }
        let secret = credential.secret();
        let mut value = HeaderValue::from_str(&format!("Bearer {}", secret.expose())).map_err(|_| {
            Failure::new(
                ToolErrorCode::PermanentFailure,
                "the credential is not a header value",
            )
        })?;
        value.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, value);
    }
    Ok(headers)
}

/// A JSON body, strictly parsed (duplicate keys, unsafe numbers refused).
pub(crate) fn parse_body(body: &[u8]) -> Result<Value, &'static str> {
    // The client already capped the body's size.
    warrant_core::json::parse(body, warrant_core::json::Limits::DOCUMENT).map_err(|_| "is not strict JSON")
}

/// A failure of a call that may have an effect, judged by its status: a 4xx (and 501, 505)
/// says the server refused before acting, so no effect happened; any other status proves
/// nothing — a 5xx, a 3xx (a `303 See Other` is the usual answer to a POST that took effect,
/// and a write's redirect is never followed), anything outside the classes — so for every
/// effect but `read` it is ambiguous: the outcome is `unknown` and reconciled, or retried
/// with the same idempotency key where the tool honours it.
pub(crate) fn effect_unproven(failure: Failure, status: StatusCode, effect: Effect) -> Failure {
    let refused_before_acting = status.is_client_error() || matches!(status.as_u16(), 501 | 505);
    if effect == Effect::Read || refused_before_acting || failure.is_ambiguous() {
        failure
    } else {
        failure.into_ambiguous()
    }
}

/// The failure a non-2xx status means, or `None` for 2xx.
pub(crate) fn status_failure(status: StatusCode, headers: &HeaderMap) -> Option<Failure> {
    if status.is_success() {
        return None;
    }
    let detail = format!("answered {}", status.as_u16());
    let wait = retry_after(headers);
    Some(match status.as_u16() {
        408 => Failure::new(ToolErrorCode::Timeout, detail),
        504 => Failure::ambiguous(ToolErrorCode::Timeout, detail),
        429 => Failure::new(ToolErrorCode::RateLimited, detail).retry_after(wait),
        500 | 502 | 503 => Failure::new(ToolErrorCode::UpstreamUnavailable, detail).retry_after(wait),
        501 | 505 => Failure::new(ToolErrorCode::PermanentFailure, detail),
        401 | 403 => Failure::new(ToolErrorCode::PermissionDenied, detail),
        400 | 422 => Failure::new(ToolErrorCode::InputInvalid, detail),
        400..=499 => Failure::new(ToolErrorCode::PermanentFailure, detail),
        _ => Failure::new(ToolErrorCode::Unclassified, detail),
    })
}

/// A transport failure, classified. Only a timeout or a lost connection may have reached the
/// tool; everything else happened before anything was sent.
pub(crate) fn net_failure(e: NetError) -> Failure {
    let detail = e.to_string();
    match e {
        NetError::Timeout => Failure::ambiguous(ToolErrorCode::Timeout, detail),
        NetError::Lost(_) => Failure::ambiguous(ToolErrorCode::UpstreamUnavailable, detail),
        NetError::TooLarge => Failure::ambiguous(ToolErrorCode::OutputInvalid, detail),
        NetError::Connect(_) | NetError::Resolve(_) | NetError::Tls(_) => {
            Failure::new(ToolErrorCode::UpstreamUnavailable, detail)
        }
        NetError::Refused(_) | NetError::InvalidRequest(_) | NetError::TooManyRedirects => {
            Failure::new(ToolErrorCode::PermanentFailure, detail)
        }
    }
}

/// `Retry-After` as delay-seconds or an HTTP date (RFC 9110 §10.2.3), capped at an hour.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = httpdate::parse_http_date(text).ok()?;
            at.duration_since(std::time::SystemTime::now())
                .unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(Duration::from_secs(3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_proves_a_call_with_an_effect_had_none() {
        let h = HeaderMap::new();
        // A server error, a redirect (a write's is never followed; `303` is the usual answer to
        // a POST that took effect), a status outside the classes: proof of nothing.
        for status in [500, 502, 503, 507, 599, 300, 302, 303, 307, 308, 600, 999] {
            let status = StatusCode::from_u16(status).unwrap();
            let failure = || status_failure(status, &h).unwrap();
            assert!(
                !effect_unproven(failure(), status, Effect::Read).is_ambiguous(),
                "{status}"
            );
            for effect in [Effect::Write, Effect::Irreversible, Effect::Async] {
                assert!(
                    effect_unproven(failure(), status, effect).is_ambiguous(),
                    "{status} {effect:?}"
                );
            }
        }
        // The server refused before acting.
        for status in [400, 401, 403, 404, 408, 409, 422, 429, 501, 505] {
            let status = StatusCode::from_u16(status).unwrap();
            let failure = status_failure(status, &h).unwrap();
            assert!(
                !effect_unproven(failure, status, Effect::Write).is_ambiguous(),
                "{status}"
            );
        }
    }

    #[test]
    fn statuses_map_onto_the_closed_codes() {
        let h = HeaderMap::new();
        let table = [
            (408, ToolErrorCode::Timeout, false),
            (504, ToolErrorCode::Timeout, true),
            (429, ToolErrorCode::RateLimited, false),
            (502, ToolErrorCode::UpstreamUnavailable, false),
            (503, ToolErrorCode::UpstreamUnavailable, false),
            (401, ToolErrorCode::PermissionDenied, false),
            (403, ToolErrorCode::PermissionDenied, false),
            (400, ToolErrorCode::InputInvalid, false),
            (422, ToolErrorCode::InputInvalid, false),
            (404, ToolErrorCode::PermanentFailure, false),
            (409, ToolErrorCode::PermanentFailure, false),
            (500, ToolErrorCode::UpstreamUnavailable, false),
            (501, ToolErrorCode::PermanentFailure, false),
            (302, ToolErrorCode::Unclassified, false),
        ];
        for (status, code, ambiguous) in table {
            let f = status_failure(StatusCode::from_u16(status).unwrap(), &h).unwrap();
            assert_eq!((f.code(), f.is_ambiguous()), (code, ambiguous), "{status}");
        }
        assert!(status_failure(StatusCode::CREATED, &h).is_none());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("999999999"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3600)));
    }

    #[test]
    fn transport_failures_say_whether_anything_was_sent() {
        assert!(net_failure(NetError::Timeout).is_ambiguous());
        assert!(net_failure(NetError::Lost("reset".into())).is_ambiguous());
        assert!(!net_failure(NetError::Connect("refused".into())).is_ambiguous());
        assert_eq!(
            net_failure(NetError::Connect("refused".into())).code(),
            ToolErrorCode::UpstreamUnavailable
        );
        assert_eq!(
            net_failure(NetError::Refused("10.0.0.1".into())).code(),
            ToolErrorCode::PermanentFailure
        );
    }
}
