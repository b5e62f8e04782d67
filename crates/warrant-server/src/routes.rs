//! The HTTP routes, one module per resource, each ending in `router()`.

pub mod approvals;
pub mod contracts;
pub mod health;
pub mod keys;
pub mod ledger;
pub mod proposals;
pub mod tenants;
pub mod workflows;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// RFC 3339 text of a timestamp.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}
