//! The command line over a running server's API: `approvals`, `ledger`, `keys`, `tenants` and
//! `contract register|list|retire|export`. `--server` / `WARRANT_SERVER` names the server,
//! `--key` / `WARRANT_KEY` the caller's key.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::Exit;
use crate::io::read_input;

/// Where the server is and who is calling.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The server's base URL.
    #[arg(
        long,
        env = "WARRANT_SERVER",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    server: String,
    /// The caller's API key.
    #[arg(long, env = "WARRANT_KEY", hide_env_values = true, global = true)]
    key: Option<String>,
}

/// `warrant approvals …`
#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// Approval requests of your tenant (default: pending).
    List {
        /// pending, approved, rejected, expired or consumed.
        #[arg(long, default_value = "pending")]
        status: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a request.
    Approve {
        /// The approval id.
        id: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a request.
    Reject {
        /// The approval id.
        id: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// `warrant webhooks …`
#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Add an endpoint; prints its id and its secret (shown only now).
    Add {
        /// The endpoint URL.
        url: String,
        /// An event type to deliver (repeat; none: every type).
        #[arg(long = "event")]
        events: Vec<String>,
        /// Free text.
        #[arg(long)]
        description: Option<String>,
        /// Sign with Ed25519 (`v1a`; prints the public key receivers verify with) instead of
        /// a shared secret (`v1`).
        #[arg(long)]
        ed25519: bool,
    },
    /// Your tenant's endpoints.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A new secret (printed only now); the previous one signs beside it for 24 hours.
    Rotate {
        /// The endpoint id.
        id: String,
    },
    /// Stop delivering to an endpoint.
    Disable {
        /// The endpoint id.
        id: String,
    },
    /// Deliver to an endpoint again.
    Enable {
        /// The endpoint id.
        id: String,
    },
    /// An endpoint's recent delivery attempts.
    Deliveries {
        /// The endpoint id.
        id: String,
    },
    /// The dead-letter queue.
    Dead,
    /// Deliver a dead message again (or every dead message with `--all`).
    Replay {
        /// The message id.
        id: Option<String>,
        /// Every dead message.
        #[arg(long)]
        all: bool,
    },
}

/// Runs a `warrant webhooks` command.
///
/// # Errors
/// The server cannot be reached or answers something unreadable.
pub fn webhooks(args: &ServerArgs, command: &WebhooksCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        let answer = match command {
            WebhooksCommand::Add {
                url,
                events,
                description,
                ed25519,
            } => {
                let signature = if *ed25519 { "ed25519" } else { "hmac" };
                client
                    .post_json(
                        "/v1/webhooks",
                        Some(json!({"url": url, "events": events, "description": description, "signature": signature})),
                    )
                    .await?
            }
            WebhooksCommand::List { json } => match client.call(Method::GET, "/v1/webhooks", None).await? {
                Ok(v) if !*json => {
                    for e in at(&v, "endpoints").as_array().into_iter().flatten() {
                        println!(
                            "{}  {}  {}  events={}",
                            at(e, "id").as_str().unwrap_or(""),
                            if at(e, "enabled").as_bool() == Some(true) {
                                "enabled"
                            } else {
                                "disabled"
                            },
                            at(e, "url").as_str().unwrap_or(""),
                            at(e, "events")
                                .as_array()
                                .filter(|a| !a.is_empty())
                                .map_or("all".to_owned(), |a| {
                                    a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")
                                }),
                        );
                    }
                    return Ok(Exit::Ok);
                }
                other => other,
            },
            WebhooksCommand::Rotate { id } => {
                client
                    .post_json(&format!("/v1/webhooks/{}/rotate", segment(id)), None)
                    .await?
            }
            WebhooksCommand::Disable { id } => {
                client
                    .post_json(&format!("/v1/webhooks/{}/disable", segment(id)), None)
                    .await?
            }
            WebhooksCommand::Enable { id } => {
                client
                    .post_json(&format!("/v1/webhooks/{}/enable", segment(id)), None)
                    .await?
            }
            WebhooksCommand::Deliveries { id } => {
                client
                    .call(
                        Method::GET,
                        &format!("/v1/webhooks/{}/deliveries", segment(id)),
                        None,
                    )
                    .await?
            }
            WebhooksCommand::Dead => client.call(Method::GET, "/v1/webhooks/dead", None).await?,
            WebhooksCommand::Replay { id, all } => {
                let ids: Vec<String> = match (id, all) {
                    (Some(id), false) => vec![id.clone()],
                    (None, true) => match client.call(Method::GET, "/v1/webhooks/dead", None).await? {
                        Ok(v) => at(&v, "messages")
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|m| at(m, "message_id").as_str().map(str::to_owned))
                            .collect(),
                        Err(m) => return Ok(refused(&m)),
                    },
                    _ => bail!("name one message id, or --all"),
                };
                for id in &ids {
                    if let Err(m) = client
                        .post_json(&format!("/v1/webhooks/dead/{}/replay", segment(id)), None)
                        .await?
                    {
                        return Ok(refused(&m));
                    }
                    println!("replayed={id}");
                }
                return Ok(Exit::Ok);
            }
        };
        match answer {
            Ok(v) => {
                print(&v);
                Ok(Exit::Ok)
            }
            Err(m) => Ok(refused(&m)),
        }
    })
}

/// `warrant inbound …`
#[derive(Debug, Subcommand)]
pub enum InboundCommand {
    /// Add a source; prints its id, its URL and — when Warrant made it — its secret (shown
    /// only now).
    Add {
        /// How the source signs: `standard_webhooks`, `stripe` or `github`.
        provider: String,
        /// The id of the API key whose principal the source's work acts as (not an admin's).
        #[arg(long)]
        key_id: String,
        /// Start a run of this published workflow (`name@version`).
        #[arg(long, conflicts_with = "tool")]
        workflow: Option<String>,
        /// Or make a call of this contract (`name@version` or a content id).
        #[arg(long)]
        tool: Option<String>,
        /// The run's input or the call's arguments: JSON whose strings may bind the event
        /// (`"${event.data.object.id}"`, `"${delivery.type}"`); a run's input defaults to the
        /// whole event.
        #[arg(long)]
        map: Option<String>,
        /// The provider's signing secret (required for Stripe; made here for the others when
        /// absent).
        #[arg(long)]
        secret: Option<String>,
        /// Free text.
        #[arg(long)]
        description: Option<String>,
    },
    /// Your tenant's sources, with their refusal counts.
    List,
    /// A new secret (the one given, or one made and printed now); the previous one is accepted
    /// for 24 hours.
    Rotate {
        /// The source id.
        id: String,
        /// The provider's new secret.
        #[arg(long)]
        secret: Option<String>,
    },
    /// Stop accepting a source's deliveries.
    Disable {
        /// The source id.
        id: String,
    },
    /// Accept a source's deliveries again.
    Enable {
        /// The source id.
        id: String,
    },
    /// A source's events, newest first, with what each did.
    Events {
        /// The source id.
        id: String,
    },
}

/// Runs a `warrant inbound` command.
///
/// # Errors
/// The server cannot be reached or answers something unreadable, or `--map` is not JSON.
pub fn inbound(args: &ServerArgs, command: &InboundCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        let answer = match command {
            InboundCommand::Add {
                provider,
                key_id,
                workflow,
                tool,
                map,
                secret,
                description,
            } => {
                let mapping: Option<Value> = map
                    .as_deref()
                    .map(serde_json::from_str)
                    .transpose()
                    .context("--map is not JSON")?;
                let action = match (workflow, tool) {
                    (Some(w), None) => match mapping {
                        Some(input) => json!({"workflow": w, "input": input}),
                        None => json!({"workflow": w}),
                    },
                    (None, Some(t)) => json!({"tool": t, "arguments": mapping.unwrap_or_else(|| json!({}))}),
                    _ => bail!("name what an event does: --workflow NAME@VERSION or --tool NAME@VERSION"),
                };
                let mut body = json!({"provider": provider, "key_id": key_id, "action": action});
                if let Value::Object(fields) = &mut body {
                    if let Some(secret) = secret {
                        fields.insert("secret".into(), json!(secret));
                    }
                    if let Some(description) = description {
                        fields.insert("description".into(), json!(description));
                    }
                }
                client.post_json("/v1/inbound-sources", Some(body)).await?
            }
            InboundCommand::List => client.call(Method::GET, "/v1/inbound-sources", None).await?,
            InboundCommand::Rotate { id, secret } => {
                let body = secret.as_ref().map(|s| json!({"secret": s}));
                client
                    .post_json(&format!("/v1/inbound-sources/{}/rotate", segment(id)), body)
                    .await?
            }
            InboundCommand::Disable { id } => {
                client
                    .post_json(&format!("/v1/inbound-sources/{}/disable", segment(id)), None)
                    .await?
            }
            InboundCommand::Enable { id } => {
                client
                    .post_json(&format!("/v1/inbound-sources/{}/enable", segment(id)), None)
                    .await?
            }
            InboundCommand::Events { id } => {
                client
                    .call(
                        Method::GET,
                        &format!("/v1/inbound-sources/{}/events", segment(id)),
                        None,
                    )
                    .await?
            }
        };
        match answer {
            Ok(v) => {
                print(&v);
                Ok(Exit::Ok)
            }
            Err(m) => Ok(refused(&m)),
        }
    })
}

/// `warrant ledger …`
#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// The newest rows, one line each; `--follow` keeps printing new ones.
    Tail {
        /// How many rows.
        #[arg(short = 'n', long, default_value_t = 20)]
        lines: u32,
        /// Only this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Keep polling for new rows.
        #[arg(short, long)]
        follow: bool,
    },
    /// One row, as JSON.
    Show {
        /// The ledger id.
        id: String,
    },
}

/// `warrant keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key in your tenant (admin), or in `--tenant` (the platform operator); prints
    /// it once.
    Create {
        /// The tenant (the platform operator only; default: your own).
        #[arg(long)]
        tenant: Option<String>,
        /// The principal the key authenticates.
        #[arg(long)]
        principal: String,
        /// Granted scopes, comma-separated.
        #[arg(long, value_delimiter = ',')]
        grants: Vec<String>,
        /// Roles, comma-separated.
        #[arg(long, value_delimiter = ',')]
        roles: Vec<String>,
        /// A label.
        #[arg(long)]
        label: Option<String>,
    },
    /// The keys of your tenant (admin): id, principal, grants, roles, label, and whether
    /// revoked. Never a key or its hash.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key (admin).
    Revoke {
        /// The key id (the part after `wrn_`, before the second `_`).
        id: String,
    },
}

/// The server-side `contract` subcommands (each takes `--server` and `--key`; the local ones,
/// `lint` and `hash`, take neither).
#[derive(Debug, Subcommand)]
pub enum RemoteContractCommand {
    /// Register a contract file on the server: in your tenant (admin), or as a platform
    /// contract or for `--tenant` (the platform operator, who alone may bind adapters).
    Register {
        /// The contract file (YAML or JSON).
        file: String,
        /// The tenant to register it for (the platform operator only).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Contracts you can see on the server (the platform's and your tenant's).
    List {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Retire a contract by content id (admin of its tenant; the platform operator for
    /// platform contracts or `--tenant`).
    Retire {
        /// `tool-contract@sha256:…`
        id: String,
        /// The tenant whose contract it is (the platform operator only).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Print a registered contract's document as JSON (what its content id covers, without
    /// the adapter binding): `contract hash` of the output is the registered id, and it
    /// registers again as is. Your tenant's contract of that name first, then the platform's.
    Export {
        /// The contract name.
        name: String,
        /// The version.
        version: u32,
        /// The tenant whose contract it is (the platform operator only).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
}

impl RemoteContractCommand {
    fn server(&self) -> &ServerArgs {
        match self {
            RemoteContractCommand::Register { server, .. }
            | RemoteContractCommand::List { server }
            | RemoteContractCommand::Retire { server, .. }
            | RemoteContractCommand::Export { server, .. } => server,
        }
    }
}

/// `warrant tenants …` (the platform operator).
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant and its first admin key; prints the key once.
    Create {
        /// The tenant id.
        id: String,
        /// A label.
        #[arg(long)]
        label: Option<String>,
        /// The principal of the first admin key (default `admin`).
        #[arg(long)]
        admin: Option<String>,
    },
    /// Every tenant.
    List,
}

/// `warrant console …`.
#[derive(Debug, Subcommand)]
pub enum ConsoleCommand {
    /// Print a one-time link that signs the key's principal in to the reviewer console
    /// (valid 15 minutes, usable once).
    Link,
}

struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    fn new(args: &ServerArgs) -> Result<Self> {
        let key = args
            .key
            .clone()
            .context("no key: pass --key or set WARRANT_KEY")?;
        // reqwest takes rustls's process-wide provider; an error means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(70))
                .build()?,
            base: args.server.trim_end_matches('/').to_owned(),
            key,
        })
    }

    /// Sends a request; `Ok(Err(refusal))` for an API refusal.
    /// `POST`s `body` (JSON) to `path`.
    async fn post_json(
        &self,
        path: &str,
        body: Option<Value>,
    ) -> Result<std::result::Result<Value, Refusal>> {
        self.call(
            Method::POST,
            path,
            body.map(|b| (b.to_string().into_bytes(), "application/json")),
        )
        .await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &str)>,
    ) -> Result<std::result::Result<Value, Refusal>> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some((bytes, content_type)) = body {
            req = req.header("content-type", content_type).body(bytes);
        }
        let response = req
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status();
        let text = response.text().await?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            Ok(Ok(value))
        } else {
            let e = at(&value, "error");
            let message = match (
                at(e, "stage").as_str(),
                at(e, "code").as_str(),
                at(e, "message").as_str(),
            ) {
                (Some(stage), Some(code), Some(m)) => format!("{status}: {stage} {code}: {m}"),
                _ => format!("{status}: {value}"),
            };
            Ok(Err(Refusal { message, body: value }))
        }
    }
}

/// An API refusal: the one-line message (status, stage, code, message) and the body it came
/// in, for the details some refusals carry (a contract's `problems`).
#[derive(Debug)]
struct Refusal {
    message: String,
    body: Value,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Refusal {
    /// The `problems` beside the answer's `error`, each `pointer: message` (a contract refused
    /// by the registration lint), in the server's order; the document's root is `/`, as
    /// `contract lint` prints it.
    fn problems(&self) -> Vec<String> {
        at(&self.body, "problems")
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let pointer = at(p, "pointer").as_str().filter(|p| !p.is_empty()).unwrap_or("/");
                format!("{pointer}: {}", at(p, "message").as_str().unwrap_or(""))
            })
            .collect()
    }
}

fn block_on<F: std::future::Future<Output = Result<Exit>>>(f: F) -> Result<Exit> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn refused(message: &impl std::fmt::Display) -> Exit {
    eprintln!("error: {message}");
    Exit::Problems
}

fn print(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

/// Runs `warrant approvals …`.
pub fn approvals(args: &ServerArgs, command: &ApprovalsCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        let (path, body) = match command {
            ApprovalsCommand::List { status, json } => {
                let answer = match client
                    .call(Method::GET, &format!("/v1/approvals?status={status}"), None)
                    .await?
                {
                    Ok(v) => v,
                    Err(m) => return Ok(refused(&m)),
                };
                if *json {
                    print(&answer);
                } else {
                    for a in at(&answer, "approvals").as_array().into_iter().flatten() {
                        println!(
                            "{}  {}  {}  proposer={}  expires={}  {}",
                            at(a, "id").as_str().unwrap_or(""),
                            at(a, "status").as_str().unwrap_or(""),
                            at(a, "tool").as_str().unwrap_or(""),
                            at(a, "proposer").as_str().unwrap_or(""),
                            at(a, "expires_at").as_str().unwrap_or(""),
                            at(a, "arguments"),
                        );
                    }
                }
                return Ok(Exit::Ok);
            }
            ApprovalsCommand::Approve { id, reason } => (format!("/v1/approvals/{id}/approve"), reason),
            ApprovalsCommand::Reject { id, reason } => (format!("/v1/approvals/{id}/reject"), reason),
        };
        let body = json!({"reason": body}).to_string().into_bytes();
        match client
            .call(Method::POST, &path, Some((body, "application/json")))
            .await?
        {
            Ok(v) => {
                println!(
                    "{} {}",
                    at(&v, "id").as_str().unwrap_or(""),
                    at(&v, "status").as_str().unwrap_or("")
                );
                Ok(Exit::Ok)
            }
            Err(m) => Ok(refused(&m)),
        }
    })
}

fn ledger_line(e: &Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or("-").to_owned();
    format!(
        "{}  {}  {}  {}  {}  {}  {}",
        s("created_at"),
        s("id"),
        s("principal"),
        s("tool"),
        s("decision"),
        at(e, "outcome").as_str().unwrap_or(""),
        at(e, "error_code").as_str().unwrap_or(""),
    )
}

/// Runs `warrant ledger …`.
pub fn ledger(args: &ServerArgs, command: &LedgerCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        match command {
            LedgerCommand::Show { id } => match client
                .call(Method::GET, &format!("/v1/ledger/{id}"), None)
                .await?
            {
                Ok(v) => {
                    print(&v);
                    Ok(Exit::Ok)
                }
                Err(m) => Ok(refused(&m)),
            },
            LedgerCommand::Tail { lines, tool, follow } => {
                let filter = tool.as_ref().map(|t| format!("&tool={t}")).unwrap_or_default();
                let mut seen = std::collections::HashSet::new();
                loop {
                    let page = match client
                        .call(Method::GET, &format!("/v1/ledger?limit={lines}{filter}"), None)
                        .await?
                    {
                        Ok(v) => v,
                        Err(m) => return Ok(refused(&m)),
                    };
                    let entries: Vec<Value> = at(&page, "entries").as_array().cloned().unwrap_or_default();
                    // Oldest first, each row once.
                    for e in entries.iter().rev() {
                        if seen.insert(at(e, "id").as_str().unwrap_or_default().to_owned()) {
                            println!("{}", ledger_line(e));
                        }
                    }
                    if !*follow {
                        return Ok(Exit::Ok);
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
            }
        }
    })
}

/// Runs `warrant keys …`.
pub fn keys(args: &ServerArgs, command: &KeysCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        match command {
            KeysCommand::Create {
                tenant,
                principal,
                grants,
                roles,
                label,
            } => {
                let body = json!({"principal": principal, "grants": grants, "roles": roles, "label": label});
                let path = match tenant {
                    Some(t) => format!("/v1/tenants/{}/keys", segment(t)),
                    None => "/v1/keys".to_owned(),
                };
                match client
                    .call(
                        Method::POST,
                        &path,
                        Some((body.to_string().into_bytes(), "application/json")),
                    )
                    .await?
                {
                    Ok(v) => {
                        println!("id={}", at(&v, "id").as_str().unwrap_or(""));
                        println!("key={}", at(&v, "key").as_str().unwrap_or(""));
                        Ok(Exit::Ok)
                    }
                    Err(m) => Ok(refused(&m)),
                }
            }
            KeysCommand::List { json } => match client.call(Method::GET, "/v1/keys", None).await? {
                Ok(v) if *json => {
                    print(&v);
                    Ok(Exit::Ok)
                }
                Ok(v) => {
                    for k in at(&v, "keys").as_array().into_iter().flatten() {
                        let list = |field: &str| {
                            let items: Vec<&str> = at(k, field)
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .collect();
                            if items.is_empty() {
                                "-".to_owned()
                            } else {
                                items.join(",")
                            }
                        };
                        println!(
                            "{}  {}  grants={}  roles={}  {}  {}",
                            at(k, "id").as_str().unwrap_or(""),
                            at(k, "principal").as_str().unwrap_or(""),
                            list("grants"),
                            list("roles"),
                            match at(k, "revoked_at").as_str() {
                                Some(at) => format!("revoked {at}"),
                                None => "active".to_owned(),
                            },
                            at(k, "label").as_str().unwrap_or(""),
                        );
                    }
                    Ok(Exit::Ok)
                }
                Err(m) => Ok(refused(&m)),
            },
            KeysCommand::Revoke { id } => match client
                .call(Method::DELETE, &format!("/v1/keys/{id}"), None)
                .await?
            {
                Ok(_) => {
                    println!("revoked {id}");
                    Ok(Exit::Ok)
                }
                Err(m) => Ok(refused(&m)),
            },
        }
    })
}

/// Runs `warrant contract register|list|retire|export`.
pub fn contracts(command: &RemoteContractCommand) -> Result<Exit> {
    let client = Client::new(command.server())?;
    block_on(async move {
        let answer = match command {
            RemoteContractCommand::Register { file, tenant, .. } => {
                let bytes = read_input(file)?;
                let content_type = if file.ends_with(".json") {
                    "application/json"
                } else {
                    "application/yaml"
                };
                let path = format!("/v1/contracts{}", tenant_query(tenant.as_deref()));
                client
                    .call(Method::POST, &path, Some((bytes, content_type)))
                    .await?
            }
            RemoteContractCommand::List { .. } => client.call(Method::GET, "/v1/contracts", None).await?,
            RemoteContractCommand::Export {
                name,
                version,
                tenant,
                ..
            } => {
                let path = format!(
                    "/v1/contracts/{}/{version}{}",
                    segment(name),
                    tenant_query(tenant.as_deref())
                );
                client.call(Method::GET, &path, None).await?
            }
            RemoteContractCommand::Retire { id, tenant, .. } => {
                let path = format!(
                    "/v1/contracts/{}/retire{}",
                    segment(id),
                    tenant_query(tenant.as_deref())
                );
                client.call(Method::POST, &path, None).await?
            }
        };
        match (command, answer) {
            (RemoteContractCommand::Export { name, version, .. }, Ok(v)) => match v.get("document") {
                Some(document) => {
                    print(document);
                    Ok(Exit::Ok)
                }
                None => bail!("the server's answer for {name}@{version} has no document"),
            },
            (RemoteContractCommand::List { .. }, Ok(v)) => {
                for c in at(&v, "contracts").as_array().into_iter().flatten() {
                    let owner = match at(c, "tenant").as_str() {
                        Some(t) => format!("{t}/"),
                        None => String::new(),
                    };
                    println!(
                        "{owner}{}@{}  {}  {}{}",
                        at(c, "name").as_str().unwrap_or(""),
                        at(c, "version"),
                        at(c, "id").as_str().unwrap_or(""),
                        at(c, "effect").as_str().unwrap_or(""),
                        if at(c, "retired_at").is_null() {
                            ""
                        } else {
                            "  (retired)"
                        },
                    );
                }
                Ok(Exit::Ok)
            }
            (_, Ok(v)) => {
                print(&v);
                Ok(Exit::Ok)
            }
            (RemoteContractCommand::Register { file, .. }, Err(m)) => {
                // Each problem the registration lint found, one line each as `contract lint`
                // prints them (exit 1, as the lint).
                let exit = refused(&m);
                for problem in m.problems() {
                    eprintln!("{file}: {problem}");
                }
                Ok(exit)
            }
            (_, Err(m)) => Ok(refused(&m)),
        }
    })
}

/// Runs `warrant workflow publish|list|show|run`.
pub fn workflows(command: &crate::workflow::WorkflowCommand) -> Result<Exit> {
    use crate::workflow::WorkflowCommand;
    let server = match command {
        WorkflowCommand::Publish { server, .. }
        | WorkflowCommand::List { server }
        | WorkflowCommand::Run { server, .. }
        | WorkflowCommand::Show { server, .. } => server,
        WorkflowCommand::Compile { .. } => bail!("`workflow compile` runs offline"),
    };
    let client = Client::new(server)?;
    block_on(async move {
        let answer = match command {
            WorkflowCommand::Publish { file, .. } => {
                let bytes = read_input(file)?;
                let content_type = if file.ends_with(".json") {
                    "application/json"
                } else {
                    "application/yaml"
                };
                client
                    .call(Method::POST, "/v1/workflows", Some((bytes, content_type)))
                    .await?
            }
            WorkflowCommand::Show { name, version, .. } => {
                let path = format!("/v1/workflows/{}/{version}", segment(name));
                client.call(Method::GET, &path, None).await?
            }
            WorkflowCommand::Run { workflow, input, .. } => {
                let Some((name, version)) = workflow.rsplit_once('@') else {
                    bail!("name the workflow as NAME@VERSION");
                };
                let bytes = read_input(input)?;
                let path = format!("/v1/workflows/{}/{}/runs", segment(name), segment(version));
                client
                    .call(Method::POST, &path, Some((bytes, "application/json")))
                    .await?
            }
            _ => client.call(Method::GET, "/v1/workflows", None).await?,
        };
        match (command, answer) {
            (WorkflowCommand::List { .. }, Ok(v)) => {
                for w in at(&v, "workflows").as_array().into_iter().flatten() {
                    println!(
                        "{}@{}  {}  published by {} at {}",
                        at(w, "name").as_str().unwrap_or(""),
                        at(w, "version"),
                        at(w, "digest").as_str().unwrap_or(""),
                        at(w, "published_by").as_str().unwrap_or(""),
                        at(w, "published_at").as_str().unwrap_or(""),
                    );
                }
                Ok(Exit::Ok)
            }
            (_, Ok(v)) => {
                print(&v);
                Ok(Exit::Ok)
            }
            (_, Err(m)) => {
                // Each violation the compiler found, as `workflow compile` prints them.
                let exit = refused(&m);
                for v in at(&m.body, "violations").as_array().into_iter().flatten() {
                    eprintln!(
                        "[{}] {}: {}",
                        at(v, "rule").as_str().unwrap_or(""),
                        at(v, "pointer").as_str().unwrap_or(""),
                        at(v, "message").as_str().unwrap_or("")
                    );
                    if let Some(path) = at(v, "path").as_str() {
                        eprintln!("    path: {path}");
                    }
                }
                Ok(exit)
            }
        }
    })
}

/// Runs `warrant runs list|show|cancel`.
pub fn runs(command: &crate::workflow::RunsCommand) -> Result<Exit> {
    use crate::workflow::RunsCommand;
    let server = match command {
        RunsCommand::List { server }
        | RunsCommand::Show { server, .. }
        | RunsCommand::Cancel { server, .. } => server,
    };
    let client = Client::new(server)?;
    block_on(async move {
        let answer = match command {
            RunsCommand::List { .. } => client.call(Method::GET, "/v1/runs", None).await?,
            RunsCommand::Show { id, .. } => {
                client
                    .call(Method::GET, &format!("/v1/runs/{}", segment(id)), None)
                    .await?
            }
            RunsCommand::Cancel { id, .. } => {
                client
                    .call(Method::POST, &format!("/v1/runs/{}/cancel", segment(id)), None)
                    .await?
            }
        };
        match (command, answer) {
            (RunsCommand::List { .. }, Ok(v)) => {
                for r in at(&v, "runs").as_array().into_iter().flatten() {
                    println!(
                        "{}  {}@{}  {}  cost {}  started {}",
                        at(r, "id").as_str().unwrap_or(""),
                        at(r, "workflow").as_str().unwrap_or(""),
                        at(r, "version"),
                        at(r, "status").as_str().unwrap_or(""),
                        at(r, "cost"),
                        at(r, "created_at").as_str().unwrap_or(""),
                    );
                }
                Ok(Exit::Ok)
            }
            (_, Ok(v)) => {
                print(&v);
                Ok(Exit::Ok)
            }
            (_, Err(m)) => Ok(refused(&m)),
        }
    })
}

/// Runs `warrant tenants …`.
pub fn tenants(args: &ServerArgs, command: &TenantsCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        match command {
            TenantsCommand::Create { id, label, admin } => {
                let body = json!({"id": id, "label": label, "admin": admin});
                match client
                    .call(
                        Method::POST,
                        "/v1/tenants",
                        Some((body.to_string().into_bytes(), "application/json")),
                    )
                    .await?
                {
                    Ok(v) => {
                        let key = at(&v, "admin_key");
                        println!("tenant={}", at(&v, "id").as_str().unwrap_or(""));
                        println!("admin_id={}", at(key, "id").as_str().unwrap_or(""));
                        println!("admin_key={}", at(key, "key").as_str().unwrap_or(""));
                        Ok(Exit::Ok)
                    }
                    Err(m) => Ok(refused(&m)),
                }
            }
            TenantsCommand::List => match client.call(Method::GET, "/v1/tenants", None).await? {
                Ok(v) => {
                    for t in at(&v, "tenants").as_array().into_iter().flatten() {
                        println!(
                            "{}  {}  {}",
                            at(t, "id").as_str().unwrap_or(""),
                            at(t, "created_at").as_str().unwrap_or(""),
                            at(t, "label").as_str().unwrap_or(""),
                        );
                    }
                    Ok(Exit::Ok)
                }
                Err(m) => Ok(refused(&m)),
            },
        }
    })
}

/// `?tenant=…` when a tenant is named.
fn tenant_query(tenant: Option<&str>) -> String {
    tenant.map_or_else(String::new, |t| format!("?tenant={}", segment(t)))
}

/// A path segment or query value, percent-encoded (ids are plain, but a typo must not change
/// the route).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~:@".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A field of a JSON object, or `null`.
fn at<'a>(value: &'a Value, key: &str) -> &'a Value {
    value.get(key).unwrap_or(&Value::Null)
}

/// `warrant console link`: asks the server for a one-time sign-in link for the key's own
/// principal and prints it.
pub fn console(args: &ServerArgs, command: &ConsoleCommand) -> Result<Exit> {
    let client = Client::new(args)?;
    block_on(async move {
        match command {
            ConsoleCommand::Link => match client.call(Method::POST, "/v1/console/links", None).await? {
                Ok(v) => {
                    println!("{}", at(&v, "url").as_str().unwrap_or(""));
                    eprintln!(
                        "signs in as {} ({}) once, until {}",
                        at(&v, "principal").as_str().unwrap_or(""),
                        at(&v, "tenant").as_str().unwrap_or(""),
                        at(&v, "expires_at").as_str().unwrap_or(""),
                    );
                    Ok(Exit::Ok)
                }
                Err(m) => Ok(refused(&m)),
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_contract_prints_its_problems_as_lint_does() {
        let refusal = Refusal {
            message: "the contract does not lint".into(),
            body: serde_json::json!({"problems": [
                {"pointer": "", "message": "a write must declare idempotency"},
                {"pointer": "/effect", "message": "unknown effect"},
            ]}),
        };
        assert_eq!(
            refusal.problems(),
            ["/: a write must declare idempotency", "/effect: unknown effect"]
        );
    }
}
