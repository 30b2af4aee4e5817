# Install rules: the libraries, the public headers, the iha command and its manual pages, the CMake package (find_package(iha),
# target iha::iha) and iha.pc for pkg-config. The components are the Debian packages of
# cmake/Package.cmake: runtime (libiha0), development (libiha-dev), tools (iha-tools). When
# libiha_mpi is built, three more: mpi_runtime (libiha-mpi0), mpi_development (libiha-mpi-dev:
# iha_mpi.h, the targets of find_package(iha COMPONENTS mpi), iha_mpi.pc) and mpi_tools
# (iha-mpi-tools), so that nothing of libiha's own needs MPI.
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
  # The documents that the command's help cites (doc/NAME.md), beside its manual pages.
  install(FILES doc/cli.md doc/spec.md doc/benchmarking.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/iha-tools
          COMPONENT tools)
  if(IHA_MAN_DIR)
    install(DIRECTORY ${IHA_MAN_DIR}/ DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT tools FILES_MATCHING PATTERN "*.1.gz")
  endif()
endif()
# libiha_mpi's own export set: ihaConfig.cmake includes it, and looks for MPI, only when the
# application asks for the component mpi. Its targets refer to libiha's (iha::iha_shared).
if(IHA_MPI_FOUND)
  install(TARGETS iha_mpi EXPORT ihaMpiTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT mpi_runtime NAMELINK_SKIP)
  install(TARGETS iha_mpi EXPORT ihaMpiTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT mpi_development NAMELINK_ONLY)
  install(EXPORT ihaMpiTargets NAMESPACE iha:: DESTINATION ${IHA_CMAKE_DIR} COMPONENT mpi_development)
  install(FILES include/iha_mpi.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT mpi_development)
  if(TARGET iha_mpi_cli)
    install(TARGETS iha_mpi_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT mpi_tools)
    if(IHA_MPI_MAN_DIR)
      install(DIRECTORY ${IHA_MPI_MAN_DIR}/ DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT mpi_tools
              FILES_MATCHING PATTERN "*.1.gz")
    endif()
  endif()
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
set(_iha_pc_files iha)
set(_iha_pc_component_iha development)
if(IHA_MPI_FOUND)
  # iha_mpi.h includes mpi.h and the application calls MPI itself, so MPI's flags are in
  # Requires: the pkg-config module of the MPI that CMake found (Open MPI's ompi-c, MPICH's
  # mpich), recognized by its header directory; without one, that MPI's directories and
  # libraries are written out.
  set(IHA_MPI_PC_REQUIRES "")
  set(IHA_MPI_PC_CFLAGS "")
  set(IHA_MPI_PC_LIBS "")
  foreach(_module ompi-c mpich)
    pkg_check_modules(_IHA_MPI_PC_${_module} QUIET ${_module})
    if(_IHA_MPI_PC_${_module}_FOUND AND MPI_C_HEADER_DIR IN_LIST _IHA_MPI_PC_${_module}_INCLUDE_DIRS)
      set(IHA_MPI_PC_REQUIRES " ${_module}")
      break()
    endif()
  endforeach()
  if(NOT IHA_MPI_PC_REQUIRES)
    foreach(_dir IN LISTS MPI_C_INCLUDE_DIRS)
      string(APPEND IHA_MPI_PC_CFLAGS " -I${_dir}")
    endforeach()
    foreach(_lib IN LISTS MPI_C_LIBRARIES)
      string(APPEND IHA_MPI_PC_LIBS " ${_lib}")
    endforeach()
  endif()
  list(APPEND _iha_pc_files iha_mpi)
  set(_iha_pc_component_iha_mpi mpi_development)
endif()
foreach(_pc IN LISTS _iha_pc_files)
  configure_file(cmake/${_pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${_pc}.pc.in @ONLY)
  install(CODE "
    file(READ \"${CMAKE_CURRENT_BINARY_DIR}/${_pc}.pc.in\" _iha_pc)
    string(REPLACE \"@IHA_PC_PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\" _iha_pc \"\${_iha_pc}\")
    file(WRITE \"${CMAKE_CURRENT_BINARY_DIR}/${_pc}.pc\" \"\${_iha_pc}\")" COMPONENT ${_iha_pc_component_${_pc}})
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${_pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
          COMPONENT ${_iha_pc_component_${_pc}})
endforeach()

# The license: in each package's copyright file (Debian's machine-readable format, which points
# to the system's copy of the license's text), under share/doc as Debian places it.
install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libiha${PROJECT_VERSION_MAJOR}
        RENAME copyright COMPONENT runtime)
install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libiha-dev RENAME copyright
        COMPONENT development)
if(IHA_BUILD_TOOLS)
  install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/iha-tools RENAME copyright
          COMPONENT tools)
endif()
if(IHA_MPI_FOUND)
  install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libiha-mpi${PROJECT_VERSION_MAJOR}
          RENAME copyright COMPONENT mpi_runtime)
  install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libiha-mpi-dev RENAME copyright
          COMPONENT mpi_development)
  if(TARGET iha_mpi_cli)
    install(FILES cmake/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/iha-mpi-tools RENAME copyright
            COMPONENT mpi_tools)
  endif()
endif()
