// NumPy .npy files: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/stat.h>

#include <zlib.h>

#include "runtime/data/dataset.hpp"

namespace ashlar {

namespace {

caf::error corrupt(const std::string& path, const std::string& what) {
  return make_error(errc::corrupt_data, path + ": " + what);
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// The value of 'key' in the header's Python dict literal, as text up to its end.
bool dict_value(const std::string& header, const std::string& key, std::string& out) {
  auto k = header.find("'" + key + "'");
  if (k == std::string::npos)
    return false;
  auto colon = header.find(':', k);
  if (colon == std::string::npos)
    return false;
  auto b = header.find_first_not_of(" ", colon + 1);
  if (b == std::string::npos)
    return false;
  size_t e;
  if (header[b] == '\'') {
    e = header.find('\'', b + 1);
    if (e == std::string::npos)
      return false;
    out = header.substr(b + 1, e - b - 1);
    return true;
  }
  if (header[b] == '(') {
    e = header.find(')', b);
    if (e == std::string::npos)
      return false;
    out = header.substr(b + 1, e - b - 1);
    return true;
  }
  e = header.find_first_of(",}", b);
  if (e == std::string::npos)
    return false;
  out = header.substr(b, e - b);
  while (!out.empty() && out.back() == ' ')
    out.pop_back();
  return true;
}

size_t dtype_size(const std::string& d) {
  if (d.size() < 3)
    return 0;
  if (d[0] != '<' && d[0] != '|' && d[0] != '=')
    return 0;
  auto bytes = std::strtoul(d.c_str() + 2, nullptr, 10);
  if ((d[1] != 'f' && d[1] != 'i' && d[1] != 'u') || (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8))
    return 0;
  if (bytes > 1 && d[0] == '|')
    return 0;
  return bytes;
}

// Label i of an integer array, or -1 if the dtype is not an integer.
int64_t label_at(const npy_array& a, size_t i) {
  const uint8_t* p = a.bytes.data();
  const char t = a.dtype[1];
  const size_t w = dtype_size(a.dtype);
  if (t == 'u') {
    uint64_t v = 0;
    std::memcpy(&v, p + i * w, w);
    return v > INT64_MAX ? INT64_MAX : static_cast<int64_t>(v);
  }
  switch (w) {
    case 1: return static_cast<int8_t>(p[i]);
    case 2: { int16_t v; std::memcpy(&v, p + i * 2, 2); return v; }
    case 4: { int32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    default: { int64_t v; std::memcpy(&v, p + i * 8, 8); return v; }
  }
}

}  // namespace

expected<npy_array> read_npy(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return make_error(errc::io_error, path + " is a directory, expected a .npy file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  struct closer {
    std::FILE* f;
    ~closer() { std::fclose(f); }
  } close_it{f};
  uint8_t pre[12];
  size_t got = std::fread(pre, 1, 10, f);
  if (got < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    return corrupt(path, "not a .npy file (no \\x93NUMPY magic; write it with numpy.save)");
  const uint8_t major = pre[6];
  uint64_t header_len = 0;
  uint64_t offset = 10;
  if (major == 1) {
    header_len = uint64_t{pre[8]} | (uint64_t{pre[9]} << 8);
  } else if (major == 2 || major == 3) {
    if (std::fread(pre + 10, 1, 2, f) != 2)
      return corrupt(path, "truncated .npy header");
    header_len = uint64_t{pre[8]} | (uint64_t{pre[9]} << 8) | (uint64_t{pre[10]} << 16) | (uint64_t{pre[11]} << 24);
    offset = 12;
  } else {
    return corrupt(path, ".npy format version " + std::to_string(major) + " is not known (1, 2 or 3)");
  }
  if (header_len > 65536 || offset + header_len > static_cast<uint64_t>(st.st_size))
    return corrupt(path, "the .npy header length " + std::to_string(header_len) + " is implausible");
  std::string header(header_len, '\0');
  if (std::fread(header.data(), 1, header_len, f) != header_len)
    return corrupt(path, "truncated .npy header");
  npy_array a;
  std::string fortran, shape;
  if (!dict_value(header, "descr", a.dtype) || !dict_value(header, "fortran_order", fortran)
      || !dict_value(header, "shape", shape))
    return corrupt(path, "the .npy header lacks descr, fortran_order or shape: " + header);
  if (fortran != "False")
    return corrupt(path, "Fortran-ordered array: save a C-ordered one (numpy.ascontiguousarray)");
  const size_t width = dtype_size(a.dtype);
  if (width == 0)
    return corrupt(path, "dtype '" + a.dtype + "' is not a little-endian integer or float");
  uint64_t count = 1;
  size_t pos = 0;
  while (pos < shape.size()) {
    auto comma = shape.find(',', pos);
    auto item = shape.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? shape.size() : comma + 1;
    auto b = item.find_first_not_of(' ');
    if (b == std::string::npos)
      continue;
    item = item.substr(b, item.find_last_not_of(' ') - b + 1);
    char* end = nullptr;
    errno = 0;
    auto v = std::strtoull(item.c_str(), &end, 10);
    if (errno || *end != '\0' || item[0] == '-')
      return corrupt(path, "the .npy shape (" + shape + ") is not a tuple of sizes");
    a.shape.push_back(v);
    if (v != 0 && count > (uint64_t{1} << 40) / v)
      return corrupt(path, "the .npy shape (" + shape + ") is too large");
    count *= v;
  }
  const uint64_t bytes = count * width;
  const uint64_t have = static_cast<uint64_t>(st.st_size) - offset - header_len;
  if (have != bytes)
    return corrupt(path, "shape " + shape_text(a.shape) + " of " + a.dtype + " needs " + std::to_string(bytes)
                           + " data bytes, the file has " + std::to_string(have));
  a.bytes.resize(bytes);
  if (bytes > 0 && std::fread(a.bytes.data(), 1, bytes, f) != bytes)
    return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  return a;
}

namespace {

// Samples of one split as floats, channel-major, shaped `input`. uint8 ones are scaled
// to [0, 1] (standardized later, with the training set's statistics).
expected<dataset> npy_samples(const std::string& path, const tensor_shape& input, bool& from_bytes) {
  auto a = read_npy(path);
  if (!a)
    return a.error();
  const bool f32 = a->dtype == "<f4" || a->dtype == "=f4";
  const bool u8 = a->dtype == "|u1" || a->dtype == "<u1";
  if (!f32 && !u8)
    return corrupt(path, "samples have dtype '" + a->dtype + "': float32 or uint8 expected "
                         "(x.astype(numpy.float32))");
  from_bytes = u8;
  const auto& s = a->shape;
  const std::string want = "(N, " + std::to_string(input.c) + ", " + std::to_string(input.h) + ", "
                           + std::to_string(input.w) + ")";
  bool nhwc = false;
  if (s.empty() || s[0] == 0)
    return corrupt(path, "holds no samples (shape " + shape_text(s) + ")");
  uint64_t per = 1;
  for (size_t i = 1; i < s.size(); ++i)
    per *= s[i];
  bool ok = false;
  if (s.size() == 4 && s[1] == input.c && s[2] == input.h && s[3] == input.w)
    ok = true;
  else if (s.size() == 4 && s[1] == input.h && s[2] == input.w && s[3] == input.c)
    ok = nhwc = true;
  else if (s.size() == 3 && input.c == 1 && s[1] == input.h && s[2] == input.w)
    ok = true;
  else if (s.size() == 2 && per == input.size() && input.flat())
    ok = true;
  if (!ok)
    return corrupt(path, "samples have shape " + shape_text(s) + ", model.input " + input.to_string() + " needs "
                           + want + (input.flat() ? " or (N, " + std::to_string(input.c) + ")" : "")
                           + " (or channels last)");
  dataset d;
  d.n = s[0];
  d.dim = input.size();
  d.shape = input;
  d.x.resize(d.n * d.dim);
  const uint64_t hw = uint64_t{input.h} * input.w;
  for (size_t i = 0; i < d.n; ++i)
    for (uint64_t j = 0; j < d.dim; ++j) {
      // Destination (c, pixel) reads source (pixel, c) when channels come last.
      const uint64_t src = nhwc ? (j % hw) * input.c + j / hw : j;
      const uint64_t at = i * d.dim + src;
      float v;
      if (u8)
        v = static_cast<float>(a->bytes[at]) / 255.0f;
      else
        std::memcpy(&v, a->bytes.data() + at * 4, 4);
      if (!std::isfinite(v))
        return corrupt(path, "sample " + std::to_string(i) + " holds a non-finite value");
      d.x[i * d.dim + j] = v;
    }
  return d;
}

caf::error npy_labels(const std::string& path, dataset& d, uint32_t classes, const std::string& samples_path) {
  auto a = read_npy(path);
  if (!a)
    return a.error();
  if (a->dtype.size() < 2 || (a->dtype[1] != 'i' && a->dtype[1] != 'u'))
    return corrupt(path, "labels have dtype '" + a->dtype + "': an integer array expected");
  const auto& s = a->shape;
  if (!(s.size() == 1 || (s.size() == 2 && s[1] == 1)))
    return corrupt(path, "labels have shape " + shape_text(s) + ": (N,) or (N, 1) expected");
  if (s[0] != d.n)
    return corrupt(path, std::to_string(s[0]) + " labels for the " + std::to_string(d.n) + " samples of "
                           + samples_path);
  d.y.resize(d.n);
  for (size_t i = 0; i < d.n; ++i) {
    const int64_t v = label_at(*a, i);
    if (v < 0 || v >= static_cast<int64_t>(classes))
      return corrupt(path, "label " + std::to_string(v) + " of sample " + std::to_string(i) + " is not in [0, "
                             + std::to_string(classes) + ") (model.classes = " + std::to_string(classes) + ")");
    d.y[i] = static_cast<uint8_t>(v);
  }
  d.classes = classes;
  return caf::none;
}

}  // namespace

expected<npy_data> load_npy_dataset(const std::string& dir, const tensor_shape& input, uint32_t classes) {
  if (classes > 256)
    return make_error(errc::invalid_config, "model.classes = " + std::to_string(classes)
                                              + ": labels are stored as bytes, at most 256 classes");
  npy_data out;
  bool train_bytes = false, test_bytes = false;
  const auto xtr = dir + "/x_train.npy", xte = dir + "/x_test.npy";
  auto train = npy_samples(xtr, input, train_bytes);
  if (!train)
    return train.error();
  auto test = npy_samples(xte, input, test_bytes);
  if (!test)
    return test.error();
  if (train_bytes != test_bytes)
    return corrupt(xte, std::string{"samples are "} + (test_bytes ? "uint8" : "float32") + " but those of " + xtr
                          + " are " + (train_bytes ? "uint8" : "float32"));
  out.train = std::move(*train);
  out.test = std::move(*test);
  if (auto err = npy_labels(dir + "/y_train.npy", out.train, classes, xtr))
    return err;
  if (auto err = npy_labels(dir + "/y_test.npy", out.test, classes, xte))
    return err;
  if (train_bytes) {
    // Standardize per channel with the training set's statistics.
    const uint64_t hw = uint64_t{input.h} * input.w;
    for (uint32_t c = 0; c < input.c; ++c) {
      double sum = 0, sq = 0;
      for (size_t i = 0; i < out.train.n; ++i)
        for (uint64_t j = 0; j < hw; ++j) {
          const double v = out.train.x[i * out.train.dim + c * hw + j];
          sum += v;
          sq += v * v;
        }
      const double m = static_cast<double>(out.train.n * hw);
      const double mean = sum / m;
      const double sd = std::sqrt(std::max(sq / m - mean * mean, 1e-12));
      for (auto* d : {&out.train, &out.test})
        for (size_t i = 0; i < d->n; ++i)
          for (uint64_t j = 0; j < hw; ++j) {
            float& v = d->x[i * d->dim + c * hw + j];
            v = static_cast<float>((v - mean) / sd);
          }
    }
  }
  return out;
}

}  // namespace ashlar

namespace ashlar {

std::vector<uint8_t> npy_bytes(const npy_array& a) {
  std::string shape;
  for (size_t i = 0; i < a.shape.size(); ++i)
    shape += (i ? ", " : "") + std::to_string(a.shape[i]);
  if (a.shape.size() == 1)
    shape += ",";
  std::string header = "{'descr': '" + a.dtype + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<uint8_t>(header.size() & 0xff));
  out.push_back(static_cast<uint8_t>(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), a.bytes.begin(), a.bytes.end());
  return out;
}

namespace {

void le16(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(static_cast<uint8_t>(x));
  v.push_back(static_cast<uint8_t>(x >> 8));
}
void le32(std::vector<uint8_t>& v, uint32_t x) {
  le16(v, x & 0xffff);
  le16(v, x >> 16);
}

}  // namespace

caf::error write_npz(const std::string& path, const std::vector<std::pair<std::string, npy_array>>& entries) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    return make_error(errc::io_error, "cannot write " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> central;
  uint64_t offset = 0;
  bool ok = true;
  auto put = [&](const std::vector<uint8_t>& b) {
    ok = ok && std::fwrite(b.data(), 1, b.size(), f) == b.size();
    offset += b.size();
  };
  for (const auto& [name, array] : entries) {
    const auto file = name + ".npy";
    const auto data = npy_bytes(array);
    if (offset + data.size() + 1024 > 0xFFFFFFFFull) {
      std::fclose(f);
      return make_error(errc::invalid_argument, path + ": the archive would pass the zip format's 4 GiB");
    }
    const auto crc = static_cast<uint32_t>(::crc32(0L, data.data(), static_cast<uInt>(data.size())));
    // Local file header: stored (method 0), no data descriptor.
    std::vector<uint8_t> h;
    le32(h, 0x04034b50);
    le16(h, 20);
    le16(h, 0);
    le16(h, 0);
    le16(h, 0);
    le16(h, 0x21);
    le32(h, crc);
    le32(h, static_cast<uint32_t>(data.size()));
    le32(h, static_cast<uint32_t>(data.size()));
    le16(h, static_cast<uint32_t>(file.size()));
    le16(h, 0);
    h.insert(h.end(), file.begin(), file.end());
    const auto at = static_cast<uint32_t>(offset);
    put(h);
    put(data);
    le32(central, 0x02014b50);
    le16(central, 20);
    le16(central, 20);
    le16(central, 0);
    le16(central, 0);
    le16(central, 0);
    le16(central, 0x21);
    le32(central, crc);
    le32(central, static_cast<uint32_t>(data.size()));
    le32(central, static_cast<uint32_t>(data.size()));
    le16(central, static_cast<uint32_t>(file.size()));
    le16(central, 0);
    le16(central, 0);
    le16(central, 0);
    le16(central, 0);
    le32(central, 0);
    le32(central, at);
    central.insert(central.end(), file.begin(), file.end());
  }
  const auto dir_at = static_cast<uint32_t>(offset);
  std::vector<uint8_t> end;
  le32(end, 0x06054b50);
  le16(end, 0);
  le16(end, 0);
  le16(end, static_cast<uint32_t>(entries.size()));
  le16(end, static_cast<uint32_t>(entries.size()));
  le32(end, static_cast<uint32_t>(central.size()));
  le32(end, dir_at);
  le16(end, 0);
  put(central);
  put(end);
  if (std::fclose(f) != 0 || !ok)
    return make_error(errc::io_error, "cannot write " + path + ": " + std::strerror(errno));
  return caf::none;
}

}  // namespace ashlar
