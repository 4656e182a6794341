// The CUDA backend as a module loaded on first use (internal to gpu/). CUDA's libraries
// cost every process that links them about 150 MB of resident memory at start (cuBLASLt's
// static tables), GPU or not; so the backend and CUDA's libraries live in
// libashlar_cuda.so, which gpu/cuda_loader.cpp opens with dlopen the first time a process
// asks for a device. A CPU-only scheduler, server or worker node never maps them.
//
// The module exports one C function, ashlar_cuda_module, that returns this table. The
// module and its loader are built from the same tree; `abi` tells a module of another
// build apart.
#pragma once

#include <cstdint>

#include "gpu/bench_timers.hpp"
#include "gpu/cuda_backend.hpp"

namespace ashlar::gpu::detail {

/// Bumped whenever this table or a type that crosses it changes.
constexpr uint32_t cuda_module_abi = 1;

struct cuda_module {
  uint32_t abi = cuda_module_abi;
  expected<std::vector<device_info>> (*list_devices)();
  expected<std::unique_ptr<compute_backend>> (*make_mlp_backend)(const mlp_spec&, int, cuda_options);
  expected<std::unique_ptr<compute_backend>> (*make_model_backend)(const model_spec&, int, cuda_options);
  std::shared_ptr<void> (*lock_host)(void*, size_t);
  expected<double> (*time_step_compute)(const mlp_spec&, size_t, int, cuda_options, int);
  expected<transfer_rates> (*time_transfers)(size_t, int, int);
  expected<double> (*time_gemms)(const std::vector<gemm_shape>&, int, bool, int);
};

}  // namespace ashlar::gpu::detail

/// The module's one entry point (extern "C", so dlsym finds it by this name).
extern "C" const ashlar::gpu::detail::cuda_module* ashlar_cuda_module();
