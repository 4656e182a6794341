// The worker actor: registration, the compute backend, the shards' handles and the data
// plane. What its step does next is the step machine's (runtime/worker/step_machine.hpp);
// this actor turns the machine's actions into messages and replies into its events.
#include "actors/actor_clock.hpp"
#include "actors/worker.hpp"

#include <spdlog/spdlog.h>

#include "actors/cluster/data_plane.hpp"
#include "actors/gpu_call.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/os/memory.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/worker/report_batch.hpp"
#include "runtime/worker/step_machine.hpp"

namespace ashlar::actors {

namespace {

struct worker_state {
  static constexpr const char* name = "ashlar.worker";
  worker_config cfg;
  // The actor system's clock, the one its timers run on: its step machine reads it.
  actor_clock_source clock;
  std::vector<shard_actor> shards;
  std::unique_ptr<compute_backend> backend;
  std::unique_ptr<step_machine> machine;
  // The backend's page locks on the machine's params and grad (a GPU backend moves them
  // by DMA); dropped before the machine (declared after it).
  std::vector<std::shared_ptr<void>> host_locks;
  // The ring: the next worker, and where its chunks go (the next worker itself, or its
  // data-plane stand-in; none while that connects: chunks wait in ring_queue).
  caf::actor ring_next;
  caf::actor ring_out;
  std::vector<wire::ring_message> ring_queue;
  std::string ring_endpoint; // its own ring inbox on the node's data plane ("": none)
  float lr_factor = 1.0f;       // the schedule's, if it came before the assignment
  bool stopped = false;         // left or failed
  uint32_t assigned = wire::any_worker; // its id in the job, once assigned
  bool kernels_logged = false;  // the backend's choices, once after its first step
  bool training = false;        // every shard's handle is final and the machine has begun
  uint32_t connecting = 0;      // data-plane connections under way
  uint32_t direct = 0;          // shards reached over data-plane connections
  std::unique_ptr<report_batch> reports; // step reports on their way to the profiler
};

using worker_pointer = worker_actor::stateful_pointer<worker_state>;

// Sends the step reports held for the profiler, in order.
void send_reports(worker_pointer self) {
  auto& st = self->state;
  if (st.reports)
    for (auto& r : st.reports->take())
      self->send(st.cfg.profiler, std::move(r));
}

// Tells the scheduler the worker leaves (finished) or fails, and why; then stops.
void leave(worker_pointer self, wire::membership_change::kind_t kind, const std::string& reason, bool early = false) {
  auto& st = self->state;
  if (st.stopped)
    return;
  st.stopped = true;
  const uint32_t id = st.machine ? st.machine->job().worker_id : st.assigned;
  const bool failed = kind == wire::membership_change::fail || kind == wire::membership_change::error;
  if (failed)
    spdlog::error("worker {}: {}", id, reason);
  const uint64_t steps = st.machine ? st.machine->steps_done() : 0;
  send_reports(self); // every step it took is reported before it leaves
  self->send(st.cfg.scheduler, wire::membership_change{kind, id, reason, early, steps});
  if (failed)
    self->quit(caf::exit_reason::user_shutdown);
  else
    self->quit();
}

void fail(worker_pointer self, const std::string& why) {
  leave(self, wire::membership_change::fail, why);
}

void run(worker_pointer self);

// The machine's actions as messages; replies come back as its events.
struct executor {
  worker_pointer self;

  void operator()(step::send_pull& a) const {
    const auto i = a.shard;
    const auto gen = a.gen;
    const bool ahead = a.ahead;
    self->request(self->state.shards[i], self->state.cfg.request_timeout, std::move(a.req))
      .then(
        [s = self, i, gen, ahead](const wire::pull_reply& r) {
          if (!s->state.machine)
            return;
          if (ahead)
            s->state.machine->on_read_ahead(i, gen, r);
          else
            s->state.machine->on_pull_reply(i, gen, r);
          run(s);
        },
        [s = self, i, gen](caf::error& err) { trouble(s, i, gen, "pull from", err); });
  }

  void operator()(step::send_push& a) const {
    const auto i = a.shard;
    const auto gen = a.gen;
    const auto floats = a.floats;
    self->request(self->state.shards[i], self->state.cfg.request_timeout, std::move(a.msg))
      .then(
        [s = self, i, gen, floats](const wire::push_ack& ack) {
          if (!s->state.machine)
            return;
          s->state.machine->on_push_ack(i, gen, floats, ack);
          run(s);
        },
        [s = self, i, gen](caf::error& err) { trouble(s, i, gen, "push to", err); });
  }

  static void trouble(worker_pointer s, size_t i, uint64_t gen, const char* what, const caf::error& err) {
    auto& m = *s->state.machine;
    m.on_request_failed(i, gen, std::string{what} + " shard " + std::to_string(m.job().shards[i].shard_id)
                                  + " failed: " + describe(err));
    run(s);
  }

  // On the CPU the step computes here. A GPU actor gets it as a request; the worker
  // waits for the reply (await: other messages stay queued, as during a CPU step) without
  // holding a thread.
  void operator()(step::compute& a) const {
    auto& st = self->state;
    auto& m = *st.machine;
    if (a.fetch_velocity) // a step on this side after steps on the backend's: their velocity first
      if (auto err = st.backend->take_commit(nullptr, 1.0f, a.fetch_velocity))
        return computed(self, err);
    if (const auto route = route_of(*st.backend); route.actor) {
      gpu_call c{gpu_call::train, route.spec, route.model, m.params().data(), a.batch, m.grad().data()};
      if (a.held) { // a local step on the model the GPU keeps
        c.kind = gpu_call::local_step;
        c.params = a.load;
        c.velocity = a.velocity;
        c.commit = a.commit;
        c.grad = nullptr;
        c.lr = a.lr;
        c.momentum = a.momentum;
      }
      self->request(*route.actor, caf::infinite, std::move(c))
        .await(
          [s = self](gpu_reply& r) {
            if (!s->state.machine)
              return;
            computed(s, r.err ? expected<batch_stats>{std::move(r.err)} : expected<batch_stats>{r.stats});
            run(s);
          },
          [s = self](caf::error& err) {
            if (!s->state.machine)
              return;
            computed(s, make_error(errc::device_error, "the GPU actor did not answer: " + describe(err)));
            run(s);
          });
      return;
    }
    auto stats = a.held ? st.backend->local_step(a.load, a.velocity, a.commit, a.batch, a.lr, a.momentum)
                        : st.backend->train_step(m.params().data(), a.batch, m.grad().data());
    if (m.gives_back_between_steps())
      st.backend->release_scratch();
    computed(self, std::move(stats)); // run() goes on
  }

  // The commit's sum from the backend that keeps the model: a blocking call (a GPU's
  // copy of it out), after which the machine sends the pushes.
  void operator()(step::take_commit& a) const {
    auto& st = self->state;
    st.machine->on_commit_taken(st.backend->take_commit(a.out, a.scale, a.velocity_out));
  }

  void operator()(step::rebase& a) const {
    auto& st = self->state;
    if (auto err = st.backend->rebase(a.pulled, a.lr))
      actors::fail(self, "the overlapped commit's pull could not reach the kept model: " + describe(err));
  }

  static void computed(worker_pointer s, const expected<batch_stats>& stats) {
    auto& st = s->state;
    st.machine->on_computed(stats);
    if (!st.kernels_logged) {
      st.kernels_logged = true;
      if (auto details = st.backend->details(); !details.empty())
        spdlog::info("worker {}: {} backend: {}", st.machine->job().worker_id, st.backend->name(), details);
    }
  }

  void operator()(step::pace& a) const {
    self->delayed_send(self, std::chrono::nanoseconds(a.ns), paced_atom::value, a.gen);
  }

  void operator()(step::report& a) const {
    auto& st = self->state;
    if (!st.reports) // held only where each worker's steps are its own to end (lockstep): the
                     // job's end of workers at their own pace counts their reports
      st.reports = std::make_unique<report_batch>(
        traits_of(st.machine->job().policy).lockstep
          ? static_cast<uint64_t>(std::chrono::nanoseconds(st.cfg.report_window).count())
          : 0);
    switch (st.reports->add(std::move(a.rep))) {
      case report_batch::next::send:
        return send_reports(self);
      case report_batch::next::arm_timer:
        return self->delayed_send(self, st.cfg.report_window, tick_atom::value);
      case report_batch::next::hold:
        return;
    }
  }

  void operator()(step::next_step&) const { self->send(self, step_atom::value); }

  void operator()(step::ring_send& a) const {
    auto& st = self->state;
    if (st.ring_out)
      caf::anon_send(st.ring_out, std::move(a.msg));
    else
      st.ring_queue.push_back(std::move(a.msg)); // in order, once the stand-in is there
  }

  void operator()(step::await_shard& a) const {
    self->delayed_send(self, std::chrono::milliseconds(a.ms), shard_atom::value, a.gen);
  }

  void operator()(step::fail& a) const {
    if (a.compute)
      leave(self, wire::membership_change::error, a.why);
    else
      actors::fail(self, a.why);
  }

  void operator()(step::finish& a) const { leave(self, wire::membership_change::leave, a.reason, a.early); }
};

// Carries out what the machine asks, until it asks nothing more.
void run(worker_pointer self) {
  auto& st = self->state;
  while (st.machine && !st.stopped) {
    auto actions = st.machine->take_actions();
    if (actions.empty())
      return;
    for (auto& a : actions) {
      if (st.stopped)
        return;
      std::visit(executor{self}, a);
    }
  }
}

// Shard `index` is reached through a data-plane stand-in when it is in another process
// and its node serves a data plane at `endpoint`. The connection (up to 30 s, each try at
// most 5 s, a busy node tried again after a backoff) is made by a
// detached actor, on a thread of its own, which sends the worker (shard_atom, index,
// stand-in); a shard whose endpoint cannot be reached stays on CAF's path. Returns
// whether a connection was started.
bool connect_data_plane(worker_pointer self, uint32_t index, const shard_actor& shard, const std::string& endpoint) {
  auto& st = self->state;
  if (!st.cfg.plane || endpoint.empty() || shard.node() == self->node())
    return false;
  ++st.connecting;
  const auto& job = st.machine->job();
  self->spawn<caf::detached>([plane = st.cfg.plane, worker = caf::actor_cast<worker_actor>(self), index, shard,
                              endpoint, key = job.data_key, shard_id = job.shards[index].shard_id,
                              worker_id = job.worker_id](caf::blocking_actor* helper) {
    auto proxy = plane->connect(shard, shard_id, endpoint, key, caf::actor_cast<caf::actor>(worker),
                                std::chrono::seconds(30));
    if (!proxy)
      spdlog::warn("worker {}: shard {} over CAF: {}", worker_id, shard_id, describe(proxy.error()));
    helper->send(worker, shard_atom::value, index, proxy ? *proxy : shard);
  });
  return true;
}

// The next worker on a new ring. Its chunks go through a data-plane stand-in when it is in
// another process whose node takes ring chunks at `endpoint`; the connection (up to 10 s)
// is made on a thread of its own, and the chunks wait meanwhile, so they keep their order.
// The same next worker keeps its path.
void ring_next(worker_pointer self, caf::actor next, const std::string& endpoint) {
  auto& st = self->state;
  if (next == st.ring_next)
    return;
  if (st.ring_out && st.ring_out != st.ring_next)
    self->send_exit(st.ring_out, caf::exit_reason::user_shutdown); // the old next's stand-in (normal would not stop it)
  st.ring_queue.clear(); // the old ring's chunks
  st.ring_next = next;
  st.ring_out = next;
  if (!st.cfg.plane || endpoint.empty() || !next || next.node() == self->node() || !st.machine)
    return;
  st.ring_out = nullptr;
  self->spawn<caf::detached>([plane = st.cfg.plane, worker = caf::actor_cast<worker_actor>(self), next, endpoint,
                              key = st.machine->job().data_key,
                              worker_id = st.machine->job().worker_id](caf::blocking_actor* helper) {
    auto proxy = plane->connect_ring(next, endpoint, key, caf::actor_cast<caf::actor>(worker), std::chrono::seconds(10));
    if (!proxy)
      spdlog::warn("worker {}: ring chunks to the next worker over CAF: {}", worker_id, describe(proxy.error()));
    helper->send(worker, ring_atom::value, next, proxy ? *proxy : next);
  });
}

// The stand-in for the next worker on the ring is connected (or `out` is the next worker
// itself, if it could not be): the chunks that waited go first.
void ring_stand_in_ready(worker_pointer self, const caf::actor& next, caf::actor out) {
  auto& st = self->state;
  if (next != st.ring_next || st.ring_out) { // for a ring re-formed since
    if (out != next)
      self->send_exit(out, caf::exit_reason::user_shutdown);
    return;
  }
  st.ring_out = std::move(out);
  for (auto& m : st.ring_queue)
    caf::anon_send(st.ring_out, std::move(m));
  st.ring_queue.clear();
}

// Training begins once every shard's handle is final.
void begin_training(worker_pointer self) {
  auto& st = self->state;
  for (auto& s : st.shards)
    self->monitor(s);
  st.training = true;
  st.machine->begin();
  run(self);
}

// Shard `index` is served again by `shard` (through its data plane at `endpoint`, if any).
void replace_shard(worker_pointer self, uint32_t index, shard_actor shard, const std::string& endpoint) {
  auto& st = self->state;
  if (st.stopped || !st.machine || index >= st.shards.size())
    return;
  st.shards[index] = shard;
  if (connect_data_plane(self, index, shard, endpoint))
    return; // goes on when the stand-in is connected
  self->monitor(st.shards[index]);
  st.machine->on_shard_replaced(index);
  run(self);
}

// A data-plane stand-in is connected (or the shard's own handle, if it could not be).
void stand_in_ready(worker_pointer self, uint32_t index, shard_actor shard) {
  auto& st = self->state;
  if (st.stopped || !st.machine || index >= st.shards.size() || st.connecting == 0)
    return;
  --st.connecting;
  const bool direct = shard != st.shards[index];
  st.shards[index] = std::move(shard);
  st.direct += direct ? 1 : 0;
  if (!st.training) {
    if (st.connecting > 0)
      return;
    if (st.direct > 0)
      spdlog::info("worker {}: {} of {} shards over direct data connections", st.machine->job().worker_id,
                   st.direct, st.shards.size());
    return begin_training(self);
  }
  self->monitor(st.shards[index]);
  st.machine->on_shard_replaced(index);
  run(self);
}

// The assignment is here: the backend for its model, the shards, the step machine.
void take_assignment(worker_pointer self, const wire::assignment& a, const std::vector<shard_actor>& shards) {
  auto& st = self->state;
  st.assigned = a.worker_id;
  if (shards.size() != a.shards.size())
    return fail(self, "malformed assignment from the scheduler");
  auto plan = compile(a.model);
  if (!plan)
    return fail(self, "the scheduler's model: " + describe(plan.error()));
  // Its parameters, gradient, commit and velocity must fit in what this host has now, as
  // a local run checks before it starts: a model sent by the scheduler is refused here
  // before anything is allocated for it.
  // The model is the job's: a host that cannot hold it fails the job, naming why, rather
  // than waiting for another worker to take its place.
  if (auto big = check_model_memory(plan->num_params, 4, available_memory_bytes(), a.model.to_string()))
    return leave(self, wire::membership_change::error,
                 describe(located(big, st.cfg.host.empty() ? std::string{"this worker's host"}
                                                           : "node " + st.cfg.host)));
  auto choice = st.cfg.make_backend ? st.cfg.make_backend(a.model) : cpu_choice(a.model, "");
  if (!choice.backend)
    return fail(self, "no compute backend for model " + a.model.to_string() + ": " + choice.note);
  st.backend = std::move(choice.backend);
  if (!choice.note.empty() && choice.quiet)
    spdlog::debug("worker {}: computing {}", a.worker_id, choice.note);
  else if (!choice.note.empty())
    spdlog::info("worker {}: computing {}", a.worker_id, choice.note);
  if (auto err = step_machine::check(a, st.backend->spec(), *st.cfg.data))
    return fail(self, describe(err));
  st.host_locks.clear(); // before the buffers go
  st.machine = std::make_unique<step_machine>(a, *st.cfg.data, plan->num_params, st.clock);
  st.machine->on_lr(st.lr_factor);
  st.machine->set_model_held(st.backend->keeps_local_model());
  if (st.cfg.plane) // pushes in the job's shared memory: shards of this host read them in place
    st.machine->use_push_buffers(st.cfg.plane->tensor_buffers(a.data_key));
  if (st.machine->model_held())
    spdlog::debug("worker {}: {} keeps the model between commits under local steps", a.worker_id,
                  st.backend->name());
  st.shards = shards;
  for (auto* v : {&st.machine->params(), &st.machine->grad(), &st.machine->commit_buffer(),
                  &st.machine->pulled_buffer(), &st.machine->velocity_buffer()})
    if (!v->empty())
      st.host_locks.push_back(st.backend->lock_host_memory(v->data(), v->size() * sizeof(float)));
  // Many workers to a core, and nothing holds the step's buffers (no page lock): they are
  // given back between steps.
  st.machine->give_back_between_steps(st.cfg.give_back_between_steps &&
    std::none_of(st.host_locks.begin(), st.host_locks.end(), [](const auto& l) { return l != nullptr; }));
  spdlog::debug("worker {}: {} backend, {} steps", a.worker_id, st.backend->name(), a.steps);
  if (!st.ring_endpoint.empty()) // a chunk carries at most the gradient and three more entries, or the
    // model and its velocity, over a ring of two or more
    st.cfg.plane->serve_ring(caf::actor_cast<caf::actor>(self), st.cfg.ring_key,
                             2 * (plan->num_params + 3) * sizeof(float));
  if (a.data_endpoints.size() == shards.size())
    for (uint32_t i = 0; i < shards.size(); ++i)
      connect_data_plane(self, i, shards[i], a.data_endpoints[i]);
  if (st.connecting == 0)
    begin_training(self);
}

// Registers with the scheduler, then trains on the assignment.
void start(worker_pointer self) {
  auto& st = self->state;
  wire::register_worker req;
  req.requested_id = st.cfg.requested_id;
  req.host = st.cfg.host;
  req.backend = "cpu";
  if (st.cfg.plane && !st.cfg.ring_host.empty() && !st.cfg.ring_key.empty()) {
    // A ring job: the previous worker's chunks come here, served before anyone learns where.
    if (auto at = st.cfg.plane->listen(st.cfg.ring_host)) {
      req.ring_endpoint = st.ring_endpoint = *at;
      st.cfg.plane->serve_ring(caf::actor_cast<caf::actor>(self), st.cfg.ring_key, wire::max_message_bytes);
      self->attach_functor([plane = st.cfg.plane, id = self->id()] { plane->unserve_ring(id); });
    } else {
      spdlog::warn("worker: ring chunks over CAF: {}", describe(at.error()));
    }
  }
  self->request(st.cfg.scheduler, std::chrono::seconds(30), req)
    .then([=](const wire::assignment& a, const std::vector<shard_actor>& shards) { take_assignment(self, a, shards); },
          [=](caf::error& err) {
            spdlog::error("worker: registration with the scheduler failed: {}", describe(err));
            self->state.stopped = true;
            self->quit(err);
          });
}

// Calls `f` on the machine, if there is one yet, and carries out what it asks.
template <class F>
void with_machine(worker_pointer self, F f) {
  if (self->state.machine && !self->state.stopped) {
    f(*self->state.machine);
    run(self);
  }
}

// How a shard's actor ended, in words: stopped with its job or its node, or lost.
std::string shard_end(const caf::error& reason) {
  if (reason == caf::exit_reason::user_shutdown)
    return "was stopped (its job ended or its node shut down)";
  if (reason == caf::exit_reason::normal)
    return "ended";
  if (reason == caf::exit_reason::remote_link_unreachable)
    return "was lost (its node became unreachable)";
  if (reason == caf::exit_reason::kill)
    return "was lost (stopped by the job driver: its node was given up on)";
  return "was lost (" + to_string(reason) + ")";
}

worker_actor::behavior_type worker_behavior(worker_pointer self, worker_config cfg) {
  self->state.cfg = std::move(cfg);
  self->state.clock.bind(self->system());
  // Stopped from outside (its job ended, its node went): the step reports it holds go
  // first. (As without a handler: a normal exit message is ignored, any other ends it.)
  self->set_exit_handler([=](caf::exit_msg& m) {
    if (m.reason == caf::exit_reason::normal)
      return;
    send_reports(self);
    self->quit(std::move(m.reason));
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t i = 0; i < st.shards.size(); ++i)
      if (st.shards[i].address() == dm.source)
        return with_machine(self, [&](step_machine& m) {
          m.on_shard_down(i, "shard " + std::to_string(m.job().shards[i].shard_id) + " " + shard_end(dm.reason));
        });
  });
  return {
    [=](start_atom) {
      if (self->state.machine)
        spdlog::warn("worker {}: already started", self->state.machine->job().worker_id);
      else
        start(self);
    },
    [=](stop_atom) {
      auto& st = self->state;
      if (st.machine) // the next step boundary leaves (a ring member waiting for a ring: now)
        return with_machine(self, [](step_machine& m) { m.on_stop(); });
      if (!st.stopped) {
        st.stopped = true;
        self->quit();
      }
    },
    [=](step_atom) { with_machine(self, [](step_machine& m) { m.on_step(); }); },
    [=](tick_atom) { // the held step reports' time is up
      if (self->state.reports) {
        self->state.reports->on_timer();
        send_reports(self);
      }
    },
    [=](paced_atom, uint64_t gen) { with_machine(self, [=](step_machine& m) { m.on_paced(gen); }); },
    [=](shard_atom, uint32_t index, shard_actor& shard, const std::string& endpoint) {
      replace_shard(self, index, std::move(shard), endpoint);
    },
    [=](shard_atom, uint64_t gen) { with_machine(self, [=](step_machine& m) { m.on_shard_wait_over(gen); }); },
    [=](shard_atom, uint32_t index, shard_actor& stand_in) { stand_in_ready(self, index, std::move(stand_in)); },
    [=](batch_atom, uint32_t b, uint64_t from_step, uint64_t data_begin, uint64_t data_count, uint64_t steps) {
      with_machine(self, [=](step_machine& m) { m.on_batch(b, from_step, data_begin, data_count, steps); });
    },
    [=](local_steps_atom, uint32_t h) { with_machine(self, [=](step_machine& m) { m.on_local_steps(h); }); },
    [=](ring_atom, uint32_t generation, uint32_t rank, uint32_t ranks, caf::actor& next, const std::string& at) {
      auto& st = self->state;
      if (!st.machine || generation > st.machine->ring_generation())
        ring_next(self, std::move(next), at);
      with_machine(self, [=](step_machine& m) { m.on_ring(generation, rank, ranks); });
    },
    [=](ring_atom, caf::actor& next, caf::actor& out) { ring_stand_in_ready(self, next, std::move(out)); },
    [=](ring_atom, const std::string& why) { fail(self, why); },
    [=](wire::ring_message& msg) {
      with_machine(self, [&](step_machine& m) { m.on_ring_message(std::move(msg)); });
    },
    [=](lr_atom, float factor) {
      self->state.lr_factor = factor;
      if (self->state.machine)
        self->state.machine->on_lr(factor);
    },
    [=](stage_atom, const std::string& stage, uint32_t h, float lr_scale, float pull_ratio) {
      with_machine(self, [&](step_machine& m) { m.on_stage(stage, h, lr_scale, pull_ratio); });
    },
  };
}

}  // namespace

worker_actor spawn_worker(caf::actor_system& sys, worker_config cfg) {
  return sys.spawn(worker_behavior, std::move(cfg));
}

std::vector<worker_actor> start_local_workers(caf::actor_system& sys, uint32_t n, const worker_config& base,
                                              const std::function<backend_factory()>& next_backend) {
  std::vector<worker_actor> out;
  for (uint32_t i = 0; i < n; ++i) {
    worker_config wc = base;
    if (next_backend)
      wc.make_backend = next_backend();
    wc.requested_id = i;
    out.push_back(spawn_worker(sys, std::move(wc)));
    caf::anon_send(out.back(), start_atom::value);
  }
  return out;
}

}  // namespace ashlar::actors
