#include "runtime/pacing/random_profiles.hpp"

#include <algorithm>
#include <random>

#include "runtime/core/number_text.hpp"

namespace ashlar {

namespace {

std::string num(double v) { return number_text("%g", v); }

}  // namespace

std::string hetero_profile::speeds_text() const {
  std::string s;
  for (auto v : speeds)
    s += (s.empty() ? "" : ",") + num(v);
  return s;
}

std::string hetero_profile::contention_text() const {
  return ashlar::contention_text(contention);
}

std::vector<hetero_profile> random_profiles(uint32_t n, uint64_t seed, const random_profile_settings& s) {
  std::mt19937_64 rng{seed};
  auto uniform = [&](uint32_t lo, uint32_t hi) { return std::uniform_int_distribution<uint32_t>{lo, hi}(rng); };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>{lo, hi}(rng); };
  std::vector<hetero_profile> out;
  for (uint32_t k = 0; k < n; ++k) {
    hetero_profile p;
    const uint32_t w = uniform(s.min_workers, s.max_workers);
    for (uint32_t i = 0; i < w; ++i)
      p.speeds.push_back(uniform(1, s.max_speed));
    // Heterogeneous for sure: a slowest worker at 1 and one at 3 or more.
    p.speeds[uniform(0, w - 1)] = 1;
    if (*std::max_element(p.speeds.begin(), p.speeds.end()) < 3) {
      uint32_t i = uniform(0, w - 1);
      while (p.speeds[i] == 1 && std::count(p.speeds.begin(), p.speeds.end(), 1.0) == 1)
        i = uniform(0, w - 1);
      p.speeds[i] = uniform(3, s.max_speed);
    }
    if (real(0, 1) < s.contention_share) {
      const uint32_t intervals = uniform(1, 3);
      for (uint32_t j = 0; j < intervals; ++j) {
        contention_interval c;
        c.worker = uniform(0, w - 1);
        c.start_s = std::round(real(0, s.horizon_s) * 10) / 10;
        c.end_s = c.start_s + std::round(real(2, 6) * 10) / 10;
        c.factor = std::round(real(2, 4) * 10) / 10;
        p.contention.push_back(c);
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

expected<uint32_t> parse_profiles_spec(const std::string& spec) {
  const std::string prefix = "random:";
  auto bad = [&] {
    return make_error(errc::invalid_argument,
                      "--profiles '" + spec + "': expected random:N (N seeded random profiles, 1 to 100)");
  };
  if (spec.rfind(prefix, 0) != 0)
    return bad();
  auto rest = spec.substr(prefix.size());
  if (rest.empty() || rest.size() > 3 || rest.find_first_not_of("0123456789") != std::string::npos)
    return bad();
  auto v = static_cast<uint32_t>(std::stoul(rest));
  if (v < 1 || v > 100)
    return bad();
  return v;
}

}  // namespace ashlar
