# Install rules: bin/devalloc, include/devalloc/, lib/devalloc/plugins/,
# lib/cmake/devalloc/ so that find_package(devalloc) works from a prefix.
include(CMakePackageConfigHelpers)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/abi/devalloc"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
        FILES_MATCHING PATTERN "*.h")
foreach(part base loader)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/${part}/include/devalloc"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
          FILES_MATCHING PATTERN "*.hpp")
endforeach()

# Three export sets, so that a plugin author's find_package(devalloc
# COMPONENTS abi plugin_kit) needs none of the core's dependencies:
#   abi        devalloc::abi (the header)
#   plugin_kit devalloc::plugin_kit (static; threads and dlopen only)
#   loader, core  devalloc::base, devalloc::loader, devalloc::core (toml++,
#              dlpack)
# and, when ExecuTorch was found at configure time, a fourth:
#   executorch devalloc::executorch (static; ExecuTorch's runtime, which the
#              package config finds again, with the hint recorded below)
# Each exported target names its installed include folder itself
# ($<INSTALL_INTERFACE:include>), so install(TARGETS) adds none (an INCLUDES
# DESTINATION would list it twice). devalloc_warnings is the build's alone:
# the exported static libraries take it as compile options
# (devalloc_private_warnings), so that no consumer inherits it.
install(TARGETS devalloc_abi EXPORT devalloc-abi-targets)
install(EXPORT devalloc-abi-targets NAMESPACE devalloc::
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/plugins/common/include/devalloc"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
        FILES_MATCHING PATTERN "*.hpp")
install(TARGETS devalloc_plugin_kit EXPORT devalloc-plugin-kit-targets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel)
install(EXPORT devalloc-plugin-kit-targets NAMESPACE devalloc::
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)

set(_devalloc_export_targets devalloc_base devalloc_loader)
if(TARGET devalloc_core)
  list(APPEND _devalloc_export_targets devalloc_core)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/core/include/devalloc"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
          FILES_MATCHING PATTERN "*.hpp")
endif()
install(TARGETS ${_devalloc_export_targets} EXPORT devalloc-targets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel)
install(EXPORT devalloc-targets NAMESPACE devalloc::
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)

# The ExecuTorch adapter. Its link interface names devalloc::executorch_runtime,
# which the installed config defines from the consumer's find_package(executorch)
# (devallocExecutorchRuntime.cmake): no path of this machine's ExecuTorch is
# exported, only recorded as the search hint. Built without ExecuTorch, the
# package has no such component.
set(DEVALLOC_PACKAGE_EXECUTORCH OFF)
set(DEVALLOC_PACKAGE_EXECUTORCH_VERSION "")
set(DEVALLOC_PACKAGE_EXECUTORCH_HINT "")
if(TARGET devalloc_executorch)
  set(DEVALLOC_PACKAGE_EXECUTORCH ON)
  get_directory_property(DEVALLOC_PACKAGE_EXECUTORCH_VERSION
    DIRECTORY "${PROJECT_SOURCE_DIR}/integrations/executorch" DEFINITION executorch_VERSION)
  set(DEVALLOC_PACKAGE_EXECUTORCH_HINT "${executorch_DIR}")
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/integrations/executorch/include/devalloc"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
          FILES_MATCHING PATTERN "*.hpp")
  install(TARGETS devalloc_executorch EXPORT devalloc-executorch-targets
          ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel)
  install(EXPORT devalloc-executorch-targets NAMESPACE devalloc::
          DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)
  install(FILES "${PROJECT_SOURCE_DIR}/integrations/executorch/cmake/devallocExecutorchRuntime.cmake"
          DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)
endif()

# Plugin authors use the same helper as the project's own plugins.
install(FILES "${PROJECT_SOURCE_DIR}/cmake/plugin_exports.map"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/devallocConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/devallocConfig.cmake"
  INSTALL_DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc"
  PATH_VARS DEVALLOC_PLUGIN_INSTALL_DIR)
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/devallocConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/devallocConfig.cmake"
              "${PROJECT_BINARY_DIR}/devallocConfigVersion.cmake"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)
