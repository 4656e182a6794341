// The rule that fits a benchmark profile's pacing to the machine (machine_fit.hpp).
#include <catch2/catch.hpp>

#include "runtime/pacing/machine_fit.hpp"

using namespace ashlar;

TEST_CASE("a profile that asks at most the share of the machine keeps its pacing") {
  // 0.5 ms at speed 1: speeds 1,1,2,4 ask 2000 x 8 = 16000 samples/s; half of 40000 is 20000,
  // and the fastest worker's 8000 is below half of one core's 20000.
  auto f = fit_pacing(0.5, {1, 1, 2, 4}, {40000, 2}, 0.5);
  CHECK(f.sample_ms == Approx(0.5));
  CHECK(f.slowdown == Approx(1));
  CHECK(f.why.empty());
}

TEST_CASE("a profile that asks more than the share of the machine in all is slowed to ask exactly that") {
  // Speeds summing to 36 at 0.5 ms ask 72000 samples/s; half of 40000 is 20000: 3.6x slower.
  const std::vector<double> speeds = {4, 5, 1, 5, 1, 8, 8, 4};
  auto f = fit_pacing(0.5, speeds, {40000, 2}, 0.5);
  CHECK(f.slowdown == Approx(3.6));
  CHECK(f.sample_ms == Approx(1.8));
  CHECK(1000.0 / f.sample_ms * 36 == Approx(20000)); // what it asks now
  CHECK(f.why == "the workers together would ask 72000 samples/s, more than 50% of the 40000 samples/s this "
                 "machine trained");
}

TEST_CASE("a fast worker that would ask more than the share of one core slows the whole profile") {
  // 16 cores measured 160000 samples/s (10000 a core); speeds 8,1,1,1 ask 22000 in all, well
  // under half of 160000, but the speed-8 worker asks 16000, more than half of one core's.
  auto f = fit_pacing(0.5, {8, 1, 1, 1}, {160000, 16}, 0.5);
  CHECK(f.slowdown == Approx(3.2)); // 16000 / 5000
  CHECK(1000.0 / f.sample_ms * 8 == Approx(5000));
  CHECK(f.why == "the fastest worker would ask 16000 samples/s, more than 50% of one core's 10000 samples/s on "
                 "this machine");
}

TEST_CASE("without a share, a measured machine or speeds the pacing stands as asked") {
  CHECK(fit_pacing(0.5, {8, 8}, {1000, 2}, 0).slowdown == 1);
  CHECK(fit_pacing(0.5, {8, 8}, {0, 2}, 0.5).slowdown == 1);
  CHECK(fit_pacing(0.5, {}, {1000, 2}, 0.5).slowdown == 1);
  CHECK(fit_pacing(0.5, {8, 8}, {1000, 0}, 0.5).slowdown > 1); // 0 cores counts as one
}

TEST_CASE("a slowed profile's contention covers the same part of the run, and reads back from its text") {
  auto p = parse_contention("2 4 6 3\n* 1.5 2 2\n", "test");
  REQUIRE(p);
  auto s = stretched(*p, 2.5);
  REQUIRE(s.size() == 2);
  CHECK(s[0].worker == 2);
  CHECK(s[0].start_s == Approx(10));
  CHECK(s[0].end_s == Approx(15));
  CHECK(s[0].factor == Approx(3)); // as much slower, for longer
  CHECK(s[1].all_workers);
  CHECK(s[1].start_s == Approx(3.75));
  CHECK(contention_text(s) == "2 10 15 3\n* 3.75 5 2\n");
  auto back = parse_contention(contention_text(s), "text");
  REQUIRE(back);
  CHECK(slowdown(*back, 2, 12) == Approx(3));
  CHECK(slowdown(*back, 0, 4) == Approx(2));
  CHECK(slowdown(*back, 0, 12) == Approx(1));
}
