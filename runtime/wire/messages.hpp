// The messages actors exchange, as plain C++ structs. Inside one actor_system they are
// passed as they are; between nodes they cross as the Cap'n Proto structs of
// schema/ashlar.capnp (see codec.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/model/model.hpp"
#include "runtime/optim/sgd.hpp"
#include "runtime/pacing/contention.hpp"
#include "runtime/tensor/layout.hpp"
#include "runtime/wire/shared_tensor.hpp"

namespace ashlar::wire {

/// Protocol version of these messages; bumped on any incompatible change.
constexpr uint32_t protocol_version = 10; // 3: delta reads, stage_atom with the pull ratio; 4: models as layer lists;
                                         // 5: nodes answer the scheduler's liveness ping; 6: a shard answers a
                                         // membership change with the pushes of the worker it took, a node
                                         // confirms its welcome; 7: a membership directive's from_step is
                                         // the step it was planned from, reports carry the worker's steps;
                                         // 8: ring chunks on the data plane (ring_atom with the next's endpoint);
                                         // 9: the shared-memory switch's proof names the sender's arena;
                                         // 10: a push may say the worker's next read follows it

/// Worker id meaning "any": the scheduler picks one.
constexpr uint32_t any_worker = 0xFFFFFFFFu;

/// Roles a node can take; values match schema Role.
enum class role : uint8_t { scheduler = 0, server = 1, worker = 2, profiler = 3 };

struct hello {
  uint32_t protocol = protocol_version;
  std::vector<role> roles;
  std::string node;
  uint32_t slots = 0;
  int64_t replace_shard = -1; // >= 0: host this shard of the running job again
};

struct welcome {
  uint32_t node_id = 0;
  std::string cluster;
};

struct spawn_shard {
  shard_range range;
  std::vector<float> params;
  std::string policy;
  float lr = 0;
  float momentum = 0;
  float weight_decay = 0;
  update_rule rule = update_rule::sgd; // adam, adamw: with beta1, beta2, eps
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  bool staleness_aware_lr = false;
  uint64_t staleness_bound = 0;
  uint32_t k = 0;
  std::string data_key; // empty: this job uses no data plane
  std::string checkpoint_dir; // empty: no checkpoints
  uint32_t checkpoint_keep = 3;
  bool resume = false;
  double average_samples = 0; // > 0: a running average of the parameters, this half-life in samples
  std::string job; // the job's id, random per job, up to 64 hex digits (empty: unknown, as from an older scheduler)
};

struct spawn_worker {
  uint32_t requested_id = 0;
  std::string data_dir;
  std::string data_source;
  uint64_t train_limit = 0;
  uint64_t seed = 0;
  uint32_t input_width = 0;
  uint32_t classes = 0;
  tensor_shape input;          // the model's input shape (the data set's samples)
  uint32_t crop_padding = 0;   // augmentation of the training set (data.crop_padding)
  bool hflip = false;          // (data.hflip)
  std::string ring_key;        // a ring job's data-plane key: the node takes its workers' ring chunks under it ("": CAF)
};

struct job_request {
  std::vector<std::pair<std::string, std::string>> settings;
};

struct job_result {
  std::string report_json;
};

struct ctl_request {
  /// stop_job: the job running (its workers finish their step; it reports) or waiting for
  /// its nodes (it ends at once) stops; the cluster's nodes stay.
  enum op_t : uint8_t { remove_worker = 0, add_worker = 1, shutdown = 2, stop_job = 3 };
  op_t op = remove_worker;
  uint32_t worker_id = 0;
  uint32_t count = 0;
};

struct register_worker {
  uint32_t requested_id = any_worker;
  std::string host;
  std::string backend = "cpu";
  std::string ring_endpoint; // "host:port" of the data plane that takes its ring chunks ("": CAF only)
};

/// A worker's place in its part of the training set: the part [begin, begin + count),
/// its cursor's shuffle seed, passes over the part done and samples into the current pass.
struct data_position {
  uint64_t begin = 0;
  uint64_t count = 0;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t pos = 0;
};

struct assignment {
  uint32_t worker_id = 0;
  std::vector<shard_range> shards;
  model_spec model;            // what the worker computes
  uint32_t batch_size = 0;
  uint64_t data_begin = 0;
  uint64_t data_count = 0;
  uint64_t steps = 0;
  uint64_t seed = 0;
  std::string policy;
  uint64_t chunk_floats = 0;
  uint32_t chunks_in_flight = 2;
  uint64_t pace_ns_per_sample = 0;
  contention_profile contention; // this worker's intervals only
  std::vector<std::string> data_endpoints; // per shard: "host:port" or "" (CAF only)
  std::string data_key;
  uint32_t local_steps = 1; // steps between commits; the commit pushes their summed gradients
  float local_lr = 0;       // learning rate applied locally between commits
  float commit_scale = 1;   // a commit pushes its summed gradients times this
  float topk_ratio = 0;     // pushes carry this fraction of each range, top-k with error feedback; 0: dense
  float pull_topk_ratio = 0; // pulls are delta reads of this fraction of each range; 0: dense
  bool overlap_commits = false; // local steps: a commit's push and pull run behind the next steps
  float momentum = 0;       // ring mode: the workers apply updates themselves (lr: local_lr)
  float local_momentum = 0; // commits: the worker's momentum over its own gradients (local steps and commits)
  float weight_decay = 0;
  update_rule rule = update_rule::sgd; // ring mode: the workers' own rule (with beta1, beta2, eps)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  double shard_wait_s = 0;  // a lost shard may be replaced within this long; 0: fail at once
  uint64_t cursor_epoch = 0; // a resumed worker's data position in [data_begin, +data_count)
  uint64_t cursor_pos = 0;   //   with `seed`: passes done, samples into the current pass
};

/// How a worker stopped on request (a removal, its node's SIGTERM, the job's stop) begins
/// the reason its leave gives: "stopped on request after N steps".
inline constexpr const char* stopped_on_request = "stopped on request";

struct membership_change {
  /// fail: the worker was lost or could not go on (a peer, the network); its share goes
  /// to the others. error: its own computation failed (its training script raised, its
  /// compute backend erred), which would fail again anywhere: the job fails, naming it.
  enum kind_t : uint8_t { join = 0, leave = 1, fail = 2, error = 3 };
  kind_t kind = join;
  uint32_t worker_id = 0;
  std::string reason;
  bool early = false; // leave: before the worker's steps were done (removed on request, its node stopped)
  uint64_t steps = 0; // leave: the steps it trained
};

struct pull_request {
  uint32_t worker_id = 0;
  uint32_t shard_id = 0;
  bool snapshot = false;
  uint64_t offset = 0;
  uint64_t max_floats = 0; // 0: the whole range in one reply
  uint64_t read_id = 0;    // 0: a new read
  /// Delta pull (pull compression): > 0 asks for the entries where the shard's
  /// parameters differ most from what this worker holds, this fraction of the range. The
  /// shard keeps a view of what the worker holds; `view_seq` names the last delta or
  /// dense read the worker applied (0: none). A mismatch (a lost reply, a new shard) gets
  /// a dense read that starts the view again.
  float topk_ratio = 0;
  uint64_t view_seq = 0;
  /// With snapshot: the shard's running average of its parameters where it keeps one
  /// (train.average_epochs; what evaluations read), its parameters otherwise.
  bool average = false;
};

struct pull_reply {
  uint32_t shard_id = 0;
  uint64_t version = 0;
  uint64_t begin = 0;
  shared_tensor params; // references the shard's version: no copy per reply
  uint64_t wait_ns = 0;
  uint64_t offset = 0;
  uint64_t total = 0;
  uint64_t read_id = 0;
  /// A delta read: params[i] is the current value at range position index[i], every
  /// other entry is as the worker's view already has it. Always whole (offset 0).
  bool sparse = false;
  std::vector<uint32_t> index{};
  uint64_t view_seq = 0; // the view this reply brings the worker to (0: no view kept)
};

struct push {
  uint32_t worker_id = 0;
  uint32_t shard_id = 0;
  uint64_t base_version = 0;
  uint32_t batch_size = 0;
  shared_tensor grad; // read in place where the sender shares it (shared memory)
  uint64_t offset = 0;
  uint64_t total = 0; // 0: grad is the whole range
  /// A sparse push (top-k): grad[i] is the entry at range position index[i], every other
  /// entry is zero. Always a whole push (offset 0); index ascending.
  bool sparse = false;
  std::vector<uint32_t> index{};
  /// The worker's next read of this shard follows this push (its last piece) at once: the
  /// shard answers the push once it answers that read, right after its reply, so that a
  /// step's acknowledgement and the next step's parameters reach the worker together.
  bool read_follows = false;
};

/// Ring all-reduce: one all-reduce step's chunk, to the next worker on the ring.
struct ring_message {
  uint64_t round = 0; // the training step
  uint32_t step = 0;  // the all-reduce step
  uint32_t chunk = 0;
  tensor data;
  uint32_t ring = 0; // the ring's generation (a re-formed ring is a new one)
  uint8_t sync = 0;  // 0: a step's gradients; 1: the members' steps; 2: the state they take up
};

struct push_ack {
  enum outcome_t : uint8_t { applied = 0, buffered = 1, dropped = 2 };
  uint32_t shard_id = 0;
  uint64_t version = 0;
  outcome_t outcome = applied;
  uint64_t staleness = 0;
  bool complete = true;
};

struct shard_status {
  uint32_t shard_id = 0;
  uint64_t version = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t pushes = 0;
  uint64_t applied = 0;
  uint64_t dropped = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  std::vector<uint32_t> live_workers;
  uint32_t pending_reads = 0;
  uint64_t cut = 0;       // the newest checkpoint cut on disk (0: none)
  std::string cut_error;  // why the last checkpoint write failed, or ""
  uint64_t samples = 0;   // the samples of the gradients that went into updates
  std::vector<uint32_t> holding_up; // the live workers a held read waits for (sync_policy::holding_up)
  double held_seconds = 0;          // how long the oldest held read has waited
};

/// A named figure a worker's script reported (its evaluation's "val_ppl", "accuracy").
struct named_value {
  std::string name;
  double value = 0;
};

struct profile_report {
  uint32_t worker_id = 0;
  uint64_t step = 0;
  uint32_t samples = 0;
  double loss = 0;
  uint64_t compute_ns = 0;
  uint64_t pull_ns = 0;
  uint64_t push_ns = 0;
  uint64_t wait_ns = 0;
  uint64_t bytes = 0; // tensor bytes pulled and pushed in this step
  uint32_t stage_changes = 0; // behaviour changes (stage switches) so far
  uint64_t steps_target = 0;  // the steps the worker trains in all, as it counts them now
  uint32_t directives = 0;    // batch directives it has taken from the scheduler
  uint64_t start_ns = 0;          // when the step began (wall clock, ns since the Unix epoch)
  uint64_t compute_offset_ns = 0; // the computation began this long after start_ns
  uint64_t staleness = 0;         // largest staleness the shards reported for the push
  uint32_t batch = 0;             // the batch share in force
  data_position position{};       // the data cursor after this step
  uint64_t dense_bytes = 0;       // what this step's pulls and pushes would have moved uncompressed
  std::vector<named_value> metrics; // named metrics the script reported with this step (none: most steps)
};

struct worker_stats {
  uint32_t worker_id = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  double samples_per_second = 0;
  double step_seconds = 0;
  double compute_seconds = 0;
  double wait_seconds = 0;
  double loss = 0;
  bool done = false;
  double total_compute_seconds = 0;
  double total_wait_seconds = 0;
  uint64_t bytes = 0;
  double compute_per_sample = 0; // smoothed compute seconds per sample
  uint32_t stage_changes = 0;
  uint64_t steps_target = 0;        // the steps it trains in all, as of the last report
  uint32_t directives = 0;          // batch directives it had taken then
  double staleness = 0;             // smoothed staleness of the worker's pushes
  double predicted_speed = 0;       // compute samples/s predicted for the next window (GRU)
  double observed_speed = 0;        // compute samples/s over the last window
  double prediction_error = 0;      // mean |predicted - observed| / observed so far
  uint32_t batch = 0;               // the batch share in force
  data_position position{};         // the data cursor, as of the last report
  uint64_t dense_bytes = 0;          // what the pulls and pushes would have moved uncompressed
};

/// One report of named metrics: the `seq`-th of the job (from 1), by worker `worker_id`
/// with its step that ended when the job had trained `samples` samples.
struct metric_report {
  uint64_t seq = 0;
  uint32_t worker_id = 0;
  uint64_t samples = 0;
  double seconds = 0; // since the first step report
  std::vector<named_value> values;
};

struct cluster_stats {
  std::vector<worker_stats> workers;
  uint64_t total_samples = 0;
  double elapsed_seconds = 0;
  double loss = 0;
  /// The latest reports of named metrics (at most cluster_profile::kept_reports, oldest
  /// first): a reader takes those with a seq past the last it took.
  std::vector<metric_report> metric_reports;
  uint64_t refused_reports = 0; // step reports the profiler refused (not a member's, impossible, replayed)
};

struct node_info {
  uint32_t node_id = 0;
  std::string name;
  std::vector<role> roles;
  uint32_t slots = 0;
  bool alive = true;
};

struct cluster_status {
  std::vector<node_info> nodes;
  cluster_stats stats;
  std::vector<shard_status> shards;
  std::string stage;
  std::string job;
  uint64_t job_samples = 0;   // the samples the running job trains in all (0: none runs)
  uint64_t train_samples = 0; // its training set's
};

}  // namespace ashlar::wire
