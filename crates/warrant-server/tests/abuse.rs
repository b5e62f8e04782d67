//! The server under slow and abusive clients: raw loopback sockets that send half a request
//! head, sit idle, trickle a body, hold connections, flood forged keys, against a gateway
//! started by [`warrant_server::serve`] with short limits (so each test takes seconds).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

/// A gateway served on a loopback port until the test ends.
struct Server {
    addr: SocketAddr,
    admin: String,
    db: PathBuf,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

/// A gateway on a fresh SQLite store at `url`, with no contracts or policies.
async fn config(url: &DatabaseUrl, limits: HttpLimits, background: bool) -> GatewayConfig {
    let store: Arc<dyn Store> = Arc::new(SqlStore::open(url, &StoreOptions::default()).await.unwrap());
    GatewayConfig {
        store,
        contracts_dir: None,
        policies: Vec::new(),
        guards: Guards::new(),
        budgets: Default::default(),
        redaction: RedactionKey::new(vec![3; 32]).unwrap(),
        adapters: AdapterConfig {
            client: SafeClient::new(NetPolicy::default()),
            secrets: Secrets::default(),
            smtp: None,
            command_roots: Vec::new(),
            model: None,
        },
        runtime: RuntimeSettings::default(),
        settings: Settings::default(),
        limits,
        public_url: "http://warrant.test".into(),
        first_tenant: "acme".into(),
        background,
        contract_sync_every: Duration::ZERO,
        requests_in_flight: Default::default(),
        review_mail: None,
    }
}

async fn start(limits: HttpLimits) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::data_dir(dir.path());
    let DatabaseUrl::Sqlite(db) = url.clone() else {
        unreachable!()
    };
    let gateway = Gateway::start(config(&url, limits, false).await).await.unwrap();
    let admin = gateway.first_keys.clone().unwrap().admin;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        warrant_server::serve(listener, &gateway, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Server {
        addr,
        admin,
        db,
        _stop: stop,
        _dir: dir,
    }
}

/// Short limits for tests; each test changes what it exercises.
fn limits() -> HttpLimits {
    HttpLimits {
        header_timeout: Duration::from_millis(500),
        body_timeout: Duration::from_millis(500),
        ..HttpLimits::default()
    }
}

/// A connection from `local` (any loopback address: 127.0.0.0/8 is all loopback on Linux).
async fn connect_from(local: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(local), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads until the peer closes (or `within` passes: `None`), returning what arrived.
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| String::from_utf8_lossy(&out).into_owned())
}

/// A whole request on a fresh connection from `local`, `Connection: close`: the status and
/// the raw response (headers and body).
async fn request_from(
    local: Ipv4Addr,
    to: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> (u16, String) {
    let mut stream = connect_from(local, to).await;
    let auth = key
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\n{auth}content-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_to_close(&mut stream, Duration::from_secs(10))
        .await
        .expect("no complete answer within 10 s");
    (status_of(&response), response)
}

async fn request(to: SocketAddr, method: &str, path: &str, key: Option<&str>) -> (u16, String) {
    request_from(Ipv4Addr::LOCALHOST, to, method, path, key).await
}

fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A well-formed key that no store holds.
fn forged(i: usize) -> String {
    format!("wrn_{:016x}_{}", i, "ab".repeat(32))
}

/// Holds SQLite's write lock from another connection: the store still reads (WAL), but every
/// write waits behind the lock, as behind a stuck disk.
fn lock_writes(db: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_head_is_closed_within_the_header_timeout() {
    let server = start(limits()).await;
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-slow: ")
            .await
            .unwrap();
        streams.push(s);
    }
    let started = Instant::now();
    for s in &mut streams {
        let closed = read_to_close(s, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "a half-sent head was still open after 5 s");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // A connection that sends nothing at all is closed the same way.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    assert!(read_to_close(&mut silent, Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = start(limits()).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // Kept alive, then idle: closed within the idle timeout, not held forever.
    let started = Instant::now();
    assert!(
        read_to_close(&mut s, Duration::from_secs(5)).await.is_some(),
        "an idle keep-alive connection was still open after 5 s"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused_at_once_and_health_stays_reachable() {
    let server = start(HttpLimits {
        connections: 8,
        header_timeout: Duration::from_secs(30),
        ..limits()
    })
    .await;
    // Idle connections fill the cap (and they would hold it for the whole header timeout).
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Over the cap, health probes are still answered...
    let started = Instant::now();
    let (status, _) = request(server.addr, "GET", "/healthz", None).await;
    assert_eq!(status, 200);
    let (status, _) = request(server.addr, "GET", "/readyz", None).await;
    assert_eq!(status, 200);
    // ...and anything else is refused at once with 503 and Retry-After, not queued.
    let (status, response) = request(server.addr, "GET", "/v1/ledger", Some(&server.admin)).await;
    assert_eq!(status, 503, "{response}");
    assert!(response.contains("OVERLOADED"), "{response}");
    assert!(header(&response, "retry-after").is_some(), "{response}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Past the cap and its reserve for health probes, a connection is closed at once.
    for _ in 0..64 {
        idle.push(TcpStream::connect(server.addr).await.unwrap());
    }
    let mut late = TcpStream::connect(server.addr).await.unwrap();
    assert!(
        read_to_close(&mut late, Duration::from_secs(2)).await.is_some(),
        "a connection past the cap was held open"
    );
    // Once the idle connections go, the server serves normally again.
    drop(idle);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = request(server.addr, "GET", "/v1/ledger", Some(&server.admin)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_off_by_the_body_deadline() {
    let server = start(limits()).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST /v1/proposals HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n",
        server.admin
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = s.into_split();
    // One byte every 100 ms: the head was fast, the body never finishes.
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if writer.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    trickle.abort();
    assert!(answered.is_ok(), "a trickled body was still being read after 5 s");
    let response = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&response), 408, "{response}");
    assert!(response.contains("BODY_TIMEOUT"), "{response}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_shares_one_in_flight_limit() {
    let server = start(HttpLimits {
        concurrency: 1,
        ..limits()
    })
    .await;
    // A key creation holds the only slot: its write waits behind the lock.
    let lock = lock_writes(&server.db);
    let (addr, admin) = (server.addr, server.admin.clone());
    let held = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let body = r#"{"principal":"p1","roles":["agent"]}"#;
        let head = format!(
            "POST /v1/keys HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {admin}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        read_to_close(&mut s, Duration::from_secs(30)).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another route is refused: the limit is the server's, not the route's.
    let (status, response) = request(server.addr, "GET", "/v1/ledger", Some(&server.admin)).await;
    assert_eq!(status, 503, "{response}");
    assert!(response.contains("OVERLOADED"), "{response}");
    // Health probes are not behind the limit.
    let (status, _) = request(server.addr, "GET", "/healthz", None).await;
    assert_eq!(status, 200);
    lock.execute_batch("ROLLBACK").unwrap();
    let created = held.await.unwrap().unwrap();
    assert_eq!(status_of(&created), 201, "{created}");
    let (status, _) = request(server.addr, "GET", "/v1/ledger", Some(&server.admin)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_when_the_store_cannot_write() {
    let server = start(limits()).await;
    let (status, _) = request(server.addr, "GET", "/readyz", None).await;
    assert_eq!(status, 200);
    let lock = lock_writes(&server.db);
    // The answer above is reused for a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Reads still work (the old check, a ping, passes); writes do not.
    let started = Instant::now();
    let (status, response) = request(server.addr, "GET", "/readyz", None).await;
    assert_eq!(status, 503, "{response}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let (status, _) = request(server.addr, "GET", "/healthz", None).await;
    assert_eq!(status, 200, "liveness does not depend on the store");
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    // Ready again once writes go through (probe results are reused for at most a second).
    let mut ready = false;
    for _ in 0..50 {
        if request(server.addr, "GET", "/readyz", None).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ready, "readyz did not recover after the lock was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_keys_is_limited_for_that_address_only() {
    let server = start(HttpLimits {
        auth_failures_per_minute: 5,
        ..limits()
    })
    .await;
    let attacker = Ipv4Addr::new(127, 0, 0, 1);
    let other = Ipv4Addr::new(127, 0, 0, 2);
    let mut statuses = Vec::new();
    let mut limited = None;
    for i in 0..20 {
        let (status, response) =
            request_from(attacker, server.addr, "GET", "/v1/ledger", Some(&forged(i))).await;
        statuses.push(status);
        if status == 429 {
            limited = Some(response);
        }
    }
    assert_eq!(&statuses[..5], &[401; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    let limited = limited.unwrap();
    assert!(limited.contains("AUTH_RATE_LIMITED"), "{limited}");
    let retry: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // The MCP lane counts the same failures.
    let (status, _) = request_from(attacker, server.addr, "POST", "/mcp", Some(&forged(99))).await;
    assert_eq!(status, 429);
    // Another address is not affected: its valid key works, its one bad key is a plain 401.
    let (status, response) = request_from(other, server.addr, "GET", "/v1/ledger", Some(&server.admin)).await;
    assert_eq!(status, 200, "{response}");
    let (status, _) = request_from(other, server.addr, "GET", "/v1/ledger", Some(&forged(100))).await;
    assert_eq!(status, 401);
}

/// A graceful shutdown stops the workers that start calls on their own (the workflow runner,
/// the inbound worker): they claim nothing more and end once what they hold is done, instead
/// of claiming during the drain and being aborted mid-step when the gateway is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_workers_that_start_calls() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::data_dir(dir.path());
    let gateway = Gateway::start(config(&url, limits(), true).await).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!gateway.callers_stopped(), "the workers run until shutdown");
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), warrant_server::shutdown(&gateway))
        .await
        .unwrap();
    assert!(gateway.callers_stopped());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "idle workers stop at once: {:?}",
        started.elapsed()
    );
}
