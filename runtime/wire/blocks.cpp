#include "runtime/wire/blocks.hpp"

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include <sys/mman.h>

namespace ashlar::wire {

namespace {

constexpr size_t cache_bound = size_t{256} << 20;
constexpr auto idle_limit = std::chrono::seconds(5);
constexpr size_t huge_page = size_t{2} << 20;

size_t block_size(size_t bytes) {
  const size_t unit = bytes >= 2 * huge_page ? huge_page : 4096;
  return (bytes + unit - 1) / unit * unit;
}

// The cache's own clock is the machine's: it only decides when idle memory goes back.
using clock = std::chrono::steady_clock;

struct cache {
  std::mutex mtx;
  std::multimap<size_t, std::pair<void*, clock::time_point>> free; // size -> block, freed at
  size_t bytes = 0;

  // Frees blocks idle past the limit. Caller holds mtx.
  void trim(clock::time_point now) {
    for (auto it = free.begin(); it != free.end();) {
      if (now - it->second.second > idle_limit) {
        bytes -= it->first;
        std::free(it->second.first);
        it = free.erase(it);
      } else {
        ++it;
      }
    }
  }
};

cache& the_cache() {
  static auto* c = new cache; // never destroyed: buffers may be given back during exit
  return *c;
}

} // namespace

void* take_block(size_t bytes) {
  const size_t size = block_size(bytes);
  auto& c = the_cache();
  {
    std::lock_guard<std::mutex> lock{c.mtx};
    auto it = c.free.find(size);
    if (it != c.free.end()) {
      void* p = it->second.first;
      c.bytes -= size;
      c.free.erase(it);
      return p;
    }
  }
  const bool huge = size >= 2 * huge_page;
  void* p = huge ? std::aligned_alloc(huge_page, size) : std::malloc(size);
  if (p == nullptr)
    throw std::bad_alloc{};
  if (huge)
    ::madvise(p, size, MADV_HUGEPAGE); // a hint: refused or ignored, the block still works
  return p;
}

void give_block(void* p, size_t bytes) noexcept {
  if (p == nullptr)
    return;
  const size_t size = block_size(bytes);
  auto& c = the_cache();
  const auto now = clock::now();
  std::lock_guard<std::mutex> lock{c.mtx};
  c.trim(now);
  if (c.bytes + size > cache_bound) {
    std::free(p);
    return;
  }
  try {
    c.free.emplace(size, std::make_pair(p, now));
    c.bytes += size;
  } catch (...) {
    std::free(p);
  }
}

size_t cached_block_bytes() noexcept {
  auto& c = the_cache();
  std::lock_guard<std::mutex> lock{c.mtx};
  return c.bytes;
}

}  // namespace ashlar::wire
