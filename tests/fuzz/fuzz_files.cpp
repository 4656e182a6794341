// libFuzzer harness: the readers of files a user or a crash leaves behind: checkpoint
// records, TOML configuration, NumPy .npy and IDX files. The first byte picks the reader.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "runtime/policy/policy_rules.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/data/npy.hpp"
#include "runtime/store/checkpoint.hpp"

using namespace ashlar;

namespace {

std::string scratch(const char* name) {
  return "/tmp/ashlar-fuzz-" + std::to_string(::getpid()) + "-" + name;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ::setenv("ASHLAR_CACHE_DIR", "off", 1); // no copy of each input's pixels in the user's cache
  if (size < 1)
    return 0;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 4) {
    case 0: {
      (void) decode_checkpoint(std::string{reinterpret_cast<const char*>(body), n});
      break;
    }
    case 1: {
      train_config cfg;
      if (!apply_toml_text(cfg, std::string{reinterpret_cast<const char*>(body), n}, "fuzz.toml"))
        (void) validate_job(cfg);
      break;
    }
    case 2: {
      auto path = scratch("x.npy");
      write_file(path, body, n);
      (void) read_npy(path);
      std::remove(path.c_str());
      break;
    }
    case 3: {
      // Images and labels: the input split in two at its second byte's proportion.
      size_t cut = n == 0 ? 0 : (n * body[0]) / 256;
      auto images = scratch("images.idx"), labels = scratch("labels.idx");
      write_file(images, body, cut);
      write_file(labels, body + cut, n - cut);
      (void) load_idx(images, labels);
      std::remove(images.c_str());
      std::remove(labels.c_str());
      break;
    }
  }
  return 0;
}
