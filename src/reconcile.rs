//! `warrant reconcile`: resolve `unknown` outcomes and the `attempting` rows a crash left
//! behind, by asking each row's adapter what became of the operation (the same code the
//! server's background reconciler runs).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use warrant_core::registry::Registry;
use warrant_runtime::{Adapters, Runtime, RuntimeSettings};
use warrant_store::{SqlStore, Store, StoreOptions, SystemEnv};

use crate::Exit;
use crate::store::StoreArgs;

/// What to reconcile and how adapters reach their tools.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Only rows untouched for this long (`0s` for every unresolved row; keep it above the
    /// longest call while servers are running).
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    older_than: String,
    /// The most rows to examine in this pass.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
    /// A host adapters may reach although it is private or loopback (repeatable).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// The config file whose network rules, `[credentials]` and relay the adapters use (as
    /// `serve` does). Default: `./warrant.toml` if it exists.
    #[arg(long, env = "WARRANT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// A directory `command` adapters may run programs from (repeatable).
    #[arg(long = "command-root", value_name = "DIR")]
    command_roots: Vec<PathBuf>,
}

/// Runs `warrant reconcile`. Exit 0 when nothing is left unresolved, 3 when some rows stay
/// `unknown` (their adapters could not tell).
pub fn run(args: &ReconcileArgs) -> Result<Exit> {
    let older_than = warrant_runtime::binding::parse_duration(&args.older_than).with_context(|| {
        format!(
            "--older-than `{}` is not a duration such as 0s or 5m",
            args.older_than
        )
    })?;
    let adapter_config =
        crate::serve::adapter_config(args.config.as_deref(), &args.allow_hosts, &args.command_roots)?;
    let url = args.store.url()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(
            SqlStore::open(&url, &StoreOptions::default())
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
        let report = rt.reconcile_older_than(cutoff, args.limit).await?;
        println!("examined={}", report.examined);
        println!("committed={}", report.committed);
        println!("not_committed={}", report.not_committed);
        println!("unknown={}", report.unknown);
        println!("duplicates={}", report.duplicates);
        Ok(if report.unknown > 0 {
            Exit::Reject
        } else {
            Exit::Ok
        })
    })
}
