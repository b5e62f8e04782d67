//! File and stdin reading for the command line (the core crate does no I/O).

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};
use warrant_core::Contract;
use warrant_core::contract::{ContractError, DocumentFormat};

/// Largest file the CLI reads; documents are bounded again by the parsers.
const MAX_INPUT: u64 = 64 * 1024 * 1024;

/// Reads a file, or standard input for `-`.
pub fn read_input(path: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    if path == "-" {
        std::io::stdin()
            .take(MAX_INPUT)
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
    } else {
        std::fs::File::open(Path::new(path))
            .with_context(|| format!("cannot open {path}"))?
            .take(MAX_INPUT)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {path}"))?;
    }
    Ok(bytes)
}

/// Reads a contract file and lints it; problems are an error listing each one.
pub fn load_contract(path: &str) -> Result<Contract> {
    let bytes = read_input(path)?;
    let text = String::from_utf8(bytes).with_context(|| format!("{path} is not valid UTF-8"))?;
    match Contract::from_text(&text, DocumentFormat::from_path(path)) {
        Ok(contract) => Ok(contract),
        Err(ContractError::Syntax(message)) => bail!("{path}: {message}"),
        Err(ContractError::Lint(problems)) => {
            let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
            bail!("{path} is not a valid contract:\n{}", lines.join("\n"))
        }
    }
}
