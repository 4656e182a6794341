#include "actors/job_driver.hpp"

#include <limits>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/interfaces.hpp"
#include "actors/job_checkpoints.hpp"
#include "actors/job_evaluations.hpp"
#include "actors/profiler.hpp"
#include "actors/scheduler.hpp"
#include "actors/server_shard.hpp"
#include "actors/worker.hpp"
#include "runtime/policy/policy_rules.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/control/job_timeline.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/metrics/json.hpp"
#include "runtime/metrics/metric_target.hpp"
#include "runtime/metrics/prometheus.hpp"
#include "runtime/metrics/recorder.hpp"
#include "runtime/net/http_endpoint.hpp"
#include "runtime/optim/divergence_guard.hpp"
#include "runtime/optim/lr_schedule.hpp"
#include "runtime/os/paths.hpp"
#include "runtime/policy/ashl.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/store/job_store.hpp"

namespace ashlar::actors {

expected<job_data> load_job_data(const data_settings& cfg, const model_spec& model, uint64_t seed) {
  job_data d;
  if (cfg.data_source == data_source_kind::synthetic) {
    // One draw split in two, so both halves share the same cluster centres.
    size_t n_train = cfg.train_limit ? cfg.train_limit : 20000;
    size_t n_test = cfg.test_limit ? cfg.test_limit : 4000;
    d.train = make_synthetic(n_train + n_test, model.input.size(), model.classes, seed);
    d.train.shape = d.test.shape = model.input;
    d.test = d.train;
    d.test.x.erase(d.test.x.begin(), d.test.x.begin() + n_train * d.test.dim);
    d.test.y.erase(d.test.y.begin(), d.test.y.begin() + n_train);
    d.test.n = n_test;
    d.train.truncate(n_train);
  } else if (cfg.data_source == data_source_kind::npy) {
    auto loaded = load_npy_dataset(cfg.data_dir, model.input, model.classes);
    if (!loaded)
      return loaded.error();
    d.train = std::move(loaded->train);
    d.test = std::move(loaded->test);
  } else {
    auto train = load_fashion_mnist(cfg.data_dir, split::train);
    if (!train)
      return train.error();
    auto test = load_fashion_mnist(cfg.data_dir, split::test);
    if (!test)
      return test.error();
    d.train = std::move(*train);
    d.test = std::move(*test);
    if (d.train.dim != model.input.size())
      return make_error(errc::invalid_config, "Fashion-MNIST in " + cfg.data_dir + " has samples of "
                                                + d.train.shape.to_string() + ", but model.input is "
                                                + model.input.to_string() + " (set model.input = 1,28,28)");
    if (model.classes != d.train.classes)
      return make_error(errc::invalid_config, "Fashion-MNIST has " + std::to_string(d.train.classes)
                                                + " classes, but model.classes is "
                                                + std::to_string(model.classes));
    // A flat model.input (784) reads the images as flat vectors.
    d.train.shape = d.test.shape = model.input;
  }
  if (cfg.data_source != data_source_kind::synthetic) {
    d.train.truncate(cfg.train_limit);
    d.test.truncate(cfg.test_limit);
  }
  d.train.crop_padding = cfg.crop_padding;
  d.train.hflip = cfg.hflip;
  return d;
}

namespace {

// Mid-run snapshots (evaluations, the divergence guard) wait briefly; the final one long.
constexpr caf::timespan mid_run_timeout = std::chrono::seconds(10);
constexpr caf::timespan final_timeout = std::chrono::seconds(60);
// A shard served again must answer its status within this to be taken (see on_shard_back).
constexpr caf::timespan probe_timeout = std::chrono::seconds(5);

// Reads every shard's range now, outside the sync policy, into one flat vector: the
// parameters, or with `average` the running averages of shards that keep one
// (train.average_epochs; what evaluations and the final accuracy read).
expected<std::vector<float>> snapshot(caf::scoped_actor& self, const std::vector<shard_actor>& shards,
                                      uint64_t num_params, caf::timespan snapshot_timeout,
                                      bool average = false) {
  std::vector<float> params(num_params);
  caf::error failure;
  // Asked all at once, with a timeout short enough that a shard whose node just died
  // (its loss not yet noticed) holds the driver up only briefly.
  wire::pull_request req{0, 0, true};
  req.average = average;
  std::vector<decltype(self->request(shards.front(), snapshot_timeout, req))> asked;
  for (const auto& s : shards)
    asked.push_back(self->request(s, snapshot_timeout, req));
  for (auto& h : asked) {
    h.receive(
        [&](const wire::pull_reply& r) {
          if (r.begin + r.params.size() > num_params) {
            failure = make_error(errc::shape_mismatch, "shard snapshot exceeds the model");
            return;
          }
          std::copy(r.params.begin(), r.params.end(), params.begin() + r.begin);
        },
        [&](caf::error& err) { failure = err; });
  }
  if (failure)
    return failure;
  return params;
}

// The job's /metrics endpoint: the node's (hooks.metrics), or one of its own on
// run.metrics_listen. Errors: io_error when the address cannot be bound.
struct metrics_target {
  std::unique_ptr<http_endpoint> own;
  http_endpoint* endpoint = nullptr;
};

expected<metrics_target> open_metrics(const train_config& cfg, const job_hooks& hooks) {
  metrics_target t;
  t.endpoint = hooks.metrics;
  if (t.endpoint || cfg.metrics_listen.empty())
    return t;
  auto ep = http_endpoint::start(cfg.metrics_listen);
  if (!ep)
    return ep.error();
  spdlog::info("job: Prometheus metrics at {}", (*ep)->url());
  t.own = std::move(*ep);
  t.endpoint = t.own.get();
  return t;
}

// The recorder for run.trace and run.metrics, or null when neither is set.
expected<std::shared_ptr<run_recorder>> open_recorder(const train_config& cfg) {
  if (cfg.trace.empty() && cfg.metrics.empty())
    return std::shared_ptr<run_recorder>{};
  auto rec = run_recorder::open(cfg.trace, cfg.metrics, cfg.confine_root);
  if (!rec)
    return rec.error();
  std::string speeds;
  for (double v : cfg.speeds)
    speeds += (speeds.empty() ? "" : ",") + json_number(v);
  (*rec)->describe_run("ashlar " + cfg.policy + " (" + std::to_string(cfg.workers) + " workers)",
                       "\"policy\":" + json_string(cfg.policy) + ",\"allocation\":" + json_string(to_string(cfg.allocation))
                         + ",\"workers\":" + std::to_string(cfg.workers) + ",\"servers\":"
                         + std::to_string(cfg.servers) + ",\"batch_size\":" + std::to_string(cfg.batch_size)
                         + ",\"model\":" + json_string(cfg.model.to_string()) + ",\"speeds\":[" + speeds + "]");
  return rec;
}

// One job from start to end, in parts: prepare (configuration, data, the job's store and
// what a resume starts from), spawn (recorder, metrics, profiler, shards, scheduler,
// workers), watch (lost shards, the learning-rate schedule, metrics, progress,
// evaluations, the job's record, the stop), finish (final figures, the last checkpoint
// round, the report).
class job_run {
public:
  job_run(caf::actor_system& sys, const train_config& cfg, job_placement& where, const job_hooks& hooks)
    : sys_(sys), cfg_(cfg), where_(where), hooks_(hooks), self_(sys) {}

  ~job_run() {
    evals_.reset(); // before the test set it reads
    if (recorder_) // the files are finished however the job ends
      recorder_->close();
  }

  expected<run_report> run(std::vector<float>* final_params) {
    // A job that fails before it trains (a file it may not read, a shard that cannot
    // start) ends its placement too: the cluster takes the next job.
    if (auto err = prepare()) {
      end_placement();
      return err;
    }
    if (auto err = spawn()) {
      end_placement();
      return err;
    }
    watch();
    rep_.seconds = seconds();
    record_point(evals_->settle(true)); // the last mid-run evaluation, if one is still running
    if (failure_) {
      stop_all();
      return failure_;
    }
    return finish(final_params);
  }

private:
  // -- prepare: the configuration, the data, the job's store and what a resume starts from.
  caf::error prepare() {
    if (auto err = validate_job(cfg_))
      return err;
    if (!cfg_.report.empty()) // written at the end: refused now rather than after the training
      if (auto err = check_output_file(cfg_.report, "run.report"))
        return err;
    if (!cfg_.contention.empty()) {
      auto profile = load_contention(cfg_.contention, cfg_.confine_root);
      if (!profile)
        return profile.error();
      contention_ = std::move(*profile);
    }
    auto data = load_job_data(cfg_, cfg_.model, cfg_.seed);
    if (!data)
      return data.error();
    train_ = std::make_shared<const dataset>(std::move(data->train));
    test_ = std::move(data->test);
    auto store = job_store::open(cfg_);
    if (!store)
      return store.error();
    store_ = std::move(*store);
    // A script's optimizer (train.optimizer = script): the scripts bring their own data and
    // epochs, and the job ends when they do (no budget of samples).
    budget_ = script_optimizer(cfg_) ? 0 : uint64_t{cfg_.epochs} * train_->n;
    if (train_->n < cfg_.workers)
      return make_error(errc::invalid_config, "train.workers = " + std::to_string(cfg_.workers) + " exceeds the "
                                                + std::to_string(train_->n) + " training samples");
    num_params_ = cfg_.model.num_params();
    auto ranges = split_ranges(num_params_, cfg_.servers);
    if (!ranges)
      return ranges.error();
    ranges_ = std::move(*ranges);
    set_blas_threads(1);
    lockstep_ = traits_of(cfg_.policy).lockstep;
    spdlog::info("job: model {} ({} parameters), {} train / {} test samples, {} workers, {} shards, "
                 "policy {}, batch {} per worker, {} epochs",
                 cfg_.model.to_string(), num_params_, train_->n, test_.n, cfg_.workers, cfg_.servers, cfg_.policy,
                 cfg_.batch_size, cfg_.epochs);
    return {};
  }

  // -- spawn: the run's files, the profiler, the shards, the scheduler and the workers.
  caf::error spawn() {
    auto recorder = open_recorder(cfg_);
    if (!recorder)
      return recorder.error();
    recorder_ = std::move(*recorder);
    auto metrics = open_metrics(cfg_, hooks_);
    if (!metrics)
      return metrics.error();
    metrics_ = std::move(*metrics);
    live_.policy = cfg_.policy;
    where_.set_driver(caf::actor_cast<caf::actor>(self_));
    profiler_ = spawn_profiler(sys_, 0.1, recorder_, 0.25, train_->n);
    // Under a script's optimizer the shards hold what is added to the script's own initial
    // parameters: zeros to start.
    auto shards = where_.make_shards(ranges_,
                                     script_optimizer(cfg_) ? std::vector<float>(num_params_, 0.0f)
                                                            : init_params(cfg_.model, cfg_.seed),
                                     cfg_,
                                     cfg_.average_epochs * static_cast<double>(train_->n));
    if (!shards) {
      self_->send_exit(profiler_, caf::exit_reason::user_shutdown);
      return shards.error();
    }
    shards_ = std::move(*shards);
    for (auto& s : shards_)
      self_->monitor(s);
    if (auto err = take_up_checkpoint()) {
      for (auto& s : shards_)
        self_->send_exit(s, caf::exit_reason::user_shutdown);
      self_->send_exit(profiler_, caf::exit_reason::user_shutdown);
      return err;
    }
    scheduler_ = spawn_scheduler(sys_, scheduler_settings());
    start_ = clock_.steady_ns();
    timeline_.emplace(clock_, timeline_settings());
    if (recorder_)
      recorder_->mark_start();
    evals_ = std::make_unique<job_evaluations>(cfg_.model, hooks_, test_);
    rep_ = report_header();
    if (!cfg_.target.empty())
      if (auto t = parse_metric_target(cfg_.target))
        metric_log_ = metric_log{*t};
    if (auto err = where_.start_workers(cfg_, scheduler_, profiler_, train_)) {
      stop_all();
      return err;
    }
    return {};
  }

  // The cut the job starts from (a resume's, agreed with every shard and restored in
  // each; none for a new job), and how far it got.
  caf::error take_up_checkpoint() {
    if (store_) {
      cuts_.emplace(self_, *store_, cfg_.checkpoint_dir, cfg_.checkpoint_every, lockstep_);
      if (auto err = cuts_->take_up(shards_))
        return err;
    }
    done_before_ = store_ ? store_->samples_before() : 0;
    if (budget_ > 0 && done_before_ >= budget_)
      return make_error(errc::invalid_config, "the job in " + cfg_.checkpoint_dir + " already trained "
                                                + std::to_string(done_before_) + " samples, its "
                                                + std::to_string(cfg_.epochs)
                                                + " epochs; raise train.epochs to train on");
    if (done_before_ > 0)
      spdlog::info("job: resuming from {}, checkpoint cut {} ({} of {} samples trained, {} trained past it are "
                   "trained again; resume {}, {} workers' batch shares and data positions)",
                   cfg_.checkpoint_dir, store_->cut(), done_before_, budget_, store_->redone_samples(),
                   store_->record().resumes, store_->record().workers.size());
    return {};
  }

  scheduler_config scheduler_settings() {
    scheduler_config sc;
    sc.job = cfg_;
    sc.ranges = ranges_;
    sc.shards = shards_;
    sc.data_endpoints = where_.data_endpoints();
    sc.data_key = where_.data_key();
    sc.profiler = profiler_;
    sc.train_size = train_->n;
    sc.remaining = budget_ > 0 ? 1.0 - static_cast<double>(done_before_) / static_cast<double>(budget_) : 1.0;
    if (store_) {
      sc.resume_stage = store_->record().stage;
      for (const auto& w : store_->record().workers)
        sc.resume_workers[w.id] = {w.batch, w.position};
      stage_ = std::make_shared<std::atomic<int>>(-1);
      sc.stage_out = stage_;
    }
    sc.reassigned_out = reassigned_;
    sc.contention = contention_;
    // Where workers can join while the job runs (nodes of a cluster), a job whose workers
    // were all lost at once waits for one as long as for a lost shard.
    if (where_.takes_joiners())
      sc.worker_wait = std::chrono::milliseconds(static_cast<int64_t>(cfg_.shard_wait * 1000));
    sc.observer = caf::actor_cast<caf::actor>(self_);
    sc.recorder = recorder_;
    return sc;
  }

  // When the driver acts (runtime/control/job_timeline.hpp).
  control::timeline_settings timeline_settings() const {
    control::timeline_settings ts;
    ts.progress_interval = hooks_.on_progress ? cfg_.progress_interval : 0;
    ts.eval_interval = cfg_.eval_interval;
    ts.eval_every_epoch = cfg_.eval_every_epoch;
    ts.epochs = cfg_.epochs;
    ts.epoch_samples = train_->n;
    ts.done_before = done_before_;
    ts.budget = budget_;
    ts.stop_at_budget = !lockstep_; // workers at their own pace are stopped from here
    ts.time_limit = cfg_.time_limit;
    ts.shard_wait = cfg_.shard_wait;
    ts.metrics_every = metrics_.endpoint ? 1.0 : 0.0; // the shards' counters, once a second
    return ts;
  }

  run_report report_header() const {
    run_report rep;
    rep.policy = cfg_.policy;
    rep.optimizer = cfg_.optimizer_kind;
    rep.model = cfg_.model.to_string();
    rep.workers = cfg_.workers;
    rep.servers = cfg_.servers;
    rep.epochs = cfg_.epochs;
    rep.batch_size = cfg_.batch_size;
    rep.seed = cfg_.seed;
    rep.train_samples = train_->n;
    rep.test_samples = test_.n;
    rep.target = cfg_.target;
    return rep;
  }

  // A model that ends with values that are not finite diverged, whatever the guard saw:
  // the job fails and says so rather than reporting chance accuracy as a result.
  caf::error diverged_at_end(const std::vector<float>& params) const {
    const auto bad = std::find_if(params.begin(), params.end(), [](float x) { return !std::isfinite(x); });
    if (bad == params.end())
      return caf::none;
    std::string guard = guard_ ? " after " + std::to_string(guard_->backoffs()) + " back-off(s) of the divergence "
                                   "guard (learning rate x" + std::to_string(guard_->lr_scale()).substr(0, 6) + ")"
                               : std::string{};
    return make_error(errc::numerical_error, "the training diverged: the final parameters hold "
                                               + std::string{std::isnan(*bad) ? "NaN" : "infinite"} + " values"
                                               + guard + "; lower train.lr");
  }

  void end_placement() {
    if (!placement_ended_)
      where_.on_job_end();
    placement_ended_ = true;
  }

  void stop_all() {
    // The workers first: a worker still stepping (a job that failed or was stopped) would
    // otherwise see its shards go and log them as lost.
    end_placement();
    self_->send_exit(scheduler_, caf::exit_reason::user_shutdown);
    self_->send_exit(profiler_, caf::exit_reason::user_shutdown);
    for (auto& s : shards_)
      self_->send_exit(s, caf::exit_reason::user_shutdown);
    if (metrics_.endpoint) {
      live_.running = false;
      metrics_.endpoint->publish(prometheus_text(live_));
    }
  }

  double seconds() const { return static_cast<double>(clock_.steady_ns() - start_) * 1e-9; }

  double epoch_of(uint64_t samples) const {
    return static_cast<double>(done_before_ + samples) / static_cast<double>(train_->n);
  }

  // -- watch: messages, and a look at the job's figures whenever the timeline says something
  // is due (runtime/control/job_timeline.hpp: progress lines, evaluations at epoch
  // boundaries and on their interval, notes, the budget, the time limit, lost shards'
  // deadlines; at least every max_wait for the schedule and the divergence guard), until
  // every worker has left or the job fails.
  void watch() {
    schedule_.kind = cfg_.lr_schedule;
    schedule_.warmup_epochs = cfg_.warmup_epochs;
    scheduled_ = schedule_.kind != lr_schedule::constant || schedule_.warmup_epochs > 0;
    if (scheduled_)
      follow_schedule(0, 0.0, true);
    // The divergence guard starts from the parameters the job starts from. A ring's
    // workers hold the model themselves: there, a loss that is not finite stops the job.
    guard_wanted_ = cfg_.divergence_guard && !traits_of(cfg_.policy).ring;
    start_guard();
    while (!done_) {
      // Everything queued, before the look: a node lost and back (its shards' losses,
      // then their restores) is taken in at once, not one message per look.
      const auto wait = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(timeline_->wait()));
      if (take_message(wait))
        take_queued();
      if (!done_)
        end_if_stop_overdue();
      if (!done_)
        check_lost_shards();
      if (!done_)
        on_look();
    }
  }

  // A stop asked timeline_settings::stop_grace ago that the workers have not answered by
  // leaving (one hung in its step, its node gone, a shard still lost): the job ends now.
  void end_if_stop_overdue() {
    if (!stop_sent_ && ((hooks_.stop_requested && hooks_.stop_requested()) || !stop_asked_.empty()))
      stop_if_due(control::timeline_duties{});
    if (!timeline_->stop_overdue())
      return;
    spdlog::warn("job: {} s after the stop request {}; the job ends without waiting longer",
                 timeline_->settings().stop_grace,
                 timeline_->shards_lost() ? "a shard is still lost" : "workers are still in their step");
    stop_forced_ = done_ = true;
  }

  // The learning-rate schedule follows the epochs trained (a resumed job's included): its
  // factor goes to the shards and, through the scheduler, to the workers whenever it has
  // moved by more than 0.2%. With a time limit, the schedule runs on whichever ends
  // first: the epochs, or the time (its fraction spent counts as that fraction of them).
  void follow_schedule(uint64_t samples, double now, bool force) {
    const double epoch = schedule_epoch(epoch_of(samples), cfg_.epochs, now, cfg_.time_limit);
    auto f = static_cast<float>(lr_factor(schedule_, epoch, cfg_.epochs));
    if (guard_)
      f *= static_cast<float>(guard_->lr_scale());
    if (!force && std::abs(f - lr_sent_) <= 0.002f * std::max(lr_sent_, 0.01f))
      return;
    lr_sent_ = f;
    for (const auto& s : shards_)
      self_->send(s, lr_atom::value, f);
    self_->send(scheduler_, lr_atom::value, f);
  }

  // Every message already queued (see take_message), without waiting. True if there was
  // any.
  bool take_queued() {
    bool any = false;
    while (!done_ && take_message(std::chrono::milliseconds(0)))
      any = true;
    return any;
  }

  // One message the driver waits for (the scheduler's done, a shard lost or served
  // again); false when none came within `wait`.
  bool take_message(caf::timespan wait) {
    bool got = true;
    self_->receive(
      [&](done_atom, uint32_t f, uint32_t fl, std::string& first_failure, std::string& job_error) {
        done_ = true;
        finished_ = f;
        failed_ = fl;
        first_failure_ = std::move(first_failure);
        if (!job_error.empty() && !failure_)
          failure_ = make_error(errc::invalid_state, "the job failed: " + job_error);
      },
      [&](start_atom, uint32_t workers) { on_training_start(workers); },
      [&](stop_atom, std::string& who) { // the cluster: ashlar ctl stop-job, a shutdown, the submitter's Ctrl-C
        if (stop_asked_.empty())
          stop_asked_ = std::move(who);
      },
      [&](caf::down_msg& dm) { on_shard_down(dm); },
      [&](shard_atom, uint32_t index, shard_actor& shard, std::string& endpoint) {
        on_shard_back(index, std::move(shard), std::move(endpoint));
      },
      [&](shard_atom, uint32_t index, std::string& why) { // the cluster's last try to serve it again
        if (index < shards_.size()) // (kept until it is served again, whichever of this and its loss came first)
          not_served_why_[index] = std::move(why);
      },
      caf::after(wait) >> [&] { got = false; });
    return got;
  }

  // The job's clock (its report's seconds, evaluations, progress, the time limit and the
  // run's files) restarts when training does: the time workers took to join (processes
  // starting, a data set loading, a script importing its framework) is reported apart,
  // as startup_seconds, and is not training time.
  void on_training_start(uint32_t workers) {
    if (training_)
      return;
    training_ = true;
    const uint64_t now = clock_.steady_ns();
    rep_.startup_seconds = static_cast<double>(now - start_) * 1e-9;
    start_ = now;
    timeline_->training_started();
    if (recorder_)
      recorder_->mark_start();
    if (rep_.startup_seconds >= 0.5)
      spdlog::info("job: training starts with {} workers, {:.1f} s after the job did (workers joining); its "
                   "times count from here",
                   workers, rep_.startup_seconds);
  }

  void on_shard_down(const caf::down_msg& dm) {
    size_t index = shards_.size();
    for (size_t i = 0; i < shards_.size(); ++i)
      if (shards_[i].address() == dm.source)
        index = i;
    if (index == shards_.size())
      return;
    const auto id = ranges_[index].shard_id;
    if (cfg_.checkpoint_dir.empty() || cfg_.shard_wait <= 0) {
      // The job cannot go on without the shard's parameters.
      failure_ = make_error(errc::peer_unreachable, "server shard " + std::to_string(id) + " was lost ("
                                                      + to_string(dm.reason) + "); the job stops");
      done_ = true;
      return;
    }
    timeline_->shard_lost(index);
    if (cuts_)
      cuts_->shard_lost();
    spdlog::warn("job: server shard {} was lost ({}); waiting up to {:.0f} s for it to be served again "
                 "from its checkpoints: ashlar node --role server --shard {} --join SCHEDULER",
                 id, to_string(dm.reason), cfg_.shard_wait, id);
    if (recorder_)
      recorder_->event("shard lost", "shard " + std::to_string(id));
  }

  void on_shard_back(uint32_t index, shard_actor shard, std::string endpoint) {
    if (index >= shards_.size())
      return;
    const auto id = ranges_[index].shard_id;
    const std::string where = endpoint.empty() ? std::string{} : " on " + endpoint;
    // A notice that waited in the queue while the driver was busy may name a shard whose
    // node has died since (lost again, and being served again elsewhere): a request to it
    // would only end at its timeout, holding up the job and the notice of the shard served
    // after it. A shard served again answers its status at once.
    caf::error probe;
    self_->request(shard, probe_timeout, status_atom::value)
      .receive([](const wire::shard_status&) {}, [&](caf::error& e) { probe = std::move(e); });
    if (probe) {
      // Stopped, so that a live but stuck one goes down and its cluster serves it again
      // (and lets go of its store); a dead one is gone already.
      self_->send_exit(shard, caf::exit_reason::kill);
      spdlog::warn("job: server shard {} served again{} does not answer its status within {} s ({}; its node "
                   "lost since?): stopped, waiting for it to be served again",
                   id, where, std::chrono::duration_cast<std::chrono::seconds>(probe_timeout).count(),
                   describe(probe));
      not_served_why_[index] = "served again" + where + ", it did not answer its status: " + describe(probe);
      return;
    }
    spdlog::info("job: server shard {} is served again{}", id, where);
    if (cuts_)
      if (auto err = cuts_->realign(shard, id)) {
        // Taken as it is, it would mix a version the job never committed into the model.
        self_->send_exit(shard, caf::exit_reason::kill);
        spdlog::error("job: server shard {} served again{} could not go back to the last committed cut ({}): "
                      "stopped, waiting for it to be served again",
                      id, where, describe(err));
        not_served_why_[index] = "served again" + where + ", it could not go back to the last committed cut: "
                                 + describe(err);
        return;
      }
    shards_[index] = shard;
    self_->monitor(shards_[index]);
    if (lr_sent_ != 1.0f)
      self_->send(shards_[index], lr_atom::value, lr_sent_);
    timeline_->shard_back(index);
    not_served_why_.erase(index);
    self_->send(scheduler_, shard_atom::value, index, std::move(shard), std::move(endpoint));
  }

  void check_lost_shards() {
    for (auto index : timeline_->expired_shards()) {
      auto why = not_served_why_.find(index);
      failure_ = make_error(errc::peer_unreachable,
                            "server shard " + std::to_string(ranges_[index].shard_id)
                              + " was lost and not served again within "
                              + std::to_string(static_cast<int>(cfg_.shard_wait)) + " s"
                              + (why == not_served_why_.end() ? std::string{} : " (last: " + why->second + ")")
                              + "; the job stops");
      done_ = true;
    }
  }

  void on_look() {
    wire::cluster_stats stats;
    self_->request(profiler_, std::chrono::seconds(10), caf::get_atom::value)
      .receive([&](const wire::cluster_stats& s) { stats = s; }, [&](caf::error&) {});
    const auto due = timeline_->look(stats.total_samples);
    last_look_samples_ = stats.total_samples;
    const double now = seconds();
    if (scheduled_)
      follow_schedule(stats.total_samples, now, false);
    guard_divergence(stats, now);
    take_metric_reports(stats.metric_reports, now);
    // A request to a shard whose node just died ends only at its timeout: the losses
    // queued meanwhile are taken in before the next step asks the shards again, and a
    // look that took any ends there (its clock and statistics are old by now: the next
    // one starts afresh).
    if (take_queued() || done_)
      return;
    publish_metrics(stats, due.metrics);
    if (training_) { // nothing to show before: the parameters are the initial ones
      if (due.progress)
        report_progress(stats, now);
      evaluate_if_due(stats, now, due);
    }
    if (take_queued() || done_)
      return;
    // Checkpoint cuts, while every shard is there to write them; how far the job got, for
    // a resume to count what it trains again.
    if (cuts_ && !timeline_->shards_lost())
      cuts_->tick(shards_, now, [&] { return progress_of(stats.total_samples, now, stats.workers); });
    if (store_ && due.note)
      store_->note_progress(stats.total_samples);
    stop_if_due(due);
  }

  // The guard's first snapshot, if it is wanted and not taken yet: at the start, or at a
  // later look once no shard is lost (a shard lost as the job starts must not hold the
  // driver up past the snapshot's timeout, nor leave the job without a guard).
  void start_guard() {
    if (!guard_wanted_ || guard_ || timeline_->shards_lost() || clock_.steady_ns() < guard_retry_ns_)
      return;
    auto p = snapshot(self_, shards_, num_params_, mid_run_timeout);
    if (!p) { // tried again in 30 s, so that a loss not yet noticed is taken in first
      guard_retry_ns_ = clock_.steady_ns() + 30000000000ull;
      spdlog::debug("job: the divergence guard's first snapshot failed ({}); taken again later", describe(p.error()));
      return;
    }
    good_ = std::move(*p);
    // The no-progress rule stays off: on small slices and slow starters (a residual
    // network under kasync, 2400 samples an epoch) it backed off runs that were
    // learning. Divergence is a loss that is not finite or rises far above its start.
    divergence_settings ds;
    ds.start_hint = std::log(static_cast<double>(std::max<uint32_t>(cfg_.model.classes, 2)));
    guard_.emplace(ds);
  }

  // The loss the guard follows: the job's, unless some workers report one that is not
  // finite while others' is and the shards' parameters are finite (read_losses): those
  // workers are at fault, removed (their samples go to the others), and the others' loss
  // is followed. The parameters are read at most every 5 s for it.
  double loss_to_follow(const wire::cluster_stats& stats, double now) {
    if (std::isfinite(stats.loss))
      return stats.loss;
    std::vector<std::pair<uint32_t, double>> live;
    for (const auto& w : stats.workers)
      if (!w.done && faulted_.count(w.worker_id) == 0)
        live.emplace_back(w.worker_id, w.loss);
    const auto r = read_losses(live);
    if (r.not_finite.empty())
      return r.finite > 0 ? r.others : stats.loss;
    if (!r.suspects() || now < loss_check_after_)
      return stats.loss;
    loss_check_after_ = now + 5;
    auto params = snapshot(self_, shards_, num_params_, mid_run_timeout);
    if (!params || std::any_of(params->begin(), params->end(), [](float x) { return !std::isfinite(x); }))
      return stats.loss; // the model diverged (or could not be read): the guard's to handle
    for (auto id : r.not_finite) {
      faulted_.insert(id);
      const std::string why = "worker " + std::to_string(id) + " reported a training loss that is not finite while "
                              "the shards' parameters are finite and " + std::to_string(r.finite)
                              + " other worker(s) report a finite loss: a fault of that worker, not the job's";
      spdlog::warn("job: {}; it is removed and its samples go to the others", why);
      if (recorder_)
        recorder_->event("worker faulted", why, id);
      self_->send(scheduler_, wire::ctl_request{wire::ctl_request::remove_worker, id, 0});
    }
    return r.others;
  }

  // The divergence guard (runtime/optim/divergence_guard.hpp): snapshots of the model
  // while the loss is near its best; on divergence the last one goes back on the shards
  // and the learning rate halves; past its back-offs, or without a guard, the job stops.
  void guard_divergence(const wire::cluster_stats& stats, double now) {
    if (stats.total_samples > 0 && std::isfinite(stats.loss) && stats.loss > 0)
      last_train_loss_ = stats.loss; // the final evaluation's entry in the history
    if (stats.total_samples == 0 || timeline_->shards_lost())
      return;
    const double loss = loss_to_follow(stats, now);
    start_guard();
    if (!guard_) {
      if (!std::isfinite(loss)) {
        failure_ = make_error(errc::numerical_error, "the training loss is not finite (lr too high? "
                                                     "run.divergence_guard backs off instead)");
        done_ = true;
      }
      return;
    }
    if (timeline_->shards_lost())
      return; // no snapshot nor back-off while a shard is being served again
    switch (guard_->observe(loss, now, stats.total_samples)) {
      case divergence_guard::action::none:
        return;
      case divergence_guard::action::snapshot:
        if (auto p = snapshot(self_, shards_, num_params_, mid_run_timeout)) {
          good_ = std::move(*p);
          guard_->snapshot_taken(loss, now);
        }
        return;
      case divergence_guard::action::give_up:
        failure_ = make_error(errc::numerical_error,
                              "the training diverged again after " + std::to_string(guard_->backoffs())
                                + " back-offs (" + guard_->why() + ", learning rate x"
                                + std::to_string(guard_->lr_scale()).substr(0, 6) + "); lower train.lr");
        done_ = true;
        return;
      case divergence_guard::action::back_off:
        break;
    }
    caf::error err;
    for (size_t i = 0; i < shards_.size() && !err; ++i) {
      std::vector<float> part(good_.begin() + static_cast<std::ptrdiff_t>(ranges_[i].begin),
                              good_.begin() + static_cast<std::ptrdiff_t>(ranges_[i].end));
      self_->request(shards_[i], std::chrono::seconds(30), restore_atom::value, std::move(part))
        .receive([](uint64_t) {}, [&](caf::error& e) { err = e; });
    }
    if (err)
      spdlog::error("job: the training diverged ({}) and the snapshot could not be put back on every shard ({}); "
                    "only the learning rate backs off",
                    guard_->why(), describe(err));
    guard_->backed_off(now);
    spdlog::warn("job: {}; backing off: the parameters of the last good snapshot are back on the shards and the "
                 "learning rate is x{} (back-off {})",
                 guard_->why(), guard_->lr_scale(), guard_->backoffs());
    if (recorder_)
      recorder_->event("diverged: backed off", guard_->why());
    follow_schedule(stats.total_samples, now, true);
  }

  void publish_metrics(const wire::cluster_stats& stats, bool poll_shards) {
    if (!metrics_.endpoint)
      return;
    live_.running = true;
    live_.epoch = epoch_of(stats.total_samples);
    // The shards' counters, once a second (each asks every shard).
    if (live_.shards.empty() || poll_shards) {
      live_.shards.clear();
      std::vector<decltype(self_->request(shards_.front(), std::chrono::seconds(2), status_atom::value))> asked;
      for (const auto& s : shards_)
        asked.push_back(self_->request(s, std::chrono::seconds(2), status_atom::value));
      for (auto& h : asked)
        h.receive([&](const wire::shard_status& st) { live_.shards.push_back(st); }, [](caf::error&) {});
    }
    live_.stats = stats;
    metrics_.endpoint->publish(prometheus_text(live_));
  }

  void report_progress(const wire::cluster_stats& stats, double now) {
    progress_event ev;
    ev.seconds = now;
    ev.samples = stats.total_samples;
    ev.epoch = epoch_of(stats.total_samples);
    const double window = now - last_progress_;
    ev.samples_per_second = static_cast<double>(stats.total_samples - last_samples_) / window;
    ev.loss = stats.loss;
    ev.lr = cfg_.optimizer.lr * lr_sent_;
    ev.metrics = metric_log_.last();
    ev.workers = stats.workers;
    // Each worker's rate over the same window as the aggregate's (the profiler's own is a
    // smoothed per-step rate, which does not add up to it).
    for (auto& w : ev.workers) {
      const uint64_t before = last_worker_samples_.count(w.worker_id) ? last_worker_samples_[w.worker_id] : 0;
      w.samples_per_second = w.samples >= before ? static_cast<double>(w.samples - before) / window : 0.0;
      last_worker_samples_[w.worker_id] = w.samples;
    }
    hooks_.on_progress(ev);
    last_samples_ = stats.total_samples;
    last_progress_ = now;
  }

  // A mid-run evaluation once an epoch boundary has been crossed (the timeline looks as the
  // boundary comes) or the evaluation interval has passed, on a snapshot, in the background.
  void evaluate_if_due(const wire::cluster_stats& stats, double now, const control::timeline_duties& due) {
    record_point(evals_->settle(false));
    if (!due.evaluate || evals_->busy())
      return;
    if (auto p = snapshot(self_, shards_, num_params_, mid_run_timeout, true)) {
      uint64_t bytes = 0;
      for (const auto& w : stats.workers)
        bytes += w.bytes;
      evals_->start(std::move(*p), epoch_of(stats.total_samples), now, stats.loss, bytes);
    }
    timeline_->evaluation_started(due.interval_eval, stats.total_samples);
  }

  // The scripts' reports of named metrics (ashlar.torch.report) not taken yet: into the
  // report, the metrics file and trace, Prometheus, a line of their own; the first that
  // meets run.target stops the job.
  void take_metric_reports(const std::vector<wire::metric_report>& reports, double now) {
    const uint64_t missed = metric_log_.missed();
    auto points = metric_log_.take(reports, now, [this](uint64_t samples) {
      return script_optimizer(cfg_) ? 0.0 : epoch_of(samples); // (the scripts' epochs are theirs)
    });
    if (metric_log_.missed() > missed)
      spdlog::warn("job: {} reports of the scripts' metrics came faster than the job took them and are not in the "
                   "report",
                   metric_log_.missed() - missed);
    for (auto& p : points) {
      if (recorder_)
        recorder_->user_metrics(p.seconds, p.epoch, p.worker_id, p.values);
      if (hooks_.on_metrics)
        hooks_.on_metrics(p);
      rep_.metrics.push_back(std::move(p));
    }
    live_.script_metrics = metric_log_.last();
    if (metric_log_.met_by() && !rep_.target_reached) {
      rep_.target_reached = true;
      const auto& met = *metric_log_.met_by();
      const auto& t = *metric_log_.target();
      spdlog::info("job: {} {} at {:.2f} s (worker {}) met run.target \"{}\"; stopping the workers", t.name,
                   metric_log_.met_value(), met.seconds, met.worker_id, t.text());
      if (recorder_)
        recorder_->event("target reached", t.text());
    }
  }

  void record_point(std::optional<epoch_point> pt) {
    if (!pt)
      return;
    rep_.history.push_back(*pt);
    // run.target on the job's own test accuracy is the same as run.target_accuracy
    if (metric_log_.target() && metric_log_.target()->name == "test_accuracy" && !rep_.target_reached
        && metric_log_.target()->met(pt->test_accuracy)) {
      rep_.target_reached = true;
      spdlog::info("job: test accuracy {:.4f} at {:.2f} s met run.target \"{}\"; stopping the workers",
                   pt->test_accuracy, pt->seconds, metric_log_.target()->text());
      if (recorder_)
        recorder_->event("target reached", fmt::format("test accuracy {:.4f}", pt->test_accuracy));
    }
    if (cfg_.target_accuracy > 0 && pt->test_accuracy >= cfg_.target_accuracy && !rep_.target_reached) {
      rep_.target_reached = true;
      spdlog::info("job: test accuracy {:.4f} at {:.2f} s reached run.target_accuracy {}; stopping the workers",
                   pt->test_accuracy, pt->seconds, cfg_.target_accuracy);
      if (recorder_)
        recorder_->event("target reached", fmt::format("test accuracy {:.4f}", pt->test_accuracy));
    }
    live_.test_accuracy = pt->test_accuracy;
    if (recorder_)
      recorder_->evaluation(pt->seconds, pt->epoch, pt->test_accuracy, pt->train_loss);
    if (hooks_.on_epoch)
      hooks_.on_epoch(*pt);
  }

  // What the job record of a cut taken now holds, with the stage the scheduler is in.
  cut_progress progress_of(uint64_t samples, double secs, const std::vector<wire::worker_stats>& workers) const {
    cut_progress p{samples, secs, workers, ""};
    if (auto s = stage_->load(); s >= 0)
      p.stage = to_string(static_cast<ashl_stage>(s));
    return p;
  }

  // Workers at their own pace stop when their samples together reach the budget; any job
  // stops at its time limit or when asked. Each worker finishes its step and leaves.
  void stop_if_due(const control::timeline_duties& due) {
    if (stop_sent_)
      return;
    const bool out_of_budget = due.stop_budget;
    const bool out_of_time = due.stop_time;
    bool asked = (hooks_.stop_requested && hooks_.stop_requested()) || !stop_asked_.empty();
    if (!(out_of_budget || out_of_time || asked || rep_.target_reached))
      return;
    stop_sent_ = true;
    if (asked) {
      timeline_->stop_asked();
      rep_.stopped_early = true;
      spdlog::info("job: asked to stop{}; stopping the workers after their current step",
                   stop_asked_.empty() ? std::string{} : " (" + stop_asked_ + ")");
      if (recorder_)
        recorder_->event("stop requested", stop_asked_);
    } else if (out_of_time && !rep_.target_reached) {
      // (the scripts' job has no budget: its time limit always stops it short)
      rep_.time_limited = budget_ == 0 || done_before_ + last_look_samples_ < budget_;
      spdlog::info("job: time limit of {} s reached; stopping the workers", cfg_.time_limit);
    }
    self_->request(scheduler_, std::chrono::seconds(10), wire::ctl_request{wire::ctl_request::shutdown, 0, 0})
      .receive([](const std::string&) {}, [](caf::error&) {});
  }

  // -- finish: the final figures, the last checkpoint round, the report.
  expected<run_report> finish(std::vector<float>* final_params) {
    // A shard lost near the end (its node gone, to come back): the final snapshot waits
    // for it to be served again, as long as the run would have.
    while (timeline_->shards_lost() && !failure_ && !timeline_->stop_overdue()) {
      take_message(std::chrono::milliseconds(200));
      check_lost_shards();
      end_if_stop_overdue();
    }
    if (timeline_->shards_lost() && !failure_)
      failure_ = make_error(errc::invalid_state, "the job was stopped" + (stop_asked_.empty() ? std::string{} : " (" + stop_asked_ + ")")
                                                   + " while a shard was lost: its final model cannot be read"
                                                   + (cuts_ ? "; a resume starts from its last checkpoint cut" : ""));
    expected<std::vector<float>> params = std::vector<float>{};
    if (failure_)
      params = failure_;
    else
      params = snapshot(self_, shards_, num_params_, final_timeout, true);
    if (!params && !failure_)
      failure_ = params.error();
    if (params && !failure_)
      failure_ = diverged_at_end(*params);
    collect_shard_counters();
    auto last_workers = collect_worker_figures();
    rep_.samples_per_second = rep_.seconds > 0 ? rep_.samples / rep_.seconds : 0;
    // What the job trained: the more of the two witnesses, each a lower bound (the workers'
    // reports miss a killed worker's last steps; the shards' count misses gradients a
    // policy dropped as stale).
    rep_.epochs_trained = epoch_of(std::max(rep_.samples, rep_.applied_samples));
    judge_short_end();
    rep_.redone_samples = store_ ? store_->redone_samples() : 0;
    rep_.reassigned_samples = reassigned_->load();
    // The clean end: every shard writes the last cut; the job's record names it.
    if (cuts_ && !timeline_->shards_lost())
      cuts_->final_cut(shards_, seconds(), progress_of(rep_.samples, rep_.seconds, last_workers));
    if (cuts_)
      rep_.abandoned_cuts = cuts_->abandoned();
    for (auto& s : shards_)
      self_->demonitor(s.address());
    stop_all();
    if (failure_)
      return failure_;
    if (finished_ == 0 && !stop_forced_)
      return make_error(errc::invalid_state, (failed_ == 1 ? std::string{"the job's one worker failed"}
                                                            : "all " + std::to_string(failed_) + " workers failed")
                                               + (first_failure_.empty() ? std::string{"; the log above says why"}
                                                                         : " (the first, " + first_failure_ + ")"));
    rep_.lost_workers = failed_;
    if (failed_ > 0)
      spdlog::warn("job: {} of {} workers failed during training", failed_, finished_ + failed_);
    if (script_optimizer(cfg_)) {
      // The scripts' model is theirs (their own initial parameters plus the shards'), and
      // so is its evaluation: the job reports what it trained.
      rep_.test_accuracy = rep_.test_loss = std::numeric_limits<double>::quiet_NaN();
      rep_.test_samples = 0;
      return std::move(rep_);
    }
    auto ev = evals_->evaluate(*params);
    if (!ev)
      return ev.error();
    if (!std::isfinite(ev->mean_loss()))
      return make_error(errc::numerical_error, "the training diverged: the final model's test loss is not finite; "
                                               "lower train.lr");
    rep_.test_accuracy = ev->accuracy();
    rep_.test_loss = ev->mean_loss();
    rep_.history.push_back(epoch_point{static_cast<double>(rep_.samples) / static_cast<double>(train_->n), rep_.seconds,
                                       rep_.test_accuracy, last_train_loss_});
    if (recorder_)
      recorder_->evaluation(rep_.seconds, rep_.history.back().epoch, rep_.test_accuracy, last_train_loss_);
    if (final_params)
      *final_params = std::move(*params);
    return std::move(rep_);
  }

  // Every worker left before the job trained its epochs (1% spared: the last step reports of
  // a lost worker may never arrive) and no rule of its own (its target, its time limit)
  // ended it: it was stopped (each worker's node asked to stop, a signal that came as they
  // left), or, with workers lost and their samples taken up by none, it failed. It never
  // reads as trained.
  void judge_short_end() {
    const bool short_of = budget_ > 0 && rep_.epochs_trained < 0.99 * cfg_.epochs;
    if (!short_of || rep_.stopped_early || rep_.target_reached || rep_.time_limited || failure_)
      return;
    char trained[32];
    std::snprintf(trained, sizeof trained, "%.2f", rep_.epochs_trained);
    if (failed_ > 0) {
      failure_ = make_error(errc::invalid_state, "the job trained " + std::string{trained} + " of its "
                                                   + std::to_string(cfg_.epochs) + " epochs: " + std::to_string(failed_)
                                                   + " of its workers were lost and none took up their samples");
      return;
    }
    rep_.stopped_early = true;
    spdlog::info("job: its workers left after {} of {} epochs, each asked to stop (by its node, or a signal as the "
                 "job ended): the job ends stopped", trained, cfg_.epochs);
  }

  void collect_shard_counters() {
    uint64_t staleness_sum = 0, pushes = 0;
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (timeline_->shard_lost_now(i)) // (a request to a lost one ends only at its timeout)
        continue;
      self_->request(shards_[i], std::chrono::seconds(10), status_atom::value)
        .receive(
          [&](const wire::shard_status& st) {
            rep_.versions += st.version;
            rep_.dropped += st.dropped;
            if (st.shard_id == 0)
              rep_.applied_samples = st.samples;
            staleness_sum += st.staleness_sum;
            pushes += st.applied + st.dropped;
          },
          [&](caf::error&) {});
    }
    rep_.mean_staleness = pushes ? static_cast<double>(staleness_sum) / pushes : 0;
  }


  std::vector<wire::worker_stats> collect_worker_figures() {
    std::vector<wire::worker_stats> last;
    self_->request(profiler_, std::chrono::seconds(10), caf::get_atom::value)
      .receive(
        [&](const wire::cluster_stats& s) {
          last = s.workers;
          rep_.samples = s.total_samples;
          rep_.refused_reports = s.refused_reports;
          take_metric_reports(s.metric_reports, rep_.seconds); // the scripts' last, reported as they left
          for (const auto& w : s.workers) {
            worker_summary ws;
            ws.worker_id = w.worker_id;
            ws.steps = w.steps;
            ws.samples = w.samples;
            ws.samples_per_second = w.samples_per_second;
            ws.compute_seconds = w.total_compute_seconds;
            ws.wait_seconds = w.total_wait_seconds;
            ws.stage_changes = w.stage_changes;
            rep_.per_worker.push_back(ws);
            rep_.bytes += w.bytes;
            rep_.dense_bytes += w.dense_bytes;
          }
        },
        [&](caf::error&) {});
    return last;
  }

  caf::actor_system& sys_;
  train_config cfg_;
  job_placement& where_;
  const job_hooks& hooks_;
  caf::scoped_actor self_;
  // prepare
  contention_profile contention_;
  std::shared_ptr<const dataset> train_;
  dataset test_;
  std::optional<job_store> store_;
  std::optional<job_checkpoints> cuts_;
  uint64_t budget_ = 0, done_before_ = 0, num_params_ = 0;
  std::vector<shard_range> ranges_;
  bool lockstep_ = true;
  bool placement_ended_ = false;
  // spawn
  std::shared_ptr<run_recorder> recorder_;
  metrics_target metrics_;
  job_metrics live_;
  profiler_actor profiler_;
  std::vector<shard_actor> shards_;
  scheduler_actor scheduler_;
  std::set<uint32_t> faulted_;     // workers removed for a loss the parameters contradict (loss_to_follow)
  double loss_check_after_ = 0;   // when loss_to_follow may read the parameters again
  std::shared_ptr<std::atomic<int>> stage_; // the scheduler's stage in force (ashl_stage; -1: none)
  std::shared_ptr<std::atomic<uint64_t>> reassigned_ = std::make_shared<std::atomic<uint64_t>>(0);
  const clock_source& clock_ = system_clock();
  uint64_t start_ = 0;    // steady ns when the job started, then when training did
  bool training_ = false; // the scheduler said training starts
  std::unique_ptr<job_evaluations> evals_;
  run_report rep_;
  metric_log metric_log_; // the scripts' reports taken so far, and run.target
  // watch
  bool done_ = false;
  caf::error failure_;
  uint32_t finished_ = 0, failed_ = 0;
  std::string first_failure_; // the scheduler's "worker ID: why" of the first that failed
  std::optional<control::job_timeline> timeline_; // when the driver acts
  uint64_t last_samples_ = 0;      // at the last progress line
  uint64_t last_look_samples_ = 0; // at the last look
  double last_progress_ = 0;
  std::map<size_t, std::string> not_served_why_; // why a lost one is not served yet: the cluster's last try
  bool stop_sent_ = false;
  bool stop_forced_ = false; // the stop's grace ran out: the job ended without its workers' leave
  std::string stop_asked_; // who asked the cluster to stop the job (ashlar ctl stop-job, ...), if anyone
  lr_schedule schedule_;
  bool scheduled_ = false;
  float lr_sent_ = 1.0f;
  std::map<uint32_t, uint64_t> last_worker_samples_; // each worker's samples at the last progress line
  double last_train_loss_ = 0; // the newest finite training loss the profiler reported
  std::optional<divergence_guard> guard_; // run.divergence_guard, for jobs whose model the shards hold
  bool guard_wanted_ = false;             // ... once its first snapshot is taken
  uint64_t guard_retry_ns_ = 0;           // not before (steady ns), after a failed one
  std::vector<float> good_;               // the guard's last snapshot of the parameters
};

}  // namespace

job_placement::~job_placement() = default;

expected<run_report> run_job(caf::actor_system& sys, const train_config& cfg, job_placement& where,
                             const job_hooks& hooks, std::vector<float>* final_params) {
  return job_run(sys, cfg, where, hooks).run(final_params);
}

}  // namespace ashlar::actors
