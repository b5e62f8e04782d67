//! The cases.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Harness, OVERFLOWING_AMOUNT, assert_error_shape, credit, redaction_key};

pub use crate::console::{
    an_edit_in_the_console_outlives_the_reviewers_request,
    sensitive_values_are_revealed_only_where_policy_lets,
    the_console_signs_reviewers_in_and_decides_through_the_pipeline,
};

fn lookup(order: &str) -> Value {
    json!({"tool": "lookup", "version": 1, "arguments": {"order_id": order}})
}

pub async fn a_call_is_decided_approved_executed_and_recorded(h: &Harness) {
    // A read is decided and executed at once.
    let (status, body) = h.propose("agent", &lookup("ord_1234")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"], "allow");
    assert_eq!(body["outcome"], "committed");
    assert_eq!(body["result"]["status"], "paid");

    // A write needing approval is held, bound to its payload.
    let (status, body) = h.propose("agent", &credit(2500, "c-1")).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["decision"], "needs_approval");
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    assert!(
        body["approval"]["review_url"]
            .as_str()
            .unwrap()
            .ends_with(&approval)
    );
    assert_eq!(h.upstream.total(), 0);

    // The inbox shows it; the proposer cannot approve its own call; a reviewer can.
    let r = h
        .req(Method::GET, "/v1/approvals?status=pending", "reviewer")
        .send()
        .await
        .unwrap();
    let inbox: Value = r.json().await.unwrap();
    assert_eq!(inbox["approvals"][0]["id"], approval.as_str());
    assert_eq!(inbox["approvals"][0]["arguments"]["amount_cents"], 2500);
    let r = h
        .req(
            Method::POST,
            &format!("/v1/approvals/{approval}/approve"),
            "agent",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = h
        .req(
            Method::POST,
            &format!("/v1/approvals/{approval}/approve"),
            "reviewer",
        )
        .json(&json!({"reason": "verified the duplicate charge"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let approved: Value = r.json().await.unwrap();
    assert_eq!(approved["status"], "approved");

    // A changed payload does not ride on the approval.
    let (status, body) = h
        .propose_with(
            0,
            "agent",
            &credit(2600, "c-1"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert!(status == 403 || status == 422, "{status} {body}");
    assert_error_shape(&body);

    // The approved call, presented again with the approval id, runs once.
    let (status, body) = h
        .propose_with(
            0,
            "agent",
            &credit(2500, "c-1"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "committed");
    let result = body["result"].clone();
    assert_eq!(h.upstream.total(), 1);
    let ledger_id = body["ledger_id"].as_str().unwrap().to_owned();

    // Replayed: the stored result, no second effect.
    let (status, body) = h
        .propose_with(
            0,
            "agent",
            &credit(2500, "c-1"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "replayed");
    assert_eq!(body["result"], result);
    assert_eq!(h.upstream.total(), 1);

    // Recorded.
    let r = h
        .req(Method::GET, &format!("/v1/ledger/{ledger_id}"), "agent")
        .send()
        .await
        .unwrap();
    let row: Value = r.json().await.unwrap();
    assert_eq!(row["outcome"], "committed");
    assert_eq!(row["approval_id"], approval.as_str());
    assert_eq!(row["tool"], "credit");
}

pub async fn idempotency_statuses_follow_the_draft(h: &Harness) {
    // Missing where required: 400.
    let no_key = json!({"tool": "credit", "version": 1,
        "arguments": {"customer_id": "cus_1", "amount_cents": 5, "reason": "x"}});
    let (status, body) = h.propose("agent", &no_key).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_REQUIRED");
    // The header carries the key as well as the envelope.
    let (status, body) = h
        .propose_with(0, "agent", &no_key, &[("idempotency-key", "hdr-1")])
        .await;
    assert_eq!(status, 202, "{body}");

    // Approve and run one call, then reuse its key with another payload: 422.
    let approval = approved(h, &credit(10, "k-reuse")).await;
    let (status, _) = h
        .propose_with(
            0,
            "agent",
            &credit(10, "k-reuse"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = h.propose("agent", &credit(11, "k-reuse")).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_REUSED");

    // In flight: 409.
    let slow = json!({"tool": "credit", "version": 1, "idempotency_key": "k-slow",
        "arguments": {"customer_id": "cus_1", "amount_cents": 10, "reason": "slow"}});
    let approval = approved(h, &slow).await;
    let headers = [("warrant-approval", approval.as_str())];
    let first = h.propose_with(0, "agent", &slow, &headers);
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        h.propose_with(0, "agent", &slow, &[("warrant-approval", &approval)])
            .await
    };
    let ((s1, b1), (s2, b2)) = tokio::join!(first, second);
    assert_eq!(s1, 200, "{b1}");
    assert_eq!(s2, 409, "{b2}");
    assert_eq!(b2["error"]["code"], "IDEMPOTENCY_IN_FLIGHT");
    // The refusal is a refusal, as its ledger row says.
    assert_eq!(b2["decision"], "reject", "{b2}");
}

pub async fn hostile_requests_get_clear_errors(h: &Harness) {
    let rows_before = ledger_count(h, "agent").await;
    let post = |body: &'static [u8], ct: &'static str| {
        h.req(Method::POST, "/v1/proposals", "agent")
            .header("content-type", ct)
            .body(body)
    };
    let cases: Vec<(reqwest::RequestBuilder, u16, bool)> = vec![
        // (request, status, writes a ledger rejection row)
        (post(b"{not json", "application/json"), 400, true),
        (
            post(br#"{"tool":"lookup","tool":"lookup"}"#, "application/json"),
            400,
            true,
        ),
        (
            post(
                br#"{"tool":"lookup","version":1,"arguments":{"order_id":"ord_1234"},"tenant":"globex"}"#,
                "application/json",
            ),
            400,
            true,
        ),
        (
            post(
                br#"{"tool":"lookup","version":1,"arguments":{"order_id":5}}"#,
                "application/json",
            ),
            422,
            true,
        ),
        (
            post(
                br#"{"tool":"nope","version":1,"arguments":{}}"#,
                "application/json",
            ),
            404,
            true,
        ),
        (post(b"{}", "text/plain"), 415, false),
        (
            h.req(Method::POST, "/v1/proposals", "nobody")
                .header("content-type", "application/json")
                .body("{}"),
            401,
            false,
        ),
        (
            h.req(Method::POST, "/v1/proposals", "nobody")
                .header("content-type", "application/json")
                .header(
                    "authorization",
                    format!("Bearer wrn_{}_{}", "0".repeat(16), "f".repeat(64)),
                )
                .body("{}"),
            401,
            false,
        ),
        (
            h.req(Method::POST, "/v1/proposals", "nobody")
                .header("authorization", "Basic YWxhZGRpbjpvcGVu")
                .body("{}"),
            401,
            false,
        ),
        (h.req(Method::GET, "/v1/does-not-exist", "agent"), 404, false),
        (h.req(Method::DELETE, "/v1/proposals", "agent"), 405, false),
        (
            h.req(Method::GET, "/v1/ledger?outcome=exploded", "agent"),
            400,
            false,
        ),
        (
            h.req(Method::GET, "/v1/ledger?cursor=garbage", "agent"),
            400,
            false,
        ),
        (
            h.req(Method::GET, "/v1/ledger?since=yesterday", "agent"),
            400,
            false,
        ),
        (
            h.req(Method::POST, "/v1/keys", "agent")
                .json(&json!({"principal": "x"})),
            403,
            false,
        ),
        (
            h.req(Method::POST, "/v1/keys", "admin")
                .body("{\"principal\": 5}"),
            400,
            false,
        ),
        (
            h.req(Method::POST, "/v1/approvals/apr_nope/approve", "reviewer"),
            404,
            false,
        ),
        (
            h.req(Method::POST, "/v1/approvals/apr_nope/approve", "reviewer")
                .body("[1,2"),
            400,
            false,
        ),
    ];
    let mut expected_rows = rows_before;
    for (i, (req, status, writes)) in cases.into_iter().enumerate() {
        let r = req.send().await.unwrap();
        let got = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("case {i}: not JSON ({e}), {ct:?}"));
        assert_eq!(got, status, "case {i}: {body}");
        assert_error_shape(&body);
        if writes {
            expected_rows += 1;
            assert!(body["ledger_id"].is_string(), "case {i}: {body}");
        }
    }
    // A body declared over the limit is refused from its headers, before it is read. (Raw
    // TCP: a client still writing 2 MiB when the server answers and closes would see a broken
    // pipe instead of the answer.)
    let (status, body) = oversized(h).await;
    assert_eq!(status, 413, "{body}");
    assert_error_shape(&body);
    assert_eq!(body["error"]["code"], "PAYLOAD_TOO_LARGE");

    // Nothing written but the rejection rows, and nothing executed.
    assert_eq!(ledger_count(h, "agent").await, expected_rows);
    assert_eq!(*h.upstream.requests.lock().unwrap(), 0);
}

/// Sends only the headers of a 2 MiB proposal and reads the answer.
async fn oversized(h: &Harness) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = h.base().trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/proposals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        h.keys["agent"],
        2 << 20
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let json = text.split_once("\r\n\r\n").map(|(_, b)| b.trim()).unwrap_or("");
    // The body may be chunked: take the JSON object inside it.
    let start = json.find('{').unwrap_or(0);
    let end = json.rfind('}').map_or(json.len(), |i| i + 1);
    (
        status,
        serde_json::from_str(&json[start..end]).unwrap_or(Value::Null),
    )
}

async fn ledger_count(h: &Harness, who: &str) -> usize {
    let r = h
        .req(Method::GET, "/v1/ledger?limit=500", who)
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    page["entries"].as_array().unwrap().len()
}

pub async fn tenants_cannot_reach_each_other(h: &Harness) {
    let (_, body) = h.propose("agent", &credit(2500, "iso-1")).await;
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    let ledger_id = body["ledger_id"].as_str().unwrap().to_owned();
    // globex's supervisor can neither see, approve nor consume acme's approval.
    let r = h.req(Method::GET, "/v1/approvals", "other").send().await.unwrap();
    let inbox: Value = r.json().await.unwrap();
    assert!(inbox["approvals"].as_array().unwrap().is_empty());
    assert_eq!(h.approve_on(0, "other", &approval).await, 404);
    let r = h
        .req(Method::GET, &format!("/v1/ledger/{ledger_id}"), "other")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Presenting acme's approval from globex does not bind.
    let (status, body) = h
        .propose_with(
            0,
            "other",
            &credit(2500, "iso-1"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert_ne!(status, 200, "{body}");
    assert_eq!(h.upstream.total(), 0);
    assert_eq!(ledger_count(h, "other").await, 1);
}

pub async fn admins_register_and_retire_contracts(h: &Harness) {
    let doc = r#"
name: ping
version: 1
description: Answer pong.
owner: test
effect: read
scopes: [orders:read]
approval: none
input: { type: object, additionalProperties: false, properties: {} }
output: { type: object, additionalProperties: false, properties: {} }
"#;
    let post = |who: &str, body: &str, ct: &str| {
        h.req(Method::POST, "/v1/contracts", who)
            .header("content-type", ct)
            .body(body.to_owned())
    };
    assert_eq!(
        post("agent", doc, "application/yaml")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        403
    );
    let r = post("admin", doc, "application/yaml").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("tool-contract@sha256:"));
    // Same body again: no change. Another body under the same version: 409.
    assert_eq!(
        post("admin", doc, "application/yaml")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let changed = doc.replace("Answer pong.", "Answer ping.");
    let r = post("admin", &changed, "application/yaml").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
    // An open schema is refused with every problem.
    let open = doc.replace(
        "additionalProperties: false, properties: {} }\noutput",
        "properties: { a: { type: string } } }\noutput",
    );
    let r = post("admin", &open, "application/yaml").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    assert!(!body["problems"].as_array().unwrap().is_empty(), "{body}");

    // Listed and readable.
    let r = h.req(Method::GET, "/v1/contracts", "agent").send().await.unwrap();
    let list: Value = r.json().await.unwrap();
    assert!(
        list["contracts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "ping")
    );
    let r = h
        .req(Method::GET, "/v1/contracts/ping/1", "agent")
        .send()
        .await
        .unwrap();
    let one: Value = r.json().await.unwrap();
    assert_eq!(one["document"]["description"], "Answer pong.");

    // Retired: new calls are refused.
    let r = h
        .req(Method::POST, &format!("/v1/contracts/{id}/retire"), "admin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (status, body) = h
        .propose("agent", &json!({"tool": "ping", "version": 1, "arguments": {}}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["stage"], "contract");
}

pub async fn keys_are_created_and_revoked(h: &Harness) {
    let r = h
        .req(Method::POST, "/v1/keys", "admin")
        .json(&json!({"principal": "bot-2", "grants": ["orders:read"], "roles": ["agent"], "label": "ci"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["tenant"], "acme");
    let call = || {
        h.http
            .post(format!("{}/v1/proposals", h.base()))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(lookup("ord_9999").to_string())
    };
    assert_eq!(call().send().await.unwrap().status().as_u16(), 200);
    let r = h
        .req(Method::DELETE, &format!("/v1/keys/{id}"), "admin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(call().send().await.unwrap().status().as_u16(), 401);
    // A revoked key is no longer active: revoking it again is 404.
    let r = h
        .req(Method::DELETE, &format!("/v1/keys/{id}"), "admin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

pub async fn the_ledger_filters_and_pages(h: &Harness) {
    for i in 0..5 {
        h.propose("agent", &lookup(&format!("ord_{i:04}"))).await;
    }
    h.propose("agent", &credit(1, "lg-1")).await;
    let r = h
        .req(Method::GET, "/v1/ledger?tool=lookup&limit=2", "agent")
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["entries"].as_array().unwrap().len(), 2);
    let mut seen = 2;
    let mut cursor = page["next_cursor"].as_str().map(str::to_owned);
    while let Some(c) = cursor {
        let r = h
            .req(
                Method::GET,
                &format!("/v1/ledger?tool=lookup&limit=2&cursor={c}"),
                "agent",
            )
            .send()
            .await
            .unwrap();
        let page: Value = r.json().await.unwrap();
        seen += page["entries"].as_array().unwrap().len();
        cursor = page["next_cursor"].as_str().map(str::to_owned);
    }
    assert_eq!(seen, 5);
    let r = h
        .req(Method::GET, "/v1/ledger?outcome=committed", "agent")
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    assert!(
        page["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["outcome"] == "committed")
    );
    assert_eq!(page["entries"].as_array().unwrap().len(), 5);
}

pub async fn health_readiness_and_metrics(h: &Harness) {
    let get = |path: &str| h.http.get(format!("{}{path}", h.base())).send();
    assert_eq!(get("/healthz").await.unwrap().status().as_u16(), 200);
    assert_eq!(get("/readyz").await.unwrap().status().as_u16(), 200);
    // One trace id per proposal, taken from a W3C traceparent.
    let (_, body) = h
        .propose_with(
            0,
            "agent",
            &lookup("ord_5555"),
            &[(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )],
        )
        .await;
    assert_eq!(body["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let r = h
        .req(
            Method::GET,
            &format!("/v1/ledger/{}", body["ledger_id"].as_str().unwrap()),
            "agent",
        )
        .send()
        .await
        .unwrap();
    let row: Value = r.json().await.unwrap();
    assert_eq!(row["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let r = get("/metrics").await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    // The per-call metrics (their handles are resolved once per pipeline and runtime) count.
    for series in [
        r#"warrant_decisions_total{decision="ALLOW"}"#,
        r#"warrant_attempts_total{adapter="http"}"#,
        r#"warrant_outcomes_total{outcome="committed"}"#,
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(series)
                && l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v >= 1.0)),
            "{series}: {text}"
        );
    }
    assert!(
        text.contains("warrant_http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains("warrant_adapter_latency_seconds"), "{text}");
    // Counted by route, method and status (the handles are resolved once per combination).
    let counted = |route: &str, status: &str| {
        text.lines().any(|l| {
            l.starts_with("warrant_http_requests_total{")
                && l.contains(&format!("route=\"{route}\""))
                && l.contains("method=\"POST\"")
                && l.contains(&format!("status=\"{status}\""))
        })
    };
    assert!(counted("/v1/proposals", "200"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("warrant_adapter_latency_seconds") && l.contains("adapter=\"http\"")),
        "{text}"
    );
}

/// Two nodes on one PostgreSQL database: the same approved call raced through both, and the
/// same key raced through both — one effect, one consumption.
pub async fn two_nodes_race(h: &Harness) {
    let (_, body) = h.propose("agent", &credit(700, "race-1")).await;
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    assert_eq!(h.approve_on(1, "reviewer", &approval).await, 200);
    let proposal = credit(700, "race-1");
    let headers = [("warrant-approval", approval.as_str())];
    let mut calls = Vec::new();
    for i in 0..8 {
        calls.push(h.propose_with(i % 2, "agent", &proposal, &headers));
    }
    let answers = join_all(calls.into_iter().map(Box::pin).collect()).await;
    let committed = answers
        .iter()
        .filter(|(s, b)| *s == 200 && b["outcome"] == "committed")
        .count();
    assert_eq!(committed, 1, "{answers:?}");
    assert_eq!(h.upstream.total(), 1);
    // Afterwards every node replays the one result.
    for node in 0..2 {
        let (status, body) = h
            .propose_with(
                node,
                "agent",
                &credit(700, "race-1"),
                &[("warrant-approval", &approval)],
            )
            .await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("replayed")),
            "{body}"
        );
    }
    // The approval was consumed once.
    let r = h
        .req(Method::GET, "/v1/approvals?status=consumed", "reviewer")
        .send()
        .await
        .unwrap();
    let list: Value = r.json().await.unwrap();
    assert_eq!(list["approvals"].as_array().unwrap().len(), 1);
}

/// Awaits every future concurrently (on this task).
async fn join_all<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut results: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futures.iter_mut().enumerate() {
            if results[i].is_none() {
                match std::pin::Pin::new(f).poll(cx) {
                    Poll::Ready(v) => results[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(()) }
    })
    .await;
    results.into_iter().map(Option::unwrap).collect()
}

pub async fn approvals_are_visible_only_to_their_reviewers_and_keep_no_sensitive_value(h: &Harness) {
    // `customer_id` is sensitive in the credit contract; supervisors review credits (policy).
    let (status, body) = h.propose("agent", &credit(2500, "vis-1")).await;
    assert_eq!(status, 202, "{body}");
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    let token = redaction_key().token(&json!("cus_1"));

    // Keys that policy does not let review credits see no approval, listed or by id: the
    // proposing agent and the tenant's admin alike.
    for who in ["agent", "admin"] {
        let r = h.req(Method::GET, "/v1/approvals", who).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let inbox: Value = r.json().await.unwrap();
        assert_eq!(inbox["approvals"], json!([]), "{who}: {inbox}");
        let r = h
            .req(Method::GET, &format!("/v1/approvals/{approval}"), who)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "{who}");
    }

    // The reviewer sees it, the sensitive value only as the ledger keeps it.
    let r = h
        .req(Method::GET, "/v1/approvals?status=pending", "reviewer")
        .send()
        .await
        .unwrap();
    let inbox: Value = r.json().await.unwrap();
    let listed = &inbox["approvals"][0];
    assert_eq!(listed["id"], approval.as_str(), "{inbox}");
    assert_eq!(listed["arguments"]["customer_id"], token.as_str());
    assert_eq!(listed["arguments"]["amount_cents"], 2500);
    let r = h
        .req(Method::GET, &format!("/v1/approvals/{approval}"), "reviewer")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let shown: Value = r.json().await.unwrap();
    assert_eq!(&shown, listed);
    assert!(!inbox.to_string().contains("cus_1"), "{inbox}");

    // The store holds no clear sensitive value.
    let stored = h.stored_approval(&approval).await;
    assert_eq!(stored.request.arguments["customer_id"], token.as_str());
    assert!(!format!("{stored:?}").contains("cus_1"), "{stored:?}");

    // The binding is over the call's own canonical arguments, not the stored copy: the
    // approved call, presented with its clear arguments, runs.
    assert_eq!(h.approve_on(0, "reviewer", &approval).await, 200);
    let (status, body) = h
        .propose_with(
            0,
            "agent",
            &credit(2500, "vis-1"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "committed", "{body}");
    assert_eq!(h.upstream.total(), 1);
}

pub async fn a_policy_that_cannot_be_evaluated_denies_the_call(h: &Harness) {
    // The agent is permitted credits; the forbid `credit.overflow` errors on this amount.
    // Cedar would skip it and let the permit through: the call is denied, naming it.
    let (status, body) = h.propose("agent", &credit(OVERFLOWING_AMOUNT, "err-1")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["stage"], "policy", "{body}");
    assert_eq!(body["error"]["code"], "POLICY_DENIED", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("policy `credit.overflow` could not be evaluated: integer overflow"),
        "{message}"
    );
    assert!(!message.contains("424242"), "{message}");
    let r = h
        .req(
            Method::GET,
            &format!("/v1/ledger/{}", body["ledger_id"].as_str().unwrap()),
            "admin",
        )
        .send()
        .await
        .unwrap();
    let row: Value = r.json().await.unwrap();
    assert_eq!(row["decision"], "reject", "{row}");
    assert_eq!(row["error_code"], "POLICY_DENIED", "{row}");
    assert_eq!(
        row["detail"],
        "denied: policy `credit.overflow` could not be evaluated: integer overflow"
    );
    // Any other amount is decided as before.
    let (status, body) = h.propose("agent", &credit(2500, "err-2")).await;
    assert_eq!(status, 202, "{body}");
}

/// The trust model over HTTP: a tenant's contracts are its own (invisible, uncallable and
/// unchangeable from another tenant, no squatting, no platform names); bindings are the
/// operator's; tenants and their keys are created only by the operator.
pub async fn contracts_and_tenants_follow_the_trust_model(h: &Harness) {
    let upstream = h.upstream_addr;
    let doc = |name: &str, description: &str| {
        format!(
            r#"
name: {name}
version: 1
description: {description}
owner: test
effect: read
scopes: [orders:read]
approval: none
input: {{ type: object, additionalProperties: false, required: [order_id], properties: {{ order_id: {{ type: string, maxLength: 20 }} }} }}
output: {{ type: object }}
"#
        )
    };
    let register = |who: &str, query: &str, body: String| {
        h.req(Method::POST, &format!("/v1/contracts{query}"), who)
            .header("content-type", "application/yaml")
            .body(body)
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    let code = async |r: reqwest::Response| {
        let body: Value = r.json().await.unwrap();
        body["error"]["code"].as_str().unwrap_or_default().to_owned()
    };

    // acme's own contract: listed and callable in acme only.
    let r = register("admin", "", doc("orders_view", "acme's view"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.unwrap();
    assert_eq!(created["tenant"], "acme");
    let acme_id = created["id"].as_str().unwrap().to_owned();
    let call = json!({"tool": "orders_view", "version": 1, "arguments": {"order_id": "ord_1"}});
    // Allowed (it has no binding yet, so it fails at execution).
    let (s, body) = h.propose("agent", &call).await;
    assert_eq!((s, body["decision"].as_str()), (502, Some("allow")), "{body}");
    let (s, body) = h.propose("other", &call).await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (404, Some("CONTRACT_NOT_FOUND")),
        "{body}"
    );
    let listed = |who: &'static str| async move {
        let r = h.req(Method::GET, "/v1/contracts", who).send().await.unwrap();
        let list: Value = r.json().await.unwrap();
        list["contracts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "{}:{}",
                    c["tenant"].as_str().unwrap_or("-"),
                    c["name"].as_str().unwrap()
                )
            })
            .collect::<Vec<_>>()
    };
    assert!(listed("agent").await.contains(&"acme:orders_view".to_owned()));
    assert!(listed("agent").await.contains(&"-:lookup".to_owned()));
    assert!(!listed("other").await.iter().any(|c| c.ends_with("orders_view")));
    let r = h
        .req(Method::GET, "/v1/contracts/orders_view/1", "other")
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 404);

    // globex cannot retire it (nor a platform contract), and can register its own under the
    // same name@version: no squatting.
    let r = h
        .req(
            Method::POST,
            &format!("/v1/contracts/{acme_id}/retire"),
            "other_admin",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 404);
    let r = h
        .req(
            Method::POST,
            &format!("/v1/contracts/{acme_id}/retire?tenant=acme"),
            "other_admin",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 403);
    let (s, body) = h.propose("agent", &call).await;
    assert_eq!(body["decision"], "allow", "still callable in acme: {s} {body}");
    let r = register("other_admin", "", doc("orders_view", "globex's own"))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 201);
    let r = h
        .req(Method::GET, "/v1/contracts/orders_view/1", "agent")
        .send()
        .await
        .unwrap();
    let one: Value = r.json().await.unwrap();
    assert_eq!(one["document"]["description"], "acme's view");
    // A platform name is the platform's.
    let r = register("other_admin", "", doc("lookup", "a shadow"))
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, "CONTRACT_NAME_TAKEN");
    let platform = listed("other").await;
    assert!(platform.contains(&"-:lookup".to_owned()));
    let lookup_id = {
        let r = h
            .req(Method::GET, "/v1/contracts/lookup/1", "agent")
            .send()
            .await
            .unwrap();
        let one: Value = r.json().await.unwrap();
        one["id"].as_str().unwrap().to_owned()
    };
    let r = h
        .req(
            Method::POST,
            &format!("/v1/contracts/{lookup_id}/retire"),
            "admin",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 404, "a tenant admin cannot retire a platform contract");

    // Bindings are the operator's: a tenant admin's document with `adapter` is refused; the
    // operator binds acme's contract, and a different binding later is a conflict.
    let bound = format!(
        "{}adapter: {{ kind: http, url: \"http://{upstream}/lookup\", credential: HOME }}\n",
        doc("orders_view", "acme's view")
    );
    let r = register("admin", "", bound.clone()).send().await.unwrap();
    assert_eq!(code(r).await, "BINDING_OPERATOR_ONLY");
    let r = register("operator", "?tenant=acme", bound).send().await.unwrap();
    assert_eq!(code(r).await, "ADAPTER_BINDING_INVALID", "HOME is no credential");
    let bound = format!(
        "{}adapter: {{ kind: http, url: \"http://{upstream}/lookup\" }}\n",
        doc("orders_view", "acme's view")
    );
    let r = register("operator", "?tenant=acme", bound).send().await.unwrap();
    assert_eq!(status(r), 200, "bound");
    let (s, body) = h.propose("agent", &call).await;
    assert_eq!((s, body["outcome"].as_str()), (200, Some("committed")), "{body}");
    let rebound = format!(
        "{}adapter: {{ kind: http, url: \"http://{upstream}/credit\" }}\n",
        doc("orders_view", "acme's view")
    );
    let r = register("operator", "?tenant=acme", rebound)
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 409);
    let r = register("admin", "?tenant=globex", doc("x", "y"))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 403);
    let r = register("operator", "?tenant=nobody", doc("x", "y"))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 404, "no contracts for a tenant that does not exist");

    // Tenants: the operator's alone.
    for who in ["admin", "agent", "other_admin"] {
        let r = h.req(Method::GET, "/v1/tenants", who).send().await.unwrap();
        assert_eq!(status(r), 403, "{who}");
        let r = h
            .req(Method::POST, "/v1/tenants", who)
            .json(&json!({"id": "initech"}))
            .send()
            .await
            .unwrap();
        assert_eq!(status(r), 403, "{who}");
        let r = h
            .req(Method::POST, "/v1/tenants/acme/keys", who)
            .json(&json!({"principal": "x", "roles": ["admin"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(status(r), 403, "{who}");
    }
    let r = h
        .req(Method::POST, "/v1/tenants", "operator")
        .json(&json!({"id": "initech", "label": "Initech"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.unwrap();
    let initech_admin = created["admin_key"]["key"].as_str().unwrap().to_owned();
    assert_eq!(created["admin_key"]["tenant"], "initech");
    let r = h
        .req(Method::POST, "/v1/tenants", "operator")
        .json(&json!({"id": "initech"}))
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, "TENANT_EXISTS");
    let r = h
        .req(Method::POST, "/v1/tenants", "operator")
        .json(&json!({"id": "platform"}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 400);
    let r = h
        .req(Method::GET, "/v1/tenants", "operator")
        .send()
        .await
        .unwrap();
    let tenants: Value = r.json().await.unwrap();
    assert!(
        tenants["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == "initech")
    );
    let r = h
        .req(Method::POST, "/v1/tenants/initech/keys", "operator")
        .json(&json!({"principal": "bot", "grants": ["orders:read"], "roles": ["agent"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let r = h
        .req(Method::POST, "/v1/tenants/nobody/keys", "operator")
        .json(&json!({"principal": "bot"}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 404);
    // The new tenant's admin works in its tenant and sees no other tenant's contracts.
    let r = h
        .http
        .get(format!("{}/v1/contracts", h.base()))
        .bearer_auth(&initech_admin)
        .send()
        .await
        .unwrap();
    let list: Value = r.json().await.unwrap();
    let names: Vec<&Value> = list["contracts"].as_array().unwrap().iter().collect();
    assert!(names.iter().all(|c| c["tenant"].is_null()), "{list}");
}

/// Sends `call` again with `approval` until it is no longer in flight (at most 10 s), and
/// requires the answer to be the replay of its committed outcome.
/// Proposes `call` as the agent and has the reviewer approve it on node 0: the approval id.
async fn approved(h: &Harness, call: &Value) -> String {
    let (_, body) = h.propose("agent", call).await;
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    assert_eq!(h.approve_on(0, "reviewer", &approval).await, 200);
    approval
}

async fn assert_replayed_once_finished(h: &Harness, call: &Value, approval: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = h
            .propose_with(0, "agent", call, &[("warrant-approval", approval)])
            .await;
        if status != 409 || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "replayed", "{body}");
}

/// A client that gives up while its call runs cannot cut the call in half: the runtime owns
/// it from decision to outcome, so the approval is spent on an effect that is recorded, and
/// the same call sent again is answered from that record.
pub async fn a_call_outlives_its_client(h: &Harness) {
    let slow = json!({"tool": "credit", "version": 1, "idempotency_key": "k-gone",
        "arguments": {"customer_id": "cus_1", "amount_cents": 12, "reason": "slow"}});
    let approval = approved(h, &slow).await;
    // The upstream takes 500 ms; the client hangs up after 100.
    let gone = h
        .req(Method::POST, "/v1/proposals", "agent")
        .header("content-type", "application/json")
        .header("warrant-approval", &approval)
        .timeout(std::time::Duration::from_millis(100))
        .body(slow.to_string())
        .send()
        .await;
    assert!(gone.is_err(), "the client was meant to give up: {gone:?}");
    // The call still runs to its recorded end.
    assert_replayed_once_finished(h, &slow, &approval).await;
    let page = h
        .req(Method::GET, "/v1/ledger?limit=50", "reviewer")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let committed: Vec<&Value> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["idempotency_key"] == "k-gone" && e["outcome"] == "committed")
        .collect();
    assert_eq!(committed.len(), 1, "{page}");
}

/// `submit` takes the call into the runtime's ownership as it is called, not at the future's
/// first poll: a lane whose wait is dropped before it ever ran (a request cancelled at once)
/// still has its call run to its recorded end, its approval spent on a recorded effect.
pub async fn a_submitted_call_runs_though_never_awaited(h: &Harness) {
    let call = json!({"tool": "credit", "version": 1, "idempotency_key": "k-unpolled",
        "arguments": {"customer_id": "cus_1", "amount_cents": 14, "reason": "unpolled"}});
    let approval = approved(h, &call).await;
    // The "agent" key's principal, as the HTTP lane would hand it over.
    let principal = warrant_core::authority::Principal::new(
        "agent-7",
        "acme",
        ["orders:read", "credits:write", "workflows:validate"].map(str::to_owned),
    )
    .unwrap()
    .with_roles(["agent".to_owned()])
    .unwrap();
    let owned = warrant_runtime::OwnedCall {
        bytes: call.to_string().into_bytes().into(),
        approval_id: Some(approval.clone()),
        trace_id: "a".repeat(32),
        ..warrant_runtime::OwnedCall::default()
    };
    let state = &h.nodes[0].gateway.state;
    drop(warrant_runtime::submit(
        state.authority.clone(),
        state.runtime.clone(),
        principal,
        owned,
    ));
    // The runtime counts the call it owns until it ends (with the old `submit`, nothing was
    // handed over and nothing is waited for); sent again then, the call is answered from the
    // record of the one never awaited, not executed again.
    assert!(state.runtime.drain(std::time::Duration::from_secs(10)).await);
    assert_replayed_once_finished(h, &call, &approval).await;
}

/// The server's own request timeout cuts only the wait too: the client gets `503 TIMEOUT`,
/// and the call — its approval already spent — runs to its recorded end, answered from that
/// record when sent again.
pub async fn a_call_outlives_its_request_timeout(h: &Harness) {
    let slow = json!({"tool": "credit", "version": 1, "idempotency_key": "k-timeout",
        "arguments": {"customer_id": "cus_1", "amount_cents": 13, "reason": "slow"}});
    let effects = h.upstream.total();
    let approval = approved(h, &slow).await;
    let sent = *h.upstream.requests.lock().unwrap();
    // Node 0's state behind a router whose request timeout (300 ms) is shorter than the
    // upstream (500 ms), and long enough for the call to reach the upstream on a busy machine
    // (at 100 ms, a loaded CI host once timed the request out before its call began, and the
    // call sent again was the first).
    let gateway = &h.nodes[0].gateway;
    let limits = warrant_server::HttpLimits {
        request_timeout: std::time::Duration::from_millis(300),
        ..gateway.limits
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let short = format!("http://{}", listener.local_addr().unwrap());
    let app = warrant_server::router(gateway.state.clone(), limits);
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let r = h
        .http
        .post(format!("{short}/v1/proposals"))
        .bearer_auth(&h.keys["agent"])
        .header("content-type", "application/json")
        .header("warrant-approval", &approval)
        .body(slow.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let cut: Value = r.json().await.unwrap();
    assert_eq!(cut["error"]["code"], "TIMEOUT", "{cut}");
    // The request was cut while its call was under way at the upstream.
    assert_eq!(
        *h.upstream.requests.lock().unwrap(),
        sent + 1,
        "the call had begun"
    );
    server.abort();
    // The call still runs to its recorded end.
    assert_replayed_once_finished(h, &slow, &approval).await;
    assert_eq!(h.upstream.total(), effects + 1, "one effect");
}

/// After a reviewer rejects a call, the identical call is answered with that rejection and
/// its reason, instead of a new request for the reviewers.
pub async fn a_rejected_call_is_not_sent_for_review_again(h: &Harness) {
    let call = credit(77, "k-rejected");
    let (status, body) = h.propose("agent", &call).await;
    assert_eq!(status, 202, "{body}");
    let id = body["approval"]["id"].as_str().unwrap().to_owned();
    let r = h
        .req(Method::POST, &format!("/v1/approvals/{id}/reject"), "reviewer")
        .json(&json!({"reason": "not for this customer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, body) = h.propose("agent", &call).await;
    assert_eq!(body["error"]["code"], "APPROVAL_REJECTED", "{body}");
    assert!(status == 403 || status == 409 || status == 422, "{status} {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("not for this customer") && message.contains(&id),
        "{message}"
    );
    // No new request was made.
    let pending = h
        .req(Method::GET, "/v1/approvals?status=pending", "reviewer")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let same: Vec<&Value> = pending["approvals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|a| a["idempotency_key"] == "k-rejected")
                .collect()
        })
        .unwrap_or_default();
    assert!(same.is_empty(), "{pending}");
    // Presented with the rejected approval, as a retrying agent does: the reason too.
    let (_, body) = h
        .propose_with(0, "agent", &call, &[("warrant-approval", id.as_str())])
        .await;
    assert_eq!(body["error"]["code"], "APPROVAL_REJECTED", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("not for this customer") && message.contains(&id),
        "{message}"
    );
    // Another call (other arguments) is sent for review as usual.
    let (status, _) = h.propose("agent", &credit(78, "k-rejected-2")).await;
    assert_eq!(status, 202);
}

/// A workflow for the harness's contracts: `lookup` (a read) then, after a review, `credit`.
fn workflow_doc(name: &str, reviewed: bool) -> String {
    let (first, review) = if reviewed {
        (
            "review",
            "  - id: review\n    review: { covers: [credit], reviewers: { role: supervisor } }\n    on_approve: credit\n    on_reject: done\n",
        )
    } else {
        ("credit", "")
    };
    format!(
        "name: {name}\nversion: 1\ndescription: Credit after a lookup.\ninput:\n  type: object\n  additionalProperties: false\n  \
         required: [customer_id, order_id]\n  properties:\n    customer_id: {{ type: string, maxLength: 36 }}\n    \
         order_id: {{ type: string, maxLength: 20 }}\nsteps:\n  - id: look\n    tool: lookup@1\n    \
         with: {{ order_id: \"${{input.order_id}}\" }}\n    next: {first}\n{review}  - id: credit\n    tool: credit@1\n    \
         with: {{ customer_id: \"${{input.customer_id}}\", amount_cents: \"${{steps.look.output.total_cents}}\", reason: goodwill }}\n    \
         next: done\n  - id: done\n    end: {{ status: completed }}\n"
    )
}

pub async fn admins_publish_only_workflows_the_compiler_accepts(h: &Harness) {
    let post = |who: &str, body: String| {
        h.req(Method::POST, "/v1/workflows", who)
            .header("content-type", "application/yaml")
            .body(body)
    };
    // An agent only proposes.
    let r = post("agent", workflow_doc("refund", true)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // Gate A refuses a credit without a review, naming the path, and nothing is stored.
    let r = post("admin", workflow_doc("refund", false)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    assert_error_shape(&body);
    assert_eq!(body["error"]["code"], "WORKFLOW_REFUSED");
    assert_eq!(body["violations"][0]["rule"], "gate_a.unreviewed_path");
    assert_eq!(body["violations"][0]["path"], "entry → look → credit");
    // A grammar problem names its pointer.
    let r = post(
        "admin",
        workflow_doc("refund", true).replace("tool: lookup@1", "tool: lookup"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "WORKFLOW_INVALID");
    assert_eq!(body["violations"][0]["pointer"], "/steps/0/tool");

    // Accepted: pinned to the content ids the tenant's calls resolve to.
    let r = post("admin", workflow_doc("refund", true)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let published: Value = r.json().await.unwrap();
    assert!(
        published["pinned"]["credit"]
            .as_str()
            .unwrap()
            .starts_with("tool-contract@sha256:")
    );
    assert_eq!(published["coverage"][1]["step"], "credit");
    assert_eq!(published["coverage"][1]["reviews"], json!(["review"]));
    assert_eq!(published["published_by"], "root");
    // The same definition again: unchanged; another under the same version: 409.
    let r = post("admin", workflow_doc("refund", true)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let changed = workflow_doc("refund", true).replace("Credit after a lookup.", "Another.");
    let r = post("admin", changed).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);

    // Listed and shown in the tenant; invisible to another tenant.
    let r = h.req(Method::GET, "/v1/workflows", "agent").send().await.unwrap();
    let list: Value = r.json().await.unwrap();
    assert_eq!(list["workflows"].as_array().unwrap().len(), 1);
    let r = h
        .req(Method::GET, "/v1/workflows/refund/1", "agent")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let shown: Value = r.json().await.unwrap();
    assert_eq!(shown["definition"]["steps"][0]["id"], "look");
    assert_eq!(shown["digest"], published["digest"]);
    let r = h
        .req(Method::GET, "/v1/workflows/refund/1", "other_admin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = h
        .req(Method::GET, "/v1/workflows", "other_admin")
        .send()
        .await
        .unwrap();
    let list: Value = r.json().await.unwrap();
    assert_eq!(list["workflows"], json!([]));
}

/// Publishes a workflow definition as the tenant's admin (201).
async fn publish(h: &Harness, definition: impl Into<reqwest::Body>) {
    let r = h
        .req(Method::POST, "/v1/workflows", "admin")
        .header("content-type", "application/yaml")
        .body(definition)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
}

/// Starts a run at `path` with `input` as the agent; the answer to the POST.
async fn start_run(h: &Harness, path: &str, input: Value) -> reqwest::Response {
    h.req(Method::POST, path, "agent")
        .header("content-type", "application/json")
        .body(input.to_string())
        .send()
        .await
        .unwrap()
}

/// Starts a run (the answer to its POST) and polls it until it waits for a review.
async fn waiting_run(h: &Harness, started: reqwest::Response) -> Value {
    assert_eq!(started.status().as_u16(), 201);
    let started: Value = started.json().await.unwrap();
    let id = started["id"].as_str().unwrap();
    for _ in 0..200 {
        let r = h
            .req(Method::GET, &format!("/v1/runs/{id}"), "agent")
            .send()
            .await
            .unwrap();
        let run: Value = r.json().await.unwrap();
        match run["status"].as_str() {
            Some("waiting") => return run,
            Some("running") => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            _ => panic!("run {id} ended before its review: {run:#}"),
        }
    }
    panic!("run {id} did not reach its review");
}

/// Polls a run until it has ended (or 20 s pass).
async fn finished_run(h: &Harness, id: &str) -> Value {
    for _ in 0..200 {
        let r = h
            .req(Method::GET, &format!("/v1/runs/{id}"), "agent")
            .send()
            .await
            .unwrap();
        let run: Value = r.json().await.unwrap();
        if !matches!(run["status"].as_str(), Some("running" | "waiting")) {
            return run;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("run {id} did not end");
}

pub async fn runs_execute_tool_branch_and_review_steps_through_the_pipeline(h: &Harness) {
    let runner = warrant_server::runs::spawn_runner(h.nodes[0].gateway.state.clone());
    let doc = "name: triage\nversion: 1\ndescription: Look an order up and branch on its status.\ninput:\n  type: object\n  \
               additionalProperties: false\n  required: [order_id]\n  properties:\n    order_id: { type: string, maxLength: 20 }\n\
               steps:\n  - id: look\n    tool: lookup@1\n    with: { order_id: \"${input.order_id}\" }\n    next: paid\n  \
               - id: paid\n    branch:\n      cases: [{ when: \"steps.look.output.status == 'paid' && steps.look.output.total_cents > 1000\", next: again }]\n      else: unpaid\n  \
               - id: again\n    tool: lookup@1\n    with: { order_id: \"${steps.look.output.order_id}\" }\n    next: done\n  \
               - id: unpaid\n    end: { status: failed }\n  - id: done\n    end: { status: completed }\n";
    publish(h, doc).await;
    let start = |input: Value| {
        h.req(Method::POST, "/v1/workflows/triage/1/runs", "agent")
            .header("content-type", "application/json")
            .body(input.to_string())
    };
    // The input is held to the workflow's input schema.
    let r = start(json!({"order_id": "ord_1234", "extra": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let r = start(json!({"order_id": "ord_1234"})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let started: Value = r.json().await.unwrap();
    assert_eq!(started["status"], "running");
    let run = finished_run(h, started["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let steps: Vec<(&str, &str)> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        steps,
        vec![
            ("look", "completed"),
            ("paid", "completed"),
            ("again", "completed"),
            ("done", "completed")
        ]
    );
    assert_eq!(run["steps"][1]["detail"], "case 1");
    assert_eq!(run["steps"][2]["output"]["order_id"], "ord_1234");
    // Each tool step is a call through the pipeline: its ledger row names the run and step.
    let ledger_id = run["steps"][0]["ledger_id"].as_str().unwrap();
    let r = h
        .req(Method::GET, &format!("/v1/ledger/{ledger_id}"), "admin")
        .send()
        .await
        .unwrap();
    let row: Value = r.json().await.unwrap();
    assert_eq!(row["run_id"], run["id"]);
    assert_eq!(row["step_id"], "look");
    assert_eq!(row["outcome"], "committed");
    // Listed in the tenant, invisible to another.
    let r = h.req(Method::GET, "/v1/runs", "agent").send().await.unwrap();
    let list: Value = r.json().await.unwrap();
    assert!(
        list["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == run["id"])
    );
    let r = h
        .req(
            Method::GET,
            &format!("/v1/runs/{}", run["id"].as_str().unwrap()),
            "other_admin",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // A review step: the run asks for the approval of the credit's exact call, waits, and
    // applies the credit once after a second principal approves it over HTTP.
    let r = h
        .req(Method::POST, "/v1/workflows", "admin")
        .header("content-type", "application/yaml")
        .body(workflow_doc("refund", true))
        .send()
        .await
        .unwrap();
    assert!(matches!(r.status().as_u16(), 200 | 201));
    let start_refund = |customer: &str| {
        h.req(Method::POST, "/v1/workflows/refund/1/runs", "agent")
            .header("content-type", "application/json")
            .body(json!({"customer_id": customer, "order_id": "ord_5678"}).to_string())
    };
    let effects_before = h.upstream.total();
    let approved = waiting_run(h, start_refund("cus_approved").send().await.unwrap()).await;
    // The runs counter counts the run parked on its review.
    let metrics = h
        .http
        .get(format!("{}/metrics", h.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("warrant_workflow_runs_total{event=\"waiting\"}"),
        "{metrics}"
    );
    let approval = approved["steps"][1]["output"]["approvals"]["credit"].clone();
    let approval_id = approval["approval_id"].as_str().unwrap().to_owned();
    assert!(
        approval["payload_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    // The approval shows the exact arguments the credit will run with.
    let r = h
        .req(Method::GET, &format!("/v1/approvals/{approval_id}"), "reviewer")
        .send()
        .await
        .unwrap();
    let shown: Value = r.json().await.unwrap();
    assert_eq!(shown["arguments"]["amount_cents"], 1200, "{shown:#}");
    // The principal that started the run cannot approve its own call.
    assert_ne!(h.approve_on(0, "agent", &approval_id).await, 200);
    assert_eq!(h.approve_on(0, "reviewer", &approval_id).await, 200);
    let run = finished_run(h, approved["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let steps: Vec<(&str, &str)> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        steps,
        vec![
            ("look", "completed"),
            ("review", "waiting"),
            ("review", "approved"),
            ("credit", "completed"),
            ("done", "completed")
        ]
    );
    assert_eq!(h.upstream.total(), effects_before + 1);
    // The approval was consumed by that one call.
    let r = h
        .req(Method::GET, &format!("/v1/approvals/{approval_id}"), "reviewer")
        .send()
        .await
        .unwrap();
    let consumed: Value = r.json().await.unwrap();
    assert_eq!(consumed["status"], "consumed", "{consumed:#}");

    // Rejected: the reject route, and no credit.
    let rejected = waiting_run(h, start_refund("cus_rejected").send().await.unwrap()).await;
    let id = rejected["steps"][1]["output"]["approvals"]["credit"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = h
        .req(Method::POST, &format!("/v1/approvals/{id}/reject"), "reviewer")
        .json(&json!({"reason": "not this one"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let run = finished_run(h, rejected["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["steps"][2]["status"], "rejected");
    assert_eq!(run["steps"][3]["step"], "done");
    assert_eq!(h.upstream.total(), effects_before + 1);

    // Expired: `on_expiry: fail` fails the run (the default follows `on_reject`).
    let expiring = workflow_doc("expiring", true).replace(
        "reviewers: { role: supervisor } }",
        "reviewers: { role: supervisor }, expires_in: 1s, on_expiry: fail }",
    );
    publish(h, expiring).await;
    let waiting = waiting_run(
        h,
        start_run(
            h,
            "/v1/workflows/expiring/1/runs",
            json!({"customer_id": "cus_expired", "order_id": "ord_5678"}),
        )
        .await,
    )
    .await;
    let run = finished_run(h, waiting["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(run["error"].as_str().unwrap().contains("expired"), "{run:#}");
    assert_eq!(h.upstream.total(), effects_before + 1);

    // Cancelled while waiting: an approval given afterwards runs nothing.
    let waiting = waiting_run(h, start_refund("cus_cancelled").send().await.unwrap()).await;
    let run_id = waiting["id"].as_str().unwrap();
    let id = waiting["steps"][1]["output"]["approvals"]["credit"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancel = |who: &str| {
        h.req(Method::POST, &format!("/v1/runs/{run_id}/cancel"), who)
            .send()
    };
    assert_eq!(cancel("reviewer").await.unwrap().status().as_u16(), 403);
    let r = cancel("agent").await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let cancelled: Value = r.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancel("agent").await.unwrap().status().as_u16(), 409);
    assert_eq!(h.approve_on(0, "reviewer", &id).await, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = h
        .req(Method::GET, &format!("/v1/runs/{run_id}"), "agent")
        .send()
        .await
        .unwrap();
    let after: Value = r.json().await.unwrap();
    assert_eq!(after["status"], "cancelled");
    assert_eq!(after["steps"].as_array().unwrap().len(), 2);
    assert_eq!(h.upstream.total(), effects_before + 1);

    // Revoked: a run acts for the principal that started it; once every key of that principal
    // is revoked, its next acting step stops the run, and an approval runs nothing.
    let r = h
        .req(Method::POST, "/v1/keys", "admin")
        .json(&json!({"principal": "temp-7", "grants": ["orders:read", "credits:write"], "roles": ["agent"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let made: Value = r.json().await.unwrap();
    let temp = made["key"].as_str().unwrap().to_owned();
    let r = h
        .http
        .post(format!("{}/v1/workflows/refund/1/runs", h.nodes[0].base))
        .bearer_auth(&temp)
        .json(&json!({"customer_id": "cus_revoked", "order_id": "ord_5678"}))
        .send()
        .await
        .unwrap();
    let waiting = waiting_run(h, r).await;
    let id = waiting["steps"][1]["output"]["approvals"]["credit"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = h
        .req(
            Method::DELETE,
            &format!("/v1/keys/{}", made["id"].as_str().unwrap()),
            "admin",
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(h.approve_on(0, "reviewer", &id).await, 200);
    let run = finished_run(h, waiting["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(run["error"].as_str().unwrap().contains("revoked"), "{run:#}");
    assert_eq!(h.upstream.total(), effects_before + 1);
    runner.abort();
}

/// A model step: the stub chat model proposes the credit's arguments; the proposal passes the
/// strict parser and the pipeline's stages, the review shows those exact arguments, and the
/// approved credit runs once; the tokens are the step's cost. Hostile proposals (extra
/// fields, duplicate keys, strings for numbers, a spliced envelope field, two calls, none, a
/// policy-denied amount) fail the run with the typed refusal, and nothing is credited.
pub async fn model_steps_propose_through_the_strict_parser_and_policy(h: &Harness) {
    use crate::support::model_calls;
    let runner = warrant_server::runs::spawn_runner(h.nodes[0].gateway.state.clone());
    let doc = "name: drafted\nversion: 1\ndescription: A model drafts a credit; a supervisor reviews it.\n\
               input:\n  type: object\n  additionalProperties: false\n  required: [customer_id, complaint]\n  properties:\n    \
               customer_id: { type: string, maxLength: 36 }\n    complaint: { type: string, maxLength: 200 }\n\
               steps:\n  - id: draft\n    model: { propose: credit@1, prompt: \"Propose a credit for: ${input.complaint}\" }\n    next: review\n  \
               - id: review\n    review: { covers: [apply], reviewers: { role: supervisor }, expires_in: 2h }\n    on_approve: apply\n    on_reject: done\n  \
               - id: apply\n    tool: credit@1\n    with: { customer_id: \"${input.customer_id}\", amount_cents: \"${steps.draft.arguments.amount_cents}\", reason: \"${steps.draft.arguments.reason}\" }\n    next: done\n  \
               - { id: done, end: { status: completed } }\n";
    publish(h, doc).await;
    let start = || {
        h.req(Method::POST, "/v1/workflows/drafted/1/runs", "agent")
            .header("content-type", "application/json")
            .body(json!({"customer_id": "cus_42", "complaint": "parcel arrived broken"}).to_string())
    };
    let effects_before = h.upstream.total();

    // The model's proposal, accepted: the review shows its exact arguments.
    let waiting = waiting_run(h, start().send().await.unwrap()).await;
    assert_eq!(waiting["steps"][0]["step"], "draft");
    assert_eq!(waiting["steps"][0]["status"], "completed", "{waiting:#}");
    assert_eq!(waiting["steps"][0]["cost"], 120);
    assert_eq!(waiting["steps"][0]["output"]["arguments"]["amount_cents"], 750);
    let (auth, request) = h.upstream.model_requests.lock().unwrap().last().cloned().unwrap();
    assert_eq!(auth.as_deref(), Some("Bearer sk-stub"));
    assert_eq!(
        request["messages"][1]["content"],
        "Propose a credit for: parcel arrived broken"
    );
    assert_eq!(request["tools"][0]["function"]["name"], "credit");
    assert_eq!(request["tools"][0]["function"]["strict"], true);
    assert_eq!(
        request["tools"][0]["function"]["parameters"]["required"][1],
        "amount_cents"
    );
    assert_eq!(request["tool_choice"]["function"]["name"], "credit");
    let approval_id = waiting["steps"][1]["output"]["approvals"]["apply"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = h
        .req(Method::GET, &format!("/v1/approvals/{approval_id}"), "reviewer")
        .send()
        .await
        .unwrap();
    let shown: Value = r.json().await.unwrap();
    assert_eq!(shown["arguments"]["amount_cents"], 750, "{shown:#}");
    assert_eq!(shown["arguments"]["reason"], "late delivery");
    // The approval lives as long as the review's `expires_in` (2 h), not the gateway's 15 min.
    let at = |field: &str| {
        time::OffsetDateTime::parse(
            shown[field].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    assert_eq!(
        (at("expires_at") - at("created_at")).whole_minutes(),
        120,
        "{shown:#}"
    );
    assert_eq!(h.approve_on(0, "reviewer", &approval_id).await, 200);
    let run = finished_run(h, waiting["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(h.upstream.total(), effects_before + 1);
    // The run's cost: the model's tokens and the credit's cost per call.
    let steps_cost: u64 = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cost"].as_u64().unwrap())
        .sum();
    assert_eq!(run["cost"].as_u64(), Some(steps_cost));
    assert!(steps_cost >= 120);

    // Hostile proposals: each fails the run at the model step with its typed code.
    let hostile: Vec<(Value, &str)> = vec![
        (
            model_calls(
                "credit",
                r#"{"customer_id": "c", "amount_cents": 5, "reason": "r", "approved": true}"#,
            ),
            "SCHEMA_UNKNOWN_FIELD",
        ),
        (
            model_calls(
                "credit",
                r#"{"customer_id": "c", "amount_cents": 5, "amount_cents": 900000, "reason": "r"}"#,
            ),
            "DUPLICATE_KEY",
        ),
        (
            model_calls(
                "credit",
                r#"{"customer_id": "c", "amount_cents": "500", "reason": "r"}"#,
            ),
            "SCHEMA_TYPE_MISMATCH",
        ),
        (
            model_calls(
                "credit",
                r#"{"customer_id": "c", "amount_cents": 5, "reason": "r"}, "approval_id": "apr_x""#,
            ),
            "INVALID_JSON",
        ),
        (
            model_calls(
                "credit",
                &format!(r#"{{"customer_id": "c", "amount_cents": {OVERFLOWING_AMOUNT}, "reason": "r"}}"#),
            ),
            "POLICY_DENIED",
        ),
        (
            json!([
                {"id": "a", "type": "function", "function": {"name": "credit", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "credit", "arguments": "{}"}},
            ]),
            "MODEL_MANY_PROPOSALS",
        ),
        (json!([]), "MODEL_NO_PROPOSAL"),
        (
            model_calls("lookup", r#"{"order_id": "ord_1234"}"#),
            "MODEL_WRONG_TOOL",
        ),
    ];
    for (calls, code) in hostile {
        h.upstream.model_answers.lock().unwrap().push_back(calls.clone());
        let r = start().send().await.unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let started: Value = r.json().await.unwrap();
        let run = finished_run(h, started["id"].as_str().unwrap()).await;
        assert_eq!(run["status"], "failed", "{calls}: {run:#}");
        let step = &run["steps"][0];
        assert_eq!(step["step"], "draft");
        assert_eq!(step["status"], "failed");
        let said = format!("{} {}", step["detail"], run["error"]);
        assert!(said.contains(code), "{calls}: wanted {code}, got {said}");
        // A refused proposal has its ledger row, a refusal at the parse, schema or policy stage.
        if let Some(ledger_id) = step["ledger_id"].as_str() {
            let r = h
                .req(Method::GET, &format!("/v1/ledger/{ledger_id}"), "admin")
                .send()
                .await
                .unwrap();
            let row: Value = r.json().await.unwrap();
            assert_eq!(row["decision"], "reject", "{row:#}");
            assert_eq!(row["error_code"], code);
            assert_eq!(row["run_id"], run["id"]);
        } else {
            assert!(code.starts_with("MODEL_"), "{code} has no ledger row");
        }
    }
    assert_eq!(h.upstream.total(), effects_before + 1);

    // A review's `reviewers` narrows who policy allows: a supervisor it does not name can
    // neither see nor decide the approval.
    let named = doc.replace("name: drafted", "name: named").replace(
        "reviewers: { role: supervisor }",
        "reviewers: { principals: [sup-9] }",
    );
    publish(h, named).await;
    let waiting = waiting_run(
        h,
        start_run(
            h,
            "/v1/workflows/named/1/runs",
            json!({"customer_id": "cus_43", "complaint": "late"}),
        )
        .await,
    )
    .await;
    let id = waiting["steps"][1]["output"]["approvals"]["apply"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = h.stored_approval(&id).await;
    assert_eq!(
        stored.request.reviewers,
        Some(warrant_core::records::ReviewerRule::Principals(vec![
            "sup-9".into()
        ]))
    );
    let decided = h.approve_on(0, "reviewer", &id).await;
    assert!(decided == 403 || decided == 404, "{decided}");
    let r = h
        .req(Method::GET, "/v1/approvals?status=pending", "reviewer")
        .send()
        .await
        .unwrap();
    let listed: Value = r.json().await.unwrap();
    assert!(!listed.to_string().contains(&id), "{listed:#}");
    runner.abort();
}

/// The built-in `workflow_validator` tool (the example contract) is a governed read call that
/// answers the compiler's verdict for the caller's tenant: the same refusals — Gate A with its
/// path — as publishing, and nothing is published.
pub async fn the_workflow_validator_tool_answers_the_compilers_verdict(h: &Harness) {
    let refused = "name: sneaky\nversion: 1\ndescription: Credit small amounts without review.\ninput:\n  type: object\n  \
                   additionalProperties: false\n  required: [customer_id, amount_cents]\n  properties:\n    \
                   customer_id: { type: string, maxLength: 36 }\n    amount_cents: { type: integer, minimum: 1, maximum: 500000 }\n\
                   steps:\n  - id: size\n    branch:\n      cases: [{ when: \"input.amount_cents > 10000\", next: review }]\n      else: pay\n  \
                   - id: review\n    review: { covers: [pay], reviewers: { role: supervisor } }\n    on_approve: pay\n    on_reject: done\n  \
                   - id: pay\n    tool: credit@1\n    with: { customer_id: \"${input.customer_id}\", amount_cents: \"${input.amount_cents}\", reason: goodwill }\n    next: done\n  \
                   - { id: done, end: { status: completed } }\n";
    let validate = |definition: &str| json!({"tool": "workflow_validator", "version": 1, "arguments": {"definition": definition}});
    let (status, body) = h.propose("agent", &validate(refused)).await;
    assert_eq!(status, 200, "{body:#}");
    let result = &body["result"];
    assert_eq!(result["valid"], false, "{body:#}");
    assert_eq!(result["code"], "WORKFLOW_REFUSED");
    let v = &result["violations"][0];
    assert!(v["rule"].as_str().unwrap().starts_with("gate_a."), "{v:#}");
    assert_eq!(v["step"], "pay");
    assert!(
        v["path"].as_str().unwrap().contains("branch(size: else)"),
        "{v:#}"
    );
    // The fixed definition is valid, with the credit's coverage.
    let fixed = refused.replace("else: pay", "else: review");
    let (status, body) = h.propose("agent", &validate(&fixed)).await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["result"]["valid"], true, "{body:#}");
    assert_eq!(body["result"]["coverage"][0]["step"], "pay");
    assert_eq!(body["result"]["coverage"][0]["reviews"], json!(["review"]));
    // Grammar and syntax refusals are verdicts too.
    let (_, body) = h
        .propose("agent", &validate("name: x\nversion: 1\nstepz: []\n"))
        .await;
    assert_eq!(body["result"]["code"], "WORKFLOW_INVALID", "{body:#}");
    let (_, body) = h.propose("agent", &validate("{ not yaml")).await;
    assert_eq!(body["result"]["code"], "WORKFLOW_SYNTAX", "{body:#}");
    // Nothing was published.
    let r = h.req(Method::GET, "/v1/workflows", "admin").send().await.unwrap();
    let list: Value = r.json().await.unwrap();
    assert!(
        !list["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["name"] == "sneaky"),
        "{list:#}"
    );
}

/// Two nodes on one PostgreSQL database, each with its runner, run many three-step runs
/// started on either: every run completes, and every tool step's call reached the tool
/// exactly once (no step is executed twice, however the nodes race for the jobs).
pub async fn two_nodes_run_each_step_once(h: &Harness) {
    let runners: Vec<_> = h
        .nodes
        .iter()
        .map(|n| warrant_server::runs::spawn_runner(n.gateway.state.clone()))
        .collect();
    let doc = "name: thrice\nversion: 1\ndescription: Three lookups.\ninput:\n  type: object\n  \
               additionalProperties: false\n  required: [order_id]\n  properties:\n    order_id: { type: string, maxLength: 20 }\n\
               steps:\n  - id: one\n    tool: lookup@1\n    with: { order_id: \"${input.order_id}\" }\n    next: two\n  \
               - id: two\n    tool: lookup@1\n    with: { order_id: \"${steps.one.output.order_id}\" }\n    next: three\n  \
               - id: three\n    tool: lookup@1\n    with: { order_id: \"${steps.two.output.order_id}\" }\n    next: done\n  \
               - { id: done, end: { status: completed } }\n";
    publish(h, doc).await;
    let before = *h.upstream.requests.lock().unwrap();
    const RUNS: usize = 40;
    let mut ids = Vec::new();
    for i in 0..RUNS {
        let r = h
            .req_on(i % 2, Method::POST, "/v1/workflows/thrice/1/runs", "agent")
            .header("content-type", "application/json")
            .body(json!({"order_id": format!("ord_{i:04}")}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let run: Value = r.json().await.unwrap();
        ids.push(run["id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let run = finished_run(h, id).await;
        assert_eq!(run["status"], "completed", "{run:#}");
        let steps: Vec<&str> = run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["step"].as_str().unwrap())
            .collect();
        assert_eq!(steps, ["one", "two", "three", "done"], "{run:#}");
    }
    assert_eq!(
        *h.upstream.requests.lock().unwrap() - before,
        u32::try_from(3 * RUNS).unwrap(),
        "a step reached the tool more than once"
    );
    // Each step has one ledger row of its call.
    let rows = h
        .store
        .list_ledger(
            "acme",
            &warrant_core::records::LedgerFilter {
                tool: Some("lookup".into()),
                limit: 500,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut per_step = std::collections::HashMap::new();
    for row in rows
        .entries
        .iter()
        .filter(|r| r.run_id.as_ref().is_some_and(|r| ids.contains(r)))
    {
        *per_step
            .entry((row.run_id.clone(), row.step_id.clone()))
            .or_insert(0) += 1;
    }
    assert_eq!(per_step.len(), 3 * RUNS);
    assert!(per_step.values().all(|n| *n == 1), "{per_step:?}");
    for r in runners {
        r.abort();
    }
}
