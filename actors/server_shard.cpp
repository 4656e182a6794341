#include "actors/server_shard.hpp"

#include <chrono>

#include <spdlog/spdlog.h>

namespace ashlar::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct held_read {
  wire::pull_request req;
  caf::typed_response_promise<wire::pull_reply> promise;
  clock_type::time_point since;
};

struct shard_state {
  static constexpr const char* name = "ashlar.shard";
  std::unique_ptr<shard_core> core;
  std::vector<held_read> held;
};

using shard_pointer = shard_actor::stateful_pointer<shard_state>;

wire::pull_reply snapshot(const shard_core& core, uint64_t wait_ns) {
  wire::pull_reply r;
  r.shard_id = core.range().shard_id;
  r.version = core.version();
  r.begin = core.range().begin;
  r.params = core.params();
  r.wait_ns = wait_ns;
  return r;
}

// Answers every held read the policy now allows, in arrival order.
void release_reads(shard_pointer self) {
  auto& st = self->state;
  auto now = clock_type::now();
  auto keep = st.held.begin();
  for (auto i = st.held.begin(); i != st.held.end(); ++i) {
    if (st.core->may_read(i->req.worker_id)) {
      auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(now - i->since).count();
      i->promise.deliver(snapshot(*st.core, static_cast<uint64_t>(waited)));
    } else {
      if (keep != i)
        *keep = std::move(*i);
      ++keep;
    }
  }
  st.held.erase(keep, st.held.end());
}

shard_actor::behavior_type shard_behavior(shard_pointer self, std::unique_ptr<shard_core> core) {
  self->state.core = std::move(core);
  return {
    [=](const wire::pull_request& req) -> caf::result<wire::pull_reply> {
      auto& st = self->state;
      if (req.snapshot || st.core->may_read(req.worker_id))
        return snapshot(*st.core, 0);
      auto promise = self->make_response_promise<wire::pull_reply>();
      st.held.push_back(held_read{req, promise, clock_type::now()});
      return promise;
    },
    [=](const wire::push& msg) -> caf::result<wire::push_ack> {
      auto& st = self->state;
      auto out = st.core->push(msg.worker_id, msg.base_version, msg.batch_size, msg.grad.data(),
                               msg.grad.size());
      if (!out) {
        spdlog::warn("shard {}: rejected push from worker {}: {}", st.core->range().shard_id,
                     msg.worker_id, describe(out.error()));
        return std::move(out.error());
      }
      if (out->version_bumped)
        release_reads(self);
      wire::push_ack ack;
      ack.shard_id = st.core->range().shard_id;
      ack.version = out->version;
      ack.staleness = out->staleness;
      ack.outcome = out->kind == push_decision::apply    ? wire::push_ack::applied
                    : out->kind == push_decision::buffer ? wire::push_ack::buffered
                                                         : wire::push_ack::dropped;
      return ack;
    },
    [=](const wire::membership_change& m) -> caf::ok_atom {
      auto& st = self->state;
      if (m.kind == wire::membership_change::join) {
        st.core->join(m.worker_id);
        spdlog::debug("shard {}: worker {} joined", st.core->range().shard_id, m.worker_id);
      } else {
        bool bumped = st.core->leave(m.worker_id);
        spdlog::debug("shard {}: worker {} left ({})", st.core->range().shard_id, m.worker_id,
                      m.reason);
        // A leaving worker's own held reads are never answered by the policy: release them.
        if (bumped || !st.held.empty())
          release_reads(self);
      }
      return caf::ok_atom::value;
    },
    [=](status_atom) -> wire::shard_status {
      const auto& core = *self->state.core;
      wire::shard_status s;
      s.shard_id = core.range().shard_id;
      s.version = core.version();
      s.begin = core.range().begin;
      s.end = core.range().end;
      const auto& c = core.counters();
      s.pushes = c.pushes;
      s.applied = c.applied;
      s.dropped = c.dropped;
      s.staleness_sum = c.staleness_sum;
      s.staleness_max = c.staleness_max;
      s.live_workers.assign(core.policy().live().begin(), core.policy().live().end());
      s.pending_reads = static_cast<uint32_t>(self->state.held.size());
      return s;
    },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& sys, std::unique_ptr<shard_core> core) {
  return sys.spawn(shard_behavior, std::move(core));
}

}  // namespace ashlar::actors
