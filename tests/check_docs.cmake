# ctest "docs": what README.md and doc/ state against the tree. cmake -DSOURCE=<repo>
# -DLIBDIR=<CMAKE_INSTALL_LIBDIR> -P check_docs.cmake. Checks that the README's apt line names
# every package tools/scripts/bootstrap.sh installs for building and testing, that each
# repository path the documents name in backquotes exists (CLBlast's own paths and build outputs
# aside), and
# that doc/installation.md names the library directory this build installs into.
cmake_policy(SET CMP0057 NEW) # if(IN_LIST)
set(_failures "")

file(READ ${SOURCE}/tools/scripts/bootstrap.sh _bootstrap)
string(REGEX MATCH "packages=\\(([^)]*)\\)" _ "${_bootstrap}")
string(REGEX REPLACE "[ \n]+" ";" _packages "${CMAKE_MATCH_1}")
list(REMOVE_ITEM _packages "")
file(READ ${SOURCE}/README.md _readme)
string(REGEX MATCH "sudo apt install ([^`]*)\ncmake" _ "${_readme}")
string(REGEX REPLACE "[ \n\\\\]+" ";" _readme_packages "${CMAKE_MATCH_1}")
foreach(_p IN LISTS _packages)
  if(NOT _p IN_LIST _readme_packages)
    string(APPEND _failures "README.md's apt line lacks ${_p}, which bootstrap.sh installs\n")
  endif()
endforeach()

file(GLOB _docs ${SOURCE}/README.md ${SOURCE}/doc/*.md ${SOURCE}/python/README.md)
foreach(_doc IN LISTS _docs)
  file(READ ${_doc} _text)
  string(REGEX REPLACE "CLBlast's( own tuners \\(| )`[^`]*`" "" _text "${_text}")
  string(REGEX MATCHALL "`(doc|include|tools|src|cl|tests|examples|python|cmake|bench|reference|\\.ci)/[A-Za-z0-9_./-]+`"
         _paths "${_text}")
  foreach(_quoted IN LISTS _paths)
    string(REPLACE "`" "" _path "${_quoted}")
    # Build outputs (python/build/, bench/peers/.work/) exist only once something is built.
    if(_path MATCHES "(^|/)(build|\\.work)(/|$)")
      continue()
    endif()
    if(NOT EXISTS ${SOURCE}/${_path})
      file(RELATIVE_PATH _name ${SOURCE} ${_doc})
      string(APPEND _failures "${_name} names ${_path}, which the tree does not have\n")
    endif()
  endforeach()
endforeach()

file(READ ${SOURCE}/doc/installation.md _installation)
string(FIND "${_installation}" "${LIBDIR}/pkgconfig" _at)
if(_at EQUAL -1)
  string(APPEND _failures "doc/installation.md does not name ${LIBDIR}/pkgconfig, where iha.pc installs\n")
endif()

if(_failures)
  message(FATAL_ERROR "${_failures}")
endif()
message(STATUS "docs: the README's packages, the documents' paths and the library directory agree with the tree")
