#include "runtime/compress/topk.hpp"

#include <algorithm>
#include <cmath>
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
  for (size_t i = 0; i < n; ++i)
    residual_[i] += grad[i];
  const size_t k = k_for(n);
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (k < n)
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                     [&](uint32_t a, uint32_t b) { return std::fabs(residual_[a]) > std::fabs(residual_[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  sparse_tensor out;
  out.size = n;
  out.index = std::move(order);
  out.value.reserve(k);
  for (uint32_t i : out.index) {
    out.value.push_back(residual_[i]);
    residual_[i] = 0.0f;
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
