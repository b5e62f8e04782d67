#!/usr/bin/env bash
# Issue 13's measurement as the issue made it: `wrk` (one thread, keep-alive connections) against
# two `warrant` binaries side by side, in interleaved rounds, with the server's CPU per call read
# from /proc. The servers, their contracts, policies and the loopback upstream are the load
# bench's own (benches/load.rs, held after its warm-up by WARRANT_LOAD_PAUSE); the requests are
# the bench's (wrk/case.lua). Prints every run (case, connections, server — 0 is BINARY, 1 the
# baseline —, calls/s, p50, p99 and max in ms, errors — transport errors, non-2xx answers and
# answers that are not a committed call (wrk/case.lua) —, server CPU µs per call), then the medians
# and this binary's ratios to the baseline. Ratios of two binaries measured in the same rounds
# travel between hosts; absolute figures do not (docs/benchmarks.md).
#
# Usage: crates/warrant-server/benches/wrk.sh BINARY BASELINE_BINARY
# Environment: WRK_ROUNDS (default 3), WRK_SECS (per run, default 10), WRK_CONNECTIONS (default
# "16 1"), WRK_CASES (default "mcp_read mcp_write http_read http_write"). Needs wrk and curl.
set -euo pipefail
bin=$(realpath "$1") baseline=$(realpath "$2")
rounds=${WRK_ROUNDS:-3} secs=${WRK_SECS:-10}
levels=${WRK_CONNECTIONS:-16 1}
cases=${WRK_CASES:-mcp_read mcp_write http_read http_write}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
work=$(mktemp -d)
log="$work/bench.log"
WARRANT_BIN=$bin WARRANT_BASELINE_BIN=$baseline WARRANT_LOAD_PAUSE=100000 WARRANT_LOAD_LEDGER_ROWS=0 \
  cargo bench -q -p warrant-server --bench load >"$work/bench.out" 2>"$log" &
bench=$!
trap 'kill $bench 2>/dev/null; pkill -P $bench 2>/dev/null; rm -rf "$work"' EXIT
until grep -q "idle after warm-up; pausing" "$log"; do
  kill -0 "$bench" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 1
done
field() { grep -m1 "$1" "$log" | sed "s/$2/\1/"; }
pid[0]=$(field "^server pid" '.*server pid \([0-9]*\) .*')
addr[0]=$(field "^server pid" '.* on \([^ ]*\) .*')
key[0]=$(field "^agent key" '^agent key \([^ ]*\) .*')
upstream=$(field "^agent key" '.*upstream \([^ ]*\)$')
pid[1]=$(field "^baseline server pid" '.*server pid \([0-9]*\) .*')
addr[1]=$(field "^baseline server pid" '.* on \([^ ]*\) .*')
key[1]=$(field "^baseline agent key" '^baseline agent key \(.*\)$')
floor=$(field "^floor server pid" '.*server pid \([0-9]*\) .*')
load=$(ps -o ppid= -p "${pid[0]}" | tr -d ' ')
# SIGTERM to the bench would leave its servers running: stop them first, then the bench.
trap 'kill "${pid[0]}" "${pid[1]}" "$floor" 2>/dev/null; kill "$load" "$bench" 2>/dev/null; rm -rf "$work"' EXIT
protocol=2025-06-18
# Each server's MCP session (a stateless server gives none): initialize, then initialized.
for i in 0 1; do
  session[$i]=$(curl -s -D - -o /dev/null "http://${addr[$i]}/mcp" -H "Authorization: Bearer ${key[$i]}" \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -d "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"$protocol\",\"capabilities\":{},\"clientInfo\":{\"name\":\"wrk\",\"version\":\"1\"}}}" |
    tr -d '\r' | awk -F': ' 'tolower($1) == "mcp-session-id" {print $2}')
  curl -s -o /dev/null "http://${addr[$i]}/mcp" -H "Authorization: Bearer ${key[$i]}" \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H "MCP-Protocol-Version: $protocol" ${session[$i]:+-H "Mcp-Session-Id: ${session[$i]}"} \
    -d '{"jsonrpc":"2.0","method":"notifications/initialized"}'
done
ticks=$(getconf CLK_TCK)
cpu() { awk -v t="$ticks" '{sub(/.*\) /, ""); split($0, f, " "); printf "%d\n", (f[12] + f[13]) * 1000000 / t}' "/proc/$1/stat"; }
# One run: prints "case conns server calls/s p50 p99 max errors cpu_us_per_call".
run() {
  local case=$1 conns=$2 i=$3 target before after out
  if [ "$i" = u ]; then target="http://$upstream"; else target="http://${addr[$i]}"; before=$(cpu "${pid[$i]}"); fi
  out=$(CASE=$case KEY=${key[${i/u/0}]} SESSION=${session[${i/u/0}]:-} PROTOCOL=$protocol \
    wrk -t1 -c"$conns" -d"${secs}s" -s "$here/wrk/case.lua" "$target" | grep '^WRK')
  local calls us p50 p99 max errors
  read -r calls us p50 p99 max errors < <(echo "$out" | sed 's/[a-z0-9]*=//g; s/^WRK //')
  local per_call=-
  if [ "$i" != u ]; then after=$(cpu "${pid[$i]}"); per_call=$(( (after - before) / (calls > 0 ? calls : 1) )); fi
  echo "$case $conns ${i/u/upstream} $(( calls * 1000000 / us )) $p50 $p99 $max $errors $per_call"
}
results="$work/results"
for round in $(seq 1 "$rounds"); do
  for conns in $levels; do
    # One line a run, kept for the medians and printed as it comes.
    line=$(run upstream "$conns" u) && echo "$line" >>"$results" && echo "round $round: $line"
    # The cases in the opposite order every other round (a case runs on the store the case
    # before it left), and the servers too.
    order_cases=$cases
    if [ $(( round % 2 )) = 0 ]; then order_cases=$(echo $cases | tr ' ' '\n' | tac | tr '\n' ' '); fi
    for case in $order_cases; do
      # Alternate which server goes first.
      if [ $(( round % 2 )) = 1 ]; then order="0 1"; else order="1 0"; fi
      for i in $order; do
        line=$(run "$case" "$conns" "$i") && echo "$line" >>"$results" && echo "round $round: $line"
      done
    done
  done
done
echo
echo "Medians of $rounds round(s), ${secs} s a run (server 0: $bin, 1: $baseline):"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    case, conns, server, *v = line.split()
    rows.setdefault((case, int(conns), server), []).append(v)
def med(key, i):
    vals = [float(v[i]) for v in rows[key] if v[i] != "-"]
    return statistics.median(vals) if vals else float("nan")
print("| conns | case | server | calls/s | p50 ms | p99 ms | errors | CPU/call µs |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(rows, key=lambda k: (-k[1], k[0], k[2])):
    errors = sum(int(v[4]) for v in rows[key])
    print(f"| {key[1]} | {key[0]} | {key[2]} | {med(key,0):.0f} | {med(key,1):.2f} | {med(key,2):.2f} | {errors} | {med(key,5):.0f} |")
print()
print("| conns | case | calls/s ratio | p50 ratio | p99 ratio | CPU/call ratio |")
print("|---|---|---|---|---|---|")
for (case, conns, server) in sorted(rows, key=lambda k: (-k[1], k[0])):
    if server != "0" or (case, conns, "1") not in rows:
        continue
    a, b = (case, conns, "0"), (case, conns, "1")
    print(f"| {conns} | {case} | {med(a,0)/med(b,0):.2f}× | {med(a,1)/med(b,1):.2f}× | {med(a,2)/med(b,2):.2f}× | {med(a,5)/med(b,5):.2f}× |")
PY
