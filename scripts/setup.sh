#!/usr/bin/env bash
# Install what is missing (Debian 12, as root) and build mantis into build/ (or $1).
# Usage: scripts/setup.sh [BUILD_DIR [meson options...]]
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(meson ninja-build pkg-config g++ python3 libmpfr-dev libgmp-dev libeigen3-dev catch2
      libfmt-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libssl-dev
      jupyter-nbconvert python3-matplotlib python3-ipykernel
      python3-torch   # the PyTorch reference checks (tests/reference) and mantis.torch
      python3-hypothesis  # the Python module's property-based tests (tests/test_python_props.py)
      python3-pybind11 python3-dev python3-numpy)  # the Python module (python/)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# nvcc (optional): the CUDA part of the build is compiled whenever it is found.
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
dir=${1:-build}
shift || true
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null
echo "built: $dir/src/cli/mantis" >&2
