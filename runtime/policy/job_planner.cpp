#include "runtime/policy/job_planner.hpp"

#include <algorithm>

namespace ashlar {

job_planner::~job_planner() = default;

void plan_local_steps(std::map<worker_id, uint32_t>& sent, const std::map<worker_id, uint32_t>& plan,
                      job_plan& out) {
  for (const auto& [id, h] : plan) {
    auto [it, fresh] = sent.emplace(id, h);
    if (!fresh && it->second == h)
      continue;
    it->second = h;
    out.local_steps[id] = h;
  }
}

combined_planner::combined_planner(std::vector<std::unique_ptr<job_planner>> parts) : parts_(std::move(parts)) {
}

bool combined_planner::plans() const {
  for (const auto& p : parts_)
    if (p->plans())
      return true;
  return false;
}

int job_planner::tick_ms() const {
  return planner_tick_ms;
}

int combined_planner::tick_ms() const {
  int ms = planner_tick_ms;
  for (const auto& p : parts_)
    ms = std::min(ms, p->tick_ms());
  return ms;
}

bool combined_planner::wants_staleness() const {
  for (const auto& p : parts_)
    if (p->wants_staleness())
      return true;
  return false;
}

void combined_planner::on_start(job_plan& out) {
  for (auto& p : parts_)
    p->on_start(out);
}

void combined_planner::on_tick(const planner_view& view, job_plan& out) {
  for (auto& p : parts_)
    p->on_tick(view, out);
}

void combined_planner::on_join(worker_id w, job_plan& out) {
  for (auto& p : parts_)
    p->on_join(w, out);
}

void combined_planner::on_resumed(worker_id w, const batch_directive& batch) {
  for (auto& p : parts_)
    p->on_resumed(w, batch);
}

shard_settings combined_planner::shard_state() const {
  shard_settings s;
  for (const auto& p : parts_) {
    auto one = p->shard_state();
    if (one.bound)
      s.bound = one.bound;
    if (one.tune)
      s.tune = one.tune;
  }
  return s;
}

}  // namespace ashlar
