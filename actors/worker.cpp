#include "actors/worker.hpp"

#include <deque>
#include <set>
#include <optional>

#include <spdlog/spdlog.h>

#include "actors/cluster/data_plane.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/collective/ring.hpp"
#include "runtime/compress/topk.hpp"
#include "runtime/optim/sgd.hpp"

namespace ashlar::actors {

namespace {

using clock_type = std::chrono::steady_clock;

uint64_t ns_since(clock_type::time_point t) {
  return static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t).count());
}

// Progress of one shard's transfer in the current phase (pull or push).
struct transfer {
  uint64_t total = 0;
  uint64_t next = 0; // next offset to request or send
  uint64_t done = 0; // floats received (pull) or acknowledged (push)
  uint64_t read_id = 0;
  uint64_t view_seq = 0; // a dense read that starts a shard's view of this worker: its number
};

// How a worker commits, one CAF behaviour each: the worker `become`s the other one when
// a stage or a plan changes it.
enum class step_mode : uint8_t {
  every_step,  // pull, compute, push: each step is a commit (profiling, BSP, ASP, ...)
  local_steps, // H local steps on the local model, then one commit (ADSP, ASHL's AHL and SHL)
  ring,        // decentralized: all-reduce each step's gradient with the other workers
};

struct worker_state {
  static constexpr const char* name = "ashlar.worker";
  worker_config cfg;
  wire::assignment job;
  std::vector<shard_actor> shards;
  std::unique_ptr<compute_backend> backend;
  std::optional<batch_cursor> cursor;
  std::vector<float> params;
  std::vector<float> grad;
  // The backend's page locks on params and grad (a GPU backend moves them by DMA); held
  // while their buffers stay put, and dropped first (declared after them).
  std::vector<std::shared_ptr<void>> host_locks;
  std::vector<uint64_t> base_versions;
  std::vector<transfer> transfers; // per shard, in the current pull or push
  uint64_t step = 0;
  size_t pending = 0;
  bool stopped = false;
  bool stop_requested = false;
  clock_type::time_point started; // when training began here (contention profiles count from it)
  // Timings of the current step.
  clock_type::time_point phase_start;
  uint64_t pull_ns = 0, wait_ns = 0, compute_ns = 0;
  clock_type::time_point step_begin; // for the trace: when the step began here,
  uint64_t step_begin_ns = 0;        // the same on the wall clock (ns since the epoch),
  uint64_t compute_offset_ns = 0;    // and when its computation began, after step_begin
  uint64_t step_staleness = 0;       // the largest staleness the shards acknowledged
  uint32_t batch_n = 0;
  double loss = 0;
  // Pacing (job.pace_ns_per_sample) is kept to over whole steps: the host time a step
  // took beyond what it reports (the delayed message's lateness, the local update, the
  // mailbox hop to the next step: on a loaded 2-core host 0.3-1 ms a step) is owed, and
  // the next steps' waits give it back. Without this a paced worker ran 10-25% slower
  // than its speed outside communication, the more so the shorter its steps. At most
  // pace_carry_steps steps' budgets are owed: after a long stall a worker goes on at its
  // speed rather than running unpaced to catch up.
  clock_type::time_point last_begin; // the last reported step's start,
  uint64_t last_parts_ns = 0;        // what it reported (compute, pull, push, wait) less what it gave back,
  bool last_follows = false;         // and whether the current step follows it directly
  uint64_t given_ns = 0;             // pacing debt the current step gave back
  uint64_t pace_debt_ns = 0;
  uint64_t step_bytes = 0; // tensor bytes moved in the current step
  uint64_t step_dense = 0; // what they would have been uncompressed
  // Local steps (ADSP, ASHL): gradients of the steps since the last commit, summed.
  uint32_t local_steps = 1;
  uint32_t local_done = 0;
  std::vector<float> acc;
  uint32_t acc_samples = 0;
  uint32_t next_batch = 0;       // allocation: batch size from step next_batch_from on
  uint64_t next_batch_from = 0;
  std::pair<uint64_t, uint64_t> next_data; // and the part of the training set (begin, count)
  uint32_t push_samples = 0; // the batch weight of the gradient pushed (a commit's: its steps' samples)
  std::string stage;         // the training stage in force (ASHL), "" if the policy has none
  uint32_t stage_changes = 0; // behaviour changes made for a stage
  step_mode mode = step_mode::every_step; // the behaviour in force
  float local_lr_scale = 1.0f;             // the stage's learning-rate factor for local steps
  float schedule_lr_scale = 1.0f;          // the learning-rate schedule's factor (lr_atom)
  bool kernels_logged = false;             // the backend's choices, once after its first step
  // Ring mode: place on the ring, the all-reduce in progress, chunks that came early.
  uint32_t ring_rank_id = 0, ring_size = 0;
  caf::actor ring_next;
  std::optional<ashlar::ring_rank> ring;
  std::deque<wire::ring_message> ring_inbox;
  bool ring_waiting = false; // a gradient is ready, the ring is not formed yet
  bool ring_stop = false;    // the ring agreed to stop after this round
  std::vector<float> velocity, before;
  std::vector<topk_compressor> compressors; // per shard, when pushes are top-k compressed
  // Pull compression (delta reads): the fraction asked for (0: dense pulls), the
  // parameters as the shards' views of this worker hold them (local steps change
  // `params`, never this), and per shard the view's number (0: none yet).
  float pull_ratio = 0;
  std::vector<float> mirror;
  std::vector<uint64_t> view_seqs;
  uint64_t pull_dense_bytes = 0, pull_sent_bytes = 0; // over the delta-read pulls
  // Overlapped commits (job.overlap_commits, local steps only): a commit's push and the
  // pull after it run while the next local steps compute. The commit is copied out
  // (`commit`), the pull lands in `pulled`, and the local model then becomes the pull
  // minus the local steps taken since the commit (their summed gradients are `acc`).
  bool commit_inflight = false;
  bool commit_due = false;    // the next commit waits for the one in flight
  bool deferred_step = false; // a step (or the worker's finish) waits for it too
  bool model_local = false;   // params is the local model: a step needs no pull first
  clock_type::time_point due_since;
  uint64_t exposed_ns = 0;    // time spent waiting for a commit in flight
  std::vector<float> commit, pulled;
  // A lost shard (job.shard_wait_s > 0): the step in flight is abandoned and the worker
  // waits for the shard's replacement; replies of the abandoned step carry an older
  // generation and are ignored.
  uint64_t gen = 0;
  bool suspended = false;
  bool in_step = false; // a step is under way (no step_atom for the next one queued yet)
  std::set<size_t> lost; // indices into shards
};

using worker_pointer = worker_actor::stateful_pointer<worker_state>;

// Most step budgets of host time a paced worker owes itself (worker_state::pace_debt_ns).
constexpr uint64_t pace_carry_steps = 4;

void fail(worker_pointer self, const std::string& why) {
  auto& st = self->state;
  if (st.stopped)
    return;
  st.stopped = true;
  spdlog::error("worker {}: {}", st.job.worker_id, why);
  wire::membership_change m;
  m.kind = wire::membership_change::fail;
  m.worker_id = st.job.worker_id;
  m.reason = why;
  self->send(st.cfg.scheduler, m);
  self->quit(caf::exit_reason::user_shutdown);
}

void finish(worker_pointer self) {
  auto& st = self->state;
  st.stopped = true;
  spdlog::debug("worker {}: finished {} steps", st.job.worker_id, st.step);
  if (!st.compressors.empty()) {
    double dense = 0, sent = 0;
    for (const auto& c : st.compressors) {
      dense += static_cast<double>(c.dense_bytes());
      sent += static_cast<double>(c.sent_bytes());
    }
    spdlog::info("worker {}: top-k pushes sent {:.1f} MB for {:.1f} MB of gradients (compression ratio {:.1f})",
                 st.job.worker_id, sent / 1e6, dense / 1e6, sent > 0 ? dense / sent : 1.0);
  }
  if (st.pull_sent_bytes > 0)
    spdlog::info("worker {}: delta pulls received {:.1f} MB for {:.1f} MB of parameters (compression ratio {:.1f})",
                 st.job.worker_id, st.pull_sent_bytes / 1e6, st.pull_dense_bytes / 1e6,
                 static_cast<double>(st.pull_dense_bytes) / static_cast<double>(st.pull_sent_bytes));
  wire::membership_change m;
  m.kind = wire::membership_change::leave;
  m.worker_id = st.job.worker_id;
  m.reason = st.stop_requested ? "removed on request after " + std::to_string(st.step) + " steps"
                                : "finished " + std::to_string(st.step) + " steps";
  self->send(st.cfg.scheduler, m);
  self->quit();
}

void push_all(worker_pointer self);

// Shard i failed a request or went down. With a replacement allowed (job.shard_wait_s), the
// worker abandons its step and waits for one, bounded; otherwise it fails.
void shard_trouble(worker_pointer self, size_t i, const std::string& why) {
  auto& st = self->state;
  if (st.stopped)
    return;
  if (st.job.shard_wait_s <= 0 || st.mode == step_mode::ring)
    return fail(self, why);
  if (i < st.view_seqs.size())
    st.view_seqs[i] = 0; // a replacement shard knows no view of this worker
  if (st.lost.insert(i).second)
    spdlog::warn("worker {}: {}; waiting up to {:.0f} s for shard {} to be served again", st.job.worker_id, why,
                 st.job.shard_wait_s, st.job.shards[i].shard_id);
  if (!st.suspended) {
    st.suspended = true;
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(st.job.shard_wait_s * 1000)),
                       shard_atom::value, st.gen);
  }
}

// True if a reply of generation `gen` still belongs to the step in flight.
bool current(worker_pointer self, uint64_t gen) {
  const auto& st = self->state;
  return !st.stopped && !st.suspended && st.gen == gen;
}

uint64_t chunk_size(const worker_state& st, uint64_t total) {
  return st.job.chunk_floats == 0 ? total : std::min<uint64_t>(st.job.chunk_floats, total);
}

void phase_done(worker_pointer self);
void push_done(worker_pointer self, size_t i, uint64_t floats, const wire::push_ack& ack);

void commit_landed(worker_pointer self);

// Shard i's read is all here: once every shard's is, the step computes (or, for an
// overlapped commit, the pulled model lands behind the local steps).
void pull_received(worker_pointer self) {
  auto& st = self->state;
  if (--st.pending > 0)
    return;
  if (st.commit_inflight)
    return commit_landed(self);
  uint64_t all = ns_since(st.phase_start);
  st.pull_ns = all > st.wait_ns ? all - st.wait_ns : 0;
  push_all(self);
}

// A delta read from shard i: the entries sent go into the view's copy (the mirror),
// and the shard's range of the working parameters is that copy again.
void delta_received(worker_pointer self, size_t i, const wire::pull_reply& r) {
  auto& st = self->state;
  const auto& range = st.job.shards[i];
  const auto shard = std::to_string(range.shard_id);
  // The read named the view this worker's mirror holds (only replies change it, one read
  // per shard at a time), so the delta applies to it even if the pull ratio has changed
  // since the request left.
  if (st.mirror.size() != st.params.size())
    return fail(self, "shard " + shard + " sent a delta read the worker holds no view for");
  if (r.total != range.size() || r.begin != range.begin || r.offset != 0 || r.index.size() != r.params.size())
    return fail(self, "shard " + shard + " sent a delta read of " + std::to_string(r.index.size())
                        + " indices and " + std::to_string(r.params.size()) + " values for a range of "
                        + std::to_string(r.total) + " at " + std::to_string(r.begin) + ", expected "
                        + std::to_string(range.size()) + " at " + std::to_string(range.begin));
  float* view = st.mirror.data() + range.begin;
  for (size_t j = 0; j < r.index.size(); ++j) {
    if (r.index[j] >= range.size())
      return fail(self, "shard " + shard + " sent a delta read with index " + std::to_string(r.index[j])
                          + " outside its range of " + std::to_string(range.size()));
    view[r.index[j]] = r.params[j];
  }
  auto& target = st.commit_inflight ? st.pulled : st.params;
  std::copy(view, view + range.size(), target.begin() + static_cast<std::ptrdiff_t>(range.begin));
  st.base_versions[i] = r.version;
  if (!st.commit_inflight) // a pull behind the local steps holds no step up
    st.wait_ns = std::max(st.wait_ns, r.wait_ns);
  st.view_seqs[i] = r.view_seq;
  const uint64_t sent = r.index.size() * (sizeof(uint32_t) + sizeof(float));
  st.step_bytes += sent;
  st.step_dense += range.size() * sizeof(float);
  st.pull_sent_bytes += sent;
  st.pull_dense_bytes += range.size() * sizeof(float);
  auto& t = st.transfers[i];
  t.done = t.next = t.total;
  pull_received(self);
}

// Pull: the first request starts the read; once the reply names it, further chunks are
// requested with at most chunks_in_flight outstanding per shard.
void request_pull_chunk(worker_pointer self, size_t i) {
  auto& st = self->state;
  auto& t = st.transfers[i];
  wire::pull_request req{st.job.worker_id, st.job.shards[i].shard_id, false, t.next, st.job.chunk_floats,
                         t.read_id};
  if (st.pull_ratio > 0 && t.read_id == 0) {
    req.topk_ratio = st.pull_ratio;
    req.view_seq = st.view_seqs[i];
  }
  if (t.read_id != 0)
    t.next = std::min(t.total, t.next + chunk_size(st, t.total));
  const uint64_t gen = st.gen;
  self->request(st.shards[i], st.cfg.request_timeout, req)
    .then(
      [=](const wire::pull_reply& r) {
        auto& st = self->state;
        if (!current(self, gen))
          return;
        const auto& range = st.job.shards[i];
        auto& t = st.transfers[i];
        if (r.sparse)
          return delta_received(self, i, r);
        if (r.total != range.size() || r.begin != range.begin
            || r.offset + r.params.size() > range.size())
          return fail(self, "shard " + std::to_string(range.shard_id) + " sent a chunk ["
                              + std::to_string(r.offset) + ", +" + std::to_string(r.params.size())
                              + ") of " + std::to_string(r.total) + " at offset "
                              + std::to_string(r.begin) + ", expected a range of "
                              + std::to_string(range.size()) + " at " + std::to_string(range.begin));
        auto& target = st.commit_inflight ? st.pulled : st.params;
        std::copy(r.params.begin(), r.params.end(),
                  target.begin() + static_cast<std::ptrdiff_t>(range.begin + r.offset));
        st.step_bytes += r.params.size() * sizeof(float);
        st.step_dense += r.params.size() * sizeof(float);
        if (r.offset == 0)
          t.view_seq = r.view_seq;
        if (t.view_seq != 0) {
          // The shard keeps a view of this read: the mirror holds what it holds.
          if (st.mirror.size() != st.params.size())
            st.mirror.resize(st.params.size());
          std::copy(r.params.begin(), r.params.end(),
                    st.mirror.begin() + static_cast<std::ptrdiff_t>(range.begin + r.offset));
          st.pull_dense_bytes += r.params.size() * sizeof(float);
          st.pull_sent_bytes += r.params.size() * sizeof(float);
        }
        if (r.offset == 0) {
          // The first reply of a read: its version and wait, and the read's id.
          st.base_versions[i] = r.version;
          if (!st.commit_inflight)
            st.wait_ns = std::max(st.wait_ns, r.wait_ns);
          t.read_id = r.read_id;
          t.next = r.params.size();
          for (uint32_t k = 0; k < std::max(1u, st.job.chunks_in_flight) && t.next < t.total; ++k)
            request_pull_chunk(self, i);
        } else if (t.next < t.total) {
          request_pull_chunk(self, i);
        }
        t.done += r.params.size();
        if (t.done == t.total) {
          // The shard's view of this worker is this read, now that all of it is here.
          st.view_seqs[i] = t.view_seq;
          pull_received(self);
        }
      },
      [=](caf::error& err) {
        if (self->state.gen == gen)
          shard_trouble(self, i, "pull from shard " + std::to_string(self->state.job.shards[i].shard_id)
                                   + " failed: " + describe(err));
      });
}

void pull_all(worker_pointer self) {
  auto& st = self->state;
  st.phase_start = clock_type::now();
  st.wait_ns = 0;
  st.pending = st.shards.size();
  st.transfers.assign(st.shards.size(), transfer{});
  for (size_t i = 0; i < st.shards.size(); ++i) {
    st.transfers[i].total = st.job.shards[i].size();
    request_pull_chunk(self, i);
  }
}

// Push: the slice of shard i is sent in chunks, chunks_in_flight outstanding at most.
void send_push_chunk(worker_pointer self, size_t i) {
  auto& st = self->state;
  const auto& range = st.job.shards[i];
  auto& t = st.transfers[i];
  uint64_t len = std::min(chunk_size(st, t.total), t.total - t.next);
  wire::push msg;
  msg.worker_id = st.job.worker_id;
  msg.shard_id = range.shard_id;
  msg.base_version = st.base_versions[i];
  msg.batch_size = st.push_samples;
  msg.offset = t.next;
  msg.total = t.total;
  const auto& out = st.commit_inflight ? st.commit : st.grad; // local steps overwrite grad
  auto from = out.begin() + static_cast<std::ptrdiff_t>(range.begin + t.next);
  msg.grad.assign(from, from + static_cast<std::ptrdiff_t>(len));
  t.next += len;
  const uint64_t gen = st.gen;
  self->request(st.shards[i], st.cfg.request_timeout, std::move(msg))
    .then(
      [=](const wire::push_ack& ack) {
        if (current(self, gen))
          push_done(self, i, len, ack);
      },
      [=](caf::error& err) {
        if (self->state.gen == gen)
          shard_trouble(self, i, "push to shard " + std::to_string(self->state.job.shards[i].shard_id)
                                   + " failed: " + describe(err));
      });
}

// Shard i acknowledged `floats` more of the push: send the next chunk, or end the phase
// once every shard has the whole gradient.
void push_done(worker_pointer self, size_t i, uint64_t floats, const wire::push_ack& ack) {
  auto& st = self->state;
  if (st.stopped)
    return;
  st.step_staleness = std::max(st.step_staleness, ack.staleness);
  auto& t = st.transfers[i];
  t.done += floats;
  if (t.next < t.total)
    send_push_chunk(self, i);
  if (t.done == t.total && --st.pending == 0)
    phase_done(self);
}

void send_pushes(worker_pointer self);
void after_compute(worker_pointer self);
void report_step(worker_pointer self, uint64_t push_ns);

// Computes the step's gradient. A paced worker then waits out the rest of its budget
// (batch x pace) with a delayed message, never blocking a scheduler thread.
void push_all(worker_pointer self) {
  auto& st = self->state;
  auto t0 = clock_type::now();
  st.compute_offset_ns = static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - st.step_begin).count());
  auto batch = st.cursor->next(st.job.batch_size);
  auto stats = st.backend->train_step(st.params.data(), batch, st.grad.data());
  if (!stats)
    return fail(self, "step " + std::to_string(st.step) + ": " + describe(stats.error()));
  st.compute_ns = ns_since(t0);
  if (!st.kernels_logged) {
    st.kernels_logged = true;
    if (auto details = st.backend->details(); !details.empty())
      spdlog::info("worker {}: {} backend: {}", st.job.worker_id, st.backend->name(), details);
  }
  st.batch_n = static_cast<uint32_t>(batch.n);
  st.loss = stats->mean_loss();
  uint64_t budget = st.job.pace_ns_per_sample * st.batch_n;
  if (budget > 0 && !st.job.contention.empty()) {
    double t = std::chrono::duration<double>(clock_type::now() - st.started).count();
    budget = static_cast<uint64_t>(static_cast<double>(budget) * slowdown(st.job.contention, st.job.worker_id, t));
  }
  if (budget > st.compute_ns) {
    const uint64_t rest = budget - st.compute_ns;
    const uint64_t give_back = std::min(rest, st.pace_debt_ns);
    st.pace_debt_ns -= give_back;
    st.given_ns = give_back;
    st.compute_ns = budget;
    if (rest > give_back) {
      self->delayed_send(self, std::chrono::nanoseconds(rest - give_back), paced_atom::value, st.gen);
      return;
    }
  }
  after_compute(self);
}


// Top-k with error feedback: one sparse push per shard carries the largest entries of
// (gradient + residual); the rest stays in that shard's residual for the next push.
void send_sparse_pushes(worker_pointer self) {
  auto& st = self->state;
  if (st.compressors.size() != st.shards.size())
    st.compressors.assign(st.shards.size(), topk_compressor{st.job.topk_ratio});
  for (size_t i = 0; i < st.shards.size(); ++i) {
    const auto& range = st.job.shards[i];
    const auto& out = st.commit_inflight ? st.commit : st.grad;
    auto sparse = st.compressors[i].compress(out.data() + range.begin, range.size());
    if (!sparse)
      return fail(self, "compressing the push to shard " + std::to_string(range.shard_id) + ": "
                          + describe(sparse.error()));
    st.step_bytes += wire_bytes(*sparse);
    st.step_dense += range.size() * sizeof(float);
    wire::push msg;
    msg.worker_id = st.job.worker_id;
    msg.shard_id = range.shard_id;
    msg.base_version = st.base_versions[i];
    msg.batch_size = st.push_samples;
    msg.total = range.size();
    msg.sparse = true;
    msg.index = std::move(sparse->index);
    msg.grad.assign(sparse->value.begin(), sparse->value.end());
    st.transfers[i].next = st.transfers[i].total;
    const uint64_t gen = st.gen;
    self->request(st.shards[i], st.cfg.request_timeout, std::move(msg))
      .then(
        [=](const wire::push_ack& ack) {
          if (current(self, gen))
            push_done(self, i, self->state.transfers[i].total, ack);
        },
        [=](caf::error& err) {
          if (self->state.gen == gen)
            shard_trouble(self, i, "push to shard " + std::to_string(self->state.job.shards[i].shard_id)
                                     + " failed: " + describe(err));
        });
  }
}

void send_pushes(worker_pointer self) {
  auto& st = self->state;
  st.phase_start = clock_type::now();
  st.pending = st.shards.size();
  st.transfers.assign(st.shards.size(), transfer{});
  for (size_t i = 0; i < st.shards.size(); ++i)
    st.transfers[i].total = st.job.shards[i].size();
  if (st.job.topk_ratio > 0)
    return send_sparse_pushes(self);
  st.step_bytes += st.grad.size() * sizeof(float);
  st.step_dense += st.grad.size() * sizeof(float);
  for (size_t i = 0; i < st.shards.size(); ++i) {
    for (uint32_t k = 0; k < std::max(1u, st.job.chunks_in_flight) && st.transfers[i].next < st.transfers[i].total; ++k)
      send_push_chunk(self, i);
  }
}

// With local steps in force, a step's gradient is applied locally and added to the
// commit; the commit (the summed gradients) is pushed after local_steps steps, or at the
// last step. Otherwise the gradient is pushed at once (with a commit still open from
// local steps, as its last step).
void ring_begin(worker_pointer self);
void begin_commit(worker_pointer self);
void end_local_step(worker_pointer self);

// The learning rate of local steps, the stage's factor included.
float local_lr(const worker_state& st) {
  return st.job.local_lr * st.local_lr_scale * st.schedule_lr_scale;
}

// A local step: the step's gradient moves the local model.
void step_local_model(worker_state& st) {
  const float lr = local_lr(st);
  for (size_t j = 0; j < st.params.size(); ++j)
    st.params[j] -= lr * st.grad[j];
}

// Closes the open commit: its summed gradients times commit_scale go into `out` (the
// buffer its push reads), and the next commit starts empty.
void take_commit(worker_state& st, std::vector<float>& out) {
  const float scale = st.job.commit_scale;
  out.resize(st.acc.size());
  for (size_t j = 0; j < st.acc.size(); ++j) {
    out[j] = st.acc[j] * scale;
    st.acc[j] = 0.0f;
  }
  st.push_samples = st.acc_samples;
  st.acc_samples = 0;
  st.local_done = 0;
}

void after_compute(worker_pointer self) {
  auto& st = self->state;
  if (st.mode == step_mode::ring)
    return ring_begin(self); // (waits if the ring is not formed yet)
  const uint32_t h = st.mode == step_mode::local_steps ? st.local_steps : 1;
  const bool overlap = st.job.overlap_commits && st.mode == step_mode::local_steps;
  if (!overlap && h <= 1 && st.local_done == 0) {
    st.push_samples = st.batch_n;
    if (st.job.commit_scale != 1.0f)
      for (auto& g : st.grad)
        g *= st.job.commit_scale;
    return send_pushes(self);
  }
  if (st.acc.size() != st.grad.size())
    st.acc.assign(st.grad.size(), 0.0f);
  for (size_t j = 0; j < st.grad.size(); ++j)
    st.acc[j] += st.grad[j];
  st.acc_samples += st.batch_n;
  ++st.local_done;
  bool last = st.step + 1 >= st.job.steps || st.stop_requested;
  if (overlap) {
    // Every step moves the local model, a committing one too: the commit's pull comes
    // back later and takes the steps made meanwhile along (commit_landed).
    step_local_model(st);
    if (st.local_done >= h || last) {
      if (st.commit_inflight) {
        // The last commit is still on its way: this step ends when it has landed.
        st.commit_due = true;
        st.due_since = clock_type::now();
        return;
      }
      begin_commit(self);
    }
    return end_local_step(self);
  }
  if (st.local_done >= h || last) {
    take_commit(st, st.grad);
    return send_pushes(self);
  }
  // A local step: move the local model and go on without talking to the shards.
  step_local_model(st);
  report_step(self, 0);
  st.in_step = false;
  self->send(self, step_atom::value);
}

// Overlapped commits: sends the summed gradients of the steps since the last commit and
// goes on computing; the push's acknowledgements start the pull (phase_done), and the pull
// lands in commit_landed.
void begin_commit(worker_pointer self) {
  auto& st = self->state;
  take_commit(st, st.commit);
  st.commit_inflight = true;
  st.model_local = true;
  st.pulled.resize(st.params.size());
  send_pushes(self);
}

// The step is done; time spent waiting for a commit in flight counts as its push time.
void end_local_step(worker_pointer self) {
  auto& st = self->state;
  report_step(self, st.exposed_ns);
  st.exposed_ns = 0;
  st.in_step = false;
  self->send(self, step_atom::value);
}

// The pull after an overlapped commit is here: the local model is the pulled one minus
// the local steps taken since the commit (lr x their summed gradients, in acc). A step
// that waited for it (its commit due, or a stage's change of mode, or the finish) goes on.
void commit_landed(worker_pointer self) {
  auto& st = self->state;
  const float lr = local_lr(st);
  for (size_t j = 0; j < st.params.size(); ++j)
    st.params[j] = st.pulled[j] - lr * st.acc[j];
  st.commit_inflight = false;
  if (st.commit_due) {
    st.commit_due = false;
    st.exposed_ns += ns_since(st.due_since);
    begin_commit(self);
    return end_local_step(self);
  }
  if (st.deferred_step) {
    st.deferred_step = false;
    self->send(self, step_atom::value);
  }
}

// Reports the finished step to the profiler and counts it.
void report_step(worker_pointer self, uint64_t push_ns) {
  auto& st = self->state;
  wire::profile_report rep;
  rep.worker_id = st.job.worker_id;
  rep.step = st.step;
  rep.samples = st.batch_n;
  rep.loss = st.loss;
  rep.compute_ns = st.compute_ns;
  rep.pull_ns = st.pull_ns;
  rep.wait_ns = st.wait_ns;
  rep.push_ns = push_ns;
  rep.bytes = st.step_bytes;
  rep.dense_bytes = st.step_dense;
  rep.stage_changes = st.stage_changes;
  rep.start_ns = st.step_begin_ns;
  rep.compute_offset_ns = st.compute_offset_ns;
  rep.staleness = st.step_staleness;
  rep.batch = st.job.batch_size;
  if (st.cursor)
    rep.position = {st.job.data_begin, st.job.data_count, st.cursor->seed(), st.cursor->epoch(), st.cursor->pos()};
  self->send(st.cfg.profiler, rep);
  st.last_begin = st.step_begin;
  st.last_parts_ns = rep.compute_ns + rep.pull_ns + rep.wait_ns + rep.push_ns - st.given_ns;
  st.given_ns = 0;
  st.last_follows = true;
  st.pull_ns = st.wait_ns = st.step_bytes = st.step_dense = st.step_staleness = 0;
  ++st.step;
}

// Every shard has the whole gradient: report the step and go on.
void phase_done(worker_pointer self) {
  auto& st = self->state;
  if (st.commit_inflight)
    return pull_all(self); // an overlapped commit's pushes are in: its pull follows
  report_step(self, ns_since(st.phase_start));
  // Through the mailbox, so other messages are handled between steps.
  st.in_step = false;
  self->send(self, step_atom::value);
}

caf::error check_assignment(const worker_state& st, const wire::assignment& a) {
  const auto& spec = st.backend->spec();
  if (a.shards.empty() || a.shards.back().end != spec.num_params())
    return make_error(errc::shape_mismatch, "the shard map does not cover the model's "
                                              + std::to_string(spec.num_params()) + " parameters");
  if (a.data_count == 0 || a.data_begin + a.data_count > st.cfg.data->n)
    return make_error(errc::invalid_config,
                      "data share [" + std::to_string(a.data_begin) + ", "
                        + std::to_string(a.data_begin + a.data_count) + ") exceeds the "
                        + std::to_string(st.cfg.data->n) + " local training samples");
  if (st.cfg.data->dim != spec.input.size())
    return make_error(errc::shape_mismatch, "the data set's samples are " + st.cfg.data->shape.to_string()
                                              + ", the model expects " + spec.input.to_string());
  if (a.batch_size == 0)
    return make_error(errc::invalid_config, "batch size 0");
  return caf::none;
}

// Replaces each shard in another process by a data-plane stand-in where the assignment
// names an endpoint; a shard whose endpoint cannot be reached stays on CAF's path.
void use_data_plane(worker_pointer self) {
  auto& st = self->state;
  if (!st.cfg.plane || st.job.data_endpoints.size() != st.shards.size())
    return;
  size_t direct = 0;
  for (size_t i = 0; i < st.shards.size(); ++i) {
    const auto& ep = st.job.data_endpoints[i];
    if (ep.empty() || st.shards[i].node() == self->node())
      continue;
    auto proxy = st.cfg.plane->connect(st.shards[i], st.job.shards[i].shard_id, ep, st.job.data_key,
                                            caf::actor_cast<caf::actor>(self), std::chrono::seconds(5));
    if (!proxy) {
      spdlog::warn("worker {}: shard {} over CAF: {}", st.job.worker_id, st.job.shards[i].shard_id,
                   describe(proxy.error()));
      continue;
    }
    st.shards[i] = std::move(*proxy);
    ++direct;
  }
  if (direct > 0)
    spdlog::info("worker {}: {} of {} shards over direct data connections", st.job.worker_id, direct,
                 st.shards.size());
}

void start(worker_pointer self);
worker_actor::behavior_type training(worker_pointer self, step_mode mode);

// Shard `index` is served again by `shard` (through its data plane at `endpoint`, if
// any). Once no shard is missing, the abandoned step starts over with a fresh pull.
void replace_shard(worker_pointer self, uint32_t index, shard_actor shard, const std::string& endpoint) {
  auto& st = self->state;
  if (st.stopped || index >= st.shards.size())
    return;
  const auto id = st.job.shards[index].shard_id;
  if (st.cfg.plane && !endpoint.empty() && shard.node() != self->node()) {
    auto proxy = st.cfg.plane->connect(shard, id, endpoint, st.job.data_key, caf::actor_cast<caf::actor>(self),
                                       std::chrono::seconds(5));
    if (proxy)
      shard = std::move(*proxy);
    else
      spdlog::warn("worker {}: shard {} over CAF: {}", st.job.worker_id, id, describe(proxy.error()));
  }
  st.shards[index] = std::move(shard);
  self->monitor(st.shards[index]);
  st.lost.erase(index);
  spdlog::info("worker {}: shard {} is served again", st.job.worker_id, id);
  if (!st.lost.empty())
    return; // another shard is still missing
  // The step under way (if any) may wait on the lost shard, even if no error said so
  // yet: it is abandoned (its replies and its pacing carry the old generation) and
  // starts over with a fresh pull. Between steps, the queued step_atom goes on.
  const bool restart = st.suspended || st.in_step || st.deferred_step;
  st.suspended = false;
  ++st.gen;
  // An overlapped commit in flight is abandoned with the step; the next step pulls.
  st.commit_inflight = st.commit_due = st.deferred_step = st.model_local = false;
  st.last_follows = false; // the time without the shard is no host time
  st.given_ns = 0;          // and the abandoned step reports nothing
  if (restart) {
    st.in_step = false;
    st.pull_ns = st.wait_ns = st.step_bytes = st.step_dense = st.step_staleness = 0;
    self->send(self, step_atom::value);
  }
}

// Allocation moved this worker's part of the training set along with its batch: a new
// cursor over the new part (shuffled afresh), unless the part is the one in use.
caf::error take_data_part(worker_pointer self) {
  auto& st = self->state;
  auto [begin, count] = st.next_data;
  if (count == 0 || (begin == st.job.data_begin && count == st.job.data_count))
    return caf::none;
  if (begin + count > st.cfg.data->n)
    return make_error(errc::invalid_config, "the scheduler moved this worker to samples [" + std::to_string(begin)
                                              + ", " + std::to_string(begin + count) + "), beyond the "
                                              + std::to_string(st.cfg.data->n) + " local training samples");
  st.job.data_begin = begin;
  st.job.data_count = count;
  st.cursor.emplace(*st.cfg.data, begin, count, st.job.seed + st.step);
  return caf::none;
}

// ---- ring mode ----
// Each step's gradient, weighted by the step's batch, is summed over the ring (its last
// two entries carry the batch and a stop vote), divided by the ring's total batch and
// applied by every worker alike, so the replicas stay identical. Rank 0 then pushes the
// update to the shards, which mirror the model for evaluation.

void ring_send(worker_pointer self) {
  auto& st = self->state;
  if (auto m = st.ring->next_send()) {
    wire::ring_message msg;
    msg.round = st.step;
    msg.step = m->step;
    msg.chunk = m->chunk;
    msg.data.assign(m->data, m->data + m->size);
    self->send(caf::actor_cast<worker_actor>(st.ring_next), std::move(msg));
  }
}

void ring_finish(worker_pointer self) {
  auto& st = self->state;
  const auto& v = st.ring->values();
  const size_t n = st.params.size();
  const float total = v[n];
  st.ring_stop = v[n + 1] > 0.0f;
  // The all-reduce counts as waiting: it ends when the slowest worker's chunks came.
  st.wait_ns = ns_since(st.phase_start);
  st.phase_start = clock_type::now();
  for (size_t j = 0; j < n; ++j)
    st.grad[j] = v[j] / total;
  st.ring.reset();
  if (st.velocity.size() != n)
    st.velocity.assign(n, 0.0f);
  sgd_config opt;
  opt.lr = st.job.local_lr;
  opt.momentum = st.job.momentum;
  opt.weight_decay = st.job.weight_decay;
  if (st.ring_rank_id == 0)
    st.before = st.params;
  sgd_apply(opt, st.schedule_lr_scale, st.params.data(), st.velocity.data(), st.grad.data(), n);
  if (st.ring_rank_id != 0)
    return phase_done(self);
  // The mirror: the shards take params -= (before - after).
  for (size_t j = 0; j < n; ++j)
    st.grad[j] = st.before[j] - st.params[j];
  st.push_samples = static_cast<uint32_t>(total);
  send_pushes(self);
}

// Uses the chunks that have come for the current all-reduce step, in order.
void ring_drain(worker_pointer self) {
  auto& st = self->state;
  while (st.ring && !st.ring_inbox.empty()) {
    auto& m = st.ring_inbox.front();
    if (m.round != st.step)
      return fail(self, "ring: a chunk of step " + std::to_string(m.round) + " at step "
                          + std::to_string(st.step) + " (the ring is out of step)");
    auto err = st.ring->receive(m.step, m.chunk, m.data.data(), m.data.size());
    st.ring_inbox.pop_front();
    if (err)
      return fail(self, "ring: " + describe(err));
    if (st.ring->done())
      return ring_finish(self);
    ring_send(self);
  }
}

void ring_begin(worker_pointer self) {
  auto& st = self->state;
  if (st.ring_size == 0) {
    st.ring_waiting = true; // starts when the ring is formed
    return;
  }
  st.ring_waiting = false;
  st.phase_start = clock_type::now();
  const size_t n = st.grad.size();
  std::vector<float> v(n + 2);
  for (size_t j = 0; j < n; ++j)
    v[j] = st.grad[j] * static_cast<float>(st.batch_n);
  v[n] = static_cast<float>(st.batch_n);
  v[n + 1] = st.stop_requested ? 1.0f : 0.0f;
  st.step_bytes += 2 * n * sizeof(float) * (st.ring_size - 1) / std::max(1u, st.ring_size);
  st.step_dense += 2 * n * sizeof(float) * (st.ring_size - 1) / std::max(1u, st.ring_size);
  st.ring.emplace(st.ring_rank_id, st.ring_size, std::move(v));
  if (st.ring->done())
    return ring_finish(self); // a ring of one
  ring_send(self);
  ring_drain(self);
}

// Takes up the behaviour of `mode`, from the next message on.
void switch_mode(worker_pointer self, step_mode mode) {
  self->state.mode = mode;
  self->state.model_local = false; // the first step in the new mode pulls
  self->become(training(self, mode));
}

// A stage from the scheduler's planner (ASHL): local steps, learning-rate factor and pull
// compression from the next step on.
void enter_stage(worker_pointer self, const std::string& stage, uint32_t h, float lr_scale, float pull_ratio) {
  auto& st = self->state;
  st.stage = stage;
  st.local_lr_scale = lr_scale;
  if (pull_ratio != st.pull_ratio) {
    st.pull_ratio = pull_ratio;
    if (pull_ratio > 0)
      spdlog::info("worker {}: pulls are delta reads of {:.0f}% of each range from now on", st.job.worker_id,
                   100.0 * pull_ratio);
  }
  st.local_steps = std::max(1u, h);
  ++st.stage_changes;
  const auto next = stage == "profiling" ? step_mode::every_step : step_mode::local_steps;
  spdlog::info("worker {}: stage {} from step {} (change {}): {}", st.job.worker_id, stage, st.step,
               st.stage_changes,
               next == step_mode::every_step ? "every step a commit"
                                             : std::to_string(st.local_steps) + " local steps per commit");
  switch_mode(self, next);
}

// One step begins: it leaves if the job is done, takes a new batch share when due, and
// starts with a pull, or with the compute where the model is local.
void begin_step(worker_pointer self, step_mode mode) {
  auto& st = self->state;
  if (st.stopped || st.suspended)
    return;
  // On a ring, everybody stops at the round the ring agreed on, never alone.
  const bool done = st.step >= st.job.steps || (mode == step_mode::ring ? st.ring_stop : st.stop_requested);
  if (st.commit_inflight && (done || mode != step_mode::local_steps)) {
    st.last_follows = false; // waiting for the commit is the policy's time, not the host's
    st.deferred_step = true; // an overlapped commit lands first (commit_landed)
    return;
  }
  if (done)
    return finish(self);
  st.step_begin = clock_type::now();
  if (st.last_follows && st.job.pace_ns_per_sample > 0) {
    const auto wall = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(st.step_begin - st.last_begin).count());
    if (wall > st.last_parts_ns)
      st.pace_debt_ns = std::min(st.pace_debt_ns + (wall - st.last_parts_ns),
                                 pace_carry_steps * st.job.pace_ns_per_sample * std::max<uint64_t>(st.batch_n, 1));
  }
  st.last_follows = false;
  st.step_begin_ns = static_cast<uint64_t>(unix_ns());
  if (st.next_batch > 0 && st.step >= st.next_batch_from) {
    st.job.batch_size = st.next_batch;
    st.next_batch = 0;
    if (auto err = take_data_part(self))
      return fail(self, describe(err));
  }
  st.in_step = true;
  if (mode == step_mode::ring && st.step > 0)
    push_all(self); // the model is local: compute, then all-reduce
  else if (st.local_done > 0 || st.commit_inflight || (mode == step_mode::local_steps && st.model_local))
    push_all(self); // a commit is open, or one is in flight: compute on the local model
  else
    pull_all(self);
}

// The worker's behaviour in one step mode. Both modes run the same step loop; they differ
// in what a finished computation does (paced_atom, after_compute: push now, or take a
// local step) and in how a new local-step plan is taken: with every_step, a plan of H > 1
// outside any stage (ADSP) switches to local_steps. A stage message switches to the
// stage's mode: every_step for profiling (each step timed with its communication),
// local_steps for AHL and SHL.
worker_actor::behavior_type training(worker_pointer self, step_mode mode) {
  return {
    [=](start_atom) {
      if (self->state.cursor)
        spdlog::warn("worker {}: already started", self->state.job.worker_id);
      else
        start(self);
    },
    [=](stop_atom) {
      auto& st = self->state;
      // Finish the step in flight; the next step boundary leaves.
      st.stop_requested = true;
      if (st.shards.empty() && !st.stopped) {
        st.stopped = true;
        self->quit();
      }
    },
    [=](paced_atom, uint64_t gen) {
      if (current(self, gen))
        after_compute(self);
    },
    [=](shard_atom, uint32_t index, shard_actor& shard, const std::string& endpoint) {
      replace_shard(self, index, std::move(shard), endpoint);
    },
    [=](shard_atom, uint64_t gen) {
      auto& st = self->state;
      if (st.suspended && st.gen == gen && !st.lost.empty())
        fail(self, "shard " + std::to_string(st.job.shards[*st.lost.begin()].shard_id) + " was lost and not served "
                     "again within " + std::to_string(static_cast<int>(st.job.shard_wait_s)) + " s");
    },
    [=](batch_atom, uint32_t b, uint64_t from_step, uint64_t data_begin, uint64_t data_count) {
      if (b > 0) {
        self->state.next_batch = b;
        self->state.next_batch_from = from_step;
        self->state.next_data = {data_begin, data_count};
      }
    },
    [=](local_steps_atom, uint32_t h) {
      auto& st = self->state;
      if (h != st.local_steps)
        spdlog::debug("worker {}: {} local steps per commit", st.job.worker_id, h);
      st.local_steps = std::max(1u, h);
      if (mode == step_mode::every_step && st.stage.empty() && st.local_steps > 1)
        switch_mode(self, step_mode::local_steps);
    },
    [=](ring_atom, uint32_t rank, uint32_t ranks, caf::actor next) {
      auto& st = self->state;
      if (ranks == 0)
        return fail(self, "the ring lost worker " + std::to_string(rank)
                            + "; decentralized training cannot go on without it");
      st.ring_rank_id = rank;
      st.ring_size = ranks;
      st.ring_next = std::move(next);
      spdlog::debug("worker {}: rank {} of a ring of {}", st.job.worker_id, rank, ranks);
      if (mode != step_mode::ring)
        switch_mode(self, step_mode::ring);
      if (st.ring_waiting)
        ring_begin(self);
    },
    [=](wire::ring_message& m) {
      auto& st = self->state;
      if (st.stopped)
        return;
      st.ring_inbox.push_back(std::move(m));
      ring_drain(self);
    },
    [=](lr_atom, float factor) { self->state.schedule_lr_scale = factor; },
    [=](stage_atom, const std::string& stage, uint32_t h, float lr_scale, float pull_ratio) {
      enter_stage(self, stage, h, lr_scale, pull_ratio);
    },
    [=](step_atom) { begin_step(self, mode); },
  };
}

// Registers with the scheduler, sets up from the assignment, and starts the step loop.
void start(worker_pointer self) {
  auto& st = self->state;
  wire::register_worker req;
  req.requested_id = st.cfg.requested_id;
  req.host = st.cfg.host;
  req.backend = "cpu";
  self->request(st.cfg.scheduler, std::chrono::seconds(30), req)
    .then(
      [=](const wire::assignment& a, const std::vector<shard_actor>& shards) {
        auto& st = self->state;
        st.job = a;
        if (shards.size() != a.shards.size())
          return fail(self, "malformed assignment from the scheduler");
        auto plan = compile(a.model);
        if (!plan)
          return fail(self, "the scheduler's model: " + describe(plan.error()));
        const model_spec* spec = &a.model;
        auto choice = st.cfg.make_backend ? st.cfg.make_backend(*spec) : cpu_choice(*spec, "");
        if (!choice.backend)
          return fail(self, "no compute backend for model " + spec->to_string() + ": " + choice.note);
        st.backend = std::move(choice.backend);
        if (!choice.note.empty())
          spdlog::info("worker {}: computing {}", a.worker_id, choice.note);
        if (auto err = check_assignment(st, a))
          return fail(self, describe(err));
        st.shards = shards;
        use_data_plane(self);
        for (auto& s : st.shards)
          self->monitor(s);
        st.host_locks.clear(); // before the buffers may move
        const auto num_params = plan->num_params;
        st.params.assign(num_params, 0.0f);
        st.grad.assign(num_params, 0.0f);
        for (auto* v : {&st.params, &st.grad})
          st.host_locks.push_back(st.backend->lock_host_memory(v->data(), v->size() * sizeof(float)));
        st.base_versions.assign(shards.size(), 0);
        st.view_seqs.assign(shards.size(), 0);
        st.pull_ratio = st.job.pull_topk_ratio;
        st.local_steps = std::max(1u, a.local_steps);
        st.cursor.emplace(*st.cfg.data, a.data_begin, a.data_count, a.seed);
        if (a.cursor_epoch > 0 || a.cursor_pos > 0) {
          st.cursor->seek(a.cursor_epoch, a.cursor_pos);
          spdlog::info("worker {}: resuming its data at pass {}, sample {} of [{}, {}), batch {}", a.worker_id,
                       a.cursor_epoch, a.cursor_pos, a.data_begin, a.data_begin + a.data_count, a.batch_size);
        }
        st.started = clock_type::now();
        spdlog::debug("worker {}: {} backend, {} steps", a.worker_id, st.backend->name(), a.steps);
        // Ring jobs take the ring behaviour now: a gradient computed before the ring is
        // formed waits for it rather than going to the shards.
        if (a.policy == "ring" && st.mode != step_mode::ring)
          switch_mode(self, step_mode::ring);
        else if (st.local_steps > 1 && st.mode == step_mode::every_step)
          switch_mode(self, step_mode::local_steps);
        self->send(self, step_atom::value);
      },
      [=](caf::error& err) {
        spdlog::error("worker: registration with the scheduler failed: {}", describe(err));
        self->state.stopped = true;
        self->quit(err);
      });
}

worker_actor::behavior_type worker_behavior(worker_pointer self, worker_config cfg) {
  self->state.cfg = std::move(cfg);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t i = 0; i < st.shards.size(); ++i)
      if (st.shards[i].address() == dm.source)
        return shard_trouble(self, i, "shard " + std::to_string(st.job.shards[i].shard_id) + " was lost ("
                                        + to_string(dm.reason) + ")");
  });
  return training(self, step_mode::every_step);
}

}  // namespace

worker_actor spawn_worker(caf::actor_system& sys, worker_config cfg) {
  return sys.spawn(worker_behavior, std::move(cfg));
}

}  // namespace ashlar::actors
