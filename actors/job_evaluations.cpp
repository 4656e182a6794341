#include "actors/job_evaluations.hpp"

#include <chrono>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/backend/cpu_backend.hpp"

namespace ashlar::actors {

namespace {

// Lowers the calling thread's CPU priority (Linux: a thread's nice value is its own;
// raising it needs no privilege). Mid-run test evaluations run so: they use time the
// workers leave idle instead of slowing them down, which on a machine with few cores
// would otherwise show in every policy's throughput.
void lower_thread_priority() {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
}

}  // namespace

job_evaluations::job_evaluations(const model_spec& model, const job_hooks& hooks, const dataset& test)
  : test_(test) {
  if (test.compact()) { // evaluated whole: as floats, here only
    floats_.emplace(test);
    floats_->expand();
  }
  if (auto cpu = make_cpu_backend(model)) {
    backend_ = std::move(*cpu);
  } else if (hooks.make_backend) {
    auto choice = hooks.make_backend(model);
    backend_ = std::move(choice.backend);
    if (!backend_)
      missing_ = make_error(errc::invalid_state, "cannot evaluate model " + model.to_string() + ": " + choice.note);
  } else {
    missing_ = cpu.error();
  }
}

job_evaluations::~job_evaluations() {
  settle(true);
}

expected<batch_stats> job_evaluations::evaluate(const std::vector<float>& params) const {
  if (!backend_)
    return missing_;
  return backend_->evaluate(params.data(), floats_ ? floats_->all() : test_.all());
}

void job_evaluations::start(std::vector<float> params, double epoch, double at, double loss, uint64_t bytes) {
  pending p{{}, epoch, at, loss, bytes};
  p.result = std::async(std::launch::async, [this, params = std::move(params)] {
    lower_thread_priority();
    return evaluate(params);
  });
  pending_ = std::move(p);
}

std::optional<epoch_point> job_evaluations::settle(bool wait) {
  if (!pending_ || (!wait && pending_->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready))
    return std::nullopt;
  auto ev = pending_->result.get();
  auto p = std::move(*pending_);
  pending_.reset();
  if (!ev)
    return std::nullopt;
  return epoch_point{p.epoch, p.at, ev->accuracy(), p.loss, p.bytes};
}

}  // namespace ashlar::actors
