# Test wiring shared by every test folder.

# Tests that run threads carry the ctest label "concurrent". The TSan stage of
# scripts/test.sh builds only the target devalloc_concurrent_tests, which
# depends on everything those tests need, and runs `ctest -L concurrent`.
#
#   devalloc_concurrent(TARGETS target... TESTS test...)
#
# TESTS must be called from the folder that added them. A gtest executable
# gets the label in its discovery instead:
#   gtest_discover_tests(x PROPERTIES LABELS concurrent)
add_custom_target(devalloc_concurrent_tests)
function(devalloc_concurrent)
  cmake_parse_arguments(arg "" "" "TARGETS;TESTS" ${ARGN})
  if(arg_TARGETS)
    add_dependencies(devalloc_concurrent_tests ${arg_TARGETS})
  endif()
  if(arg_TESTS)
    set_property(TEST ${arg_TESTS} APPEND PROPERTY LABELS concurrent)
  endif()
endfunction()

# Python with the reference safetensors package (scripts/setup.sh makes it).
# Said at configure time when it is missing; the tests that need it are then
# disabled (ctest lists them as "Not Run (Disabled)") instead of failing
# with "No such file or directory".
set(DEVALLOC_TEST_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python interpreter with safetensors and numpy, for reference test data")
execute_process(COMMAND "${DEVALLOC_TEST_PYTHON}" -c "import safetensors, numpy"
                RESULT_VARIABLE _devalloc_python_result OUTPUT_QUIET ERROR_QUIET)
if(_devalloc_python_result STREQUAL "0")
  set(DEVALLOC_HAVE_TEST_PYTHON ON)
else()
  set(DEVALLOC_HAVE_TEST_PYTHON OFF)
  message(WARNING
    "The reference Python writer is missing: ${DEVALLOC_TEST_PYTHON} cannot "
    "import safetensors and numpy (${_devalloc_python_result}). The tests "
    "that need it are disabled. Run scripts/setup.sh, or pass "
    "-DDEVALLOC_TEST_PYTHON=/path/to/python of a venv that has them.")
endif()

#   devalloc_needs_test_python(test...)
# Marks tests that run DEVALLOC_TEST_PYTHON: disabled when it is missing.
function(devalloc_needs_test_python)
  if(NOT DEVALLOC_HAVE_TEST_PYTHON)
    set_tests_properties(${ARGN} PROPERTIES DISABLED TRUE)
  endif()
endfunction()

# gtest_discover_tests passes each item of a list in PROPERTIES as an
# argument of its own, so `PROPERTIES ENVIRONMENT "A=1;B=2" LABELS x` sets A
# alone and misreads the rest (B=2 as a property named "B=2", LABELS lost).
# Tests discovered with TEST_LIST <list> get several variables from here,
# applied by ctest after the discovered tests are added:
#   gtest_discover_tests(x TEST_LIST x_tests PROPERTIES LABELS concurrent)
#   devalloc_gtest_environment(x_tests "A=1" "B=2")
function(devalloc_gtest_environment test_list)
  set(script "${CMAKE_CURRENT_BINARY_DIR}/${test_list}_environment.cmake")
  # GENERATE: the values may hold generator expressions ($<TARGET_FILE:...>).
  file(GENERATE OUTPUT "${script}" CONTENT
       "foreach(test IN LISTS ${test_list})
  set_tests_properties(\"\${test}\" PROPERTIES ENVIRONMENT \"${ARGN}\")
endforeach()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
endfunction()
