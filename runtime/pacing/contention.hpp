// Time-varying contention for paced workers: intervals during which a worker runs slower,
// as another job on its node would make it. Pure code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// Worker `worker` (or every worker, when all_workers) is `factor` times slower from
/// `start_s` to `end_s` seconds after training starts.
struct contention_interval {
  bool all_workers = false;
  uint32_t worker = 0;
  double start_s = 0;
  double end_s = 0;
  double factor = 1;
};

using contention_profile = std::vector<contention_interval>;

/// Parses a profile: one interval a line, `WORKER START_S END_S FACTOR` (WORKER is an id
/// or `*`), `#` starts a comment. Errors name the origin and line.
[[nodiscard]] expected<contention_profile> parse_contention(const std::string& text,
                                                           const std::string& origin);

/// Largest contention profile read: 1 MiB.
constexpr size_t max_contention_bytes = size_t{1} << 20;

/// Reads a profile from a regular file of at most max_contention_bytes (opened beneath
/// `root` when given: runtime/os/paths.hpp).
[[nodiscard]] expected<contention_profile> load_contention(const std::string& path, const std::string& root = "");

/// The slowdown of `worker` at `t_s` seconds: the product of the factors of every interval
/// covering it (1 when none does).
double slowdown(const contention_profile& p, uint32_t worker, double t_s);

/// The intervals that concern `worker`.
contention_profile for_worker(const contention_profile& p, uint32_t worker);

/// The text form parse_contention reads: one `WORKER START_S END_S FACTOR` line an interval.
std::string contention_text(const contention_profile& p);

}  // namespace ashlar
