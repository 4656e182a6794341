// `ashlar train CONFIG`: one training job, all actors in this process; with --join, the job
// is submitted to a running cluster's scheduler instead.
#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>

#include "actors/cluster/system.hpp"
#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/security_options.hpp"
#include "apps/ashlar/host.hpp"
#include "apps/ashlar/stop_signal.hpp"
#include "apps/ashlar/train_options.hpp"
#include "runtime/policy/policy_rules.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/policy/sync_policy.hpp"
#include "runtime/core/log.hpp"
#include "runtime/core/number_text.hpp"
#include "runtime/metrics/progress_text.hpp"
#include "runtime/metrics/report.hpp"

namespace ashlar::cli {

namespace {

using job_outcome = std::promise<expected<wire::job_result>>;

// Prints a line of the job's progress from the scheduler's status, when it has trained since
// `last` (elapsed seconds and samples at the line before), which it then updates.
void print_progress(const wire::cluster_status& st, std::pair<double, uint64_t>& last) {
  if (st.stats.workers.empty() || !(st.stats.elapsed_seconds > last.first))
    return;
  const double rate = static_cast<double>(st.stats.total_samples - std::min(last.second, st.stats.total_samples))
                      / (st.stats.elapsed_seconds - last.first);
  const uint64_t done = st.stats.total_samples;
  // As a local run's line: the epoch (where the scheduler said the job's size), the time
  // in and left, and the workers' speeds.
  std::string epoch;
  if (st.train_samples > 0 && st.job_samples > 0)
    epoch = "epoch " + number_text("%.2f", static_cast<double>(done) / static_cast<double>(st.train_samples)) + "/"
            + number_text("%.0f", static_cast<double>(st.job_samples) / static_cast<double>(st.train_samples)) + "  ";
  else
    epoch = std::to_string(done) + " samples  ";
  std::printf("%s %s%s  %8.0f samples/s  loss %.4f%s%s  per-worker samples/s:%s\n",
              log_stamp(system_clock().wall_ns()).c_str(), epoch.c_str(),
              time_left(st.stats.elapsed_seconds, done, st.job_samples, rate).c_str(), rate, st.stats.loss,
              st.stage.empty() ? "" : "  stage ", st.stage.c_str(), worker_rates(st.stats.workers).c_str());
  std::fflush(stdout);
  last = {st.stats.elapsed_seconds, st.stats.total_samples};
}

// Spawns the helper actor that sends the job to the scheduler at `join` and sets `outcome` to
// its answer, or to an error once it loses the scheduler; meanwhile it prints the job's
// progress every `every` seconds (none when 0).
caf::actor spawn_job_watcher(caf::actor_system& sys, const actors::cluster_actor& cluster,
                             const wire::job_request& req, const std::string& join, double every,
                             job_outcome* outcome) {
  return sys.spawn([cluster, req, join, every, outcome](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(cluster);
    self->set_down_handler([self, join, outcome](caf::down_msg& dm) {
      outcome->set_value(make_error(errc::peer_unreachable, "lost the scheduler at " + join + " ("
                                                              + to_string(dm.reason) + ") before the job ended"));
      self->quit();
    });
    self->request(cluster, caf::infinite, req)
      .then(
        [self, outcome](const wire::job_result& res) {
          outcome->set_value(res);
          self->quit();
        },
        [self, outcome](caf::error& err) {
          outcome->set_value(std::move(err));
          self->quit();
        });
    // The job's progress, as the scheduler's status shows it, every run.progress_interval.
    auto last = std::make_shared<std::pair<double, uint64_t>>(0.0, 0);
    auto asking = std::make_shared<bool>(false); // one status request at a time
    const auto period = std::chrono::milliseconds(std::max<int64_t>(100, static_cast<int64_t>(every * 1000)));
    if (every > 0)
      self->delayed_send(self, period, actors::status_atom::value);
    return {
      [=](actors::status_atom) {
        self->delayed_send(self, period, actors::status_atom::value);
        if (*asking)
          return;
        *asking = true;
        self->request(cluster, std::chrono::seconds(5), actors::status_atom::value)
          .then(
            [=](const wire::cluster_status& st) {
              *asking = false;
              print_progress(st, *last);
            },
            [=](caf::error&) { *asking = false; });
      },
    };
  });
}

// Asks the scheduler to stop the job (its workers finish their step, then it reports) and
// prints what it said.
void ask_to_stop(caf::actor_system& sys, const actors::cluster_actor& cluster) {
  caf::scoped_actor asker{sys};
  asker->request(cluster, std::chrono::seconds(15), wire::ctl_request{wire::ctl_request::stop_job, 0, 0})
    .receive([](const std::string& said) { std::printf("scheduler: %s\n", said.c_str()); },
             [](caf::error& err) {
               std::fprintf(stderr, "ashlar train: the scheduler did not take the stop: %s\n", describe(err).c_str());
             });
  std::fflush(stdout);
}

// Waits for the job's answer. Ctrl-C (or SIGTERM) asks the scheduler to stop the job: its
// workers finish their step and it reports, here as it would have at its end; `sig` gets that
// signal. Returns false when a second one leaves the job running (the helper stopped).
bool wait_for_job(caf::actor_system& sys, const actors::cluster_actor& cluster, const caf::actor& helper,
                  const std::string& join, std::future<expected<wire::job_result>>& answer, int& sig) {
  catch_stop_signals(false);
  while (answer.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
    const int now = take_stop_signal();
    if (now == 0)
      continue;
    if (sig != 0) {
      std::printf("ashlar train: %s again: leaving the job running on the cluster (`ashlar ctl stop-job --join %s` "
                  "stops it)\n", signal_name(now), join.c_str());
      std::fflush(stdout);
      caf::anon_send_exit(helper, caf::exit_reason::user_shutdown);
      return false;
    }
    sig = now;
    std::printf("ashlar train: %s: asking the scheduler at %s to stop the job (its workers finish their step, then "
                "it reports); %s again leaves it running\n", signal_name(now), join.c_str(), signal_name(now));
    std::fflush(stdout);
    ask_to_stop(sys, cluster);
  }
  return true;
}

// The value of `key` in the job's report `j` (quotes taken off a string), "?" when it has none.
std::string report_field(const std::string& j, const char* key) {
  auto at = j.find(std::string{"\""} + key + "\": ");
  if (at == std::string::npos)
    return "?";
  at = j.find(": ", at) + 2;
  auto end = j.find_first_of(",\n}", at);
  auto v = j.substr(at, end - at);
  if (v.size() >= 2 && v.front() == '"')
    v = v.substr(1, v.size() - 2);
  return v;
}

// The strings of array `key` in report `j` (as to_json writes them: one line, escaped).
std::vector<std::string> report_strings(const std::string& j, const char* key) {
  std::vector<std::string> out;
  auto at = j.find(std::string{"\""} + key + "\": [");
  if (at == std::string::npos)
    return out;
  std::string cur;
  bool in = false;
  for (size_t i = j.find('[', at) + 1; i < j.size(); ++i) {
    const char c = j[i];
    if (!in && c == ']')
      break;
    if (c == '"') {
      if (in)
        out.push_back(cur);
      cur.clear();
      in = !in;
    } else if (in && c == '\\' && i + 1 < j.size()) {
      const char e = j[++i];
      cur += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    } else if (in) {
      cur += c;
    }
  }
  return out;
}

// Prints the summary `ashlar train` prints locally, from the job's report `j`: in the same
// words and precision as a local run's summary (finish_run).
void print_job_summary(const std::string& j) {
  auto field = [&](const char* key) { return report_field(j, key); };
  auto num = [&](const char* key) { return std::strtod(field(key).c_str(), nullptr); };
  std::printf("done: policy %s, %s workers, %s shards, model %s\n", field("policy").c_str(), field("workers").c_str(),
              field("servers").c_str(), field("model").c_str());
  const char* why = ending_words(field("stopped_early") == "true", field("target_reached") == "true",
                                 field("time_limited") == "true");
  if (field("optimizer") == "script")
    std::printf("the scripts' optimizers trained %s samples in %.1f s (%.0f samples/s)%s; the scripts evaluate their "
                "model\n",
                field("samples").c_str(), num("seconds"), num("samples_per_second"),
                script_ending(field("stopped_early") == "true", field("target_reached") == "true",
                              field("time_limited") == "true"));
  else
    std::printf("test accuracy %.4f (loss %.4f) on %s samples, %s%.2f of %s epochs in %.1f s (%.0f samples/s)\n",
                num("test_accuracy"), num("test_loss"), field("test_samples").c_str(), why, num("epochs_trained"),
                field("epochs").c_str(), num("seconds"), num("samples_per_second"));
  print_work_moved(num("redone_samples"), num("reassigned_samples"), num("lost_workers"));
  print_run_notes(static_cast<uint64_t>(num("refused_reports")), report_strings(j, "abandoned_cuts"));
}

// Writes the job's report `report_json` to run.report; false (said) when it cannot.
bool write_report(const train_config& cfg, const std::string& report_json) {
  std::FILE* f = std::fopen(cfg.report.c_str(), "wb");
  const bool written = f && std::fwrite(report_json.data(), 1, report_json.size(), f) == report_json.size();
  if (f && std::fclose(f) == 0 && written) {
    std::printf("report written to %s\n", cfg.report.c_str());
    return true;
  }
  std::fflush(stdout);
  std::fprintf(stderr, "ashlar train: cannot write report %s: %s\n", cfg.report.c_str(), std::strerror(errno));
  return false;
}

// Reports the job's answer `res`: its summary and report file, or why the cluster could not
// run it. `sig`: the signal that asked to stop it, 0 if none. Returns the exit code.
int report_job(const train_config& cfg, const expected<wire::job_result>& res, int sig) {
  if (!res) {
    std::fprintf(stderr, "ashlar train: the cluster could not run the job: %s\n", describe(res.error()).c_str());
    // As a local run's: a job that failed past its configuration leaves its report, with the error.
    if (!cfg.report.empty() && !is(res.error(), errc::invalid_config) && !is(res.error(), errc::invalid_argument)) {
      auto failed = failed_report(cfg.policy, cfg.model.to_string(), cfg.workers, cfg.servers, cfg.epochs,
                                  describe(res.error()));
      if (!write_report(failed, cfg.report))
        std::printf("report (with the error) written to %s\n", cfg.report.c_str());
    }
    return 1;
  }
  print_job_summary(res->report_json);
  int code = 0;
  if (!cfg.report.empty() && !write_report(cfg, res->report_json))
    code = 1;
  if (sig == 0 && report_field(res->report_json, "stopped_early") == "true") {
    std::fflush(stdout);
    std::fprintf(stderr, "ashlar train: the job was stopped on request (`ashlar ctl stop-job`, a shutdown or a "
                         "signal to the scheduler node) before it trained its epochs\n");
    code = 1;
  }
  return code == 0 && sig != 0 ? 128 + sig : code;
}

// Submits the job to the scheduler at `join` (--join) and follows it to its end; returns the exit code.
int submit(const train_config& cfg, const std::string& join, const security_options& security) {
  auto where = actors::parse_endpoint(join);
  if (!where) {
    std::fprintf(stderr, "ashlar train: --join: %s\n", describe(where.error()).c_str());
    return 2;
  }
  auto sec = load_security(security, join);
  if (!sec) {
    std::fprintf(stderr, "ashlar train: %s\n", describe(sec.error()).c_str());
    return 2;
  }
  actors::cluster_system_config sys_cfg;
  caf::actor_system sys{sys_cfg};
  auto net = actors::cluster_network::start(sys, *sec);
  if (!net) {
    std::fprintf(stderr, "ashlar train: %s\n", describe(net.error()).c_str());
    return 1;
  }
  auto ptr = actors::connect(sys, *where, std::chrono::seconds(10));
  if (!ptr) {
    std::fprintf(stderr, "ashlar train: %s\n", describe(ptr.error()).c_str());
    return 1;
  }
  auto cluster = caf::actor_cast<actors::cluster_actor>(*ptr);
  wire::job_request req;
  for (const auto& k : config_keys())
    req.settings.emplace_back(k.key, setting_text(cfg, k.key));
  std::printf("submitted the job to %s; its progress follows (the scheduler's log has the rest)\n", join.c_str());
  std::fflush(stdout);
  // The job may run for hours, so the request has no timeout; a helper actor watches the
  // scheduler meanwhile, so that losing it ends the wait with an error instead of a hang.
  job_outcome outcome;
  auto answer = outcome.get_future();
  auto helper = spawn_job_watcher(sys, cluster, req, join, cfg.progress_interval, &outcome);
  int sig = 0;
  if (!wait_for_job(sys, cluster, helper, join, answer, sig))
    return 128 + sig;
  return report_job(cfg, answer.get(), sig);
}

}  // namespace

// The configuration reference (docs/guides/configuration-reference.md is its output; a
// test checks that they match): every key the code reads, by section, with its variable
// and help, and what each policy's rules derive from the shipped defaults at 4 workers.
std::string config_reference() {
  std::string out =
    "# Configuration reference\n\n"
    "Every key Ashlar reads, as `ashlar config reference` prints it from the code's own table (a test checks "
    "that this page matches). A key is set in a TOML file (`[section]` then `key = value`), in the "
    "environment (the variable beside it), or with `--set section.key=value`; the last of these wins. "
    "`ashlar config show CONFIG.toml` prints each key's effective value and where it came from.\n";
  std::string section;
  for (const auto& k : config_keys()) {
    const std::string s = k.key.substr(0, k.key.find('.'));
    if (s != section) {
      section = s;
      out += "\n## " + s + "\n\n| key | environment | what it sets (default) |\n|---|---|---|\n";
    }
    std::string help = k.help;
    for (size_t i = 0; (i = help.find('|', i)) != std::string::npos; i += 2)
      help.replace(i, 1, "\\|");
    out += "| `" + k.key + "` | `" + k.env + "` | " + help + " |\n";
  }
  out += "\n## What each policy's rules derive\n\n"
         "`train.lr`, `train.momentum` and `train.batch_size` are the recipe of synchronous training; each policy "
         "adapts them by a stated rule unless you set the key yourself (a flag, `--set`, the environment) or set "
         "`train.policy_rules = false`. From the defaults, at 4 workers:\n\n| policy | key | value | rule |\n"
         "|---|---|---|---|\n";
  for (const auto& p : policy_names()) {
    train_config cfg;
    cfg.policy = p;
    cfg.workers = 4;
    const auto changes = policy_rule_changes(cfg);
    if (changes.empty())
      out += "| " + p + " | | | the recipe as it is |\n";
    for (const auto& c : changes)
      out += "| " + p + " | `" + c.key + "` | " + c.value + " | " + c.why + " |\n";
  }
  return out;
}

command_fn add_config(CLI::App& app) {
  auto o = std::make_shared<train_options>();
  auto* cmd = app.add_subcommand("config", "Show a configuration: every key's effective value and its source");
  cmd->require_subcommand(1);
  auto* reference = cmd->add_subcommand("reference", "every configuration key, its environment variable and help, "
                                                     "and each policy's rules, as a Markdown page");
  reference->callback([] {});
  auto* show = cmd->add_subcommand("show", "every key's effective value and where it came from (default, file:line, "
                                           "env, flag, --set, the policy's rule), as `train` would run it");
  show->footer(key_help());
  add_train_options(show, *o);
  return [o, reference] {
    if (reference->parsed()) {
      std::fputs(config_reference().c_str(), stdout);
      return 0;
    }
    train_config cfg;
    if (auto err = resolve_config(*o, cfg)) {
      std::fprintf(stderr, "ashlar config show: %s\n", describe(err).c_str());
      return 2;
    }
    std::fputs(explain(cfg).c_str(), stdout);
    return 0;
  };
}

command_fn add_train(CLI::App& app) {
  auto o = std::make_shared<train_options>();
  auto join = std::make_shared<std::string>();
  auto security = std::make_shared<security_options>();
  auto* cmd = app.add_subcommand("train", "Train a model; all actors run in this process unless --join");
  cmd->footer(key_help());
  add_train_options(cmd, *o);
  cmd->add_option("--join", *join, "submit the job to the scheduler at HOST:PORT instead");
  add_security_options(cmd, *security, false);
  auto explain_only = std::make_shared<bool>(false);
  cmd->add_flag("--explain", *explain_only,
                "print every setting's effective value and where it came from (default, file:line, env, flag, "
                "--set, the policy's rule), then exit");
  return [o, join, security, explain_only] {
    train_config cfg;
    if (auto err = resolve_config(*o, cfg)) {
      std::fprintf(stderr, "ashlar train: %s\n", describe(err).c_str());
      return 2;
    }
    if (*explain_only) {
      std::fputs(explain(cfg).c_str(), stdout);
      return 0;
    }
    if (auto err = init_logging(cfg.log_level)) {
      std::fprintf(stderr, "ashlar train: %s\n", describe(err).c_str());
      return 2;
    }
    log_rule_notes(cfg);
    if (!join->empty())
      return submit(cfg, *join, *security);
    // Ctrl-C (or SIGTERM) stops the job after the workers' current step, with its final
    // evaluation, checkpoint and report; a second one ends the process at once.
    catch_stop_signals(true);
    auto hooks = print_hooks(script_optimizer(cfg) ? 0 : cfg.epochs);
    hooks.stop_requested = [] { return stop_signal() != 0; };
    hooks.make_backend = host_backend();
    auto rep = actors::run_local_job(cfg, hooks);
    const int code = finish_run(cfg, rep, "ashlar train");
    const int sig = stop_signal();
    return code == 0 && sig != 0 ? 128 + sig : code;
  };
}

}  // namespace ashlar::cli
