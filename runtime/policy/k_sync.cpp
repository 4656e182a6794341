#include "runtime/policy/k_sync.hpp"

#include <algorithm>

namespace ashlar {

namespace {

size_t effective_k(uint32_t k, size_t live) {
  size_t want = k == 0 ? (live + 1) / 2 : k;
  return std::max<size_t>(1, std::min(want, live));
}

}  // namespace

size_t k_sync_policy::k() const {
  return effective_k(cfg_.k, live_.size());
}

void k_sync_policy::on_leave(worker_id w) {
  live_.erase(w);
  waiting_for_.erase(w);
}

push_decision k_sync_policy::on_push(worker_id w, uint64_t base_version, uint64_t version) {
  push_decision d;
  d.staleness = version >= base_version ? version - base_version : 0;
  waiting_for_[w] = base_version + 1;
  // Late for its round (the round was applied without it), or a second push: cancelled.
  if (base_version != version || pushed_.count(w) > 0) {
    d.kind = push_decision::drop;
    return d;
  }
  pushed_.insert(w);
  d.kind = push_decision::buffer;
  return d;
}

bool k_sync_policy::round_ready() const {
  return !pushed_.empty() && pushed_.size() >= k();
}

bool k_sync_policy::may_read(worker_id w, uint64_t version) const {
  auto i = waiting_for_.find(w);
  return i == waiting_for_.end() || version >= i->second;
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
