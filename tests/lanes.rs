//! One conformance table, four lanes: the same hostile proposals sent as `POST /v1/proposals`,
//! as MCP `tools/call` over streamable HTTP, as MCP over stdio (the real `warrant mcp`) and to
//! `warrant check` must be answered with the same decision, stage and code, and every refusal
//! of a server lane must have its ledger row with that stage and code. The proposal's bytes are
//! written by hand, never re-serialized, so each lane sees the spelling the table gives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// A read tool (no approval, no idempotency key), so every row is decided on its arguments
/// alone; its endpoint does not exist, so an allowed call fails at execution (still `allow`).
const CONTRACT: &str = r#"
name: pay
version: 1
description: A tool for the conformance table.
owner: test
effect: read
scopes: [lanes:read]
approval: none
input:
  type: object
  additionalProperties: false
  properties:
    amount_cents: { type: integer, minimum: 1, maximum: 500000 }
    note: { type: string, maxLength: 8 }
    meta:
      type: object
      additionalProperties: false
      properties:
        a: { type: integer, minimum: 0, maximum: 10 }
    deep: { type: array, maxItems: 2, items: { type: integer, minimum: 0, maximum: 9 } }
output:
  type: object
  additionalProperties: false
  properties:
    ok: { type: boolean }
adapter: { kind: http, url: "http://127.0.0.1:9/pay" }
"#;

const POLICY: &str = r#"permit (principal, action in Warrant::Action::"invoke", resource);"#;

/// One row: envelope members besides `tool`, `version` and `arguments` (raw, each followed by
/// a comma; over MCP they are members of `params`), the raw arguments, and the answer every
/// lane must give (`None`: allowed).
struct Case {
    name: &'static str,
    extra: &'static str,
    arguments: Vec<u8>,
    expect: Option<(&'static str, &'static str)>,
}

fn case(
    name: &'static str,
    extra: &'static str,
    arguments: impl Into<Vec<u8>>,
    expect: Option<(&'static str, &'static str)>,
) -> Case {
    Case {
        name,
        extra,
        arguments: arguments.into(),
        expect,
    }
}

fn cases() -> Vec<Case> {
    let deep = format!(r#"{{"deep":{}1{}}}"#, "[".repeat(40), "]".repeat(40));
    let big = format!(r#"{{"note":"{}"}}"#, "x".repeat(70 * 1024));
    vec![
        case("valid", "", r#"{"amount_cents":7}"#, None),
        case(
            "integer as 7.0",
            "",
            r#"{"amount_cents":7.0}"#,
            Some(("schema", "SCHEMA_NOT_INTEGER")),
        ),
        case(
            "integer as 100.0",
            "",
            r#"{"amount_cents":100.0}"#,
            Some(("schema", "SCHEMA_NOT_INTEGER")),
        ),
        case(
            "integer as 25e2",
            "",
            r#"{"amount_cents":25e2}"#,
            Some(("schema", "SCHEMA_NOT_INTEGER")),
        ),
        case(
            "integer as 1E3",
            "",
            r#"{"amount_cents":1E3}"#,
            Some(("schema", "SCHEMA_NOT_INTEGER")),
        ),
        case(
            "duplicate key",
            "",
            r#"{"amount_cents":1,"amount_cents":2}"#,
            Some(("parse", "DUPLICATE_KEY")),
        ),
        case(
            "duplicate key, escaped spelling",
            "",
            r#"{"amount_cents":1,"amount\u005fcents":2}"#,
            Some(("parse", "DUPLICATE_KEY")),
        ),
        case(
            "nested duplicate key",
            "",
            r#"{"meta":{"a":1,"a":2}}"#,
            Some(("parse", "DUPLICATE_KEY")),
        ),
        case(
            "unknown argument",
            "",
            r#"{"amount_cents":1,"colour":"red"}"#,
            Some(("schema", "SCHEMA_UNKNOWN_FIELD")),
        ),
        case(
            "unknown envelope field",
            r#""colour":"red","#,
            r#"{"amount_cents":1}"#,
            Some(("parse", "ENVELOPE_UNKNOWN_FIELD")),
        ),
        case(
            "identity in the envelope",
            r#""tenant":"other","#,
            r#"{"amount_cents":1}"#,
            Some(("identity", "IDENTITY_IN_PROPOSAL")),
        ),
        case(
            "nesting over the limit",
            "",
            deep,
            Some(("parse", "NESTING_TOO_DEEP")),
        ),
        case(
            "payload over the limit",
            "",
            big,
            Some(("parse", "PAYLOAD_TOO_LARGE")),
        ),
        case(
            "lone leading surrogate",
            "",
            r#"{"note":"\ud800"}"#,
            Some(("parse", "LONE_SURROGATE")),
        ),
        case(
            "lone trailing surrogate",
            "",
            r#"{"note":"a\udc00"}"#,
            Some(("parse", "LONE_SURROGATE")),
        ),
        case(
            "invalid UTF-8",
            "",
            b"{\"note\":\"\xff\xfe\"}".to_vec(),
            Some(("parse", "INVALID_UTF8")),
        ),
        case(
            "number overflow",
            "",
            r#"{"amount_cents":1e400}"#,
            Some(("parse", "NUMBER_OUT_OF_RANGE")),
        ),
        case(
            "integer beyond 2^53",
            "",
            r#"{"amount_cents":9007199254740993}"#,
            Some(("parse", "NUMBER_OUT_OF_RANGE")),
        ),
        case(
            "string over maxLength",
            "",
            r#"{"note":"123456789"}"#,
            Some(("schema", "SCHEMA_STRING_TOO_LONG")),
        ),
        case(
            "boolean for a number",
            "",
            r#"{"amount_cents":true}"#,
            Some(("schema", "SCHEMA_TYPE_MISMATCH")),
        ),
    ]
}

/// The proposal as `POST /v1/proposals` and `warrant check` take it.
fn proposal(c: &Case) -> Vec<u8> {
    let mut out = br#"{"tool":"pay","version":1,"#.to_vec();
    out.extend_from_slice(c.extra.as_bytes());
    out.extend_from_slice(b"\"arguments\":");
    out.extend_from_slice(&c.arguments);
    out.push(b'}');
    out
}

/// The same call as an MCP `tools/call` message.
fn tools_call(id: usize, c: &Case) -> Vec<u8> {
    let mut out =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"pay","#).into_bytes();
    out.extend_from_slice(c.extra.as_bytes());
    out.extend_from_slice(b"\"arguments\":");
    out.extend_from_slice(&c.arguments);
    out.extend_from_slice(b"}}");
    out
}

/// What a lane answered: `allow`, `reject <stage> <CODE>`, or something else (described).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    answer: String,
    ledger_id: Option<String>,
}

fn expected(c: &Case) -> String {
    match c.expect {
        None => "allow".into(),
        Some((stage, code)) => format!("reject {stage} {code}"),
    }
}

fn described(decision: Option<&str>, stage: Option<&str>, code: Option<&str>) -> String {
    match decision {
        Some("allow") => "allow".into(),
        Some("reject") => format!("reject {} {}", stage.unwrap_or("?"), code.unwrap_or("?")),
        other => format!("{other:?} {stage:?} {code:?}"),
    }
}

/// An MCP answer (a JSON-RPC response) as a lane outcome.
fn from_mcp(answer: &Value) -> Seen {
    let Some(result) = answer.get("result") else {
        return Seen {
            answer: format!("json-rpc error {}", answer["error"]),
            ledger_id: None,
        };
    };
    let s = &result["structuredContent"];
    let decision = s["decision"]
        .as_str()
        .or_else(|| result["_meta"]["io.warrant/decision"].as_str());
    Seen {
        answer: described(decision, s["stage"].as_str(), s["code"].as_str()),
        ledger_id: s["ledger_id"].as_str().map(str::to_owned),
    }
}

fn write_files(dir: &Path) {
    std::fs::create_dir_all(dir.join("contracts")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("contracts/pay.yaml"), CONTRACT).unwrap();
    std::fs::write(dir.join("policies/all.cedar"), POLICY).unwrap();
}

fn config(cmd: &mut Command, dir: &Path) {
    cmd.arg("--data-dir")
        .arg(dir.join("store"))
        .arg("--contracts")
        .arg(dir.join("contracts"))
        .arg("--policy")
        .arg(dir.join("policies"));
}

/// `warrant check` over the same contract and policy.
fn check(dir: &Path, c: &Case) -> Seen {
    let mut child = Command::new(env!("CARGO_BIN_EXE_warrant"))
        .arg("check")
        .arg("--contract")
        .arg(dir.join("contracts/pay.yaml"))
        .arg("--policy")
        .arg(dir.join("policies"))
        .args([
            "--proposal",
            "-",
            "--principal",
            "demo-agent",
            "--tenant",
            "demo",
            "--grants",
            "lanes:read",
            "--roles",
            "agent",
            "--format",
            "json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&proposal(c)).unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}: check answered no report: {}",
            c.name,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let decision = v["decision"].as_str().map(str::to_ascii_lowercase);
    Seen {
        answer: described(decision.as_deref(), v["stage"].as_str(), v["code"].as_str()),
        ledger_id: None,
    }
}

/// MCP over stdio: one `warrant mcp` process answering every row in turn.
fn stdio(dir: &Path, key: &str, cases: &[Case]) -> Vec<Seen> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warrant"));
    cmd.current_dir(dir).arg("mcp");
    config(&mut cmd, dir);
    let mut child = cmd
        .env("WARRANT_KEY", key)
        .env_remove("WARRANT_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Ok(v) = serde_json::from_str(&line)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    writeln!(stdin, "{init}").unwrap();
    let answer = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(answer["id"], 0, "{answer}");
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    let mut seen = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let id = 100 + i;
        let mut line = tools_call(id, c);
        line.push(b'\n');
        stdin.write_all(&line).unwrap();
        stdin.flush().unwrap();
        let answer = loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(v) if v["id"] == id => break Some(v),
                Ok(_) => {}
                Err(_) => break None,
            }
        };
        seen.push(match answer {
            Some(v) => from_mcp(&v),
            None => Seen {
                answer: "no answer".into(),
                ledger_id: None,
            },
        });
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn every_lane_answers_the_table_alike() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_files(dir);
    let cases = cases();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = common::http_client();

    // HTTP and MCP over HTTP, on one server.
    let served = common::serve::serve(|cmd| config(cmd, dir));
    let key = served.keys["agent"].clone();
    let url = served.url.clone();
    let (via_http, via_mcp_http) = rt.block_on(async {
        let mut via_http = Vec::new();
        let mut via_mcp = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let r = http
                .post(format!("{url}/v1/proposals"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(proposal(c))
                .timeout(Duration::from_secs(20))
                .send()
                .await
                .unwrap();
            let v: Value = r.json().await.unwrap();
            via_http.push(Seen {
                answer: described(
                    v["decision"].as_str(),
                    v["error"]["stage"].as_str(),
                    v["error"]["code"].as_str(),
                ),
                ledger_id: v["ledger_id"].as_str().map(str::to_owned),
            });
            let r = http
                .post(format!("{url}/mcp"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-06-18")
                .body(tools_call(i, c))
                .timeout(Duration::from_secs(20))
                .send()
                .await
                .unwrap();
            let v: Value = r.json().await.unwrap();
            via_mcp.push(from_mcp(&v));
        }
        (via_http, via_mcp)
    });
    drop(served);

    // MCP over stdio, on the same store (one process per SQLite directory at a time).
    let via_stdio = stdio(dir, &key, &cases);
    let via_check: Vec<Seen> = cases.iter().map(|c| check(dir, c)).collect();

    let mut problems = Vec::new();
    let mut rows = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let want = expected(c);
        for (lane, seen) in [
            ("http", &via_http[i]),
            ("mcp-http", &via_mcp_http[i]),
            ("mcp-stdio", &via_stdio[i]),
            ("check", &via_check[i]),
        ] {
            if seen.answer != want {
                problems.push(format!(
                    "{}: {lane} answered `{}`, want `{want}`",
                    c.name, seen.answer
                ));
            }
            if lane != "check" && c.expect.is_some() {
                match &seen.ledger_id {
                    Some(id) => rows.push((c.name, lane, id.clone(), c.expect)),
                    None => problems.push(format!("{}: {lane} names no ledger row", c.name)),
                }
            }
        }
    }

    // Every refusal's ledger row, read back through the API.
    let served = common::serve::serve(|cmd| config(cmd, dir));
    let url = served.url.clone();
    rt.block_on(async {
        for (name, lane, id, expect) in &rows {
            let r = http
                .get(format!("{url}/v1/ledger/{id}"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            if r.status() != 200 {
                problems.push(format!("{name}: {lane}'s ledger row {id}: {}", r.status()));
                continue;
            }
            let row: Value = r.json().await.unwrap();
            let (stage, code) = expect.unwrap();
            if (
                row["decision"].as_str(),
                row["stage"].as_str(),
                row["error_code"].as_str(),
            ) != (Some("reject"), Some(stage), Some(code))
            {
                problems.push(format!("{name}: {lane}'s ledger row says {row}"));
            }
        }
    });
    drop(served);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
