#include "runtime/core/clock.hpp"
#include "runtime/metrics/progress_text.hpp"
#include "apps/ashlar/train_options.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "runtime/policy/policy_rules.hpp"
#include "runtime/core/log.hpp"

namespace ashlar::cli {

namespace {

std::string rate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

struct flag_key {
  const char* flag;
  const char* key;
  std::optional<std::string> train_options::*member;
};

const flag_key flag_keys[] = {
  {"--workers", "train.workers", &train_options::workers},
  {"--servers", "train.servers", &train_options::servers},
  {"--policy", "train.policy", &train_options::policy},
  {"--epochs", "train.epochs", &train_options::epochs},
  {"--seed", "train.seed", &train_options::seed},
  {"--batch-size", "train.batch_size", &train_options::batch},
  {"--lr", "train.lr", &train_options::lr},
  {"--data-dir", "data.dir", &train_options::data_dir},
  {"--report", "run.report", &train_options::report},
  {"--trace", "run.trace", &train_options::trace},
  {"--checkpoint-dir", "run.checkpoint_dir", &train_options::checkpoint_dir},
  {"--checkpoint-every", "run.checkpoint_every", &train_options::checkpoint_every},
  {"--metrics", "run.metrics", &train_options::metrics},
  {"--metrics-listen", "run.metrics_listen", &train_options::metrics_listen},
  {"--log-level", "run.log_level", &train_options::log_level},
  {"--gpus", "run.gpus", &train_options::gpus},
};

}  // namespace

std::string key_help() {
  std::string s = "Configuration keys (TOML [section] key, or ASHLAR_SECTION_KEY, or --set "
                  "section.key=value):\n";
  for (const auto& k : config_keys())
    s += "  " + k.key + "  (" + k.env + ")  " + k.help + "\n";
  return s;
}

std::vector<std::string> train_options::as_args() const {
  std::vector<std::string> out;
  for (const auto& f : flag_keys)
    if (this->*f.member) {
      out.emplace_back(f.flag);
      out.push_back(*(this->*f.member));
    }
  for (const auto& s : sets) {
    out.emplace_back("--set");
    out.push_back(s);
  }
  if (resume)
    out.emplace_back("--resume");
  return out;
}

void add_train_options(CLI::App* cmd, train_options& o, bool with_config) {
  if (with_config)
    cmd->add_option("config", o.config_file, "TOML configuration file (e.g. ops/configs/fmnist-mlp.toml)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--workers", o.workers, "number of workers (train.workers)");
  cmd->add_option("--servers", o.servers, "number of server shards (train.servers)");
  cmd->add_option("--policy", o.policy,
                  "sync policy (train.policy): bsp, asp, ssp, ksync, kasync, adaptive, adsp, ashl or ring; "
                  "README's \"Which policy\" table says which to pick");
  cmd->add_option("--epochs", o.epochs, "passes over the training set (train.epochs)");
  cmd->add_option("--seed", o.seed, "seed for initial parameters and data order (train.seed)");
  cmd->add_option("--batch-size", o.batch, "mini-batch size per worker (train.batch_size)");
  cmd->add_option("--lr", o.lr, "learning rate (train.lr)");
  cmd->add_option("--data-dir", o.data_dir, "the data set's directory (data.dir): Fashion-MNIST's files, or .npy files with data.source=npy");
  cmd->add_option("--report", o.report, "write a JSON summary to FILE (run.report)");
  cmd->add_option("--gpus", o.gpus, "GPUs for the workers: auto, none or 0,1,... (run.gpus)");
  cmd->add_option("--checkpoint-dir", o.checkpoint_dir,
                  "checkpoint shards and progress into DIR (run.checkpoint_dir)");
  cmd->add_option("--checkpoint-every", o.checkpoint_every,
                  "a checkpoint cut of every shard each K versions of shard 0 (run.checkpoint_every)");
  cmd->add_flag("--resume", o.resume, "continue from the checkpoints in --checkpoint-dir (run.resume)");
  cmd->add_option("--trace", o.trace, "write a Chrome trace (open in Perfetto) to FILE (run.trace)");
  cmd->add_option("--metrics", o.metrics, "write per-step metrics as JSON lines to FILE (run.metrics)");
  cmd->add_option("--metrics-listen", o.metrics_listen,
                  "serve Prometheus metrics at http://HOST:PORT/metrics (run.metrics_listen)");
  cmd->add_option("--log-level", o.log_level, "trace, debug, info, warn, error (run.log_level)");
  cmd->add_option("--set", o.sets, "override any key: --set section.key=value (repeatable)");
}

caf::error resolve_config(const train_options& o, train_config& cfg, bool rules) {
  if (!o.config_file.empty())
    if (auto err = apply_toml_file(cfg, o.config_file))
      return err;
  if (auto err = apply_environment(cfg, [](const char* n) { return std::getenv(n); }))
    return err;
  {
    std::vector<std::string> names;
    for (char** e = environ; e && *e; ++e)
      names.emplace_back(*e, std::strcspn(*e, "="));
    for (const auto& w : environment_warnings(names))
      spdlog::warn("{}", w);
  }
  for (const auto& f : flag_keys)
    if (o.*f.member)
      if (auto err = apply_setting(cfg, f.key, *(o.*f.member), f.flag))
        return err;
  if (o.resume)
    cfg.resume = true;
  for (const auto& kv : o.sets) {
    auto eq = kv.find('=');
    if (eq == std::string::npos)
      return make_error(errc::invalid_argument, "--set expects section.key=value, got '" + kv + "'");
    if (auto err = apply_setting(cfg, kv.substr(0, eq), kv.substr(eq + 1), "--set"))
      return err;
  }
  if (rules)
    if (auto err = apply_policy_rules(cfg))
      return err;
  return validate_job(cfg);
}

void log_rule_notes(const train_config& cfg) {
  for (const auto& note : rule_notes(cfg))
    spdlog::info("policy {}: {}", cfg.policy, note);
}

std::string explain(const train_config& cfg) {
  size_t width = 0;
  for (const auto& k : config_keys())
    width = std::max(width, k.key.size() + 3 + setting_text(cfg, k.key).size());
  std::string out;
  for (const auto& k : config_keys()) {
    auto line = k.key + " = " + setting_text(cfg, k.key);
    auto it = cfg.sources.find(k.key);
    line += std::string(width + 2 - std::min(width, line.size()), ' ');
    line += it == cfg.sources.end() ? "default" : it->second;
    out += line + "\n";
  }
  return out;
}

void print_work_moved(double redone, double reassigned, double lost) {
  if (lost > 0)
    std::printf("workers lost: %.0f while the job ran (a process or node gone); the job went on without %s\n", lost,
                lost == 1 ? "it" : "them");
  if (redone > 0)
    std::printf("work redone: %.0f samples trained again after the resume\n", redone);
  if (reassigned > 0)
    std::printf("work moved: %.0f samples of workers lost or removed were trained by the others\n", reassigned);
}

void print_run_notes(uint64_t refused_reports, const std::vector<std::string>& abandoned_cuts) {
  if (refused_reports > 0)
    std::printf("reports refused: %llu step reports no member could have sent (the log names the first)\n",
                static_cast<unsigned long long>(refused_reports));
  for (const auto& cut : abandoned_cuts)
    std::printf("checkpoint abandoned: %s\n", cut.c_str());
}

std::string worker_rates(const std::vector<wire::worker_stats>& workers) {
  std::vector<const wire::worker_stats*> live;
  for (const auto& w : workers)
    if (!w.done)
      live.push_back(&w);
  std::string out;
  if (live.size() <= max_listed_workers) {
    for (const auto* w : live)
      out += " w" + std::to_string(w->worker_id) + "=" + rate(w->samples_per_second);
    return out;
  }
  // Many workers: the spread, and the slowest few by name (the stragglers to look at).
  std::sort(live.begin(), live.end(),
            [](const auto* a, const auto* b) { return a->samples_per_second < b->samples_per_second; });
  out = " " + std::to_string(live.size()) + " workers, min " + rate(live.front()->samples_per_second) + " median "
        + rate(live[live.size() / 2]->samples_per_second) + " max " + rate(live.back()->samples_per_second)
        + "; slowest:";
  for (size_t i = 0; i < 3; ++i)
    out += " w" + std::to_string(live[i]->worker_id) + "=" + rate(live[i]->samples_per_second);
  return out;
}

// "SEP val_ppl 145.2, accuracy 0.8" ("" for none).
std::string metric_text(const std::vector<std::pair<std::string, double>>& values, const char* sep) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i)
    out += (i ? ", " : sep) + values[i].first + " " + fmt::format("{:.6g}", values[i].second);
  return out;
}

actors::job_hooks print_hooks(uint32_t epochs) {
  actors::job_hooks hooks;
  // Lines come out in time order: an evaluation runs in the background on a snapshot, and
  // its line, printed when it ends, may follow a progress line stamped later than the
  // snapshot; it then carries the later stamp and says when its model was taken.
  auto last = std::make_shared<double>(0.0);
  hooks.on_progress = [epochs, last](const actors::progress_event& ev) {
    std::string per = worker_rates(ev.workers);
    per += metric_text(ev.metrics, "; ");
    *last = std::max(*last, ev.seconds);
    // (the samples of the whole job, from the epoch the samples make)
    const uint64_t total = ev.epoch > 0 ? static_cast<uint64_t>(std::llround(ev.samples / ev.epoch * epochs)) : 0;
    if (epochs == 0) { // the scripts' job (train.optimizer = script): their epochs and rates are theirs
      std::printf("%s %10llu samples  %s  %8s samples/s  loss %.4f  per-worker samples/s:%s\n",
                  log_stamp(system_clock().wall_ns()).c_str(), static_cast<unsigned long long>(ev.samples),
                  time_left(*last, ev.samples, 0, ev.samples_per_second).c_str(), rate(ev.samples_per_second).c_str(),
                  ev.loss, per.c_str());
      std::fflush(stdout);
      return;
    }
    std::printf("%s epoch %5.2f/%u  %s  %8s samples/s  loss %.4f  lr %.3g  per-worker samples/s:%s\n",
                log_stamp(system_clock().wall_ns()).c_str(), ev.epoch, epochs,
                time_left(*last, ev.samples, total, ev.samples_per_second).c_str(), rate(ev.samples_per_second).c_str(),
                ev.loss, ev.lr, per.c_str());
    std::fflush(stdout);
  };
  hooks.on_metrics = [last](const metric_point& p) {
    *last = std::max(*last, p.seconds);
    std::printf("%s metrics from worker %u at %llu samples:%s\n", log_stamp(system_clock().wall_ns()).c_str(),
                p.worker_id, static_cast<unsigned long long>(p.samples), metric_text(p.values, " ").c_str());
    std::fflush(stdout);
  };
  hooks.on_epoch = [last](const epoch_point& p) {
    const bool later = *last > p.seconds + 0.05;
    *last = std::max(*last, p.seconds);
    std::printf("%s epoch %.2f: test accuracy %.4f, train loss %.4f", log_stamp(system_clock().wall_ns()).c_str(),
                p.epoch, p.test_accuracy, p.train_loss);
    if (later)
      std::printf(" (the model as of %.1f s in)", p.seconds);
    std::printf("\n");
    std::fflush(stdout);
  };
  return hooks;
}

const char* script_ending(bool stopped_early, bool target_reached, bool time_limited) {
  return stopped_early    ? ", stopped on request"
         : target_reached ? ", stopped at the target (run.target)"
         : time_limited   ? ", stopped at the time limit"
                          : "";
}

const char* ending_words(bool stopped_early, bool target_reached, bool time_limited) {
  return stopped_early    ? "stopped on request after "
         : target_reached ? "stopped at the target after "
         : time_limited   ? "stopped at the time limit after "
                          : "after ";
}

int finish_run(const train_config& cfg, const expected<run_report>& rep, const char* who) {
  if (!rep) {
    std::fprintf(stderr, "%s: %s\n", who, describe(rep.error()).c_str());
    // A run that fails past its configuration still leaves its report, with the error.
    if (!cfg.report.empty() && !is(rep.error(), errc::invalid_config)) {
      auto failed = failed_report(cfg.policy, cfg.model.to_string(), cfg.workers, cfg.servers, cfg.epochs,
                                  describe(rep.error()));
      if (!write_report(failed, cfg.report))
        std::printf("report (with the error) written to %s\n", cfg.report.c_str());
    }
    return is(rep.error(), errc::invalid_config) ? 2 : 1;
  }
  std::printf("done: policy %s, %u workers, %u shards, model %s\n", rep->policy.c_str(),
              rep->workers, rep->servers, rep->model.c_str());
  // The epochs the job trained, as counted by its samples: a stop on request or at the
  // time limit says so; a run that trained past its budget (workers at their own pace
  // finish the step in flight) says how far.
  const char* why = ending_words(rep->stopped_early, rep->target_reached, rep->time_limited);
  if (rep->optimizer == "script")
    std::printf("the scripts' optimizers trained %llu samples in %.1f s (%s samples/s)%s; %s\n",
                static_cast<unsigned long long>(rep->samples), rep->seconds, rate(rep->samples_per_second).c_str(),
                script_ending(rep->stopped_early, rep->target_reached, rep->time_limited),
                rep->metrics.empty() ? "the scripts evaluate their model"
                                     : ("their last metrics:" + metric_text(rep->metrics.back().values, " ")).c_str());
  else
    std::printf("test accuracy %.4f (loss %.4f) on %lu samples, %s%.2f of %u epochs in %.1f s (%s samples/s)\n",
                rep->test_accuracy, rep->test_loss, static_cast<unsigned long>(rep->test_samples), why,
                rep->epochs_trained, rep->epochs, rep->seconds, rate(rep->samples_per_second).c_str());
  print_work_moved(static_cast<double>(rep->redone_samples), static_cast<double>(rep->reassigned_samples),
                   rep->lost_workers);
  print_run_notes(rep->refused_reports, rep->abandoned_cuts);
  std::fflush(stdout);
  if (!cfg.report.empty()) {
    if (auto err = write_report(*rep, cfg.report)) {
      std::fprintf(stderr, "%s: %s\n", who, describe(err).c_str());
      return 1;
    }
    std::printf("report written to %s\n", cfg.report.c_str());
  }
  return 0;
}

}  // namespace ashlar::cli
