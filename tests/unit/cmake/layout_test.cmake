# cmake/DevallocLayout.cmake for the install layouts packagers use: the
# folder the loader looks in, relative to the program, and the build tree's
# plugin folder that mirrors it. Run as cmake -DSOURCE_DIR=... [-DOUTSIDE=1]
# -P this file.

function(expect_layout name prefix bindir libdir from_bin hint output)
  set(PROJECT_BINARY_DIR "/b")
  set(CMAKE_INSTALL_PREFIX "${prefix}")
  set(CMAKE_INSTALL_BINDIR "${bindir}")
  set(CMAKE_INSTALL_LIBDIR "${libdir}")
  # As GNUInstallDirs sets them.
  foreach(dir BINDIR LIBDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
      set(CMAKE_INSTALL_FULL_${dir} "${CMAKE_INSTALL_${dir}}")
    else()
      set(CMAKE_INSTALL_FULL_${dir} "${prefix}/${CMAKE_INSTALL_${dir}}")
    endif()
  endforeach()
  include("${SOURCE_DIR}/cmake/DevallocLayout.cmake")
  foreach(pair "DEVALLOC_PLUGIN_DIR_FROM_BIN;${from_bin}" "DEVALLOC_PLUGIN_DIR_HINT;${hint}"
               "DEVALLOC_PLUGIN_OUTPUT_DIR;${output}")
    list(GET pair 0 var)
    list(GET pair 1 expected)
    if(NOT "${${var}}" STREQUAL "${expected}")
      message(SEND_ERROR "${name}: ${var} is \"${${var}}\", expected \"${expected}\"")
    endif()
  endforeach()
endfunction()

expect_layout("default" "/usr/local" "bin" "lib"
  "../lib/devalloc/plugins" "PREFIX/lib/devalloc/plugins" "/b/lib/devalloc/plugins")
expect_layout("Debian multiarch" "/usr" "bin" "lib/x86_64-linux-gnu"
  "../lib/x86_64-linux-gnu/devalloc/plugins" "PREFIX/lib/x86_64-linux-gnu/devalloc/plugins"
  "/b/lib/x86_64-linux-gnu/devalloc/plugins")
expect_layout("Fedora, absolute libdir" "/usr" "bin" "/usr/lib64"
  "../lib64/devalloc/plugins" "PREFIX/lib64/devalloc/plugins" "/b/lib64/devalloc/plugins")
# A plugin folder outside the prefix cannot be mirrored by the build tree:
# configuring stops, saying why (the ctest of -DOUTSIDE=1 expects that).
if(OUTSIDE)
  expect_layout("libdir outside the prefix" "/opt/devalloc" "bin" "/usr/lib"
    "" "" "")
endif()
