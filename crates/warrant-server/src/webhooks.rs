//! Outbound webhooks (Standard Webhooks, PRODUCT §9): each event a tenant's endpoint subscribes
//! to becomes one message — a [`WEBHOOK_JOB`] job, enqueued by the event worker's fan-out —
//! delivered at least once by any node: `POST` to the endpoint through the outbound guard (an
//! endpoint on a private address only where the operator allows the host; redirects never
//! followed), signed per the specification (`webhook-id` is the event's id, stable across
//! retries; `webhook-timestamp`; `webhook-signature` with the current secret, and the previous
//! one during a rotation). A `2xx` within 15 s is delivered; `410 Gone` disables the endpoint;
//! `429`/`503` with `Retry-After` wait that long; anything else is retried on the schedule
//! ([`SCHEDULE`]); after the last attempt the message is dead (the dead-letter queue: listed,
//! inspected by attempt, replayed). Every attempt is recorded.
//!
//! Secrets are sealed at rest (AES-256-GCM under a key derived from the server's redaction key);
//! the written `whsec_…` form is shown once, when it is made.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};
use warrant_core::records::{Job, JobCompletion, WEBHOOK_JOB, WebhookAttempt, WebhookEndpoint};
use warrant_core::store::StoreError;
use warrant_core::webhook::WebhookSecret;
use warrant_runtime::net::{OutboundRequest, SafeClient};

use crate::state::AppState;

/// The waits before each retry (the specification's schedule): the first attempt at once, then
/// 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
pub const SCHEDULE: [Duration; 7] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];
/// The version of the message body's shape (`type`, `version`, `timestamp`, `data`, and each
/// type's `data` fields as `docs/webhooks.md` lists them): a field is only ever added within a
/// version.
pub const PAYLOAD_VERSION: u32 = 1;
/// How long an endpoint has to answer.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a claimed message is a node's from its claim or last renewal (renewed while it is
/// delivered): a node that dies mid-delivery leaves it to another node this long after.
pub const LEASE: Duration = Duration::from_secs(20);
/// Messages claimed at once, delivered side by side.
const CLAIM: u32 = 16;
/// How much of an answer's body an attempt records.
const SNIPPET: usize = 512;
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10 * 3600);

/// Seals and opens endpoint secrets at rest.
#[derive(Clone)]
pub struct SecretBox(Arc<LessSafeKey>);

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox(..)")
    }
}

impl SecretBox {
    /// A box keyed by `key` (derived from the server's redaction key, so every node opens
    /// what any node sealed).
    pub fn new(key: [u8; 32]) -> Self {
        // INVARIANT: AES-256-GCM takes exactly 32 bytes.
        let unbound =
            UnboundKey::new(&AES_256_GCM, &key).unwrap_or_else(|_| unreachable!("a 32-byte AES-256-GCM key"));
        SecretBox(Arc::new(LessSafeKey::new(unbound)))
    }

    /// The signing key sealed as `sealed` for the endpoint `aad`; `None` when it was not
    /// sealed by this server's key for that endpoint.
    pub(crate) fn open(&self, sealed: &str, aad: &str) -> Option<Signer> {
        Signer::parse(&self.open_text(sealed, aad)?)
    }

    /// `s1.<nonce>.<ciphertext>` of a secret's written form, bound to `aad` (what it belongs
    /// to: an endpoint or a source).
    pub(crate) fn seal_text(&self, secret: &str, aad: &str) -> String {
        self.seal_bytes(secret.as_bytes(), aad)
    }

    /// `s1.<nonce>.<ciphertext>` of `plain`, bound to `aad`.
    fn seal_bytes(&self, plain: &[u8], aad: &str) -> String {
        let nonce: [u8; 12] = rand::random();
        let mut data = plain.to_vec();
        // Sealing in place cannot fail for a message this short.
        if self
            .0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .is_err()
        {
            data.clear();
        }
        format!(
            "s1.{}.{}",
            URL_SAFE_NO_PAD.encode(nonce),
            URL_SAFE_NO_PAD.encode(data)
        )
    }

    /// The text sealed as `sealed` for `aad`; `None` when it was not sealed by this server's key
    /// for that owner.
    pub(crate) fn open_text(&self, sealed: &str, aad: &str) -> Option<String> {
        String::from_utf8(self.open_bytes(sealed, aad)?).ok()
    }

    /// The bytes sealed as `sealed` for `aad`.
    fn open_bytes(&self, sealed: &str, aad: &str) -> Option<Vec<u8>> {
        let mut parts = sealed.split('.');
        let (Some("s1"), Some(nonce), Some(data), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let nonce: [u8; 12] = URL_SAFE_NO_PAD.decode(nonce).ok()?.try_into().ok()?;
        let mut data = URL_SAFE_NO_PAD.decode(data).ok()?;
        let plain = self
            .0
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

/// The same AEAD keeps a held call's exact arguments at rest (`warrant_core::seal`), under its
/// own derived key.
impl warrant_core::seal::ArgumentSeal for SecretBox {
    fn seal(&self, plain: &[u8], aad: &str) -> String {
        self.seal_bytes(plain, aad)
    }
    fn open(&self, sealed: &str, aad: &str) -> Option<Vec<u8>> {
        self.open_bytes(sealed, aad)
    }
}

/// The prefix of a written Ed25519 signing key (its PKCS#8 document, base64), as the Standard
/// Webhooks specification writes asymmetric secrets.
pub const SIGNING_KEY_PREFIX: &str = "whsk_";
/// The prefix of a written Ed25519 public key (its 32 bytes, base64): what receivers verify
/// `v1a` signatures with.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// How an endpoint's messages are signed: `v1` (HMAC-SHA256 under a shared secret, the
/// default) or `v1a` (Ed25519: receivers hold only the public key).
pub enum Signer {
    /// A shared secret (`whsec_…`).
    Hmac(WebhookSecret),
    /// An Ed25519 key pair (`whsk_…`).
    Ed25519(Ed25519KeyPair),
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signer::Hmac(_) => "Signer::Hmac(..)",
            Signer::Ed25519(_) => "Signer::Ed25519(..)",
        })
    }
}

impl Signer {
    /// A new Ed25519 key pair and its written form (`whsk_…`, to seal).
    ///
    /// # Errors
    /// The system's randomness failed.
    pub fn new_ed25519() -> Result<(Signer, String), ring::error::Unspecified> {
        let document = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())?;
        let written = format!(
            "{SIGNING_KEY_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(document.as_ref())
        );
        let pair = Ed25519KeyPair::from_pkcs8(document.as_ref()).map_err(|_| ring::error::Unspecified)?;
        Ok((Signer::Ed25519(pair), written))
    }

    /// Reads a written key: `whsec_…` or `whsk_…`.
    pub fn parse(text: &str) -> Option<Signer> {
        match text.strip_prefix(SIGNING_KEY_PREFIX) {
            Some(encoded) => {
                let document = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
                Ed25519KeyPair::from_pkcs8(&document).ok().map(Signer::Ed25519)
            }
            None => WebhookSecret::parse(text).ok().map(Signer::Hmac),
        }
    }

    /// The public key receivers verify with (`whpk_…`), for an Ed25519 signer.
    pub fn public_key(&self) -> Option<String> {
        match self {
            Signer::Hmac(_) => None,
            Signer::Ed25519(pair) => Some(format!(
                "{PUBLIC_KEY_PREFIX}{}",
                base64::engine::general_purpose::STANDARD.encode(pair.public_key().as_ref())
            )),
        }
    }

    /// This signer's signature of a message: `v1,…` or `v1a,…`, over `{id}.{timestamp}.{body}`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        match self {
            Signer::Hmac(secret) => secret.sign(id, timestamp, body),
            Signer::Ed25519(pair) => {
                let mut signed = format!("{id}.{timestamp}.").into_bytes();
                signed.extend_from_slice(body);
                format!(
                    "v1a,{}",
                    base64::engine::general_purpose::STANDARD.encode(pair.sign(&signed).as_ref())
                )
            }
        }
    }
}

/// The `webhook-signature` header of a message signed by each of `signers` (the current one
/// first; during a rotation, the previous one too), space-separated.
pub fn signatures(signers: &[&Signer], id: &str, timestamp: i64, body: &[u8]) -> String {
    signers
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The associated data a secret is sealed with: its endpoint.
pub(crate) fn secret_aad(tenant: &str, id: &str) -> String {
    format!("warrant-webhook-secret-v1|{tenant}|{id}")
}

/// Whether `endpoint` takes events of `kind`.
fn subscribes(endpoint: &WebhookEndpoint, kind: &str) -> bool {
    endpoint.enabled && (endpoint.events.is_empty() || endpoint.events.iter().any(|e| e == kind))
}

/// The fan-out of one event: a message job for each enabled endpoint of its tenant that
/// subscribes to its type (ids `whm_<event>_<endpoint>`, so running the fan-out again after a
/// crash adds nothing).
///
/// # Errors
/// The store fails.
pub(crate) async fn fan_out(
    state: &AppState,
    event: &Job,
    kind: &str,
    data: &Value,
) -> Result<(), StoreError> {
    let tenant = &event.job.tenant;
    let now = state.env.now();
    for endpoint in state.store.list_webhooks(tenant).await? {
        if !subscribes(&endpoint, kind) {
            continue;
        }
        let message = warrant_core::records::NewJob {
            id: format!("whm_{}_{}", event.job.id, endpoint.id),
            tenant: tenant.clone(),
            kind: WEBHOOK_JOB.to_owned(),
            payload: json!({
                "event_id": event.job.id,
                "endpoint_id": endpoint.id,
                "body": {"type": kind, "version": PAYLOAD_VERSION, "timestamp": crate::routes::rfc3339(event.job.run_at), "data": data},
            }),
            run_at: now,
            max_attempts: u32::try_from(SCHEDULE.len() + 1).unwrap_or(8),
        };
        match state.store.enqueue_job(&message).await {
            Ok(()) | Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs the delivery worker until the gateway stops.
pub(crate) fn spawn_worker(state: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let worker = format!("webhooks-{}", hex::encode(rand::random::<[u8; 6]>()));
        loop {
            match deliver_due(&state, &worker, &SCHEDULE, DELIVERY_TIMEOUT).await {
                Ok(0) => tokio::time::sleep(Duration::from_secs(1)).await,
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "the webhook worker cannot claim messages");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    })
}

/// Claims the due messages as `worker` and delivers them side by side, each attempt given
/// `timeout` to answer, retrying on `schedule` ([`SCHEDULE`] and [`DELIVERY_TIMEOUT`] in
/// production; compressed in tests); answers how many were claimed.
///
/// # Errors
/// The store fails to claim.
pub async fn deliver_due(
    state: &Arc<AppState>,
    worker: &str,
    schedule: &[Duration],
    timeout: Duration,
) -> Result<usize, StoreError> {
    let jobs = state
        .store
        .claim_jobs(worker, WEBHOOK_JOB, CLAIM, LEASE, state.env.now())
        .await?;
    let claimed = jobs.len();
    let mut running = tokio::task::JoinSet::new();
    for job in jobs {
        let (state, worker, schedule) = (state.clone(), worker.to_owned(), schedule.to_vec());
        running.spawn(async move {
            let completion = crate::jobs::holding(
                &state,
                &job,
                &worker,
                LEASE,
                deliver(&state, &job, &schedule, timeout),
            )
            .await;
            if let Err(error) = state
                .store
                .complete_job(&job.job.id, &worker, &completion, state.env.now())
                .await
            {
                tracing::warn!(message = job.job.id, %error, "a webhook delivery was not recorded");
            }
        });
    }
    while running.join_next().await.is_some() {}
    Ok(claimed)
}

/// One attempt at one message, recorded; what becomes of the message.
async fn deliver(state: &AppState, job: &Job, schedule: &[Duration], timeout: Duration) -> JobCompletion {
    let payload = &job.job.payload;
    let (Some(event_id), Some(endpoint_id), Some(body)) = (
        payload.get("event_id").and_then(Value::as_str),
        payload.get("endpoint_id").and_then(Value::as_str),
        payload.get("body"),
    ) else {
        return JobCompletion::Dead {
            error: "a malformed message".into(),
        };
    };
    let tenant = &job.job.tenant;
    let endpoint = match state.store.get_webhook(tenant, endpoint_id).await {
        Ok(Some(e)) if e.enabled => e,
        Ok(_) => {
            return JobCompletion::Dead {
                error: "the endpoint is disabled or gone".into(),
            };
        }
        Err(e) => return retry(state, job, schedule, None, e.to_string()),
    };
    let aad = secret_aad(tenant, endpoint_id);
    let Some(current) = state.webhook_secrets.open(&endpoint.secret, &aad) else {
        return JobCompletion::Dead {
            error: "the endpoint's secret cannot be opened with this server's key".into(),
        };
    };
    let now = state.env.now();
    let previous = endpoint
        .previous_secret
        .as_deref()
        .filter(|_| endpoint.previous_until.is_some_and(|until| until > now))
        .and_then(|sealed| state.webhook_secrets.open(sealed, &aad));
    let body = body.to_string().into_bytes();
    let timestamp = now.unix_timestamp();
    let mut signers = vec![&current];
    signers.extend(previous.as_ref());
    let signature = signatures(&signers, event_id, timestamp, &body);
    let outcome = post(
        state.adapters.config().client.clone(),
        &endpoint.url,
        event_id,
        timestamp,
        &signature,
        body,
        timeout,
    )
    .await;
    let attempt = WebhookAttempt {
        tenant: tenant.clone(),
        message_id: job.job.id.clone(),
        endpoint_id: endpoint_id.to_owned(),
        attempt: job.attempts,
        at: now,
        status: outcome.status,
        latency_ms: u64::try_from(outcome.latency.as_millis()).unwrap_or(u64::MAX),
        response: outcome.snippet.clone(),
        error: outcome.error.clone(),
    };
    if let Err(error) = state.store.record_webhook_attempt(&attempt).await {
        tracing::warn!(message = job.job.id, %error, "a webhook attempt was not recorded");
    }
    match outcome.status {
        Some(200..=299) => {
            metrics::counter!("warrant_webhook_deliveries_total", "result" => "delivered").increment(1);
            JobCompletion::Done
        }
        Some(410) => {
            let mut disabled = endpoint.clone();
            disabled.enabled = false;
            disabled.disabled_reason = Some("the endpoint answered 410 Gone".into());
            disabled.updated_at = now;
            if let Err(error) = state.store.update_webhook(&disabled).await {
                tracing::warn!(endpoint = endpoint_id, %error, "a gone endpoint was not disabled");
            }
            metrics::counter!("warrant_webhook_deliveries_total", "result" => "gone").increment(1);
            JobCompletion::Dead {
                error: "410 Gone: the endpoint was disabled".into(),
            }
        }
        status => {
            metrics::counter!("warrant_webhook_deliveries_total", "result" => "retry").increment(1);
            let why = outcome
                .error
                .unwrap_or_else(|| format!("answered {}", status.unwrap_or_default()));
            retry(state, job, schedule, outcome.retry_after, why)
        }
    }
}

/// The next attempt: after `retry_after` when the endpoint asked for it (bounded), else on the
/// schedule; the store marks the message dead once its attempts are spent.
fn retry(
    state: &AppState,
    job: &Job,
    schedule: &[Duration],
    retry_after: Option<Duration>,
    error: String,
) -> JobCompletion {
    let index = usize::try_from(job.attempts.saturating_sub(1)).unwrap_or(usize::MAX);
    let wait = retry_after
        .map(|w| w.min(MAX_RETRY_AFTER))
        .or_else(|| schedule.get(index).copied())
        .unwrap_or_else(|| schedule.last().copied().unwrap_or(Duration::from_secs(60)));
    // Jitter: up to a tenth of the wait, so endpoints recovering together are not hit together.
    let jitter = wait.mul_f64(rand::random::<f64>() * 0.1);
    JobCompletion::Retry {
        run_at: state.env.now() + wait + jitter,
        error,
    }
}

/// What one `POST` came to.
struct Posted {
    status: Option<u16>,
    latency: Duration,
    snippet: Option<String>,
    error: Option<String>,
    retry_after: Option<Duration>,
}

async fn post(
    client: SafeClient,
    url: &str,
    id: &str,
    timestamp: i64,
    signature: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Posted {
    let started = Instant::now();
    let failed = |error: String| Posted {
        status: None,
        latency: started.elapsed(),
        snippet: None,
        error: Some(error),
        retry_after: None,
    };
    let Ok(parsed) = url::Url::parse(url) else {
        return failed("the endpoint URL does not parse".into());
    };
    let mut request = OutboundRequest::new(http::Method::POST, parsed);
    request.body = body.into();
    request.follow_redirects = false;
    request.timeout = Some(timeout);
    for (name, value) in [
        ("content-type", "application/json"),
        ("webhook-id", id),
        ("webhook-timestamp", &timestamp.to_string()),
        ("webhook-signature", signature),
        (
            "user-agent",
            concat!("warrant-webhooks/", env!("CARGO_PKG_VERSION")),
        ),
    ] {
        if let Ok(value) = http::HeaderValue::from_str(value) {
            request.headers.insert(name, value);
        }
    }
    match client.send(request).await {
        Ok(response) => {
            let status = response.status.as_u16();
            let retry_after = matches!(status, 429 | 503)
                .then(|| response.headers.get(http::header::RETRY_AFTER))
                .flatten()
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let snippet =
                String::from_utf8_lossy(response.body.get(..SNIPPET).unwrap_or(&response.body)).into_owned();
            Posted {
                status: Some(status),
                latency: started.elapsed(),
                snippet: Some(snippet),
                error: None,
                retry_after,
            }
        }
        Err(e) => failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn secrets_open_only_for_their_endpoint_under_their_key() {
        let sealer = SecretBox::new([4; 32]);
        let secret = WebhookSecret::from_bytes(vec![7; 32]).unwrap();
        let sealed = sealer.seal_text(&secret.expose(), &secret_aad("acme", "whe_1"));
        assert!(!sealed.contains(&secret.expose()));
        assert_eq!(
            sealer.open_text(&sealed, &secret_aad("acme", "whe_1")),
            Some(secret.expose())
        );
        assert!(matches!(
            sealer.open(&sealed, &secret_aad("acme", "whe_1")),
            Some(Signer::Hmac(s)) if s == secret
        ));
        assert!(sealer.open(&sealed, &secret_aad("acme", "whe_2")).is_none());
        assert!(sealer.open(&sealed, &secret_aad("globex", "whe_1")).is_none());
        assert!(
            SecretBox::new([5; 32])
                .open(&sealed, &secret_aad("acme", "whe_1"))
                .is_none()
        );
        assert!(sealer.open("s1.x.y", &secret_aad("acme", "whe_1")).is_none());
        assert_ne!(
            sealer.seal_text(&secret.expose(), "a"),
            sealer.seal_text(&secret.expose(), "a"),
            "a fresh nonce each time"
        );
    }

    /// `v1a`: an Ed25519 signature over `id.timestamp.body` that the public key alone verifies
    /// (checked with ring's verifier from the written `whpk_` key), sealed and opened like a
    /// shared secret.
    #[test]
    fn ed25519_signatures_verify_with_the_public_key_alone() {
        let (signer, written) = Signer::new_ed25519().unwrap();
        assert!(written.starts_with(SIGNING_KEY_PREFIX));
        let sealer = SecretBox::new([4; 32]);
        let sealed = sealer.seal_text(&written, &secret_aad("acme", "whe_9"));
        let opened = sealer.open(&sealed, &secret_aad("acme", "whe_9")).unwrap();
        let public = opened.public_key().unwrap();
        assert_eq!(Some(public.clone()), signer.public_key());
        let key = base64::engine::general_purpose::STANDARD
            .decode(public.strip_prefix(PUBLIC_KEY_PREFIX).unwrap())
            .unwrap();
        let verifier = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key);
        let header = opened.sign("msg_1", 1_700_000_000, b"{\"a\":1}");
        let signature = base64::engine::general_purpose::STANDARD
            .decode(header.strip_prefix("v1a,").unwrap())
            .unwrap();
        assert!(verifier.verify(b"msg_1.1700000000.{\"a\":1}", &signature).is_ok());
        assert!(
            verifier
                .verify(b"msg_1.1700000001.{\"a\":1}", &signature)
                .is_err()
        );
        // Beside a shared secret during a rotation: both signatures, space-separated.
        let hmac = Signer::Hmac(WebhookSecret::from_bytes(vec![7; 32]).unwrap());
        let both = signatures(&[&opened, &hmac], "msg_1", 1_700_000_000, b"{}");
        assert!(both.starts_with("v1a,") && both.contains(" v1,"), "{both}");
        assert!(Signer::parse("whsk_!!!").is_none());
    }
}
