// `ashlar train CONFIG`: one training job, all actors in this process.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include <spdlog/spdlog.h>

#include "actors/local_job.hpp"
#include "apps/ashlar/commands.hpp"
#include "runtime/core/log.hpp"

namespace ashlar::cli {

namespace {

struct train_options {
  std::string config_file;
  std::optional<std::string> workers, servers, policy, epochs, seed, report, data_dir, batch, lr,
    log_level;
  std::vector<std::string> sets;
};

std::string key_help() {
  std::string s = "Configuration keys (TOML [section] key, or ASHLAR_SECTION_KEY, or --set "
                  "section.key=value):\n";
  for (const auto& k : config_keys())
    s += "  " + k.key + "  (" + k.env + ")  " + k.help + "\n";
  return s;
}

std::string rate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

int run_train(const train_options& o) {
  train_config cfg;
  auto fail_config = [](const caf::error& err) {
    std::fprintf(stderr, "ashlar train: %s\n", describe(err).c_str());
    return 2;
  };
  if (!o.config_file.empty())
    if (auto err = apply_toml_file(cfg, o.config_file))
      return fail_config(err);
  if (auto err = apply_environment(cfg, [](const char* n) { return std::getenv(n); }))
    return fail_config(err);
  const std::pair<const char*, const std::optional<std::string>*> flags[] = {
    {"train.workers", &o.workers}, {"train.servers", &o.servers}, {"train.policy", &o.policy},
    {"train.epochs", &o.epochs},   {"train.seed", &o.seed},       {"run.report", &o.report},
    {"data.dir", &o.data_dir},     {"train.batch_size", &o.batch}, {"train.lr", &o.lr},
    {"run.log_level", &o.log_level},
  };
  for (const auto& [key, value] : flags)
    if (*value)
      if (auto err = apply_setting(cfg, key, **value))
        return fail_config(err);
  for (const auto& kv : o.sets) {
    auto eq = kv.find('=');
    if (eq == std::string::npos)
      return fail_config(make_error(errc::invalid_argument,
                                    "--set expects section.key=value, got '" + kv + "'"));
    if (auto err = apply_setting(cfg, kv.substr(0, eq), kv.substr(eq + 1)))
      return fail_config(err);
  }
  if (auto err = validate(cfg))
    return fail_config(err);
  if (auto err = init_logging(cfg.log_level))
    return fail_config(err);

  actors::job_hooks hooks;
  const uint32_t epochs = cfg.epochs;
  hooks.on_progress = [&](const actors::progress_event& ev) {
    std::string per;
    for (const auto& w : ev.workers)
      per += " w" + std::to_string(w.worker_id) + "=" + rate(w.samples_per_second);
    std::printf("[%6.1fs] epoch %5.2f/%u  %8s samples/s  loss %.4f  per-worker samples/s:%s\n",
                ev.seconds, ev.epoch, epochs, rate(ev.samples_per_second).c_str(), ev.loss,
                per.c_str());
    std::fflush(stdout);
  };
  hooks.on_epoch = [&](const epoch_point& p) {
    std::printf("[%6.1fs] epoch %.2f: test accuracy %.4f, train loss %.4f\n", p.seconds, p.epoch,
                p.test_accuracy, p.train_loss);
    std::fflush(stdout);
  };
  auto rep = actors::run_local_job(cfg, hooks);
  if (!rep) {
    std::fprintf(stderr, "ashlar train: %s\n", describe(rep.error()).c_str());
    return is(rep.error(), errc::invalid_config) ? 2 : 1;
  }
  std::printf("done: policy %s, %u workers, %u shards, model %s\n", rep->policy.c_str(),
              rep->workers, rep->servers, rep->model.c_str());
  std::printf("test accuracy %.4f (loss %.4f) on %lu samples after %u epochs in %.1f s "
              "(%s samples/s)\n",
              rep->test_accuracy, rep->test_loss, static_cast<unsigned long>(rep->test_samples),
              rep->epochs, rep->seconds, rate(rep->samples_per_second).c_str());
  std::fflush(stdout);
  if (!cfg.report.empty()) {
    if (auto err = write_report(*rep, cfg.report)) {
      std::fprintf(stderr, "ashlar train: %s\n", describe(err).c_str());
      return 1;
    }
    std::printf("report written to %s\n", cfg.report.c_str());
  }
  return 0;
}

}  // namespace

command_fn add_train(CLI::App& app) {
  auto o = std::make_shared<train_options>();
  auto* cmd = app.add_subcommand("train", "Train a model; all actors run in this process");
  cmd->footer(key_help());
  cmd->add_option("config", o->config_file, "TOML configuration file (e.g. ops/configs/fmnist-mlp.toml)")
    ->check(CLI::ExistingFile);
  cmd->add_option("--workers", o->workers, "number of workers (train.workers)");
  cmd->add_option("--servers", o->servers, "number of server shards (train.servers)");
  cmd->add_option("--policy", o->policy, "sync policy: bsp or asp (train.policy)");
  cmd->add_option("--epochs", o->epochs, "passes over the training set (train.epochs)");
  cmd->add_option("--seed", o->seed, "seed for initial parameters and data order (train.seed)");
  cmd->add_option("--batch-size", o->batch, "mini-batch size per worker (train.batch_size)");
  cmd->add_option("--lr", o->lr, "learning rate (train.lr)");
  cmd->add_option("--data-dir", o->data_dir, "Fashion-MNIST directory (data.dir)");
  cmd->add_option("--report", o->report, "write a JSON summary to FILE (run.report)");
  cmd->add_option("--log-level", o->log_level, "trace, debug, info, warn, error (run.log_level)");
  cmd->add_option("--set", o->sets, "override any key: --set section.key=value (repeatable)");
  return [o] { return run_train(*o); };
}

}  // namespace ashlar::cli
