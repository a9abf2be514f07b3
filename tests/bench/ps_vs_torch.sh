#!/usr/bin/env bash
# ps_vs_torch.sh — the parameter-server apps (apps/param_server, apps/batch_ps)
# next to PyTorch's (the anchor torch_ps_fmnist.py), alternated in one run:
# the same model (MLP 784-256-10), batch 64, SGD lr 0.05, 1 epoch, the data
# split across the trainers the same way.
#
# One JSON line per configuration:
#   {"name":"ps_app","mode":"dist"|"batch","trainers":T,"ps":K,"samples_per_s":…,"test_acc":…,
#    "torch_samples_per_s":…,"torch_test_acc":…,"ratio":…,"procs":…,"cores":…,"oversubscribed":…}
# The issue's two configurations come first (dist mode, 1 trainer; batch mode,
# 2 trainers), then 1, 2 and 4 trainers with 1 and 2 PS shards in both modes.
# PyTorch's anchor has one PS: the 2-shard lines repeat the 1-PS PyTorch
# figure of the same mode and trainers (torch_ps 1). Each PyTorch
# configuration runs once; with --pairs N each of ours and PyTorch's runs N
# times alternately and the medians are printed. "oversubscribed" is true when
# the job has more processes than the machine has cores.
#
# Usage: BUILD_DIR=build ANCHORS_DIR=../shared/anchors tests/bench/ps_vs_torch.sh [--quick] [--pairs N]
#   --quick: only the issue's two configurations.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
anchors=${ANCHORS_DIR:-../shared/anchors}
pairs=1 quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1; shift ;;
        --pairs) pairs="$2"; shift 2 ;;
        *) echo "usage: BUILD_DIR=... ANCHORS_DIR=... $0 [--quick] [--pairs N]" >&2; exit 2 ;;
    esac
done
torch_script=$anchors/torch_ps_fmnist.py
for app in param_server batch_ps; do
    [ -x "$build/apps/$app/$app" ] || { echo "ps_vs_torch: $build/apps/$app/$app not built (BUILD_DIR)" >&2; exit 1; }
done
[ -f "$torch_script" ] || { echo "ps_vs_torch: $torch_script not found (ANCHORS_DIR)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "ps_vs_torch: needs python3-torch" >&2; exit 1; }
. tests/bench/same_blas_kernels.sh && same_blas_kernels "$build" # the apps' OpenBLAS kernels for PyTorch too
cores=$(nproc)

field() { # field NAME LINE: a numeric field of a JSON or Python-dict line
    sed -E "s/.*[\"']$1[\"']: *([0-9.]+).*/\1/" <<<"$2"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

ours() { # ours MODE TRAINERS PS -> the app's JSON line
    local app=param_server
    [ "$1" = batch ] && app=batch_ps
    mpirun --oversubscribe --allow-run-as-root --bind-to none -np $(($2 + $3)) "$build/apps/$app/$app" \
        --epochs 1 --batch 64 --lr 0.05 --optimizer sgd --ps "$3" --log-interval 1000 2>/dev/null | grep '"name":"ps_app"'
}
torch() { # torch MODE TRAINERS -> the anchor's dict line
    /usr/bin/python3 "$torch_script" "$1" "$2" 1 2>/dev/null | grep "train_samples_per_s"
}

declare -A torch_rate torch_acc
configs=("dist 1 1" "batch 2 1")
[ $quick = 1 ] || configs+=("dist 2 1" "dist 4 1" "dist 1 2" "dist 2 2" "dist 4 2"
                            "batch 1 1" "batch 4 1" "batch 1 2" "batch 2 2" "batch 4 2")
for c in "${configs[@]}"; do
    read -r mode trainers ps <<<"$c"
    rates=() accs=() trates=() taccs=()
    for ((i = 0; i < pairs; i++)); do # PyTorch (one PS) only for ps 1; odd pairs start with it
        if [ "$ps" = 1 ] && [ $((i % 2)) = 1 ]; then
            t=$(torch "$mode" "$trainers") && trates+=("$(field train_samples_per_s "$t")") taccs+=("$(field test_acc "$t")")
        fi
        o=$(ours "$mode" "$trainers" "$ps") && rates+=("$(field samples_per_s "$o")") accs+=("$(field test_acc "$o")")
        if [ "$ps" = 1 ] && [ $((i % 2)) = 0 ]; then
            t=$(torch "$mode" "$trainers") && trates+=("$(field train_samples_per_s "$t")") taccs+=("$(field test_acc "$t")")
        fi
    done
    if [ ${#trates[@]} -gt 0 ]; then
        torch_rate[$mode$trainers]=$(printf '%s\n' "${trates[@]}" | median)
        torch_acc[$mode$trainers]=$(printf '%s\n' "${taccs[@]}" | median)
    fi
    rate=$( [ ${#rates[@]} -gt 0 ] && printf '%s\n' "${rates[@]}" | median || echo null)
    acc=$( [ ${#accs[@]} -gt 0 ] && printf '%s\n' "${accs[@]}" | median || echo null)
    trate=${torch_rate[$mode$trainers]:-null} tacc=${torch_acc[$mode$trainers]:-null}
    ratio=null
    [ "$rate" != null ] && [ "$trate" != null ] && ratio=$(awk -v a="$rate" -v b="$trate" 'BEGIN { printf "%.2f", a / b }')
    procs=$((trainers + ps))
    over=false
    [ $procs -gt "$cores" ] && over=true
    printf '{"name":"ps_app","mode":"%s","trainers":%d,"ps":%d,"samples_per_s":%s,"test_acc":%s,"torch_samples_per_s":%s,"torch_test_acc":%s,"torch_ps":1,"ratio":%s,"procs":%d,"cores":%d,"oversubscribed":%s}\n' \
        "$mode" "$trainers" "$ps" "$rate" "$acc" "$trate" "$tacc" "$ratio" "$procs" "$cores" "$over"
done
