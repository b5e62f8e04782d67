//! Helpers shared by the integration tests of the binary.
#![allow(dead_code, reason = "each test binary uses a part")]

pub mod serve;
