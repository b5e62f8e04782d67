//! `warrant store check`: open (creating and migrating) the store named by `--database` or
//! `--data-dir` and report what is in it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use warrant_store::{DatabaseUrl, SqlStore, Store, StoreOptions};

use crate::Exit;

/// Where the store lives: flags (each also read from its `WARRANT_*` variable), then the
/// config file's `[store]` section (as `serve` reads it), then `./warrant-data`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The config file (TOML) whose `[store]` section names the store (as `serve` reads it;
    /// `reconcile` also takes its limits, network rules, `[credentials]` and relay). Default:
    /// `./warrant.toml` if it exists.
    #[arg(long, env = "WARRANT_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// `sqlite://<file or data directory>` or `postgres://…` (overrides `--data-dir`).
    #[arg(long, env = "WARRANT_DATABASE", value_name = "URL")]
    database: Option<String>,
    /// The data directory of the embedded SQLite store. Default: `store.data_dir`, else
    /// `./warrant-data`.
    #[arg(long, env = "WARRANT_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The PostgreSQL schema to use (created if missing); default: `store.schema`, else the
    /// search path.
    #[arg(long, env = "WARRANT_DATABASE_SCHEMA", value_name = "NAME")]
    database_schema: Option<String>,
}

impl StoreArgs {
    /// The database this names, and how to open it.
    pub fn resolve(&self) -> Result<(DatabaseUrl, StoreOptions)> {
        let (database, data_dir, schema) = crate::serve::store_config(self.config.as_deref())?;
        let url = match self.database.clone().or(database) {
            Some(url) => DatabaseUrl::parse(&url).context("invalid database URL")?,
            None => DatabaseUrl::data_dir(
                self.data_dir
                    .clone()
                    .or(data_dir)
                    .unwrap_or_else(|| PathBuf::from("./warrant-data")),
            ),
        };
        let options = StoreOptions {
            postgres_schema: self.database_schema.clone().or(schema),
            ..StoreOptions::default()
        };
        Ok((url, options))
    }
}

/// Runs `warrant store check`.
pub fn check(args: &StoreArgs) -> Result<Exit> {
    let (url, options) = args.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = SqlStore::open(&url, &options)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn args(config: Option<PathBuf>) -> StoreArgs {
        StoreArgs {
            config,
            database: None,
            data_dir: None,
            database_schema: None,
        }
    }

    #[test]
    fn the_store_comes_from_the_flags_then_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("warrant.toml");
        std::fs::write(
            &file,
            "[store]\ndatabase = \"postgres://warrant@db.internal/warrant\"\nschema = \"tenant_a\"\n",
        )
        .unwrap();
        let (url, options) = args(Some(file.clone())).resolve().unwrap();
        assert_eq!(
            url,
            DatabaseUrl::Postgres("postgres://warrant@db.internal/warrant".into())
        );
        assert_eq!(options.postgres_schema.as_deref(), Some("tenant_a"));
        let flags = StoreArgs {
            database: Some(format!("sqlite://{}", dir.path().join("x.db").display())),
            database_schema: Some("other".into()),
            ..args(Some(file))
        };
        let (url, options) = flags.resolve().unwrap();
        assert_eq!(url, DatabaseUrl::Sqlite(dir.path().join("x.db")));
        assert_eq!(options.postgres_schema.as_deref(), Some("other"));
    }
}
