#!/usr/bin/env bash
# Writes `link/warrant.profdata`, the profile a release build is optimised with (`link/rustc`
# passes it to the compiler as `-C profile-use` for every crate built at `opt-level=3`).
#
# Profile-guided optimisation: LLVM inlines, orders branches and splits hot from cold code by
# how often each ran, rather than by guesses. The gateway's per-call work is spread thinly over
# thousands of functions of many crates (hyper, axum, tokio, serde, Cedar, SQLite's callers)
# with none above 2% of a call, which is what this helps: 0.75–0.95× the CPU per call in every
# case of the load bench (docs/benchmarks.md, "profile-guided optimisation").
#
# The profile: a `warrant` built with `-C profile-generate` (its own target directory; not with
# `--target`, which would change the symbols' hashes; the build scripts it runs write their
# counts apart, where they are dropped) serving the load bench — every case (MCP
# and HTTP, read and write with a key) at one and at 16 connections, one short round — then
# stopped cleanly (SIGTERM), which writes its counts. Merged sparse: functions that never ran
# have no entry (they are optimised as without a profile), which keeps the file about 3 MB.
#
# Functions are named by their symbols, which carry the hashes of the compiler and of the
# dependency graph: run this again after changing the compiler, Cargo.lock or the release
# profile (as for `layout.sh`); `tests/layout.rs` holds the header to the build's. Code changed
# since the profile was made is optimised as without one (LLVM matches each function's control
# flow to its record and drops a record that no longer fits), so a stale profile costs speed,
# never correctness.
#
# Usage: crates/warrant-server/benches/pgo.sh   Needs `llvm-profdata` of the compiler's own
# LLVM (`rustup component add llvm-tools`); takes a release build and about 3 minutes of load.
set -euo pipefail
cd "$(dirname "$0")/../../.."
sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  echo "needs $profdata: rustup component add llvm-tools" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/raw" "$work/build"

echo "==> the instrumented build"
WARRANT_PGO=0 RUSTFLAGS="-C profile-generate=$work/build" \
  cargo build --release -q -p warrant --target-dir target/pgo-generate
bin=$(realpath target/pgo-generate/release/warrant)

echo "==> the load bench against it"
LLVM_PROFILE_FILE="$work/raw/warrant-%p-%m.profraw" WARRANT_BIN=$bin WARRANT_LOAD_LEDGER_ROWS=0 \
  WARRANT_LOAD_ROUNDS=1 WARRANT_LOAD_SECS=4 WARRANT_LOAD_CONNECTIONS=1,16 \
  cargo bench -q -p warrant-server --bench load >"$work/bench.log" 2>&1 || {
  cat "$work/bench.log"
  exit 1
}
if ! ls "$work"/raw/*.profraw >/dev/null 2>&1; then
  echo "the server wrote no profile (was it stopped cleanly?)" >&2
  exit 1
fi

"$profdata" merge --sparse -o link/warrant.profdata "$work"/raw/*.profraw
{
  # The hashes in the names are the compiler's and the dependency graph's: `link/rustc` uses
  # the profile only with the compiler named here, and the test
  # `the_profile_is_made_for_this_cargo_lock` fails when Cargo.lock is not the one it was made
  # with.
  echo "# $(rustc -V)"
  echo "# Cargo.lock sha256 $(sha256sum Cargo.lock | cut -d' ' -f1)"
} >link/warrant.profdata.txt
echo "link/warrant.profdata: $(du -h link/warrant.profdata | cut -f1)"
