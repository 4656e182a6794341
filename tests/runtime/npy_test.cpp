#include <catch2/catch.hpp>

#include <cstring>
#include <cmath>
#include <numeric>
#include <set>

#include "runtime/data/dataset.hpp"
#include "temp_dir.hpp"

using namespace ashlar;
using ashlar::test::temp_dir;

namespace {

// A .npy file as numpy.save writes it (format 1.0, header padded to 64 bytes).
std::vector<uint8_t> npy(const std::string& descr, const std::string& shape, const std::vector<uint8_t>& data,
                         const std::string& fortran = "False") {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': (" + shape + "), }";
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<uint8_t>(header.size() & 0xff));
  out.push_back(static_cast<uint8_t>(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// n samples of c x h x w uint8 pixels, labels i % classes as int64.
void write_set(const temp_dir& d, const std::string& split, uint32_t n, tensor_shape s, uint32_t classes) {
  std::vector<uint8_t> px(n * s.size());
  for (size_t i = 0; i < px.size(); ++i)
    px[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<int64_t> y(n);
  for (uint32_t i = 0; i < n; ++i)
    y[i] = i % classes;
  d.write("x_" + split + ".npy", npy("|u1", std::to_string(n) + ", " + std::to_string(s.c) + ", " + std::to_string(s.h)
                                              + ", " + std::to_string(s.w), px));
  d.write("y_" + split + ".npy", npy("<i8", std::to_string(n) + ",", bytes_of(y)));
}

std::string error_of(const expected<npy_data>& r) {
  REQUIRE_FALSE(r);
  return describe(r.error());
}

}  // namespace

TEST_CASE("NumPy data loads with its shape, uint8 samples standardized per channel with the training statistics") {
  temp_dir d;
  write_set(d, "train", 20, {3, 4, 5}, 4);
  write_set(d, "test", 8, {3, 4, 5}, 4);
  auto r = load_npy_dataset(d.path(), {3, 4, 5}, 4);
  REQUIRE(r);
  CHECK(r->train.n == 20);
  CHECK(r->test.n == 8);
  CHECK(r->train.dim == 60);
  CHECK(r->train.shape == tensor_shape{3, 4, 5});
  CHECK(r->train.y[5] == 1);
  for (uint32_t c = 0; c < 3; ++c) {
    double sum = 0, sq = 0;
    for (size_t i = 0; i < 20; ++i)
      for (size_t j = 0; j < 20; ++j) {
        double v = r->train.x[i * 60 + c * 20 + j];
        sum += v;
        sq += v * v;
      }
    CHECK(sum / 400 == Approx(0).margin(1e-4));
    CHECK(sq / 400 == Approx(1).epsilon(1e-3));
  }
}

TEST_CASE("NumPy float32 samples load as they are, channels-last arrays move to channel-major") {
  temp_dir d;
  // 2 samples of 2x2 pixels and 3 channels, channels last: value = 100*sample + 10*pixel + channel.
  std::vector<float> x;
  for (int s = 0; s < 2; ++s)
    for (int p = 0; p < 4; ++p)
      for (int c = 0; c < 3; ++c)
        x.push_back(static_cast<float>(100 * s + 10 * p + c));
  std::vector<int32_t> y = {1, 0};
  for (const char* split : {"train", "test"}) {
    d.write(std::string{"x_"} + split + ".npy", npy("<f4", "2, 2, 2, 3", bytes_of(x)));
    d.write(std::string{"y_"} + split + ".npy", npy("<i4", "2, 1", bytes_of(y)));
  }
  auto r = load_npy_dataset(d.path(), {3, 2, 2}, 2);
  REQUIRE(r);
  // Channel-major: sample 1, channel 2, pixel 3 = 100 + 30 + 2.
  CHECK(r->train.x[12 + 2 * 4 + 3] == 132.0f);
  CHECK(r->train.x[0 * 4 + 1] == 10.0f);
  CHECK(r->test.y == std::vector<uint8_t>{1, 0});
}

TEST_CASE("a bad NumPy file gets one error naming the file and what is wrong") {
  temp_dir d;
  write_set(d, "train", 10, {1, 4, 4}, 3);
  write_set(d, "test", 5, {1, 4, 4}, 3);
  const auto xtr = d.file("x_train.npy"), ytr = d.file("y_train.npy");
  SECTION("wrong magic") {
    d.write("x_train.npy", std::string{"PK\x03\x04 not numpy at all"});
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 3)) == "corrupt_data: " + xtr
                                                                   + ": not a .npy file (no \\x93NUMPY magic; "
                                                                     "write it with numpy.save)");
  }
  SECTION("wrong dtype") {
    d.write("x_train.npy", npy("<f8", "10, 1, 4, 4", std::vector<uint8_t>(10 * 16 * 8)));
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 3)).find(xtr + ": samples have dtype '<f8': float32 or uint8")
          != std::string::npos);
  }
  SECTION("wrong shape") {
    CHECK(error_of(load_npy_dataset(d.path(), {1, 5, 5}, 3))
          == "corrupt_data: " + xtr + ": samples have shape (10, 1, 4, 4), model.input 1x5x5 needs (N, 1, 5, 5) "
                                      "(or channels last)");
  }
  SECTION("label out of range") {
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 2))
          == "corrupt_data: " + ytr + ": label 2 of sample 2 is not in [0, 2) (model.classes = 2)");
  }
  SECTION("counts that differ") {
    std::vector<int64_t> y(9, 0);
    d.write("y_train.npy", npy("<i8", "9,", bytes_of(y)));
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 3))
          == "corrupt_data: " + ytr + ": 9 labels for the 10 samples of " + xtr);
  }
  SECTION("data shorter than the header says") {
    auto bytes = npy("|u1", "10, 1, 4, 4", std::vector<uint8_t>(150));
    d.write("x_train.npy", bytes);
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 3))
          .find(xtr + ": shape (10, 1, 4, 4) of |u1 needs 160 data bytes, the file has 150")
          != std::string::npos);
  }
  SECTION("float labels, Fortran order, a missing file") {
    d.write("y_train.npy", npy("<f4", "10,", std::vector<uint8_t>(40)));
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 3)).find(ytr + ": labels have dtype '<f4'")
          != std::string::npos);
    d.write("x_train.npy", npy("|u1", "10, 1, 4, 4", std::vector<uint8_t>(160), "True"));
    CHECK(error_of(load_npy_dataset(d.path(), {1, 4, 4}, 3)).find("Fortran-ordered") != std::string::npos);
    CHECK(error_of(load_npy_dataset(d.path() + "/nowhere", {1, 4, 4}, 3))
          .find("io_error: cannot open " + d.path() + "/nowhere/x_train.npy")
          != std::string::npos);
  }
}

TEST_CASE("augmentation crops and flips each epoch anew, the same way for the same seed, pass and position") {
  dataset d;
  d.n = 4;
  d.shape = {1, 6, 6};
  d.dim = 36;
  d.classes = 2;
  d.x.resize(4 * 36);
  for (size_t i = 0; i < d.x.size(); ++i)
    d.x[i] = static_cast<float>(i % 36 + 1); // every pixel nonzero: padding shows as 0
  d.y = {0, 1, 0, 1};
  d.crop_padding = 2;
  d.hflip = true;
  batch_cursor a{d, 0, 4, 5}, b{d, 0, 4, 5};
  std::set<std::vector<float>> seen;
  size_t padded = 0;
  for (int epoch = 0; epoch < 6; ++epoch) {
    auto va = a.next(4);
    auto vb = b.next(4);
    REQUIRE(va.n == 4);
    CHECK(std::equal(va.x, va.x + 4 * 36, vb.x));
    for (size_t s = 0; s < 4; ++s) {
      std::vector<float> img(va.x + s * 36, va.x + (s + 1) * 36);
      seen.insert(img);
      for (float v : img) {
        padded += v == 0.0f;
        // Every value is a pixel of the image or padding.
        CHECK(((v >= 0.0f && v <= 36.0f) && v == std::floor(v)));
      }
    }
  }
  CHECK(seen.size() > 12); // one image, many crops and flips
  CHECK(padded > 0);
  // Without augmentation the batches are the images themselves.
  d.crop_padding = 0;
  d.hflip = false;
  batch_cursor plain{d, 0, 4, 5};
  auto v = plain.next(4);
  std::multiset<float> sums;
  for (size_t s = 0; s < 4; ++s)
    CHECK(std::accumulate(v.x + s * 36, v.x + (s + 1) * 36, 0.0f) == 666.0f);
}
