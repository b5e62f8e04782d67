//! The sealing port: how a held call's exact arguments are kept at rest when its contract marks
//! a field `x-warrant-sensitive`.
//!
//! The ledger and an approval's `arguments` hold a sensitive value only as its keyed hash, so
//! the call cannot be rebuilt from them, and a reviewer sees only the hash. While the request
//! can still be decided or executed, its exact canonical arguments are also kept sealed
//! (authenticated encryption under a server key, bound to the approval), so that a reviewer
//! whom policy lets `reveal` the tool's sensitive values can see them and Warrant can execute
//! the approved call on the reviewer's decision. The store drops the sealed copy once the
//! request is consumed, rejected or expired. The AEAD itself lives above the core (no
//! cryptographic provider here); this is its interface.

use serde_json::{Map, Value};

use crate::canon::Sha256Digest;

/// Seals and opens bytes bound to an owner (additional authenticated data).
pub trait ArgumentSeal: Send + Sync {
    /// `plain` sealed for `aad`, as text the store keeps.
    fn seal(&self, plain: &[u8], aad: &str) -> String;
    /// The bytes sealed as `sealed` for `aad`; `None` when it was not sealed by this key for
    /// that owner (tampered, moved to another approval, or another server's key).
    fn open(&self, sealed: &str, aad: &str) -> Option<Vec<u8>>;
}

/// What a sealed copy of an approval's arguments is bound to: its tenant and id, so a copy
/// moved to another request (or tenant) does not open.
pub fn approval_aad(tenant: &str, approval_id: &str) -> String {
    format!("approval-arguments:{tenant}:{approval_id}")
}

/// The exact arguments sealed as `sealed` for approval `approval_id` of `tenant`, checked
/// against the `payload_digest` the approval is bound to; `None` when the copy does not open,
/// or is not exactly the approved payload.
pub fn open_arguments(
    seal: &dyn ArgumentSeal,
    sealed: &str,
    tenant: &str,
    approval_id: &str,
    payload_digest: &str,
) -> Option<Map<String, Value>> {
    let plain = seal.open(sealed, &approval_aad(tenant, approval_id))?;
    if Sha256Digest::of_bytes(&plain).text() != payload_digest {
        return None;
    }
    match serde_json::from_slice(&plain).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test seal: XOR with a key byte, the owner appended (no security; checks the port's
    /// binding logic only).
    struct Toy;
    impl ArgumentSeal for Toy {
        fn seal(&self, plain: &[u8], aad: &str) -> String {
            format!(
                "{}|{aad}",
                hex::encode(plain.iter().map(|b| b ^ 0x5a).collect::<Vec<_>>())
            )
        }
        fn open(&self, sealed: &str, aad: &str) -> Option<Vec<u8>> {
            let (data, owner) = sealed.split_once('|')?;
            (owner == aad).then(|| {
                hex::decode(data)
                    .ok()
                    .map(|d| d.iter().map(|b| b ^ 0x5a).collect())
            })?
        }
    }

    #[test]
    fn only_the_approved_payload_of_its_own_approval_opens() {
        let canonical = br#"{"card":"4111","n":1}"#;
        let digest = Sha256Digest::of_bytes(canonical).text();
        let sealed = Toy.seal(canonical, &approval_aad("acme", "apr_1"));
        let opened = open_arguments(&Toy, &sealed, "acme", "apr_1", &digest).expect("opens");
        assert_eq!(opened.get("card"), Some(&Value::String("4111".into())));
        assert!(
            open_arguments(&Toy, &sealed, "acme", "apr_2", &digest).is_none(),
            "another approval"
        );
        assert!(
            open_arguments(&Toy, &sealed, "other", "apr_1", &digest).is_none(),
            "another tenant"
        );
        let other = Sha256Digest::of_bytes(b"{}").text();
        assert!(
            open_arguments(&Toy, &sealed, "acme", "apr_1", &other).is_none(),
            "another payload"
        );
        let not_object = Toy.seal(b"[1]", &approval_aad("acme", "apr_1"));
        let d = Sha256Digest::of_bytes(b"[1]").text();
        assert!(open_arguments(&Toy, &not_object, "acme", "apr_1", &d).is_none());
    }
}
