# cmake -DPLUGIN=... -DNM=... -DREADELF=... -P check_plugin_elf.cmake
# The CUDA plugin must export its entry point alone and must not need any
# CUDA library at load time: it opens the driver itself, so that it loads on
# machines without one.
execute_process(COMMAND "${NM}" -D --defined-only "${PLUGIN}"
                OUTPUT_VARIABLE symbols RESULT_VARIABLE failed)
if(failed)
  message(FATAL_ERROR "${NM} failed on ${PLUGIN}")
endif()
string(REGEX MATCHALL "[^ \n]+\n" names "${symbols}")
string(REGEX REPLACE "\n" "" names "${names}")
if(NOT names STREQUAL "devalloc_plugin_negotiate")
  message(FATAL_ERROR "${PLUGIN} exports [${names}], not only devalloc_plugin_negotiate")
endif()

execute_process(COMMAND "${READELF}" -d "${PLUGIN}"
                OUTPUT_VARIABLE dynamic RESULT_VARIABLE failed)
if(failed)
  message(FATAL_ERROR "${READELF} failed on ${PLUGIN}")
endif()
string(REGEX MATCHALL "Shared library: \\[[^]]+\\]" needed "${dynamic}")
foreach(entry IN LISTS needed)
  string(REGEX REPLACE "Shared library: \\[(.*)\\]" "\\1" library "${entry}")
  # The C and C++ runtimes, and the sanitizers' in sanitized builds.
  if(NOT library MATCHES "^(libc|libm|libstdc\\+\\+|libgcc_s|libpthread|libdl|ld-linux-x86-64|libasan|libubsan|libtsan)\\.so")
    message(FATAL_ERROR "${PLUGIN} needs ${library} at load time")
  endif()
endforeach()
message(STATUS "${PLUGIN}: exports ${names}; needs ${needed}")
