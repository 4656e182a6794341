#include "runtime/metrics/progress_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace ashlar {

std::string short_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char b[32];
  if (s < 60)
    std::snprintf(b, sizeof b, "%llds", s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return b;
}

std::string time_left(double elapsed_s, uint64_t done_samples, uint64_t total_samples, double recent_rate) {
  char b[48];
  std::snprintf(b, sizeof b, "%.1f s in", elapsed_s);
  std::string out = b;
  if (total_samples == 0 || done_samples * 100 < total_samples)
    return out;
  if (done_samples >= total_samples)
    return out + ", finishing";
  const double rate = recent_rate > 0 ? recent_rate : (elapsed_s > 0 ? done_samples / elapsed_s : 0);
  if (!(rate > 0))
    return out;
  return out + ", about " + short_duration(static_cast<double>(total_samples - done_samples) / rate) + " left";
}

std::string log_stamp(int64_t unix_ns) {
  const std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char b[32];
  std::snprintf(b, sizeof b, "[%02d:%02d:%02d.%03d]", tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>((unix_ns / 1000000) % 1000));
  return b;
}

}  // namespace ashlar
