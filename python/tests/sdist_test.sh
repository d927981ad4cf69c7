#!/usr/bin/env bash
# The source distribution of the Python package holds what its build needs.
# Makes the sdist from the repository root as `python -m build --sdist` does,
# unpacks it, configures python/ from it as scikit-build-core would (CMake
# fails on a missing CMakeLists.txt or source file), then, without compiling,
# checks every file the build commands of the package's targets name and
# preprocesses each of their sources (a missing header fails). Building the
# wheel itself takes minutes; this takes seconds.
# Usage: sdist_test.sh PYTHON SOURCE_DIR SCRATCH_DIR
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 PYTHON SOURCE_DIR SCRATCH_DIR" >&2
  exit 2
fi
python=$1 source_dir=$2 scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch/dist" "$scratch/unpacked"

# No isolation: the venv already has the build requirements, and CI may have
# no package index to fetch them from. -I: no build/ folder in the current
# one passes for the build module.
"$python" -I -m build --sdist --no-isolation --outdir "$scratch/dist" "$source_dir" \
  >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
sdists=("$scratch"/dist/*.tar.gz)
[[ ${#sdists[@]} -eq 1 && -f ${sdists[0]} ]] || { echo "FAIL: no single sdist made" >&2; exit 1; }
tar -C "$scratch/unpacked" -xzf "${sdists[0]}"
roots=("$scratch"/unpacked/*)
root=${roots[0]}
echo "sdist: $(basename "${sdists[0]}"), $(tar -tzf "${sdists[0]}" | wc -l) members"

# What stays out: build folders, the repository's metadata, and what the
# package's build never reads.
if tar -tzf "${sdists[0]}" | grep -E '^[^/]+/(build[^/]*|\.git|\.venv|docs|bench|examples|integrations|scripts|python/tests)(/|$)|__pycache__|\.pyc$'; then
  echo "FAIL: the sdist holds the files above, which the build does not need" >&2
  exit 1
fi

# pip builds in the folder pyproject.toml names, or in a temporary one; a
# folder inside the source tree fails `pip install` from a tree its user
# cannot write (CMakeConfigError: build directory ... must be a (creatable)
# directory).
build_dir=$("$python" -I -c '
import sys
from scikit_build_core.settings.skbuild_read_settings import SettingsReader
print(SettingsReader.from_file(sys.argv[1], state="wheel").settings.build_dir)' "$root/pyproject.toml")
if [[ -n $build_dir ]]; then
  echo "FAIL: pyproject.toml builds in $build_dir, inside the source tree, which its user may not be able to write" >&2
  exit 1
fi

command -v ninja >/dev/null || { echo "FAIL: this test needs ninja (scripts/setup.sh installs it)" >&2; exit 1; }
nanobind_dir=$("$python" -m nanobind --cmake_dir)
cmake -S "$root/python" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$python" -Dnanobind_DIR="$nanobind_dir" \
  >"$scratch/configure.log" 2>&1 || { cat "$scratch/configure.log"; echo "FAIL: python/ does not configure from the sdist" >&2; exit 1; }

# The commands that would build the package's two targets (the extension and
# the host plugin it ships) and everything they link.
ninja -C "$scratch/build" -t commands _native devalloc_host >"$scratch/commands.txt"

# Every file of the unpacked sdist a command names (sources, include
# folders, the plugins' version script) is there.
missing=0
while read -r path; do
  if [[ ! -e $path ]]; then
    echo "FAIL: the build names $path, which the sdist lacks" >&2
    missing=1
  fi
done < <(sed -E 's/-fmacro-prefix-map=[^ ]+//g' "$scratch/commands.txt" |
         grep -oE "$root/[^ \"';]+" | sort -u)

# Each of the sdist's sources preprocessed as its command would compile it:
# the headers it includes are all there. -E replaces the compile; the object
# and its dependency file are not written.
count=0
while read -r command; do
  command=$(sed -E 's/ -M(D|MD) / /; s/ -MT [^ ]+ / /; s/ -MF [^ ]+ / /; s/ -o [^ ]+ / -o \/dev\/null /' <<<"$command")
  if ! (cd "$scratch/build" && eval "$command -E") >/dev/null 2>"$scratch/preprocess.err"; then
    cat "$scratch/preprocess.err" >&2
    echo "FAIL: a source of the sdist does not preprocess: $command" >&2
    missing=1
  fi
  count=$((count + 1))
done < <(grep -E " -c [^ ]*$root/" "$scratch/commands.txt")
echo "preprocessed $count sources of the sdist"
[[ $count -gt 0 ]] || { echo "FAIL: no compile command names a source of the sdist" >&2; exit 1; }
[[ $missing -eq 0 ]]
echo "the sdist holds what the build of python/ reads"
