//! API keys: generated here, shown once, stored only as a SHA-256 hash.
//!
//! A key reads `wrn_<id>_<secret>`: the id (16 hex) names the key in listings and revocation,
//! the secret (64 hex, 256 random bits) is what proves possession. Because the secret has full
//! entropy a fast hash is enough (no password stretching needed), and lookups are by hash, so
//! no secret is ever compared byte by byte.

use sha2::{Digest, Sha256};

/// The prefix of every Warrant API key.
pub const KEY_PREFIX: &str = "wrn_";

/// A freshly generated key: the string to hand out once, and what to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedKey {
    /// The public id.
    pub id: String,
    /// The full key string (`wrn_<id>_<secret>`); never stored.
    pub key: String,
    /// SHA-256 of `key`, hex: what the store keeps.
    pub hash: String,
}

/// Generates a new random key.
pub fn generate() -> GeneratedKey {
    let id = hex::encode(rand::random::<[u8; 8]>());
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let key = format!("{KEY_PREFIX}{id}_{secret}");
    let hash = hash(&key);
    GeneratedKey { id, key, hash }
}

/// The stored hash of a presented key, or `None` when it is not shaped like a key (so
/// malformed input never reaches the database).
pub fn hash_presented(presented: &str) -> Option<String> {
    let rest = presented.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let is_hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    (is_hex(id, 16) && is_hex(secret, 64)).then(|| hash(presented))
}

fn hash(key: &str) -> String {
    warrant_core::canon::hex_lower(&Sha256::digest(key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_hash_back() {
        let k = generate();
        assert_eq!(hash_presented(&k.key), Some(k.hash.clone()));
        assert!(k.key.starts_with("wrn_"));
        assert_ne!(generate().key, k.key);
        assert_eq!(hash_presented("wrn_abc_def"), None);
        assert_eq!(hash_presented(&k.key.to_uppercase()), None);
        assert_eq!(hash_presented(""), None);
    }
}
