//! The environment port: the only way the core learns the time or gets a fresh id. The
//! system implementation lives outside the core (`warrant_store::SystemEnv`); tests inject a
//! fixed clock.

use time::OffsetDateTime;

/// Time and ids.
pub trait Env: Send + Sync {
    /// The current time.
    fn now(&self) -> OffsetDateTime;
    /// A fresh, unique, time-sortable id with `prefix` (e.g. `led_01J…`).
    fn new_id(&self, prefix: &str) -> String;
}
