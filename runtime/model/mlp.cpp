#include "runtime/model/mlp.hpp"

#include <cmath>
#include <random>

namespace ashlar {

std::vector<uint32_t> mlp_spec::widths() const {
  std::vector<uint32_t> w;
  w.reserve(hidden.size() + 2);
  w.push_back(input);
  w.insert(w.end(), hidden.begin(), hidden.end());
  w.push_back(classes);
  return w;
}

uint64_t mlp_spec::num_params() const {
  auto w = widths();
  uint64_t n = 0;
  for (size_t i = 0; i + 1 < w.size(); ++i)
    n += uint64_t{w[i]} * w[i + 1] + w[i + 1];
  return n;
}

std::string mlp_spec::to_string() const {
  std::string s;
  for (auto w : widths()) {
    if (!s.empty())
      s += '-';
    s += std::to_string(w);
  }
  return s;
}

std::vector<layer_offsets> layer_layout(const mlp_spec& spec) {
  auto w = spec.widths();
  std::vector<layer_offsets> out;
  uint64_t pos = 0;
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    layer_offsets l;
    l.in = w[i];
    l.out = w[i + 1];
    l.weight = pos;
    pos += uint64_t{l.in} * l.out;
    l.bias = pos;
    pos += l.out;
    out.push_back(l);
  }
  return out;
}

caf::error validate(const mlp_spec& spec) {
  if (spec.input == 0)
    return make_error(errc::invalid_config, "model input width must be > 0");
  if (spec.classes < 2)
    return make_error(errc::invalid_config, "model.classes must be >= 2");
  for (size_t i = 0; i < spec.hidden.size(); ++i)
    if (spec.hidden[i] == 0)
      return make_error(errc::invalid_config,
                        "model.hidden[" + std::to_string(i) + "] must be > 0");
  return caf::none;
}

std::vector<float> init_params(const mlp_spec& spec, uint64_t seed) {
  std::vector<float> p(spec.num_params(), 0.0f);
  std::mt19937_64 gen{seed};
  // Box-Muller on the raw generator: std::normal_distribution's algorithm is not
  // pinned by the standard, this is, so the bits do not depend on the library.
  auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };
  for (const auto& l : layer_layout(spec)) {
    double stddev = std::sqrt(2.0 / l.in);
    uint64_t n = uint64_t{l.in} * l.out;
    for (uint64_t i = 0; i < n; ++i) {
      double u1 = uniform(), u2 = uniform();
      double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      p[l.weight + i] = static_cast<float>(z * stddev);
    }
  }
  return p;
}

}  // namespace ashlar
