// The worker's step without CAF: the step machine fed replies, acknowledgements and
// computed gradients by hand, on a manual clock, asserting what it asks to send next.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <numeric>

#include "runtime/backend/cpu_backend.hpp"
#include "runtime/backend/held_model.hpp"
#include "runtime/worker/step_machine.hpp"

using namespace ashlar;

namespace {

// Two shards over 8 parameters ([0, 5) and [5, 8)), batches of 4 from 40 samples.
struct rig {
  dataset data = make_synthetic(40, 3, 2, 7);
  manual_clock clock;
  wire::assignment a;
  std::unique_ptr<step_machine> m;

  explicit rig(void (*tune)(wire::assignment&) = nullptr) {
    a.worker_id = 3;
    a.shards = {shard_range{0, 0, 5}, shard_range{1, 5, 8}};
    a.batch_size = 4;
    a.data_begin = 0;
    a.data_count = 40;
    a.steps = 10;
    a.seed = 1;
    a.policy = "bsp";
    a.chunk_floats = 0;
    a.chunks_in_flight = 2;
    a.local_lr = 0.5f;
    a.commit_scale = 1.0f;
    if (tune)
      tune(a);
    m = std::make_unique<step_machine>(a, data, 8, clock);
  }

  // Reads sent ahead behind pushes (send_pull with ahead), not yet answered.
  std::vector<step::send_pull> ahead;

  std::vector<step_action> actions() {
    auto acts = m->take_actions();
    for (const auto& act : acts)
      if (auto* p = std::get_if<step::send_pull>(&act); p && p->ahead)
        ahead.push_back(*p);
    return acts;
  }

  // The whole reply to a pull of shard i: every parameter `value`, at `version`.
  wire::pull_reply whole(size_t i, float value, uint64_t version = 0) const {
    const auto& r = a.shards[i];
    wire::pull_reply rep;
    rep.shard_id = r.shard_id;
    rep.version = version;
    rep.begin = r.begin;
    rep.total = r.size();
    std::vector<float> p(r.size(), value);
    rep.params = wire::tensor(p.begin(), p.end());
    return rep;
  }

  // Answers every pull in `acts`, and the reads sent ahead so far, with whole replies
  // (all parameters `value`).
  void answer_pulls(const std::vector<step_action>& acts, float value) {
    for (const auto& act : acts)
      if (auto* p = std::get_if<step::send_pull>(&act); p && !p->ahead)
        m->on_pull_reply(p->shard, p->gen, whole(p->shard, value));
    auto sent = std::move(ahead);
    ahead.clear();
    for (const auto& p : sent)
      m->on_read_ahead(p.shard, p.gen, whole(p.shard, value));
  }

  // Begins, takes the first step's pull (all parameters 1), runs `before` (if any), then
  // computes a gradient of all 0.25: the step's pushes are what actions() gives next.
  void first_step_computed(const std::function<void()>& before = {}) {
    m->begin();
    actions();
    m->on_step();
    answer_pulls(actions(), 1.0f);
    actions();
    if (before)
      before();
    compute(0.25f);
  }

  // Computes a gradient of all `g` in `ms` milliseconds.
  void compute(float g, uint64_t ms = 1) {
    std::fill(m->grad().begin(), m->grad().end(), g);
    clock.advance(ms * 1000000);
    batch_stats s;
    s.n = 4;
    s.loss_sum = 4.0;
    m->on_computed(s);
  }
};

template <class T>
size_t count(const std::vector<step_action>& acts) {
  return static_cast<size_t>(
    std::count_if(acts.begin(), acts.end(), [](const step_action& a) { return std::holds_alternative<T>(a); }));
}

template <class T>
std::vector<T> all(const std::vector<step_action>& acts) {
  std::vector<T> out;
  for (const auto& a : acts)
    if (auto* x = std::get_if<T>(&a))
      out.push_back(*x);
  return out;
}

}  // namespace

TEST_CASE("step machine: pull every shard, compute, push every shard, report, next step") {
  rig r;
  r.m->begin();
  REQUIRE(count<step::next_step>(r.actions()) == 1);
  r.m->on_step();
  auto pulls = all<step::send_pull>(r.actions());
  REQUIRE(pulls.size() == 2);
  CHECK(pulls[0].req.shard_id == 0);
  CHECK(pulls[1].req.shard_id == 1);
  r.m->on_pull_reply(0, pulls[0].gen, r.whole(0, 1.0f, 7));
  CHECK(r.actions().empty()); // shard 1's read is still out
  r.m->on_pull_reply(1, pulls[1].gen, r.whole(1, 2.0f, 9));
  auto acts = r.actions();
  REQUIRE(count<step::compute>(acts) == 1);
  CHECK(all<step::compute>(acts)[0].batch.n == 4);
  CHECK(r.m->params() == std::vector<float>{1, 1, 1, 1, 1, 2, 2, 2});
  r.compute(0.25f);
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  CHECK(pushes[0].msg.base_version == 7); // the version each slice was computed from
  CHECK(pushes[1].msg.base_version == 9);
  CHECK(pushes[1].msg.grad == wire::tensor{0.25f, 0.25f, 0.25f});
  CHECK(pushes[0].msg.batch_size == 4);
  wire::push_ack ack;
  ack.staleness = 2;
  r.m->on_push_ack(0, pushes[0].gen, pushes[0].floats, ack);
  CHECK(r.actions().empty());
  r.m->on_push_ack(1, pushes[1].gen, pushes[1].floats, {});
  acts = r.actions();
  auto reports = all<step::report>(acts);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].rep.worker_id == 3);
  CHECK(reports[0].rep.step == 0);
  CHECK(reports[0].rep.samples == 4);
  CHECK(reports[0].rep.staleness == 2);
  CHECK(reports[0].rep.loss == Approx(1.0));
  CHECK(reports[0].rep.compute_ns == 1000000); // the manual clock's millisecond
  CHECK(count<step::next_step>(acts) == 1);
  CHECK(r.m->steps_done() == 1);
}

TEST_CASE("step machine: a worker that gives its buffers back between steps holds no gradient once its pushes "
          "hold their copies, keeps it while chunks are still to send, and pushes what it computed") {
  rig r;
  r.m->give_back_between_steps(true);
  CHECK(r.m->grad().empty()); // given back until the first step takes them
  CHECK(r.m->params().empty());
  r.m->begin();
  r.actions();
  for (int step = 0; step < 2; ++step) {
    r.m->on_step();
    r.answer_pulls(r.actions(), 1.0f + static_cast<float>(step));
    REQUIRE(count<step::compute>(r.actions()) == 1); // the replies, kept as they came, copied in now
    CHECK(r.m->params() == std::vector<float>(8, 1.0f + static_cast<float>(step)));
    REQUIRE(r.m->grad().size() == 8); // taken again, zeroed, for the step
    CHECK(std::all_of(r.m->grad().begin(), r.m->grad().end(), [](float g) { return g == 0.0f; }));
    r.compute(0.25f);
    auto pushes = all<step::send_push>(r.actions());
    REQUIRE(pushes.size() == 2);
    CHECK(pushes[0].msg.grad == wire::tensor{0.25f, 0.25f, 0.25f, 0.25f, 0.25f});
    CHECK(pushes[1].msg.grad == wire::tensor{0.25f, 0.25f, 0.25f});
    CHECK(r.m->grad().empty());
    CHECK(r.m->params().empty()); // every step pulls the whole model again
    for (const auto& p : pushes)
      r.m->on_push_ack(p.shard, p.gen, p.floats, {});
    CHECK(count<step::report>(r.actions()) == 1);
  }

  // Local steps keep the model between steps (a step adds to it): never given back.
  rig l;
  l.m->give_back_between_steps(true);
  l.m->begin();
  l.actions();
  l.m->on_stage("coarse", 2, 1.0f, 0.0f);
  l.m->on_step();
  l.answer_pulls(l.actions(), 1.0f);
  REQUIRE(count<step::compute>(l.actions()) == 1);
  l.compute(0.25f);
  l.actions();
  CHECK(l.m->params().size() == 8);
  CHECK(l.m->params()[0] != 1.0f); // moved by the local step
  l.m->on_step();
  REQUIRE(count<step::compute>(l.actions()) == 1); // on the local model, no pull
  CHECK(l.m->params().size() == 8);

  rig c([](wire::assignment& a) {
    a.chunk_floats = 2;
    a.chunks_in_flight = 1;
  });
  c.m->give_back_between_steps(true);
  c.m->begin();
  c.actions();
  c.m->on_step();
  c.answer_pulls(c.actions(), 1.0f);
  c.actions();
  c.compute(0.5f);
  auto out = all<step::send_push>(c.actions());
  CHECK(out.size() == 2);
  CHECK(c.m->grad().size() == 8); // chunks are still to send from it
  size_t sent = 0;
  while (!out.empty()) {
    for (const auto& p : out) {
      sent += p.msg.grad.size();
      CHECK(std::all_of(p.msg.grad.begin(), p.msg.grad.end(), [](float g) { return g == 0.5f; }));
      c.m->on_push_ack(p.shard, p.gen, p.floats, {});
    }
    out = all<step::send_push>(c.actions());
  }
  CHECK(sent == 8);
  CHECK(c.m->grad().empty());
}

namespace {

// One whole step from its start: every pull answered, a computation, every push acked.
// Returns its report.
wire::profile_report one_step(rig& r) {
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.0f);
  for (const auto& p : all<step::send_push>(r.actions()))
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  auto reports = all<step::report>(r.actions());
  REQUIRE(reports.size() == 1);
  return reports[0].rep;
}

}  // namespace

TEST_CASE("step machine: a membership directive moves the part from its step on, and one that comes after that "
          "step counts the steps taken on the old part") {
  rig r; // 40 samples at batch 4: 10 steps a pass
  r.m->begin();
  r.actions();
  one_step(r);
  one_step(r);
  // Planned when the profiler had counted 2 steps: its old part for 2 more, then [0, 20).
  r.m->on_batch(4, 4, 0, 20, 12);
  auto third = one_step(r);
  CHECK(third.position.count == 40);
  CHECK(third.steps_target == 12);
  CHECK(third.directives == 1);
  CHECK(one_step(r).position.count == 40);
  auto fifth = one_step(r);
  CHECK(fifth.position.count == 20);
  CHECK(fifth.position.begin == 0);
  // A directive planned from step 3 that comes after 5 steps: 2 of its steps trained the
  // old part's 4 samples, not the new part's 3 (6 samples: 2 steps of 3). The plan's
  // (9 - 3) steps of 3 = 18 samples, less 8 trained: 10 more, 4 steps (rounded up: 3
  // would leave a sample untrained).
  r.m->on_batch(4, 3, 20, 6, 9);
  auto sixth = one_step(r);
  CHECK(sixth.position.count == 6);
  CHECK(sixth.position.begin == 20);
  CHECK(sixth.steps_target == 5 + 4);
  CHECK(sixth.directives == 2);
}

TEST_CASE("step machine: a worker stopped while it computes drops that step's gradient and leaves without pushing "
          "it, its steps before that all pushed and reported") {
  rig r([](wire::assignment& a) { a.policy = "kasync"; });
  r.m->begin();
  r.actions();
  // Step 0 whole: pushed and reported.
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.25f);
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  for (const auto& p : pushes)
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  auto acts = r.actions();
  REQUIRE(all<step::report>(acts).size() == 1);
  REQUIRE(count<step::next_step>(acts) == 1);
  // Step 1: the stop arrives while its gradient is computed.
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  REQUIRE(count<step::compute>(r.actions()) == 1);
  r.m->on_stop();
  r.compute(0.5f);
  acts = r.actions();
  CHECK(count<step::send_push>(acts) == 0);
  CHECK(count<step::report>(acts) == 0);
  auto fin = all<step::finish>(acts);
  REQUIRE(fin.size() == 1);
  CHECK(fin[0].reason == "stopped on request after 1 steps");
  CHECK(r.m->steps_done() == 1);
}

TEST_CASE("step machine: a range in chunks keeps chunks_in_flight requests out and pushes in chunks") {
  rig r([](wire::assignment& a) {
    a.shards = {shard_range{0, 0, 8}};
    a.chunk_floats = 2;
  });
  r.m->begin();
  r.actions();
  r.m->on_step();
  auto first = all<step::send_pull>(r.actions());
  REQUIRE(first.size() == 1); // the read starts with one request
  // The first chunk names the read: two more requests go out (chunks_in_flight).
  wire::pull_reply c0 = r.whole(0, 1.0f);
  c0.params = wire::tensor{1, 1};
  c0.read_id = 42;
  r.m->on_pull_reply(0, first[0].gen, c0);
  auto more = all<step::send_pull>(r.actions());
  REQUIRE(more.size() == 2);
  CHECK(more[0].req.offset == 2);
  CHECK(more[1].req.offset == 4);
  CHECK(more[0].req.read_id == 42);
  wire::pull_reply c1 = c0;
  c1.offset = 2;
  r.m->on_pull_reply(0, first[0].gen, c1);
  auto last = all<step::send_pull>(r.actions()); // one out, one more to ask for
  REQUIRE(last.size() == 1);
  CHECK(last[0].req.offset == 6);
  for (uint64_t off : {4, 6}) {
    wire::pull_reply c = c0;
    c.offset = off;
    r.m->on_pull_reply(0, first[0].gen, c);
  }
  REQUIRE(count<step::compute>(r.actions()) == 1);
  r.compute(1.0f);
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2); // two chunks in flight of four
  CHECK(pushes[0].msg.offset == 0);
  CHECK(pushes[1].msg.offset == 2);
  CHECK(pushes[0].msg.total == 8);
  r.m->on_push_ack(0, pushes[0].gen, pushes[0].floats, {});
  auto next = all<step::send_push>(r.actions());
  REQUIRE(next.size() == 1);
  CHECK(next[0].msg.offset == 4);
}

TEST_CASE("step machine: local steps move the local model and commit their summed gradients") {
  rig r([](wire::assignment& a) {
    a.local_steps = 3;
    a.commit_scale = 0.5f;
  });
  r.m->begin();
  REQUIRE(r.m->mode() == step_mode::local_steps);
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.5f); // a local step: params -= 0.5 x 0.5, no push
  auto acts = r.actions();
  CHECK(count<step::send_push>(acts) == 0);
  CHECK(count<step::report>(acts) == 1);
  CHECK(r.m->params()[0] == Approx(0.75f));
  r.m->on_step(); // the model is local: straight to the compute
  CHECK(count<step::send_pull>(r.actions()) == 0);
  r.compute(0.5f);
  r.actions();
  r.m->on_step();
  r.actions();
  r.compute(1.0f); // the third step commits (0.5 + 0.5 + 1) x 0.5
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  CHECK(pushes[0].msg.grad[0] == Approx(1.0f));
  CHECK(pushes[0].msg.batch_size == 12); // the commit's samples
}

TEST_CASE("step machine: with local momentum a step moves the local model by its velocity, and the commit carries "
          "the summed velocities") {
  rig r([](wire::assignment& a) {
    a.local_steps = 3;
    a.commit_scale = 0.5f;
    a.local_momentum = 0.5f;
  });
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.5f); // velocity 0.5: params 1 - 0.5 x 0.5
  r.actions();
  CHECK(r.m->params()[0] == Approx(0.75f));
  r.m->on_step();
  r.actions();
  r.compute(0.5f); // velocity 0.5 x 0.5 + 0.5 = 0.75: params 0.75 - 0.5 x 0.75
  r.actions();
  CHECK(r.m->params()[0] == Approx(0.375f));
  r.m->on_step();
  r.actions();
  r.compute(1.0f); // velocity 0.375 + 1 = 1.375; the commit (0.5 + 0.75 + 1.375) x 0.5
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  CHECK(pushes[0].msg.grad[0] == Approx(1.3125f));
  // The velocity outlives the commit: the next step after the pull starts from it.
  for (const auto& p : pushes)
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.0f); // velocity 1.375 x 0.5 = 0.6875: params 1 - 0.5 x 0.6875
  r.actions();
  CHECK(r.m->params()[0] == Approx(0.65625f));
}

TEST_CASE("step machine: an overlapped commit's push and pull run behind the next local step") {
  rig r([](wire::assignment& a) {
    a.local_steps = 1;
    a.overlap_commits = true;
  });
  r.m->on_local_steps(2);
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.2f); // local step 1 of 2
  r.actions();
  r.m->on_step();
  r.compute(0.2f); // commit due: its pushes go out and the step ends at once
  auto acts = r.actions();
  auto pushes = all<step::send_push>(acts);
  REQUIRE(pushes.size() == 2);
  CHECK(count<step::report>(acts) == 1);
  CHECK(count<step::next_step>(acts) == 1);
  // The next step computes on the local model while the commit is out.
  r.m->on_step();
  CHECK(count<step::compute>(r.actions()) == 1);
  r.compute(0.1f);
  r.actions();
  // The commit's acks start its pull; the pulled model takes the step made meanwhile.
  for (const auto& p : pushes)
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  auto pulls = r.actions();
  REQUIRE(count<step::send_pull>(pulls) == 2);
  r.answer_pulls(pulls, 3.0f);
  CHECK(r.m->params()[0] == Approx(3.0f - 0.5f * 0.1f));
}

TEST_CASE("step machine: a lost shard suspends the step, stale replies are ignored, the replacement restarts it") {
  rig r([](wire::assignment& a) { a.shard_wait_s = 30; });
  r.m->begin();
  r.actions();
  r.m->on_step();
  auto pulls = all<step::send_pull>(r.actions());
  REQUIRE(pulls.size() == 2);
  r.m->on_request_failed(1, pulls[1].gen, "pull from shard 1 failed: down");
  auto waits = all<step::await_shard>(r.actions());
  REQUIRE(waits.size() == 1);
  CHECK(waits[0].ms == 30000);
  CHECK(r.m->lost() == std::set<size_t>{1});
  // Shard 0's late reply belongs to the abandoned step.
  r.m->on_pull_reply(0, pulls[0].gen, r.whole(0, 1.0f));
  CHECK(r.actions().empty());
  r.m->on_shard_replaced(1);
  CHECK(r.m->generation() == pulls[0].gen + 1);
  REQUIRE(count<step::next_step>(r.actions()) == 1);
  r.m->on_step();
  auto again = all<step::send_pull>(r.actions());
  REQUIRE(again.size() == 2);
  CHECK(again[0].gen == r.m->generation());
  // The old wait's end no longer fails anything.
  r.m->on_shard_wait_over(waits[0].gen);
  CHECK(r.actions().empty());
}

TEST_CASE("step machine: a lost shard not replaced in time fails the worker, naming it") {
  rig r([](wire::assignment& a) { a.shard_wait_s = 2; });
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.actions();
  r.m->on_shard_down(0, "shard 0 was lost");
  auto waits = all<step::await_shard>(r.actions());
  REQUIRE(waits.size() == 1);
  r.m->on_shard_wait_over(waits[0].gen);
  auto fails = all<step::fail>(r.actions());
  REQUIRE(fails.size() == 1);
  CHECK(fails[0].why == "shard 0 was lost and not served again within 2 s");
  CHECK(r.m->stopped());
  // Without a wait allowed, the first trouble fails at once.
  rig now;
  now.m->begin();
  now.actions();
  now.m->on_shard_down(1, "shard 1 was lost (killed)");
  REQUIRE(all<step::fail>(now.actions()).size() == 1);
}

TEST_CASE("step machine: each shard's next read goes right behind the push, and the next step computes on its "
          "reply without a pull, the round's wait counted in the step that waited") {
  rig r;
  r.first_step_computed();
  auto acts = r.m->take_actions();
  // Each push says its read follows, and the read follows it.
  REQUIRE(acts.size() == 4);
  for (size_t i = 0; i < 2; ++i) {
    auto* push = std::get_if<step::send_push>(&acts[2 * i]);
    auto* read = std::get_if<step::send_pull>(&acts[2 * i + 1]);
    REQUIRE(push);
    REQUIRE(read);
    CHECK(push->msg.read_follows);
    CHECK(read->ahead);
    CHECK(read->shard == push->shard);
    CHECK(read->req.offset == 0);
    CHECK(read->req.read_id == 0);
    CHECK(read->req.shard_id == r.a.shards[i].shard_id);
  }
  // The shard answers the read after the round (held 30 ms), then the push.
  r.clock.advance(std::chrono::milliseconds(31));
  for (size_t i = 0; i < 2; ++i) {
    const auto& read = std::get<step::send_pull>(acts[2 * i + 1]);
    auto reply = r.whole(i, 2.0f, 1);
    reply.wait_ns = 30000000;
    r.m->on_read_ahead(read.shard, read.gen, reply);
    CHECK(r.m->take_actions().empty());
    const auto& push = std::get<step::send_push>(acts[2 * i]);
    r.m->on_push_ack(push.shard, push.gen, push.floats, {});
  }
  auto done = r.m->take_actions();
  auto reports = all<step::report>(done);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].rep.push_ns == 1000000); // 31 ms less the round's 30 ms,
  CHECK(reports[0].rep.wait_ns == 30000000); // which this step waited
  REQUIRE(count<step::next_step>(done) == 1);
  r.m->on_step();
  auto next = r.m->take_actions();
  CHECK(count<step::send_pull>(next) == 0); // the reads are here already
  REQUIRE(count<step::compute>(next) == 1);
  CHECK(r.m->params() == std::vector<float>(8, 2.0f));
  r.compute(0.5f);
  auto pushes = all<step::send_push>(r.m->take_actions());
  REQUIRE(pushes.size() == 2);
  CHECK(pushes[0].msg.base_version == 1);
  for (const auto& p : pushes)
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  auto second = all<step::report>(r.m->take_actions());
  REQUIRE(second.size() == 1);
  CHECK(second[0].rep.wait_ns == 0); // counted once, in the step that waited for it
  CHECK(second[0].rep.pull_ns == 0);
}

TEST_CASE("step machine: a step that begins before its reads sent ahead came waits for them, and one of an "
          "abandoned step is dropped") {
  rig r([](wire::assignment& a) { a.shard_wait_s = 30; });
  r.first_step_computed();
  auto acts = r.m->take_actions();
  auto reads = all<step::send_pull>(acts);
  REQUIRE(reads.size() == 2);
  for (const auto& p : all<step::send_push>(acts)) // acknowledged before the reads are answered
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  REQUIRE(count<step::next_step>(r.m->take_actions()) == 1);
  r.m->on_step();
  CHECK(r.m->take_actions().empty()); // nothing to send: both reads are out
  r.m->on_read_ahead(0, reads[0].gen, r.whole(0, 3.0f, 1));
  CHECK(r.m->take_actions().empty());
  r.m->on_read_ahead(1, reads[1].gen, r.whole(1, 3.0f, 1));
  REQUIRE(count<step::compute>(r.m->take_actions()) == 1);
  CHECK(r.m->params() == std::vector<float>(8, 3.0f));
  // Shard 1 is lost while this step's reads ahead are out: the step starts over with a
  // fresh pull, and the old reads' replies are dropped.
  r.compute(0.25f);
  auto second = r.m->take_actions();
  auto reads2 = all<step::send_pull>(second);
  REQUIRE(reads2.size() == 2);
  r.m->on_shard_down(1, "shard 1 was lost");
  r.m->take_actions();
  r.m->on_shard_replaced(1);
  REQUIRE(count<step::next_step>(r.m->take_actions()) == 1);
  r.m->on_step();
  auto fresh = all<step::send_pull>(r.m->take_actions());
  REQUIRE(fresh.size() == 2);
  CHECK_FALSE(fresh[0].ahead);
  r.m->on_read_ahead(0, reads2[0].gen, r.whole(0, 9.0f, 2)); // of the abandoned step
  r.m->on_read_ahead(1, reads2[1].gen, r.whole(1, 9.0f, 2));
  CHECK(r.m->take_actions().empty());
  r.m->on_pull_reply(0, fresh[0].gen, r.whole(0, 4.0f, 2));
  r.m->on_pull_reply(1, fresh[1].gen, r.whole(1, 4.0f, 2));
  REQUIRE(count<step::compute>(r.m->take_actions()) == 1);
  CHECK(r.m->params() == std::vector<float>(8, 4.0f));
}

TEST_CASE("step machine: no read goes ahead on the last step, once asked to stop, with delta reads, or with "
          "local steps") {
  auto reads_after_push = [](rig& r, const std::function<void()>& before = {}) {
    r.first_step_computed(before);
    auto acts = r.m->take_actions();
    size_t n = 0;
    for (const auto& p : all<step::send_pull>(acts))
      n += p.ahead;
    for (const auto& p : all<step::send_push>(acts))
      CHECK(p.msg.read_follows == (n > 0));
    return std::make_pair(count<step::send_push>(acts), n);
  };
  using pushes_reads = std::pair<size_t, size_t>;
  rig plain;
  CHECK(reads_after_push(plain) == pushes_reads{2, 2});
  rig last([](wire::assignment& a) { a.steps = 1; });
  CHECK(reads_after_push(last) == pushes_reads{2, 0});
  rig stopping;
  CHECK(reads_after_push(stopping, [&] { stopping.m->on_stop(); }) == pushes_reads{0, 0}); // (nor a push)
  rig delta([](wire::assignment& a) { a.pull_topk_ratio = 0.5f; });
  CHECK(reads_after_push(delta) == pushes_reads{2, 0});
  rig local; // a stage of local steps, a commit every step: pushed, then pulled as its own phase
  CHECK(reads_after_push(local, [&] { local.m->on_stage("coarse", 1, 1.0f, 0.0f); }) == pushes_reads{2, 0});
  CHECK(local.m->mode() == step_mode::local_steps);
}

TEST_CASE("step machine: a paced worker waits out its budget less what it owes, on the clock it is given") {
  rig r([](wire::assignment& a) { a.pace_ns_per_sample = 5000000; }); // 5 ms a sample: 20 ms a batch
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.1f, 3); // 3 ms of compute: 17 ms to wait
  auto paces = all<step::pace>(r.actions());
  REQUIRE(paces.size() == 1);
  CHECK(paces[0].ns == 17000000);
  r.clock.advance(std::chrono::milliseconds(17));
  r.m->on_paced(paces[0].gen);
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  for (const auto& p : pushes)
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  auto reports = all<step::report>(r.actions());
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].rep.compute_ns == 20000000); // the budget, not the 3 ms
  // The host took 4 ms more than the step reported before the next began: the next
  // step's wait gives them back.
  r.clock.advance(std::chrono::milliseconds(4));
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(0.1f, 3);
  paces = all<step::pace>(r.actions());
  REQUIRE(paces.size() == 1);
  CHECK(paces[0].ns == 13000000);
}

TEST_CASE("step machine: delta reads update the view the shard keeps, and a ring of one applies its own gradient") {
  rig r([](wire::assignment& a) { a.pull_topk_ratio = 0.5f; });
  r.m->begin();
  r.actions();
  r.m->on_step();
  auto pulls = all<step::send_pull>(r.actions());
  REQUIRE(pulls.size() == 2);
  CHECK(pulls[0].req.topk_ratio == 0.5f);
  CHECK(pulls[0].req.view_seq == 0); // no view yet: the shard answers densely, starting one
  for (const auto& p : pulls) {
    auto rep = r.whole(p.shard, 1.0f);
    rep.view_seq = 11;
    r.m->on_pull_reply(p.shard, p.gen, rep);
  }
  r.actions();
  r.compute(0.0f);
  for (const auto& p : all<step::send_push>(r.actions()))
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  r.actions();
  r.m->on_step();
  pulls = all<step::send_pull>(r.actions());
  REQUIRE(pulls.size() == 2);
  CHECK(pulls[0].req.view_seq == 11);
  wire::pull_reply delta;
  delta.shard_id = 0;
  delta.begin = 0;
  delta.total = 5;
  delta.sparse = true;
  delta.index = {1, 3};
  delta.params = wire::tensor{9, 8};
  delta.view_seq = 12;
  r.m->on_pull_reply(0, pulls[0].gen, delta);
  CHECK(r.m->params()[1] == 9.0f);
  CHECK(r.m->params()[2] == 1.0f); // unchanged: the view's copy
  CHECK(r.m->params()[3] == 8.0f);
  // A delta read with an index outside the range fails the worker.
  wire::pull_reply bad = delta;
  bad.index = {7};
  bad.params = wire::tensor{1};
  r.m->on_pull_reply(1, pulls[1].gen, bad);
  auto fails = all<step::fail>(r.actions());
  REQUIRE(fails.size() == 1);
  CHECK(fails[0].why.find("sent a delta read") != std::string::npos);

  rig ring([](wire::assignment& a) { a.policy = "ring"; });
  ring.m->begin();
  REQUIRE(ring.m->mode() == step_mode::ring);
  ring.actions();
  ring.m->on_step();
  ring.answer_pulls(ring.actions(), 1.0f); // the first step pulls the model
  ring.actions();
  ring.compute(0.5f);
  CHECK(ring.actions().empty()); // waits for the ring
  ring.m->on_ring(1, 0, 1);
  auto acts = ring.actions();
  // Rank 0 of a ring of one: applies lr x gradient and mirrors the update to the shards.
  CHECK(ring.m->params()[0] == Approx(1.0f - 0.5f * 0.5f));
  auto pushes = all<step::send_push>(acts);
  REQUIRE(pushes.size() == 2);
  CHECK(pushes[0].msg.grad[0] == Approx(0.25f));
}

TEST_CASE("step machine: a step whose loss is not finite drops the worker's momentum, so it pushes zero") {
  rig r([](wire::assignment& a) { a.local_momentum = 0.5f; });
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.compute(1.0f); // velocity 1, pushed
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  CHECK(pushes[0].msg.grad[0] == Approx(1.0f));
  for (const auto& p : pushes)
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  r.actions();
  r.m->on_computed(make_error(errc::numerical_error, "training loss is not finite"));
  auto paces = all<step::pace>(r.actions());
  REQUIRE(paces.size() == 1);
  r.m->on_paced(paces[0].gen);
  pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  for (const auto& p : pushes)
    CHECK(std::all_of(p.msg.grad.begin(), p.msg.grad.end(), [](float g) { return g == 0.0f; }));
}

TEST_CASE("step machine: a step whose loss is not finite waits a tenth of a second, pushes a zero gradient and "
          "reports the loss, and the worker goes on") {
  rig r;
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  REQUIRE(count<step::compute>(r.actions()) == 1);
  std::fill(r.m->grad().begin(), r.m->grad().end(), 1e30f);
  r.m->on_computed(make_error(errc::numerical_error, "training loss is not finite (lr too high?)"));
  auto acts = r.actions();
  auto paces = all<step::pace>(acts);
  REQUIRE(paces.size() == 1);
  CHECK(paces[0].ns == 100'000'000);
  CHECK(count<step::send_push>(acts) == 0);
  r.m->on_paced(paces[0].gen);
  auto pushes = all<step::send_push>(r.actions());
  REQUIRE(pushes.size() == 2);
  for (const auto& p : pushes) {
    CHECK(std::all_of(p.msg.grad.begin(), p.msg.grad.end(), [](float g) { return g == 0.0f; }));
    r.m->on_push_ack(p.shard, p.gen, p.floats, {});
  }
  acts = r.actions();
  auto reports = all<step::report>(acts);
  REQUIRE(reports.size() == 1);
  CHECK(std::isnan(reports[0].rep.loss));
  CHECK(count<step::next_step>(acts) == 1);
  // Any other failure of the computation still ends the worker.
  rig other;
  other.m->begin();
  other.actions();
  other.m->on_step();
  other.answer_pulls(other.actions(), 1.0f);
  other.actions();
  other.m->on_computed(make_error(errc::device_error, "cudaMemcpy failed"));
  CHECK(count<step::fail>(other.actions()) == 1);
}

namespace {

// Runs machine `m` to its end with backend `b`: pulls answered at once (the k-th pull's
// every parameter 0.1 x k, the same sequence for any machine), pushes acknowledged at
// once, pacing over at once, the next step once the actions before it are done (as the
// worker's mailbox orders them). Computes as the worker does: a held step through
// local_step, a commit taken through take_commit, a landed pull through rebase.
struct drive_result {
  std::vector<wire::tensor> pushes;
  size_t loads = 0, held_steps = 0, host_steps = 0, pulls = 0;
};

// `script(m, event, computes)` runs at each pacing wait ("pace", before it ends) and before
// each step ("step"), with the steps computed so far: a test's plans arrive there.
using drive_script = std::function<void(step_machine&, const char*, size_t)>;

drive_result drive(rig& r, compute_backend& b, const drive_script& script = {}) {
  drive_result out;
  size_t computes = 0;
  size_t pull_rounds = 0;
  r.m->begin();
  bool done = false, step_due = false;
  for (int guard = 0; !done && guard < 100000; ++guard) {
    auto acts = r.actions();
    if (acts.empty()) {
      if (!step_due)
        break;
      step_due = false; // the next step comes through the mailbox, after the actions before it
      if (script)
        script(*r.m, "step", computes);
      r.m->on_step();
      continue;
    }
    bool new_round = true;
    for (auto& act : acts) {
      if (auto* p = std::get_if<step::send_pull>(&act)) {
        if (new_round) {
          ++pull_rounds;
          new_round = false;
        }
        ++out.pulls;
        const auto reply = r.whole(p->shard, 0.1f * static_cast<float>(pull_rounds));
        if (p->ahead)
          r.m->on_read_ahead(p->shard, p->gen, reply);
        else
          r.m->on_pull_reply(p->shard, p->gen, reply);
      } else if (auto* s = std::get_if<step::send_push>(&act)) {
        out.pushes.emplace_back(s->msg.grad.begin(), s->msg.grad.end());
        r.m->on_push_ack(s->shard, s->gen, s->floats, {});
      } else if (auto* c = std::get_if<step::compute>(&act)) {
        ++computes;
        if (c->fetch_velocity)
          REQUIRE_FALSE(b.take_commit(nullptr, 1.0f, c->fetch_velocity));
        if (c->held) {
          ++out.held_steps;
          out.loads += c->load != nullptr;
          r.m->on_computed(b.local_step(c->load, c->velocity, c->commit, c->batch, c->lr, c->momentum));
        } else {
          ++out.host_steps;
          r.m->on_computed(b.train_step(r.m->params().data(), c->batch, r.m->grad().data()));
        }
      } else if (auto* t = std::get_if<step::take_commit>(&act)) {
        r.m->on_commit_taken(b.take_commit(t->out, t->scale, t->velocity_out));
      } else if (auto* rb = std::get_if<step::rebase>(&act)) {
        REQUIRE_FALSE(b.rebase(rb->pulled, rb->lr));
      } else if (auto* pc = std::get_if<step::pace>(&act)) {
        if (script)
          script(*r.m, "pace", computes);
        r.m->on_paced(pc->gen);
      } else if (std::holds_alternative<step::next_step>(act)) {
        step_due = true;
      } else if (auto* f = std::get_if<step::fail>(&act)) {
        FAIL(f->why);
      } else if (std::holds_alternative<step::finish>(act)) {
        done = true;
      }
    }
  }
  REQUIRE(done);
  return out;
}

// The rig's model: 3 inputs, 2 classes, one dense layer (8 parameters).
model_spec rig_model() {
  mlp_spec m;
  m.input = 3;
  m.hidden = {};
  m.classes = 2;
  return from_mlp(m);
}

}  // namespace

TEST_CASE("step machine: where the backend keeps the local model, it gets the model after each pull and gives each "
          "commit, and the pushes are those of local steps on the worker's side, bit for bit") {
  for (bool overlap : {false, true}) {
    auto tune = overlap ? +[](wire::assignment& a) {
      a.local_steps = 3;
      a.commit_scale = 0.5f;
      a.local_momentum = 0.5f;
      a.overlap_commits = true;
      a.steps = 11;
    }
                        : +[](wire::assignment& a) {
                            a.local_steps = 3;
                            a.commit_scale = 0.5f;
                            a.local_momentum = 0.5f;
                            a.steps = 11;
                          };
    INFO("overlapped commits: " << overlap);
    auto cpu = make_cpu_backend(rig_model());
    REQUIRE(cpu);
    rig host(tune);
    const auto on_host = drive(host, **cpu);
    CHECK(on_host.held_steps == 0);
    auto kept = hold_local_model(std::move(*cpu));
    rig held(tune);
    held.m->set_model_held(true);
    const auto on_device = drive(held, *kept);
    CHECK(on_device.host_steps == 0);
    CHECK(on_device.held_steps == 11);
    // The model goes to the backend once per pull into the working model: not between
    // local steps (and, with overlapped commits, not after the commit's pull either,
    // which the backend applies itself).
    CHECK(on_device.loads == (overlap ? 1u : 4u));
    REQUIRE(on_host.pushes.size() == on_device.pushes.size());
    CHECK(on_host.pushes.size() == 8); // 4 commits of 2 shards
    for (size_t i = 0; i < on_host.pushes.size(); ++i)
      CHECK(on_host.pushes[i] == on_device.pushes[i]);
  }
}

TEST_CASE("a backend that keeps no local model refuses the calls, naming itself") {
  auto cpu = make_cpu_backend(rig_model());
  REQUIRE(cpu);
  CHECK_FALSE((*cpu)->keeps_local_model());
  std::vector<float> out(8);
  auto err = (*cpu)->take_commit(out.data(), 1.0f, nullptr);
  REQUIRE(err);
  CHECK(describe(err).find("backend cpu keeps no local model") != std::string::npos);
}

namespace {

// The pushes of a machine tuned by `tune` and driven by `script`, on the worker's side and
// with a backend that keeps the model (a fresh one, or `kept` if given); both must match
// bit for bit. Returns the held run's counts.
drive_result same_pushes(void (*tune)(wire::assignment&), const drive_script& script,
                         compute_backend* kept = nullptr) {
  auto cpu = make_cpu_backend(rig_model());
  REQUIRE(cpu);
  rig host(tune);
  const auto on_host = drive(host, **cpu, script);
  auto fresh = hold_local_model(std::move(*cpu));
  rig held(tune);
  held.m->set_model_held(true);
  const auto on_device = drive(held, kept ? *kept : *fresh, script);
  REQUIRE(on_host.pushes.size() == on_device.pushes.size());
  CHECK_FALSE(on_host.pushes.empty());
  for (size_t i = 0; i < on_host.pushes.size(); ++i)
    CHECK(on_host.pushes[i] == on_device.pushes[i]);
  return on_device;
}

void paced_local_steps(wire::assignment& a) {
  a.local_steps = 1; // every step a commit, until the plan below
  a.commit_scale = 0.5f;
  a.local_momentum = 0.5f;
  a.pace_ns_per_sample = 1000000;
  a.steps = 12;
}

// Commits of 3 local steps at half weight, with the workers' own momentum 0.5.
template <uint64_t Steps>
void three_local_steps(wire::assignment& a) {
  a.local_steps = 3;
  a.commit_scale = 0.5f;
  a.local_momentum = 0.5f;
  a.steps = Steps;
}

}  // namespace

TEST_CASE("step machine: a backend that keeps the model gets a new worker's model, velocity and commit afresh: "
          "what an earlier worker left there (a velocity, a commit dropped by a stop) does not leak") {
  auto tune = &three_local_steps<8>;
  auto cpu = make_cpu_backend(rig_model());
  REQUIRE(cpu);
  auto shared = hold_local_model(std::move(*cpu));
  // An earlier worker on the same backend: stopped between steps with 2 local steps of an
  // open commit (and a velocity) left in the backend.
  rig earlier(tune);
  earlier.m->set_model_held(true);
  drive(earlier, *shared, [](step_machine& m, const char* event, size_t computes) {
    if (std::string{event} == "step" && computes == 5)
      m.on_stop();
  });
  same_pushes(tune, {}, shared.get());
}

TEST_CASE("step machine: local steps that begin while a step on the worker's side waits out its pacing take that "
          "step's update along to the backend, and the pushes stay those of the worker's side") {
  auto r = same_pushes(&paced_local_steps, [](step_machine& m, const char* event, size_t computes) {
    if (std::string{event} == "pace" && computes == 3)
      m.on_local_steps(3); // ADSP's plan arrives during step 3's pacing
  });
  CHECK(r.host_steps == 3);
  CHECK(r.held_steps == 9);
}

TEST_CASE("step machine: steps on the worker's side after steps on the backend's go on from the backend's "
          "velocity") {
  auto r = same_pushes(
    &three_local_steps<12>,
    [](step_machine& m, const char* event, size_t computes) {
      if (std::string{event} == "step" && computes == 6) // right after the second commit
        m.on_stage("profiling", 1, 1.0f, 0.0f);
    });
  CHECK(r.held_steps == 6);
  CHECK(r.host_steps == 6);
}

TEST_CASE("step machine: with overlapped commits where the backend keeps the model, a committing step is reported "
          "once its pushes are out, with their bytes") {
  auto tune = +[](wire::assignment& a) {
    a.local_steps = 2;
    a.overlap_commits = true;
    a.steps = 2;
  };
  auto cpu = make_cpu_backend(rig_model());
  REQUIRE(cpu);
  auto kept = hold_local_model(std::move(*cpu));
  rig r(tune);
  r.m->set_model_held(true);
  r.m->begin();
  r.actions();
  r.m->on_step();
  r.answer_pulls(r.actions(), 1.0f);
  auto step1 = all<step::compute>(r.actions());
  REQUIRE(step1.size() == 1);
  r.m->on_computed(kept->local_step(step1[0].load, step1[0].velocity, step1[0].commit, step1[0].batch, step1[0].lr,
                                    step1[0].momentum));
  r.actions();
  r.m->on_step();
  auto step2 = all<step::compute>(r.actions());
  REQUIRE(step2.size() == 1);
  r.m->on_computed(kept->local_step(nullptr, nullptr, nullptr, step2[0].batch, step2[0].lr, step2[0].momentum));
  auto acts = r.actions(); // the commit is due: taken first, the step not yet reported
  auto takes = all<step::take_commit>(acts);
  REQUIRE(takes.size() == 1);
  CHECK(count<step::report>(acts) == 0);
  r.m->on_commit_taken(kept->take_commit(takes[0].out, takes[0].scale, takes[0].velocity_out));
  acts = r.actions();
  CHECK(count<step::send_push>(acts) == 2);
  auto reports = all<step::report>(acts);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].rep.bytes == 8 * sizeof(float)); // the commit's pushes, dense
}

namespace {

// Members of a ring, each a step machine of its own, and the chunks between them: what
// one sends goes to the next rank's inbox; deliver() hands them over one by one, except
// those `hold` keeps back (a lost member's, or chunks stuck behind it).
struct ring_rig {
  std::vector<std::unique_ptr<rig>> members; // by worker id
  std::vector<uint32_t> order;               // the ring: worker ids by rank
  struct chunk {
    uint32_t to;
    wire::ring_message msg;
  };
  std::deque<chunk> wire_;
  std::vector<std::vector<step_action>> pending; // actions not yet acted on, by worker id

  explicit ring_rig(uint32_t n) {
    for (uint32_t id = 0; id < n; ++id) {
      auto r = std::make_unique<rig>([](wire::assignment& a) {
        a.policy = "ring";
        a.momentum = 0.9f;
        a.steps = 100;
      });
      r->a.worker_id = id;
      r->m = std::make_unique<step_machine>(r->a, r->data, 8, r->clock);
      members.push_back(std::move(r));
    }
    pending.resize(n);
  }
  step_machine& m(uint32_t id) { return *members[id]->m; }

  void form(uint32_t generation, std::vector<uint32_t> ids) {
    order = std::move(ids);
    for (uint32_t r = 0; r < order.size(); ++r)
      m(order[r]).on_ring(generation, r, static_cast<uint32_t>(order.size()));
  }
  uint32_t next_of(uint32_t id) const {
    for (size_t r = 0; r < order.size(); ++r)
      if (order[r] == id)
        return order[(r + 1) % order.size()];
    return id;
  }

  // Takes every member's new actions: ring chunks onto the wire, the rest kept.
  void collect() {
    for (uint32_t id = 0; id < members.size(); ++id)
      for (auto& act : members[id]->actions()) {
        if (auto* c = std::get_if<step::ring_send>(&act))
          wire_.push_back({next_of(id), c->msg});
        else
          pending[id].push_back(std::move(act));
      }
  }

  // Delivers chunks until none is left but those `hold` keeps back.
  template <class Hold>
  void deliver(Hold hold) {
    collect();
    for (bool moved = true; moved;) {
      moved = false;
      for (auto it = wire_.begin(); it != wire_.end(); ++it)
        if (!hold(*it)) {
          auto c = std::move(*it);
          wire_.erase(it);
          m(c.to).on_ring_message(std::move(c.msg));
          collect();
          moved = true;
          break;
        }
    }
  }
  void deliver() {
    deliver([](const chunk&) { return false; });
  }

  template <class T>
  std::vector<T> take(uint32_t id) {
    std::vector<T> out;
    auto& p = pending[id];
    for (auto it = p.begin(); it != p.end();)
      if (auto* x = std::get_if<T>(&*it)) {
        out.push_back(*x);
        it = p.erase(it);
      } else {
        ++it;
      }
    return out;
  }

  // Answers member id's pushes (the mirror) with acknowledgements, and its step's end.
  std::vector<step::send_push> ack_pushes(uint32_t id) {
    auto pushes = take<step::send_push>(id);
    for (const auto& p : pushes)
      m(id).on_push_ack(p.shard, p.gen, p.floats, {});
    collect();
    return pushes;
  }
  // A compute asked of member id: its gradient, all `g`.
  void compute(uint32_t id, float g) {
    REQUIRE(take<step::compute>(id).size() == 1);
    members[id]->compute(g);
    collect();
  }
  void next_step(uint32_t id) {
    REQUIRE(!take<step::next_step>(id).empty());
    m(id).on_step();
    collect();
  }
  // Answers member id's read of both shards: every parameter `value`.
  void answer_pulls(uint32_t id, float value) {
    auto pulls = take<step::send_pull>(id);
    REQUIRE(pulls.size() == 2);
    for (const auto& p : pulls)
      m(id).on_pull_reply(p.shard, p.gen, members[id]->whole(p.shard, value));
    collect();
  }
  // Member id begins: its first step pulls the model (every parameter `value`).
  void start(uint32_t id, float value = 1.0f) {
    m(id).begin();
    collect();
    next_step(id);
    answer_pulls(id, value);
  }
};

}  // namespace

TEST_CASE("step machine: a ring that lost a member halfway through an all-reduce re-forms, the members agree on the state of the furthest, and rank 0 sets the shards' mirror to it") {
  ring_rig ring(3);
  for (uint32_t id = 0; id < 3; ++id)
    ring.start(id); // the first step pulls the model
  ring.form(1, {0, 1, 2});
  // Step 0, whole: every member applies the same update; rank 0 mirrors it.
  for (uint32_t id = 0; id < 3; ++id)
    ring.compute(id, 0.3f * static_cast<float>(id + 1));
  ring.deliver();
  CHECK(ring.ack_pushes(0).size() == 2);
  for (uint32_t id = 0; id < 3; ++id) {
    CHECK(ring.m(id).steps_done() == 1);
    CHECK(ring.m(id).params() == ring.m(0).params());
    ring.next_step(id);
  }
  // Step 1: worker 2 is lost in the all-gather. Worker 0 has every chunk and applies
  // the step; worker 1's last chunk never comes.
  for (uint32_t id = 0; id < 3; ++id)
    ring.compute(id, 0.1f * static_cast<float>(id + 1));
  ring.deliver([](const ring_rig::chunk& c) { return c.to == 1 && c.msg.step == 3; });
  CHECK(ring.ack_pushes(0).size() == 2); // step 1's update, mirrored
  CHECK(ring.m(0).steps_done() == 2);
  CHECK(ring.m(1).steps_done() == 1); // still in step 1's all-reduce
  ring.next_step(0);
  const auto furthest = ring.m(0).params();
  CHECK(furthest != ring.m(1).params());

  // The ring of the two left: worker 0 computes its step 2 gradient meanwhile.
  ring.wire_.clear(); // what the lost member sent or would have received
  ring.form(2, {0, 1});
  ring.compute(0, 0.2f);
  ring.deliver(); // the sync: steps, then worker 0's state
  CHECK(ring.m(1).params() == furthest);
  CHECK(ring.m(1).steps_done() == 2);
  // Worker 1's step 1 is in that state: it is reported with its batch's samples (the
  // job's count and the handover's ledger take them from the reports), and its next step
  // starts as any does.
  auto reports = ring.take<step::report>(1);
  REQUIRE(reports.size() == 2);
  CHECK(reports.back().rep.step == 1);
  CHECK(reports.back().rep.samples == reports.front().rep.samples);
  CHECK(reports.back().rep.samples > 0);
  ring.next_step(1);
  // Rank 0 reads the mirror (as if the lost member's half-pushed update left it off by
  // 0.5 everywhere) and pushes what differs; its model stays.
  auto pulls = ring.take<step::send_pull>(0);
  REQUIRE(pulls.size() == 2);
  for (const auto& p : pulls) {
    auto rep = ring.members[0]->whole(p.shard, 0.0f);
    std::vector<float> off(furthest.begin() + static_cast<std::ptrdiff_t>(rep.begin),
                           furthest.begin() + static_cast<std::ptrdiff_t>(rep.begin + rep.total));
    for (auto& x : off)
      x += 0.5f;
    rep.params = wire::tensor(off.begin(), off.end());
    ring.m(0).on_pull_reply(p.shard, p.gen, rep);
  }
  ring.collect();
  auto fix = ring.ack_pushes(0);
  REQUIRE(fix.size() == 2);
  for (const auto& p : fix)
    for (float g : p.msg.grad)
      CHECK(g == Approx(0.5f)); // the shards take params -= 0.5: the model again
  CHECK(ring.m(0).params() == furthest);
  // Both compute step 2 on the agreed model and all-reduce it in the new ring.
  ring.compute(0, 0.2f);
  ring.compute(1, 0.4f);
  ring.deliver();
  ring.ack_pushes(0);
  CHECK(ring.m(0).steps_done() == 3);
  CHECK(ring.m(1).steps_done() == 3);
  CHECK(ring.m(0).params() == ring.m(1).params());
  CHECK(ring.m(0).params() != furthest);
  CHECK(ring.take<step::fail>(0).empty());
  CHECK(ring.take<step::fail>(1).empty());
}

TEST_CASE("step machine: chunks of a ring re-formed since are dropped, and a newer ring's wait for the worker's place on it") {
  ring_rig ring(2);
  for (uint32_t id = 0; id < 2; ++id)
    ring.start(id);
  ring.form(1, {0, 1});
  ring.compute(0, 0.5f);
  ring.compute(1, 0.5f);
  ring.collect();
  // An old ring's chunk, after the worker learned of generation 2: dropped, no failure.
  auto old_chunk = ring.wire_.front().msg;
  ring.wire_.clear();
  ring.m(1).on_ring(2, 1, 2);
  ring.m(1).on_ring_message(old_chunk);
  ring.collect();
  CHECK(ring.take<step::fail>(1).empty());
  // Worker 1 started generation 2's sync; its chunk reaches worker 0 before worker 0
  // learns of the new ring: kept until it does, then used.
  REQUIRE(ring.wire_.size() == 1);
  CHECK(ring.wire_.front().msg.ring == 2);
  CHECK(ring.wire_.front().msg.sync == 1);
  ring.deliver();
  CHECK(ring.take<step::fail>(0).empty());
  ring.m(0).on_ring(2, 0, 2);
  ring.deliver();
  // Both at step 0: no one is behind, rank 0 still reads the mirror before going on.
  ring.answer_pulls(0, 1.0f);
  for (const auto& p : ring.ack_pushes(0))
    for (float g : p.msg.grad)
      CHECK(g == 0.0f);
  ring.compute(0, 0.5f);
  ring.deliver();
  ring.ack_pushes(0);
  CHECK(ring.m(0).steps_done() == 1);
  CHECK(ring.m(1).steps_done() == 1);
  CHECK(ring.m(0).params() == ring.m(1).params());
  // A place outside the ring is refused.
  ring.m(1).on_ring(3, 5, 2);
  ring.collect();
  auto fails = ring.take<step::fail>(1);
  REQUIRE(fails.size() == 1);
  CHECK(fails[0].why == "the scheduler placed this worker at rank 5 of a ring of 2");
}

TEST_CASE("step machine: a ring member asked to leave votes in its last all-reduce and leaves after it, and the others wait for the ring formed without it") {
  ring_rig ring(5);
  for (uint32_t id = 0; id < 5; ++id)
    ring.start(id);
  ring.form(1, {0, 1, 2, 3, 4});
  for (uint32_t id : {0u, 1u, 2u, 3u})
    ring.compute(id, 0.1f * static_cast<float>(id + 1));
  ring.m(4).on_stop(); // removed on request while it computes
  ring.compute(4, 0.5f);
  ring.deliver();
  ring.ack_pushes(0);
  // Its gradient counted: every member applied the same update, worker 4's step included.
  for (uint32_t id = 0; id < 5; ++id) {
    CHECK(ring.m(id).steps_done() == 1);
    CHECK(ring.m(id).params() == ring.m(0).params());
    CHECK(ring.take<step::fail>(id).empty());
  }
  const auto model = ring.m(0).params();
  ring.next_step(4);
  auto left = ring.take<step::finish>(4);
  REQUIRE(left.size() == 1);
  CHECK(left[0].early);
  CHECK(left[0].reason == "stopped on request after 1 steps");
  // The others compute their next step but start no all-reduce on the old ring.
  for (uint32_t id : {0u, 1u, 2u, 3u})
    ring.next_step(id);
  ring.m(3).on_stop(); // asked to leave while it computes: no ring to vote in, it goes after its compute
  for (uint32_t id : {0u, 1u, 2u, 3u})
    ring.compute(id, 0.2f);
  CHECK(ring.wire_.empty());
  left = ring.take<step::finish>(3);
  REQUIRE(left.size() == 1);
  CHECK(left[0].early);
  // Worker 2 is asked to leave while it waits: it goes at once.
  ring.m(2).on_stop();
  ring.collect();
  left = ring.take<step::finish>(2);
  REQUIRE(left.size() == 1);
  CHECK(left[0].early);
  // Workers 0 and 1 on the ring formed without them: each tells how far it got; at the
  // same all-reduce, their models are the same, so none is shared (no second sync round).
  ring.form(2, {0, 1});
  bool shared = false;
  ring.deliver([&](const ring_rig::chunk& c) {
    shared = shared || c.msg.sync == 2;
    return false;
  });
  CHECK_FALSE(shared);
  // Rank 0 reads the mirror (here it matches) and computes again; both step on the model they had.
  ring.answer_pulls(0, 1.0f);
  ring.ack_pushes(0);
  CHECK(ring.m(0).params() == model);
  CHECK(ring.m(1).params() == model);
  ring.compute(0, 0.2f);
  ring.deliver();
  ring.ack_pushes(0);
  for (uint32_t id : {0u, 1u}) {
    CHECK(ring.m(id).steps_done() == 2);
    CHECK(ring.m(id).params() == ring.m(0).params());
    CHECK(ring.take<step::fail>(id).empty());
    CHECK(ring.take<step::finish>(id).empty());
  }
  CHECK(ring.m(0).params() != model);
}

TEST_CASE("step machine: ring members apply rank 0's learning-rate factor, so a schedule's change that reaches them between different steps leaves the replicas the same") {
  ring_rig ring(2);
  for (uint32_t id = 0; id < 2; ++id)
    ring.start(id);
  ring.form(1, {0, 1});
  ring.m(1).on_lr(0.5f); // the change has reached worker 1, not yet worker 0
  ring.compute(0, 0.2f);
  ring.compute(1, 0.2f);
  ring.deliver();
  ring.ack_pushes(0);
  CHECK(ring.m(0).params() == ring.m(1).params());
  // Rank 0's factor, 1: the step lr x 0.2 from every parameter at 1.
  const float lr = ring.members[0]->a.local_lr;
  for (float p : ring.m(1).params())
    CHECK(p == Approx(1.0f - lr * 0.2f));
  ring.next_step(0);
  ring.next_step(1);
  ring.m(0).on_lr(0.5f); // now both have it
  ring.compute(0, 0.2f);
  ring.compute(1, 0.2f);
  ring.deliver();
  CHECK(ring.m(0).params() == ring.m(1).params());
}

TEST_CASE("step machine: a worker that joins a running ring takes up the model and velocity of its members before its first all-reduce") {
  ring_rig ring(3);
  for (uint32_t id = 0; id < 2; ++id)
    ring.start(id);
  ring.form(1, {0, 1});
  for (int step = 0; step < 3; ++step) { // three steps of a ring of two
    ring.compute(0, 0.2f);
    ring.compute(1, 0.4f);
    ring.deliver();
    ring.ack_pushes(0);
    ring.next_step(0);
    ring.next_step(1);
  }
  const auto model = ring.m(0).params();
  // Worker 2 joins: its first step pulls the shards' mirror (here stale: all 1) and
  // computes on it, then waits for its place on a ring.
  ring.start(2);
  ring.compute(2, 0.9f);
  ring.form(2, {0, 1, 2});
  ring.compute(0, 0.2f);
  ring.compute(1, 0.4f);
  ring.deliver(); // the sync
  CHECK(ring.m(2).params() == model);
  CHECK(ring.m(2).steps_done() == 0); // its own count: it joined, it skipped nothing
  ring.answer_pulls(0, 0.0f); // rank 0's read of the mirror
  ring.ack_pushes(0);
  ring.compute(0, 0.2f); // rank 0 computes again after the mirror's fix
  ring.compute(2, 0.6f); // the newcomer on the model it took up
  ring.deliver();
  ring.ack_pushes(0);
  for (uint32_t id = 0; id < 3; ++id) {
    CHECK(ring.take<step::fail>(id).empty());
    CHECK(ring.m(id).params() == ring.m(0).params());
  }
  CHECK(ring.m(0).params() != model);
  CHECK(ring.m(0).steps_done() == 4);
  CHECK(ring.m(2).steps_done() == 1);
}

TEST_CASE("step machine: a ring trains on while a shard of its mirror is lost, and rank 0 sets the mirror to the model once it is back") {
  ring_rig ring(2);
  for (uint32_t id = 0; id < 2; ++id) {
    ring.members[id]->a.shard_wait_s = 30;
    ring.members[id]->m = std::make_unique<step_machine>(ring.members[id]->a, ring.members[id]->data, 8,
                                                         ring.members[id]->clock);
    ring.start(id);
  }
  ring.form(1, {0, 1});
  ring.compute(0, 0.2f);
  ring.compute(1, 0.4f);
  ring.deliver();
  // Rank 0's push of the step's update: shard 1's part fails (its node died).
  auto pushes = ring.take<step::send_push>(0);
  REQUIRE(pushes.size() == 2);
  ring.m(0).on_push_ack(pushes[0].shard, pushes[0].gen, pushes[0].floats, {});
  ring.m(0).on_request_failed(pushes[1].shard, pushes[1].gen, "push to shard 1 failed: down");
  ring.m(1).on_shard_down(1, "shard 1 was lost");
  ring.collect();
  for (uint32_t id = 0; id < 2; ++id) {
    CHECK(ring.take<step::fail>(id).empty());
    CHECK(ring.m(id).steps_done() == 1);
    ring.next_step(id);
  }
  // The next step: the ring goes on; rank 0 pushes nothing while the shard is missing.
  ring.compute(0, 0.2f);
  ring.compute(1, 0.4f);
  ring.deliver();
  CHECK(ring.take<step::send_push>(0).empty());
  CHECK(ring.m(0).steps_done() == 2);
  CHECK(ring.m(1).steps_done() == 2);
  CHECK(ring.m(0).params() == ring.m(1).params());
  ring.m(0).on_shard_replaced(1);
  ring.m(1).on_shard_replaced(1);
  ring.collect();
  CHECK(ring.take<step::send_pull>(1).empty()); // the others have no use for the shards
  for (uint32_t id = 0; id < 2; ++id)
    ring.next_step(id);
  ring.compute(0, 0.2f);
  ring.compute(1, 0.4f);
  ring.deliver();
  // After its step, rank 0 reads the whole mirror (shard 1 back at an older cut: all 1)
  // and pushes what differs from the model, instead of the step's update alone.
  ring.answer_pulls(0, 1.0f);
  auto fix = ring.ack_pushes(0);
  REQUIRE(fix.size() == 2);
  const auto& model = ring.m(0).params();
  for (const auto& p : fix)
    for (size_t j = 0; j < p.msg.grad.size(); ++j)
      CHECK(p.msg.grad[j] == Approx(1.0f - model[(p.shard == 0 ? 0 : 5) + j]));
  CHECK(ring.m(0).steps_done() == 3);
  CHECK(ring.take<step::fail>(0).empty());
}
