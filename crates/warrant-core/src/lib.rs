//! Warrant's pure core: tool contracts, strict parsing of untrusted proposals, canonical
//! digests, the closed decision vocabulary and the authority checks that need no storage.
//!
//! **Architecture invariant:** this crate does no I/O. Files, sockets, clocks and databases
//! belong to the crates above it; time comes in as an argument.

pub mod authority;
pub mod budget;
pub mod canon;
pub mod contract;
pub mod decision;
pub mod env;
pub mod guard;
pub mod inbound;
pub mod json;
pub mod pipeline;
pub mod policy;
pub mod proposal;
pub mod records;
pub mod redact;
pub mod registry;
pub mod seal;
pub mod store;
pub mod webhook;
pub mod yaml;

pub use canon::Sha256Digest;
pub use contract::{Contract, ContractId, Effect};
pub use decision::{RejectCode, Rejection, Stage, ToolErrorCode};
