#include "runtime/store/serve_again.hpp"

namespace ashlar {

serve_retry after_failed_serve(serve_failure why, bool node_alive) {
  using namespace std::chrono_literals;
  if (!node_alive)
    return {serve_retry::any_node, 500ms};
  switch (why) {
    case serve_failure::busy:
      return {serve_retry::any_node, 2000ms};
    case serve_failure::timed_out:
      return {serve_retry::same_node, 0ms};
    case serve_failure::refused:
      break;
  }
  return {serve_retry::nobody, 0ms};
}

bool same_shard_of_job(const wire::spawn_shard& a, const wire::spawn_shard& b) {
  return a.range == b.range && a.policy == b.policy && a.lr == b.lr && a.momentum == b.momentum
         && a.weight_decay == b.weight_decay && a.rule == b.rule && a.beta1 == b.beta1 && a.beta2 == b.beta2
         && a.eps == b.eps && a.staleness_aware_lr == b.staleness_aware_lr
         && a.staleness_bound == b.staleness_bound && a.k == b.k && a.data_key == b.data_key
         && a.checkpoint_dir == b.checkpoint_dir && a.checkpoint_keep == b.checkpoint_keep
         && a.average_samples == b.average_samples && a.job == b.job;
}

}  // namespace ashlar
