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

void select_topk(const float* r, size_t n, size_t k, topk_scratch& scratch, std::vector<uint32_t>& out) {
  out.clear();
  k = std::min(k, n);
  if (k == 0)
    return;
  auto& magnitudes = scratch.magnitudes;
  auto& candidates = scratch.candidates;
  // The k-th largest magnitude. A strided sample of the magnitudes gives a threshold a
  // little below it; the entries at or above that threshold (about 1.5 k, gathered in one
  // branch-free pass) are the only candidates, and a selection among them finds the
  // exact value. If the sample was unlucky (too few candidates), every entry is one.
  magnitudes.clear();
  const size_t stride = std::max<size_t>(1, n / 4096);
  for (size_t i = 0; i < n; i += stride)
    magnitudes.push_back(std::fabs(r[i]));
  const double top = std::min(1.0, 1.5 * static_cast<double>(k) / static_cast<double>(n));
  const size_t pos = std::min(magnitudes.size() - 1,
                              static_cast<size_t>(top * static_cast<double>(magnitudes.size())));
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(pos),
                   magnitudes.end(), std::greater<float>{});
  const float estimate = k == n ? 0.0f : magnitudes[pos];
  candidates.resize(n);
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    candidates[c] = static_cast<uint32_t>(i);
    c += std::fabs(r[i]) >= estimate ? 1 : 0;
  }
  if (c < k) {
    std::iota(candidates.begin(), candidates.end(), 0u);
    c = n;
  }
  candidates.resize(c);
  magnitudes.resize(c);
  for (size_t j = 0; j < c; ++j)
    magnitudes[j] = std::fabs(r[candidates[j]]);
  const auto kth = magnitudes.end() - static_cast<std::ptrdiff_t>(k);
  std::nth_element(magnitudes.begin(), kth, magnitudes.end());
  const float threshold = *kth;
  size_t above = 0;
  for (auto i = kth + 1; i != magnitudes.end(); ++i)
    above += *i > threshold ? 1 : 0;
  size_t ties = k - above; // entries equal to the threshold that go (the first ones)
  // The candidates are in index order, so the indices come out ascending.
  out.reserve(k);
  for (uint32_t i : candidates) {
    const float m = std::fabs(r[i]);
    const bool tie = m == threshold && ties > 0;
    if (m > threshold || tie) {
      ties -= tie ? 1 : 0;
      out.push_back(i);
    }
  }
}

void delta_topk(const float* params, std::vector<float>& view, size_t k, topk_scratch& scratch,
                std::vector<float>& diff, std::vector<uint32_t>& index, std::vector<float>& value) {
  const size_t n = view.size();
  diff.resize(n);
  for (size_t i = 0; i < n; ++i)
    diff[i] = params[i] - view[i];
  select_topk(diff.data(), n, k, scratch, index);
  value.resize(index.size());
  for (size_t j = 0; j < index.size(); ++j) {
    value[j] = params[index[j]];
    view[index[j]] = value[j];
  }
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
  select_topk(r, n, k, scratch_, index_);
  sparse_tensor out;
  out.size = n;
  out.index = index_;
  out.value.resize(index_.size());
  for (size_t j = 0; j < index_.size(); ++j) {
    out.value[j] = r[index_[j]];
    r[index_[j]] = 0.0f;
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
