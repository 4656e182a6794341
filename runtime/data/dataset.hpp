// In-memory labelled data sets: Fashion-MNIST from IDX files, the user's own NumPy
// arrays, and synthetic data. Samples keep their shape (C, H, W).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/core/error.hpp"
#include "runtime/data/npy.hpp"

namespace ashlar {

/// `n` samples of `dim` floats (row-major; each of `shape`, channel-major) with labels in
/// [0, classes).
struct dataset {
  size_t n = 0;
  size_t dim = 0;
  uint32_t classes = 0;
  /// The shape of one sample; shape.size() == dim.
  tensor_shape shape;
  std::vector<float> x;
  std::vector<uint8_t> y;
  /// Samples kept as bytes, as IDX files hold them (a quarter of the memory of floats: the
  /// training set of Fashion-MNIST is 47 MB, not 188), `n * dim` of them, read-only and
  /// shared by every copy of the data set (and, through the host's data cache, by every
  /// process that loaded the same file: pixel_cache.hpp): `x` is then empty and value j
  /// of sample i is pixels[i * dim + j] * pixel_scale - pixel_shift. Batches are made
  /// from either (batch_cursor); whole-set views need floats (expand()).
  std::shared_ptr<const uint8_t> pixels;
  float pixel_scale = 1.0f;
  float pixel_shift = 0.0f;
  /// Augmentation applied by batch_cursor (training sets only): random crop after zero
  /// padding by this many pixels, 0 = none; random horizontal flip.
  uint32_t crop_padding = 0;
  bool hflip = false;

  bool compact() const { return pixels != nullptr; }
  /// Writes sample i's `dim` floats to `out`.
  void sample(size_t i, float* out) const;
  /// Keeps the samples as floats from now on (x filled from pixels, pixels dropped).
  void expand();
  /// A view of every sample: the set must hold floats (expand() a compact one first).
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

/// Loads the user's own data from NumPy .npy files in `dir`: x_train.npy, y_train.npy,
/// x_test.npy, y_test.npy. Samples are float32 or uint8 arrays of shape (N, C, H, W),
/// (N, H, W, C) (moved to channel-major), (N, H, W) (one channel) or (N, D) (flat), and
/// must match `input`; labels are an integer array (N,) or (N, 1) in [0, classes), at
/// most 256 classes. uint8 samples are scaled to [0, 1] and standardized per channel with
/// the training set's mean and deviation; float32 samples are used as they are.
/// Errors: io_error (cannot open, names the path), corrupt_data naming the file: not a
/// .npy file (magic), a dtype other than float32/uint8 (samples) or an integer (labels),
/// Fortran order, a shape that does not match `input`, a length that disagrees with the
/// header, a label out of range, sample and label counts that differ.
struct npy_data {
  dataset train;
  dataset test;
};
[[nodiscard]] expected<npy_data> load_npy_dataset(const std::string& dir, const tensor_shape& input,
                                                  uint32_t classes);

/// A synthetic classification set for benchmarks and tests: `classes` Gaussian
/// clusters in `dim` dimensions around random centres, deterministic in `seed`.
dataset make_synthetic(size_t n, size_t dim, uint32_t classes, uint64_t seed);

/// Where the step that starts at `pos` of a pass over `count` samples ends, in batches of at
/// most `batch`: a pass takes ceil(count / batch) steps of near-equal size (count / steps,
/// give or take one), so that every step of a pass trains what step_samples
/// (runtime/policy/assignment.hpp) counts for it, wherever the pass stands, and none is a
/// remnant of a few samples that costs a whole round of a lockstep job.
size_t pass_step_end(size_t count, size_t batch, size_t pos);

/// Iterates over a worker's part of a data set in mini-batches, reshuffling its
/// indices every epoch with a generator seeded from (seed, epoch): deterministic.
class batch_cursor {
public:
  /// The cursor covers indices [begin, begin + count) of `data`.
  batch_cursor(const dataset& data, size_t begin, size_t count, uint64_t seed);

  /// Copies the next at most `batch` samples into internal buffers and returns a view of
  /// them, augmented as the data set says (a draw that depends only on the seed, the pass
  /// and the position). A pass is split into ceil(size / batch) batches of near-equal size
  /// (pass_step_end). Valid until the next call.
  batch_view next(size_t batch);
  /// Gives the batch's buffers back (the last view is then invalid); next() takes them again.
  void release();

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
  void augment(size_t i, float* sample);

  const dataset* data_;
  std::vector<uint32_t> indices_;
  uint64_t seed_;
  size_t pos_ = 0;
  size_t epoch_ = 0;
  std::vector<float> xb_;
  std::vector<uint8_t> yb_;
  std::vector<float> tmp_;
};

}  // namespace ashlar
