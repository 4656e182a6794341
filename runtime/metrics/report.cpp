#include "runtime/metrics/report.hpp"
#include "runtime/metrics/json.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace ashlar {

namespace {

std::string num(double v) { return json_number(v); }
std::string str(const std::string& s) { return json_string(s); }

}  // namespace

std::string json_number(double v, int digits) {
  if (!std::isfinite(v))
    return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return buf;
}

std::string json_micros(double us) {
  if (!std::isfinite(us))
    return "null";
  return std::to_string(std::llround(us));
}

std::string json_seconds(double seconds) {
  if (!std::isfinite(seconds))
    return "null";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.6f", seconds);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

void keep_last(std::vector<std::pair<std::string, double>>& values, const std::string& name, double value) {
  auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
  if (it == values.end())
    values.emplace_back(name, value);
  else
    it->second = value;
}

std::string to_json(const run_report& r) {
  std::ostringstream o;
  o << "{\n"
    << "  \"policy\": " << str(r.policy) << ",\n"
    << "  \"optimizer\": " << str(r.optimizer) << ",\n"
    << "  \"model\": " << str(r.model) << ",\n"
    << "  \"backend\": " << str(r.backend) << ",\n"
    << "  \"workers\": " << r.workers << ",\n"
    << "  \"servers\": " << r.servers << ",\n"
    << "  \"epochs\": " << r.epochs << ",\n"
    << "  \"batch_size\": " << r.batch_size << ",\n"
    << "  \"seed\": " << r.seed << ",\n"
    << "  \"train_samples\": " << r.train_samples << ",\n"
    << "  \"test_samples\": " << r.test_samples << ",\n"
    << "  \"test_accuracy\": " << num(r.test_accuracy) << ",\n"
    << "  \"test_loss\": " << num(r.test_loss) << ",\n"
    << "  \"seconds\": " << num(r.seconds) << ",\n"
    << "  \"startup_seconds\": " << num(r.startup_seconds) << ",\n"
    << "  \"samples\": " << r.samples << ",\n"
    << "  \"samples_per_second\": " << num(r.samples_per_second) << ",\n"
    << "  \"versions\": " << r.versions << ",\n"
    << "  \"dropped\": " << r.dropped << ",\n"
    << "  \"mean_staleness\": " << num(r.mean_staleness) << ",\n"
    << "  \"bytes\": " << r.bytes << ",\n"
    << "  \"dense_bytes\": " << r.dense_bytes << ",\n"
    << "  \"compression_ratio\": "
    << num(r.bytes > 0 ? static_cast<double>(r.dense_bytes) / static_cast<double>(r.bytes) : 1.0) << ",\n"
    << "  \"stopped_early\": " << (r.stopped_early ? "true" : "false") << ",\n"
    << "  \"target_reached\": " << (r.target_reached ? "true" : "false") << ",\n"
    << "  \"time_limited\": " << (r.time_limited ? "true" : "false") << ",\n"
    << "  \"epochs_trained\": " << num(r.epochs_trained) << ",\n"
    << "  \"redone_samples\": " << r.redone_samples << ",\n"
    << "  \"lost_workers\": " << r.lost_workers << ",\n"
    << "  \"reassigned_samples\": " << r.reassigned_samples << ",\n"
    << "  \"applied_samples\": " << r.applied_samples << ",\n"
    << "  \"refused_reports\": " << r.refused_reports << ",\n"
    << "  \"abandoned_cuts\": [";
  for (size_t i = 0; i < r.abandoned_cuts.size(); ++i)
    o << (i ? ", " : "") << str(r.abandoned_cuts[i]);
  o << "],\n";
  if (!r.error.empty())
    o << "  \"error\": " << str(r.error) << ",\n";
  o << "  \"target\": " << (r.target.empty() ? std::string{"null"} : str(r.target)) << ",\n";
  // The scripts' named metrics: each report, and the last value of each name.
  auto values = [](const std::vector<std::pair<std::string, double>>& vs) {
    std::string out = "{";
    for (size_t i = 0; i < vs.size(); ++i)
      out += (i ? ", " : "") + str(vs[i].first) + ": " + json_number(vs[i].second, 10); // (as reported)
    return out + "}";
  };
  std::vector<std::pair<std::string, double>> last;
  for (const auto& m : r.metrics)
    for (const auto& [name, value] : m.values)
      keep_last(last, name, value);
  o << "  \"final_metrics\": " << values(last) << ",\n  \"metrics\": [";
  for (size_t i = 0; i < r.metrics.size(); ++i) {
    const auto& m = r.metrics[i];
    o << (i ? ",\n    " : "\n    ") << "{\"seconds\": " << num(m.seconds) << ", \"epoch\": " << num(m.epoch)
      << ", \"samples\": " << m.samples << ", \"worker\": " << m.worker_id << ", \"values\": " << values(m.values)
      << "}";
  }
  o << (r.metrics.empty() ? "],\n" : "\n  ],\n");
  o
    << "  \"history\": [";
  for (size_t i = 0; i < r.history.size(); ++i) {
    const auto& h = r.history[i];
    o << (i ? ",\n    " : "\n    ") << "{\"epoch\": " << num(h.epoch) << ", \"seconds\": "
      << num(h.seconds) << ", \"test_accuracy\": " << num(h.test_accuracy)
      << ", \"train_loss\": " << num(h.train_loss) << ", \"bytes\": " << h.bytes << "}";
  }
  o << (r.history.empty() ? "],\n" : "\n  ],\n") << "  \"per_worker\": [";
  for (size_t i = 0; i < r.per_worker.size(); ++i) {
    const auto& w = r.per_worker[i];
    o << (i ? ",\n    " : "\n    ") << "{\"worker\": " << w.worker_id << ", \"steps\": " << w.steps
      << ", \"samples\": " << w.samples << ", \"samples_per_second\": " << num(w.samples_per_second)
      << ", \"compute_seconds\": " << num(w.compute_seconds)
      << ", \"wait_seconds\": " << num(w.wait_seconds) << ", \"stage_changes\": " << w.stage_changes
      << "}";
  }
  o << (r.per_worker.empty() ? "]\n" : "\n  ]\n") << "}\n";
  return o.str();
}

run_report failed_report(const std::string& policy, const std::string& model, uint32_t workers, uint32_t servers,
                         uint32_t epochs, const std::string& error) {
  run_report r;
  r.policy = policy;
  r.model = model;
  r.workers = workers;
  r.servers = servers;
  r.epochs = epochs;
  r.error = error;
  return r;
}

caf::error write_report(const run_report& r, const std::string& path) {
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    return make_error(errc::io_error, "cannot write report " + tmp + ": " + std::strerror(errno));
  auto text = to_json(r);
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    int e = errno;
    std::remove(tmp.c_str());
    return make_error(errc::io_error, "cannot write report " + path + ": " + std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    return make_error(errc::io_error, "cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
  }
  return caf::none;
}

}  // namespace ashlar
