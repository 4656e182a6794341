// The CUDA compute backend: the compute_backend interface on one NVIDIA GPU, with
// cuBLAS SGEMM for dense and conv2d layers (im2col) and CUDA kernels for the rest: bias,
// ReLU, pooling, dropout, group norm, residual add, softmax cross-entropy. An MLP runs
// on a pipelined path whose transfers overlap its products; other models node by node.
//
// This header needs no CUDA: a build without the toolkit (ASHLAR_ENABLE_CUDA=OFF, or
// AUTO with none found) compiles gpu/no_cuda.cpp instead, where list_devices() says so
// and make_cuda_backend() fails with the reason, and everything runs on the CPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/core/error.hpp"
#include "runtime/model/mlp.hpp"

namespace ashlar::gpu {

/// Whether this build has the CUDA backend.
bool built_with_cuda();

struct device_info {
  int index = 0;
  std::string name;
  size_t memory = 0; // bytes
  int major = 0, minor = 0; // compute capability
  int multiprocessors = 0;
};

/// The CUDA devices this process can use. An error (device_error) says why there are
/// none: a build without CUDA, no driver, no device.
[[nodiscard]] expected<std::vector<device_info>> list_devices();

struct cuda_options {
  /// Let cuBLAS use TF32 tensor cores for the float32 products (about 1e-3 relative
  /// error instead of float32's 1e-6; much faster on Ampere and later).
  bool tf32 = false;
  /// Parameters travel to the device, and gradients back, in pieces of at most this many
  /// floats (a layer's rows of output units), each overlapping the products on the pieces
  /// before it. 4M floats: a 4096-wide layer's 64 MB of weights in 4 pieces.
  size_t piece_floats = size_t{1} << 22;
  /// Dropout masks: 0 draws a stream of the backend's own; a CPU backend made with the
  /// same seed (make_cpu_backend) drops the same entries, step for step.
  uint64_t seed = 0;
};

/// A backend owning `device`: its stream, cuBLAS handle, device buffers and pinned
/// host buffers. Not thread-safe: one caller at a time (the GPU actor serializes).
[[nodiscard]] expected<std::unique_ptr<compute_backend>> make_cuda_backend(const mlp_spec& spec, int device,
                                                                           cuda_options options = {});

/// Same for any model of runtime/model/model.hpp: an MLP (the short form, or layers that
/// are exactly one) takes the pipelined MLP path, every other model the layer-by-layer
/// one. Fails with invalid_config if the model does not compile and with unknown_name if
/// it has an external layer (only its host application's backend computes those).
[[nodiscard]] expected<std::unique_ptr<compute_backend>> make_cuda_backend(const model_spec& spec, int device,
                                                                           cuda_options options = {});

/// Page-locks `bytes` of host memory at `p` (cudaHostRegister) until the returned handle
/// is dropped, so that transfers from and to it go straight to the device. Null when it
/// cannot be locked (no CUDA device, the process's limit on locked memory): transfers
/// then stage through the backend's pinned buffers. `p` must outlive the handle.
std::shared_ptr<void> lock_host(void* p, size_t bytes);

}  // namespace ashlar::gpu
