#!/bin/bash
# Install what building and testing mpirpc needs on Debian 12 (run as root, or
# with sudo available), the apps' data (dataset-fashion-mnist; fortunes, the
# text rnn_lm learns) and plotting tool (gnuplot-nox) included. Idempotent: skips apt when everything is present.
# --test also installs PyTorch 1.13 (python3-torch, with NumPy), which the
# interop test uses to read the files the library writes (it skips without),
# and Slurm with munge, which tests/slurm starts for real (it skips without).
set -euo pipefail
packages=(build-essential cmake pkg-config git libopenmpi-dev openmpi-bin libcmocka-dev libopenblas-dev
          libhwloc-dev zlib1g-dev libcjson-dev dataset-fashion-mnist gnuplot-nox
          fortunes)
if [ "${1:-}" = "--test" ]; then
  packages+=(python3-torch slurm-wlm munge) # PyTorch references; a real Slurm for tests/slurm
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--test]" >&2
  exit 2
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
