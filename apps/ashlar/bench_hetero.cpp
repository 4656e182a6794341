#include "apps/ashlar/bench_hetero.hpp"

#include "runtime/policy/policy_rules.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <sched.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "actors/local_job.hpp"
#include "runtime/core/log.hpp"
#include "runtime/core/number_text.hpp"
#include "runtime/pacing/contention.hpp"
#include "runtime/pacing/machine_fit.hpp"
#include "runtime/pacing/random_profiles.hpp"

namespace ashlar::cli {

namespace {

struct policy_result {
  std::string policy;
  std::optional<double> time_to_target; // median over the runs (a run that missed counts as slowest)
  double time_min = 0, time_max = 0;    // over the runs that reached the target
  uint32_t reached = 0, runs = 0;
  double final_accuracy = 0;
  double best_accuracy = 0;
  double samples_per_second = 0;
  double ideal_fraction = 0;
  double mean_staleness = 0;
  uint64_t bytes = 0;
  std::optional<double> bytes_to_target; // median over the runs that reached the target
  double seconds = 0;
  std::vector<epoch_point> history;
  std::string error;
  std::string settings; // batch, lr and momentum it trained with
  double cap = 0;        // the time cap it trained under (a miss counts as this)
  double sample_ms = 0;  // the profile's pacing it trained under
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss{s};
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty())
      out.push_back(item);
  return out;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty())
    return std::numeric_limits<double>::quiet_NaN();
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string fmt(double x, int prec = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, x);
  return buf;
}

}  // namespace

void add_hetero_options(CLI::App* cmd, hetero_options& o) {
  add_train_options(cmd, o.train);
  cmd->add_option("--speeds", o.speeds, "relative worker speeds; the worker count is their number")
    ->capture_default_str();
  cmd->add_option("--contention", o.contention, "contention profile file (lines: WORKER START_S END_S FACTOR)");
  cmd->add_option("--policies", o.policies,
                  "policies to run, comma-separated; POLICY+ALLOCATION picks a batch allocation "
                  "(e.g. bsp+proportional)")
    ->capture_default_str();
  cmd->add_option("--policy-set", o.policy_sets,
                  "POLICY:KEY=VALUE, a setting for one policy only (repeatable), e.g. asp:train.lr=0.02");
  auto given = [&o](const std::string&) { o.pacing_given = true; };
  auto* sample_ms = cmd->add_option("--sample-ms", o.sample_ms, "wall time per sample at speed 1, ms")
                      ->capture_default_str()
                      ->each(given);
  cmd->add_option("--ideal-rate", o.ideal_rate,
                  "samples/s the workers together could train, every one busy at its pace: sets --sample-ms to "
                  "1000 x (sum of the speeds) / RATE, so profiles of any size ask the same of the machine "
                  "(for a model whose compute, not the pacing, would otherwise set the rate)")
    ->check(CLI::PositiveNumber)
    ->excludes(sample_ms)
    ->each(given);
  auto* share = cmd->add_option("--machine-share", o.machine_share,
                  "without --sample-ms or --ideal-rate: the bench first measures what this machine trains with "
                  "every core busy, and slows a profile that would ask more than this share of it in all, or of "
                  "one core for its fastest worker, until it asks exactly that (every worker by the same factor, "
                  "the time cap and the contention intervals with them), so that the pacing, not the machine's "
                  "cores, sets the workers' speeds; 0 paces as given")
    ->capture_default_str()
    ->check(CLI::Range(0.0, 1.0))
    ->excludes(sample_ms);
  auto* ideal_rate = cmd->get_option("--ideal-rate");
  share->excludes(ideal_rate);
  // For tests and for repeating a bench on a machine measured before: no measuring.
  cmd->add_option("--machine-capacity", o.machine_capacity,
                  "RATE:CORES, the machine's unpaced samples/s and the cores they were measured on, instead of "
                  "measuring it")
    ->group("")
    ->excludes(sample_ms)
    ->excludes(ideal_rate);
  cmd->add_option("--target", o.target, "target test accuracy")->capture_default_str();
  cmd->add_option("--time-cap", o.time_cap, "seconds each policy may train")->capture_default_str();
  cmd->add_flag("--stop-at-target", o.stop_at_target,
                "end each run once an evaluation reaches --target (run.target_accuracy) instead of training to "
                "--time-cap: for long runs; final and best accuracy are then those at the stop");
  cmd->add_option("--eval-interval", o.eval_interval, "seconds between test evaluations")->capture_default_str();
  cmd->add_option("--repeat", o.repeat, "runs per policy, seeds seed .. seed + N - 1; the table gives the "
                                        "median time to target, its range, and means of the rest")
    ->capture_default_str()
    ->check(CLI::Range(1u, 100u));
  cmd->add_option("--profiles", o.profiles,
                  "random:N: run every policy on N seeded random heterogeneity profiles (4-8 workers, speeds 1-8, "
                  "some with contention; --seed picks them) instead of --speeds, with a table per profile and a "
                  "summary of each policy's median and worst time ratio to adsp and bsp over them");
  cmd->add_option("--out", o.out, "directory for results.md, results.csv, series.csv and bench.json (ops/plot draws accuracy.png "
                               "from them)")
    ->capture_default_str();
}

namespace {

// The cores this process may run on: its CPU affinity, and at most a cgroup v2 CPU quota.
uint32_t usable_cores() {
  uint32_t n = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    n = std::max(1, CPU_COUNT(&set));
  std::ifstream max{"/sys/fs/cgroup/cpu.max"};
  std::string quota;
  double period = 0;
  if (max >> quota >> period && quota != "max" && period > 0) {
    char* end = nullptr;
    const double q = std::strtod(quota.c_str(), &end);
    if (end != quota.c_str() && q > 0)
      n = std::min(n, std::max(1u, static_cast<uint32_t>(std::ceil(q / period))));
  }
  return n;
}

// What this machine's cores train with every one busy: the config's model on the CPU, plain
// ASP (no worker waits for another), unpaced, twice as many workers as cores (at least 4),
// for 3 s, writing nothing (no checkpoints, report, trace or metrics).
expected<machine_capacity> measure_capacity(const hetero_options& o) {
  train_config cfg;
  if (auto err = resolve_config(o.train, cfg, false))
    return err;
  const uint32_t cores = usable_cores();
  const std::vector<std::pair<std::string, std::string>> settings = {
    {"train.policy", "asp"},          {"train.allocation", "equal"},
    {"train.workers", std::to_string(std::max(4u, 2 * cores))},
    {"train.speeds", ""},             {"train.contention", ""},
    {"run.time_limit", "3"},          {"run.eval_interval", "0"},
    {"run.eval_every_epoch", "false"}, {"run.target_accuracy", "0"},
    {"run.progress_interval", "0"},   {"run.checkpoint_dir", ""},
    {"run.resume", "false"},          {"run.report", ""},
    {"run.trace", ""},                {"run.metrics", ""},
    {"run.metrics_listen", ""},       {"run.gpus", "none"}, // the cores' rate, which paced workers share
    {"train.epochs", "1000000"},      // the 3 s, not the sample budget, end it
  };
  for (const auto& [key, value] : settings)
    if (auto err = apply_setting(cfg, key, value, ""))
      return err;
  if (auto err = apply_policy_rules(cfg)) // asp's step: a diverging run would measure its back-offs
    return err;
  if (auto err = validate_job(cfg))
    return err;
  std::printf("measuring this machine: %u unpaced asp workers for 3 s ... ", cfg.workers);
  std::fflush(stdout);
  auto rep = actors::run_local_job(cfg);
  if (!rep)
    return rep.error();
  std::printf("%.0f samples/s on %u cores\n", rep->samples_per_second, cores);
  std::fflush(stdout);
  return machine_capacity{rep->samples_per_second, cores};
}

// One profile of `bench hetero`: its speeds, its pacing and contention (fit to the machine
// when asked), and the results of the policies it trains one after the other.
struct profile_bench {
  hetero_options o;                   // the options, with --speeds as a plain list
  std::vector<double> speed_values;   // --speeds, parsed
  double sample_ms = 0;               // the pacing every policy trains under
  double time_cap = 0;                // the seconds every policy may train
  std::string contention;             // stretched with the pacing when that is fit
  std::string machine_text;           // RATE:CORES the pacing was fit to, for bench.json
  std::vector<policy_result> results; // per policy, in the order of --policies
  double ideal = 0;                   // the last policy's ideal aggregate throughput, samples/s

  // One policy's runs as they come in: the result they add to, per run its time to the
  // target (a miss is +inf), and per run that reached it the bytes moved by then.
  struct policy_runs {
    policy_result r;
    std::vector<double> times;
    std::vector<double> target_bytes;
  };

  int prepare(const hetero_options& given);
  int fit_to_machine();
  int stretch_contention(double slowdown);
  int configure_policy(const std::string& entry, train_config& cfg, std::string& own_settings) const;
  int run_policy(const std::string& entry);
  void add_run(const train_config& cfg, const contention_profile& profile, uint32_t run, policy_runs& runs) const;
  double run_ideal(const train_config& cfg, const contention_profile& profile, double seconds) const;
  void finish_policy(policy_runs& runs) const;
  void write_results_csv() const;
  void write_series_csv() const;
  void write_results_md() const;
  void write_bench_json() const;
};

// Takes the options: --speeds parsed and shown as a plain list, the output directory created,
// the pacing and time cap as given. Returns the exit code, 0 when the profile can run.
int profile_bench::prepare(const hetero_options& given) {
  // --speeds takes what train.speeds takes (blanks and brackets too); the tables and
  // bench.json show it as a plain list.
  train_config parsed;
  if (auto err = apply_setting(parsed, "train.speeds", given.speeds)) {
    std::fprintf(stderr, "ashlar bench hetero: --speeds: %s\n", describe(err).c_str());
    return 2;
  }
  speed_values = parsed.speeds;
  if (speed_values.empty()) {
    std::fprintf(stderr, "ashlar bench hetero: --speeds needs at least one speed\n");
    return 2;
  }
  o = given;
  o.speeds.clear();
  for (double x : speed_values)
    o.speeds += (o.speeds.empty() ? "" : ",") + number_text("%.10g", x);
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec || !std::filesystem::is_directory(o.out)) {
    std::fprintf(stderr, "ashlar bench hetero: cannot create the directory %s: %s\n", o.out.c_str(),
                 ec ? ec.message().c_str() : "not a directory");
    return 1;
  }
  sample_ms = o.sample_ms;
  if (o.ideal_rate > 0)
    sample_ms = 1000.0 * std::accumulate(speed_values.begin(), speed_values.end(), 0.0) / o.ideal_rate;
  time_cap = o.time_cap;
  contention = o.contention;
  return 0;
}

// Slows the pacing, the time cap and the contention profile to ask at most --machine-share of
// the machine (measured first unless --machine-capacity gave it). Returns the exit code.
int profile_bench::fit_to_machine() {
  machine_capacity machine{o.capacity, o.capacity_cores};
  if (!(machine.samples_per_second > 0)) {
    auto m = measure_capacity(o);
    if (!m) {
      std::fprintf(stderr, "ashlar bench hetero: measuring this machine: %s\n", describe(m.error()).c_str());
      return 2;
    }
    machine = *m;
  }
  if (machine.samples_per_second >= 1) // a rate --machine-capacity takes again
    machine_text = fmt(machine.samples_per_second, 0) + ":" + std::to_string(machine.cores);
  auto fit = fit_pacing(sample_ms, speed_values, machine, o.machine_share);
  if (!(fit.slowdown > 1))
    return 0;
  std::printf("   paced to this machine: %.2f ms per sample at speed 1 instead of %.2f, time cap %.3g s instead of "
              "%.3g (%s; --machine-share 0 paces as given)\n",
              fit.sample_ms, sample_ms, time_cap * fit.slowdown, time_cap, fit.why.c_str());
  sample_ms = fit.sample_ms;
  time_cap *= fit.slowdown;
  return o.contention.empty() ? 0 : stretch_contention(fit.slowdown);
}

// Writes --contention on the `slowdown` times slower run's timeline (the same part of the run)
// to OUT/contention.txt, which the policies then train with. Returns the exit code.
int profile_bench::stretch_contention(double slowdown) {
  auto profile = load_contention(o.contention);
  if (!profile) {
    std::fprintf(stderr, "ashlar bench hetero: %s\n", describe(profile.error()).c_str());
    return 2;
  }
  contention = o.out + "/contention.txt";
  std::ofstream out{contention};
  out << "# " << o.contention << " with its times x " << fmt(slowdown, 4)
      << " (the pacing fit to this machine)\n# worker start_s end_s factor\n"
      << contention_text(stretched(std::move(*profile), slowdown));
  if (!out) {
    std::fprintf(stderr, "ashlar bench hetero: cannot write %s\n", contention.c_str());
    return 1;
  }
  return 0;
}

// The config policy `entry` (POLICY or POLICY+ALLOCATION) trains with: the job's, the bench's
// settings, its --policy-set ones and the policy's rules; `own_settings` lists those beyond
// batch, lr and momentum. Returns the exit code, 0 when the config is valid.
int profile_bench::configure_policy(const std::string& entry, train_config& cfg, std::string& own_settings) const {
  // "bsp+proportional": policy bsp with train.allocation = proportional.
  auto plus = entry.find('+');
  std::string name = entry.substr(0, plus);
  std::string allocation = plus == std::string::npos ? "equal" : entry.substr(plus + 1);
  // The policy's rules apply once the bench has set the policy and the workers.
  if (auto err = resolve_config(o.train, cfg, false)) {
    std::fprintf(stderr, "ashlar bench hetero: %s\n", describe(err).c_str());
    return 2;
  }
  std::vector<std::pair<std::string, std::string>> settings = {
    {"train.policy", name},
    {"train.allocation", allocation},
    {"train.speeds", o.speeds},
    {"train.workers", std::to_string(speed_values.size())},
    {"train.sample_ms", fmt(sample_ms, 6)},
    {"train.contention", contention},
    {"run.eval_interval", fmt(o.eval_interval, 6)},
    {"run.time_limit", fmt(time_cap, 6)},
    {"run.target_accuracy", o.stop_at_target ? fmt(o.target, 6) : "0"},
    {"run.eval_every_epoch", "false"},
    {"run.progress_interval", "0"},
  };
  const size_t bench_settings = settings.size(); // the bench's own; --policy-set ones follow
  for (const auto& ps : o.policy_sets) { // their form was checked before the first run
    const auto colon = ps.find(':'), eq = ps.find('=');
    if (ps.substr(0, colon) == name || ps.substr(0, colon) == entry) {
      settings.emplace_back(ps.substr(colon + 1, eq - colon - 1), ps.substr(eq + 1));
      // The table names the batch, lr and momentum of every policy; other settings
      // of this policy's own are listed after them as given.
      const auto& key = settings.back().first;
      if (key != "train.batch_size" && key != "train.lr" && key != "train.momentum")
        own_settings += ", " + key + "=" + settings.back().second;
    }
  }
  caf::error err;
  for (size_t i = 0; i < settings.size() && !err; ++i)
    err = apply_setting(cfg, settings[i].first, settings[i].second, i < bench_settings ? "" : "--policy-set");
  if (!err)
    err = apply_policy_rules(cfg);
  for (const auto& [key, source] : cfg.sources)
    if (source.rfind("rule: ", 0) == 0 && key != "train.batch_size" && key != "train.lr" && key != "train.momentum")
      own_settings += ", " + key + "=" + setting_text(cfg, key) + " (rule)";
  if (!err)
    err = validate_job(cfg);
  if (err) {
    std::fprintf(stderr, "ashlar bench hetero: policy %s: %s\n", name.c_str(), describe(err).c_str());
    return 2;
  }
  return 0;
}

// Trains policy `entry` --repeat times and adds its result (or its failure) to the results.
// Returns the exit code: 0 also when a run failed, not when the policy cannot be configured.
int profile_bench::run_policy(const std::string& entry) {
  train_config cfg;
  std::string own_settings; // this policy's --policy-set keys beyond batch, lr and momentum
  if (int code = configure_policy(entry, cfg, own_settings))
    return code;
  // Ideal aggregate throughput: every worker busy at its paced rate all the time.
  ideal = 0;
  for (uint32_t i = 0; i < cfg.workers; ++i)
    ideal += 1000.0 / cfg.sample_ms * cfg.speeds[i % cfg.speeds.size()];
  contention_profile profile;
  if (!cfg.contention.empty()) {
    auto p = load_contention(cfg.contention);
    if (!p) {
      std::fprintf(stderr, "ashlar bench hetero: %s\n", describe(p.error()).c_str());
      return 2;
    }
    profile = std::move(*p);
  }
  std::printf("== %s: %u workers at speeds %s, %.2f ms/sample, batch %u per worker, lr %g, momentum %g, cap %.0f s\n",
              entry.c_str(), cfg.workers, o.speeds.c_str(), cfg.sample_ms, cfg.batch_size, cfg.optimizer.lr,
              cfg.optimizer.momentum, time_cap);
  std::fflush(stdout);
  policy_runs runs;
  policy_result& r = runs.r;
  r.policy = entry;
  r.cap = time_cap;
  r.sample_ms = sample_ms;
  r.runs = o.repeat;
  {
    char buf[96];
    std::snprintf(buf, sizeof buf, "batch %u, lr %g, momentum %g", cfg.batch_size, cfg.optimizer.lr,
                  cfg.optimizer.momentum);
    r.settings = buf + own_settings;
  }
  const uint64_t seed = cfg.seed;
  for (uint32_t run = 0; run < o.repeat && r.error.empty(); ++run) {
    cfg.seed = seed + run;
    add_run(cfg, profile, run, runs);
  }
  if (!r.error.empty())
    std::printf("   failed: %s\n", r.error.c_str());
  else
    finish_policy(runs);
  results.push_back(r);
  return 0;
}

// Trains run number `run` of a policy with `cfg` and adds it to `runs` (its error when it failed).
void profile_bench::add_run(const train_config& cfg, const contention_profile& profile, uint32_t run,
                            policy_runs& runs) const {
  policy_result& r = runs.r;
  auto rep = actors::run_local_job(cfg);
  if (!rep) {
    r.error = describe(rep.error());
    return;
  }
  std::optional<double> t;
  double best = 0;
  for (const auto& p : rep->history) {
    best = std::max(best, p.test_accuracy);
    if (!t && p.test_accuracy >= o.target) {
      t = p.seconds;
      runs.target_bytes.push_back(static_cast<double>(p.bytes));
    }
  }
  if (run == 0)
    r.history = rep->history;
  const double ideal_rate = run_ideal(cfg, profile, rep->seconds);
  const double n = static_cast<double>(o.repeat);
  r.best_accuracy += best / n;
  r.final_accuracy += rep->test_accuracy / n;
  r.samples_per_second += rep->samples_per_second / n;
  r.ideal_fraction += (ideal_rate > 0 ? rep->samples_per_second / ideal_rate : 0) / n;
  r.mean_staleness += rep->mean_staleness / n;
  r.bytes += rep->bytes / o.repeat;
  r.seconds += rep->seconds / n;
  runs.times.push_back(t ? *t : std::numeric_limits<double>::infinity());
  if (t) {
    r.time_min = r.reached == 0 ? *t : std::min(r.time_min, *t);
    r.time_max = r.reached == 0 ? *t : std::max(r.time_max, *t);
    ++r.reached;
  }
  if (o.repeat > 1)
    std::printf("   run %u (seed %llu): %s\n", run + 1, static_cast<unsigned long long>(cfg.seed),
                t ? ("target at " + fmt(*t, 1) + " s").c_str() : "target NOT reached");
}

// The ideal aggregate throughput of a run of `seconds`: with a contention profile, each
// worker's paced rate divided by its slowdown, averaged over the run.
double profile_bench::run_ideal(const train_config& cfg, const contention_profile& profile, double seconds) const {
  if (profile.empty() || !(seconds > 0))
    return ideal;
  double total = 0;
  const double dt = 0.01;
  for (uint32_t i = 0; i < cfg.workers; ++i) {
    double base = 1000.0 / cfg.sample_ms * cfg.speeds[i % cfg.speeds.size()], sum = 0;
    int steps = 0;
    for (double tt = 0; tt < seconds; tt += dt, ++steps)
      sum += base / slowdown(profile, i, tt);
    total += steps > 0 ? sum / steps : base;
  }
  return total;
}

// Sets a policy's median time to the target and bytes to the target over its runs, and prints its line.
void profile_bench::finish_policy(policy_runs& runs) const {
  policy_result& r = runs.r;
  auto& times = runs.times;
  std::sort(times.begin(), times.end());
  double median = times.size() % 2 == 1 ? times[times.size() / 2]
                                        : (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;
  if (std::isfinite(median))
    r.time_to_target = median;
  if (!runs.target_bytes.empty())
    r.bytes_to_target = median_of(runs.target_bytes);
  std::printf("   %s; final accuracy %.4f; %.0f samples/s = %.3f of ideal; mean staleness %.2f\n",
              r.time_to_target ? ("target " + fmt(o.target, 2) + " at " + fmt(*r.time_to_target, 1) + " s").c_str()
                               : ("target " + fmt(o.target, 2) + " NOT reached").c_str(),
              r.final_accuracy, r.samples_per_second, r.ideal_fraction, r.mean_staleness);
  std::fflush(stdout);
}

// Writes OUT/results.csv: a line per policy.
void profile_bench::write_results_csv() const {
  std::ofstream csv{o.out + "/results.csv"};
  csv << "policy,time_to_target_s,time_min_s,time_max_s,runs_reached,runs,final_accuracy,best_accuracy,"
         "samples_per_second,ideal_fraction,mean_staleness,bytes_sent,bytes_to_target,seconds,error\n";
  for (const auto& r : results)
    csv << r.policy << "," << (r.time_to_target ? fmt(*r.time_to_target, 2) : "") << ","
        << (r.reached ? fmt(r.time_min, 2) : "") << "," << (r.reached ? fmt(r.time_max, 2) : "") << ","
        << r.reached << "," << r.runs << ","
        << fmt(r.final_accuracy, 4) << "," << fmt(r.best_accuracy, 4) << "," << fmt(r.samples_per_second, 0)
        << "," << fmt(r.ideal_fraction, 3) << "," << fmt(r.mean_staleness, 3) << "," << r.bytes << ","
        << (r.bytes_to_target ? fmt(*r.bytes_to_target, 0) : "") << "," << fmt(r.seconds, 1) << "," << r.error << "\n";
}

// Writes OUT/series.csv: every policy's test accuracy over time, from its first run.
void profile_bench::write_series_csv() const {
  std::ofstream csv{o.out + "/series.csv"};
  csv << "policy,seconds,epoch,test_accuracy\n";
  for (const auto& r : results)
    for (const auto& p : r.history)
      csv << r.policy << "," << fmt(p.seconds, 2) << "," << fmt(p.epoch, 3) << "," << fmt(p.test_accuracy, 4)
          << "\n";
}

// Writes OUT/results.md: the profile, a table row per policy, and the policies that missed the target.
void profile_bench::write_results_md() const {
  std::ofstream md{o.out + "/results.md"};
  md << "# Sync policies on heterogeneous workers\n\n"
     << "Speeds " << o.speeds << " (relative), " << sample_ms << " ms per sample at speed 1"
     << (contention.empty() ? "" : ", contention profile " + contention) << "; target test accuracy "
     << o.target << "; each policy trains at most " << time_cap << " s. Ideal throughput (every worker "
     << "busy at its paced rate): " << fmt(ideal, 0) << " samples/s"
     << (o.contention.empty() ? "" : " without contention; ideal_fraction divides by each run's ideal with "
                                      "the profile's slowdowns")
     << "." << (o.repeat > 1 ? " Each policy ran " + std::to_string(o.repeat)
                                 + " times (seeds differ): the time to target is the median (a run that "
                                   "missed counts as slowest), with the range over the runs that reached it "
                                   "and how many did; the other columns are means."
                               : std::string{})
     << "\n\n"
     << "| policy | time to " << o.target << " (s) | final accuracy | best accuracy | samples/s | ideal fraction "
     << "| mean staleness | MB sent | MB to target | settings |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    if (!r.error.empty()) {
      md << "| " << r.policy << " | failed: " << r.error << " | | | | | | | | " << r.settings << " |\n";
      continue;
    }
    std::string range = o.repeat > 1 && r.reached > 0
                          ? " (" + fmt(r.time_min, 1) + "-" + fmt(r.time_max, 1) + ", " + std::to_string(r.reached)
                              + "/" + std::to_string(r.runs) + ")"
                          : std::string{};
    md << "| " << r.policy << " | " << (r.time_to_target ? fmt(*r.time_to_target, 1) : "not reached") << range
       << " | "
       << fmt(r.final_accuracy, 4) << " | " << fmt(r.best_accuracy, 4) << " | " << fmt(r.samples_per_second, 0)
       << " | " << fmt(r.ideal_fraction, 3) << " | " << fmt(r.mean_staleness, 2) << " | " << fmt(r.bytes / 1e6, 0)
       << " | " << (r.bytes_to_target ? fmt(*r.bytes_to_target / 1e6, 0) : "-") << " | " << r.settings << " |\n";
  }
  md << "\n";
  for (const auto& r : results)
    if (r.error.empty() && !r.time_to_target)
      md << "- " << r.policy << " did not reach " << o.target << " within " << time_cap << " s (best "
         << fmt(r.best_accuracy, 4) << ").\n";
}

// Writes OUT/bench.json: what ops/plot needs besides the series (it draws accuracy.png from them).
void profile_bench::write_bench_json() const {
  std::ofstream meta{o.out + "/bench.json"};
  meta << "{\"target\": " << fmt(o.target, 3) << ", \"speeds\": \"" << o.speeds << "\", \"sample_ms\": "
       << fmt(sample_ms, 6) << ", \"time_cap\": " << fmt(time_cap, 3);
  if (!machine_text.empty()) // what --machine-capacity repeats the fit with
    meta << ", \"machine_capacity\": \"" << machine_text << "\"";
  meta << "}\n";
}

// Every policy on one profile (--speeds, --contention); writes its tables to OUT and, when
// `collected` is given, hands it the results. Returns the exit code.
int run_profile(const hetero_options& given, std::vector<policy_result>* collected) {
  profile_bench bench;
  if (int code = bench.prepare(given))
    return code;
  const hetero_options& o = bench.o;
  if (!o.pacing_given && o.machine_share > 0)
    if (int code = bench.fit_to_machine())
      return code;
  for (const auto& entry : split(o.policies, ','))
    if (int code = bench.run_policy(entry))
      return code;
  bench.write_results_csv();
  bench.write_series_csv();
  bench.write_results_md();
  bench.write_bench_json();
  std::printf("wrote %s/results.md, results.csv, series.csv, bench.json; plot them with: ops/plot %s/series.csv\n",
              o.out.c_str(), o.out.c_str());
  if (collected)
    *collected = std::move(bench.results);
  return 0;
}

// The seed of the random profiles: --seed, else 1. Returns the exit code, 0 when --seed is valid.
int profiles_seed(const hetero_options& o, uint64_t& seed) {
  if (o.train.seed) {
    char* end = nullptr;
    seed = std::strtoull(o.train.seed->c_str(), &end, 10);
    if (end == o.train.seed->c_str() || *end != '\0') {
      std::fprintf(stderr, "ashlar bench hetero: --seed '%s' is not a non-negative integer\n", o.train.seed->c_str());
      return 2;
    }
  }
  return 0;
}

// Measures the machine once for every profile into `measured`; when that trained nothing, every
// profile is paced as given. Returns the exit code.
int measure_for_profiles(const hetero_options& o, hetero_options& measured) {
  auto m = measure_capacity(o);
  if (!m) {
    std::fprintf(stderr, "ashlar bench hetero: measuring this machine: %s\n", describe(m.error()).c_str());
    return 2;
  }
  measured.capacity = m->samples_per_second;
  measured.capacity_cores = m->cores;
  if (!(measured.capacity > 0)) {
    std::printf("   the measuring run trained nothing: every profile is paced as given\n");
    measured.machine_share = 0;
  }
  return 0;
}

// Runs every policy on random profile `p`, number `k` (from 0) of `n`, in OUT/profile-K with its
// contention in a file there; `res` gets the results. Returns the exit code.
int run_random_profile(const hetero_options& measured, const hetero_profile& p, uint32_t k, uint32_t n,
                       std::vector<policy_result>& res) {
  auto ok = measured;
  ok.profiles.clear();
  ok.speeds = p.speeds_text();
  ok.out = measured.out + "/profile-" + std::to_string(k + 1);
  std::error_code ec;
  std::filesystem::create_directories(ok.out, ec);
  if (!p.contention.empty()) {
    ok.contention = ok.out + "/contention.txt";
    std::ofstream{ok.contention} << "# worker start_s end_s factor\n" << p.contention_text();
  }
  std::printf("=== profile %u of %u: speeds %s%s\n", k + 1, n, ok.speeds.c_str(),
              p.contention.empty() ? ""
                                   : (", contention " + std::to_string(p.contention.size()) + " interval(s)").c_str());
  std::fflush(stdout);
  return run_profile(ok, &res);
}

// The result of policy `name` in one profile's results, or nullptr.
const policy_result* result_of(const std::vector<policy_result>& res, const std::string& name) {
  for (const auto& r : res)
    if (r.policy == name)
      return &r;
  return nullptr;
}

// Policy `name`'s time to the target in one profile's results, a miss counting as the time cap; none without it.
std::optional<double> time_of(const std::vector<policy_result>& res, const std::string& name) {
  const auto* r = result_of(res, name);
  return r ? std::optional<double>{r->time_to_target ? *r->time_to_target : r->cap} : std::nullopt;
}

// The largest of `v` with 2 decimals, "-" when there is none.
std::string worst_text(const std::vector<double>& v) {
  return v.empty() ? std::string{"-"} : fmt(*std::max_element(v.begin(), v.end()), 2);
}

// The summary of every policy on N random profiles: per profile, each policy's time; per policy,
// its median time and its median and worst ratio to adsp's and bsp's (a miss counts as the time cap).
struct profiles_summary {
  const hetero_options& o;                            // the options as given
  const hetero_options& measured;                     // with the machine's capacity when it was measured
  uint64_t seed;                                      // the profiles' seed
  uint32_t n;                                         // the number of profiles
  const std::vector<hetero_profile>& profiles;        // the profiles, in order
  const std::vector<std::vector<policy_result>>& all; // per profile, every policy's result
  std::vector<std::string> names;                     // the policies, in the order they ran

  void write(const std::string& path) const;
  void write_intro(std::ostream& md) const;
  void write_profile_table(std::ostream& md) const;
  void write_policy_row(std::ostream& md, const std::string& name) const;
};

// Writes the summary to `path` (summary.md): the intro, the table per profile and the table per policy.
void profiles_summary::write(const std::string& path) const {
  std::ofstream md{path};
  write_intro(md);
  write_profile_table(md);
  md << "\n| policy | reached (profiles) | median time (s) | / adsp median | / adsp worst | / bsp median | / bsp worst "
     << "| MB to target / adsp median | / adsp worst |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : names)
    write_policy_row(md, name);
}

// Writes the summary's title and what the times are, with the pacing and the machine they ran on.
void profiles_summary::write_intro(std::ostream& md) const {
  md << "# Every policy on " << n << " random heterogeneity profiles (seed " << seed << ")\n\n"
     << "Time to " << o.target << " test accuracy (s), median over " << o.repeat << " run(s) per policy; a policy "
     << "that misses counts as its profile's time cap (" << o.time_cap << " s unless the pacing was fit to the "
     << "machine). Each profile's own table is in profile-K/."
     << (o.ideal_rate > 0 ? " Pacing per profile: " + fmt(o.ideal_rate, 0)
                              + " samples/s with every worker busy (--ideal-rate; ms per sample at speed 1 = 1000 x "
                                "the sum of the speeds / that rate)."
                          : std::string{})
     << (measured.capacity > 0
           ? " This machine trained " + fmt(measured.capacity, 0) + " samples/s unpaced on "
               + std::to_string(measured.capacity_cores) + " cores; a profile that would ask more than "
               + fmt(o.machine_share * 100, 0) + "% of that in all, or of one core for its fastest worker, was "
               + "slowed to ask exactly that, its time cap with it (--machine-share; the pacing column)."
           : std::string{})
     << "\n\n";
}

// Writes the table per profile: its speeds, contention and pacing, and each policy's time.
void profiles_summary::write_profile_table(std::ostream& md) const {
  md << "| profile | speeds | contention | pacing (ms/sample at speed 1, time cap s) |";
  for (const auto& name : names)
    md << " " << name << " |";
  md << "\n|---|---|---|---|";
  for (size_t i = 0; i < names.size(); ++i)
    md << "---|";
  md << "\n";
  for (uint32_t k = 0; k < n; ++k) {
    md << "| " << k + 1 << " | " << profiles[k].speeds_text() << " | "
       << (profiles[k].contention.empty() ? "none" : std::to_string(profiles[k].contention.size()) + " interval(s)")
       << " | "
       << (all[k].empty() ? std::string{"-"} : fmt(all[k].front().sample_ms, 2) + ", " + fmt(all[k].front().cap, 0))
       << " |";
    for (const auto& name : names) {
      const auto* r = result_of(all[k], name);
      md << " " << (!r ? "-" : r->time_to_target ? fmt(*r->time_to_target, 1) : "missed") << " |";
    }
    md << "\n";
  }
}

// Writes policy `name`'s row of the table per policy: how often it reached the target, its
// median time, and its ratios to adsp's and bsp's times and to adsp's bytes to the target.
void profiles_summary::write_policy_row(std::ostream& md, const std::string& name) const {
  std::vector<double> times, to_adsp, to_bsp, bytes_to_adsp;
  uint32_t reached = 0;
  for (const auto& res : all) {
    for (const auto& r : res)
      if (r.policy == name && r.time_to_target)
        ++reached;
    auto t = time_of(res, name);
    if (!t)
      continue;
    times.push_back(*t);
    if (auto a = time_of(res, "adsp"))
      to_adsp.push_back(*t / *a);
    if (auto b = time_of(res, "bsp"))
      to_bsp.push_back(*t / *b);
    // Bytes moved until the target, on the profiles where both reached it.
    const auto *mine = result_of(res, name), *theirs = result_of(res, "adsp");
    if (mine && theirs && mine->bytes_to_target && theirs->bytes_to_target && *theirs->bytes_to_target > 0)
      bytes_to_adsp.push_back(*mine->bytes_to_target / *theirs->bytes_to_target);
  }
  md << "| " << name << " | " << reached << "/" << n << " | " << fmt(median_of(times), 1) << " | "
     << (to_adsp.empty() ? "-" : fmt(median_of(to_adsp), 2)) << " | " << worst_text(to_adsp) << " | "
     << (to_bsp.empty() ? "-" : fmt(median_of(to_bsp), 2)) << " | " << worst_text(to_bsp) << " | "
     << (bytes_to_adsp.empty() ? "-" : fmt(median_of(bytes_to_adsp), 2)) << " | " << worst_text(bytes_to_adsp)
     << " |\n";
}

// Every policy on N random profiles; a summary of their times against adsp's and bsp's.
int run_profiles(const hetero_options& o, uint32_t n) {
  uint64_t seed = 1;
  if (int code = profiles_seed(o, seed))
    return code;
  auto profiles = random_profiles(n, seed);
  hetero_options measured = o; // the machine, measured once for every profile
  if (!o.pacing_given && o.machine_share > 0 && !(o.capacity > 0))
    if (int code = measure_for_profiles(o, measured))
      return code;
  std::vector<std::vector<policy_result>> all;
  for (uint32_t k = 0; k < n; ++k) {
    std::vector<policy_result> res;
    if (int code = run_random_profile(measured, profiles[k], k, n, res); code != 0)
      return code;
    all.push_back(std::move(res));
  }
  profiles_summary summary{o, measured, seed, n, profiles, all, {}};
  for (const auto& r : all.front())
    summary.names.push_back(r.policy);
  summary.write(o.out + "/summary.md");
  std::ifstream in{o.out + "/summary.md"};
  std::printf("\n%s", std::string{std::istreambuf_iterator<char>{in}, {}}.c_str());
  std::printf("wrote %s/summary.md and profile-1 .. profile-%u/\n", o.out.c_str(), n);
  return 0;
}

}  // namespace

int run_hetero_bench(const hetero_options& given) {
  hetero_options o = given;
  if (!o.machine_capacity.empty()) { // RATE:CORES
    const auto colon = o.machine_capacity.find(':');
    char *end1 = nullptr, *end2 = nullptr;
    const std::string rate = o.machine_capacity.substr(0, colon);
    const std::string cores = colon == std::string::npos ? "" : o.machine_capacity.substr(colon + 1);
    o.capacity = std::strtod(rate.c_str(), &end1);
    const unsigned long n = std::strtoul(cores.c_str(), &end2, 10);
    if (colon == std::string::npos || end1 == rate.c_str() || *end1 != '\0' || !(o.capacity > 0)
        || !std::isfinite(o.capacity) || end2 == cores.c_str() || *end2 != '\0' || n == 0 || n > 1u << 16) {
      std::fprintf(stderr, "ashlar bench hetero: --machine-capacity expects RATE:CORES (e.g. 32000:2), got '%s'\n",
                   o.machine_capacity.c_str());
      return 2;
    }
    o.capacity_cores = static_cast<uint32_t>(n);
  }
  for (const auto& ps : o.policy_sets) { // before any run: a typo costs no measuring
    const auto colon = ps.find(':'), eq = ps.find('=');
    if (colon == std::string::npos || eq == std::string::npos || eq < colon) {
      std::fprintf(stderr, "ashlar bench hetero: --policy-set expects POLICY:KEY=VALUE, got '%s'\n", ps.c_str());
      return 2;
    }
  }
  if (o.profiles.empty())
    return run_profile(o, nullptr);
  auto n = parse_profiles_spec(o.profiles);
  if (!n) {
    std::fprintf(stderr, "ashlar bench hetero: %s\n", describe(n.error()).c_str());
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  return run_profiles(o, *n);
}

}  // namespace ashlar::cli
