//! The reviewer console over HTTP: sign-in (key and one-time link), the security headers, the
//! inbox, an approval's page and its decision forms (CSRF, reasons, the proposer, another
//! tenant), the ledger, runs and contracts pages, sign-out.

use reqwest::Method;
use reqwest::header::{HeaderMap, LOCATION, SET_COOKIE};
use serde_json::{Value, json};

use crate::support::{Harness, credit};

/// A browser's cookies, kept by hand (name → value).
#[derive(Default, Clone)]
struct Jar(Vec<(String, String)>);

impl Jar {
    fn take(&mut self, headers: &HeaderMap) {
        for v in headers.get_all(SET_COOKIE) {
            let text = v.to_str().unwrap();
            let (pair, attrs) = text.split_once(';').unwrap_or((text, ""));
            let (name, value) = pair.split_once('=').unwrap();
            self.0.retain(|(n, _)| n != name);
            if !value.is_empty() && !attrs.contains("Max-Age=0") {
                self.0.push((name.to_owned(), value.to_owned()));
            }
        }
    }

    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A browser-like client: no redirects followed, cookies kept.
struct Browser<'h> {
    h: &'h Harness,
    http: reqwest::Client,
    jar: Jar,
}

struct Page {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Page {
    fn location(&self) -> &str {
        self.headers.get(LOCATION).map_or("", |v| v.to_str().unwrap())
    }

    /// The value of the first hidden `csrf` field.
    fn csrf(&self) -> String {
        let at = self.body.find(r#"name="csrf" value=""#).expect("a csrf field");
        let rest = &self.body[at + r#"name="csrf" value=""#.len()..];
        rest[..rest.find('"').unwrap()].to_owned()
    }
}

impl<'h> Browser<'h> {
    fn new(h: &'h Harness) -> Self {
        Browser {
            h,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            jar: Jar::default(),
        }
    }

    async fn send(&mut self, method: Method, path: &str, form: Option<&[(&str, &str)]>) -> Page {
        let mut b = self
            .http
            .request(method, format!("{}{path}", self.h.base()))
            .header("cookie", self.jar.header());
        if let Some(form) = form {
            let body: Vec<String> = form
                .iter()
                .map(|(k, v)| format!("{k}={}", urlencode(v)))
                .collect();
            b = b
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.join("&"));
        }
        let r = b.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        self.jar.take(&headers);
        Page {
            status,
            headers,
            body: r.text().await.unwrap(),
        }
    }

    async fn get(&mut self, path: &str) -> Page {
        self.send(Method::GET, path, None).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        self.send(Method::POST, path, Some(form)).await
    }

    /// Signs in with `who`'s key through the sign-in form.
    async fn sign_in(&mut self, who: &str) {
        let form = self.get("/console/signin").await;
        assert_eq!(form.status, 200);
        let key = self.h.keys[who].clone();
        let done = self
            .post(
                "/console/signin",
                &[
                    ("csrf", &form.csrf()),
                    ("key", &key),
                    ("next", "/console/approvals"),
                ],
            )
            .await;
        assert_eq!(
            (done.status, done.location()),
            (303, "/console/approvals"),
            "{}",
            done.body
        );
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn the_console_signs_reviewers_in_and_decides_through_the_pipeline(h: &Harness) {
    // Not signed in: sent to the sign-in page, with the way back.
    let mut reviewer = Browser::new(h);
    let page = reviewer.get("/console/approvals").await;
    assert_eq!(
        (page.status, page.location()),
        (303, "/console/signin?next=/console/approvals")
    );

    // The sign-in page: security headers, an anti-forgery token bound to a cookie.
    let form = reviewer.get("/console/signin").await;
    let csp = form.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(form.headers["x-frame-options"], "DENY");
    let set = form.headers[SET_COOKIE].to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let csrf = form.csrf();
    // A key is refused without the form's token, and a wrong key is a 401.
    let key = h.keys["reviewer"].clone();
    let mut stranger = Browser::new(h);
    let refused = stranger
        .post("/console/signin", &[("csrf", &csrf), ("key", &key)])
        .await;
    assert_eq!(refused.status, 403);
    let refused = stranger.post("/console/signin", &[("key", &key)]).await;
    assert_eq!(refused.status, 403);
    let wrong = reviewer
        .post(
            "/console/signin",
            &[
                ("csrf", &csrf),
                (
                    "key",
                    "wrn_0000000000000000_0000000000000000000000000000000000000000000000000000000000000000",
                ),
            ],
        )
        .await;
    assert_eq!(wrong.status, 401);
    let form = reviewer.get("/console/signin").await;
    let done = reviewer
        .post("/console/signin", &[("csrf", &form.csrf()), ("key", &key)])
        .await;
    assert_eq!((done.status, done.location()), (303, "/console/approvals"));
    let session = done
        .headers
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("warrant_session="))
        .unwrap();
    assert!(
        session.contains("HttpOnly")
            && session.contains("SameSite=Strict")
            && session.contains("Path=/console"),
        "{session}"
    );
    assert!(!session.contains(&key));

    // An agent's call needs approval: the inbox lists it, the page shows the exact payload.
    let (status, body) = h.propose("agent", &credit(2500, "console-1")).await;
    assert_eq!(status, 202, "{body}");
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    let digest = body["approval"]["payload_digest"].as_str().unwrap().to_owned();
    let inbox = reviewer.get("/console/approvals").await;
    assert_eq!(inbox.status, 200);
    assert!(
        inbox.body.contains(&format!("/console/approvals/{approval}")),
        "{}",
        inbox.body
    );
    assert!(inbox.body.contains("(1 pending"), "{}", inbox.body);
    let count: Value = serde_json::from_str(&reviewer.get("/console/approvals/count").await.body).unwrap();
    assert_eq!(count["pending"], "1");
    let page = reviewer.get(&format!("/console/approvals/{approval}")).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("2500") && page.body.contains("Approve") && page.body.contains("Reject"));
    assert!(page.body.contains(&digest), "the page shows the payload digest");
    let csrf = page.csrf();
    // A contract with a sensitive field is not offered edits (its stored arguments hold only
    // the keyed hash), and an edit posted anyway is refused.
    assert!(!page.body.contains("Approve with edits"));
    let refused = reviewer
        .post(
            &format!("/console/approvals/{approval}/edit"),
            &[
                ("csrf", &csrf),
                ("reason", "smaller"),
                ("arg:amount_cents", "100"),
            ],
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.body);

    // The proposer sees the page without the forms, and is refused anyway.
    let mut agent = Browser::new(h);
    agent.sign_in("agent").await;
    let own = agent.get(&format!("/console/approvals/{approval}")).await;
    assert_eq!(own.status, 200);
    assert!(
        !own.body.contains("/approve\""),
        "no approve form for the proposer"
    );
    let agent_csrf = own.csrf();
    let refused = agent
        .post(
            &format!("/console/approvals/{approval}/approve"),
            &[("csrf", &agent_csrf), ("reason", "mine")],
        )
        .await;
    assert_eq!(refused.status, 403);
    // Another tenant does not learn it exists.
    let mut other = Browser::new(h);
    other.sign_in("other").await;
    assert_eq!(
        other.get(&format!("/console/approvals/{approval}")).await.status,
        404
    );
    let other_csrf = other.get("/console/approvals").await.csrf();
    let refused = other
        .post(
            &format!("/console/approvals/{approval}/approve"),
            &[("csrf", &other_csrf), ("reason", "x")],
        )
        .await;
    assert_eq!(refused.status, 404);

    // A form without its token, with another session's token, or without a reason is refused.
    let path = format!("/console/approvals/{approval}/approve");
    assert_eq!(reviewer.post(&path, &[("reason", "ok")]).await.status, 403);
    assert_eq!(
        reviewer
            .post(&path, &[("csrf", &agent_csrf), ("reason", "ok")])
            .await
            .status,
        403
    );
    assert_eq!(
        reviewer
            .post(&path, &[("csrf", &csrf), ("reason", "  ")])
            .await
            .status,
        400
    );
    assert_eq!(h.upstream.total(), 0);

    // Approved with a reason: the agent's retry executes, and the page links the execution.
    let done = reviewer
        .post(
            &path,
            &[("csrf", &csrf), ("reason", "verified the duplicate charge")],
        )
        .await;
    assert_eq!(
        (done.status, done.location()),
        (303, format!("/console/approvals/{approval}").as_str())
    );
    let (status, body) = h
        .propose_with(
            0,
            "agent",
            &credit(2500, "console-1"),
            &[("warrant-approval", &approval)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "committed");
    assert_eq!(h.upstream.total(), 1);
    let page = reviewer.get(&format!("/console/approvals/{approval}")).await;
    assert!(page.body.contains("verified the duplicate charge") && page.body.contains("Executed as"));
    assert!(
        !page.body.contains("/approve\""),
        "a decided request has no forms"
    );
    let again = reviewer
        .post(&path, &[("csrf", &csrf), ("reason", "twice")])
        .await;
    assert_eq!(again.status, 409);

    // Rejected with a reason.
    let (_, body) = h.propose("agent", &credit(9900, "console-2")).await;
    let second = body["approval"]["id"].as_str().unwrap().to_owned();
    let rejected = reviewer
        .post(
            &format!("/console/approvals/{second}/reject"),
            &[("csrf", &csrf), ("reason", "too large")],
        )
        .await;
    assert_eq!(rejected.status, 303);
    let shown: Value = h
        .req(Method::GET, &format!("/v1/approvals/{second}"), "reviewer")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (shown["status"].as_str(), shown["reason"].as_str()),
        (Some("rejected"), Some("too large"))
    );

    // The ledger, its row pages, runs and contracts render for the tenant.
    let ledger = reviewer.get("/console/ledger?tool=credit").await;
    assert_eq!(ledger.status, 200);
    assert!(ledger.body.contains("committed"), "{}", ledger.body);
    let row = h
        .store
        .list_ledger(
            "acme",
            &warrant_core::records::LedgerFilter {
                approval_id: Some(approval.clone()),
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .entries;
    assert!(!row.is_empty());
    let detail = reviewer.get(&format!("/console/ledger/{}", row[0].id)).await;
    assert_eq!(detail.status, 200);
    assert!(detail.body.contains(&row[0].trace_id));
    let by_trace = reviewer
        .get(&format!("/console/ledger?trace={}", row[0].trace_id))
        .await;
    assert!(by_trace.body.contains(&format!("/console/ledger/{}", row[0].id)));
    assert_eq!(
        other.get(&format!("/console/ledger/{}", row[0].id)).await.status,
        404
    );
    assert_eq!(reviewer.get("/console/runs").await.status, 200);
    assert_eq!(reviewer.get("/console/runs/run_missing").await.status, 404);
    let contracts = reviewer.get("/console/contracts").await;
    assert!(contracts.status == 200 && contracts.body.contains("credit"));
    assert_eq!(reviewer.get("/console/nowhere").await.status, 404);

    // Two versions of a tenant contract: the catalogue links their diff, which shows the change;
    // another tenant cannot read it.
    for (version, description) in [(1, "Answer pong."), (2, "Answer pong, politely.")] {
        let doc = format!(
            "name: ping\nversion: {version}\ndescription: {description}\nowner: test\neffect: read\n\
             scopes: [orders:read]\napproval: none\n\
             input: {{ type: object, additionalProperties: false, properties: {{}} }}\n\
             output: {{ type: object, additionalProperties: false, properties: {{}} }}\n"
        );
        let r = h
            .req(Method::POST, "/v1/contracts", "admin")
            .header("content-type", "application/yaml")
            .body(doc)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let contracts = reviewer.get("/console/contracts").await;
    let diff_path = "/console/contracts/diff?namespace=acme&name=ping&from=1&to=2";
    assert!(
        contracts.body.contains(&diff_path.replace('&', "&amp;")),
        "{}",
        contracts.body
    );
    let diff = reviewer.get(diff_path).await;
    assert_eq!(diff.status, 200, "{}", diff.body);
    assert!(
        diff.body.contains("- ") && diff.body.contains("Answer pong, politely."),
        "{}",
        diff.body
    );
    assert_eq!(other.get(diff_path).await.status, 404);

    // Sign-out ends the session server-side: the old cookie no longer works.
    let old = reviewer.jar.clone();
    let out = reviewer.post("/console/signout", &[("csrf", &csrf)]).await;
    assert_eq!((out.status, out.location()), (303, "/console/signin"));
    reviewer.jar = old;
    assert_eq!(reviewer.get("/console/approvals").await.status, 303);

    // Revoking the key ends its sessions.
    let made: Value = h
        .req(Method::POST, "/v1/keys", "admin")
        .json(&serde_json::json!({"principal": "sam", "roles": ["supervisor"], "label": "console"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (key_id, sam_key) = (
        made["id"].as_str().unwrap().to_owned(),
        made["key"].as_str().unwrap().to_owned(),
    );
    let mut sam = Browser::new(h);
    let form = sam.get("/console/signin").await;
    let done = sam
        .post("/console/signin", &[("csrf", &form.csrf()), ("key", &sam_key)])
        .await;
    assert_eq!(done.status, 303);
    assert_eq!(sam.get("/console/approvals").await.status, 200);
    let r = h
        .req(Method::DELETE, &format!("/v1/keys/{key_id}"), "admin")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_eq!(sam.get("/console/approvals").await.status, 303);

    // A one-time sign-in link: made over the API, used once.
    let made: Value = h
        .req(Method::POST, "/v1/console/links", "reviewer")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = made["url"].as_str().unwrap();
    let path = url.strip_prefix("http://warrant.test").unwrap();
    let token = path.rsplit('/').next().unwrap().to_owned();
    let mut linked = Browser::new(h);
    let form = linked.get(path).await;
    assert_eq!(form.status, 200);
    let used = linked
        .post("/console/link", &[("csrf", &form.csrf()), ("link", &token)])
        .await;
    assert_eq!((used.status, used.location()), (303, "/console/approvals"));
    assert_eq!(linked.get("/console/approvals").await.status, 200);
    let mut late = Browser::new(h);
    let form = late.get(path).await;
    let reused = late
        .post("/console/link", &[("csrf", &form.csrf()), ("link", &token)])
        .await;
    assert_eq!(reused.status, 401);
}

/// A held call's sensitive values: masked for a reviewer whom policy does not let reveal them
/// (and for the proposer, whom it does not either), in clear for one it does, exactly the
/// approved payload; the sealed copy is dropped once the request is consumed or rejected, and
/// a contract that executes on approval runs the exact call from it.
pub async fn sensitive_values_are_revealed_only_where_policy_lets(h: &Harness) {
    let token = crate::support::redaction_key().token(&json!("cus_1"));
    let (status, body) = h.propose("agent", &credit(2600, "reveal-1")).await;
    assert_eq!(status, 202, "{body}");
    let approval = body["approval"]["id"].as_str().unwrap().to_owned();
    let page_of = format!("/console/approvals/{approval}");

    // The stored request keeps the value only sealed: never in clear.
    let stored = h.stored_approval(&approval).await;
    let sealed = stored.request.sealed_arguments.clone().expect("a sealed copy");
    assert!(!sealed.contains("cus_1") && !format!("{stored:?}").contains("cus_1"));

    // A supervisor may review credits but not reveal: masked, with the keyed hash.
    let mut reviewer = Browser::new(h);
    reviewer.sign_in("reviewer").await;
    let page = reviewer.get(&page_of).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"masked\""), "{}", page.body);
    assert!(page.body.contains(&token) && !page.body.contains("cus_1"));
    // The proposer sees its request masked as well (policy does not let agents reveal).
    let mut agent = Browser::new(h);
    agent.sign_in("agent").await;
    let own = agent.get(&page_of).await;
    assert!(own.body.contains("id=\"masked\"") && !own.body.contains("cus_1"));
    // A senior supervisor may reveal: the exact payload, in clear.
    let mut senior = Browser::new(h);
    senior.sign_in("senior").await;
    let page = senior.get(&page_of).await;
    assert!(page.body.contains("id=\"revealed\""), "{}", page.body);
    assert!(page.body.contains("cus_1") && !page.body.contains(&token));
    // Each reveal is counted (and logged, never with the values).
    let metrics = h
        .http
        .get(format!("{}/metrics", h.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("warrant_console_reveals_total"), "{metrics}");
    // Each request is sealed on its own (its own nonce, bound to its own id: a copy moved to
    // another request does not open — `seal::tests`).
    let (_, other) = h.propose("agent", &credit(2601, "reveal-2")).await;
    let other_id = other["approval"]["id"].as_str().unwrap().to_owned();
    let moved = h.stored_approval(&other_id).await;
    assert!(moved.request.sealed_arguments.is_some());
    assert_ne!(moved.request.sealed_arguments.as_deref(), Some(sealed.as_str()));

    // Rejected: the sealed copy is gone, and even the senior sees the hash.
    let path = format!("/console/approvals/{other_id}/reject");
    let csrf = senior.get(&format!("/console/approvals/{other_id}")).await.csrf();
    let done = senior.post(&path, &[("csrf", &csrf), ("reason", "no")]).await;
    assert_eq!(done.status, 303, "{}", done.body);
    let rejected = h.stored_approval(&other_id).await;
    assert_eq!(rejected.request.sealed_arguments, None);
    let page = senior.get(&format!("/console/approvals/{other_id}")).await;
    assert!(page.body.contains("id=\"masked\"") && !page.body.contains("cus_1"));

    // A contract that executes on approval: the reviewer's decision runs the exact call (the
    // upstream receives the clear value), and the sealed copy is dropped with the consumption.
    let payout = json!({"tool": "payout", "version": 1, "idempotency_key": "reveal-3",
                        "arguments": {"customer_id": "cus_77", "amount_cents": 700, "reason": "refund"}});
    let (status, body) = h.propose("agent", &payout).await;
    assert_eq!(status, 202, "{body}");
    let payout_id = body["approval"]["id"].as_str().unwrap().to_owned();
    assert_eq!(h.approve_on(0, "reviewer", &payout_id).await, 200);
    let consumed = h.stored_approval(&payout_id).await;
    assert_eq!(consumed.status.as_str(), "consumed", "executed on the decision");
    assert_eq!(consumed.request.sealed_arguments, None);
    let credits = h.upstream.credits.lock().unwrap().clone();
    assert!(
        credits
            .iter()
            .any(|c| c["customer_id"] == "cus_77" && c["amount_cents"] == 700),
        "{credits:?}"
    );
    // The agent's retry answers the stored result, without a second effect.
    let before = h.upstream.total();
    let (status, body) = h
        .propose_with(0, "agent", &payout, &[("warrant-approval", &payout_id)])
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "replayed", "{body}");
    assert_eq!(h.upstream.total(), before);
}

/// A reviewer's edit is work the runtime owns: cut part way by the reviewer's request going
/// away (the request's future dropped once the edited call is held, as a disconnect or the
/// request timeout drops it), it still runs to its end — the original rejected and linked, the
/// edited request approved, the edited call executed — as it does through the API.
pub async fn an_edit_in_the_console_outlives_the_reviewers_request(h: &Harness) {
    use std::future::Future as _;
    use tower::ServiceExt as _;
    // A version of the credit tool the console offers edits on (no sensitive field), the
    // operator's (it carries the binding).
    let doc = crate::support::credit_document(h.upstream_addr, "credit", 2, "", false);
    let r = h
        .req(Method::POST, "/v1/contracts", "operator")
        .header("content-type", "application/yaml")
        .body(doc)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let call = json!({"tool": "credit", "version": 2, "idempotency_key": "k-edit-cut",
        "arguments": {"customer_id": "cus_9", "amount_cents": 9000, "reason": "refund"}});
    let (status, body) = h.propose("agent", &call).await;
    assert_eq!(status, 202, "{body}");
    let original = body["approval"]["id"].as_str().unwrap().to_owned();

    let mut reviewer = Browser::new(h);
    reviewer.sign_in("reviewer").await;
    let page = reviewer.get(&format!("/console/approvals/{original}")).await;
    assert!(page.body.contains("Approve with edits"), "{}", page.body);
    let form = [
        ("csrf", page.csrf()),
        ("reason", "a smaller credit".to_owned()),
        ("arg:customer_id", "cus_9".to_owned()),
        ("arg:amount_cents", "4500".to_owned()),
        ("arg:reason", "refund".to_owned()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}", urlencode(v)))
    .collect::<Vec<_>>()
    .join("&");
    let request = axum::http::Request::post(format!("/console/approvals/{original}/edit"))
        .header("host", "127.0.0.1")
        .header("cookie", reviewer.jar.header())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(axum::body::Body::from(form))
        .unwrap();
    let gateway = &h.nodes[0].gateway;
    let router = warrant_server::router(gateway.state.clone(), gateway.limits);
    let mut answer = Box::pin(router.oneshot(request));
    // Driven by hand, a poll at a time, until the edited call is held (a second request for
    // the key); then dropped, as the server drops a request its client left.
    let held = async || {
        let pending = h.get_json("/v1/approvals?status=pending", "reviewer").await;
        pending["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["idempotency_key"] == "k-edit-cut" && a["id"] != original.as_str())
    };
    let mut cut = false;
    for _ in 0..2_000 {
        let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(answer.as_mut().poll(cx))).await;
        if polled.is_ready() {
            break;
        }
        if held().await {
            cut = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    drop(answer);
    assert!(cut, "the edit was cut after the edited call was held");
    // The rest runs anyway: the edited amount reaches the upstream, once, and the original is
    // rejected, linked to the edited request, which is consumed by the call.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let executed = || {
        h.upstream
            .credits
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c["customer_id"] == "cus_9")
            .cloned()
            .collect::<Vec<_>>()
    };
    while executed().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let executed = executed();
    assert_eq!(executed.len(), 1, "the edited call ran once: {executed:?}");
    assert_eq!(executed[0]["amount_cents"], 4500);
    let stored = h.stored_approval(&original).await;
    assert_eq!(stored.status, warrant_core::records::ApprovalStatus::Rejected);
    let edited = stored.superseded_by.expect("linked to the edited request");
    let edited = h.stored_approval(&edited).await;
    assert_eq!(edited.status, warrant_core::records::ApprovalStatus::Consumed);
}
