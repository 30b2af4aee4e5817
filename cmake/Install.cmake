# Install rules: the libraries, the public headers, the iha command, the CMake package (find_package(iha),
# target iha::iha) and iha.pc for pkg-config. The components are the Debian packages of
# cmake/Package.cmake: runtime (libiha0), development (libiha-dev), tools (iha-tools).
include(CMakePackageConfigHelpers)
set(IHA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/iha)

# Two export sets: the shared library's needs only OpenCL in the application, the static
# library's also needs the private dependencies, which ihaConfig.cmake looks for only when the
# application asks for the static library.
if(IHA_BUILD_SHARED)
  set_target_properties(iha_shared PROPERTIES EXPORT_NAME iha_shared)
  install(TARGETS iha_shared EXPORT ihaSharedTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_SKIP)
  # The unversioned libiha.so is for linking, so it belongs to the development package.
  install(TARGETS iha_shared EXPORT ihaSharedTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development NAMELINK_ONLY)
  install(EXPORT ihaSharedTargets NAMESPACE iha:: DESTINATION ${IHA_CMAKE_DIR} COMPONENT development)
endif()
set_target_properties(iha PROPERTIES EXPORT_NAME iha_static)
install(TARGETS iha EXPORT ihaStaticTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
install(EXPORT ihaStaticTargets NAMESPACE iha:: DESTINATION ${IHA_CMAKE_DIR} COMPONENT development)
install(FILES include/iha.h include/iha_tune.h include/iha_measure.h include/iha_multi.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
if(IHA_BUILD_TOOLS)
  install(TARGETS iha_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()

configure_package_config_file(cmake/ihaConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/ihaConfig.cmake
                              INSTALL_DESTINATION ${IHA_CMAKE_DIR})
# 0.x: a minor version may break the API (doc/abi.md), so only the same minor version matches.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_iha_compatibility SameMinorVersion)
else()
  set(_iha_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ihaConfigVersion.cmake
                                 COMPATIBILITY ${_iha_compatibility})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ihaConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ihaConfigVersion.cmake
        DESTINATION ${IHA_CMAKE_DIR} COMPONENT development)

# iha.pc names the prefix given at install time (cmake --install --prefix, or CPack's /usr), and
# the other paths relative to it.
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(IHA_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(IHA_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
set(IHA_PC_PREFIX "@IHA_PC_PREFIX@") # left for the install step
configure_file(cmake/iha.pc.in ${CMAKE_CURRENT_BINARY_DIR}/iha.pc.in @ONLY)
install(CODE "
  file(READ \"${CMAKE_CURRENT_BINARY_DIR}/iha.pc.in\" _iha_pc)
  string(REPLACE \"@IHA_PC_PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\" _iha_pc \"\${_iha_pc}\")
  file(WRITE \"${CMAKE_CURRENT_BINARY_DIR}/iha.pc\" \"\${_iha_pc}\")" COMPONENT development)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/iha.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)

# The license: beside the CMake package, and in each Debian package's copyright file (Debian's
# machine-readable format, which points to the system's copy of the license's text).
install(FILES LICENSE DESTINATION ${IHA_CMAKE_DIR} COMPONENT development)
install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libiha${PROJECT_VERSION_MAJOR}
        RENAME copyright COMPONENT runtime)
install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libiha-dev RENAME copyright
        COMPONENT development)
if(IHA_BUILD_TOOLS)
  install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/iha-tools RENAME copyright
          COMPONENT tools)
endif()
