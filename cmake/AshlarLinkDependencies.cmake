# The packages Ashlar's libraries link, as targets: included by the build
# (AshlarDependencies.cmake) and by the installed package config (AshlarConfig.cmake), so a
# host application that calls find_package(Ashlar) gets the same targets. Each imported
# target is defined once, whoever includes this first.

# ashlar_imported_library(TARGET LIBRARY INCLUDE_DIR): a shared library found by hand, as a target.
function(ashlar_imported_library target library include_dir)
  if(NOT TARGET ${target})
    add_library(${target} SHARED IMPORTED)
    set_target_properties(${target} PROPERTIES IMPORTED_LOCATION "${library}"
                          INTERFACE_INCLUDE_DIRECTORIES "${include_dir}")
  endif()
endfunction()

find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(CapnProto REQUIRED)
find_package(RocksDB REQUIRED)
find_package(spdlog REQUIRED)
find_package(tomlplusplus REQUIRED)
# OpenSSL: TLS between nodes, HMAC for the token handshake, certificates (`ashlar cert`).
find_package(OpenSSL 3 REQUIRED)

# CAF 0.17 ships neither a CMake config nor a .pc file: wrap it as imported targets.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
foreach(_lib core io)
  find_library(CAF_${_lib}_LIBRARY caf_${_lib} REQUIRED)
  ashlar_imported_library(caf::${_lib} "${CAF_${_lib}_LIBRARY}" "${CAF_INCLUDE_DIR}")
endforeach()
set_property(TARGET caf::core PROPERTY INTERFACE_LINK_LIBRARIES Threads::Threads)
set_property(TARGET caf::io PROPERTY INTERFACE_LINK_LIBRARIES caf::core)

# OpenBLAS: the CBLAS interface and openblas_set_num_threads.
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)
find_library(OPENBLAS_LIBRARY openblas REQUIRED)
ashlar_imported_library(openblas::openblas "${OPENBLAS_LIBRARY}" "${OPENBLAS_INCLUDE_DIR}")

# oneDNN (Debian's libdnnl-dev, OpenMP threading): CPU convolutions, chosen per layer
# against im2col + OpenBLAS by measurement. OpenMP for the team size of its kernels.
# (Its CMake package drags in OpenCL for a GPU runtime Ashlar does not use.)
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
ashlar_imported_library(DNNL::dnnl "${DNNL_LIBRARY}" "${DNNL_INCLUDE_DIR}")
find_package(OpenMP REQUIRED COMPONENTS CXX)
