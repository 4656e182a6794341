#include "runtime/policy/ssp.hpp"

#include <algorithm>

namespace ashlar {

void ssp_policy::on_join(worker_id w) {
  live_.insert(w);
  // A worker joining late starts at the slowest live clock, not at zero (which would
  // hold every other worker back until it caught up).
  uint64_t slowest = UINT64_MAX;
  for (auto other : live_)
    if (other != w)
      slowest = std::min(slowest, clock(other));
  clock_[w] = slowest == UINT64_MAX ? 0 : slowest;
}

void ssp_policy::on_leave(worker_id w) {
  live_.erase(w);
  clock_.erase(w);
}

push_decision ssp_policy::on_push(worker_id w, uint64_t base_version, uint64_t version) {
  push_decision d;
  d.kind = push_decision::apply;
  d.staleness = version >= base_version ? version - base_version : 0;
  if (cfg_.staleness_aware_lr)
    d.lr_scale = 1.0f / static_cast<float>(1 + d.staleness);
  clock_[w] += 1;
  return d;
}

void ssp_policy::set_staleness_bound(uint64_t s) {
  cfg_.staleness_bound = s;
  // Without this, ASHL's switch from AHL (gap 16) to SHL (gap 2) would hold every fast
  // worker until the slowest had made up the whole lead the fast ones had built, and a
  // lead built while profiling would keep them at AHL's gap, waiting, all through AHL.
  uint64_t slowest = UINT64_MAX;
  for (auto w : live_)
    slowest = std::min(slowest, clock(w));
  for (auto w : live_)
    clock_[w] = slowest;
}

uint64_t ssp_policy::clock(worker_id w) const {
  auto i = clock_.find(w);
  return i == clock_.end() ? 0 : i->second;
}

bool ssp_policy::may_read(worker_id w, uint64_t) const {
  if (live_.count(w) == 0)
    return true;
  uint64_t slowest = UINT64_MAX;
  for (auto other : live_)
    slowest = std::min(slowest, clock(other));
  return clock(w) <= slowest + cfg_.staleness_bound;
}

std::vector<worker_id> ssp_policy::holding_up() const {
  std::vector<worker_id> out;
  if (live_.size() < 2)
    return out;
  uint64_t lowest = UINT64_MAX, highest = 0;
  for (auto w : live_) {
    lowest = std::min(lowest, clock(w));
    highest = std::max(highest, clock(w));
  }
  if (highest - lowest <= cfg_.staleness_bound)
    return out; // nobody is held back
  for (auto w : live_)
    if (clock(w) == lowest)
      out.push_back(w);
  return out;
}

}  // namespace ashlar
