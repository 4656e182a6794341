// A running job's figures in Prometheus' text exposition format (version 0.0.4): base
// units (seconds, bytes), the ashlar_ prefix, one series per worker and per shard.
#pragma once

#include <string>
#include <vector>

#include "runtime/wire/messages.hpp"

namespace ashlar {

struct job_metrics {
  std::string policy;
  bool running = false;
  wire::cluster_stats stats;
  std::vector<wire::shard_status> shards;
  double test_accuracy = -1; // the last evaluation's; < 0: none yet
  std::vector<std::pair<std::string, double>> script_metrics; // the last value of each metric the scripts reported
  double epoch = 0;
};

/// The exposition text for `m`.
std::string prometheus_text(const job_metrics& m);

}  // namespace ashlar
