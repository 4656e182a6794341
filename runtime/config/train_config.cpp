#include "runtime/config/train_config.hpp"

#include "runtime/core/suggest.hpp"

#include "runtime/metrics/metric_target.hpp"
#include "runtime/optim/lr_schedule.hpp"
#include "runtime/net/http_endpoint.hpp"

#include <cerrno>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <sstream>

#include <toml++/toml.h>

namespace ashlar {

namespace {

caf::error bad_value(const std::string& key, const std::string& text, const char* want) {
  return make_error(errc::invalid_config,
                    "config key " + key + ": '" + text + "' is not " + want);
}

caf::error parse(const std::string& key, const std::string& text, uint64_t& out) {
  if (text.empty() || text[0] == '-')
    return bad_value(key, text, "a non-negative integer");
  errno = 0;
  char* end = nullptr;
  auto v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0')
    return bad_value(key, text, "a non-negative integer");
  out = v;
  return caf::none;
}

caf::error parse(const std::string& key, const std::string& text, uint32_t& out) {
  uint64_t v = 0;
  if (auto err = parse(key, text, v))
    return err;
  if (v > UINT32_MAX)
    return bad_value(key, text, "an integer below 2^32");
  out = static_cast<uint32_t>(v);
  return caf::none;
}

caf::error parse(const std::string& key, const std::string& text, double& out) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(v))
    return bad_value(key, text, "a finite number");
  out = v;
  return caf::none;
}

caf::error parse(const std::string& key, const std::string& text, float& out) {
  double v = 0;
  if (auto err = parse(key, text, v))
    return err;
  if (std::abs(v) > static_cast<double>(std::numeric_limits<float>::max()))
    return bad_value(key, text, "a number a float holds (at most 3.4e38 in magnitude)");
  out = static_cast<float>(v);
  return caf::none;
}

caf::error parse(const std::string& key, const std::string& text, bool& out) {
  if (text == "true" || text == "1" || text == "yes" || text == "on")
    out = true;
  else if (text == "false" || text == "0" || text == "no" || text == "off")
    out = false;
  else
    return bad_value(key, text, "true or false");
  return caf::none;
}

caf::error parse(const std::string&, const std::string& text, std::string& out) {
  out = text;
  return caf::none;
}

// Comma-separated lists (brackets and blanks allowed); every item must parse as T and
// satisfy `ok`.
template <class T, class Ok>
caf::error parse_list(const std::string& key, const std::string& text, std::vector<T>& out,
                      const char* want, Ok ok) {
  std::vector<T> v;
  std::stringstream ss{text};
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto b = item.find_first_not_of(" \t[");
    auto e = item.find_last_not_of(" \t]");
    if (b == std::string::npos)
      continue;
    T x{};
    if (parse(key, item.substr(b, e - b + 1), x) || !ok(x))
      return bad_value(key, text, want);
    v.push_back(x);
  }
  out = std::move(v);
  return caf::none;
}

caf::error parse(const std::string& key, const std::string& text, std::vector<uint32_t>& out) {
  return parse_list(key, text, out, "a comma-separated list of non-negative integers",
                    [](uint32_t) { return true; });
}

caf::error parse(const std::string& key, const std::string& text, std::vector<double>& out) {
  return parse_list(key, text, out, "a comma-separated list of positive numbers",
                    [](double x) { return x > 0; });
}

caf::error parse(const std::string& key, const std::string& text, tensor_shape& out) {
  std::vector<uint32_t> dims;
  if (auto err = parse_list(key, text, dims, "a shape C,H,W or a width (e.g. 1,28,28 or 784)",
                            [](uint32_t v) { return v > 0; }))
    return err;
  if (dims.size() == 1)
    out = tensor_shape{dims[0], 1, 1};
  else if (dims.size() == 3)
    out = tensor_shape{dims[0], dims[1], dims[2]};
  else
    return bad_value(key, text, "a shape C,H,W or a width (e.g. 1,28,28 or 784)");
  return caf::none;
}

caf::error parse(const std::string&, const std::string& text, std::vector<layer_spec>& out) {
  auto layers = parse_layers(text);
  if (!layers)
    return layers.error();
  out = std::move(*layers);
  return caf::none;
}

// Modes: each enum's own parser names the key and the choices.
template <class E>
caf::error parse_mode(expected<E> (*from)(const std::string&), const std::string& text, E& out) {
  auto v = from(text);
  if (!v)
    return v.error();
  out = *v;
  return caf::none;
}
caf::error parse(const std::string&, const std::string& text, data_source_kind& out) {
  return parse_mode(parse_data_source, text, out);
}
caf::error parse(const std::string&, const std::string& text, allocation_mode& out) {
  return parse_mode(parse_allocation, text, out);
}
caf::error parse(const std::string&, const std::string& text, lr_schedule_kind& out) {
  return parse_mode(parse_lr_schedule, text, out);
}
caf::error parse(const std::string&, const std::string& text, ashl_rule& out) {
  return parse_mode(parse_ashl_rule, text, out);
}

std::string show(data_source_kind v) { return to_string(v); }
std::string show(allocation_mode v) { return to_string(v); }
std::string show(lr_schedule_kind v) { return to_string(v); }
std::string show(ashl_rule v) { return to_string(v); }
std::string show(uint64_t v) { return std::to_string(v); }
std::string show(uint32_t v) { return std::to_string(v); }
std::string show(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
std::string show(float v) { return show(static_cast<double>(v)); }
std::string show(bool v) { return v ? "true" : "false"; }
std::string show(const std::string& v) { return v; }
std::string show(const std::vector<double>& v) {
  std::string s;
  for (auto x : v)
    s += (s.empty() ? "" : ",") + show(x);
  return s;
}
std::string show(const tensor_shape& v) {
  return v.flat() ? std::to_string(v.c)
                  : std::to_string(v.c) + "," + std::to_string(v.h) + "," + std::to_string(v.w);
}
std::string show(const std::vector<layer_spec>& v) {
  return layers_text(v);
}
std::string show(const std::vector<uint32_t>& v) {
  std::string s;
  for (auto x : v)
    s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

struct field {
  std::string key;
  std::string help;
  std::function<caf::error(train_config&, const std::string&)> set;
  std::function<std::string(const train_config&)> get;
};

// Binds a key to a member through an accessor, so nested members work too.
template <class Access>
field bind(std::string key, std::string help, Access access) {
  field f;
  f.key = key;
  f.help = std::move(help);
  f.set = [key, access](train_config& c, const std::string& text) {
    return parse(key, text, access(c));
  };
  f.get = [access](const train_config& c) {
    return show(access(const_cast<train_config&>(c)));
  };
  return f;
}

const std::vector<field>& fields() {
  static const std::vector<field> table = {
    bind("data.dir", "directory of the data: Fashion-MNIST's IDX files, or for data.source = npy "
                     "x_train.npy, y_train.npy, x_test.npy, y_test.npy (default /usr/share/datasets/fashion-mnist)",
         [](train_config& c) -> std::string& { return c.data_dir; }),
    bind("data.source", "fashion-mnist, npy (your own NumPy arrays in data.dir) or synthetic (default fashion-mnist)",
         [](train_config& c) -> data_source_kind& { return c.data_source; }),
    bind("data.crop_padding", "augmentation: pad training images by N pixels and crop back at a random offset, "
                              "every epoch; 0 = off (default 0)",
         [](train_config& c) -> uint32_t& { return c.crop_padding; }),
    bind("data.hflip", "augmentation: mirror training images left-right with probability 1/2, every epoch "
                       "(default false)",
         [](train_config& c) -> bool& { return c.hflip; }),
    bind("data.train_limit", "use the first N training samples, 0 = all (default 0)",
         [](train_config& c) -> uint64_t& { return c.train_limit; }),
    bind("data.test_limit", "use the first N test samples, 0 = all (default 0)",
         [](train_config& c) -> uint64_t& { return c.test_limit; }),
    bind("model.input", "shape of one sample, C,H,W (default 1,28,28)",
         [](train_config& c) -> tensor_shape& { return c.model.input; }),
    bind("model.classes", "output classes; the last layer's output (default 10)",
         [](train_config& c) -> uint32_t& { return c.model.classes; }),
    bind("model.hidden", "MLP short form: hidden layer widths, comma-separated; used when model.layers is empty "
                         "(default 256,128)",
         [](train_config& c) -> std::vector<uint32_t>& { return c.model.hidden; }),
    bind("model.layers", "the layers, 'KIND key=value ...' separated by ';' (e.g. 'conv2d out=32 kernel=5 "
                         "padding=2; relu; maxpool; flatten; dense out=10'; kinds: dense, conv2d, maxpool, avgpool, "
                         "relu, flatten, dropout, groupnorm, layernorm, add, external); empty = the MLP of "
                         "model.hidden (default empty)",
         [](train_config& c) -> std::vector<layer_spec>& { return c.model.layers; }),
    bind("train.workers", "number of workers (default 4)",
         [](train_config& c) -> uint32_t& { return c.workers; }),
    bind("train.max_workers", "on a cluster, the most workers the job grows to as worker nodes join while it runs; "
                              "0 = twice train.workers (default 0)",
         [](train_config& c) -> uint32_t& { return c.max_workers; }),
    bind("train.min_workers", "the fewest workers a running job goes on with after it lost members (a process "
                              "killed, a node gone); below it the job fails naming the loss (default 1)",
         [](train_config& c) -> uint32_t& { return c.min_workers; }),
    bind("train.servers", "number of server shards (default 2)",
         [](train_config& c) -> uint32_t& { return c.servers; }),
    bind("train.policy", "sync policy: bsp, asp, ssp, ksync, kasync, adsp, adaptive, ashl or ring; README's "
                         "\"Which policy\" table says which to pick (default bsp)",
         [](train_config& c) -> std::string& { return c.policy; }),
    bind("train.epochs", "passes over the training set (default 10)",
         [](train_config& c) -> uint32_t& { return c.epochs; }),
    bind("train.batch_size", "mini-batch size per worker, samples (default 64)",
         [](train_config& c) -> uint32_t& { return c.batch_size; }),
    bind("train.seed", "seed for initial parameters and data order (default 1)",
         [](train_config& c) -> uint64_t& { return c.seed; }),
    bind("train.chunk_floats", "largest tensor chunk per message, floats (default 262144 = 1 MiB)",
         [](train_config& c) -> uint64_t& { return c.chunk_floats; }),
    bind("train.chunks_in_flight", "chunks a worker keeps in flight per shard, at most 16 (default 4)",
         [](train_config& c) -> uint32_t& { return c.chunks_in_flight; }),
    bind("train.topk_ratio", "push compression: fraction of the gradient each push carries (top-k, error feedback); 0 = dense (default 0)",
         [](train_config& c) -> double& { return c.topk_ratio; }),
    bind("train.pull_topk_ratio", "pull compression: pulls are delta reads carrying this fraction of each range "
                                  "(what changed most; the rest follows later); 0 = dense (default 0; ashl decides itself)",
         [](train_config& c) -> double& { return c.pull_topk_ratio; }),
    bind("train.commit_scale", "adsp/ashl: a commit pushes its summed local gradients times this; 0 = 1/workers (default 0)",
         [](train_config& c) -> double& { return c.commit_scale; }),
    bind("train.local_momentum", "adsp/ashl: each worker's momentum over its own gradients, in its local steps and "
                                 "commits (default 0; ashl's rule: 0.5)",
         [](train_config& c) -> double& { return c.local_momentum; }),
    bind("train.average_epochs", "the shards keep a running average of the parameters with this half-life in epochs; "
                                 "evaluations, the final accuracy and `checkpoint export` are the average's (checkpoints store it beside the parameters); 0 = none (default 0; adsp's and "
                                 "ashl's rule: 0.0625)",
         [](train_config& c) -> double& { return c.average_epochs; }),
    bind("train.overlap_commits", "adsp/ashl: a commit's push and pull run while the next local steps compute (default false)",
         [](train_config& c) -> bool& { return c.overlap_commits; }),
    bind("train.speeds",
         "pacing: relative worker speeds, e.g. 1,1,2,4, each > 0; worker i runs at entry i mod their number (1 "
         "paces every worker at speed 1; entries past train.workers pace workers added later); empty = unpaced "
         "(default empty)",
         [](train_config& c) -> std::vector<double>& { return c.speeds; }),
    bind("train.sample_ms", "pacing: milliseconds per sample at speed 1 (default 0.5)",
         [](train_config& c) -> double& { return c.sample_ms; }),
    bind("train.contention", "pacing: contention profile file, lines WORKER START_S END_S FACTOR (default none)",
         [](train_config& c) -> std::string& { return c.contention; }),
    bind("train.lr", "learning rate of synchronous training; other policies derive theirs from it (train.policy_rules) "
                     "(default 0.05)",
         [](train_config& c) -> float& { return c.optimizer.lr; }),
    bind("train.lr_schedule", "learning rate over the epochs (or over run.time_limit, if that ends first): constant, "
                              "cosine (half a cosine down to 0) or step (x0.1 at half the epochs, x0.01 at three "
                              "quarters) (default constant)",
         [](train_config& c) -> lr_schedule_kind& { return c.lr_schedule; }),
    bind("train.warmup_epochs", "epochs of linear learning-rate warmup (at most half of train.epochs), 0 = none "
                                "(default 0)",
         [](train_config& c) -> double& { return c.warmup_epochs; }),
    bind("train.optimizer", "what updates the model: sgd (the shards' SGD, train.lr and train.momentum), adam or "
                            "adamw (the shards' Adam, as torch.optim.Adam and AdamW, with train.beta1, train.beta2 "
                            "and train.eps; lockstep and asynchronous-push policies and ring) or script (each Python "
                            "worker's own torch optimizer through ashlar.torch; the shards carry mean gradients or "
                            "parameter deltas at a unit rate) (default sgd)",
         [](train_config& c) -> std::string& { return c.optimizer_kind; }),
    bind("train.beta1", "adam, adamw: the first moment's decay rate (default 0.9)",
         [](train_config& c) -> float& { return c.optimizer.beta1; }),
    bind("train.beta2", "adam, adamw: the second moment's decay rate (default 0.999)",
         [](train_config& c) -> float& { return c.optimizer.beta2; }),
    bind("train.eps", "adam, adamw: the term added to the denominator (default 1e-08)",
         [](train_config& c) -> float& { return c.optimizer.eps; }),
    bind("train.momentum", "SGD momentum, 0 = none (default 0.9)",
         [](train_config& c) -> float& { return c.optimizer.momentum; }),
    bind("train.weight_decay", "L2 weight decay (default 0.0001)",
         [](train_config& c) -> float& { return c.optimizer.weight_decay; }),
    bind("train.allocation", "batch split: equal, proportional, adaptive or predicted (default equal)",
         [](train_config& c) -> allocation_mode& { return c.allocation; }),
    bind("train.data_plane", "cluster: tensors on direct worker-shard connections (default true)",
         [](train_config& c) -> bool& { return c.data_plane; }),
    bind("train.policy_rules", "derive the policy's lr, momentum, batch and commit scaling from this config's "
                               "(synchronous) values by its rules, for keys not set by flag, --set or environment; "
                               "`ashlar train --explain` shows them (default true)",
         [](train_config& c) -> bool& { return c.policy_rules; }),
    bind("train.staleness_aware_lr", "asp: divide lr by 1 + staleness (default false)",
         [](train_config& c) -> bool& { return c.policy_settings.staleness_aware_lr; }),
    bind("train.staleness_bound", "ssp: clocks a worker may run ahead of the slowest (default 3)",
         [](train_config& c) -> uint64_t& { return c.policy_settings.staleness_bound; }),
    bind("train.k", "ksync/kasync: gradients per update, 0 = half the workers (default 0)",
         [](train_config& c) -> uint32_t& { return c.policy_settings.k; }),
    bind("ashl.profile_steps", "ashl: steps every worker completes in the profiling stage (default 5)",
         [](train_config& c) -> uint32_t& { return c.ashl.profile_steps; }),
    bind("ashl.ahl_local_steps", "ashl: the slowest worker's local steps per commit in AHL (default 2)",
         [](train_config& c) -> uint32_t& { return c.ashl.ahl_local_steps; }),
    bind("ashl.ahl_gap", "ashl: commits a worker may run ahead of the slowest in AHL (default 16)",
         [](train_config& c) -> uint64_t& { return c.ashl.ahl_gap; }),
    bind("ashl.shl_local_steps", "ashl: the slowest worker's local steps per commit in SHL (default 1)",
         [](train_config& c) -> uint32_t& { return c.ashl.shl_local_steps; }),
    bind("ashl.shl_gap", "ashl: commits a worker may run ahead of the slowest in SHL (default 2)",
         [](train_config& c) -> uint64_t& { return c.ashl.shl_gap; }),
    bind("ashl.shl_lr_scale", "ashl: learning rate factor in SHL, shards and local steps (default 0.5)",
         [](train_config& c) -> double& { return c.ashl.shl_lr_scale; }),
    bind("ashl.rule", "ashl: AHL -> SHL on a loss plateau or at a target loss: plateau or loss (default plateau)",
         [](train_config& c) -> ashl_rule& { return c.ashl.rule; }),
    bind("ashl.plateau_window_epochs", "ashl: plateau rule window, epochs of training samples, all workers' "
                                       "together (default 0.25)",
         [](train_config& c) -> double& { return c.ashl.plateau_window_epochs; }),
    bind("ashl.plateau_window_s", "ashl: plateau rule window in seconds instead, when above 0 (default 0)",
         [](train_config& c) -> double& { return c.ashl.plateau_window_s; }),
    bind("ashl.plateau_drop", "ashl: plateau when the loss fell by less than this fraction in the window (default 0.1)",
         [](train_config& c) -> double& { return c.ashl.plateau_drop; }),
    bind("ashl.switch_loss", "ashl: loss rule: switch once the training loss is at most this (default 0.45)",
         [](train_config& c) -> double& { return c.ashl.switch_loss; }),
    bind("ashl.pull_topk_ratio", "ashl: pulls are delta reads of this fraction of the range when communication "
                                 "is at least ashl.pull_compress_above of the slowest step's compute; 0 = dense (default 0.1)",
         [](train_config& c) -> double& { return c.ashl.pull_topk_ratio; }),
    bind("ashl.pull_compress_above", "ashl: profiled communication per commit, as a fraction of the slowest "
                                     "worker's compute per step, from which pulls are compressed (default 0: always)",
         [](train_config& c) -> double& { return c.ashl.pull_compress_above; }),
    bind("ashl.max_comm_share", "ashl: communication's largest share of the slowest worker's commit period; "
                                "past it that worker takes more local steps than its stage's (default 0.25; 1 = no limit)",
         [](train_config& c) -> double& { return c.ashl.max_comm_share; }),
    bind("ashl.topk_ratio", "ashl: fraction of the gradient each push carries in both stages; 0 = dense (default 0.1)",
         [](train_config& c) -> double& { return c.ashl.topk_ratio; }),
    bind("run.report", "write a JSON summary to this file (default none)",
         [](train_config& c) -> std::string& { return c.report; }),
    bind("run.checkpoint_dir", "checkpoint shards and job progress into this directory (default none)",
         [](train_config& c) -> std::string& { return c.checkpoint_dir; }),
    bind("run.checkpoint_every", "a checkpoint cut of every shard each this many versions of shard 0 (default 100)",
         [](train_config& c) -> uint64_t& { return c.checkpoint_every; }),
    bind("run.checkpoint_keep", "checkpoint cuts kept per shard and in the job record (default 3)",
         [](train_config& c) -> uint32_t& { return c.checkpoint_keep; }),
    bind("run.resume", "continue from the checkpoints in run.checkpoint_dir (default false)",
         [](train_config& c) -> bool& { return c.resume; }),
    bind("run.shard_wait", "with checkpoints: seconds to wait for a lost shard to be served again; on a cluster, also "
         "for a worker to join when every worker was lost (default 60)",
         [](train_config& c) -> double& { return c.shard_wait; }),
    bind("run.gpus", "GPUs for this process's workers: auto (every visible one), none, or indices such as 0,1; "
                     "one worker per GPU, the others on the CPU (default auto)",
         [](train_config& c) -> std::string& { return c.gpus; }),
    bind("run.tf32", "let cuBLAS use TF32 tensor cores for the GPU workers' float32 products (default false)",
         [](train_config& c) -> bool& { return c.tf32; }),
    bind("run.gpu_local_model", "under local steps (adsp, ashl) a GPU worker keeps its model on the device between "
                                "commits; false: parameters in and gradient out every step (default true)",
         [](train_config& c) -> bool& { return c.gpu_local_model; }),
    bind("run.trace", "write a Chrome trace-event JSON (Perfetto) of the run to this file (default none)",
         [](train_config& c) -> std::string& { return c.trace; }),
    bind("run.metrics", "write per-step metrics as JSON lines to this file (default none)",
         [](train_config& c) -> std::string& { return c.metrics; }),
    bind("run.metrics_listen", "serve Prometheus metrics on HOST:PORT at /metrics (default none)",
         [](train_config& c) -> std::string& { return c.metrics_listen; }),
    bind("run.progress_interval", "seconds between progress lines, 0 = none (default 1)",
         [](train_config& c) -> double& { return c.progress_interval; }),
    bind("run.log_level", "trace, debug, info, warn or error (default info)",
         [](train_config& c) -> std::string& { return c.log_level; }),
    bind("run.eval_interval", "seconds between test evaluations, 0 = epoch boundaries only (default 0)",
         [](train_config& c) -> double& { return c.eval_interval; }),
    bind("run.time_limit", "stop training after this many seconds, 0 = none (default 0)",
         [](train_config& c) -> double& { return c.time_limit; }),
    bind("run.target_accuracy", "stop once a test evaluation reaches this accuracy (time to accuracy), 0 = train on "
                                "(default 0)",
         [](train_config& c) -> double& { return c.target_accuracy; }),
    bind("run.target", "stop once a reported metric meets this, \"NAME OP VALUE\" (OP <=, <, >=, >): a script's "
                       "own (ashlar.torch.report(val_ppl=...): \"val_ppl <= 150\") or the job's test_accuracy "
                       "(default none)",
         [](train_config& c) -> std::string& { return c.target; }),
    bind("run.divergence_guard", "on a loss that is not finite or rises far above its start, put the last good "
                                 "snapshot back and halve the lr (up to 6 times); off: such a loss stops the job "
                                 "(default true)",
         [](train_config& c) -> bool& { return c.divergence_guard; }),
    bind("run.eval_every_epoch", "evaluate test accuracy at each epoch boundary (default true)",
         [](train_config& c) -> bool& { return c.eval_every_epoch; }),
  };
  return table;
}

const field* find_field(const std::string& key) {
  for (const auto& f : fields())
    if (f.key == key)
      return &f;
  return nullptr;
}

std::string env_name(const std::string& key) {
  std::string s = "ASHLAR_";
  for (char c : key)
    s += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> key_names() {
  std::vector<std::string> out;
  for (const auto& f : fields())
    out.push_back(f.key);
  return out;
}

// "unknown config key 'train.lrr' (did you mean 'train.lr'?); ..." without the whole list.
std::string unknown_key(const std::string& key) {
  return "unknown config key '" + key + "'" + did_you_mean(key, key_names())
         + "; `ashlar train --help` lists every key";
}

// The text form of a TOML value, for the shared text parsers.
bool toml_text(const toml::node& n, std::string& out) {
  if (auto s = n.as_string()) {
    out = s->get();
    return true;
  }
  if (auto i = n.as_integer()) {
    out = std::to_string(i->get());
    return true;
  }
  if (auto d = n.as_floating_point()) {
    out = show(d->get());
    return true;
  }
  if (auto b = n.as_boolean()) {
    out = b->get() ? "true" : "false";
    return true;
  }
  if (auto a = n.as_array()) {
    out.clear();
    for (const auto& e : *a) {
      std::string item;
      if (!toml_text(e, item) || e.is_array())
        return false;
      out += (out.empty() ? "" : ",") + item;
    }
    return true;
  }
  return false;
}

// model.layers in TOML: a string in the text form, or an array whose items are strings
// ("conv2d out=32 kernel=5") or tables ({ type = "conv2d", out = 32, kernel = 5 }, also
// written as [[model.layers]] sections). Returns the text form.
expected<std::string> toml_layers(const toml::node& n) {
  if (auto s = n.as_string())
    return s->get();
  auto a = n.as_array();
  if (!a)
    return make_error(errc::invalid_config, "config key model.layers must be a string or an array of layers");
  std::string out;
  size_t i = 0;
  for (const auto& e : *a) {
    std::string item;
    if (auto s = e.as_string()) {
      item = s->get();
    } else if (auto t = e.as_table()) {
      auto type = t->get("type");
      if (!type || !type->as_string())
        return make_error(errc::invalid_config, "model.layers[" + std::to_string(i) + "] needs type = \"KIND\"");
      item = type->as_string()->get();
      for (const auto& [k, v] : *t) {
        if (k.str() == "type")
          continue;
        std::string text;
        if (!toml_text(v, text) || v.is_array())
          return make_error(errc::invalid_config, "model.layers[" + std::to_string(i) + "]." + std::string{k.str()}
                                                    + " must be a number, string or boolean");
        item += " " + std::string{k.str()} + "=" + text;
      }
    } else {
      return make_error(errc::invalid_config,
                        "model.layers[" + std::to_string(i) + "] must be a string or a table with type = \"KIND\"");
    }
    out += (out.empty() ? "" : "; ") + item;
    ++i;
  }
  return out;
}

}  // namespace

std::vector<config_key_info> config_keys() {
  std::vector<config_key_info> out;
  for (const auto& f : fields())
    out.push_back({f.key, env_name(f.key), f.help});
  return out;
}

caf::error apply_setting(train_config& cfg, const std::string& key, const std::string& text,
                         const std::string& source) {
  auto f = find_field(key);
  if (!f)
    return make_error(errc::invalid_config, unknown_key(key));
  if (auto err = f->set(cfg, text))
    return err;
  if (!source.empty())
    cfg.sources[key] = source;
  return caf::none;
}

std::string setting_text(const train_config& cfg, const std::string& key) {
  auto f = find_field(key);
  return f ? f->get(cfg) : std::string{};
}

caf::error apply_toml_text(train_config& cfg, const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    return make_error(errc::invalid_config, os.str());
  }
  for (const auto& [section, node] : root) {
    auto where = [&](const toml::node& n) {
      return origin + ":" + std::to_string(n.source().begin.line);
    };
    auto tbl = node.as_table();
    if (!tbl)
      return make_error(errc::invalid_config,
                        where(node) + ": top-level key '" + std::string{section.str()}
                          + "' must be a section ([data], [model], [train], [ashl] or [run])");
    for (const auto& [name, value] : *tbl) {
      std::string key = std::string{section.str()} + "." + std::string{name.str()};
      if (!find_field(key))
        return make_error(errc::invalid_config, where(value) + ": " + unknown_key(key));
      std::string txt;
      if (key == "model.layers") {
        auto layers = toml_layers(value);
        if (!layers)
          return make_error(errc::invalid_config, where(value) + ": " + describe(layers.error()));
        txt = *layers;
      } else if (!toml_text(value, txt))
        return make_error(errc::invalid_config,
                          where(value) + ": config key " + key + " has an unsupported value type");
      if (auto err = apply_setting(cfg, key, txt, where(value)))
        return make_error(errc::invalid_config, where(value) + ": " + describe(err));
    }
  }
  return caf::none;
}

caf::error apply_toml_file(train_config& cfg, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    return make_error(errc::io_error,
                      "cannot open config file " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0)
    text.append(buf, got);
  std::fclose(f);
  return apply_toml_text(cfg, text, path);
}

caf::error apply_environment(train_config& cfg, const env_lookup& lookup) {
  for (const auto& f : fields()) {
    auto name = env_name(f.key);
    if (const char* v = lookup(name.c_str()))
      if (auto err = apply_setting(cfg, f.key, v, "env " + name))
        return make_error(errc::invalid_config, "environment variable " + name + ": " + describe(err));
  }
  return caf::none;
}

std::vector<std::string> environment_warnings(const std::vector<std::string>& names) {
  // ASHLAR_* variables that are not a key's: the cluster's, the Python package's (what
  // ashlar launch --python sets for a worker script), the Slurm scripts' and the test
  // harness's own.
  static const std::vector<std::string> others{"ASHLAR_TOKEN",     "ASHLAR_HOME", "ASHLAR_TLS_DIR", "ASHLAR_JOIN",
                                               "ASHLAR_TOKEN_FILE", "ASHLAR_NAME", "ASHLAR_CONFIG",
                                               "ASHLAR_LOCAL_RANK", "ASHLAR_GPU", "ASHLAR_JOIN_FILE",
                                               "ASHLAR_STORE_DIR", "ASHLAR_RANK", "ASHLAR_SIZE",
                                               "ASHLAR_LOCAL_SIZE", "ASHLAR_POLICY",
                                               "ASHLAR_COLLECTIVE_TIMEOUT",
                                               // --join auto's, and ops/slurm's scripts'
                                               "ASHLAR_PORT", "ASHLAR_SLURM_DIR", "ASHLAR_JOB_DIR",
                                               "ASHLAR_SERVERS"};
  std::vector<std::string> known = others;
  for (const auto& f : fields())
    known.push_back(env_name(f.key));
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (n.rfind("ASHLAR_", 0) != 0 || n.rfind("ASHLAR_TEST_", 0) == 0)
      continue;
    if (std::find(known.begin(), known.end(), n) == known.end())
      out.push_back("environment variable " + n + " is not one Ashlar reads" + did_you_mean(n, known)
                    + "; it is ignored");
  }
  return out;
}

caf::error validate_gpu_list(const std::string& devices) {
  if (devices == "auto" || devices == "none" || devices.empty())
    return caf::none;
  size_t start = 0;
  while (start <= devices.size()) {
    auto end = std::min(devices.find(',', start), devices.size());
    auto item = devices.substr(start, end - start);
    if (item.empty() || item.size() > 3 || item.find_first_not_of("0123456789") != std::string::npos)
      return make_error(errc::invalid_config, "run.gpus '" + devices + "': expected auto, none or device indices "
                                                "such as 0,1 (not '" + item + "')");
    start = end + 1;
  }
  return caf::none;
}

caf::error validate(const train_config& c) {
  auto bad = [](const std::string& msg) { return make_error(errc::invalid_config, msg); };
  if (auto err = validate_gpu_list(c.gpus))
    return err;
  if (c.workers == 0)
    return bad("train.workers must be at least 1");
  if (c.max_workers != 0 && c.max_workers < c.workers)
    return bad("train.max_workers = " + std::to_string(c.max_workers) + " is below train.workers = "
               + std::to_string(c.workers) + " (0: twice train.workers)");
  if (c.min_workers == 0 || c.min_workers > c.workers)
    return bad("train.min_workers = " + std::to_string(c.min_workers) + " must be between 1 and train.workers = "
               + std::to_string(c.workers));
  if (c.servers == 0)
    return bad("train.servers must be at least 1");
  if (c.epochs == 0)
    return bad("train.epochs must be at least 1");
  if (c.batch_size == 0)
    return bad("train.batch_size must be at least 1");
  if (!(c.sample_ms > 0) || c.sample_ms > 60000)
    return bad("train.sample_ms must be in (0, 60000] milliseconds per sample");
  if (c.chunk_floats == 0)
    return bad("train.chunk_floats must be at least 1");
  if (c.chunks_in_flight == 0 || c.chunks_in_flight > train_config::max_chunks_in_flight)
    return bad("train.chunks_in_flight must be in [1, " + std::to_string(train_config::max_chunks_in_flight) + "]");
  // A sparse entry costs 8 bytes (index and value): from half the entries on, a sparse
  // push is no smaller than a dense one.
  if (!(c.commit_scale >= 0 && c.commit_scale <= 1))
    return bad("train.commit_scale must be in [0, 1] (0: 1 / workers)");
  if (!(c.local_momentum >= 0 && c.local_momentum < 1))
    return bad("train.local_momentum must be in [0, 1)");
  if (!(c.average_epochs >= 0 && c.average_epochs <= 100))
    return bad("train.average_epochs must be in [0, 100] epochs (0: no running average)");
  if (!(c.topk_ratio >= 0 && c.topk_ratio < 0.5))
    return bad("train.topk_ratio must be in [0, 0.5): from 0.5 on a sparse push is no smaller than a dense one");
  if (!(c.pull_topk_ratio >= 0 && c.pull_topk_ratio < 0.5))
    return bad("train.pull_topk_ratio must be in [0, 0.5): from 0.5 on a delta read is no smaller than a dense one");
  if (!(c.ashl.topk_ratio >= 0 && c.ashl.topk_ratio < 0.5))
    return bad("ashl.topk_ratio must be in [0, 0.5): from 0.5 on a sparse push is no smaller than a dense one");
  if (!(c.optimizer.lr > 0))
    return bad("train.lr must be > 0");
  update_rule rule{};
  if (c.optimizer_kind != "script" && !parse_update_rule(c.optimizer_kind, rule))
    return bad("train.optimizer '" + c.optimizer_kind + "' is not known"
               + did_you_mean(c.optimizer_kind, {"sgd", "adam", "adamw", "script"}) + " (known: sgd, adam, adamw, script)");
  if (rule != update_rule::sgd) {
    if (!(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1) || !(c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1))
      return bad("train.beta1 and train.beta2 must be in [0, 1)");
    if (!(c.optimizer.eps > 0))
      return bad("train.eps must be > 0");
  }
  if (!(c.warmup_epochs >= 0) || !std::isfinite(c.warmup_epochs))
    return bad("train.warmup_epochs must be a number of epochs, at least 0");
  if (c.optimizer.momentum < 0 || c.optimizer.momentum >= 1)
    return bad("train.momentum must be in [0, 1)");
  if (c.optimizer.weight_decay < 0)
    return bad("train.weight_decay must be >= 0");
  if (c.progress_interval < 0)
    return bad("run.progress_interval must be >= 0");
  if (c.eval_interval < 0)
    return bad("run.eval_interval must be >= 0");
  if (c.resume && c.checkpoint_dir.empty())
    return bad("run.resume needs run.checkpoint_dir (--checkpoint-dir DIR): where the checkpoints are");
  if (script_optimizer(c) && !c.checkpoint_dir.empty())
    return bad(std::string{c.resume ? "run.resume" : "run.checkpoint_dir"}
               + ": under train.optimizer = script the model and its optimizer state are the scripts' (the "
                 "shards hold only what the rule passes between them): a script checkpoints itself as under "
                 "Horovod (rank 0 saves model.state_dict() and optimizer.state_dict(); the resumed run loads "
                 "them on rank 0, then calls broadcast_parameters and broadcast_optimizer_state); "
                 "see docs/pytorch.md, Checkpoints");
  if (c.checkpoint_keep < 1)
    return bad("run.checkpoint_keep must be >= 1");
  if (!c.metrics_listen.empty()) {
    std::string host;
    uint16_t port = 0;
    if (parse_listen(c.metrics_listen, host, port))
      return bad("run.metrics_listen = \"" + c.metrics_listen + "\" is not HOST:PORT (e.g. 0.0.0.0:9400)");
  }
  if (c.time_limit < 0)
    return bad("run.time_limit must be >= 0");
  if (!(c.target_accuracy >= 0 && c.target_accuracy <= 1))
    return bad("run.target_accuracy must be in [0, 1] (a test accuracy; 0 = train on)");
  if (c.target_accuracy > 0 && c.eval_interval <= 0 && !c.eval_every_epoch)
    return bad("run.target_accuracy needs test evaluations: set run.eval_interval or run.eval_every_epoch");
  if (!c.target.empty())
    if (auto t = parse_metric_target(c.target); !t)
      return t.error();
  if (c.crop_padding > 64)
    return bad("data.crop_padding must be at most 64 pixels");
  static const std::vector<std::string> levels = {"trace", "debug", "info", "warn", "error", "off"};
  if (std::find(levels.begin(), levels.end(), c.log_level) == levels.end())
    return bad("run.log_level must be one of trace, debug, info, warn, error, off");
  auto plan = compile(c.model);
  if (!plan)
    return plan.error();
  if (plan->num_params > max_model_params)
    return bad("model " + c.model.to_string() + " has " + std::to_string(plan->num_params)
               + " parameters; Ashlar takes at most " + std::to_string(max_model_params)
               + " (2^31 - 1: shard ranges and sparse indices are 32-bit)");
  if ((c.crop_padding > 0 || c.hflip) && c.model.input.flat())
    return bad("data.crop_padding and data.hflip need image samples, but model.input is the flat "
               + c.model.input.to_string() + " (set model.input = C,H,W)");
  if (c.servers > plan->num_params)
    return bad("train.servers = " + std::to_string(c.servers) + " exceeds the "
               + std::to_string(c.model.num_params()) + " parameters of model "
               + c.model.to_string() + ": every shard needs at least one parameter");
  return caf::none;
}

}  // namespace ashlar
