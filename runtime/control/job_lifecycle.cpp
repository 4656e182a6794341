#include "runtime/control/job_lifecycle.hpp"

#include <cstdio>

namespace ashlar::control {

std::string lacking(const job_needs& needs, const capacity& have) {
  std::string out;
  if (have.server_nodes == 0)
    out = "needs a server node for its " + std::to_string(needs.shards) + " shards, has none";
  if (have.worker_slots < needs.workers)
    out += (out.empty() ? "" : "; ") + std::string{"needs "} + std::to_string(needs.workers) + " worker slots, has "
           + std::to_string(have.worker_slots);
  return out;
}

const char* to_string(job_outcome::kind_t k) {
  switch (k) {
    case job_outcome::trained:
      return "trained";
    case job_outcome::stopped:
      return "stopped";
    case job_outcome::failed:
      return "failed";
  }
  return "?";
}

job_lifecycle::job_lifecycle(const clock_source& clock, job_needs needs, uint64_t wait_ns)
  : clock_(clock), needs_(needs), wait_until_(clock.steady_ns() + wait_ns), wait_ns_(wait_ns) {
}

std::vector<job_action> job_lifecycle::end(job_outcome::kind_t kind, std::string cause) {
  phase_ = phase::ended;
  outcome_ = job_outcome{kind, std::move(cause)};
  return {job_action{job_action::ended, summary()}};
}

std::vector<job_action> job_lifecycle::on_capacity(const capacity& have) {
  if (phase_ != phase::waiting)
    return {};
  auto now_lacks = lacking(needs_, have);
  if (now_lacks.empty()) {
    lacks_.clear();
    phase_ = phase::running;
    started_ = true;
    return {job_action{job_action::start, {}}};
  }
  if (now_lacks == lacks_)
    return {};
  lacks_ = std::move(now_lacks);
  return {job_action{job_action::waiting, lacks_}};
}

std::vector<job_action> job_lifecycle::on_time() {
  if (phase_ != phase::waiting || clock_.steady_ns() < wait_until_)
    return {};
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", static_cast<double>(wait_ns_) * 1e-9);
  return end(job_outcome::failed,
             "the job's nodes did not join in time: it " + lacks_ + " (waited " + std::string{secs} + " s)");
}

std::vector<job_action> job_lifecycle::on_stop(const std::string& who) {
  switch (phase_) {
    case phase::waiting:
      stop_cause_ = who;
      return end(job_outcome::stopped, "stopped while waiting for the job's nodes"
                                         + (lacks_.empty() ? std::string{} : ": it " + lacks_) + " (" + who + ")");
    case phase::running:
      stop_cause_ = who;
      phase_ = phase::stopping;
      return {job_action{job_action::stop_workers, who}};
    case phase::stopping:
    case phase::ended:
      return {};
  }
  return {};
}

std::vector<job_action> job_lifecycle::on_worker_error(const std::string& what) {
  if (phase_ == phase::ended || !error_cause_.empty())
    return {};
  error_cause_ = what;
  if (phase_ == phase::waiting)
    return end(job_outcome::failed, what);
  const bool was_stopping = phase_ == phase::stopping;
  phase_ = phase::stopping;
  if (was_stopping)
    return {};
  return {job_action{job_action::stop_workers, what}};
}

std::vector<job_action> job_lifecycle::on_run_ended(const std::string& error, bool trained_all) {
  if (phase_ == phase::ended)
    return {};
  // One outcome, the first cause: a worker's error over the run's own words about it,
  // then the run's failure, then a stop that was asked for, then a job that ran out.
  if (!error_cause_.empty())
    return end(job_outcome::failed, error_cause_);
  if (!error.empty())
    return end(job_outcome::failed, error);
  if (!stop_cause_.empty() && !trained_all)
    return end(job_outcome::stopped, stop_cause_);
  return end(job_outcome::trained, {});
}

std::optional<uint64_t> job_lifecycle::deadline() const {
  if (phase_ == phase::waiting)
    return wait_until_;
  return std::nullopt;
}

std::string job_lifecycle::summary() const {
  switch (phase_) {
    case phase::waiting:
      return lacks_.empty() ? "submitted" : "waiting for its nodes: it " + lacks_;
    case phase::running:
      return "running";
    case phase::stopping:
      return "stopping: " + (error_cause_.empty() ? stop_cause_ : error_cause_);
    case phase::ended:
      break;
  }
  switch (outcome_.kind) {
    case job_outcome::trained:
      return "trained";
    case job_outcome::stopped: // (before it started, the cause says "stopped while waiting")
      return (started_ ? "stopped: " : "") + outcome_.cause;
    case job_outcome::failed:
      return (started_ ? "failed: " : "") + outcome_.cause;
  }
  return {};
}

}  // namespace ashlar::control
