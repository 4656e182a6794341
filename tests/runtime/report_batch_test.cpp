// A worker's step reports sent a few at a time (runtime/worker/report_batch.hpp).
#include <catch2/catch.hpp>

#include "runtime/worker/report_batch.hpp"

using namespace ashlar;

namespace {
wire::profile_report step(uint64_t s) {
  wire::profile_report r;
  r.worker_id = 2;
  r.step = s;
  return r;
}
std::vector<uint64_t> steps(const std::vector<wire::profile_report>& rs) {
  std::vector<uint64_t> out;
  for (const auto& r : rs)
    out.push_back(r.step);
  return out;
}
}  // namespace

TEST_CASE("step reports without a window go one by one") {
  report_batch b{0};
  for (uint64_t s = 0; s < 3; ++s) {
    CHECK(b.add(step(s)) == report_batch::next::send);
    CHECK(steps(b.take()) == std::vector<uint64_t>{s});
  }
}

TEST_CASE("step reports are held under one timer per batch, or until the most are held, and go in order") {
  report_batch b{25'000'000, 4};
  CHECK(b.add(step(0)) == report_batch::next::arm_timer);
  CHECK(b.add(step(1)) == report_batch::next::hold);
  CHECK(b.held() == 2);
  b.on_timer();
  CHECK(steps(b.take()) == std::vector<uint64_t>{0, 1});
  CHECK(b.held() == 0);
  // The next batch arms its own timer; four held go at once, and the timer still
  // pending then carries the batch after them (no second timer).
  CHECK(b.add(step(2)) == report_batch::next::arm_timer);
  CHECK(b.add(step(3)) == report_batch::next::hold);
  CHECK(b.add(step(4)) == report_batch::next::hold);
  CHECK(b.add(step(5)) == report_batch::next::send);
  CHECK(steps(b.take()) == std::vector<uint64_t>{2, 3, 4, 5});
  CHECK(b.add(step(6)) == report_batch::next::hold);
  b.on_timer();
  CHECK(steps(b.take()) == std::vector<uint64_t>{6});
  CHECK(b.take().empty()); // a timer with nothing held sends nothing
  CHECK(b.add(step(7)) == report_batch::next::arm_timer);
}
