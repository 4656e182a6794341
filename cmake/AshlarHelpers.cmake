# ashlar_library(NAME SOURCES ... DEPS ...): one static library per module, warnings on,
# include root at the repository top so headers are included as "runtime/...".
function(ashlar_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  ashlar_public_includes(${name})
  target_link_libraries(${name} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  target_compile_options(${name} PRIVATE -Wall -Wextra)
endfunction()

# The include root for "runtime/...", "actors/...", "gpu/...", "schema/...": the source and
# build trees in the build, include/ashlar once installed (see ashlar_install).
function(ashlar_public_includes name)
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                             $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}> $<INSTALL_INTERFACE:include/ashlar>)
endfunction()

# ashlar_test(NAME SOURCES ... DEPS ... [LABELS ...] [SKIP_REGEX RE] [LONG_CASES NAME ...]): a
# Catch2 executable whose test cases ctest discovers. LONG_CASES: the names of the cases
# that also get the label `long` (minutes of real processes: run by `ctest -L long`, left
# out of the suite's `-LE long`).
function(ashlar_test name)
  cmake_parse_arguments(A "" "SKIP_REGEX" "SOURCES;DEPS;LABELS;LONG_CASES" ${ARGN})
  # ctest names each Catch test case after its name, and a ';' there splits the name (a
  # CMake list), so the truncated name matches no test case and "passes" running nothing.
  foreach(_src ${A_SOURCES})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_src})
    file(STRINGS ${_src} _bad REGEX "TEST_CASE\\(\"[^\"]*;")
    if(_bad)
      message(FATAL_ERROR "${_src}: a test case name with ';' would never run under ctest: ${_bad}")
    endif()
    # A '[' in a name opens a Catch tag: the test list that discovery parses goes wrong
    # from that case on, and every later case of the binary silently drops out of ctest.
    file(STRINGS ${_src} _bad REGEX "TEST_CASE\\(\"[^\"]*\\[")
    if(_bad)
      message(FATAL_ERROR "${_src}: a test case name with '[' would cut ctest's discovery: ${_bad}")
    endif()
  endforeach()
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} ashlar_test_main)
  target_compile_options(${name} PRIVATE -Wall -Wextra)
  # Every test has a time limit, so a hang fails the run instead of stalling it.
  set(_props TIMEOUT 300)
  if(A_LABELS)
    list(APPEND _props LABELS "${A_LABELS}")
  endif()
  # A case whose output matches SKIP_REGEX (it lacks what it needs, e.g. a GPU) is
  # reported as skipped, not passed.
  if(A_SKIP_REGEX)
    list(APPEND _props SKIP_REGULAR_EXPRESSION "${A_SKIP_REGEX}")
  endif()
  catch_discover_tests(${name} TEST_PREFIX "${name}: " PROPERTIES ${_props}
    EXTRA_ARGS --warn NoAssertions)
  # The long cases' label, set once ctest has read the discovered cases (an include file
  # that comes after discovery's own).
  if(A_LONG_CASES)
    set(_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_long_cases.cmake")
    set(_text "")
    foreach(_case ${A_LONG_CASES})
      string(APPEND _text "set_tests_properties(\"${name}:${_case}\" PROPERTIES LABELS \"${A_LABELS};long\")\n")
    endforeach()
    file(WRITE "${_file}" "${_text}")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_file}")
  endif()
endfunction()
