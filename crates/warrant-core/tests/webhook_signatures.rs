//! Warrant's Standard Webhooks signatures, checked by an independent implementation (the
//! specification's own `standardwebhooks` crate), for arbitrary text bodies, ids and secrets.
#![allow(clippy::unwrap_used, missing_docs, reason = "tests")]

use proptest::prelude::*;
use warrant_core::webhook::{WebhookSecret, signature_header};

fn headers(id: &str, timestamp: i64, signature: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("webhook-id", id.parse().unwrap());
    h.insert("webhook-timestamp", timestamp.to_string().parse().unwrap());
    h.insert("webhook-signature", signature.parse().unwrap());
    h
}

proptest! {
    #[test]
    fn every_signature_verifies_independently(
        key in proptest::collection::vec(any::<u8>(), 24..=64),
        other in proptest::collection::vec(any::<u8>(), 24..=64),
        id in "msg_[A-Za-z0-9]{1,32}",
        // Webhook bodies are JSON text (the reference signs UTF-8 only).
        text in "\\PC{0,256}",
    ) {
        let body = text.into_bytes();
        let secret = WebhookSecret::from_bytes(key).unwrap();
        let previous = WebhookSecret::from_bytes(other).unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let header = signature_header(&[&secret, &previous], &id, now, &body);
        for s in [&secret, &previous] {
            let reference = standardwebhooks::Webhook::new(&s.expose()).unwrap();
            prop_assert!(reference.verify(&body, &headers(&id, now, &header)).is_ok());
        }
        let mut tampered = body.clone();
        tampered.push(b' ');
        let reference = standardwebhooks::Webhook::new(&secret.expose()).unwrap();
        prop_assert!(reference.verify(&tampered, &headers(&id, now, &header)).is_err());
        // And ours agrees with the reference's own signatures.
        let theirs = reference.sign(&id, now, &body).unwrap();
        prop_assert!(secret.verify(&id, now, &body, &theirs));
    }
}
