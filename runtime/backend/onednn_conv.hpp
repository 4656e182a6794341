// A conv2d layer computed by oneDNN (the library PyTorch's CPU convolutions use): direct
// convolution kernels on oneDNN's blocked layouts, with reorders from and to the plain
// NCHW activations and OIHW weights the rest of the CPU backend keeps. The CPU backend
// times it against im2col + OpenBLAS per layer and keeps the faster (cpu_backend.cpp).
//
// oneDNN's headers stay in the .cpp: this header is cheap to include.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "runtime/model/model.hpp"

namespace ashlar::cpu {

class onednn_conv {
public:
  /// Throws std::runtime_error when oneDNN cannot compute this layer's shape.
  explicit onednn_conv(const plan_node& layer);
  ~onednn_conv();
  onednn_conv(const onednn_conv&) = delete;
  onednn_conv& operator=(const onednn_conv&) = delete;

  /// y = conv(x, w) + b over n samples (NCHW in, NCHW out). Keeps x in oneDNN's layout
  /// for the backward pass of the same batch.
  void forward(size_t n, const float* x, const float* w, const float* b, float* y);

  /// Writes dw and db; writes dx (or adds into it with `accumulate`) unless dx is null.
  /// `x` is the forward pass's input; reordered again unless it was the last forward's.
  void backward(size_t n, const float* x, const float* w, const float* dy, float* dw, float* db, float* dx,
                bool accumulate);

  /// oneDNN's kernel names for the primitives built so far, e.g. "jit:avx512_core".
  std::string kernels() const;

private:
  struct batch;
  batch& for_batch(size_t n);

  plan_node layer_;
  struct engine;
  std::unique_ptr<engine> engine_;
  std::map<size_t, std::unique_ptr<batch>> batches_; // by batch size
  const float* last_x_ = nullptr;
  size_t last_n_ = 0;
};

/// Sets the threads oneDNN's kernels use on the calling thread (the OpenMP team size).
void set_onednn_threads(int n);

}  // namespace ashlar::cpu
