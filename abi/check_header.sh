#!/bin/sh
# The ABI header with every C and C++ compiler of gcc, clang, g++ and clang++
# that is installed:
#   - C89, C99, C11, C17 with -Wall -Wextra -Wpedantic -Werror
#     (abi_c_check.c);
#   - C++11, C++14, C++17, C++20 with -Wall -Wextra -Wpedantic
#     -Wold-style-cast -Wzero-as-null-pointer-constant -Werror
#     (abi_cxx_check.cpp);
# A compiler that is not installed is skipped and says so; at least one C
# and one C++ compiler must run.
#   check_header.sh ABI_DIR
set -u
abi=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
ran_c=0
ran_cxx=0

check() { # what, command...: the command must succeed
  what=$1
  shift
  if out=$("$@" 2>&1); then
    echo "ok: $what"
  else
    echo "FAILED: $what: $*"
    printf '%s\n' "$out"
    status=1
  fi
}

for cc in gcc clang; do
  command -v "$cc" >/dev/null 2>&1 || { echo "skipped: $cc is not installed"; continue; }
  ran_c=1
  for std in c89 c99 c11 c17; do
    check "$cc -std=$std" "$cc" -std=$std -Wall -Wextra -Wpedantic -Werror -I"$abi" \
      -c "$abi/abi_c_check.c" -o "$tmp/c.o"
  done
done

for cxx in g++ clang++; do
  command -v "$cxx" >/dev/null 2>&1 || { echo "skipped: $cxx is not installed"; continue; }
  ran_cxx=1
  for std in c++11 c++14 c++17 c++20; do
    check "$cxx -std=$std" "$cxx" -std=$std -Wall -Wextra -Wpedantic -Wold-style-cast \
      -Wzero-as-null-pointer-constant -Werror -I"$abi" -c "$abi/abi_cxx_check.cpp" -o "$tmp/cxx.o"
  done
done

[ "$ran_c" = 1 ] || { echo "FAILED: no C compiler (gcc, clang) found"; status=1; }
[ "$ran_cxx" = 1 ] || { echo "FAILED: no C++ compiler (g++, clang++) found"; status=1; }
exit $status
