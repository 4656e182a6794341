#include "runtime/policy/bsp.hpp"

#include <algorithm>

namespace ashlar {

void bsp_policy::on_join(worker_id w) {
  live_.insert(w);
}

void bsp_policy::on_leave(worker_id w) {
  live_.erase(w);
  waiting_for_.erase(w);
}

push_decision bsp_policy::on_push(worker_id w, uint64_t base_version, uint64_t version) {
  push_decision d;
  d.staleness = version >= base_version ? version - base_version : 0;
  // A second push in one round, or one computed from an older version, is not part of
  // this round: BSP workers push once per version.
  if (pushed_.count(w) > 0 || base_version != version) {
    d.kind = push_decision::drop;
    return d;
  }
  pushed_.insert(w);
  waiting_for_[w] = version + 1;
  d.kind = push_decision::buffer;
  return d;
}

bool bsp_policy::round_ready() const {
  if (pushed_.empty())
    return false;
  return std::all_of(live_.begin(), live_.end(),
                     [&](worker_id w) { return pushed_.count(w) > 0; });
}

void bsp_policy::on_round_applied() {
  pushed_.clear();
}

bool bsp_policy::may_read(worker_id w, uint64_t version) const {
  auto i = waiting_for_.find(w);
  return i == waiting_for_.end() || version >= i->second;
}

std::vector<worker_id> bsp_policy::holding_up() const {
  std::vector<worker_id> out;
  if (pushed_.empty())
    return out;
  for (auto w : live_)
    if (pushed_.count(w) == 0)
      out.push_back(w);
  return out;
}

}  // namespace ashlar
