// The configuration of a training job: sections of settings, filled once from a TOML
// file, then ASHLAR_* environment variables, then command-line settings (later ones
// win), parsed (modes as enums) and validated here, in one place.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/config/allocation_mode.hpp"
#include "runtime/config/policy_settings.hpp"
#include "runtime/core/error.hpp"
#include "runtime/data/data_source.hpp"
#include "runtime/model/model.hpp"
#include "runtime/optim/lr_schedule.hpp"
#include "runtime/optim/sgd.hpp"

namespace ashlar {

using lr_schedule_kind = lr_schedule::kind_t;

/// [data]: where the samples come from and how they are augmented.
struct data_settings {
  /// Where the data files are: Fashion-MNIST's IDX files, or for data.source = npy the
  /// NumPy files x_train.npy, y_train.npy, x_test.npy, y_test.npy.
  /// Default: /usr/share/datasets/fashion-mnist.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  /// fashion-mnist, npy (the user's own NumPy arrays, see load_npy_dataset) or synthetic
  /// (Gaussian clusters, for benchmarks). Default: fashion-mnist.
  data_source_kind data_source = data_source_kind::fashion_mnist;
  /// Augmentation, drawn anew every epoch: pad each training image by this many pixels
  /// (zeros) and crop it back to its size at a random offset; 0 = off (data.crop_padding).
  /// Default: 0.
  uint32_t crop_padding = 0;
  /// Augmentation: mirror each training image left-right with probability 1/2, anew every
  /// epoch (data.hflip). Default: false.
  bool hflip = false;
  /// Use only the first N training samples; 0 = all. Default: 0.
  uint64_t train_limit = 0;
  /// Use only the first N test samples; 0 = all. Default: 0.
  uint64_t test_limit = 0;
};

/// [train]: the job's workers, shards, policy, batch, optimizer, compression and pacing.
struct train_settings {
  /// Number of worker actors. Default: 4.
  uint32_t workers = 4;
  /// On a cluster, the most workers the job grows to as worker nodes join while it runs
  /// (a node's free slots, in join order); 0: twice `workers` (train.max_workers). Default: 0.
  uint32_t max_workers = 0;
  /// The fewest workers a running job goes on with after it lost members (a process killed,
  /// a node gone): below it the job fails, naming the loss; 1 (a job that lost every worker
  /// waits train.worker_wait for one to join). Default: 1.
  uint32_t min_workers = 1;
  /// Number of server shards the parameters are split into. Default: 2.
  uint32_t servers = 2;
  /// Sync policy, a registry name (runtime/policy/registry.cpp): bsp, asp, ssp, ksync,
  /// kasync, adsp, adaptive, ashl or ring. Default: bsp.
  std::string policy = "bsp";
  /// Passes over the training set (each worker passes over its share). Default: 10.
  uint32_t epochs = 10;
  /// Mini-batch size per worker, in samples. Default: 64.
  uint32_t batch_size = 64;
  /// Seed for initial parameters and data order. Default: 1.
  uint64_t seed = 1;
  /// Largest tensor chunk in one message, in floats: bigger ranges are pulled and pushed
  /// in chunks so no single message holds up a connection. Chunks that stay in cache
  /// through the kernel copy and the shard's apply move faster than bigger ones (see
  /// ops/bench/wire-vs-iperf3.sh). Default: 262144 (1 MiB).
  uint64_t chunk_floats = 1 << 18;
  /// Chunks a worker keeps in flight per shard (bounds the data in flight), at most
  /// max_chunks_in_flight. Default: 4.
  uint32_t chunks_in_flight = 4;
  static constexpr uint32_t max_chunks_in_flight = 16;
  /// Push compression: each push carries this fraction of the gradient, its largest
  /// entries, and the rest waits in a per-worker residual (top-k with error feedback);
  /// 0 = dense pushes (ASHL jobs then use ashl.topk_ratio). Default: 0.
  double topk_ratio = 0;
  /// Pulls are delta reads carrying this fraction of each shard's range: the entries that
  /// changed most since this worker's last pull (the rest follows in later pulls). 0 =
  /// dense pulls (ASHL jobs then decide with ashl.pull_topk_ratio). Default: 0.
  double pull_topk_ratio = 0;
  /// Local steps (ADSP, ASHL): a commit pushes its summed gradients times this; 0 means
  /// 1 / workers (a commit counts as one worker's share of a model average). Default: 0.
  double commit_scale = 0;
  /// Local steps (ADSP, ASHL): each worker's momentum over its own gradients: a step
  /// moves the local model by lr x its velocity (velocity = this x velocity + gradient),
  /// and a commit carries the summed velocities. The shards' train.momentum would act
  /// across different workers' commits; this acts within one worker's. Default: 0.
  double local_momentum = 0;
  /// The shards keep a running average of the parameters, with this half-life in epochs
  /// of samples applied (shorter at first: at most a tenth of what was applied); mid-run
  /// evaluations and the final accuracy are the average's, while the workers train the
  /// parameters themselves; checkpoints store the average beside the parameters (a
  /// resume goes on with it, `ashlar checkpoint export` writes it). 0: none.
  /// Default: 0 (adsp's and ashl's rule: 1/16).
  double average_epochs = 0;
  /// Local steps (ADSP, ASHL): a commit's push and the pull after it run while the next
  /// local steps compute; the pulled model then takes those steps along (pull minus local
  /// lr x their summed gradients). A worker waits only if its next commit is due before
  /// the last one has landed. Default: false.
  bool overlap_commits = false;
  /// Between processes, pulls and pushes use direct data connections (worker to shard
  /// node, raw TCP) instead of CAF's middleman (train.data_plane). Default: true.
  bool data_plane = true;
  /// How the global batch (batch_size x workers) is split among workers
  /// (train.allocation): equal; proportional to speed profiled over the first steps,
  /// then fixed; adaptive, re-split every 0.5 s from smoothed observed speed; predicted,
  /// re-split from each worker's next iteration time as a GRU predicts it. With any but
  /// equal, every worker samples the whole training set until its first share. Default:
  /// equal.
  allocation_mode allocation = allocation_mode::equal;
  /// Pacing: relative speeds of the workers (worker i gets speeds[i % size]); empty =
  /// unpaced, every worker as fast as the machine lets it. Default: empty.
  std::vector<double> speeds;
  /// Pacing: wall time one sample costs a worker of speed 1, in milliseconds; a worker of
  /// speed k takes sample_ms / k (the real compute runs inside that budget). Default: 0.5.
  double sample_ms = 0.5;
  /// Pacing: a contention profile file (see runtime/pacing/contention.hpp); empty = none.
  /// Default: "".
  std::string contention;
  /// Optimizer applied by the shards (train.lr, train.momentum, train.weight_decay).
  sgd_config optimizer;
  /// What updates the model (train.optimizer): "sgd", the shards' SGD with train.lr and
  /// train.momentum; "adam" or "adamw", the shards' Adam (torch.optim.Adam's L2 decay or
  /// AdamW's decoupled decay, train.beta1, train.beta2, train.eps; under ring each
  /// worker's copy); or "script", the optimizer of each worker's training script (Python
  /// workers through ashlar.torch): the shards then carry what the script's optimizer
  /// needs, at a unit rate (policy_rules.hpp: the round's mean gradient under bsp and
  /// ring, each worker's parameter delta under the other policies), start from zeros
  /// (the script's model is its own initial parameters plus what the shards hold), and
  /// the job ends when its workers' scripts do. Default: "sgd".
  std::string optimizer_kind = "sgd";
  /// The learning rate over the epochs: constant, cosine or step (see
  /// runtime/optim/lr_schedule.hpp). Default: constant.
  lr_schedule_kind lr_schedule = lr_schedule_kind::constant;
  /// Epochs of linear learning-rate warmup (at most half the epochs); 0 = none. Default: 0.
  double warmup_epochs = 0;
  /// Policy settings (train.staleness_aware_lr).
  policy_config policy_settings;
  /// Derive the policy's learning rate, momentum, batch and commit scaling from the
  /// configuration's by the rules of runtime/policy/policy_rules.hpp, for every key the
  /// user did not set on the command line or in the environment (train.policy_rules).
  /// Default: true.
  bool policy_rules = true;
};

/// [run]: where outputs go, checkpoints, devices, logging, evaluations and limits.
struct run_settings {
  /// Write a JSON summary here when training ends; empty = none. Default: "".
  std::string report;
  /// Write a Chrome trace-event JSON of every worker's steps here (run.trace); empty =
  /// none. Default: "".
  std::string trace;
  /// Write metrics as JSON lines here: per step and worker, events, evaluations
  /// (run.metrics); empty = none. Default: "".
  std::string metrics;
  /// Checkpoint the server shards (RocksDB in DIR/shard-ID) and the job's progress
  /// (DIR/job) here (run.checkpoint_dir); empty = no checkpoints. Default: "".
  std::string checkpoint_dir;
  /// A checkpoint cut of every shard each this many versions of shard 0, and once more
  /// at the end (run.checkpoint_every; 0: only at the end). Default: 100.
  uint64_t checkpoint_every = 100;
  /// Checkpoint cuts kept per shard and in the job record (run.checkpoint_keep). Default: 3.
  uint32_t checkpoint_keep = 3;
  /// Continue from the checkpoints in checkpoint_dir (run.resume). Default: false.
  bool resume = false;
  /// With checkpoints, how long the job and its workers wait for a lost server shard to
  /// be served again (`ashlar node --role server --shard ID --join ...`), in seconds
  /// (run.shard_wait). Default: 60.
  double shard_wait = 60;
  /// GPUs for the workers of this process (run.gpus): "auto" (every visible CUDA device),
  /// "none", or indices such as "0,1". One worker per GPU; the others compute on the
  /// CPU. Default: "auto".
  std::string gpus = "auto";
  /// Let cuBLAS use TF32 tensor cores for the GPU workers' products (run.tf32). Default: false.
  bool tf32 = false;
  /// Under local steps (adsp, ashl) a GPU worker keeps its model, velocity and open
  /// commit on the device between commits (run.gpu_local_model); false: the parameters
  /// go in and the gradient out every step. Default: true.
  bool gpu_local_model = true;
  /// Not a key: set by a node for a job submitted to it. Every file the job opens (trace,
  /// metrics, contention profile) is opened beneath this directory at the moment of use.
  std::string confine_root;
  /// Serve Prometheus metrics at http://HOST:PORT/metrics while the job runs
  /// (run.metrics_listen, e.g. "0.0.0.0:9400"); empty = none. Default: "".
  std::string metrics_listen;
  /// Seconds between live progress lines; 0 = no progress lines. Default: 1.
  double progress_interval = 1.0;
  /// Log level: trace, debug, info, warn, error. Default: info.
  std::string log_level = "info";
  /// Evaluate test accuracy at every epoch boundary (costs a forward pass over the test
  /// set each time). Default: true.
  bool eval_every_epoch = true;
  /// Also evaluate test accuracy every this many seconds (run.eval_interval); 0 = only at
  /// epoch boundaries. Default: 0.
  double eval_interval = 0;
  /// Stop the job after this many seconds of training, evaluating what it reached
  /// (run.time_limit); 0 = no limit. Default: 0.
  double time_limit = 0;
  /// Stop the job once a test evaluation reaches this accuracy, as time-to-accuracy
  /// runs do (run.target_accuracy; needs evaluations: run.eval_interval or epoch
  /// boundaries); 0 = train on. The evaluation that reaches it is of a snapshot, so the
  /// workers stop a little after the time it records. Default: 0.
  double target_accuracy = 0;
  /// Stop the job at the first report of a metric that meets this (run.target), "NAME OP
  /// VALUE" with OP one of <=, <, >=, >: a metric a script reports from its own
  /// evaluation (ashlar.torch.report(val_ppl=...): "val_ppl <= 150"), or "test_accuracy"
  /// (the job's own test evaluations, or a script's metric of that name). Default: "" (none).
  std::string target;
  /// When the training loss becomes non-finite or rises far above its start, put the
  /// last good snapshot of the parameters back and halve the learning rate, up to 6
  /// times, instead of training on at chance accuracy (run.divergence_guard;
  /// runtime/optim/divergence_guard.hpp). Without it, a non-finite loss stops the job.
  /// Default: true.
  bool divergence_guard = true;
};

/// The whole configuration: one section per module (data loading takes data_settings,
/// the job driver run_settings, ...), [model] and [ashl] as their own structs. Sections
/// are bases, so every key is also cfg.KEY.
/// The most workers a job holds at once: train.max_workers, or twice train.workers when 0.
inline uint32_t most_workers(const train_settings& t) { return t.max_workers > 0 ? t.max_workers : 2 * t.workers; }

struct train_config : data_settings, train_settings, run_settings {
  // [model]
  /// The model: input shape (model.input), classes (model.classes), and its layers
  /// (model.layers) or the MLP short form (model.hidden). Default: the MLP 784-256-128-10
  /// over 1x28x28 images.
  model_spec model;
  /// [ashl]: ASHL's stages (see runtime/policy/ashl.hpp for each default).
  ashl_config ashl;
  /// Where each key's value came from, for keys not at their default: "FILE:LINE",
  /// "env ASHLAR_...", "--lr" (a flag), "--set", "rule: ..." (policy_rules.hpp). Not a key.
  std::map<std::string, std::string> sources;
};

/// One configuration key: its TOML name ("train.workers"), environment variable
/// (ASHLAR_TRAIN_WORKERS), help text with default and unit, and its current value.
struct config_key_info {
  std::string key;
  std::string env;
  std::string help;
};

/// Every key, in documentation order.
std::vector<config_key_info> config_keys();

/// Sets `key` from its text form (numbers, true/false, comma-separated lists).
/// Errors name the key and the bad value: invalid_config for an unknown key or a value
/// that does not parse.
/// A non-empty `source` is recorded in cfg.sources.
[[nodiscard]] caf::error apply_setting(train_config& cfg, const std::string& key,
                                       const std::string& text, const std::string& source = {});

/// Reads a TOML file into `cfg`. Unknown sections or keys and mistyped values fail with
/// invalid_config naming the file, line and key; a missing file fails with io_error.
[[nodiscard]] caf::error apply_toml_file(train_config& cfg, const std::string& path);

/// Same, from TOML text (`origin` names it in errors).
[[nodiscard]] caf::error apply_toml_text(train_config& cfg, const std::string& text,
                                         const std::string& origin);

/// Applies every ASHLAR_<SECTION>_<KEY> variable that `lookup` returns non-null for.
using env_lookup = std::function<const char*(const char*)>;
[[nodiscard]] caf::error apply_environment(train_config& cfg, const env_lookup& lookup);

/// A warning for each of `names` (the environment's variable names) that starts with
/// ASHLAR_ but is no variable Ashlar reads (a key's, ASHLAR_TOKEN, ASHLAR_HOME,
/// ASHLAR_TLS_DIR, the Python package's ASHLAR_JOIN, ASHLAR_TOKEN_FILE, ASHLAR_NAME,
/// ASHLAR_CONFIG, ASHLAR_JOIN_FILE, ASHLAR_STORE_DIR, ASHLAR_RANK, ASHLAR_SIZE, ...;
/// ASHLAR_TEST_* are the tests'), with the closest one it may have meant.
std::vector<std::string> environment_warnings(const std::vector<std::string>& names);

/// Whether the workers' scripts' own optimizers update the model (train.optimizer = script).
inline bool script_optimizer(const train_config& cfg) { return cfg.optimizer_kind == "script"; }

/// The job's optimizer as the shards (or ring workers) apply it: train.lr, train.momentum,
/// train.weight_decay, Adam's betas and eps, and the rule train.optimizer names (sgd for
/// script: the shards' unit-rate SGD).
inline sgd_config job_optimizer(const train_config& cfg) {
  sgd_config o = cfg.optimizer;
  if (!parse_update_rule(cfg.optimizer_kind, o.rule))
    o.rule = update_rule::sgd;
  return o;
}

/// Most parameters a model may have: ranges and sparse indices are 32-bit.
constexpr uint64_t max_model_params = (uint64_t{1} << 31) - 1;

/// Checks the whole configuration for consistency (counts >= 1, known policy and data
/// source, positive learning rate...). Names the offending key.
[[nodiscard]] caf::error validate(const train_config& cfg);

/// Checks a run.gpus / --gpus value: "auto", "none" or device indices such as "0,1".
[[nodiscard]] caf::error validate_gpu_list(const std::string& devices);

/// The current value of `key` in text form (for --help and reports).
std::string setting_text(const train_config& cfg, const std::string& key);

}  // namespace ashlar
