//! Inbound webhook signatures: whether a delivery from an outside system was signed by the
//! source's secret, checked over the **raw bytes** of the body before anything parses them, in
//! constant time, and — where the scheme signs a timestamp — no more than [`TOLERANCE`]
//! seconds away from now.
//!
//! Three schemes, one per [`Provider`]:
//! - **Standard Webhooks**: `webhook-id`, `webhook-timestamp`, `webhook-signature`
//!   (`v1,<base64>` of HMAC-SHA256 over `id.timestamp.body`, under the base64-decoded
//!   `whsec_…` secret); the event id is `webhook-id`.
//! - **Stripe**: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]` (HMAC-SHA256 over
//!   `t.body` under the secret's bytes as written); the event id is the body's `id`.
//! - **GitHub**: `X-Hub-Signature-256: sha256=<hex>` (HMAC-SHA256 over the body under the
//!   secret's bytes); no timestamp; the event id is `X-GitHub-Delivery`.
//!
//! Written here (a few lines over `hmac`, which does the constant-time comparison) because no
//! maintained crate verifies all three; the Standard Webhooks scheme is the one
//! [`crate::webhook`] signs with, checked there against the specification's vector.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far (seconds) a signed timestamp may be from now, either way.
pub const TOLERANCE: i64 = 300;

/// The longest signature header read (a rotation sends a few signatures; nothing needs more).
const MAX_HEADER: usize = 2048;

/// How an outside system signs its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// The Standard Webhooks specification (Svix and others).
    StandardWebhooks,
    /// Stripe's `Stripe-Signature` scheme.
    Stripe,
    /// GitHub's `X-Hub-Signature-256`.
    Github,
}

impl Provider {
    /// Every provider.
    pub const ALL: [Provider; 3] = [Provider::StandardWebhooks, Provider::Stripe, Provider::Github];

    /// The stored and written name.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::StandardWebhooks => "standard_webhooks",
            Provider::Stripe => "stripe",
            Provider::Github => "github",
        }
    }

    /// Reads a written name.
    pub fn parse(text: &str) -> Option<Self> {
        Provider::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// The header that carries the signature.
    pub fn signature_header(self) -> &'static str {
        match self {
            Provider::StandardWebhooks => "webhook-signature",
            Provider::Stripe => "stripe-signature",
            Provider::Github => "x-hub-signature-256",
        }
    }
}

/// A source's verifying secret. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct InboundSecret {
    written: String,
    key: Vec<u8>,
}

impl std::fmt::Debug for InboundSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InboundSecret(..)")
    }
}

/// A secret that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InboundSecretError {
    /// A Standard Webhooks secret that is not (`whsec_`) base64.
    #[error("a Standard Webhooks secret is `whsec_` followed by base64")]
    Malformed,
    /// Too weak or too long: 16 to 256 bytes of key.
    #[error("a secret holds 16 to 256 bytes")]
    Length,
}

impl InboundSecret {
    /// Reads the secret of a `provider` as the provider writes it: a Standard Webhooks secret is
    /// `whsec_` (optional) and base64; Stripe's and GitHub's are used byte for byte.
    ///
    /// # Errors
    /// Malformed, or too short or long.
    pub fn parse(provider: Provider, written: &str) -> Result<Self, InboundSecretError> {
        let key = match provider {
            Provider::StandardWebhooks => {
                let encoded = written
                    .strip_prefix(crate::webhook::SECRET_PREFIX)
                    .unwrap_or(written);
                STANDARD
                    .decode(encoded)
                    .map_err(|_| InboundSecretError::Malformed)?
            }
            Provider::Stripe | Provider::Github => written.as_bytes().to_vec(),
        };
        if !(16..=256).contains(&key.len()) {
            return Err(InboundSecretError::Length);
        }
        Ok(InboundSecret {
            written: written.to_owned(),
            key,
        })
    }

    /// The secret as it was written (to seal it at rest).
    pub fn expose(&self) -> &str {
        &self.written
    }

    fn mac(&self) -> HmacSha256 {
        // INVARIANT: HMAC takes a key of any length.
        HmacSha256::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
    }
}

/// Why a delivery is refused. Every refusal answers `401` and does nothing else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A header the scheme needs is absent.
    #[error("the `{0}` header is missing")]
    Missing(&'static str),
    /// A header is not in the scheme's form.
    #[error("the `{0}` header is malformed")]
    Malformed(&'static str),
    /// The signed timestamp is too far from now.
    #[error("the signed timestamp is {0} s from now (at most {TOLERANCE} s is accepted)")]
    Stale(i64),
    /// No signature in the header is the source's for these bytes.
    #[error("no signature matches the body under the source's secret")]
    Mismatch,
}

/// What a verified delivery's headers said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The provider's event id, where a header carries it (Stripe's is in the body).
    pub event_id: Option<String>,
    /// The signed timestamp, where the scheme signs one.
    pub timestamp: Option<i64>,
}

/// Verifies a delivery: `header` reads a request header by lower-case name, `body` is the raw
/// bytes, `now` the Unix time. Any of `secrets` may have signed it (a rotation keeps the
/// previous one for a while).
///
/// # Errors
/// The [`Refusal`].
pub fn verify<'h>(
    provider: Provider,
    secrets: &[&InboundSecret],
    header: &dyn Fn(&str) -> Option<&'h str>,
    body: &[u8],
    now: i64,
) -> Result<Verified, Refusal> {
    let name = provider.signature_header();
    let signature = header(name).ok_or(Refusal::Missing(name))?;
    if signature.len() > MAX_HEADER {
        return Err(Refusal::Malformed(name));
    }
    match provider {
        Provider::StandardWebhooks => {
            let id = header("webhook-id").ok_or(Refusal::Missing("webhook-id"))?;
            let timestamp = timestamp_of(
                header("webhook-timestamp").ok_or(Refusal::Missing("webhook-timestamp"))?,
                "webhook-timestamp",
            )?;
            fresh(timestamp, now)?;
            let candidates: Vec<Vec<u8>> = signature
                .split(' ')
                .filter_map(|c| c.strip_prefix("v1,"))
                .filter_map(|s| STANDARD.decode(s).ok())
                .collect();
            if candidates.is_empty() {
                return Err(Refusal::Malformed(name));
            }
            let written = timestamp.to_string();
            let signed = [id.as_bytes(), b".", written.as_bytes(), b".", body];
            matches(secrets, &signed, &candidates)?;
            Ok(Verified {
                event_id: Some(id.to_owned()),
                timestamp: Some(timestamp),
            })
        }
        Provider::Stripe => {
            let mut timestamp = None;
            let mut candidates = Vec::new();
            for part in signature.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", t)) => timestamp = Some(timestamp_of(t, name)?),
                    Some(("v1", sig)) => {
                        candidates.push(hex::decode(sig).map_err(|_| Refusal::Malformed(name))?)
                    }
                    // Other schemes (`v0`, test-mode signatures) are not trusted.
                    Some(_) => {}
                    None => return Err(Refusal::Malformed(name)),
                }
            }
            let timestamp = timestamp.ok_or(Refusal::Malformed(name))?;
            if candidates.is_empty() {
                return Err(Refusal::Malformed(name));
            }
            fresh(timestamp, now)?;
            let written = timestamp.to_string();
            let signed = [written.as_bytes(), b".", body];
            matches(secrets, &signed, &candidates)?;
            Ok(Verified {
                event_id: None,
                timestamp: Some(timestamp),
            })
        }
        Provider::Github => {
            let sig = signature
                .strip_prefix("sha256=")
                .and_then(|s| hex::decode(s).ok())
                .ok_or(Refusal::Malformed(name))?;
            matches(secrets, &[body], &[sig])?;
            Ok(Verified {
                event_id: header("x-github-delivery").map(str::to_owned),
                timestamp: None,
            })
        }
    }
}

fn timestamp_of(text: &str, header: &'static str) -> Result<i64, Refusal> {
    text.trim().parse::<i64>().map_err(|_| Refusal::Malformed(header))
}

fn fresh(timestamp: i64, now: i64) -> Result<(), Refusal> {
    let skew = timestamp.saturating_sub(now);
    if skew.unsigned_abs() > TOLERANCE.unsigned_abs() {
        return Err(Refusal::Stale(skew));
    }
    Ok(())
}

/// Whether any candidate is the MAC of `signed` (its parts concatenated) under any secret;
/// each comparison in constant time (`Mac::verify_slice`), and every pair is compared.
fn matches(secrets: &[&InboundSecret], signed: &[&[u8]], candidates: &[Vec<u8>]) -> Result<(), Refusal> {
    let mut found = false;
    for secret in secrets {
        let mut mac = secret.mac();
        for part in signed {
            mac.update(part);
        }
        for candidate in candidates {
            found |= mac.clone().verify_slice(candidate).is_ok();
        }
    }
    if found { Ok(()) } else { Err(Refusal::Mismatch) }
}

/// The signature a `provider` would send for `body` (the `Stripe-Signature` or
/// `X-Hub-Signature-256` value, or Standard Webhooks' `webhook-signature` for message `id`), for
/// tests and for operators checking a source by hand.
pub fn sign(provider: Provider, secret: &InboundSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = secret.mac();
    match provider {
        Provider::StandardWebhooks => {
            mac.update(format!("{id}.{timestamp}.").as_bytes());
            mac.update(body);
            format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
        }
        Provider::Stripe => {
            mac.update(format!("{timestamp}.").as_bytes());
            mac.update(body);
            format!("t={timestamp},v1={}", hex::encode(mac.finalize().into_bytes()))
        }
        Provider::Github => {
            mac.update(body);
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::collections::HashMap;

    use super::*;

    fn lookup<'a>(headers: &'a HashMap<&'static str, String>) -> impl Fn(&str) -> Option<&'a str> + 'a {
        move |name: &str| headers.get(name).map(String::as_str)
    }

    /// GitHub's published example ("Validating webhook deliveries").
    #[test]
    fn verifies_githubs_published_example() {
        let secret = InboundSecret::parse(Provider::Github, "It's a Secret to Everybody").unwrap();
        let body = b"Hello, World!";
        let expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(Provider::Github, &secret, "", 0, body), expected);
        let headers = HashMap::from([
            ("x-hub-signature-256", expected.to_owned()),
            ("x-github-delivery", "72d3162e".to_owned()),
        ]);
        let verified = verify(Provider::Github, &[&secret], &lookup(&headers), body, 0).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("72d3162e"));
        assert_eq!(
            verify(
                Provider::Github,
                &[&secret],
                &lookup(&headers),
                b"Hello, World?",
                0
            ),
            Err(Refusal::Mismatch)
        );
    }

    /// The Standard Webhooks specification's vector.
    #[test]
    fn verifies_the_standard_webhooks_vector() {
        let secret = InboundSecret::parse(
            Provider::StandardWebhooks,
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        .unwrap();
        let body = br#"{"test": 2432232314}"#;
        let headers = HashMap::from([
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek".to_owned()),
            ("webhook-timestamp", "1614265330".to_owned()),
            (
                "webhook-signature",
                "v1,bm9ldHUjKzFob2VudXRob2VodWUzMjRvdWVvdW9ldQo= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_owned(),
            ),
        ]);
        let at = 1_614_265_330;
        let verified = verify(
            Provider::StandardWebhooks,
            &[&secret],
            &lookup(&headers),
            body,
            at,
        )
        .unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("msg_p5jXN8AQM9LWM0D4loKWxJek"));
        assert!(
            verify(
                Provider::StandardWebhooks,
                &[&secret],
                &lookup(&headers),
                body,
                at + 300
            )
            .is_ok()
        );
        assert_eq!(
            verify(
                Provider::StandardWebhooks,
                &[&secret],
                &lookup(&headers),
                body,
                at + 301
            ),
            Err(Refusal::Stale(-301))
        );
        assert_eq!(
            verify(
                Provider::StandardWebhooks,
                &[&secret],
                &lookup(&headers),
                body,
                at - 301
            ),
            Err(Refusal::Stale(301))
        );
    }

    #[test]
    fn stripe_signatures_are_checked_with_their_timestamp() {
        let secret = InboundSecret::parse(Provider::Stripe, "whsec_test_secret_0123456789").unwrap();
        let other = InboundSecret::parse(Provider::Stripe, "whsec_previous_secret_98765").unwrap();
        let body = br#"{"id":"evt_1","type":"invoice.paid"}"#;
        let header = sign(Provider::Stripe, &secret, "", 1_700_000_000, body);
        let mut headers = HashMap::from([("stripe-signature", header.clone())]);
        let ok = |h: &HashMap<&'static str, String>, b: &[u8], now| {
            verify(Provider::Stripe, &[&other, &secret], &lookup(h), b, now)
        };
        assert!(ok(&headers, body, 1_700_000_100).is_ok());
        assert_eq!(ok(&headers, b"{}", 1_700_000_100), Err(Refusal::Mismatch));
        assert_eq!(ok(&headers, body, 1_700_000_301), Err(Refusal::Stale(-301)));
        // A signature for another timestamp does not verify under this one.
        headers.insert("stripe-signature", header.replace("t=1700000000", "t=1700000001"));
        assert_eq!(ok(&headers, body, 1_700_000_100), Err(Refusal::Mismatch));
        // Truncated, or only an untrusted scheme.
        headers.insert("stripe-signature", header[..header.len() - 2].to_owned());
        assert_eq!(ok(&headers, body, 1_700_000_100), Err(Refusal::Mismatch));
        headers.insert("stripe-signature", header[..header.len() - 1].to_owned());
        assert_eq!(
            ok(&headers, body, 1_700_000_100),
            Err(Refusal::Malformed("stripe-signature"))
        );
        headers.insert("stripe-signature", "t=1700000000,v0=abcd".to_owned());
        assert_eq!(
            ok(&headers, body, 1_700_000_100),
            Err(Refusal::Malformed("stripe-signature"))
        );
        headers.remove("stripe-signature");
        assert_eq!(
            ok(&headers, body, 1_700_000_100),
            Err(Refusal::Missing("stripe-signature"))
        );
        // The wrong secret alone.
        headers.insert("stripe-signature", header);
        assert_eq!(
            verify(
                Provider::Stripe,
                &[&other],
                &lookup(&headers),
                body,
                1_700_000_100
            ),
            Err(Refusal::Mismatch)
        );
    }

    #[test]
    fn secrets_are_read_per_provider() {
        assert_eq!(
            InboundSecret::parse(Provider::StandardWebhooks, "whsec_!!!"),
            Err(InboundSecretError::Malformed)
        );
        assert_eq!(
            InboundSecret::parse(Provider::Github, "short"),
            Err(InboundSecretError::Length)
        );
        let s = InboundSecret::parse(Provider::Github, "a long enough secret").unwrap();
        assert_eq!(format!("{s:?}"), "InboundSecret(..)");
        assert_eq!(s.expose(), "a long enough secret");
        for p in Provider::ALL {
            assert_eq!(Provider::parse(p.as_str()), Some(p));
        }
    }

    proptest::proptest! {
        /// Any change to the body or the signature refuses it, whatever the provider.
        #[test]
        fn any_tampering_is_refused(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            flip in 0usize..200,
            provider in proptest::sample::select(Provider::ALL.to_vec()),
        ) {
            let secret = InboundSecret::parse(provider, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
            let now = 1_700_000_000;
            let signature = sign(provider, &secret, "msg_1", now, &body);
            let headers = HashMap::from([
                (provider.signature_header(), signature),
                ("webhook-id", "msg_1".to_owned()),
                ("webhook-timestamp", now.to_string()),
            ]);
            proptest::prop_assert!(verify(provider, &[&secret], &lookup(&headers), &body, now).is_ok());
            if !body.is_empty() {
                let mut tampered = body.clone();
                let i = flip % tampered.len();
                tampered[i] ^= 1;
                proptest::prop_assert!(verify(provider, &[&secret], &lookup(&headers), &tampered, now).is_err());
            }
        }
    }
}
