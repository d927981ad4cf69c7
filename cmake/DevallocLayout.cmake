# Where the plugins are installed, and where a program finds them.
#
# The loader in bin/devalloc (and in any program installed next to it) looks
# for plugins at a path relative to its own folder, so that an install can be
# moved as a whole. That path is computed here from the install folders as
# the packager set them: CMAKE_INSTALL_LIBDIR may be "lib", a multiarch
# "lib/x86_64-linux-gnu" (Debian), or absolute ("/usr/lib64", Fedora).
#
# The build tree mirrors it: programs in build/bin, plugins at the same
# relative path from there, so that the programs of the build tree (and the
# tests) find the plugins they were built with.
#
# Sets:
#   DEVALLOC_PLUGIN_INSTALL_DIR   install DESTINATION of the plugins
#   DEVALLOC_PLUGIN_DIR_FROM_BIN  the plugin folder relative to the bin folder
#   DEVALLOC_PLUGIN_DIR_HINT      the plugin folder for messages: PREFIX/...,
#                                 or absolute where it is outside the prefix
#   DEVALLOC_PLUGIN_OUTPUT_DIR    the plugin folder of the build tree

set(DEVALLOC_PLUGIN_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/devalloc/plugins")
set(_devalloc_full_plugin_dir "${CMAKE_INSTALL_FULL_LIBDIR}/devalloc/plugins")
file(RELATIVE_PATH DEVALLOC_PLUGIN_DIR_FROM_BIN
     "${CMAKE_INSTALL_FULL_BINDIR}" "${_devalloc_full_plugin_dir}")
file(RELATIVE_PATH _devalloc_in_prefix "${CMAKE_INSTALL_PREFIX}" "${_devalloc_full_plugin_dir}")
if(_devalloc_in_prefix MATCHES "^\\.\\./" OR IS_ABSOLUTE "${_devalloc_in_prefix}")
  set(DEVALLOC_PLUGIN_DIR_HINT "${_devalloc_full_plugin_dir}")
else()
  set(DEVALLOC_PLUGIN_DIR_HINT "PREFIX/${_devalloc_in_prefix}")
endif()

set(CMAKE_RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/bin")
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/lib")
set(CMAKE_ARCHIVE_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/lib")
cmake_path(SET DEVALLOC_PLUGIN_OUTPUT_DIR NORMALIZE
           "${PROJECT_BINARY_DIR}/bin/${DEVALLOC_PLUGIN_DIR_FROM_BIN}")
cmake_path(IS_PREFIX PROJECT_BINARY_DIR "${DEVALLOC_PLUGIN_OUTPUT_DIR}" NORMALIZE
           _devalloc_inside)
if(NOT _devalloc_inside)
  message(FATAL_ERROR
    "devalloc: the plugin folder ${_devalloc_full_plugin_dir} is "
    "${DEVALLOC_PLUGIN_DIR_FROM_BIN} from the program folder "
    "${CMAKE_INSTALL_FULL_BINDIR}: the build tree cannot mirror that (its "
    "programs and tests would not find their plugins). Choose a "
    "CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_BINDIR under one prefix.")
endif()
string(REGEX REPLACE "/$" "" DEVALLOC_PLUGIN_OUTPUT_DIR "${DEVALLOC_PLUGIN_OUTPUT_DIR}")
