#include "runtime/metrics/prometheus.hpp"

#include <cmath>
#include <cstdio>
#include <functional>

namespace ashlar {

namespace {

std::string value(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

struct writer {
  std::string out;
  void family(const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const char* name, const std::string& labels, double v) {
    out += name;
    if (!labels.empty())
      out += "{" + labels + "}";
    out += " " + value(v) + "\n";
  }
  // One family with a sample per element of `xs`.
  template <class T>
  void each(const char* name, const char* type, const char* help, const std::vector<T>& xs,
            const std::function<std::string(const T&)>& labels, const std::function<double(const T&)>& get) {
    family(name, type, help);
    for (const auto& x : xs)
      sample(name, labels(x), get(x));
  }
};

}  // namespace

std::string prometheus_text(const job_metrics& m) {
  writer w;
  w.family("ashlar_job_running", "gauge", "1 while a training job runs, else 0.");
  w.sample("ashlar_job_running", m.policy.empty() ? "" : "policy=\"" + m.policy + "\"", m.running ? 1 : 0);
  if (!m.running)
    return w.out;
  const auto& s = m.stats;
  w.family("ashlar_job_elapsed_seconds", "gauge", "Seconds since the job's first step.");
  w.sample("ashlar_job_elapsed_seconds", "", s.elapsed_seconds);
  w.family("ashlar_samples_total", "counter", "Training samples processed by all workers.");
  w.sample("ashlar_samples_total", "", static_cast<double>(s.total_samples));
  w.family("ashlar_train_loss", "gauge", "Smoothed training loss over all workers.");
  w.sample("ashlar_train_loss", "", s.loss);
  w.family("ashlar_epoch", "gauge", "Samples processed divided by the training set's size.");
  w.sample("ashlar_epoch", "", m.epoch);
  if (m.test_accuracy >= 0) {
    w.family("ashlar_test_accuracy_ratio", "gauge", "Test accuracy at the last evaluation (0 to 1).");
    w.sample("ashlar_test_accuracy_ratio", "", m.test_accuracy);
  }
  if (!m.script_metrics.empty()) { // (names are letters, digits, _ . - only: no label escaping needed)
    w.family("ashlar_script_metric", "gauge", "The last value of each metric the training scripts reported.");
    for (const auto& [name, v] : m.script_metrics)
      w.sample("ashlar_script_metric", "name=\"" + name + "\"", v);
  }
  using ws = wire::worker_stats;
  std::vector<ws> live;
  for (const auto& x : s.workers)
    if (!x.done)
      live.push_back(x);
  w.family("ashlar_workers", "gauge", "Workers training now.");
  w.sample("ashlar_workers", "", static_cast<double>(live.size()));
  std::function<std::string(const ws&)> wl = [](const ws& x) {
    return "worker=\"" + std::to_string(x.worker_id) + "\"";
  };
  auto per_worker = [&](const char* name, const char* type, const char* help, std::function<double(const ws&)> get) {
    w.each<ws>(name, type, help, s.workers, wl, get);
  };
  per_worker("ashlar_worker_steps_total", "counter", "Steps the worker finished.",
             [](const ws& x) { return static_cast<double>(x.steps); });
  per_worker("ashlar_worker_samples_total", "counter", "Samples the worker processed.",
             [](const ws& x) { return static_cast<double>(x.samples); });
  per_worker("ashlar_worker_samples_per_second", "gauge", "Smoothed samples per second, communication included.",
             [](const ws& x) { return x.samples_per_second; });
  per_worker("ashlar_worker_step_seconds", "gauge", "Smoothed seconds per step.",
             [](const ws& x) { return x.step_seconds; });
  per_worker("ashlar_worker_compute_seconds_total", "counter", "Seconds spent computing.",
             [](const ws& x) { return x.total_compute_seconds; });
  per_worker("ashlar_worker_wait_seconds_total", "counter", "Seconds held back by the synchronization policy.",
             [](const ws& x) { return x.total_wait_seconds; });
  per_worker("ashlar_worker_transfer_bytes_total", "counter", "Tensor bytes pulled and pushed.",
             [](const ws& x) { return static_cast<double>(x.bytes); });
  per_worker("ashlar_worker_staleness", "gauge", "Smoothed staleness (versions) of the worker's pushes.",
             [](const ws& x) { return x.staleness; });
  per_worker("ashlar_worker_loss", "gauge", "Smoothed training loss of the worker's batches.",
             [](const ws& x) { return x.loss; });
  per_worker("ashlar_worker_predicted_samples_per_second", "gauge",
             "Compute speed the profiler predicts for the worker's next window.",
             [](const ws& x) { return x.predicted_speed; });
  per_worker("ashlar_worker_observed_samples_per_second", "gauge", "Compute speed over the worker's last window.",
             [](const ws& x) { return x.observed_speed; });
  per_worker("ashlar_worker_stage_changes_total", "counter", "Behaviour changes the worker made for stages.",
             [](const ws& x) { return static_cast<double>(x.stage_changes); });
  using ss = wire::shard_status;
  std::function<std::string(const ss&)> sl = [](const ss& x) {
    return "shard=\"" + std::to_string(x.shard_id) + "\"";
  };
  auto per_shard = [&](const char* name, const char* type, const char* help, std::function<double(const ss&)> get) {
    w.each<ss>(name, type, help, m.shards, sl, get);
  };
  per_shard("ashlar_shard_version", "gauge", "The shard's parameter version.",
            [](const ss& x) { return static_cast<double>(x.version); });
  per_shard("ashlar_shard_pushes_total", "counter", "Pushes the shard received.",
            [](const ss& x) { return static_cast<double>(x.pushes); });
  per_shard("ashlar_shard_applied_total", "counter", "Gradients the shard applied.",
            [](const ss& x) { return static_cast<double>(x.applied); });
  per_shard("ashlar_shard_dropped_total", "counter", "Gradients the policy dropped.",
            [](const ss& x) { return static_cast<double>(x.dropped); });
  per_shard("ashlar_shard_staleness_max", "gauge", "The largest staleness (versions) seen.",
            [](const ss& x) { return static_cast<double>(x.staleness_max); });
  return w.out;
}

}  // namespace ashlar
