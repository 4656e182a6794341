// The CUDA kernels of conv2d (im2col and its adjoint around cuBLAS products), pooling,
// ReLU, dropout, residual add and group normalization. Each mirrors the CPU kernel of
// runtime/backend/cpu_layers.cpp; gradients are gathered per input element, so no two
// threads write one value and the results do not depend on timing.
#include "gpu/layer_kernels.hpp"

#include "gpu/launch.cuh"

namespace ashlar::gpu {
namespace {

// SplitMix64, as the CPU backend's dropout draws its masks.
__device__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. Safe to call several times in a row.
__device__ double block_sum(double v) {
  __shared__ double partial[32];
  for (int off = 16; off > 0; off /= 2)
    v += __shfl_down_sync(0xffffffffu, v, off);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0)
    partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? partial[lane] : 0.0;
    for (int off = 16; off > 0; off /= 2)
      v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0)
      partial[0] = v;
  }
  __syncthreads();
  const double total = partial[0];
  __syncthreads();
  return total;
}

// The output rows (or columns) whose window covers input row `i`: [lo, hi], empty when lo > hi.
__device__ void covering(int i, const geometry& l, int outs, int& lo, int& hi) {
  const int k = static_cast<int>(l.k), s = static_cast<int>(l.s), p = static_cast<int>(l.p);
  const int first = i + p - k + 1; // smallest o*s
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = (i + p) / s;
  if (hi > outs - 1)
    hi = outs - 1;
}

__global__ void im2col(geometry l, size_t g, const float* __restrict__ x, float* __restrict__ col) {
  const size_t P = size_t{l.oh} * l.ow, cols = g * P, K = size_t{l.c} * l.k * l.k;
  ASHLAR_GRID_LOOP(i, K * cols) {
    const size_t r = i / cols, j = i % cols;
    const size_t s = j / P, pix = j % P;
    const int oy = static_cast<int>(pix / l.ow), ox = static_cast<int>(pix % l.ow);
    const int ci = static_cast<int>(r / (l.k * l.k)), ky = static_cast<int>((r / l.k) % l.k),
              kx = static_cast<int>(r % l.k);
    const int iy = oy * static_cast<int>(l.s) + ky - static_cast<int>(l.p);
    const int ix = ox * static_cast<int>(l.s) + kx - static_cast<int>(l.p);
    float v = 0.0f;
    if (iy >= 0 && iy < static_cast<int>(l.h) && ix >= 0 && ix < static_cast<int>(l.w))
      v = x[s * (size_t{l.c} * l.h * l.w) + (size_t(ci) * l.h + iy) * l.w + ix];
    col[i] = v;
  }
}

__global__ void col2im(geometry l, size_t g, const float* __restrict__ dcol, float* __restrict__ dx,
                       bool accumulate) {
  const size_t P = size_t{l.oh} * l.ow, cols = g * P, plane = size_t{l.h} * l.w, per = l.c * plane;
  ASHLAR_GRID_LOOP(i, g * per) {
    const size_t s = i / per, rem = i % per;
    const int ci = static_cast<int>(rem / plane);
    const int iy = static_cast<int>((rem % plane) / l.w), ix = static_cast<int>(rem % l.w);
    int oy_lo, oy_hi, ox_lo, ox_hi;
    covering(iy, l, static_cast<int>(l.oh), oy_lo, oy_hi);
    covering(ix, l, static_cast<int>(l.ow), ox_lo, ox_hi);
    float v = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
      const int ky = iy + static_cast<int>(l.p) - oy * static_cast<int>(l.s);
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const int kx = ix + static_cast<int>(l.p) - ox * static_cast<int>(l.s);
        const size_t r = (size_t(ci) * l.k + ky) * l.k + kx;
        v += dcol[r * cols + s * P + size_t(oy) * l.ow + ox];
      }
    }
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

__global__ void conv_bias_scatter(geometry l, size_t g, const float* __restrict__ out,
                                  const float* __restrict__ bias, float* __restrict__ y) {
  const size_t P = size_t{l.oh} * l.ow, per = l.oc * P;
  ASHLAR_GRID_LOOP(i, g * per) {
    const size_t s = i / per, c = (i % per) / P, pix = i % P;
    y[i] = out[c * g * P + s * P + pix] + bias[c];
  }
}

__global__ void conv_gather(geometry l, size_t g, const float* __restrict__ dy, float* __restrict__ dout) {
  const size_t P = size_t{l.oh} * l.ow, per = l.oc * P;
  ASHLAR_GRID_LOOP(i, g * per) {
    const size_t s = i / per, c = (i % per) / P, pix = i % P;
    dout[c * g * P + s * P + pix] = dy[i];
  }
}

// One block per channel.
__global__ void channel_sums(geometry l, size_t n, const float* __restrict__ dy, float* __restrict__ db) {
  const size_t P = size_t{l.oh} * l.ow, c = blockIdx.x;
  double v = 0;
  for (size_t j = threadIdx.x; j < n * P; j += blockDim.x)
    v += dy[(j / P) * l.oc * P + c * P + j % P];
  v = block_sum(v);
  if (threadIdx.x == 0)
    db[c] = static_cast<float>(v);
}

__global__ void maxpool_forward(geometry l, size_t n, const float* __restrict__ x, float* __restrict__ y,
                                uint32_t* __restrict__ argmax) {
  const size_t oplane = size_t{l.oh} * l.ow, plane = size_t{l.h} * l.w;
  ASHLAR_GRID_LOOP(o, n * l.c * oplane) {
    const size_t sc = o / oplane; // sample * c + channel
    const uint32_t c = static_cast<uint32_t>(sc % l.c);
    const int oy = static_cast<int>((o % oplane) / l.ow), ox = static_cast<int>(o % l.ow);
    const float* xc = x + sc * plane;
    float best = 0.0f;
    uint32_t where = 0;
    bool any = false;
    for (int ky = 0; ky < static_cast<int>(l.k); ++ky) {
      const int iy = oy * static_cast<int>(l.s) + ky - static_cast<int>(l.p);
      if (iy < 0 || iy >= static_cast<int>(l.h))
        continue;
      for (int kx = 0; kx < static_cast<int>(l.k); ++kx) {
        const int ix = ox * static_cast<int>(l.s) + kx - static_cast<int>(l.p);
        if (ix < 0 || ix >= static_cast<int>(l.w))
          continue;
        const uint32_t off = static_cast<uint32_t>(iy) * l.w + static_cast<uint32_t>(ix);
        if (!any || xc[off] > best) {
          best = xc[off];
          where = off;
          any = true;
        }
      }
    }
    y[o] = best;
    argmax[o] = c * static_cast<uint32_t>(plane) + where;
  }
}

template <bool Max>
__global__ void pool_backward(geometry l, size_t n, const uint32_t* __restrict__ argmax,
                              const float* __restrict__ dy, float* __restrict__ dx, bool accumulate) {
  const size_t oplane = size_t{l.oh} * l.ow, plane = size_t{l.h} * l.w;
  const float inv = 1.0f / static_cast<float>(l.k * l.k);
  ASHLAR_GRID_LOOP(i, n * l.c * plane) {
    const size_t sc = i / plane;
    const uint32_t c = static_cast<uint32_t>(sc % l.c);
    const int iy = static_cast<int>((i % plane) / l.w), ix = static_cast<int>(i % l.w);
    const uint32_t self = c * static_cast<uint32_t>(plane) + static_cast<uint32_t>(i % plane);
    int oy_lo, oy_hi, ox_lo, ox_hi;
    covering(iy, l, static_cast<int>(l.oh), oy_lo, oy_hi);
    covering(ix, l, static_cast<int>(l.ow), ox_lo, ox_hi);
    float v = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; ++oy)
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const size_t o = sc * oplane + size_t(oy) * l.ow + ox;
        if (Max) {
          if (argmax[o] == self)
            v += dy[o];
        } else {
          v += dy[o] * inv;
        }
      }
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

__global__ void avgpool_forward(geometry l, size_t n, const float* __restrict__ x, float* __restrict__ y) {
  const size_t oplane = size_t{l.oh} * l.ow, plane = size_t{l.h} * l.w;
  const float inv = 1.0f / static_cast<float>(l.k * l.k);
  ASHLAR_GRID_LOOP(o, n * l.c * oplane) {
    const size_t sc = o / oplane;
    const int oy = static_cast<int>((o % oplane) / l.ow), ox = static_cast<int>(o % l.ow);
    const float* xc = x + sc * plane;
    float acc = 0.0f;
    for (int ky = 0; ky < static_cast<int>(l.k); ++ky) {
      const int iy = oy * static_cast<int>(l.s) + ky - static_cast<int>(l.p);
      if (iy < 0 || iy >= static_cast<int>(l.h))
        continue;
      for (int kx = 0; kx < static_cast<int>(l.k); ++kx) {
        const int ix = ox * static_cast<int>(l.s) + kx - static_cast<int>(l.p);
        if (ix >= 0 && ix < static_cast<int>(l.w))
          acc += xc[iy * l.w + ix];
      }
    }
    y[o] = acc * inv;
  }
}

__global__ void relu_forward(size_t count, const float* __restrict__ x, float* __restrict__ y) {
  ASHLAR_GRID_LOOP(i, count)
  y[i] = fmaxf(x[i], 0.0f);
}

__global__ void relu_backward(size_t count, const float* __restrict__ y, const float* __restrict__ dy,
                              float* __restrict__ dx, bool accumulate) {
  ASHLAR_GRID_LOOP(i, count) {
    const float v = y[i] > 0.0f ? dy[i] : 0.0f;
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

__global__ void dropout_forward(size_t count, uint64_t threshold, float keep, uint64_t seed,
                                const float* __restrict__ x, float* __restrict__ y, float* __restrict__ mask) {
  const uint64_t base = mix(seed);
  ASHLAR_GRID_LOOP(i, count) {
    const bool dropped = (mix(base + i) >> 11) < threshold;
    mask[i] = dropped ? 0.0f : keep;
    y[i] = x[i] * mask[i];
  }
}

__global__ void scale_backward(size_t count, const float* __restrict__ m, const float* __restrict__ dy,
                               float* __restrict__ dx, bool accumulate) {
  ASHLAR_GRID_LOOP(i, count) {
    const float v = m ? dy[i] * m[i] : dy[i];
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

__global__ void add(size_t count, const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y) {
  ASHLAR_GRID_LOOP(i, count)
  y[i] = a[i] + b[i];
}

// One block per (sample, group).
__global__ void groupnorm_forward(uint32_t c, size_t hw, uint32_t groups, double eps, const float* __restrict__ x,
                                  const float* __restrict__ gamma, const float* __restrict__ beta,
                                  float* __restrict__ y, float* __restrict__ stats) {
  const size_t s = blockIdx.x / groups, g = blockIdx.x % groups, cg = c / groups, m = cg * hw;
  const size_t base = s * c * hw + g * m;
  double sum = 0;
  for (size_t i = threadIdx.x; i < m; i += blockDim.x)
    sum += x[base + i];
  const double mean = block_sum(sum) / static_cast<double>(m);
  double sq = 0;
  for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
    const double d = x[base + i] - mean;
    sq += d * d;
  }
  const double rstd = 1.0 / sqrt(block_sum(sq) / static_cast<double>(m) + eps);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = static_cast<float>(mean);
    stats[2 * blockIdx.x + 1] = static_cast<float>(rstd);
  }
  for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
    const size_t ch = g * cg + i / hw;
    const float a = static_cast<float>(gamma[ch] * rstd);
    const float b = static_cast<float>(beta[ch] - gamma[ch] * rstd * mean);
    y[base + i] = a * x[base + i] + b;
  }
}

// One block per (sample, group): per-channel sums into `partial`, and dx.
__global__ void groupnorm_backward(uint32_t c, size_t hw, uint32_t groups, const float* __restrict__ x,
                                   const float* __restrict__ gamma, const float* __restrict__ stats,
                                   const float* __restrict__ dy, float* __restrict__ partial, float* __restrict__ dx,
                                   bool accumulate) {
  const size_t s = blockIdx.x / groups, g = blockIdx.x % groups, cg = c / groups, m = cg * hw;
  const size_t base = s * c * hw + g * m;
  const double mean = stats[2 * blockIdx.x], rstd = stats[2 * blockIdx.x + 1];
  double sum_dxhat = 0, sum_dxhat_xhat = 0;
  for (size_t ci = 0; ci < cg; ++ci) {
    const size_t ch = g * cg + ci;
    double sdy = 0, sdyx = 0;
    for (size_t i = threadIdx.x; i < hw; i += blockDim.x) {
      const size_t at = base + ci * hw + i;
      const double xhat = (x[at] - mean) * rstd;
      sdy += dy[at];
      sdyx += dy[at] * xhat;
    }
    sdy = block_sum(sdy);
    sdyx = block_sum(sdyx);
    if (threadIdx.x == 0) {
      partial[2 * (s * c + ch)] = static_cast<float>(sdy);
      partial[2 * (s * c + ch) + 1] = static_cast<float>(sdyx);
    }
    sum_dxhat += sdy * gamma[ch];
    sum_dxhat_xhat += sdyx * gamma[ch];
  }
  if (!dx)
    return;
  const double inv_m = 1.0 / static_cast<double>(m);
  for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
    const size_t ch = g * cg + i / hw;
    const double xhat = (x[base + i] - mean) * rstd;
    const double dxhat = static_cast<double>(dy[base + i]) * gamma[ch];
    const auto v = static_cast<float>(rstd * (dxhat - inv_m * sum_dxhat - xhat * inv_m * sum_dxhat_xhat));
    dx[base + i] = accumulate ? dx[base + i] + v : v;
  }
}

__global__ void groupnorm_params(size_t n, uint32_t c, const float* __restrict__ partial, float* __restrict__ dgamma,
                                 float* __restrict__ dbeta) {
  ASHLAR_GRID_LOOP(ch, size_t{c}) {
    float sdy = 0, sdyx = 0;
    for (size_t s = 0; s < n; ++s) {
      sdy += partial[2 * (s * c + ch)];
      sdyx += partial[2 * (s * c + ch) + 1];
    }
    dbeta[ch] = sdy;
    dgamma[ch] = sdyx;
  }
}

}  // namespace

void launch_im2col(const geometry& l, size_t g, const float* x, float* col, cudaStream_t stream) {
  const size_t count = size_t{l.c} * l.k * l.k * g * l.oh * l.ow;
  im2col<<<blocks_for(count), threads, 0, stream>>>(l, g, x, col);
}

void launch_col2im(const geometry& l, size_t g, const float* dcol, float* dx, bool accumulate, cudaStream_t stream) {
  col2im<<<blocks_for(g * l.c * l.h * l.w), threads, 0, stream>>>(l, g, dcol, dx, accumulate);
}

void launch_conv_bias_scatter(const geometry& l, size_t g, const float* out, const float* bias, float* y,
                              cudaStream_t stream) {
  conv_bias_scatter<<<blocks_for(g * l.oc * l.oh * l.ow), threads, 0, stream>>>(l, g, out, bias, y);
}

void launch_conv_gather(const geometry& l, size_t g, const float* dy, float* dout, cudaStream_t stream) {
  conv_gather<<<blocks_for(g * l.oc * l.oh * l.ow), threads, 0, stream>>>(l, g, dy, dout);
}

void launch_channel_sums(const geometry& l, size_t n, const float* dy, float* db, cudaStream_t stream) {
  channel_sums<<<l.oc, threads, 0, stream>>>(l, n, dy, db);
}

void launch_maxpool_forward(const geometry& l, size_t n, const float* x, float* y, uint32_t* argmax,
                            cudaStream_t stream) {
  maxpool_forward<<<blocks_for(n * l.c * l.oh * l.ow), threads, 0, stream>>>(l, n, x, y, argmax);
}

void launch_maxpool_backward(const geometry& l, size_t n, const uint32_t* argmax, const float* dy, float* dx,
                             bool accumulate, cudaStream_t stream) {
  pool_backward<true><<<blocks_for(n * l.c * l.h * l.w), threads, 0, stream>>>(l, n, argmax, dy, dx, accumulate);
}

void launch_avgpool_forward(const geometry& l, size_t n, const float* x, float* y, cudaStream_t stream) {
  avgpool_forward<<<blocks_for(n * l.c * l.oh * l.ow), threads, 0, stream>>>(l, n, x, y);
}

void launch_avgpool_backward(const geometry& l, size_t n, const float* dy, float* dx, bool accumulate,
                             cudaStream_t stream) {
  pool_backward<false><<<blocks_for(n * l.c * l.h * l.w), threads, 0, stream>>>(l, n, nullptr, dy, dx, accumulate);
}

void launch_relu_forward(size_t count, const float* x, float* y, cudaStream_t stream) {
  relu_forward<<<blocks_for(count), threads, 0, stream>>>(count, x, y);
}

void launch_relu_backward(size_t count, const float* y, const float* dy, float* dx, bool accumulate,
                          cudaStream_t stream) {
  relu_backward<<<blocks_for(count), threads, 0, stream>>>(count, y, dy, dx, accumulate);
}

void launch_dropout_forward(size_t count, uint64_t threshold, float keep, uint64_t seed, const float* x, float* y,
                            float* mask, cudaStream_t stream) {
  dropout_forward<<<blocks_for(count), threads, 0, stream>>>(count, threshold, keep, seed, x, y, mask);
}

void launch_scale_backward(size_t count, const float* m, const float* dy, float* dx, bool accumulate,
                           cudaStream_t stream) {
  scale_backward<<<blocks_for(count), threads, 0, stream>>>(count, m, dy, dx, accumulate);
}

void launch_add(size_t count, const float* a, const float* b, float* y, cudaStream_t stream) {
  add<<<blocks_for(count), threads, 0, stream>>>(count, a, b, y);
}

void launch_groupnorm_forward(size_t n, uint32_t c, size_t hw, uint32_t groups, double eps, const float* x,
                              const float* gamma, const float* beta, float* y, float* stats, cudaStream_t stream) {
  groupnorm_forward<<<static_cast<unsigned>(n * groups), threads, 0, stream>>>(c, hw, groups, eps, x, gamma, beta, y,
                                                                              stats);
}

void launch_groupnorm_backward(size_t n, uint32_t c, size_t hw, uint32_t groups, const float* x, const float* gamma,
                               const float* stats, const float* dy, float* partial, float* dgamma, float* dbeta,
                               float* dx, bool accumulate, cudaStream_t stream) {
  groupnorm_backward<<<static_cast<unsigned>(n * groups), threads, 0, stream>>>(c, hw, groups, x, gamma, stats, dy,
                                                                               partial, dx, accumulate);
  groupnorm_params<<<blocks_for(c), threads, 0, stream>>>(n, c, partial, dgamma, dbeta);
}

}  // namespace ashlar::gpu
