//! A loopback fault server: a small axum app playing a tool that can answer any status, hang,
//! drop the connection before or after committing, answer garbage, and report what it
//! committed for reconciliation. The behaviour of one request is chosen by the `mode` field of
//! the canonical arguments it receives.
//!
//! Routes: `POST /honoured` deduplicates by `Idempotency-Key` (an idempotent tool);
//! `POST /plain` does not (every commit is a new effect); `GET /status/{operation}` answers
//! the status protocol; `GET /json/{name}` serves fixed JSON for fetches.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// What the server has seen, per idempotency key.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Requests received (attempts).
    pub requests: u32,
    /// Effects committed.
    pub effects: u32,
    /// The result of the first commit.
    pub result: Option<Value>,
    /// Headers of the last request.
    pub last_headers: HashMap<String, String>,
}

#[derive(Default)]
pub struct Faults {
    pub seen: Mutex<HashMap<String, Seen>>,
}

impl Faults {
    pub fn effects(&self, key: &str) -> u32 {
        self.seen.lock().unwrap().get(key).map_or(0, |s| s.effects)
    }
    pub fn requests(&self, key: &str) -> u32 {
        self.seen.lock().unwrap().get(key).map_or(0, |s| s.requests)
    }
    pub fn header(&self, key: &str, name: &str) -> Option<String> {
        self.seen
            .lock()
            .unwrap()
            .get(key)?
            .last_headers
            .get(name)
            .cloned()
    }
}

/// A body that fails after the headers went out: the client sees the connection die.
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

async fn tool(faults: Arc<Faults>, honoured: bool, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mode = args["mode"].as_str().unwrap_or("ok").to_owned();
    let attempt = {
        let mut seen = faults.seen.lock().unwrap();
        let s = seen.entry(key.clone()).or_default();
        s.requests += 1;
        s.last_headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        s.requests
    };
    // Commits the effect (once per key when honoured) and answers the result.
    let commit = |faults: &Faults| -> Value {
        let mut seen = faults.seen.lock().unwrap();
        let s = seen.entry(key.clone()).or_default();
        if honoured && s.effects > 0 {
            return s.result.clone().unwrap();
        }
        s.effects += 1;
        let result = json!({"credit_id": format!("cr_{}", &key[..key.len().min(12)]), "status": "applied"});
        s.result.get_or_insert(result.clone());
        result
    };
    let ok = |v: Value| (StatusCode::OK, axum::Json(v)).into_response();
    let random = mode == "random";
    let mode = if random {
        ["ok", "503", "hang", "commit_hang", "reset", "commit_drop"][rand::random_range(0..6)].to_owned()
    } else {
        mode
    };
    match mode.as_str() {
        "ok" => ok(commit(&faults)),
        "slow" => {
            let result = commit(&faults);
            tokio::time::sleep(Duration::from_millis(150)).await;
            ok(result)
        }
        "bad_output" => {
            commit(&faults);
            ok(json!({"unexpected": true}))
        }
        "hang" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        "commit_hang" => {
            commit(&faults);
            tokio::time::sleep(Duration::from_secs(30)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        "reset" => dropped(),
        "commit_drop" => {
            commit(&faults);
            dropped()
        }
        "dup" => {
            // Commits twice (a broken tool), then drops the answer.
            {
                let mut seen = faults.seen.lock().unwrap();
                let s = seen.entry(key.clone()).or_default();
                s.effects += 2;
                s.result = Some(json!({"credit_id": "cr_dup", "status": "applied"}));
            }
            dropped()
        }
        "limited_once" if attempt == 1 => {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response()
        }
        "limited_once" => ok(commit(&faults)),
        m if m.starts_with("flaky") => {
            let n: u32 = m.trim_start_matches("flaky").parse().unwrap_or(1);
            if attempt <= n {
                StatusCode::SERVICE_UNAVAILABLE.into_response()
            } else {
                ok(commit(&faults))
            }
        }
        m => match m.parse::<u16>() {
            Ok(status) => StatusCode::from_u16(status).unwrap().into_response(),
            Err(_) => StatusCode::BAD_REQUEST.into_response(),
        },
    }
}

async fn status(State(faults): State<Arc<Faults>>, Path(operation): Path<String>) -> Response {
    let seen = faults.seen.lock().unwrap();
    match seen.get(&operation) {
        Some(s) if s.effects > 0 => axum::Json(json!({
            "status": "committed", "result": s.result, "effects": s.effects
        }))
        .into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn fixed(State(faults): State<Arc<Faults>>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    {
        // Fetches are recorded under `fetch:<name>`, so tests can see what was sent.
        let mut seen = faults.seen.lock().unwrap();
        let s = seen.entry(format!("fetch:{name}")).or_default();
        s.requests += 1;
        s.last_headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
    }
    match name.as_str() {
        "order" => axum::Json(
            json!({"order_id": "ord_12345678", "status": "paid", "total_cents": 1200, "currency": "EUR"}),
        )
        .into_response(),
        "garbage" => (StatusCode::OK, "not json").into_response(),
        "big" => (StatusCode::OK, "x".repeat(2 << 20)).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Starts the server on an ephemeral loopback port.
pub async fn start() -> (SocketAddr, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let f1 = faults.clone();
    let f2 = faults.clone();
    let app = Router::new()
        .route(
            "/honoured",
            post(move |h: HeaderMap, b: Bytes| tool(f1.clone(), true, h, b)),
        )
        .route(
            "/plain",
            post(move |h: HeaderMap, b: Bytes| tool(f2.clone(), false, h, b)),
        )
        .route("/status/{operation}", get(status))
        .route("/json/{name}", get(fixed))
        .with_state(faults.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, faults)
}
