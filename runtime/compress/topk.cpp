#include "runtime/compress/topk.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace ashlar {

topk_compressor::topk_compressor(double ratio) : ratio_(std::clamp(ratio, 1e-9, 1.0)) {
}

size_t topk_compressor::k_for(size_t n) const {
  if (n == 0)
    return 0;
  return std::clamp<size_t>(static_cast<size_t>(std::ceil(ratio_ * static_cast<double>(n))), 1, n);
}

expected<sparse_tensor> topk_compressor::compress(const float* grad, size_t n) {
  if (residual_.empty())
    residual_.assign(n, 0.0f);
  if (residual_.size() != n)
    return make_error(errc::shape_mismatch, "top-k compressor: a tensor of " + std::to_string(n)
                                              + " floats, but the residual holds " + std::to_string(residual_.size()));
  float* r = residual_.data();
  for (size_t i = 0; i < n; ++i)
    r[i] += grad[i];
  const size_t k = k_for(n);
  // The k-th largest magnitude. A strided sample of the magnitudes gives a threshold a
  // little below it; the entries at or above that threshold (about 1.5 k, gathered in one
  // branch-free pass) are the only candidates, and a selection among them finds the
  // exact value. If the sample was unlucky (too few candidates), every entry is one.
  magnitudes_.clear();
  const size_t stride = std::max<size_t>(1, n / 4096);
  for (size_t i = 0; i < n; i += stride)
    magnitudes_.push_back(std::fabs(r[i]));
  const double top = std::min(1.0, 1.5 * static_cast<double>(k) / static_cast<double>(n));
  const size_t pos = std::min(magnitudes_.size() - 1,
                              static_cast<size_t>(top * static_cast<double>(magnitudes_.size())));
  std::nth_element(magnitudes_.begin(), magnitudes_.begin() + static_cast<std::ptrdiff_t>(pos),
                   magnitudes_.end(), std::greater<float>{});
  const float estimate = k == n ? 0.0f : magnitudes_[pos];
  candidates_.resize(n);
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    candidates_[c] = static_cast<uint32_t>(i);
    c += std::fabs(r[i]) >= estimate ? 1 : 0;
  }
  if (c < k) {
    std::iota(candidates_.begin(), candidates_.end(), 0u);
    c = n;
  }
  candidates_.resize(c);
  magnitudes_.resize(c);
  for (size_t j = 0; j < c; ++j)
    magnitudes_[j] = std::fabs(r[candidates_[j]]);
  const auto kth = magnitudes_.end() - static_cast<std::ptrdiff_t>(k);
  std::nth_element(magnitudes_.begin(), kth, magnitudes_.end());
  const float threshold = *kth;
  size_t above = 0;
  for (auto i = kth + 1; i != magnitudes_.end(); ++i)
    above += *i > threshold ? 1 : 0;
  size_t ties = k - above; // entries equal to the threshold that go (the first ones)
  // The candidates are in index order, so the indices come out ascending.
  sparse_tensor out;
  out.size = n;
  out.index.reserve(k);
  out.value.reserve(k);
  for (uint32_t i : candidates_) {
    const float m = std::fabs(r[i]);
    const bool tie = m == threshold && ties > 0;
    if (m > threshold || tie) {
      ties -= tie ? 1 : 0;
      out.index.push_back(i);
      out.value.push_back(r[i]);
      r[i] = 0.0f;
    }
  }
  dense_bytes_ += n * sizeof(float);
  sent_bytes_ += wire_bytes(out);
  return out;
}

double topk_compressor::compression_ratio() const {
  return sent_bytes_ == 0 ? 1.0 : static_cast<double>(dense_bytes_) / static_cast<double>(sent_bytes_);
}

caf::error add_sparse(const sparse_tensor& s, float scale, float* out, size_t n) {
  if (s.size != n || s.index.size() != s.value.size())
    return make_error(errc::shape_mismatch, "sparse tensor of size " + std::to_string(s.size) + " with "
                                              + std::to_string(s.index.size()) + " indices and "
                                              + std::to_string(s.value.size()) + " values, for a tensor of "
                                              + std::to_string(n));
  for (size_t i = 0; i < s.index.size(); ++i) {
    if (s.index[i] >= n)
      return make_error(errc::shape_mismatch, "sparse index " + std::to_string(s.index[i])
                                                + " outside a tensor of " + std::to_string(n));
    out[s.index[i]] += scale * s.value[i];
  }
  return {};
}

}  // namespace ashlar
