//! `warrant store check`: open (creating and migrating) the store named by `--database` or
//! `--data-dir` and report what is in it.

use anyhow::{Context, Result};
use clap::Args;
use warrant_store::{DatabaseUrl, SqlStore, Store, StoreOptions};

use crate::Exit;

/// Where the store lives.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// `sqlite://<file or data directory>` or `postgres://…` (overrides `--data-dir`).
    #[arg(long, env = "WARRANT_DATABASE", value_name = "URL")]
    database: Option<String>,
    /// The data directory of the embedded SQLite store.
    #[arg(
        long,
        env = "WARRANT_DATA_DIR",
        default_value = "./warrant-data",
        value_name = "DIR"
    )]
    data_dir: String,
}

impl StoreArgs {
    /// The database this names.
    pub fn url(&self) -> Result<DatabaseUrl> {
        match &self.database {
            Some(url) => DatabaseUrl::parse(url).context("invalid --database"),
            None => Ok(DatabaseUrl::data_dir(&self.data_dir)),
        }
    }
}

/// Runs `warrant store check`.
pub fn check(args: &StoreArgs) -> Result<Exit> {
    let url = args.url()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = SqlStore::open(&url, &StoreOptions::default())
            .await
            .with_context(|| format!("cannot open {}", url.redacted()))?;
        store.ping().await?;
        let contracts = store.list_contracts().await?;
        let has_keys = store.has_api_keys().await?;
        println!("backend={}", store.backend_name());
        println!("database={}", url.redacted());
        println!("schema=up-to-date");
        println!("contracts={}", contracts.len());
        println!("api_keys={}", if has_keys { "present" } else { "none" });
        store.close().await;
        Ok(Exit::Ok)
    })
}
