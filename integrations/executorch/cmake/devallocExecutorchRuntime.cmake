# devalloc_executorch_runtime_usage(TARGET): gives the INTERFACE target TARGET
# the usage requirements of ExecuTorch's runtime alone (libexecutorch.so: the
# registry and DeviceMemoryBuffer), after find_package(executorch) found it.
# EXECUTORCH_LIBRARIES would add every kernel and delegate library of the
# wheel; the imported targets exist only with CMake 3.28 and newer.
# The build tree and the installed package (devallocConfig.cmake) both use it.
function(devalloc_executorch_runtime_usage target)
  if(TARGET executorch::runtime)
    target_link_libraries(${target} INTERFACE executorch::runtime)
    return()
  endif()
  # Not cached: a consumer that points executorch_DIR elsewhere later gets
  # that package's library, not a stale entry.
  find_library(_devalloc_executorch_library executorch
    HINTS "${EXECUTORCH_RUNTIME_LIBRARY_DIR}" NO_DEFAULT_PATH NO_CACHE)
  if(NOT _devalloc_executorch_library)
    message(FATAL_ERROR "ExecuTorch's package names ${EXECUTORCH_RUNTIME_LIBRARY_DIR} "
                        "but it holds no libexecutorch")
  endif()
  target_include_directories(${target} SYSTEM INTERFACE ${EXECUTORCH_INCLUDE_DIRS})
  target_compile_definitions(${target} INTERFACE ${EXECUTORCH_COMPILE_DEFINITIONS})
  target_link_libraries(${target} INTERFACE "${_devalloc_executorch_library}")
  target_link_options(${target} INTERFACE "LINKER:-rpath,${EXECUTORCH_RUNTIME_LIBRARY_DIR}")
endfunction()
