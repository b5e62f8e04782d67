//! Chaos: a few thousand writes through the real `warrant serve`, SIGKILLed every 2–5 s and
//! restarted on the same store — an SQLite data directory, then a PostgreSQL schema — against
//! an upstream that drops, delays and answers 500. The two runs take turns. After
//! reconciliation the ledger must agree with the upstream, intent by intent:
//!
//! - **lost**: the client was told `committed` and the ledger does not say so, or the upstream
//!   applied an effect the ledger's final outcome says did not happen (or that no row owns);
//! - **duplicate**: an operation applied more than once by the tool that does not deduplicate;
//! - **unresolved**: rows still `attempting` or `unknown` after reconciliation;
//! - **phantom**: the ledger says committed and the upstream never applied it.
//!
//! It prints the counts with a sample of each and fails on any non-zero count.
//! `WARRANT_CHAOS_SEED` replays a run's faults and schedule (the seed is printed; timing still
//! varies); `WARRANT_CHAOS_REPORT_ONLY=1` prints without failing, to look at today's counts.
//!
//! The upstream (in this process, loopback) serves two write tools: `chaos_credit` honours
//! idempotency (one effect per `Idempotency-Key`, every delivery counted) and `chaos_note` does
//! not (every applying delivery is an effect, so a second one for an operation is a visible
//! duplicate). Each delivery's fault is a function of (seed, operation, delivery number): a
//! normal answer, a connection dropped before or after applying, a delay past the binding's
//! timeout before or after applying, 500 before or after applying, 503 before applying. Its
//! status endpoint answers what reconciliation asks (`unknown` while a delivery may still
//! apply), itself failing now and then.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use warrant_core::records::{self, LedgerEntry};
use warrant_runtime::execute::{operation_id, scope_of};
use warrant_store::{DatabaseUrl, LedgerFilter, SqlStore, Store, StoreOptions};

/// Intents (one idempotency key each) in a run.
const INTENTS: u32 = 2016;
/// Concurrent clients.
const CLIENTS: u32 = 32;
/// The binding's per-attempt timeout (`adapter.timeout`).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a delayed delivery sleeps (past the attempt timeout).
const DELAY: Duration = Duration::from_millis(700);
/// The load stops here at the latest.
const LOAD_LIMIT: Duration = Duration::from_secs(60);
/// One visit of an intent gives up (and parks it for later) after this long.
const VISIT_LIMIT: Duration = Duration::from_secs(2);
/// Visits of one intent before the client gives up on it.
const VISITS: u32 = 3;
/// The environment variable holding the upstream's bearer token (a `[credentials]` entry).
const TOKEN_VAR: &str = "WARRANT_CHAOS_UPSTREAM_TOKEN";
const TOKEN: &str = "chaos-upstream-token-7f3a";

// ----- a seeded generator, so a run replays from its seed -----

/// SplitMix64.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, n)`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// A generator for one (seed, name, number): the same draw whatever the order of arrival.
fn rng_for(seed: u64, name: &str, n: u32) -> Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut r = Rng(seed ^ h ^ (u64::from(n) << 32));
    r.next();
    r
}

// ----- the upstream -----

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Ok,
    DropBefore,
    ApplyDrop,
    DelayApply,
    ApplyDelay,
    E500Before,
    Apply500,
    E503Before,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::Ok,
        Fault::DropBefore,
        Fault::ApplyDrop,
        Fault::DelayApply,
        Fault::ApplyDelay,
        Fault::E500Before,
        Fault::Apply500,
        Fault::E503Before,
    ];

    /// A delivery's fault: about half answer normally.
    fn pick(seed: u64, operation: &str, delivery: u32) -> Fault {
        let roll = rng_for(seed, operation, delivery).below(100);
        match roll {
            0..50 => Fault::Ok,
            50..57 => Fault::DropBefore,
            57..64 => Fault::ApplyDrop,
            64..70 => Fault::DelayApply,
            70..76 => Fault::ApplyDelay,
            76..82 => Fault::E500Before,
            82..88 => Fault::Apply500,
            _ => Fault::E503Before,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    /// Honours idempotency: one effect per key.
    Credit,
    /// Does not: every applying delivery is an effect.
    Note,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Credit => "chaos_credit",
            Tool::Note => "chaos_note",
        }
    }
}

/// What the upstream saw of one operation (one `Idempotency-Key`).
#[derive(Debug, Clone, Default)]
struct Op {
    tool: Option<&'static str>,
    deliveries: u32,
    effects: u32,
    /// Deliveries that may still apply.
    pending: u32,
    result: Option<Value>,
    faults: Vec<Fault>,
    /// The faults of the deliveries that applied an effect.
    applied_by: Vec<Fault>,
}

#[derive(Default)]
struct Upstream {
    seed: u64,
    ops: Mutex<HashMap<String, Op>>,
    status_asks: AtomicU32,
    unauthorized: AtomicU32,
}

/// A body that fails after the head went out: the caller sees the connection die.
struct Broken;

impl http_body::Body for Broken {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::other("dropped on purpose"))))
    }
}

fn dropped() -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::new(Broken))
        .unwrap()
}

enum Reply {
    Ok(Value),
    Drop,
    Status(StatusCode),
}

impl Upstream {
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let ok = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == format!("Bearer {TOKEN}"));
        if !ok {
            self.unauthorized.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Applies the effect (once per key for the honoured tool) and answers its result.
    fn apply(&self, operation: &str, tool: Tool, fault: Fault) -> Value {
        let mut ops = self.ops.lock().unwrap();
        let op = ops.entry(operation.to_owned()).or_default();
        if fault == Fault::DelayApply {
            op.pending -= 1;
        }
        if tool == Tool::Credit
            && let Some(result) = &op.result
        {
            return result.clone();
        }
        op.effects += 1;
        op.applied_by.push(fault);
        let result = json!({
            "credit_id": format!("cr_{}_{}", &operation[3..operation.len().min(19)], op.effects),
            "status": "applied",
        });
        op.result.get_or_insert(result.clone());
        result
    }

    async fn deliver(self: Arc<Self>, tool: Tool, operation: String, fault: Fault) -> Reply {
        match fault {
            Fault::Ok => Reply::Ok(self.apply(&operation, tool, fault)),
            Fault::DropBefore => Reply::Drop,
            Fault::ApplyDrop => {
                self.apply(&operation, tool, fault);
                Reply::Drop
            }
            Fault::DelayApply => {
                tokio::time::sleep(DELAY).await;
                Reply::Ok(self.apply(&operation, tool, fault))
            }
            Fault::ApplyDelay => {
                let result = self.apply(&operation, tool, fault);
                tokio::time::sleep(DELAY).await;
                Reply::Ok(result)
            }
            Fault::E500Before => Reply::Status(StatusCode::INTERNAL_SERVER_ERROR),
            Fault::Apply500 => {
                self.apply(&operation, tool, fault);
                Reply::Status(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Fault::E503Before => Reply::Status(StatusCode::SERVICE_UNAVAILABLE),
        }
    }
}

async fn tool_route(up: Arc<Upstream>, tool: Tool, headers: HeaderMap) -> Response {
    if !up.authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some(operation) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let fault = {
        let mut ops = up.ops.lock().unwrap();
        let op = ops.entry(operation.clone()).or_default();
        op.tool = Some(tool.name());
        op.deliveries += 1;
        let fault = Fault::pick(up.seed, &operation, op.deliveries);
        op.faults.push(fault);
        if fault == Fault::DelayApply {
            op.pending += 1;
        }
        fault
    };
    // The effect runs to its end whatever happens to the connection (a real service does not
    // stop half-way because its caller went away).
    let reply = tokio::spawn(up.clone().deliver(tool, operation, fault))
        .await
        .unwrap();
    match reply {
        Reply::Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        Reply::Drop => dropped(),
        Reply::Status(s) => s.into_response(),
    }
}

/// The status protocol: `unknown` while a delivery may still apply, `committed` with the count
/// of effects, 404 when nothing was applied. One ask in ten fails (503 or a dropped answer).
async fn status_route(
    State(up): State<Arc<Upstream>>,
    headers: HeaderMap,
    UrlPath(operation): UrlPath<String>,
) -> Response {
    if !up.authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let ask = up.status_asks.fetch_add(1, Ordering::Relaxed);
    match rng_for(up.seed, &operation, 1_000_000 + ask).below(20) {
        0 => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        1 => return dropped(),
        _ => {}
    }
    let ops = up.ops.lock().unwrap();
    match ops.get(&operation) {
        Some(op) if op.pending > 0 => axum::Json(json!({"status": "unknown"})).into_response(),
        Some(op) if op.effects > 0 => axum::Json(json!({
            "status": "committed", "result": op.result, "effects": op.effects
        }))
        .into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn start_upstream(seed: u64) -> (std::net::SocketAddr, Arc<Upstream>) {
    let up = Arc::new(Upstream {
        seed,
        ..Upstream::default()
    });
    let (u1, u2) = (up.clone(), up.clone());
    let app = Router::new()
        .route(
            "/credit",
            post(move |h: HeaderMap| tool_route(u1.clone(), Tool::Credit, h)),
        )
        .route(
            "/note",
            post(move |h: HeaderMap| tool_route(u2.clone(), Tool::Note, h)),
        )
        .route("/status/{operation}", get(status_route))
        .with_state(up.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, up)
}

// ----- the gateway's files -----

fn contract(tool: Tool, addr: std::net::SocketAddr) -> String {
    let (path, idempotency, retry) = match tool {
        Tool::Credit => ("credit", "{ honoured: true, retention: 1h }", 3),
        Tool::Note => ("note", "{ honoured: false, retention: 1h }", 1),
    };
    format!(
        r#"name: {name}
version: 1
description: A write for the chaos test.
owner: test
effect: write
scopes: [chaos:write]
approval: none
idempotency: {idempotency}
retry: {{ max_attempts: {retry} }}
input:
  type: object
  additionalProperties: false
  required: [client, n]
  properties:
    client: {{ type: integer, minimum: 0, maximum: 1000 }}
    n: {{ type: integer, minimum: 0, maximum: 1000000 }}
output:
  type: object
  additionalProperties: false
  required: [credit_id, status]
  properties:
    credit_id: {{ type: string, maxLength: 64 }}
    status: {{ enum: [applied, pending] }}
adapter:
  kind: http
  url: "http://{addr}/{path}"
  credential: CHAOS_TOKEN
  timeout: {timeout}ms
  status_url: "http://{addr}/status/{{operation_id}}"
"#,
        name = tool.name(),
        timeout = ATTEMPT_TIMEOUT.as_millis(),
    )
}

fn write_files(dir: &Path, addr: std::net::SocketAddr) -> PathBuf {
    std::fs::create_dir_all(dir.join("contracts")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    for tool in [Tool::Credit, Tool::Note] {
        std::fs::write(
            dir.join(format!("contracts/{}.yaml", tool.name())),
            contract(tool, addr),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("policies/all.cedar"),
        r#"permit (principal, action in Warrant::Action::"invoke", resource);"#,
    )
    .unwrap();
    let config = dir.join("warrant.toml");
    std::fs::write(
        &config,
        format!(
            r#"[store]
data_dir = "{data}"

[network]
allow_hosts = ["127.0.0.1"]

[limits]
call_deadline = "3s"

[credentials.CHAOS_TOKEN]
env = "{TOKEN_VAR}"
tools = ["chaos_credit", "chaos_note"]
origins = ["http://{addr}"]
"#,
            data = dir.join("store").display(),
        ),
    )
    .unwrap();
    config
}

/// Where the server keeps its store: embedded SQLite in the run's directory, or a fresh
/// PostgreSQL schema.
#[derive(Debug, Clone)]
enum Backend {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
}

impl Backend {
    /// The store flags of `warrant serve` and `warrant reconcile`.
    fn flags(&self, cmd: &mut Command) {
        match self {
            Backend::Sqlite(dir) => cmd.arg("--data-dir").arg(dir),
            Backend::Postgres { url, schema } => cmd
                .args(["--database", url, "--database-schema", schema])
                // The redaction key a SQLite server keeps in its data directory.
                .env("WARRANT_REDACTION_KEY", "2a".repeat(32)),
        };
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "SQLite",
            Backend::Postgres { .. } => "PostgreSQL",
        }
    }

    async fn open(&self) -> SqlStore {
        match self {
            Backend::Sqlite(dir) => {
                SqlStore::open(&DatabaseUrl::data_dir(dir), &StoreOptions::default()).await
            }
            Backend::Postgres { url, schema } => {
                let options = StoreOptions {
                    postgres_schema: Some(schema.clone()),
                    ..StoreOptions::default()
                };
                SqlStore::open(&DatabaseUrl::Postgres(url.clone()), &options).await
            }
        }
        .unwrap()
    }
}

fn start_server(dir: &Path, config: &Path, backend: &Backend) -> common::serve::Served {
    common::serve::serve(|cmd| {
        backend.flags(cmd);
        cmd.arg("--config")
            .arg(config)
            .arg("--contracts")
            .arg(dir.join("contracts"))
            .arg("--policy")
            .arg(dir.join("policies"))
            .env(TOKEN_VAR, TOKEN)
            .env("WARRANT_LOG", "warn");
    })
}

// ----- the careful client -----

/// What a client learned of an intent.
#[derive(Debug, Clone, PartialEq)]
enum Saw {
    Committed(Value),
    Failed(String),
    Refused(u16, String),
    /// It never learned (gave up after its visits).
    NotLearned(String),
}

#[derive(Debug, Default)]
struct ClientStats {
    calls: u32,
    connection_errors: u32,
    unknown: u32,
    in_flight: u32,
    failed: u32,
    unavailable: u32,
}

struct Intent {
    key: String,
    tool: Tool,
    body: String,
    visits: u32,
}

enum Visit {
    Done(Saw),
    /// Not settled yet: come back later.
    Later(String),
}

/// One visit: presents the intent until it settles or the visit's time is up.
async fn visit(
    http: &reqwest::Client,
    url: &RwLock<String>,
    agent: &str,
    intent: &Intent,
    stats: &mut ClientStats,
    rng: &mut Rng,
) -> Visit {
    let until = Instant::now() + VISIT_LIMIT;
    let mut last = String::from("not tried");
    let mut failures = 0u32;
    while Instant::now() < until {
        let base = url.read().unwrap().clone();
        stats.calls += 1;
        let sent = http
            .post(format!("{base}/v1/proposals"))
            .bearer_auth(agent)
            .header("content-type", "application/json")
            .header("idempotency-key", &intent.key)
            .body(intent.body.clone())
            .timeout(Duration::from_secs(15))
            .send()
            .await;
        let wait = match sent {
            Err(e) => {
                stats.connection_errors += 1;
                last = format!("connection: {e}");
                rng.millis(50, 150)
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                let outcome = body["outcome"].as_str().unwrap_or("");
                let code = body["error"]["code"]
                    .as_str()
                    .or(body["code"].as_str())
                    .unwrap_or("")
                    .to_owned();
                match (status, outcome) {
                    (200, "committed" | "replayed") => {
                        return Visit::Done(Saw::Committed(body["result"].clone()));
                    }
                    (202, "unknown") => {
                        stats.unknown += 1;
                        last = "unknown".into();
                        rng.millis(50, 200)
                    }
                    (409, _) if code == "IDEMPOTENCY_IN_FLIGHT" => {
                        stats.in_flight += 1;
                        last = "in flight".into();
                        rng.millis(100, 300)
                    }
                    (502, "failed") => {
                        stats.failed += 1;
                        // A failure replayed from the record is the final answer; a fresh
                        // one may be retried with the same key (the key is freed when a retry
                        // could help).
                        failures += 1;
                        if body["replayed"] == json!(true) || failures >= 3 {
                            return Visit::Done(Saw::Failed(code));
                        }
                        last = format!("failed {code}");
                        rng.millis(20, 80)
                    }
                    (500..=599, _) => {
                        stats.unavailable += 1;
                        last = format!("{status} {code}");
                        rng.millis(50, 200)
                    }
                    _ => return Visit::Done(Saw::Refused(status, format!("{code} {body}"))),
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
    Visit::Later(last)
}

/// Runs one client's intents, parking unsettled ones for a later visit.
async fn client(
    c: u32,
    seed: u64,
    url: Arc<RwLock<String>>,
    agent: String,
    stop: Arc<AtomicBool>,
) -> (Vec<(String, Tool, Saw)>, ClientStats) {
    let http = common::http_client();
    let mut rng = rng_for(seed, "client", c);
    let mut queue: std::collections::VecDeque<Intent> = (0..INTENTS / CLIENTS)
        .map(|n| {
            let tool = if rng.below(2) == 0 {
                Tool::Credit
            } else {
                Tool::Note
            };
            Intent {
                key: format!("chaos-{c}-{n}"),
                tool,
                body: json!({"tool": tool.name(), "version": 1, "arguments": {"client": c, "n": n}})
                    .to_string(),
                visits: 0,
            }
        })
        .collect();
    let mut stats = ClientStats::default();
    let mut seen = Vec::new();
    while let Some(mut intent) = queue.pop_front() {
        if stop.load(Ordering::Relaxed) {
            seen.push((intent.key, intent.tool, Saw::NotLearned("load stopped".into())));
            continue;
        }
        intent.visits += 1;
        match visit(&http, &url, &agent, &intent, &mut stats, &mut rng).await {
            Visit::Done(saw) => seen.push((intent.key, intent.tool, saw)),
            Visit::Later(why) if intent.visits >= VISITS => {
                seen.push((intent.key, intent.tool, Saw::NotLearned(why)));
            }
            Visit::Later(_) => queue.push_back(intent),
        }
    }
    (seen, stats)
}

// ----- reconciliation and the comparison -----

/// Runs `warrant reconcile --older-than 0s` until nothing is left to examine, or five passes
/// in a row resolved nothing (the upstream's status endpoint itself fails one ask in ten, so a
/// row may need a few passes, as an operator would run them); returns the output of every pass.
fn reconcile_until_settled(config: &Path, backend: &Backend) -> Vec<String> {
    let mut passes = Vec::new();
    let mut futile = 0;
    for _ in 0..15 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warrant"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["reconcile", "--older-than", "0s", "--limit", "100000", "--config"])
            .arg(config);
        backend.flags(&mut cmd);
        let out = cmd
            .env(TOKEN_VAR, TOKEN)
            .env("WARRANT_LOG", "warn")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "warrant reconcile: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |name: &str| -> u32 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {text}"))
        };
        let (examined, resolved) = (field("examined"), field("committed") + field("not_committed"));
        passes.push(text.split_whitespace().collect::<Vec<_>>().join(" "));
        futile = if resolved == 0 { futile + 1 } else { 0 };
        if examined == 0 || futile >= 5 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    passes
}

async fn ledger(backend: &Backend) -> Vec<LedgerEntry> {
    let store = backend.open().await;
    let mut filter = LedgerFilter {
        limit: 500,
        ..LedgerFilter::default()
    };
    let mut rows = Vec::new();
    loop {
        let page = store.list_ledger("demo", &filter).await.unwrap();
        rows.extend(page.entries);
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    store.close().await;
    rows.reverse(); // oldest first
    rows
}

/// The verdict on one run.
#[derive(Debug, Default)]
struct Verdict {
    lost: Vec<String>,
    /// Lost effects by the faults of the deliveries that applied them.
    lost_by: BTreeMap<String, u32>,
    duplicate: Vec<String>,
    unresolved: Vec<String>,
    phantom: Vec<String>,
}

fn describe(key: &str, op: &str, rows: &[&LedgerEntry], up: Option<&Op>) -> String {
    let mut s = format!("{key} {op}: ledger [");
    for r in rows {
        let _ = write!(
            s,
            " {}{}",
            r.outcome.map_or("-", records::Outcome::as_str),
            r.error_code
                .as_deref()
                .map(|c| format!("({c})"))
                .unwrap_or_default()
        );
    }
    match up {
        Some(o) => {
            let _ = write!(
                s,
                " ] upstream deliveries={} effects={} faults={:?}",
                o.deliveries, o.effects, o.faults
            );
        }
        None => s.push_str(" ] upstream: never delivered"),
    }
    s
}

fn judge(
    rows: &[LedgerEntry],
    ops: &HashMap<String, Op>,
    seen: &[(String, Tool, Saw)],
) -> (Verdict, BTreeMap<&'static str, u32>) {
    let mut verdict = Verdict::default();
    let mut totals: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut by_key: BTreeMap<&str, Vec<&LedgerEntry>> = BTreeMap::new();
    for r in rows {
        if let Some(k) = r.idempotency_key.as_deref() {
            by_key.entry(k).or_default().push(r);
        }
        if let Some(o) = r.outcome {
            *totals.entry(o.as_str()).or_default() += 1;
        }
    }
    let saw: HashMap<&str, &Saw> = seen.iter().map(|(k, _, s)| (k.as_str(), s)).collect();
    let mut owned_ops: HashMap<String, &str> = HashMap::new();
    for (key, key_rows) in &by_key {
        let Some(first) = key_rows.iter().find(|r| r.contract_id.is_some()) else {
            continue;
        };
        let op = operation_id(first, scope_of(first).as_ref()).as_str().to_owned();
        if let Some(other) = owned_ops.insert(op.clone(), key) {
            verdict
                .duplicate
                .push(format!("{key} and {other} share the operation {op}"));
        }
        let up = ops.get(&op);
        let effects = up.map_or(0, |o| o.effects);
        let line = || describe(key, &op, key_rows, up);
        let open = key_rows.iter().any(|r| {
            matches!(
                r.outcome,
                Some(records::Outcome::Attempting | records::Outcome::Unknown)
            )
        });
        let committed = key_rows.iter().any(|r| {
            matches!(
                r.outcome,
                Some(records::Outcome::Committed | records::Outcome::ReconciledCommitted)
            )
        });
        if open {
            verdict.unresolved.push(line());
        }
        let told_committed = matches!(saw.get(key), Some(Saw::Committed(_)));
        if (told_committed && !committed) || (effects > 0 && !committed && !open) {
            verdict.lost.push(line());
            let by = up.map_or_else(|| "never delivered".to_owned(), |o| format!("{:?}", o.applied_by));
            *verdict.lost_by.entry(by).or_default() += 1;
        }
        if committed && effects == 0 {
            verdict.phantom.push(line());
        }
        if up.is_some_and(|o| o.tool == Some(Tool::Note.name())) && effects > 1 {
            verdict.duplicate.push(line());
        }
    }
    for (op, o) in ops {
        if o.effects > 0 && !owned_ops.contains_key(op) {
            verdict.lost.push(format!(
                "{op}: applied {} time(s) by the upstream, no ledger row owns it",
                o.effects
            ));
        }
    }
    for (key, _, s) in seen {
        if matches!(s, Saw::Committed(_)) && !by_key.contains_key(key.as_str()) {
            verdict
                .lost
                .push(format!("{key}: the client was told committed; no ledger row"));
        }
    }
    (verdict, totals)
}

/// One chaos run at a time: two at once on a small machine would measure each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_and_a_faulty_upstream_lose_nothing_duplicate_nothing_leave_nothing_open() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    chaos(Backend::Sqlite(dir.path().join("store"))).await;
}

/// The same on PostgreSQL (a fresh schema; skipped when the server is unreachable, unless
/// `WARRANT_REQUIRE_POSTGRES=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_postgresql_loses_nothing_duplicates_nothing_leaves_nothing_open() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(db) = warrant_store::testing::TestDatabase::postgres().await.unwrap() else {
        return;
    };
    // The schema exists before the first server starts (as an operator's would).
    db.open().await.unwrap().close().await;
    chaos(Backend::Postgres {
        url: db.url().to_owned(),
        schema: db.schema().to_owned(),
    })
    .await;
    db.drop_schema().await;
}

async fn chaos(backend: Backend) {
    let started = Instant::now();
    let seed = std::env::var("WARRANT_CHAOS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!(
        "chaos ({}): seed {seed} (replay with WARRANT_CHAOS_SEED={seed})",
        backend.name()
    );
    let report_only = std::env::var("WARRANT_CHAOS_REPORT_ONLY").is_ok_and(|v| v == "1");

    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_owned();
    let (addr, up) = start_upstream(seed).await;
    let config = write_files(&dir, addr);
    let first = {
        let (dir, config, backend) = (dir.clone(), config.clone(), backend.clone());
        tokio::task::spawn_blocking(move || start_server(&dir, &config, &backend))
            .await
            .unwrap()
    };
    let agent = first.keys["agent"].clone();
    let url = Arc::new(RwLock::new(first.url.clone()));
    let server = Arc::new(Mutex::new(Some(first)));
    let stop = Arc::new(AtomicBool::new(false));
    let load_done = Arc::new(AtomicBool::new(false));

    // The killer: SIGKILL at random moments, restart on the same data directory at once.
    let killer = {
        let (server, url, load_done, dir, config, backend) = (
            server.clone(),
            url.clone(),
            load_done.clone(),
            dir.clone(),
            config.clone(),
            backend.clone(),
        );
        tokio::spawn(async move {
            let mut rng = rng_for(seed, "killer", 0);
            let mut kills = 0u32;
            let mut restart_ms = Vec::new();
            loop {
                tokio::time::sleep(rng.millis(2000, 5000)).await;
                if load_done.load(Ordering::Relaxed) {
                    break;
                }
                let (server, url, dir, config, backend) = (
                    server.clone(),
                    url.clone(),
                    dir.clone(),
                    config.clone(),
                    backend.clone(),
                );
                let ms = tokio::task::spawn_blocking(move || {
                    let mut slot = server.lock().unwrap();
                    if let Some(mut s) = slot.take() {
                        s.child.kill().unwrap(); // SIGKILL
                        s.child.wait().unwrap();
                    }
                    let t0 = Instant::now();
                    let s = start_server(&dir, &config, &backend);
                    *url.write().unwrap() = s.url.clone();
                    *slot = Some(s);
                    t0.elapsed().as_millis()
                })
                .await
                .unwrap();
                kills += 1;
                restart_ms.push(ms);
            }
            (kills, restart_ms)
        })
    };

    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        clients.push(tokio::spawn(client(
            c,
            seed,
            url.clone(),
            agent.clone(),
            stop.clone(),
        )));
    }
    let limit = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LOAD_LIMIT).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut seen = Vec::new();
    let mut stats = ClientStats::default();
    for c in clients {
        let (s, st) = c.await.unwrap();
        seen.extend(s);
        stats.calls += st.calls;
        stats.connection_errors += st.connection_errors;
        stats.unknown += st.unknown;
        stats.in_flight += st.in_flight;
        stats.failed += st.failed;
        stats.unavailable += st.unavailable;
    }
    limit.abort();
    load_done.store(true, Ordering::Relaxed);
    let load_time = started.elapsed();
    let (kills, restart_ms) = killer.await.unwrap();

    // Stop: one last SIGKILL; let every delivery that may still apply settle; reconcile.
    {
        let server = server.clone();
        tokio::task::spawn_blocking(move || drop(server.lock().unwrap().take()))
            .await
            .unwrap();
    }
    let settle = Instant::now();
    while up.ops.lock().unwrap().values().any(|o| o.pending > 0) && settle.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let passes = {
        let (config, backend) = (config.clone(), backend.clone());
        tokio::task::spawn_blocking(move || reconcile_until_settled(&config, &backend))
            .await
            .unwrap()
    };

    let rows = ledger(&backend).await;
    let ops = up.ops.lock().unwrap().clone();
    let (verdict, totals) = judge(&rows, &ops, &seen);

    // What happened, then the verdict.
    let mut faults: BTreeMap<Fault, u32> = BTreeMap::new();
    for o in ops.values() {
        for f in &o.faults {
            *faults.entry(*f).or_default() += 1;
        }
    }
    let mut told: BTreeMap<&str, u32> = BTreeMap::new();
    for (_, _, s) in &seen {
        let k = match s {
            Saw::Committed(_) => "committed",
            Saw::Failed(_) => "failed",
            Saw::Refused(..) => "refused",
            Saw::NotLearned(_) => "not learned",
        };
        *told.entry(k).or_default() += 1;
    }
    let effects: u32 = ops.values().map(|o| o.effects).sum();
    let deliveries: u32 = ops.values().map(|o| o.deliveries).sum();
    println!(
        "chaos: {} intents from {CLIENTS} clients, {} HTTP calls in {:.1}s; {kills} SIGKILLs (restarts {restart_ms:?} ms)",
        seen.len(),
        stats.calls,
        load_time.as_secs_f64()
    );
    println!("chaos: client saw {stats:?}; told {told:?}");
    println!(
        "chaos: upstream {deliveries} deliveries, {effects} effects, {} status asks, {} unauthorized; faults {faults:?}",
        up.status_asks.load(Ordering::Relaxed),
        up.unauthorized.load(Ordering::Relaxed)
    );
    println!("chaos: reconcile passes {passes:?}");
    println!("chaos: ledger {} rows, outcomes {totals:?}", rows.len());
    for (name, list) in [
        ("lost", &verdict.lost),
        ("duplicate", &verdict.duplicate),
        ("unresolved", &verdict.unresolved),
        ("phantom", &verdict.phantom),
    ] {
        for line in list.iter().take(5) {
            println!("chaos:   {name}: {line}");
        }
    }
    for (key, _, s) in &seen {
        if let Saw::Refused(status, why) = s {
            println!("chaos:   refused: {key} {status} {why}");
        }
    }
    if !verdict.lost_by.is_empty() {
        println!(
            "chaos:   lost, by the faults of the applying deliveries: {:?}",
            verdict.lost_by
        );
    }
    let mut not_learned: BTreeMap<&str, u32> = BTreeMap::new();
    for (_, _, s) in &seen {
        if let Saw::NotLearned(why) = s {
            let why = why.split(':').next().unwrap_or("");
            *not_learned.entry(why).or_default() += 1;
        }
    }
    println!("chaos: not learned, by the last answer: {not_learned:?}");
    println!(
        "chaos: lost={} duplicate={} unresolved={} phantom={} ({:.1}s in all)",
        verdict.lost.len(),
        verdict.duplicate.len(),
        verdict.unresolved.len(),
        verdict.phantom.len(),
        started.elapsed().as_secs_f64()
    );

    // The run must have been a real one, or the zeros mean nothing.
    assert!(kills >= 3, "only {kills} kills");
    for f in Fault::ALL {
        assert!(faults.get(&f).copied().unwrap_or(0) > 0, "no {f:?} fault");
    }
    assert!(
        told.get("committed").copied().unwrap_or(0) >= INTENTS / 2,
        "too few calls committed: {told:?}"
    );
    assert_eq!(
        up.unauthorized.load(Ordering::Relaxed),
        0,
        "the credential did not reach the upstream"
    );
    assert!(!told.contains_key("refused"), "refusals: {told:?}");
    if report_only {
        return;
    }
    assert!(
        verdict.lost.is_empty()
            && verdict.duplicate.is_empty()
            && verdict.unresolved.is_empty()
            && verdict.phantom.is_empty(),
        "chaos on {} (seed {seed}): lost={} duplicate={} unresolved={} phantom={}",
        backend.name(),
        verdict.lost.len(),
        verdict.duplicate.len(),
        verdict.unresolved.len(),
        verdict.phantom.len()
    );
}
