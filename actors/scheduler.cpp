#include "actors/actor_clock.hpp"
#include "actors/scheduler.hpp"

#include <cmath>

#include <functional>
#include <map>
#include <memory>

#include <optional>
#include <set>

#include <spdlog/spdlog.h>

#include "runtime/control/job_roster.hpp"
#include "runtime/control/member_plan.hpp"
#include "runtime/control/stall_watch.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/metrics/recorder.hpp"
#include "runtime/policy/assignment.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/policy/ring.hpp"

namespace ashlar::actors {

namespace {

struct member {
  uint32_t id = 0;
  caf::actor_addr addr;
  caf::strong_actor_ptr handle;
  std::string host;
  std::string ring_endpoint; // its node's data plane, which takes its ring chunks ("": CAF only)
  // Its batch share, part of the training set and steps as last sent, and what its steps
  // trained on earlier parts (runtime/policy/assignment.hpp).
  member_part part;
  bool left = false;
  bool failed = false;
  bool admitted = false; // training: it started with the job or was admitted to it
  uint64_t steps_left_at = 0; // the steps it said it trained when it left (0: it did not say)
  uint32_t directives = 0;    // batch directives sent to it (its reports say how many it took)
};

using registration = caf::typed_response_promise<wire::assignment, std::vector<shard_actor>>;

struct pending_join {
  wire::assignment a;
  registration promise;
};

struct scheduler_state {
  static constexpr const char* name = "ashlar.scheduler";
  scheduler_config cfg;
  // The actor system's clock, the one its timers run on: its machines read it.
  actor_clock_source clock;
  policy_traits traits;
  std::unique_ptr<job_planner> planner;
  std::map<uint32_t, member> members;
  uint32_t next_id = 0;
  uint32_t registered = 0;
  bool done_sent = false;
  std::string first_failure; // "worker ID: why" of the first worker that failed
  std::string job_error;     // why the job fails (a worker's own computation failed); empty: it does not
  // Registrations answered only once the job's workers are ready (or at the start
  // timeout), so every worker of the first round starts from version 0 with the full
  // membership in place; the end, and the wait for a joiner when every worker was lost
  // with steps left (runtime/control/job_roster.hpp).
  std::vector<std::function<void()>> start_barrier;
  std::optional<control::job_roster> roster;
  bool started() const { return roster && roster->began(); } // training started (it may have ended since)
  bool stopping = false; // a shutdown request stopped every worker
  float lr_factor = 1.0f; // the learning-rate schedule's, as the job driver last sent it
  uint64_t reassigned = 0; // lost members' untrained samples handed to the others
  // Membership changes a shard has not answered yet, by request: the shard, and what runs
  // once it answers, fails or is lost (see ask_shard).
  uint64_t next_wait = 0;
  std::map<uint64_t, std::pair<caf::actor_addr, std::function<void()>>> shard_waits;
  std::set<caf::actor_addr> lost_shards; // down, not served again yet
  // Decentralized mode: which ring the live workers form, and when.
  ring_membership ring;
  // Membership changes waiting for one plan (plan_membership): lost members, and newcomers
  // with their answers; whether the profiler's figures are asked for, and whether the
  // last plan is too recent for another (replan_gap).
  std::set<uint32_t> handover_due;
  std::vector<pending_join> joins_due;
  bool replan_asked = false;
  bool replan_cooling = false;
};

using scheduler_pointer = scheduler_actor::stateful_pointer<scheduler_state>;

// Records a job event in the run's trace and metrics, when they are kept.
void record(scheduler_pointer self, const std::string& name, const std::string& detail, int64_t worker = -1) {
  if (self->state.cfg.recorder)
    self->state.cfg.recorder->event(name, detail, worker);
}

constexpr auto ack_timeout = std::chrono::seconds(30);
// The stall watch looks every stall_look while the job trains.
constexpr auto stall_look = std::chrono::seconds(2);

// Asks a shard to take membership change `m`; `done(acknowledged)` runs once. A shard that
// is lost (its node down: requests to it go nowhere until they time out) counts as having
// acknowledged: it learns the live members when it is served again (on_shard_restored), so
// a worker that registers while a shard is down is not held up for it.
// `done(ok, taken)`: `taken` the pushes of the worker the shard took (nullopt: not known,
// the shard being lost).
void ask_shard(scheduler_pointer self, const shard_actor& shard, const wire::membership_change& m,
               std::function<void(bool, std::optional<uint64_t>)> done) {
  auto& st = self->state;
  if (st.lost_shards.count(shard.address()) > 0)
    return done(true, std::nullopt);
  const auto wait = st.next_wait++;
  auto fired = std::make_shared<bool>(false);
  auto once = [=](bool ok, std::optional<uint64_t> taken) {
    if (*fired)
      return;
    *fired = true;
    self->state.shard_waits.erase(wait);
    done(ok, taken);
  };
  st.shard_waits[wait] = {shard.address(), [=] { once(true, std::nullopt); }};
  self->request(shard, ack_timeout, m).then([=](uint64_t taken) { once(true, taken); },
                                            [=](caf::error& err) {
                                              spdlog::error("scheduler: membership change for worker {} not "
                                                            "acknowledged: {}", m.worker_id, describe(err));
                                              once(false, std::nullopt);
                                            });
}

// A shard of the job went down: what waits for its answer goes on without it.
bool on_shard_down(scheduler_pointer self, const caf::actor_addr& source) {
  auto& st = self->state;
  bool ours = false;
  for (const auto& shard : st.cfg.shards)
    ours = ours || shard.address() == source;
  if (!ours)
    return false;
  st.lost_shards.insert(source);
  std::vector<std::function<void()>> go_on;
  for (const auto& [id, w] : st.shard_waits)
    if (w.first == source)
      go_on.push_back(w.second);
  for (auto& f : go_on)
    f();
  return true;
}

// Sends `m` to every shard and the profiler; calls `then(ok)` once all have answered.
// `taken`: the fewest pushes of the worker any shard that answered took (0 when none did):
// the steps of a lockstep worker that count.
void broadcast(scheduler_pointer self, const wire::membership_change& m,
               std::function<void(bool, uint64_t)> then_fn) {
  auto then = std::make_shared<std::function<void(bool, uint64_t)>>(std::move(then_fn));
  auto& cfg = self->state.cfg;
  auto pending = std::make_shared<size_t>(cfg.shards.size() + 1);
  auto ok = std::make_shared<bool>(true);
  auto fewest = std::make_shared<std::optional<uint64_t>>();
  auto one = [=](bool acknowledged, std::optional<uint64_t> taken) {
    *ok = *ok && acknowledged;
    if (taken)
      *fewest = std::min(fewest->value_or(*taken), *taken);
    if (--*pending == 0)
      (*then)(*ok, fewest->value_or(0));
  };
  for (auto& shard : cfg.shards)
    ask_shard(self, shard, m, one);
  const auto member = self->state.members.find(m.worker_id);
  self->request(cfg.profiler, ack_timeout, m,
                member != self->state.members.end() ? member->second.addr : caf::actor_addr{})
    .then([=](caf::ok_atom) { one(true, std::nullopt); },
          [=](caf::error& err) {
            spdlog::error("scheduler: membership change for worker {} not acknowledged by the profiler: {}",
                          m.worker_id, describe(err));
            one(false, std::nullopt);
          });
}

void end_job(scheduler_pointer self, uint32_t finished, uint32_t failed) {
  auto& st = self->state;
  st.done_sent = true;
  spdlog::info("scheduler: all workers done ({} finished, {} failed)", finished, failed);
  if (st.cfg.observer)
    caf::anon_send(st.cfg.observer, done_atom::value, finished, failed, st.first_failure, st.job_error);
}

// The steps lost members left untrained and nobody took over: the most any one left.
uint64_t untaken_steps(const scheduler_state& st, const wire::cluster_stats& stats) {
  // The scripts' own data loaders decide what each trains (train.optimizer = script): a lost
  // member leaves no steps for another to take up.
  if (script_optimizer(st.cfg.job))
    return 0;
  std::map<uint32_t, uint64_t> assigned, done;
  for (const auto& [id, m] : st.members)
    if (m.left && m.failed && m.admitted) { // (one lost before the start is counted missing then)
      assigned[id] = m.part.steps;
      done[id] = m.steps_left_at; // what it said, or the shards took of it
    }
  for (const auto& w : stats.workers)
    done[w.worker_id] = std::max(done[w.worker_id], w.steps);
  return steps_left(assigned, done);
}

void start_training(scheduler_pointer self);

// A timer for the roster's next deadline (the start barrier's, or the wait for a joiner).
void arm_roster_timer(scheduler_pointer self) {
  const uint64_t at = self->state.roster->next_timer();
  if (at == 0)
    return;
  const uint64_t now = self->state.clock.steady_ns();
  self->delayed_send(self, std::chrono::nanoseconds{at > now ? at - now : 0}, start_atom::value);
}

void check_done(scheduler_pointer self) {
  auto& st = self->state;
  // (A job stopped before its start barrier ends once the workers that came have left.)
  if (st.done_sent || (!st.started() && !st.stopping && st.registered < st.cfg.job.workers))
    return;
  uint32_t finished = 0, failed = 0;
  for (const auto& [id, m] : st.members) {
    if (!m.left)
      return;
    (m.failed ? failed : finished) += 1;
  }
  auto act = [=](control::job_roster::action a, uint64_t left) {
    auto& st = self->state;
    if (a == control::job_roster::action::end)
      return end_job(self, finished, failed);
    if (a != control::job_roster::action::wait_for_joiner)
      return;
    arm_roster_timer(self);
    spdlog::warn("scheduler: every worker has gone ({} lost) with {} steps left; waiting up to {:g} s for a worker "
                 "to join and take them up", failed, left, std::chrono::duration<double>(st.cfg.worker_wait).count());
    record(self, "every worker lost", std::to_string(left) + " steps left");
  };
  if (!st.roster->may_wait(failed, st.stopping, !st.job_error.empty()))
    return act(st.roster->all_left(failed, 0, st.stopping, !st.job_error.empty()), 0);
  // Every worker is gone, some lost: if they left steps untrained, a worker that joins
  // (a node that comes back, `ctl add-worker`) takes them up; the job waits for one.
  self->request(st.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        if (st.done_sent)
          return;
        for (const auto& [id, m] : st.members)
          if (!m.left)
            return; // one joined meanwhile
        const auto left = untaken_steps(st, stats);
        act(st.roster->all_left(failed, left, st.stopping, !st.job_error.empty()), left);
      },
      [=](caf::error&) { end_job(self, finished, failed); });
}

// A roster timer fired (the start barrier's timeout, or the wait for a joiner).
void on_roster_timer(scheduler_pointer self) {
  auto& st = self->state;
  switch (st.roster->timer()) {
    case control::job_roster::action::start:
      return start_training(self);
    case control::job_roster::action::end: {
      uint32_t finished = 0, failed = 0;
      for (const auto& [id, m] : st.members)
        (m.failed ? failed : finished) += 1;
      spdlog::error("scheduler: every worker has gone, lost ones with steps left, and none joined within {:g} s",
                    std::chrono::duration<double>(st.cfg.worker_wait).count());
      return end_job(self, finished, failed);
    }
    default:
      arm_roster_timer(self); // early: a timer for the roster's own deadline
  }
}

void form_ring(scheduler_pointer self, uint32_t generation, const std::string& why = {});
void apply_plan(scheduler_pointer self, const job_plan& plan);
void hand_over(scheduler_pointer self, uint32_t lost);

// The live members' batch shares, parts of the training set and steps (those admitted:
// a worker still registering gets its part when it is).
std::map<uint32_t, member_part> live_parts(const scheduler_state& st) {
  std::map<uint32_t, member_part> out;
  for (const auto& [id, m] : st.members)
    if (!m.left && m.admitted)
      out[id] = m.part;
  return out;
}

// Every live worker finishes its step and leaves; nothing is handed over from now on.
uint32_t stop_workers(scheduler_pointer self) {
  auto& st = self->state;
  st.stopping = true;
  st.roster->stop_before_start();
  uint32_t n = 0;
  for (auto& [id, m] : st.members)
    if (!m.left) {
      self->send(caf::actor_cast<worker_actor>(m.handle), stop_atom::value);
      ++n;
    }
  return n;
}

// `early`: a leave before the member's steps were done (removed on request, its node stopped).
// `error`: its own computation failed (a script that raised): the job fails, and every
// other worker is stopped after its step.
void on_leave(scheduler_pointer self, uint32_t id, bool failed, const std::string& reason, bool early = false,
              uint64_t steps_done = 0, bool error = false) {
  auto& st = self->state;
  auto i = st.members.find(id);
  if (i == st.members.end() || i->second.left)
    return;
  i->second.left = true;
  i->second.failed = failed;
  i->second.steps_left_at = steps_done;
  // A worker the job's end stopped (its samples or time reached, a stop of the job) says
  // "stopped on request", as one removed alone does: the log names which.
  const std::string on_request = wire::stopped_on_request;
  const std::string why = st.stopping && reason.rfind(on_request, 0) == 0
                            ? "stopped as the job ends" + reason.substr(on_request.size())
                            : reason;
  if (failed)
    spdlog::warn("scheduler: worker {} removed: {}", id, why);
  else
    spdlog::info("scheduler: worker {} left: {}", id, why);
  if (failed && st.first_failure.empty())
    st.first_failure = "worker " + std::to_string(id) + ": " + reason;
  if (error && st.job_error.empty()) {
    st.job_error = "worker " + std::to_string(id) + "'s computation failed: " + reason;
    spdlog::error("scheduler: the job fails: {}; stopping the other workers", st.job_error);
    stop_workers(self);
  }
  if (failed && !st.stopping && st.job_error.empty()) {
    uint32_t live = 0;
    for (const auto& [other, m] : st.members)
      live += !m.left && m.admitted;
    if (st.roster->too_few(live)) {
      st.job_error = "worker " + std::to_string(id) + " was lost (" + reason + ") and " + std::to_string(live)
                     + " workers remain, fewer than train.min_workers = "
                     + std::to_string(st.roster->min_workers());
      spdlog::error("scheduler: the job fails: {}; stopping the other workers", st.job_error);
      stop_workers(self);
    }
  }
  record(self, failed ? "worker failed" : "worker left", reason, id);
  wire::membership_change m;
  m.kind = failed ? wire::membership_change::fail : wire::membership_change::leave;
  m.worker_id = id;
  m.reason = reason;
  if (st.started() && st.traits.ring && !st.stopping)
    if (auto generation = st.ring.on_leave(failed, early)) {
      const bool asked = reason.rfind(wire::stopped_on_request, 0) == 0;
      const std::string how = failed           ? " was lost"
                              : early && asked ? " was removed"
                              : early          ? " left early (" + reason + ")"
                                               : " left";
      form_ring(self, generation, "worker " + std::to_string(id) + how);
    }
  // A lockstep member's last step counts when its push reached the shards before it was
  // lost (the profiler hears of a step only after its pull): the shards say how many of its
  // pushes they took, and its share is handed over once they have.
  broadcast(self, m, [=](bool, uint64_t taken) {
    auto& st = self->state;
    if (auto i = st.members.find(id); i != st.members.end() && st.traits.lockstep && !st.traits.ring)
      i->second.steps_left_at = std::max(i->second.steps_left_at, std::min(taken, i->second.part.steps));
    hand_over(self, id);
    check_done(self);
  });
}

// Decentralized mode: the live workers form a ring in id order; each learns the ring's
// generation, its rank and the next worker. A member lost mid-job makes the others form a
// new ring (its generation one more): they agree on their state, then go on without it
// (runtime/worker/step_machine.hpp: on_ring).
void form_ring(scheduler_pointer self, uint32_t generation, const std::string& why) {
  auto& st = self->state;
  std::vector<const member*> ring;
  for (const auto& [id, m] : st.members)
    if (!m.left && m.admitted)
      ring.push_back(&m);
  const auto n = static_cast<uint32_t>(ring.size());
  if (n == 0)
    return;
  for (uint32_t r = 0; r < n; ++r) {
    const auto* next = ring[(r + 1) % n];
    self->send(caf::actor_cast<worker_actor>(ring[r]->handle), ring_atom::value, generation, r, n,
               caf::actor_cast<caf::actor>(next->handle), next->ring_endpoint);
  }
  if (why.empty()) {
    spdlog::info("scheduler: ring of {} workers formed", n);
    return;
  }
  spdlog::warn("scheduler: {}: the ring re-formed with {} workers (generation {})", why, n, generation);
  record(self, "ring re-formed", why + ", " + std::to_string(n) + " workers");
}

void start_training(scheduler_pointer self) {
  auto& st = self->state;
  if (st.stopping) // (the roster said start, once: its barrier filled or timed out)
    return;
  for (auto& [id, m] : st.members)
    m.admitted = !m.left;
  if (st.start_barrier.size() < st.cfg.job.workers)
    spdlog::warn("scheduler: only {} of {} workers joined within the start timeout; training "
                 "starts with them",
                 st.start_barrier.size(), st.cfg.job.workers);
  else
    spdlog::info("scheduler: {} workers joined, training starts", st.start_barrier.size());
  record(self, "training starts", std::to_string(st.start_barrier.size()) + " workers");
  if (st.cfg.observer) // the job's clock starts here: the time workers took to join is not training
    caf::anon_send(st.cfg.observer, start_atom::value, static_cast<uint32_t>(st.start_barrier.size()));
  for (auto& f : st.start_barrier)
    f();
  st.start_barrier.clear();
  if (st.traits.ring)
    form_ring(self, st.ring.start());
  job_plan plan;
  // Fewer workers than the job's came in time: the parts of the set the missing ones were
  // to train go to those that came (as a lost worker's would), so the epochs still cover
  // the whole set.
  const auto live = live_parts(st);
  if (!live.empty() && live.size() < st.cfg.job.workers) {
    const assignment_context ctx{&st.cfg.job, st.traits, st.cfg.train_size, st.cfg.remaining, &st.cfg.contention};
    uint64_t owed = 0;
    for (uint32_t id = 0; id < st.cfg.job.workers; ++id)
      if (st.members.count(id) == 0 || st.members[id].left) {
        const auto a = make_assignment(ctx, id, id);
        // What its steps would have trained, as a lost member's are counted: a step trains
        // step_samples of its part, not a whole batch.
        owed += static_cast<uint64_t>(std::ceil(
          static_cast<double>(a.steps) * step_samples(member_part{a.batch_size, a.data_begin, a.data_count, a.steps})));
      }
    auto h = st.traits.lockstep ? hand_over_lockstep(live, {}, owed, st.cfg.train_size, st.traits.ring)
                                : hand_over_joined(live, st.cfg.train_size);
    spdlog::info("scheduler: the set is re-split over the {} workers that came{}", live.size(),
                 st.traits.lockstep ? ", with " + std::to_string(owed) + " samples of the missing ones" : "");
    plan.batches = std::move(h.parts);
  }
  st.planner->on_start(plan);
  apply_plan(self, plan);
  self->delayed_send(self, stall_look, wait_atom::value);
  // The first plan as soon as the profiler has a few steps of each worker.
  if (st.planner->plans())
    self->delayed_send(self, std::chrono::milliseconds(200), tick_atom::value);
}

// Sends `shard` the settings in `s`.
void send_shard_settings(scheduler_pointer self, const shard_actor& shard, const shard_settings& s) {
  if (s.bound)
    self->send(shard, bound_atom::value, s.bound->first, s.bound->second);
  if (s.tune)
    self->send(shard, tune_atom::value, s.tune->first, s.tune->second);
}

// Turns a plan into messages: to the shards, to the workers it names, to the log and the
// run's trace.
void apply_plan(scheduler_pointer self, const job_plan& plan) {
  auto& st = self->state;
  for (const auto& line : plan.info)
    spdlog::info("scheduler: {}", line);
  for (const auto& line : plan.debug)
    spdlog::debug("scheduler: {}", line);
  for (const auto& e : plan.events)
    record(self, e.name, e.detail);
  if (plan.stage && st.cfg.stage_out)
    st.cfg.stage_out->store(*plan.stage);
  if (!plan.shards.empty())
    for (const auto& shard : st.cfg.shards)
      send_shard_settings(self, shard, plan.shards);
  auto worker = [&](uint32_t id) -> std::optional<worker_actor> {
    auto m = st.members.find(id);
    if (m == st.members.end() || m->second.left)
      return std::nullopt;
    return caf::actor_cast<worker_actor>(m->second.handle);
  };
  for (const auto& [id, d] : plan.stages)
    if (auto w = worker(id))
      self->send(*w, stage_atom::value, d.stage, d.local_steps, d.lr_scale, d.pull_ratio);
  for (const auto& [id, h] : plan.local_steps)
    if (auto w = worker(id))
      self->send(*w, local_steps_atom::value, h);
  for (const auto& [id, b] : plan.batches)
    if (auto w = worker(id)) {
      self->send(*w, batch_atom::value, b.share, b.from_step, b.data_begin, b.data_count, b.steps);
      auto& m = st.members[id];
      ++m.directives;
      m.part = after_directive(m.part, b);
    }
}

// A shard's held reads waiting past their deadline (runtime/control/stall_watch.hpp): the
// workers they wait for are removed as lost (their shares go to the others), never the
// workers waiting.
void watch_stalls(scheduler_pointer self, const wire::cluster_stats& stats) {
  auto& st = self->state;
  if (!st.started() || st.traits.ring || st.cfg.shards.empty()
      || st.lost_shards.count(st.cfg.shards.front().address()) > 0)
    return;
  std::vector<double> steps;
  for (const auto& w : stats.workers)
    if (auto m = st.members.find(w.worker_id); m != st.members.end() && !m->second.left && w.steps >= 2)
      steps.push_back(w.step_seconds);
  self->request(st.cfg.shards.front(), ack_timeout, status_atom::value)
    .then(
      [=](const wire::shard_status& s) {
        const auto verdict = control::judge_stall(control::stall_view{s.held_seconds, s.holding_up, steps});
        for (auto id : verdict.remove) {
          auto i = self->state.members.find(id);
          if (i == self->state.members.end() || i->second.left || self->state.stopping)
            continue;
          spdlog::warn("scheduler: worker {} stalled the job: {}; it is removed", id, verdict.why);
          self->send(caf::actor_cast<worker_actor>(i->second.handle), stop_atom::value);
          on_leave(self, id, true, "it stalled the job: " + verdict.why);
        }
      },
      [](caf::error&) {});
}

void look_for_stalls(scheduler_pointer self) {
  auto& st = self->state;
  if (st.done_sent || st.stopping)
    return;
  self->request(st.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then([=](const wire::cluster_stats& stats) { watch_stalls(self, stats); }, [](caf::error&) {});
  self->delayed_send(self, stall_look, wait_atom::value);
}

// One planner tick: the profiler's figures (and shard 0's staleness counters, if the
// planner wants them) into a view, the planner's answer into messages.
void tick(scheduler_pointer self) {
  auto plan_from = [=](planner_view view) {
    auto& st = self->state;
    if (st.done_sent || st.stopping)
      return;
    job_plan plan;
    st.planner->on_tick(view, plan);
    apply_plan(self, plan);
  };
  self->request(self->state.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        if (st.done_sent || st.stopping)
          return;
        planner_view view;
        view.t_s = stats.elapsed_seconds;
        view.loss = stats.loss;
        view.samples = stats.total_samples;
        for (const auto& w : stats.workers)
          if (auto m = st.members.find(w.worker_id); m != st.members.end() && !m->second.left)
            view.workers.push_back(planner_worker{w.worker_id, w.steps, w.step_seconds, w.compute_seconds,
                                                  w.wait_seconds, w.compute_per_sample});
        for (const auto& [id, m] : st.members)
          view.live_members += m.left ? 0 : 1;
        if (!st.planner->wants_staleness() || st.cfg.shards.empty()
            || st.lost_shards.count(st.cfg.shards.front().address()) > 0)
          return plan_from(std::move(view));
        self->request(st.cfg.shards.front(), ack_timeout, status_atom::value)
          .then(
            [=](const wire::shard_status& s) mutable {
              view.staleness_sum = s.staleness_sum;
              view.pushes = s.applied + s.dropped;
              plan_from(std::move(view));
            },
            [=](caf::error& err) { spdlog::warn("scheduler: planning skipped: {}", describe(err)); });
      },
      [=](caf::error& err) { spdlog::warn("scheduler: planning skipped: {}", describe(err)); });
}

// A registered worker's answer waits for every shard and the profiler to know it; a
// worker of the first round also waits for the others (the start barrier), one joining a
// running job trains as long as the others still will.

// Membership changes of a running job are planned together (runtime/policy/assignment.hpp):
// lost members' untrained shares and newcomers' parts, in one plan for every change that
// came while the profiler's figures were asked for, and at most one plan every
// replan_gap; the first change after a quiet spell is planned at once. So a storm of
// losses and joins costs one message per live worker per plan, not per change.
constexpr auto replan_gap = std::chrono::milliseconds(250);

size_t plan_membership(scheduler_pointer self, const wire::cluster_stats& stats);

void ask_replan(scheduler_pointer self) {
  auto& st = self->state;
  if (st.replan_asked || st.replan_cooling)
    return;
  st.replan_asked = true;
  self->request(st.cfg.profiler, ack_timeout, caf::get_atom::value)
    .then(
      [=](const wire::cluster_stats& stats) {
        auto& st = self->state;
        st.replan_asked = false;
        // A plan that told live workers anything holds the next one back for replan_gap.
        if (plan_membership(self, stats) > 0) {
          st.replan_cooling = true;
          self->delayed_send(self, replan_gap, replan_atom::value);
        }
      },
      [=](caf::error& err) {
        auto& st = self->state;
        st.replan_asked = false;
        spdlog::warn("scheduler: membership changes not planned ({} losses, {} joins): {}", st.handover_due.size(),
                     st.joins_due.size(), describe(err));
        st.handover_due.clear();
        for (auto& j : st.joins_due)
          j.promise.deliver(err);
        st.joins_due.clear();
      });
}

void hand_over(scheduler_pointer self, uint32_t lost) {
  auto& st = self->state;
  if (!st.started() || st.stopping || st.done_sent)
    return;
  st.handover_due.insert(lost);
  ask_replan(self);
}

void admit_to_running_job(scheduler_pointer self, wire::assignment a, registration promise) {
  self->state.joins_due.push_back(pending_join{std::move(a), std::move(promise)});
  ask_replan(self);
}

// What a lockstep job's steps cover after a change of members: every admitted member's
// steps as planned (a lost one's as it took them), in epochs of the set. A change keeps
// the job's epochs; the line says where it did not.
void log_planned_epochs(const scheduler_state& st) {
  if (st.cfg.train_size == 0 || script_optimizer(st.cfg.job))
    return;
  double samples = 0;
  for (const auto& [id, m] : st.members)
    if (m.admitted)
      samples += samples_between(m.part, 0, m.part.steps);
  const double epochs = samples / static_cast<double>(st.cfg.train_size);
  const double job = st.cfg.job.epochs * st.cfg.remaining;
  spdlog::info("scheduler: the members' steps now cover {:.4f} epochs of the job's {:g} ({:.4f}x)", epochs, job,
               job > 0 ? epochs / job : 0.0);
}

// Returns the live workers the plan concerned (0: it sent nothing).
size_t plan_membership(scheduler_pointer self, const wire::cluster_stats& stats) {
  auto& st = self->state;
  auto due = std::move(st.handover_due);
  st.handover_due.clear();
  // The scripts' own data loaders decide what each worker trains (train.optimizer =
  // script): a member that leaves hands over no steps.
  if (script_optimizer(st.cfg.job))
    due.clear();
  auto joins = std::move(st.joins_due);
  st.joins_due.clear();
  if (st.stopping || st.done_sent) {
    for (auto& j : joins) { // a job that ends takes no newcomer: it trains nothing
      j.a.steps = 0;
      j.promise.deliver(j.a, st.cfg.shards);
    }
    return 0;
  }
  std::map<uint32_t, uint64_t> done;
  for (const auto& w : stats.workers) {
    done[w.worker_id] = w.steps;
    // A member that corrected its steps for a directive (steps_after_directive) and
    // reported since: its own count is the ledger's.
    auto m = st.members.find(w.worker_id);
    if (m != st.members.end() && !m->second.left && w.steps_target > 0 && w.directives == m->second.directives)
      m->second.part.steps = w.steps_target;
  }
  std::map<uint32_t, control::ledger_entry> ledger;
  for (const auto& [id, m] : st.members)
    ledger[id] = control::ledger_entry{m.part, m.left, m.failed,
                                       m.admitted, m.steps_left_at};
  std::set<uint32_t> newcomers;
  for (auto& j : joins) {
    newcomers.insert(j.a.worker_id);
    auto& m = st.members[j.a.worker_id];
    m.admitted = !m.left; // one lost before this plan was owed nothing, and is owed nothing after
  }
  auto p = control::plan_member_changes(ledger, due, newcomers, done, st.cfg.train_size, st.traits.lockstep,
                                        st.traits.ring);
  if (p.live == 0) // nobody live: the lost members' steps wait for a newcomer (check_done)
    return 0;
  std::string ids;
  for (const auto& [id, steps] : p.lost_steps) {
    st.members[id].part.steps = steps;
    if (due.count(id) > 0)
      ids += (ids.empty() ? "" : ", ") + std::to_string(id);
  }
  st.reassigned += p.handed_samples;
  if (st.cfg.reassigned_out)
    st.cfg.reassigned_out->store(st.reassigned);
  if (!ids.empty()) {
    const std::string text = st.traits.lockstep
                               ? std::to_string(p.handed_samples) + " untrained samples of worker(s) " + ids
                                   + " handed to " + std::to_string(p.live) + " live workers"
                               : "the parts of the set of worker(s) " + ids + " re-split over "
                                   + std::to_string(p.live) + " live workers";
    spdlog::info("scheduler: {}", text);
    record(self, "share handed over", text);
  }
  if (p.taken_up > 0)
    spdlog::info("scheduler: {} newcomer(s) take up the steps {} lost worker(s) left", joins.size(), p.taken_up);
  job_plan plan;
  plan.batches = std::move(p.directives);
  for (auto& j : joins) {
    j.a.steps = p.newcomer_steps[j.a.worker_id];
    st.members[j.a.worker_id].part.steps = j.a.steps;
    spdlog::info("scheduler: worker {} joins the running job for {} steps", j.a.worker_id, j.a.steps);
    j.promise.deliver(j.a, st.cfg.shards);
    // The newcomer takes a part of the set of its own (the others' shrink), from their
    // next steps; the planner's own directives come after.
    st.planner->on_join(j.a.worker_id, plan);
  }
  apply_plan(self, plan);
  if (st.traits.ring && !joins.empty()) // a ring of the members and the newcomers, who agree on the model first
    form_ring(self, st.ring.on_join(), std::to_string(joins.size()) + " worker(s) joined");
  if (st.traits.lockstep && !st.traits.ring)
    log_planned_epochs(st);
  return p.live;
}

caf::result<wire::assignment, std::vector<shard_actor>> on_register(scheduler_pointer self,
                                                                     const wire::register_worker& req) {
  auto& st = self->state;
  const auto& cfg = st.cfg;
  // A job holds at most train.max_workers live members (0: twice train.workers): a node
  // that registers more workers than it could be given grows nothing here.
  const uint32_t most = most_workers(cfg.job);
  uint32_t live = 0;
  for (const auto& [other, m] : st.members)
    live += !m.left;
  if (live >= most)
    return make_error(errc::busy, "the job holds " + std::to_string(live) + " workers, its most (train.max_workers = "
                                    + std::to_string(most) + "); a worker of " + (req.host.empty() ? "this process" : req.host)
                                    + " was refused");
  uint32_t id = st.next_id;
  if (req.requested_id != wire::any_worker && st.members.count(req.requested_id) == 0)
    id = req.requested_id;
  while (st.members.count(st.next_id) > 0 || st.next_id == id)
    ++st.next_id;
  const assignment_context ctx{&cfg.job, st.traits, cfg.train_size, cfg.remaining, &cfg.contention};
  wire::assignment a = make_assignment(ctx, id, st.registered);
  ++st.registered;
  a.shards = cfg.ranges;
  a.data_endpoints = cfg.data_endpoints;
  a.data_key = cfg.data_key;
  if (auto r = cfg.resume_workers.find(id); r != cfg.resume_workers.end()) {
    if (auto why = apply_resumed(a, r->second, ctx))
      spdlog::warn("scheduler: {}", *why);
    else
      st.planner->on_resumed(id, batch_directive{a.batch_size, 0, a.data_begin, a.data_count});
  }
  member m;
  m.id = id;
  m.addr = caf::actor_cast<caf::actor_addr>(self->current_sender());
  m.handle = self->current_sender();
  m.host = req.host;
  m.ring_endpoint = st.traits.ring ? req.ring_endpoint : std::string{};
  m.part = member_part{a.batch_size, a.data_begin, a.data_count, a.steps};
  st.members[id] = m;
  st.roster->joined(); // a worker to take up what lost ones left
  if (auto sender = self->current_sender())
    self->monitor(sender);
  if (st.lr_factor != 1.0f)
    self->send(caf::actor_cast<worker_actor>(m.handle), lr_atom::value, st.lr_factor);
  const std::string where = req.host.empty() ? std::string{"local"} : req.host;
  // (a policy that is not lockstep trains until the job's samples are reached: its steps
  // are a bound)
  spdlog::info("scheduler: worker {} joined ({}), samples [{}, {}), batch {}, {}{} steps", id, where, a.data_begin,
               a.data_begin + a.data_count, a.batch_size, st.traits.lockstep ? "" : "up to ", a.steps);
  record(self, "worker joined", where + ", batch " + std::to_string(a.batch_size), id);
  auto promise = self->make_response_promise<wire::assignment, std::vector<shard_actor>>();
  wire::membership_change join;
  join.kind = wire::membership_change::join;
  join.worker_id = id;
  broadcast(self, join, [=](bool ok, uint64_t) mutable {
    auto& st = self->state;
    if (!ok) {
      promise.deliver(
        make_error(errc::peer_unreachable, "a shard or the profiler did not acknowledge worker " + std::to_string(id)));
      return;
    }
    if (st.started()) {
      admit_to_running_job(self, a, promise);
      return;
    }
    st.start_barrier.push_back([=]() mutable { promise.deliver(a, self->state.cfg.shards); });
    if (st.roster->ready() == control::job_roster::action::start)
      return start_training(self);
    if (st.start_barrier.size() == 1)
      arm_roster_timer(self);
  });
  return promise;
}

// A lost shard is served again: it gets the planner's settings and learns the live
// workers, then they learn it.
void on_shard_restored(scheduler_pointer self, uint32_t index, const shard_actor& shard,
                       const std::string& endpoint) {
  auto& st = self->state;
  if (index >= st.cfg.shards.size())
    return;
  st.lost_shards.erase(st.cfg.shards[index].address());
  st.cfg.shards[index] = shard;
  self->monitor(shard);
  if (index < st.cfg.data_endpoints.size())
    st.cfg.data_endpoints[index] = endpoint;
  send_shard_settings(self, shard, st.planner->shard_state());
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
        self->send(caf::actor_cast<worker_actor>(st.members[id].handle), shard_atom::value, index, shard, endpoint);
  };
  if (live->empty())
    return tell_workers();
  for (auto id : *live) {
    wire::membership_change join;
    join.kind = wire::membership_change::join;
    join.worker_id = id;
    ask_shard(self, shard, join, [=](bool, std::optional<uint64_t>) {
      if (--*pending == 0)
        tell_workers();
    });
  }
}

// Whether the message being handled comes from worker `id` itself, or from this process
// (the cluster, the job driver): no worker says another has left.
bool from_member(scheduler_pointer self, uint32_t id) {
  auto sender = self->current_sender();
  if (sender && sender->node() == self->node())
    return true;
  auto i = self->state.members.find(id);
  if (i != self->state.members.end() && sender && i->second.addr == caf::actor_cast<caf::actor_addr>(sender))
    return true;
  spdlog::warn("scheduler: refused a membership change for worker {} from {}: not that worker's own", id,
               sender ? to_string(sender->node()) : std::string{"an unknown sender"});
  return false;
}

caf::result<std::string> on_ctl(scheduler_pointer self, const wire::ctl_request& req) {
  auto& st = self->state;
  if (req.op == wire::ctl_request::shutdown) {
    // The job's budget or time is up: every worker finishes its step and leaves.
    return "stopping " + std::to_string(stop_workers(self)) + " workers";
  }
  if (req.op != wire::ctl_request::remove_worker)
    return make_error(errc::invalid_argument, "the scheduler handles remove-worker and shutdown");
  auto i = st.members.find(req.worker_id);
  if (i == st.members.end() || i->second.left)
    return make_error(errc::invalid_argument, "worker " + std::to_string(req.worker_id) + " is not a live member");
  spdlog::info("scheduler: removing worker {} on request: it finishes its step and leaves", req.worker_id);
  self->send(caf::actor_cast<worker_actor>(i->second.handle), stop_atom::value);
  if (st.traits.ring)
    return "worker " + std::to_string(req.worker_id)
           + " will leave after its next all-reduce; the others go on in a ring formed without it";
  return "worker " + std::to_string(req.worker_id) + " will leave after its current step";
}

scheduler_actor::behavior_type scheduler_behavior(scheduler_pointer self, scheduler_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.clock.bind(self->system());
  st.traits = traits_of(st.cfg.job.policy);
  planner_context ctx;
  ctx.job = &st.cfg.job;
  ctx.train_size = st.cfg.train_size;
  ctx.lockstep = st.traits.lockstep;
  ctx.resume_stage = st.cfg.resume_stage;
  for (const auto& [id, r] : st.cfg.resume_workers)
    ctx.resume_batches[id] = r.batch;
  st.planner = make_job_planner(ctx);
  st.roster.emplace(st.clock, st.cfg.job.workers,
                    static_cast<uint64_t>(std::chrono::nanoseconds{st.cfg.start_timeout}.count()),
                    static_cast<uint64_t>(std::chrono::nanoseconds{st.cfg.worker_wait}.count()),
                    st.cfg.job.min_workers);
  // The shards are watched so that a lost one holds up no membership change (ask_shard).
  for (const auto& shard : st.cfg.shards)
    self->monitor(shard);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (on_shard_down(self, dm.source))
      return;
    for (auto& [id, m] : self->state.members)
      if (m.addr == dm.source && !m.left)
        on_leave(self, id, true, "worker actor terminated: " + to_string(dm.reason));
  });
  return {
    [=](const wire::register_worker& req) -> caf::result<wire::assignment, std::vector<shard_actor>> {
      return on_register(self, req);
    },
    // A wait ran out: the start barrier's, or the wait for a worker to join (check_done).
    [=](start_atom) { on_roster_timer(self); },
    [=](lr_atom, float factor) {
      auto& st = self->state;
      st.lr_factor = factor;
      for (const auto& [id, m] : st.members)
        if (!m.left)
          self->send(caf::actor_cast<worker_actor>(m.handle), lr_atom::value, factor);
    },
    [=](wait_atom) { // (from itself only: another sender would start a second chain of looks)
      if (self->current_sender() == self->ctrl())
        look_for_stalls(self);
    },
    [=](replan_atom) { // the gap after a membership plan is over: plan what came meanwhile
      auto& st = self->state;
      st.replan_cooling = false;
      if (!st.handover_due.empty() || !st.joins_due.empty())
        ask_replan(self);
    },
    [=](tick_atom) {
      auto& st = self->state;
      if (st.done_sent || st.stopping)
        return;
      tick(self);
      self->delayed_send(self, std::chrono::milliseconds(st.planner->tick_ms()), tick_atom::value);
    },
    [=](shard_atom, uint32_t index, const shard_actor& shard, const std::string& endpoint) {
      on_shard_restored(self, index, shard, endpoint);
    },
    [=](const wire::ctl_request& req) -> caf::result<std::string> { return on_ctl(self, req); },
    [=](nodes_atom, const std::string& node) {
      std::vector<uint32_t> lost;
      for (const auto& [id, m] : self->state.members)
        if (m.host == node && !m.left)
          lost.push_back(id);
      for (auto id : lost)
        on_leave(self, id, true, "its node " + node + " was lost");
    },
    [=](const wire::membership_change& m) {
      if (m.kind == wire::membership_change::join || !from_member(self, m.worker_id))
        return;
      const bool error = m.kind == wire::membership_change::error;
      on_leave(self, m.worker_id, error || m.kind == wire::membership_change::fail, m.reason, m.early, m.steps,
               error);
    },
  };
}

}  // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg) {
  return sys.spawn(scheduler_behavior, std::move(cfg));
}

}  // namespace ashlar::actors
