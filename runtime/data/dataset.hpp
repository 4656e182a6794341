// In-memory labelled data sets: Fashion-MNIST from IDX files, and synthetic data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/core/error.hpp"

namespace ashlar {

/// `n` samples of `dim` floats (row-major) with labels in [0, classes).
struct dataset {
  size_t n = 0;
  size_t dim = 0;
  uint32_t classes = 0;
  std::vector<float> x;
  std::vector<uint8_t> y;

  batch_view all() const { return {x.data(), y.data(), n, dim}; }
  /// Keeps the first `limit` samples (0 keeps all).
  void truncate(size_t limit);
};

/// Reads an IDX image file and its label file (gzip-compressed or plain), checking
/// magic numbers (2051 / 2049), dimensions, counts and file lengths. Pixels are scaled to
/// [0, 1] and standardized with Fashion-MNIST's mean 0.2860 and std 0.3530.
/// Errors: io_error (cannot open, names the path), corrupt_data (bad magic, truncated,
/// counts disagree, label >= 10; names the path and what was expected).
[[nodiscard]] expected<dataset> load_idx(const std::string& images_path,
                                         const std::string& labels_path);

/// Which half of a data set.
enum class split { train, test };

/// Loads Fashion-MNIST's train or test split from `dir`, which holds
/// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (Debian's dataset-fashion-mnist
/// installs them in /usr/share/datasets/fashion-mnist).
[[nodiscard]] expected<dataset> load_fashion_mnist(const std::string& dir, split which);

/// A synthetic classification set for benchmarks and tests: `classes` Gaussian
/// clusters in `dim` dimensions around random centres, deterministic in `seed`.
dataset make_synthetic(size_t n, size_t dim, uint32_t classes, uint64_t seed);

/// Iterates over a worker's part of a data set in mini-batches, reshuffling its
/// indices every epoch with a generator seeded from (seed, epoch): deterministic.
class batch_cursor {
public:
  /// The cursor covers indices [begin, begin + count) of `data`.
  batch_cursor(const dataset& data, size_t begin, size_t count, uint64_t seed);

  /// Copies the next `batch` samples into internal buffers and returns a view of them.
  /// The last batch of an epoch may be smaller. Valid until the next call.
  batch_view next(size_t batch);

  /// Completed passes over this cursor's part.
  size_t epoch() const { return epoch_; }
  /// Samples taken in the current pass.
  size_t pos() const { return pos_; }
  uint64_t seed() const { return seed_; }
  size_t size() const { return indices_.size(); }

  /// Puts the cursor where one of the same part and seed stood after `epoch` passes and
  /// `pos` more samples (a resumed job's data position): the next batch is the one that
  /// cursor would have returned. A `pos` beyond the part starts the next pass.
  void seek(size_t epoch, size_t pos);

private:
  void shuffle();

  const dataset* data_;
  std::vector<uint32_t> indices_;
  uint64_t seed_;
  size_t pos_ = 0;
  size_t epoch_ = 0;
  std::vector<float> xb_;
  std::vector<uint8_t> yb_;
};

}  // namespace ashlar
