# Declared before its first use below: read while still undefined, the first
# configure of a fresh build folder built without -Werror and the second with
# it, so that the second rebuilt nearly everything.
option(DEVALLOC_WERROR "Treat warnings as errors" ON)

set(DEVALLOC_WARNING_OPTIONS
  -Wall -Wextra -Wpedantic -Wshadow $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor> -Wcast-align
  -Wimplicit-fallthrough $<$<BOOL:${DEVALLOC_WERROR}>:-Werror>
  # GCC 12 at -O3 (the Release build) warns inside libstdc++'s own headers:
  # std::string's appends taken for overlapping copies (-Wrestrict, GCC bug
  # 105651) and the destructor of a std::thread in a vector indexed out of
  # bounds (-Warray-bounds); -Werror made both a failed build. Fixed in
  # GCC 13; the -O2 builds (RelWithDebInfo, CI) keep both warnings.
  $<$<AND:$<COMPILE_LANG_AND_ID:CXX,GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>,$<CONFIG:Release>>:-Wno-restrict>
  $<$<AND:$<COMPILE_LANG_AND_ID:CXX,GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>,$<CONFIG:Release>>:-Wno-array-bounds>
  # GCC before 13 warns of the fields a C++ designated initializer leaves
  # out, which is what LoadRequest's are for:
  # load(plan, {.methods = {"forward"}}) leaves the rest at their defaults.
  $<$<AND:$<COMPILE_LANG_AND_ID:CXX,GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-missing-field-initializers>)

# One INTERFACE target carries the project's warnings; every target links it,
# except the installed static libraries (below).
add_library(devalloc_warnings INTERFACE)
target_compile_options(devalloc_warnings INTERFACE ${DEVALLOC_WARNING_OPTIONS})

# devalloc_private_warnings(TARGET): the warnings as TARGET's own compile
# options, for the static libraries the CMake package exports. CMake exports
# a static library's PRIVATE link items as $<LINK_ONLY:...>, so linking
# devalloc_warnings would hand it (and its -Werror) to every consumer, and
# $<BUILD_INTERFACE:devalloc_warnings> still leaves an empty $<LINK_ONLY:>
# ($<BUILD_LOCAL_INTERFACE> needs CMake 3.26).
function(devalloc_private_warnings target)
  target_compile_options(${target} PRIVATE ${DEVALLOC_WARNING_OPTIONS})
endfunction()

if(DEVALLOC_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(DEVALLOC_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
