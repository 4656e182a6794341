#include "runtime/wire/codec.hpp"

#include <cstring>
#include <string>

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/serialize.h>
#include <kj/io.h>

#include "schema/ashlar.capnp.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensors travel as little-endian float bytes; big-endian hosts need a byte swap");

namespace ashlar::wire {

namespace {

// Writes the message straight into the word vector: one copy of each segment.
words to_words(capnp::MessageBuilder& mb) {
  words out(capnp::computeSerializedSizeInWords(mb));
  kj::ArrayOutputStream stream{kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()),
                                            out.size() * sizeof(uint64_t))};
  capnp::writeMessage(stream, mb);
  return out;
}

template <class Vector>
capnp::Data::Reader floats_as_data(const Vector& v) {
  return {reinterpret_cast<const kj::byte*>(v.data()), v.size() * sizeof(float)};
}

// Sets a Data field from floats. Cap'n Proto may reference external data without a copy
// only if it is whole 8-byte words at an 8-byte-aligned address (it copies whole words
// later, so an odd float count would be read 4 bytes past the vector's end); otherwise
// the floats are copied in.
template <class Vector, class Adopt, class Set>
void set_floats(capnp::MessageBuilder& mb, const Vector& v, Adopt adopt, Set set) {
  auto data = floats_as_data(v);
  bool whole_words = data.size() % sizeof(capnp::word) == 0
                     && reinterpret_cast<uintptr_t>(data.begin()) % alignof(capnp::word) == 0;
  if (whole_words)
    adopt(mb.getOrphanage().referenceExternalData(data));
  else
    set(data);
}

caf::error malformed(const char* type, const std::string& what) {
  return make_error(errc::malformed_message, std::string{type} + ": " + what);
}

// The update rule and Adam's settings of a SpawnShard or Assignment (an empty name: sgd,
// as messages from before the field read).
template <class Reader, class Out>
caf::error decode_rule(const char* type, Reader r, Out& out) {
  const std::string name = r.getOptimizer();
  if (!name.empty() && !parse_update_rule(name, out.rule))
    return malformed(type, "update rule '" + name + "' is not known (known: sgd, adam, adamw)");
  if (out.rule == update_rule::sgd)
    return caf::none;
  out.beta1 = r.getBeta1();
  out.beta2 = r.getBeta2();
  out.eps = r.getEps();
  if (!(out.beta1 >= 0.0f && out.beta1 < 1.0f && out.beta2 >= 0.0f && out.beta2 < 1.0f && out.eps > 0.0f))
    return malformed(type, "Adam's beta1 " + std::to_string(out.beta1) + ", beta2 " + std::to_string(out.beta2)
                             + " or eps " + std::to_string(out.eps) + " is out of range ([0, 1), [0, 1), > 0)");
  return caf::none;
}

// Sizes `out` to `n` floats and returns them for writing.
template <class Vector>
float* sized_floats(Vector& out, size_t n) {
  out.resize(n);
  return out.data();
}

float* sized_floats(shared_tensor& out, size_t n) {
  return out.reset(n);
}

template <class Vector>
caf::error data_to_floats(const char* type, const char* field, capnp::Data::Reader d, Vector& out) {
  if (d.size() % sizeof(float) != 0)
    return malformed(type, std::string{field} + " holds " + std::to_string(d.size())
                             + " bytes, not a whole number of float32 values");
  float* dst = sized_floats(out, d.size() / sizeof(float));
  if (d.size() > 0)
    std::memcpy(dst, d.begin(), d.size());
  return caf::none;
}

// Sparse positions: uint32 LE values.
caf::error data_to_index(const char* type, capnp::Data::Reader d, std::vector<uint32_t>& out) {
  if (d.size() % sizeof(uint32_t) != 0)
    return malformed(type, "index holds " + std::to_string(d.size()) + " bytes, not a whole number of uint32 values");
  out.resize(d.size() / sizeof(uint32_t));
  if (d.size() > 0)
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
  b.setRingEndpoint(x.ring_endpoint);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, register_worker& out) {
  return with_reader<schema::RegisterWorker>("RegisterWorker", d, n, [&](auto r) {
    out.requested_id = r.getRequestedId();
    out.host = r.getHost();
    out.backend = r.getBackend();
    out.ring_endpoint = r.getRingEndpoint();
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
  auto input = b.initModelInput(3);
  input.set(0, x.model.input.c);
  input.set(1, x.model.input.h);
  input.set(2, x.model.input.w);
  b.setModelClasses(x.model.classes);
  auto hidden = b.initModelHidden(static_cast<unsigned>(x.model.hidden.size()));
  for (size_t i = 0; i < x.model.hidden.size(); ++i)
    hidden.set(static_cast<unsigned>(i), x.model.hidden[i]);
  b.setModelLayers(layers_text(x.model.layers));
  b.setBatchSize(x.batch_size);
  b.setDataBegin(x.data_begin);
  b.setDataCount(x.data_count);
  b.setSteps(x.steps);
  b.setSeed(x.seed);
  b.setPolicy(x.policy);
  b.setChunkFloats(x.chunk_floats);
  b.setChunksInFlight(x.chunks_in_flight);
  b.setPaceNsPerSample(x.pace_ns_per_sample);
  auto slow = b.initContention(static_cast<unsigned>(x.contention.size()));
  for (size_t i = 0; i < x.contention.size(); ++i) {
    slow[i].setStartS(x.contention[i].start_s);
    slow[i].setEndS(x.contention[i].end_s);
    slow[i].setFactor(x.contention[i].factor);
  }
  auto eps = b.initDataEndpoints(static_cast<unsigned>(x.data_endpoints.size()));
  for (size_t i = 0; i < x.data_endpoints.size(); ++i)
    eps.set(i, x.data_endpoints[i]);
  b.setDataKey(x.data_key);
  b.setLocalSteps(x.local_steps);
  b.setLocalLr(x.local_lr);
  b.setCommitScale(x.commit_scale);
  b.setTopkRatio(x.topk_ratio);
  b.setPullTopkRatio(x.pull_topk_ratio);
  b.setOverlapCommits(x.overlap_commits);
  b.setShardWaitS(x.shard_wait_s);
  b.setCursorEpoch(x.cursor_epoch);
  b.setCursorPos(x.cursor_pos);
  b.setMomentum(x.momentum);
  b.setWeightDecay(x.weight_decay);
  b.setLocalMomentum(x.local_momentum);
  b.setOptimizer(to_string(x.rule));
  b.setBeta1(x.beta1);
  b.setBeta2(x.beta2);
  b.setEps(x.eps);
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
    auto input = r.getModelInput();
    if (input.size() != 3)
      return malformed("Assignment", "the model's input shape has " + std::to_string(input.size())
                                       + " dimensions, not 3");
    out.model.input = tensor_shape{input[0], input[1], input[2]};
    out.model.classes = r.getModelClasses();
    out.model.hidden.clear();
    for (auto w : r.getModelHidden())
      out.model.hidden.push_back(w);
    // Read once: every read counts against the traversal limit (the message's size), and
    // the layer list can be most of the message.
    const auto text = r.getModelLayers();
    auto layers = parse_layers(std::string{text.cStr(), text.size()});
    if (!layers)
      return malformed("Assignment", "its model: " + describe(layers.error()));
    out.model.layers = std::move(*layers);
    if (auto err = validate(out.model))
      return malformed("Assignment", "its model: " + describe(err));
    out.batch_size = r.getBatchSize();
    out.data_begin = r.getDataBegin();
    out.data_count = r.getDataCount();
    out.steps = r.getSteps();
    out.seed = r.getSeed();
    out.policy = r.getPolicy();
    out.chunk_floats = r.getChunkFloats();
    out.chunks_in_flight = r.getChunksInFlight();
    out.pace_ns_per_sample = r.getPaceNsPerSample();
    out.contention.clear();
    for (auto c : r.getContention())
      out.contention.push_back(contention_interval{false, out.worker_id, c.getStartS(), c.getEndS(),
                                                   c.getFactor()});
    out.data_endpoints.clear();
    for (auto e : r.getDataEndpoints())
      out.data_endpoints.emplace_back(e.cStr(), e.size());
    if (!out.data_endpoints.empty() && out.data_endpoints.size() != out.shards.size())
      return malformed("Assignment", std::to_string(out.data_endpoints.size()) + " data endpoints for "
                                       + std::to_string(out.shards.size()) + " shards");
    out.data_key = r.getDataKey();
    out.local_steps = r.getLocalSteps();
    out.local_lr = r.getLocalLr();
    out.commit_scale = r.getCommitScale();
    out.topk_ratio = r.getTopkRatio();
    out.pull_topk_ratio = r.getPullTopkRatio();
    out.overlap_commits = r.getOverlapCommits();
    out.shard_wait_s = r.getShardWaitS();
    out.cursor_epoch = r.getCursorEpoch();
    out.cursor_pos = r.getCursorPos();
    out.momentum = r.getMomentum();
    out.weight_decay = r.getWeightDecay();
    out.local_momentum = r.getLocalMomentum();
    if (auto err = decode_rule("Assignment", r, out))
      return err;
    if (!(out.local_momentum >= 0.0f && out.local_momentum < 1.0f))
      return malformed("Assignment", "local momentum " + std::to_string(out.local_momentum) + " is not in [0, 1)");
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
  b.setEarly(x.early);
  b.setSteps(x.steps);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, membership_change& out) {
  return with_reader<schema::MembershipChange>("MembershipChange", d, n, [&](auto r) -> caf::error {
    auto k = static_cast<uint16_t>(r.getKind());
    if (k > 3)
      return malformed("MembershipChange", "unknown kind " + std::to_string(k));
    out.kind = static_cast<membership_change::kind_t>(k);
    out.worker_id = r.getWorkerId();
    out.reason = r.getReason();
    out.early = r.getEarly();
    out.steps = r.getSteps();
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
  b.setOffset(x.offset);
  b.setMaxFloats(x.max_floats);
  b.setReadId(x.read_id);
  b.setTopkRatio(x.topk_ratio);
  b.setViewSeq(x.view_seq);
  b.setAverage(x.average);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, pull_request& out) {
  return with_reader<schema::PullRequest>("PullRequest", d, n, [&](auto r) {
    out.worker_id = r.getWorkerId();
    out.shard_id = r.getShardId();
    out.snapshot = r.getSnapshot();
    out.offset = r.getOffset();
    out.max_floats = r.getMaxFloats();
    out.read_id = r.getReadId();
    out.topk_ratio = r.getTopkRatio();
    out.view_seq = r.getViewSeq();
    out.average = r.getAverage();
    return caf::error{};
  });
}

// ---- pull_reply ----
words encode(const pull_reply& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::PullReply>();
  b.setShardId(x.shard_id);
  b.setVersion(x.version);
  b.setBegin(x.begin);
  // The tensor is referenced, not copied, until the message is written out.
  set_floats(mb, x.params, [&](auto o) { b.adoptParams(std::move(o)); },
                   [&](capnp::Data::Reader d) { b.setParams(d); });
  b.setWaitNs(x.wait_ns);
  b.setOffset(x.offset);
  b.setTotal(x.total);
  b.setReadId(x.read_id);
  b.setViewSeq(x.view_seq);
  if (x.sparse) {
    b.setSparse(true);
    set_floats(mb, x.index, [&](auto o) { b.adoptIndex(std::move(o)); },
               [&](capnp::Data::Reader d) { b.setIndex(d); });
  }
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, pull_reply& out) {
  return with_reader<schema::PullReply>("PullReply", d, n, [&](auto r) {
    out.shard_id = r.getShardId();
    out.version = r.getVersion();
    out.begin = r.getBegin();
    out.wait_ns = r.getWaitNs();
    out.offset = r.getOffset();
    out.total = r.getTotal();
    out.read_id = r.getReadId();
    out.view_seq = r.getViewSeq();
    out.sparse = r.getSparse();
    if (auto err = data_to_floats("PullReply", "params", r.getParams(), out.params))
      return err;
    if (auto err = data_to_index("PullReply", r.getIndex(), out.index))
      return err;
    if (out.sparse && (out.index.size() != out.params.size() || out.offset != 0))
      return malformed("PullReply", "a delta read with " + std::to_string(out.index.size()) + " indices and "
                                      + std::to_string(out.params.size()) + " values at offset "
                                      + std::to_string(out.offset) + " (must match, at offset 0)");
    if (!out.sparse && out.offset + out.params.size() > out.total)
      return malformed("PullReply", "chunk [" + std::to_string(out.offset) + ", +"
                                      + std::to_string(out.params.size()) + ") exceeds the range of "
                                      + std::to_string(out.total));
    return caf::error{};
  });
}

// ---- push ----
words encode(const push& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::Push>();
  b.setWorkerId(x.worker_id);
  b.setShardId(x.shard_id);
  b.setBaseVersion(x.base_version);
  b.setBatchSize(x.batch_size);
  b.setOffset(x.offset);
  b.setTotal(x.total);
  b.setReadFollows(x.read_follows);
  set_floats(mb, x.grad, [&](auto o) { b.adoptGrad(std::move(o)); },
                   [&](capnp::Data::Reader d) { b.setGrad(d); });
  if (x.sparse) {
    b.setSparse(true);
    set_floats(mb, x.index, [&](auto o) { b.adoptIndex(std::move(o)); },
               [&](capnp::Data::Reader d) { b.setIndex(d); });
  }
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, push& out) {
  return with_reader<schema::Push>("Push", d, n, [&](auto r) {
    out.worker_id = r.getWorkerId();
    out.shard_id = r.getShardId();
    out.base_version = r.getBaseVersion();
    out.batch_size = r.getBatchSize();
    out.offset = r.getOffset();
    out.total = r.getTotal();
    out.sparse = r.getSparse();
    out.read_follows = r.getReadFollows();
    if (auto err = data_to_floats("Push", "grad", r.getGrad(), out.grad))
      return err;
    if (auto err = data_to_index("Push", r.getIndex(), out.index))
      return err;
    if (out.sparse && out.index.size() != out.grad.size())
      return malformed("Push", "a sparse push with " + std::to_string(out.index.size()) + " indices and "
                                 + std::to_string(out.grad.size()) + " values");
    return caf::error{};
  });
}

// ---- ring_message ----
words encode(const ring_message& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::RingChunk>();
  b.setRound(x.round);
  b.setStep(x.step);
  b.setChunk(x.chunk);
  b.setRing(x.ring);
  b.setSync(x.sync);
  set_floats(mb, x.data, [&](auto o) { b.adoptData(std::move(o)); },
             [&](capnp::Data::Reader d) { b.setData(d); });
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, ring_message& out) {
  return with_reader<schema::RingChunk>("RingChunk", d, n, [&](auto r) {
    out.round = r.getRound();
    out.step = r.getStep();
    out.chunk = r.getChunk();
    out.ring = r.getRing();
    out.sync = r.getSync();
    return data_to_floats("RingChunk", "data", r.getData(), out.data);
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
  b.setComplete(x.complete);
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
    out.complete = r.getComplete();
    return caf::none;
  });
}

// ---- shard_status ----
namespace {

void fill(schema::DataPosition::Builder b, const data_position& x) {
  b.setBegin(x.begin);
  b.setCount(x.count);
  b.setSeed(x.seed);
  b.setEpoch(x.epoch);
  b.setPos(x.pos);
}

data_position read(schema::DataPosition::Reader r) {
  return {r.getBegin(), r.getCount(), r.getSeed(), r.getEpoch(), r.getPos()};
}

void fill(schema::ShardStatus::Builder b, const shard_status& x) {
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
  b.setCut(x.cut);
  b.setCutError(x.cut_error);
  b.setSamples(x.samples);
  auto holding = b.initHoldingUp(static_cast<unsigned>(x.holding_up.size()));
  for (size_t i = 0; i < x.holding_up.size(); ++i)
    holding.set(i, x.holding_up[i]);
  b.setHeldSeconds(x.held_seconds);
}

caf::error read(schema::ShardStatus::Reader r, shard_status& out) {
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
  out.samples = r.getSamples();
  out.pending_reads = r.getPendingReads();
  out.cut = r.getCut();
  out.cut_error = r.getCutError().cStr();
  out.holding_up.clear();
  for (auto w : r.getHoldingUp())
    out.holding_up.push_back(w);
  out.held_seconds = r.getHeldSeconds();
  return caf::none;
}

template <class Builder>
void fill_values(Builder b, const std::vector<named_value>& values) {
  for (unsigned i = 0; i < values.size(); ++i) {
    b[i].setName(values[i].name);
    b[i].setValue(values[i].value);
  }
}

template <class List>
std::vector<named_value> read_values(List list) {
  std::vector<named_value> out;
  for (auto v : list)
    out.push_back({v.getName().cStr(), v.getValue()});
  return out;
}

void fill(schema::ClusterStats::Builder b, const cluster_stats& x) {
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
    o.setBytes(w.bytes);
    o.setComputePerSample(w.compute_per_sample);
    o.setStageChanges(w.stage_changes);
    o.setStaleness(w.staleness);
    o.setPredictedSpeed(w.predicted_speed);
    o.setObservedSpeed(w.observed_speed);
    o.setPredictionError(w.prediction_error);
    o.setBatch(w.batch);
    fill(o.initPosition(), w.position);
    o.setDenseBytes(w.dense_bytes);
    o.setStepsTarget(w.steps_target);
    o.setDirectives(w.directives);
  }
  b.setTotalSamples(x.total_samples);
  b.setElapsedSeconds(x.elapsed_seconds);
  b.setLoss(x.loss);
  b.setRefusedReports(x.refused_reports);
  auto ms = b.initMetricReports(static_cast<unsigned>(x.metric_reports.size()));
  for (unsigned i = 0; i < x.metric_reports.size(); ++i) {
    const auto& m = x.metric_reports[i];
    ms[i].setSeq(m.seq);
    ms[i].setWorkerId(m.worker_id);
    ms[i].setSamples(m.samples);
    ms[i].setSeconds(m.seconds);
    fill_values(ms[i].initValues(static_cast<unsigned>(m.values.size())), m.values);
  }
}

void read(schema::ClusterStats::Reader r, cluster_stats& out) {
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
    s.bytes = w.getBytes();
    s.compute_per_sample = w.getComputePerSample();
    s.stage_changes = w.getStageChanges();
    s.staleness = w.getStaleness();
    s.predicted_speed = w.getPredictedSpeed();
    s.observed_speed = w.getObservedSpeed();
    s.prediction_error = w.getPredictionError();
    s.batch = w.getBatch();
    s.position = read(w.getPosition());
    s.dense_bytes = w.getDenseBytes();
    s.steps_target = w.getStepsTarget();
    s.directives = w.getDirectives();
    out.workers.push_back(s);
  }
  out.total_samples = r.getTotalSamples();
  out.elapsed_seconds = r.getElapsedSeconds();
  out.loss = r.getLoss();
  out.refused_reports = r.getRefusedReports();
  out.metric_reports.clear();
  for (auto m : r.getMetricReports())
    out.metric_reports.push_back({m.getSeq(), m.getWorkerId(), m.getSamples(), m.getSeconds(), read_values(m.getValues())});
}

template <class List>
caf::error read_roles(const char* type, List list, std::vector<role>& out) {
  out.clear();
  for (auto x : list) {
    auto v = static_cast<uint16_t>(x);
    if (v > 3)
      return malformed(type, "unknown role " + std::to_string(v));
    out.push_back(static_cast<role>(v));
  }
  return caf::none;
}

template <class Builder>
void fill_roles(Builder b, const std::vector<role>& roles) {
  for (size_t i = 0; i < roles.size(); ++i)
    b.set(i, static_cast<schema::Role>(roles[i]));
}

}  // namespace

words encode(const shard_status& x) {
  capnp::MallocMessageBuilder mb;
  fill(mb.initRoot<schema::ShardStatus>(), x);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, shard_status& out) {
  return with_reader<schema::ShardStatus>("ShardStatus", d, n,
                                          [&](auto r) { return read(r, out); });
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
  b.setBytes(x.bytes);
  b.setStageChanges(x.stage_changes);
  b.setStartNs(x.start_ns);
  b.setComputeOffsetNs(x.compute_offset_ns);
  b.setStaleness(x.staleness);
  b.setBatch(x.batch);
  fill(b.initPosition(), x.position);
  b.setDenseBytes(x.dense_bytes);
  b.setStepsTarget(x.steps_target);
  b.setDirectives(x.directives);
  fill_values(b.initMetrics(static_cast<unsigned>(x.metrics.size())), x.metrics);
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
    out.stage_changes = r.getStageChanges();
    out.bytes = r.getBytes();
    out.start_ns = r.getStartNs();
    out.compute_offset_ns = r.getComputeOffsetNs();
    out.staleness = r.getStaleness();
    out.batch = r.getBatch();
    out.position = read(r.getPosition());
    out.dense_bytes = r.getDenseBytes();
    out.steps_target = r.getStepsTarget();
    out.directives = r.getDirectives();
    out.metrics = read_values(r.getMetrics());
    return caf::error{};
  });
}

// ---- cluster_stats ----
words encode(const cluster_stats& x) {
  capnp::MallocMessageBuilder mb;
  fill(mb.initRoot<schema::ClusterStats>(), x);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, cluster_stats& out) {
  return with_reader<schema::ClusterStats>("ClusterStats", d, n, [&](auto r) {
    read(r, out);
    return caf::error{};
  });
}

// ---- hello / welcome ----
words encode(const hello& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::Hello>();
  b.setProtocolVersion(x.protocol);
  fill_roles(b.initRoles(static_cast<unsigned>(x.roles.size())), x.roles);
  b.setNode(x.node);
  b.setSlots(x.slots);
  b.setReplaceShard(x.replace_shard);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, hello& out) {
  return with_reader<schema::Hello>("Hello", d, n, [&](auto r) {
    out.protocol = r.getProtocolVersion();
    out.node = r.getNode();
    out.slots = r.getSlots();
    out.replace_shard = r.getReplaceShard();
    return read_roles("Hello", r.getRoles(), out.roles);
  });
}

words encode(const welcome& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::Welcome>();
  b.setNodeId(x.node_id);
  b.setCluster(x.cluster);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, welcome& out) {
  return with_reader<schema::Welcome>("Welcome", d, n, [&](auto r) {
    out.node_id = r.getNodeId();
    out.cluster = r.getCluster();
    return caf::error{};
  });
}

// ---- spawn_shard / spawn_worker ----
words encode(const spawn_shard& x) {
  capnp::MallocMessageBuilder mb{static_cast<unsigned>(x.params.size() / 2 + 64)};
  auto b = mb.initRoot<schema::SpawnShard>();
  auto r = b.initRange();
  r.setShardId(x.range.shard_id);
  r.setBegin(x.range.begin);
  r.setEnd(x.range.end);
  b.setParams(floats_as_data(x.params));
  b.setPolicy(x.policy);
  b.setLr(x.lr);
  b.setMomentum(x.momentum);
  b.setWeightDecay(x.weight_decay);
  b.setOptimizer(to_string(x.rule));
  b.setBeta1(x.beta1);
  b.setBeta2(x.beta2);
  b.setEps(x.eps);
  b.setStalenessAwareLr(x.staleness_aware_lr);
  b.setStalenessBound(x.staleness_bound);
  b.setK(x.k);
  b.setDataKey(x.data_key);
  b.setCheckpointDir(x.checkpoint_dir);
  b.setCheckpointKeep(x.checkpoint_keep);
  b.setResume(x.resume);
  b.setAverageSamples(x.average_samples);
  b.setJob(x.job);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, spawn_shard& out) {
  return with_reader<schema::SpawnShard>("SpawnShard", d, n, [&](auto r) -> caf::error {
    auto range = r.getRange();
    out.range = shard_range{range.getShardId(), range.getBegin(), range.getEnd()};
    if (out.range.end <= out.range.begin)
      return malformed("SpawnShard", "empty parameter range");
    if (auto err = data_to_floats("SpawnShard", "params", r.getParams(), out.params))
      return err;
    if (out.params.size() != out.range.size())
      return malformed("SpawnShard", "holds " + std::to_string(out.params.size())
                                       + " parameters for a range of "
                                       + std::to_string(out.range.size()));
    out.policy = r.getPolicy();
    out.lr = r.getLr();
    out.momentum = r.getMomentum();
    out.weight_decay = r.getWeightDecay();
    if (auto err = decode_rule("SpawnShard", r, out))
      return err;
    out.staleness_aware_lr = r.getStalenessAwareLr();
    out.staleness_bound = r.getStalenessBound();
    out.k = r.getK();
    out.data_key = r.getDataKey();
    out.checkpoint_dir = r.getCheckpointDir();
    out.checkpoint_keep = r.getCheckpointKeep();
    out.resume = r.getResume();
    out.average_samples = r.getAverageSamples();
    out.job = r.getJob();
    // (logged by the node: hex digits only, as the cluster writes it)
    if (out.job.size() > 64 || out.job.find_first_not_of("0123456789abcdef") != std::string::npos)
      return malformed("SpawnShard", "job id of " + std::to_string(out.job.size())
                                       + " bytes is not up to 64 lowercase hex digits");
    return caf::none;
  });
}

words encode(const spawn_worker& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::SpawnWorker>();
  b.setRequestedId(x.requested_id);
  b.setDataDir(x.data_dir);
  b.setDataSource(x.data_source);
  b.setTrainLimit(x.train_limit);
  b.setSeed(x.seed);
  b.setInputWidth(x.input_width);
  b.setClasses(x.classes);
  auto shape = b.initInputShape(3);
  shape.set(0, x.input.c);
  shape.set(1, x.input.h);
  shape.set(2, x.input.w);
  b.setCropPadding(x.crop_padding);
  b.setHflip(x.hflip);
  b.setRingKey(x.ring_key);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, spawn_worker& out) {
  return with_reader<schema::SpawnWorker>("SpawnWorker", d, n, [&](auto r) {
    out.requested_id = r.getRequestedId();
    out.data_dir = r.getDataDir();
    out.data_source = r.getDataSource();
    out.train_limit = r.getTrainLimit();
    out.seed = r.getSeed();
    out.input_width = r.getInputWidth();
    out.classes = r.getClasses();
    auto shape = r.getInputShape();
    if (shape.size() != 3 || uint64_t{shape[0]} * shape[1] * shape[2] == 0)
      return malformed("SpawnWorker", "the input shape needs 3 non-zero dimensions");
    out.input = tensor_shape{shape[0], shape[1], shape[2]};
    out.crop_padding = r.getCropPadding();
    out.hflip = r.getHflip();
    out.ring_key = r.getRingKey();
    return caf::error{};
  });
}

// ---- jobs and control ----
words encode(const job_request& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::JobRequest>();
  auto list = b.initSettings(static_cast<unsigned>(x.settings.size()));
  for (size_t i = 0; i < x.settings.size(); ++i) {
    list[i].setKey(x.settings[i].first);
    list[i].setValue(x.settings[i].second);
  }
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, job_request& out) {
  return with_reader<schema::JobRequest>("JobRequest", d, n, [&](auto r) {
    out.settings.clear();
    for (auto s : r.getSettings())
      out.settings.emplace_back(s.getKey(), s.getValue());
    return caf::error{};
  });
}

words encode(const job_result& x) {
  capnp::MallocMessageBuilder mb;
  mb.initRoot<schema::JobResult>().setReportJson(x.report_json);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, job_result& out) {
  return with_reader<schema::JobResult>("JobResult", d, n, [&](auto r) {
    out.report_json = r.getReportJson();
    return caf::error{};
  });
}

words encode(const ctl_request& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::CtlRequest>();
  b.setOp(static_cast<schema::CtlRequest::Op>(x.op));
  b.setWorkerId(x.worker_id);
  b.setCount(x.count);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, ctl_request& out) {
  return with_reader<schema::CtlRequest>("CtlRequest", d, n, [&](auto r) -> caf::error {
    auto op = static_cast<uint16_t>(r.getOp());
    if (op > 3)
      return malformed("CtlRequest", "unknown operation " + std::to_string(op));
    out.op = static_cast<ctl_request::op_t>(op);
    out.worker_id = r.getWorkerId();
    out.count = r.getCount();
    return caf::none;
  });
}

// ---- cluster_status ----
words encode(const cluster_status& x) {
  capnp::MallocMessageBuilder mb;
  auto b = mb.initRoot<schema::ClusterStatus>();
  auto nodes = b.initNodes(static_cast<unsigned>(x.nodes.size()));
  for (size_t i = 0; i < x.nodes.size(); ++i) {
    const auto& n = x.nodes[i];
    auto o = nodes[i];
    o.setNodeId(n.node_id);
    o.setName(n.name);
    fill_roles(o.initRoles(static_cast<unsigned>(n.roles.size())), n.roles);
    o.setSlots(n.slots);
    o.setAlive(n.alive);
  }
  fill(b.initStats(), x.stats);
  auto shards = b.initShards(static_cast<unsigned>(x.shards.size()));
  for (size_t i = 0; i < x.shards.size(); ++i)
    fill(shards[i], x.shards[i]);
  b.setStage(x.stage);
  b.setJob(x.job);
  b.setJobSamples(x.job_samples);
  b.setTrainSamples(x.train_samples);
  return to_words(mb);
}

caf::error decode(const uint64_t* d, size_t n, cluster_status& out) {
  return with_reader<schema::ClusterStatus>("ClusterStatus", d, n, [&](auto r) -> caf::error {
    out.nodes.clear();
    for (auto nr : r.getNodes()) {
      node_info ni;
      ni.node_id = nr.getNodeId();
      ni.name = nr.getName();
      if (auto err = read_roles("ClusterStatus", nr.getRoles(), ni.roles))
        return err;
      ni.slots = nr.getSlots();
      ni.alive = nr.getAlive();
      out.nodes.push_back(std::move(ni));
    }
    read(r.getStats(), out.stats);
    out.shards.clear();
    for (auto sr : r.getShards()) {
      shard_status st;
      if (auto err = read(sr, st))
        return err;
      out.shards.push_back(std::move(st));
    }
    out.stage = r.getStage();
    out.job = r.getJob();
    out.job_samples = r.getJobSamples();
    out.train_samples = r.getTrainSamples();
    return caf::none;
  });
}

}  // namespace ashlar::wire
