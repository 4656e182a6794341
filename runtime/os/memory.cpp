#include "runtime/os/memory.hpp"

#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>
#include <sstream>

#include <sys/mman.h>

namespace ashlar {

uint32_t host_slot_limit(unsigned cores, uint64_t available) {
  uint64_t limit = uint64_t{64} * std::max(1u, cores);
  if (available > 0)
    limit = std::min<uint64_t>(limit, available / (uint64_t{32} << 20));
  return static_cast<uint32_t>(std::max<uint64_t>(1, limit));
}

namespace {

// The first word of a small file, or "" if it cannot be read.
std::string first_word(const std::filesystem::path& p) {
  std::ifstream in{p};
  std::string w;
  in >> w;
  return w;
}

// A limit or usage as a number; nullopt for "max", v1's "unlimited" (near 2^63) or junk.
std::optional<uint64_t> bytes_in(const std::filesystem::path& p) {
  const std::string w = first_word(p);
  if (w.empty() || w.find_first_not_of("0123456789") != std::string::npos || w.size() > 19)
    return std::nullopt;
  const uint64_t v = std::stoull(w);
  if (v >= (uint64_t{1} << 62))
    return std::nullopt;
  return v;
}

// The least room over `dir` and its ancestors up to `mount`, each level's limit less its usage.
std::optional<uint64_t> least_room(std::filesystem::path dir, const std::filesystem::path& mount, const char* limit,
                                   const char* usage) {
  std::optional<uint64_t> room;
  for (;;) {
    auto l = bytes_in(dir / limit);
    if (l) {
      const uint64_t used = bytes_in(dir / usage).value_or(0);
      const uint64_t here = *l > used ? *l - used : 0;
      room = room ? std::min(*room, here) : here;
    }
    if (dir == mount || !dir.has_relative_path() || dir.parent_path() == dir)
      break;
    dir = dir.parent_path();
  }
  return room;
}

}  // namespace

std::optional<uint64_t> cgroup_memory_room(const std::string& root) {
  namespace fs = std::filesystem;
  const fs::path base{root};
  std::ifstream in{base / "proc/self/cgroup"};
  std::string line;
  std::optional<uint64_t> room;
  auto take = [&](std::optional<uint64_t> r) {
    if (r)
      room = room ? std::min(*room, *r) : *r;
  };
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path; v2 is "0::/path".
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos)
      continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    bool memory = false;
    std::istringstream names{controllers};
    for (std::string c; std::getline(names, c, ',');)
      memory = memory || c == "memory";
    if (!v2 && !memory)
      continue;
    std::vector<fs::path> mounts = v2 ? std::vector<fs::path>{base / "sys/fs/cgroup", base / "sys/fs/cgroup/unified"}
                                      : std::vector<fs::path>{base / "sys/fs/cgroup/memory"};
    for (const auto& mount : mounts) {
      std::error_code ec;
      if (!fs::is_directory(mount, ec))
        continue;
      // Inside a container the hierarchy's root is often the container's own cgroup.
      const fs::path rel = fs::path{path}.relative_path();
      fs::path dir = rel.empty() ? mount : mount / rel;
      if (!fs::is_directory(dir, ec))
        dir = mount;
      take(v2 ? least_room(dir, mount, "memory.max", "memory.current")
              : least_room(dir, mount, "memory.limit_in_bytes", "memory.usage_in_bytes"));
    }
  }
  return room;
}

uint64_t available_memory_bytes() {
  std::ifstream in{"/proc/meminfo"};
  std::string line;
  uint64_t available = 0;
  while (std::getline(in, line)) {
    std::istringstream fields{line};
    std::string name;
    uint64_t kib = 0;
    if (fields >> name >> kib && name == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  if (auto room = cgroup_memory_room()) // at least a byte: 0 would read as "not known"
    return std::max<uint64_t>(1, available == 0 ? *room : std::min(available, *room));
  return available;
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

void prefer_huge_pages(const void* p, size_t bytes) {
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  if (bytes < 2 * huge)
    return;
  const auto from = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const auto to = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(huge - 1);
  if (to <= from)
    return;
  auto* at = reinterpret_cast<void*>(from);
  constexpr int collapse = 25; // MADV_COLLAPSE (Linux 6.1); older kernels refuse it, harmlessly
  if (::madvise(at, to - from, MADV_HUGEPAGE) == 0)
    (void) ::madvise(at, to - from, collapse);
}

}  // namespace ashlar
