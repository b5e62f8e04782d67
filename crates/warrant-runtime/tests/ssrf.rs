//! The outbound client's SSRF guard end to end. Every test resolves through an injected map and
//! dials through a dialer that connects to loopback only: any other address is recorded and
//! refused, and a test fails unless it expected exactly those addresses — so a guard bug can
//! never make these tests reach the network.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests"
)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{any, get, post};
use bytes::Bytes;
use http::header::{AUTHORIZATION, HOST, LOCATION};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use url::{Host, Url};
use warrant_runtime::net::{
    Dialer, NetError, NetPolicy, OutboundRequest, Resolver, SafeClient, TcpDialer, is_public,
};

const PUBLIC_V4: &str = "93.184.216.34";
const PUBLIC_V6: &str = "2606:2800:220:1:248:1893:25c8:1946";

/// Resolves from a fixed map and records every name it is asked for.
#[derive(Default)]
struct MapResolver {
    names: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Resolver for MapResolver {
    async fn resolve(&self, host: &str, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        self.asked.lock().unwrap().push(host.to_string());
        self.names
            .get(host)
            .cloned()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "unknown test host"))
    }
}

/// Dials loopback only (through `TcpDialer`); records every address it is asked for, and refuses
/// and records separately any address outside 127.0.0.0/8 and ::1.
#[derive(Default)]
struct LoopbackDialer {
    dialed: Mutex<Vec<SocketAddr>>,
    foreign: Mutex<Vec<SocketAddr>>,
    /// Loopback addresses whose dial never completes.
    hang: Vec<IpAddr>,
}

#[async_trait::async_trait]
impl Dialer for LoopbackDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.dialed.lock().unwrap().push(addr);
        if !addr.ip().to_canonical().is_loopback() {
            self.foreign.lock().unwrap().push(addr);
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the test dialer connects to loopback only",
            ));
        }
        if self.hang.contains(&addr.ip()) {
            std::future::pending::<()>().await;
        }
        TcpDialer.dial(addr).await
    }
}

struct Harness {
    client: SafeClient,
    resolver: Arc<MapResolver>,
    dialer: Arc<LoopbackDialer>,
}

impl Harness {
    fn new(policy: NetPolicy, names: &[(&str, &[&str])]) -> Self {
        Self::with_hang(policy, names, &[])
    }

    fn with_hang(policy: NetPolicy, names: &[(&str, &[&str])], hang: &[&str]) -> Self {
        let names = names
            .iter()
            .map(|(name, addrs)| {
                (
                    name.to_string(),
                    addrs.iter().map(|a| a.parse().unwrap()).collect(),
                )
            })
            .collect();
        let resolver = Arc::new(MapResolver {
            names,
            asked: Mutex::default(),
        });
        let hang = hang.iter().map(|a| a.parse().unwrap()).collect();
        let dialer = Arc::new(LoopbackDialer {
            hang,
            ..LoopbackDialer::default()
        });
        let client = SafeClient::with_parts(policy, resolver.clone(), dialer.clone());
        Self {
            client,
            resolver,
            dialer,
        }
    }

    fn allowing(hosts: &[&str]) -> Self {
        Self::new(policy(hosts), &[])
    }

    async fn get(&self, url: &str) -> Result<warrant_runtime::net::OutboundResponse, NetError> {
        self.client
            .send(OutboundRequest::get(Url::parse(url).unwrap()))
            .await
    }

    async fn follow(&self, method: Method, url: &str, body: &'static str) -> Result<String, NetError> {
        let mut request = OutboundRequest::new(method, Url::parse(url).unwrap());
        request.body = Bytes::from_static(body.as_bytes());
        request.follow_redirects = true;
        let response = self.client.send(request).await?;
        Ok(String::from_utf8(response.body.to_vec()).unwrap())
    }

    fn asked(&self) -> Vec<String> {
        self.resolver.asked.lock().unwrap().clone()
    }

    fn dialed(&self) -> Vec<SocketAddr> {
        self.dialer.dialed.lock().unwrap().clone()
    }

    /// The non-loopback addresses the dialer was asked for, acknowledged (and cleared) by the test.
    fn take_foreign(&self) -> Vec<SocketAddr> {
        std::mem::take(&mut *self.dialer.foreign.lock().unwrap())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let foreign = self.take_foreign();
            assert!(
                foreign.is_empty(),
                "unexpected dial of non-loopback addresses: {foreign:?}"
            );
        }
    }
}

fn policy(hosts: &[&str]) -> NetPolicy {
    NetPolicy {
        allow_hosts: hosts.iter().map(ToString::to_string).collect(),
        ..NetPolicy::default()
    }
}

fn refused(result: Result<impl std::fmt::Debug, NetError>, what: &str) -> String {
    match result {
        Err(NetError::Refused(reason)) => reason,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

fn sock(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

// ---- servers (loopback only) ----

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn redirect(status: StatusCode, to: impl Into<String>) -> (StatusCode, [(http::HeaderName, String); 1]) {
    (status, [(LOCATION, to.into())])
}

/// The test application; `other` is a second server, for cross-origin redirects.
fn app(other: Option<SocketAddr>) -> Router {
    let cross = format!("http://{}/headers", other.unwrap_or_else(|| sock("127.0.0.1:9")));
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/echo", post(|body: Bytes| async move { body }))
        .route(
            "/method",
            any(|method: Method, body: Bytes| async move { format!("{method} {}", body.len()) }),
        )
        .route(
            "/headers",
            get(|headers: HeaderMap| async move {
                let host = headers
                    .get(HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("-")
                    .to_string();
                format!("host={host};auth={}", headers.contains_key(AUTHORIZATION))
            }),
        )
        .route("/big", get(|| async { vec![b'x'; 2 * 1024 * 1024] }))
        .route("/kib", get(|| async { vec![b'x'; 1024] }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route(
            "/to-private",
            get(|| async { redirect(StatusCode::FOUND, "http://10.0.0.1/") }),
        )
        .route(
            "/to-metadata",
            get(|| async { redirect(StatusCode::FOUND, "http://169.254.169.254/latest/meta-data/") }),
        )
        .route(
            "/to-loopback-literal",
            get(|| async { redirect(StatusCode::FOUND, "http://0x7f.0.0.2/") }),
        )
        .route(
            "/to-name",
            get(|| async { redirect(StatusCode::FOUND, "http://private.test/") }),
        )
        .route(
            "/to-public",
            get(|| async { redirect(StatusCode::FOUND, "https://public.test/") }),
        )
        .route(
            "/to-hello",
            get(|| async { redirect(StatusCode::FOUND, "/hello") }),
        )
        .route(
            "/see-other",
            any(|| async { redirect(StatusCode::SEE_OTHER, "/method") }),
        )
        .route("/found", any(|| async { redirect(StatusCode::FOUND, "/method") }))
        .route(
            "/temporary",
            any(|| async { redirect(StatusCode::TEMPORARY_REDIRECT, "/method") }),
        )
        .route(
            "/permanent",
            any(|| async { redirect(StatusCode::PERMANENT_REDIRECT, "/method") }),
        )
        .route("/loop", get(|| async { redirect(StatusCode::FOUND, "/loop") }))
        .route(
            "/same",
            get(|| async { redirect(StatusCode::TEMPORARY_REDIRECT, "/headers") }),
        )
        .route(
            "/cross",
            get(move || {
                let cross = cross.clone();
                async move { redirect(StatusCode::TEMPORARY_REDIRECT, cross) }
            }),
        )
        .route("/no-location", get(|| async { StatusCode::FOUND }))
}

async fn read_head(stream: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut buffer = [0_u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await.unwrap();
        if read == 0 {
            return;
        }
        seen.extend_from_slice(&buffer[..read]);
    }
}

/// Reads each request, then closes the connection without answering.
async fn serve_then_hang_up() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            drop(stream);
        }
    });
    addr
}

/// Answers with a chunked body that never ends.
async fn serve_endless_body() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                read_head(&mut stream).await;
                let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                if stream.write_all(head).await.is_err() {
                    return;
                }
                let chunk = [b"4000\r\n".as_slice(), &[b'x'; 0x4000], b"\r\n"].concat();
                while stream.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    addr
}

// ---- literals ----

#[test]
fn the_url_crate_normalizes_every_ipv4_spelling() {
    for spelling in [
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "017700000001",
        "0177.0.0.1",
        "0x7f.1",
        "127.0.0.1.",
        "0x7F000001",
    ] {
        let url = Url::parse(&format!("http://{spelling}/")).unwrap();
        assert_eq!(url.host(), Some(Host::Ipv4(Ipv4Addr::LOCALHOST)), "{spelling}");
    }
    let mapped = Url::parse("http://[::ffff:127.0.0.1]/").unwrap();
    assert_eq!(
        mapped.host(),
        Some(Host::Ipv6("::ffff:7f00:1".parse::<Ipv6Addr>().unwrap()))
    );
    assert!(!is_public("::ffff:7f00:1".parse().unwrap()));
}

#[tokio::test]
async fn address_literals_are_refused_without_resolving_or_dialing() {
    let harness = Harness::new(
        NetPolicy {
            allow_plain_http: true,
            ..NetPolicy::default()
        },
        &[],
    );
    let hosts = [
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "017700000001",
        "127.0.0.1.",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "169.254.169.254",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "[fd00::1]",
        "[fe80::1]",
        "[fec0::1]",
        "100.64.0.1",
        "0.0.0.0",
        "0",
        "[::]",
        "224.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "198.18.0.1",
        "240.0.0.1",
        "[::127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[64:ff9b::a9fe:a9fe]",
        "[2002:a9fe:a9fe::1]",
        "[::ffff:169.254.169.254]",
    ];
    for host in hosts {
        for scheme in ["https", "http"] {
            let url = format!("{scheme}://{host}:8080/latest/meta-data/");
            refused(harness.get(&url).await, &url);
        }
    }
    assert!(harness.asked().is_empty(), "literals are never resolved");
    assert!(harness.dialed().is_empty());
}

#[tokio::test]
async fn loopback_and_metadata_names_are_refused_without_resolving() {
    let names: Vec<(&str, &[&str])> = vec![
        ("localhost", &[PUBLIC_V4]),
        ("api.localhost", &[PUBLIC_V4]),
        ("metadata.google.internal", &[PUBLIC_V4]),
    ];
    let harness = Harness::new(NetPolicy::default(), &names);
    for host in [
        "localhost",
        "localhost.",
        "LOCALHOST",
        "api.localhost",
        "metadata.google.internal",
        "metadata.google.internal.",
        "Metadata.Google.Internal",
        "metadata.goog",
    ] {
        let url = format!("https://{host}/computeMetadata/v1/");
        refused(harness.get(&url).await, &url);
    }
    assert!(harness.asked().is_empty());
    assert!(harness.dialed().is_empty());
}

// ---- resolved names ----

#[tokio::test]
async fn names_with_any_non_public_address_are_refused() {
    let names: Vec<(&str, &[&str])> = vec![
        ("private.test", &["10.0.0.7"]),
        ("mixed.test", &[PUBLIC_V4, "10.0.0.7"]),
        ("mixed6.test", &[PUBLIC_V6, "fd00::1"]),
        ("loopback.test", &["127.0.0.1"]),
        ("mapped.test", &["::ffff:169.254.169.254"]),
        ("cgnat.test", &["100.64.0.1"]),
    ];
    let harness = Harness::new(NetPolicy::default(), &names);
    for (name, _) in &names {
        let reason = refused(harness.get(&format!("https://{name}/")).await, name);
        assert!(reason.contains(name), "{reason}");
    }
    let asked: Vec<String> = names.iter().map(|(name, _)| name.to_string()).collect();
    assert_eq!(harness.asked(), asked);
    assert!(
        harness.dialed().is_empty(),
        "nothing is dialed for a refused name"
    );
}

#[tokio::test]
async fn public_destinations_pass_the_guard_and_reach_the_dialer() {
    let names: Vec<(&str, &[&str])> = vec![("public.test", &[PUBLIC_V4]), ("public6.test", &[PUBLIC_V6])];
    let harness = Harness::new(NetPolicy::default(), &names);

    let err = harness.get("https://public.test/data.json").await.unwrap_err();
    assert!(matches!(err, NetError::Connect(_)), "{err:?}");
    assert!(!err.maybe_sent());
    assert_eq!(harness.take_foreign(), vec![sock("93.184.216.34:443")]);

    let err = harness.get("https://public6.test:8443/").await.unwrap_err();
    assert!(matches!(err, NetError::Connect(_)), "{err:?}");
    assert_eq!(
        harness.take_foreign(),
        vec![SocketAddr::new(PUBLIC_V6.parse().unwrap(), 8443)]
    );

    // Literals go straight to the dialer; a mapped literal is dialed as its IPv4 address.
    harness.get("https://93.184.216.34:8443/").await.unwrap_err();
    assert_eq!(harness.take_foreign(), vec![sock("93.184.216.34:8443")]);
    harness.get("https://[::ffff:93.184.216.34]/").await.unwrap_err();
    assert_eq!(harness.take_foreign(), vec![sock("93.184.216.34:443")]);

    assert_eq!(
        harness.asked(),
        vec!["public.test".to_string(), "public6.test".to_string()]
    );
}

#[tokio::test]
async fn plain_http_needs_an_allow_rule_or_the_policy() {
    let names: Vec<(&str, &[&str])> = vec![("public.test", &[PUBLIC_V4])];
    let strict = Harness::new(NetPolicy::default(), &names);
    for url in ["http://public.test/", "http://93.184.216.34/"] {
        let reason = refused(strict.get(url).await, url);
        assert!(reason.contains("plain http"), "{reason}");
    }
    assert!(strict.dialed().is_empty());

    let open = Harness::new(
        NetPolicy {
            allow_plain_http: true,
            ..NetPolicy::default()
        },
        &names,
    );
    assert!(matches!(
        open.get("http://public.test/").await,
        Err(NetError::Connect(_))
    ));
    assert_eq!(open.take_foreign(), vec![sock("93.184.216.34:80")]);
    refused(
        open.get("http://10.0.0.1/").await,
        "plain http does not open private addresses",
    );
}

#[tokio::test]
async fn unknown_names_fail_to_resolve() {
    let harness = Harness::new(NetPolicy::default(), &[]);
    let err = harness.get("https://nowhere.test/").await.unwrap_err();
    assert!(matches!(err, NetError::Resolve(_)), "{err:?}");
    assert!(!err.maybe_sent());
    assert!(harness.dialed().is_empty());
}

#[tokio::test]
async fn only_http_urls_without_credentials_are_valid() {
    let harness = Harness::new(NetPolicy::default(), &[("public.test", &[PUBLIC_V4])]);
    for url in [
        "ftp://public.test/file",
        "file:///etc/passwd",
        "gopher://public.test/",
        "data:text/plain,hi",
        "https://user:pass@public.test/",
    ] {
        let result = harness.get(url).await;
        assert!(
            matches!(result, Err(NetError::InvalidRequest(_))),
            "{url}: {result:?}"
        );
    }
    let connect = OutboundRequest::new(Method::CONNECT, Url::parse("https://public.test/").unwrap());
    assert!(matches!(
        harness.client.send(connect).await,
        Err(NetError::InvalidRequest(_))
    ));
    assert!(harness.asked().is_empty());
    assert!(harness.dialed().is_empty());
}

// ---- allowed loopback: the positive path ----

#[tokio::test]
async fn an_allowed_loopback_server_answers_get_and_post() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);

    let response = harness.get(&format!("http://{server}/hello")).await.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body, "hello");
    assert_eq!(response.final_url.as_str(), format!("http://{server}/hello"));

    let url = Url::parse(&format!("http://{server}/echo")).unwrap();
    let response = harness
        .client
        .send(OutboundRequest::post(url, r#"{"order":42}"#))
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body, r#"{"order":42}"#);

    assert!(harness.dialed().iter().all(|addr| *addr == server));
    assert!(harness.asked().is_empty());
}

#[tokio::test]
async fn an_allowed_ipv6_loopback_server_answers() {
    let Ok(listener) = TcpListener::bind("[::1]:0").await else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app(None)).await.unwrap() });
    let harness = Harness::allowing(&["::1"]);
    let response = harness.get(&format!("http://{server}/hello")).await.unwrap();
    assert_eq!(response.body, "hello");
    assert_eq!(harness.dialed(), vec![server]);
}

#[tokio::test]
async fn allowed_names_and_blocks_reach_their_addresses_with_the_original_host() {
    let server = serve(app(None)).await;
    let port = server.port();
    let names: Vec<(&str, &[&str])> = vec![
        ("orders.internal", &["127.0.0.1"]),
        ("metadata.google.internal", &["127.0.0.1"]),
        ("localhost", &["127.0.0.1"]),
    ];
    let by_name = Harness::new(
        policy(&["Orders.Internal", "metadata.google.internal", "localhost"]),
        &names,
    );
    let mut request =
        OutboundRequest::get(Url::parse(&format!("http://orders.internal:{port}/headers")).unwrap());
    request
        .headers
        .insert(HOST, HeaderValue::from_static("evil.example"));
    let response = by_name.client.send(request).await.unwrap();
    assert_eq!(response.body, format!("host=orders.internal:{port};auth=false"));
    for host in ["metadata.google.internal", "localhost"] {
        let response = by_name.get(&format!("http://{host}:{port}/hello")).await.unwrap();
        assert_eq!(response.body, "hello", "{host}");
    }
    assert_eq!(
        by_name.asked(),
        vec!["orders.internal", "metadata.google.internal", "localhost"]
    );

    let by_block = Harness::new(policy(&["127.0.0.0/8"]), &[("svc.internal", &["127.0.0.1"])]);
    let response = by_block
        .get(&format!("http://svc.internal:{port}/hello"))
        .await
        .unwrap();
    assert_eq!(response.body, "hello");
    assert_eq!(by_block.dialed(), vec![server]);
    // The block does not open other private addresses.
    refused(
        by_block.get("https://10.0.0.1/").await,
        "outside the allowed block",
    );
}

#[tokio::test]
async fn every_vetted_address_is_tried_in_order() {
    let server = serve(app(None)).await;
    let names: Vec<(&str, &[&str])> = vec![("multi.internal", &["127.0.0.2", "127.0.0.1"])];
    let harness = Harness::new(policy(&["127.0.0.0/8"]), &names);
    let response = harness
        .get(&format!("http://multi.internal:{}/hello", server.port()))
        .await
        .unwrap();
    assert_eq!(response.body, "hello");
    let expected = vec![
        SocketAddr::new("127.0.0.2".parse().unwrap(), server.port()),
        server,
    ];
    assert_eq!(harness.dialed(), expected);
}

#[tokio::test]
async fn connections_are_pooled() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    for _ in 0..3 {
        let response = harness.get(&format!("http://{server}/hello")).await.unwrap();
        assert_eq!(response.body, "hello");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(harness.dialed(), vec![server], "one connection, reused");
}

// ---- redirects ----

#[tokio::test]
async fn a_redirect_from_an_allowed_host_to_a_private_address_is_refused() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    for path in ["/to-private", "/to-metadata", "/to-loopback-literal"] {
        let result = harness
            .follow(Method::GET, &format!("http://{server}{path}"), "")
            .await;
        refused(result, path);
    }
    assert!(harness.dialed().iter().all(|addr| *addr == server));
}

#[tokio::test]
async fn a_redirect_to_a_name_resolving_private_is_refused() {
    let server = serve(app(None)).await;
    let harness = Harness::new(policy(&["127.0.0.1"]), &[("private.test", &["10.0.0.7"])]);
    let reason = refused(
        harness
            .follow(Method::GET, &format!("http://{server}/to-name"), "")
            .await,
        "to-name",
    );
    assert!(reason.contains("10.0.0.7"), "{reason}");
    assert_eq!(harness.asked(), vec!["private.test"]);
    assert_eq!(harness.dialed(), vec![server]);
}

#[tokio::test]
async fn a_redirect_to_a_public_name_is_vetted_then_dialed() {
    let server = serve(app(None)).await;
    let harness = Harness::new(policy(&["127.0.0.1"]), &[("public.test", &[PUBLIC_V4])]);
    let err = harness
        .follow(Method::GET, &format!("http://{server}/to-public"), "")
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::Connect(_)), "{err:?}");
    assert_eq!(harness.take_foreign(), vec![sock("93.184.216.34:443")]);
}

#[tokio::test]
async fn redirects_are_returned_unless_followed() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let response = harness.get(&format!("http://{server}/to-private")).await.unwrap();
    assert_eq!(response.status, StatusCode::FOUND);
    assert_eq!(response.headers.get(LOCATION).unwrap(), "http://10.0.0.1/");
    let response = harness
        .get(&format!("http://{server}/no-location"))
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::FOUND);
    let body = harness
        .follow(Method::GET, &format!("http://{server}/no-location"), "")
        .await
        .unwrap();
    assert_eq!(body, "");
}

#[tokio::test]
async fn redirects_change_the_method_as_rfc_9110_says() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let cases = [
        (Method::POST, "/see-other", "GET 0"),
        (Method::PUT, "/see-other", "GET 0"),
        (Method::POST, "/found", "GET 0"),
        (Method::PUT, "/found", "PUT 5"),
        (Method::POST, "/temporary", "POST 5"),
        (Method::POST, "/permanent", "POST 5"),
        (Method::GET, "/to-hello", "hello"),
    ];
    for (method, path, expected) in cases {
        let body = harness
            .follow(method.clone(), &format!("http://{server}{path}"), "hello")
            .await
            .unwrap();
        assert_eq!(body, expected, "{method} {path}");
    }
    let mut request = OutboundRequest::get(Url::parse(&format!("http://{server}/to-hello")).unwrap());
    request.follow_redirects = true;
    let response = harness.client.send(request).await.unwrap();
    assert_eq!(response.final_url.as_str(), format!("http://{server}/hello"));
}

#[tokio::test]
async fn redirects_are_capped() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let result = harness
        .follow(Method::GET, &format!("http://{server}/loop"), "")
        .await;
    assert_eq!(result, Err(NetError::TooManyRedirects));
    let none = Harness::new(
        NetPolicy {
            max_redirects: 0,
            ..policy(&["127.0.0.1"])
        },
        &[],
    );
    let result = none
        .follow(Method::GET, &format!("http://{server}/to-hello"), "")
        .await;
    assert_eq!(result, Err(NetError::TooManyRedirects));
}

#[tokio::test]
async fn credentials_do_not_follow_a_redirect_to_another_origin() {
    let other = serve(app(None)).await;
    let server = serve(app(Some(other))).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    for (path, host, auth) in [("/same", server, true), ("/cross", other, false)] {
        let mut request = OutboundRequest::get(Url::parse(&format!("http://{server}{path}")).unwrap());
        request
            .headers
            .insert(AUTHORIZATION, HeaderValue::from_static("Bearer secret"));
        request.follow_redirects = true;
        let response = harness.client.send(request).await.unwrap();
        assert_eq!(response.body, format!("host={host};auth={auth}"), "{path}");
    }
}

// ---- limits and failures ----

#[tokio::test]
async fn the_response_body_is_capped() {
    let server = serve(app(None)).await;
    let endless = serve_endless_body().await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    assert_eq!(
        harness.get(&format!("http://{server}/big")).await.unwrap_err(),
        NetError::TooLarge
    );
    assert_eq!(
        harness.get(&format!("http://{endless}/")).await.unwrap_err(),
        NetError::TooLarge
    );
    // A HEAD answer declares the length of a body it does not carry.
    let head = OutboundRequest::new(Method::HEAD, Url::parse(&format!("http://{server}/big")).unwrap());
    let response = harness.client.send(head).await.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert!(response.body.is_empty());

    let exact = Harness::new(
        NetPolicy {
            max_response_bytes: 1024,
            ..policy(&["127.0.0.1"])
        },
        &[],
    );
    assert_eq!(
        exact
            .get(&format!("http://{server}/kib"))
            .await
            .unwrap()
            .body
            .len(),
        1024
    );
    let under = Harness::new(
        NetPolicy {
            max_response_bytes: 1023,
            ..policy(&["127.0.0.1"])
        },
        &[],
    );
    assert_eq!(
        under.get(&format!("http://{server}/kib")).await.unwrap_err(),
        NetError::TooLarge
    );
}

#[tokio::test]
async fn a_slow_answer_times_out_and_may_have_been_sent() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let mut request = OutboundRequest::get(Url::parse(&format!("http://{server}/slow")).unwrap());
    request.timeout = Some(Duration::from_millis(200));
    let err = harness.client.send(request).await.unwrap_err();
    assert_eq!(err, NetError::Timeout);
    assert!(err.maybe_sent());

    // A request's timeout never extends the policy's.
    let short = Harness::new(
        NetPolicy {
            timeout: Duration::from_millis(200),
            ..policy(&["127.0.0.1"])
        },
        &[],
    );
    let mut request = OutboundRequest::get(Url::parse(&format!("http://{server}/slow")).unwrap());
    request.timeout = Some(Duration::from_secs(60));
    let started = Instant::now();
    assert_eq!(short.client.send(request).await.unwrap_err(), NetError::Timeout);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_refused_connection_was_not_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let harness = Harness::allowing(&["127.0.0.1"]);
    let err = harness.get(&format!("http://{closed}/")).await.unwrap_err();
    assert!(matches!(err, NetError::Connect(_)), "{err:?}");
    assert!(!err.maybe_sent());
}

#[tokio::test]
async fn a_dial_that_never_completes_hits_the_connect_timeout() {
    let policy = NetPolicy {
        connect_timeout: Duration::from_millis(100),
        ..policy(&["127.0.0.0/8"])
    };
    let harness = Harness::with_hang(policy, &[], &["127.0.0.2"]);
    let err = harness.get("http://127.0.0.2:9/").await.unwrap_err();
    match &err {
        NetError::Connect(reason) => assert!(reason.contains("timeout"), "{reason}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
    assert!(!err.maybe_sent());
}

#[tokio::test]
async fn a_connection_closed_before_the_answer_is_lost_and_may_have_been_sent() {
    let server = serve_then_hang_up().await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let url = Url::parse(&format!("http://{server}/orders")).unwrap();
    let err = harness
        .client
        .send(OutboundRequest::post(url, "{}"))
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::Lost(_)), "{err:?}");
    assert!(err.maybe_sent());
}

/// Answers one request per connection (keep-alive, as far as the client can tell), then
/// closes it a moment later; counts the requests it read.
async fn serve_once_per_connection(requests: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let requests = Arc::clone(&requests);
            tokio::spawn(async move {
                read_head(&mut stream).await;
                requests.fetch_add(1, Ordering::SeqCst);
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(stream);
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_kept_connection_the_upstream_closed_is_not_used_and_nothing_is_sent_twice() {
    let requests = Arc::new(AtomicUsize::new(0));
    let server = serve_once_per_connection(Arc::clone(&requests)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let url = Url::parse(&format!("http://{server}/credits")).unwrap();
    for _ in 0..3 {
        let response = harness
            .client
            .send(OutboundRequest::post(url.clone(), "{}"))
            .await
            .unwrap();
        assert_eq!(response.body, "hello");
        // The upstream closes the kept connection meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "each request reached the upstream once"
    );
    assert_eq!(harness.dialed(), vec![server; 3], "a new connection for each");
}

#[tokio::test]
async fn a_failed_handshake_is_a_tls_error() {
    let server = serve(app(None)).await;
    let harness = Harness::allowing(&["127.0.0.1"]);
    let err = harness.get(&format!("https://{server}/hello")).await.unwrap_err();
    assert!(matches!(err, NetError::Tls(_)), "{err:?}");
    assert!(!err.maybe_sent());
}
