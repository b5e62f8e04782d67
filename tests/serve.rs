//! `warrant serve` as a user runs it: zero setup, keys printed once, the API answering, and a
//! clean exit on SIGTERM; and `warrant mcp` configured by the same `warrant.toml`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_starts_with_no_setup_answers_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // Loopback allowed, so a webhook endpoint on it can be added.
    let config = dir.path().join("warrant.toml");
    std::fs::write(&config, "[network]\nallow_hosts = [\"127.0.0.1\"]\n").unwrap();
    let mut served = common::serve::serve(|cmd| {
        cmd.arg("--data-dir").arg(dir.path()).arg("--config").arg(&config);
    });
    let url = served.url.clone();
    let agent = served.keys["agent"].clone();
    let admin = served.keys["admin"].clone();
    assert!(agent.starts_with("wrn_") && admin.starts_with("wrn_"));
    let addr = url.trim_start_matches("http://");

    let health = http(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let body = r#"{"tool":"lookup_order","version":1,"arguments":{"order_id":"ord_12345678"}}"#;
    let answer = http(
        addr,
        &format!(
            "POST /v1/proposals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    // Decided (allowed by the bundled policy) and recorded; the example's endpoint does not
    // exist here, so the call itself fails.
    assert!(answer.contains("\"decision\":\"allow\""), "{answer}");
    assert!(answer.contains("\"ledger_id\":\"led_"), "{answer}");

    // The command line over the API.
    let cli = |key: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_warrant"))
            .args(args)
            .env("WARRANT_SERVER", &url)
            .env("WARRANT_KEY", key)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, _) = cli(&admin, &["contract", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("create_support_credit@1"), "{out}");
    let credit = r#"{"tool":"create_support_credit","version":1,"idempotency_key":"cli-1","arguments":{"customer_id":"cus_8f3k2m9q","amount_cents":2500,"reason":"duplicate charge"}}"#;
    let held = http(
        addr,
        &format!(
            "POST /v1/proposals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{credit}",
            credit.len()
        ),
    );
    assert!(held.starts_with("HTTP/1.1 202"), "{held}");
    let (code, out, _) = cli(&admin, &["approvals", "list"]);
    assert_eq!(code, Some(0));
    let id = out.split_whitespace().next().unwrap().to_owned();
    assert!(id.starts_with("apr_"), "{out}");
    // The proposer cannot approve its own call; the admin (a supervisor) can.
    let (code, _, err) = cli(&agent, &["approvals", "approve", &id]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("SELF_REVIEW") || err.contains("REVIEW_FORBIDDEN"),
        "{err}"
    );
    let (code, out, err) = cli(&admin, &["approvals", "approve", &id, "--reason", "checked"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("approved"), "{out}");
    let (code, out, _) = cli(&agent, &["ledger", "tail", "-n", "5"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("create_support_credit") && out.contains("needs_approval"),
        "{out}"
    );
    let (code, out, _) = cli(
        &admin,
        &[
            "keys",
            "create",
            "--principal",
            "bot",
            "--grants",
            "orders:read",
            "--roles",
            "agent",
        ],
    );
    assert_eq!(code, Some(0));
    let key_id = out.lines().next().unwrap().trim_start_matches("id=").to_owned();
    let (code, _, _) = cli(&admin, &["keys", "revoke", &key_id]);
    assert_eq!(code, Some(0));
    // Webhook endpoints: added (the secret printed once), listed, disabled; an agent is refused.
    let (code, out, err) = cli(
        &admin,
        &[
            "webhooks",
            "add",
            "http://127.0.0.1:9/hook",
            "--event",
            "approval.requested",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let added: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"), "{out}");
    let hook = added["id"].as_str().unwrap().to_owned();
    let (code, out, _) = cli(&admin, &["webhooks", "list"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains(&hook) && out.contains("enabled") && !out.contains("whsec_"),
        "{out}"
    );
    let (code, out, _) = cli(&admin, &["webhooks", "disable", &hook]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"enabled\": false"), "{out}");
    let (code, _, err) = cli(&agent, &["webhooks", "list"]);
    assert_eq!(code, Some(1), "{err}");
    let (code, _, err) = cli(&admin, &["webhooks", "replay", "whm_nope"]);
    assert_eq!(code, Some(1), "{err}");
    // An inbound source: added with a key of its own (the secret printed once), a GitHub
    // delivery signed with it accepted, its event listed with what it did.
    let (code, out, _) = cli(
        &admin,
        &[
            "keys",
            "create",
            "--principal",
            "billing",
            "--grants",
            "orders:read",
        ],
    );
    assert_eq!(code, Some(0));
    let billing = out.lines().next().unwrap().trim_start_matches("id=").to_owned();
    let (code, out, err) = cli(
        &admin,
        &[
            "inbound",
            "add",
            "github",
            "--key-id",
            &billing,
            "--tool",
            "lookup_order@1",
            "--map",
            r#"{"order_id": "${event.order}"}"#,
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let source: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (source_id, secret) = (
        source["id"].as_str().unwrap().to_owned(),
        source["secret"].as_str().unwrap().to_owned(),
    );
    let event = r#"{"order":"ord_8f3k2m9q"}"#;
    let signature = warrant_core::inbound::sign(
        warrant_core::inbound::Provider::Github,
        &warrant_core::inbound::InboundSecret::parse(warrant_core::inbound::Provider::Github, &secret)
            .unwrap(),
        "",
        0,
        event.as_bytes(),
    );
    let delivered = http(
        addr,
        &format!(
            "POST /v1/inbound/{source_id} HTTP/1.1\r\nHost: x\r\nX-Hub-Signature-256: {signature}\r\n\
             X-GitHub-Delivery: gh-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{event}",
            event.len()
        ),
    );
    assert!(delivered.starts_with("HTTP/1.1 202"), "{delivered}");
    let (code, out, _) = cli(&admin, &["inbound", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(&source_id) && !out.contains(&secret), "{out}");
    let (code, out, _) = cli(&admin, &["inbound", "events", &source_id]);
    assert_eq!(code, Some(0));
    assert!(out.contains("gh-1"), "{out}");
    let (code, _, err) = cli(&agent, &["inbound", "list"]);
    assert_eq!(code, Some(1), "{err}");
    // Tenants are the platform operator's: a tenant admin is refused; the operator creates
    // one, gives it a key, and its admin registers a contract only it sees.
    let operator = served.keys["operator"].clone();
    let (code, _, err) = cli(&admin, &["tenants", "create", "initech"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("403"), "{err}");
    let (code, out, err) = cli(&operator, &["tenants", "create", "initech", "--label", "Initech"]);
    assert_eq!(code, Some(0), "{err}");
    let initech_admin = out
        .lines()
        .find_map(|l| l.strip_prefix("admin_key="))
        .unwrap()
        .to_owned();
    let (code, out, _) = cli(&operator, &["tenants", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("initech") && out.contains("demo"), "{out}");
    let (code, out, err) = cli(
        &operator,
        &[
            "keys",
            "create",
            "--tenant",
            "initech",
            "--principal",
            "bot",
            "--roles",
            "agent",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("key=wrn_"), "{out}");
    let (code, _, err) = cli(
        &admin,
        &["keys", "create", "--tenant", "initech", "--principal", "x"],
    );
    assert_eq!(code, Some(1), "{err}");
    let contract = dir.path().join("mine.yaml");
    std::fs::write(
        &contract,
        "name: initech_report\nversion: 1\ndescription: d\nowner: o\neffect: read\nscopes: [r]\n\
         input: { type: object, additionalProperties: false, properties: {} }\noutput: { type: object }\n",
    )
    .unwrap();
    let (code, _, err) = cli(
        &initech_admin,
        &["contract", "register", contract.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, out, _) = cli(&initech_admin, &["contract", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("initech/initech_report@1"), "{out}");
    let (code, out, _) = cli(&admin, &["contract", "list"]);
    assert_eq!(code, Some(0));
    assert!(!out.contains("initech_report"), "{out}");

    let (code, _, err) = cli("wrn_nope", &["ledger", "tail"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("401"), "{err}");

    // SIGTERM: a clean exit.
    nix_kill(served.child.id());
    let status = served.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));

    // A config file that cannot be read stops the start, naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_warrant"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            "/nonexistent.toml",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a missing config file is an error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent.toml"));
}

/// Stops a server with SIGTERM, waits for it, and answers what it wrote on stderr.
fn stop_and_read_stderr(served: &mut common::serve::Served) -> String {
    nix_kill(served.child.id());
    served.child.wait().unwrap();
    let mut err = String::new();
    if let Some(mut stderr) = served.child.stderr.take() {
        stderr.read_to_string(&mut err).unwrap();
    }
    err
}

fn nix_kill(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A directory with a store in `store/` that `warrant serve` started once (so it has its first
/// keys), and the agent key it printed.
fn store_with_keys() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let served = common::serve::serve(|cmd| {
        cmd.arg("--data-dir").arg(&store);
    });
    let agent = served.keys["agent"].clone();
    drop(served);
    (dir, store, agent)
}

/// `warrant mcp` started in a directory whose `warrant.toml` names the store: it finds the
/// keys `warrant serve` created there (without the file it would open `./warrant-data`, an
/// empty store, and stop) and lists that store's tools; a malformed value in the file stops it
/// with the key named, as it stops `warrant serve`.
#[test]
fn mcp_reads_warrant_toml_like_serve() {
    let (dir, store, agent) = store_with_keys();

    let mcp = |toml: &str| {
        std::fs::write(dir.path().join("warrant.toml"), toml).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warrant"));
        cmd.current_dir(dir.path())
            .arg("mcp")
            .env("WARRANT_KEY", &agent)
            .env("WARRANT_LOG", "warn");
        for var in [
            "WARRANT_CONFIG",
            "WARRANT_DATA_DIR",
            "WARRANT_DATABASE",
            "WARRANT_CONTRACTS",
        ] {
            cmd.env_remove(var);
        }
        cmd
    };

    let bad = mcp("[limits]\napproval_ttl = \"forever\"\n").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("limits.approval_ttl"), "{err}");

    let toml = format!("[store]\ndata_dir = {:?}\n", store.to_str().unwrap());
    let mut child = mcp(&toml)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let messages = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ];
    for m in messages {
        writeln!(stdin, "{m}").unwrap();
    }
    let mut tools = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let answer: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if answer["id"] == 2 {
            tools = Some(answer);
            break;
        }
    }
    drop(stdin);
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let tools = tools.unwrap_or_else(|| panic!("no tools/list answer; stderr: {err}"));
    assert_lists_lookup_order(&tools);
    assert_eq!(status.code(), Some(0), "{err}");
}

/// A `tools/list` answer names the example read tool.
fn assert_lists_lookup_order(tools: &serde_json::Value) {
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"lookup_order"), "{tools}");
}

/// `warrant mcp` driven over stdio by the official MCP SDK clients (`tests/mcp_clients`: the
/// Python SDK `mcp` and the TypeScript SDK `@modelcontextprotocol/sdk`, the versions `.ci/run`
/// pins): the handshake, `tools/list`, five concurrent calls, each decided and recorded once,
/// and a call the schema refuses. `WARRANT_TEST_MCP_PYTHON` names a Python with `mcp`
/// installed and `WARRANT_TEST_MCP_NODE_MODULES` a `node_modules` holding the TypeScript SDK;
/// `.ci/run` installs both and sets `WARRANT_REQUIRE_MCP_CLIENTS=1`, which turns a missing
/// client into a failure instead of a skip.
#[test]
fn official_sdk_clients_drive_mcp_over_stdio() {
    let required = std::env::var_os("WARRANT_REQUIRE_MCP_CLIENTS").is_some();
    let repository = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let scripts = repository.join("tests/mcp_clients");
    let mut clients = Vec::new();
    match std::env::var_os("WARRANT_TEST_MCP_PYTHON") {
        Some(python) => {
            let mut cmd = Command::new(python);
            cmd.arg(scripts.join("python_sdk.py"));
            clients.push(("the Python SDK", cmd));
        }
        None => assert!(
            !required,
            "WARRANT_REQUIRE_MCP_CLIENTS is set but WARRANT_TEST_MCP_PYTHON is not"
        ),
    }
    match std::env::var_os("WARRANT_TEST_MCP_NODE_MODULES") {
        Some(modules) => {
            let mut cmd = Command::new("node");
            cmd.arg(scripts.join("typescript_sdk.mjs"))
                .env("NODE_PATH", modules);
            clients.push(("the TypeScript SDK", cmd));
        }
        None => assert!(
            !required,
            "WARRANT_REQUIRE_MCP_CLIENTS is set but WARRANT_TEST_MCP_NODE_MODULES is not"
        ),
    }
    if clients.is_empty() {
        eprintln!("skipped: no MCP SDK client (see .ci/run for how it installs them)");
        return;
    }
    let (dir, store, agent) = store_with_keys();
    for (client, mut cmd) in clients {
        let mut child = cmd
            .arg(env!("CARGO_BIN_EXE_warrant"))
            .arg(&store)
            .current_dir(dir.path())
            .env("WARRANT_KEY", &agent)
            .env("WARRANT_LOG", "warn")
            // The bundled policy, which allows the agent's reads.
            .env("WARRANT_POLICY", repository.join("examples/policies"))
            .env_remove("WARRANT_CONFIG")
            .env_remove("WARRANT_DATABASE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{client}: no answer in 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{client}: {err}");
        let summary: serde_json::Value =
            serde_json::from_slice(out.stdout.trim_ascii()).unwrap_or_else(|e| {
                panic!(
                    "{client}: {e}: {}; stderr: {err}",
                    String::from_utf8_lossy(&out.stdout)
                )
            });
        let protocol = summary["protocol"].as_str().unwrap_or_default();
        assert!(
            ["2025-06-18", "2025-11-25"].contains(&protocol),
            "{client}: {summary}"
        );
        assert!(
            summary["tools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t == "lookup_order"),
            "{client}: {summary}"
        );
        // The example's endpoint does not exist here: each call is allowed, recorded under a
        // ledger id of its own, and fails.
        let calls = summary["calls"].as_array().unwrap();
        let ledger: std::collections::HashSet<&str> = calls
            .iter()
            .map(|c| {
                assert_eq!(c["decision"], "allow", "{client}: {summary}");
                c["ledger_id"].as_str().unwrap()
            })
            .collect();
        assert_eq!(ledger.len(), 5, "{client}: {summary}");
        assert_eq!(
            summary["refused"]["code"], "SCHEMA_TYPE_MISMATCH",
            "{client}: {summary}"
        );
    }
}

/// `warrant mcp` reads and writes its stdio through the runtime's reactor when they are pipes
/// or sockets (a client on libuv hands a server a socket pair), and through blocking reads and
/// writes otherwise (a file): every kind carries the same session to the same answers, and
/// the end of stdin ends it.
#[test]
fn mcp_answers_over_pipes_sockets_and_files() {
    use std::os::unix::net::UnixStream;
    let (dir, store, agent) = store_with_keys();
    let session = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        "\n",
    );
    // Runs one session: `stdin` and `stdout` for the child, what to write the session to
    // (`None`: stdin is a file that holds it), where to read the answers from.
    let run = |stdin: Stdio, stdout: Stdio, to: Option<Box<dyn Write>>, from: Box<dyn Read + Send>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_warrant"))
            .current_dir(dir.path())
            .arg("mcp")
            .arg("--data-dir")
            .arg(&store)
            .env("WARRANT_KEY", &agent)
            .env("WARRANT_LOG", "warn")
            .env_remove("WARRANT_CONFIG")
            .env_remove("WARRANT_DATABASE")
            .stdin(stdin)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(mut to) = to {
            to.write_all(session.as_bytes()).unwrap();
            // The end of stdin ends the session once its answers are written.
            drop(to);
        }
        let answers: Vec<serde_json::Value> = BufReader::new(from)
            .lines()
            .map(|line| serde_json::from_str(&line.unwrap()).unwrap())
            .collect();
        let status = child.wait().unwrap();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(status.code(), Some(0), "{err}");
        let tools = answers
            .iter()
            .find(|a| a["id"] == 2)
            .unwrap_or_else(|| panic!("no tools/list answer in {answers:?}; stderr: {err}"));
        assert_lists_lookup_order(tools);
    };

    // Pipes.
    let (in_read, in_write) = std::io::pipe().unwrap();
    let (out_read, out_write) = std::io::pipe().unwrap();
    run(
        Stdio::from(in_read),
        Stdio::from(out_write),
        Some(Box::new(in_write)),
        Box::new(out_read),
    );
    // A socket pair each way.
    let (in_ours, in_theirs) = UnixStream::pair().unwrap();
    let (out_ours, out_theirs) = UnixStream::pair().unwrap();
    run(
        Stdio::from(std::os::fd::OwnedFd::from(in_theirs)),
        Stdio::from(std::os::fd::OwnedFd::from(out_theirs)),
        Some(Box::new(in_ours)),
        Box::new(out_ours),
    );
    // stderr into the same pipe as stdout: stdout stays blocking, the session is the same.
    let (in_read, in_write) = std::io::pipe().unwrap();
    let (out_read, out_write) = std::io::pipe().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_warrant"))
        .current_dir(dir.path())
        .args(["mcp", "--data-dir"])
        .arg(&store)
        .env("WARRANT_KEY", &agent)
        .env("WARRANT_LOG", "warn")
        .env_remove("WARRANT_CONFIG")
        .env_remove("WARRANT_DATABASE")
        .stdin(Stdio::from(in_read))
        .stderr(Stdio::from(out_write.try_clone().unwrap()))
        .stdout(Stdio::from(out_write))
        .spawn()
        .unwrap();
    let mut to = in_write;
    to.write_all(session.as_bytes()).unwrap();
    drop(to);
    // Read to the end (the child's exit closes the pipe), logs and answers alike.
    let lines: Vec<String> = BufReader::new(out_read).lines().map(Result::unwrap).collect();
    let tools = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|a| a["id"] == 2)
        .unwrap_or_else(|| panic!("no tools/list answer in {lines:?}"));
    assert_lists_lookup_order(&tools);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // A file as stdin, read through blocking reads.
    let file = dir.path().join("session.jsonl");
    std::fs::write(&file, session).unwrap();
    let (out_read, out_write) = std::io::pipe().unwrap();
    run(
        Stdio::from(std::fs::File::open(&file).unwrap()),
        Stdio::from(out_write),
        None,
        Box::new(out_read),
    );
}

/// The banner of `serve` in the repository root with an empty store, with the parts that
/// change per run (address, store path, keys) replaced as the README writes them.
fn normalized_banner(served: &common::serve::Served) -> Vec<String> {
    served
        .banner
        .iter()
        .map(|line| {
            let line = line.replace(&served.url, "http://127.0.0.1:8080");
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["store", _] => "  store      sqlite://./warrant-data/warrant.db".to_owned(),
                [name, key] if key.starts_with("wrn_") => format!("  {name:<10} wrn_…"),
                _ => line,
            }
        })
        .collect()
}

/// Started in the repository root, `serve` prints exactly the README's sample (what it loaded,
/// from where, and the example contracts it cannot call) and logs no warning; started
/// anywhere else, it says that it found no contracts and no policies, and what to pass.
#[test]
fn the_banner_says_what_was_loaded_and_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = common::serve::serve(|cmd| {
        cmd.arg("--data-dir")
            .arg(dir.path().join("root"))
            .env_remove("WARRANT_LOG")
            .stderr(Stdio::piped());
    });
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let sample: Vec<String> = readme
        .split("On first start `serve`")
        .nth(1)
        .and_then(|rest| rest.split("```text\n").nth(1))
        .and_then(|block| block.split("```").next())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        normalized_banner(&served),
        sample,
        "README.md's sample banner is stale"
    );
    let err = stop_and_read_stderr(&mut served);
    assert!(!err.contains("WARN"), "{err}");

    let elsewhere = tempfile::tempdir().unwrap();
    let served = common::serve::serve(|cmd| {
        cmd.current_dir(elsewhere.path())
            .arg("--data-dir")
            .arg(dir.path().join("elsewhere"));
    });
    let banner = served.banner.join("\n");
    assert!(
        banner.contains(
            "  contracts  0 registered (no ./contracts or ./examples/contracts here: pass --contracts DIR"
        ),
        "{banner}"
    );
    assert!(
        banner.contains("  policies   none, so every call is denied (no ./policies or ./examples/policies here: pass --policy DIR)"),
        "{banner}"
    );
}

/// A server with the default log filter writes no line per MCP call from the SDK (rmcp logs
/// three `info` lines per call); `WARRANT_LOG` still brings them back; neither has colour codes
/// when stderr is not a terminal.
#[test]
fn mcp_calls_are_not_logged_per_call_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let run = |log: Option<&str>, data: &str| {
        let mut served = common::serve::serve(|cmd| {
            cmd.arg("--data-dir")
                .arg(dir.path().join(data))
                .stderr(Stdio::piped());
            match log {
                Some(filter) => cmd.env("WARRANT_LOG", filter),
                None => cmd.env_remove("WARRANT_LOG"),
            };
        });
        let agent = served.keys["agent"].clone();
        let addr = served.url.trim_start_matches("http://").to_owned();
        for (id, body) in [
            (1, r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            (
                2,
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"ord_12345678"}}}"#,
            ),
        ] {
            let answer = http(
                &addr,
                &format!(
                    "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {agent}\r\n\
                     Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                ),
            );
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(answer.contains(&format!("\"id\":{id}")), "{answer}");
        }
        stop_and_read_stderr(&mut served)
    };
    let quiet = run(None, "default");
    assert!(!quiet.contains("rmcp"), "{quiet}");
    assert!(
        quiet.contains("shutting down"),
        "the gateway's own info lines stay: {quiet}"
    );
    let loud = run(Some("info"), "asked");
    assert!(
        loud.contains("rmcp"),
        "WARRANT_LOG=info shows the SDK's lines: {loud}"
    );
    // Logs that are not a terminal are plain text: no colour codes in a file or collector
    // (nor the cost of styling every request span's fields).
    for log in [&quiet, &loud] {
        assert!(!log.contains('\x1b'), "{log:?}");
    }
}
