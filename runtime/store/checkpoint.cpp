#include "runtime/store/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include "runtime/core/clock.hpp"
#include "schema/ashlar.capnp.h"

namespace ashlar {

namespace {

// CRC-32 over a record's identity and tensors.
// A stop record's (cut 0) identity is summed without the cut, and a record without a
// running average without it (so records written before averages existed check out).
uint64_t checksum(uint32_t shard_id, uint64_t version, uint64_t cut, uint64_t begin, uint64_t end, const void* params,
                  const void* velocity, size_t tensor_bytes, size_t velocity_bytes, const void* average = nullptr,
                  size_t average_bytes = 0, uint64_t average_samples = 0) {
  unsigned char head[36];
  std::memcpy(head, &shard_id, 4);
  std::memcpy(head + 4, &version, 8);
  std::memcpy(head + 12, &begin, 8);
  std::memcpy(head + 20, &end, 8);
  std::memcpy(head + 28, &cut, 8);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, head, cut != 0 ? 36 : 28);
  crc = crc32(crc, static_cast<const Bytef*>(params), static_cast<uInt>(tensor_bytes));
  if (velocity_bytes > 0)
    crc = crc32(crc, static_cast<const Bytef*>(velocity), static_cast<uInt>(velocity_bytes));
  if (average_bytes > 0) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(&average_samples), 8);
    crc = crc32(crc, static_cast<const Bytef*>(average), static_cast<uInt>(average_bytes));
  }
  return crc;
}

std::string to_bytes(capnp::MessageBuilder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// Runs `read` on the record in `bytes`, turning Cap'n Proto's exceptions into errors.
template <class Schema, class F>
auto with_record(const char* what, const std::string& bytes, F read) -> decltype(read(typename Schema::Reader{})) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0)
    return make_error(errc::corrupt_data, std::string{what} + ": " + std::to_string(bytes.size())
                                            + " bytes, not a whole record (truncated?)");
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = words.size() + 16;
    capnp::FlatArrayMessageReader reader{words, opts};
    return read(reader.getRoot<Schema>());
  } catch (const kj::Exception& e) {
    return make_error(errc::corrupt_data, std::string{what} + " does not decode: " + e.getDescription().cStr());
  }
}

// The error for `what`, a record in format `format`, newer than `known`.
caf::error newer_format(uint32_t format, uint32_t known, const std::string& what) {
  return make_error(errc::unsupported_format,
                    what + " is in record format " + std::to_string(format) + "; this build of Ashlar reads formats up to "
                      + std::to_string(known)
                      + ": resume it with the Ashlar that wrote it, or a newer one (the record is left as it is)");
}

}  // namespace

std::string encode_checkpoint(uint32_t shard_id, uint64_t version, uint64_t cut, uint64_t begin, uint64_t end,
                              int64_t unix_ns, const float* params, const float* velocity, const float* average,
                              uint64_t average_samples) {
  const size_t bytes = (end - begin) * sizeof(float);
  const size_t tensors = 1 + (velocity ? 1 : 0) + (average ? 1 : 0);
  capnp::MallocMessageBuilder mb{static_cast<unsigned>(tensors * bytes / sizeof(capnp::word) + 64)};
  auto r = mb.initRoot<schema::CheckpointRecord>();
  r.setShardId(shard_id);
  r.setVersion(version);
  r.setCut(cut);
  r.setBegin(begin);
  r.setEnd(end);
  r.setUnixNs(unix_ns);
  r.setFormat(checkpoint_format);
  std::memcpy(r.initParams(static_cast<unsigned>(bytes)).begin(), params, bytes);
  if (velocity)
    std::memcpy(r.initVelocity(static_cast<unsigned>(bytes)).begin(), velocity, bytes);
  if (average) {
    std::memcpy(r.initAverage(static_cast<unsigned>(bytes)).begin(), average, bytes);
    r.setAverageSamples(average_samples);
  }
  r.setChecksum(checksum(shard_id, version, cut, begin, end, params, velocity, bytes, velocity ? bytes : 0, average,
                         average ? bytes : 0, average ? average_samples : 0));
  return to_bytes(mb);
}

expected<shard_checkpoint> decode_checkpoint(const std::string& bytes) {
  return with_record<schema::CheckpointRecord>("checkpoint record", bytes, [&](auto r) -> expected<shard_checkpoint> {
    shard_checkpoint c;
    c.shard_id = r.getShardId();
    c.version = r.getVersion();
    c.cut = r.getCut();
    c.begin = r.getBegin();
    c.end = r.getEnd();
    c.unix_ns = r.getUnixNs();
    if (r.getFormat() > checkpoint_format)
      return newer_format(r.getFormat(), checkpoint_format,
                          "shard " + std::to_string(c.shard_id) + "'s checkpoint record of version "
                            + std::to_string(c.version) + (c.cut != 0 ? ", cut " + std::to_string(c.cut) : ""));
    auto p = r.getParams();
    auto v = r.getVelocity();
    auto a = r.getAverage();
    // A range whose size in bytes would not fit (a corrupt record) is refused before the
    // multiplication can wrap around to a size that matches.
    if (c.end < c.begin || c.end - c.begin > p.size() / sizeof(float))
      return make_error(errc::corrupt_data, "checkpoint record of version " + std::to_string(c.version)
                                              + ": a range of [" + std::to_string(c.begin) + ", "
                                              + std::to_string(c.end) + ") for " + std::to_string(p.size())
                                              + " bytes of parameters");
    const size_t want = (c.end - c.begin) * sizeof(float);
    if (p.size() != want || (v.size() != 0 && v.size() != want) || (a.size() != 0 && a.size() != want))
      return make_error(errc::corrupt_data, "checkpoint record of version " + std::to_string(c.version)
                                              + ": parameters of " + std::to_string(p.size())
                                              + " bytes, velocity of " + std::to_string(v.size())
                                              + " and average of " + std::to_string(a.size())
                                              + " for a range of " + std::to_string(c.end - c.begin)
                                              + " floats");
    c.average_samples = a.size() > 0 ? r.getAverageSamples() : 0;
    if (checksum(c.shard_id, c.version, c.cut, c.begin, c.end, p.begin(), v.begin(), p.size(), v.size(), a.begin(),
                 a.size(), c.average_samples)
        != r.getChecksum())
      return make_error(errc::corrupt_data, "checkpoint record of version " + std::to_string(c.version)
                                              + ": checksum mismatch");
    c.params.resize(want / sizeof(float));
    if (p.size() > 0)
      std::memcpy(c.params.data(), p.begin(), p.size());
    c.velocity.resize(v.size() / sizeof(float));
    if (v.size() > 0)
      std::memcpy(c.velocity.data(), v.begin(), v.size());
    c.average.resize(a.size() / sizeof(float));
    if (a.size() > 0)
      std::memcpy(c.average.data(), a.begin(), a.size());
    return c;
  });
}

checkpoint_log::checkpoint_log(kv_store& store, uint32_t shard_id, uint32_t keep)
  : store_(&store), shard_id_(shard_id), keep_(keep < 1 ? 1 : keep) {}

std::string checkpoint_log::prefix() const { return "shard/" + std::to_string(shard_id_) + "/c/"; }

std::string checkpoint_log::key(uint64_t cut) const {
  if (cut == 0)
    return "shard/" + std::to_string(shard_id_) + "/stop";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020" PRIu64, cut);
  return prefix() + buf;
}

expected<uint64_t> checkpoint_log::save(uint64_t version, uint64_t cut, uint64_t begin, uint64_t end,
                                        const float* params, const float* velocity, const float* average,
                                        uint64_t average_samples, uint64_t kept) {
  const auto now = unix_ns();
  kv_batch b;
  b.puts.emplace_back(key(cut), encode_checkpoint(shard_id_, version, cut, begin, end, now, params, velocity,
                                                  average, average_samples));
  const uint64_t bytes = b.puts.front().second.size();
  if (cut != 0) {
    auto stored = store_->keys(prefix());
    if (!stored)
      return stored.error();
    // Keep the newest keep_ - 1 stored cuts besides the new one.
    auto& ks = *stored;
    const auto own = key(cut);
    ks.erase(std::remove(ks.begin(), ks.end(), own), ks.end());
    if (ks.size() + 1 > keep_)
      b.deletes.assign(ks.begin(), ks.end() - static_cast<std::ptrdiff_t>(keep_ - 1));
    if (kept != 0) // the job's last committed cut stays, however old
      b.deletes.erase(std::remove(b.deletes.begin(), b.deletes.end(), key(kept)), b.deletes.end());
  }
  if (auto err = store_->write(b))
    return err;
  return bytes;
}

namespace {

// The record under `k`, checked to be shard `id`'s of cut `cut`: nothing when absent.
expected<std::optional<shard_checkpoint>> read_record(const kv_store& store, const std::string& k, uint32_t id,
                                                      uint64_t cut) {
  auto value = store.get(k);
  if (!value)
    return value.error();
  if (!*value)
    return std::optional<shard_checkpoint>{};
  auto c = decode_checkpoint(**value);
  if (!c) {
    if (is(c.error(), errc::unsupported_format))
      return located(c.error(), store.where() + ", " + k);
    return c.error();
  }
  if (c->shard_id != id || c->cut != cut)
    return make_error(errc::corrupt_data, "the record under " + k + " is shard " + std::to_string(c->shard_id)
                                            + "'s of cut " + std::to_string(c->cut));
  return std::optional<shard_checkpoint>{std::move(*c)};
}

uint64_t cut_of(const std::string& k) { return std::stoull(k.substr(k.rfind('/') + 1)); }

}  // namespace

expected<std::optional<shard_checkpoint>> checkpoint_log::load_latest() const {
  auto stored = store_->keys(prefix());
  if (!stored)
    return stored.error();
  // A record that does not check out is passed over, saying so; a store that cannot be
  // read fails the load.
  auto usable = [&](const std::string& k, uint64_t cut) -> expected<std::optional<shard_checkpoint>> {
    auto c = read_record(*store_, k, shard_id_, cut);
    if (c || !is(c.error(), errc::corrupt_data))
      return c;
    spdlog::warn("checkpoint store {}: shard {}: {} is unusable ({}); trying the one before", store_->where(),
                 shard_id_, k, describe(c.error()));
    return std::optional<shard_checkpoint>{};
  };
  std::optional<shard_checkpoint> best;
  for (auto i = stored->rbegin(); i != stored->rend() && !best; ++i) {
    auto c = usable(*i, cut_of(*i));
    if (!c)
      return c.error();
    best = std::move(*c);
  }
  auto stop = usable(key(0), 0);
  if (!stop)
    return stop.error();
  if (*stop && (!best || (*stop)->version >= best->version))
    best = std::move(*stop);
  return best;
}

expected<std::vector<checkpoint_info>> checkpoint_log::list() const {
  auto stored = store_->keys(prefix());
  if (!stored)
    return stored.error();
  stored->push_back(key(0));
  std::vector<checkpoint_info> out;
  for (const auto& k : *stored) {
    auto value = store_->get(k);
    if (!value)
      return value.error();
    if (!*value)
      continue;
    checkpoint_info info;
    info.shard_id = shard_id_;
    info.cut = k == key(0) ? 0 : cut_of(k);
    info.bytes = (*value)->size();
    auto c = decode_checkpoint(**value);
    if (c && (c->shard_id != shard_id_ || c->cut != info.cut))
      c = make_error(errc::corrupt_data, "the record is shard " + std::to_string(c->shard_id) + "'s of cut "
                                           + std::to_string(c->cut));
    info.intact = static_cast<bool>(c);
    info.newer_format = !c && is(c.error(), errc::unsupported_format);
    if (c) {
      info.unix_ns = c->unix_ns;
      info.version = c->version;
    } else {
      info.problem = describe(c.error());
    }
    out.push_back(std::move(info));
  }
  return out;
}

expected<std::vector<uint64_t>> checkpoint_log::intact_cuts() const {
  auto all = list();
  if (!all)
    return all.error();
  std::vector<uint64_t> out;
  for (const auto& i : *all) {
    if (i.newer_format) // the error again, naming the store and the key
      if (auto c = load(i.cut); !c)
        return c.error();
    if (i.intact && i.cut != 0)
      out.push_back(i.cut);
  }
  return out;
}

expected<shard_checkpoint> checkpoint_log::load(uint64_t cut) const {
  auto c = read_record(*store_, key(cut), shard_id_, cut);
  if (!c)
    return c.error();
  if (!*c)
    return make_error(errc::invalid_argument, "no checkpoint of cut " + std::to_string(cut) + " of shard "
                                                + std::to_string(shard_id_) + " in " + store_->where());
  return std::move(**c);
}

caf::error checkpoint_log::discard_after(uint64_t cut) {
  auto stored = store_->keys(prefix());
  if (!stored)
    return stored.error();
  kv_batch b;
  for (const auto& k : *stored)
    if (cut_of(k) > cut)
      b.deletes.push_back(k);
  b.deletes.push_back(key(0));
  return store_->write(b);
}

async_checkpointer::async_checkpointer(kv_store& store, uint32_t shard_id, uint32_t keep)
  : log_(store, shard_id, keep), thread_([this] { run(); }) {}

async_checkpointer::~async_checkpointer() {
  {
    std::lock_guard<std::mutex> lock{mu_};
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void async_checkpointer::submit(uint64_t version, uint64_t cut, uint64_t begin, uint64_t end,
                                wire::shared_tensor params, std::vector<float> velocity,
                                std::vector<float> average, uint64_t average_samples) {
  {
    std::lock_guard<std::mutex> lock{mu_};
    if (waiting_)
      ++totals_.skipped;
    waiting_ = job{version, cut, begin, end, std::move(params), std::move(velocity), std::move(average),
                   average_samples};
  }
  cv_.notify_all();
}

void async_checkpointer::keep_cut(uint64_t cut) {
  std::lock_guard<std::mutex> lock{mu_};
  kept_ = cut;
}

void async_checkpointer::new_cut() {
  std::lock_guard<std::mutex> lock{mu_};
  totals_.error.clear();
}

uint64_t async_checkpointer::kept_cut() const {
  std::lock_guard<std::mutex> lock{mu_};
  return kept_;
}

uint64_t async_checkpointer::flush() {
  std::unique_lock<std::mutex> lock{mu_};
  cv_.wait(lock, [this] { return !waiting_ && !busy_; });
  return totals_.newest;
}

async_checkpointer::totals async_checkpointer::stats() const {
  std::lock_guard<std::mutex> lock{mu_};
  return totals_;
}

void async_checkpointer::run() {
  std::unique_lock<std::mutex> lock{mu_};
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || waiting_; });
    if (!waiting_)
      return; // stopped, nothing left
    job j = std::move(*waiting_);
    waiting_.reset();
    const uint64_t kept = kept_;
    busy_ = true;
    lock.unlock();
    const auto t0 = steady_now();
    auto bytes = log_.save(j.version, j.cut, j.begin, j.end, j.params.data(),
                           j.velocity.empty() ? nullptr : j.velocity.data(),
                           j.average.empty() ? nullptr : j.average.data(), j.average_samples, kept);
    const double took = std::chrono::duration<double>(steady_now() - t0).count();
    std::string failed;
    if (!bytes) {
      failed = "checkpoint cut " + std::to_string(j.cut) + " (version " + std::to_string(j.version)
               + ") failed: " + describe(bytes.error());
      spdlog::error("{}", failed);
    }
    lock.lock();
    busy_ = false;
    totals_.seconds += took;
    if (bytes) {
      ++totals_.written;
      totals_.bytes += *bytes;
      totals_.newest = j.version;
      if (j.cut != 0)
        totals_.newest_cut = j.cut;
      totals_.error.clear();
    } else {
      ++totals_.failures;
      totals_.error = std::move(failed);
    }
    cv_.notify_all();
  }
}

expected<std::vector<uint32_t>> stored_shards(const kv_store& store) {
  auto ks = store.keys("shard/");
  if (!ks)
    return ks.error();
  std::vector<uint32_t> out;
  for (const auto& k : *ks) {
    auto slash = k.find('/', 6);
    if (slash == std::string::npos)
      continue;
    auto id = static_cast<uint32_t>(std::strtoul(k.c_str() + 6, nullptr, 10));
    if (std::find(out.begin(), out.end(), id) == out.end())
      out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::string job_cut_key(uint64_t cut) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "cut/%020" PRIu64, cut);
  return buf;
}

expected<job_record> decode_job_record(const std::string& bytes);

}  // namespace

caf::error save_job_record(kv_store& store, const job_record& r, uint32_t keep) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::JobRecord>();
  auto s = b.initSettings(static_cast<unsigned>(r.settings.size()));
  for (size_t i = 0; i < r.settings.size(); ++i)
    s.set(static_cast<unsigned>(i), r.settings[i]);
  b.setSamples(r.samples);
  b.setSeconds(r.seconds);
  b.setUnixNs(r.unix_ns != 0 ? r.unix_ns : unix_ns());
  b.setResumes(r.resumes);
  b.setStage(r.stage);
  b.setCut(r.cut);
  b.setFormat(job_record_format);
  auto ws = b.initWorkers(static_cast<unsigned>(r.workers.size()));
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const auto& w = r.workers[i];
    auto o = ws[static_cast<unsigned>(i)];
    o.setWorkerId(w.id);
    o.setBatch(w.batch);
    o.setSamples(w.samples);
    auto p = o.initPosition();
    p.setBegin(w.position.begin);
    p.setCount(w.position.count);
    p.setSeed(w.position.seed);
    p.setEpoch(w.position.epoch);
    p.setPos(w.position.pos);
  }
  kv_batch batch;
  batch.puts.emplace_back(job_cut_key(r.cut), to_bytes(mb));
  auto stored = store.keys("cut/");
  if (!stored)
    return stored.error();
  auto& ks = *stored;
  ks.erase(std::remove(ks.begin(), ks.end(), job_cut_key(r.cut)), ks.end());
  const size_t keep_others = keep < 1 ? 0 : keep - 1;
  if (ks.size() > keep_others)
    batch.deletes.assign(ks.begin(), ks.end() - static_cast<std::ptrdiff_t>(keep_others));
  return store.write(batch);
}

namespace {

expected<job_record> decode_job_record(const std::string& bytes) {
  return with_record<schema::JobRecord>("job record", bytes, [](auto r) -> expected<job_record> {
    job_record out;
    if (r.getFormat() > job_record_format)
      return newer_format(r.getFormat(), job_record_format, "the job's record of cut " + std::to_string(r.getCut()));
    for (auto s : r.getSettings())
      out.settings.emplace_back(s.cStr());
    out.samples = r.getSamples();
    out.seconds = r.getSeconds();
    out.unix_ns = r.getUnixNs();
    out.resumes = r.getResumes();
    out.stage = r.getStage().cStr();
    out.cut = r.getCut();
    for (auto w : r.getWorkers()) {
      auto p = w.getPosition();
      out.workers.push_back(
        {w.getWorkerId(), w.getBatch(), {p.getBegin(), p.getCount(), p.getSeed(), p.getEpoch(), p.getPos()},
         w.getSamples()});
    }
    return out;
  });
}

}  // namespace

expected<std::optional<job_record>> load_job_record(const kv_store& store) {
  auto cuts = load_job_cuts(store);
  if (!cuts)
    return cuts.error();
  if (cuts->empty())
    return std::optional<job_record>{};
  return std::optional<job_record>{std::move(cuts->front())};
}

caf::error discard_job_cuts_after(kv_store& store, uint64_t cut) {
  auto stored = store.keys("cut/");
  if (!stored)
    return stored.error();
  kv_batch b;
  for (const auto& k : *stored)
    if (std::strtoull(k.c_str() + 4, nullptr, 10) > cut)
      b.deletes.push_back(k);
  return b.deletes.empty() ? caf::error{} : store.write(b);
}

expected<std::vector<job_record>> load_job_cuts(const kv_store& store) {
  auto stored = store.keys("cut/");
  if (!stored)
    return stored.error();
  std::vector<job_record> out;
  for (auto i = stored->rbegin(); i != stored->rend(); ++i) {
    auto value = store.get(*i);
    if (!value)
      return value.error();
    if (!*value)
      continue;
    auto r = decode_job_record(**value);
    if (!r && is(r.error(), errc::unsupported_format))
      return located(r.error(), "checkpoint store " + store.where() + ", " + *i);
    if (r && r->cut == std::stoull(i->substr(4)))
      out.push_back(std::move(*r));
    else
      spdlog::warn("checkpoint store {}: the job's record of {} is unusable ({})", store.where(), *i,
                   r ? "it names cut " + std::to_string(r->cut) : describe(r.error()));
  }
  return out;
}

}  // namespace ashlar
