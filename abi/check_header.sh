#!/bin/sh
# The ABI header with every C and C++ compiler of gcc, clang, g++ and clang++
# that is installed:
#   - C89, C99, C11, C17 with -Wall -Wextra -Wpedantic -Werror
#     (abi_c_check.c);
#   - C++11, C++14, C++17, C++20 with -Wall -Wextra -Wpedantic
#     -Wold-style-cast -Wzero-as-null-pointer-constant -Werror
#     (abi_cxx_check.cpp);
#   - refused, naming LP64, for targets that are not LP64 (i386, also with
#     -malign-double, x32, ARM32, riscv32), and accepted for other LP64
#     targets (AArch64, ppc64le), each where the compiler can target it
#     (freestanding, so no C library of that target is needed).
# A compiler that is not installed, or cannot target one of those, is
# skipped and says so; at least one C and one C++ compiler must run.
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
  printf '#include <stddef.h>\n#include <stdint.h>\nint devalloc_control;\n' > "$tmp/control.c"
  for target in "-m32" "-m32 -malign-double" "-mx32" "--target=armv7-linux-gnueabihf" \
                "--target=riscv32-linux-gnu"; do
    # $target unquoted: it may be two flags.
    if ! "$cc" $target -std=c89 -ffreestanding -fsyntax-only "$tmp/control.c" >/dev/null 2>&1; then
      echo "skipped: $cc $target: cannot compile for that target here"
      continue
    fi
    if out=$("$cc" $target -std=c89 -ffreestanding -fsyntax-only -I"$abi" "$abi/abi_c_check.c" 2>&1); then
      echo "FAILED: $cc $target: the header compiles for a target that is not LP64"
      status=1
    elif printf '%s\n' "$out" | grep -q 'defined for LP64 targets only'; then
      echo "ok: $cc $target is refused (LP64 only)"
    else
      echo "FAILED: $cc $target: refused, but without naming LP64:"
      printf '%s\n' "$out"
      status=1
    fi
  done
  # And accepted on LP64 targets other than this one.
  for target in "--target=aarch64-linux-gnu" "--target=powerpc64le-linux-gnu"; do
    if ! "$cc" $target -std=c89 -ffreestanding -fsyntax-only "$tmp/control.c" >/dev/null 2>&1; then
      echo "skipped: $cc $target: cannot compile for that target here"
      continue
    fi
    check "$cc $target (LP64)" "$cc" $target -std=c89 -ffreestanding -Wall -Wextra -Wpedantic \
      -Werror -fsyntax-only -I"$abi" "$abi/abi_c_check.c"
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
