// A job whose shard is lost and served again, in one process: the job driver takes a
// replacement only once it answers and is back at the last committed cut.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "actors/job_driver.hpp"
#include "actors/server_shard.hpp"
#include "actors/worker.hpp"
#include "runtime/policy/ring.hpp"
#include "runtime/store/checkpoint.hpp"
#include "runtime/store/kv_store.hpp"
#include "../runtime/temp_dir.hpp"

using namespace ashlar;
using namespace ashlar::actors;
using namespace std::chrono_literals;

namespace {

// Shards with checkpoints and CPU workers in this process, as local_job's placement, with
// the shards and the driver kept where the test can reach them.
class test_placement final : public job_placement {
public:
  explicit test_placement(caf::actor_system& sys) : sys_(sys) {}

  expected<std::vector<shard_actor>> make_shards(const std::vector<shard_range>& ranges,
                                                 const std::vector<float>& init, const train_config& cfg,
                                                 double average_samples) override {
    for (const auto& r : ranges) {
      auto core = make_core(r, std::vector<float>(init.begin() + r.begin, init.begin() + r.end), cfg,
                            average_samples);
      auto p = open_shard_persistence(cfg.checkpoint_dir, cfg.checkpoint_keep, false, *core);
      if (!p)
        return p.error();
      shards.push_back(spawn_shard(sys_, std::move(core), std::move(*p)));
    }
    return shards;
  }

  caf::error start_workers(const train_config& cfg, const scheduler_actor& scheduler, const profiler_actor& profiler,
                           std::shared_ptr<const dataset> train) override {
    worker_config base; // (on the CPU)
    base.scheduler = scheduler;
    base.profiler = profiler;
    base.data = std::move(train);
    workers_ = start_local_workers(sys_, cfg.workers, base);
    return caf::none;
  }

  void on_job_end() override {
    for (auto& w : workers_)
      caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  }

  static std::unique_ptr<shard_core> make_core(const shard_range& r, std::vector<float> params,
                                               const train_config& cfg, double average_samples) {
    auto policy = make_policy(cfg.policy, cfg.policy_settings);
    REQUIRE(policy);
    auto core = std::make_unique<shard_core>(r, std::move(params), shard_optimizer(cfg.policy, cfg.optimizer),
                                             std::move(*policy));
    core->keep_average(average_samples);
    return core;
  }

  caf::actor driver() const { return driver_; }
  std::vector<shard_actor> shards;

private:
  caf::actor_system& sys_;
  std::vector<worker_actor> workers_;
};

// A shard whose node is gone: it takes every request and answers none.
shard_actor silent_shard(caf::actor_system& sys) {
  return sys.spawn([](shard_actor::pointer self) -> shard_actor::behavior_type {
    return {
      [self](const wire::pull_request&) { return self->make_response_promise<wire::pull_reply>(); },
      [self](const wire::push&) { return self->make_response_promise<wire::push_ack>(); },
      [self](const wire::membership_change&) { return self->make_response_promise<uint64_t>(); },
      [self](status_atom) { return self->make_response_promise<wire::shard_status>(); },
      [](tune_atom, uint32_t, bool) {},
      [](bound_atom, uint64_t, float) {},
      [](lr_atom, float) {},
      [self](checkpoint_atom, uint64_t, uint64_t, uint64_t) { return self->make_response_promise<uint64_t>(); },
      [self](checkpoint_atom, caf::get_atom) { return self->make_response_promise<std::vector<uint64_t>>(); },
      [self](restore_atom, uint64_t) { return self->make_response_promise<uint64_t>(); },
      [self](restore_atom, const std::vector<float>&) { return self->make_response_promise<uint64_t>(); },
      [self](checkpoint_atom) { return self->make_response_promise<uint64_t>(); },
    };
  });
}

class system_config : public caf::actor_system_config {
public:
  system_config() { register_types(*this); }
};

}  // namespace

TEST_CASE("a lost shard's notice that names a replacement which never answers is passed over, and the replacement "
          "served after it is taken back to the last committed cut: the job trains its epochs") {
  test::temp_dir dir;
  train_config cfg;
  cfg.data_dir = "/usr/share/datasets/fashion-mnist";
  cfg.train_limit = 8000;
  cfg.test_limit = 2000;
  cfg.workers = 2;
  cfg.servers = 2;
  cfg.policy = "bsp";
  cfg.epochs = 4;
  cfg.batch_size = 32;
  cfg.optimizer.lr = 0.05f;
  cfg.progress_interval = 0;
  cfg.eval_every_epoch = true;
  cfg.log_level = "warn";
  cfg.gpus = "none";
  cfg.checkpoint_dir = dir.path();
  cfg.checkpoint_every = 20;
  cfg.shard_wait = 30;
  REQUIRE_FALSE(validate(cfg));
  system_config sys_cfg;
  caf::actor_system sys{sys_cfg};
  test_placement where{sys};
  std::atomic<bool> struck{false};
  std::atomic<bool> replaced{false};
  std::string fault_error; // set by the fault thread, read after it is joined
  uint64_t committed = 0;  // the newest cut the job had committed when shard 1 was lost
  std::thread fault;
  actors::job_hooks hooks;
  hooks.on_epoch = [&](const epoch_point& p) {
    // After the first epoch: shard 1 is lost, a stale notice names a shard that never
    // answers, and then the real replacement is served. (This runs in the driver's
    // thread, the test's own; the fault's messages go from a thread of their own.)
    if (p.epoch < 1 || struck.exchange(true))
      return;
    auto job = open_rocksdb_store(cfg.checkpoint_dir + "/job", open_mode::read_only);
    REQUIRE(job);
    auto cuts = load_job_cuts(**job);
    REQUIRE(cuts);
    for (const auto& c : *cuts)
      committed = std::max(committed, c.cut);
    auto ranges = split_ranges(cfg.model.num_params(), cfg.servers);
    REQUIRE(ranges);
    const auto r = (*ranges)[1];
    auto core = std::make_shared<std::unique_ptr<shard_core>>(
      test_placement::make_core(r, std::vector<float>(r.size(), 0.0f), cfg, 0));
    fault = std::thread([&, core] {
      caf::scoped_actor self{sys};
      auto lost = where.shards[1];
      self->monitor(lost);
      caf::anon_send_exit(lost, caf::exit_reason::kill);
      self->receive([](const caf::down_msg&) {});
      auto driver = where.driver();
      self->send(driver, shard_atom::value, uint32_t{1}, silent_shard(sys), std::string{"10.0.0.9:7000"});
      // The lost shard's store closes with the actor; served again from it, as a node does.
      expected<shard_persistence> ps = make_error(errc::invalid_state, "not opened");
      for (int i = 0; i < 200 && !ps; ++i) {
        ps = open_shard_persistence(cfg.checkpoint_dir, cfg.checkpoint_keep, true, **core);
        if (!ps)
          std::this_thread::sleep_for(20ms);
      }
      if (!ps) {
        fault_error = describe(ps.error());
        return;
      }
      auto again = spawn_shard(sys, std::move(*core), std::move(*ps));
      self->send(driver, shard_atom::value, uint32_t{1}, again, std::string{});
      replaced = true;
    });
  };
  auto report = run_job(sys, cfg, where, hooks);
  if (fault.joinable())
    fault.join();
  INFO(fault_error);
  REQUIRE(report);
  CHECK(struck);
  CHECK(replaced);
  CHECK(committed > 0); // the replacement had a committed cut to go back to
  // Every epoch trained (a resume from the cut trains some samples again), and the model
  // works: the silent shard was never given to the workers.
  CHECK(report->samples >= 4 * 8000);
  CHECK(report->test_accuracy > 0.7);
}
