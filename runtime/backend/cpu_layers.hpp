// The CPU kernels of each layer kind, on batches of samples in NCHW order: pure functions
// over caller-owned buffers (no allocation but `scratch`), so each is checked on its own
// against finite differences. Products go through OpenBLAS (im2col + GEMM for conv2d).
//
// Conventions: `x` is the layer's input [n x in.size()], `y` its output [n x out.size()],
// `dy` the loss's gradient with respect to y, `dx` with respect to x. Backward functions
// WRITE the parameter gradients (dw, db) of their own layer and write dx, or ADD into it
// with `accumulate` (a layer's output may feed several layers: the first to deliver its
// gradient writes, the others add).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/model/model.hpp"

namespace ashlar::cpu {

/// y = x W^T + b.
void dense_forward(const plan_node& l, size_t n, const float* x, const float* w, const float* b, float* y);
/// dw = dy^T x, db = column sums of dy, dx (+)= dy W (dx may be null: not wanted).
void dense_backward(const plan_node& l, size_t n, const float* x, const float* w, const float* dy, float* dw,
                    float* db, float* dx, bool accumulate);

/// Convolution (cross-correlation, as every framework computes it) with zero padding.
/// `scratch` grows to the im2col buffer of one sample.
void conv2d_forward(const plan_node& l, size_t n, const float* x, const float* w, const float* b, float* y,
                    std::vector<float>& scratch);
void conv2d_backward(const plan_node& l, size_t n, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, bool accumulate, std::vector<float>& scratch);

/// Max pooling; `argmax` (n x out.size() entries) records the winning input offset within
/// the sample, for backward. Padding never wins.
void maxpool_forward(const plan_node& l, size_t n, const float* x, float* y, uint32_t* argmax);
void maxpool_backward(const plan_node& l, size_t n, const uint32_t* argmax, const float* dy, float* dx,
                      bool accumulate);

/// Average pooling; the divisor is kernel x kernel, padding included.
void avgpool_forward(const plan_node& l, size_t n, const float* x, float* y);
void avgpool_backward(const plan_node& l, size_t n, const float* dy, float* dx, bool accumulate);

void relu_forward(size_t count, const float* x, float* y);
/// dx (+)= dy where y > 0.
void relu_backward(size_t count, const float* y, const float* dy, float* dx, bool accumulate);

/// Inverted dropout: y = x * mask, mask 0 or 1/(1-p), drawn from (seed, element index)
/// so the same seed gives the same mask.
void dropout_forward(const plan_node& l, size_t count, const float* x, float* y, float* mask, uint64_t seed);
void dropout_backward(size_t count, const float* mask, const float* dy, float* dx, bool accumulate);
/// dx (+)= dy: the gradient through an identity.
void pass_backward(size_t count, const float* dy, float* dx, bool accumulate);

/// Group normalization per sample: groups of in.c / groups channels, normalized to mean
/// 0 and variance 1 (biased variance plus eps), then y = gamma * xhat + beta per channel.
/// `stats` holds mean and 1/sigma per (sample, group): 2 * n * groups floats.
void groupnorm_forward(const plan_node& l, size_t n, const float* x, const float* gamma, const float* beta,
                       float* y, float* stats);
void groupnorm_backward(const plan_node& l, size_t n, const float* x, const float* gamma, const float* stats,
                        const float* dy, float* dgamma, float* dbeta, float* dx, bool accumulate);

}  // namespace ashlar::cpu
