#include "runtime/pacing/machine_fit.hpp"

#include <algorithm>
#include <numeric>

#include "runtime/core/number_text.hpp"

namespace ashlar {

namespace {

std::string whole(double v) { return number_text("%.0f", v); }

}  // namespace

pacing_fit fit_pacing(double sample_ms, const std::vector<double>& speeds, const machine_capacity& machine,
                      double share) {
  pacing_fit out{sample_ms, 1, ""};
  if (share <= 0 || !(machine.samples_per_second > 0) || speeds.empty() || !(sample_ms > 0))
    return out;
  const double per_speed = 1000.0 / sample_ms; // samples/s at speed 1
  const double asked = per_speed * std::accumulate(speeds.begin(), speeds.end(), 0.0);
  const double fastest = per_speed * *std::max_element(speeds.begin(), speeds.end());
  const double all_limit = share * machine.samples_per_second;
  const double core_limit = all_limit / std::max<uint32_t>(machine.cores, 1);
  const double slowdown = std::max({1.0, asked / all_limit, fastest / core_limit});
  if (slowdown <= 1.0)
    return out;
  out.sample_ms = sample_ms * slowdown;
  out.slowdown = slowdown;
  const std::string limit = " samples/s, more than " + whole(share * 100) + "% of ";
  out.why = asked / all_limit >= fastest / core_limit
              ? "the workers together would ask " + whole(asked) + limit + "the " + whole(machine.samples_per_second)
                  + " samples/s this machine trained"
              : "the fastest worker would ask " + whole(fastest) + limit + "one core's " + whole(core_limit / share)
                  + " samples/s on this machine";
  return out;
}

contention_profile stretched(contention_profile p, double slowdown) {
  for (auto& c : p) {
    c.start_s *= slowdown;
    c.end_s *= slowdown;
  }
  return p;
}

}  // namespace ashlar
