//! `warrant contract lint|hash` and `warrant canon`.

use std::io::Write;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use warrant_core::Contract;
use warrant_core::canon::{Sha256Digest, canonical_bytes};
use warrant_core::contract::{ContractError, DocumentFormat};
use warrant_core::json::{self, Limits};

use crate::Exit;
use crate::io::{load_contract, read_input};

/// `warrant contract …`
#[derive(Debug, Subcommand)]
pub enum ContractCommand {
    /// Check contract files against every registration rule; one line per problem.
    Lint {
        /// Contract files (YAML or JSON).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
    },
    /// Print a contract's content id `tool-contract@sha256:<hex>`.
    Hash {
        /// The contract file (YAML or JSON).
        #[arg(value_name = "FILE")]
        file: String,
        /// Print the digest of the adapter binding instead.
        #[arg(long)]
        binding: bool,
    },
    /// Register, list and retire contracts on a running server.
    #[command(flatten)]
    Remote(crate::client::RemoteContractCommand),
}

/// Arguments of `warrant canon`.
#[derive(Debug, Args)]
pub struct CanonArgs {
    /// The JSON document, or `-` (the default) for standard input.
    #[arg(default_value = "-", value_name = "FILE|-")]
    file: String,
    /// Print `sha256:<hex>` of the canonical form instead of the form itself.
    #[arg(long)]
    digest: bool,
}

/// Runs a `contract` subcommand.
pub fn run(command: &ContractCommand) -> Result<Exit> {
    match command {
        ContractCommand::Lint { files } => lint(files),
        ContractCommand::Remote(remote) => bail!("`{remote:?}` needs a server"),
        ContractCommand::Hash { file, binding } => {
            let contract = load_contract(file)?;
            if *binding {
                match contract.adapter() {
                    Some(adapter) => println!("{}", adapter.digest()),
                    None => bail!("{file} has no adapter binding"),
                }
            } else {
                println!("{}", contract.id());
            }
            Ok(Exit::Ok)
        }
    }
}

fn lint(files: &[String]) -> Result<Exit> {
    let mut exit = Exit::Ok;
    for path in files {
        let bytes = read_input(path)?;
        let Ok(text) = String::from_utf8(bytes) else {
            println!("{path}: not valid UTF-8");
            exit = Exit::Problems;
            continue;
        };
        match Contract::from_text(&text, DocumentFormat::from_path(path)) {
            Ok(contract) => println!("{path}: ok {}", contract.id()),
            Err(ContractError::Syntax(message)) => {
                println!("{path}: {message}");
                exit = Exit::Problems;
            }
            Err(ContractError::Lint(problems)) => {
                for problem in problems {
                    println!("{path}: {problem}");
                }
                exit = Exit::Problems;
            }
        }
    }
    Ok(exit)
}

/// Runs `warrant canon`.
pub fn canon(args: &CanonArgs) -> Result<Exit> {
    let bytes = read_input(&args.file)?;
    let value = json::parse(&bytes, Limits::DOCUMENT)
        .with_context(|| format!("{} is not strict JSON", display_name(&args.file)))?;
    let canonical = canonical_bytes(&value);
    let mut stdout = std::io::stdout().lock();
    if args.digest {
        writeln!(stdout, "{}", Sha256Digest::of_bytes(&canonical))?;
    } else {
        // No trailing newline: the output is exactly the canonical bytes, so piping it into
        // another SHA-256 tool gives the same digest as `--digest`.
        stdout.write_all(&canonical)?;
    }
    stdout.flush()?;
    Ok(Exit::Ok)
}

fn display_name(path: &str) -> &str {
    if path == "-" { "standard input" } else { path }
}
