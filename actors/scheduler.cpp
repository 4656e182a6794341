#include "actors/scheduler.hpp"

#include <cmath>

#include <functional>
#include <map>
#include <memory>

#include <optional>

#include <spdlog/spdlog.h>

#include "runtime/alloc/batch_allocation.hpp"
#include "runtime/policy/adaptive_k.hpp"
#include "runtime/metrics/recorder.hpp"
#include "runtime/predict/speed_predictor.hpp"
#include "runtime/policy/adsp.hpp"
#include "runtime/policy/ashl.hpp"

namespace ashlar::actors {

namespace {

struct member {
  uint32_t id = 0;
  caf::actor_addr addr;
  caf::strong_actor_ptr handle;
  std::string host;
  uint64_t steps = 0; // assigned
  bool left = false;
  bool failed = false;
};

struct scheduler_state {
  static constexpr const char* name = "ashlar.scheduler";
  scheduler_config cfg;
  std::map<uint32_t, member> members;
  uint32_t next_id = 0;
  uint32_t registered = 0;
  bool done_sent = false;
  // Registrations answered only once expected_workers have joined, so every worker of
  // the first round starts from version 0 with the full membership in place.
  std::vector<std::function<void()>> start_barrier;
  bool started = false;
  bool stopping = false; // a shutdown request stopped every worker
  bool lockstep = true;  // the policy's: see sync_policy::lockstep
  float lr_factor = 1.0f; // the learning-rate schedule's, as the job driver last sent it
  // ADSP: plans each worker's local steps per commit from the profiler's times.
  std::optional<adsp_planner> adsp;
  std::map<uint32_t, uint32_t> local_steps; // as last sent
  // Adaptive k: chooses k and sync/async from the profiler's times and the shards' staleness.
  std::optional<adaptive_k_planner> adaptive;
  adaptive_k_choice tuned;             // as last sent
  uint64_t staleness_sum = 0, staleness_n = 0; // shard 0's counters at the last tick
  // ASHL: the stage machine, and each worker's communication time per commit as
  // profiled while every step communicated.
  std::optional<ashl_planner> ashl;
  std::map<uint32_t, double> ashl_comm;
  // Batch allocation (train.allocation other than equal).
  std::map<uint32_t, uint32_t> shares;              // as last sent
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> data_parts; // begin, count: as last sent
  std::map<uint32_t, gru_predictor> predictors;     // "predicted": per worker
  bool allocation_frozen = false;                   // "proportional": set once
};

using scheduler_pointer = scheduler_actor::stateful_pointer<scheduler_state>;

// Records a job event in the run's trace and metrics, when they are kept.
void record(scheduler_pointer self, const std::string& name, const std::string& detail, int64_t worker = -1) {
  if (self->state.cfg.recorder)
    self->state.cfg.recorder->event(name, detail, worker);
}

constexpr auto ack_timeout = std::chrono::seconds(30);
constexpr auto adsp_replan_interval = std::chrono::milliseconds(500);

// Sends `m` to every shard and the profiler; calls `then(ok)` once all have answered.
void broadcast(scheduler_pointer self, const wire::membership_change& m,
               std::function<void(bool)> then_fn) {
  auto then = std::make_shared<std::function<void(bool)>>(std::move(then_fn));
  auto& cfg = self->state.cfg;
  auto pending = std::make_shared<size_t>(cfg.shards.size() + 1);
  auto ok = std::make_shared<bool>(true);
  auto one = [=] {
    if (--*pending == 0)
      (*then)(*ok);
  };
  auto fail = [=](caf::error& err) {
    spdlog::error("scheduler: membership change for worker {} not acknowledged: {}", m.worker_id,
                  describe(err));
    *ok = false;
    one();
  };
  for (auto& shard : cfg.shards)
    self->request(shard, ack_timeout, m).then([=](caf::ok_atom) { one(); }, fail);
  self->request(cfg.profiler, ack_timeout, m).then([=](caf::ok_atom) { one(); }, fail);
}

void check_done(scheduler_pointer self) {
  auto& st = self->state;
  if (st.done_sent || (!st.started && st.registered < st.cfg.job.workers))
    return;
  uint32_t finished = 0, failed = 0;
  for (const auto& [id, m] : st.members) {
    if (!m.left)
      return;
    (m.failed ? failed : finished) += 1;
  }
  st.done_sent = true;
  spdlog::info("scheduler: all workers done ({} finished, {} failed)", finished, failed);
  if (st.cfg.observer)
    caf::anon_send(st.cfg.observer, done_atom::value, finished, failed);
}

void break_ring(scheduler_pointer self, uint32_t lost);

void on_leave(scheduler_pointer self, uint32_t id, bool failed, const std::string& reason) {
  auto& st = self->state;
  auto i = st.members.find(id);
  if (i == st.members.end() || i->second.left)
    return;
  i->second.left = true;
  i->second.failed = failed;
  if (failed)
    spdlog::warn("scheduler: worker {} removed: {}", id, reason);
  else
    spdlog::info("scheduler: worker {} left: {}", id, reason);
  record(self, failed ? "worker failed" : "worker left", reason, id);
  wire::membership_change m;
  m.kind = failed ? wire::membership_change::fail : wire::membership_change::leave;
  m.worker_id = id;
  m.reason = reason;
  if (failed && st.started && st.cfg.job.policy == "ring")
    break_ring(self, id);
  broadcast(self, m, [=](bool) { check_done(self); });
}

// Decentralized mode: the workers present at the start form a ring in id order; each
// learns its rank and the next worker. A ring with ranks 0 tells a worker that the ring
// broke (a member failed) and training cannot go on.
void form_ring(scheduler_pointer self) {
  auto& st = self->state;
  std::vector<const member*> ring;
  for (const auto& [id, m] : st.members)
    if (!m.left)
      ring.push_back(&m);
  const auto n = static_cast<uint32_t>(ring.size());
  for (uint32_t r = 0; r < n; ++r)
    self->send(caf::actor_cast<worker_actor>(ring[r]->handle), ring_atom::value, r, n,
               caf::actor_cast<caf::actor>(ring[(r + 1) % n]->handle));
  spdlog::info("scheduler: ring of {} workers formed", n);
}

void break_ring(scheduler_pointer self, uint32_t lost) {
  for (const auto& [id, m] : self->state.members)
    if (!m.left)
      self->send(caf::actor_cast<worker_actor>(m.handle), ring_atom::value, lost, uint32_t{0}, caf::actor{});
}

void start_training(scheduler_pointer self) {
  auto& st = self->state;
  if (st.started)
    return;
  st.started = true;
  if (st.start_barrier.size() < st.cfg.job.workers)
    spdlog::warn("scheduler: only {} of {} workers joined within the start timeout; training "
                 "starts with them",
                 st.start_barrier.size(), st.cfg.job.workers);
  else
    spdlog::info("scheduler: {} workers joined, training starts", st.start_barrier.size());
  record(self, "training starts", std::to_string(st.start_barrier.size()) + " workers");
  for (auto& f : st.start_barrier)
    f();
  st.start_barrier.clear();
  if (st.cfg.job.policy == "ring")
    form_ring(self);
  // The first plan as soon as the profiler has a few steps of each worker.
  if (st.ashl)
    for (const auto& shard : st.cfg.shards)
      self->send(shard, bound_atom::value, st.ashl->allowed_gap(), st.ashl->lr_scale());
  if (st.adsp || st.adaptive || st.ashl || st.cfg.job.allocation != "equal")
    self->delayed_send(self, std::chrono::milliseconds(200), tick_atom::value);
}

// Batch allocation: shares of the global batch proportional to each live worker's
// speed (1 / compute seconds per sample): profiled once ("proportional"), smoothed
// observations ("adaptive"), or a GRU's prediction of the next value ("predicted").
void reallocate(scheduler_pointer self) {
  self->request(self->state.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        if (st.done_sent || st.stopping || st.allocation_frozen)
          return;
        const auto& mode = st.cfg.job.allocation;
        std::vector<uint32_t> ids;
        std::vector<double> speeds;
        uint64_t max_steps = 0;
        std::map<uint32_t, uint64_t> steps;
        for (const auto& w : stats.workers) {
          auto m = st.members.find(w.worker_id);
          if (m == st.members.end() || m->second.left || w.steps < 3 || w.compute_per_sample <= 0)
            continue;
          double per_sample = w.compute_per_sample;
          if (mode == "predicted") {
            auto& p = st.predictors[w.worker_id];
            p.observe(per_sample);
            per_sample = std::max(1e-9, p.predict());
          }
          ids.push_back(w.worker_id);
          speeds.push_back(1.0 / per_sample);
          steps[w.worker_id] = w.steps;
          max_steps = std::max(max_steps, w.steps);
        }
        size_t live = 0;
        for (const auto& [id, m] : st.members)
          live += m.left ? 0 : 1;
        if (ids.empty() || ids.size() < live)
          return; // not every worker measured yet
        auto global = static_cast<uint32_t>(st.cfg.job.batch_size * ids.size());
        auto shares = proportional_shares(global, speeds);
        if (!shares)
          return;
        // The data follows the batch: each worker's part of the training set is in
        // proportion to its share, so a pass over the set is one pass for the job, each
        // sample once per epoch, as with equal batches. (Until the first shares, every
        // worker draws from the whole set, and samples repeat across workers within an
        // epoch.)
        std::string text;
        bool changed = false;
        uint64_t begin = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
          uint64_t end = i + 1 == ids.size() ? st.cfg.train_size : begin + st.cfg.train_size * (*shares)[i] / global;
          auto part = std::make_pair(begin, std::max<uint64_t>(1, end - begin));
          text += (text.empty() ? "" : ", ") + std::to_string(ids[i]) + ":" + std::to_string((*shares)[i]) + " ["
                  + std::to_string(begin) + ", " + std::to_string(end) + ")";
          begin = end;
          if (st.shares[ids[i]] == (*shares)[i] && st.data_parts[ids[i]] == part)
            continue;
          changed = true;
          st.shares[ids[i]] = (*shares)[i];
          st.data_parts[ids[i]] = part;
          // Lockstep workers switch together, a few rounds ahead; the others at their next step.
          uint64_t from = st.lockstep ? max_steps + 3 : steps[ids[i]] + 1;
          self->send(caf::actor_cast<worker_actor>(st.members[ids[i]].handle), batch_atom::value, (*shares)[i],
                     from, std::min(part.first, st.cfg.train_size - 1), part.second);
        }
        if (changed)
          record(self, "batch shares", text);
        if (mode == "proportional") {
          st.allocation_frozen = true;
          spdlog::info("scheduler: batch shares from profiled speed: {}", text);
        } else {
          spdlog::debug("scheduler: batch shares ({}): {}", mode, text);
        }
      },
      [=](caf::error& err) { spdlog::warn("scheduler: batch allocation skipped: {}", describe(err)); });
}

// Adaptive k: every tick, k from the spread of the workers' iteration times and the
// mode from the staleness of recent pushes (shard 0's counters); shards retune at their
// next round boundary.
void retune_adaptive(scheduler_pointer self) {
  auto& st = self->state;
  self->request(st.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        if (st.done_sent || st.stopping || st.cfg.shards.empty())
          return;
        std::vector<worker_timing> times;
        for (const auto& w : stats.workers)
          if (auto m = st.members.find(w.worker_id); m != st.members.end() && !m->second.left)
            times.push_back(worker_timing{w.worker_id, std::max(0.0, w.step_seconds - w.wait_seconds)});
        self->request(st.cfg.shards.front(), ack_timeout, status_atom::value)
          .then(
            [=](const wire::shard_status& s) {
              auto& st = self->state;
              uint64_t n = s.applied + s.dropped;
              double recent = n > st.staleness_n
                                ? static_cast<double>(s.staleness_sum - st.staleness_sum) / (n - st.staleness_n)
                                : 0.0;
              st.staleness_sum = s.staleness_sum;
              st.staleness_n = n;
              auto choice = st.adaptive->choose(times, recent);
              if (!(choice == st.tuned)) {
                st.tuned = choice;
                spdlog::info("scheduler: adaptive policy now {} with k = {} (recent staleness {:.2f})",
                             choice.async ? "k-async" : "k-sync", choice.k, recent);
                record(self, choice.async ? "k-async" : "k-sync", "k = " + std::to_string(choice.k));
                for (const auto& shard : st.cfg.shards)
                  self->send(shard, tune_atom::value, choice.k, choice.async);
              }
            },
            [=](caf::error& err) { spdlog::warn("scheduler: adaptive tuning skipped: {}", describe(err)); });
      },
      [=](caf::error& err) { spdlog::warn("scheduler: adaptive tuning skipped: {}", describe(err)); });
}

// Sends each worker whose planned local steps per commit changed its new count.
void send_local_steps(scheduler_pointer self, const std::map<uint32_t, uint32_t>& plan) {
  auto& st = self->state;
  for (const auto& [id, h] : plan) {
    if (st.local_steps[id] == h)
      continue;
    st.local_steps[id] = h;
    self->send(caf::actor_cast<worker_actor>(st.members[id].handle), local_steps_atom::value, h);
  }
}

// ADSP: from the profiler's per-step compute times, each live worker's local steps per
// commit, so all commit about once per period; the period follows the loss (see
// adsp_planner). Runs every adsp_replan_interval while the job runs.
void replan_adsp(scheduler_pointer self) {
  self->request(self->state.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        if (st.done_sent || st.stopping)
          return;
        st.adsp->observe(stats.elapsed_seconds, stats.loss);
        std::map<worker_id, double> times;
        for (const auto& w : stats.workers)
          if (auto m = st.members.find(w.worker_id); m != st.members.end() && !m->second.left)
            times[w.worker_id] = w.compute_seconds;
        send_local_steps(self, st.adsp->local_steps(times));
        spdlog::debug("scheduler: adsp commit period {:.3f} s", st.adsp->period());
      },
      [=](caf::error& err) { spdlog::warn("scheduler: adsp planning skipped: {}", describe(err)); });
}

// The fraction of each range a push carries (0: dense).
double push_topk_ratio(const train_config& job) {
  return job.policy == "ring"   ? 0.0 // its pushes mirror the model
         : job.topk_ratio > 0   ? job.topk_ratio
         : job.policy == "ashl" ? job.ashl.topk_ratio
                                : 0.0;
}

// ASHL's pulls: train.pull_topk_ratio when set, else what the planner decided.
float ashl_pull_ratio(const scheduler_state& st) {
  return st.cfg.job.pull_topk_ratio > 0 ? static_cast<float>(st.cfg.job.pull_topk_ratio) : st.ashl->pull_ratio();
}

// ASHL: feeds the stage machine the profiler's numbers. A stage change is an event:
// logged, sent to every shard (the allowed gap) and every live worker (the stage and its
// local steps). Each worker's local steps follow its measured step time (H_i x t_i +
// comm_i equal across workers), a worker that joined late included, once it has times.
void replan_ashl(scheduler_pointer self) {
  self->request(self->state.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        if (st.done_sent || st.stopping)
          return;
        std::vector<ashl_worker> live;
        for (const auto& w : stats.workers) {
          auto m = st.members.find(w.worker_id);
          if (m == st.members.end() || m->second.left)
            continue;
          // Communication per step, averaged by the profiler. Every step commits while
          // profiling; with H local steps per commit a step carries 1/H of a commit's, so
          // the commit's is H times the figure. It is measured again all the time (smoothed
          // over replans): what a commit costs changes with the plan, with compressed
          // pulls, and with what else shares the network.
          double comm = std::max(0.0, w.step_seconds - w.compute_seconds - w.wait_seconds);
          auto h = st.local_steps.find(w.worker_id);
          auto c = st.ashl_comm.find(w.worker_id);
          if (st.ashl->stage() == ashl_stage::profiling || c == st.ashl_comm.end() || h == st.local_steps.end())
            st.ashl_comm[w.worker_id] = comm;
          else
            c->second = 0.7 * c->second + 0.3 * comm * std::max<uint32_t>(1, h->second);
          live.push_back(ashl_worker{w.worker_id, w.compute_seconds, st.ashl_comm[w.worker_id], w.steps});
        }
        const bool profiling = st.ashl->stage() == ashl_stage::profiling;
        auto change = st.ashl->observe(stats.elapsed_seconds, stats.loss, live);
        if (profiling && change && st.cfg.job.pull_topk_ratio <= 0 && st.ashl->pull_ratio() > 0) {
          // Pulls are compressed from now on: until measured again, a commit's
          // communication is taken to shrink with its bytes (a delta read moves 8 bytes
          // for each of pull_ratio x n entries instead of 4 bytes for each of n).
          const double push = push_topk_ratio(st.cfg.job) > 0 ? 2 * push_topk_ratio(st.cfg.job) : 1.0;
          const double factor = (push + 2 * st.ashl->pull_ratio()) / (push + 1);
          for (auto& w : live)
            w.comm_s = st.ashl_comm[w.id] *= factor;
        }
        auto steps = st.ashl->local_steps(live);
        if (change) {
          spdlog::info("scheduler: ASHL stage {} at {:.1f} s (change {}): {}", to_string(change->to),
                       change->t_s, st.ashl->events().size(), change->why);
          record(self, "stage " + std::string{to_string(change->to)}, change->why);
          if (st.cfg.stage_out)
            st.cfg.stage_out->store(static_cast<int>(change->to));
          for (const auto& shard : st.cfg.shards)
            self->send(shard, bound_atom::value, st.ashl->allowed_gap(), st.ashl->lr_scale());
          std::string plan, basis;
          for (const auto& w : live)
            basis += fmt::format("{}{}: {:.1f} + {:.1f} ms", basis.empty() ? "" : ", ", w.id, 1e3 * w.step_s,
                                 1e3 * w.comm_s);
          for (const auto& [id, h] : steps) {
            plan += (plan.empty() ? "" : ", ") + std::to_string(id) + ":" + std::to_string(h);
            st.local_steps[id] = h;
            self->send(caf::actor_cast<worker_actor>(st.members[id].handle), stage_atom::value,
                       std::string{to_string(change->to)}, h, st.ashl->lr_scale(), ashl_pull_ratio(st));
          }
          spdlog::info("scheduler: ASHL {}: allowed gap {} commits, local steps per commit {} (from compute per "
                       "step + communication per commit: {})",
                       to_string(change->to), st.ashl->allowed_gap(), plan, basis);
          return;
        }
        send_local_steps(self, steps);
      },
      [=](caf::error& err) { spdlog::warn("scheduler: ashl planning skipped: {}", describe(err)); });
}

// A resumed job: the worker taking a checkpointed member's id starts from that member's
// batch share and data position (its part, the cursor's seed, passes and offset), so
// the job goes on where it stopped rather than profiling and reshuffling afresh.
void resume_position(scheduler_pointer self, wire::assignment& a, const scheduler_config::resumed_worker& r) {
  auto& st = self->state;
  const auto& p = r.position;
  if (r.batch == 0 || p.count == 0 || p.begin + p.count > st.cfg.train_size) {
    spdlog::warn("scheduler: worker {}'s checkpointed data position [{}, {}) does not fit the {} training samples; "
                 "it starts afresh", a.worker_id, p.begin, p.begin + p.count, st.cfg.train_size);
    return;
  }
  a.data_begin = p.begin;
  a.data_count = p.count;
  a.seed = p.seed;
  a.cursor_epoch = p.epoch;
  a.cursor_pos = p.pos;
  if (st.cfg.job.allocation != "equal") {
    a.batch_size = r.batch;
    st.shares[a.worker_id] = r.batch;
    st.data_parts[a.worker_id] = {p.begin, p.count};
  }
}

scheduler_actor::behavior_type scheduler_behavior(scheduler_pointer self, scheduler_config cfg) {
  self->state.cfg = std::move(cfg);
  if (auto policy = make_policy(self->state.cfg.job.policy, {}))
    self->state.lockstep = (*policy)->lockstep();
  if (self->state.cfg.job.policy == "adsp")
    self->state.adsp.emplace();
  if (self->state.cfg.job.policy == "adaptive")
    self->state.adaptive.emplace();
  if (self->state.cfg.job.policy == "ashl") {
    if (auto p = ashl_planner::make(self->state.cfg.job.ashl)) {
      self->state.ashl.emplace(std::move(*p));
      if (self->state.cfg.resume_stage == "shl")
        self->state.ashl->resume_in(ashl_stage::shl);
    }
    else
      spdlog::error("scheduler: {}", describe(p.error())); // validated with the config before
  }
  if (self->state.cfg.job.allocation == "proportional" && !self->state.cfg.resume_workers.empty()) {
    // Shares profiled once per job: a resumed job keeps the checkpointed job's, when they
    // cover every expected worker and add up to the global batch.
    const auto& rw = self->state.cfg.resume_workers;
    uint64_t sum = 0;
    std::string text;
    bool whole = true;
    for (uint32_t id = 0; id < self->state.cfg.job.workers; ++id) {
      auto r = rw.find(id);
      whole = whole && r != rw.end() && r->second.batch > 0;
      if (!whole)
        break;
      sum += r->second.batch;
      text += (text.empty() ? "" : ", ") + std::to_string(id) + ":" + std::to_string(r->second.batch);
    }
    if (whole && sum == uint64_t{self->state.cfg.job.batch_size} * self->state.cfg.job.workers) {
      self->state.allocation_frozen = true;
      spdlog::info("scheduler: batch shares restored from the checkpointed job: {}", text);
    }
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    for (auto& [id, m] : self->state.members)
      if (m.addr == dm.source && !m.left)
        on_leave(self, id, true, "worker actor terminated: " + to_string(dm.reason));
  });
  return {
    [=](const wire::register_worker& req)
      -> caf::result<wire::assignment, std::vector<shard_actor>> {
      auto& st = self->state;
      const auto& cfg = st.cfg;
      if (st.started && cfg.job.policy == "ring")
        return make_error(errc::invalid_state, "the ring is formed when training starts; a worker "
                                                "cannot join a decentralized (ring) job mid-run");
      uint32_t id = st.next_id;
      if (req.requested_id != wire::any_worker && st.members.count(req.requested_id) == 0)
        id = req.requested_id;
      while (st.members.count(st.next_id) > 0 || st.next_id == id)
        ++st.next_id;
      // The first expected_workers ids own fixed data slots, so a run is reproducible
      // whatever order the workers register in.
      uint32_t slot = id < cfg.job.workers ? id : st.registered % cfg.job.workers;
      ++st.registered;
      wire::assignment a;
      a.worker_id = id;
      a.shards = cfg.ranges;
      a.model = cfg.job.model;
      a.batch_size = cfg.job.batch_size;
      uint64_t n = cfg.train_size, k = cfg.job.workers;
      a.data_begin = n * slot / k;
      a.data_count = n * (slot + 1) / k - a.data_begin;
      uint64_t per_epoch = (a.data_count + cfg.job.batch_size - 1) / cfg.job.batch_size;
      a.steps = per_epoch * cfg.job.epochs;
      if (cfg.job.allocation != "equal") {
        // Shares change while training: every worker samples the whole set (its own
        // seed) until its first share comes with its part of the set; a lockstep job
        // runs epochs x set / global batch rounds.
        a.data_begin = 0;
        a.data_count = n;
        uint64_t global = uint64_t{cfg.job.batch_size} * k;
        a.steps = (n * cfg.job.epochs + global - 1) / global;
      }
      if (!st.lockstep) {
        // Workers run at their own pace over their share (repeating it as needed); the
        // driver ends the job when their samples together reach the budget.
        a.steps = (n * cfg.job.epochs + cfg.job.batch_size - 1) / cfg.job.batch_size;
      }
      if (cfg.remaining < 1.0) // a resumed job trains what is left
        a.steps = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(static_cast<double>(a.steps) * cfg.remaining)));
      a.local_steps = 1;
      a.local_lr = cfg.job.optimizer.lr;
      // A commit counts as one worker's share of a model average.
      // Policies with commits (adsp, ashl) scale every commit alike, one step or many;
      // for the others a push is the step's gradient.
      const bool commits = cfg.job.policy == "adsp" || cfg.job.policy == "ashl";
      a.commit_scale = !commits                  ? 1.0f
                       : cfg.job.commit_scale > 0 ? static_cast<float>(cfg.job.commit_scale)
                                                  : 1.0f / static_cast<float>(std::max<uint32_t>(1, cfg.job.workers));
      a.seed = cfg.job.seed * 1000003ull + id;
      a.policy = cfg.job.policy;
      a.data_endpoints = cfg.data_endpoints;
      a.data_key = cfg.data_key;
      a.chunk_floats = cfg.job.chunk_floats;
      a.topk_ratio = static_cast<float>(push_topk_ratio(cfg.job));
      // Pull compression: as configured; ASHL decides once profiling ends (stage_atom).
      a.pull_topk_ratio = static_cast<float>(cfg.job.pull_topk_ratio);
      a.overlap_commits = cfg.job.overlap_commits;
      a.momentum = cfg.job.optimizer.momentum;
      a.weight_decay = cfg.job.optimizer.weight_decay;
      a.chunks_in_flight = cfg.job.chunks_in_flight;
      // A lost shard can come back from its checkpoints: workers wait for it, bounded.
      a.shard_wait_s = cfg.job.checkpoint_dir.empty() ? 0.0 : cfg.job.shard_wait;
      a.contention = for_worker(cfg.contention, id);
      if (auto r = cfg.resume_workers.find(id); r != cfg.resume_workers.end())
        resume_position(self, a, r->second);
      if (!cfg.job.speeds.empty())
        a.pace_ns_per_sample = static_cast<uint64_t>(cfg.job.sample_ms * 1e6 / cfg.job.speeds[id % cfg.job.speeds.size()]);
      member m;
      m.id = id;
      m.addr = caf::actor_cast<caf::actor_addr>(self->current_sender());
      m.handle = self->current_sender();
      m.host = req.host;
      m.steps = a.steps;
      st.members[id] = m;
      if (auto sender = self->current_sender())
        self->monitor(sender);
      if (st.lr_factor != 1.0f)
        self->send(caf::actor_cast<worker_actor>(m.handle), lr_atom::value, st.lr_factor);
      spdlog::info("scheduler: worker {} joined ({}), samples [{}, {}), batch {}, {} steps", id,
                   req.host.empty() ? "local" : req.host, a.data_begin,
                   a.data_begin + a.data_count, a.batch_size, a.steps);
      record(self, "worker joined", (req.host.empty() ? std::string{"local"} : req.host) + ", batch "
                                      + std::to_string(a.batch_size), id);
      auto promise = self->make_response_promise<wire::assignment, std::vector<shard_actor>>();
      wire::membership_change join;
      join.kind = wire::membership_change::join;
      join.worker_id = id;
      broadcast(self, join, [=](bool ok) mutable {
        auto& st = self->state;
        if (!ok) {
          promise.deliver(make_error(errc::peer_unreachable,
                                     "a shard or the profiler did not acknowledge worker "
                                       + std::to_string(id)));
          return;
        }
        auto reply = [=]() mutable { promise.deliver(a, self->state.cfg.shards); };
        if (st.started) {
          // A worker joining a running job trains for as long as the others still will.
          self->request(st.cfg.profiler, ack_timeout, caf::get_atom::value)
            .then(
              [=](const wire::cluster_stats& stats) mutable {
                auto& st = self->state;
                uint64_t remaining = 0;
                for (const auto& [mid, mem] : st.members) {
                  if (mem.left || mid == a.worker_id)
                    continue;
                  uint64_t done = 0;
                  for (const auto& w : stats.workers)
                    if (w.worker_id == mid)
                      done = w.steps;
                  remaining = std::max(remaining, mem.steps > done ? mem.steps - done : 0);
                }
                auto b = a;
                b.steps = remaining;
                st.members[b.worker_id].steps = remaining;
                spdlog::info("scheduler: worker {} joins the running job for {} steps", b.worker_id,
                             remaining);
                promise.deliver(b, st.cfg.shards);
                if (st.ashl) // slotted into the stage in force; profiled by its first steps
                  self->send(caf::actor_cast<worker_actor>(st.members[b.worker_id].handle), stage_atom::value,
                             std::string{to_string(st.ashl->stage())}, uint32_t{1}, st.ashl->lr_scale(),
                             ashl_pull_ratio(st));
              },
              [=](caf::error& err) mutable { promise.deliver(err); });
          return;
        }
        st.start_barrier.push_back(reply);
        if (st.start_barrier.size() == 1)
          self->delayed_send(self, st.cfg.start_timeout, start_atom::value);
        if (st.start_barrier.size() >= st.cfg.job.workers)
          start_training(self);
      });
      return promise;
    },
    [=](start_atom) { start_training(self); },
    [=](lr_atom, float factor) {
      auto& st = self->state;
      st.lr_factor = factor;
      for (const auto& [id, m] : st.members)
        if (!m.left)
          self->send(caf::actor_cast<worker_actor>(m.handle), lr_atom::value, factor);
    },
    [=](tick_atom) {
      auto& st = self->state;
      if (st.done_sent || st.stopping)
        return;
      if (st.adsp)
        replan_adsp(self);
      if (st.adaptive)
        retune_adaptive(self);
      if (st.ashl)
        replan_ashl(self);
      if (st.cfg.job.allocation != "equal" && !st.allocation_frozen)
        reallocate(self);
      self->delayed_send(self, adsp_replan_interval, tick_atom::value);
    },
    [=](shard_atom, uint32_t index, const shard_actor& shard, const std::string& endpoint) {
      // A lost shard is served again: it learns the live workers, then they learn it.
      auto& st = self->state;
      if (index >= st.cfg.shards.size())
        return;
      st.cfg.shards[index] = shard;
      if (index < st.cfg.data_endpoints.size())
        st.cfg.data_endpoints[index] = endpoint;
      if (st.ashl)
        self->send(shard, bound_atom::value, st.ashl->allowed_gap(), st.ashl->lr_scale());
      if (st.adaptive)
        self->send(shard, tune_atom::value, st.tuned.k, st.tuned.async);
      auto live = std::make_shared<std::vector<uint32_t>>();
      for (const auto& [id, m] : st.members)
        if (!m.left)
          live->push_back(id);
      auto pending = std::make_shared<size_t>(live->size());
      auto tell_workers = [=] {
        auto& st = self->state;
        spdlog::info("scheduler: shard {} is served again; {} workers go on", st.cfg.ranges[index].shard_id,
                     live->size());
        record(self, "shard restored", "shard " + std::to_string(st.cfg.ranges[index].shard_id));
        for (auto id : *live)
          if (!st.members[id].left)
            self->send(caf::actor_cast<worker_actor>(st.members[id].handle), shard_atom::value, index, shard,
                       endpoint);
      };
      if (live->empty())
        return tell_workers();
      for (auto id : *live) {
        wire::membership_change join;
        join.kind = wire::membership_change::join;
        join.worker_id = id;
        self->request(shard, ack_timeout, join)
          .then([=](caf::ok_atom) { if (--*pending == 0) tell_workers(); },
                [=](caf::error& err) {
                  spdlog::error("scheduler: the restored shard did not take worker {}: {}", id, describe(err));
                  if (--*pending == 0)
                    tell_workers();
                });
      }
    },
    [=](const wire::ctl_request& req) -> caf::result<std::string> {
      auto& st = self->state;
      if (req.op == wire::ctl_request::shutdown) {
        // The job's budget or time is up: every worker finishes its step and leaves.
        st.stopping = true;
        uint32_t n = 0;
        for (auto& [id, m] : st.members)
          if (!m.left) {
            self->send(caf::actor_cast<worker_actor>(m.handle), stop_atom::value);
            ++n;
          }
        return "stopping " + std::to_string(n) + " workers";
      }
      if (req.op != wire::ctl_request::remove_worker)
        return make_error(errc::invalid_argument, "the scheduler handles remove-worker and shutdown");
      auto i = st.members.find(req.worker_id);
      if (i == st.members.end() || i->second.left)
        return make_error(errc::invalid_argument,
                          "worker " + std::to_string(req.worker_id) + " is not a live member");
      spdlog::info("scheduler: removing worker {} on request: it finishes its step and leaves",
                   req.worker_id);
      self->send(caf::actor_cast<worker_actor>(i->second.handle), stop_atom::value);
      return "worker " + std::to_string(req.worker_id) + " will leave after its current step";
    },
    [=](const wire::membership_change& m) {
      if (m.kind == wire::membership_change::join)
        return;
      on_leave(self, m.worker_id, m.kind == wire::membership_change::fail, m.reason);
    },
  };
}

}  // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg) {
  return sys.spawn(scheduler_behavior, std::move(cfg));
}

}  // namespace ashlar::actors
