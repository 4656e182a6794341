#include "actors/profiler.hpp"

#include <chrono>
#include <map>

namespace ashlar::actors {

namespace {

struct worker_track {
  wire::worker_stats stats;
  bool seen = false;
};

struct profiler_state {
  static constexpr const char* name = "ashlar.profiler";
  double alpha = 0.1;
  std::map<uint32_t, worker_track> workers;
  std::chrono::steady_clock::time_point start;
  bool started = false;
  uint64_t total_samples = 0;
  double loss = 0;
  bool loss_seen = false;
};

using profiler_pointer = profiler_actor::stateful_pointer<profiler_state>;

double ema(double old, double x, double alpha, bool first) {
  return first ? x : (1 - alpha) * old + alpha * x;
}

profiler_actor::behavior_type profiler_behavior(profiler_pointer self, double alpha) {
  self->state.alpha = alpha;
  return {
    [=](const wire::profile_report& r) {
      auto& st = self->state;
      if (!st.started) {
        st.start = std::chrono::steady_clock::now();
        st.started = true;
      }
      auto& t = st.workers[r.worker_id];
      auto& s = t.stats;
      bool first = !t.seen;
      t.seen = true;
      s.worker_id = r.worker_id;
      s.steps += 1;
      s.samples += r.samples;
      double step_s = (r.compute_ns + r.pull_ns + r.push_ns + r.wait_ns) * 1e-9;
      s.step_seconds = ema(s.step_seconds, step_s, st.alpha, first);
      s.compute_seconds = ema(s.compute_seconds, r.compute_ns * 1e-9, st.alpha, first);
      s.wait_seconds = ema(s.wait_seconds, r.wait_ns * 1e-9, st.alpha, first);
      double rate = step_s > 0 ? r.samples / step_s : 0;
      s.samples_per_second = ema(s.samples_per_second, rate, st.alpha, first);
      s.loss = ema(s.loss, r.loss, st.alpha, first);
      s.total_compute_seconds += r.compute_ns * 1e-9;
      s.total_wait_seconds += r.wait_ns * 1e-9;
      s.bytes += r.bytes;
      s.stage_changes = r.stage_changes;
      if (r.samples > 0)
        s.compute_per_sample = ema(s.compute_per_sample, r.compute_ns * 1e-9 / r.samples, st.alpha, first);
      st.total_samples += r.samples;
      st.loss = ema(st.loss, r.loss, st.alpha / 2, !st.loss_seen);
      st.loss_seen = true;
    },
    [=](const wire::membership_change& m) -> caf::ok_atom {
      auto& t = self->state.workers[m.worker_id];
      t.stats.worker_id = m.worker_id;
      t.stats.done = m.kind != wire::membership_change::join;
      return caf::ok_atom::value;
    },
    [=](caf::get_atom) -> wire::cluster_stats {
      auto& st = self->state;
      wire::cluster_stats out;
      for (const auto& [id, t] : st.workers)
        out.workers.push_back(t.stats);
      out.total_samples = st.total_samples;
      out.loss = st.loss;
      if (st.started)
        out.elapsed_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - st.start).count();
      return out;
    },
  };
}

}  // namespace

profiler_actor spawn_profiler(caf::actor_system& sys, double smoothing) {
  return sys.spawn(profiler_behavior, smoothing);
}

}  // namespace ashlar::actors
