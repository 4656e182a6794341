#include "actors/profiler.hpp"

#include <chrono>
#include <cmath>
#include <map>

#include "runtime/metrics/recorder.hpp"
#include "runtime/predict/speed_predictor.hpp"

namespace ashlar::actors {

namespace {

struct worker_track {
  wire::worker_stats stats;
  bool seen = false;
  // Compute speed per window: samples and compute time so far in the current window,
  // and the GRU that predicts the next window's seconds per sample.
  std::chrono::steady_clock::time_point window_start;
  double window_samples = 0, window_compute = 0;
  gru_predictor predictor;
  uint64_t predicted_windows = 0;
  double error_sum = 0;
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
  std::shared_ptr<run_recorder> recorder;
  double window = 0.25;
};

using profiler_pointer = profiler_actor::stateful_pointer<profiler_state>;

double ema(double old, double x, double alpha, bool first) {
  return first ? x : (1 - alpha) * old + alpha * x;
}

// Closes a worker's speed window once it is `window` seconds long: the GRU's prediction
// for it is scored against what was observed, then the GRU learns the window.
void close_window(worker_track& t, double window, std::chrono::steady_clock::time_point now) {
  if (std::chrono::duration<double>(now - t.window_start).count() < window || t.window_samples <= 0
      || t.window_compute <= 0)
    return;
  const double per_sample = t.window_compute / t.window_samples;
  const double predicted = t.predictor.predict();
  if (predicted > 0) {
    t.error_sum += std::abs(predicted - per_sample) / per_sample;
    ++t.predicted_windows;
    t.stats.prediction_error = t.error_sum / static_cast<double>(t.predicted_windows);
  }
  t.predictor.observe(per_sample);
  t.stats.observed_speed = 1.0 / per_sample;
  t.stats.predicted_speed = t.predictor.predict() > 0 ? 1.0 / t.predictor.predict() : 0.0;
  t.window_start = now;
  t.window_samples = t.window_compute = 0;
}

profiler_actor::behavior_type profiler_behavior(profiler_pointer self, double alpha,
                                                std::shared_ptr<run_recorder> recorder, double window) {
  self->state.alpha = alpha;
  self->state.recorder = std::move(recorder);
  self->state.window = window;
  return {
    [=](const wire::profile_report& r) {
      auto& st = self->state;
      const auto now = std::chrono::steady_clock::now();
      if (!st.started) {
        st.start = now;
        st.started = true;
      }
      if (st.recorder)
        st.recorder->step(r);
      auto& t = st.workers[r.worker_id];
      auto& s = t.stats;
      bool first = !t.seen;
      if (first)
        t.window_start = now;
      t.seen = true;
      s.worker_id = r.worker_id;
      s.steps += 1;
      s.samples += r.samples;
      // A worker's first step carries one-time costs (a GPU's lazily loaded kernels, cold
      // caches and connections), up to a hundred steps' time: the smoothed timings start
      // from its second step, so that one outlier does not skew the first allocation.
      if (s.steps >= 2) {
        const bool seed = s.steps == 2;
        double step_s = (r.compute_ns + r.pull_ns + r.push_ns + r.wait_ns) * 1e-9;
        s.step_seconds = ema(s.step_seconds, step_s, st.alpha, seed);
        s.compute_seconds = ema(s.compute_seconds, r.compute_ns * 1e-9, st.alpha, seed);
        s.wait_seconds = ema(s.wait_seconds, r.wait_ns * 1e-9, st.alpha, seed);
        double rate = step_s > 0 ? r.samples / step_s : 0;
        s.samples_per_second = ema(s.samples_per_second, rate, st.alpha, seed);
        if (r.samples > 0)
          s.compute_per_sample =
            ema(s.compute_per_sample, r.compute_ns * 1e-9 / r.samples, st.alpha, seed || s.compute_per_sample <= 0);
      }
      s.loss = ema(s.loss, r.loss, st.alpha, first);
      s.total_compute_seconds += r.compute_ns * 1e-9;
      s.total_wait_seconds += r.wait_ns * 1e-9;
      s.bytes += r.bytes;
      s.dense_bytes += r.dense_bytes;
      s.stage_changes = r.stage_changes;
      s.batch = r.batch;
      s.position = r.position;
      // A step that pushed (push time), or during which an overlapped commit landed (the
      // shards' acknowledged staleness; its push time is hidden behind local steps).
      if (r.push_ns > 0 || r.staleness > 0)
        s.staleness = ema(s.staleness, static_cast<double>(r.staleness), st.alpha, s.staleness == 0);
      t.window_samples += r.samples;
      t.window_compute += r.compute_ns * 1e-9;
      close_window(t, st.window, now);
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

profiler_actor spawn_profiler(caf::actor_system& sys, double smoothing, std::shared_ptr<run_recorder> recorder,
                              double window) {
  return sys.spawn(profiler_behavior, smoothing, std::move(recorder), window);
}

}  // namespace ashlar::actors
