#include "runtime/store/job_store.hpp"

#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/config/train_config.hpp"

namespace ashlar {

std::vector<std::string> job_settings(const train_config& cfg) {
  std::vector<std::string> out;
  for (const auto& k : config_keys()) {
    if (k.key.rfind("run.", 0) == 0 || k.key == "data.dir" || k.key == "train.epochs" || k.key == "train.speeds"
        || k.key == "train.sample_ms" || k.key == "train.contention")
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

expected<std::optional<job_store>> job_store::open(const train_config& cfg) {
  if (cfg.checkpoint_dir.empty())
    return std::optional<job_store>{};
  std::error_code ec;
  std::filesystem::create_directories(cfg.checkpoint_dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create the checkpoint directory " + cfg.checkpoint_dir + ": "
                                        + ec.message());
  auto store = open_rocksdb_store(cfg.checkpoint_dir + "/job", open_mode::create);
  if (!store)
    return store.error();
  auto old = load_job_record(**store);
  if (!old)
    return old.error();
  job_store js;
  js.store_ = std::move(*store);
  js.record_.settings = job_settings(cfg);
  if (!cfg.resume) {
    if (*old)
      return make_error(errc::invalid_config, cfg.checkpoint_dir + " holds the checkpoints of a job ("
                                                + std::to_string((*old)->samples) + " samples trained): "
                                                "continue it with --resume, or use another directory");
    return std::optional<job_store>{std::move(js)};
  }
  if (!*old) {
    spdlog::warn("job: nothing to resume in {}; starting from the beginning", cfg.checkpoint_dir);
    return std::optional<job_store>{std::move(js)};
  }
  if (auto diff = settings_diff((*old)->settings, js.record_.settings); !diff.empty())
    return make_error(errc::invalid_config, "cannot resume the job in " + cfg.checkpoint_dir
                                              + ": the configuration differs: " + diff);
  auto& r = js.record_;
  r.samples = (*old)->samples;
  r.seconds = (*old)->seconds;
  r.resumes = (*old)->resumes + 1;
  r.stage = (*old)->stage;
  r.workers = (*old)->workers;
  js.samples_before_ = r.samples;
  js.seconds_before_ = r.seconds;
  for (const auto& w : r.workers)
    js.worker_samples_before_[w.id] = w.samples;
  return std::optional<job_store>{std::move(js)};
}

caf::error job_store::save(uint64_t samples, double seconds, const std::vector<wire::worker_stats>& workers,
                           const std::string& stage) {
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
  return save_job_record(*store_, record_);
}

}  // namespace ashlar
