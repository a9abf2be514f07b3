#!/usr/bin/env bash
# mlp_vs_torch.sh — mpirpc's MLP training step next to PyTorch's, alternated
# in one run (the machine is shared and noisy: only same-run ratios count).
#
# Each pair runs `bench_tensor mlp` (784-256-10, batch 64, SGD, 1 BLAS thread)
# and the anchor ../shared/anchors/torch_mlp_step.py (the same step in
# PyTorch 1.13, 1 thread) back to back, alternating which goes first. Prints
# one JSON line per pair and a summary with the median ratio
# mpirpc samples/s / PyTorch samples/s.
#
# Both programs run the same OpenBLAS, so both get the same kernel set: the
# one OpenBLAS picks for the CPU, or OPENBLAS_CORETYPE when it is set in the
# environment, or, when OpenBLAS did not recognise the CPU, the set the apps
# would re-execute themselves with (same_blas_kernels.sh). --default-kernels
# unsets OPENBLAS_CORETYPE for both and keeps OpenBLAS's own pick.
#
# Usage: tests/bench/mlp_vs_torch.sh [--pairs N] [--default-kernels] [--build DIR] [--torch-script PATH]
set -euo pipefail
cd "$(dirname "$0")/../.."
pairs=5 default_kernels=0
build=build
torch_script=../shared/anchors/torch_mlp_step.py
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs="$2"; shift 2 ;;
        --default-kernels) unset OPENBLAS_CORETYPE; default_kernels=1; shift ;;
        --build) build="$2"; shift 2 ;;
        --torch-script) torch_script="$2"; shift 2 ;;
        *) echo "usage: $0 [--pairs N] [--default-kernels] [--build DIR] [--torch-script PATH]" >&2; exit 2 ;;
    esac
done
bench="$build/tests/bench/bench_tensor"
[ -x "$bench" ] || { echo "mlp_vs_torch: $bench not built" >&2; exit 1; }
[ -f "$torch_script" ] || { echo "mlp_vs_torch: $torch_script not found (--torch-script)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "mlp_vs_torch: needs python3-torch" >&2; exit 1; }
[ $default_kernels = 1 ] || { . tests/bench/same_blas_kernels.sh && same_blas_kernels "$build"; }

json_field() { # json_field NAME LINE: a numeric field of a JSON or Python-dict line
    sed -E "s/.*[\"']$1[\"']: *([0-9.]+).*/\1/" <<<"$2"
}
ours_run() { "$bench" mlp | grep '"name":"mlp_step"'; }
torch_run() { /usr/bin/python3 "$torch_script"; }

ratios=()
for ((i = 1; i <= pairs; i++)); do
    if ((i % 2)); then ours=$(ours_run); torch=$(torch_run); else torch=$(torch_run); ours=$(ours_run); fi
    ours_us=$(json_field median_us "$ours")
    torch_us=$(json_field median_us "$torch")
    core=$(sed -E 's/.*"blas_core":"([^"]*)".*/\1/' <<<"$ours")
    ratio=$(awk -v a="$torch_us" -v b="$ours_us" 'BEGIN { printf "%.3f", a / b }')
    ratios+=("$ratio")
    echo "{\"name\":\"mlp_vs_torch_pair\",\"pair\":$i,\"blas_core\":\"$core\",\"mpirpc_us\":$ours_us,\"torch_us\":$torch_us,\"ratio\":$ratio}"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk -v core="$core" '
    { r[NR] = $1 }
    END {
        med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
        printf "{\"name\":\"mlp_vs_torch\",\"blas_core\":\"%s\",\"pairs\":%d,\"median_ratio\":%.3f,\"min_ratio\":%.3f,\"max_ratio\":%.3f,\"target\":1.25}\n", core, NR, med, r[1], r[NR]
    }'
