# devalloc_add_plugin(NAME SOURCES...): a MODULE library libdevalloc_NAME.so
# with hidden visibility whose only exported symbol is the ABI entry point.
# Placed in the build tree's plugin folder; installed beside it when INSTALL.
set(DEVALLOC_PLUGIN_VERSION_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/plugin_exports.map")

function(devalloc_add_plugin name)
  cmake_parse_arguments(ARG "INSTALL" "OUTPUT_DIRECTORY" "SOURCES;LIBRARIES" ${ARGN})
  set(target devalloc_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(NOT ARG_OUTPUT_DIRECTORY)
    set(ARG_OUTPUT_DIRECTORY "${DEVALLOC_PLUGIN_OUTPUT_DIR}")
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "devalloc_${name}"
    LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(${target} PRIVATE devalloc::abi devalloc::plugin_kit
                        devalloc_warnings Threads::Threads ${ARG_LIBRARIES})
  # The version script keeps the C++ runtime's weak symbols out of the
  # dynamic table too, so the entry point is the only export.
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${DEVALLOC_PLUGIN_VERSION_SCRIPT}"
    "LINKER:--no-undefined")
  if(ARG_INSTALL AND DEVALLOC_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION "${DEVALLOC_PLUGIN_INSTALL_DIR}"
            COMPONENT plugins)
  endif()
endfunction()
