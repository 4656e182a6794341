#include "runtime/alloc/batch_allocation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>


namespace ashlar {

expected<std::vector<uint32_t>> equal_shares(uint32_t global, size_t workers) {
  if (workers == 0 || global < workers)
    return make_error(errc::invalid_argument, "cannot split a batch of " + std::to_string(global) + " over "
                                                + std::to_string(workers) + " workers (each needs at least 1)");
  std::vector<uint32_t> out(workers, static_cast<uint32_t>(global / workers));
  for (size_t i = 0; i < global % workers; ++i)
    ++out[i];
  return out;
}

expected<std::vector<uint32_t>> proportional_shares(uint32_t global, const std::vector<double>& speeds) {
  const size_t n = speeds.size();
  if (n == 0 || global < n)
    return make_error(errc::invalid_argument, "cannot split a batch of " + std::to_string(global) + " over "
                                                + std::to_string(n) + " workers (each needs at least 1)");
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!(speeds[i] > 0) || !std::isfinite(speeds[i]))
      return make_error(errc::invalid_argument, "worker " + std::to_string(i) + " has speed "
                                                  + std::to_string(speeds[i]) + "; speeds must be > 0");
    total += speeds[i];
  }
  // Each worker's exact proportional part, rounded down but at least 1; what is left (or
  // over, from the minimum of 1) is settled by largest (smallest) remainder.
  std::vector<uint32_t> out(n);
  std::vector<std::pair<double, size_t>> remainder(n);
  int64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = global * speeds[i] / total;
    out[i] = std::max<uint32_t>(1, static_cast<uint32_t>(std::floor(exact)));
    given += out[i];
    remainder[i] = {exact - out[i], i};
  }
  std::sort(remainder.begin(), remainder.end(),
            [](const auto& x, const auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  for (size_t j = 0; given < global; ++j, ++given)
    ++out[remainder[j % n].second];
  for (size_t j = n; given > global; --j) {
    size_t i = remainder[(j - 1) % n].second;
    if (out[i] > 1) {
      --out[i];
      --given;
    }
    if (j == 1)
      j = n + 1;
  }
  return out;
}

adaptive_allocator::adaptive_allocator(uint32_t global, size_t workers, double alpha)
  : global_(global), alpha_(std::clamp(alpha, 1e-6, 1.0)), speed_(workers, 0.0) {
}

void adaptive_allocator::observe(size_t worker, uint32_t batch, double seconds) {
  if (worker >= speed_.size() || batch == 0 || !(seconds > 0) || !std::isfinite(seconds))
    return;
  double s = batch / seconds;
  speed_[worker] = speed_[worker] == 0 ? s : alpha_ * s + (1 - alpha_) * speed_[worker];
}

std::vector<uint32_t> adaptive_allocator::shares() const {
  bool all = std::all_of(speed_.begin(), speed_.end(), [](double s) { return s > 0; });
  auto out = all ? proportional_shares(global_, speed_) : equal_shares(global_, speed_.size());
  return out ? *out : std::vector<uint32_t>(speed_.size(), 1);
}

}  // namespace ashlar
