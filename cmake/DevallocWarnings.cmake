# Declared before its first use below: read while still undefined, the first
# configure of a fresh build folder built without -Werror and the second with
# it, so that the second rebuilt nearly everything.
option(DEVALLOC_WERROR "Treat warnings as errors" ON)

# One INTERFACE target carries the project's warnings; every target links it.
add_library(devalloc_warnings INTERFACE)
target_compile_options(devalloc_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor> -Wcast-align
  -Wimplicit-fallthrough $<$<BOOL:${DEVALLOC_WERROR}>:-Werror>)

if(DEVALLOC_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(DEVALLOC_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
