//! Warrant's execution runtime (PRODUCT §4, §5, §7): what happens after `allow`.

pub mod adapter;
pub mod adapters;
pub mod binding;
pub mod dispatch;
pub mod execute;
pub mod model;
pub mod net;
pub mod reconcile;
pub mod retry;
pub mod secrets;

pub use adapter::{Adapter, BindingError, Failure, Inquiry, Invocation, Reconciled};
pub use adapters::Adapters;
pub use dispatch::{Dispatched, OwnedCall, dispatch, submit};
pub use execute::{Executed, Execution, Runtime, RuntimeSettings};
pub use secrets::{Credential, CredentialSpec, Secret, Secrets, ToolGrant};
