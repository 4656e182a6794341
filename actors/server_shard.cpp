#include "runtime/os/paths.hpp"
#include "actors/actor_clock.hpp"
#include "actors/server_shard.hpp"

#include <filesystem>
#include <optional>

#include "runtime/compress/topk.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/server/shard_sessions.hpp"
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

struct shard_state {
  static constexpr const char* name = "ashlar.shard";
  // The actor system's clock, the one its timers run on: its sessions read it.
  actor_clock_source clock;
  std::unique_ptr<shard_core> core;
  // Reads, pushes, membership and the cut schedule (runtime/server/shard_sessions.hpp).
  std::unique_ptr<shard_sessions> sessions;
  // Held reads' promises, and held pushes', by the ticket the sessions gave them.
  std::map<uint64_t, caf::typed_response_promise<wire::pull_reply>> promises;
  std::map<uint64_t, caf::typed_response_promise<wire::push_ack>> ack_promises;
  shard_persistence persistence;
  std::unique_ptr<async_checkpointer> writer;
};

using shard_pointer = shard_actor::stateful_pointer<shard_state>;

// Hands the current version to the checkpoint writer as cut `cut` (0: the stop record).
void checkpoint(shard_pointer self, uint64_t cut) {
  auto& st = self->state;
  const auto& core = *st.core;
  st.writer->submit(core.version(), cut, core.range().begin, core.range().end, core.shared_params(),
                    core.velocity(), core.average(), core.average_samples());
}

// Answers held pushes whose reads were answered (or whose workers moved on).
void deliver_acks(shard_pointer self, shard_sessions::held_acks& acks) {
  auto& st = self->state;
  for (auto& [ticket, ack] : acks) {
    auto p = st.ack_promises.find(ticket);
    if (p == st.ack_promises.end())
      continue;
    p->second.deliver(std::move(ack));
    st.ack_promises.erase(p);
  }
}

// Carries out what an event released: held reads answered, then the pushes held for
// them, a due cut written.
void deliver(shard_pointer self, shard_sessions::outcome out) {
  auto& st = self->state;
  for (auto& [ticket, reply] : out.released) {
    auto p = st.promises.find(ticket);
    if (p == st.promises.end())
      continue;
    p->second.deliver(std::move(reply));
    st.promises.erase(p);
  }
  deliver_acks(self, out.acks);
  if (out.cut && st.writer)
    checkpoint(self, *out.cut);
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

// A cut of the job: written in the background (the status says when it is on disk), now
// or once the shard makes version `at_version`. The job's last committed cut stays in the
// store however many cuts after it are abandoned (a node lost again and again): a resume,
// or this shard served again, goes back to it.
caf::result<uint64_t> ask_cut(shard_pointer self, uint64_t cut, uint64_t at_version, uint64_t committed) {
  auto& st = self->state;
  if (!st.writer)
    return make_error(errc::invalid_state, "shard " + std::to_string(st.core->range().shard_id)
                                             + " keeps no checkpoints");
  if (cut != 0) // a restore's cut stands until a later one
    st.writer->keep_cut(std::max(st.writer->kept_cut(), committed));
  st.writer->new_cut(); // an earlier write's failure says nothing of this cut
  auto now = st.sessions->ask_cut(cut, at_version);
  if (!now)
    return std::move(now.error());
  if (*now)
    checkpoint(self, cut);
  return st.core->version();
}

// The node stops this shard mid-job: its current version as the stop record, on disk
// before the shard answers.
uint64_t write_stop_record(shard_pointer self) {
  auto& st = self->state;
  if (!st.writer)
    return 0;
  checkpoint(self, 0);
  auto v = st.writer->flush();
  auto t = st.writer->stats();
  if (t.seconds > 0)
    spdlog::info("shard {}: {} checkpoints ({} skipped while the store was busy), {:.1f} MB written in "
                 "{:.2f} s ({:.0f} MB/s)",
                 st.core->range().shard_id, t.written, t.skipped, t.bytes / 1e6, t.seconds, t.bytes / 1e6 / t.seconds);
  return v;
}

wire::shard_status status_of(const shard_state& st) {
  const auto& core = *st.core;
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
  s.samples = c.samples;
  s.live_workers.assign(core.policy().live().begin(), core.policy().live().end());
  s.pending_reads = static_cast<uint32_t>(st.sessions->held_reads());
  if (s.pending_reads > 0 || st.sessions->held_pushes() > 0) {
    s.holding_up = core.policy().holding_up();
    s.held_seconds = st.sessions->oldest_held_seconds();
  }
  if (st.writer) {
    auto t = st.writer->stats();
    s.cut = t.newest_cut;
    s.cut_error = t.error;
  }
  return s;
}

// The actor turns messages into the sessions' events and delivers their outcomes.
// The shard's state as it starts: its core, its sessions on the actor system's clock, its
// checkpoints' writer.
void init_shard_state(shard_pointer self, std::unique_ptr<shard_core> core, shard_persistence persistence) {
  auto& st = self->state;
  st.core = std::move(core);
  st.clock.bind(self->system());
  st.sessions = std::make_unique<shard_sessions>(*st.core, st.clock);
  st.persistence = std::move(persistence);
  if (st.persistence.store)
    st.writer = std::make_unique<async_checkpointer>(*st.persistence.store, st.core->range().shard_id,
                                                     st.persistence.keep);
}

shard_actor::behavior_type shard_behavior(shard_pointer self, std::unique_ptr<shard_core> core,
                                          shard_persistence persistence) {
  init_shard_state(self, std::move(core), std::move(persistence));
  return {
    [=](const wire::pull_request& req) -> caf::result<wire::pull_reply> {
      auto answer = self->state.sessions->on_read(req);
      if (!answer)
        return std::move(answer.error());
      if (answer->reply && answer->acks.empty())
        return std::move(*answer->reply);
      auto promise = self->make_response_promise<wire::pull_reply>();
      if (answer->reply) { // the reply first, then the push that waited for this read
        promise.deliver(std::move(*answer->reply));
        deliver_acks(self, answer->acks);
        return promise;
      }
      self->state.promises.emplace(answer->ticket, promise);
      return promise;
    },
    [=](const wire::push& msg) -> caf::result<wire::push_ack> {
      shard_sessions::outcome out;
      auto answer = self->state.sessions->on_push(msg, out);
      if (!answer) {
        spdlog::warn("shard {}: rejected push from worker {}: {}", self->state.core->range().shard_id, msg.worker_id,
                     describe(answer.error()));
        deliver(self, std::move(out));
        return std::move(answer.error());
      }
      deliver(self, std::move(out));
      if (answer->ack)
        return *answer->ack;
      auto promise = self->make_response_promise<wire::push_ack>(); // answered after the read that follows
      self->state.ack_promises.emplace(answer->ticket, promise);
      return promise;
    },
    // Answered with the pushes of the worker this shard took (runtime/server/shard_sessions.hpp).
    [=](const wire::membership_change& m) -> uint64_t {
      spdlog::debug("shard {}: worker {} {}", self->state.core->range().shard_id, m.worker_id,
                    m.kind == wire::membership_change::join ? "joined" : "left (" + m.reason + ")");
      const uint64_t taken = self->state.sessions->pushes_of(m.worker_id);
      deliver(self, self->state.sessions->on_member(m));
      return taken;
    },
    [=](tune_atom, uint32_t k, bool async) { self->state.core->tune(k, async); },
    [=](checkpoint_atom, uint64_t cut, uint64_t at_version, uint64_t committed) {
      return ask_cut(self, cut, at_version, committed);
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
      const auto v = st.core->version();
      if (auto err = st.core->restore(v, std::move(params), {}))
        return err;
      st.sessions->forget_views(); // delta reads start over from a dense pull
      return v;
    },
    [=](checkpoint_atom) -> uint64_t { return write_stop_record(self); },
    [=](lr_atom, float factor) { self->state.core->set_schedule_scale(factor); },
    [=](bound_atom, uint64_t bound, float lr_scale) {
      self->state.core->set_staleness_bound(bound);
      self->state.core->set_lr_scale(lr_scale);
      deliver(self, self->state.sessions->release()); // a wider bound lets held reads go
    },
    [=](status_atom) -> wire::shard_status { return status_of(self->state); },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& sys, std::unique_ptr<shard_core> core, shard_persistence persistence) {
  return sys.spawn(shard_behavior, std::move(core), std::move(persistence));
}

// A shard served again mid-job: its core restored from the newest intact record in
// `store` (named `named`); none there is refused.
static caf::error restore_newest(kv_store& store, uint32_t id, uint32_t keep, shard_core& core, const std::string& named) {
  checkpoint_log log{store, id, keep};
  auto c = log.load_latest();
  if (!c)
    return c.error();
  if (!*c) {
    // Serving a lost shard again from nothing would mix a fresh range into a trained
    // model: refused (this node cannot see the shard's checkpoints).
    return make_error(errc::invalid_state, "shard " + std::to_string(id) + ": no checkpoint in " + named
                                             + " to serve it again from (is the job's checkpoint directory "
                                               "reachable from this node?)");
  } else {
    auto& ck = **c;
    if (ck.begin != core.range().begin || ck.end != core.range().end)
      return make_error(errc::shape_mismatch, "shard " + std::to_string(id) + ": the checkpoint in " + named
                                                + " holds [" + std::to_string(ck.begin) + ", "
                                                + std::to_string(ck.end) + "), this job's shard is ["
                                                + std::to_string(core.range().begin) + ", "
                                                + std::to_string(core.range().end) + ")");
    const auto version = ck.version;
    if (auto err = core.restore(version, std::move(ck.params), std::move(ck.velocity), std::move(ck.average),
                                ck.average_samples))
      return err;
    spdlog::info("shard {}: restored version {} ({}) from {}", id, version,
                 ck.cut != 0 ? "checkpoint cut " + std::to_string(ck.cut) : std::string{"its stop record"}, named);
  }
  return caf::none;
}

static expected<shard_persistence> open_persistence(const std::string& dir, uint32_t keep, bool resume,
                                                    shard_core& core, const store_owner& owner) {
  const auto id = core.range().shard_id;
  const std::string named = dir + "/shard-" + std::to_string(id);
  // Opened through the held directory where there is one; named by the directory as given.
  const std::string path = owner.pinned ? owner.pinned->path() + "/shard-" + std::to_string(id) : named;
  // A path through the held directory, as the user named it (for messages).
  const auto shown = [&](const std::string& p) { return owner.pinned ? owner.pinned->named(p, dir) : p; };
  std::error_code ec;
  if (!owner.pinned)
    std::filesystem::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create the checkpoint directory " + dir + ": " + ec.message());
  auto gen = store_generation_of(path);
  if (!gen)
    return gen.error();
  auto store = open_rocksdb_store(gen->path, open_mode::create, shown(gen->path));
  if (!store && resume && owner.watch && is(store.error(), errc::busy)) {
    // Held by another process: the node the cluster lost, frozen or hung, or still
    // running and about to notice. Its lease tells which (store_lease.hpp).
    auto lease = read_lease(gen->path);
    if (!lease)
      return lease.error();
    if (!*lease)
      return store.error(); // a holder without a lease: nothing tells whether it runs
    const double now = std::chrono::duration<double>(steady_now().time_since_epoch()).count();
    const auto seen = owner.watch->observe(named, **lease, now, owner.stale_s);
    const auto holder = lease_holder(**lease);
    if (!seen.stale)
      return make_error(errc::busy, "shard " + std::to_string(id) + ": its checkpoint store " + shown(gen->path)
                                      + " is held by " + holder + (seen.unchanged_s > 0 ? ", whose lease has not "
                                        "changed for " + fmt_seconds(seen.unchanged_s) : std::string{})
                                      + "; it is taken over once that lease has not changed for "
                                      + fmt_seconds(owner.stale_s) + " (a holder that runs renews it twice a "
                                        "second)");
    auto taken = take_over_store(path, named);
    owner.watch->forget(named);
    if (!taken)
      return taken.error();
    spdlog::warn("shard {}: took over its checkpoint store from {}, whose lease had not changed for {} (a process "
                 "frozen or hung): {} now holds its records; {} is left to that process",
                 id, holder, fmt_seconds(seen.unchanged_s), shown(taken->now.path), shown(taken->abandoned));
    *gen = taken->now;
    store = std::move(taken->store);
  }
  if (!store)
    return store.error();
  if (owner.watch)
    owner.watch->forget(named);
  shard_persistence p;
  p.store = std::move(*store);
  p.keep = keep;
  p.pin = owner.pinned;
  auto lease = store_lease::take(gen->path, owner.holder.empty() ? default_lease_holder() : owner.holder);
  if (!lease)
    return lease.error();
  p.lease = std::move(*lease);
  if (resume)
    if (auto err = restore_newest(*p.store, id, keep, core, named))
      return err;
  return p;
}

expected<shard_persistence> open_shard_persistence(const std::string& dir, uint32_t keep, bool resume,
                                                   shard_core& core, const store_owner& owner) {
  auto p = open_persistence(dir, keep, resume, core, owner);
  if (!p && owner.pinned) // named by the directory as given, not by the held one
    return owner.pinned->named(p.error(), dir);
  return p;
}

}  // namespace ashlar::actors
