#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>

#include "runtime/alloc/batch_allocation.hpp"
#include "runtime/collective/ring.hpp"
#include "runtime/compress/topk.hpp"
#include "runtime/metrics/cluster_profile.hpp"
#include "runtime/predict/speed_predictor.hpp"

using namespace ashlar;

TEST_CASE("top-k with error feedback sends exactly k values and the residual keeps the rest") {
  topk_compressor c{0.25};
  std::vector<float> g = {0.1f, -5.0f, 0.2f, 3.0f, -0.3f, 0.05f, 1.0f, -2.0f};
  auto s = c.compress(g.data(), g.size());
  REQUIRE(s);
  REQUIRE(s->index.size() == 2);
  CHECK(s->index == std::vector<uint32_t>{1, 3});
  CHECK(s->value == std::vector<float>{-5.0f, 3.0f});
  // Sent + residual == the gradient, entry by entry.
  std::vector<float> sum = c.residual();
  REQUIRE_FALSE(add_sparse(*s, 1.0f, sum.data(), sum.size()));
  CHECK(sum == g);
  CHECK(c.residual()[1] == 0.0f);
  CHECK(c.residual()[7] == -2.0f);
  // The next call sends what was held back once it is the largest.
  std::vector<float> zero(8, 0.0f);
  auto s2 = c.compress(zero.data(), zero.size());
  REQUIRE(s2);
  CHECK(s2->index == std::vector<uint32_t>{6, 7});
  CHECK(c.compression_ratio() == Approx(8.0 * 4 * 2 / (2 * 2 * 8.0)));
}

TEST_CASE("top-k with error feedback loses nothing over many rounds") {
  std::mt19937 rng{7};
  std::normal_distribution<float> d{0.0f, 1.0f};
  const size_t n = 1000;
  topk_compressor c{0.01};
  std::vector<double> sent(n, 0.0), total(n, 0.0);
  for (int round = 0; round < 50; ++round) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) {
      g[i] = d(rng);
      total[i] += g[i];
    }
    auto s = c.compress(g.data(), n);
    REQUIRE(s);
    CHECK(s->index.size() == 10);
    CHECK(wire_bytes(*s) == 80);
    for (size_t j = 0; j < s->index.size(); ++j)
      sent[s->index[j]] += s->value[j];
  }
  for (size_t i = 0; i < n; ++i)
    CHECK(sent[i] + c.residual()[i] == Approx(total[i]).margin(1e-3));
  CHECK(c.compression_ratio() == Approx(50.0));
}

TEST_CASE("top-k sends exactly k values when magnitudes tie at the threshold") {
  topk_compressor c{0.5};
  std::vector<float> g = {1.0f, -1.0f, 1.0f, 0.5f, -1.0f, 1.0f}; // five tie for 3 places
  auto s = c.compress(g.data(), g.size());
  REQUIRE(s);
  CHECK(s->index == std::vector<uint32_t>{0, 1, 2});
  CHECK(s->value == std::vector<float>{1.0f, -1.0f, 1.0f});
  CHECK(c.residual() == std::vector<float>{0, 0, 0, 0.5f, -1.0f, 1.0f});
}

TEST_CASE("top-k refuses a tensor of another size and a sparse tensor that does not fit") {
  topk_compressor c{0.5};
  std::vector<float> a(4, 1.0f), b(5, 1.0f);
  REQUIRE(c.compress(a.data(), a.size()));
  auto bad = c.compress(b.data(), b.size());
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::shape_mismatch));
  sparse_tensor s{4, {9}, {1.0f}};
  CHECK(is(add_sparse(s, 1.0f, a.data(), a.size()), errc::shape_mismatch));
}

TEST_CASE("batch shares sum to the global batch and follow speed") {
  auto eq = equal_shares(64, 3);
  REQUIRE(eq);
  CHECK(*eq == std::vector<uint32_t>{22, 21, 21});
  auto p = proportional_shares(256, {1, 1, 2, 4});
  REQUIRE(p);
  CHECK(std::accumulate(p->begin(), p->end(), 0u) == 256);
  CHECK(*p == std::vector<uint32_t>{32, 32, 64, 128});
  auto q = proportional_shares(10, {1, 3, 100});
  REQUIRE(q);
  CHECK(std::accumulate(q->begin(), q->end(), 0u) == 10);
  CHECK((*q)[0] >= 1);
  CHECK((*q)[2] > (*q)[1]);
  CHECK(is(proportional_shares(2, {1, 1, 1}).error(), errc::invalid_argument));
  CHECK(is(proportional_shares(8, {1, 0}).error(), errc::invalid_argument));
  CHECK(is(equal_shares(8, 0).error(), errc::invalid_argument));
}

TEST_CASE("self-adaptive allocation moves the batch toward the faster workers") {
  adaptive_allocator a{120, 3};
  CHECK(a.shares() == std::vector<uint32_t>{40, 40, 40}); // nothing observed yet
  // Worker 2 is 4x as fast as worker 0, worker 1 twice as fast.
  for (int round = 0; round < 5; ++round) {
    auto s = a.shares();
    a.observe(0, s[0], s[0] / 100.0);
    a.observe(1, s[1], s[1] / 200.0);
    a.observe(2, s[2], s[2] / 400.0);
  }
  auto s = a.shares();
  CHECK(std::accumulate(s.begin(), s.end(), 0u) == 120);
  CHECK(s[0] == Approx(120.0 / 7).margin(1));
  CHECK(s[2] == Approx(480.0 / 7).margin(1));
}

namespace {

// Mean squared error of one-step-ahead predictions over the second half of `xs`.
double mse(speed_predictor& p, const std::vector<double>& xs) {
  double sum = 0;
  size_t n = 0;
  for (size_t t = 0; t + 1 < xs.size(); ++t) {
    p.observe(xs[t]);
    if (t >= xs.size() / 2) {
      double e = p.predict() - xs[t + 1];
      sum += e * e;
      ++n;
    }
  }
  return sum / n;
}

}  // namespace

TEST_CASE("the GRU predictor beats last-value prediction on a periodic iteration-time series") {
  std::vector<double> xs;
  const double pattern[] = {0.10, 0.12, 0.20, 0.12}; // e.g. a co-located job every 4th step
  for (int i = 0; i < 400; ++i)
    xs.push_back(pattern[i % 4]);
  last_value_predictor last;
  gru_predictor gru;
  double e_last = mse(last, xs), e_gru = mse(gru, xs);
  INFO("last " << e_last << " gru " << e_gru);
  CHECK(e_gru < 0.5 * e_last);
}

TEST_CASE("on a noisy iteration-time series smoothing beats last-value, and the GRU beats smoothing") {
  std::mt19937 rng{3};
  std::normal_distribution<double> noise{0.0, 0.02};
  std::vector<double> xs;
  for (int i = 0; i < 400; ++i)
    xs.push_back(0.1 + noise(rng));
  last_value_predictor last;
  ewma_predictor ewma;
  gru_predictor gru;
  double e_last = mse(last, xs), e_ewma = mse(ewma, xs), e_gru = mse(gru, xs);
  INFO("last " << e_last << " ewma " << e_ewma << " gru " << e_gru);
  CHECK(e_ewma < 0.75 * e_last);
  CHECK(e_gru < e_ewma); // deterministic: fixed noise and weight seeds
}

namespace {

// Runs a ring of ring_rank state machines, delivering each step's messages.
std::vector<std::vector<float>> run_ring(std::vector<std::vector<float>> inputs) {
  const auto p = static_cast<uint32_t>(inputs.size());
  std::vector<ring_rank> ranks;
  for (uint32_t r = 0; r < p; ++r)
    ranks.emplace_back(r, p, inputs[r]);
  for (uint32_t step = 0; step < 2 * (p - 1); ++step) {
    std::vector<ring_chunk> msgs;
    for (auto& r : ranks)
      msgs.push_back(*r.outgoing());
    for (uint32_t r = 0; r < p; ++r)
      REQUIRE_FALSE(ranks[(r + 1) % p].receive(msgs[r]));
  }
  std::vector<std::vector<float>> out;
  for (auto& r : ranks) {
    CHECK(r.done());
    CHECK_FALSE(r.outgoing());
    out.push_back(r.values());
  }
  return out;
}

}  // namespace

TEST_CASE("ring all-reduce sums exactly for 1 to 8 workers and tensor sizes that do not divide evenly") {
  for (uint32_t p = 1; p <= 8; ++p) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{1001}}) {
      std::vector<std::vector<float>> in(p, std::vector<float>(n));
      std::vector<float> want(n, 0.0f);
      for (uint32_t r = 0; r < p; ++r)
        for (size_t i = 0; i < n; ++i) {
          in[r][i] = static_cast<float>((r + 1) * 1000 + i % 97); // integers: sums are exact
          want[i] += in[r][i];
        }
      auto out = run_ring(in);
      for (uint32_t r = 0; r < p; ++r)
        CHECK(out[r] == want);
    }
  }
}

TEST_CASE("ring all-reduce of batch-weighted gradients gives the global mean for uneven shares") {
  // Shares 8, 8, 16, 32 of a 64-sample batch: each rank scales its mean gradient by its
  // share; the ring's sum is then the mean over all 64 samples.
  std::vector<uint32_t> shares = {8, 8, 16, 32};
  std::vector<std::vector<float>> in;
  std::vector<float> want(5, 0.0f);
  for (size_t r = 0; r < shares.size(); ++r) {
    std::vector<float> g(5);
    for (size_t i = 0; i < 5; ++i) {
      g[i] = static_cast<float>(r + i);
      want[i] += g[i] * shares[r] / 64.0f;
      g[i] *= shares[r] / 64.0f;
    }
    in.push_back(g);
  }
  for (const auto& v : run_ring(in))
    for (size_t i = 0; i < 5; ++i)
      CHECK(v[i] == Approx(want[i]));
}

TEST_CASE("a ring rank refuses a message for another step, chunk or length") {
  ring_rank r{1, 3, std::vector<float>(9, 1.0f)};
  ring_chunk wrong_step{1, 0, std::vector<float>(3, 1.0f)};
  CHECK(is(r.receive(wrong_step), errc::invalid_state));
  ring_chunk wrong_chunk{0, 2, std::vector<float>(3, 1.0f)};
  CHECK(is(r.receive(wrong_chunk), errc::invalid_state));
  ring_chunk wrong_len{0, 0, std::vector<float>(2, 1.0f)};
  CHECK(is(r.receive(wrong_len), errc::shape_mismatch));
}

TEST_CASE("a delta read sends the k entries that changed most, as current values, and the view catches up") {
  std::vector<float> params = {1.0f, 5.0f, 2.0f, -4.0f, 0.5f, 3.0f, 0.0f, -1.0f};
  std::vector<float> view(params.size(), 0.0f);
  topk_scratch scratch;
  std::vector<float> diff, value;
  std::vector<uint32_t> index;
  delta_topk(params.data(), view, 2, scratch, diff, index, value);
  CHECK(index == std::vector<uint32_t>{1, 3});
  CHECK(value == std::vector<float>{5.0f, -4.0f});
  CHECK(view == std::vector<float>{0, 5.0f, 0, -4.0f, 0, 0, 0, 0});
  // The parameters move on; what was not sent is still owed, and the largest
  // differences go first (entry 1 moved by 0.25 only, so it waits).
  params[1] = 5.25f;
  delta_topk(params.data(), view, 2, scratch, diff, index, value);
  CHECK(index == std::vector<uint32_t>{2, 5});
  CHECK(value == std::vector<float>{2.0f, 3.0f});
  // Pulled often enough, the view equals the parameters exactly (values, not sums).
  for (int i = 0; i < 3; ++i)
    delta_topk(params.data(), view, 2, scratch, diff, index, value);
  CHECK(view == params);
  delta_topk(params.data(), view, 2, scratch, diff, index, value);
  CHECK(index.size() == 2); // always k entries, even when nothing differs
  CHECK(view == params);
}

TEST_CASE("delta reads track a moving tensor within what k entries per read can carry") {
  std::mt19937 rng{11};
  std::normal_distribution<float> d{0.0f, 0.01f};
  const size_t n = 10000, k = 1000;
  std::vector<float> params(n, 0.0f), view(n, 0.0f);
  for (size_t i = 0; i < n; ++i)
    params[i] = view[i] = d(rng) * 100;
  topk_scratch scratch;
  std::vector<float> diff, value;
  std::vector<uint32_t> index;
  double worst = 0;
  for (int round = 0; round < 100; ++round) {
    for (auto& p : params)
      p += d(rng); // an update of every entry
    delta_topk(params.data(), view, k, scratch, diff, index, value);
    REQUIRE(index.size() == k);
    REQUIRE(std::is_sorted(index.begin(), index.end()));
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      err += (params[i] - view[i]) * (params[i] - view[i]);
      norm += params[i] * params[i];
    }
    worst = std::max(worst, std::sqrt(err / norm));
  }
  // The view lags by the residual: bounded, not growing with the rounds.
  CHECK(worst < 0.05);
}

TEST_CASE("the cluster profile smooths from a worker's second step, scores the GRU per window, and counts time on its clock") {
  manual_clock clock;
  cluster_profile p(0.5, 0.25, clock);
  p.membership(0, false);
  CHECK(p.stats().elapsed_seconds == 0);
  uint64_t steps = 0;
  auto step = [&](uint32_t w, uint64_t compute_ms, uint32_t samples) {
    wire::profile_report r;
    r.worker_id = w;
    r.step = steps++;
    r.samples = samples;
    r.compute_ns = compute_ms * 1000000;
    r.push_ns = 1000000;
    r.loss = 2.0;
    p.observe(r);
  };
  step(0, 500, 10); // a first step's one-time costs: not smoothed in
  CHECK(p.stats().workers[0].compute_seconds == 0);
  step(0, 10, 10);
  CHECK(p.stats().workers[0].compute_seconds == Approx(0.010));
  step(0, 20, 10);
  CHECK(p.stats().workers[0].compute_seconds == Approx(0.015)); // alpha 0.5
  CHECK(p.stats().workers[0].compute_per_sample == Approx(0.0015));
  // Windows of 0.25 s: the observed speed is the window's samples over its compute.
  clock.advance(std::chrono::milliseconds(300));
  step(0, 10, 10);
  auto s = p.stats();
  CHECK(s.workers[0].observed_speed == Approx(40.0 / 0.540));
  CHECK(s.elapsed_seconds == Approx(0.3));
  CHECK(s.total_samples == 40);
  p.membership(0, true);
  CHECK(p.stats().workers[0].done);
}

TEST_CASE("the cluster profile takes reports from members only, each within a step's bound and newer than the "
          "last, and counts the rest") {
  manual_clock clock;
  cluster_profile p(0.5, 0.25, clock);
  p.bound_step_samples(60000);
  p.membership(3, false);
  auto report = [&](uint32_t w, uint64_t step, uint32_t samples) {
    wire::profile_report r;
    r.worker_id = w;
    r.step = step;
    r.samples = samples;
    r.compute_ns = 1000000;
    return p.observe(r);
  };
  CHECK_FALSE(report(3, 0, 64));
  // Reports for 10,000 ids the scheduler never announced: refused, nothing kept for them.
  for (uint32_t w = 10; w < 10010; ++w) {
    auto why = report(w, 1, 64);
    REQUIRE(why);
    CHECK(why->find("worker " + std::to_string(w) + " is not a member") != std::string::npos);
  }
  CHECK(p.stats().workers.size() == 1);
  CHECK(p.refused() == 10000);
  // A step of more samples than the training set holds, and a replayed step.
  auto big = report(3, 1, 4294967295u);
  REQUIRE(big);
  CHECK(big->find("4294967295 samples in one step, more than the training set's 60000") != std::string::npos);
  REQUIRE(report(3, 0, 64));
  CHECK(p.stats().total_samples == 64);
  CHECK_FALSE(report(3, 1, 64));
  CHECK(p.stats().refused_reports == 10002);
  // A member that left is no longer heard; joined again under its id, it counts its steps anew.
  p.membership(3, true);
  CHECK(report(3, 2, 64));
  p.membership(3, false);
  CHECK_FALSE(report(3, 0, 64));
  CHECK(p.stats().total_samples == 192);
}
