// When the job driver takes a checkpoint cut and when one counts as done.
#include <catch2/catch.hpp>

#include "runtime/store/cut_pacer.hpp"

using namespace ashlar;

namespace {

std::vector<shard_cut_view> at(std::vector<uint64_t> versions, uint64_t cut = 0) {
  std::vector<shard_cut_view> out;
  for (auto v : versions)
    out.push_back({v, cut, ""});
  return out;
}

}  // namespace

TEST_CASE("a cut starts every K versions of shard 0, one at a time, and is committed once every shard has it on disk") {
  cut_pacer p{100, false, 0};
  CHECK(p.on_status(at({0, 0}), 0.0).kind == cut_action::none);
  CHECK(p.on_status(at({99, 120}), 1.0).kind == cut_action::none);
  auto a = p.on_status(at({100, 97}), 2.0);
  REQUIRE(a.kind == cut_action::start);
  CHECK(a.cut == 1);
  CHECK(a.at_version == 0); // not lockstep: each shard writes its current version
  REQUIRE(p.in_flight());
  // Only one shard has it: not yet; no second cut starts meanwhile.
  CHECK(p.on_status({{250, 1, ""}, {240, 0, ""}}, 3.0).kind == cut_action::none);
  auto c = p.on_status({{260, 1, ""}, {255, 1, ""}}, 4.0);
  REQUIRE(c.kind == cut_action::commit);
  CHECK(c.cut == 1);
  CHECK(p.last_committed() == 1);
  CHECK_FALSE(p.in_flight());
  // The next is due 100 versions after the last one started.
  CHECK(p.on_status(at({199, 199}, 1), 5.0).kind == cut_action::none);
  auto next = p.on_status(at({200, 200}, 1), 6.0);
  CHECK(next.kind == cut_action::start);
  CHECK(next.cut == 2);
}

TEST_CASE("under a lockstep policy every shard writes one version a few rounds past the newest, and a cut a "
          "shard had passed is taken again further ahead") {
  cut_pacer p{10, true, 4};
  p.on_status(at({0, 0, 0}), 0.0);
  auto a = p.on_status(at({10, 10, 10}), 1.0);
  REQUIRE(a.kind == cut_action::start);
  CHECK(a.cut == 5); // after the cut the job started from
  CHECK(a.at_version == 12);
  // Shards mid-round (one ahead): still one version for all, past the newest.
  cut_pacer q{10, true, 0};
  q.on_status(at({0, 0}), 0.0);
  auto b = q.on_status(at({10, 11}), 1.0);
  REQUIRE(b.kind == cut_action::start);
  CHECK(b.at_version == 13);
  // A shard was past it when asked: abandoned, and the next cut looks twice as far ahead.
  CHECK_FALSE(q.missed(b.cut + 1, "not this one"));
  auto m = q.missed(b.cut, "shard 1 is at version 14, past 13");
  REQUIRE(m);
  CHECK(m->kind == cut_action::abandon);
  CHECK(m->why.find("past 13") != std::string::npos);
  CHECK_FALSE(q.in_flight());
  CHECK(q.margin() == 4);
  auto c = q.on_status(at({24, 24}), 2.0);
  REQUIRE(c.kind == cut_action::start);
  CHECK(c.cut == b.cut + 1);
  CHECK(c.at_version == 28);
  // Not lockstep: each shard writes its current version.
  cut_pacer r{10, false, 0};
  r.on_status(at({0, 0}), 0.0);
  CHECK(r.on_status(at({10, 11}), 1.0).at_version == 0);
}

TEST_CASE("a cut is abandoned on a failed write, a lost shard or a timeout, and its id is never reused") {
  cut_pacer p{1, false, 0, 30};
  p.on_status(at({0, 0}), 0.0);
  REQUIRE(p.on_status(at({1, 1}), 1.0).kind == cut_action::start);
  auto failed = p.on_status({{2, 1, ""}, {2, 0, "checkpoint cut 1 (version 1) failed: io_error: No space left on device"}}, 2.0);
  REQUIRE(failed.kind == cut_action::abandon);
  CHECK(failed.why.find("shard 1: checkpoint cut 1") != std::string::npos);
  CHECK(failed.why.find("No space left") != std::string::npos);
  CHECK(p.last_committed() == 0);
  auto again = p.on_status(at({3, 3}), 3.0);
  REQUIRE(again.kind == cut_action::start);
  CHECK(again.cut == 2);
  auto lost = p.shard_lost();
  REQUIRE(lost);
  CHECK(lost->kind == cut_action::abandon);
  CHECK_FALSE(p.shard_lost());
  REQUIRE(p.on_status(at({5, 5}), 4.0).kind == cut_action::start);
  CHECK(p.on_status(at({6, 6}, 2), 20.0).kind == cut_action::none); // cut 2's late write is not cut 3
  auto late = p.on_status(at({7, 7}, 2), 40.0);
  CHECK(late.kind == cut_action::abandon);
  CHECK(late.why.find("within 30 s") != std::string::npos);
}

TEST_CASE("the final cut starts at once, replacing one in flight, even with periodic cuts off") {
  cut_pacer p{0, false, 3};
  CHECK(p.on_status(at({1000}), 1.0).kind == cut_action::none);
  auto f = p.final_cut(2.0);
  REQUIRE(f.kind == cut_action::start);
  CHECK(f.cut == 4);
  CHECK(f.at_version == 0);
  CHECK(p.on_status(at({1000}, 4), 2.1).kind == cut_action::commit);
}

TEST_CASE("a cut whose job record could not be written is not the cut the shards keep") {
  cut_pacer p{1, false, 0};
  p.on_status(at({0, 0}), 0.0);
  REQUIRE(p.on_status(at({1, 1}), 1.0).kind == cut_action::start);
  REQUIRE(p.on_status(at({2, 2}, 1), 1.1).kind == cut_action::commit);
  CHECK(p.last_committed() == 1);
  REQUIRE(p.on_status(at({3, 3}, 1), 2.0).kind == cut_action::start);
  REQUIRE(p.on_status(at({4, 4}, 2), 2.1).kind == cut_action::commit);
  p.commit_failed(2); // the job's store is full
  CHECK(p.last_committed() == 1);
  p.commit_failed(1); // not the last commit: nothing changes
  CHECK(p.last_committed() == 1);
  auto next = p.on_status(at({5, 5}, 2), 3.0);
  REQUIRE(next.kind == cut_action::start);
  CHECK(next.cut == 3); // ids are never reused
}
