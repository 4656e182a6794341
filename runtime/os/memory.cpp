#include "runtime/os/memory.hpp"

#include <algorithm>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace ashlar {

uint32_t host_slot_limit(unsigned cores, uint64_t available) {
  uint64_t limit = uint64_t{64} * std::max(1u, cores);
  if (available > 0)
    limit = std::min<uint64_t>(limit, available / (uint64_t{32} << 20));
  return static_cast<uint32_t>(std::max<uint64_t>(1, limit));
}

uint64_t available_memory_bytes() {
  std::ifstream in{"/proc/meminfo"};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields{line};
    std::string name;
    uint64_t kib = 0;
    if (fields >> name >> kib && name == "MemAvailable:")
      return kib * 1024;
  }
  return 0;
}

caf::error check_model_memory(uint64_t params, uint64_t copies, uint64_t available, const std::string& model) {
  const double need = static_cast<double>(params) * sizeof(float) * static_cast<double>(copies);
  if (available == 0 || need <= static_cast<double>(available))
    return caf::none;
  char text[160];
  std::snprintf(text, sizeof text, "about %.1f GiB (%llu parameters x 4 bytes x %llu copies), and %.1f GiB is available",
                need / (1u << 30), static_cast<unsigned long long>(params), static_cast<unsigned long long>(copies),
                static_cast<double>(available) / (1u << 30));
  return make_error(errc::invalid_config, "model " + model + " does not fit in this machine's memory: it needs "
                                            + text + "; use a smaller model, fewer workers per process, or a cluster");
}

}  // namespace ashlar
