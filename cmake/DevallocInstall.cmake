# Install rules: bin/devalloc, include/devalloc/, lib/devalloc/plugins/,
# lib/cmake/devalloc/ so that find_package(devalloc) works from a prefix.
include(CMakePackageConfigHelpers)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/abi/devalloc"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/loader/include/devalloc"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
        FILES_MATCHING PATTERN "*.hpp")

set(_devalloc_export_targets devalloc_abi devalloc_loader)
if(TARGET devalloc_core)
  list(APPEND _devalloc_export_targets devalloc_core)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/core/include/devalloc"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
          FILES_MATCHING PATTERN "*.hpp")
endif()
install(TARGETS ${_devalloc_export_targets} devalloc_warnings
        EXPORT devalloc-targets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT devalloc-targets NAMESPACE devalloc::
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/devalloc" COMPONENT devel)

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
