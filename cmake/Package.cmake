# Debian packages through CPack (`cpack -G DEB` in the build directory), one per install
# component of cmake/Install.cmake: libiha0 (the shared library), libiha-dev (headers, static
# library, CMake package, pkg-config file) and iha-tools (the iha command). Their dependencies
# on other packages come from the binaries (dpkg-shlibdeps, in dpkg-dev).
# libiha_mpi, when it is built, gets three packages of its own from the same build rather than
# being folded into those: libiha-mpi0 (libiha_mpi.so.0, the name Debian gives its SONAME),
# libiha-mpi-dev and iha-mpi-tools (the iha-mpi command). They are components like libiha's,
# so one cpack run gives all six at one version and each depends on its libiha package at
# exactly that version; MPI (libopenmpi3, through dpkg-shlibdeps) is theirs alone, and a
# system that never runs MPI installs libiha0 without it.
set(CPACK_PACKAGE_NAME iha)
set(CPACK_PACKAGE_VENDOR "The iha authors")
# The Maintainer field: whoever builds the packages, named as Debian's own tools (dch, dh_make)
# take it, from DEBFULLNAME and DEBEMAIL, else from git's user.name and user.email, else the
# committer of the source's commit; set IHA_PACKAGE_CONTACT to name someone else.
set(_iha_contact "")
if(DEFINED ENV{DEBFULLNAME} AND DEFINED ENV{DEBEMAIL})
  set(_iha_contact "$ENV{DEBFULLNAME} <$ENV{DEBEMAIL}>")
else()
  find_program(IHA_GIT git)
  if(IHA_GIT)
    execute_process(COMMAND ${IHA_GIT} config user.name WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                    OUTPUT_VARIABLE _iha_git_name OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${IHA_GIT} config user.email WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                    OUTPUT_VARIABLE _iha_git_email OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_iha_git_name AND _iha_git_email)
      set(_iha_contact "${_iha_git_name} <${_iha_git_email}>")
    else()
      execute_process(COMMAND ${IHA_GIT} log -1 "--format=%cn <%ce>" WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                      OUTPUT_VARIABLE _iha_contact OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
endif()
if(NOT IHA_PACKAGE_CONTACT AND NOT _iha_contact)
  message(STATUS "Debian packages: no maintainer known (set DEBFULLNAME and DEBEMAIL, or IHA_PACKAGE_CONTACT); "
                 "cpack refuses to build them")
endif()
set(IHA_PACKAGE_CONTACT "${_iha_contact}" CACHE STRING "Maintainer of the Debian packages (\"Name <address>\")")
set(CPACK_PACKAGE_CONTACT "${IHA_PACKAGE_CONTACT}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Interleaved Head Attention on OpenCL") # first line of each description
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_FILE_NAME iha-${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING IGNORE)
set(CPACK_COMPONENTS_ALL runtime development)
if(IHA_BUILD_TOOLS)
  list(APPEND CPACK_COMPONENTS_ALL tools)
endif()
if(IHA_MPI_FOUND)
  list(APPEND CPACK_COMPONENTS_ALL mpi_runtime mpi_development)
  if(TARGET iha_mpi_cli)
    list(APPEND CPACK_COMPONENTS_ALL mpi_tools)
  endif()
endif()

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # name_version_arch.deb
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON) # packages built against libiha0 depend on this version or later
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_STRIP_FILES ON)
# libiha_mpi.so and iha-mpi link libiha.so.0 and libiha_mpi.so.0 of this build, which belong
# to no installed package yet: dpkg-shlibdeps finds them here, and the component dependencies
# below say which package holds them.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libiha${PROJECT_VERSION_MAJOR})
# The ICD loader (a dependency through libOpenCL.so.1) runs nothing without a driver: PoCL for
# the host CPU, or any other that provides opencl-icd (Mesa's, NVIDIA's, Intel's).
set(IHA_DEBIAN_DRIVER "pocl-opencl-icd | opencl-icd")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "${IHA_DEBIAN_DRIVER}")
# The ldconfig trigger that Debian requires of a shared library package (CPack adds ldconfig
# calls to the maintainer scripts as well).
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/debian/runtime/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_BINARY_DIR}/debian/runtime/triggers)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "The shared library libiha.so.${PROJECT_VERSION_MAJOR}: the Interleaved Head Attention layer (forward,\nKV-cache decoding and backward) on any OpenCL 1.2 device, GPUs and CPUs\nthrough PoCL. License: Apache-2.0.")

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME libiha-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEVELOPMENT_DEPENDS runtime)
# The header includes CL/cl.h; the static library links CLBlast and cJSON.
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS "ocl-icd-opencl-dev | opencl-dev, opencl-c-headers, libclblast-dev, libcjson-dev")
set(CPACK_COMPONENT_DEVELOPMENT_DESCRIPTION
    "Development files: the headers iha.h, iha_tune.h, iha_measure.h and\niha_multi.h, the static library, the CMake package (find_package(iha), target\niha::iha) and the pkg-config file iha.pc.\nLicense: Apache-2.0.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME iha-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "${IHA_DEBIAN_DRIVER}")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "The iha command: devices, check, forward, demo, generate-check, bench, tune,\nprofile and soak, the library's self-test, benchmarks and tuning, with its\nmanual pages, iha(1) and one per command.\nLicense: Apache-2.0.")

if(IHA_MPI_FOUND)
  set(CPACK_DEBIAN_MPI_RUNTIME_PACKAGE_NAME libiha-mpi${PROJECT_VERSION_MAJOR})
  set(CPACK_COMPONENT_MPI_RUNTIME_DEPENDS runtime)
  set(CPACK_DEBIAN_MPI_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_BINARY_DIR}/debian/runtime/triggers)
  set(CPACK_DEBIAN_MPI_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)
  set(CPACK_COMPONENT_MPI_RUNTIME_DESCRIPTION
      "The shared library libiha_mpi.so.${PROJECT_VERSION_MAJOR}: Interleaved Head Attention and the\nwhole layer (forward and backward) with the sequence split over the ranks of\nan MPI communicator, on top of libiha. License: Apache-2.0.")

  set(CPACK_DEBIAN_MPI_DEVELOPMENT_PACKAGE_NAME libiha-mpi-dev)
  set(CPACK_DEBIAN_MPI_DEVELOPMENT_PACKAGE_SECTION libdevel)
  set(CPACK_COMPONENT_MPI_DEVELOPMENT_DEPENDS mpi_runtime development)
  # iha_mpi.h includes mpi.h: the development package of the MPI libiha_mpi was built with.
  if(MPI_C_HEADER_DIR MATCHES "openmpi")
    set(CPACK_DEBIAN_MPI_DEVELOPMENT_PACKAGE_DEPENDS "libopenmpi-dev")
  elseif(MPI_C_HEADER_DIR MATCHES "mpich")
    set(CPACK_DEBIAN_MPI_DEVELOPMENT_PACKAGE_DEPENDS "libmpich-dev")
  endif()
  set(CPACK_COMPONENT_MPI_DEVELOPMENT_DESCRIPTION
      "Development files of libiha_mpi: the header iha_mpi.h, libiha_mpi.so, the CMake\ntargets of find_package(iha COMPONENTS mpi) (iha::iha_mpi) and the pkg-config\nfile iha_mpi.pc.\nLicense: Apache-2.0.")

  set(CPACK_DEBIAN_MPI_TOOLS_PACKAGE_NAME iha-mpi-tools)
  set(CPACK_DEBIAN_MPI_TOOLS_PACKAGE_SECTION science)
  set(CPACK_COMPONENT_MPI_TOOLS_DEPENDS mpi_runtime)
  set(CPACK_COMPONENT_MPI_TOOLS_DESCRIPTION
      "The iha-mpi command, run under mpirun: bench (times ring attention over the\nranks) and forward (the layer over the ranks on .npy files).\nLicense: Apache-2.0.")
endif()

# Each package's changelog.gz, which Debian requires: it points to CHANGELOG.md's API changes.
find_program(IHA_GZIP gzip)
if(IHA_GZIP)
  string(TIMESTAMP _iha_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog
       "iha (${PROJECT_VERSION}) unstable; urgency=medium\n\n"
       "  * Packages of iha ${PROJECT_VERSION} built by CPack; the changes that users see are in\n"
       "    the source's CHANGELOG.md.\n\n"
       " -- ${IHA_PACKAGE_CONTACT}  ${_iha_date}\n")
  execute_process(COMMAND ${IHA_GZIP} -9nf ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog)
  set(_iha_doc_runtime libiha${PROJECT_VERSION_MAJOR})
  set(_iha_doc_development libiha-dev)
  set(_iha_doc_tools iha-tools)
  set(_iha_doc_mpi_runtime libiha-mpi${PROJECT_VERSION_MAJOR})
  set(_iha_doc_mpi_development libiha-mpi-dev)
  set(_iha_doc_mpi_tools iha-mpi-tools)
  foreach(_component IN LISTS CPACK_COMPONENTS_ALL)
    install(FILES ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog.gz
            DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${_iha_doc_${_component}} COMPONENT ${_component})
  endforeach()
endif()
include(CPack)
