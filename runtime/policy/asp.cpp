#include "runtime/policy/asp.hpp"

namespace ashlar {

push_decision asp_policy::on_push(worker_id, uint64_t base_version, uint64_t version) {
  push_decision d;
  d.kind = push_decision::apply;
  d.staleness = version >= base_version ? version - base_version : 0;
  if (cfg_.staleness_aware_lr)
    d.lr_scale = 1.0f / static_cast<float>(1 + d.staleness);
  return d;
}

}  // namespace ashlar
