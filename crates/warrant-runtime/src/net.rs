//! The SSRF-safe outbound HTTP client: every request Warrant makes (the `http` adapter, the
//! `structured_data_fetch` built-in, reconciliation lookups) goes through [`SafeClient`].
//!
//! URLs may come from an untrusted model, so the destination is vetted before anything is sent:
//!
//! - only `http` and `https` URLs with a host and without credentials; plain `http` only to a
//!   host the operator allows ([`NetPolicy::allow_hosts`]) unless [`NetPolicy::allow_plain_http`];
//! - address literals, in every spelling the `url` crate accepts (`127.1`, `0x7f.0.0.1`,
//!   `2130706433`, `[::ffff:7f00:1]`, …, all normalized by its WHATWG parser), are vetted
//!   without resolution; `localhost`, `*.localhost` and cloud metadata names
//!   (`metadata.google.internal`, …) are refused without resolution;
//! - any other name is resolved by the [`Resolver`] and refused if ANY of its addresses is not
//!   [`is_public`] (and not allowed); the [`Dialer`] is then handed only vetted addresses, one
//!   [`std::net::SocketAddr`] at a time, so nothing resolves the name again;
//! - every redirect target goes through the same vetting; no proxy is ever used (hyper reads no
//!   proxy settings from the environment);
//! - the response body is capped while it streams, a connect timeout bounds each dial and one
//!   overall timeout bounds the whole exchange, redirects included.
//!
//! Built on hyper 1's HTTP/1 connections with our own connector (`connect::GuardedConnector`:
//! resolve, vet, dial) beneath `hyper_rustls` for TLS, and our own pool of idle connections
//! (`pool`); the Host header and the TLS server name are the URL's host. `reqwest` was considered and rejected:
//! IP-literal URLs bypass its resolver, and its connector layer cannot see the resolved address,
//! so neither a guard on the dialed address nor a test dialer beneath the guard is possible.

mod connect;
mod guard;
mod pool;

use std::error::Error as StdError;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use url::{Host, Url};

pub use guard::is_public;

use connect::{GuardedConnector, Shared};
use guard::{Guard, Target};
use pool::{Origin, Pool, Sender};

/// What outbound requests may reach and how much they may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPolicy {
    /// Hosts the operator allows even though they resolve to private/loopback/etc. addresses.
    /// Entries: exact host names (case-insensitive, e.g. "orders.internal"), IP literals ("127.0.0.1", "::1"),
    /// or CIDR ("10.1.0.0/16"). A host allowed here may also be fetched over plain http.
    ///
    /// A listed name accepts whatever it resolves to (and is the only way to reach a loopback
    /// or metadata name); an address or block allows literals inside it and any name whose
    /// every non-public address lies inside an address rule.
    pub allow_hosts: Vec<String>,
    /// Allow plain `http://` to hosts not in allow_hosts (default false: https only).
    pub allow_plain_http: bool,
    /// The largest response body accepted, in bytes; a larger one is refused with
    /// [`NetError::TooLarge`], never truncated (default 1 MiB).
    pub max_response_bytes: usize,
    /// The whole request, redirects and body included (default 10 s).
    pub timeout: Duration,
    /// Each dial of one vetted address (default 3 s).
    pub connect_timeout: Duration,
    /// The most redirects followed for one request (default 5).
    pub max_redirects: u8,
}

impl Default for NetPolicy {
    fn default() -> Self {
        Self {
            allow_hosts: Vec::new(),
            allow_plain_http: false,
            max_response_bytes: 1 << 20,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            max_redirects: 5,
        }
    }
}

/// Turns a host name into addresses. Injected in tests; [`SystemResolver`] otherwise.
#[async_trait::async_trait]
pub trait Resolver: Send + Sync + 'static {
    /// The addresses of `host` (a name, never an address literal), looked up for `port`.
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>>;
}

/// The operating system's resolver (`tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait::async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, port))
            .await?
            .map(|addr| addr.ip())
            .collect())
    }
}

/// Opens a TCP connection to one vetted address. Injected in tests; [`TcpDialer`] otherwise.
#[async_trait::async_trait]
pub trait Dialer: Send + Sync + 'static {
    /// Connects to `addr`, which the guard has already vetted.
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream>;
}

/// Plain TCP (`tokio::net::TcpStream::connect`, with `TCP_NODELAY`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpDialer;

#[async_trait::async_trait]
impl Dialer for TcpDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// One outbound request.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    /// The method (`CONNECT` is refused).
    pub method: Method,
    /// The destination: an `http` or `https` URL with a host and no credentials.
    pub url: Url,
    /// Request headers. `Host`, the body framing (`Content-Length`, `Transfer-Encoding`) and
    /// hop-by-hop headers are set by the client and dropped from here.
    pub headers: HeaderMap,
    /// The request body.
    pub body: Bytes,
    /// Follow redirects, vetting each target. Every hop before an error was sent, yet the error
    /// describes the last hop only: set this for safe (GET-like) requests.
    pub follow_redirects: bool,
    /// Overrides the policy timeout for this request (never longer than it).
    pub timeout: Option<Duration>,
}

impl OutboundRequest {
    /// A request with no headers, no body, no redirects and the policy timeout.
    #[must_use]
    pub fn new(method: Method, url: Url) -> Self {
        Self {
            method,
            url,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            follow_redirects: false,
            timeout: None,
        }
    }

    /// A `GET` of `url`.
    #[must_use]
    pub fn get(url: Url) -> Self {
        Self::new(Method::GET, url)
    }

    /// A `POST` of `body` to `url`.
    #[must_use]
    pub fn post(url: Url, body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            ..Self::new(Method::POST, url)
        }
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct OutboundResponse {
    /// The status of the final response.
    pub status: StatusCode,
    /// The headers of the final response.
    pub headers: HeaderMap,
    /// The whole body; at most `max_response_bytes` (a larger body is refused, not truncated).
    pub body: Bytes,
    /// The URL that answered, after any redirects.
    pub final_url: Url,
}

/// Why an outbound request failed. [`NetError::maybe_sent`] tells whether the destination may
/// have received it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// The destination is refused by the SSRF guard (address class or scheme); carries a description, never sends anything.
    #[error("destination refused: {0}")]
    Refused(String),
    /// The host name does not resolve.
    #[error("name resolution failed: {0}")]
    Resolve(String),
    /// Could not connect (refused, unreachable, connect timeout): the request was certainly NOT sent.
    #[error("connect failed: {0}")]
    Connect(String),
    /// No complete answer in time; the request MAY have been sent.
    #[error("timed out")]
    Timeout,
    /// The connection failed after it was established (reset, closed before the response): the request MAY have been sent.
    #[error("connection lost: {0}")]
    Lost(String),
    /// The response body is larger than max_response_bytes.
    #[error("response body too large")]
    TooLarge,
    /// Too many redirects.
    #[error("too many redirects")]
    TooManyRedirects,
    /// The URL is not an http(s) URL with a host, or a header is invalid.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// TLS failed (during the handshake, before the request was sent).
    #[error("tls failed: {0}")]
    Tls(String),
}

impl NetError {
    /// Whether the destination may have received the request: true for `Timeout` and `Lost`
    /// only. (After followed redirects, earlier hops were sent whatever the error.)
    #[must_use]
    pub fn maybe_sent(&self) -> bool {
        matches!(self, Self::Timeout | Self::Lost(_))
    }
}

struct Inner {
    policy: NetPolicy,
    shared: Arc<Shared>,
    /// Dials (vetted), then TLS for `https`.
    connector: HttpsConnector<GuardedConnector>,
    /// Idle connections; one idle for [`IDLE_TIMEOUT`] is not used again.
    pool: Pool,
}

/// The SSRF-safe HTTP/1.1 client. Cheap to clone (one `Arc`); clones share the connection pool.
#[derive(Clone)]
pub struct SafeClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SafeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeClient")
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// Request headers the client owns: the Host of the vetted URL, the body framing it computes,
/// hop-by-hop headers that would change how the connection is used, and proxy credentials
/// (no proxy is ever used, so they could only leak to the destination).
const OWNED_HEADERS: &[HeaderName] = &[
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
];

/// Headers describing a body, dropped when a redirect turns the request into a body-less GET.
const CONTENT_HEADERS: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
];

/// Credentials that do not follow a redirect to another origin.
const CREDENTIAL_HEADERS: &[HeaderName] = &[header::AUTHORIZATION, header::COOKIE];

impl SafeClient {
    /// A client resolving with [`SystemResolver`] and dialing with [`TcpDialer`].
    #[must_use]
    pub fn new(policy: NetPolicy) -> Self {
        Self::with_parts(policy, Arc::new(SystemResolver), Arc::new(TcpDialer))
    }

    /// A client with the given resolver and dialer (tests inject both).
    #[must_use]
    pub fn with_parts(policy: NetPolicy, resolver: Arc<dyn Resolver>, dialer: Arc<dyn Dialer>) -> Self {
        let shared = Arc::new(Shared {
            guard: Guard::new(&policy.allow_hosts, policy.allow_plain_http),
            resolver,
            dialer,
            connect_timeout: policy.connect_timeout,
        });
        let tls = match HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        {
            Ok(builder) => builder,
            Err(err) => {
                tracing::warn!(%err, "ring provider refused; using the process default crypto provider");
                HttpsConnectorBuilder::new().with_webpki_roots()
            }
        };
        let connector = tls
            .https_or_http()
            .enable_http1()
            .wrap_connector(GuardedConnector::new(Arc::clone(&shared)));
        Self {
            inner: Arc::new(Inner {
                policy,
                shared,
                connector,
                pool: Pool::new(IDLE_TIMEOUT),
            }),
        }
    }

    /// The policy this client enforces.
    #[must_use]
    pub fn policy(&self) -> &NetPolicy {
        &self.inner.policy
    }

    /// Vets a destination that is not an HTTP URL (the SMTP relay) by the same rules as a
    /// request: the addresses that may be dialed, in resolver order. `tls` plays the part of
    /// `https` (without it, only a host the operator allows, or any with `allow_plain_http`).
    ///
    /// # Errors
    /// Refused by the guard, unresolvable, or no answer within the policy's timeout.
    pub async fn vet(&self, tls: bool, host: &str, port: u16) -> Result<Vec<IpAddr>, NetError> {
        let shared = &self.inner.shared;
        tokio::time::timeout(
            self.inner.policy.timeout,
            shared.guard.vet(tls, host, port, shared.resolver.as_ref()),
        )
        .await
        .unwrap_or(Err(NetError::Timeout))
    }

    /// Sends one request. Redirects (301/302/303/307/308) are followed only when `follow_redirects`,
    /// each target re-vetted (303, and 301/302 on POST, become GET without body per RFC 9110).
    ///
    /// # Errors
    ///
    /// A [`NetError`]: refused by the guard, unresolvable, not connected, timed out, lost,
    /// too large, too many redirects, invalid or a TLS failure.
    pub async fn send(&self, request: OutboundRequest) -> Result<OutboundResponse, NetError> {
        let policy_timeout = self.inner.policy.timeout;
        let limit = request
            .timeout
            .map_or(policy_timeout, |timeout| timeout.min(policy_timeout));
        tokio::time::timeout(limit, self.exchange(request))
            .await
            .unwrap_or(Err(NetError::Timeout))
    }

    async fn exchange(&self, request: OutboundRequest) -> Result<OutboundResponse, NetError> {
        let OutboundRequest {
            mut method,
            mut url,
            mut headers,
            mut body,
            follow_redirects,
            ..
        } = request;
        if method == Method::CONNECT {
            return Err(NetError::InvalidRequest(
                "the CONNECT method is not supported".into(),
            ));
        }
        // Looked for in one pass over the few headers a caller sets (a standard name compares
        // as a constant), removed only when there: a removal hashes the name and probes.
        if headers.keys().any(|name| OWNED_HEADERS.contains(name)) {
            for name in OWNED_HEADERS {
                headers.remove(name);
            }
        }
        let mut redirects: u8 = 0;
        loop {
            let uri = self.check(&url)?;
            let (origin, path, host) = target_of(&uri)?;
            let mut outgoing = http::Request::new(Full::new(body.clone()));
            *outgoing.method_mut() = method.clone();
            *outgoing.uri_mut() = path;
            // Kept for the next hop only when a redirect may be followed.
            *outgoing.headers_mut() = if follow_redirects {
                headers.clone()
            } else {
                std::mem::take(&mut headers)
            };
            outgoing.headers_mut().insert(header::HOST, host);
            let (response, sender) = self.request(&origin, &uri, outgoing).await?;
            let status = response.status();
            if follow_redirects
                && is_redirect(status)
                && let Some(location) = response.headers().get(header::LOCATION)
            {
                if redirects >= self.inner.policy.max_redirects {
                    return Err(NetError::TooManyRedirects);
                }
                redirects = redirects.saturating_add(1);
                let next = std::str::from_utf8(location.as_bytes())
                    .ok()
                    .and_then(|location| url.join(location).ok())
                    .ok_or_else(|| NetError::InvalidRequest("unusable redirect location".into()))?;
                if let Some(rewritten) = redirect_method(status, &method) {
                    method = rewritten;
                    body = Bytes::new();
                    for name in CONTENT_HEADERS {
                        headers.remove(name);
                    }
                }
                if next.origin() != url.origin() {
                    for name in CREDENTIAL_HEADERS {
                        headers.remove(name);
                    }
                }
                tracing::debug!(%status, host = next.host_str(), "following a redirect");
                url = next;
                continue;
            }
            let (parts, incoming) = response.into_parts();
            // These carry no body, whatever length they declare.
            let bodiless = method == Method::HEAD
                || status == StatusCode::NO_CONTENT
                || status == StatusCode::NOT_MODIFIED;
            let max = self.inner.policy.max_response_bytes;
            let body = read_capped(incoming, &parts.headers, bodiless, max).await?;
            // Read to its end: the connection may carry the next request.
            self.inner.pool.put(origin, sender);
            return Ok(OutboundResponse {
                status,
                headers: parts.headers,
                body,
                final_url: url,
            });
        }
    }

    /// Sends `outgoing` on an idle connection to `origin`, or on a new one. A request that an
    /// idle connection gives back unwritten (its peer closed it meanwhile) goes on the next
    /// one; a new connection that gives it back is a failed connect (nothing was sent); once
    /// hyper may have written any of it, a failure is [`NetError::Lost`].
    async fn request(
        &self,
        origin: &Origin,
        uri: &Uri,
        mut outgoing: http::Request<Full<Bytes>>,
    ) -> Result<(http::Response<Incoming>, Sender), NetError> {
        loop {
            let (mut sender, kept) = match self.inner.pool.checkout(origin) {
                Some(sender) => (sender, true),
                None => (self.connect(uri).await?, false),
            };
            if kept && sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(outgoing).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) if kept => outgoing = unsent,
                    Some(_) => {
                        return Err(NetError::Connect(format!(
                            "the connection closed before the request was sent: {}",
                            describe(failed.error())
                        )));
                    }
                    None => return Err(NetError::Lost(describe(failed.error()))),
                },
            }
        }
    }

    /// A new connection to `uri`'s origin: dialed by the guarded connector (TLS above it for
    /// `https`), its HTTP/1 state driven by a task of its own until either side closes it.
    async fn connect(&self, uri: &Uri) -> Result<Sender, NetError> {
        use tower_service::Service as _;
        let mut connector = self.inner.connector.clone();
        let io = async {
            std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
            connector.call(uri.clone()).await
        }
        .await
        .map_err(|err| connect_error(err.as_ref()))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|err| NetError::Connect(describe(&err)))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %describe(&err), "upstream connection ended");
            }
        });
        Ok(sender)
    }

    /// The checks that need no resolution (scheme, host, credentials, literals, loopback and
    /// metadata names), then the URI hyper gets. The connector vets again, with resolution.
    fn check(&self, url: &Url) -> Result<Uri, NetError> {
        let https = match url.scheme() {
            "https" => true,
            "http" => false,
            other => {
                return Err(NetError::InvalidRequest(format!(
                    "scheme {other} is not http or https"
                )));
            }
        };
        let target = match url.host() {
            Some(Host::Ipv4(ip)) => Target::Ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => Target::Ip(IpAddr::V6(ip)),
            Some(Host::Domain(name)) => Target::parse(name),
            None => return Err(NetError::InvalidRequest("the url has no host".into())),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(NetError::InvalidRequest(
                "credentials in the url are not supported".into(),
            ));
        }
        self.inner.shared.guard.plan(https, &target)?;
        // The URL's text without its fragment, sliced rather than copied.
        url[..url::Position::AfterQuery]
            .parse::<Uri>()
            .map_err(|err| NetError::InvalidRequest(format!("url: {err}")))
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// The method a redirect turns the request into, when it drops the body (RFC 9110 §15.4):
/// 303 makes anything but HEAD a GET; 301 and 302 make a POST a GET.
fn redirect_method(status: StatusCode, method: &Method) -> Option<Method> {
    match status.as_u16() {
        303 if *method != Method::HEAD && *method != Method::GET => Some(Method::GET),
        301 | 302 if *method == Method::POST => Some(Method::GET),
        _ => None,
    }
}

/// Reads a body, refusing it as soon as it exceeds `max` bytes (a declared length over the cap
/// is refused before reading, unless the response is `bodiless`).
async fn read_capped(
    mut body: Incoming,
    headers: &HeaderMap,
    bodiless: bool,
    max: usize,
) -> Result<Bytes, NetError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if !bodiless && declared.is_some_and(|length| length > u64::try_from(max).unwrap_or(u64::MAX)) {
        return Err(NetError::TooLarge);
    }
    let capacity = declared
        .and_then(|length| usize::try_from(length).ok())
        .unwrap_or(0)
        .min(max);
    let mut buffer = BytesMut::with_capacity(capacity);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|err| NetError::Lost(describe(&err)))?;
        if let Ok(data) = frame.into_data() {
            if data.len() > max.saturating_sub(buffer.len()) {
                return Err(NetError::TooLarge);
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer.freeze())
}

/// How long an idle upstream connection may be used again; past it, the pool closes it when
/// it next looks (a checkout), unless the upstream has closed it first.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A request's origin (its pool key), its origin-form target (`/path?query`) and its `Host`
/// header (the authority: the URL parser has dropped a default port).
fn target_of(uri: &Uri) -> Result<(Origin, Uri, http::HeaderValue), NetError> {
    let authority = uri
        .authority()
        .ok_or_else(|| NetError::InvalidRequest("the url has no host".into()))?;
    let host = http::HeaderValue::from_str(authority.as_str())
        .map_err(|err| NetError::InvalidRequest(format!("host: {err}")))?;
    let path = match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => Uri::from(path.clone()),
        _ => Uri::from_static("/"),
    };
    let origin = Origin {
        https: uri.scheme() == Some(&http::uri::Scheme::HTTPS),
        authority: authority.clone(),
    };
    Ok((origin, path, host))
}

/// Maps a failure to connect onto a `NetError`: one raised by our connector is returned as
/// is; any other comes from the TLS layer above it. Nothing was sent either way.
fn connect_error(err: &(dyn StdError + Send + Sync + 'static)) -> NetError {
    find_net_error(err).unwrap_or_else(|| NetError::Tls(describe(err)))
}

/// The first `NetError` among an error and its sources.
fn find_net_error(err: &(dyn StdError + 'static)) -> Option<NetError> {
    let mut source = Some(err);
    while let Some(current) = source {
        if let Some(net) = current.downcast_ref::<NetError>() {
            return Some(net.clone());
        }
        source = current.source();
    }
    None
}

/// An error and its sources, joined by ": ".
fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(current) = source {
        let next = current.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = current.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        reason = "tests"
    )]

    use super::*;

    #[test]
    fn policy_defaults() {
        let policy = NetPolicy::default();
        assert!(policy.allow_hosts.is_empty());
        assert!(!policy.allow_plain_http);
        assert_eq!(policy.max_response_bytes, 1024 * 1024);
        assert_eq!(policy.timeout, Duration::from_secs(10));
        assert_eq!(policy.connect_timeout, Duration::from_secs(3));
        assert_eq!(policy.max_redirects, 5);
    }

    #[test]
    fn only_timeout_and_lost_may_have_been_sent() {
        let sent = [NetError::Timeout, NetError::Lost("reset".into())];
        let not_sent = [
            NetError::Refused(String::new()),
            NetError::Resolve(String::new()),
            NetError::Connect(String::new()),
            NetError::TooLarge,
            NetError::TooManyRedirects,
            NetError::InvalidRequest(String::new()),
            NetError::Tls(String::new()),
        ];
        assert!(sent.iter().all(NetError::maybe_sent));
        assert!(!not_sent.iter().any(NetError::maybe_sent));
    }

    #[test]
    fn redirect_methods_follow_rfc_9110() {
        let table = [
            (301, Method::POST, Some(Method::GET)),
            (302, Method::POST, Some(Method::GET)),
            (303, Method::POST, Some(Method::GET)),
            (303, Method::PUT, Some(Method::GET)),
            (303, Method::DELETE, Some(Method::GET)),
            (303, Method::GET, None),
            (303, Method::HEAD, None),
            (301, Method::PUT, None),
            (302, Method::GET, None),
            (307, Method::POST, None),
            (308, Method::POST, None),
        ];
        for (status, method, expected) in table {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(redirect_method(status, &method), expected, "{status} {method}");
        }
        for status in [301, 302, 303, 307, 308] {
            assert!(is_redirect(StatusCode::from_u16(status).unwrap()));
        }
        for status in [200, 300, 304, 305, 306, 400] {
            assert!(!is_redirect(StatusCode::from_u16(status).unwrap()));
        }
    }

    #[tokio::test]
    async fn urls_are_checked_before_anything_is_sent() {
        let client = SafeClient::new(NetPolicy::default());
        let check = |url: &str| client.check(&Url::parse(url).unwrap());
        assert!(matches!(
            check("ftp://example.com/"),
            Err(NetError::InvalidRequest(_))
        ));
        assert!(matches!(
            check("file:///etc/passwd"),
            Err(NetError::InvalidRequest(_))
        ));
        assert!(matches!(
            check("https://user:secret@example.com/"),
            Err(NetError::InvalidRequest(_))
        ));
        assert!(matches!(check("https://127.1/"), Err(NetError::Refused(_))));
        assert!(matches!(check("http://8.8.8.8/"), Err(NetError::Refused(_))));
        let uri = check("https://Example.COM:8443/a/b?c=d#fragment").unwrap();
        assert_eq!(uri.to_string(), "https://example.com:8443/a/b?c=d");
        let uri = check("https://[2606:4700:4700::1111]/").unwrap();
        assert_eq!(uri.host(), Some("[2606:4700:4700::1111]"));
    }

    #[test]
    fn a_request_goes_in_origin_form_with_the_authority_as_host() {
        let target = |url: &str| target_of(&url.parse::<Uri>().unwrap()).unwrap();
        let (origin, path, host) = target("https://example.com:8443/a/b?c=d");
        assert_eq!(
            origin,
            Origin {
                https: true,
                authority: http::uri::Authority::from_static("example.com:8443")
            }
        );
        assert_eq!(path.to_string(), "/a/b?c=d");
        assert_eq!(host, "example.com:8443");
        let (origin, path, host) = target("http://[::1]:9000");
        assert!(!origin.https);
        assert_eq!(path.to_string(), "/");
        assert_eq!(host, "[::1]:9000");
    }

    /// A loopback server answering every request on a connection with `hello`, keep-alive.
    async fn keep_alive_server() -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buffer = [0_u8; 1024];
                    loop {
                        let Ok(read) = stream.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buffer[..read]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
                            if stream.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    fn loopback_client() -> SafeClient {
        SafeClient::new(NetPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            ..NetPolicy::default()
        })
    }

    #[tokio::test]
    async fn a_connection_read_to_its_end_is_kept_and_used_again() {
        let server = keep_alive_server().await;
        let client = loopback_client();
        let url = Url::parse(&format!("http://{server}/orders")).unwrap();
        for _ in 0..3 {
            let response = client.send(OutboundRequest::get(url.clone())).await.unwrap();
            assert_eq!(response.body, "hello");
            assert_eq!(client.inner.pool.idle(), 1, "one connection, kept between calls");
        }
    }

    #[tokio::test]
    async fn a_connection_idle_too_long_is_closed_not_used() {
        let server = keep_alive_server().await;
        let client = loopback_client();
        let url = Url::parse(&format!("http://{server}/orders")).unwrap();
        client.send(OutboundRequest::get(url)).await.unwrap();
        let origin = Origin {
            https: false,
            authority: server.to_string().parse().unwrap(),
        };
        let Some(sender) = client.inner.pool.checkout(&origin) else {
            panic!("the connection was not kept");
        };
        let pool = Pool::new(Duration::ZERO);
        pool.put(origin.clone(), sender);
        assert_eq!(pool.idle(), 1);
        assert!(pool.checkout(&origin).is_none(), "idle past the timeout");
        assert_eq!(pool.idle(), 0, "and closed");
    }

    #[tokio::test]
    async fn a_response_not_read_to_its_end_does_not_keep_its_connection() {
        let server = keep_alive_server().await;
        let client = SafeClient::new(NetPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            max_response_bytes: 2,
            ..NetPolicy::default()
        });
        let url = Url::parse(&format!("http://{server}/orders")).unwrap();
        let err = client.send(OutboundRequest::get(url)).await.unwrap_err();
        assert_eq!(err, NetError::TooLarge);
        assert_eq!(client.inner.pool.idle(), 0);
    }

    #[test]
    fn connector_errors_are_found_in_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] NetError);
        let outer = Outer(NetError::Refused("10.0.0.1 is private".into()));
        assert_eq!(
            find_net_error(&outer),
            Some(NetError::Refused("10.0.0.1 is private".into()))
        );
        let io = std::io::Error::other("handshake failed");
        assert_eq!(find_net_error(&io), None);
        assert_eq!(
            describe(&outer),
            "outer: destination refused: 10.0.0.1 is private"
        );
    }
}
