//! A webhook delivery cut by `SIGKILL`: the real `warrant serve` posts an `approval.requested`
//! event to a loopback receiver that never answers the first request; the server is killed
//! while that delivery is in flight and restarted on the same data directory; the message is
//! claimed again once the dead node's lease lapses and delivered — at least once, under the
//! same event id, each request verifying with the independent `standardwebhooks` crate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use serde_json::{Value, json};

type Seen = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// A receiver that records every request and never answers the first.
async fn receiver() -> (std::net::SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let record = record.clone();
            async move {
                let first = {
                    let mut seen = record.lock().unwrap();
                    seen.push((headers, body.to_vec()));
                    seen.len() == 1
                };
                if first {
                    std::future::pending::<()>().await;
                }
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

async fn until(seen: &Seen, count: usize, within: Duration) {
    let started = Instant::now();
    while seen.lock().unwrap().len() < count {
        assert!(
            started.elapsed() < within,
            "{} requests after {within:?}",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_cut_by_sigkill_is_delivered_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    cut_and_delivered(dir.path(), &|cmd| {
        cmd.arg("--data-dir").arg(&data);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_cut_by_sigkill_is_delivered_after_restart_on_postgresql() {
    let Some(db) = warrant_store::testing::TestDatabase::postgres().await.unwrap() else {
        return;
    };
    // The schema exists before the first server starts (as an operator's would).
    db.open().await.unwrap().close().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, schema) = (db.url().to_owned(), db.schema().to_owned());
    cut_and_delivered(dir.path(), &|cmd| {
        cmd.args(["--database", &url, "--database-schema", &schema])
            .env("WARRANT_REDACTION_KEY", "2a".repeat(32));
    })
    .await;
    db.drop_schema().await;
}

async fn cut_and_delivered(dir: &std::path::Path, store: &dyn Fn(&mut std::process::Command)) {
    let config = dir.join("warrant.toml");
    std::fs::write(&config, "[network]\nallow_hosts = [\"127.0.0.1\"]\n").unwrap();
    let start = || {
        common::serve::serve(|cmd| {
            store(cmd);
            cmd.arg("--config").arg(&config);
        })
    };
    let (addr, seen) = receiver().await;
    let served = start();
    let (url, admin, agent) = (
        served.url.clone(),
        served.keys["admin"].clone(),
        served.keys["agent"].clone(),
    );
    let http = common::http_client();
    let made: Value = http
        .post(format!("{url}/v1/webhooks"))
        .bearer_auth(&admin)
        .json(&json!({"url": format!("http://{addr}/hook"), "events": ["approval.requested"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = made["secret"].as_str().expect("a secret").to_owned();
    let held = http
        .post(format!("{url}/v1/proposals"))
        .bearer_auth(&agent)
        .json(&json!({
            "tool": "create_support_credit", "version": 1, "idempotency_key": "kill-1",
            "arguments": {"customer_id": "cus_8f3k2m9q", "amount_cents": 2500, "reason": "duplicate charge"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status().as_u16(), 202);

    // The first delivery is in flight (the receiver holds it): kill the server.
    until(&seen, 1, Duration::from_secs(30)).await;
    let mut served = served;
    served.child.kill().unwrap(); // SIGKILL
    served.child.wait().unwrap();
    drop(served);

    // Restarted on the same data: delivered again once the dead node's lease lapses.
    let _restarted = start();
    until(&seen, 2, Duration::from_secs(90)).await;
    let seen = seen.lock().unwrap().clone();
    let reference = standardwebhooks::Webhook::new(&secret).unwrap();
    for (headers, body) in &seen {
        reference.verify(body, headers).unwrap();
        let body: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(body["type"], "approval.requested");
    }
    assert_eq!(
        seen[0].0["webhook-id"], seen[1].0["webhook-id"],
        "the same event, the same id"
    );
}
