#include "actors/job_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <future>
#include <optional>
#include <thread>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "actors/interfaces.hpp"
#include "actors/profiler.hpp"
#include "actors/scheduler.hpp"
#include "actors/server_shard.hpp"
#include "actors/worker.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/metrics/json.hpp"
#include "runtime/metrics/prometheus.hpp"
#include "runtime/metrics/recorder.hpp"
#include "runtime/net/http_endpoint.hpp"
#include "runtime/optim/lr_schedule.hpp"
#include "runtime/policy/ashl.hpp"
#include "runtime/store/checkpoint.hpp"

namespace ashlar::actors {

namespace {

using clock_type = std::chrono::steady_clock;

}  // namespace

expected<job_data> load_job_data(const train_config& cfg) {
  job_data d;
  if (cfg.data_source == "synthetic") {
    // One draw split in two, so both halves share the same cluster centres.
    size_t n_train = cfg.train_limit ? cfg.train_limit : 20000;
    size_t n_test = cfg.test_limit ? cfg.test_limit : 4000;
    d.train = make_synthetic(n_train + n_test, cfg.model.input.size(), cfg.model.classes, cfg.seed);
    d.train.shape = d.test.shape = cfg.model.input;
    d.test = d.train;
    d.test.x.erase(d.test.x.begin(), d.test.x.begin() + n_train * d.test.dim);
    d.test.y.erase(d.test.y.begin(), d.test.y.begin() + n_train);
    d.test.n = n_test;
    d.train.truncate(n_train);
  } else if (cfg.data_source == "npy") {
    auto loaded = load_npy_dataset(cfg.data_dir, cfg.model.input, cfg.model.classes);
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
    if (d.train.dim != cfg.model.input.size())
      return make_error(errc::invalid_config, "Fashion-MNIST in " + cfg.data_dir + " has samples of "
                                                + d.train.shape.to_string() + ", but model.input is "
                                                + cfg.model.input.to_string() + " (set model.input = 1,28,28)");
    if (cfg.model.classes != d.train.classes)
      return make_error(errc::invalid_config, "Fashion-MNIST has " + std::to_string(d.train.classes)
                                                + " classes, but model.classes is "
                                                + std::to_string(cfg.model.classes));
    // A flat model.input (784) reads the images as flat vectors.
    d.train.shape = d.test.shape = cfg.model.input;
  }
  if (cfg.data_source != "synthetic") {
    d.train.truncate(cfg.train_limit);
    d.test.truncate(cfg.test_limit);
  }
  d.train.crop_padding = cfg.crop_padding;
  d.train.hflip = cfg.hflip;
  return d;
}

namespace {

// Lowers the calling thread's CPU priority (Linux: a thread's nice value is its own;
// raising it needs no privilege). Mid-run test evaluations run so: they use time the
// workers leave idle instead of slowing them down, which on a machine with few cores
// would otherwise show in every policy's throughput.
void lower_thread_priority() {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
}

// Reads every shard's range now, outside the sync policy, into one flat vector.
expected<std::vector<float>> snapshot(caf::scoped_actor& self, const std::vector<shard_actor>& shards,
                                      uint64_t num_params) {
  std::vector<float> params(num_params);
  caf::error failure;
  for (const auto& s : shards) {
    self->request(s, std::chrono::seconds(30), wire::pull_request{0, 0, true})
      .receive(
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
  auto rec = run_recorder::open(cfg.trace, cfg.metrics);
  if (!rec)
    return rec.error();
  std::string speeds;
  for (double v : cfg.speeds)
    speeds += (speeds.empty() ? "" : ",") + json_number(v);
  (*rec)->describe_run("ashlar " + cfg.policy + " (" + std::to_string(cfg.workers) + " workers)",
                       "\"policy\":" + json_string(cfg.policy) + ",\"allocation\":" + json_string(cfg.allocation)
                         + ",\"workers\":" + std::to_string(cfg.workers) + ",\"servers\":"
                         + std::to_string(cfg.servers) + ",\"batch_size\":" + std::to_string(cfg.batch_size)
                         + ",\"model\":" + json_string(cfg.model.to_string()) + ",\"speeds\":[" + speeds + "]");
  return rec;
}

// Settings a resumed job must share with the checkpointed one: all but where things go
// (run.*, data.dir), how long (train.epochs) and the bench's pacing emulation.
std::vector<std::string> job_settings(const train_config& cfg) {
  std::vector<std::string> out;
  for (const auto& k : config_keys()) {
    if (k.key.rfind("run.", 0) == 0 || k.key == "data.dir" || k.key == "train.epochs" || k.key == "train.speeds"
        || k.key == "train.sample_ms" || k.key == "train.contention")
      continue;
    out.push_back(k.key + "=" + setting_text(cfg, k.key));
  }
  return out;
}

// The job's own checkpoint store (DIR/job) and what a resume starts from.
struct job_store {
  std::unique_ptr<kv_store> store;
  job_record record; // samples and time so far, resumes
};

// Opens DIR/job. With cfg.resume: reads the record and refuses a configuration that
// differs, naming each setting. Without: refuses a directory that holds another job.
expected<std::optional<job_store>> open_job_store(const train_config& cfg) {
  if (cfg.checkpoint_dir.empty())
    return std::optional<job_store>{};
  std::error_code ec;
  std::filesystem::create_directories(cfg.checkpoint_dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create the checkpoint directory " + cfg.checkpoint_dir + ": "
                                        + ec.message());
  auto store = open_rocksdb_store(cfg.checkpoint_dir + "/job", open_mode::create);
  if (!store)
    return store.error();
  auto old = load_job_record(**store);
  if (!old)
    return old.error();
  job_store js;
  js.store = std::move(*store);
  js.record.settings = job_settings(cfg);
  if (!cfg.resume) {
    if (*old)
      return make_error(errc::invalid_config, cfg.checkpoint_dir + " holds the checkpoints of a job ("
                                                + std::to_string((*old)->samples) + " samples trained): "
                                                "continue it with --resume, or use another directory");
    return std::optional<job_store>{std::move(js)};
  }
  if (!*old) {
    spdlog::warn("job: nothing to resume in {}; starting from the beginning", cfg.checkpoint_dir);
    return std::optional<job_store>{std::move(js)};
  }
  std::map<std::string, std::string> then, now;
  auto split = [](const std::vector<std::string>& kvs, std::map<std::string, std::string>& m) {
    for (const auto& kv : kvs)
      m[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  };
  split((*old)->settings, then);
  split(js.record.settings, now);
  std::string diff;
  const train_config defaults;
  for (const auto& [k, v] : now) {
    auto i = then.find(k);
    if (i != then.end()) {
      if (i->second != v)
        diff += (diff.empty() ? "" : "; ") + k + " = " + v + " (checkpointed job: " + i->second + ")";
      continue;
    }
    // A setting newer than the checkpoint: the checkpointed job ran at its default.
    const std::string was = setting_text(defaults, k);
    if (was != v)
      diff += (diff.empty() ? "" : "; ") + k + " = " + v + " (checkpointed job: " + was
              + ", the default; its record predates this setting)";
  }
  if (!diff.empty())
    return make_error(errc::invalid_config, "cannot resume the job in " + cfg.checkpoint_dir
                                              + ": the configuration differs: " + diff);
  js.record.samples = (*old)->samples;
  js.record.seconds = (*old)->seconds;
  js.record.resumes = (*old)->resumes + 1;
  js.record.stage = (*old)->stage;
  js.record.workers = (*old)->workers;
  return std::optional<job_store>{std::move(js)};
}

}  // namespace

job_placement::~job_placement() = default;

expected<run_report> run_job(caf::actor_system& sys, const train_config& cfg_in,
                             job_placement& where, const job_hooks& hooks,
                             std::vector<float>* final_params) {
  train_config cfg = cfg_in;
  if (auto err = validate(cfg))
    return err;
  contention_profile contention;
  if (!cfg.contention.empty()) {
    auto profile = load_contention(cfg.contention);
    if (!profile)
      return profile.error();
    contention = std::move(*profile);
  }
  auto data = load_job_data(cfg);
  if (!data)
    return data.error();
  auto train = std::make_shared<const dataset>(std::move(data->train));
  const dataset test = std::move(data->test);
  auto job_store_or = open_job_store(cfg);
  if (!job_store_or)
    return job_store_or.error();
  auto jobstore = std::move(*job_store_or);
  const uint64_t budget = uint64_t{cfg.epochs} * train->n;
  const uint64_t done_before = jobstore ? jobstore->record.samples : 0;
  const double seconds_before = jobstore ? jobstore->record.seconds : 0.0;
  if (done_before >= budget)
    return make_error(errc::invalid_config, "the job in " + cfg.checkpoint_dir + " already trained "
                                              + std::to_string(done_before) + " samples, its "
                                              + std::to_string(cfg.epochs)
                                              + " epochs; raise train.epochs to train on");
  if (done_before > 0)
    spdlog::info("job: resuming from {} ({} of {} samples trained, resume {}, {} workers' batch shares and data "
                 "positions)", cfg.checkpoint_dir, done_before, budget, jobstore->record.resumes,
                 jobstore->record.workers.size());
  if (train->n < cfg.workers)
    return make_error(errc::invalid_config, "train.workers = " + std::to_string(cfg.workers)
                                              + " exceeds the " + std::to_string(train->n)
                                              + " training samples");
  const uint64_t num_params = cfg.model.num_params();
  auto ranges = split_ranges(num_params, cfg.servers);
  if (!ranges)
    return ranges.error();
  auto init = init_params(cfg.model, cfg.seed);
  set_blas_threads(1);

  spdlog::info("job: model {} ({} parameters), {} train / {} test samples, {} workers, {} shards, "
               "policy {}, batch {} per worker, {} epochs",
               cfg.model.to_string(), num_params, train->n, test.n, cfg.workers, cfg.servers,
               cfg.policy, cfg.batch_size, cfg.epochs);

  auto recorder_or = open_recorder(cfg);
  if (!recorder_or)
    return recorder_or.error();
  auto recorder = std::move(*recorder_or);
  // The files are finished however the job ends (the profiler may hold on a while).
  struct close_on_exit {
    std::shared_ptr<run_recorder> r;
    ~close_on_exit() {
      if (r)
        r->close();
    }
  } recorder_guard{recorder};
  auto metrics_or = open_metrics(cfg, hooks);
  if (!metrics_or)
    return metrics_or.error();
  auto metrics = std::move(*metrics_or);
  job_metrics live;
  live.policy = cfg.policy;

  caf::scoped_actor self{sys};
  where.set_driver(caf::actor_cast<caf::actor>(self));

  auto profiler = spawn_profiler(sys, 0.1, recorder);
  auto shards_or = where.make_shards(*ranges, init, cfg);
  if (!shards_or) {
    self->send_exit(profiler, caf::exit_reason::user_shutdown);
    return shards_or.error();
  }
  auto shards = std::move(*shards_or);
  for (auto& s : shards)
    self->monitor(s);
  scheduler_config sc;
  sc.job = cfg;
  sc.ranges = *ranges;
  sc.shards = shards;
  sc.data_endpoints = where.data_endpoints();
  sc.data_key = where.data_key();
  sc.profiler = profiler;
  sc.train_size = train->n;
  sc.remaining = 1.0 - static_cast<double>(done_before) / static_cast<double>(budget);
  if (jobstore) {
    sc.resume_stage = jobstore->record.stage;
    for (const auto& w : jobstore->record.workers)
      sc.resume_workers[w.id] = {w.batch, w.position};
    sc.stage_out = std::make_shared<std::atomic<int>>(-1);
  }
  sc.contention = std::move(contention);
  sc.observer = caf::actor_cast<caf::actor>(self);
  sc.recorder = recorder;
  auto scheduler = spawn_scheduler(sys, sc);
  auto start = clock_type::now();
  if (recorder)
    recorder->mark_start();
  auto stop_all = [&] {
    for (auto& s : shards)
      self->send_exit(s, caf::exit_reason::user_shutdown);
    self->send_exit(profiler, caf::exit_reason::user_shutdown);
    self->send_exit(scheduler, caf::exit_reason::user_shutdown);
    where.on_job_end();
    if (metrics.endpoint) {
      live.running = false;
      metrics.endpoint->publish(prometheus_text(live));
    }
  };
  if (auto err = where.start_workers(cfg, scheduler, profiler, train)) {
    stop_all();
    return err;
  }

  run_report rep;
  rep.policy = cfg.policy;
  rep.model = cfg.model.to_string();
  rep.workers = cfg.workers;
  rep.servers = cfg.servers;
  rep.epochs = cfg.epochs;
  rep.batch_size = cfg.batch_size;
  rep.seed = cfg.seed;
  rep.train_samples = train->n;
  rep.test_samples = test.n;

  // The test evaluations: on the CPU, or for a model with a layer only the host
  // application computes, on a backend of its own (hooks.make_backend); without one, the
  // evaluations fail with the reason and the job trains on.
  std::unique_ptr<compute_backend> evaluator;
  caf::error no_evaluator;
  if (auto cpu = make_cpu_backend(cfg.model)) {
    evaluator = std::move(*cpu);
  } else if (hooks.make_backend) {
    auto choice = hooks.make_backend(cfg.model);
    evaluator = std::move(choice.backend);
    if (!evaluator)
      no_evaluator = make_error(errc::invalid_state, "cannot evaluate model " + cfg.model.to_string() + ": "
                                                       + choice.note);
  } else {
    no_evaluator = cpu.error();
  }
  auto evaluate = [&](const std::vector<float>& p) -> expected<batch_stats> {
    if (!evaluator)
      return no_evaluator;
    return evaluator->evaluate(p.data(), test.all());
  };
  auto seconds = [&] { return std::chrono::duration<double>(clock_type::now() - start).count(); };

  bool done = false;
  caf::error failure;
  uint32_t finished = 0, failed = 0;
  // The next epoch boundary to evaluate at (a resumed job counts the samples before it).
  auto next_epoch = static_cast<uint32_t>(done_before / train->n + 1);
  uint64_t last_samples = 0;
  double last_progress = 0;
  double last_eval = 0;
  double last_shard_poll = 0;
  double last_record = 0;
  std::map<uint32_t, uint64_t> worker_samples_before;
  if (jobstore)
    for (const auto& w : jobstore->record.workers)
      worker_samples_before[w.id] = w.samples;
  // The job's record for a resume: this run's samples and seconds on top of the earlier
  // runs', the stage the scheduler is in, and each member's batch share and data position
  // (members that have not reported in this run keep their checkpointed entries).
  auto save_progress = [&](uint64_t samples, double secs, const std::vector<wire::worker_stats>& workers) {
    jobstore->record.samples = done_before + samples;
    jobstore->record.seconds = seconds_before + secs;
    auto& rw = jobstore->record.workers;
    for (const auto& w : workers) {
      if (w.steps == 0 || w.position.count == 0)
        continue;
      auto i = std::find_if(rw.begin(), rw.end(), [&](const auto& r) { return r.id == w.worker_id; });
      if (i == rw.end())
        i = rw.insert(rw.end(), job_record::worker{});
      *i = {w.worker_id, w.batch, w.position, worker_samples_before[w.worker_id] + w.samples};
    }
    if (auto stage = sc.stage_out->load(); stage >= 0)
      jobstore->record.stage = to_string(static_cast<ashl_stage>(stage));
    if (auto err = save_job_record(*jobstore->store, jobstore->record))
      spdlog::error("job: saving progress to {} failed: {}", cfg.checkpoint_dir, describe(err));
  };
  std::map<size_t, double> lost_since; // shards lost and not served again yet: since when
  bool stop_sent = false;
  bool lockstep = true;
  if (auto policy = make_policy(cfg.policy, {}))
    lockstep = (*policy)->lockstep();
  // A mid-run evaluation runs in the background on a snapshot, at most one at a time; its
  // point is recorded (at the snapshot's time) once it completes.
  struct pending_eval {
    std::future<expected<batch_stats>> result;
    double epoch = 0, at = 0, loss = 0;
  };
  std::optional<pending_eval> pending;
  auto settle = [&](bool wait) {
    if (!pending || (!wait && pending->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready))
      return;
    auto ev = pending->result.get();
    if (ev) {
      epoch_point pt{pending->epoch, pending->at, ev->accuracy(), pending->loss};
      rep.history.push_back(pt);
      live.test_accuracy = pt.test_accuracy;
      if (recorder)
        recorder->evaluation(pt.seconds, pt.epoch, pt.test_accuracy, pt.train_loss);
      if (hooks.on_epoch)
        hooks.on_epoch(pt);
    }
    pending.reset();
  };
  auto record = [&](std::vector<float> p, double epoch, double at, double loss) {
    pending_eval e{{}, epoch, at, loss};
    e.result = std::async(std::launch::async, [&evaluate, p = std::move(p)] {
      lower_thread_priority();
      return evaluate(p);
    });
    pending = std::move(e);
  };
  // Epoch boundaries and evaluations are checked every tick (a fifth of the evaluation
  // interval, 10-100 ms, so evaluations come when due rather than on a coarser tick);
  // progress lines go out every progress_interval. Workers at their own pace are stopped
  // at the sample budget from here, so they get a 20 ms tick: what they train past the
  // budget is about a tick's worth of samples.
  int64_t tick_ms = cfg.eval_interval > 0
                      ? std::clamp(static_cast<int64_t>(cfg.eval_interval * 1000 / 5), int64_t{10}, int64_t{100})
                      : int64_t{100};
  if (!lockstep)
    tick_ms = std::min<int64_t>(tick_ms, 20);
  const auto tick = std::chrono::milliseconds(tick_ms);
  // The learning-rate schedule follows the epochs trained (a resumed job's included):
  // its factor goes to the shards and, through the scheduler, to the workers whenever it
  // has moved by more than 0.2%. With a time limit, the schedule runs on whichever ends
  // first: the epochs, or the time (its fraction spent counts as that fraction of them).
  lr_schedule schedule;
  schedule.kind = *parse_lr_schedule(cfg.lr_schedule); // validated
  schedule.warmup_epochs = cfg.warmup_epochs;
  const bool scheduled = schedule.kind != lr_schedule::constant || schedule.warmup_epochs > 0;
  float lr_sent = 1.0f;
  auto follow_schedule = [&](uint64_t samples, double now, bool force) {
    const double epoch = schedule_epoch(static_cast<double>(samples) / static_cast<double>(train->n), cfg.epochs,
                                        now, cfg.time_limit);
    const auto f = static_cast<float>(lr_factor(schedule, epoch, cfg.epochs));
    if (!force && std::abs(f - lr_sent) <= 0.002f * std::max(lr_sent, 0.01f))
      return;
    lr_sent = f;
    for (const auto& s : shards)
      self->send(s, lr_atom::value, f);
    self->send(scheduler, lr_atom::value, f);
  };
  if (scheduled)
    follow_schedule(done_before, 0.0, true);
  while (!done) {
    self->receive(
      [&](done_atom, uint32_t f, uint32_t fl) {
        done = true;
        finished = f;
        failed = fl;
      },
      [&](caf::down_msg& dm) {
        size_t index = shards.size();
        for (size_t i = 0; i < shards.size(); ++i)
          if (shards[i].address() == dm.source)
            index = i;
        if (index == shards.size())
          return;
        const auto id = (*ranges)[index].shard_id;
        if (cfg.checkpoint_dir.empty() || cfg.shard_wait <= 0) {
          // The job cannot go on without the shard's parameters.
          failure = make_error(errc::peer_unreachable, "server shard " + std::to_string(id) + " was lost ("
                                                         + to_string(dm.reason) + "); the job stops");
          done = true;
          return;
        }
        lost_since.emplace(index, seconds());
        spdlog::warn("job: server shard {} was lost ({}); waiting up to {:.0f} s for it to be served again "
                     "from its checkpoints: ashlar node --role server --shard {} --join SCHEDULER",
                     id, to_string(dm.reason), cfg.shard_wait, id);
        if (recorder)
          recorder->event("shard lost", "shard " + std::to_string(id));
      },
      [&](shard_atom, uint32_t index, shard_actor& shard, std::string& endpoint) {
        if (index >= shards.size())
          return;
        spdlog::info("job: server shard {} is served again", (*ranges)[index].shard_id);
        shards[index] = shard;
        self->monitor(shards[index]);
        if (lr_sent != 1.0f)
          self->send(shards[index], lr_atom::value, lr_sent);
        lost_since.erase(index);
        self->send(scheduler, shard_atom::value, index, std::move(shard), std::move(endpoint));
      },
      caf::after(tick) >> [] {});
    if (done)
      break;
    for (const auto& [index, since] : lost_since)
      if (seconds() - since > cfg.shard_wait) {
        failure = make_error(errc::peer_unreachable, "server shard " + std::to_string((*ranges)[index].shard_id)
                                                       + " was lost and not served again within "
                                                       + std::to_string(static_cast<int>(cfg.shard_wait))
                                                       + " s; the job stops");
        done = true;
      }
    if (done)
      break;
    wire::cluster_stats stats;
    self->request(profiler, std::chrono::seconds(10), caf::get_atom::value)
      .receive([&](const wire::cluster_stats& s) { stats = s; }, [&](caf::error&) {});
    double now = seconds();
    if (scheduled)
      follow_schedule(done_before + stats.total_samples, now, false);
    if (metrics.endpoint) {
      live.running = true;
      live.epoch = static_cast<double>(done_before + stats.total_samples) / static_cast<double>(train->n);
      // The shards' counters, once a second (each asks every shard).
      if (live.shards.empty() || now - last_shard_poll >= 1.0) {
        live.shards.clear();
        for (const auto& s : shards)
          self->request(s, std::chrono::seconds(5), status_atom::value)
            .receive([&](const wire::shard_status& st) { live.shards.push_back(st); }, [](caf::error&) {});
        last_shard_poll = now;
      }
      live.stats = stats;
      metrics.endpoint->publish(prometheus_text(live));
    }
    if (hooks.on_progress && cfg.progress_interval > 0 && now - last_progress >= cfg.progress_interval) {
      progress_event ev;
      ev.seconds = now;
      ev.samples = stats.total_samples;
      ev.epoch = static_cast<double>(done_before + stats.total_samples) / static_cast<double>(train->n);
      ev.samples_per_second = static_cast<double>(stats.total_samples - last_samples) / (now - last_progress);
      ev.loss = stats.loss;
      ev.lr = cfg.optimizer.lr * lr_sent;
      ev.workers = stats.workers;
      hooks.on_progress(ev);
      last_samples = stats.total_samples;
      last_progress = now;
    }
    // Evaluate once an epoch boundary has been crossed (within a tick of it).
    bool epoch_due = cfg.eval_every_epoch && next_epoch < cfg.epochs
                     && done_before + stats.total_samples >= uint64_t{next_epoch} * train->n;
    bool interval_due = cfg.eval_interval > 0 && now - last_eval >= cfg.eval_interval;
    settle(false);
    if ((epoch_due || interval_due) && !pending && lost_since.empty()) {
      if (auto p = snapshot(self, shards, num_params))
        record(std::move(*p), static_cast<double>(done_before + stats.total_samples) / train->n, now, stats.loss);
      // Interval evaluations keep to their grid (0.25, 0.5, ... s for 0.25), unless one
      // still running made them fall behind by more than an interval.
      last_eval = interval_due ? std::max(last_eval + cfg.eval_interval, now - cfg.eval_interval) : now;
      while (next_epoch <= cfg.epochs && done_before + stats.total_samples >= uint64_t{next_epoch} * train->n)
        ++next_epoch;
    }
    // Workers at their own pace stop when their samples together reach the budget; any
    // job stops at its time limit. Each finishes its step and leaves.
    bool out_of_budget = !lockstep && done_before + stats.total_samples >= budget;
    // The job's progress, for a resume: at most as far as the shards' checkpoints are.
    if (jobstore && now - last_record >= 1.0) {
      save_progress(stats.total_samples, now, stats.workers);
      last_record = now;
    }
    bool out_of_time = cfg.time_limit > 0 && now >= cfg.time_limit;
    bool asked = !stop_sent && hooks.stop_requested && hooks.stop_requested();
    if (!stop_sent && (out_of_budget || out_of_time || asked)) {
      stop_sent = true;
      if (asked) {
        rep.stopped_early = true;
        spdlog::info("job: asked to stop; stopping the workers after their current step");
        if (recorder)
          recorder->event("stop requested", "");
      } else if (out_of_time) {
        spdlog::info("job: time limit of {} s reached; stopping the workers", cfg.time_limit);
      }
      self->request(scheduler, std::chrono::seconds(10), wire::ctl_request{wire::ctl_request::shutdown, 0, 0})
        .receive([](const std::string&) {}, [](caf::error&) {});
    }
  }
  rep.seconds = seconds();
  settle(true); // the last mid-run evaluation, if one is still running

  if (failure) {
    stop_all();
    return failure;
  }
  // Final figures: parameters, shard counters, per-worker statistics.
  auto params = snapshot(self, shards, num_params);
  if (!params)
    failure = params.error();
  uint64_t staleness_sum = 0, applied = 0;
  for (const auto& s : shards)
    self->request(s, std::chrono::seconds(10), status_atom::value)
      .receive(
        [&](const wire::shard_status& st) {
          rep.versions += st.version;
          rep.dropped += st.dropped;
          staleness_sum += st.staleness_sum;
          applied += st.applied + st.dropped;
        },
        [&](caf::error&) {});
  rep.mean_staleness = applied ? static_cast<double>(staleness_sum) / applied : 0;
  // The clean end: every shard checkpoints its last version, then the job's record.
  if (jobstore) {
    for (const auto& s : shards)
      self->request(s, std::chrono::seconds(60), checkpoint_atom::value)
        .receive([](uint64_t) {},
                 [&](caf::error& err) { spdlog::error("job: the final checkpoint failed: {}", describe(err)); });
  }
  std::vector<wire::worker_stats> last_workers;
  self->request(profiler, std::chrono::seconds(10), caf::get_atom::value)
    .receive(
      [&](const wire::cluster_stats& s) {
        last_workers = s.workers;
        rep.samples = s.total_samples;
        for (const auto& w : s.workers) {
          worker_summary ws;
          ws.worker_id = w.worker_id;
          ws.steps = w.steps;
          ws.samples = w.samples;
          ws.samples_per_second = w.samples_per_second;
          ws.compute_seconds = w.total_compute_seconds;
          ws.wait_seconds = w.total_wait_seconds;
          ws.stage_changes = w.stage_changes;
          rep.per_worker.push_back(ws);
          rep.bytes += w.bytes;
          rep.dense_bytes += w.dense_bytes;
        }
      },
      [&](caf::error&) {});
  rep.samples_per_second = rep.seconds > 0 ? rep.samples / rep.seconds : 0;
  if (jobstore)
    save_progress(rep.samples, rep.seconds, last_workers);

  for (auto& s : shards)
    self->demonitor(s.address());
  stop_all();

  if (failure)
    return failure;
  if (finished == 0)
    return make_error(errc::invalid_state, "all " + std::to_string(failed)
                                             + " workers failed; the log above says why");
  if (failed > 0)
    spdlog::warn("job: {} of {} workers failed during training", failed, finished + failed);
  auto ev = evaluate(*params);
  if (!ev)
    return ev.error();
  rep.test_accuracy = ev->accuracy();
  rep.test_loss = ev->mean_loss();
  rep.history.push_back(epoch_point{static_cast<double>(rep.samples) / train->n, rep.seconds,
                                    rep.test_accuracy, 0.0});
  if (recorder)
    recorder->evaluation(rep.seconds, rep.history.back().epoch, rep.test_accuracy, rep.test_loss);
  if (final_params)
    *final_params = std::move(*params);
  return rep;
}

}  // namespace ashlar::actors

