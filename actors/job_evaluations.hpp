// A job's test evaluations: the backend that computes them (the CPU, or the host
// application's for a model only it computes), at the end on the driver's thread, and
// mid-run in the background on a parameter snapshot, at most one at a time, at a lower
// CPU priority than the workers.
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "actors/local_job.hpp"
#include "runtime/backend/compute_backend.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/metrics/report.hpp"

namespace ashlar::actors {

class job_evaluations {
public:
  /// Without a backend for `model`, every evaluation fails with the reason and the job
  /// trains on.
  job_evaluations(const model_spec& model, const job_hooks& hooks, const dataset& test);
  ~job_evaluations();

  /// Evaluates `params` on the test set now.
  [[nodiscard]] expected<batch_stats> evaluate(const std::vector<float>& params) const;

  /// True while a background evaluation runs.
  bool busy() const { return pending_.has_value(); }

  /// Starts evaluating `params` in the background; its point will carry `epoch`, `at`
  /// (seconds), `loss` (the training loss when the snapshot was taken) and `bytes` (the
  /// tensor bytes moved by then).
  void start(std::vector<float> params, double epoch, double at, double loss, uint64_t bytes);

  /// The background evaluation's point once it has finished (`wait`: waits for it);
  /// nothing while it runs, when none runs, or when it failed.
  std::optional<epoch_point> settle(bool wait);

private:
  struct pending {
    std::future<expected<batch_stats>> result;
    double epoch = 0, at = 0, loss = 0;
    uint64_t bytes = 0;
  };
  const dataset& test_;
  std::optional<dataset> floats_; // the test set as floats, if it is kept as bytes
  std::unique_ptr<compute_backend> backend_;
  caf::error missing_;
  std::optional<pending> pending_;
};

}  // namespace ashlar::actors
