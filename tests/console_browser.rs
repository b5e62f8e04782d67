//! The reviewer console in a real browser (Chromium through chromedriver) against the real
//! `warrant serve`: a supervisor signs in, sees the approval an agent's MCP call asked for,
//! opens it, approves it with a reason; the agent's retry executes once and its ledger row
//! appears; a second request is rejected; a third is approved with edits and only the edited
//! payload reaches the upstream; a form stripped of its CSRF token is refused; the
//! proposer sees no decision form and is refused; another tenant's admin gets a 404.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium`, `chromium-driver`; `.ci/run`
//! installs them and sets `WARRANT_REQUIRE_BROWSER=1`, which turns a missing browser into a
//! failure instead of a skip). With `WARRANT_UPDATE_SCREENSHOTS=1` the inbox and an approval page
//! are saved under `docs/console/`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

fn which(names: &[&str]) -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    for name in names {
        for dir in path.split(':').chain(["/usr/bin", "/usr/lib/chromium"]) {
            let candidate = Path::new(dir).join(name);
            if candidate.is_file() {
                return Some(candidate.to_string_lossy().into_owned());
            }
        }
    }
    None
}

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The loopback credit tool: the bodies it received.
async fn start_upstream() -> (SocketAddr, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/credit",
        axum::routing::post(move |body: axum::body::Bytes| {
            let seen = s.clone();
            async move {
                let args: Value = serde_json::from_slice(&body).unwrap();
                seen.lock().unwrap().push(args);
                axum::Json(json!({"credit_id": "cr_browser1", "status": "applied"}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn layout(dir: &Path, upstream: SocketAddr) -> std::path::PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let contracts = dir.join("contracts");
    let policies = dir.join("policies");
    std::fs::create_dir_all(&contracts).unwrap();
    std::fs::create_dir_all(&policies).unwrap();
    let credit =
        std::fs::read_to_string(format!("{root}/examples/contracts/create_support_credit.v1.yaml")).unwrap();
    let head = credit
        .find("\nadapter:")
        .map_or(credit.as_str(), |at| &credit[..at]);
    std::fs::write(
        contracts.join("create_support_credit.v1.yaml"),
        format!("{head}\nadapter: {{ kind: http, url: \"http://{upstream}/credit\" }}\n"),
    )
    .unwrap();
    std::fs::copy(
        format!("{root}/examples/policies/support.cedar"),
        policies.join("support.cedar"),
    )
    .unwrap();
    let config = dir.join("warrant.toml");
    std::fs::write(&config, "[network]\nallow_hosts = [\"127.0.0.1\"]\n").unwrap();
    config
}

async fn api(
    http: &reqwest::Client,
    url: &str,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Value,
) -> Value {
    let r = http
        .request(method, format!("{url}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

/// An MCP `tools/call` of the credit tool as the agent (protocol 2025-06-18: an approval is a
/// tool error naming it and its console page).
async fn mcp_credit(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    amount: u32,
    approval: Option<&str>,
) -> Value {
    let mut params = json!({"name": "create_support_credit",
        "arguments": {"customer_id": "cus_8f3k2m9q", "amount_cents": amount, "reason": "late delivery"}});
    if let Some(id) = approval {
        params["_meta"] = json!({"approval_id": id});
    }
    let r = http
        .post(format!("{url}/mcp"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).to_string())
        .send()
        .await
        .unwrap();
    r.json().await.unwrap()
}

async fn browser(driver_url: &str, chromium: &str) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"binary": chromium, "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage", "--window-size=1280,1000"]}),
    );
    let started = Instant::now();
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(driver_url)
            .await
        {
            Ok(c) => return c,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("chromedriver did not start a session: {e}"),
        }
    }
}

/// Waits until the page's main text contains `needle`.
async fn wait_text(c: &Client, needle: &str) {
    let started = Instant::now();
    loop {
        if let Ok(main) = c.find(Locator::Css("main")).await
            && let Ok(t) = main.text().await
            && t.contains(needle)
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "`{needle}` never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The page's main text (read again if the page was replaced meanwhile: the inbox reloads
/// itself when its count changes).
async fn text(c: &Client) -> String {
    let started = Instant::now();
    loop {
        match c.find(Locator::Css("main")).await {
            Ok(main) => match main.text().await {
                Ok(t) => return t,
                Err(e) => assert!(started.elapsed() < Duration::from_secs(10), "{e}"),
            },
            Err(e) => assert!(started.elapsed() < Duration::from_secs(10), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn sign_in(c: &Client, url: &str, key: &str) {
    c.goto(&format!("{url}/console/approvals")).await.unwrap();
    assert!(c.current_url().await.unwrap().path().ends_with("/console/signin"));
    c.find(Locator::Css("input[name=key]"))
        .await
        .unwrap()
        .send_keys(key)
        .await
        .unwrap();
    submit(c, "main form button[type=submit]").await;
    wait_path(c, "/console/approvals").await;
}

async fn sign_out(c: &Client) {
    submit(c, "header form button").await;
    wait_path(c, "/console/signin").await;
}

/// Clicks the submit button `css` and waits for the next page to be loaded (a click does not
/// wait for the navigation it starts).
async fn submit(c: &Client, css: &str) {
    c.execute("window.__before_submit = true;", vec![]).await.unwrap();
    c.find(Locator::Css(css)).await.unwrap().click().await.unwrap();
    let started = Instant::now();
    loop {
        let loaded = c
            .execute(
                "return window.__before_submit === undefined && document.readyState === 'complete';",
                vec![],
            )
            .await
            .unwrap_or(Value::Bool(false));
        if loaded == Value::Bool(true) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no page after clicking {css}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the browser to arrive at `path` (a click does not wait for the navigation).
async fn wait_path(c: &Client, path: &str) {
    let started = Instant::now();
    loop {
        let at = c.current_url().await.unwrap();
        if at.path() == path {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "at {at}, not {path}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn screenshot(name: &str, png: &[u8]) {
    if std::env::var_os("WARRANT_UPDATE_SCREENSHOTS").is_some() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
    }
}

#[test]
fn a_reviewer_decides_in_a_real_browser() {
    let required = std::env::var_os("WARRANT_REQUIRE_BROWSER").is_some();
    let (Some(chromium), Some(chromedriver)) = (
        which(&["chromium", "chromium-browser", "google-chrome"]),
        which(&["chromedriver"]),
    ) else {
        assert!(
            !required,
            "WARRANT_REQUIRE_BROWSER is set but chromium or chromedriver is missing"
        );
        eprintln!("skipped: no chromium/chromedriver (Debian: apt-get install chromium chromium-driver)");
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, seen) = rt.block_on(start_upstream());
    let config = layout(dir.path(), upstream);
    let served = common::serve::serve(|cmd| {
        cmd.arg("--config")
            .arg(&config)
            .arg("--contracts")
            .arg(dir.path().join("contracts"))
            .arg("--policy")
            .arg(dir.path().join("policies"))
            .arg("--data-dir")
            .arg(dir.path().join("data"));
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _driver = Driver(
        Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = served.url.clone();
    let http = common::http_client();
    rt.block_on(async {
        let admin = served.keys["admin"].clone();
        let agent = served.keys["agent"].clone();
        let operator = served.keys["operator"].clone();
        let made = api(&http, &url, reqwest::Method::POST, "/v1/keys", &admin,
            json!({"principal": "sam", "roles": ["supervisor"], "label": "reviewer"})).await;
        let supervisor = made["key"].as_str().unwrap().to_owned();
        let globex = api(&http, &url, reqwest::Method::POST, "/v1/tenants", &operator,
            json!({"id": "globex", "label": "Globex"})).await;
        let outsider = globex["admin_key"]["key"].as_str().unwrap().to_owned();

        // The agent's MCP call needs approval; the answer points at the console page.
        let answer = mcp_credit(&http, &url, &agent, 2500, None).await;
        let held = &answer["result"]["structuredContent"];
        let approval = held["approval_id"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned();
        let review_url = held["review_url"].as_str().unwrap().to_owned();
        assert!(review_url.ends_with(&format!("/console/approvals/{approval}")), "{review_url}");
        let second = mcp_credit(&http, &url, &agent, 9900, None).await;
        let second = second["result"]["structuredContent"]["approval_id"].as_str().unwrap().to_owned();

        let c = browser(&format!("http://127.0.0.1:{port}"), &chromium).await;
        sign_in(&c, &url, &supervisor).await;
        let inbox = text(&c).await;
        assert!(inbox.contains("2 pending") && inbox.contains("create_support_credit"), "{inbox}");
        screenshot("inbox.png", &c.screenshot().await.unwrap());

        // The approval page: the exact payload and digest; approved with a reason.
        c.goto(&format!("{url}/console/approvals/{approval}")).await.unwrap();
        let page = text(&c).await;
        assert!(page.contains("2500") && page.contains(held["payload_digest"].as_str().unwrap()), "{page}");
        screenshot("approval.png", &c.screenshot().await.unwrap());
        // A form stripped of its CSRF token is refused.
        c.execute(
            "document.querySelector('form[action$=\"/approve\"] input[name=csrf]').remove();\
             document.querySelector('#approve-reason').value = 'forged';\
             document.querySelector('form[action$=\"/approve\"]').submit();",
            vec![],
        )
        .await
        .unwrap();
        wait_text(&c, "Form refused").await;
        c.goto(&format!("{url}/console/approvals/{approval}")).await.unwrap();
        c.find(Locator::Css("#approve-reason")).await.unwrap()
            .send_keys("verified the duplicate charge").await.unwrap();
        submit(&c, "button.approve").await;
        let page = text(&c).await;
        assert!(page.contains("approved") && page.contains("verified the duplicate charge"), "{page}");
        assert!(seen.lock().unwrap().is_empty());

        // The agent's retry with the approval executes once; the ledger row appears.
        let done = mcp_credit(&http, &url, &agent, 2500, Some(&approval)).await;
        assert_eq!(done["result"]["isError"], false, "{done}");
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert_eq!(seen.lock().unwrap()[0]["amount_cents"], 2500);
        c.goto(&format!("{url}/console/approvals/{approval}")).await.unwrap();
        assert!(text(&c).await.contains("Executed as"));
        c.goto(&format!("{url}/console/ledger?tool=create_support_credit&outcome=committed")).await.unwrap();
        assert!(text(&c).await.contains("committed"));

        // The second request is rejected with a reason.
        c.goto(&format!("{url}/console/approvals/{second}")).await.unwrap();
        c.find(Locator::Css("#reject-reason")).await.unwrap().send_keys("too large").await.unwrap();
        submit(&c, "button.reject").await;
        let page = text(&c).await;
        assert!(page.contains("rejected") && page.contains("too large"), "{page}");
        // Approved with edits: the upstream receives the edited payload only, at once.
        let asked = mcp_credit(&http, &url, &agent, 7000, None).await;
        let fourth = asked["result"]["structuredContent"]["approval_id"].as_str().unwrap().to_owned();
        c.goto(&format!("{url}/console/approvals/{fourth}")).await.unwrap();
        c.find(Locator::Css("details.edit summary")).await.unwrap().click().await.unwrap();
        let amount = c.find(Locator::Css("#edit-arg-amount_cents")).await.unwrap();
        amount.clear().await.unwrap();
        amount.send_keys("3000").await.unwrap();
        c.find(Locator::Css("#edit-why")).await.unwrap()
            .send_keys("goodwill is capped at 30 EUR").await.unwrap();
        submit(&c, "details.edit button.approve").await;
        let page = text(&c).await;
        assert!(page.contains("consumed") && page.contains("3000") && page.contains(&fourth), "{page}");
        {
            let bodies = seen.lock().unwrap();
            assert_eq!(bodies.len(), 2, "{bodies:?}");
            assert_eq!(bodies[1]["amount_cents"], 3000);
            assert!(bodies.iter().all(|b| b["amount_cents"] != 7000));
        }
        // The original payload cannot run on that decision.
        let retried = mcp_credit(&http, &url, &agent, 7000, Some(&fourth)).await;
        assert_eq!(retried["result"]["isError"], true, "{retried}");
        assert_eq!(seen.lock().unwrap().len(), 2);
        screenshot("edited.png", &c.screenshot().await.unwrap());

        // A workflow run waiting on its review: the run page shows the graph and each step.
        let workflow = "name: goodwill\nversion: 1\ndescription: A supervisor reviews a goodwill credit before it is applied.\n\
            input:\n  type: object\n  additionalProperties: false\n  required: [customer_id, amount_cents]\n  properties:\n    \
            customer_id: { type: string, pattern: \"^cus_[a-z0-9]{8,32}$\", maxLength: 36 }\n    \
            amount_cents: { type: integer, minimum: 1, maximum: 50000 }\nsteps:\n  - id: review_credit\n    \
            review: { covers: [credit], reviewers: { role: supervisor }, expires_in: 24h }\n    on_approve: credit\n    on_reject: done\n  \
            - id: credit\n    tool: create_support_credit@1\n    \
            with: { customer_id: \"${input.customer_id}\", amount_cents: \"${input.amount_cents}\", reason: goodwill }\n    next: done\n  \
            - id: done\n    end: { status: completed }\n";
        let r = http
            .post(format!("{url}/v1/workflows"))
            .bearer_auth(&admin)
            .header("content-type", "application/yaml")
            .body(workflow)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
        let run = api(&http, &url, reqwest::Method::POST, "/v1/workflows/goodwill/1/runs", &agent,
            json!({"customer_id": "cus_8f3k2m9q", "amount_cents": 1500})).await;
        let run_id = run["id"].as_str().unwrap_or_else(|| panic!("{run}")).to_owned();
        c.goto(&format!("{url}/console/runs")).await.unwrap();
        assert!(text(&c).await.contains("Runs"));
        c.goto(&format!("{url}/console/runs/{run_id}")).await.unwrap();
        wait_text(&c, "review_credit").await;
        let page = text(&c).await;
        assert!(page.contains("credit") && page.contains("goodwill"), "{page}");
        screenshot("run.png", &c.screenshot().await.unwrap());
        sign_out(&c).await;

        // The proposer sees its request without a form, and a forged post is refused.
        let (_, third) = (
            (),
            mcp_credit(&http, &url, &agent, 4200, None).await["result"]["structuredContent"]["approval_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        sign_in(&c, &url, &agent).await;
        c.goto(&format!("{url}/console/approvals/{third}")).await.unwrap();
        let page = text(&c).await;
        assert!(page.contains("You proposed this call") && !page.contains("Approve"), "{page}");
        let status = c
            .execute_async(
                "const done = arguments[arguments.length - 1];\
                 const csrf = document.querySelector('input[name=csrf]').value;\
                 fetch(location.pathname + '/approve', {method: 'POST', headers: {'content-type': 'application/x-www-form-urlencoded'},\
                   body: 'csrf=' + encodeURIComponent(csrf) + '&reason=mine'}).then(r => done(r.status));",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(status, json!(403));
        sign_out(&c).await;

        // Another tenant's admin: the approval does not exist for them.
        sign_in(&c, &url, &outsider).await;
        c.goto(&format!("{url}/console/approvals/{third}")).await.unwrap();
        assert!(text(&c).await.contains("There is no such approval request"));
        c.close().await.unwrap();
    });
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "the approved call and the edited one, once each"
    );
}
