#include <filesystem>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <sys/stat.h>

#include <zlib.h>

#include "runtime/data/dataset.hpp"
#include "runtime/data/pixel_cache.hpp"

namespace ashlar {

namespace {

constexpr uint32_t images_magic = 0x00000803; // unsigned byte, 3 dimensions
constexpr uint32_t labels_magic = 0x00000801; // unsigned byte, 1 dimension
constexpr float fmnist_mean = 0.2860f;
constexpr float fmnist_std = 0.3530f;

uint32_t be32(const uint8_t* p);

// The most data an IDX file may declare: 8 GiB (Fashion-MNIST's training images are 47 MB).
constexpr uint64_t max_idx_bytes = uint64_t{8} << 30;

// Reads an (optionally gzip-compressed) IDX file into memory, bounded by what its header
// declares: the header (`header` bytes: magic, then 32-bit dimensions) is read first, and
// no more than the size it declares (plus one byte, to tell that more follows) is ever
// decompressed, so a small file that inflates to gigabytes costs no more than the size
// its header names. A file whose header does not start with `magic` is read no further
// than its header. The checks of magic and sizes are the caller's.
expected<std::vector<uint8_t>> read_idx(const std::string& path, size_t header, uint32_t magic,
                                        bool header_only = false) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return make_error(errc::io_error, path + " is a directory, expected an IDX file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  gzbuffer(f, 1 << 17);
  std::vector<uint8_t> out;
  uint64_t limit = header; // until the header is in: the header
  uint8_t buf[1 << 16];
  while (out.size() <= limit) {
    const uint64_t room = limit + 1 - out.size();
    int got = gzread(f, buf, static_cast<unsigned>(std::min<uint64_t>(sizeof(buf), room)));
    if (got < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      return make_error(errc::corrupt_data, path + " is not a valid gzip stream: " + msg);
    }
    if (got == 0)
      break;
    out.insert(out.end(), buf, buf + got);
    if (limit == header && out.size() >= header) {
      if (be32(out.data()) != magic || header_only) { // (another kind: the caller names the magic)
        gzclose(f);
        out.resize(header);
        return out;
      }
      // The header's dimensions (each 32-bit, after the magic) declare the size.
      uint64_t elements = 1;
      for (size_t d = 4; d + 4 <= header; d += 4) {
        const uint64_t dim = be32(out.data() + d);
        elements = dim != 0 && elements > max_idx_bytes / dim ? max_idx_bytes + 1 : elements * dim;
      }
      if (elements > max_idx_bytes) {
        gzclose(f);
        return make_error(errc::corrupt_data, path + " declares more than " + std::to_string(max_idx_bytes >> 30)
                                                + " GiB of data in its header; refused before reading it");
      }
      limit = header + elements;
      // One buffer of the declared size, filled in place (growing it by doubling would
      // copy it and hold two for a moment); a lying header reserves at most 256 MiB.
      out.reserve(static_cast<size_t>(std::min<uint64_t>(limit + 1, uint64_t{256} << 20)));
    }
  }
  if (out.size() > limit) { // more than the header declares: stop reading here
    gzclose(f);
    return out;
  }
  // gzread reports a truncated gzip stream only through gzerror after EOF.
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    std::string m = msg;
    gzclose(f);
    return make_error(errc::corrupt_data, path + " is a damaged gzip stream: " + m);
  }
  if (gzclose(f) != Z_OK)
    return make_error(errc::corrupt_data, path + " is a truncated gzip stream");
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

} // namespace

// The host's copy of the images of `images_path` where the cache holds one for this very
// file (path, device, inode, size, time, and the header it starts with), found from the
// file's header alone: the images are then neither decompressed nor held twice (the file
// was decoded and checked whole when the copy was written). Null otherwise.
std::shared_ptr<const uint8_t> cached_images(const std::string& images_path, uint8_t (&header)[16]) {
  auto head = read_idx(images_path, 16, images_magic, true);
  if (!head || head->size() != 16 || be32(head->data()) != images_magic)
    return nullptr;
  const uint64_t n = be32(head->data() + 4), rows = be32(head->data() + 8), cols = be32(head->data() + 12);
  if (rows == 0 || cols == 0 || rows * cols > (1u << 24) || n > max_idx_bytes / (rows * cols))
    return nullptr;
  std::memcpy(header, head->data(), sizeof header);
  return cached_pixels(images_path, header, n * rows * cols);
}

expected<dataset> load_idx(const std::string& images_path, const std::string& labels_path) {
  uint8_t header[16];
  auto cached = cached_images(images_path, header);
  auto img = cached ? expected<std::vector<uint8_t>>{std::vector<uint8_t>(header, header + 16)}
                    : read_idx(images_path, 16, images_magic);
  if (!img)
    return img.error();
  auto lbl = read_idx(labels_path, 8, labels_magic);
  if (!lbl)
    return lbl.error();
  if (img->size() < 16)
    return make_error(errc::corrupt_data, images_path + " is truncated: "
                                            + std::to_string(img->size())
                                            + " bytes, an IDX image header needs 16");
  if (auto m = be32(img->data()); m != images_magic)
    return make_error(errc::corrupt_data, images_path + " has magic " + hex(m)
                                            + ", expected " + hex(images_magic)
                                            + " (IDX unsigned-byte images)");
  uint64_t n = be32(img->data() + 4);
  uint64_t rows = be32(img->data() + 8);
  uint64_t cols = be32(img->data() + 12);
  if (rows == 0 || cols == 0 || rows * cols > (1u << 24))
    return make_error(errc::corrupt_data, images_path + " declares images of " + std::to_string(rows)
                                            + "x" + std::to_string(cols) + " pixels");
  uint64_t want = 16 + n * rows * cols;
  if (!cached && img->size() != want)
    return make_error(errc::corrupt_data, images_path + " holds " + (img->size() > want ? "more than " : "")
                                            + std::to_string(img->size() > want ? want : img->size())
                                            + " bytes, its header (" + std::to_string(n)
                                            + " images of " + std::to_string(rows) + "x"
                                            + std::to_string(cols) + ") needs "
                                            + std::to_string(want));
  if (lbl->size() < 8)
    return make_error(errc::corrupt_data, labels_path + " is truncated: "
                                            + std::to_string(lbl->size())
                                            + " bytes, an IDX label header needs 8");
  if (auto m = be32(lbl->data()); m != labels_magic)
    return make_error(errc::corrupt_data, labels_path + " has magic " + hex(m)
                                            + ", expected " + hex(labels_magic)
                                            + " (IDX unsigned-byte labels)");
  uint64_t nl = be32(lbl->data() + 4);
  if (nl != n)
    return make_error(errc::corrupt_data, labels_path + " has " + std::to_string(nl)
                                            + " labels but " + images_path + " has "
                                            + std::to_string(n) + " images");
  if (lbl->size() != 8 + n)
    return make_error(errc::corrupt_data, labels_path + " holds " + (lbl->size() > 8 + n ? "more than " : "")
                                            + std::to_string(lbl->size() > 8 + n ? 8 + n : lbl->size())
                                            + " bytes, its header needs " + std::to_string(8 + n));
  dataset d;
  d.n = n;
  d.dim = rows * cols;
  d.shape = tensor_shape{1, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols)};
  d.classes = 10;
  d.y.assign(lbl->begin() + 8, lbl->end());
  for (size_t i = 0; i < n; ++i)
    if (d.y[i] >= d.classes)
      return make_error(errc::corrupt_data, labels_path + ": label " + std::to_string(d.y[i])
                                              + " at index " + std::to_string(i)
                                              + " is not in [0, 10)");
  // Kept as the bytes they are; each batch is standardized as it is made.
  // The file's own buffer becomes the pixels (no second copy, even for a moment), or the
  // host's shared copy of them.
  if (cached) {
    d.pixels = std::move(cached);
  } else {
    std::memcpy(header, img->data(), sizeof header);
    img->erase(img->begin(), img->begin() + 16);
    img->resize(n * d.dim);
    d.pixels = share_pixels(images_path, header, std::move(*img));
  }
  d.pixel_scale = 1.0f / (255.0f * fmnist_std);
  d.pixel_shift = fmnist_mean / fmnist_std;
  return d;
}

expected<dataset> load_fashion_mnist(const std::string& dir, split which) {
  std::string prefix = which == split::train ? "train" : "t10k";
  auto pick = [&](const std::string& stem) {
    std::string base = dir + "/" + prefix + "-" + stem;
    struct stat st;
    if (::stat((base + ".gz").c_str(), &st) == 0)
      return base + ".gz";
    if (::stat(base.c_str(), &st) == 0)
      return base;
    return base + ".gz";
  };
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return make_error(errc::io_error,
                      "Fashion-MNIST directory " + dir
                        + " does not exist (install Debian's dataset-fashion-mnist, or set "
                          "data.dir / --data-dir / ASHLAR_DATA_DIR)");
  const auto images = pick("images-idx3-ubyte");
  if (::stat(images.c_str(), &st) != 0) {
    // A directory of .npy files, read as Fashion-MNIST's: say which source reads them.
    std::error_code ec;
    for (std::filesystem::directory_iterator it{dir, ec}, end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".npy")
        return make_error(errc::io_error, "cannot open " + images + ": " + dir + " holds .npy files ("
                                            + it->path().filename().string()
                                            + "); read them with data.source=npy (--set data.source=npy)");
    return make_error(errc::io_error, "cannot open " + images + ": " + dir + " holds no Fashion-MNIST files "
                                        "(train-images-idx3-ubyte[.gz] and the others); for .npy files set "
                                        "data.source=npy");
  }
  return load_idx(images, pick("labels-idx1-ubyte"));
}

void dataset::truncate(size_t limit) {
  if (limit == 0 || limit >= n)
    return;
  n = limit;
  if (!compact()) {
    x.resize(n * dim);
    x.shrink_to_fit();
  }
  y.resize(n);
}

void dataset::sample(size_t i, float* out) const {
  if (!compact()) {
    std::memcpy(out, x.data() + i * dim, dim * sizeof(float));
    return;
  }
  const uint8_t* px = pixels.get() + i * dim;
  for (size_t j = 0; j < dim; ++j)
    out[j] = static_cast<float>(px[j]) * pixel_scale - pixel_shift;
}

void dataset::expand() {
  if (!compact())
    return;
  x.resize(n * dim);
  for (size_t i = 0; i < n; ++i)
    sample(i, x.data() + i * dim);
  pixels.reset();
}

dataset make_synthetic(size_t n, size_t dim, uint32_t classes, uint64_t seed) {
  std::mt19937_64 gen{seed};
  std::normal_distribution<float> noise{0.0f, 1.0f};
  std::vector<float> centres(size_t{classes} * dim);
  for (auto& c : centres)
    c = noise(gen) * 0.5f;
  dataset d;
  d.n = n;
  d.dim = dim;
  d.shape = tensor_shape{static_cast<uint32_t>(dim), 1, 1};
  d.classes = classes;
  d.x.resize(n * dim);
  d.y.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto label = static_cast<uint8_t>(gen() % classes);
    d.y[i] = label;
    for (size_t j = 0; j < dim; ++j)
      d.x[i * dim + j] = centres[label * dim + j] + noise(gen);
  }
  return d;
}

batch_cursor::batch_cursor(const dataset& data, size_t begin, size_t count, uint64_t seed)
  : data_(&data), seed_(seed) {
  indices_.resize(count);
  for (size_t i = 0; i < count; ++i)
    indices_[i] = static_cast<uint32_t>(begin + i);
  shuffle();
}

void batch_cursor::shuffle() {
  std::mt19937_64 gen{seed_ * 0x9E3779B97F4A7C15ull + epoch_};
  // Fisher-Yates with our own index draw: std::shuffle's use of the generator is
  // library-defined, this is fixed.
  for (size_t i = indices_.size(); i > 1; --i) {
    size_t j = gen() % i;
    std::swap(indices_[i - 1], indices_[j]);
  }
}

void batch_cursor::seek(size_t epoch, size_t pos) {
  // Each pass reshuffles the order the pass before left, so replay them from the start.
  std::sort(indices_.begin(), indices_.end());
  epoch_ = 0;
  shuffle();
  while (epoch_ < epoch) {
    ++epoch_;
    shuffle();
  }
  pos_ = std::min(pos, indices_.size());
}

void batch_cursor::augment(size_t i, float* sample) {
  const auto& sh = data_->shape;
  if (sh.flat())
    return;
  // One draw per (seed, pass, position): the same sample at the same place of the same
  // pass gets the same crop and flip, whoever draws it (a resumed worker included).
  std::mt19937_64 gen{(seed_ * 0x9E3779B97F4A7C15ull + epoch_) * 0xD1B54A32D192ED03ull + i};
  const int p = static_cast<int>(data_->crop_padding);
  const int dy = p > 0 ? static_cast<int>(gen() % (2 * static_cast<uint64_t>(p) + 1)) - p : 0;
  const int dx = p > 0 ? static_cast<int>(gen() % (2 * static_cast<uint64_t>(p) + 1)) - p : 0;
  const bool flip = data_->hflip && (gen() & 1);
  if (dy == 0 && dx == 0 && !flip)
    return;
  const int h = static_cast<int>(sh.h), w = static_cast<int>(sh.w);
  tmp_.assign(sample, sample + sh.size());
  for (uint32_t c = 0; c < sh.c; ++c) {
    const float* src = tmp_.data() + size_t{c} * sh.h * sh.w;
    float* dst = sample + size_t{c} * sh.h * sh.w;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        // Output (y, x) of the crop reads padded pixel (y + dy, x + dx), mirrored first.
        const int sy = y + dy, sx0 = x + dx;
        const int sx = flip ? w - 1 - sx0 : sx0;
        dst[y * w + x] = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? src[sy * w + sx] : 0.0f;
      }
  }
}

size_t pass_step_end(size_t count, size_t batch, size_t pos) {
  if (count == 0)
    return 0;
  if (pos >= count)
    return count;
  const size_t b = std::max<size_t>(1, batch);
  const size_t steps = (count + b - 1) / b;
  // The step boundaries of a pass are ceil(count * j / steps), j = 1..steps (the larger
  // steps first: a pass cut short by a new part has trained no less than step_samples a
  // step); the step from `pos` ends at the first one past it (a resumed position may fall
  // between two).
  auto boundary = [&](size_t j) { return (count * j + steps - 1) / steps; };
  size_t j = pos * steps / count;
  while (boundary(j) <= pos)
    ++j;
  return boundary(j);
}

void batch_cursor::release() {
  std::vector<float>().swap(xb_);
  decltype(yb_)().swap(yb_);
}

batch_view batch_cursor::next(size_t batch) {
  if (indices_.empty())
    return {};
  if (pos_ >= indices_.size()) {
    pos_ = 0;
    ++epoch_;
    shuffle();
  }
  const size_t take = pass_step_end(indices_.size(), batch, pos_) - pos_;
  const size_t dim = data_->dim;
  xb_.resize(take * dim);
  yb_.resize(take);
  for (size_t i = 0; i < take; ++i) {
    uint32_t idx = indices_[pos_ + i];
    data_->sample(idx, xb_.data() + i * dim);
    yb_[i] = data_->y[idx];
    if (data_->crop_padding > 0 || data_->hflip)
      augment(pos_ + i, xb_.data() + i * dim);
  }
  pos_ += take;
  return {xb_.data(), yb_.data(), take, dim};
}

} // namespace ashlar
