//! The HTTP routes, one module per resource, each ending in `router()`.

pub mod approvals;
pub mod contracts;
pub mod health;
pub mod inbound;
pub mod keys;
pub mod ledger;
pub mod proposals;
pub mod tenants;
pub mod webhooks;
pub mod workflows;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The format of an authored document (a contract, a workflow) by its `Content-Type`:
/// `application/json`, or `application/yaml` (also `application/x-yaml`, `text/yaml`);
/// anything else is a `415` naming `what`.
pub(crate) fn document_format(
    headers: &axum::http::HeaderMap,
    what: &str,
) -> Result<warrant_core::contract::DocumentFormat, crate::error::ApiError> {
    use warrant_core::contract::DocumentFormat;
    match proposals::header_text(headers, &axum::http::header::CONTENT_TYPE)
        .and_then(|ct| ct.split(';').next())
        .map(str::trim)
    {
        Some("application/json") => Ok(DocumentFormat::Json),
        Some("application/yaml" | "application/x-yaml" | "text/yaml") => Ok(DocumentFormat::Yaml),
        _ => Err(crate::error::ApiError::new(
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "request",
            "UNSUPPORTED_MEDIA_TYPE",
            format!("{what} is application/json or application/yaml"),
        )),
    }
}

/// RFC 3339 text of a timestamp.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}
