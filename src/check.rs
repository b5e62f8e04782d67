//! `warrant check`: the offline audit of one proposal, through the same `decide` every lane
//! calls, over an in-memory store holding just the given contract (and approval record).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};
use warrant_core::Contract;
use warrant_core::authority::{ApprovalRecord, Principal};
use warrant_core::budget::BudgetConfig;
use warrant_core::decision::Decision;
use warrant_core::env::Env;
use warrant_core::guard::{AllowList, Guards};
use warrant_core::json::{self, Limits};
use warrant_core::pipeline::{Authority, Call, Decided, Settings};
use warrant_core::policy::{PolicyEngine, PolicyVerdict};
use warrant_core::redact::RedactionKey;
use warrant_core::registry::Registry;
use warrant_policy::{CedarEngine, PolicySource};
use warrant_store::MemoryStore;

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
    /// The principal's roles, comma-separated (used by policies).
    #[arg(long, value_delimiter = ',', value_name = "ROLE,...")]
    roles: Vec<String>,
    /// A Cedar policy file, or a directory of them (`*.cedar`), validated against the contract;
    /// without it, the policies `warrant serve` reads by default (`./policies`, else
    /// `./examples/policies`, loaded with the contracts of `./contracts`, else
    /// `./examples/contracts`), and with none there every call is denied, as by the server.
    #[arg(long, value_name = "FILE|DIR")]
    policy: Option<String>,
    /// A tenant allow-list for guarded fields, `NAME=ENTRY,ENTRY` (e.g.
    /// `email_recipients=alice@x.example,*@y.example`); repeatable.
    #[arg(long = "allowlist", value_name = "NAME=ENTRIES")]
    allowlists: Vec<String>,
    /// An approval record (JSON) presented with the call.
    #[arg(long, value_name = "FILE")]
    approval: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Evaluate at this RFC 3339 time instead of now (approval expiry, daily budgets).
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

/// A fixed clock and sequential ids: an audit is reproducible.
struct AuditEnv {
    now: OffsetDateTime,
    next: AtomicU64,
}

impl Env for AuditEnv {
    fn now(&self) -> OffsetDateTime {
        self.now
    }

    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}_check{:06}", self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// Runs `warrant check`.
pub fn run(args: &CheckArgs) -> Result<Exit> {
    let contract = load_contract(&args.contract)?;
    let proposal = read_input(&args.proposal)?;
    let clean = |items: &[String]| -> Vec<String> {
        items
            .iter()
            .map(|g| g.trim())
            .filter(|g| !g.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let principal =
        Principal::new(&args.principal, &args.tenant, clean(&args.grants))?.with_roles(clean(&args.roles))?;
    let now = match &args.now {
        None => OffsetDateTime::now_utc(),
        Some(text) => OffsetDateTime::parse(text, &Rfc3339).context("--now must be an RFC 3339 timestamp")?,
    };
    let approval = args.approval.as_deref().map(read_approval).transpose()?;
    let mut guards = Guards::new();
    for spec in &args.allowlists {
        let (name, entries) = spec
            .split_once('=')
            .context("--allowlist takes NAME=ENTRY,ENTRY")?;
        let list = AllowList::new(entries.split(',').map(str::trim).filter(|e| !e.is_empty()))
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--allowlist {name}"))?;
        guards.set(principal.tenant(), name, list);
    }
    let contract = Arc::new(contract);
    let (engine, source) = policies(&contract, args.policy.as_deref())?;
    // On standard error, so the report's lines stay the facts of the decision.
    eprintln!("policy source: {source}");
    let policy: Arc<dyn PolicyEngine> = Arc::new(engine);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let decided = runtime.block_on(async {
        let store = Arc::new(MemoryStore::new());
        let registry = Arc::new(Registry::new(store.clone(), Duration::days(1)));
        registry.register((*contract).clone(), now).await?;
        if let Some(record) = &approval {
            store.insert_approval(record.to_request(contract.name(), principal.id()))?;
        }
        let env = Arc::new(AuditEnv {
            now,
            next: AtomicU64::new(1),
        });
        // The key only tokenizes sensitive values in the throwaway in-memory ledger.
        let redaction = RedactionKey::new(vec![0x5a; 32]).context("redaction key")?;
        let authority = Authority::new(
            store,
            registry,
            policy,
            Arc::new(guards),
            BudgetConfig::default(),
            redaction,
            env,
            Settings {
                limits: Limits::PROPOSAL,
                ..Settings::default()
            },
        );
        let call = Call {
            bytes: &proposal,
            approval_id: approval.as_ref().map(|a| a.id.as_str()),
            trace_id: "check",
            ..Call::default()
        };
        anyhow::Ok(authority.decide(&principal, &call).await?)
    })?;
    let report = Report {
        contract: &contract,
        decided: &decided,
    };
    match args.format {
        Format::Text => print!("{}", report.text()),
        Format::Json => println!("{}", report.json()),
    }
    Ok(match decided.decision {
        Decision::Allow(_) => Exit::Ok,
        Decision::NeedsApproval(_) => Exit::NeedsApproval,
        Decision::Reject(_) => Exit::Reject,
    })
}

/// The policies an audit decides with, and where they came from. `--policy` names them;
/// without it the audit decides as `warrant serve` started here would: with the policies of
/// its default directory, else with none — and no policy denies every call. (There is no
/// audit that skips the policy stage: an answer the server would not give is no audit.)
fn policies(contract: &Arc<Contract>, given: Option<&str>) -> Result<(CedarEngine, String)> {
    if let Some(path) = given {
        return Ok((load_policy(contract, path)?, format!("{path} (--policy)")));
    }
    let Some(dir) = crate::serve::default_policy_dir() else {
        let engine =
            CedarEngine::new(std::slice::from_ref(contract), &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
        return Ok((
            engine,
            "none (no ./policies or ./examples/policies): every call is denied, as by warrant serve \
             without policies"
                .to_owned(),
        ));
    };
    // The server validates its policies against every contract it registers, so a directory
    // may name other tools: load it with those contracts too. The checked contract stands in
    // for a registered one of the same name@version (it may be an edit of that file).
    let mut contracts = vec![Arc::clone(contract)];
    if let Some(contracts_dir) = crate::serve::default_contracts_dir() {
        let registered = warrant_server::bootstrap::read_contracts(&contracts_dir).with_context(|| {
            format!(
                "cannot read the contracts `warrant serve` would register ({})",
                contracts_dir.display()
            )
        })?;
        contracts.extend(
            registered
                .into_iter()
                .filter(|c| (c.name(), c.version()) != (contract.name(), contract.version()))
                .map(Arc::new),
        );
    }
    let engine = CedarEngine::load_dir(&contracts, &dir)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot load the policies in {}", dir.display()))?;
    Ok((
        engine,
        format!("{} (the default of warrant serve)", dir.display()),
    ))
}

/// Loads one policy file, or every `*.cedar` file of a directory, validated against the schema
/// generated from `contract`.
fn load_policy(contract: &Arc<Contract>, path: &str) -> Result<CedarEngine> {
    let contracts = std::slice::from_ref(contract);
    let location = std::path::Path::new(path);
    let engine = if location.is_dir() {
        CedarEngine::load_dir(contracts, location)
    } else {
        let text = std::fs::read_to_string(location).with_context(|| format!("cannot read {path}"))?;
        let name = location
            .file_name()
            .map_or(path.into(), |n| n.to_string_lossy().into_owned());
        CedarEngine::new(contracts, &[PolicySource::new(name, text)])
    };
    engine
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot load the policies in {path}"))
}

fn read_approval(path: &str) -> Result<ApprovalRecord> {
    let bytes = read_input(path)?;
    let value =
        json::parse(&bytes, Limits::DOCUMENT).with_context(|| format!("{path} is not strict JSON"))?;
    match ApprovalRecord::from_value(&value) {
        Ok(record) => Ok(record),
        Err(message) => bail!("{path}: {message}"),
    }
}

struct Report<'a> {
    contract: &'a Contract,
    decided: &'a Decided,
}

impl Report<'_> {
    /// The facts as ordered `(key, value)` pairs; absent facts were not reached.
    fn facts(&self) -> Vec<(&'static str, Option<String>)> {
        let f = &self.decided.facts;
        let c = self.contract;
        let policy = f.policy.as_ref().map(|verdict| match verdict {
            PolicyVerdict::Allow => "ALLOW".to_owned(),
            PolicyVerdict::Deny { .. } => "DENY".to_owned(),
        });
        let mut out = vec![
            ("contract_id", Some(c.id().to_string())),
            ("tool", Some(c.name().to_owned())),
            ("version", Some(c.version().to_string())),
            ("effect", Some(c.effect().as_str().to_owned())),
            (
                "schema",
                f.schema
                    .map(|valid| if valid { "VALID" } else { "INVALID" }.to_owned()),
            ),
            ("payload_digest", f.payload_digest.map(|d| d.to_string())),
            ("policy", policy),
            (
                "delegated_scopes",
                f.delegated_scopes.as_ref().map(|s| s.join(",")),
            ),
            ("approval", f.approval.map(|a| a.as_str().to_owned())),
            ("idempotency", f.idempotency.map(|i| i.as_str().to_owned())),
            ("decision", Some(self.decided.decision.as_str().to_owned())),
        ];
        match &self.decided.decision {
            Decision::Reject(rejection) => {
                out.push(("stage", Some(rejection.stage().as_str().to_owned())));
                out.push(("code", Some(rejection.code().as_str().to_owned())));
                out.push(("detail", Some(rejection.detail().to_owned())));
                out.push(("pointer", rejection.pointer().map(str::to_owned)));
            }
            Decision::NeedsApproval(needed) => {
                out.push(("approval_request", needed.request_id.clone()));
            }
            Decision::Allow(_) => {}
        }
        out
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for (key, value) in self.facts() {
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

    fn json(&self) -> Value {
        let mut map = serde_json::Map::new();
        for (key, value) in self.facts() {
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
}
