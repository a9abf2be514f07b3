#!/bin/bash
# Install the built mpirpc into a temporary prefix, then build and run
# tests/consumer against it twice: with CMake's find_package and with pkg-config.
# Usage: run_consumer_test.sh <mpirpc build dir> <mpirpc source dir> <mpiexec> [mpiexec flags...]
set -euo pipefail
build=$1 src=$2 mpiexec=$3
shift 3
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
cmake -S "$src/tests/consumer" -B "$prefix/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$prefix/consumer-build" > /dev/null
"$mpiexec" "$@" -n 2 "$prefix/consumer-build/consumer"
# pkg-config route
export PKG_CONFIG_PATH="$(dirname "$(find "$prefix" -name mpirpc.pc | head -1)")"
cc_flags=$(pkg-config --cflags --libs mpirpc)
mpicc "$src/tests/consumer/consumer.c" -o "$prefix/consumer-pc" $cc_flags -Wl,-rpath,"$(pkg-config --variable=libdir mpirpc)"
"$mpiexec" "$@" -n 2 "$prefix/consumer-pc"
echo "1 passed, 0 failed"
