# Outside dependencies, all from Debian's packages (see ops/install-deps.sh).
# What a program linking Ashlar's libraries needs: shared with the installed package
# config (AshlarConfig.cmake), which finds the same packages for a host application.
include(${CMAKE_CURRENT_LIST_DIR}/AshlarLinkDependencies.cmake)

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
