# Debian packages through CPack (`cpack -G DEB` in the build directory), one per install
# component of cmake/Install.cmake: libiha0 (the shared library), libiha-dev (headers, static
# library, CMake package, pkg-config file) and iha-tools (the iha command). Their dependencies
# on other packages come from the binaries (dpkg-shlibdeps, in dpkg-dev).
set(CPACK_PACKAGE_NAME iha)
set(CPACK_PACKAGE_VENDOR "The iha authors")
# Whoever publishes the packages names themselves here; the default is a placeholder.
set(IHA_PACKAGE_CONTACT "The iha authors <iha@example.org>" CACHE STRING "Maintainer of the Debian packages")
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

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # name_version_arch.deb
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON) # packages built against libiha0 depend on this version or later
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libiha${PROJECT_VERSION_MAJOR})
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
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "The iha command: devices, check, forward, demo, generate-check, bench, tune,\nprofile and soak, the library's self-test, benchmarks and tuning.\nLicense: Apache-2.0.")

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
  foreach(_component IN LISTS CPACK_COMPONENTS_ALL)
    install(FILES ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog.gz
            DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${_iha_doc_${_component}} COMPONENT ${_component})
  endforeach()
endif()
include(CPack)
