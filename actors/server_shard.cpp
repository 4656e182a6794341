#include "actors/server_shard.hpp"

#include <filesystem>
#include <optional>

#include "runtime/compress/topk.hpp"
#include "runtime/store/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <memory>

#include <spdlog/spdlog.h>

namespace ashlar::actors {

namespace {

std::string fmt_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

using clock_type = std::chrono::steady_clock;

struct held_read {
  wire::pull_request req;
  caf::typed_response_promise<wire::pull_reply> promise;
  clock_type::time_point since;
};

// A read larger than one chunk: a reference to the parameter version it began at, so
// every chunk of it belongs to that version (the shard never writes a referenced one).
struct frozen_read {
  uint64_t id = 0;
  std::shared_ptr<const std::vector<float>> data;
  uint64_t version = 0;
};

// Pull compression: what one worker holds of this shard's range, as far as the shard
// knows, and the sequence number of the read that brought it there.
struct pull_view {
  std::vector<float> params;
  uint64_t seq = 0;
};

struct shard_state {
  static constexpr const char* name = "ashlar.shard";
  std::unique_ptr<shard_core> core;
  std::vector<held_read> held;
  std::map<uint32_t, frozen_read> reads;   // by worker
  uint64_t next_read = 1;
  std::vector<float> dense; // a sparse push, densified
  std::map<uint32_t, pull_view> views; // delta reads: by worker, members only
  std::set<uint32_t> members;          // workers the scheduler announced (join, not yet left)
  uint64_t next_view_seq = 1;
  topk_scratch topk;          // delta reads: selection scratch
  std::vector<float> diff;    //   the difference from the view,
  std::vector<float> values;  //   and the values sent
  shard_persistence persistence;
  std::unique_ptr<async_checkpointer> writer;
  // A cut asked for at a version the shard has not reached yet (lockstep policies: every
  // shard writes the same round): written when the shard makes that version.
  std::optional<std::pair<uint64_t, uint64_t>> due_cut; // cut, at version
};

using shard_pointer = shard_actor::stateful_pointer<shard_state>;

// A reply referencing [offset, offset + len) of a parameter version: no floats are copied.
wire::pull_reply chunk_of(const shard_core& core, const std::shared_ptr<const std::vector<float>>& data,
                          uint64_t version, uint64_t offset, uint64_t len) {
  wire::pull_reply r;
  r.shard_id = core.range().shard_id;
  r.version = version;
  r.begin = core.range().begin;
  r.params = wire::shared_tensor{data, offset, len};
  r.offset = offset;
  r.total = data->size();
  return r;
}

// A delta read (pull compression with error feedback): the entries where the current
// parameters differ most from the worker's view, as their current values; the view takes
// them. Whatever is not sent stays in the difference and goes with a later read.
wire::pull_reply delta_read(shard_state& st, pull_view& view, const wire::pull_request& req) {
  const auto& core = *st.core;
  const uint64_t total = core.params().size();
  // The ratio came as a float: 0.2f x 10 is a hair above 2, which is 2 entries, not 3.
  const auto k = static_cast<size_t>(std::ceil(static_cast<double>(req.topk_ratio) * static_cast<double>(total) * (1 - 1e-6)));
  std::vector<uint32_t> index;
  delta_topk(core.params().data(), view.params, std::clamp<size_t>(k, 1, total), st.topk, st.diff, index,
             st.values);
  wire::pull_reply r;
  r.shard_id = core.range().shard_id;
  r.version = core.version();
  r.begin = core.range().begin;
  r.total = total;
  r.sparse = true;
  r.index = std::move(index);
  std::copy(st.values.begin(), st.values.end(), r.params.reset(st.values.size()));
  view.seq = st.next_view_seq++;
  r.view_seq = view.seq;
  return r;
}

// Starts a read the policy allows: the whole range in one reply, or its first chunk with
// the rest frozen for the requests that follow. With pull compression asked for, a worker
// whose view the shard knows gets a delta read; any other gets this dense read, and the
// shard starts a view of it (the worker's reply names it).
wire::pull_reply begin_read(shard_state& st, const wire::pull_request& req, uint64_t wait_ns) {
  const auto& core = *st.core;
  const uint64_t total = core.params().size();
  pull_view* view = nullptr;
  // A view is a copy of the range: only the job's members get one, so a peer inventing
  // worker ids makes the shard hold no more memory.
  if (req.topk_ratio > 0 && !req.snapshot && st.members.count(req.worker_id) > 0) {
    view = &st.views[req.worker_id];
    if (view->seq != 0 && view->seq == req.view_seq && view->params.size() == total) {
      auto r = delta_read(st, *view, req);
      r.wait_ns = wait_ns;
      return r;
    }
    view->params = core.params();
    view->seq = st.next_view_seq++;
  }
  wire::pull_reply r;
  // An evaluation's snapshot reads the running average where the shard keeps one.
  auto data = req.snapshot && req.average ? core.average_copy() : core.shared_params();
  if (req.max_floats == 0 || req.max_floats >= total) {
    r = chunk_of(core, data, core.version(), 0, total);
  } else {
    frozen_read f{st.next_read++, std::move(data), core.version()};
    r = chunk_of(core, f.data, f.version, 0, req.max_floats);
    r.read_id = f.id;
    st.reads[req.worker_id] = std::move(f);
  }
  r.wait_ns = wait_ns;
  r.view_seq = view ? view->seq : 0;
  return r;
}

// Answers every held read the policy now allows, in arrival order.
void release_reads(shard_pointer self) {
  auto& st = self->state;
  auto now = clock_type::now();
  auto keep = st.held.begin();
  for (auto i = st.held.begin(); i != st.held.end(); ++i) {
    if (!st.core->applying() && (i->req.snapshot || st.core->may_read(i->req.worker_id))) {
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

// Hands the current version to the checkpoint writer as cut `cut` (0: the stop record).
void checkpoint(shard_pointer self, uint64_t cut) {
  auto& st = self->state;
  const auto& core = *st.core;
  st.writer->submit(core.version(), cut, core.range().begin, core.range().end, core.shared_params(),
                    core.velocity(), core.average(), core.average_samples());
}

// After a version was made: the cut waiting for it, if this is its version.
void after_version(shard_pointer self) {
  auto& st = self->state;
  if (st.writer && st.due_cut && st.core->version() >= st.due_cut->second) {
    checkpoint(self, st.due_cut->first);
    st.due_cut.reset();
  }
}

// The cut `cut` of this shard's store, restored into the core (the cuts after it and the
// stop record deleted: the job goes on from here).
caf::result<uint64_t> restore_cut(shard_pointer self, uint64_t cut) {
  auto& st = self->state;
  auto& core = *st.core;
  const auto id = core.range().shard_id;
  if (!st.persistence.store)
    return make_error(errc::invalid_state, "shard " + std::to_string(id) + " keeps no checkpoints");
  checkpoint_log log{*st.persistence.store, id, st.persistence.keep};
  if (cut == 0) {
    // From the beginning: the initial parameters stay, every cut this store holds goes.
    if (auto err = log.discard_after(0))
      return err;
    if (st.writer)
      st.writer->keep_cut(0);
    return core.version();
  }
  auto c = log.load(cut);
  if (!c)
    return make_error(errc::corrupt_data, "shard " + std::to_string(id) + ": " + describe(c.error()));
  if (c->begin != core.range().begin || c->end != core.range().end)
    return make_error(errc::shape_mismatch, "shard " + std::to_string(id) + ": cut " + std::to_string(cut)
                                              + " in " + st.persistence.store->where() + " holds ["
                                              + std::to_string(c->begin) + ", " + std::to_string(c->end)
                                              + "), this job's shard is [" + std::to_string(core.range().begin)
                                              + ", " + std::to_string(core.range().end) + ")");
  const auto version = c->version;
  if (auto err = core.restore(version, std::move(c->params), std::move(c->velocity), std::move(c->average),
                              c->average_samples))
    return err;
  if (auto err = log.discard_after(cut))
    return err;
  if (st.writer) // the job goes on from this cut: the cuts written next keep it
    st.writer->keep_cut(cut);
  spdlog::info("shard {}: restored version {} (checkpoint cut {}) from {}", id, version, cut,
               st.persistence.store->where());
  return version;
}

shard_actor::behavior_type shard_behavior(shard_pointer self, std::unique_ptr<shard_core> core,
                                          shard_persistence persistence) {
  self->state.core = std::move(core);
  auto& st = self->state;
  st.persistence = std::move(persistence);
  if (st.persistence.store)
    st.writer = std::make_unique<async_checkpointer>(*st.persistence.store, st.core->range().shard_id,
                                                     st.persistence.keep);
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
        auto r = chunk_of(*st.core, i->second.data, i->second.version, req.offset, len);
        r.read_id = req.read_id;
        if (req.offset + len == data.size())
          st.reads.erase(i); // chunks are requested in order: this was the last
        return r;
      }
      // A push being applied piece by piece is not a version yet: reads wait for it.
      if (!st.core->applying() && (req.snapshot || st.core->may_read(req.worker_id)))
        return begin_read(st, req, 0);
      auto promise = self->make_response_promise<wire::pull_reply>();
      st.held.push_back(held_read{req, promise, clock_type::now()});
      return promise;
    },
    [=](const wire::push& msg) -> caf::result<wire::push_ack> {
      auto& st = self->state;
      auto& core = *st.core;
      const uint64_t range = core.range().size();
      const size_t n = msg.grad.size();
      expected<push_outcome> out{push_outcome{}};
      bool complete = true;
      if (msg.sparse) {
        // Top-k: the entries sent, every other one zero. The policy sees a whole push.
        auto bad = [&](const std::string& what) {
          return make_error(errc::shape_mismatch, "shard " + std::to_string(core.range().shard_id)
                                                    + " got a sparse push from worker "
                                                    + std::to_string(msg.worker_id) + " " + what);
        };
        if (msg.offset != 0 || (msg.total != 0 && msg.total != range))
          return bad("at offset " + std::to_string(msg.offset) + " of " + std::to_string(msg.total)
                     + "; sparse pushes are whole (its range holds " + std::to_string(range) + ")");
        if (msg.index.size() != n)
          return bad("with " + std::to_string(msg.index.size()) + " indices for " + std::to_string(n)
                     + " values");
        st.dense.assign(range, 0.0f);
        for (size_t j = 0; j < n; ++j) {
          if (msg.index[j] >= range)
            return bad("with index " + std::to_string(msg.index[j]) + " outside its range of "
                       + std::to_string(range));
          st.dense[msg.index[j]] += msg.grad[j];
        }
        out = core.push(msg.worker_id, msg.base_version, msg.batch_size, st.dense.data(), range);
      } else if (msg.total != 0 && !(msg.offset == 0 && n == msg.total)) {
        // One chunk of a larger push: the policy decides at the first, and each chunk is
        // used as it arrives (applied in place or written into the round), no assembling.
        if (msg.total != range || msg.offset + n > range || n == 0)
          return make_error(errc::shape_mismatch,
                            "shard " + std::to_string(core.range().shard_id) + " got a chunk ["
                              + std::to_string(msg.offset) + ", +" + std::to_string(n) + ") of "
                              + std::to_string(msg.total) + " from worker "
                              + std::to_string(msg.worker_id) + ", its range holds "
                              + std::to_string(range));
        if (msg.offset == 0)
          out = core.begin_push(msg.worker_id, msg.base_version, msg.batch_size, range);
        if (out)
          out = core.push_piece(msg.worker_id, msg.offset, msg.grad.data(), n);
        complete = msg.offset + n == range;
      } else {
        out = core.push(msg.worker_id, msg.base_version, msg.batch_size, msg.grad.data(), n);
      }
      if (!out) {
        spdlog::warn("shard {}: rejected push from worker {}: {}", core.range().shard_id,
                     msg.worker_id, describe(out.error()));
        return std::move(out.error());
      }
      if (out->version_bumped || (!st.held.empty() && !core.applying()))
        release_reads(self);
      if (out->version_bumped)
        after_version(self);
      wire::push_ack ack;
      ack.shard_id = core.range().shard_id;
      ack.version = out->version;
      ack.staleness = out->staleness;
      ack.complete = complete;
      ack.outcome = out->kind == push_decision::apply    ? wire::push_ack::applied
                    : out->kind == push_decision::buffer ? wire::push_ack::buffered
                                                         : wire::push_ack::dropped;
      return ack;
    },
    [=](const wire::membership_change& m) -> caf::ok_atom {
      auto& st = self->state;
      if (m.kind == wire::membership_change::join) {
        st.core->join(m.worker_id);
        st.members.insert(m.worker_id);
        spdlog::debug("shard {}: worker {} joined", st.core->range().shard_id, m.worker_id);
      } else {
        bool bumped = st.core->leave(m.worker_id);
        st.reads.erase(m.worker_id);
        st.views.erase(m.worker_id);
        st.members.erase(m.worker_id);
        spdlog::debug("shard {}: worker {} left ({})", st.core->range().shard_id, m.worker_id,
                      m.reason);
        // A leaving worker's own held reads are never answered by the policy: release them.
        if (bumped || !st.held.empty())
          release_reads(self);
        if (bumped)
          after_version(self);
      }
      return caf::ok_atom::value;
    },
    [=](tune_atom, uint32_t k, bool async) { self->state.core->tune(k, async); },
    [=](checkpoint_atom, uint64_t cut, uint64_t at_version, uint64_t committed) -> caf::result<uint64_t> {
      // A cut of the job: written in the background (the status says when it is on disk),
      // now or once the shard makes version `at_version`. The job's last committed cut
      // stays in the store however many cuts after it are abandoned (a node lost again and
      // again): a resume, or this shard served again, goes back to it.
      auto& st = self->state;
      if (!st.writer)
        return make_error(errc::invalid_state,
                          "shard " + std::to_string(st.core->range().shard_id) + " keeps no checkpoints");
      if (cut == 0)
        return make_error(errc::invalid_argument, "checkpoint cut 0 is not a cut");
      st.writer->keep_cut(std::max(st.writer->kept_cut(), committed)); // a restore's cut stands until a later one
      st.due_cut.reset();
      if (at_version != 0 && at_version < st.core->version())
        return make_error(errc::invalid_state, "shard " + std::to_string(st.core->range().shard_id)
                                                 + " was at version " + std::to_string(st.core->version())
                                                 + ", past the cut's version " + std::to_string(at_version));
      if (at_version > st.core->version())
        st.due_cut.emplace(cut, at_version);
      else
        checkpoint(self, cut);
      return st.core->version();
    },
    [=](checkpoint_atom, caf::get_atom) -> caf::result<std::vector<uint64_t>> {
      auto& st = self->state;
      if (!st.persistence.store)
        return std::vector<uint64_t>{};
      return checkpoint_log{*st.persistence.store, st.core->range().shard_id, st.persistence.keep}.intact_cuts();
    },
    [=](restore_atom, uint64_t cut) { return restore_cut(self, cut); },
    [=](restore_atom, std::vector<float>& params) -> caf::result<uint64_t> {
      // The divergence guard's snapshot of this range: the parameters go back, the
      // momentum starts over, the version goes on (rounds count on it).
      auto& st = self->state;
      auto& core = *st.core;
      const auto v = core.version();
      if (auto err = core.restore(v, std::move(params), {}))
        return err;
      st.views.clear(); // delta reads start over from a dense pull
      return v;
    },
    [=](checkpoint_atom) -> uint64_t {
      // The node stops this shard mid-job: its current version as the stop record, on
      // disk before the shard answers.
      auto& st = self->state;
      if (!st.writer)
        return 0;
      checkpoint(self, 0);
      auto v = st.writer->flush();
      auto t = st.writer->stats();
      if (t.seconds > 0)
        spdlog::info("shard {}: {} checkpoints ({} skipped while the store was busy), {:.1f} MB written in "
                     "{:.2f} s ({:.0f} MB/s)",
                     st.core->range().shard_id, t.written, t.skipped, t.bytes / 1e6, t.seconds,
                     t.bytes / 1e6 / t.seconds);
      return v;
    },
    [=](lr_atom, float factor) { self->state.core->set_schedule_scale(factor); },
    [=](bound_atom, uint64_t bound, float lr_scale) {
      self->state.core->set_staleness_bound(bound);
      self->state.core->set_lr_scale(lr_scale);
      release_reads(self); // a wider bound lets held reads go
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
      if (self->state.writer) {
        auto t = self->state.writer->stats();
        s.cut = t.newest_cut;
        s.cut_error = t.error;
      }
      return s;
    },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& sys, std::unique_ptr<shard_core> core, shard_persistence persistence) {
  return sys.spawn(shard_behavior, std::move(core), std::move(persistence));
}

expected<shard_persistence> open_shard_persistence(const std::string& dir, uint32_t keep, bool resume,
                                                   shard_core& core, const store_owner& owner) {
  const auto id = core.range().shard_id;
  const std::string path = dir + "/shard-" + std::to_string(id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create the checkpoint directory " + dir + ": " + ec.message());
  auto gen = store_generation_of(path);
  if (!gen)
    return gen.error();
  auto store = open_rocksdb_store(gen->path, open_mode::create);
  if (!store && resume && owner.watch && is(store.error(), errc::busy)) {
    // Held by another process: the node the cluster lost, frozen or hung, or still
    // running and about to notice. Its lease tells which (store_lease.hpp).
    auto lease = read_lease(gen->path);
    if (!lease)
      return lease.error();
    if (!*lease)
      return store.error(); // a holder without a lease: nothing tells whether it runs
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    const auto seen = owner.watch->observe(path, **lease, now, owner.stale_s);
    const auto holder = lease_holder(**lease);
    if (!seen.stale)
      return make_error(errc::busy, "shard " + std::to_string(id) + ": its checkpoint store " + gen->path
                                      + " is held by " + holder + (seen.unchanged_s > 0 ? ", whose lease has not "
                                        "changed for " + fmt_seconds(seen.unchanged_s) : std::string{})
                                      + "; it is taken over once that lease has not changed for "
                                      + fmt_seconds(owner.stale_s) + " (a holder that runs renews it twice a "
                                        "second)");
    auto taken = take_over_store(path);
    owner.watch->forget(path);
    if (!taken)
      return taken.error();
    spdlog::warn("shard {}: took over its checkpoint store from {}, whose lease had not changed for {} (a process "
                 "frozen or hung): {} now holds its records; {} is left to that process",
                 id, holder, fmt_seconds(seen.unchanged_s), taken->now.path, taken->abandoned);
    *gen = taken->now;
    store = std::move(taken->store);
  }
  if (!store)
    return store.error();
  if (owner.watch)
    owner.watch->forget(path);
  shard_persistence p;
  p.store = std::move(*store);
  p.keep = keep;
  auto lease = store_lease::take(gen->path, owner.holder.empty() ? default_lease_holder() : owner.holder);
  if (!lease)
    return lease.error();
  p.lease = std::move(*lease);
  if (resume) {
    checkpoint_log log{*p.store, id, keep};
    auto c = log.load_latest();
    if (!c)
      return c.error();
    if (!*c) {
      // Serving a lost shard again from nothing would mix a fresh range into a trained
      // model: refused (this node cannot see the shard's checkpoints).
      return make_error(errc::invalid_state, "shard " + std::to_string(id) + ": no checkpoint in " + path
                                               + " to serve it again from (is the job's checkpoint directory "
                                                 "reachable from this node?)");
    } else {
      auto& ck = **c;
      if (ck.begin != core.range().begin || ck.end != core.range().end)
        return make_error(errc::shape_mismatch, "shard " + std::to_string(id) + ": the checkpoint in " + path
                                                  + " holds [" + std::to_string(ck.begin) + ", "
                                                  + std::to_string(ck.end) + "), this job's shard is ["
                                                  + std::to_string(core.range().begin) + ", "
                                                  + std::to_string(core.range().end) + ")");
      const auto version = ck.version;
      if (auto err = core.restore(version, std::move(ck.params), std::move(ck.velocity), std::move(ck.average),
                                  ck.average_samples))
        return err;
      spdlog::info("shard {}: restored version {} ({}) from {}", id, version,
                   ck.cut != 0 ? "checkpoint cut " + std::to_string(ck.cut) : std::string{"its stop record"}, path);
    }
  }
  return p;
}

}  // namespace ashlar::actors
