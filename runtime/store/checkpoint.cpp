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
uint64_t checksum(uint32_t shard_id, uint64_t version, uint64_t begin, uint64_t end, const void* params,
                  const void* velocity, size_t tensor_bytes, size_t velocity_bytes) {
  unsigned char head[28];
  std::memcpy(head, &shard_id, 4);
  std::memcpy(head + 4, &version, 8);
  std::memcpy(head + 12, &begin, 8);
  std::memcpy(head + 20, &end, 8);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, head, sizeof(head));
  crc = crc32(crc, static_cast<const Bytef*>(params), static_cast<uInt>(tensor_bytes));
  if (velocity_bytes > 0)
    crc = crc32(crc, static_cast<const Bytef*>(velocity), static_cast<uInt>(velocity_bytes));
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

constexpr const char* job_key = "job";

}  // namespace

std::string encode_checkpoint(uint32_t shard_id, uint64_t version, uint64_t begin, uint64_t end, int64_t unix_ns,
                              const float* params, const float* velocity) {
  const size_t bytes = (end - begin) * sizeof(float);
  capnp::MallocMessageBuilder mb{static_cast<unsigned>(2 * bytes / sizeof(capnp::word) + 64)};
  auto r = mb.initRoot<schema::CheckpointRecord>();
  r.setShardId(shard_id);
  r.setVersion(version);
  r.setBegin(begin);
  r.setEnd(end);
  r.setUnixNs(unix_ns);
  std::memcpy(r.initParams(static_cast<unsigned>(bytes)).begin(), params, bytes);
  if (velocity)
    std::memcpy(r.initVelocity(static_cast<unsigned>(bytes)).begin(), velocity, bytes);
  r.setChecksum(checksum(shard_id, version, begin, end, params, velocity, bytes, velocity ? bytes : 0));
  return to_bytes(mb);
}

expected<shard_checkpoint> decode_checkpoint(const std::string& bytes) {
  return with_record<schema::CheckpointRecord>("checkpoint record", bytes, [&](auto r) -> expected<shard_checkpoint> {
    shard_checkpoint c;
    c.shard_id = r.getShardId();
    c.version = r.getVersion();
    c.begin = r.getBegin();
    c.end = r.getEnd();
    c.unix_ns = r.getUnixNs();
    auto p = r.getParams();
    auto v = r.getVelocity();
    // A range whose size in bytes would not fit (a corrupt record) is refused before the
    // multiplication can wrap around to a size that matches.
    if (c.end < c.begin || c.end - c.begin > p.size() / sizeof(float))
      return make_error(errc::corrupt_data, "checkpoint record of version " + std::to_string(c.version)
                                              + ": a range of [" + std::to_string(c.begin) + ", "
                                              + std::to_string(c.end) + ") for " + std::to_string(p.size())
                                              + " bytes of parameters");
    const size_t want = (c.end - c.begin) * sizeof(float);
    if (p.size() != want || (v.size() != 0 && v.size() != want))
      return make_error(errc::corrupt_data, "checkpoint record of version " + std::to_string(c.version)
                                              + ": tensors of " + std::to_string(p.size()) + " and "
                                              + std::to_string(v.size()) + " bytes for a range of "
                                              + std::to_string(c.end - c.begin) + " floats");
    if (checksum(c.shard_id, c.version, c.begin, c.end, p.begin(), v.begin(), p.size(), v.size()) != r.getChecksum())
      return make_error(errc::corrupt_data, "checkpoint record of version " + std::to_string(c.version)
                                              + ": checksum mismatch");
    c.params.resize(want / sizeof(float));
    if (p.size() > 0)
      std::memcpy(c.params.data(), p.begin(), p.size());
    c.velocity.resize(v.size() / sizeof(float));
    if (v.size() > 0)
      std::memcpy(c.velocity.data(), v.begin(), v.size());
    return c;
  });
}

checkpoint_log::checkpoint_log(kv_store& store, uint32_t shard_id, uint32_t keep)
  : store_(&store), shard_id_(shard_id), keep_(keep < 1 ? 1 : keep) {}

std::string checkpoint_log::key(uint64_t version) const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard/%u/v/%020" PRIu64, shard_id_, version);
  return buf;
}

expected<uint64_t> checkpoint_log::save(uint64_t version, uint64_t begin, uint64_t end, const float* params,
                                        const float* velocity) {
  const auto now = unix_ns();
  kv_batch b;
  b.puts.emplace_back(key(version), encode_checkpoint(shard_id_, version, begin, end, now, params, velocity));
  b.puts.emplace_back("shard/" + std::to_string(shard_id_) + "/latest", std::to_string(version));
  const uint64_t bytes = b.puts.front().second.size();
  auto stored = store_->keys("shard/" + std::to_string(shard_id_) + "/v/");
  if (!stored)
    return stored.error();
  // Keep the newest keep_ - 1 stored ones besides the new one.
  auto& ks = *stored;
  const auto own = key(version);
  ks.erase(std::remove(ks.begin(), ks.end(), own), ks.end());
  if (ks.size() + 1 > keep_)
    b.deletes.assign(ks.begin(), ks.end() - static_cast<std::ptrdiff_t>(keep_ - 1));
  if (auto err = store_->write(b))
    return err;
  return bytes;
}

expected<std::optional<shard_checkpoint>> checkpoint_log::load_latest() const {
  auto stored = store_->keys("shard/" + std::to_string(shard_id_) + "/v/");
  if (!stored)
    return stored.error();
  // From the LATEST pointer down: the pointer and its record were written in one batch,
  // so the pointer never names a record that is not there; an intact record below it is
  // the fallback when that one does not check out.
  auto latest = store_->get("shard/" + std::to_string(shard_id_) + "/latest");
  if (!latest)
    return latest.error();
  if (!*latest)
    return std::optional<shard_checkpoint>{};
  const std::string newest = key(std::strtoull((*latest)->c_str(), nullptr, 10));
  for (auto i = stored->rbegin(); i != stored->rend(); ++i) {
    if (*i > newest)
      continue;
    auto value = store_->get(*i);
    if (!value)
      return value.error();
    if (!*value)
      continue;
    auto c = decode_checkpoint(**value);
    if (c && c->shard_id == shard_id_)
      return std::optional<shard_checkpoint>{std::move(*c)};
    spdlog::warn("checkpoint store {}: shard {}: {} is unusable ({}); trying the one before", store_->where(),
                 shard_id_, *i, c ? "another shard's record" : describe(c.error()));
  }
  return std::optional<shard_checkpoint>{};
}

expected<std::vector<checkpoint_info>> checkpoint_log::list() const {
  auto stored = store_->keys("shard/" + std::to_string(shard_id_) + "/v/");
  if (!stored)
    return stored.error();
  std::vector<checkpoint_info> out;
  for (const auto& k : *stored) {
    auto value = store_->get(k);
    if (!value)
      return value.error();
    if (!*value)
      continue;
    checkpoint_info info;
    info.shard_id = shard_id_;
    info.version = std::stoull(k.substr(k.rfind('/') + 1));
    info.bytes = (*value)->size();
    auto c = decode_checkpoint(**value);
    info.intact = static_cast<bool>(c);
    if (c)
      info.unix_ns = c->unix_ns;
    else
      info.problem = describe(c.error());
    out.push_back(std::move(info));
  }
  return out;
}

expected<shard_checkpoint> checkpoint_log::load(uint64_t version) const {
  auto value = store_->get(key(version));
  if (!value)
    return value.error();
  if (!*value)
    return make_error(errc::invalid_argument, "no checkpoint of version " + std::to_string(version) + " of shard "
                                                + std::to_string(shard_id_) + " in " + store_->where());
  return decode_checkpoint(**value);
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

void async_checkpointer::submit(uint64_t version, uint64_t begin, uint64_t end,
                                std::shared_ptr<const std::vector<float>> params, std::vector<float> velocity) {
  {
    std::lock_guard<std::mutex> lock{mu_};
    if (waiting_)
      ++totals_.skipped;
    waiting_ = job{version, begin, end, std::move(params), std::move(velocity)};
  }
  cv_.notify_all();
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
    busy_ = true;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    auto bytes = log_.save(j.version, j.begin, j.end, j.params->data(), j.velocity.empty() ? nullptr : j.velocity.data());
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!bytes)
      spdlog::error("checkpoint of version {} failed: {}", j.version, describe(bytes.error()));
    lock.lock();
    busy_ = false;
    totals_.seconds += took;
    if (bytes) {
      ++totals_.written;
      totals_.bytes += *bytes;
      totals_.newest = j.version;
    } else {
      ++totals_.failures;
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
    auto id = static_cast<uint32_t>(std::stoul(k.substr(6, slash - 6)));
    if (out.empty() || out.back() != id)
      out.push_back(id);
  }
  return out;
}

caf::error save_job_record(kv_store& store, const job_record& r) {
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
  batch.puts.emplace_back(job_key, to_bytes(mb));
  return store.write(batch);
}

expected<std::optional<job_record>> load_job_record(const kv_store& store) {
  auto value = store.get(job_key);
  if (!value)
    return value.error();
  if (!*value)
    return std::optional<job_record>{};
  return with_record<schema::JobRecord>("job record", **value, [](auto r) -> expected<std::optional<job_record>> {
    job_record out;
    for (auto s : r.getSettings())
      out.settings.emplace_back(s.cStr());
    out.samples = r.getSamples();
    out.seconds = r.getSeconds();
    out.unix_ns = r.getUnixNs();
    out.resumes = r.getResumes();
    out.stage = r.getStage().cStr();
    for (auto w : r.getWorkers()) {
      auto p = w.getPosition();
      out.workers.push_back(
        {w.getWorkerId(), w.getBatch(), {p.getBegin(), p.getCount(), p.getSeed(), p.getEpoch(), p.getPos()},
         w.getSamples()});
    }
    return std::optional<job_record>{std::move(out)};
  });
}

}  // namespace ashlar
