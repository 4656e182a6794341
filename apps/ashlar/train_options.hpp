// Options shared by `ashlar train`, `ashlar node --role scheduler` and `ashlar launch`:
// the job configuration (file < environment < flags) and the progress printing.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/local_job.hpp"
#include "runtime/config/train_config.hpp"

namespace ashlar::cli {

struct train_options {
  std::string config_file;
  std::optional<std::string> workers, servers, policy, epochs, seed, report, trace, metrics, metrics_listen,
    checkpoint_dir, checkpoint_every,
    data_dir, batch, lr, log_level, gpus;
  std::vector<std::string> sets;
  bool resume = false;

  /// The flags as they were given, to pass on to child processes (launch).
  std::vector<std::string> as_args() const;
};

/// Adds the CONFIG positional (when `with_config`) and the training flags to `cmd`.
void add_train_options(CLI::App* cmd, train_options& o, bool with_config = true);

/// Fills `cfg` from the file, ASHLAR_* variables and flags (recording where each value
/// came from), applies the policy's rules (runtime/policy/policy_rules.hpp) unless
/// `rules` is false, and validates it.
[[nodiscard]] caf::error resolve_config(const train_options& o, train_config& cfg, bool rules = true);

/// Logs the values the policy's rules derived, one line each.
void log_rule_notes(const train_config& cfg);

/// Every key's effective value and where it came from: default, FILE:LINE, env VAR, a
/// flag, --set, or the policy's rule (with the rule).
std::string explain(const train_config& cfg);

/// Workers a progress line lists by name; with more, it gives the spread (min, median,
/// max) and the slowest three.
constexpr size_t max_listed_workers = 8;

/// The per-worker part of a progress line: " w0=17.8K w1=21.6K ..." for up to
/// max_listed_workers live workers, else " 256 workers, min 1.2K median 3.4K max 9.9K;
/// slowest: w17=1.2K w3=1.3K w99=1.4K".
std::string worker_rates(const std::vector<wire::worker_stats>& workers);

/// The summary's lines on work done twice or moved: samples trained again after a resume,
/// samples of lost or removed workers the others trained, and the workers lost (each only
/// when there are).
void print_work_moved(double redone, double reassigned, double lost);
/// Prints what the report says went wrong without failing the job: step reports refused,
/// checkpoint cuts abandoned (each with its cause).
void print_run_notes(uint64_t refused_reports, const std::vector<std::string>& abandoned_cuts);

/// Hooks that print progress lines and epoch evaluations to stdout.
/// (epochs 0: the scripts' job, train.optimizer = script: samples, not epochs of its own)
actors::job_hooks print_hooks(uint32_t epochs);

/// Prints the final summary and writes cfg.report if set. Returns the exit code.
int finish_run(const train_config& cfg, const expected<run_report>& rep, const char* who);

/// How the summary line says a run ended, before its epochs: "stopped on request after ",
/// The scripts' job (train.optimizer = script): ", stopped on request", ", stopped at the
/// target (run.target)", ", stopped at the time limit" or "".
const char* script_ending(bool stopped_early, bool target_reached, bool time_limited);
/// "stopped at the target after ", "stopped at the time limit after " or "after ".
const char* ending_words(bool stopped_early, bool target_reached, bool time_limited);

/// "Configuration keys..." help text listing every key, its variable and default.
std::string key_help();

}  // namespace ashlar::cli
