#!/usr/bin/env bash
# Writes `link/symbol-order.txt`, the order in which the linker lays out the release binary's
# functions (build.rs passes it to lld as `--symbol-ordering-file`).
#
# The kernel maps the 64 KiB around each page of code a process faults in, and start-up plus
# the per-call path touch functions scattered over the whole text segment, so almost all of it
# ends up resident (docs/benchmarks.md, "Memory"). Laid out in the order this file gives, the
# functions a serving gateway runs sit together at the start of the text segment: fewer pages
# resident, fewer instruction-cache and TLB misses on the per-call path.
#
# The profile: the load bench's server (`warrant serve` with the bench's contracts, policies and
# upstream) under callgrind, from start-up through the warm-up of every case (MCP and HTTP,
# read and write) until it is idle. Functions are ordered by the instructions they executed,
# most first, so the per-call path comes first and the start-up code after it. Functions never
# run are laid out after these, in the linker's usual order.
#
# Symbol names carry a hash of their crate's build (compiler version, dependency graph,
# features, profile): run this again after changing the compiler, Cargo.lock or the release
# profile. A name the linker does not find is skipped, so a stale file costs memory, never
# correctness: after one dependency was added to the workspace's lowest crate, 3,539 of the
# file's 5,781 names were no longer in the binary and idle RSS went from ~21 to 31 MiB. The
# file's second line is the digest of the Cargo.lock it was made with; a test holds it to the
# current one.
#
# Usage: crates/warrant-server/benches/layout.sh [BINARY]   (default: target/release/warrant,
# built first). Needs valgrind, curl.
set -euo pipefail
cd "$(dirname "$0")/../../.."
if [ $# -ge 1 ]; then
  bin=$(realpath "$1")
else
  cargo build --release -q
  bin=$(realpath target/release/warrant)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out="$work/profile.callgrind"
wrapper="$work/warrant"
printf '#!/bin/sh\nexec valgrind --tool=callgrind --demangle=no --compress-strings=no --compress-pos=no --dump-instr=no --callgrind-out-file=%s %s "$@"\n' "$out" "$bin" >"$wrapper"
chmod +x "$wrapper"
log="$work/bench.log"
WARRANT_BIN=$wrapper WARRANT_LOAD_LEDGER_ROWS=0 WARRANT_LOAD_ROUNDS=1 WARRANT_LOAD_SECS=1 \
  WARRANT_LOAD_CONNECTIONS=1 WARRANT_LOAD_PAUSE=600 \
  cargo bench -q -p warrant-server --bench load >"$log" 2>&1 &
bench=$!
until grep -q "idle after warm-up; pausing" "$log"; do
  kill -0 "$bench" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 1
done
pid=$(grep -m1 "idle after warm-up; pausing" "$log" | sed 's/.*server pid \([0-9]*\).*/\1/')
callgrind_control -d "$pid" >/dev/null
kill -- "$bench" 2>/dev/null || true
kill -TERM "$pid" 2>/dev/null || true
wait "$bench" 2>/dev/null || true
dump=$(ls "$out".* | head -n1)
# Self cost per function of the binary itself (not libc's), most first. With
# --compress-strings=no every `fn=` line names its function; `ob=` names the object file the
# following functions belong to; cost lines follow `fn=` until the next `fn=`, and the lines
# after `calls=` are a call's inclusive cost, not the function's own.
awk -v bin="$bin" '
  /^ob=/ { ours = (substr($0, 4) == bin) ; next }
  /^fn=/ {
    fn = ours ? substr($0, 4) : ""
    sub(/\047[0-9]+$/, "", fn)  # callgrind names recursion levels name\047N: one function
    next
  }
  /^(cfn|cfi|cfl|cob)=/ { next }
  /^calls=/ { skip = 1; next }
  /^[0-9+-]/ {
    if (skip) { skip = 0; next }
    if (fn != "" && fn !~ /^0x/) { cost[fn] += $2 }
    next
  }
  END { for (f in cost) if (cost[f] > 0) printf "%d %s\n", cost[f], f }
' "$dump" | sort -k1,1nr -k2 | awk '{print $2}' >"$work/order"
mkdir -p link
{
  # The hashes in the names are the compiler's and the dependency graph's: build.rs warns when
  # another compiler builds, and the test `the_function_order_is_made_for_this_cargo_lock` fails
  # when Cargo.lock is not the one the file was made with.
  echo "# $(rustc -V)"
  echo "# Cargo.lock sha256 $(sha256sum Cargo.lock | cut -d' ' -f1)"
  cat "$work/order"
} >link/symbol-order.txt
echo "link/symbol-order.txt: $(wc -l <link/symbol-order.txt) functions"
