#!/bin/bash
# The whole test suite: install dependencies, build with -Werror, run every
# test (unit, multi-rank, install/consumer), then rebuild with AddressSanitizer
# + UndefinedBehaviorSanitizer and run the suite again.
# Usage: ci/run_tests.sh [--no-sanitizers]
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install_deps.sh --test

# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
jobs=$(nproc)

cmake -S . -B build-ci -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPIRPC_WERROR=ON
cmake --build build-ci -j"$jobs"
(cd build-ci && ctest --output-on-failure)

# The CUDA backend is compiled wherever nvcc exists; its GPU tests skip with a
# message when no GPU is visible.
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ]; then
  cmake -S . -B build-ci-cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPIRPC_WERROR=ON -DMPIRPC_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc"
  cmake --build build-ci-cuda -j"$jobs"
  (cd build-ci-cuda && ctest --output-on-failure -R "test_cuda|test_tensor|test_rt_")
fi

if [ "${1:-}" != "--no-sanitizers" ]; then
  cmake -S . -B build-ci-asan -DCMAKE_BUILD_TYPE=Debug -DMPIRPC_SANITIZE=ON -DMPIRPC_WERROR=ON
  cmake --build build-ci-asan -j"$jobs"
  # Full stack unwinding and no dlclose of Open MPI components, so leaks are
  # attributed correctly; the MPI stack's own allocations are suppressed.
  export ASAN_OPTIONS=fast_unwind_on_malloc=0:detect_leaks=1:abort_on_error=0
  export LSAN_OPTIONS="suppressions=$PWD/ci/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export OMPI_MCA_mca_base_component_disable_dlclose=1
  (cd build-ci-asan && ctest --output-on-failure --timeout 900)
fi
