#include <catch2/catch.hpp>

#include <algorithm>
#include <unistd.h>
#include <filesystem>
#include <thread>
#include <fcntl.h>
#include <sys/stat.h>

#include <zlib.h>

#include "runtime/data/dataset.hpp"
#include "temp_dir.hpp"

using namespace ashlar;
using ashlar::test::temp_dir;

namespace {

void be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8)
    v.push_back(static_cast<uint8_t>(x >> s));
}

std::vector<uint8_t> images(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::vector<uint8_t> v;
  be32(v, magic);
  be32(v, n);
  be32(v, rows);
  be32(v, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i)
    v.push_back(static_cast<uint8_t>(i * 37));
  return v;
}

std::vector<uint8_t> labels(uint32_t n, uint32_t magic = 0x801) {
  std::vector<uint8_t> v;
  be32(v, magic);
  be32(v, n);
  for (uint32_t i = 0; i < n; ++i)
    v.push_back(static_cast<uint8_t>(i % 10));
  return v;
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& in) {
  uLongf cap = compressBound(in.size()) + 32;
  std::vector<uint8_t> out(cap);
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string error_text(const expected<dataset>& r) {
  REQUIRE_FALSE(r);
  return describe(r.error());
}

}  // namespace

namespace {

// The host's data cache in a directory of the test's, for the scope.
struct cache_in {
  explicit cache_in(const std::string& dir) { ::setenv("ASHLAR_CACHE_DIR", dir.c_str(), 1); }
  ~cache_in() { ::unsetenv("ASHLAR_CACHE_DIR"); }
};

size_t files_in(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator{dir, ec}; !ec && it != std::filesystem::directory_iterator{}; ++it)
    ++n;
  return n;
}

}  // namespace

TEST_CASE("the IDX reader loads well-formed plain and gzip files") {
  temp_dir dir;
  cache_in cache{dir.file("cache")};
  auto img = images(3, 2, 2);
  auto lbl = labels(3);
  for (bool gz : {false, true}) {
    auto ip = dir.write(gz ? "i.gz" : "i", gz ? gzip(img) : img);
    auto lp = dir.write(gz ? "l.gz" : "l", gz ? gzip(lbl) : lbl);
    auto d = load_idx(ip, lp);
    REQUIRE(d);
    CHECK(d->n == 3);
    CHECK(d->dim == 4);
    CHECK(d->y == std::vector<uint8_t>{0, 1, 2});
    // Kept as bytes, a quarter of floats' memory; a sample standardizes them, pixel 0
    // (0) to -mean/std.
    CHECK(d->compact());
    CHECK(d->x.empty());
    float s0[4];
    d->sample(0, s0);
    CHECK(s0[0] == Approx(-0.2860f / 0.3530f));
    CHECK(s0[1] == Approx((37 / 255.0f - 0.2860f) / 0.3530f));
    // As floats, the same values; a cursor's batch too.
    auto e = *d;
    e.expand();
    CHECK_FALSE(e.compact());
    REQUIRE(e.x.size() == 12);
    CHECK(e.x[1] == s0[1]);
    batch_cursor c{*d, 0, 3, 1};
    auto b = c.next(3);
    REQUIRE(b.n == 3);
    for (size_t k = 0; k < 3; ++k) {
      float one[4];
      d->sample(b.y[k], one); // labels 0, 1, 2 name their sample
      CHECK(std::equal(one, one + 4, b.x + k * 4));
    }
  }
}

TEST_CASE("a truncated IDX image file is refused, naming the file and the sizes") {
  temp_dir dir;
  auto img = images(3, 2, 2);
  img.resize(img.size() - 3);
  auto msg = error_text(load_idx(dir.write("i", img), dir.write("l", labels(3))));
  CHECK(msg.find("corrupt_data") == 0);
  CHECK(msg.find(dir.file("i")) != std::string::npos);
  CHECK(msg.find("needs 28") != std::string::npos);
}

TEST_CASE("an IDX file shorter than its header is refused") {
  temp_dir dir;
  auto msg = error_text(load_idx(dir.write("i", std::vector<uint8_t>{0, 0, 8}), dir.write("l", labels(1))));
  CHECK(msg.find("truncated") != std::string::npos);
}

TEST_CASE("an IDX file with a wrong magic number is refused") {
  temp_dir dir;
  auto msg = error_text(load_idx(dir.write("i", images(2, 2, 2, 0x1234)), dir.write("l", labels(2))));
  CHECK(msg.find("magic 0x00001234") != std::string::npos);
  msg = error_text(load_idx(dir.write("i2", images(2, 2, 2)), dir.write("l2", labels(2, 0x803))));
  CHECK(msg.find("expected 0x00000801") != std::string::npos);
}

TEST_CASE("image and label counts that disagree are refused") {
  temp_dir dir;
  auto msg = error_text(load_idx(dir.write("i", images(3, 2, 2)), dir.write("l", labels(2))));
  CHECK(msg.find("has 2 labels but") != std::string::npos);
}

TEST_CASE("a label outside 0..9 is refused") {
  temp_dir dir;
  auto lbl = labels(2);
  lbl.back() = 12;
  auto msg = error_text(load_idx(dir.write("i", images(2, 2, 2)), dir.write("l", lbl)));
  CHECK(msg.find("label 12 at index 1") != std::string::npos);
}

TEST_CASE("a damaged gzip stream is refused, not crashed on") {
  temp_dir dir;
  auto gz = gzip(images(50, 4, 4));
  gz.resize(gz.size() / 2);
  auto msg = error_text(load_idx(dir.write("i.gz", gz), dir.write("l", labels(50))));
  CHECK(msg.find("corrupt_data") == 0);
  CHECK(msg.find("i.gz") != std::string::npos);
}

TEST_CASE("a missing file or directory gives io_error naming the path") {
  temp_dir dir;
  auto msg = error_text(load_idx(dir.file("nope"), dir.file("nope2")));
  CHECK(msg.find("io_error") == 0);
  CHECK(msg.find("nope") != std::string::npos);
  auto r = load_fashion_mnist(dir.file("missing-dir"), split::train);
  msg = error_text(r);
  CHECK(msg.find("missing-dir does not exist") != std::string::npos);
  CHECK(msg.find("dataset-fashion-mnist") != std::string::npos);
}

TEST_CASE("the installed Fashion-MNIST loads with 60000 training and 10000 test samples") {
  auto train = load_fashion_mnist("/usr/share/datasets/fashion-mnist", split::train);
  REQUIRE(train);
  CHECK(train->n == 60000);
  CHECK(train->dim == 784);
  auto test = load_fashion_mnist("/usr/share/datasets/fashion-mnist", split::test);
  REQUIRE(test);
  CHECK(test->n == 10000);
  std::vector<size_t> per_class(10, 0);
  for (auto y : test->y)
    per_class[y]++;
  for (auto c : per_class)
    CHECK(c == 1000);
}

namespace {

// n one-feature samples whose feature is their index, so a batch shows which it holds.
dataset index_dataset(size_t n) {
  dataset d;
  d.n = n;
  d.dim = 1;
  d.classes = 2;
  for (size_t i = 0; i < d.n; ++i) {
    d.x.push_back(static_cast<float>(i));
    d.y.push_back(static_cast<uint8_t>(i % 2));
  }
  return d;
}

}  // namespace

TEST_CASE("a batch cursor visits each of its samples once per epoch, in a seeded order") {
  auto d = index_dataset(100);
  batch_cursor a{d, 10, 50, 9}, b{d, 10, 50, 9}, c{d, 10, 50, 10};
  std::vector<int> seen(d.n, 0);
  bool differs = false;
  for (int i = 0; i < 7; ++i) { // 50 samples in 7 batches of at most 8: one of 8, six of 7
    auto x = a.next(8);
    auto y = b.next(8);
    auto z = c.next(8);
    REQUIRE(x.n == (i < 1 ? 8u : 7u));
    CHECK(std::equal(x.x, x.x + x.n, y.x));
    differs = differs || !std::equal(x.x, x.x + x.n, z.x);
    for (size_t k = 0; k < x.n; ++k)
      seen[static_cast<size_t>(x.x[k])]++;
  }
  for (size_t i = 0; i < d.n; ++i)
    CHECK(seen[i] == (i >= 10 && i < 60 ? 1 : 0));
  CHECK(differs);
  CHECK(a.epoch() == 0);
  a.next(8);
  CHECK(a.epoch() == 1);
}

// A lockstep job's planner counts what a step trains as step_samples: count / the pass's
// steps. The cursor's steps must train that wherever a pass stands (a plan moves a member's
// part mid-pass, and a new part starts a new pass): no step of a few leftover samples, and
// no prefix of a pass behind the average.
TEST_CASE("a pass is split into ceil(count over batch) steps of near-equal size, none behind the average") {
  for (size_t count : {1, 5, 37, 58, 64, 65, 67, 127, 128, 129, 1000, 15000})
    for (size_t batch : {1, 7, 8, 32, 64, 100}) {
      const size_t steps = (count + batch - 1) / batch;
      size_t pos = 0, n = 0, first = 0;
      std::vector<size_t> sizes;
      while (pos < count) {
        const size_t end = pass_step_end(count, batch, pos);
        REQUIRE(end > pos);
        sizes.push_back(end - pos);
        pos = end;
        ++n;
      }
      INFO("count " << count << ", batch " << batch);
      CHECK(n == steps);
      CHECK(pos == count);
      first = sizes.front();
      const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
      CHECK(*hi <= batch);
      CHECK(*hi - *lo <= 1);
      CHECK(static_cast<double>(first) * static_cast<double>(steps) >= static_cast<double>(count));
      // However far a pass got, its steps trained no less than step_samples each.
      size_t done = 0;
      for (size_t j = 0; j < sizes.size(); ++j) {
        done += sizes[j];
        CHECK(done * steps >= (j + 1) * count);
      }
    }
  // A position between two boundaries (a resumed job's) ends its step at the next one.
  CHECK(pass_step_end(67, 64, 0) == 34);
  CHECK(pass_step_end(67, 64, 10) == 34);
  CHECK(pass_step_end(67, 64, 34) == 67);
  CHECK(pass_step_end(67, 64, 80) == 67);
}

TEST_CASE("a batch cursor sought to a pass and offset returns the batches a running cursor returns there") {
  auto d = index_dataset(60);
  batch_cursor running{d, 5, 37, 11};
  for (int i = 0; i < 23; ++i) // 37 in batches of 8, 7, 8, 7, 7 per pass: ends in pass 4, 23 in
    running.next(8);
  REQUIRE(running.epoch() == 4);
  REQUIRE(running.pos() == 23);
  batch_cursor sought{d, 5, 37, 11};
  sought.next(8);
  sought.seek(running.epoch(), running.pos());
  CHECK(sought.epoch() == 4);
  for (int i = 0; i < 12; ++i) { // on into passes 5 and 6, which reshuffle
    auto x = running.next(8);
    auto y = sought.next(8);
    REQUIRE(x.n == y.n);
    CHECK(std::equal(x.x, x.x + x.n, y.x));
  }
  CHECK(sought.epoch() == running.epoch());
  // Passes count from the cursor's start, so a fresh cursor at pass 0 differs from pass 4.
  batch_cursor fresh{d, 5, 37, 11};
  fresh.seek(4, 23);
  batch_cursor zero{d, 5, 37, 11};
  zero.seek(0, 23);
  auto a = fresh.next(8), b = zero.next(8);
  CHECK_FALSE(std::equal(a.x, a.x + a.n, b.x));
}

TEST_CASE("an IDX file is decompressed no further than its header declares: a gzip bomb costs no more than that") {
  ashlar::test::temp_dir dir;
  // A valid header for 10 images of 4x4, then 64 MiB of zeros (a few KB compressed).
  auto img = images(10, 4, 4);
  img.resize(img.size() + (64u << 20), 0);
  auto lbl = labels(10);
  auto ip = dir.write("bomb.gz", gzip(img));
  auto lp = dir.write("l", lbl);
  auto d = load_idx(ip, lp);
  REQUIRE_FALSE(d);
  CHECK(describe(d.error()).find("holds more than 176 bytes") != std::string::npos);
  // A header that declares more than Ashlar reads is refused before any of it is read.
  std::vector<uint8_t> huge = {0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x10, 0, 0, 0, 0x10, 0};
  auto hp = dir.write("huge.gz", gzip(huge));
  auto h = load_idx(hp, lp);
  REQUIRE_FALSE(h);
  CHECK(describe(h.error()).find("declares more than 8 GiB") != std::string::npos);
}

TEST_CASE("processes that load one IDX file map one shared copy of its pixels from the host's cache, and a copy "
          "that is not theirs or not whole is not used") {
  temp_dir dir;
  cache_in cache{dir.file("cache")};
  auto img = images(3, 2, 2);
  auto ip = dir.write("i", img);
  auto lp = dir.write("l", labels(3));
  auto first = load_idx(ip, lp);
  REQUIRE(first);
  CHECK(files_in(dir.file("cache")) == 1);
  auto second = load_idx(ip, lp);
  REQUIRE(second);
  // The second maps the file the first wrote: the same pages, read-only.
  const auto cached = std::filesystem::directory_iterator{dir.file("cache")}->path().string();
  struct stat st{};
  REQUIRE(::stat(cached.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_size == 16 + 12);
  float a[4], b[4];
  for (size_t i = 0; i < 3; ++i) {
    first->sample(i, a);
    second->sample(i, b);
    CHECK(std::equal(a, a + 4, b));
  }
  // What sample i holds, from the file's bytes.
  auto expect = [&](size_t i, float* out) {
    for (size_t j = 0; j < 4; ++j)
      out[j] = static_cast<float>(img[16 + i * 4 + j]) * (1.0f / (255.0f * 0.3530f)) - 0.2860f / 0.3530f;
  };
  first->pixels.reset(); // the mappings go before the copy is tampered with
  second->pixels.reset();
  // A copy cut short (a process of this user died writing it in place, a full disk) is
  // not mapped: the loader decodes the file again and writes a whole copy.
  ::truncate(cached.c_str(), 20);
  auto third = load_idx(ip, lp);
  REQUIRE(third);
  third->sample(2, b);
  expect(2, a);
  CHECK(std::equal(a, a + 4, b));
  CHECK(std::filesystem::file_size(cached) == 16 + 12);
  // A link planted in its place is not followed.
  std::filesystem::remove(cached);
  std::filesystem::create_symlink(ip, cached);
  auto fourth = load_idx(ip, lp);
  REQUIRE(fourth);
  fourth->sample(1, b);
  expect(1, a);
  CHECK(std::equal(a, a + 4, b));
  // The source changes: its new copy replaces the old one.
  img.back() = 200;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100)); // a new modification time
  dir.write("i", img);
  auto fifth = load_idx(ip, lp);
  REQUIRE(fifth);
  fifth->sample(2, b);
  CHECK(b[3] == Approx((200 / 255.0f - 0.2860f) / 0.3530f));
  size_t copies = 0;
  for (const auto& e : std::filesystem::directory_iterator{dir.file("cache")})
    copies += e.is_symlink() ? 0 : 1;
  CHECK(copies == 1);
}

TEST_CASE("a process that finds the host's copy of an IDX file's pixels maps it from the file's header alone, "
          "decompressing nothing past it") {
  temp_dir dir;
  cache_in cache{dir.file("cache")};
  auto img = images(5000, 28, 28); // (its trailer well past what the header's read inflates)
  auto z = gzip(img);
  auto ip = dir.write("i.gz", z);
  auto lp = dir.write("l", labels(5000));
  auto first = load_idx(ip, lp);
  REQUIRE(first);
  first->pixels.reset();
  // The gzip stream's check sum is damaged under the same size and modification time (the
  // cache's key): a loader that decompressed the file to its end would fail; this one maps
  // the copy from the header alone.
  struct stat st{};
  REQUIRE(::stat(ip.c_str(), &st) == 0);
  z[z.size() - 8] ^= 0xff; // the CRC-32 in the trailer
  dir.write("i.gz", z);
  const timespec times[2] = {st.st_atim, st.st_mtim};
  REQUIRE(::utimensat(AT_FDCWD, ip.c_str(), times, 0) == 0);
  auto second = load_idx(ip, lp);
  INFO((second ? std::string{} : describe(second.error())));
  REQUIRE(second);
  std::vector<float> a(784), b(784);
  second->sample(4999, b.data());
  for (size_t j = 0; j < 784; ++j)
    a[j] = static_cast<float>(img[16 + 4999 * 784 + j]) * (1.0f / (255.0f * 0.3530f)) - 0.2860f / 0.3530f;
  CHECK(a == b);
  // Without the cache the file is decompressed whole, and the damage found.
  ::setenv("ASHLAR_CACHE_DIR", "off", 1);
  const auto why = error_text(load_idx(ip, lp));
  INFO(why);
  CHECK(why.find("gzip stream") != std::string::npos);
  CHECK(why.find("incorrect data check") != std::string::npos);
}
