// Launchers for the CUDA kernels of the layer kinds other than dense (gpu/layer_kernels.cu),
// on batches in NCHW order, mirroring runtime/backend/cpu_layers.hpp: `x` a layer's
// input, `y` its output, `dy`/`dx` their gradients. Backward launchers WRITE dx, or ADD
// into it with `accumulate`. Every launch is asynchronous on `stream`; the caller checks
// cudaGetLastError() after it. Gradients are gathered per input element (no atomics), so
// a step's result does not depend on thread timing.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ashlar::gpu {

/// One layer's spatial geometry: input c x h x w, output oc x oh x ow, square kernel k,
/// stride s, zero padding p (pools: oc == c).
struct geometry {
  uint32_t c = 1, h = 1, w = 1;
  uint32_t oc = 1, oh = 1, ow = 1;
  uint32_t k = 1, s = 1, p = 0;
};

/// Unfolds `g` samples of x into col [c*k*k rows x g*oh*ow columns], row-major: row
/// (ci, ky, kx), column (sample, oy, ox) holds x[ci, oy*s-p+ky, ox*s-p+kx] or 0.
void launch_im2col(const geometry& l, size_t g, const float* x, float* col, cudaStream_t stream);
/// The adjoint of im2col: dx[sample] (+)= every col entry that was read from it.
void launch_col2im(const geometry& l, size_t g, const float* dcol, float* dx, bool accumulate, cudaStream_t stream);
/// y[sample][c][pix] = out[c][sample*P + pix] + bias[c] for `g` samples (P = oh*ow).
void launch_conv_bias_scatter(const geometry& l, size_t g, const float* out, const float* bias, float* y,
                              cudaStream_t stream);
/// dout[c][sample*P + pix] = dy[sample][c][pix] for `g` samples.
void launch_conv_gather(const geometry& l, size_t g, const float* dy, float* dout, cudaStream_t stream);
/// db[c] = the sum of dy over every sample and pixel of channel c (n samples).
void launch_channel_sums(const geometry& l, size_t n, const float* dy, float* db, cudaStream_t stream);

/// Max pooling; argmax[o] is the winning input offset within the sample (the first of
/// equal values in window order; padding never wins).
void launch_maxpool_forward(const geometry& l, size_t n, const float* x, float* y, uint32_t* argmax,
                            cudaStream_t stream);
void launch_maxpool_backward(const geometry& l, size_t n, const uint32_t* argmax, const float* dy, float* dx,
                             bool accumulate, cudaStream_t stream);
/// Average pooling; the divisor is k x k, padding included.
void launch_avgpool_forward(const geometry& l, size_t n, const float* x, float* y, cudaStream_t stream);
void launch_avgpool_backward(const geometry& l, size_t n, const float* dy, float* dx, bool accumulate,
                             cudaStream_t stream);

void launch_relu_forward(size_t count, const float* x, float* y, cudaStream_t stream);
/// dx (+)= dy where y > 0.
void launch_relu_backward(size_t count, const float* y, const float* dy, float* dx, bool accumulate,
                          cudaStream_t stream);
/// Inverted dropout with the CPU backend's mask for the same seed: entry i is dropped when
/// splitmix64(splitmix64(seed) + i) >> 11 is below `threshold` (p scaled to 2^53), else
/// scaled by `keep` (1 / (1 - p)); `mask` holds 0 or keep.
void launch_dropout_forward(size_t count, uint64_t threshold, float keep, uint64_t seed, const float* x, float* y,
                            float* mask, cudaStream_t stream);
/// dx (+)= dy * m (m null: dx (+)= dy).
void launch_scale_backward(size_t count, const float* m, const float* dy, float* dx, bool accumulate,
                           cudaStream_t stream);
/// y = a + b.
void launch_add(size_t count, const float* a, const float* b, float* y, cudaStream_t stream);

/// Group normalization of n samples of c channels of hw values in `groups` groups;
/// stats holds mean and 1/sigma per (sample, group).
void launch_groupnorm_forward(size_t n, uint32_t c, size_t hw, uint32_t groups, double eps, const float* x,
                              const float* gamma, const float* beta, float* y, float* stats, cudaStream_t stream);
/// dgamma, dbeta (written) and dx ((+)=, unless null); `partial` is scratch of 2 * n * c floats.
void launch_groupnorm_backward(size_t n, uint32_t c, size_t hw, uint32_t groups, const float* x, const float* gamma,
                               const float* stats, const float* dy, float* partial, float* dgamma, float* dbeta,
                               float* dx, bool accumulate, cudaStream_t stream);

}  // namespace ashlar::gpu
