// The shard's sessions (runtime/server/shard_sessions.hpp): reads held and released,
// chunked reads, delta reads, malformed pushes, and the cut schedule, on a manual clock.
#include <catch2/catch.hpp>

#include "runtime/server/shard_sessions.hpp"

using namespace ashlar;

namespace {

struct sessions_rig {
  manual_clock clock;
  shard_core core;
  shard_sessions sessions{core, clock};

  explicit sessions_rig(size_t n, std::vector<uint32_t> workers = {0, 1}, const std::string& policy = "bsp")
    : core{make_core(n, policy)} {
    for (auto w : workers) {
      wire::membership_change m;
      m.kind = wire::membership_change::join;
      m.worker_id = w;
      CHECK(sessions.on_member(m).released.empty());
    }
  }

  static shard_core make_core(size_t n, const std::string& policy) {
    sgd_config opt;
    opt.lr = 1.0f;
    opt.momentum = 0.0f;
    opt.weight_decay = 0.0f;
    auto p = make_policy(policy, {});
    REQUIRE(p);
    return shard_core{shard_range{3, 0, n}, std::vector<float>(n, 1.0f), opt, std::move(*p)};
  }

  static wire::push push_of(uint32_t w, std::vector<float> g) {
    wire::push p;
    p.worker_id = w;
    p.shard_id = 3;
    p.batch_size = 1;
    p.grad.assign(g.begin(), g.end());
    return p;
  }

  // A push whose worker's read follows it.
  static wire::push held_push_of(uint32_t w, std::vector<float> g) {
    auto p = push_of(w, std::move(g));
    p.read_follows = true;
    return p;
  }

  static wire::pull_request read_of(uint32_t w) {
    wire::pull_request r;
    r.worker_id = w;
    r.shard_id = 3;
    return r;
  }
};

}  // namespace

TEST_CASE("a read the round does not allow yet is held, and the round's last push releases it with its wait") {
  sessions_rig s{2};
  shard_sessions::outcome out;
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(0, {1, 1}), out));
  CHECK(out.released.empty());
  auto held = s.sessions.on_read(sessions_rig::read_of(0));
  REQUIRE(held);
  CHECK_FALSE(held->reply);
  CHECK(held->ticket != 0);
  CHECK(s.sessions.held_reads() == 1);
  s.clock.advance(std::chrono::milliseconds{40});
  auto ack = s.sessions.on_push(sessions_rig::push_of(1, {3, 3}), out);
  REQUIRE(ack);
  REQUIRE(ack->ack);
  CHECK(ack->ack->version == 1);
  REQUIRE(out.released.size() == 1);
  CHECK(out.released[0].first == held->ticket);
  const auto& r = out.released[0].second;
  CHECK(r.version == 1);
  CHECK(r.wait_ns == 40000000);
  CHECK(r.params.size() == 2);
  CHECK(r.params.data()[0] == Approx(1.0f - 2.0f)); // the round's mean gradient, lr 1
  CHECK(s.sessions.held_reads() == 0);
}

TEST_CASE("a chunked read stays at the version it began at, and a chunk of no read is refused naming the shard") {
  sessions_rig s{4};
  auto first = sessions_rig::read_of(0);
  first.max_floats = 2;
  auto a = s.sessions.on_read(first);
  REQUIRE(a);
  REQUIRE(a->reply);
  CHECK(a->reply->read_id != 0);
  CHECK(a->reply->total == 4);
  shard_sessions::outcome out;
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(0, {1, 1, 1, 1}), out));
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(1, {1, 1, 1, 1}), out));
  REQUIRE(s.core.version() == 1);
  auto next = first;
  next.read_id = a->reply->read_id;
  next.offset = 2;
  auto b = s.sessions.on_read(next);
  REQUIRE(b);
  REQUIRE(b->reply);
  CHECK(b->reply->version == 0);
  CHECK(b->reply->params.data()[0] == 1.0f);
  // The read ended with its last chunk: asking again is an error.
  auto again = s.sessions.on_read(next);
  REQUIRE_FALSE(again);
  CHECK(describe(again.error()).find("shard 3 has no read") != std::string::npos);
}

TEST_CASE("a cut asked for at a version not made yet is due when a push makes it and one past it is refused") {
  sessions_rig s{2};
  auto later = s.sessions.ask_cut(7, 1);
  REQUIRE(later);
  CHECK_FALSE(*later);
  shard_sessions::outcome out;
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(0, {1, 1}), out));
  CHECK_FALSE(out.cut);
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(1, {1, 1}), out));
  REQUIRE(out.cut);
  CHECK(*out.cut == 7);
  auto now = s.sessions.ask_cut(8, 1);
  REQUIRE(now);
  CHECK(*now);
  auto at_once = s.sessions.ask_cut(9, 0); // 0: now
  REQUIRE(at_once);
  CHECK(*at_once);
  for (uint32_t w : {0u, 1u}) {
    auto p = sessions_rig::push_of(w, {1, 1});
    p.base_version = 1;
    REQUIRE(s.sessions.on_push(p, out));
  }
  REQUIRE(s.core.version() == 2);
  auto stale = s.sessions.ask_cut(10, 1);
  REQUIRE_FALSE(stale);
  CHECK(describe(stale.error()).find("past the cut's version 1") != std::string::npos);
  CHECK_FALSE(s.sessions.ask_cut(0, 0));
}

TEST_CASE("a cut asked for while a push is applied in pieces waits for the version that push makes, past "
          "another push's version on the way") {
  sessions_rig s{4, {0, 1}, "asp"}; // (a policy that applies each push alone)
  auto& core = s.core;
  auto& sessions = s.sessions;
  auto piece = [](uint64_t offset) {
    auto p = sessions_rig::push_of(0, {1, 1});
    p.offset = offset;
    p.total = 4;
    return p;
  };
  shard_sessions::outcome out;
  REQUIRE(sessions.on_push(piece(0), out));
  REQUIRE(core.applying()); // half of worker 0's gradient is in the parameters
  auto now = sessions.ask_cut(5, 0);
  REQUIRE(now);
  CHECK_FALSE(*now);
  shard_sessions::outcome other; // worker 1's whole push makes a version meanwhile
  REQUIRE(sessions.on_push(sessions_rig::push_of(1, {1, 1, 1, 1}), other));
  CHECK(core.version() == 1);
  CHECK_FALSE(other.cut);
  shard_sessions::outcome last;
  REQUIRE(sessions.on_push(piece(2), last));
  CHECK_FALSE(core.applying());
  CHECK(core.version() == 2);
  REQUIRE(last.cut);
  CHECK(*last.cut == 5);
}

TEST_CASE("a malformed sparse push is refused naming the shard, the worker and what is wrong") {
  sessions_rig s{2};
  auto p = sessions_rig::push_of(1, {0.5f});
  p.sparse = true;
  p.index = {5};
  shard_sessions::outcome out;
  auto ack = s.sessions.on_push(p, out);
  REQUIRE_FALSE(ack);
  CHECK(describe(ack.error()).find("shard 3 got a sparse push from worker 1 with index 5 outside its range of 2")
        != std::string::npos);
  CHECK(s.core.version() == 0);
}

TEST_CASE("a member's delta read follows its view, a leaving worker's view goes, a stranger never gets one") {
  sessions_rig s{4};
  auto req = sessions_rig::read_of(0);
  req.topk_ratio = 0.5f;
  auto dense = s.sessions.on_read(req);
  REQUIRE(dense);
  REQUIRE(dense->reply);
  CHECK_FALSE(dense->reply->sparse);
  CHECK(dense->reply->view_seq != 0);
  CHECK(s.sessions.views() == 1);
  req.view_seq = dense->reply->view_seq;
  auto delta = s.sessions.on_read(req);
  REQUIRE(delta);
  REQUIRE(delta->reply);
  CHECK(delta->reply->sparse);
  CHECK(delta->reply->params.size() == 2);
  auto stranger = sessions_rig::read_of(42);
  stranger.topk_ratio = 0.5f;
  auto s2 = s.sessions.on_read(stranger);
  REQUIRE(s2);
  REQUIRE(s2->reply);
  CHECK(s2->reply->view_seq == 0);
  CHECK(s.sessions.views() == 1);
  wire::membership_change leave;
  leave.kind = wire::membership_change::leave;
  leave.worker_id = 0;
  s.sessions.on_member(leave);
  CHECK(s.sessions.views() == 0);
}

// A lockstep worker lost while it waits for its round has pushed that round's step: the
// shard counts it (the scheduler hands over what is left after it), a dropped push does not.
TEST_CASE("the shard counts each worker's whole pushes it took, its last round's buffered one included") {
  sessions_rig s{2};
  shard_sessions::outcome out;
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(0, {1, 1}), out));
  REQUIRE(s.sessions.on_push(sessions_rig::push_of(1, {1, 1}), out)); // round 1 applied
  auto round2 = [](uint32_t w) {
    auto p = sessions_rig::push_of(w, {1, 1});
    p.base_version = 1;
    return p;
  };
  REQUIRE(s.sessions.on_push(round2(0), out)); // round 2: buffered
  CHECK(s.sessions.pushes_of(0) == 2);
  CHECK(s.sessions.pushes_of(1) == 1);
  auto dropped = s.sessions.on_push(round2(0), out); // a second push in one round: dropped
  REQUIRE(dropped);
  REQUIRE(dropped->ack);
  CHECK(dropped->ack->outcome == wire::push_ack::dropped);
  CHECK(s.sessions.pushes_of(0) == 2);
  CHECK(s.sessions.pushes_of(7) == 0); // a worker it never heard from
  wire::membership_change lost;
  lost.kind = wire::membership_change::fail;
  lost.worker_id = 0;
  s.sessions.on_member(lost);
  CHECK(s.core.version() == 1); // worker 1 has not pushed round 2: it waits for it
  REQUIRE(s.sessions.on_push(round2(1), out));
  CHECK(s.core.version() == 2); // the lost worker's buffered push is in the round
}

TEST_CASE("a push whose read follows is acknowledged after that read's reply, held or not") {
  sessions_rig s{2};
  shard_sessions::outcome out;
  auto a = s.sessions.on_push(sessions_rig::held_push_of(0, {1, 1}), out);
  REQUIRE(a);
  CHECK_FALSE(a->ack); // held for the read
  CHECK(a->ticket != 0);
  CHECK(s.sessions.held_pushes() == 1);
  auto read = s.sessions.on_read(sessions_rig::read_of(0)); // the round is not complete: held
  REQUIRE(read);
  CHECK_FALSE(read->reply);
  CHECK(read->acks.empty());
  CHECK(out.acks.empty());
  auto b = s.sessions.on_push(sessions_rig::held_push_of(1, {3, 3}), out);
  REQUIRE(b);
  CHECK_FALSE(b->ack);
  // The round is applied: worker 0's read is answered, then its push; worker 1's push
  // waits for worker 1's read.
  REQUIRE(out.released.size() == 1);
  CHECK(out.released[0].first == read->ticket);
  CHECK(out.released[0].second.version == 1);
  REQUIRE(out.acks.size() == 1);
  CHECK(out.acks[0].first == a->ticket);
  CHECK(out.acks[0].second.outcome == wire::push_ack::buffered);
  CHECK(out.acks[0].second.complete);
  CHECK(s.sessions.held_pushes() == 1);
  auto now = s.sessions.on_read(sessions_rig::read_of(1)); // allowed at once: the ack goes with the reply
  REQUIRE(now);
  REQUIRE(now->reply);
  CHECK(now->reply->version == 1);
  REQUIRE(now->acks.size() == 1);
  CHECK(now->acks[0].first == b->ticket);
  CHECK(now->acks[0].second.version == 1);
  CHECK(s.sessions.held_pushes() == 0);
}

TEST_CASE("a held push is answered when its worker pushes again or leaves without the read, never by a snapshot") {
  sessions_rig s{2};
  shard_sessions::outcome out;
  auto a = s.sessions.on_push(sessions_rig::held_push_of(0, {1, 1}), out);
  REQUIRE(a);
  REQUIRE_FALSE(a->ack);
  auto snap = sessions_rig::read_of(0);
  snap.snapshot = true;
  auto sr = s.sessions.on_read(snap);
  REQUIRE(sr);
  REQUIRE(sr->reply);
  CHECK(sr->acks.empty());
  CHECK(s.sessions.held_pushes() == 1);
  // The next push of the same worker (its read never came): the held one is answered first.
  shard_sessions::outcome again;
  auto second = s.sessions.on_push(sessions_rig::push_of(0, {1, 1}), again); // dropped: a second push in the round
  REQUIRE(second);
  REQUIRE(second->ack);
  REQUIRE(again.acks.size() == 1);
  CHECK(again.acks[0].first == a->ticket);
  CHECK(s.sessions.held_pushes() == 0);
  // A worker that leaves with its push held: answered with its leaving.
  shard_sessions::outcome o2;
  auto b = s.sessions.on_push(sessions_rig::held_push_of(1, {1, 1}), o2);
  REQUIRE(b);
  REQUIRE_FALSE(b->ack);
  wire::membership_change gone;
  gone.kind = wire::membership_change::leave;
  gone.worker_id = 1;
  auto left = s.sessions.on_member(gone);
  REQUIRE(left.acks.size() == 1);
  CHECK(left.acks[0].first == b->ticket);
  CHECK(s.sessions.held_pushes() == 0);
}

TEST_CASE("a push whose read follows is answered at once for a worker the shard was not told of, or a piece") {
  sessions_rig s{4, {0}};
  shard_sessions::outcome out;
  s.core.join(9); // live in the core, never announced to the sessions
  auto a = s.sessions.on_push(sessions_rig::held_push_of(9, {1, 1, 1, 1}), out);
  REQUIRE(a);
  CHECK(a->ack);
  auto piece = sessions_rig::push_of(0, {1, 1});
  piece.total = 4;
  piece.read_follows = true; // on a piece that does not complete the push: no hold
  auto b = s.sessions.on_push(piece, out);
  REQUIRE(b);
  REQUIRE(b->ack);
  CHECK_FALSE(b->ack->complete);
  CHECK(s.sessions.held_pushes() == 0);
}
