// `ashlar bench hetero`: every sync policy trained on the same heterogeneous (paced)
// workers, one after the other in this process, judged by time to a target accuracy and
// by how much of the workers' ideal throughput each one turns into samples.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/ashlar/train_options.hpp"

namespace ashlar::cli {

struct hetero_options {
  train_options train;        // the job: CONFIG and --set overrides, shared by every policy
  std::string speeds = "1,1,2,4";
  std::string contention;     // a contention profile file, or ""
  std::string policies = "bsp,ssp,ksync,kasync,asp,adsp";
  std::vector<std::string> policy_sets; // POLICY:KEY=VALUE, applied to that policy only
  double sample_ms = 0.5;
  double ideal_rate = 0;      // > 0: each profile's sample_ms set so its workers together could train this many samples/s
  bool pacing_given = false;  // --sample-ms or --ideal-rate: the pacing stands as given
  double machine_share = 0.5; // else a profile asks at most this share of the machine (machine_fit.hpp); 0: as given
  std::string machine_capacity; // "RATE:CORES": the machine as measured before (no measuring)
  double capacity = 0;        // the machine's measured samples/s (0: not measured yet)
  uint32_t capacity_cores = 1; // the cores it was measured on
  double target = 0.85;
  double time_cap = 60;
  double eval_interval = 1;
  bool stop_at_target = false; // each run ends once an evaluation reaches the target
  uint32_t repeat = 1;        // runs per policy (seeds seed, seed + 1, ...); medians reported
  std::string out = "hetero-results";
  std::string profiles;       // "random:N": N seeded random profiles (seed: --seed) instead of --speeds
};

void add_hetero_options(CLI::App* cmd, hetero_options& o);

/// Runs the benchmark; writes OUT/results.csv, results.md, series.csv and (when
/// python3-matplotlib is installed) accuracy.png. Returns the exit code.
int run_hetero_bench(const hetero_options& o);

}  // namespace ashlar::cli
