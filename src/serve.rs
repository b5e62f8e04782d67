//! `warrant serve`: the gateway. Configuration comes from flags, then `WARRANT_*` environment
//! variables, then the config file (`--config`, default `./warrant.toml` when it exists), then
//! built-in defaults; it is validated before anything starts, with the offending key named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Deserialize;
use warrant_core::guard::{AllowList, Guards};
use warrant_core::pipeline::Settings;
use warrant_core::redact::RedactionKey;
use warrant_core::store::Store;
use warrant_policy::PolicySource;
use warrant_runtime::adapters::{AdapterConfig, RelaySecurity, SmtpRelay};
use warrant_runtime::binding::parse_duration;
use warrant_runtime::model::ModelEndpoint;
use warrant_runtime::net::{NetPolicy, SafeClient};
use warrant_runtime::{CredentialSpec, RuntimeSettings, Secrets};
use warrant_server::{Gateway, GatewayConfig, HttpLimits};
use warrant_store::{DatabaseUrl, SqlStore, StoreOptions};

use crate::Exit;

/// Where a gateway's configuration comes from: the flags `warrant serve` and `warrant mcp`
/// share (each also read from its `WARRANT_*` variable).
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// The config file (TOML). Default: `./warrant.toml` if it exists.
    #[arg(long, env = "WARRANT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The embedded SQLite store's directory.
    #[arg(long, env = "WARRANT_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// `postgres://…` (or `sqlite://…`): overrides the data directory.
    #[arg(long, env = "WARRANT_DATABASE", value_name = "URL")]
    database: Option<String>,
    /// The PostgreSQL schema to use (created if missing); default: the search path.
    #[arg(long, env = "WARRANT_DATABASE_SCHEMA", value_name = "NAME")]
    database_schema: Option<String>,
    /// Contract files registered at start. Default: `./contracts`, else `./examples/contracts`.
    #[arg(long, env = "WARRANT_CONTRACTS", value_name = "DIR")]
    contracts: Option<PathBuf>,
    /// Cedar policy files. Default: `./policies`, else `./examples/policies`.
    #[arg(long, env = "WARRANT_POLICY", value_name = "DIR")]
    policy: Option<PathBuf>,
    /// The URL clients and reviewers reach this server at (printed, and used in approval
    /// links). Default: `server.public_url`, else the listen address.
    #[arg(long, env = "WARRANT_PUBLIC_URL", value_name = "URL")]
    public_url: Option<String>,
}

/// The threads that serve requests when nothing says how many: one fewer than the cores, at
/// least one. The embedded store commits on a thread of its own (group commit: one `fsync` for
/// every write queued meanwhile); with a core left to it, the request threads do not preempt
/// it, and on a small machine fewer request threads also wake each other less (measured in
/// docs/benchmarks.md: one thread on two cores costs 10–20% less CPU per call than two).
pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

/// The runtime of a server: `workers` request threads (default [`default_workers`]).
///
/// One request thread is tokio's current-thread runtime, on the thread that starts the server:
/// the multi-thread scheduler with one worker does the same work through its stealing queues,
/// atomics and a second thread for the accept loop (measured alone: 0.93× the CPU per MCP read
/// at 16 connections, docs/benchmarks.md).
///
/// Given the server's gauge of requests in flight, every request thread may run a write on an
/// idle SQLite store itself ([`warrant_store::write_here_when_alone`]): the current-thread
/// runtime's one thread, which is this thread (it runs whatever `block_on` is given), or each
/// worker of a multi-thread runtime as it starts.
///
/// # Errors
/// The runtime cannot start.
pub(crate) fn runtime(
    workers: Option<usize>,
    requests_in_flight: &Arc<AtomicUsize>,
) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = workers.unwrap_or_else(default_workers).max(1);
    if workers == 1 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        warrant_store::write_here_when_alone(Arc::clone(requests_in_flight));
        return Ok(rt);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(workers).enable_all();
    let gauge = Arc::clone(requests_in_flight);
    builder.on_thread_start(move || warrant_store::write_here_when_alone(Arc::clone(&gauge)));
    builder.build()
}

/// Where a server listens when neither `--listen` nor `server.listen` says.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Flags of `warrant serve` (each also read from its `WARRANT_*` variable).
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    common: ConfigArgs,
    /// Address to listen on.
    #[arg(long, env = "WARRANT_LISTEN", value_name = "ADDR")]
    listen: Option<String>,
    /// Log lines as JSON (`WARRANT_LOG_JSON` takes `1`/`0`, `true`/`false`, `yes`/`no`,
    /// `on`/`off`).
    #[arg(long, env = "WARRANT_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new(),
          num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    log_json: bool,
    /// Threads serving requests. Default: `server.workers`, else one fewer than the cores (at
    /// least one): the embedded store's writer thread keeps a core for its commits.
    #[arg(long, env = "WARRANT_WORKERS", value_name = "N")]
    workers: Option<usize>,
}

/// The config file. Every section and key is optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileConfig {
    server: ServerSection,
    store: StoreSection,
    contracts: ContractsSection,
    policies: DirSection,
    network: NetworkSection,
    adapters: AdaptersSection,
    limits: LimitsSection,
    /// The chat model of workflows' `model` steps.
    model: Option<ModelSection>,
    /// The reviewer console: `[console.notify]` emails reviewers when an approval is requested.
    console: ConsoleSection,
    /// The operator's credential map: `[credentials.NAME] env = "VAR"` (or `secret = "key"` of
    /// the secrets file), `tools = [...]`, `origins = [...]`.
    credentials: BTreeMap<String, CredentialSection>,
    /// Allow-lists per tenant: `[guards.acme] email_recipients = ["*@acme.example"]`.
    guards: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ConsoleSection {
    notify: Option<NotifySection>,
}

/// `[console.notify]`: `from = "warrant@example.com"` and `[console.notify.reviewers]
/// demo = ["sup@example.com"]`, sent through `[adapters.smtp]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifySection {
    from: String,
    #[serde(default)]
    reviewers: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerSection {
    listen: Option<String>,
    public_url: Option<String>,
    first_tenant: Option<String>,
    workers: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct StoreSection {
    data_dir: Option<PathBuf>,
    database: Option<String>,
    schema: Option<String>,
    redaction_key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DirSection {
    dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ContractsSection {
    dir: Option<PathBuf>,
    /// How often to look for contracts registered or retired by other nodes (`0s`: never).
    sync_interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct NetworkSection {
    allow_hosts: Vec<String>,
    allow_plain_http: bool,
    timeout: Option<String>,
    max_response_bytes: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AdaptersSection {
    secrets_file: Option<PathBuf>,
    command_roots: Vec<PathBuf>,
    smtp: Option<SmtpSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SmtpSection {
    host: String,
    port: u16,
    #[serde(default = "starttls")]
    tls: String,
    /// A credential of `[credentials]` whose value is the relay login, `user:password`.
    credential: Option<String>,
}

/// One credential: where its value comes from (exactly one of `env` and `secret`), the tools
/// it is granted to and the origins it may be sent to.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CredentialSection {
    env: Option<String>,
    secret: Option<String>,
    tools: Vec<String>,
    origins: Vec<String>,
}

/// `[model]`: an OpenAI-compatible chat completions endpoint. Its host is reached through the
/// outbound rules of `[network]` like any other (a private or loopback address must be listed
/// in `allow_hosts`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSection {
    /// The API base, e.g. `https://api.openai.com/v1`.
    base_url: String,
    /// The model name.
    model: String,
    /// A credential of `[credentials]` sent as the bearer token.
    credential: Option<String>,
    max_tokens: Option<u32>,
    /// Per request (default 60s; never longer than `network.timeout` allows).
    timeout: Option<String>,
}

/// The model endpoint of `[model]`, its token from the credential map.
fn model_endpoint(cfg: &FileConfig, secrets: &Secrets) -> Result<Option<ModelEndpoint>> {
    let Some(m) = &cfg.model else {
        return Ok(None);
    };
    let base_url = url::Url::parse(&m.base_url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .with_context(|| format!("`model.base_url`: `{}` is not an http(s) URL", m.base_url))?;
    if m.model.trim().is_empty() {
        bail!("`model.model` is empty");
    }
    let credential = match &m.credential {
        None => None,
        Some(name) => Some(
            secrets
                .value_of(name)
                .cloned()
                .with_context(|| format!("`model.credential`: no credential `{name}` in [credentials]"))?,
        ),
    };
    Ok(Some(ModelEndpoint {
        base_url,
        model: m.model.clone(),
        credential,
        max_tokens: m.max_tokens,
        timeout: duration("model.timeout", m.timeout.as_ref(), Duration::from_secs(60))?,
    }))
}

fn starttls() -> String {
    "starttls".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LimitsSection {
    body_bytes: Option<usize>,
    request_timeout: Option<String>,
    concurrency: Option<usize>,
    connections: Option<usize>,
    header_timeout: Option<String>,
    body_timeout: Option<String>,
    auth_failures_per_minute: Option<u32>,
    approval_ttl: Option<String>,
    rejection_window: Option<String>,
    call_deadline: Option<String>,
    overdue_after: Option<String>,
}

fn duration(key: &str, text: Option<&String>, default: Duration) -> Result<Duration> {
    match text {
        None => Ok(default),
        Some(t) => {
            parse_duration(t).with_context(|| format!("`{key}`: `{t}` is not a duration such as 30s or 15m"))
        }
    }
}

/// The operator's credential map from `[credentials]` (values from the named environment
/// variables or the secrets file). Nothing else of the environment is ever a credential.
fn credentials(cfg: &FileConfig) -> Result<Secrets> {
    let file = match &cfg.adapters.secrets_file {
        Some(path) => Secrets::read_file(path).map_err(anyhow::Error::msg)?,
        None => BTreeMap::new(),
    };
    let mut secrets = Secrets::default();
    for (name, c) in &cfg.credentials {
        let key = format!("credentials.{name}");
        let value = match (&c.env, &c.secret) {
            (Some(var), None) => {
                std::env::var(var).with_context(|| format!("`{key}`: the environment has no `{var}`"))?
            }
            (None, Some(secret)) => file
                .get(secret)
                .with_context(|| format!("`{key}`: the secrets file has no `{secret}`"))?
                .expose()
                .to_owned(),
            _ => bail!("`{key}` needs exactly one of `env` and `secret`"),
        };
        let spec = CredentialSpec::new(value)
            .for_tools(&c.tools)
            .and_then(|s| s.to_origins(&c.origins))
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("`{key}`"))?;
        secrets = secrets.with(name.clone(), spec);
    }
    Ok(secrets)
}

/// The SMTP relay of `[adapters.smtp]`, its login from the credential map.
fn smtp_relay(cfg: &FileConfig, secrets: &Secrets) -> Result<Option<SmtpRelay>> {
    let Some(s) = &cfg.adapters.smtp else {
        return Ok(None);
    };
    let relay = SmtpRelay {
        host: s.host.clone(),
        port: s.port,
        security: match s.tls.as_str() {
            "starttls" => RelaySecurity::StartTls,
            "tls" => RelaySecurity::Tls,
            "none" => RelaySecurity::Plain,
            other => bail!("`adapters.smtp.tls` must be starttls, tls or none, not `{other}`"),
        },
        login: match &s.credential {
            Some(name) => Some(
                secrets
                    .value_of(name)
                    .with_context(|| {
                        format!("`adapters.smtp.credential`: no credential `{name}` in [credentials]")
                    })?
                    .clone(),
            ),
            None => None,
        },
    };
    relay
        .check()
        .map_err(anyhow::Error::msg)
        .context("`adapters.smtp`")?;
    Ok(Some(relay))
}

/// The adapter configuration of a config file alone (for `warrant reconcile`): its network
/// rules, credentials, relay and command roots, plus `allow_hosts` and `command_roots` given
/// on the command line.
pub(crate) fn adapter_config(
    path: Option<&Path>,
    allow_hosts: &[String],
    command_roots: &[PathBuf],
) -> Result<AdapterConfig> {
    let cfg = read_config(path)?;
    let secrets = credentials(&cfg)?;
    let smtp = smtp_relay(&cfg, &secrets)?;
    let model = model_endpoint(&cfg, &secrets)?;
    let mut net = net_policy(&cfg)?;
    net.allow_hosts.extend(allow_hosts.iter().cloned());
    let mut roots = cfg.adapters.command_roots.clone();
    roots.extend(command_roots.iter().cloned());
    Ok(AdapterConfig {
        client: SafeClient::new(net),
        secrets,
        smtp,
        command_roots: roots,
        model,
    })
}

/// The runtime's settings a config file's `[limits]` give (`call_deadline`, `overdue_after`),
/// for `warrant reconcile`, which must judge rows as the servers do.
pub(crate) fn runtime_settings(path: Option<&Path>) -> Result<RuntimeSettings> {
    runtime_of(&read_config(path)?)
}

fn runtime_of(cfg: &FileConfig) -> Result<RuntimeSettings> {
    let mut runtime = RuntimeSettings::default();
    runtime.retry.deadline = duration(
        "limits.call_deadline",
        cfg.limits.call_deadline.as_ref(),
        runtime.retry.deadline,
    )?;
    runtime.stale_after = runtime.retry.deadline + Duration::from_secs(30);
    runtime.overdue_after = duration(
        "limits.overdue_after",
        cfg.limits.overdue_after.as_ref(),
        runtime.overdue_after,
    )?;
    if runtime.overdue_after.is_zero() {
        bail!("`limits.overdue_after` must be longer than 0s");
    }
    Ok(runtime)
}

/// Where a config file's `[store]` section puts the store (for `warrant reconcile` and
/// `warrant store check`): its database URL, data directory and PostgreSQL schema.
pub(crate) fn store_config(path: Option<&Path>) -> Result<(Option<String>, Option<PathBuf>, Option<String>)> {
    let cfg = read_config(path)?;
    Ok((cfg.store.database, cfg.store.data_dir, cfg.store.schema))
}

/// The config file: `path`, else `./warrant.toml` if it exists, else the defaults.
fn read_config(path: Option<&Path>) -> Result<FileConfig> {
    let file = match (path, Path::new("warrant.toml").is_file()) {
        (Some(path), _) => Some(path.to_path_buf()),
        (None, true) => Some(PathBuf::from("warrant.toml")),
        (None, false) => None,
    };
    match &file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))
        }
        None => Ok(FileConfig::default()),
    }
}

/// The outbound network rules of `[network]` and `WARRANT_ALLOW_HOSTS`.
fn net_policy(cfg: &FileConfig) -> Result<NetPolicy> {
    let mut net = NetPolicy {
        allow_hosts: cfg.network.allow_hosts.clone(),
        allow_plain_http: cfg.network.allow_plain_http,
        ..NetPolicy::default()
    };
    net.allow_hosts.extend(allow_hosts_from_env());
    net.timeout = duration("network.timeout", cfg.network.timeout.as_ref(), net.timeout)?;
    if let Some(n) = cfg.network.max_response_bytes {
        net.max_response_bytes = n;
    }
    Ok(net)
}

fn first_existing(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.is_dir())
}

/// The contracts directory a server reads when no flag, variable or config key names one:
/// `./contracts`, else `./examples/contracts` (also what `warrant check` loads policies with).
pub(crate) fn default_contracts_dir() -> Option<PathBuf> {
    first_existing(&["contracts", "examples/contracts"])
}

/// The policy directory a server reads when no flag, variable or config key names one:
/// `./policies`, else `./examples/policies`; with neither, no policy (every call denied).
pub(crate) fn default_policy_dir() -> Option<PathBuf> {
    first_existing(&["policies", "examples/policies"])
}

/// The redaction key: `WARRANT_REDACTION_KEY` (hex), else a key file (created on first start
/// beside the embedded store), so redacted values stay comparable across restarts.
fn redaction_key(file: Option<&Path>) -> Result<RedactionKey> {
    if let Ok(hex_key) = std::env::var("WARRANT_REDACTION_KEY") {
        let bytes = hex::decode(hex_key.trim()).context("WARRANT_REDACTION_KEY is not hex")?;
        return RedactionKey::new(bytes).context("WARRANT_REDACTION_KEY must be at least 32 bytes");
    }
    let Some(path) = file else {
        tracing::warn!("no WARRANT_REDACTION_KEY: redacted values are comparable only within this process");
        return RedactionKey::new(rand::random::<[u8; 32]>().to_vec()).context("redaction key");
    };
    if !path.exists() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let key = hex::encode(rand::random::<[u8; 32]>());
        write_private(path, key.as_bytes())?;
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let bytes = hex::decode(text.trim()).with_context(|| format!("{} is not hex", path.display()))?;
    RedactionKey::new(bytes).with_context(|| format!("{} must hold at least 32 bytes", path.display()))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

/// The hosts `WARRANT_ALLOW_HOSTS` (comma-separated) allows besides the config file's.
fn allow_hosts_from_env() -> Vec<String> {
    std::env::var("WARRANT_ALLOW_HOSTS")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The crates whose events a default filter shows at the gateway's own level; every other
/// crate (the MCP SDK writes three INFO lines per call, hyper, sqlx, …) shows only WARN and
/// above unless `WARRANT_LOG` asks for more.
const OWN_CRATES: [&str; 6] = [
    "warrant",
    "warrant_core",
    "warrant_policy",
    "warrant_store",
    "warrant_runtime",
    "warrant_server",
];

/// The filter used when `WARRANT_LOG` is not set: `own` (e.g. `info`) for Warrant's crates,
/// `warn` for every dependency.
pub(crate) fn default_log_filter(own: &str) -> String {
    let mut filter = String::from("warn");
    for krate in OWN_CRATES {
        filter.push_str(&format!(",{krate}={own}"));
    }
    filter
}

/// Logs to stderr, filtered by `WARRANT_LOG` (a `tracing` filter such as `debug` or
/// `info,rmcp=info`, which replaces the default) else [`default_log_filter`]`(own)`, as JSON
/// lines if asked.
pub(crate) fn init_logging(json: bool, own: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WARRANT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log_filter(own)));
    // Colours only on a terminal (and not with `NO_COLOR`): a log file or collector gets plain
    // text, and no request pays for styling its span's fields.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        let _ = builder.json().try_init();
    } else if ansi {
        let _ = builder.try_init();
    } else {
        let _ = builder.fmt_fields(crate::logfmt::PlainFields).try_init();
    }
}

/// Where a server's contracts and policies came from, for its banner.
struct Sources {
    contracts_dir: Option<PathBuf>,
    policy_dir: Option<PathBuf>,
    policy_files: usize,
}

impl Sources {
    /// The banner's lines on contracts, policies and unusable bindings: what was loaded and
    /// from where, and for what is missing, what to do.
    fn banner(&self, registered: usize, unusable: &[warrant_server::UnusableBinding]) -> Vec<String> {
        let mut lines = Vec::new();
        lines.push(match &self.contracts_dir {
            Some(dir) => format!("  contracts  {registered} registered (loaded {})", dir.display()),
            None => format!(
                "  contracts  {registered} registered (no ./contracts or ./examples/contracts here: \
                 pass --contracts DIR, or register with `warrant contract register FILE`)"
            ),
        });
        lines.push(match &self.policy_dir {
            Some(dir) if self.policy_files == 0 => format!(
                "  policies   none, so every call is denied (no *.cedar file in {})",
                dir.display()
            ),
            Some(dir) => format!(
                "  policies   {} file{} (loaded {})",
                self.policy_files,
                if self.policy_files == 1 { "" } else { "s" },
                dir.display()
            ),
            None => "  policies   none, so every call is denied (no ./policies or ./examples/policies \
                     here: pass --policy DIR)"
                .to_owned(),
        });
        for u in unusable {
            lines.push(format!(
                "  unusable   {}: {} (its calls fail until warrant.toml provides it: docs/operations.md)",
                u.contract, u.reason
            ));
        }
        lines
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing calls in flight");
}

/// A gateway's configuration, resolved from flags, `WARRANT_*` variables, the config file and
/// defaults (in that order) and validated: what `warrant serve` and `warrant mcp` both start
/// from.
pub(crate) struct Loaded {
    /// `server.listen`, if set.
    pub(crate) listen: Option<String>,
    /// The store.
    pub(crate) database: DatabaseUrl,
    /// How to open it.
    pub(crate) store_options: StoreOptions,
    /// The contracts registered at start.
    pub(crate) contracts_dir: Option<PathBuf>,
    /// Where the policies were read from.
    pub(crate) policy_dir: Option<PathBuf>,
    /// `--public-url` / `WARRANT_PUBLIC_URL`, else the file's `server.public_url`, without a
    /// trailing `/`.
    pub(crate) public_url: Option<String>,
    /// The tenant of the first keys of an empty store.
    pub(crate) first_tenant: String,
    /// `server.workers`, if set.
    pub(crate) workers: Option<usize>,
    policies: Vec<PolicySource>,
    guards: Guards,
    adapters: AdapterConfig,
    limits: HttpLimits,
    runtime: RuntimeSettings,
    settings: Settings,
    redaction: RedactionKey,
    contract_sync_every: Duration,
    review_mail: Option<warrant_server::events::ReviewMail>,
}

impl Loaded {
    /// The gateway over `store`, reached by clients at `public_url`.
    pub(crate) fn gateway(
        self,
        store: Arc<dyn Store>,
        public_url: String,
        requests_in_flight: Arc<AtomicUsize>,
    ) -> GatewayConfig {
        GatewayConfig {
            store,
            contracts_dir: self.contracts_dir,
            policies: self.policies,
            guards: self.guards,
            budgets: Default::default(),
            redaction: self.redaction,
            adapters: self.adapters,
            runtime: self.runtime,
            settings: self.settings,
            limits: self.limits,
            public_url,
            first_tenant: self.first_tenant,
            background: true,
            contract_sync_every: self.contract_sync_every,
            review_mail: self.review_mail,
            requests_in_flight,
        }
    }
}

/// Reads and validates the configuration (see [`Loaded`]).
pub(crate) fn load(args: &ConfigArgs) -> Result<Loaded> {
    let cfg = read_config(args.config.as_deref())?;
    let data_dir = args
        .data_dir
        .clone()
        .or(cfg.store.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from("./warrant-data"));
    let database = match args.database.clone().or(cfg.store.database.clone()) {
        Some(url) => DatabaseUrl::parse(&url).context("invalid database URL")?,
        None => DatabaseUrl::data_dir(&data_dir),
    };
    let contracts_dir = args
        .contracts
        .clone()
        .or(cfg.contracts.dir.clone())
        .or_else(default_contracts_dir);
    let policy_dir = args
        .policy
        .clone()
        .or(cfg.policies.dir.clone())
        .or_else(default_policy_dir);
    let policies = match &policy_dir {
        Some(dir) => PolicySource::read_dir(dir)?,
        None => Vec::new(),
    };
    let mut guards = Guards::new();
    for (tenant, lists) in &cfg.guards {
        for (name, entries) in lists {
            let list = AllowList::new(entries.iter().map(String::as_str))
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("`guards.{tenant}.{name}`"))?;
            guards.set(tenant, name, list);
        }
    }
    let secrets = credentials(&cfg)?;
    let smtp = smtp_relay(&cfg, &secrets)?;
    let model = model_endpoint(&cfg, &secrets)?;
    let net = net_policy(&cfg)?;
    let defaults = HttpLimits::default();
    let limits = HttpLimits {
        body_bytes: cfg.limits.body_bytes.unwrap_or(defaults.body_bytes),
        request_timeout: duration(
            "limits.request_timeout",
            cfg.limits.request_timeout.as_ref(),
            defaults.request_timeout,
        )?,
        concurrency: cfg.limits.concurrency.unwrap_or(defaults.concurrency).max(1),
        connections: cfg.limits.connections.unwrap_or(defaults.connections).max(1),
        header_timeout: duration(
            "limits.header_timeout",
            cfg.limits.header_timeout.as_ref(),
            defaults.header_timeout,
        )?,
        body_timeout: duration(
            "limits.body_timeout",
            cfg.limits.body_timeout.as_ref(),
            defaults.body_timeout,
        )?,
        auth_failures_per_minute: cfg
            .limits
            .auth_failures_per_minute
            .unwrap_or(defaults.auth_failures_per_minute)
            .max(1),
    };
    for (key, value) in [
        ("limits.header_timeout", limits.header_timeout),
        ("limits.body_timeout", limits.body_timeout),
        ("limits.request_timeout", limits.request_timeout),
    ] {
        if value.is_zero() {
            bail!("`{key}` must be longer than 0s");
        }
    }
    let runtime = runtime_of(&cfg)?;
    let mut settings = Settings::default();
    let ttl = duration(
        "limits.approval_ttl",
        cfg.limits.approval_ttl.as_ref(),
        Duration::from_secs(15 * 60),
    )?;
    settings.approval_ttl = time::Duration::try_from(ttl).context("`limits.approval_ttl` is too long")?;
    let window = duration(
        "limits.rejection_window",
        cfg.limits.rejection_window.as_ref(),
        Duration::from_secs(15 * 60),
    )?;
    settings.rejection_window =
        time::Duration::try_from(window).context("`limits.rejection_window` is too long")?;
    let contract_sync_every = duration(
        "contracts.sync_interval",
        cfg.contracts.sync_interval.as_ref(),
        warrant_server::CONTRACT_SYNC_EVERY,
    )?;
    let key_file = cfg.store.redaction_key_file.clone().or_else(|| match &database {
        DatabaseUrl::Sqlite(_) => Some(data_dir.join("redaction.key")),
        DatabaseUrl::Postgres(_) => None,
    });
    let redaction = redaction_key(key_file.as_deref())?;
    let store_options = StoreOptions {
        postgres_schema: args.database_schema.clone().or(cfg.store.schema.clone()),
        ..StoreOptions::default()
    };
    let public_url = args
        .public_url
        .clone()
        .or_else(|| cfg.server.public_url.clone())
        .map(|u| u.trim_end_matches('/').to_owned());
    let first_tenant = cfg.server.first_tenant.clone().unwrap_or_else(|| "demo".into());
    let adapters = AdapterConfig {
        client: SafeClient::new(net),
        secrets,
        smtp,
        command_roots: cfg.adapters.command_roots,
        model,
    };
    let review_mail = cfg.console.notify.map(|n| warrant_server::events::ReviewMail {
        from: n.from,
        reviewers: n.reviewers,
    });
    if review_mail.is_some() && adapters.smtp.is_none() {
        bail!("`console.notify` sends through `[adapters.smtp]`, which is not configured");
    }
    Ok(Loaded {
        review_mail,
        listen: cfg.server.listen,
        workers: cfg.server.workers,
        database,
        store_options,
        contracts_dir,
        policy_dir,
        public_url,
        first_tenant,
        policies,
        guards,
        adapters,
        limits,
        runtime,
        settings,
        redaction,
        contract_sync_every,
    })
}

/// Runs `warrant serve` until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> Result<Exit> {
    init_logging(args.log_json, "info");
    let loaded = load(&args.common)?;
    let listen = args
        .listen
        .clone()
        .or_else(|| loaded.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.into());
    let database = loaded.database.clone();
    let sources = Sources {
        contracts_dir: loaded.contracts_dir.clone(),
        policy_dir: loaded.policy_dir.clone(),
        policy_files: loaded.policies.len(),
    };
    let first_tenant = loaded.first_tenant.clone();

    // Counted at the edge; made first, for the request threads to be given as they start.
    let requests_in_flight = Arc::new(AtomicUsize::new(0));
    let rt = runtime(args.workers.or(loaded.workers), &requests_in_flight)?;
    rt.block_on(async move {
        if tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            // One request thread: the store's answers reach it with one wake per commit.
            warrant_store::deliver_answers_here();
        }
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let public_url = match &loaded.public_url {
            Some(url) => url.clone(),
            None => format!("http://{}", listener.local_addr()?),
        };
        let sql = Arc::new(
            SqlStore::open(&database, &loaded.store_options)
                .await
                .with_context(|| format!("cannot open {}", database.redacted()))?,
        );
        let store: Arc<dyn Store> = sql.clone();
        let gateway = Gateway::start(loaded.gateway(store, public_url.clone(), requests_in_flight)).await?;
        let contracts = gateway.state.store.list_contracts().await?.len();
        println!("warrant is listening on {public_url}");
        println!("  API        {public_url}/v1");
        println!("  MCP        {public_url}/mcp");
        println!("  metrics    {public_url}/metrics");
        println!("  store      {}", database.redacted());
        for line in sources.banner(contracts, &gateway.unusable_bindings) {
            println!("{line}");
        }
        if args.log_json {
            // Log pipelines get what the banner says is missing.
            for u in &gateway.unusable_bindings {
                tracing::warn!(contract = u.contract, id = u.id, error = %u.reason, "adapter binding unusable; its calls will fail");
            }
        }
        if let Some(keys) = &gateway.first_keys {
            println!(
                "first start: the platform operator's key and two keys for tenant `{first_tenant}`, shown only now"
            );
            println!("  operator   {}", keys.operator);
            println!("  admin      {}", keys.admin);
            println!("  agent      {}", keys.agent);
        }
        println!("ready (SIGTERM or Ctrl-C stops it, finishing calls in flight)");
        warrant_server::serve(listener, &gateway, shutdown_signal()).await?;
        drop(gateway);
        sql.close().await;
        Ok(Exit::Ok)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_json_takes_the_usual_spellings_of_a_boolean() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let parse = |args: &[&str]| {
            <Cli as clap::Parser>::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
                .map(|cli| cli.serve.log_json)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]), Ok(false));
        assert_eq!(parse(&["--log-json"]), Ok(true));
        for (value, json) in [
            ("1", true),
            ("true", true),
            ("yes", true),
            ("on", true),
            ("0", false),
            ("off", false),
        ] {
            assert_eq!(parse(&["--log-json", value]), Ok(json), "{value}");
            assert_eq!(parse(&[&format!("--log-json={value}")]), Ok(json), "{value}");
        }
        assert!(parse(&["--log-json", "maybe"]).is_err());
    }

    #[test]
    fn one_request_thread_is_the_current_thread_runtime() {
        use tokio::runtime::RuntimeFlavor;
        let gauge = Arc::new(AtomicUsize::new(0));
        let flavor = |workers| runtime(Some(workers), &gauge).unwrap().handle().runtime_flavor();
        assert_eq!(flavor(0), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(1), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(2), RuntimeFlavor::MultiThread);
    }

    #[test]
    fn every_request_thread_may_write_on_an_idle_store() {
        let gauge = Arc::new(AtomicUsize::new(0));
        let on_a_worker = |rt: &tokio::runtime::Runtime| {
            rt.block_on(async { tokio::spawn(async { warrant_store::writes_here_when_alone() }).await })
                .unwrap()
        };
        // Workers of a multi-thread runtime, given the gauge as they start: each of them.
        let rt = runtime(Some(2), &gauge).unwrap();
        for _ in 0..8 {
            assert!(on_a_worker(&rt));
        }
        // The workers of a runtime made otherwise: none.
        let plain = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        assert!(!on_a_worker(&plain));
        // The current-thread runtime runs on the thread that made it.
        assert!(!warrant_store::writes_here_when_alone());
        let rt = runtime(Some(1), &gauge).unwrap();
        assert!(warrant_store::writes_here_when_alone());
        assert!(on_a_worker(&rt));
    }

    #[test]
    fn credentials_come_only_from_the_explicit_map() {
        let cfg = |text: &str| toml::from_str::<FileConfig>(text).unwrap();
        // PATH exists in every environment, but only a listed credential is one.
        let secrets = credentials(&cfg(
            "[credentials.TOOL]\nenv = \"PATH\"\ntools = [\"lookup_order\"]\norigins = [\"https://x.example\"]\n",
        ))
        .unwrap();
        assert_eq!(secrets.names().collect::<Vec<_>>(), vec!["TOOL"]);
        assert!(secrets.value_of("PATH").is_none() && secrets.value_of("HOME").is_none());
        for bad in [
            "[credentials.A]\nenv = \"WARRANT_TEST_SURELY_UNSET_VAR\"\n",
            "[credentials.A]\nenv = \"PATH\"\nsecret = \"a\"\n",
            "[credentials.A]\n",
            "[credentials.A]\nenv = \"PATH\"\norigins = [\"https://x.example/path\"]\n",
            "[credentials.A]\nenv = \"PATH\"\ntools = [\"Not A Tool\"]\n",
        ] {
            assert!(credentials(&cfg(bad)).is_err(), "{bad}");
        }
        let plain = cfg(
            "[credentials.LOGIN]\nenv = \"PATH\"\n[adapters.smtp]\nhost = \"smtp.example\"\nport = 25\ntls = \"none\"\ncredential = \"LOGIN\"\n",
        );
        let secrets = credentials(&plain).unwrap();
        let err = smtp_relay(&plain, &secrets).unwrap_err();
        assert!(format!("{err:#}").contains("without TLS"), "{err:#}");
        let unknown = cfg("[adapters.smtp]\nhost = \"smtp.example\"\nport = 587\ncredential = \"NOPE\"\n");
        assert!(smtp_relay(&unknown, &Secrets::default()).is_err());
    }

    #[test]
    fn the_model_endpoint_takes_its_token_from_the_credential_map() {
        let cfg = |text: &str| toml::from_str::<FileConfig>(text).unwrap();
        let good = cfg(
            "[credentials.LLM]\nenv = \"PATH\"\n[model]\nbase_url = \"https://llm.example/v1\"\nmodel = \"m\"\ncredential = \"LLM\"\ntimeout = \"30s\"\n",
        );
        let endpoint = model_endpoint(&good, &credentials(&good).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(endpoint.base_url.as_str(), "https://llm.example/v1");
        assert_eq!(endpoint.timeout, Duration::from_secs(30));
        assert!(endpoint.credential.is_some());
        // The token never shows in a debug print.
        assert!(!format!("{endpoint:?}").contains(&std::env::var("PATH").unwrap()));
        for bad in [
            "[model]\nbase_url = \"https://llm.example/v1\"\nmodel = \"m\"\ncredential = \"NOPE\"\n",
            "[model]\nbase_url = \"file:///etc/passwd\"\nmodel = \"m\"\n",
            "[model]\nbase_url = \"https://llm.example/v1\"\nmodel = \" \"\n",
        ] {
            let c = cfg(bad);
            assert!(model_endpoint(&c, &credentials(&c).unwrap()).is_err(), "{bad}");
        }
        assert!(
            toml::from_str::<FileConfig>(
                "[model]\nbase_url = \"https://x\"\nmodel = \"m\"\napi_key = \"sk\"\n"
            )
            .is_err()
        );
        assert!(model_endpoint(&cfg(""), &Secrets::default()).unwrap().is_none());
    }

    #[test]
    fn reviewer_mail_is_read_strictly() {
        let c: FileConfig = toml::from_str(
            "[console.notify]\nfrom = \"warrant@example.com\"\n[console.notify.reviewers]\ndemo = [\"sup@example.com\"]\n",
        )
        .unwrap();
        let notify = c.console.notify.unwrap();
        assert_eq!(notify.from, "warrant@example.com");
        assert_eq!(notify.reviewers["demo"], ["sup@example.com"]);
        assert!(toml::from_str::<FileConfig>("[console.notify]\nfrom = \"a@b.c\"\nto = []\n").is_err());
        assert!(toml::from_str::<FileConfig>("[console]\nnotfy = {}\n").is_err());
    }

    #[test]
    fn the_example_config_is_valid_and_unknown_keys_are_refused() {
        let cfg: FileConfig = toml::from_str(include_str!("../warrant.example.toml")).unwrap();
        assert_eq!(cfg.server.listen.as_deref(), Some("127.0.0.1:8080"));
        assert_eq!(cfg.limits.approval_ttl.as_deref(), Some("15m"));
        // The file says its values are the defaults: they must be the code's.
        let sync = duration(
            "contracts.sync_interval",
            cfg.contracts.sync_interval.as_ref(),
            Duration::ZERO,
        );
        assert_eq!(sync.unwrap(), warrant_server::CONTRACT_SYNC_EVERY);
        let defaults = HttpLimits::default();
        let l = &cfg.limits;
        let time = |key, t: Option<&String>| duration(key, t, Duration::ZERO).unwrap();
        assert_eq!(l.body_bytes, Some(defaults.body_bytes));
        assert_eq!(time("r", l.request_timeout.as_ref()), defaults.request_timeout);
        assert_eq!(l.concurrency, Some(defaults.concurrency));
        assert_eq!(l.connections, Some(defaults.connections));
        assert_eq!(time("h", l.header_timeout.as_ref()), defaults.header_timeout);
        assert_eq!(time("b", l.body_timeout.as_ref()), defaults.body_timeout);
        assert_eq!(
            l.auth_failures_per_minute,
            Some(defaults.auth_failures_per_minute)
        );
        let err = toml::from_str::<FileConfig>("[server]\nlisten = \"x\"\nport = 1\n").unwrap_err();
        assert!(err.to_string().contains("port"), "{err}");
        let err = toml::from_str::<FileConfig>("[limits]\nconcurrency = \"many\"\n").unwrap_err();
        assert!(err.to_string().contains("concurrency"), "{err}");
    }
}
