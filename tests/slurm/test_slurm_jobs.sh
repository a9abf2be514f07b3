#!/bin/bash
# test_slurm_jobs.sh SOURCE_DIR BUILD_DIR — the batch scripts of apps/slurm/
# submitted to a real one-node Slurm (tests/slurm/local_slurm.sh) with
# `sbatch --wait`; each job's state, exit code and output are checked.
# Exit 77 (skipped) when Slurm cannot run here (see local_slurm.sh).
#
#  1. the generic script runs a program on 2 ranks with `srun --mpi=pmix` and
#     with `mpirun`: COMPLETED, exit 0, the program's results in the output;
#  2. a program that fails makes the job FAILED with its exit code (a job
#     that fails is never reported as success);
#  3. a bad launcher name is refused with exit 2 and a message;
#  4. apps/slurm/param_server.sbatch trains (a few steps, small data): the
#     metrics CSV, its PNG and checkpoints are in the run directory; the same
#     job submitted again with that RUN_DIR (what a requeue does) resumes from
#     the newest checkpoint and continues the metrics from its step.
set -uo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$build/slurm-test
rm -rf "$work"
mkdir -p "$work"

conf=$(bash "$src/tests/slurm/local_slurm.sh" start "$work/slurm")
rc=$?
[ $rc -eq 0 ] || exit $rc
eval "$conf"
trap 'bash "$src/tests/slurm/local_slurm.sh" stop "$work/slurm"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# submit NAME ENV... -- SBATCH_ARGS... : runs the job to its end; sets $job and $out
submit() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  out=$work/$name.out
  job=$(cd "$work" && env "${envs[@]}" timeout 300 sbatch --parsable --wait -J "$name" -o "$out" "$@" 2>"$work/$name.sbatch.err")
  job=${job%%;*}
  [ -n "$job" ] || fail "$name: sbatch gave no job id: $(cat "$work/$name.sbatch.err")"
}

# job_field FIELD: JobState / ExitCode of $job from slurmctld
job_field() { scontrol show job "$job" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

expect_job() { # STATE EXIT
  local state exitc
  state=$(job_field JobState)
  exitc=$(job_field ExitCode)
  [ "$state" = "$1" ] && [ "$exitc" = "$2" ] ||
    fail "job $job: JobState=$state ExitCode=$exitc, expected $1 $2; output:
$(cat "$out" 2>/dev/null)"
}

demo=$build/apps/demo_rpc
[ -x "$demo" ] || fail "$demo not built"

# 1. both launchers
for launcher in srun mpirun; do
  submit "demo_$launcher" MPIRPC_LAUNCHER=$launcher -- -n 2 "$src/apps/slurm/mpirpc.sbatch" "$demo"
  expect_job COMPLETED 0:0
  grep -q "2 ranks, 1 core(s) each" "$out" || fail "$launcher: no job banner in $out"
  grep -q "graceful shutdown done on every rank" "$out" || fail "$launcher: demo did not finish: $(cat "$out")"
  grep -q "worker1 add(3, 4) = 7" "$out" || fail "$launcher: no rpc_sync result in $out"
  echo "ok: generic script with $launcher (job $job)"
done

# 2. a failing program fails the job
submit fails -- -n 2 "$src/apps/slurm/mpirpc.sbatch" /bin/sh -c 'exit 3'
state=$(job_field JobState)
[ "$state" = FAILED ] || fail "a program exiting 3 left the job $state"
echo "ok: a failing program makes the job FAILED ($(job_field ExitCode))"

# 3. a bad launcher
submit badlauncher MPIRPC_LAUNCHER=ssh -- -n 1 "$src/apps/slurm/mpirpc.sbatch" /bin/true
expect_job FAILED 2:0
grep -q "MPIRPC_LAUNCHER must be srun or mpirun" "$out" || fail "no message for a bad launcher: $(cat "$out")"
echo "ok: a bad launcher is refused"
# 4. an app's batch script: outputs in the run directory, resumed when run again
ps=$build/apps/param_server/param_server
[ -x "$ps" ] || fail "$ps not built"
run=$work/ps_run
common=(--train-limit 2560 --batch 32 --metrics-every 5 --log-interval 1) # 40 steps per epoch
submit ps_first RUN_DIR="$run" CHECKPOINT_EVERY=10 MPIRPC_HOME="$src" MPIRPC_BUILD="$build" -- \
  -n 3 --overcommit "$src/apps/slurm/param_server.sbatch" "${common[@]}" --max-steps 20 --verbose
expect_job COMPLETED 0:0
# --verbose: one line per rank with its worker name, cores and Slurm task (issue #18)
for r in 0 1 2; do
  grep -Eq "^rank $r: worker (ps0|trainer0|trainer1), host [^,]+, pid [0-9]+, cores [0-9,-]+ \([0-9]+\), slurm job [0-9]+ task $r " "$out" ||
    fail "no --verbose placement line for rank $r: $(head -5 "$out")"
done
[ -s "$run/metrics.csv" ] && [ -s "$run/metrics.png" ] || fail "no metrics CSV/PNG in $run: $(ls "$run")"
compgen -G "$run/checkpoints/ckpt-*" >/dev/null || fail "no checkpoint in $run/checkpoints"
grep -q "resuming" "$out" && fail "the first run says it resumes: $(head -3 "$out")"
last=$(tail -1 "$run/metrics.csv" | cut -d, -f1)
[ "$last" = 20 ] || fail "the first run's last metrics step is '$last', expected 20"
submit ps_again RUN_DIR="$run" CHECKPOINT_EVERY=10 MPIRPC_HOME="$src" MPIRPC_BUILD="$build" -- \
  -n 3 --overcommit "$src/apps/slurm/param_server.sbatch" "${common[@]}" --max-steps 40
expect_job COMPLETED 0:0
grep -q "resuming from its newest checkpoint" "$out" || fail "the second run did not resume: $(head -5 "$out")"
last=$(tail -1 "$run/metrics.csv" | cut -d, -f1)
[ "$last" = 40 ] || fail "the resumed run's last metrics step is '$last', expected 40"
awk -F, 'NR > 1 { if ($1 + 0 < prev) bad = 1; prev = $1 + 0 } END { exit bad }' "$run/metrics.csv" ||
  fail "the resumed metrics go back in steps: $(cat "$run/metrics.csv")"
echo "ok: param_server.sbatch wrote metrics, plot and checkpoints, and a second submission resumed at step 20"
echo "all Slurm job checks passed"
