#!/bin/bash
# pack.sh — bundle a CUDA build and the runtime it needs, to run its tests on a
# bare GPU machine that has CUDA 13 (cuBLAS, cudart) and Python but none of
# Debian's packages (Open MPI, OpenBLAS, cmocka, hwloc...): the device machines
# lent to sessions here are such (Ubuntu 24.04, no network). Run on the Debian
# 12 development machine after building:
#   cmake -S . -B build-cuda -DMPIRPC_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc && cmake --build build-cuda
#   bash ci/gpu/pack.sh            # writes .devrun/ (add "/.devrun/" to .git/info/exclude)
# then, there, from the repository root: bash ci/gpu/run_tests.sh (see that file).
#
# What goes in .devrun/: libs.tar.gz (the shared-library closure of the build's
# binaries and of Open MPI's components, less glibc, libstdc++/libgcc and CUDA's
# libraries, which the target has), ompi.tar.gz (Open MPI's and PMIx's trees at
# their Debian paths), build.tar.gz (build-cuda without objects, debug info
# stripped: ~8 MB), fortunes.tar.gz (rnn_lm's corpus). About 30 MB in all.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-cuda}
D=.devrun
[ -f "$build/CMakeCache.txt" ] || { echo "pack.sh: no CUDA build in $build (BUILD_DIR)" >&2; exit 1; }
rm -rf "$D" && mkdir -p "$D/libs"
bins=$(find "$build" -path "*/CMakeFiles/*" -prune -o -type f -executable -print; find "$build" -name "*.so*" -type f)
ompi_so=$(find /usr/lib/x86_64-linux-gnu/openmpi/lib /usr/lib/x86_64-linux-gnu/pmix2/lib -name "*.so*")
for f in $bins $ompi_so /usr/bin/orterun /usr/bin/orted; do ldd "$f" 2>/dev/null || true; done |
    awk '/=>/ {print $3}' | sort -u |
    grep -v -E '^not$|/libc\.so|/libm\.so|/libmvec|/libpthread|/libdl\.so|/librt\.so|ld-linux|libstdc\+\+|libgcc_s|/cuda|libcublas|libcudart|libcuda\.so|libmpirpc' |
    while read -r l; do cp -L "$l" "$D/libs/"; done
tar czf "$D/libs.tar.gz" -C "$D" libs && rm -rf "$D/libs"
tar czf "$D/ompi.tar.gz" /usr/lib/x86_64-linux-gnu/openmpi/lib /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
    /etc/openmpi /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info 2>/dev/null
tmp=$(mktemp -d)
find "$build" -path "*/CMakeFiles/*" -prune -o \( -type f -o -type l \) -print | grep -v -E '\.(o|a)$' |
    tar cf - -T - | (cd "$tmp" && tar xf -)
find "$tmp" -type f \( -executable -o -name "*.so*" \) -exec strip --strip-debug {} + 2>/dev/null || true
(cd "$tmp" && tar czf - "$build") > "$D/build.tar.gz"
rm -rf "$tmp"
[ -d /usr/share/games/fortunes ] && tar czf "$D/fortunes.tar.gz" -C /usr/share/games fortunes
du -sh "$D"/*
