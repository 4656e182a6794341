// Top-k sparsification with error feedback (Stich et al., NeurIPS 2018): each push sends
// the k largest-magnitude entries of (gradient + residual) and keeps everything else as
// the residual for the next push, so no part of a gradient is lost, only delayed.
// Pure code; one compressor per worker and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// A sparse tensor: `index` ascending, `value[i]` at `index[i]`, all others zero.
struct sparse_tensor {
  uint64_t size = 0;
  std::vector<uint32_t> index;
  std::vector<float> value;
};

/// Bytes of a sparse tensor on the wire (4-byte index + 4-byte value per entry).
inline size_t wire_bytes(const sparse_tensor& s) {
  return s.index.size() * (sizeof(uint32_t) + sizeof(float));
}

/// Scratch buffers of select_topk, reused between calls.
struct topk_scratch {
  std::vector<float> magnitudes;
  std::vector<uint32_t> candidates;
};

/// Writes into `out` the positions of the k largest-magnitude entries of x[0, n), in
/// ascending order; among equal magnitudes at the threshold the first positions win.
/// k is clamped to n.
void select_topk(const float* x, size_t n, size_t k, topk_scratch& scratch, std::vector<uint32_t>& out);

/// Delta pulls (the server's side of pull compression, with error feedback): `view` is
/// what a reader holds of `params`; the k entries where they differ most are sent, as
/// their current values, and written into the view. What is not sent stays as the
/// difference between params and view, sent by a later pull once it is among the largest.
/// `params` holds view.size() floats; `diff` is scratch; `index` and `value` are
/// overwritten.
void delta_topk(const float* params, std::vector<float>& view, size_t k, topk_scratch& scratch,
                std::vector<float>& diff, std::vector<uint32_t>& index, std::vector<float>& value);

class topk_compressor {
public:
  /// Keeps ceil(ratio x n) entries per call (at least 1). ratio in (0, 1]; Default: 0.01.
  explicit topk_compressor(double ratio = 0.01);

  /// Compresses grad + residual; the entries not sent become the new residual. The
  /// residual is sized on the first call; a later call with another n fails with
  /// shape_mismatch.
  [[nodiscard]] expected<sparse_tensor> compress(const float* grad, size_t n);

  /// What has not been sent yet.
  const std::vector<float>& residual() const { return residual_; }

  /// Entries kept per call for a tensor of n floats.
  size_t k_for(size_t n) const;

  /// Dense bytes / sent bytes over every call so far (1 before the first).
  double compression_ratio() const;
  /// Bytes the dense tensors would have taken, and bytes sent, over every call so far.
  uint64_t dense_bytes() const { return dense_bytes_; }
  uint64_t sent_bytes() const { return sent_bytes_; }

private:
  double ratio_;
  std::vector<float> residual_;
  topk_scratch scratch_;
  std::vector<uint32_t> index_; // scratch
  uint64_t dense_bytes_ = 0;
  uint64_t sent_bytes_ = 0;
};

/// out[index[i]] += scale x value[i]. Fails with shape_mismatch if s.size != n or an
/// index is out of range.
[[nodiscard]] caf::error add_sparse(const sparse_tensor& s, float scale, float* out, size_t n);

}  // namespace ashlar
