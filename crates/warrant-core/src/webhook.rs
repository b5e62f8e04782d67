//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>): the `webhook-signature`
//! of a message is `v1,` and the base64 HMAC-SHA256, under the endpoint's secret, of
//! `{webhook-id}.{webhook-timestamp}.{body}`; a header may carry several space-separated
//! signatures (during a secret rotation, one per secret). Secrets are written `whsec_` and the
//! base64 of their bytes.
//!
//! Written here rather than taken from the `standardwebhooks` crate so that the tests can check
//! every signature against that independent implementation (and the specification's vector).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of a written secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// An endpoint's signing secret. `Debug` never shows it.
#[derive(Clone)]
pub struct WebhookSecret {
    bytes: Vec<u8>,
    /// The MAC keyed with `bytes`, cloned for each message.
    keyed: HmacSha256,
}

impl PartialEq for WebhookSecret {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for WebhookSecret {}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

/// A secret that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not `whsec_` and base64.
    #[error("a webhook secret is `whsec_` followed by base64")]
    Malformed,
    /// Fewer than 24 or more than 64 bytes.
    #[error("a webhook secret holds 24 to 64 bytes")]
    Length,
}

impl WebhookSecret {
    /// A secret of `bytes` (24 to 64 of them).
    ///
    /// # Errors
    /// Too short or too long.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, SecretError> {
        if !(24..=64).contains(&bytes.len()) {
            return Err(SecretError::Length);
        }
        let keyed = HmacSha256::new_from_slice(&bytes).map_err(|_| SecretError::Length)?;
        Ok(WebhookSecret { bytes, keyed })
    }

    /// Reads a written secret (`whsec_…`).
    ///
    /// # Errors
    /// Not a written secret.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text.strip_prefix(SECRET_PREFIX).ok_or(SecretError::Malformed)?;
        let bytes = STANDARD.decode(encoded).map_err(|_| SecretError::Malformed)?;
        Self::from_bytes(bytes)
    }

    /// The written form, `whsec_` and base64: shown once, when the secret is made.
    pub fn expose(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.bytes))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The `v1,` signature of a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!(
            "v1,{}",
            STANDARD.encode(self.mac(id, timestamp, body).finalize().into_bytes())
        )
    }

    /// Whether any `v1,` signature in `header` (space-separated) is this secret's for the
    /// message; each comparison in constant time.
    pub fn verify(&self, id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
        header.split(' ').any(|candidate| {
            candidate
                .strip_prefix("v1,")
                .and_then(|sig| STANDARD.decode(sig).ok())
                .is_some_and(|sig| self.mac(id, timestamp, body).verify_slice(&sig).is_ok())
        })
    }
}

/// The `webhook-signature` header for a message signed by each of `secrets` (the current one
/// first; during a rotation, the previous one too).
pub fn signature_header(secrets: &[&WebhookSecret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;

    /// The specification's test vector.
    #[test]
    fn signs_the_specification_vector() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        assert_eq!(
            secret.sign(ID, TIMESTAMP, BODY),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_eq!(secret.expose(), SECRET);
    }

    #[test]
    fn verifies_only_the_exact_message() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        let other = WebhookSecret::from_bytes(vec![9; 32]).unwrap();
        let header = signature_header(&[&other, &secret], ID, TIMESTAMP, BODY);
        assert!(header.contains(' '));
        assert!(secret.verify(ID, TIMESTAMP, BODY, &header));
        assert!(other.verify(ID, TIMESTAMP, BODY, &header));
        assert!(!secret.verify(ID, TIMESTAMP, br#"{"test": 2432232315}"#, &header));
        assert!(!secret.verify(ID, TIMESTAMP + 1, BODY, &header));
        assert!(!secret.verify("msg_other", TIMESTAMP, BODY, &header));
        let sig = secret.sign(ID, TIMESTAMP, BODY);
        for bad in [
            "",
            "v1,",
            "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            &sig[..sig.len() - 4],
            "v1,not base64!",
        ] {
            assert!(!secret.verify(ID, TIMESTAMP, BODY, bad), "{bad}");
        }
        let stranger = WebhookSecret::from_bytes(vec![1; 32]).unwrap();
        assert!(!stranger.verify(ID, TIMESTAMP, BODY, &header));
    }

    #[test]
    fn secrets_are_read_strictly() {
        assert_eq!(
            WebhookSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(SecretError::Malformed)
        );
        assert_eq!(WebhookSecret::parse("whsec_!!!"), Err(SecretError::Malformed));
        assert_eq!(WebhookSecret::parse("whsec_AAAA"), Err(SecretError::Length));
        assert_eq!(
            format!("{:?}", WebhookSecret::parse(SECRET).unwrap()),
            "WebhookSecret(..)"
        );
    }
}
