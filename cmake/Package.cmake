# Debian packages through CPack (`cpack -G DEB` in the build directory), one per install
# component of cmake/Install.cmake: libiha0 (the shared library), libiha-dev (headers, static
# library, CMake package, pkg-config file) and iha-tools (the iha command). Their dependencies
# on other packages come from the binaries (dpkg-shlibdeps, in dpkg-dev).
set(CPACK_PACKAGE_NAME iha)
set(CPACK_PACKAGE_VENDOR "The iha authors")
set(CPACK_PACKAGE_CONTACT "The iha authors <iha@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Interleaved Head Attention on OpenCL")
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
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON) # a shlibs file, so packages built against libiha0 depend on it
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libiha${PROJECT_VERSION_MAJOR})
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "Interleaved Head Attention on OpenCL: shared library\n The iha library runs the Interleaved Head Attention layer (forward, KV-cache\n decoding and backward) on any OpenCL 1.2 device, GPUs and CPUs through PoCL.\n License: Apache-2.0.")

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME libiha-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEVELOPMENT_DEPENDS runtime)
# The header includes CL/cl.h; the static library links CLBlast and cJSON.
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS "ocl-icd-opencl-dev | opencl-dev, opencl-c-headers, libclblast-dev, libcjson-dev")
set(CPACK_COMPONENT_DEVELOPMENT_DESCRIPTION
    "Interleaved Head Attention on OpenCL: development files\n The header iha.h, the static library, the CMake package (find_package(iha),\n target iha::iha) and the pkg-config file iha.pc.\n License: Apache-2.0.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME iha-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "Interleaved Head Attention on OpenCL: the iha command\n iha devices, check, forward, demo, generate-check, bench, tune, profile and soak:\n the library's self-test, benchmarks and tuning from the command line.\n License: Apache-2.0.")
include(CPack)
