//! Warrant's execution runtime (PRODUCT §4, §5, §7): what happens after `allow`.

pub mod net;
