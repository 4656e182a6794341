#include "actors/server_shard.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include <spdlog/spdlog.h>

namespace ashlar::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct held_read {
  wire::pull_request req;
  caf::typed_response_promise<wire::pull_reply> promise;
  clock_type::time_point since;
};

// A read larger than one chunk: the parameters as they were when it began, so every
// chunk of it belongs to the same version.
struct frozen_read {
  uint64_t id = 0;
  std::shared_ptr<const std::vector<float>> data;
  uint64_t version = 0;
};

// A push arriving in chunks, assembled before the policy sees it.
struct staged_push {
  uint64_t base_version = 0;
  uint32_t batch = 0;
  std::vector<float> grad;
  uint64_t received = 0;
};

struct shard_state {
  static constexpr const char* name = "ashlar.shard";
  std::unique_ptr<shard_core> core;
  std::vector<held_read> held;
  std::map<uint32_t, frozen_read> reads;   // by worker
  std::map<uint32_t, staged_push> staging; // by worker
  uint64_t next_read = 1;
};

using shard_pointer = shard_actor::stateful_pointer<shard_state>;

wire::pull_reply chunk_of(const shard_core& core, const std::vector<float>& data, uint64_t version,
                          uint64_t offset, uint64_t len) {
  wire::pull_reply r;
  r.shard_id = core.range().shard_id;
  r.version = version;
  r.begin = core.range().begin;
  r.params.assign(data.begin() + static_cast<std::ptrdiff_t>(offset),
                  data.begin() + static_cast<std::ptrdiff_t>(offset + len));
  r.offset = offset;
  r.total = data.size();
  return r;
}

// Starts a read the policy allows: the whole range in one reply, or its first chunk with
// the rest frozen for the requests that follow.
wire::pull_reply begin_read(shard_state& st, const wire::pull_request& req, uint64_t wait_ns) {
  const auto& core = *st.core;
  const uint64_t total = core.params().size();
  wire::pull_reply r;
  if (req.max_floats == 0 || req.max_floats >= total) {
    r = chunk_of(core, core.params(), core.version(), 0, total);
  } else {
    frozen_read f{st.next_read++, std::make_shared<const std::vector<float>>(core.params()),
                  core.version()};
    r = chunk_of(core, *f.data, f.version, 0, req.max_floats);
    r.read_id = f.id;
    st.reads[req.worker_id] = std::move(f);
  }
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
      i->promise.deliver(begin_read(st, i->req, static_cast<uint64_t>(waited)));
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
      if (req.read_id != 0) {
        // A later chunk of a read already begun.
        auto i = st.reads.find(req.worker_id);
        if (i == st.reads.end() || i->second.id != req.read_id)
          return make_error(errc::invalid_state, "shard " + std::to_string(st.core->range().shard_id)
                                                   + " has no read " + std::to_string(req.read_id)
                                                   + " of worker " + std::to_string(req.worker_id));
        const auto& data = *i->second.data;
        if (req.offset >= data.size() || req.max_floats == 0)
          return make_error(errc::invalid_argument, "chunk offset " + std::to_string(req.offset)
                                                      + " is outside the range of "
                                                      + std::to_string(data.size()));
        uint64_t len = std::min<uint64_t>(req.max_floats, data.size() - req.offset);
        auto r = chunk_of(*st.core, data, i->second.version, req.offset, len);
        r.read_id = req.read_id;
        if (req.offset + len == data.size())
          st.reads.erase(i); // chunks are requested in order: this was the last
        return r;
      }
      if (req.snapshot || st.core->may_read(req.worker_id))
        return begin_read(st, req, 0);
      auto promise = self->make_response_promise<wire::pull_reply>();
      st.held.push_back(held_read{req, promise, clock_type::now()});
      return promise;
    },
    [=](const wire::push& msg) -> caf::result<wire::push_ack> {
      auto& st = self->state;
      const uint64_t range = st.core->range().size();
      const float* grad = msg.grad.data();
      size_t n = msg.grad.size();
      uint64_t base = msg.base_version;
      uint32_t batch = msg.batch_size;
      if (msg.total != 0 && !(msg.offset == 0 && n == msg.total)) {
        // One chunk of a larger push: stage it, and hand the whole gradient on at the end.
        if (msg.total != range || msg.offset + n > range || n == 0)
          return make_error(errc::shape_mismatch,
                            "shard " + std::to_string(st.core->range().shard_id) + " got a chunk ["
                              + std::to_string(msg.offset) + ", +" + std::to_string(n) + ") of "
                              + std::to_string(msg.total) + " from worker "
                              + std::to_string(msg.worker_id) + ", its range holds "
                              + std::to_string(range));
        auto& s = st.staging[msg.worker_id];
        if (msg.offset == 0 || s.grad.size() != range || s.base_version != msg.base_version) {
          s.base_version = msg.base_version;
          s.batch = msg.batch_size;
          s.grad.resize(range);
          s.received = 0;
        }
        std::copy(msg.grad.begin(), msg.grad.end(), s.grad.begin() + static_cast<std::ptrdiff_t>(msg.offset));
        s.received += n;
        if (s.received < range) {
          wire::push_ack part;
          part.shard_id = st.core->range().shard_id;
          part.version = st.core->version();
          part.complete = false;
          return part;
        }
        grad = s.grad.data();
        n = s.grad.size();
        base = s.base_version;
        batch = s.batch;
      }
      auto out = st.core->push(msg.worker_id, base, batch, grad, n);
      if (auto i = st.staging.find(msg.worker_id); i != st.staging.end() && i->second.received >= range)
        st.staging.erase(i);
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
        st.reads.erase(m.worker_id);
        st.staging.erase(m.worker_id);
        spdlog::debug("shard {}: worker {} left ({})", st.core->range().shard_id, m.worker_id,
                      m.reason);
        // A leaving worker's own held reads are never answered by the policy: release them.
        if (bumped || !st.held.empty())
          release_reads(self);
      }
      return caf::ok_atom::value;
    },
    [=](tune_atom, uint32_t k, bool async) { self->state.core->tune(k, async); },
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
