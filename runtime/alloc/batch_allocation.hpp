// How a global batch is split among workers of different speeds: equally, in proportion
// to profiled speed (static), or from observed iteration times (self-adaptive). Shares
// always sum to the global batch and each worker gets at least one sample; gradients are
// then weighted by batch size so the global step stays the mean over all samples.
// Pure code.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// `global` split as evenly as possible over `workers` (the first ones get one more).
[[nodiscard]] expected<std::vector<uint32_t>> equal_shares(uint32_t global, size_t workers);

/// `global` split in proportion to `speeds` (samples per second, > 0), by largest
/// remainder, every worker at least 1. Fails with invalid_argument for an empty list, a
/// speed <= 0 or not finite, or fewer samples than workers.
[[nodiscard]] expected<std::vector<uint32_t>> proportional_shares(uint32_t global,
                                                                  const std::vector<double>& speeds);

/// Self-adaptive allocation: after each round, each worker's speed is estimated as the
/// batch it processed over the time it took (compute only, no waits), smoothed, and the
/// next shares are proportional to it. Equal until every worker has been observed.
class adaptive_allocator {
public:
  /// alpha: weight of the newest observation in the smoothing, in (0, 1]. Default: 0.5.
  adaptive_allocator(uint32_t global, size_t workers, double alpha = 0.5);

  /// Worker i processed `batch` samples in `seconds`.
  void observe(size_t worker, uint32_t batch, double seconds);

  /// Shares for the next round.
  std::vector<uint32_t> shares() const;

private:
  uint32_t global_;
  double alpha_;
  std::vector<double> speed_; // smoothed samples/s; 0 = not observed yet
};

}  // namespace ashlar
