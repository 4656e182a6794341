// A worker's training step as a state machine: given what arrived (a pull's chunk, a
// push's acknowledgement, a computed gradient, a pacing delay's end, a ring chunk, a lost
// or restored shard, the scheduler's plans), it says what to do next, as actions: send
// this pull request or push, compute on this batch, wait this long, report this step,
// start the next step, fail, finish. The worker actor only turns actions into messages
// and replies into events. Pure code: no CAF actors, time from a clock_source.
//
// One step under a parameter-server policy: pull every shard's range (in chunks, at most
// chunks_in_flight outstanding per shard; or a delta read of pull_ratio of it), compute
// the gradient, wait out the pacing budget, push (in chunks, or top-k sparse) and report.
// With local steps (ADSP, ASHL) a step's gradient moves the local model and adds to the
// open commit; every local_steps steps the commit (the summed gradients times
// commit_scale) is pushed and the model pulled again, or with overlap_commits the commit's
// push and pull run behind the next local steps. On a ring the step's gradient is summed
// with the other workers' (ring all-reduce) and applied by every worker alike; rank 0
// mirrors the update to the shards. A lost shard suspends the step (bounded by the
// assignment's shard_wait_s); its replacement restarts it with a fresh pull, and replies
// of the abandoned step (an older generation) are ignored.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/collective/ring.hpp"
#include "runtime/compress/topk.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

/// How a worker commits.
enum class step_mode : uint8_t {
  every_step,  // pull, compute, push: each step is a commit (profiling, BSP, ASP, ...)
  local_steps, // H local steps on the local model, then one commit (ADSP, ASHL's AHL and SHL)
  ring,        // decentralized: all-reduce each step's gradient with the other workers
};

namespace step {

/// Send `req` to shard `shard`; its reply or error comes back with `gen` (on_pull_reply,
/// or with `ahead` on_read_ahead: the next step's read, sent right behind a push).
struct send_pull {
  size_t shard = 0;
  uint64_t gen = 0;
  wire::pull_request req;
  bool ahead = false;
};

/// Send `msg` to shard `shard`; its acknowledgement covers `floats` floats and comes back
/// with `gen`.
struct send_push {
  size_t shard = 0;
  uint64_t gen = 0;
  uint64_t floats = 0;
  wire::push msg;
};

/// Compute the gradient of `batch` at params() into grad(), then call on_computed (with
/// `fetch_velocity`, first the backend's velocity into it: compute_backend::take_commit
/// with no output). With `held`, a local step on the model the backend keeps instead
/// (compute_backend::local_step with load, velocity, commit, lr and momentum): grad()
/// is not written. A held step's learning rate is the one in force when it starts.
struct compute {
  batch_view batch;
  bool held = false;
  const float* load = nullptr;     // the model to load first (the step pulled), or null
  const float* velocity = nullptr; // with load: the velocity to start from (null: the kept one)
  const float* commit = nullptr;   // with load: the open commit's sum so far (null: empty)
  float lr = 0, momentum = 0;
  float* fetch_velocity = nullptr;
};

/// Take the open commit from the backend that keeps the model (compute_backend::
/// take_commit) into `out`, then call on_commit_taken (its pushes follow).
struct take_commit {
  float* out = nullptr;
  float scale = 1.0f;
  float* velocity_out = nullptr;
};

/// An overlapped commit's pull landed: the kept model becomes `pulled` - lr x the open
/// commit (compute_backend::rebase).
struct rebase {
  const float* pulled = nullptr;
  float lr = 0;
};

/// Wait `ns` (pacing), then call on_paced(gen).
struct pace {
  uint64_t ns = 0;
  uint64_t gen = 0;
};

/// Send `report` to the profiler.
struct report {
  wire::profile_report rep;
};

/// Start the next step (through the mailbox, so other messages are taken between steps).
struct next_step {};

/// Send `msg` to the next worker on the ring.
struct ring_send {
  wire::ring_message msg;
};

/// A shard is lost: call on_shard_wait_over(gen) after `ms` unless it is replaced.
struct await_shard {
  uint64_t ms = 0;
  uint64_t gen = 0;
};

/// The worker fails with `why`: tell the scheduler and stop.
struct fail {
  std::string why;
  bool compute = false; // the step's own computation failed (the backend, a script), not a peer
};

/// The worker's steps are done, or it leaves before they are (`early`: asked to, or its
/// compute backend stopped): leave with `reason` and stop.
struct finish {
  std::string reason;
  bool early = false;
};

}  // namespace step

using step_action = std::variant<step::send_pull, step::send_push, step::compute, step::take_commit, step::rebase,
                                 step::pace, step::report, step::next_step, step::ring_send, step::await_shard,
                                 step::fail, step::finish>;

class step_machine {
public:
  /// A worker of assignment `a` over its part of `data` (a model of `num_params`
  /// parameters), reading time from `clock`. `data` and `clock` must outlive it.
  step_machine(wire::assignment a, const dataset& data, uint64_t num_params, const clock_source& clock);

  /// Checks an assignment against the model it names and the local data: the shard map
  /// covers the model, the data part fits, samples have the model's input shape, the
  /// batch is not empty.
  [[nodiscard]] static caf::error check(const wire::assignment& a, const model_spec& spec, const dataset& data);

  /// The backend keeps the local model (compute_backend::keeps_local_model): local steps
  /// then run there, and the machine sends the model after each pull and takes commits
  /// from it (compute, take_commit and rebase actions). Call before begin().
  void set_model_held(bool held);
  bool model_held() const { return held_; }
  /// Whether a step's working memory is given back between steps: grad() once the
  /// step's pushes hold their copies of it (taken again, zeroed, when the next step
  /// computes), and the batch's buffer once the step computed. The workers of a node
  /// with many slots then hold that memory only while they compute or send (a few at a
  /// time), not one each. Only where nothing outside keeps grad()'s address (no page
  /// lock). The gradient stays on a ring and while a commit overlaps local steps. In every
  /// step mode the parameters are given back too, from the step's computation to the next
  /// one: the pull's replies are kept as they came (over shared memory, views of the
  /// shards' one copy of the version for this host) and copied into params() when the step
  /// computes, so that a node's workers waiting for a round hold no copy each.
  /// Call before begin(): the buffers go at once, until the first step takes them.
  void give_back_between_steps(bool yes);

  /// Where the buffers of dense pushes come from (n floats, or nullptr: the heap): the
  /// job's shared-memory arena where shards of this host read pushes in place, so that a
  /// push is copied once, as in one process.
  using buffer_source = std::function<std::shared_ptr<float>(size_t n)>;
  void use_push_buffers(buffer_source source) { push_buffers_ = std::move(source); }
  bool gives_back_between_steps() const { return release_grad_; }
  /// The buffers of commits taken from the backend and of overlapped commits' pulls;
  /// sized once the model is held (a backend may lock them).
  std::vector<float>& commit_buffer() { return commit_; }
  std::vector<float>& pulled_buffer() { return pulled_; }
  std::vector<float>& velocity_buffer() { return local_velocity_; }

  /// The buffers the compute reads and writes (they never move: a backend may lock them;
  /// params() is empty between steps where it is given back, see give_back_between_steps).
  std::vector<float>& params() { return params_; }
  std::vector<float>& grad() { return grad_; }

  const wire::assignment& job() const { return job_; }
  step_mode mode() const { return mode_; }
  uint64_t steps_done() const { return step_; }
  bool stopped() const { return stopped_; }
  uint64_t generation() const { return gen_; }
  const std::set<size_t>& lost() const { return lost_; }

  /// The actions that events have produced since the last call, in order.
  std::vector<step_action> take_actions();

  // -- events -------------------------------------------------------------------------

  /// Training begins: the mode the assignment asks for, and the first step.
  void begin();
  /// The next step is due.
  void on_step();
  /// A reply to a pull request of generation `gen` from shard `i`.
  void on_pull_reply(size_t i, uint64_t gen, const wire::pull_reply& r);
  /// A reply to the read sent ahead behind a push to shard `i` (send_pull with ahead):
  /// kept for the next step's pull, or taken by a pull that waits for it.
  void on_read_ahead(size_t i, uint64_t gen, const wire::pull_reply& r);
  /// An acknowledgement of `floats` floats pushed to shard `i` in generation `gen`.
  void on_push_ack(size_t i, uint64_t gen, uint64_t floats, const wire::push_ack& ack);
  /// A request of generation `gen` to shard `i` failed with `why`.
  void on_request_failed(size_t i, uint64_t gen, const std::string& why);
  /// Shard `i` went down (`why`).
  void on_shard_down(size_t i, const std::string& why);
  /// The compute's result (after a step::compute).
  void on_computed(const expected<batch_stats>& stats);
  /// The commit is taken from the backend (after a step::take_commit), or failed.
  void on_commit_taken(const caf::error& err);
  /// A pacing wait of generation `gen` is over.
  void on_paced(uint64_t gen);
  /// The wait for a lost shard (of generation `gen`) is over.
  void on_shard_wait_over(uint64_t gen);
  /// Shard `i` is served again; once none is missing, the abandoned step starts over.
  void on_shard_replaced(size_t i);
  /// Leave after the step in flight. On a ring the member leaves after the all-reduce it
  /// votes in (so its last gradient counts); the others wait for the ring the scheduler
  /// forms without it. A member already waiting for that ring leaves at once (finish:
  /// the caller carries out the actions).
  void on_stop();
  /// A new batch share from step `from_step` on, with its part of the training set.
  void on_batch(uint32_t batch, uint64_t from_step, uint64_t data_begin, uint64_t data_count, uint64_t steps = 0);
  /// Local steps per commit (ADSP's plan); switches to local steps outside any stage.
  void on_local_steps(uint32_t h);
  /// A stage (ASHL): local steps per commit, learning-rate factor, pull compression.
  void on_stage(const std::string& stage, uint32_t h, float lr_scale, float pull_ratio);
  /// The learning-rate schedule's factor.
  void on_lr(float factor) { schedule_lr_scale_ = factor; }
  /// The place on ring `generation` (a rank outside the ring fails the worker).
  /// Generation 1 is the job's first ring, its members fresh from the same pull. A later
  /// one is the ring re-formed after a member was lost or joined: the all-reduce in
  /// progress is abandoned and, before the next one, the members agree on their state
  /// (sync rounds): each tells how far it got (the generation it last all-reduced in, and
  /// how many all-reduces it completed there), and the lowest rank of those furthest on
  /// shares its parameters and velocity, which every member takes up (a member a step
  /// behind, or one that just joined, computes its gradient again on them). Rank 0 then
  /// reads the shards' mirror and pushes what differs from the model (a lost rank 0 may
  /// have died halfway through an update's push). Chunks of older generations are dropped.
  void on_ring(uint32_t generation, uint32_t rank, uint32_t ranks);
  /// The ring's generation (0 before the first).
  uint32_t ring_generation() const { return ring_gen_; }
  /// A chunk from the previous worker on the ring.
  void on_ring_message(wire::ring_message m);

private:
  // Progress of one shard's transfer in the current phase (pull or push).
  struct transfer {
    uint64_t total = 0;
    uint64_t next = 0; // next offset to request or send
    uint64_t done = 0; // floats received (pull) or acknowledged (push)
    uint64_t read_id = 0;
    uint64_t view_seq = 0; // a dense read that starts a shard's view of this worker: its number
  };

  void emit(step_action a) { actions_.push_back(std::move(a)); }
  void fail(const std::string& why);
  void finish(std::string reason = {});
  void shard_trouble(size_t i, const std::string& why);
  bool current(uint64_t gen) const { return !stopped_ && !suspended_ && gen_ == gen; }
  uint64_t chunk_size(uint64_t total) const;
  uint64_t since(uint64_t t) const;
  void switch_mode(step_mode m);

  void pull_all();
  bool defer_params() const;
  void ensure_params();
  bool read_ahead_due() const;
  void read_ahead(size_t i);
  void drop_reads_ahead();
  void request_pull_chunk(size_t i);
  void delta_received(size_t i, const wire::pull_reply& r);
  void pull_received();
  void compute_step();
  void after_compute();
  void send_pushes();
  void send_push_chunk(size_t i);
  void send_sparse_pushes();
  void push_done(size_t i, uint64_t floats, const wire::push_ack& ack);
  void phase_done();
  void report_step(uint64_t push_ns);
  void end_step();

  float local_lr() const;
  void step_local_model();
  bool take_commit(std::vector<float>& out);
  bool begin_commit();
  void end_local_step();
  void commit_landed();
  caf::error take_data_part(uint64_t begin, uint64_t count);

  void ring_begin();
  void ring_start(std::vector<float> values);
  void ring_sync_done();
  void ring_synced();
  bool ring_shard_trouble(size_t i, const std::string& why);
  void read_mirror(bool then_compute);
  void mirror_done();
  void ring_send_next();
  void gradient_sent();
  void ring_drain();
  void ring_finish();

  const clock_source& clock_;
  const dataset& data_;
  wire::assignment job_;
  std::optional<batch_cursor> cursor_;
  std::vector<step_action> actions_;
  step_mode mode_ = step_mode::every_step;

  uint64_t n_params_ = 0;
  std::vector<float> params_, grad_;
  // A step's pulled parameters where params_ is given back between steps (every step
  // mode, buffers given back): the replies' tensors (views of the shards' copies of the
  // version, shared by the workers of this host where they read in place), copied into
  // params_ only when the step computes, by range offset.
  std::vector<std::pair<uint64_t, wire::shared_tensor>> pulled_views_;
  std::vector<uint64_t> base_versions_;
  std::vector<transfer> transfers_; // per shard, in the current pull or push
  // Reads sent ahead (every step mode): right behind a step's push, each shard's read for
  // the next step goes too, and the shard answers both at once (wire::push::read_follows):
  // the push's acknowledgement no longer has to reach the worker before the next pull
  // leaves. The reply waits here for the next step's pull (or that pull for it).
  struct ahead_read {
    enum state_t : uint8_t { none, sent, arrived, awaited } state = none;
    uint64_t gen = 0;
    wire::pull_reply reply;
  };
  std::vector<ahead_read> ahead_; // per shard
  uint64_t step_ = 0;
  size_t pending_ = 0;
  bool stopped_ = false;
  bool stop_requested_ = false;
  uint64_t started_ns_ = 0; // when training began here (contention profiles count from it)
  // Timings of the current step.
  uint64_t phase_start_ = 0;
  uint64_t pull_ns_ = 0, wait_ns_ = 0, compute_ns_ = 0;
  uint64_t compute_t0_ = 0;
  uint64_t step_begin_ = 0;        // when the step began (steady),
  uint64_t step_begin_wall_ = 0;   // the same on the wall clock,
  uint64_t compute_offset_ns_ = 0; // and when its computation began, after step_begin
  uint64_t step_staleness_ = 0;    // the largest staleness the shards acknowledged
  uint32_t batch_n_ = 0;
  double loss_ = 0;
  std::vector<wire::named_value> metrics_; // the script's named metrics, with the step's report
  // Pacing is kept to over whole steps: host time a step took beyond what it reports is
  // owed, and the next steps' waits give it back (at most pace_carry_steps budgets).
  uint64_t last_begin_ = 0;    // the last reported step's start,
  uint64_t last_parts_ns_ = 0; // what it reported less what it gave back,
  bool last_follows_ = false;  // and whether the current step follows it directly
  uint64_t given_ns_ = 0;      // pacing debt the current step gave back
  uint64_t pace_debt_ns_ = 0;
  uint64_t step_bytes_ = 0; // tensor bytes moved in the current step
  uint64_t step_dense_ = 0; // what they would have been uncompressed
  // Local steps: gradients of the steps since the last commit, summed.
  uint32_t local_steps_ = 1;
  std::vector<float> local_velocity_; // local_momentum: the worker's velocity over its gradients
  uint32_t local_done_ = 0;
  std::vector<float> acc_;
  uint32_t acc_samples_ = 0;
  // Batch shares and parts of the training set the scheduler moved, each from a step on,
  // in order of that step.
  struct part_change {
    uint64_t from = 0;
    uint32_t batch = 0;
    uint64_t begin = 0, count = 0;
  };
  std::deque<part_change> next_parts_;
  uint32_t push_samples_ = 0; // the batch weight of the gradient pushed
  std::string stage_;          // the stage in force (ASHL), "" if the policy has none
  uint32_t stage_changes_ = 0;
  uint32_t directives_ = 0; // batch directives taken (reported, so the scheduler knows which its ledger matches)
  float local_lr_scale_ = 1.0f;    // the stage's learning-rate factor for local steps
  float schedule_lr_scale_ = 1.0f; // the learning-rate schedule's factor
  // Ring: place on the ring, the all-reduce in progress, chunks that came early.
  uint32_t ring_rank_id_ = 0, ring_size_ = 0;
  std::optional<ring_rank> ring_;
  std::deque<wire::ring_message> ring_inbox_;
  bool ring_waiting_ = false; // a gradient is ready, the ring is not formed yet (or not re-formed: ring_await_)
  bool ring_vote_ = false;    // this member votes to leave in the all-reduce in progress
  bool ring_leave_ = false;   // it voted so in the last one completed: it leaves now
  uint32_t ring_await_ = 0;   // others voted to leave in ring ring_await_: the next all-reduce waits for a newer ring
  uint32_t ring_gen_ = 0;     // the ring's generation
  bool ring_sync_due_ = false; // re-formed: the next all-reduce is preceded by the sync rounds
  uint8_t ring_sync_ = 0;      // the sync round in progress (1: progress, 2: state), 0: none
  uint32_t ring_source_ = 0;   // round 2: the rank whose state every member takes up
  bool ring_behind_ = false;   // round 2: this member lacks an update the source has,
  uint64_t ring_step_up_ = 0;  // and the steps of its ring it missed (0: it joined)
  uint32_t ring_trained_ = 0;  // the generation this member all-reduced in last (0: none),
  uint64_t ring_round_ = 0;    // and how many all-reduces it completed in it
  bool mirror_push_ = false;   // rank 0 pushes what its read of the mirror differs by (ring_io::mirror_read),
  bool mirror_then_compute_ = false; // then computes (its gradient was overwritten) or ends the step
  bool mirror_stale_ = false;  // rank 0 skipped an update while a shard was lost: read it again
  // What the ring's shards are being asked now: the first step's read, rank 0's read of
  // the mirror (after a sync, or a shard's return), or a push of rank 0's.
  enum class ring_io : uint8_t { none, first_pull, mirror_read, push };
  ring_io ring_io_ = ring_io::none;
  std::vector<float> velocity_, before_;
  std::vector<float> second_; // ring mode under adam and adamw: the second moment
  uint64_t ring_updates_ = 0; // ring mode: updates this worker's copy took (Adam's bias correction)
  std::vector<topk_compressor> compressors_; // per shard, when pushes are top-k compressed
  // Pull compression: the fraction asked for (0: dense), the parameters as the shards'
  // views of this worker hold them, and per shard the view's number (0: none yet).
  float pull_ratio_ = 0;
  std::vector<float> mirror_;
  std::vector<uint64_t> view_seqs_;
  uint64_t pull_dense_bytes_ = 0, pull_sent_bytes_ = 0;
  // Overlapped commits: the commit copied out, the pull landing in `pulled_`.
  bool commit_inflight_ = false;
  bool commit_due_ = false;    // the next commit waits for the one in flight
  bool deferred_step_ = false; // a step (or the finish) waits for it too
  bool model_local_ = false;   // params is the local model: a step needs no pull first
  uint64_t due_since_ = 0;
  uint64_t exposed_ns_ = 0; // time spent waiting for a commit in flight
  std::vector<float> commit_, pulled_;
  // The backend keeps the local model: whether its copy is current (no pull since it was
  // sent), and whether the step in flight ran there.
  bool held_ = false;
  bool release_grad_ = false;
  buffer_source push_buffers_;
  bool held_current_ = false;
  bool held_step_ = false;
  bool velocity_on_host_ = true; // local_velocity_ is the latest (else the backend's is)
  bool commit_on_host_ = false;  // the open commit's sum is in acc_ (a step on this side opened it)
  bool commit_handed_ = false;   // acc_ went to the backend with the step in flight
  bool end_on_take_ = false;     // an overlapped commit's step ends when the commit is taken
  // A lost shard: the step in flight is abandoned; replies of older generations ignored.
  uint64_t gen_ = 0;
  bool suspended_ = false;
  bool in_step_ = false; // a step is under way (no next_step queued yet)
  std::set<size_t> lost_;
};

}  // namespace ashlar
