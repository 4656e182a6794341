// Predicting a worker's next iteration time from its history, for batch allocation:
// last value, exponential smoothing, and a small GRU trained online on the series.
// Pure code, deterministic for a given seed.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace ashlar {

class speed_predictor {
public:
  virtual ~speed_predictor() = default;
  virtual const char* name() const = 0;
  /// The series' next value arrived.
  virtual void observe(double x) = 0;
  /// The predicted next value (0 before any observation).
  virtual double predict() const = 0;
};

/// Predicts the last value seen.
class last_value_predictor final : public speed_predictor {
public:
  const char* name() const override { return "last"; }
  void observe(double x) override { last_ = x; }
  double predict() const override { return last_; }

private:
  double last_ = 0;
};

/// Exponential smoothing: s = alpha x + (1 - alpha) s. alpha in (0, 1]; Default: 0.3.
class ewma_predictor final : public speed_predictor {
public:
  explicit ewma_predictor(double alpha = 0.3) : alpha_(alpha) {}
  const char* name() const override { return "ewma"; }
  void observe(double x) override;
  double predict() const override { return s_; }

private:
  double alpha_;
  double s_ = 0;
  bool seen_ = false;
};

struct gru_config {
  /// Hidden units. Default: 8.
  uint32_t hidden = 8;
  /// Observations the GRU is trained on after each new one (truncated BPTT). Default: 16.
  uint32_t window = 16;
  /// Gradient steps over the window per observation. Default: 4.
  uint32_t epochs = 4;
  /// Learning rate. Default: 0.05.
  double lr = 0.05;
  /// Weight initialisation seed. Default: 1.
  uint64_t seed = 1;
};

/// A one-layer GRU with a linear read-out, trained online: after each observation it
/// takes a few gradient steps on predicting each value of the recent window from the
/// ones before it, then runs over the window to predict the next. Values are scaled by
/// the running mean, so any unit works.
class gru_predictor final : public speed_predictor {
public:
  explicit gru_predictor(gru_config cfg = {});
  const char* name() const override { return "gru"; }
  void observe(double x) override;
  double predict() const override { return prediction_; }

private:
  struct step_cache;
  double forward(const std::vector<double>& xs, std::vector<step_cache>* cache) const;
  void train_step(const std::vector<double>& xs);

  gru_config cfg_;
  // Parameters: per gate (z, r, n) input weights W (H), recurrent U (H x H), bias b (H);
  // read-out v (H), c.
  std::vector<double> wz_, wr_, wn_, uz_, ur_, un_, bz_, br_, bn_, v_;
  double c_ = 0;
  std::deque<double> window_;
  double mean_ = 0;
  uint64_t seen_ = 0;
  double prediction_ = 0;
};

}  // namespace ashlar
