#!/usr/bin/env bash
# Installs what dsc needs to build and test on Debian 12 (run as root or with sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build flex bison libgtest-dev libcjson-dev clang libclang-rt-14-dev python3
  libopenmpi-dev openmpi-bin llvm-14-dev libdnnl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Python packages used only by tests that cross-check files dsc writes
# (the independent safetensors reader).
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  echo "install-deps: installing safetensors and numpy from PyPI for the cross-check tests"
  python3 -m pip install --quiet safetensors numpy 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages safetensors numpy
fi
