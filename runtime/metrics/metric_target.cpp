#include "runtime/metrics/metric_target.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace ashlar {

const char* metric_name_error(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return "a metric's name has 1 to 64 characters";
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'))
      return "a metric's name holds letters, digits, '_', '.' and '-' only";
  return nullptr;
}

bool metric_target::met(double x) const {
  if (std::isnan(x))
    return false;
  switch (op) {
    case cmp::le:
      return x <= value;
    case cmp::lt:
      return x < value;
    case cmp::ge:
      return x >= value;
    case cmp::gt:
      return x > value;
  }
  return false;
}

std::string metric_target::text() const {
  static const char* ops[] = {"<=", "<", ">=", ">"};
  std::ostringstream o;
  o << name << ' ' << ops[static_cast<int>(op)] << ' ' << value;
  return o.str();
}

expected<metric_target> parse_metric_target(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_config,
                      "run.target = \"" + text + "\": " + why + " (write NAME OP VALUE, e.g. \"val_ppl <= 150\"; OP is "
                                                                 "<=, <, >= or >)");
  };
  const auto at = text.find_first_of("<>");
  if (at == std::string::npos)
    return bad("no comparison");
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t");
    const auto e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string{} : s.substr(b, e - b + 1);
  };
  metric_target t;
  t.name = trim(text.substr(0, at));
  if (auto why = metric_name_error(t.name))
    return bad(why);
  size_t rest = at + 1;
  const bool eq = rest < text.size() && text[rest] == '=';
  if (eq)
    ++rest;
  t.op = text[at] == '<' ? (eq ? metric_target::cmp::le : metric_target::cmp::lt)
                         : (eq ? metric_target::cmp::ge : metric_target::cmp::gt);
  const std::string number = trim(text.substr(rest));
  char* end = nullptr;
  t.value = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(t.value))
    return bad("'" + number + "' is not a finite number");
  return t;
}

std::vector<metric_point> metric_log::take(const std::vector<wire::metric_report>& reports, double now,
                                           const std::function<double(uint64_t)>& epoch_of) {
  std::vector<metric_point> out;
  for (const auto& r : reports) {
    if (r.seq <= seq_)
      continue;
    missed_ += r.seq - seq_ - 1;
    seq_ = r.seq;
    metric_point p;
    p.seconds = now;
    p.samples = r.samples;
    p.epoch = epoch_of ? epoch_of(r.samples) : 0;
    p.worker_id = r.worker_id;
    for (const auto& v : r.values) {
      p.values.emplace_back(v.name, v.value);
      keep_last(last_, v.name, v.value);
    }
    if (target_ && !met_) {
      if (const double* v = find_metric(r.values, target_->name); v && target_->met(*v)) {
        met_ = p;
        met_value_ = *v;
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ashlar
