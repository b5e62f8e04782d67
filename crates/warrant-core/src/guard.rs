//! Guards: argument allow-lists configured per tenant, applied to the fields a contract marks
//! with `x-warrant-allowlist: <list>` (e.g. email recipients on `to`, `cc`, `bcc`).
//!
//! An entry is an exact address (`alice@customer.example`) or a domain pattern
//! (`*@customer.example`); matching is case-insensitive. A value that does not parse as exactly
//! one bare address (no display name, no list, no comment, no domain literal) is refused like
//! an address off the list, and a marked field with no list configured for the tenant refuses
//! every value: guards fail closed. Which values a marked node applies to is the schema walk's
//! answer ([`crate::contract::walk`]), the same one redaction uses.

use std::collections::{BTreeMap, BTreeSet};

use email_address::{EmailAddress, Options};
use serde_json::{Map, Value};

use crate::contract::CompiledSchema;
use crate::contract::walk::{Annotations, Instance};
use crate::decision::{RejectCode, Rejection};

/// One allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    exact: BTreeSet<String>,
    domains: BTreeSet<String>,
}

impl AllowList {
    /// Builds a list from entries (`user@domain` or `*@domain`).
    ///
    /// # Errors
    /// The first entry that is neither.
    pub fn new<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<AllowList, String> {
        let mut list = AllowList::default();
        for entry in entries {
            if let Some(domain) = entry.strip_prefix("*@") {
                let probe = format!("x@{domain}");
                let parsed = parse_address(&probe)
                    .ok_or_else(|| format!("`{entry}` is not a valid domain pattern"))?;
                list.domains.insert(parsed.1);
            } else {
                let (local, domain) =
                    parse_address(entry).ok_or_else(|| format!("`{entry}` is not a single email address"))?;
                list.exact.insert(format!("{local}@{domain}"));
            }
        }
        Ok(list)
    }

    /// Whether `address` parses as one address and is on the list.
    pub fn allows(&self, address: &str) -> bool {
        match parse_address(address) {
            Some((local, domain)) => {
                self.domains.contains(&domain) || self.exact.contains(&format!("{local}@{domain}"))
            }
            None => false,
        }
    }
}

/// Parses exactly one bare address; returns (local part, domain), both lowercased.
fn parse_address(text: &str) -> Option<(String, String)> {
    // The parser accepts some forms that are not a single bare mailbox for our purposes;
    // refuse anything with list, display-name, comment or whitespace characters outright.
    if text.len() > 254
        || text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || ",;<>()[]\"\\".contains(c))
    {
        return None;
    }
    let options = Options {
        minimum_sub_domains: 2,
        allow_domain_literal: false,
        allow_display_text: false,
        allow_long_local_parts: false,
    };
    let parsed = EmailAddress::parse_with_options(text, options).ok()?;
    if parsed.as_str() != text {
        return None;
    }
    Some((parsed.local_part().to_lowercase(), parsed.domain().to_lowercase()))
}

/// Allow-lists per tenant: tenant → list name → list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guards {
    tenants: BTreeMap<String, BTreeMap<String, AllowList>>,
}

impl Guards {
    /// No lists at all (every marked field refuses every value).
    pub fn new() -> Self {
        Guards::default()
    }

    /// Sets `tenant`'s list `name`.
    pub fn set(&mut self, tenant: &str, name: &str, list: AllowList) {
        self.tenants
            .entry(tenant.to_owned())
            .or_default()
            .insert(name.to_owned(), list);
    }

    /// Checks every value a marked node of `schema` applies to in `arguments` (valid for it):
    /// one walk ([`crate::contract::walk`]), then [`Guards::check_annotations`].
    ///
    /// # Errors
    /// `reject(guard, RECIPIENT_NOT_ALLOWED)` with the pointer of the first refused value, or
    /// `reject(schema, ARGUMENTS_TOO_COMPLEX)` when the walk overflows.
    pub fn check(
        &self,
        tenant: &str,
        schema: &CompiledSchema,
        arguments: &Map<String, Value>,
    ) -> Result<(), Rejection> {
        self.check_annotations(tenant, &schema.annotations(arguments)?)
    }

    /// Checks every value an `x-warrant-allowlist` node applies to, as the walk found them. A
    /// string must be on the list; each item of an array must be a string on the list; `null`
    /// (no value) passes; anything else is refused.
    ///
    /// # Errors
    /// `reject(guard, RECIPIENT_NOT_ALLOWED)` with the pointer of the first refused value.
    pub fn check_annotations(
        &self,
        tenant: &str,
        annotations: &Annotations<'_, '_>,
    ) -> Result<(), Rejection> {
        let lists = self.tenants.get(tenant);
        for hit in annotations.hits() {
            let Some(name) = hit.node().allowlist() else {
                continue;
            };
            let list = lists.and_then(|l| l.get(name));
            let allowed = |value: &Value| value.as_str().is_some_and(|v| list.is_some_and(|l| l.allows(v)));
            let refuse = |at: String| {
                Err(Rejection::new(
                    RejectCode::RecipientNotAllowed,
                    format!("a value is not on the tenant's `{name}` allow-list"),
                )
                .at(at))
            };
            let at = format!("/arguments{}", hit.pointer());
            match hit.value() {
                Instance::Value(Value::Null) => {}
                Instance::Value(Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        if !allowed(item) {
                            return refuse(format!("{at}/{i}"));
                        }
                    }
                }
                Instance::Value(value) if allowed(value) => {}
                _ => return refuse(at),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> AllowList {
        AllowList::new(["alice@customer.example", "*@partner.example"]).unwrap()
    }

    #[test]
    fn exact_and_domain_entries_case_insensitive() {
        let l = list();
        assert!(l.allows("alice@customer.example"));
        assert!(l.allows("ALICE@Customer.Example"));
        assert!(l.allows("bob@partner.example"));
        assert!(l.allows("Bob@PARTNER.example"));
        assert!(!l.allows("bob@customer.example"));
        assert!(!l.allows("alice@customer.example.evil"));
        assert!(
            !l.allows("bob@sub.partner.example"),
            "a domain pattern is that domain only"
        );
    }

    #[test]
    fn anything_but_one_bare_address_is_refused() {
        let l = list();
        for bad in [
            "Alice <alice@customer.example>",
            "alice@customer.example, bob@partner.example",
            "alice@customer.example;bob@partner.example",
            " alice@customer.example",
            "alice@customer.example\n",
            "alice(comment)@customer.example",
            "\"alice\"@customer.example",
            "alice@[192.168.0.1]",
            "alice@localhost",
            "alice",
            "",
            "@partner.example",
            "a@b@partner.example",
        ] {
            assert!(!l.allows(bad), "{bad:?}");
        }
        assert!(AllowList::new(["not an address"]).is_err());
        assert!(AllowList::new(["*@"]).is_err());
    }

    #[test]
    fn marked_fields_are_checked_with_pointers() {
        let schema = json!({
            "type": "object",
            "properties": {
                "to": {"type": "array", "items": {"type": "string"}, "x-warrant-allowlist": "email_recipients"},
                "cc": {"type": "array", "items": {"type": "string"}, "x-warrant-allowlist": "email_recipients"},
                "subject": {"type": "string"}
            }
        });
        let schema = CompiledSchema::compile(&schema).unwrap();
        let mut guards = Guards::new();
        guards.set("acme", "email_recipients", list());
        let args = |v: Value| v.as_object().unwrap().clone();
        assert!(
            guards
                .check(
                    "acme",
                    &schema,
                    &args(json!({"to": ["alice@customer.example"], "subject": "x@evil.example"}))
                )
                .is_ok()
        );
        let refused = guards
            .check("acme", &schema, &args(json!({"to": ["alice@customer.example"], "cc": ["bob@partner.example", "eve@evil.example"]})))
            .unwrap_err();
        assert_eq!(refused.code(), RejectCode::RecipientNotAllowed);
        assert_eq!(refused.pointer(), Some("/arguments/cc/1"));
        assert!(!refused.detail().contains("evil"), "details never echo values");
        // Another tenant has no list: everything is refused.
        assert!(
            guards
                .check(
                    "globex",
                    &schema,
                    &args(json!({"to": ["alice@customer.example"]}))
                )
                .is_err()
        );
    }
}
