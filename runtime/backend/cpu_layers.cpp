#include "runtime/backend/cpu_layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <cblas.h>

namespace ashlar::cpu {

namespace {

int to_int(uint64_t v) {
  return static_cast<int>(v);
}

// The output columns [lo, hi) whose input column ox*s - p + kx lies inside [0, w).
void valid_columns(uint32_t ow, uint32_t s, uint32_t p, uint32_t kx, uint32_t w, uint32_t& lo, uint32_t& hi) {
  // ox*s + kx >= p  and  ox*s + kx - p < w
  lo = kx >= p ? 0 : (p - kx + s - 1) / s;
  const int64_t last = static_cast<int64_t>(w) + p - kx - 1; // largest ox*s allowed
  hi = last < 0 ? 0 : std::min<uint32_t>(ow, static_cast<uint32_t>(last / s) + 1);
  if (hi < lo)
    hi = lo;
}

// Unfolds one sample [c x h x w] into col [(c*k*k) x (oh*ow)] (rows `ld` floats apart):
// row (ci, ky, kx), column (oy, ox) holds x[ci, oy*s - p + ky, ox*s - p + kx] or 0
// outside the image.
void im2col(const plan_node& l, const float* __restrict x, float* __restrict col, size_t ld) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, s = l.spec.stride, p = l.spec.padding;
  const uint32_t oh = l.out.h, ow = l.out.w;
  for (uint32_t c = 0; c < in.c; ++c)
    for (uint32_t ky = 0; ky < k; ++ky)
      for (uint32_t kx = 0; kx < k; ++kx) {
        float* row = col + ((size_t{c} * k + ky) * k + kx) * ld;
        uint32_t lo, hi;
        valid_columns(ow, s, p, kx, in.w, lo, hi);
        for (uint32_t oy = 0; oy < oh; ++oy) {
          const int iy = static_cast<int>(oy * s + ky) - static_cast<int>(p);
          float* dst = row + size_t{oy} * ow;
          if (iy < 0 || iy >= static_cast<int>(in.h)) {
            std::fill(dst, dst + ow, 0.0f);
            continue;
          }
          const float* src = x + (size_t{c} * in.h + static_cast<size_t>(iy)) * in.w;
          std::fill(dst, dst + lo, 0.0f);
          if (s == 1) {
            std::memcpy(dst + lo, src + lo + kx - p, (hi - lo) * sizeof(float));
          } else {
            for (uint32_t ox = lo; ox < hi; ++ox)
              dst[ox] = src[ox * s + kx - p];
          }
          std::fill(dst + hi, dst + ow, 0.0f);
        }
      }
}

// The adjoint of im2col: adds col's entries back into dx.
void col2im_add(const plan_node& l, const float* __restrict col, size_t ld, float* __restrict dx) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, s = l.spec.stride, p = l.spec.padding;
  const uint32_t oh = l.out.h, ow = l.out.w;
  for (uint32_t c = 0; c < in.c; ++c)
    for (uint32_t ky = 0; ky < k; ++ky)
      for (uint32_t kx = 0; kx < k; ++kx) {
        const float* row = col + ((size_t{c} * k + ky) * k + kx) * ld;
        uint32_t lo, hi;
        valid_columns(ow, s, p, kx, in.w, lo, hi);
        for (uint32_t oy = 0; oy < oh; ++oy) {
          const int iy = static_cast<int>(oy * s + ky) - static_cast<int>(p);
          if (iy < 0 || iy >= static_cast<int>(in.h))
            continue;
          float* dst = dx + (size_t{c} * in.h + static_cast<size_t>(iy)) * in.w;
          const float* src = row + size_t{oy} * ow;
          if (s == 1) {
            float* d = dst + kx - p;
            for (uint32_t ox = lo; ox < hi; ++ox)
              d[ox] += src[ox];
          } else {
            for (uint32_t ox = lo; ox < hi; ++ox)
              dst[ox * s + kx - p] += src[ox];
          }
        }
      }
}

// Calls f(offset) for every tap of the pooling window of output (oy, ox) that lies
// inside the image, `offset` within the channel's plane; taps on padding are skipped.
template <class F>
void for_each_tap(const plan_node& l, uint32_t oy, uint32_t ox, F&& f) {
  const uint32_t k = l.spec.kernel, st = l.spec.stride, p = l.spec.padding;
  for (uint32_t ky = 0; ky < k; ++ky) {
    const int iy = static_cast<int>(oy * st + ky) - static_cast<int>(p);
    if (iy < 0 || iy >= static_cast<int>(l.in.h))
      continue;
    for (uint32_t kx = 0; kx < k; ++kx) {
      const int ix = static_cast<int>(ox * st + kx) - static_cast<int>(p);
      if (ix >= 0 && ix < static_cast<int>(l.in.w))
        f(static_cast<uint32_t>(iy) * l.in.w + static_cast<uint32_t>(ix));
    }
  }
}

// SplitMix64: a counter-based generator, so a mask depends only on (seed, index).
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void dense_forward(const plan_node& l, size_t n, const float* x, const float* w, const float* b, float* y) {
  const auto in = l.in.c, out = l.out.c;
  for (size_t r = 0; r < n; ++r)
    std::memcpy(y + r * out, b, out * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, to_int(n), to_int(out), to_int(in), 1.0f, x, to_int(in),
              w, to_int(in), 1.0f, y, to_int(out));
}

void dense_backward(const plan_node& l, size_t n, const float* x, const float* w, const float* dy, float* dw,
                    float* db, float* dx, bool accumulate) {
  const auto in = l.in.c, out = l.out.c;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_int(out), to_int(in), to_int(n), 1.0f, dy, to_int(out),
              x, to_int(in), 0.0f, dw, to_int(in));
  std::fill(db, db + out, 0.0f);
  for (size_t r = 0; r < n; ++r) {
    const float* row = dy + r * out;
    for (uint32_t c = 0; c < out; ++c)
      db[c] += row[c];
  }
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_int(n), to_int(in), to_int(out), 1.0f, dy,
                to_int(out), w, to_int(in), accumulate ? 1.0f : 0.0f, dx, to_int(in));
}

// Samples are unfolded in groups, side by side: col [K x g*P], so each product is one
// GEMM with g*P columns (per-sample products of a few hundred columns run BLAS far below
// its rate). A group's buffers stay within about 8 MB.
size_t conv_group(const plan_node& l, size_t n) {
  const uint64_t per = (l.fan_in + l.out.c) * uint64_t{l.out.h} * l.out.w;
  return static_cast<size_t>(std::clamp<uint64_t>((uint64_t{2} << 20) / std::max<uint64_t>(per, 1), 1, n));
}

void conv2d_forward(const plan_node& l, size_t n, const float* x, const float* w, const float* b, float* y,
                    std::vector<float>& scratch) {
  const uint64_t K = l.fan_in, P = uint64_t{l.out.h} * l.out.w, oc = l.out.c;
  const size_t group = conv_group(l, n);
  if (scratch.size() < (K + oc) * P * group)
    scratch.resize((K + oc) * P * group);
  float* col = scratch.data();
  float* out = scratch.data() + K * P * group;
  for (size_t s0 = 0; s0 < n; s0 += group) {
    const size_t g = std::min(group, n - s0);
    const uint64_t cols = g * P;
    for (size_t s = 0; s < g; ++s)
      im2col(l, x + (s0 + s) * l.in.size(), col + s * P, cols);
    // out [oc x g*P] = W [oc x K] col [K x g*P]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_int(oc), to_int(cols), to_int(K), 1.0f, w, to_int(K),
                col, to_int(cols), 0.0f, out, to_int(cols));
    for (size_t s = 0; s < g; ++s) {
      float* ys = y + (s0 + s) * l.out.size();
      for (uint64_t c = 0; c < oc; ++c) {
        const float* src = out + c * cols + s * P;
        float* dst = ys + c * P;
        const float bias = b[c];
        for (uint64_t i = 0; i < P; ++i)
          dst[i] = src[i] + bias;
      }
    }
  }
}

void conv2d_backward(const plan_node& l, size_t n, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, bool accumulate, std::vector<float>& scratch) {
  const uint64_t K = l.fan_in, P = uint64_t{l.out.h} * l.out.w, oc = l.out.c;
  const size_t group = conv_group(l, n);
  if (scratch.size() < (2 * K + oc) * P * group)
    scratch.resize((2 * K + oc) * P * group);
  float* col = scratch.data();
  float* dout = scratch.data() + K * P * group;
  float* dcol = dout + oc * P * group;
  std::fill(db, db + oc, 0.0f);
  if (dx && !accumulate)
    std::fill(dx, dx + n * l.in.size(), 0.0f);
  for (size_t s0 = 0; s0 < n; s0 += group) {
    const size_t g = std::min(group, n - s0);
    const uint64_t cols = g * P;
    for (size_t s = 0; s < g; ++s) {
      im2col(l, x + (s0 + s) * l.in.size(), col + s * P, cols);
      const float* dys = dy + (s0 + s) * l.out.size();
      for (uint64_t c = 0; c < oc; ++c) {
        const float* src = dys + c * P;
        std::copy(src, src + P, dout + c * cols + s * P);
        float acc = 0;
        for (uint64_t i = 0; i < P; ++i)
          acc += src[i];
        db[c] += acc;
      }
    }
    // dW [oc x K] (+)= dout [oc x g*P] col^T [g*P x K]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, to_int(oc), to_int(K), to_int(cols), 1.0f, dout,
                to_int(cols), col, to_int(cols), s0 == 0 ? 0.0f : 1.0f, dw, to_int(K));
    if (!dx)
      continue;
    // dcol [K x g*P] = W^T [K x oc] dout [oc x g*P], folded back into each sample
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_int(K), to_int(cols), to_int(oc), 1.0f, w, to_int(K),
                dout, to_int(cols), 0.0f, dcol, to_int(cols));
    for (size_t s = 0; s < g; ++s)
      col2im_add(l, dcol + s * P, cols, dx + (s0 + s) * l.in.size());
  }
}

void maxpool_forward(const plan_node& l, size_t n, const float* x, float* y, uint32_t* argmax) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, st = l.spec.stride, p = l.spec.padding;
  if (p == 0) {
    // Every window lies inside the image: no bounds to check.
    for (size_t s = 0; s < n; ++s)
      for (uint32_t c = 0; c < in.c; ++c) {
        const float* xc = x + s * in.size() + size_t{c} * in.h * in.w;
        const size_t obase = s * l.out.size() + size_t{c} * l.out.h * l.out.w;
        for (uint32_t oy = 0; oy < l.out.h; ++oy)
          for (uint32_t ox = 0; ox < l.out.w; ++ox) {
            uint32_t where = oy * st * in.w + ox * st;
            float best = xc[where];
            for (uint32_t ky = 0; ky < k; ++ky) {
              const uint32_t rowoff = (oy * st + ky) * in.w + ox * st;
              for (uint32_t kx = 0; kx < k; ++kx)
                if (xc[rowoff + kx] > best) {
                  best = xc[rowoff + kx];
                  where = rowoff + kx;
                }
            }
            y[obase + size_t{oy} * l.out.w + ox] = best;
            argmax[obase + size_t{oy} * l.out.w + ox] = c * in.h * in.w + where;
          }
      }
    return;
  }
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < in.c; ++c) {
      const float* xc = x + s * in.size() + size_t{c} * in.h * in.w;
      for (uint32_t oy = 0; oy < l.out.h; ++oy)
        for (uint32_t ox = 0; ox < l.out.w; ++ox) {
          float best = -std::numeric_limits<float>::infinity();
          uint32_t where = 0;
          bool any = false;
          for_each_tap(l, oy, ox, [&](uint32_t off) {
            if (!any || xc[off] > best) {
              best = xc[off];
              where = off;
              any = true;
            }
          });
          const size_t o = s * l.out.size() + (size_t{c} * l.out.h + oy) * l.out.w + ox;
          y[o] = best;
          argmax[o] = c * in.h * in.w + where;
        }
    }
}

void maxpool_backward(const plan_node& l, size_t n, const uint32_t* argmax, const float* dy, float* dx,
                      bool accumulate) {
  const uint64_t per = l.out.size();
  if (!accumulate)
    std::fill(dx, dx + n * l.in.size(), 0.0f);
  for (size_t s = 0; s < n; ++s) {
    float* dxs = dx + s * l.in.size();
    for (uint64_t i = 0; i < per; ++i)
      dxs[argmax[s * per + i]] += dy[s * per + i];
  }
}

void avgpool_forward(const plan_node& l, size_t n, const float* x, float* y) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel;
  const float inv = 1.0f / static_cast<float>(k * k);
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < in.c; ++c) {
      const float* xc = x + s * in.size() + size_t{c} * in.h * in.w;
      for (uint32_t oy = 0; oy < l.out.h; ++oy)
        for (uint32_t ox = 0; ox < l.out.w; ++ox) {
          float acc = 0;
          for_each_tap(l, oy, ox, [&](uint32_t off) { acc += xc[off]; });
          y[s * l.out.size() + (size_t{c} * l.out.h + oy) * l.out.w + ox] = acc * inv;
        }
    }
}

void avgpool_backward(const plan_node& l, size_t n, const float* dy, float* dx, bool accumulate) {
  const auto& in = l.in;
  if (!accumulate)
    std::fill(dx, dx + n * in.size(), 0.0f);
  const uint32_t k = l.spec.kernel;
  const float inv = 1.0f / static_cast<float>(k * k);
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < in.c; ++c) {
      float* dxc = dx + s * in.size() + size_t{c} * in.h * in.w;
      for (uint32_t oy = 0; oy < l.out.h; ++oy)
        for (uint32_t ox = 0; ox < l.out.w; ++ox) {
          const float g = dy[s * l.out.size() + (size_t{c} * l.out.h + oy) * l.out.w + ox] * inv;
          for_each_tap(l, oy, ox, [&](uint32_t off) { dxc[off] += g; });
        }
    }
}

// Branch-free, so they vectorize: a sign test per element mispredicts half the time.
void relu_forward(size_t count, const float* __restrict x, float* __restrict y) {
  for (size_t i = 0; i < count; ++i)
    y[i] = std::max(x[i], 0.0f);
}

void relu_backward(size_t count, const float* __restrict y, const float* __restrict dy, float* __restrict dx,
                   bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < count; ++i)
      dx[i] += dy[i] * static_cast<float>(y[i] > 0.0f);
  } else {
    for (size_t i = 0; i < count; ++i)
      dx[i] = dy[i] * static_cast<float>(y[i] > 0.0f);
  }
}

void dropout_forward(const plan_node& l, size_t count, const float* x, float* y, float* mask, uint64_t seed) {
  const double p = l.spec.p;
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  // Compare the top 53 bits with p scaled to that range: one multiply-free test per entry.
  const auto threshold = static_cast<uint64_t>(p * 0x1.0p53);
  const uint64_t base = mix(seed);
  for (size_t i = 0; i < count; ++i) {
    const bool dropped = (mix(base + i) >> 11) < threshold;
    mask[i] = dropped ? 0.0f : keep;
    y[i] = x[i] * mask[i];
  }
}

void dropout_backward(size_t count, const float* __restrict mask, const float* __restrict dy, float* __restrict dx,
                      bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < count; ++i)
      dx[i] += dy[i] * mask[i];
  } else {
    for (size_t i = 0; i < count; ++i)
      dx[i] = dy[i] * mask[i];
  }
}

void pass_backward(size_t count, const float* __restrict dy, float* __restrict dx, bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < count; ++i)
      dx[i] += dy[i];
  } else {
    std::memcpy(dx, dy, count * sizeof(float));
  }
}

void groupnorm_forward(const plan_node& l, size_t n, const float* x, const float* gamma, const float* beta,
                       float* y, float* stats) {
  const uint32_t G = l.spec.groups, C = l.in.c;
  const uint64_t hw = uint64_t{l.in.h} * l.in.w, cg = C / G, m = cg * hw;
  for (size_t s = 0; s < n; ++s)
    for (uint32_t g = 0; g < G; ++g) {
      const float* xg = x + s * l.in.size() + g * m;
      float* yg = y + s * l.in.size() + g * m;
      double sum = 0, sq = 0;
      for (uint64_t i = 0; i < m; ++i)
        sum += xg[i];
      const double mean = sum / static_cast<double>(m);
      for (uint64_t i = 0; i < m; ++i) {
        const double d = xg[i] - mean;
        sq += d * d;
      }
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(m) + l.spec.eps);
      stats[2 * (s * G + g)] = static_cast<float>(mean);
      stats[2 * (s * G + g) + 1] = static_cast<float>(rstd);
      for (uint64_t ci = 0; ci < cg; ++ci) {
        const uint64_t c = g * cg + ci;
        const float a = static_cast<float>(gamma[c] * rstd);
        const float b = static_cast<float>(beta[c] - gamma[c] * rstd * mean);
        const float* xc = xg + ci * hw;
        float* yc = yg + ci * hw;
        for (uint64_t i = 0; i < hw; ++i)
          yc[i] = a * xc[i] + b;
      }
    }
}

void groupnorm_backward(const plan_node& l, size_t n, const float* x, const float* gamma, const float* stats,
                        const float* dy, float* dgamma, float* dbeta, float* dx, bool accumulate) {
  const uint32_t G = l.spec.groups, C = l.in.c;
  const uint64_t hw = uint64_t{l.in.h} * l.in.w, cg = C / G, m = cg * hw;
  std::fill(dgamma, dgamma + C, 0.0f);
  std::fill(dbeta, dbeta + C, 0.0f);
  for (size_t s = 0; s < n; ++s)
    for (uint32_t g = 0; g < G; ++g) {
      const float* xg = x + s * l.in.size() + g * m;
      const float* dyg = dy + s * l.in.size() + g * m;
      const double mean = stats[2 * (s * G + g)], rstd = stats[2 * (s * G + g) + 1];
      // Per channel: sum(dy) and sum(dy * xhat) give dbeta and dgamma; over the group,
      // sum(dxhat) and sum(dxhat * xhat) give dx.
      double sum_dxhat = 0, sum_dxhat_xhat = 0;
      for (uint64_t ci = 0; ci < cg; ++ci) {
        const uint64_t c = g * cg + ci;
        double sdy = 0, sdyx = 0;
        for (uint64_t i = 0; i < hw; ++i) {
          const double xhat = (xg[ci * hw + i] - mean) * rstd;
          sdy += dyg[ci * hw + i];
          sdyx += dyg[ci * hw + i] * xhat;
        }
        dbeta[c] += static_cast<float>(sdy);
        dgamma[c] += static_cast<float>(sdyx);
        sum_dxhat += sdy * gamma[c];
        sum_dxhat_xhat += sdyx * gamma[c];
      }
      if (!dx)
        continue;
      float* dxg = dx + s * l.in.size() + g * m;
      const double inv_m = 1.0 / static_cast<double>(m);
      for (uint64_t ci = 0; ci < cg; ++ci) {
        const uint64_t c = g * cg + ci;
        for (uint64_t i = 0; i < hw; ++i) {
          const double xhat = (xg[ci * hw + i] - mean) * rstd;
          const double dxhat = dyg[ci * hw + i] * gamma[c];
          const auto v = static_cast<float>(rstd * (dxhat - inv_m * sum_dxhat - xhat * inv_m * sum_dxhat_xhat));
          dxg[ci * hw + i] = accumulate ? dxg[ci * hw + i] + v : v;
        }
      }
    }
}

}  // namespace ashlar::cpu
