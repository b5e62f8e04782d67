//! `warrant check`: the offline audit of one proposal.

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use warrant_core::authority::{ApprovalRecord, Principal};
use warrant_core::check::{CheckInput, Report, evaluate};
use warrant_core::decision::Decision;
use warrant_core::json::{self, Limits};

use crate::Exit;
use crate::io::{load_contract, read_input};

/// Arguments of `warrant check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The contract file (YAML or JSON).
    #[arg(long, value_name = "FILE")]
    contract: String,
    /// The proposal (JSON), or `-` for standard input.
    #[arg(long, value_name = "FILE|-")]
    proposal: String,
    /// The authenticated principal the call is made as.
    #[arg(long)]
    principal: String,
    /// The principal's tenant.
    #[arg(long)]
    tenant: String,
    /// The principal's granted scopes, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "SCOPE,...")]
    grants: Vec<String>,
    /// An approval record (JSON) presented with the call.
    #[arg(long, value_name = "FILE")]
    approval: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Evaluate approval expiry at this RFC 3339 time instead of now.
    #[arg(long, value_name = "RFC3339")]
    now: Option<String>,
}

/// How `check` prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One `key=value` per line.
    Text,
    /// One JSON object.
    Json,
}

/// Runs `warrant check`.
pub fn run(args: &CheckArgs) -> Result<Exit> {
    let contract = load_contract(&args.contract)?;
    let proposal = read_input(&args.proposal)?;
    let grants = args
        .grants
        .iter()
        .map(|g| g.trim())
        .filter(|g| !g.is_empty())
        .map(str::to_owned);
    let principal = Principal::new(&args.principal, &args.tenant, grants)?;
    let approval = match &args.approval {
        None => None,
        Some(path) => {
            let bytes = read_input(path)?;
            let value = json::parse(&bytes, Limits::DOCUMENT)
                .with_context(|| format!("{path} is not strict JSON"))?;
            match ApprovalRecord::from_value(&value) {
                Ok(record) => Some(record),
                Err(message) => bail!("{path}: {message}"),
            }
        }
    };
    let now = match &args.now {
        None => OffsetDateTime::now_utc(),
        Some(text) => OffsetDateTime::parse(text, &Rfc3339).context("--now must be an RFC 3339 timestamp")?,
    };
    let report = evaluate(&CheckInput {
        contract: &contract,
        proposal: &proposal,
        principal: &principal,
        approval: approval.as_ref(),
        now,
        limits: Limits::PROPOSAL,
    });
    match args.format {
        Format::Text => print!("{}", render_text(&report)),
        Format::Json => println!("{}", render_json(&report)),
    }
    Ok(match report.decision {
        Decision::Allow(_) => Exit::Ok,
        Decision::NeedsApproval(_) => Exit::NeedsApproval,
        Decision::Reject(_) => Exit::Reject,
    })
}

/// The report's facts as ordered `(key, value)` pairs; absent facts were not reached.
fn facts(report: &Report) -> Vec<(&'static str, Option<String>)> {
    let f = &report.facts;
    let mut out = vec![
        ("contract_id", Some(report.contract_id.to_string())),
        ("tool", Some(report.tool.clone())),
        ("version", Some(report.version.to_string())),
        ("effect", Some(report.effect.as_str().to_owned())),
        ("schema", f.schema.map(|s| s.as_str().to_owned())),
        ("payload_digest", f.payload_digest.map(|d| d.to_string())),
        (
            "delegated_scopes",
            f.delegated_scopes.as_ref().map(|s| s.join(",")),
        ),
        ("approval", f.approval.map(|a| a.as_str().to_owned())),
        ("idempotency", f.idempotency.map(|i| i.as_str().to_owned())),
        ("decision", Some(report.decision.as_str().to_owned())),
    ];
    if let Decision::Reject(rejection) = &report.decision {
        out.push(("stage", Some(rejection.stage().as_str().to_owned())));
        out.push(("code", Some(rejection.code().as_str().to_owned())));
        out.push(("detail", Some(rejection.detail().to_owned())));
        out.push(("pointer", rejection.pointer().map(str::to_owned)));
    }
    out
}

fn render_text(report: &Report) -> String {
    let mut out = String::new();
    for (key, value) in facts(report) {
        if let Some(value) = value {
            out.push_str(key);
            out.push('=');
            // One line per key: details come from untrusted input and must not forge lines.
            out.extend(value.chars().map(|c| if c.is_control() { ' ' } else { c }));
            out.push('\n');
        }
    }
    out
}

fn render_json(report: &Report) -> Value {
    let mut map = serde_json::Map::new();
    for (key, value) in facts(report) {
        let value = match (key, value) {
            (_, None) => Value::Null,
            ("version", Some(v)) => v.parse::<u64>().map_or(Value::String(v), Value::from),
            ("delegated_scopes", Some(v)) => {
                Value::Array(v.split(',').filter(|s| !s.is_empty()).map(|s| json!(s)).collect())
            }
            (_, Some(v)) => Value::String(v),
        };
        map.insert(key.to_owned(), value);
    }
    Value::Object(map)
}
