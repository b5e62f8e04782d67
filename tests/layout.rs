//! The release binary's function order (`link/symbol-order.txt`, passed to the linker by
//! `build.rs`) names functions by their symbols, and a symbol's hash follows the compiler and
//! the crate's place in the dependency graph: one dependency added to the lowest workspace
//! crate renamed 3,539 of the file's 5,781 functions, the linker skipped them without a word,
//! and idle RSS went from ~21 MiB to 31 MiB, over PRODUCT §12's 30 MB (docs/benchmarks.md,
//! "Memory"). The file names the compiler and the `Cargo.lock` it was made with; this holds
//! them to the build's, so the file is remade (`crates/warrant-server/benches/layout.sh`) with
//! the change that stales it.
#![allow(clippy::panic, reason = "tests")]

use sha2::{Digest, Sha256};

const REMAKE: &str = "remake it with crates/warrant-server/benches/layout.sh (a release build \
                      and a short load run under callgrind), and commit it with this change";

fn order_header() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/link/symbol-order.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .take_while(|line| line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_function_order_is_made_for_this_cargo_lock() {
    let lock = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .unwrap_or_else(|e| panic!("Cargo.lock: {e}"));
    let expected = format!("# Cargo.lock sha256 {}", hex::encode(Sha256::digest(&lock)));
    let header = order_header();
    assert!(
        header.contains(&expected),
        "link/symbol-order.txt was made with another Cargo.lock (its header: {header:?}; this \
         one: {expected:?}): most of its names are no longer the binary's; {REMAKE}"
    );
}

#[test]
fn the_function_order_is_made_with_this_compiler() {
    let built_with = env!("WARRANT_BUILT_WITH");
    // Releases are built with a stable compiler; a nightly or beta one (fuzzing, Miri) builds
    // other symbols anyway and is not what the file is for (`build.rs` warns when a release
    // is built with a compiler the file was not made with).
    if built_with.is_empty() || built_with.contains("-nightly") || built_with.contains("-beta") {
        return;
    }
    let expected = format!("# {built_with}");
    let header = order_header();
    assert!(
        header.contains(&expected),
        "link/symbol-order.txt was made with another compiler (its header: {header:?}; this \
         one: {expected:?}); {REMAKE}"
    );
}
