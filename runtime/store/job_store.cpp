#include "runtime/store/job_store.hpp"
#include "runtime/os/paths.hpp"

#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/config/train_config.hpp"

namespace ashlar {

std::vector<std::string> job_settings(const train_config& cfg) {
  std::vector<std::string> out;
  for (const auto& k : config_keys()) {
    if (k.key.rfind("run.", 0) == 0 || k.key == "data.dir" || k.key == "train.epochs" || k.key == "train.speeds"
        || k.key == "train.sample_ms" || k.key == "train.contention"
        || k.key == "train.average_epochs") // what is evaluated, not what is trained
      continue;
    out.push_back(k.key + "=" + setting_text(cfg, k.key));
  }
  return out;
}

std::string settings_diff(const std::vector<std::string>& then_kv, const std::vector<std::string>& now_kv) {
  std::map<std::string, std::string> then, now;
  auto split = [](const std::vector<std::string>& kvs, std::map<std::string, std::string>& m) {
    for (const auto& kv : kvs)
      m[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  };
  split(then_kv, then);
  split(now_kv, now);
  std::string diff;
  const train_config defaults;
  for (const auto& [k, v] : now) {
    auto i = then.find(k);
    if (i != then.end()) {
      if (i->second != v)
        diff += (diff.empty() ? "" : "; ") + k + " = " + v + " (checkpointed job: " + i->second + ")";
      continue;
    }
    const std::string was = setting_text(defaults, k);
    if (was != v)
      diff += (diff.empty() ? "" : "; ") + k + " = " + v + " (checkpointed job: " + was
              + ", the default; its record predates this setting)";
  }
  return diff;
}

namespace {

std::string cut_list(const std::vector<uint64_t>& cuts) {
  if (cuts.empty())
    return "none";
  std::string out;
  for (auto c : cuts)
    out += (out.empty() ? "" : ", ") + std::to_string(c);
  return out;
}

}  // namespace

expected<cut_choice> choose_cut(const std::vector<uint64_t>& committed, const std::vector<shard_cuts>& shards,
                                const std::string& where) {
  auto holds = [](const shard_cuts& s, uint64_t c) {
    return std::find(s.intact.begin(), s.intact.end(), c) != s.intact.end();
  };
  if (committed.empty()) {
    // No record at all (a job's start record is written before its shards write any cut).
    for (const auto& s : shards)
      if (!s.intact.empty())
        return make_error(errc::corrupt_data,
                          where + ": shard " + std::to_string(s.shard_id) + " holds checkpoint cuts ("
                            + cut_list(s.intact) + ") that no job record names (the job's record in " + where
                            + "/job is missing or another job wrote them); starting over would mix two jobs: "
                              "use another directory, or check it with `ashlar checkpoint verify "
                            + where + "`");
    return cut_choice{};
  }
  std::vector<uint64_t> newest_first = committed;
  std::sort(newest_first.rbegin(), newest_first.rend());
  cut_choice choice;
  // The job's start record (cut 0) alone: nothing was committed before the run stopped.
  // The shards' cuts are that run's uncommitted rounds; the job starts over and they are
  // dropped. Once a cut was committed, the start record is no fallback: going back to the
  // beginning would silently lose the committed progress.
  newest_first.erase(std::remove(newest_first.begin(), newest_first.end(), 0), newest_first.end());
  if (newest_first.empty())
    return choice;
  for (auto c : newest_first) {
    const shard_cuts* lacking = nullptr;
    for (const auto& s : shards)
      if (!lacking && !holds(s, c))
        lacking = &s;
    if (!lacking) {
      choice.cut = c;
      return choice;
    }
    choice.passed_over += (choice.passed_over.empty() ? "" : "; ") + std::string{"cut "} + std::to_string(c)
                          + ": shard " + std::to_string(lacking->shard_id) + " lacks it intact (holds cuts "
                          + cut_list(lacking->intact) + ")";
  }
  // Name the shard that holds the fewest of the committed cuts, and which it lacks.
  const shard_cuts* worst = nullptr;
  size_t worst_held = 0;
  for (const auto& s : shards) {
    size_t held = 0;
    for (auto c : newest_first)
      held += holds(s, c) ? 1 : 0;
    if (!worst || held < worst_held) {
      worst = &s;
      worst_held = held;
    }
  }
  std::vector<uint64_t> lacks;
  for (auto c : newest_first)
    if (!holds(*worst, c))
      lacks.push_back(c);
  return make_error(errc::corrupt_data,
                    "cannot resume from " + where + ": no checkpoint cut is intact on every shard: shard "
                      + std::to_string(worst->shard_id) + " lacks cut" + (lacks.size() > 1 ? "s " : " ")
                      + cut_list(lacks) + " of the job record's " + cut_list(newest_first)
                      + " (it holds intact cuts " + cut_list(worst->intact) + ")");
}

expected<std::optional<job_store>> job_store::open(const train_config& cfg) {
  if (cfg.checkpoint_dir.empty())
    return std::optional<job_store>{};
  // A submitted job's directory was resolved inside the work directory when it came in;
  // now the job record's directory (DIR/job) is opened beneath it, no link followed on the
  // way, and held: a link planted since (or while the store opens) cannot lead it out.
  std::shared_ptr<pinned_dir> pin;
  std::string at = cfg.checkpoint_dir + "/job";
  if (!cfg.confine_root.empty()) {
    auto held = pin_confined_dir(cfg.confine_root, at, "run.checkpoint_dir");
    if (!held)
      return held.error();
    pin = std::move(*held);
    at = pin->path();
  } else {
    std::error_code ec;
    std::filesystem::create_directories(cfg.checkpoint_dir, ec);
    if (ec)
      return make_error(errc::io_error, "cannot create the checkpoint directory " + cfg.checkpoint_dir + ": "
                                          + ec.message());
  }
  auto store = open_rocksdb_store(at, open_mode::create, cfg.checkpoint_dir + "/job");
  if (!store)
    return store.error();
  auto cuts = load_job_cuts(**store);
  if (!cuts)
    return cuts.error();
  std::optional<job_record> old;
  if (!cuts->empty())
    old = cuts->front();
  job_store js;
  js.pin_ = std::move(pin);
  js.store_ = std::move(*store);
  js.keep_ = cfg.checkpoint_keep;
  js.record_.settings = job_settings(cfg);
  if (!cfg.resume) {
    if (old)
      return make_error(errc::invalid_config, cfg.checkpoint_dir + " holds the checkpoints of a job ("
                                                + std::to_string(old->samples) + " samples trained): "
                                                "continue it with --resume, or use another directory");
    return std::optional<job_store>{std::move(js)};
  }
  if (!old) {
    spdlog::warn("job: {} holds no job record to resume from", cfg.checkpoint_dir);
    return std::optional<job_store>{std::move(js)};
  }
  if (auto diff = settings_diff(old->settings, js.record_.settings); !diff.empty())
    return make_error(errc::invalid_config, "cannot resume the job in " + cfg.checkpoint_dir
                                              + ": the configuration differs: " + diff);
  js.candidates_ = std::move(*cuts);
  // Records that did not load (damaged) may be committed cuts: then the start record is
  // no way back to the beginning (choose_cut would drop the shards' intact cuts).
  if (auto keys = js.store_->keys("cut/"); keys && keys->size() > js.candidates_.size())
    js.candidates_.erase(std::remove_if(js.candidates_.begin(), js.candidates_.end(),
                                        [](const job_record& r) { return r.cut == 0; }),
                         js.candidates_.end());
  if (auto noted = js.store_->get("progress"); noted && *noted)
    js.reached_ = std::strtoull((*noted)->c_str(), nullptr, 10);
  return std::optional<job_store>{std::move(js)};
}

void job_store::note_progress(uint64_t samples) {
  kv_batch b;
  b.puts.emplace_back("progress", std::to_string(samples_before_ + samples));
  if (auto err = store_->write(b))
    spdlog::warn("job: noting progress in {} failed: {}", store_->where(), describe(err));
}

std::vector<uint64_t> job_store::committed_cuts() const {
  std::vector<uint64_t> out;
  for (const auto& c : candidates_)
    out.push_back(c.cut);
  return out;
}

caf::error job_store::adopt(uint64_t cut) {
  auto& r = record_;
  r.cut = cut;
  if (cut != 0) {
    auto i = std::find_if(candidates_.begin(), candidates_.end(), [&](const auto& c) { return c.cut == cut; });
    if (i == candidates_.end())
      return make_error(errc::invalid_state, "the job record names no cut " + std::to_string(cut));
    r.samples = i->samples;
    r.seconds = i->seconds;
    r.resumes = i->resumes + 1;
    r.stage = i->stage;
    r.workers = i->workers;
    samples_before_ = r.samples;
    seconds_before_ = r.seconds;
    for (const auto& w : r.workers)
      worker_samples_before_[w.id] = w.samples;
  }
  if (auto err = discard_job_cuts_after(*store_, cut))
    return err;
  if (cut != 0)
    return {};
  // Starting from the beginning: the start record (cut 0, this job's settings) goes in
  // before any shard writes a cut, so that a run stopped before its first commit is
  // still known as this job's and resumes from the beginning.
  return save_job_record(*store_, r, keep_);
}

caf::error job_store::commit(uint64_t cut, uint64_t samples, double seconds,
                             const std::vector<wire::worker_stats>& workers, const std::string& stage) {
  record_.cut = cut;
  record_.samples = samples_before_ + samples;
  record_.seconds = seconds_before_ + seconds;
  auto& rw = record_.workers;
  for (const auto& w : workers) {
    if (w.steps == 0 || w.position.count == 0)
      continue;
    auto i = std::find_if(rw.begin(), rw.end(), [&](const auto& r) { return r.id == w.worker_id; });
    if (i == rw.end())
      i = rw.insert(rw.end(), job_record::worker{});
    *i = {w.worker_id, w.batch, w.position, worker_samples_before_[w.worker_id] + w.samples};
  }
  if (!stage.empty())
    record_.stage = stage;
  record_.unix_ns = 0; // stamped now
  return save_job_record(*store_, record_, keep_);
}

}  // namespace ashlar
