#include "runtime/policy/adaptive_k.hpp"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

namespace ashlar {

adaptive_k_choice adaptive_k_planner::choose(const std::vector<worker_timing>& workers,
                                             double recent_staleness) const {
  adaptive_k_choice c;
  double fastest = 0;
  for (const auto& w : workers)
    if (w.iteration_s > 0 && (fastest == 0 || w.iteration_s < fastest))
      fastest = w.iteration_s;
  uint32_t k = 0;
  for (const auto& w : workers)
    if (fastest == 0 || w.iteration_s <= 0 || w.iteration_s <= cfg_.wait_tolerance * fastest)
      ++k;
  c.k = std::max<uint32_t>(1, k);
  c.async = recent_staleness <= cfg_.max_staleness;
  return c;
}

adaptive_k_policy::adaptive_k_policy(policy_config cfg) : sync_(cfg), async_(cfg) {
  // Start as BSP-like k-sync with every live worker until the planner says otherwise.
  sync_.set_k(cfg.k);
  async_.set_k(cfg.k);
}

void adaptive_k_policy::on_join(worker_id w) {
  sync_.on_join(w);
  async_.on_join(w);
}

void adaptive_k_policy::on_leave(worker_id w) {
  sync_.on_leave(w);
  async_.on_leave(w);
}

push_decision adaptive_k_policy::on_push(worker_id w, uint64_t base_version, uint64_t version) {
  auto d = async_mode_ ? async_.on_push(w, base_version, version) : sync_.on_push(w, base_version, version);
  if (d.kind == push_decision::buffer)
    ++buffered_;
  return d;
}

void adaptive_k_policy::on_push_cut_short(worker_id w) {
  // The mode does not change while a push is buffered (switch_if_idle): the one in force
  // counted it.
  if (async_mode_)
    async_.on_push_cut_short(w);
  else
    sync_.on_push_cut_short(w);
  if (buffered_ > 0)
    --buffered_;
  switch_if_idle();
}

bool adaptive_k_policy::round_ready() const {
  return async_mode_ ? async_.round_ready() : sync_.round_ready();
}

void adaptive_k_policy::on_round_applied() {
  if (async_mode_)
    async_.on_round_applied();
  else
    sync_.on_round_applied();
  buffered_ = 0;
  switch_if_idle();
}

bool adaptive_k_policy::may_read(worker_id w, uint64_t version) const {
  return async_mode_ ? async_.may_read(w, version) : sync_.may_read(w, version);
}

void adaptive_k_policy::tune(uint32_t k, bool async) {
  pending_ = true;
  pending_k_ = k;
  pending_async_ = async;
  switch_if_idle();
}

void adaptive_k_policy::switch_if_idle() {
  if (!pending_ || buffered_ > 0)
    return;
  pending_ = false;
  sync_.set_k(pending_k_);
  async_.set_k(pending_k_);
  async_mode_ = pending_async_;
}

void adaptive_k_job_planner::on_tick(const planner_view& view, job_plan& out) {
  std::vector<worker_timing> times;
  for (const auto& w : view.workers)
    times.push_back(worker_timing{w.id, std::max(0.0, w.step_s - w.wait_s)});
  double recent = view.pushes > pushes_ ? static_cast<double>(view.staleness_sum - staleness_sum_)
                                            / static_cast<double>(view.pushes - pushes_)
                                        : 0.0;
  staleness_sum_ = view.staleness_sum;
  pushes_ = view.pushes;
  auto choice = planner_.choose(times, recent);
  if (choice == tuned_)
    return;
  tuned_ = choice;
  const char* mode = choice.async ? "k-async" : "k-sync";
  out.info.push_back(fmt::format("adaptive policy now {} with k = {} (recent staleness {:.2f})", mode, choice.k,
                                 recent));
  out.events.push_back(plan_event{mode, "k = " + std::to_string(choice.k)});
  out.shards.tune = std::make_pair(choice.k, choice.async);
}

shard_settings adaptive_k_job_planner::shard_state() const {
  shard_settings s;
  s.tune = std::make_pair(tuned_.k, tuned_.async);
  return s;
}

}  // namespace ashlar
