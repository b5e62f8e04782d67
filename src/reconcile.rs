//! `warrant reconcile`: resolve `unknown` outcomes and the `attempting` rows a crash left
//! behind, by asking each row's adapter what became of the operation (the same code the
//! server's background reconciler runs).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use warrant_core::registry::Registry;
use warrant_runtime::reconcile::ReconcileSchedule;
use warrant_runtime::{Adapters, Runtime, RuntimeSettings};
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
    /// when their backoff says.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    older_than: String,
    /// The most rows to examine in this pass.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
    /// Rows unresolved for longer than this (since their call) are marked on the ledger as
    /// needing an operator, once each.
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    overdue_after: String,
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
/// stay `unknown` (their adapters could not tell).
pub fn run(args: &ReconcileArgs) -> Result<Exit> {
    let older_than = warrant_runtime::binding::parse_duration(&args.older_than).with_context(|| {
        format!(
            "--older-than `{}` is not a duration such as 0s or 5m",
            args.older_than
        )
    })?;
    let overdue_after = warrant_runtime::binding::parse_duration(&args.overdue_after).with_context(|| {
        format!(
            "--overdue-after `{}` is not a duration such as 30m or 1h",
            args.overdue_after
        )
    })?;
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
        let rt = Runtime::new(
            store.clone(),
            registry,
            Arc::new(SystemEnv),
            adapters,
            RuntimeSettings::default(),
        );
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
        Ok(if report.unknown > 0 {
            Exit::Reject
        } else {
            Exit::Ok
        })
    })
}
