#!/bin/bash
# app_job.sh PROGRAM [ARGS...] — the body of the apps' batch scripts (one
# copy for all of them): runs an app of apps/ (one built on apps/common) inside
# a Slurm allocation with its outputs in one run directory, and resumes from
# its newest checkpoint when the job runs again (requeued, e.g. after a node
# failure or preemption with `#SBATCH --requeue`, or resubmitted with the same
# RUN_DIR).
#
#   RUN_DIR           default $SLURM_SUBMIT_DIR/runs/$SLURM_JOB_NAME-$SLURM_JOB_ID
#                     (a requeued job keeps its id, so it finds its checkpoints)
#   CHECKPOINT_EVERY  steps between checkpoints (default 200)
#   MPIRPC_LAUNCHER   srun (default: srun --mpi=pmix) or mpirun
# Writes RUN_DIR/metrics.csv, RUN_DIR/metrics.png, RUN_DIR/checkpoints/.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: app_job.sh PROGRAM [ARGS...] (from a batch script)" >&2
  exit 2
fi
program=$1
shift
[ -x "$program" ] || { echo "app_job.sh: $program is not an executable (build the apps first: cmake --build build)" >&2; exit 2; }
run_dir=${RUN_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/runs/${SLURM_JOB_NAME:-$(basename "$program")}-${SLURM_JOB_ID:-local}}
mkdir -p "$run_dir/checkpoints"
resume=()
if compgen -G "$run_dir/checkpoints/ckpt-*" >/dev/null; then resume=(--resume); fi
threads=${SLURM_CPUS_PER_TASK:-1}
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
echo "$(basename "$program") job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
     "${SLURM_NTASKS:-?} ranks, $threads core(s) each; outputs in $run_dir${resume:+; resuming from its newest checkpoint}"
args=(--metrics "$run_dir/metrics.csv" --checkpoint-dir "$run_dir/checkpoints"
      --checkpoint-every "${CHECKPOINT_EVERY:-200}" "${resume[@]}" "$@")
case "${MPIRPC_LAUNCHER:-srun}" in
  srun) exec srun --mpi=pmix "$program" "${args[@]}" ;;
  mpirun) exec mpirun "$program" "${args[@]}" ;;
  *) echo "MPIRPC_LAUNCHER must be srun or mpirun, not '$MPIRPC_LAUNCHER'" >&2; exit 2 ;;
esac
