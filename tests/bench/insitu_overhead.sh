#!/usr/bin/env bash
# insitu_overhead.sh — what in-situ streaming costs the simulation of
# apps/insitu_heat: the same run with streaming on and off (--no-stream:
# mpirpc never initialized), alternated in one script, --pairs times.
#
# Prints one JSON line per run, then one per mode with the medians:
#   {"name":"insitu_heat","stream":false,"steps_per_s":…,"bytes_per_s":0,"runs":N,...}
#   {"name":"insitu_heat","stream":true,"steps_per_s":…,"bytes_per_s":…,"slowdown":…,"runs":N,...}
# slowdown = median over the pairs of (off steps/s / on steps/s) - 1, so 0.05 is 5%
# slower with streaming; each ratio compares two runs made one after the other
# ("slowdowns": every pair's). cpu_slowdown: the same median for the CPU time of
# the simulation's thread (sim_cpu_s: what streaming costs the time loop itself,
# the float32 copies and sends, less sensitive to other jobs on the machine than
# the wall-clock rate). wait_s: the median time the simulation waited for a full
# window inside its time loop (counted in its steps/s); drain_s: the median wait
# after the loop for the last replies (not counted: the host can overlap it with
# its own end of run).
# "procs" and "cores" say whether the job oversubscribed the machine (then the
# learner's training takes CPU from the simulation and the figure says so).
#
# Usage: BUILD_DIR=build tests/bench/insitu_overhead.sh [--pairs N] [--np N] [--bind core|none] [-- app options...]
#   default: 3 pairs, 3 ranks (2 simulation, 1 learner), --bind none, the app's defaults (512 x 512, 400 steps, K = 20).
#   Without oversubscription on 2 cores: --np 2 --bind core -- --progress-pu 1 --every 100
#   (1 simulation rank on core 0, the learner on core 1, the simulation's progress thread on PU 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
app=$build/apps/insitu_heat/insitu_heat
pairs=3 np=3 bind=none
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs="$2"; shift 2 ;;
        --np) np="$2"; shift 2 ;;
        --bind) bind="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "usage: BUILD_DIR=... $0 [--pairs N] [--np N] [--bind core|none] [-- app options...]" >&2; exit 2 ;;
    esac
done
[ -x "$app" ] || { echo "insitu_overhead: $app not built (BUILD_DIR)" >&2; exit 1; }
cores=$(nproc)

field() { sed -E "s/.*\"$1\":\"?([-0-9.e+a-f]+).*/\1/" <<<"$2"; } # a number, or a hex string
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
run() { # run [--no-stream] -> the app's JSON line
    mpirun --oversubscribe --allow-run-as-root --bind-to "$bind" -np "$np" "$app" --log-interval 1000 "$@" 2>/dev/null |
        grep '"name":"insitu_heat"'
}

off_rates=() on_rates=() on_bytes=() ratios=() cpu_ratios=() drains=() waits=()
for ((i = 0; i < pairs; i++)); do
    off=$(run --no-stream "$@")
    on=$(run "$@")
    echo "$off"
    echo "$on"
    [ "$(field checksum "$off")" = "$(field checksum "$on")" ] || { echo "insitu_overhead: checksums differ" >&2; exit 1; }
    off_rates+=("$(field steps_per_s "$off")")
    on_rates+=("$(field steps_per_s "$on")")
    on_bytes+=("$(field bytes_per_s "$on")")
    drains+=("$(field drain_s "$on")")
    waits+=("$(field wait_s "$on")")
    ratios+=("$(awk -v a="${off_rates[-1]}" -v b="${on_rates[-1]}" 'BEGIN { print a / b - 1 }')")
    cpu_ratios+=("$(awk -v a="$(field sim_cpu_s "$off")" -v b="$(field sim_cpu_s "$on")" 'BEGIN { print b / a - 1 }')")
done
med() { printf '%s\n' "$@" | median; }
common="\"runs\":$pairs,\"procs\":$np,\"cores\":$cores,\"bind\":\"$bind\",\"load\":$(cut -d' ' -f1 /proc/loadavg),\"oversubscribed\":$([ "$np" -gt "$cores" ] && echo true || echo false)"
every=$(field every "$on")
echo "{\"name\":\"insitu_heat\",\"stream\":false,\"every\":$every,\"steps_per_s\":$(med "${off_rates[@]}"),\"bytes_per_s\":0,$common}"
echo "{\"name\":\"insitu_heat\",\"stream\":true,\"every\":$every,\"steps_per_s\":$(med "${on_rates[@]}"),\"bytes_per_s\":$(med "${on_bytes[@]}"),\"slowdown\":$(med "${ratios[@]}"),\"cpu_slowdown\":$(med "${cpu_ratios[@]}"),\"slowdowns\":[$(IFS=,; echo "${ratios[*]}")],\"wait_s\":$(med "${waits[@]}"),\"drain_s\":$(med "${drains[@]}"),$common}"
