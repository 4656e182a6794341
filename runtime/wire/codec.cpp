#include "runtime/wire/codec.hpp"

#include <cstring>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "schema/ashlar.capnp.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensors travel as little-endian float bytes; big-endian hosts need a byte swap");

namespace ashlar::wire {

namespace {

words to_words(capnp::MessageBuilder& mb) {
  auto flat = capnp::messageToFlatArray(mb);
  words out(flat.size());
  std::memcpy(out.data(), flat.begin(), flat.size() * sizeof(capnp::word));
  return out;
}

capnp::Data::Reader floats_as_data(const std::vector<float>& v) {
  return {reinterpret_cast<const kj::byte*>(v.data()), v.size() * sizeof(float)};
}

caf::error malformed(const char* type, const std::string& what) {
  return make_error(errc::malformed_message, std::string{type} + ": " + what);
}

caf::error data_to_floats(const char* type, const char* field, capnp::Data::Reader d,
                          std::vector<float>& out) {
  if (d.size() % sizeof(float) != 0)
    return malformed(type, std::string{field} + " holds " + std::to_string(d.size())
                             + " bytes, not a whole number of float32 values");
  out.resize(d.size() / sizeof(float));
  if (!out.empty())
    std::memcpy(out.data(), d.begin(), d.size());
  return caf::none;
}

// Runs `read` over a validated reader; Cap'n Proto reports malformed input by
// throwing kj::Exception, which must not escape into an actor.
template <class Schema, class F>
caf::error with_reader(const char* type, const uint64_t* data, size_t n, F read) {
  if (n * sizeof(uint64_t) > max_message_bytes)
    return malformed(type, "message of " + std::to_string(n * 8) + " bytes exceeds the limit");
  if (n == 0)
    return malformed(type, "empty message");
  try {
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = n + 16;
    opts.nestingLimit = 16;
    kj::ArrayPtr<const capnp::word> view{reinterpret_cast<const capnp::word*>(data), n};
    capnp::FlatArrayMessageReader reader{view, opts};
    return read(reader.getRoot<Schema>());
  } catch (const kj::Exception& e) {
    return malformed(type, e.getDescription().cStr());
  } catch (const std::exception& e) {
    return malformed(type, e.what());
  }
}

}  // namespace

// ---- register_worker ----
words encode(const register_worker& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::RegisterWorker>();
  b.setRequestedId(x.requested_id);
  b.setHost(x.host);
  b.setBackend(x.backend);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, register_worker& out) {
  return with_reader<schema::RegisterWorker>("RegisterWorker", d, n, [&](auto r) {
    out.requested_id = r.getRequestedId();
    out.host = r.getHost();
    out.backend = r.getBackend();
    return caf::error{};
  });
}

// ---- assignment ----
words encode(const assignment& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::Assignment>();
  b.setWorkerId(x.worker_id);
  auto shards = b.initShards(static_cast<unsigned>(x.shards.size()));
  for (size_t i = 0; i < x.shards.size(); ++i) {
    shards[i].setShardId(x.shards[i].shard_id);
    shards[i].setBegin(x.shards[i].begin);
    shards[i].setEnd(x.shards[i].end);
  }
  auto widths = b.initLayerWidths(static_cast<unsigned>(x.layer_widths.size()));
  for (size_t i = 0; i < x.layer_widths.size(); ++i)
    widths.set(i, x.layer_widths[i]);
  b.setBatchSize(x.batch_size);
  b.setDataBegin(x.data_begin);
  b.setDataCount(x.data_count);
  b.setSteps(x.steps);
  b.setSeed(x.seed);
  b.setPolicy(x.policy);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, assignment& out) {
  return with_reader<schema::Assignment>("Assignment", d, n, [&](auto r) -> caf::error {
    out.worker_id = r.getWorkerId();
    out.shards.clear();
    uint64_t expect_begin = 0;
    for (auto s : r.getShards()) {
      if (s.getEnd() <= s.getBegin() || s.getBegin() != expect_begin)
        return malformed("Assignment", "shard ranges are empty, overlapping or not contiguous");
      expect_begin = s.getEnd();
      out.shards.push_back(shard_range{s.getShardId(), s.getBegin(), s.getEnd()});
    }
    out.layer_widths.clear();
    for (auto w : r.getLayerWidths())
      out.layer_widths.push_back(w);
    if (out.layer_widths.size() < 2)
      return malformed("Assignment", "a model needs at least two layer widths");
    out.batch_size = r.getBatchSize();
    out.data_begin = r.getDataBegin();
    out.data_count = r.getDataCount();
    out.steps = r.getSteps();
    out.seed = r.getSeed();
    out.policy = r.getPolicy();
    return caf::none;
  });
}

// ---- membership_change ----
words encode(const membership_change& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::MembershipChange>();
  b.setKind(static_cast<schema::MembershipChange::Kind>(x.kind));
  b.setWorkerId(x.worker_id);
  b.setReason(x.reason);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, membership_change& out) {
  return with_reader<schema::MembershipChange>("MembershipChange", d, n, [&](auto r) -> caf::error {
    auto k = static_cast<uint16_t>(r.getKind());
    if (k > 2)
      return malformed("MembershipChange", "unknown kind " + std::to_string(k));
    out.kind = static_cast<membership_change::kind_t>(k);
    out.worker_id = r.getWorkerId();
    out.reason = r.getReason();
    return caf::none;
  });
}

// ---- pull_request ----
words encode(const pull_request& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::PullRequest>();
  b.setWorkerId(x.worker_id);
  b.setShardId(x.shard_id);
  b.setSnapshot(x.snapshot);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, pull_request& out) {
  return with_reader<schema::PullRequest>("PullRequest", d, n, [&](auto r) {
    out.worker_id = r.getWorkerId();
    out.shard_id = r.getShardId();
    out.snapshot = r.getSnapshot();
    return caf::error{};
  });
}

// ---- pull_reply ----
words encode(const pull_reply& x) {
  capnp::MallocMessageBuilder mb{static_cast<unsigned>(x.params.size() / 2 + 64)};
  auto b = mb.initRoot<schema::PullReply>();
  b.setShardId(x.shard_id);
  b.setVersion(x.version);
  b.setBegin(x.begin);
  b.setParams(floats_as_data(x.params));
  b.setWaitNs(x.wait_ns);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, pull_reply& out) {
  return with_reader<schema::PullReply>("PullReply", d, n, [&](auto r) {
    out.shard_id = r.getShardId();
    out.version = r.getVersion();
    out.begin = r.getBegin();
    out.wait_ns = r.getWaitNs();
    return data_to_floats("PullReply", "params", r.getParams(), out.params);
  });
}

// ---- push ----
words encode(const push& x) {
  capnp::MallocMessageBuilder mb{static_cast<unsigned>(x.grad.size() / 2 + 64)};
  auto b = mb.initRoot<schema::Push>();
  b.setWorkerId(x.worker_id);
  b.setShardId(x.shard_id);
  b.setBaseVersion(x.base_version);
  b.setBatchSize(x.batch_size);
  b.setGrad(floats_as_data(x.grad));
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, push& out) {
  return with_reader<schema::Push>("Push", d, n, [&](auto r) {
    out.worker_id = r.getWorkerId();
    out.shard_id = r.getShardId();
    out.base_version = r.getBaseVersion();
    out.batch_size = r.getBatchSize();
    return data_to_floats("Push", "grad", r.getGrad(), out.grad);
  });
}

// ---- push_ack ----
words encode(const push_ack& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::PushAck>();
  b.setShardId(x.shard_id);
  b.setVersion(x.version);
  b.setOutcome(static_cast<schema::PushAck::Outcome>(x.outcome));
  b.setStaleness(x.staleness);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, push_ack& out) {
  return with_reader<schema::PushAck>("PushAck", d, n, [&](auto r) -> caf::error {
    auto o = static_cast<uint16_t>(r.getOutcome());
    if (o > 2)
      return malformed("PushAck", "unknown outcome " + std::to_string(o));
    out.shard_id = r.getShardId();
    out.version = r.getVersion();
    out.outcome = static_cast<push_ack::outcome_t>(o);
    out.staleness = r.getStaleness();
    return caf::none;
  });
}

// ---- shard_status ----
words encode(const shard_status& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::ShardStatus>();
  b.setShardId(x.shard_id);
  b.setVersion(x.version);
  b.setBegin(x.begin);
  b.setEnd(x.end);
  b.setPushes(x.pushes);
  b.setApplied(x.applied);
  b.setDropped(x.dropped);
  b.setStalenessSum(x.staleness_sum);
  b.setStalenessMax(x.staleness_max);
  auto live = b.initLiveWorkers(static_cast<unsigned>(x.live_workers.size()));
  for (size_t i = 0; i < x.live_workers.size(); ++i)
    live.set(i, x.live_workers[i]);
  b.setPendingReads(x.pending_reads);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, shard_status& out) {
  return with_reader<schema::ShardStatus>("ShardStatus", d, n, [&](auto r) -> caf::error {
    out.shard_id = r.getShardId();
    out.version = r.getVersion();
    out.begin = r.getBegin();
    out.end = r.getEnd();
    if (out.end < out.begin)
      return malformed("ShardStatus", "range end precedes begin");
    out.pushes = r.getPushes();
    out.applied = r.getApplied();
    out.dropped = r.getDropped();
    out.staleness_sum = r.getStalenessSum();
    out.staleness_max = r.getStalenessMax();
    out.live_workers.clear();
    for (auto w : r.getLiveWorkers())
      out.live_workers.push_back(w);
    out.pending_reads = r.getPendingReads();
    return caf::none;
  });
}

// ---- profile_report ----
words encode(const profile_report& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::ProfileReport>();
  b.setWorkerId(x.worker_id);
  b.setStep(x.step);
  b.setSamples(x.samples);
  b.setLoss(x.loss);
  b.setComputeNs(x.compute_ns);
  b.setPullNs(x.pull_ns);
  b.setPushNs(x.push_ns);
  b.setWaitNs(x.wait_ns);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, profile_report& out) {
  return with_reader<schema::ProfileReport>("ProfileReport", d, n, [&](auto r) {
    out.worker_id = r.getWorkerId();
    out.step = r.getStep();
    out.samples = r.getSamples();
    out.loss = r.getLoss();
    out.compute_ns = r.getComputeNs();
    out.pull_ns = r.getPullNs();
    out.push_ns = r.getPushNs();
    out.wait_ns = r.getWaitNs();
    return caf::error{};
  });
}

// ---- cluster_stats ----
words encode(const cluster_stats& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::ClusterStats>();
  auto ws = b.initWorkers(static_cast<unsigned>(x.workers.size()));
  for (size_t i = 0; i < x.workers.size(); ++i) {
    const auto& w = x.workers[i];
    auto o = ws[i];
    o.setWorkerId(w.worker_id);
    o.setSteps(w.steps);
    o.setSamples(w.samples);
    o.setSamplesPerSecond(w.samples_per_second);
    o.setStepSeconds(w.step_seconds);
    o.setComputeSeconds(w.compute_seconds);
    o.setWaitSeconds(w.wait_seconds);
    o.setLoss(w.loss);
    o.setDone(w.done);
    o.setTotalComputeSeconds(w.total_compute_seconds);
    o.setTotalWaitSeconds(w.total_wait_seconds);
  }
  b.setTotalSamples(x.total_samples);
  b.setElapsedSeconds(x.elapsed_seconds);
  b.setLoss(x.loss);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, cluster_stats& out) {
  return with_reader<schema::ClusterStats>("ClusterStats", d, n, [&](auto r) {
    out.workers.clear();
    for (auto w : r.getWorkers()) {
      worker_stats s;
      s.worker_id = w.getWorkerId();
      s.steps = w.getSteps();
      s.samples = w.getSamples();
      s.samples_per_second = w.getSamplesPerSecond();
      s.step_seconds = w.getStepSeconds();
      s.compute_seconds = w.getComputeSeconds();
      s.wait_seconds = w.getWaitSeconds();
      s.loss = w.getLoss();
      s.done = w.getDone();
      s.total_compute_seconds = w.getTotalComputeSeconds();
      s.total_wait_seconds = w.getTotalWaitSeconds();
      out.workers.push_back(s);
    }
    out.total_samples = r.getTotalSamples();
    out.elapsed_seconds = r.getElapsedSeconds();
    out.loss = r.getLoss();
    return caf::error{};
  });
}

}  // namespace ashlar::wire
