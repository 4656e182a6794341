#include "runtime/policy/k_sync.hpp"

#include <algorithm>
#include <cstdint>

namespace ashlar {

size_t effective_k(uint32_t k, size_t live) {
  size_t want = k == 0 ? (live + 1) / 2 : k;
  return std::max<size_t>(1, std::min(want, live));
}

size_t k_sync_policy::k() const {
  return effective_k(cfg_.k, live_.size());
}

bool k_sync_policy::round_ready() const {
  return !pushed_.empty() && pushed_.size() >= k();
}

size_t k_async_policy::k() const {
  return effective_k(cfg_.k, live_.size());
}

push_decision k_async_policy::on_push(worker_id, uint64_t base_version, uint64_t version) {
  push_decision d;
  d.kind = push_decision::buffer;
  d.staleness = version >= base_version ? version - base_version : 0;
  ++buffered_;
  return d;
}

bool k_async_policy::round_ready() const {
  return buffered_ > 0 && buffered_ >= k();
}

}  // namespace ashlar
