//! `warrant reconcile`: resolve `unknown` outcomes and the `attempting` rows a crash left
//! behind, by asking each row's adapter what became of the operation (the same code the
//! server's background reconciler runs).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use warrant_core::registry::Registry;
use warrant_runtime::reconcile::ReconcileSchedule;
use warrant_runtime::{Adapters, Runtime};
use warrant_store::{SqlStore, Store, SystemEnv};

use crate::Exit;
use crate::store::StoreArgs;

/// What to reconcile and how adapters reach their tools.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Rows not yet asked about are due once untouched for this long (`0s`: at once; keep it
    /// above the longest call while servers are running). Rows asked about before are due
    /// when their backoff says. Default: as the servers judge a row abandoned, the config
    /// file's `limits.call_deadline` plus 30 s (90 s without one).
    #[arg(long, value_name = "DURATION")]
    older_than: Option<String>,
    /// The most rows to examine in this pass.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
    /// Rows unresolved for longer than this (since their call) are marked on the ledger as
    /// needing an operator, once each. Default: the config file's `limits.overdue_after`, else
    /// 1h.
    #[arg(long, value_name = "DURATION")]
    overdue_after: Option<String>,
    /// A host adapters may reach although it is private or loopback (repeatable; added to
    /// the config file's `network.allow_hosts`).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// A directory `command` adapters may run programs from (repeatable).
    #[arg(long = "command-root", value_name = "DIR")]
    command_roots: Vec<PathBuf>,
}

/// Runs `warrant reconcile`: one pass over the rows that are due (never-scheduled rows older
/// than `--older-than`, and rows whose next inquiry time has come), printing the totals and,
/// for each row left unresolved, why. Exit 0 when nothing is left unresolved, 3 when some rows
/// stay `unknown` (their adapters could not tell) or were left unasked (the pass's lease ran
/// short).
pub fn run(args: &ReconcileArgs) -> Result<Exit> {
    let (older_than, settings) = limits(args)?;
    let overdue_after = settings.overdue_after;
    let adapter_config = crate::serve::adapter_config(
        args.store.config.as_deref(),
        &args.allow_hosts,
        &args.command_roots,
    )?;
    let (url, options) = args.store.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(
            SqlStore::open(&url, &options)
                .await
                .with_context(|| format!("cannot open {}", url.redacted()))?,
        );
        let registry = Arc::new(Registry::new(store.clone(), time::Duration::seconds(60)));
        let adapters = Arc::new(Adapters::new(adapter_config));
        let rt = Runtime::new(store.clone(), registry, Arc::new(SystemEnv), adapters, settings);
        let cutoff = time::OffsetDateTime::now_utc() - time::Duration::try_from(older_than)?;
        let schedule = ReconcileSchedule {
            overdue_after,
            ask_all_now: true,
            ..ReconcileSchedule::default()
        };
        let pass = rt.reconcile_pass(cutoff, args.limit, &schedule).await?;
        let report = pass.totals;
        println!("examined={}", report.examined);
        println!("committed={}", report.committed);
        println!("not_committed={}", report.not_committed);
        println!("unknown={}", report.unknown);
        println!("duplicates={}", report.duplicates);
        println!("overdue={}", pass.overdue);
        println!("left={}", pass.left);
        if pass.left > 0 {
            println!(
                "left unasked: {} claimed row(s) had no time left in this pass's lease for an inquiry; \
                 they fall due again when the lease ends (run again)",
                pass.left
            );
        }
        for row in &pass.unresolved {
            let next = row
                .next_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            println!(
                "unresolved ledger={} tenant={} tool={} inquiries={} next={next}: {}",
                row.ledger_id, row.tenant, row.tool, row.attempts, row.why
            );
        }
        Ok(verdict(report.unknown, pass.left))
    })
}

/// The exit of a pass: 3 when any row stays unresolved — asked and still `unknown`, or claimed
/// and left unasked — else 0.
fn verdict(unknown: u32, left: u32) -> Exit {
    if unknown > 0 || left > 0 {
        Exit::Reject
    } else {
        Exit::Ok
    }
}

/// How young a row not yet asked about may be and still be left alone (`--older-than`), and
/// the runtime's settings: the limits the servers run with, from the same config file (a row
/// is abandoned, and overdue, for a pass exactly when it is for them), the flags overriding.
fn limits(args: &ReconcileArgs) -> Result<(std::time::Duration, warrant_runtime::RuntimeSettings)> {
    let mut settings = crate::serve::runtime_settings(args.store.config.as_deref())?;
    let parse = |flag: &str, text: &str| {
        warrant_runtime::binding::parse_duration(text)
            .with_context(|| format!("{flag} `{text}` is not a duration such as 0s, 5m or 1h"))
    };
    let older_than = match &args.older_than {
        Some(text) => parse("--older-than", text)?,
        None => settings.stale_after,
    };
    if let Some(text) = &args.overdue_after {
        settings.overdue_after = parse("--overdue-after", text)?;
    }
    Ok((older_than, settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_judges_rows_by_the_servers_limits() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            reconcile: ReconcileArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("warrant.toml");
        std::fs::write(
            &config,
            "[limits]\ncall_deadline = \"10m\"\noverdue_after = \"2h\"\n",
        )
        .unwrap();
        let config = config.to_str().unwrap();
        let limits_of = |flags: &[&str]| {
            let cli =
                <Cli as clap::Parser>::try_parse_from(["reconcile", "--config", config].iter().chain(flags))
                    .unwrap();
            let (older_than, settings) = limits(&cli.reconcile).unwrap();
            (older_than.as_secs(), settings.overdue_after.as_secs())
        };
        // A row untouched for less than the deadline plus 30 s may belong to a running call.
        assert_eq!(limits_of(&[]), (630, 7200));
        assert_eq!(
            limits_of(&["--older-than", "0s", "--overdue-after", "5m"]),
            (0, 300)
        );
    }

    #[test]
    fn a_pass_that_leaves_rows_unasked_does_not_exit_clean() {
        assert_eq!(verdict(0, 0), Exit::Ok);
        assert_eq!(verdict(1, 0), Exit::Reject);
        assert_eq!(verdict(0, 2), Exit::Reject);
    }
}
