#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>

#include "actors/local_job.hpp"
#include "runtime/metrics/report.hpp"
#include "../runtime/temp_dir.hpp"

using namespace ashlar;

namespace {

train_config small_job(const std::string& policy) {
  train_config cfg;
  cfg.train_limit = 12000;
  cfg.test_limit = 2000;
  cfg.workers = 4;
  cfg.servers = 2;
  cfg.policy = policy;
  cfg.epochs = 3;
  cfg.batch_size = 32;
  cfg.optimizer.lr = 0.05f;
  cfg.progress_interval = 0;
  cfg.eval_every_epoch = false;
  cfg.log_level = "warn";
  return cfg;
}

// Steps of every worker together.
uint64_t total_steps(const run_report& r) {
  uint64_t n = 0;
  for (const auto& w : r.per_worker)
    n += w.steps;
  return n;
}

}  // namespace

TEST_CASE("BSP on a Fashion-MNIST subset reaches 78% test accuracy") {
  auto rep = actors::run_local_job(small_job("bsp"));
  REQUIRE(rep);
  CHECK(rep->samples == 3 * 12000);
  CHECK(rep->dropped == 0);
  CHECK(rep->mean_staleness == 0);
  CHECK(rep->per_worker.size() == 4);
  CHECK(rep->test_accuracy >= 0.78);
}

TEST_CASE("BSP with a fixed seed gives bit-identical parameters in two runs") {
  auto cfg = small_job("bsp");
  cfg.epochs = 1;
  cfg.train_limit = 4000;
  std::vector<float> a, b;
  REQUIRE(actors::run_local_job(cfg, {}, &a));
  REQUIRE(actors::run_local_job(cfg, {}, &b));
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  cfg.seed = 2;
  std::vector<float> c;
  REQUIRE(actors::run_local_job(cfg, {}, &c));
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);
}

TEST_CASE("ASP trains until the workers' samples together reach the epoch budget, and reports staleness") {
  auto cfg = small_job("asp");
  cfg.epochs = 2;
  // Each push is its own SGD step here: a smaller rate and momentum keep the four
  // interleaved workers stable.
  cfg.optimizer.lr = 0.02f;
  cfg.optimizer.momentum = 0.5f;
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  // Workers run at their own pace; the job stops them once their samples reach
  // epochs x training set, each finishing the step it is in.
  CHECK(rep->samples >= 2 * 12000);
  CHECK(rep->samples < 2 * 12000 * 5 / 4);
  // Every push is applied alone: one version per push per shard.
  uint64_t steps = 0;
  for (const auto& w : rep->per_worker)
    steps += w.steps;
  CHECK(rep->versions == 2 * steps);
  CHECK(rep->mean_staleness > 0);
  CHECK(rep->test_accuracy >= 0.75);
}

TEST_CASE("progress and epoch hooks are called while a job runs") {
  auto cfg = small_job("bsp");
  cfg.progress_interval = 0.1;
  cfg.eval_every_epoch = true;
  size_t progress = 0;
  std::vector<epoch_point> epochs;
  actors::job_hooks hooks;
  hooks.on_progress = [&](const actors::progress_event& ev) {
    ++progress;
    CHECK(ev.workers.size() <= 4);
  };
  hooks.on_epoch = [&](const epoch_point& p) { epochs.push_back(p); };
  auto rep = actors::run_local_job(cfg, hooks);
  REQUIRE(rep);
  // Epoch hooks fire for boundaries before the last; the final one is in the report.
  CHECK(progress >= 1);
  CHECK(epochs.size() >= 1);
  CHECK(rep->history.size() == epochs.size() + 1);
  CHECK(rep->history.back().test_accuracy == rep->test_accuracy);
  CHECK(rep->history.back().train_loss > 0); // the last training loss, not a placeholder
}

TEST_CASE("a missing data set fails the job with io_error naming the directory") {
  auto cfg = small_job("bsp");
  cfg.data_dir = "/nonexistent/fmnist";
  auto rep = actors::run_local_job(cfg);
  REQUIRE_FALSE(rep);
  CHECK(is(rep.error(), errc::io_error));
  CHECK(describe(rep.error()).find("/nonexistent/fmnist") != std::string::npos);
}

TEST_CASE("chunked pulls and pushes give bit-identical parameters to whole-range ones") {
  auto cfg = small_job("bsp");
  cfg.epochs = 1;
  cfg.train_limit = 3000;
  std::vector<float> whole, chunked;
  REQUIRE(actors::run_local_job(cfg, {}, &whole));
  cfg.chunk_floats = 7919; // a prime: chunks never line up with layers or shards
  cfg.chunks_in_flight = 3;
  REQUIRE(actors::run_local_job(cfg, {}, &chunked));
  REQUIRE(whole.size() == chunked.size());
  CHECK(std::memcmp(whole.data(), chunked.data(), whole.size() * sizeof(float)) == 0);
}

TEST_CASE("SSP trains to the epoch budget without dropping a gradient, to a working model") {
  auto cfg = small_job("ssp");
  cfg.epochs = 2;
  cfg.optimizer.lr = 0.02f;
  cfg.optimizer.momentum = 0.5f;
  cfg.policy_settings.staleness_bound = 2;
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  CHECK(rep->samples >= 2 * 12000);
  CHECK(rep->samples < 2 * 12000 * 5 / 4);
  CHECK(rep->dropped == 0);
  CHECK(rep->test_accuracy >= 0.75);
}

TEST_CASE("a paced worker spends sample_ms / speed of wall time per sample") {
  auto cfg = small_job("asp");
  cfg.workers = 2;
  cfg.epochs = 1;
  cfg.train_limit = 1024;
  cfg.optimizer.lr = 0.02f;
  cfg.speeds = {1.0, 4.0};
  cfg.sample_ms = 1.0; // ~20x the real compute per sample, so the budget always binds
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  REQUIRE(rep->per_worker.size() == 2);
  for (const auto& w : rep->per_worker) {
    double speed = cfg.speeds[w.worker_id % 2];
    double budget = static_cast<double>(w.samples) * cfg.sample_ms * 1e-3 / speed;
    // Never faster than its pace; slower only by the timer's lateness on a busy machine
    // (3%, and up to a millisecond a step when the timer wakes late on a loaded machine:
    // 9% was seen at speed 4 in a full suite run): sleeping the whole budget on top of the
    // compute (the compute is 5% of the budget at speed 1, 20% at speed 4: worker 1 then
    // comes out at 1.2x its budget, past 1.03 + 25 ms over 25 steps) would fail.
    INFO("worker " << w.worker_id << ": " << w.compute_seconds << " s against a budget of " << budget << " s, "
                   << w.steps << " steps");
    CHECK(w.compute_seconds >= budget * 0.99);
    CHECK(w.compute_seconds <= budget * 1.03 + static_cast<double>(w.steps) * 1e-3);
  }
}

namespace {

// Two paced ASP workers at these speeds (1 ms a sample at speed 1) over 4096 samples.
train_config paced_asp_pair(std::vector<double> speeds) {
  auto cfg = small_job("asp");
  cfg.workers = 2;
  cfg.epochs = 1;
  cfg.train_limit = 4096;
  cfg.optimizer.lr = 0.02f;
  cfg.speeds = std::move(speeds);
  cfg.sample_ms = 1.0;
  return cfg;
}

}  // namespace

TEST_CASE("a paced worker keeps its speed over whole steps: samples per second outside communication") {
  // Short steps (batch 8; 2 ms at speed 4), where the host time between steps (the
  // delayed message's lateness, the bookkeeping, the hop to the next step) weighs most.
  ashlar::test::temp_dir dir;
  auto cfg = paced_asp_pair({1.0, 4.0});
  cfg.batch_size = 8;
  cfg.metrics = dir.file("run.jsonl");
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  // Per worker, from the step lines: first start to last end, less the time its steps
  // spent pulling, pushing and waiting, against the samples it computed.
  struct seen {
    double first = -1, last = 0, comm = 0, samples = 0;
  };
  std::map<int, seen> per;
  std::ifstream in{cfg.metrics};
  std::string line;
  const std::regex step{R"re("type":"step","t":([0-9.e+-]+),"worker":(\d+),"step":\d+,"samples":(\d+),)re"
                        R"re("step_seconds":([0-9.e+-]+),"compute_seconds":[0-9.e+-]+,"pull_seconds":([0-9.e+-]+),)re"
                        R"re("push_seconds":([0-9.e+-]+),"wait_seconds":([0-9.e+-]+),)re"};
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, step))
      continue;
    auto& w = per[std::stoi(m[2])];
    const double end = std::stod(m[1]);
    if (w.first < 0)
      w.first = end - std::stod(m[4]);
    w.last = end;
    w.samples += std::stod(m[3]);
    w.comm += std::stod(m[5]) + std::stod(m[6]) + std::stod(m[7]);
  }
  REQUIRE(per.size() == 2);
  for (const auto& [id, w] : per) {
    const double speed = cfg.speeds[static_cast<size_t>(id) % 2];
    const double rate = w.samples / (w.last - w.first - w.comm);
    const double paced = speed / (cfg.sample_ms * 1e-3);
    INFO("worker " << id << ": " << rate << " samples/s outside communication, paced " << paced);
    CHECK(rate > 0.95 * paced); // before the debt was given back: 0.89 at speed 4, loaded
    CHECK(rate < 1.02 * paced);
  }
}

TEST_CASE("test evaluations come every run.eval_interval seconds while a job runs") {
  ashlar::test::temp_dir dir;
  auto cfg = paced_asp_pair({1.0, 1.0}); // 2048 samples a worker at 1 ms: about 2 s
  cfg.eval_interval = 0.25;
  cfg.metrics = dir.file("run.jsonl");
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  std::vector<double> times;
  std::ifstream in{cfg.metrics};
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, std::regex{R"re("type":"eval","t":([0-9.e+-]+))re"}))
      times.push_back(std::stod(m[1]));
  REQUIRE(times.size() >= 6);
  std::vector<double> gaps;
  for (size_t i = 1; i < times.size(); ++i)
    gaps.push_back(times[i] - times[i - 1]);
  std::sort(gaps.begin(), gaps.end());
  const double median = gaps[gaps.size() / 2];
  INFO(times.size() << " evaluations, median gap " << median << " s");
  // The first comes about an interval after the start, and none comes sooner than the
  // interval after the one before. (That they keep to the interval's grid, 0.25, 0.5, ...
  // s, is the job timeline's case on a manual clock, in control_test.cpp: here, on a loaded
  // machine, an evaluation itself may take longer than the interval.)
  CHECK(times.front() >= 0.2);
  CHECK(times.front() < 0.5);
  CHECK(median >= 0.225);
}

TEST_CASE("k-sync and k-async jobs train to a working model") {
  for (const char* policy : {"ksync", "kasync"}) {
    auto cfg = small_job(policy);
    cfg.epochs = 3;
    cfg.policy_settings.k = 2;
    // Paced at one speed, the workers arrive in no fixed order: k-sync's dropped gradients
    // come from every share of the data, and k-async's staleness stays near k whatever
    // else loads the machine (unpaced on a loaded machine one worker can stay last, its
    // share never reaching a k-sync model and its gradients growing stale under k-async).
    cfg.speeds = {1.0};
    cfg.sample_ms = 0.2;
    if (std::string{policy} == "kasync") {
      // Updates without waiting, like ASP: a smaller step keeps stale gradients stable.
      cfg.optimizer.lr = 0.02f;
      cfg.optimizer.momentum = 0.5f;
    }
    auto rep = actors::run_local_job(cfg);
    INFO(policy);
    REQUIRE(rep);
    // k-sync applies 2 of 4 gradients a round: its 3 epochs of samples are about 1.5
    // epochs of updates. Measured 0.79-0.83 for both idle; with four busy loops beside
    // them on 2 cores 0.79-0.83 (k-sync) and 0.73-0.85 (k-async, whose last iterate is
    // noisier); an untrained model scores 0.1.
    CHECK(rep->test_accuracy >= 0.70);
    if (std::string{policy} == "kasync")
      CHECK(rep->dropped == 0);
  }
}

TEST_CASE("a contention interval makes a paced worker slower while it lasts") {
  ashlar::test::temp_dir dir;
  auto profile = dir.write("contention.txt", std::string{"1 0 1000 3\n"}); // worker 1: 3x, all run
  auto cfg = small_job("asp");
  cfg.workers = 2;
  cfg.epochs = 1;
  cfg.train_limit = 512;
  cfg.optimizer.lr = 0.02f;
  cfg.speeds = {1.0};
  cfg.sample_ms = 1.0;
  cfg.contention = profile;
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  REQUIRE(rep->per_worker.size() == 2);
  for (const auto& w : rep->per_worker) {
    double factor = w.worker_id == 1 ? 3.0 : 1.0;
    CHECK(w.compute_seconds == Approx(static_cast<double>(w.samples) * 1e-3 * factor).epsilon(0.02));
  }
  cfg.contention = dir.file("missing.txt");
  auto bad = actors::run_local_job(cfg);
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("missing.txt") != std::string::npos);
}

namespace {

// Two workers at speeds 1 and 4 on a small job (lr 0.05, momentum 0.5), for policies
// whose workers never wait for each other.
train_config paced_pair_job(const std::string& policy) {
  auto cfg = small_job(policy);
  cfg.epochs = 2;
  cfg.optimizer.lr = 0.05f;
  cfg.optimizer.momentum = 0.5f;
  cfg.workers = 2;
  cfg.speeds = {1, 4};
  // The fast worker's budget (2 ms x 32 = 64 ms a step) stays well above its real
  // compute even in a sanitizer build, so the 4x holds on a slow machine too.
  cfg.sample_ms = 2.0;
  cfg.train_limit = 6000;
  return cfg;
}

// The report's entries of worker 0 (slow) and worker 1 (fast).
std::pair<worker_summary, worker_summary> slow_and_fast(const run_report& rep) {
  REQUIRE(rep.per_worker.size() == 2);
  const auto& a = rep.per_worker[0];
  const auto& b = rep.per_worker[1];
  return a.worker_id == 0 ? std::make_pair(a, b) : std::make_pair(b, a);
}

}  // namespace

TEST_CASE("ADSP workers at speeds 1 and 4 commit about equally often, never wait, and train") {
  auto rep = actors::run_local_job(paced_pair_job("adsp"));
  REQUIRE(rep);
  auto [slow, fast] = slow_and_fast(*rep);
  // The fast worker does about 4x the steps ...
  CHECK(fast.steps * 10 > 25 * slow.steps);
  // ... but commits (shard versions) come from both at about the same rate: far fewer
  // versions than steps, and no policy wait.
  uint64_t steps = fast.steps + slow.steps;
  CHECK(rep->versions < steps); // 2 shards: versions would be 2 x steps without local steps
  CHECK(slow.wait_seconds == 0);
  CHECK(fast.wait_seconds == 0);
  CHECK(rep->test_accuracy >= 0.7);
}

namespace {

// Step lines of a metrics file, and how many of them pulled (pull_seconds not 0).
std::pair<int, int> steps_and_pulls(const std::string& path) {
  std::ifstream in{path};
  std::string line;
  int steps = 0, pulls = 0;
  while (std::getline(in, line)) {
    if (line.find("\"type\":\"step\"") == std::string::npos)
      continue;
    ++steps;
    pulls += line.find("\"pull_seconds\":0,") == std::string::npos;
  }
  return {steps, pulls};
}

}  // namespace

TEST_CASE("ADSP with overlapped commits pulls behind the local steps, never before one, and trains") {
  ashlar::test::temp_dir dir;
  auto plain = paced_pair_job("adsp");
  plain.metrics = dir.file("plain.jsonl");
  auto overlapped = plain;
  overlapped.overlap_commits = true;
  overlapped.metrics = dir.file("overlapped.jsonl");
  auto a = actors::run_local_job(plain);
  auto b = actors::run_local_job(overlapped);
  REQUIRE(a);
  REQUIRE(b);
  auto [steps_a, pulls_a] = steps_and_pulls(plain.metrics);
  auto [steps_b, pulls_b] = steps_and_pulls(overlapped.metrics);
  INFO("plain: " << pulls_a << " of " << steps_a << " steps pulled; overlapped: " << pulls_b << " of " << steps_b);
  // Without overlap a step pulls after every commit; with it, only the steps before the
  // plan's first local steps do (the pull of each commit lands behind the next steps).
  CHECK(pulls_a > 20);
  CHECK(pulls_b * 2 < pulls_a);
  CHECK(pulls_a - pulls_b >= 20);
  // Commits still reach the shards about as often, and the model trains as well.
  CHECK(b->versions * 2 > a->versions);
  CHECK(b->versions < static_cast<uint64_t>(steps_b));
  CHECK(b->test_accuracy >= 0.7);
  // Two epochs of 6000 samples end on the steep part of the curve, where the workers'
  // interleaving alone moves one run's accuracy by about +-0.03 (12 pairs on a loaded
  // 2-core machine: plain 0.76-0.82, overlapped 0.75-0.82, differences up to 0.06);
  // 0.1 is about three spreads.
  CHECK(b->test_accuracy > a->test_accuracy - 0.1);
}

namespace {

// Two lockstep workers at speeds 1 and 4 with batches proportional to speed.
train_config proportional_pair_job(const std::string& policy) {
  auto cfg = small_job(policy);
  cfg.epochs = 2;
  cfg.workers = 2;
  cfg.speeds = {1, 4};
  // 0.375 ms per sample for the fast worker: well above its real compute even on a
  // loaded machine, so the profiled speeds are the paced 1:4 (at 0.5 ms, CI's load
  // made the fast worker's compute overrun its budget and profile 2.3x).
  cfg.sample_ms = 1.5;
  cfg.allocation = allocation_mode::proportional;
  return cfg;
}

}  // namespace

TEST_CASE("BSP with proportional batches gives a 4x faster worker about 4x the samples of each round, and "
          "about 4x the data") {
  ashlar::test::temp_dir dir;
  auto cfg = proportional_pair_job("bsp");
  cfg.metrics = dir.file("run.jsonl");
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  // The scheduler's allocation event: "0:13 [0, 2437), 1:51 [2437, 12000)": each worker's
  // batch and its part of the 12000 training samples, in proportion.
  std::ifstream in{cfg.metrics};
  std::string line, shares;
  while (std::getline(in, line))
    if (line.find("\"batch shares\"") != std::string::npos)
      shares = line;
  INFO(shares);
  std::smatch m;
  REQUIRE(std::regex_search(shares, m, std::regex{R"(0:(\d+) \[0, (\d+)\), 1:(\d+) \[(\d+), 12000\))"}));
  const double b0 = std::stod(m[1]), end0 = std::stod(m[2]), b1 = std::stod(m[3]), begin1 = std::stod(m[4]);
  CHECK(end0 == begin1);
  CHECK((12000 - begin1) / end0 == Approx(b1 / b0).epsilon(0.05));
  auto [slow, fast] = slow_and_fast(*rep);
  // Lockstep: the same number of rounds each, at most the global batch (2 x 32) per
  // round (a batch is cut short where a worker's pass over the data set ends).
  CHECK(slow.steps == fast.steps);
  CHECK(slow.steps == (2 * 12000 + 63) / 64);
  CHECK(rep->samples <= slow.steps * 64);
  CHECK(rep->samples >= 2 * 12000 * 99 / 100);
  // After a few profiled steps at 32 each, the split is 13 / 51 (speeds 1 : 4).
  double ratio = static_cast<double>(fast.samples) / static_cast<double>(slow.samples);
  CHECK(ratio > 3.0);
  CHECK(ratio < 4.5);
  CHECK(rep->test_accuracy >= 0.75);
}

TEST_CASE("an unknown batch allocation is refused, naming the choices") {
  train_config cfg;
  auto err = apply_setting(cfg, "train.allocation", "greedy");
  CHECK(is(err, errc::invalid_config));
  CHECK(describe(err).find("(known: equal, proportional, adaptive, predicted)") != std::string::npos);
}

TEST_CASE("an ASHL job profiles, then commits less often from the fast worker, and trains") {
  auto cfg = paced_pair_job("ashl");
  cfg.ashl.profile_steps = 3;
  cfg.ashl.ahl_local_steps = 2;
  cfg.ashl.rule = ashl_rule::loss;
  cfg.ashl.switch_loss = 1.0; // reached early: both stages run
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  auto [slow, fast] = slow_and_fast(*rep);
  CHECK(fast.steps * 10 > 25 * slow.steps); // nobody waits for the slow worker
  // After profiling the fast worker takes ~4x the local steps per commit, so the shards
  // see far fewer versions than steps.
  CHECK(rep->versions < fast.steps + slow.steps);
  CHECK(rep->test_accuracy >= 0.7);
  // Each worker changed behaviour (CAF become) at each stage change: AHL, then SHL.
  CHECK(slow.stage_changes == 2);
  CHECK(fast.stage_changes == 2);
}

TEST_CASE("an ASHL job that finds communication costly compresses its pulls from AHL on, and trains") {
  auto dense_cfg = paced_pair_job("ashl");
  dense_cfg.ashl.profile_steps = 3;
  dense_cfg.ashl.pull_compress_above = 1e9; // never costly enough: dense pulls
  auto dense = actors::run_local_job(dense_cfg);
  REQUIRE(dense);
  auto cfg = dense_cfg;
  cfg.ashl.pull_compress_above = 0; // always costly enough: delta reads of 10%
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  // After profiling a commit pulls 10% of the range at 8 bytes an entry instead of all of
  // it at 4, and pushes 10% at 8 either way: (0.8 + 0.8) / (4 + 0.8) = 1/3 of the bytes.
  // Profiling's pulls (every step a commit) are dense in both jobs, about a quarter of
  // the dense job's bytes here: about 0.5 of the dense job's bytes in all.
  REQUIRE(rep->versions > 0);
  INFO("dense: " << dense->bytes << " bytes, " << dense->versions << " versions; delta: " << rep->bytes
                 << " bytes, " << rep->versions << " versions");
  CHECK(static_cast<double>(rep->bytes) < 0.65 * static_cast<double>(dense->bytes));
  CHECK(rep->test_accuracy >= 0.7);
}

TEST_CASE("top-k pushes move a fraction of the dense bytes and still train") {
  auto dense_cfg = small_job("bsp");
  dense_cfg.epochs = 2;
  auto dense = actors::run_local_job(dense_cfg);
  REQUIRE(dense);
  auto cfg = dense_cfg;
  cfg.topk_ratio = 0.05;
  auto sparse = actors::run_local_job(cfg);
  REQUIRE(sparse);
  REQUIRE(total_steps(*dense) == total_steps(*sparse));
  // A step pulls the dense parameters (4 bytes each) and pushes 5% of the gradient at 8
  // bytes an entry: (4 + 0.05 x 8) / (4 + 4) = 0.55 of a dense step's bytes.
  double ratio = static_cast<double>(sparse->bytes) / static_cast<double>(dense->bytes);
  CHECK(ratio == Approx(0.55).margin(0.01));
  // The report gives the uncompressed equivalent: the dense job's bytes, both times.
  CHECK(dense->dense_bytes == dense->bytes);
  CHECK(sparse->dense_bytes == dense->bytes);
  // Error feedback delays what is not sent, it does not lose it: the model still learns.
  CHECK(sparse->test_accuracy >= 0.72);
}

TEST_CASE("a ring all-reduce job follows the same trajectory as BSP over the shards") {
  auto cfg = small_job("bsp");
  cfg.epochs = 1;
  cfg.train_limit = 4000;
  std::vector<float> bsp, ring;
  auto b = actors::run_local_job(cfg, {}, &bsp);
  REQUIRE(b);
  cfg.policy = "ring";
  auto r = actors::run_local_job(cfg, {}, &ring);
  REQUIRE(r);
  REQUIRE(bsp.size() == ring.size());
  // The same mean gradient and optimizer each round, summed in another order.
  double diff = 0, norm = 0;
  for (size_t i = 0; i < bsp.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(bsp[i] - ring[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(bsp[i])));
  }
  INFO("max |bsp - ring| = " << diff << ", max |bsp| = " << norm);
  CHECK(diff < 1e-3 * norm);
  CHECK(r->samples == b->samples);
}

TEST_CASE("a ring job with proportional shares gives a 4x faster worker about 4x the samples, and trains") {
  auto rep = actors::run_local_job(proportional_pair_job("ring"));
  REQUIRE(rep);
  auto [slow, fast] = slow_and_fast(*rep);
  CHECK(slow.steps == fast.steps); // lockstep rounds
  double ratio = static_cast<double>(fast.samples) / static_cast<double>(slow.samples);
  CHECK(ratio > 3.0);
  CHECK(ratio < 4.5);
  CHECK(rep->test_accuracy >= 0.75);
}

TEST_CASE("delta pulls move a fraction of the dense bytes, both ways compressed, and still train") {
  auto dense_cfg = small_job("bsp");
  dense_cfg.epochs = 2;
  auto dense = actors::run_local_job(dense_cfg);
  REQUIRE(dense);
  auto cfg = dense_cfg;
  cfg.topk_ratio = 0.05;
  cfg.pull_topk_ratio = 0.05;
  auto sparse = actors::run_local_job(cfg);
  REQUIRE(sparse);
  REQUIRE(total_steps(*dense) == total_steps(*sparse));
  // Each worker's first pull per shard is dense (it starts the shard's view); every
  // other pull and every push carries 5% at 8 bytes an entry: 0.1 of a dense step's bytes,
  // plus the first pulls' share.
  const double steps_per_worker = static_cast<double>(total_steps(*sparse)) / 4;
  const double expected = 0.1 + 0.9 * 0.5 / steps_per_worker;
  double ratio = static_cast<double>(sparse->bytes) / static_cast<double>(dense->bytes);
  CHECK(ratio == Approx(expected).margin(0.01));
  CHECK(sparse->dense_bytes == dense->bytes);
  auto json = to_json(*sparse);
  CHECK(json.find("\"dense_bytes\": " + std::to_string(dense->bytes)) != std::string::npos);
  CHECK(json.find("\"compression_ratio\": ") != std::string::npos);
  // The workers train on parameters that lag the shards' by what is not sent yet.
  CHECK(sparse->test_accuracy >= 0.72);
}

TEST_CASE("a job with run.target_accuracy stops at the first evaluation that reaches it") {
  auto cfg = small_job("bsp");
  cfg.epochs = 200; // far more than the target needs: the target, not the epochs, ends it
  cfg.eval_interval = 0.25;
  cfg.target_accuracy = 0.7;
  cfg.time_limit = 120;
  auto rep = actors::run_local_job(cfg);
  REQUIRE(rep);
  CHECK(rep->target_reached);
  CHECK_FALSE(rep->time_limited);
  CHECK(rep->epochs_trained < 200);
  // Mid-run evaluations below the target, then the one that reached it; the final
  // evaluation of the stopped model comes after.
  REQUIRE(rep->history.size() >= 2);
  size_t first = 0;
  while (first < rep->history.size() && rep->history[first].test_accuracy < 0.7)
    ++first;
  REQUIRE(first < rep->history.size());
  CHECK(rep->history.size() <= first + 3); // it stopped within a couple of evaluations
  CHECK(rep->seconds < 60);
}
