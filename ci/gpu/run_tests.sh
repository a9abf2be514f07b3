#!/bin/bash
# run_tests.sh — the GPU tests of a CUDA build on a bare GPU machine (a
# throwaway one: it writes Open MPI's Debian tree into /usr and /etc, links
# /work/main to this checkout and /root/.pyenv/shims/python3 to python3, where
# the build's CTest files expect them). Run from the repository root with the
# bundle of ci/gpu/pack.sh in .devrun/; OUT (default /tmp/gpu-out) gets the logs.
#   bash ci/gpu/run_tests.sh                    # the GPU tests (ctest -R "$GPU_TESTS")
#   PHASES="gpu rest bench" bash ci/gpu/run_tests.sh
# Phases: gpu (the tests whose code paths change when a GPU is visible: CUDA,
# tensors, ops, autograd, optimizers, RemoteModule, rnn_lm on cuda:0), rest
# (the rest of the suite, less the Fashion-MNIST apps, whose data the bundle
# lacks, and the install, Slurm and layer checks; the tests that draw PNGs fail
# without gnuplot), bench (bench_dist_autograd with OpenBLAS's default and the
# CPU's kernels). Each phase has a time limit; the whole takes about a minute.
set -u
R=$PWD
OUT=${OUT:-/tmp/gpu-out}
PHASES=${PHASES:-gpu}
mkdir -p "$OUT"
t0=$(date +%s)
log() { echo "== [$(($(date +%s) - t0))s] $*"; }
{
log machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ldd --version | head -1
head -1 /etc/os-release
nproc
log setup
mkdir -p /opt/mpirpc-libs && tar xzf .devrun/libs.tar.gz -C /opt/mpirpc-libs --strip-components=1
tar xzf .devrun/ompi.tar.gz -C / 2>&1 | grep -v "Removing leading" | tail -2
ln -sf orterun /usr/bin/mpirun
ln -sf orterun /usr/bin/mpiexec
[ -f .devrun/fortunes.tar.gz ] && mkdir -p /usr/share/games && tar xzf .devrun/fortunes.tar.gz -C /usr/share/games
tar xzf .devrun/build.tar.gz
cudadirs=""
for n in libcublas.so.13 libcublasLt.so.13 libcudart.so.13; do
    f=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -1)
    echo "$n: ${f:-not found}"
    [ -n "$f" ] && cudadirs="$cudadirs$(dirname "$f"):"
done
export LD_LIBRARY_PATH=/opt/mpirpc-libs:${cudadirs}${LD_LIBRARY_PATH:-}
if [ ! /work/main -ef "$R" ]; then
    mkdir -p /work
    [ -e /work/main ] && mv /work/main /work/main.orig
    ln -s "$R" /work/main
fi
mkdir -p /root/.pyenv/shims && ln -sf "$(command -v python3)" /root/.pyenv/shims/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ldd build-cuda/libmpirpc.so.0 | grep -E "not found|cublas|cudart"
cd /work/main/build-cuda || exit 1
GPU_TESTS="cuda|test_tensor|test_oom|test_ops_|test_rt_codec|test_remote_module|test_dist_optim|test_optim|test_nn_|test_autograd"
if [[ " $PHASES " == *" gpu "* ]]; then
    log GPU tests
    timeout 150 ctest -R "$GPU_TESTS" -j6 --output-on-failure --timeout 120
    cp Testing/Temporary/LastTest.log "$OUT/gpu_tests.log" 2>/dev/null
fi
if [[ " $PHASES " == *" rest "* ]]; then
    log the rest of the suite
    timeout 100 ctest -E "$GPU_TESTS|ps_app|pipeline_|fmnist|test_two_hosts|test_slurm_jobs|test_install_consumer|layer_|check_layer" \
        -j12 --timeout 90 --output-on-failure
    cp Testing/Temporary/LastTest.log "$OUT/rest_tests.log" 2>/dev/null
fi
if [[ " $PHASES " == *" bench "* ]]; then
    log bench_dist_autograd
    lscpu | grep -E "Model name|^CPU\(s\)"
    timeout 120 mpirun -np 2 tests/bench/bench_dist_autograd 2>&1 | grep '^{' | tee "$OUT/bench.jsonl"
    timeout 120 mpirun -np 2 -x OPENBLAS_CORETYPE=SkylakeX tests/bench/bench_dist_autograd 2>&1 | grep '^{' |
        tee -a "$OUT/bench.jsonl"
fi
log done
} 2>&1 | tee "$OUT/log.txt"
