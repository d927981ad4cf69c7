# DEVALLOC_FUZZ=ON builds the libFuzzer targets of tests/fuzz (clang only:
# CMAKE_CXX_COMPILER=clang++-14, runtime from libclang-rt-14-dev). Everything
# is then compiled with coverage for the fuzzer and with ASan and UBSan, so
# use a build folder of its own; scripts/fuzz.sh does all of this.
option(DEVALLOC_FUZZ "Build the libFuzzer targets in tests/fuzz (clang; see scripts/fuzz.sh)" OFF)
if(DEVALLOC_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DEVALLOC_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++-14 "
                        "-DCMAKE_C_COMPILER=clang-14); this is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
