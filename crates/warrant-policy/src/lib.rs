//! Warrant's policy engine: Cedar policies validated, at load, against a schema generated
//! from the registered contracts, and answered per call without parsing anything.
//!
//! [`CedarEngine`] implements [`warrant_core::policy::PolicyEngine`]. The entity model, the
//! JSON Schema → Cedar type mapping and the loading rules are described in `docs/policy.md`.
//!
//! Why the context is built by hand rather than with `Context::from_json_value`: the context
//! must leave out exactly the fields the schema leaves out (floats, mixed enums, …), and one
//! typed tree per contract (the `mapping` module) drives both the schema and the value, so
//! they cannot drift apart. Every request is still checked against the schema by
//! `Request::new`, which is what catches a wrong primitive type.

mod engine;
mod mapping;
mod schema;

pub use engine::{CedarEngine, PolicyLoadError, PolicyProblem, PolicySource};
