//! The gateway under load, as a client sees it, in one run (PRODUCT §12, issue 6):
//!
//! 1. a loopback upstream (axum on `127.0.0.1:0`, its own runtime) answers a fixed valid result
//!    for the read tool `lookup_order`;
//! 2. the real `warrant serve` runs as a separate process (the release binary, built first by
//!    this bench) on a fresh SQLite data directory (`synchronous=FULL`), with the example
//!    contract `lookup_order` bound to the upstream (its daily call budget raised so it cannot
//!    run out) and the example policy `orders.cedar`; the demo agent key is read from its banner;
//! 3. the server's resident memory (`VmRSS`, split into anonymous and file-backed pages) is read
//!    at start, when idle after a warm-up, and when idle again after the runs;
//! 4. `POST /v1/proposals` of the read (no idempotency key) is driven by N keep-alive HTTP/1.1
//!    connections (hyper's connection-level client, one request in flight per connection) for a
//!    fixed time: calls/s, latency p50 / p99 / max, errors (anything but `200` with
//!    `"outcome":"committed"`), the server's CPU time per call and its peak RSS during the run;
//! 5. the upstream is driven directly by the same client at the same concurrency, and the table
//!    gives the ratio.
//!
//! Everything shares the machine: the client and the upstream run in this process, the server
//! in its own, so on a small machine the client's and the upstream's work is part of what is
//! measured — for the upstream baseline too.
//!
//! Run: `cargo bench -p warrant-server --bench load`. Environment: `WARRANT_LOAD_SECS` (seconds
//! per measured run, default 10), `WARRANT_LOAD_CONNECTIONS` (comma-separated, default `16,64`),
//! `WARRANT_BIN` (a `warrant` binary to use instead of building `target/release/warrant`),
//! `WARRANT_LOAD_PAUSE` (seconds to wait after each idle reading, to inspect the server's
//! `/proc/<pid>/smaps` from another shell).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "benchmark"
)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

const LOOKUP: &str = include_str!("../../../examples/contracts/lookup_order.v1.yaml");
const ORDERS: &str = include_str!("../../../examples/policies/orders.cedar");
const PROPOSAL: &str = r#"{"tool":"lookup_order","version":1,"arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}"#;
/// What the `http` adapter posts: the canonical arguments.
const ARGUMENTS: &str = r#"{"order_id":"ord_7Hq2Lm9Xv3"}"#;
const ORDER_RESULT: &str =
    r#"{"order_id":"ord_7Hq2Lm9Xv3","status":"paid","total_cents":1200,"currency":"EUR"}"#;
const TOKEN: &str = "tok-orders-load-secret";
/// Per-request cap, so a stuck server shows as errors rather than a hung bench.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the upstream on its own runtime (as another process would be), on 127.0.0.1:0.
fn start_upstream() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new().route(
                "/orders",
                post(|| async { ([(CONTENT_TYPE, "application/json")], ORDER_RESULT) }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// The release `warrant` binary: `WARRANT_BIN`, else `target/release/warrant`, (re)built first
/// (cargo does nothing when it is fresh). A failed build falls back to an existing binary.
fn warrant_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("WARRANT_BIN") {
        return PathBuf::from(bin);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let bin = root.join(target).join("release").join("warrant");
    eprintln!("building the release `warrant` binary …");
    let built = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--release", "--bin", "warrant"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !built {
        assert!(
            bin.is_file(),
            "`cargo build --release --bin warrant` failed and {} does not exist",
            bin.display()
        );
        eprintln!("warning: the build failed; using the existing {}", bin.display());
    }
    bin
}

/// `warrant serve` as a child process; stopped with SIGTERM when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    agent_key: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start(bin: &Path, upstream: SocketAddr) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let contracts = dir.path().join("contracts");
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&contracts).unwrap();
        std::fs::create_dir_all(&policies).unwrap();
        let lookup = LOOKUP
            .replace("calls_per_day: 5000", "calls_per_day: 1000000000000")
            .replace(
                "https://orders.internal.example/lookup",
                &format!("http://{upstream}/orders"),
            );
        assert!(lookup.contains("127.0.0.1") && lookup.contains("1000000000000"));
        std::fs::write(contracts.join("lookup_order.v1.yaml"), lookup).unwrap();
        std::fs::write(policies.join("orders.cedar"), ORDERS).unwrap();
        // The binding's credential, granted to the tool and pinned to the upstream's origin
        // (credentials come only from this map).
        std::fs::write(
            dir.path().join("warrant.toml"),
            format!(
                "[credentials.ORDERS_API_TOKEN]\nenv = \"ORDERS_API_TOKEN\"\ntools = [\"lookup_order\"]\n\
                 origins = [\"http://{upstream}\"]\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.path().join("server.log");
        let mut child = Command::new(bin)
            .current_dir(dir.path())
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--contracts")
            .arg(&contracts)
            .arg("--policy")
            .arg(&policies)
            .env_remove("WARRANT_CONFIG")
            .env_remove("WARRANT_DATABASE")
            .env("WARRANT_ALLOW_HOSTS", "127.0.0.1")
            .env("ORDERS_API_TOKEN", TOKEN)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut url = None;
        let mut agent_key = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(u) = line.strip_prefix("warrant is listening on ") {
                url = Some(u.trim().to_owned());
            }
            // `  agent      wrn_…`, the last key of the banner.
            if let ["agent", key] = line.split_whitespace().collect::<Vec<_>>().as_slice()
                && key.starts_with("wrn_")
            {
                agent_key = Some((*key).to_owned());
                break;
            }
        }
        let (Some(url), Some(agent_key)) = (url, agent_key) else {
            let _ = child.kill();
            panic!(
                "the server did not print its banner; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        // Keep draining its standard output.
        std::thread::spawn(move || for _ in lines {});
        let addr = url.trim_start_matches("http://").parse().unwrap();
        Server {
            child,
            addr,
            agent_key,
            dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`).
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The process's user + system CPU time so far.
fn cpu_time(pid: u32, ticks_per_sec: u64) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &text[text.rfind(')').unwrap() + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_micros(ticks * 1_000_000 / ticks_per_sec)
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// `VmRSS`, `RssAnon` and `RssFile` now.
fn rss(pid: u32) -> [u64; 3] {
    ["VmRSS", "RssAnon", "RssFile"].map(|f| status_kb(pid, f))
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

/// Samples a process's `VmRSS` every 10 ms until stopped; answers the highest value.
struct RssSampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(status_kb(pid, "VmRSS"));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak.max(status_kb(pid, "VmRSS"))
        });
        RssSampler { stop, handle }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// What one load run posts, and to where.
struct Target {
    addr: SocketAddr,
    path: &'static str,
    authorization: String,
    body: Bytes,
    /// A fragment a successful answer contains.
    expect: Option<&'static str>,
}

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn call(sender: &mut Sender, target: &Target) -> Result<(), String> {
    let request = Request::post(target.path)
        .header(HOST, "127.0.0.1")
        .header(CONTENT_TYPE, "application/json")
        .header(AUTHORIZATION, &target.authorization)
        .body(Full::new(target.body.clone()))
        .map_err(|e| e.to_string())?;
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let matches = target
        .expect
        .is_none_or(|needle| body.windows(needle.len()).any(|w| w == needle.as_bytes()));
    if status == StatusCode::OK && matches {
        Ok(())
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
    }
}

/// One measured run.
struct Run {
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
    /// Latencies of the successful calls, µs, sorted.
    latencies: Vec<u32>,
}

impl Run {
    fn per_sec(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// Nearest-rank percentile, in ms.
    fn percentile_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        f64::from(self.latencies[rank - 1]) / 1000.0
    }
}

/// `connections` keep-alive connections, each sending the next call when the last answered,
/// for `duration` (calls in flight at the deadline finish and count).
async fn drive(target: Arc<Target>, connections: usize, duration: Duration) -> Run {
    let mut senders = Vec::with_capacity(connections);
    for _ in 0..connections {
        senders.push(connect(target.addr).await.unwrap());
    }
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let target = target.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(65_536);
                let mut errors = 0u64;
                let mut first_error = None;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let result = match tokio::time::timeout(REQUEST_TIMEOUT, call(&mut sender, &target)).await
                    {
                        Ok(r) => r,
                        Err(_) => Err("timed out".to_owned()),
                    };
                    match result {
                        Ok(()) => latencies.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX)),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                            if sender.is_closed() || sender.ready().await.is_err() {
                                match connect(target.addr).await {
                                    Ok(s) => sender = s,
                                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                                }
                            }
                        }
                    }
                }
                (latencies, errors, first_error)
            })
        })
        .collect();
    let mut run = Run {
        ok: 0,
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for task in tasks {
        let (latencies, errors, first_error) = task.await.unwrap();
        run.latencies.extend(latencies);
        run.errors += errors;
        if run.first_error.is_none() {
            run.first_error = first_error;
        }
    }
    run.elapsed = start.elapsed();
    run.ok = run.latencies.len() as u64;
    run.latencies.sort_unstable();
    run
}

/// Adds `rows` ledger rows (spread over the last 30 days, with arguments like the bench's) to
/// the running server's SQLite database, through a connection of its own, in one transaction.
fn preload_ledger(server: &Server, rows: u64) {
    let conn = rusqlite::Connection::open(server.dir.path().join("data").join("warrant.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Spread over the last 30 days, whatever the number of rows.
    let step = (30 * 86_400_000 / rows.max(1)).max(1);
    let sql = format!(
        "INSERT INTO ledger (id, tenant, principal, trace_id, tool, contract_id, payload_digest, decision, \
         attempts, outcome, created_at, updated_at, latency_ms, cost, arguments) \
         WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {rows}) \
         SELECT printf('led_pre_%012d', n), 'demo', 'demo-agent', printf('%032x', n), 'lookup_order', \
         'lookup_order@sha256:pre', 'sha256:pre', 'allow', 1, 'committed', {now} - n * {step}, {now} - n * {step}, \
         3, 0, '{{\"order_id\":\"ord_' || n || '\"}}' FROM s"
    );
    conn.execute_batch(&format!("BEGIN; {sql}; COMMIT;")).unwrap();
}

/// Waits `WARRANT_LOAD_PAUSE` seconds, if set, so the server can be inspected.
fn pause_if_asked(when: &str, pid: u32) {
    let pause: u64 = env_or("WARRANT_LOAD_PAUSE", 0);
    if pause > 0 {
        eprintln!("{when}; pausing {pause} s (server pid {pid})");
        std::thread::sleep(Duration::from_secs(pause));
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter or `--list` from a workspace-wide run is ignored.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let secs: u64 = env_or("WARRANT_LOAD_SECS", 10);
    let duration = Duration::from_secs(secs.max(1));
    let levels: Vec<usize> = std::env::var("WARRANT_LOAD_CONNECTIONS")
        .unwrap_or_else(|_| "16,64".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect();
    let ticks = clock_ticks();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let upstream = start_upstream();
    let bin = warrant_binary();
    let server = Server::start(&bin, upstream);
    let pid = server.pid();
    eprintln!("server pid {pid} on {} ({})", server.addr, bin.display());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let gateway = Arc::new(Target {
        addr: server.addr,
        path: "/v1/proposals",
        authorization: format!("Bearer {}", server.agent_key),
        body: Bytes::from_static(PROPOSAL.as_bytes()),
        expect: Some(r#""outcome":"committed""#),
    });
    let direct = Arc::new(Target {
        addr: upstream,
        path: "/orders",
        authorization: format!("Bearer {TOKEN}"),
        body: Bytes::from_static(ARGUMENTS.as_bytes()),
        expect: Some(r#""status":"paid""#),
    });

    std::thread::sleep(Duration::from_millis(500));
    let rss_start = rss(pid);
    // Warm-up: both paths, then let the server settle.
    let warm = rt.block_on(drive(gateway.clone(), 16, Duration::from_secs(2)));
    assert!(
        warm.ok > 0,
        "no call succeeded during warm-up: {:?}",
        warm.first_error
    );
    rt.block_on(drive(direct.clone(), 16, Duration::from_secs(1)));
    std::thread::sleep(Duration::from_secs(2));
    let rss_idle = rss(pid);
    pause_if_asked("idle after warm-up", pid);

    struct Row {
        connections: usize,
        direct: Run,
        gateway: Run,
        cpu_per_call: Duration,
        peak_rss: u64,
    }
    let mut rows = Vec::new();
    for &connections in &levels {
        eprintln!("{connections} connections: upstream directly, {secs} s …");
        let d = rt.block_on(drive(direct.clone(), connections, duration));
        eprintln!("{connections} connections: through the gateway, {secs} s …");
        let sampler = RssSampler::start(pid);
        let cpu0 = cpu_time(pid, ticks);
        let g = rt.block_on(drive(gateway.clone(), connections, duration));
        let cpu = cpu_time(pid, ticks).saturating_sub(cpu0);
        let peak_rss = sampler.finish();
        let cpu_per_call = cpu / u32::try_from(g.ok.max(1)).unwrap_or(u32::MAX);
        rows.push(Row {
            connections,
            direct: d,
            gateway: g,
            cpu_per_call,
            peak_rss,
        });
    }
    // Cost per call against the ledger's size (PRODUCT §12: flat from 1k to 1M rows): the
    // first level again, after adding `WARRANT_LOAD_LEDGER_ROWS` rows.
    let ledger_rows: u64 = env_or("WARRANT_LOAD_LEDGER_ROWS", 1_000_000);
    let scale = match levels.first() {
        Some(&connections) if ledger_rows > 0 => {
            // Rows the server wrote before the preload: the warm-up's and every gateway run's.
            let written = warm.ok + rows.iter().map(|r| r.gateway.ok).sum::<u64>();
            eprintln!("adding {ledger_rows} ledger rows …");
            let started = Instant::now();
            preload_ledger(&server, ledger_rows);
            eprintln!("… in {:.1} s", started.elapsed().as_secs_f64());
            std::thread::sleep(Duration::from_secs(2));
            eprintln!("{connections} connections: through the gateway with the larger ledger, {secs} s …");
            let cpu0 = cpu_time(pid, ticks);
            let g = rt.block_on(drive(gateway.clone(), connections, duration));
            let cpu = cpu_time(pid, ticks).saturating_sub(cpu0);
            let cpu_per_call = cpu / u32::try_from(g.ok.max(1)).unwrap_or(u32::MAX);
            Some((connections, written, g, cpu_per_call))
        }
        _ => None,
    };
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = rss(pid);
    pause_if_asked("idle after the runs", pid);
    let hwm = status_kb(pid, "VmHWM");
    drop(server);

    println!();
    println!(
        "`POST /v1/proposals` (read `lookup_order`, SQLite `synchronous=FULL`), {secs} s per run, \
         load average at start: {}",
        loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!();
    println!(
        "| connections | path | calls/s | p50 | p99 | max | errors | server CPU/call | server peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        for (name, run, cpu, rss) in [
            ("upstream directly", &r.direct, None, None),
            ("gateway", &r.gateway, Some(r.cpu_per_call), Some(r.peak_rss)),
        ] {
            println!(
                "| {} | {name} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {} | {} | {} |",
                r.connections,
                run.per_sec(),
                run.percentile_ms(0.50),
                run.percentile_ms(0.99),
                run.percentile_ms(1.0),
                run.errors,
                cpu.map_or("—".to_owned(), |c| format!("{} µs", c.as_micros())),
                rss.map_or("—".to_owned(), mib),
            );
        }
        println!(
            "| {} | gateway vs upstream | {:.1}× fewer | {:.1}× | {:.1}× | | | | |",
            r.connections,
            r.direct.per_sec() / r.gateway.per_sec(),
            r.gateway.percentile_ms(0.5) / r.direct.percentile_ms(0.5),
            r.gateway.percentile_ms(0.99) / r.direct.percentile_ms(0.99),
        );
    }
    println!();
    println!("| server RSS | `VmRSS` | anonymous | file-backed |");
    println!("|---|---|---|---|");
    for (name, [total, anon, file]) in [
        ("at start", rss_start),
        ("idle after warm-up", rss_idle),
        ("idle after the runs", rss_after),
    ] {
        println!("| {name} | {} | {} | {} |", mib(total), mib(anon), mib(file));
    }
    println!("| high-water mark (`VmHWM`) | {} | | |", mib(hwm));
    println!();
    if let (Some((connections, calls_before, after, cpu_after)), Some(first)) = (&scale, rows.first()) {
        let before = &first.gateway;
        println!("Ledger size ({connections} connections, gateway):");
        println!();
        println!("| ledger rows | calls/s | p50 | p99 | server CPU/call |");
        println!("|---|---|---|---|---|");
        println!(
            "| {} (the runs above) | {:.0} | {:.2} ms | {:.2} ms | {} µs |",
            calls_before,
            before.per_sec(),
            before.percentile_ms(0.5),
            before.percentile_ms(0.99),
            first.cpu_per_call.as_micros()
        );
        println!(
            "| + {ledger_rows} | {:.0} | {:.2} ms | {:.2} ms | {} µs |",
            after.per_sec(),
            after.percentile_ms(0.5),
            after.percentile_ms(0.99),
            cpu_after.as_micros()
        );
        println!(
            "| ratio (larger / smaller) | {:.2}× | {:.2}× | {:.2}× | {:.2}× |",
            after.per_sec() / before.per_sec(),
            after.percentile_ms(0.5) / before.percentile_ms(0.5),
            after.percentile_ms(0.99) / before.percentile_ms(0.99),
            cpu_after.as_secs_f64() / first.cpu_per_call.as_secs_f64().max(1e-9)
        );
        println!();
    }
    let best = rows.iter().map(|r| r.gateway.per_sec()).fold(0.0, f64::max);
    let best_p99 = rows
        .iter()
        .map(|r| r.gateway.percentile_ms(0.99))
        .fold(f64::INFINITY, f64::min);
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!("Targets (PRODUCT §12):");
    println!(
        "- ≥ 3,000 calls/s: {} (best {best:.0}/s)",
        verdict(best >= 3000.0)
    );
    println!(
        "- p99 ≤ 10 ms: {} (best {best_p99:.2} ms)",
        verdict(best_p99 <= 10.0)
    );
    println!(
        "- idle RSS ≤ 30 MB: {} ({})",
        verdict(rss_idle[0] * 1024 <= 30_000_000),
        mib(rss_idle[0])
    );
    for r in &rows {
        for (name, run) in [("upstream", &r.direct), ("gateway", &r.gateway)] {
            if let Some(e) = &run.first_error {
                println!(
                    "first error ({name}, {} connections): {}",
                    r.connections,
                    e.chars().take(300).collect::<String>()
                );
            }
        }
    }
}
