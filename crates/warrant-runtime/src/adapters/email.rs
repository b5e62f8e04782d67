//! The `send_email` built-in: one plain-text message over SMTP (`lettre`), to recipients the
//! decision's guard already checked against the tenant's allow-list.
//!
//! ```yaml
//! adapter:
//!   kind: send_email
//!   from: support@example.com
//!   timeout: 30s                      # optional; the whole SMTP exchange
//!   status_url: https://esp.example/v1/messages/{operation_id}    # optional, for reconcile
//! ```
//!
//! The relay and its login are the platform operator's (`[adapters.smtp]` in `warrant.toml`),
//! never a binding's: a contract cannot pick where mail goes or which login it uses. Every send
//! resolves the relay and dials only addresses the outbound network guard vets (the same rules
//! as HTTP: private, loopback and metadata addresses only where the operator allows the host),
//! and a login is refused over a relay without TLS.
//!
//! The arguments are `to` (a list or one address), optional `cc` and `bcc`, `subject` and
//! `body`. The `Message-ID` is `<{operation id}@{sender's domain}>`: every attempt of one
//! operation sends the same id, so a receiving system (or the relay's log) can tell a
//! duplicate, and reconciliation can ask the provider's `status_url` about exactly that
//! message. SMTP itself cannot be asked, so without a `status_url` an unknown send stays
//! unknown until an operator resolves it.
//!
//! Errors: a 4xx reply is `TOOL_UPSTREAM_UNAVAILABLE` (not accepted; retryable), a 5xx reply
//! `TOOL_PERMANENT_FAILURE`, a timeout `TOOL_TIMEOUT` and a broken connection
//! `TOOL_UPSTREAM_UNAVAILABLE` — both of those may have happened after the message data
//! was sent, so they are ambiguous.

use std::time::Duration;

use async_trait::async_trait;
use lettre::message::{Mailbox, header::ContentType};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde_json::{Value, json};
use warrant_core::{Contract, ToolErrorCode};

use super::AdapterConfig;
use super::http::{ask_status, check_status_url, net_failure, status_url};
use crate::adapter::{Adapter, BindingError, Failure, Inquiry, Invocation, Reconciled};
use crate::binding::Binding;
use crate::net::SafeClient;
use crate::secrets::Secret;

/// How the relay is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelaySecurity {
    /// STARTTLS, required (port 587).
    StartTls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No TLS: only for a relay on the same host or a trusted network.
    Plain,
}

/// The SMTP relay (operator configuration only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpRelay {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Transport security.
    pub security: RelaySecurity,
    /// The login, `user:password`; refused with [`RelaySecurity::Plain`].
    pub login: Option<Secret>,
}

impl SmtpRelay {
    /// Checks the relay's own rules (a login only over TLS).
    ///
    /// # Errors
    /// A login over a relay without TLS.
    pub fn check(&self) -> Result<(), String> {
        if self.login.is_some() && self.security == RelaySecurity::Plain {
            return Err("an SMTP login is never sent without TLS: set tls = \"starttls\" or \"tls\"".into());
        }
        if let Some(login) = &self.login
            && login.expose().split_once(':').is_none()
        {
            return Err("the SMTP login must be user:password".into());
        }
        Ok(())
    }
}

/// The `send_email` adapter of one contract.
pub struct EmailAdapter {
    relay: SmtpRelay,
    from: Mailbox,
    domain: String,
    timeout: Duration,
    client: SafeClient,
    status_url: Option<String>,
}

impl std::fmt::Debug for EmailAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailAdapter")
            .field("from", &self.from.to_string())
            .finish_non_exhaustive()
    }
}

impl EmailAdapter {
    /// Builds the adapter from its binding.
    ///
    /// # Errors
    /// A malformed binding, or no relay configured.
    pub fn from_binding(
        contract: &Contract,
        doc: &Value,
        config: &AdapterConfig,
    ) -> Result<Self, BindingError> {
        require_guarded_recipients(contract)?;
        let b = Binding::open("send_email", doc, &["from", "timeout", "status_url"])?;
        let from_text = b.string("from")?;
        let from: Mailbox = from_text
            .parse()
            .map_err(|_| BindingError::invalid("send_email", format!("`{from_text}` is not an address")))?;
        let domain = from.email.domain().to_owned();
        let relay = config.smtp.clone().ok_or_else(|| {
            BindingError::invalid("send_email", "no SMTP relay is configured ([adapters.smtp])")
        })?;
        relay
            .check()
            .map_err(|why| BindingError::invalid("send_email", why))?;
        let timeout = b.duration("timeout", Duration::from_secs(30), Duration::from_secs(300))?;
        Ok(EmailAdapter {
            relay,
            from,
            domain,
            timeout,
            client: config.client.clone(),
            status_url: check_status_url(&b)?,
        })
    }

    async fn transport(&self) -> Result<AsyncSmtpTransport<Tokio1Executor>, Failure> {
        transport(&self.client, &self.relay, self.timeout).await
    }
}

/// A transport to one vetted address of `relay`: the name is resolved and vetted by the
/// outbound guard (as for HTTP), and the connection goes to that address, while TLS still
/// verifies the relay's name.
async fn transport(
    client: &SafeClient,
    relay: &SmtpRelay,
    timeout: Duration,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, Failure> {
    let tls = relay.security != RelaySecurity::Plain;
    let addrs = client
        .vet(tls, &relay.host, relay.port)
        .await
        .map_err(net_failure)?;
    let ip = addrs
        .first()
        .ok_or_else(|| Failure::new(ToolErrorCode::UpstreamUnavailable, "the relay has no address"))?;
    let parameters = || {
        TlsParameters::new(relay.host.clone())
            .map_err(|_| Failure::new(ToolErrorCode::PermanentFailure, "tls parameters for the relay"))
    };
    let security = match relay.security {
        RelaySecurity::StartTls => Tls::Required(parameters()?),
        RelaySecurity::Tls => Tls::Wrapper(parameters()?),
        RelaySecurity::Plain => Tls::None,
    };
    // `builder_dangerous` only because the TLS settings are given explicitly above.
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(ip.to_string())
        .port(relay.port)
        .tls(security)
        .timeout(Some(timeout));
    if let Some((user, password)) = relay.login.as_ref().and_then(|l| l.expose().split_once(':')) {
        builder = builder.credentials(Credentials::new(user.to_owned(), password.to_owned()));
    }
    Ok(builder.build())
}

impl EmailAdapter {
    fn message(&self, call: &Invocation<'_>) -> Result<Message, Failure> {
        let invalid = |why: String| Failure::new(ToolErrorCode::InputInvalid, why);
        let args = call.arguments;
        let text = |key: &str| args.get(key).and_then(Value::as_str);
        let mut builder = Message::builder()
            .from(self.from.clone())
            .message_id(Some(format!("<{}@{}>", call.operation_id.as_str(), self.domain)))
            .subject(text("subject").unwrap_or_default())
            .header(ContentType::TEXT_PLAIN);
        let mut any = false;
        for field in ["to", "cc", "bcc"] {
            let list: Vec<&str> = match args.get(field) {
                None => Vec::new(),
                Some(Value::String(s)) => vec![s.as_str()],
                Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
                Some(_) => return Err(invalid(format!("`{field}` must be addresses"))),
            };
            for address in list {
                let mailbox: Mailbox = address
                    .parse()
                    .map_err(|_| invalid(format!("a `{field}` entry is not an address")))?;
                builder = match field {
                    "to" => builder.to(mailbox),
                    "cc" => builder.cc(mailbox),
                    _ => builder.bcc(mailbox),
                };
                any = true;
            }
        }
        if !any {
            return Err(invalid("no recipients".into()));
        }
        builder
            .body(text("body").unwrap_or_default().to_owned())
            .map_err(|e| invalid(format!("cannot build the message: {e}")))
    }
}

#[async_trait]
impl Adapter for EmailAdapter {
    async fn invoke(&self, call: &Invocation<'_>) -> Result<Value, Failure> {
        let message = self.message(call)?;
        let id = format!("<{}@{}>", call.operation_id.as_str(), self.domain);
        let limit = self.timeout.min(call.timeout);
        let transport = self.transport().await?;
        match tokio::time::timeout(limit, transport.send(message)).await {
            Ok(Ok(_)) => Ok(json!({"message_id": id, "status": "sent"})),
            Ok(Err(e)) => Err(smtp_failure(&e)),
            Err(_) => Err(Failure::ambiguous(
                ToolErrorCode::Timeout,
                "no answer from the relay in time",
            )),
        }
    }

    async fn reconcile(&self, inquiry: &Inquiry<'_>) -> Result<Reconciled, Failure> {
        match &self.status_url {
            Some(template) => {
                let url = status_url(template, inquiry)?;
                ask_status(&self.client, url, http::HeaderMap::new(), inquiry).await
            }
            None => Ok(Reconciled::Unknown),
        }
    }
}

/// Warrant's own mail (reviewer notifications): plain-text messages from the operator's sender
/// address through the operator's relay (`[adapters.smtp]`), over the same vetted connection
/// as the `send_email` tool. Not a tool: no contract, no ledger row; the caller retries.
#[derive(Clone)]
pub struct Mailer {
    relay: SmtpRelay,
    from: Mailbox,
    client: SafeClient,
    timeout: Duration,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer")
            .field("from", &self.from.to_string())
            .finish_non_exhaustive()
    }
}

impl Mailer {
    /// A mailer sending as `from` through the operator's relay in `config`.
    ///
    /// # Errors
    /// No relay is configured, the relay breaks its rules, or `from` is not an address.
    pub fn new(from: &str, config: &AdapterConfig) -> Result<Self, String> {
        let from: Mailbox = from.parse().map_err(|_| format!("`{from}` is not an address"))?;
        let relay = config
            .smtp
            .clone()
            .ok_or_else(|| "no SMTP relay is configured ([adapters.smtp])".to_owned())?;
        relay.check()?;
        Ok(Mailer {
            relay,
            from,
            client: config.client.clone(),
            timeout: Duration::from_secs(30),
        })
    }

    /// Sends one plain-text message to `to` (addresses), with `message_id` (`<id@domain>`, the
    /// same for every attempt of one notification).
    ///
    /// # Errors
    /// An address is malformed, or the relay refused or could not be reached.
    pub async fn send(
        &self,
        to: &[String],
        subject: &str,
        body: &str,
        message_id: &str,
    ) -> Result<(), Failure> {
        let invalid = |why: String| Failure::new(ToolErrorCode::InputInvalid, why);
        let mut builder = Message::builder()
            .from(self.from.clone())
            .message_id(Some(format!("<{message_id}@{}>", self.from.email.domain())))
            .subject(subject)
            .header(ContentType::TEXT_PLAIN);
        for address in to {
            let mailbox: Mailbox = address
                .parse()
                .map_err(|_| invalid("a recipient is not an address".into()))?;
            builder = builder.to(mailbox);
        }
        let message = builder
            .body(body.to_owned())
            .map_err(|e| invalid(format!("cannot build the message: {e}")))?;
        let transport = transport(&self.client, &self.relay, self.timeout).await?;
        match tokio::time::timeout(self.timeout, transport.send(message)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(smtp_failure(&e)),
            Err(_) => Err(Failure::ambiguous(
                ToolErrorCode::Timeout,
                "no answer from the relay in time",
            )),
        }
    }
}

fn smtp_failure(e: &lettre::transport::smtp::Error) -> Failure {
    // Never the error's own text: a relay's reply can quote addresses.
    let code = e.status().map(|c| c.to_string()).unwrap_or_default();
    if e.is_permanent() {
        Failure::new(
            ToolErrorCode::PermanentFailure,
            format!("the relay refused ({code})"),
        )
    } else if e.is_transient() {
        Failure::new(
            ToolErrorCode::UpstreamUnavailable,
            format!("the relay deferred ({code})"),
        )
    } else if e.is_timeout() {
        Failure::ambiguous(ToolErrorCode::Timeout, "the relay timed out")
    } else if e.is_tls() {
        Failure::new(ToolErrorCode::UpstreamUnavailable, "tls with the relay failed")
    } else {
        Failure::ambiguous(
            ToolErrorCode::UpstreamUnavailable,
            "the connection to the relay failed",
        )
    }
}

/// The fields [`EmailAdapter::message`] reads recipients from.
const RECIPIENT_FIELDS: [&str; 3] = ["to", "cc", "bcc"];

/// Refuses a binding whose contract could let a recipient through unguarded: the message is
/// addressed from `to`, `cc` and `bcc` whatever the contract says, so each one the input schema
/// admits must be allow-listed on a node that applies to it in every valid call (the schema
/// walk's [`warrant_core::contract::walk::Walker::guards_member`]).
fn require_guarded_recipients(contract: &Contract) -> Result<(), BindingError> {
    let walker = contract.input_schema().walker();
    let open: Vec<String> = RECIPIENT_FIELDS
        .into_iter()
        .filter(|field| !walker.guards_member(field))
        .map(|field| format!("`{field}`"))
        .collect();
    if open.is_empty() {
        Ok(())
    } else {
        Err(BindingError::invalid(
            "send_email",
            format!(
                "the input schema admits {} without `x-warrant-allowlist` on the node that always \
                 applies to it (directly, through `$ref` or `allOf`; not only in a branch); \
                 guard it or leave it out of `properties`",
                open.join(", ")
            ),
        ))
    }
}
