#!/usr/bin/env bash
# pipeline_vs_torch.sh — the pipeline app (apps/pipeline) next to PyTorch's
# RPC pipeline (the anchor torch_pipeline.py), alternated in one run: the same
# CNN, batch 64, SGD lr 0.05, one thread per process, the median time per
# mini-batch after two warm-up steps (both programs measure it the same way).
#
# For M in {1, 2, 4, 8, 16} micro-batches, S in {1, 2, 3, 4} stages and both schedules of ours
# (gpipe, 1f1b: --schedule), one JSON line:
#   {"name":"pipeline","schedule":…,"stages":S,"micro_batches":M,"ms_per_batch":…,"speedup":…,"ideal":…,
#    "efficiency":…,"torch_ms_per_batch":…,"torch_ratio":…,"stage_ms":[…],"peak_act_bytes":[…],
#    "procs":S+1,"cores":…,"oversubscribed":…,"load_avg":…}
# speedup = ms_per_batch at S = 1 (same M, same schedule) / ms_per_batch; ideal = S·M / (M + S − 1)
# corrected for stage imbalance: M·Σt / ((M + S − 1)·max t) with t the stages' forward+backward times
# per micro-batch that the app measures (its stage_ms), i.e. the sequential time over a pipeline
# bound by its slowest stage; efficiency = speedup / ideal. torch_ratio = PyTorch's ms_per_batch /
# ours (> 1: we are faster); PyTorch's tutorial has the GPipe-like schedule only, so both of our
# schedules are set against the same PyTorch run. The anchor has two stages at most: for S > 2
# torch_ms_per_batch is null. peak_act_bytes: each stage's peak activation memory over the run
# (the app's, bytes saved for backward).
#
# "oversubscribed" (the rule): ours runs S + 1 processes, but the driver only waits (blocked in
# MPI/condition waits, no core), so the processes that compute are the S stages; a configuration
# is oversubscribed when S > cores, cores being the CPUs this script may use (its affinity mask,
# capped by a cgroup CPU quota). On this 2-core machine: S = 3 and S = 4. PyTorch's runs (S <= 2)
# are never oversubscribed by that rule. load_avg: the 1-minute load average when the line is
# printed (the machine is shared: read the times against it).
#
# Usage: BUILD_DIR=build ANCHORS_DIR=<dir> tests/bench/pipeline_vs_torch.sh [--steps N] [--repeat R] [--quick]
#        [--stages "1 2"] [--micro-batches "1 2 4 8 16"] [--schedules "gpipe 1f1b"]
#   BUILD_DIR: relative to the repository root (default build). ANCHORS_DIR: default
#   ../shared/anchors next to the repository root, or, in a git worktree that has none there, next
#   to the main checkout (git rev-parse --git-common-dir).
#   --steps N: mini-batches per run (default 30); --quick: only S = 1, 2 and M = 1, 8.
#   --repeat R (default 3): R rounds for each M, each round running every S (PyTorch, then ours),
#   so the runs of S = 1 and S = 2 and of both programs alternate; each line then gives the
#   medians over the rounds (ms_per_batch, PyTorch's, every stage's stage_ms, from which speedup,
#   ideal and efficiency follow as above) and the rounds themselves: "repeat", "ms_runs",
#   "torch_ms_runs", "efficiency_runs" (round r's S = 1 time over its S time, over its ideal).
#   On a shared machine whose speed drifts by tens of percent between minutes, one run of each
#   compares two different moments; the medians of alternated rounds do not (hence 3 by default:
#   the whole table then takes ~13 minutes on 2 cores; --repeat 1 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${BUILD_DIR:-build}
if [ -n "${ANCHORS_DIR:-}" ]; then
    anchors=$ANCHORS_DIR
else
    anchors=$(cd "$root/.." && pwd)/shared/anchors
    if [ ! -d "$anchors" ] && common=$(git -C "$root" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
        anchors=$(cd "$(dirname "$common")/.." && pwd)/shared/anchors # the main checkout's neighbour
    fi
fi
steps=30 repeat=3 quick=0 stage_list=(1 2 3 4) ms_list=(1 2 4 8 16) sched_list=(gpipe 1f1b)
usage() { echo "usage: BUILD_DIR=... ANCHORS_DIR=... $0 [--steps N] [--repeat R] [--quick] [--stages \"S ...\"] [--micro-batches \"M ...\"] [--schedules \"gpipe 1f1b\"]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) [ $# -ge 2 ] || usage; steps="$2"; shift 2 ;;
        --repeat) [ $# -ge 2 ] && [ "$2" -ge 1 ] 2>/dev/null || usage; repeat="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        --stages) [ $# -ge 2 ] || usage; read -r -a stage_list <<<"$2"; shift 2 ;;
        --micro-batches) [ $# -ge 2 ] || usage; read -r -a ms_list <<<"$2"; shift 2 ;;
        --schedules) [ $# -ge 2 ] || usage; read -r -a sched_list <<<"$2"; shift 2 ;;
        *) usage ;;
    esac
done
[ $quick = 1 ] && ms_list=(1 8) stage_list=(1 2)
for x in "${sched_list[@]}"; do case "$x" in gpipe|1f1b) ;; *) usage ;; esac; done
[ "${stage_list[0]}" = 1 ] || { echo "pipeline_vs_torch: --stages must start with 1 (the speedup's base)" >&2; exit 2; }
app=$build/apps/pipeline/pipeline
torch_script=$anchors/torch_pipeline.py
[ -x "$app" ] || { echo "pipeline_vs_torch: $app not built (BUILD_DIR)" >&2; exit 1; }
[ -f "$torch_script" ] || { echo "pipeline_vs_torch: $torch_script not found (ANCHORS_DIR)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "pipeline_vs_torch: needs python3-torch" >&2; exit 1; }
. tests/bench/same_blas_kernels.sh && same_blas_kernels "$build" # the app's OpenBLAS kernels for PyTorch too
cores=$(/usr/bin/python3 -c '
import os, math
n = len(os.sched_getaffinity(0))
try:
    q, p = open("/sys/fs/cgroup/cpu.max").read().split()
    if q != "max": n = min(n, math.ceil(int(q) / int(p)))
except OSError:
    pass
print(n)')

ours() { # ours S M SCHEDULE -> the app's JSON line
    mpirun --oversubscribe --allow-run-as-root --bind-to none -np $(($1 + 1)) "$app" --stages "$1" \
        --micro-batches "$2" --schedule "$3" --batch 64 --lr 0.05 --max-steps "$steps" --test-limit 64 --profile-reps 5 \
        --log-interval 1000 2>/dev/null | grep '"name":"pipeline"'
}
torch() { # torch S M -> the anchor's JSON line
    /usr/bin/python3 "$torch_script" "$1" "$2" "$steps" 2>/dev/null | grep '"ms_per_batch"'
}

runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
for m in "${ms_list[@]}"; do
    for r in $(seq 1 "$repeat"); do # rounds: in each, every S in order, PyTorch before ours
        for s in "${stage_list[@]}"; do
            if [ "$s" -le 2 ]; then torch "$s" "$m" >"$runs/torch_${s}_$r" || : >"$runs/torch_${s}_$r"; fi
            for sched in "${sched_list[@]}"; do
                ours "$s" "$m" "$sched" >"$runs/ours_${s}_${sched}_$r" ||
                    { echo "pipeline_vs_torch: our run S=$s M=$m $sched failed" >&2; exit 1; }
            done
        done
    done
    for s in "${stage_list[@]}"; do
        for sched in "${sched_list[@]}"; do
            /usr/bin/python3 - "$runs" "$s" "$m" "$sched" "$repeat" "$cores" <<'EOF'
import json, os, statistics, sys
runs, s, m, sched, repeat, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
def line(path):
    try:
        text = open(path).read().strip()
    except OSError:
        return None
    return json.loads(text.splitlines()[-1]) if text else None
rounds = range(1, repeat + 1)
mine = [line(f"{runs}/ours_{s}_{sched}_{r}") for r in rounds]
base = [line(f"{runs}/ours_1_{sched}_{r}") for r in rounds]
theirs = [t for t in (line(f"{runs}/torch_{s}_{r}") for r in rounds) if t] if s <= 2 else []
med = statistics.median
ms = med([x["ms_per_batch"] for x in mine])
t = [round(med([x["stage_ms"][k] for x in mine]), 3) for k in range(s)]  # each stage's median profile
ideal = m * sum(t) / ((m + s - 1) * max(t))
speedup = med([b["ms_per_batch"] for b in base]) / ms
tm = med([x["ms_per_batch"] for x in theirs]) if theirs else None
def round_efficiency(b, x):
    st = x["stage_ms"]
    return b["ms_per_batch"] / x["ms_per_batch"] / (m * sum(st) / ((m + s - 1) * max(st)))
out = {"name": "pipeline", "schedule": sched, "stages": s, "micro_batches": m, "ms_per_batch": round(ms, 3),
       "speedup": round(speedup, 3), "ideal": round(ideal, 3), "efficiency": round(speedup / ideal, 3),
       "torch_ms_per_batch": tm, "torch_ratio": round(tm / ms, 3) if tm else None, "stage_ms": t,
       "split": mine[-1]["split"], "peak_act_bytes": [max(x["peak_act_bytes"][k] for x in mine) for k in range(s)],
       "procs": s + 1, "cores": cores, "oversubscribed": s > cores, "load_avg": round(os.getloadavg()[0], 2)}
if repeat > 1:
    out.update({"repeat": repeat, "ms_runs": [x["ms_per_batch"] for x in mine],
                "torch_ms_runs": [x["ms_per_batch"] for x in theirs] if s <= 2 else None,
                "efficiency_runs": [round(round_efficiency(b, x), 3) for b, x in zip(base, mine)]})
print(json.dumps(out), flush=True)
EOF
        done
    done
    rm -f "$runs"/*
done
