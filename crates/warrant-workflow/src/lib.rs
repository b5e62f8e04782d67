//! Warrant's authored lane (PRODUCT §8): workflows written in YAML whose tool steps are
//! governed exactly like a dispatched call, and whose definitions are refused before they can
//! be published if any path could reach a side effect without the human review its policy
//! requires (Gate A).
//!
//! - [`definition`]: the grammar, read strictly (unknown keys refused, every problem with its
//!   pointer);
//! - [`template`]: the `${…}` bindings;
//! - [`graph`]: the step graph and the path searches the rules need;
//! - [`types`]: what a JSON Schema says about a bound field;
//! - [`compile`]: the compiler — tool resolution and pinning, binding types, CEL conditions,
//!   Gate A and cycle bounds — with every violation's rule and witness path.
//!
//! No I/O: the catalogue of contracts is passed in ([`compile::Catalog`]).

pub mod compile;
pub mod definition;
pub mod graph;
pub mod run;
pub mod template;
pub mod types;

pub use compile::{Catalog, Compiled, Found, Rule, StaticCatalog, Violation, compile, compile_text};
pub use definition::{Definition, Step, StepKind, ToolRef};
