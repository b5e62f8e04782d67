//! The release binary's function order (`link/symbol-order.txt`, passed to the linker by
//! `build.rs`) and its optimisation profile (`link/warrant.profdata`, passed to the compiler by
//! `link/rustc`) name functions by their symbols, and a symbol's hash follows the compiler and
//! the crate's place in the dependency graph: one dependency added to the lowest workspace
//! crate renamed 3,539 of the order's 5,781 functions, the linker skipped them without a word,
//! and idle RSS went from ~21 MiB to 31 MiB, over PRODUCT §12's 30 MB (docs/benchmarks.md,
//! "Memory"); a profile whose names are not the binary's optimises nothing, as silently. Each
//! file's header names the compiler and the `Cargo.lock` it was made with; these tests hold
//! them to the build's, so a file is remade with the change that stales it.
#![allow(clippy::panic, reason = "tests")]

use sha2::{Digest, Sha256};

/// A file made from a profile of the serving gateway, and how to remake it.
struct Made {
    /// The file whose leading `#` lines are the header, relative to the package root.
    header: &'static str,
    /// What it is, for the failure message.
    what: &'static str,
    remake: &'static str,
}

const ORDER: Made = Made {
    header: "link/symbol-order.txt",
    what: "link/symbol-order.txt",
    remake: "remake it with crates/warrant-server/benches/layout.sh (a release build and a short \
             load run under callgrind), and commit it with this change",
};

const PROFILE: Made = Made {
    header: "link/warrant.profdata.txt",
    what: "link/warrant.profdata",
    remake: "remake it with crates/warrant-server/benches/pgo.sh (an instrumented release build \
             and a short load run), and commit it with this change",
};

impl Made {
    fn header(&self) -> Vec<String> {
        let path = format!("{}/{}", env!("CARGO_MANIFEST_DIR"), self.header);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        text.lines()
            .take_while(|line| line.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }

    fn is_made_for_this_cargo_lock(&self) {
        let lock = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
            .unwrap_or_else(|e| panic!("Cargo.lock: {e}"));
        let expected = format!("# Cargo.lock sha256 {}", hex::encode(Sha256::digest(&lock)));
        let header = self.header();
        assert!(
            header.contains(&expected),
            "{} was made with another Cargo.lock (its header: {header:?}; this one: \
             {expected:?}): most of its names are no longer the binary's; {}",
            self.what,
            self.remake
        );
    }

    fn is_made_with_this_compiler(&self) {
        let built_with = env!("WARRANT_BUILT_WITH");
        // Releases are built with a stable compiler; a nightly or beta one (fuzzing, Miri)
        // builds other symbols anyway and is not what the file is for (`build.rs` warns when
        // a release is built with a compiler the file was not made with).
        if built_with.is_empty() || built_with.contains("-nightly") || built_with.contains("-beta") {
            return;
        }
        let expected = format!("# {built_with}");
        let header = self.header();
        assert!(
            header.first() == Some(&expected),
            "{} was made with another compiler (its header: {header:?}; this one: {expected:?}); \
             {}",
            self.what,
            self.remake
        );
    }
}

#[test]
fn the_function_order_is_made_for_this_cargo_lock() {
    ORDER.is_made_for_this_cargo_lock();
}

#[test]
fn the_function_order_is_made_with_this_compiler() {
    ORDER.is_made_with_this_compiler();
}

#[test]
fn the_profile_is_made_for_this_cargo_lock() {
    PROFILE.is_made_for_this_cargo_lock();
}

#[test]
fn the_profile_is_made_with_this_compiler() {
    PROFILE.is_made_with_this_compiler();
}
