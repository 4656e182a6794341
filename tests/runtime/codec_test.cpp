#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/wire/codec.hpp"

using namespace ashlar;
using namespace ashlar::wire;

namespace {
bool apply_layers(model_spec& m, const std::string& text) {
  auto l = parse_layers(text);
  if (!l)
    return false;
  m.layers = *l;
  return true;
}
}  // namespace

TEST_CASE("every wire message survives an encode/decode round trip") {
  assignment a;
  a.worker_id = 3;
  a.shards = {{0, 0, 10}, {1, 10, 25}};
  a.model.hidden = {256};
  REQUIRE(apply_layers(a.model, "conv2d name=c out=4 kernel=3 padding=1; relu; add from=c; flatten; dense out=10"));
  a.batch_size = 64;
  a.data_begin = 100;
  a.data_count = 200;
  a.steps = 12;
  a.seed = 99;
  a.policy = "bsp";
  a.cursor_epoch = 4;
  a.cursor_pos = 320;
  a.overlap_commits = true;
  a.local_momentum = 0.5f;
  assignment a2;
  REQUIRE_FALSE(decode(encode(a), a2));
  CHECK(a2.overlap_commits);
  CHECK(a2.local_momentum == 0.5f);
  CHECK(a2.cursor_epoch == 4);
  CHECK(a2.cursor_pos == 320);
  CHECK(a2.worker_id == 3);
  CHECK(a2.shards == a.shards);
  CHECK(a2.model.input == a.model.input);
  CHECK(a2.model.classes == a.model.classes);
  CHECK(a2.model.hidden == a.model.hidden);
  CHECK(layers_text(a2.model.layers) == layers_text(a.model.layers));
  CHECK(a2.model.num_params() == a.model.num_params());
  CHECK(a2.steps == 12);
  CHECK(a2.policy == "bsp");

  push p{1, 2, 77, 32, {1.5f, -2.25f, 3e-8f}};
  push p2;
  REQUIRE_FALSE(decode(encode(p), p2));
  CHECK(p2.grad == p.grad);
  CHECK(p2.base_version == 77);
  CHECK(p2.batch_size == 32);

  ring_message rm;
  rm.round = 41;
  rm.step = 3;
  rm.chunk = 2;
  rm.data = {1.0f, -0.5f};
  rm.ring = 7;
  rm.sync = 2;
  ring_message rm2;
  REQUIRE_FALSE(decode(encode(rm), rm2));
  CHECK(rm2.round == 41);
  CHECK(rm2.step == 3);
  CHECK(rm2.chunk == 2);
  CHECK(rm2.data == rm.data);
  CHECK(rm2.ring == 7); // a re-formed ring's generation
  CHECK(rm2.sync == 2);

  pull_reply r{1, 5, 10, {0.5f, 0.25f}, 1234, 0, 2, 0};
  pull_reply r2;
  REQUIRE_FALSE(decode(encode(r), r2));
  CHECK(r2.params == r.params);
  CHECK(r2.wait_ns == 1234);

  membership_change m{membership_change::fail, 4, "killed"};
  membership_change m2;
  REQUIRE_FALSE(decode(encode(m), m2));
  CHECK(m2.kind == membership_change::fail);
  CHECK(m2.reason == "killed");
  CHECK_FALSE(m2.early);
  membership_change early{membership_change::leave, 2, "removed on request", true, 77};
  REQUIRE_FALSE(decode(encode(early), m2));
  CHECK(m2.kind == membership_change::leave);
  CHECK(m2.early);
  CHECK(m2.steps == 77);

  push_ack k{1, 9, push_ack::dropped, 3};
  push_ack k2;
  REQUIRE_FALSE(decode(encode(k), k2));
  CHECK(k2.outcome == push_ack::dropped);
  CHECK(k2.staleness == 3);

  profile_report pr{2, 10, 64, 0.5, 1, 2, 3, 4};
  profile_report pr2;
  REQUIRE_FALSE(decode(encode(pr), pr2));
  CHECK(pr2.wait_ns == 4);
  CHECK(pr2.loss == 0.5);
  pr.start_ns = 1'700'000'000'000'000'000;
  pr.compute_offset_ns = 12345;
  pr.steps_target = 77;
  pr.directives = 3;
  pr.staleness = 6;
  REQUIRE_FALSE(decode(encode(pr), pr2));
  CHECK(pr2.start_ns == pr.start_ns);
  CHECK(pr2.compute_offset_ns == 12345);
  CHECK(pr2.steps_target == 77);
  CHECK(pr2.directives == 3);
  CHECK(pr2.staleness == 6);
  pr.batch = 96;
  pr.position = {1000, 5000, 77, 3, 640};
  REQUIRE_FALSE(decode(encode(pr), pr2));
  CHECK(pr2.batch == 96);
  CHECK(pr2.position.begin == 1000);
  CHECK(pr2.position.count == 5000);
  CHECK(pr2.position.seed == 77);
  CHECK(pr2.position.epoch == 3);
  CHECK(pr2.position.pos == 640);
  CHECK(pr2.metrics.empty());
  pr.metrics = {{"val_ppl", 141.25}, {"val_loss", 4.95}};
  REQUIRE_FALSE(decode(encode(pr), pr2));
  REQUIRE(pr2.metrics.size() == 2);
  CHECK(pr2.metrics[0].name == "val_ppl");
  CHECK(pr2.metrics[0].value == 141.25);
  CHECK(pr2.metrics[1].name == "val_loss");

  cluster_stats cs;
  cs.metric_reports.push_back({3, 1, 640, 2.5, {{"val_ppl", 150}}});
  cs.workers.push_back(worker_stats{1, 2, 3, 4.5, 0.1, 0.2, 0.3, 0.4, true, 5.0, 6.0});
  cs.workers[0].staleness = 1.5;
  cs.workers[0].predicted_speed = 900;
  cs.workers[0].observed_speed = 1000;
  cs.workers[0].prediction_error = 0.1;
  cs.workers[0].batch = 40;
  cs.workers[0].position = {8, 16, 5, 2, 4};
  cs.total_samples = 77;
  cluster_stats cs2;
  REQUIRE_FALSE(decode(encode(cs), cs2));
  REQUIRE(cs2.workers.size() == 1);
  CHECK(cs2.workers[0].done);
  CHECK(cs2.workers[0].total_wait_seconds == 6.0);
  CHECK(cs2.workers[0].staleness == 1.5);
  CHECK(cs2.workers[0].predicted_speed == 900);
  CHECK(cs2.workers[0].observed_speed == 1000);
  CHECK(cs2.workers[0].prediction_error == 0.1);
  CHECK(cs2.workers[0].batch == 40);
  CHECK(cs2.workers[0].position.pos == 4);
  CHECK(cs2.workers[0].position.epoch == 2);
  REQUIRE(cs2.metric_reports.size() == 1);
  CHECK(cs2.metric_reports[0].seq == 3);
  CHECK(cs2.metric_reports[0].worker_id == 1);
  CHECK(cs2.metric_reports[0].samples == 640);
  CHECK(cs2.metric_reports[0].seconds == 2.5);
  REQUIRE(cs2.metric_reports[0].values.size() == 1);
  CHECK(cs2.metric_reports[0].values[0].name == "val_ppl");
  CHECK(cs2.metric_reports[0].values[0].value == 150);

  shard_status ss;
  ss.shard_id = 1;
  ss.begin = 5;
  ss.end = 9;
  ss.live_workers = {0, 2};
  shard_status ss2;
  REQUIRE_FALSE(decode(encode(ss), ss2));
  CHECK(ss2.live_workers == ss.live_workers);

  register_worker rw{7, "h:1", "cpu", "10.0.0.2:4711"};
  register_worker rw2;
  REQUIRE_FALSE(decode(encode(rw), rw2));
  CHECK(rw2.host == "h:1");
  CHECK(rw2.ring_endpoint == "10.0.0.2:4711");

  spawn_worker sw;
  sw.input = tensor_shape{1, 28, 28};
  sw.ring_key = "0123456789abcdef";
  spawn_worker sw2;
  REQUIRE_FALSE(decode(encode(sw), sw2));
  CHECK(sw2.ring_key == sw.ring_key);

  pull_request q{1, 2, true};
  pull_request q2;
  REQUIRE_FALSE(decode(encode(q), q2));
  CHECK(q2.snapshot);
  CHECK_FALSE(q2.average);
  q.average = true;
  REQUIRE_FALSE(decode(encode(q), q2));
  CHECK(q2.average);

  spawn_shard sp;
  sp.range = shard_range{0, 0, 2};
  sp.params = {1.0f, 2.0f};
  sp.policy = "ashl";
  sp.average_samples = 3750;
  sp.job = "9d2e41b0";
  spawn_shard sp2;
  REQUIRE_FALSE(decode(encode(sp), sp2));
  CHECK(sp2.average_samples == 3750);
  CHECK(sp2.job == "9d2e41b0");
  // A job id that is not hex digits (it is logged) is refused, naming it.
  sp.job = "9d2e\n41b0";
  auto bad_job = decode(encode(sp), sp2);
  REQUIRE(bad_job);
  CHECK(is(bad_job, errc::malformed_message));
  CHECK(describe(bad_job).find("job id") != std::string::npos);
}

TEST_CASE("a truncated message is refused with malformed_message, never read past its end") {
  push p{1, 2, 3, 4, tensor(1000, 1.0f)};
  auto w = encode(p);
  for (size_t keep : {size_t{0}, size_t{1}, size_t{3}, w.size() / 2, w.size() - 1}) {
    push out;
    auto err = decode(w.data(), keep, out);
    REQUIRE(err);
    CHECK(is(err, errc::malformed_message));
    CHECK(describe(err).find("Push") != std::string::npos);
  }
}

TEST_CASE("garbage bytes are refused as malformed, not crashed on") {
  words junk(64);
  for (size_t i = 0; i < junk.size(); ++i)
    junk[i] = 0x9E3779B97F4A7C15ull * (i + 1);
  pull_reply out;
  CHECK(is(decode(junk, out), errc::malformed_message));
  assignment a;
  CHECK(is(decode(junk, a), errc::malformed_message));
}

TEST_CASE("a tensor whose byte length is not a whole number of floats is refused") {
  // A push whose grad Data holds 7 bytes: built by encoding 2 floats, then patching the
  // list length in the pointer (element count lives in the upper 29 bits of the word).
  push p{1, 2, 3, 4, {1.0f, 2.0f}};
  auto w = encode(p);
  bool patched = false;
  for (auto& word : w) {
    // A list pointer of bytes (element size 2) with 8 elements: (8 << 35) | (2 << 32) | 1.
    if ((word & 3) == 1 && ((word >> 32) & 7) == 2 && (word >> 35) == 8) {
      word = (word & ((uint64_t{1} << 35) - 1)) | (uint64_t{7} << 35);
      patched = true;
    }
  }
  REQUIRE(patched);
  push out;
  auto err = decode(w, out);
  REQUIRE(err);
  CHECK(describe(err).find("not a whole number of float32") != std::string::npos);
}

TEST_CASE("an assignment whose shard ranges overlap is refused") {
  assignment a;
  a.shards = {{0, 0, 10}, {1, 5, 20}};
  assignment out;
  auto err = decode(encode(a), out);
  REQUIRE(err);
  CHECK(describe(err).find("not contiguous") != std::string::npos);
}

TEST_CASE("an assignment whose local momentum is below 0, 1 or more, or not a number is refused, naming it") {
  for (float bad : {1.0f, -0.1f, std::nanf("")}) {
    assignment a;
    a.shards = {{0, 0, 10}};
    a.local_momentum = bad;
    assignment out;
    auto err = decode(encode(a), out);
    REQUIRE(is(err, errc::malformed_message));
    CHECK(describe(err).find("local momentum") != std::string::npos);
  }
}

TEST_CASE("a pull reply whose chunk runs past its range is refused") {
  pull_reply r{1, 5, 10, {0.5f, 0.25f, 1.0f}, 0, 8, 10, 3};
  pull_reply out;
  auto err = decode(encode(r), out);
  REQUIRE(err);
  CHECK(describe(err).find("exceeds the range of 10") != std::string::npos);
}

TEST_CASE("a sparse push keeps its indices and values through the codec, and a mismatch is refused") {
  push p{1, 2, 3, 4, {0.5f, -1.0f, 2.0f}};
  p.total = 100;
  p.sparse = true;
  p.index = {3, 40, 99};
  push p2;
  REQUIRE_FALSE(decode(encode(p), p2));
  CHECK(p2.sparse);
  CHECK(p2.index == p.index);
  CHECK(p2.grad == p.grad);
  CHECK(p2.total == 100);
  // A sparse push whose indices do not match its values is malformed, not applied.
  p.index = {3, 40};
  push p3;
  auto err = decode(encode(p), p3);
  CHECK(is(err, errc::malformed_message));
  CHECK(describe(err).find("2 indices and 3 values") != std::string::npos);
  // A dense push carries no indices.
  push d{1, 2, 3, 4, {1.0f}};
  push d2;
  REQUIRE_FALSE(decode(encode(d), d2));
  CHECK_FALSE(d2.sparse);
  CHECK(d2.index.empty());
}

TEST_CASE("a delta read keeps its indices, values and view through the codec, and a mismatch is refused") {
  pull_request q{1, 2, false};
  q.topk_ratio = 0.1f;
  q.view_seq = 42;
  pull_request q2;
  REQUIRE_FALSE(decode(encode(q), q2));
  CHECK(q2.topk_ratio == 0.1f);
  CHECK(q2.view_seq == 42);
  pull_reply r;
  r.shard_id = 2;
  r.version = 7;
  r.total = 100;
  r.sparse = true;
  r.index = {0, 17, 99};
  r.params = shared_tensor{1.0f, -2.0f, 3.5f};
  r.view_seq = 43;
  pull_reply r2;
  REQUIRE_FALSE(decode(encode(r), r2));
  CHECK(r2.sparse);
  CHECK(r2.index == r.index);
  CHECK(r2.params == r.params);
  CHECK(r2.view_seq == 43);
  CHECK(r2.total == 100);
  r.index = {0, 17};
  pull_reply r3;
  auto err = decode(encode(r), r3);
  CHECK(is(err, errc::malformed_message));
  CHECK(describe(err).find("a delta read with 2 indices and 3 values") != std::string::npos);
}

TEST_CASE("an assignment carries the shipped CNN whole: its shard ranges cover the model's parameters") {
  assignment a;
  REQUIRE(apply_layers(a.model, "conv2d out=32 kernel=5 padding=2; relu; maxpool kernel=2; conv2d out=64 kernel=5 "
                                "padding=2; relu; maxpool kernel=2; flatten; dense out=128; relu; dense out=10"));
  const auto n = a.model.num_params();
  a.shards = {{0, 0, n / 2}, {1, n / 2, n}};
  a.batch_size = 64;
  a.steps = 3;
  a.policy = "bsp";
  assignment a2;
  auto err = decode(encode(a), a2);
  INFO((err ? describe(err) : std::string{"ok"}));
  REQUIRE_FALSE(err);
  CHECK(layers_text(a2.model.layers) == layers_text(a.model.layers));
}

TEST_CASE("the update rule and Adam's settings go with a shard's spawn and a ring worker's assignment") {
  spawn_shard sp;
  sp.range = shard_range{0, 0, 2};
  sp.params = {1.0f, 2.0f};
  sp.policy = "asp";
  sp.rule = update_rule::adamw;
  sp.beta1 = 0.8f;
  sp.beta2 = 0.99f;
  sp.eps = 1e-6f;
  spawn_shard got;
  REQUIRE_FALSE(decode(encode(sp), got));
  CHECK(got.rule == update_rule::adamw);
  CHECK(got.beta1 == 0.8f);
  CHECK(got.beta2 == 0.99f);
  CHECK(got.eps == 1e-6f);
  sp.beta2 = 1.0f; // no decay at all: refused, naming the field
  auto bad = decode(encode(sp), got);
  REQUIRE(bad);
  CHECK(is(bad, errc::malformed_message));
  CHECK(describe(bad).find("SpawnShard: Adam's beta1") != std::string::npos);
  assignment a;
  a.shards = {{0, 0, 10}};
  a.rule = update_rule::adam;
  assignment b;
  REQUIRE_FALSE(decode(encode(a), b));
  CHECK(b.rule == update_rule::adam);
  CHECK(b.beta2 == 0.999f);
  a.rule = update_rule::sgd;
  REQUIRE_FALSE(decode(encode(a), b));
  CHECK(b.rule == update_rule::sgd);
}
