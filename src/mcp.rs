//! `warrant mcp --key KEY`: the MCP server over stdin/stdout, for desktop agents that launch
//! their tools as processes. It assembles the same gateway as `warrant serve` over the same
//! store (the flags and their `WARRANT_*` variables mean the same), authenticates the key
//! once at start, and then serves every call as that key's principal. stdout carries only
//! the protocol; logs go to stderr.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use warrant_core::guard::Guards;
use warrant_core::pipeline::Settings;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::AdapterConfig;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

use crate::Exit;
use crate::serve::{allow_hosts_from_env, first_existing, init_logging, redaction_key};

/// Flags of `warrant mcp` (each also read from its `WARRANT_*` variable).
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The API key whose principal every call runs as.
    #[arg(long, env = "WARRANT_KEY", value_name = "KEY", hide_env_values = true)]
    key: String,
    /// The embedded SQLite store's directory.
    #[arg(long, env = "WARRANT_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// `postgres://…` (or `sqlite://…`): overrides the data directory.
    #[arg(long, env = "WARRANT_DATABASE", value_name = "URL")]
    database: Option<String>,
    /// Contract files registered at start. Default: `./contracts`, else `./examples/contracts`.
    #[arg(long, env = "WARRANT_CONTRACTS", value_name = "DIR")]
    contracts: Option<PathBuf>,
    /// Cedar policy files. Default: `./policies`, else `./examples/policies`.
    #[arg(long, env = "WARRANT_POLICY", value_name = "DIR")]
    policy: Option<PathBuf>,
    /// The URL reviewers reach the console at (for approval links).
    #[arg(long, env = "WARRANT_PUBLIC_URL", value_name = "URL")]
    public_url: Option<String>,
}

/// Runs `warrant mcp` until the client closes stdin.
pub fn run(args: &McpArgs) -> Result<Exit> {
    init_logging(false, "warn");
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("./warrant-data"));
    let database = match &args.database {
        Some(url) => DatabaseUrl::parse(url).context("invalid database URL")?,
        None => DatabaseUrl::data_dir(&data_dir),
    };
    let contracts_dir = args
        .contracts
        .clone()
        .or_else(|| first_existing(&["contracts", "examples/contracts"]));
    let policy_dir = args
        .policy
        .clone()
        .or_else(|| first_existing(&["policies", "examples/policies"]));
    let policies = match &policy_dir {
        Some(dir) => PolicySource::read_dir(dir)?,
        None => Vec::new(),
    };
    let net = NetPolicy {
        allow_hosts: allow_hosts_from_env(),
        ..NetPolicy::default()
    };
    let key_file = match &database {
        DatabaseUrl::Sqlite(_) => Some(data_dir.join("redaction.key")),
        DatabaseUrl::Postgres(_) => None,
    };
    let redaction = redaction_key(key_file.as_deref())?;
    let public_url = args
        .public_url
        .clone()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let key = args.key.trim().to_owned();

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let sql = Arc::new(
            SqlStore::open(&database, &StoreOptions::default())
                .await
                .with_context(|| format!("cannot open {}", database.redacted()))?,
        );
        let store: Arc<dyn Store> = sql.clone();
        // An empty store would get its first keys from the gateway, shown to nobody here.
        if !store.has_api_keys().await? {
            bail!("this store has no API keys yet: run `warrant serve` once to create the first keys");
        }
        let gateway = Gateway::start(GatewayConfig {
            store,
            contracts_dir,
            policies,
            guards: Guards::new(),
            budgets: Default::default(),
            redaction,
            adapters: AdapterConfig {
                client: SafeClient::new(net),
                secrets: Secrets::from_env(),
                smtp: None,
                command_roots: Vec::new(),
            },
            runtime: RuntimeSettings::default(),
            settings: Settings::default(),
            limits: HttpLimits::default(),
            public_url,
            first_tenant: "demo".into(),
            background: true,
        })
        .await?;
        let caller = warrant_server::auth::authenticate(&gateway.state, &key)
            .await
            .map_err(|e| anyhow::anyhow!("cannot check the key: {e:?}"))?
            .context("the key is unknown, revoked or malformed")?;
        tracing::info!(
            principal = caller.principal.id(),
            tenant = caller.principal.tenant(),
            "mcp over stdio"
        );
        warrant_server::mcp::serve_stdio(gateway.state.clone(), caller.principal)
            .await
            .context("mcp over stdio")?;
        drop(gateway);
        sql.close().await;
        Ok(Exit::Ok)
    })
}
