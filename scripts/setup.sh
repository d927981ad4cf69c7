#!/usr/bin/env bash
# Installs everything devalloc needs to build and test on Debian 12.
# Idempotent: packages already present are left alone. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config python3 python3-dev python3-pip python3-venv valgrind
  libgtest-dev libgmock-dev
  libboost1.81-dev
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libdlpack-dev
  libamdhip64-dev
  clang-14 libclang-rt-14-dev
  libze-dev libze1
  mesa-vulkan-drivers libvulkan1 libvulkan-dev
  pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers
  openmpi-bin libopenmpi-dev python3-mpi4py
  ccache
)
# openmpi-bin: the launcher of the sharded-load test (mpirun -n 4);
# libopenmpi-dev builds mpi4py for the venv's Python (Debian's
# python3-mpi4py serves Debian's python3).
# libamdhip64-dev: the HIP plugin's headers, and the real runtime whose
# no-device answer a test checks (the plugin opens it at run time).
# clang-14 and its runtime (libFuzzer, ASan, UBSan) are for scripts/fuzz.sh.
# The CUDA plugin needs only cuda.h; it is built when CMake finds a CUDA
# toolkit (as under /usr/local/cuda) and skipped otherwise.
# The Level Zero plugin needs the headers of libze-dev; its tests run the
# fake driver (tests/fakes/level_zero) under Debian's real loader from libze1.
# Vulkan (Mesa's lavapipe) and OpenCL (PoCL) are real drivers that run on the
# CPU: the vulkan and opencl plugins' tests load through them.

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  # libboost1.81-dev conflicts with the default 1.74 dev packages; apt removes them.
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A venv local to the checkout: the reference safetensors writer for the
# tests; nanobind for the Python package (python/) and pytest for its tests;
# scikit-build-core for `pip install --no-build-isolation .` (pyproject.toml at
# the root) and, with build, for the test that makes the package's sdist.
# -I: a build/ folder in the current one must not pass for the build module.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] ||
   ! "$venv/bin/python" -I -c 'import safetensors, numpy, nanobind, pytest, scikit_build_core, build, mpi4py
assert int(scikit_build_core.__version__.split(".")[0]) >= 1' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q safetensors numpy "nanobind>=3.1" pytest "scikit-build-core>=1.0" build \
    mpi4py
fi

# The C++ runtime of the ExecuTorch wheel, for the ExecuTorch integration and
# its test (integrations/executorch): the wheel alone, without torch, unpacked
# into .venv/executorch-<version>/ (headers, libexecutorch.so, CMake config).
executorch_version=1.5.1
executorch_dir="$venv/executorch-$executorch_version"
if [ ! -f "$executorch_dir/executorch/lib/libexecutorch.so" ] && [ "$(uname -m)" = x86_64 ]; then
  download="$(mktemp -d)"
  if "$venv/bin/pip" download -q --no-deps --only-binary=:all: \
       --python-version 3.11 --platform manylinux_2_28_x86_64 \
       -d "$download" "executorch==$executorch_version"; then
    "$venv/bin/python" - "$download"/executorch-*.whl "$executorch_dir.partial" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [n for n in z.namelist()
                       if n.startswith(("executorch/include/", "executorch/lib/",
                                        "executorch/share/"))])
PY
    rm -rf "$executorch_dir" && mv "$executorch_dir.partial" "$executorch_dir"
  else
    echo "setup: could not download executorch==$executorch_version; the ExecuTorch integration will not be built" >&2
  fi
  rm -rf "$download"
fi
