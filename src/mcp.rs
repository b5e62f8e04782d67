//! `warrant mcp --key KEY`: the MCP server over stdin/stdout, for desktop agents that launch
//! their tools as processes. It assembles the same gateway as `warrant serve` over the same
//! store, from the same configuration (flags, then `WARRANT_*` variables, then the config
//! file, then defaults; read by `serve::load`), refuses to start with a key that does not
//! authenticate, and then checks the key on every request like the HTTP lane does (a revoked
//! key stops working within the key cache's 2 s). stdout carries only the protocol; logs go
//! to stderr.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use warrant_core::store::Store;
use warrant_server::Gateway;
use warrant_store::SqlStore;

use crate::Exit;
use crate::serve::{ConfigArgs, DEFAULT_LISTEN, init_logging, load};

/// Flags of `warrant mcp` (each also read from its `WARRANT_*` variable).
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The API key whose principal every call runs as.
    #[arg(long, env = "WARRANT_KEY", value_name = "KEY", hide_env_values = true)]
    key: String,
    #[command(flatten)]
    common: ConfigArgs,
}

/// Runs `warrant mcp` until the client closes stdin.
pub fn run(args: &McpArgs) -> Result<Exit> {
    init_logging(false, "warn");
    let loaded = load(&args.common)?;
    let database = loaded.database.clone();
    // Approval links name the server reviewers use: the configured public URL, else where a
    // `warrant serve` with this configuration listens.
    let public_url = loaded
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", loaded.listen.as_deref().unwrap_or(DEFAULT_LISTEN)));
    let key = args.key.trim().to_owned();

    // The requests of the session being answered (counted by the stdio transport), for the
    // request threads to be given as they start: at one request at a time, a write on an idle
    // store runs on the request thread.
    let requests_in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rt = crate::serve::runtime(loaded.workers, &requests_in_flight)?;
    rt.block_on(async move {
        let sql = Arc::new(
            SqlStore::open(&database, &loaded.store_options)
                .await
                .with_context(|| format!("cannot open {}", database.redacted()))?,
        );
        let store: Arc<dyn Store> = sql.clone();
        // An empty store would get its first keys from the gateway, shown to nobody here.
        if !store.has_api_keys().await? {
            bail!("this store has no API keys yet: run `warrant serve` once to create the first keys");
        }
        let gateway = Gateway::start(loaded.gateway(store, public_url, requests_in_flight)).await?;
        // stdout is the protocol's: what `serve` prints in its banner is logged here.
        for u in &gateway.unusable_bindings {
            tracing::warn!(contract = u.contract, id = u.id, error = %u.reason, "adapter binding unusable; its calls will fail");
        }
        let caller = warrant_server::auth::authenticate(&gateway.state, &key)
            .await
            .map_err(|e| anyhow::anyhow!("cannot check the key: {e:?}"))?
            .context("the key is unknown, revoked or malformed")?;
        tracing::info!(
            principal = caller.principal.id(),
            tenant = caller.principal.tenant(),
            "mcp over stdio"
        );
        warrant_server::mcp::serve_stdio(gateway.state.clone(), key)
            .await
            .context("mcp over stdio")?;
        // The client closed its end: calls it started still run to their recorded end.
        warrant_server::shutdown(&gateway).await;
        drop(gateway);
        sql.close().await;
        Ok(Exit::Ok)
    })
}
