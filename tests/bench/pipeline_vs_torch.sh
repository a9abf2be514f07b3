#!/usr/bin/env bash
# pipeline_vs_torch.sh — the pipeline app (apps/pipeline) next to PyTorch's
# RPC pipeline (the anchor torch_pipeline.py), alternated in one run: the same
# CNN, batch 64, SGD lr 0.05, one thread per process, the median time per
# mini-batch after two warm-up steps (both programs measure it the same way).
#
# For M in {1, 2, 4, 8, 16} micro-batches and S in {1, 2, 3, 4} stages (ours
# runs S + 1 processes, the driver mostly waiting; "oversubscribed" when the
# stages outnumber the cores: S = 3 and 4 on a 2-core machine), one JSON line:
#   {"name":"pipeline","stages":S,"micro_batches":M,"ms_per_batch":…,"speedup":…,"ideal":…,
#    "efficiency":…,"torch_ms_per_batch":…,"torch_ratio":…,"stage_ms":[…],"oversubscribed":…}
# speedup = ms_per_batch at S = 1 (same M) / ms_per_batch; ideal = S·M / (M + S − 1) corrected
# for stage imbalance: M·Σt / ((M + S − 1)·max t) with t the stages' forward+backward times
# per micro-batch that the app measures (its stage_ms), i.e. the sequential time over a
# pipeline bound by its slowest stage; efficiency = speedup / ideal. torch_ratio = PyTorch's
# ms_per_batch / ours (> 1: we are faster). The anchor has two stages at most: for S > 2
# torch_ms_per_batch is null.
#
# Usage: BUILD_DIR=build ANCHORS_DIR=../shared/anchors tests/bench/pipeline_vs_torch.sh [--steps N] [--quick]
#   --steps N: mini-batches per run (default 30); --quick: only S = 1, 2 and M = 1, 8.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
anchors=${ANCHORS_DIR:-../shared/anchors}
steps=30 quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "usage: BUILD_DIR=... ANCHORS_DIR=... $0 [--steps N] [--quick]" >&2; exit 2 ;;
    esac
done
app=$build/apps/pipeline/pipeline
torch_script=$anchors/torch_pipeline.py
[ -x "$app" ] || { echo "pipeline_vs_torch: $app not built (BUILD_DIR)" >&2; exit 1; }
[ -f "$torch_script" ] || { echo "pipeline_vs_torch: $torch_script not found (ANCHORS_DIR)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "pipeline_vs_torch: needs python3-torch" >&2; exit 1; }
cores=$(nproc)

ours() { # ours S M -> the app's JSON line
    mpirun --oversubscribe --allow-run-as-root --bind-to none -np $(($1 + 1)) "$app" --stages "$1" \
        --micro-batches "$2" --batch 64 --lr 0.05 --max-steps "$steps" --test-limit 64 --profile-reps 5 \
        --log-interval 1000 2>/dev/null | grep '"name":"pipeline"'
}
torch() { # torch S M -> the anchor's JSON line
    /usr/bin/python3 "$torch_script" "$1" "$2" "$steps" 2>/dev/null | grep '"ms_per_batch"'
}

ms_list=(1 2 4 8 16) stage_list=(1 2 3 4)
[ $quick = 1 ] && ms_list=(1 8) stage_list=(1 2)
for m in "${ms_list[@]}"; do
    base=""
    for s in "${stage_list[@]}"; do
        mine=$(ours "$s" "$m") || { echo "pipeline_vs_torch: our run S=$s M=$m failed" >&2; exit 1; }
        theirs=null
        if [ "$s" -le 2 ]; then theirs=$(torch "$s" "$m") || theirs=null; fi
        [ -n "$base" ] || base=$mine
        /usr/bin/python3 - "$mine" "$base" "$theirs" "$s" "$m" "$cores" <<'EOF'
import json, sys
mine, base = json.loads(sys.argv[1]), json.loads(sys.argv[2])
theirs = None if sys.argv[3] in ("null", "") else json.loads(sys.argv[3])
s, m, cores = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
t = mine["stage_ms"]
ideal = m * sum(t) / ((m + s - 1) * max(t))
speedup = base["ms_per_batch"] / mine["ms_per_batch"]
tm = theirs["ms_per_batch"] if theirs else None
print(json.dumps({"name": "pipeline", "stages": s, "micro_batches": m, "ms_per_batch": mine["ms_per_batch"],
                  "speedup": round(speedup, 3), "ideal": round(ideal, 3), "efficiency": round(speedup / ideal, 3),
                  "torch_ms_per_batch": tm, "torch_ratio": round(tm / mine["ms_per_batch"], 3) if tm else None,
                  "stage_ms": t, "split": mine["split"], "procs": s + 1, "cores": cores,
                  "oversubscribed": s > cores}), flush=True)
EOF
    done
done
