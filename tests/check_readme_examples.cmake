# Fails unless the documentation shows the programs of examples/ as they are (each one named
# below appears in its page verbatim, as a whole ```c block, so that the code a reader copies is
# the code the test suite builds and runs) and its links lead somewhere.
#   cmake -DSOURCE=<repository> -P tests/check_readme_examples.cmake
set(_shown
  README.md     host_layer
  doc/guide.md  opencl_layer
  doc/guide.md  generate)
list(LENGTH _shown _count)
math(EXPR _last "${_count} - 1")
foreach(_i RANGE 0 ${_last} 2)
  math(EXPR _j "${_i} + 1")
  list(GET _shown ${_i} _page)
  list(GET _shown ${_j} _example)
  if(NOT EXISTS ${SOURCE}/${_page})
    message(FATAL_ERROR "${_page} does not exist: it shows examples/${_example}.c")
  endif()
  file(READ ${SOURCE}/${_page} _text)
  file(READ ${SOURCE}/examples/${_example}.c _code)
  string(FIND "${_text}" "```c\n${_code}```\n" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_page} does not show examples/${_example}.c as it is: copy the file into its ```c block")
  endif()
  message(STATUS "${_page} shows examples/${_example}.c as it is")
endforeach()

# Every relative link of these pages names a file of the repository: a reader who follows one
# finds the page it promises.
foreach(_page README.md CHANGELOG.md doc/installation.md doc/guide.md doc/cli.md doc/testing.md .ci/README.md)
  file(READ ${SOURCE}/${_page} _text)
  get_filename_component(_dir ${SOURCE}/${_page} DIRECTORY)
  # "](" opens a Markdown link's target; the brackets themselves would confuse CMake's lists.
  string(REPLACE "](" " @link@" _text "${_text}")
  string(REGEX MATCHALL "@link@[^)# \n]+" _links "${_text}")
  foreach(_link IN LISTS _links)
    string(SUBSTRING "${_link}" 6 -1 _target)
    if(_target MATCHES "^[a-z]+:")
      continue()
    endif()
    if(NOT EXISTS ${_dir}/${_target})
      message(FATAL_ERROR "${_page} links ${_target}, which does not exist")
    endif()
  endforeach()
endforeach()
message(STATUS "the relative links of README.md, CHANGELOG.md, .ci/README.md and the user's pages of doc/ name existing files")
