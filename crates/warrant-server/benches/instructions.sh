#!/usr/bin/env bash
# Instructions per request of a `warrant` binary under the load bench, counted by callgrind.
#
# On a shared VM the load bench's CPU per call moves ±5–10% from run to run, which hides any
# change smaller than that. Callgrind counts the instructions the server executes (user space
# only; no kernel time, no waiting), which repeats to about 1–2% for the same binary and load.
# This runs the load bench's case against the server under callgrind, zeroes the counts once
# the measured run is under way, dumps them 12 s later, and divides by the requests the server
# counted in between (`warrant_http_requests_total` on /metrics). Counted per thread: the
# request threads and the SQLite writer make the figure; the other threads (checkpointer,
# readers, timers) are shown apart, since their work per request depends on how many requests
# the window held (under callgrind a server does only ~50–150 calls/s).
#
# Usage: crates/warrant-server/benches/instructions.sh CASE CONNECTIONS BINARY...
#   e.g. crates/warrant-server/benches/instructions.sh mcp_read 4 /tmp/before /tmp/after
# WARRANT_CALLGRIND_KEEP=DIR keeps each thread's dump (DIR/NAME.CASE.CONNECTIONS.PART-THREAD.callgrind)
# for `callgrind_annotate --inclusive=yes`. Needs valgrind and curl. Group commit batches differ
# from a native run's: compare binaries at the same CONNECTIONS, not with native figures.
set -euo pipefail
case_name=$1 connections=$2
shift 2
cd "$(dirname "$0")/../../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
secs=20
for bin in "$@"; do
  name=$(basename "$bin")
  out="$work/$name.callgrind"
  wrapper="$work/$name"
  printf '#!/bin/sh\nexec valgrind --tool=callgrind --separate-threads=yes --compress-strings=no --callgrind-out-file=%s %s "$@"\n' "$out" "$(realpath "$bin")" >"$wrapper"
  chmod +x "$wrapper"
  log="$work/$name.log"
  WARRANT_BIN=$wrapper WARRANT_LOAD_LEDGER_ROWS=0 WARRANT_LOAD_ROUNDS=1 WARRANT_LOAD_SECS=$secs \
    WARRANT_LOAD_CASES=$case_name WARRANT_LOAD_CONNECTIONS=$connections \
    cargo bench -q -p warrant-server --bench load >"$log" 2>&1 &
  bench=$!
  # The case's own run (before it at each level: the upstream alone, then the floor).
  until grep -q "connections: $case_name, $secs s" "$log"; do
    kill -0 "$bench" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 1
  done
  sleep 3
  pid=$(grep -m1 "server pid" "$log" | sed 's/.*server pid \([0-9]*\) .*/\1/')
  addr=$(grep -m1 "server pid" "$log" | sed 's/.* on \([^ ]*\) .*/\1/')
  requests() { curl -s "http://$addr/metrics" | awk '/^warrant_http_requests_total/ {s += $2} END {print s}'; }
  before=$(requests)
  callgrind_control -z "$pid" >/dev/null
  sleep 12
  callgrind_control -d "$pid" >/dev/null
  after=$(requests)
  wait "$bench"
  n=$((after - before))
  # One dump per thread: the request threads (tokio's workers, or the thread of a
  # current-thread runtime), the SQLite writer, and the
  # rest (the checkpointer, readers, timers), whose work per request depends on how many
  # requests the window held rather than on the request itself.
  request=0 writer=0 other=0
  for dump in "$out".1-*; do
    instructions=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    if grep -qE "multi_thread::worker::run|current_thread::Context::run_task" "$dump"; then
      request=$((request + instructions))
    elif grep -q "WriteJob>::run" "$dump"; then
      writer=$((writer + instructions))
    else
      other=$((other + instructions))
    fi
    if [ -n "${WARRANT_CALLGRIND_KEEP:-}" ]; then
      mkdir -p "$WARRANT_CALLGRIND_KEEP"
      cp "$dump" "$WARRANT_CALLGRIND_KEEP/$name.$case_name.$connections.${dump##*.}.callgrind"
    fi
  done
  awk -v r="$request" -v w="$writer" -v o="$other" -v n="$n" -v b="$bin" 'BEGIN {
    printf "%s: %d requests counted; instructions per request: %.0f (request threads %.0f + writer %.0f), other threads %.0f\n",
      b, n, (r + w) / n, r / n, w / n, o / n
  }'
done
