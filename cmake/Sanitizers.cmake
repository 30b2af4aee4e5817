# Sanitizer and fuzzing builds. Included from the top CMakeLists.txt before any target exists,
# so the flags reach the library, the tools, the tests and the fuzz targets alike.
#
#   -DIHA_SANITIZE=address,undefined   AddressSanitizer (with LeakSanitizer) and UBSan; any
#                                      comma-separated list that -fsanitize= takes
#   -DIHA_FUZZ=ON                      libFuzzer targets in tests/fuzz (needs clang); adds
#                                      -fsanitize=fuzzer-no-link (coverage) to everything
#
# UBSan does not recover (-fno-sanitize-recover), so every finding fails its test. Every
# executable links cmake/sanitizer_hooks.c: the sanitizers' default options, LeakSanitizer's
# suppressions (PoCL's and LLVM's own leaks, nothing of ours), and stdout flushed when a
# sanitizer ends the process. A plain `ctest` in the build directory then runs as CI does.
set(IHA_SANITIZE "" CACHE STRING "Comma-separated -fsanitize= list (e.g. address,undefined); empty for none")
option(IHA_FUZZ "Build the libFuzzer targets in tests/fuzz (clang only)" OFF)

if(IHA_FUZZ AND NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "IHA_FUZZ needs clang (libFuzzer): configure with CC=clang")
endif()
if(IHA_SANITIZE STREQUAL "" AND NOT IHA_FUZZ)
  return()
endif()

set(_iha_sanitize_flags -fno-omit-frame-pointer)
if(NOT IHA_SANITIZE STREQUAL "")
  list(APPEND _iha_sanitize_flags -fsanitize=${IHA_SANITIZE})
  if(IHA_SANITIZE MATCHES "undefined")
    list(APPEND _iha_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
endif()
add_compile_options(${_iha_sanitize_flags})
add_link_options(${_iha_sanitize_flags})
if(IHA_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(NOT IHA_SANITIZE STREQUAL "")
  # Linked into every later target; -u pulls the object out of the archive although nothing
  # calls into it (the runtimes find its hooks by name, its constructor does the rest).
  add_library(iha_sanitizer_hooks STATIC ${CMAKE_CURRENT_LIST_DIR}/sanitizer_hooks.c)
  link_libraries(iha_sanitizer_hooks)
  add_link_options(LINKER:-u,iha__sanitizer_hooks_anchor)
endif()
message(STATUS "iha: sanitizers '${IHA_SANITIZE}', fuzzing ${IHA_FUZZ}")
