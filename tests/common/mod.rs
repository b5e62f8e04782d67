//! Helpers shared by the integration tests of the binary.
#![allow(dead_code, reason = "each test binary uses a part")]

pub mod serve;

/// An HTTP client. The workspace's reqwest has rustls without a built-in provider (the
/// binary installs ring, `src/client.rs`); a test's client needs the same.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
