//! `warrant workflow compile`: the compiler offline, against a directory of contracts.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};
use warrant_core::contract::DocumentFormat;
use warrant_workflow::compile::{Catalog, Compiled, Found, Violation};
use warrant_workflow::definition::{Reviewers, StepKind, ToolRef};

use crate::Exit;
use crate::io::read_input;

/// `warrant workflow …`
#[derive(Debug, Subcommand)]
pub enum WorkflowCommand {
    /// Compile a workflow definition offline: the grammar, every tool it calls, its bindings
    /// and Gate A. Prints the graph and each tool step's review coverage; exits 1 with every
    /// violation (its rule, where, and the path that proves it).
    Compile {
        /// The definition (YAML or JSON), or `-` for standard input.
        #[arg(value_name = "FILE|-")]
        file: String,
        /// The contracts to resolve tools against (a directory of YAML or JSON contracts);
        /// default: the directory `warrant serve` registers (`./contracts`, else
        /// `./examples/contracts`). A contract past its `retire_after` date counts as retired.
        #[arg(long, value_name = "DIR")]
        contracts: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Publish a definition on a running server (admin of your tenant): compiled there against
    /// the contracts your tenant's calls resolve to; refused with every violation (exit 1).
    Publish {
        /// The definition (YAML or JSON).
        #[arg(value_name = "FILE|-")]
        file: String,
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
    /// Your tenant's published workflows.
    List {
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
    /// Start a run of a published workflow (`NAME@VERSION`) with an input document.
    Run {
        /// `name@version`.
        #[arg(value_name = "NAME@VERSION")]
        workflow: String,
        /// The run's input (JSON), or `-` for standard input.
        #[arg(long, value_name = "FILE|-")]
        input: String,
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
    /// One published workflow: its pins and definition.
    Show {
        /// The workflow's name.
        name: String,
        /// Its version.
        version: u32,
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
}

/// `warrant runs …`
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Your tenant's newest runs.
    List {
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
    /// One run: its status, each executed step with its ledger row, and its cost.
    Show {
        /// The run id.
        id: String,
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
    /// Cancel a run that has not ended (the principal that started it, or an admin).
    Cancel {
        /// The run id.
        id: String,
        #[command(flatten)]
        server: crate::client::ServerArgs,
    },
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// One JSON document.
    Json,
}

/// The contracts of a directory; one past its `retire_after` date is retired.
struct Directory {
    contracts: Vec<Arc<warrant_core::Contract>>,
    today: time::Date,
}

impl Catalog for Directory {
    fn find(&self, tool: &ToolRef) -> Found {
        let found = self.contracts.iter().find(|c| match tool {
            ToolRef::Version { name, version } => c.qualified_name() == *name && c.version() == *version,
            ToolRef::Content(id) => c.id() == *id,
        });
        match found {
            Some(c) if c.retire_after().is_some_and(|d| d < self.today) => Found::Retired(c.clone()),
            Some(c) => Found::Active(c.clone()),
            None => Found::Unknown,
        }
    }
}

/// Runs a `workflow` subcommand.
pub fn run(command: &WorkflowCommand) -> Result<Exit> {
    match command {
        WorkflowCommand::Compile {
            file,
            contracts,
            format,
        } => compile(file, contracts.as_ref(), *format),
        remote => crate::client::workflows(remote),
    }
}

fn compile(file: &str, contracts: Option<&PathBuf>, format: Format) -> Result<Exit> {
    let text = String::from_utf8(read_input(file)?).with_context(|| format!("{file} is not valid UTF-8"))?;
    let dir = contracts.cloned().or_else(crate::serve::default_contracts_dir);
    let loaded = match &dir {
        Some(dir) => warrant_server::bootstrap::read_contracts(dir)
            .with_context(|| format!("cannot read the contracts in {}", dir.display()))?,
        None => Vec::new(),
    };
    let catalog = Directory {
        contracts: loaded.into_iter().map(Arc::new).collect(),
        today: time::OffsetDateTime::now_utc().date(),
    };
    let result = warrant_workflow::compile_text(&text, DocumentFormat::from_path(file), &catalog);
    match format {
        Format::Json => {
            let document = match &result {
                Ok(compiled) => json!({"ok": true, "workflow": described(compiled)}),
                Err(violations) => {
                    json!({"ok": false, "violations": violations.iter().map(Violation::to_json).collect::<Vec<_>>()})
                }
            };
            println!("{}", serde_json::to_string_pretty(&document)?);
        }
        Format::Text => match &result {
            Ok(compiled) => print!("{}", text_of(compiled)),
            Err(violations) => {
                for v in violations {
                    println!("{v}");
                }
                println!("{file}: refused, {} violation(s)", violations.len());
            }
        },
    }
    Ok(if result.is_ok() { Exit::Ok } else { Exit::Problems })
}

fn reviewers(r: &Reviewers) -> String {
    match r {
        Reviewers::Role(role) => format!("role {role}"),
        Reviewers::Principals(p) => format!("principals {}", p.join(", ")),
    }
}

/// One line per step: kind, what it does, where it leads.
fn step_lines(compiled: &Compiled) -> Vec<(String, String, String)> {
    let label = |step: &str| {
        compiled
            .contracts
            .get(step)
            .map(|c| format!("{}@{}", c.qualified_name(), c.version()))
            .unwrap_or_default()
    };
    compiled
        .definition
        .steps
        .iter()
        .map(|s| {
            let what = match &s.kind {
                StepKind::Model(m) => format!("proposes {} → {}", label(&s.id), m.next),
                StepKind::Tool(t) => {
                    let c = compiled.contracts.get(&s.id);
                    format!(
                        "{} ({}, {}) → {}",
                        label(&s.id),
                        c.map(|c| c.effect().as_str()).unwrap_or_default(),
                        c.map(|c| c.id().to_string()).unwrap_or_default(),
                        t.next
                    )
                }
                StepKind::Review(r) => format!(
                    "covers {} ({}, expires in {}s) → approve: {}, reject: {}",
                    r.covers.join(", "),
                    reviewers(&r.reviewers),
                    r.expires_in.as_secs(),
                    r.on_approve,
                    r.on_reject
                ),
                StepKind::Branch(b) => {
                    let cases: Vec<String> = b
                        .cases
                        .iter()
                        .enumerate()
                        .map(|(i, c)| format!("case {} `{}` → {}", i + 1, c.when, c.next))
                        .collect();
                    format!("{}; else → {}", cases.join("; "), b.otherwise)
                }
                StepKind::End(e) => format!("{:?}", e.status).to_lowercase(),
            };
            let bound = s
                .max_visits
                .map(|n| format!(" (at most {n} visits)"))
                .unwrap_or_default();
            (s.id.clone(), s.kind.name().to_owned(), format!("{what}{bound}"))
        })
        .collect()
}

fn text_of(compiled: &Compiled) -> String {
    let d = &compiled.definition;
    let mut out = format!("{}@{}: ok\n", d.name, d.version);
    let classes: Vec<&str> = d.review_required_for.iter().map(|c| c.as_str()).collect();
    out.push_str(&format!(
        "review required for: {}\n\nsteps (the first is the entry):\n",
        classes.join(", ")
    ));
    let lines = step_lines(compiled);
    let width = lines.iter().map(|(id, _, _)| id.len()).max().unwrap_or(0);
    for (id, kind, what) in &lines {
        out.push_str(&format!("  {id:<width$}  {kind:<6}  {what}\n"));
    }
    out.push_str("\nreview coverage of tool steps:\n");
    for c in &compiled.coverage {
        let covered = if c.reviews.is_empty() {
            "no review".to_owned()
        } else {
            format!("reviewed by {}", c.reviews.join(", "))
        };
        let required = if c.review_required {
            "review required"
        } else {
            "no review required"
        };
        out.push_str(&format!(
            "  {:<width$}  {} ({}): {required}; {covered}\n",
            c.step,
            c.tool,
            c.effect.as_str()
        ));
    }
    out
}

fn described(compiled: &Compiled) -> Value {
    let d = &compiled.definition;
    json!({
        "name": d.name,
        "version": d.version,
        "review_required_for": d.review_required_for.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        "entry": d.steps.first().map(|s| s.id.clone()),
        "steps": step_lines(compiled).into_iter().map(|(id, kind, what)| json!({"id": id, "kind": kind, "summary": what})).collect::<Vec<_>>(),
        "pinned": compiled.pinned().into_iter().map(|(s, id)| (s, Value::String(id.to_string()))).collect::<serde_json::Map<_, _>>(),
        "coverage": compiled.coverage.iter().map(|c| json!({
            "step": c.step,
            "tool": c.tool,
            "content_id": c.content_id.to_string(),
            "effect": c.effect.as_str(),
            "review_required": c.review_required,
            "reviews": c.reviews,
        })).collect::<Vec<_>>(),
    })
}
