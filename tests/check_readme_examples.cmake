# Fails unless each example the README shows appears in it verbatim, as a whole ```c block.
#   cmake -DSOURCE=<repository> -P tests/check_readme_examples.cmake
file(READ ${SOURCE}/README.md _readme)
foreach(_example host_layer generate)
  file(READ ${SOURCE}/examples/${_example}.c _code)
  string(FIND "${_readme}" "```c\n${_code}```\n" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "README.md does not show examples/${_example}.c as it is: copy the file into its ```c block")
  endif()
endforeach()
message(STATUS "README.md shows examples/host_layer.c and examples/generate.c as they are")
