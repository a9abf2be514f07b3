#!/bin/bash
# trace_cost.sh — what tracing and statistics cost (issue #19): bench_rpc --rpc (no-op rpc_sync round
# trip, pipelined rpc_async throughput) run in alternation, round after round, with
#   base   the library of another build (BASE_LIB=<its build dir>, optional: "off" against the code
#          before tracing existed; bench_rpc itself is this build's, loaded against that library),
#   off    this build, nothing enabled,
#   trace  MPIRPC_TRACE set (every event recorded: buffers large enough that none is dropped; the
#          runtime threads' buffers are written through when tracing starts, so a larger buffer
#          costs start-up time and memory, not throughput),
#   stats  MPIRPC_STATS=1.
# Prints each run as a JSON line, then one summary line: per configuration the median over rounds,
# and the ratios to "off" (rtt: higher is slower; throughput: lower is slower): the median of the
# per-round ratios, and the ratio of the best runs (lowest rtt, highest throughput over the rounds:
# on a shared machine other jobs only ever slow a run down, so the best run is the least disturbed).
# With BASE_LIB pointing at a copy of this build's library, base_vs_off shows how far the noise
# alone moves the ratios. The machine may be shared: compare only ratios taken in the same run.
# usage: tests/bench/trace_cost.sh BUILD_DIR [ROUNDS]   (env: BASE_LIB, MPIEXEC_FLAGS)
set -euo pipefail
build=${1:?usage: trace_cost.sh BUILD_DIR [ROUNDS]}
rounds=${2:-5}
bench=$build/tests/bench/bench_rpc
flags=${MPIEXEC_FLAGS:---oversubscribe --bind-to none --mca btl self,vader}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
configs=(off trace stats)
[ -n "${BASE_LIB:-}" ] && configs=(base "${configs[@]}")

run() { # config -> "rtt_us calls_per_s"
  local env=()
  case $1 in
    base) env=(LD_LIBRARY_PATH="$BASE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}") ;;
    trace) env=(MPIRPC_TRACE="$tmp/trace" MPIRPC_TRACE_EVENTS=65536) ;; # --quick --rpc: <= 42k events a thread
    stats) env=(MPIRPC_STATS=1) ;;
  esac
  env "${env[@]}" mpiexec $flags -n 2 "$bench" --quick --rpc 2>/dev/null |
    python3 -c '
import json, sys
d = {}
for line in sys.stdin:
    if line.startswith("{"):
        o = json.loads(line); d[o["name"]] = o
print(d["rpc_sync_noop"]["median_us"], d["rpc_async_pipelined"]["calls_per_s"])'
}

for ((r = 1; r <= rounds; r++)); do
  for c in "${configs[@]}"; do
    read -r rtt tput < <(run "$c")
    echo "{\"name\":\"trace_cost_run\",\"round\":$r,\"config\":\"$c\",\"rpc_sync_noop_median_us\":$rtt,\"pipelined_calls_per_s\":$tput}" |
      tee -a "$tmp/runs.jsonl"
  done
done
python3 - "$tmp/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
out = {"name": "trace_cost", "rounds": max(r["round"] for r in runs)}
med = {}
for c in sorted({r["config"] for r in runs}):
    rs = [r for r in runs if r["config"] == c]
    med[c] = (statistics.median(r["rpc_sync_noop_median_us"] for r in rs),
              statistics.median(r["pipelined_calls_per_s"] for r in rs))
    out[c] = {"rtt_us": round(med[c][0], 2), "calls_per_s": round(med[c][1])}
# Ratios per round (each against the "off" run of the same round), then their median.
for c in med:
    if c == "off":
        continue
    rr, tr = [], []
    for r in runs:
        if r["config"] != c:
            continue
        off = next(o for o in runs if o["config"] == "off" and o["round"] == r["round"])
        rr.append(r["rpc_sync_noop_median_us"] / off["rpc_sync_noop_median_us"])
        tr.append(r["pipelined_calls_per_s"] / off["pipelined_calls_per_s"])
    best = lambda cfg, key, f: f(r[key] for r in runs if r["config"] == cfg)
    out[c + "_vs_off"] = {"rtt_ratio": round(statistics.median(rr), 3), "throughput_ratio": round(statistics.median(tr), 3),
                          "best_rtt_ratio": round(best(c, "rpc_sync_noop_median_us", min) / best("off", "rpc_sync_noop_median_us", min), 3),
                          "best_throughput_ratio": round(best(c, "pipelined_calls_per_s", max) / best("off", "pipelined_calls_per_s", max), 3)}
print(json.dumps(out))
EOF
