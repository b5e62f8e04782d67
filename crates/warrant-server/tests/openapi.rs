//! The committed OpenAPI document (`docs/openapi.json`) is exactly what the code generates;
//! rerun with `WARRANT_UPDATE_OPENAPI=1` to rewrite it after changing the API.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let generated = warrant_server::openapi::document();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    if std::env::var_os("WARRANT_UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is stale: run `WARRANT_UPDATE_OPENAPI=1 cargo test -p warrant-server --test openapi`"
    );
    // Every route of the API is described.
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    for path in [
        "/v1/proposals",
        "/v1/contracts",
        "/v1/contracts/{name}/{version}",
        "/v1/contracts/{id}/retire",
        "/v1/approvals",
        "/v1/approvals/{id}",
        "/v1/approvals/{id}/approve",
        "/v1/approvals/{id}/reject",
        "/v1/ledger",
        "/v1/ledger/{id}",
        "/v1/keys",
        "/v1/keys/{id}",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/openapi.json",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is not described");
    }
}
