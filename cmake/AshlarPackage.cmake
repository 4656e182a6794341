# `cmake --install` of the embedding API: the static libraries, their headers under
# include/ashlar, and a package config, so a host application calls find_package(Ashlar)
# and links Ashlar::ashlar (tests/CMakeLists.txt builds apps/embed against an installed tree).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Ashlar::ashlar: everything a host links (the actors bring the runtime and the GPU backend).
add_library(ashlar_embed INTERFACE)
target_link_libraries(ashlar_embed INTERFACE ashlar_actors)
set_target_properties(ashlar_embed PROPERTIES EXPORT_NAME ashlar)
add_library(Ashlar::ashlar ALIAS ashlar_embed)
foreach(_t runtime actors gpu schema)
  set_target_properties(ashlar_${_t} PROPERTIES EXPORT_NAME ${_t})
  add_library(Ashlar::${_t} ALIAS ashlar_${_t})
endforeach()

install(TARGETS ashlar_embed ashlar_actors ashlar_runtime ashlar_gpu ashlar_schema
        EXPORT AshlarTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY runtime actors gpu DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ashlar
        FILES_MATCHING PATTERN "*.hpp")
set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/Ashlar)
install(EXPORT AshlarTargets NAMESPACE Ashlar:: DESTINATION ${_cmakedir})
configure_package_config_file(cmake/AshlarConfig.cmake.in ${PROJECT_BINARY_DIR}/AshlarConfig.cmake
                              INSTALL_DESTINATION ${_cmakedir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/AshlarConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/AshlarConfig.cmake ${PROJECT_BINARY_DIR}/AshlarConfigVersion.cmake
              cmake/AshlarLinkDependencies.cmake
        DESTINATION ${_cmakedir})
