// Seeded random heterogeneity profiles for benchmarks: how many workers, their relative
// speeds, and intervals of contention. Pure code: the same seed gives the same profiles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/pacing/contention.hpp"

namespace ashlar {

struct hetero_profile {
  std::vector<double> speeds;   // one per worker, 1..8
  contention_profile contention; // may be empty
  std::string speeds_text() const;       // "1,3,8,2"
  std::string contention_text() const;   // the file form parse_contention reads
};

struct random_profile_settings {
  uint32_t min_workers = 4, max_workers = 8;
  uint32_t max_speed = 8;
  double contention_share = 0.4;   // the fraction of profiles with contention intervals
  double horizon_s = 20;           // intervals start within this many seconds
};

/// `n` profiles drawn from `seed`: a worker count in [min, max], integer speeds in
/// [1, max_speed] with at least one worker at 1 and one at 3 or more (heterogeneous), and
/// in about contention_share of them 1-3 intervals in which one worker is 2-4x slower for
/// 2-6 s.
std::vector<hetero_profile> random_profiles(uint32_t n, uint64_t seed, const random_profile_settings& s = {});

/// "random:N" -> N; anything else is invalid_argument naming the form.
[[nodiscard]] expected<uint32_t> parse_profiles_spec(const std::string& spec);

}  // namespace ashlar
