# Outside dependencies, all from Debian's packages (see ops/install-deps.sh).
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(CapnProto REQUIRED)
find_package(RocksDB REQUIRED)
find_package(spdlog REQUIRED)
find_package(tomlplusplus REQUIRED)
# OpenSSL: TLS between nodes, HMAC for the token handshake, certificates (`ashlar cert`).
find_package(OpenSSL 3 REQUIRED)

# cpp-httplib serves /metrics. Debian builds it as a shared library; its .pc file carries
# the feature macros (TLS, zlib, brotli) the header must be compiled with.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

# CAF 0.17 ships neither a CMake config nor a .pc file: wrap it as imported targets.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
foreach(_lib core io)
  find_library(CAF_${_lib}_LIBRARY caf_${_lib} REQUIRED)
  add_library(caf::${_lib} SHARED IMPORTED)
  set_target_properties(caf::${_lib} PROPERTIES
    IMPORTED_LOCATION "${CAF_${_lib}_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
endforeach()
set_property(TARGET caf::core PROPERTY INTERFACE_LINK_LIBRARIES Threads::Threads)
set_property(TARGET caf::io PROPERTY INTERFACE_LINK_LIBRARIES caf::core)

# OpenBLAS: the CBLAS interface and openblas_set_num_threads.
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)
find_library(OPENBLAS_LIBRARY openblas REQUIRED)
add_library(openblas::openblas SHARED IMPORTED)
set_target_properties(openblas::openblas PROPERTIES
  IMPORTED_LOCATION "${OPENBLAS_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${OPENBLAS_INCLUDE_DIR}")

# oneDNN (Debian's libdnnl-dev, OpenMP threading): CPU convolutions, chosen per layer
# against im2col + OpenBLAS by measurement. OpenMP for the team size of its kernels.
# (Its CMake package drags in OpenCL for a GPU runtime Ashlar does not use.)
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(DNNL::dnnl SHARED IMPORTED)
set_target_properties(DNNL::dnnl PROPERTIES
  IMPORTED_LOCATION "${DNNL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
find_package(OpenMP REQUIRED COMPONENTS CXX)

# CLI11 is header-only (Debian ships no config for 2.1).
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
add_library(cli11::cli11 INTERFACE IMPORTED)
set_target_properties(cli11::cli11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CLI11_INCLUDE_DIR}")

if(ASHLAR_ENABLE_TESTS)
  find_package(Catch2 REQUIRED)
endif()

# CUDA: AUTO builds gpu/ when a toolkit is found, ON requires it, OFF skips it.
set(ASHLAR_HAVE_CUDA OFF)
if(NOT ASHLAR_ENABLE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit QUIET)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(ASHLAR_HAVE_CUDA ON)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Ampere and Hopper machine code, and PTX that later chips compile at load.
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
    endif()
    # Enabled here, at the top level, since every executable links gpu/'s objects.
    enable_language(CUDA)
  elseif(ASHLAR_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ASHLAR_ENABLE_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
message(STATUS "Ashlar: CUDA backend ${ASHLAR_HAVE_CUDA}")
