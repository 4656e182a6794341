// A job's target on a named metric (run.target = "val_ppl <= 150"): the metric a script
// reports from its own evaluation (ashlar.torch.report), or the job's own test accuracy
// ("test_accuracy >= 0.9"). The job stops at the first report that meets it. Pure code.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/metrics/report.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

/// Why `name` cannot name a metric (empty, over 64 characters, a character beyond
/// letters, digits, '_', '.' and '-'), or null.
const char* metric_name_error(const std::string& name);

struct metric_target {
  enum class cmp { le, lt, ge, gt };
  std::string name;
  cmp op = cmp::ge;
  double value = 0;

  /// Whether `x` meets it (a NaN never does).
  bool met(double x) const;
  /// "val_ppl <= 150"
  std::string text() const;
};

/// Parses "NAME OP VALUE" (OP: <=, <, >=, >; spaces optional). Errors: invalid_config
/// naming run.target, the text and what is wrong with it.
expected<metric_target> parse_metric_target(const std::string& text);

/// The value named `name` in `values` (the last one of that name), or null.
template <class Values>
const double* find_metric(const Values& values, const std::string& name) {
  const double* found = nullptr;
  for (const auto& v : values)
    if (v.name == name)
      found = &v.value;
  return found;
}

/// What a job has taken of its scripts' reports (the profile's latest, each look): the
/// points not taken before, the last value of each name, and whether one met the target.
class metric_log {
public:
  explicit metric_log(std::optional<metric_target> target = std::nullopt) : target_(std::move(target)) {}

  /// The reports of `reports` past the last taken, as points at `now` seconds (the
  /// job's clock) and `epoch_of(samples)`, in order.
  std::vector<metric_point> take(const std::vector<wire::metric_report>& reports, double now,
                                 const std::function<double(uint64_t)>& epoch_of);

  /// The first point taken whose target metric met the target, or null.
  const metric_point* met_by() const { return met_ ? &*met_ : nullptr; }
  /// The target metric's value in that point.
  double met_value() const { return met_value_; }
  /// The last value of each name taken, in order of first report.
  const std::vector<std::pair<std::string, double>>& last() const { return last_; }
  /// Reports that fell out of the profile's window before they could be taken.
  uint64_t missed() const { return missed_; }
  const std::optional<metric_target>& target() const { return target_; }

private:
  std::optional<metric_target> target_;
  uint64_t seq_ = 0;
  uint64_t missed_ = 0;
  std::optional<metric_point> met_;
  double met_value_ = 0;
  std::vector<std::pair<std::string, double>> last_;
};

}  // namespace ashlar
