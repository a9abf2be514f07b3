#!/usr/bin/env bash
# param_echo_vs_torch.sh — echoes of tensor lists through mpirpc, raw MPI and
# PyTorch's RPC, alternated in one run (the machine is shared and noisy: only
# same-run ratios count).
#
# Each pair runs `mpirun -np 2 bench_rpc --lists` (tensor_list_echo 256 x 1 KiB
# and 4096 x 256 B, param_list_echo of ResNet-18's 62 parameter tensors, each
# next to raw MPI echoing the same bytes) and tests/bench/torch_param_echo.py
# (PyTorch 1.13 rpc_sync echo of the same lists, TensorPipe) back to back,
# alternating which goes first, and prints both programs' JSON lines plus one
# line per list with torch_us / mpirpc_us.
#
# Usage: tests/bench/param_echo_vs_torch.sh [--pairs N] [--quick] [--build DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
pairs=3
build=build
quick=
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs="$2"; shift 2 ;;
        --quick) quick=--quick; shift ;;
        --build) build="$2"; shift 2 ;;
        *) echo "usage: $0 [--pairs N] [--quick] [--build DIR]" >&2; exit 2 ;;
    esac
done
bench="$build/tests/bench/bench_rpc"
[ -x "$bench" ] || { echo "param_echo_vs_torch: $bench not built" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "param_echo_vs_torch: needs python3-torch" >&2; exit 1; }

json_field() { sed -E "s/.*\"$1\": *([0-9.]+).*/\1/" <<<"$2"; }
ours_run() { mpirun --oversubscribe --allow-run-as-root -np 2 "$bench" --lists $quick; }
torch_run() { /usr/bin/python3 tests/bench/torch_param_echo.py $quick 2>/dev/null; }

for ((i = 1; i <= pairs; i++)); do
    if ((i % 2)); then ours=$(ours_run); torch=$(torch_run); else torch=$(torch_run); ours=$(ours_run); fi
    echo "$ours"
    echo "$torch"
    for n in 1 2 3; do
        o=$(sed -n "${n}p" <<<"$ours")
        t=$(sed -n "${n}p" <<<"$torch")
        what=$(sed -E 's/.*"name":"([a-z_]+)","(tensors|model)":"?([a-z0-9]+)"?.*/\1 \3/' <<<"$o")
        awk -v w="$what" -v p="$i" -v a="$(json_field median_us "$t")" -v b="$(json_field median_us "$o")" \
            -v m="$(json_field mpi_echo_same_bytes_us "$o")" 'BEGIN {
            split(w, f, " ")
            printf "{\"name\":\"%s_vs_torch\",\"pair\":%d,\"which\":\"%s\",\"mpirpc_us\":%s,\"mpi_us\":%s,\"torch_us\":%s,\"torch_over_mpirpc\":%.2f,\"mpirpc_over_mpi\":%.2f}\n",
                f[1], p, f[2], b, m, a, a / b, b / m }'
    done
done
