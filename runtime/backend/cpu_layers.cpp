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

// Unfolds one sample [c x h x w] into col [(c*k*k) x (oh*ow)]: row (ci, ky, kx), column
// (oy, ox) holds x[ci, oy*s - p + ky, ox*s - p + kx] or 0 outside the image.
void im2col(const plan_node& l, const float* x, float* col) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, s = l.spec.stride, p = l.spec.padding;
  const uint32_t oh = l.out.h, ow = l.out.w;
  for (uint32_t c = 0; c < in.c; ++c)
    for (uint32_t ky = 0; ky < k; ++ky)
      for (uint32_t kx = 0; kx < k; ++kx) {
        float* row = col + ((size_t{c} * k + ky) * k + kx) * oh * ow;
        for (uint32_t oy = 0; oy < oh; ++oy) {
          const int iy = static_cast<int>(oy * s + ky) - static_cast<int>(p);
          float* dst = row + size_t{oy} * ow;
          if (iy < 0 || iy >= static_cast<int>(in.h)) {
            std::fill(dst, dst + ow, 0.0f);
            continue;
          }
          const float* src = x + (size_t{c} * in.h + static_cast<size_t>(iy)) * in.w;
          if (s == 1) {
            // Contiguous: zeros left and right of the image, the row in between.
            const int first = static_cast<int>(kx) - static_cast<int>(p);
            for (uint32_t ox = 0; ox < ow; ++ox) {
              const int ix = first + static_cast<int>(ox);
              dst[ox] = (ix >= 0 && ix < static_cast<int>(in.w)) ? src[ix] : 0.0f;
            }
          } else {
            for (uint32_t ox = 0; ox < ow; ++ox) {
              const int ix = static_cast<int>(ox * s + kx) - static_cast<int>(p);
              dst[ox] = (ix >= 0 && ix < static_cast<int>(in.w)) ? src[ix] : 0.0f;
            }
          }
        }
      }
}

// The adjoint of im2col: adds col's entries back into dx.
void col2im_add(const plan_node& l, const float* col, float* dx) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, s = l.spec.stride, p = l.spec.padding;
  const uint32_t oh = l.out.h, ow = l.out.w;
  for (uint32_t c = 0; c < in.c; ++c)
    for (uint32_t ky = 0; ky < k; ++ky)
      for (uint32_t kx = 0; kx < k; ++kx) {
        const float* row = col + ((size_t{c} * k + ky) * k + kx) * oh * ow;
        for (uint32_t oy = 0; oy < oh; ++oy) {
          const int iy = static_cast<int>(oy * s + ky) - static_cast<int>(p);
          if (iy < 0 || iy >= static_cast<int>(in.h))
            continue;
          float* dst = dx + (size_t{c} * in.h + static_cast<size_t>(iy)) * in.w;
          const float* src = row + size_t{oy} * ow;
          for (uint32_t ox = 0; ox < ow; ++ox) {
            const int ix = static_cast<int>(ox * s + kx) - static_cast<int>(p);
            if (ix >= 0 && ix < static_cast<int>(in.w))
              dst[ix] += src[ox];
          }
        }
      }
}

// A 1x1 convolution with stride 1 and no padding reads the sample itself as its columns.
bool pointwise(const plan_node& l) {
  return l.spec.kernel == 1 && l.spec.stride == 1 && l.spec.padding == 0;
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
                    float* db, float* dx) {
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
                to_int(out), w, to_int(in), 1.0f, dx, to_int(in));
}

void conv2d_forward(const plan_node& l, size_t n, const float* x, const float* w, const float* b, float* y,
                    std::vector<float>& scratch) {
  const uint64_t K = l.fan_in, P = uint64_t{l.out.h} * l.out.w, oc = l.out.c;
  const bool direct = pointwise(l);
  if (!direct && scratch.size() < K * P)
    scratch.resize(K * P);
  for (size_t s = 0; s < n; ++s) {
    const float* xs = x + s * l.in.size();
    float* ys = y + s * l.out.size();
    const float* col = xs;
    if (!direct) {
      im2col(l, xs, scratch.data());
      col = scratch.data();
    }
    for (uint64_t c = 0; c < oc; ++c)
      std::fill(ys + c * P, ys + (c + 1) * P, b[c]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_int(oc), to_int(P), to_int(K), 1.0f, w, to_int(K),
                col, to_int(P), 1.0f, ys, to_int(P));
  }
}

void conv2d_backward(const plan_node& l, size_t n, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, std::vector<float>& scratch) {
  const uint64_t K = l.fan_in, P = uint64_t{l.out.h} * l.out.w, oc = l.out.c;
  const bool direct = pointwise(l);
  if (scratch.size() < 2 * K * P)
    scratch.resize(2 * K * P);
  float* col_buf = scratch.data();
  float* dcol = scratch.data() + K * P;
  std::fill(db, db + oc, 0.0f);
  for (size_t s = 0; s < n; ++s) {
    const float* xs = x + s * l.in.size();
    const float* dys = dy + s * l.out.size();
    const float* col = xs;
    if (!direct) {
      im2col(l, xs, col_buf);
      col = col_buf;
    }
    // dW [oc x K] (+)= dy_s [oc x P] col^T [P x K]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, to_int(oc), to_int(K), to_int(P), 1.0f, dys, to_int(P),
                col, to_int(P), s == 0 ? 0.0f : 1.0f, dw, to_int(K));
    for (uint64_t c = 0; c < oc; ++c) {
      const float* row = dys + c * P;
      float acc = 0;
      for (uint64_t i = 0; i < P; ++i)
        acc += row[i];
      db[c] += acc;
    }
    if (!dx)
      continue;
    float* dxs = dx + s * l.in.size();
    if (direct) {
      // dx_s [K x P] += W^T [K x oc] dy_s [oc x P]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_int(K), to_int(P), to_int(oc), 1.0f, w, to_int(K),
                  dys, to_int(P), 1.0f, dxs, to_int(P));
    } else {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_int(K), to_int(P), to_int(oc), 1.0f, w, to_int(K),
                  dys, to_int(P), 0.0f, dcol, to_int(P));
      col2im_add(l, dcol, dxs);
    }
  }
}

void maxpool_forward(const plan_node& l, size_t n, const float* x, float* y, uint32_t* argmax) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, st = l.spec.stride, p = l.spec.padding;
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < in.c; ++c) {
      const float* xc = x + s * in.size() + size_t{c} * in.h * in.w;
      for (uint32_t oy = 0; oy < l.out.h; ++oy)
        for (uint32_t ox = 0; ox < l.out.w; ++ox) {
          float best = -std::numeric_limits<float>::infinity();
          uint32_t where = 0;
          bool any = false;
          for (uint32_t ky = 0; ky < k; ++ky) {
            const int iy = static_cast<int>(oy * st + ky) - static_cast<int>(p);
            if (iy < 0 || iy >= static_cast<int>(in.h))
              continue;
            for (uint32_t kx = 0; kx < k; ++kx) {
              const int ix = static_cast<int>(ox * st + kx) - static_cast<int>(p);
              if (ix < 0 || ix >= static_cast<int>(in.w))
                continue;
              const auto off = static_cast<uint32_t>(iy) * in.w + static_cast<uint32_t>(ix);
              if (!any || xc[off] > best) {
                best = xc[off];
                where = off;
                any = true;
              }
            }
          }
          const size_t o = s * l.out.size() + (size_t{c} * l.out.h + oy) * l.out.w + ox;
          y[o] = best;
          argmax[o] = c * in.h * in.w + where;
        }
    }
}

void maxpool_backward(const plan_node& l, size_t n, const uint32_t* argmax, const float* dy, float* dx) {
  const uint64_t per = l.out.size();
  for (size_t s = 0; s < n; ++s) {
    float* dxs = dx + s * l.in.size();
    for (uint64_t i = 0; i < per; ++i)
      dxs[argmax[s * per + i]] += dy[s * per + i];
  }
}

void avgpool_forward(const plan_node& l, size_t n, const float* x, float* y) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, st = l.spec.stride, p = l.spec.padding;
  const float inv = 1.0f / static_cast<float>(k * k);
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < in.c; ++c) {
      const float* xc = x + s * in.size() + size_t{c} * in.h * in.w;
      for (uint32_t oy = 0; oy < l.out.h; ++oy)
        for (uint32_t ox = 0; ox < l.out.w; ++ox) {
          float acc = 0;
          for (uint32_t ky = 0; ky < k; ++ky) {
            const int iy = static_cast<int>(oy * st + ky) - static_cast<int>(p);
            if (iy < 0 || iy >= static_cast<int>(in.h))
              continue;
            for (uint32_t kx = 0; kx < k; ++kx) {
              const int ix = static_cast<int>(ox * st + kx) - static_cast<int>(p);
              if (ix >= 0 && ix < static_cast<int>(in.w))
                acc += xc[static_cast<uint32_t>(iy) * in.w + static_cast<uint32_t>(ix)];
            }
          }
          y[s * l.out.size() + (size_t{c} * l.out.h + oy) * l.out.w + ox] = acc * inv;
        }
    }
}

void avgpool_backward(const plan_node& l, size_t n, const float* dy, float* dx) {
  const auto& in = l.in;
  const uint32_t k = l.spec.kernel, st = l.spec.stride, p = l.spec.padding;
  const float inv = 1.0f / static_cast<float>(k * k);
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < in.c; ++c) {
      float* dxc = dx + s * in.size() + size_t{c} * in.h * in.w;
      for (uint32_t oy = 0; oy < l.out.h; ++oy)
        for (uint32_t ox = 0; ox < l.out.w; ++ox) {
          const float g = dy[s * l.out.size() + (size_t{c} * l.out.h + oy) * l.out.w + ox] * inv;
          for (uint32_t ky = 0; ky < k; ++ky) {
            const int iy = static_cast<int>(oy * st + ky) - static_cast<int>(p);
            if (iy < 0 || iy >= static_cast<int>(in.h))
              continue;
            for (uint32_t kx = 0; kx < k; ++kx) {
              const int ix = static_cast<int>(ox * st + kx) - static_cast<int>(p);
              if (ix >= 0 && ix < static_cast<int>(in.w))
                dxc[static_cast<uint32_t>(iy) * in.w + static_cast<uint32_t>(ix)] += g;
            }
          }
        }
    }
}

void relu_forward(size_t count, const float* x, float* y) {
  for (size_t i = 0; i < count; ++i)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(size_t count, const float* y, const float* dy, float* dx) {
  for (size_t i = 0; i < count; ++i)
    dx[i] += y[i] > 0.0f ? dy[i] : 0.0f;
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

void dropout_backward(size_t count, const float* mask, const float* dy, float* dx) {
  for (size_t i = 0; i < count; ++i)
    dx[i] += dy[i] * mask[i];
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
                        const float* dy, float* dgamma, float* dbeta, float* dx) {
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
          dxg[ci * hw + i] += static_cast<float>(rstd * (dxhat - inv_m * sum_dxhat - xhat * inv_m * sum_dxhat_xhat));
        }
      }
    }
}

}  // namespace ashlar::cpu
