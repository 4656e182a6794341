#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/core/clock.hpp"
#include <map>

#include "runtime/metrics/cluster_profile.hpp"
#include "runtime/metrics/metric_target.hpp"

using namespace ashlar;

TEST_CASE("a metric target parses NAME OP VALUE and says where a text is wrong") {
  auto t = parse_metric_target("val_ppl <= 150");
  REQUIRE(t);
  CHECK(t->name == "val_ppl");
  CHECK(t->op == metric_target::cmp::le);
  CHECK(t->value == 150);
  CHECK(t->met(150));
  CHECK(t->met(149.9));
  CHECK_FALSE(t->met(150.1));
  CHECK_FALSE(t->met(std::nan("")));
  CHECK(t->text() == "val_ppl <= 150");

  auto ge = parse_metric_target("test_accuracy>=0.9");
  REQUIRE(ge);
  CHECK(ge->name == "test_accuracy");
  CHECK(ge->met(0.9));
  CHECK_FALSE(ge->met(0.89));
  auto lt = parse_metric_target("  val.loss-2 < 1e-3 ");
  REQUIRE(lt);
  CHECK(lt->name == "val.loss-2");
  CHECK_FALSE(lt->met(1e-3));
  CHECK(lt->met(5e-4));
  auto gt = parse_metric_target("bleu > 30");
  REQUIRE(gt);
  CHECK_FALSE(gt->met(30));
  CHECK(gt->met(30.5));

  for (const char* bad : {"val_ppl", "val_ppl == 150", "<= 150", "val ppl <= 150", "val_ppl <= fast", "val_ppl <=",
                          "val_ppl <= 150x", "val_ppl <= inf"}) {
    auto e = parse_metric_target(bad);
    INFO(bad);
    REQUIRE_FALSE(e);
    CHECK(is(e.error(), errc::invalid_config));
    CHECK_THAT(describe(e.error()), Catch::Contains("run.target") && Catch::Contains(bad));
  }
  CHECK(metric_name_error(std::string(64, 'a')) == nullptr);
  CHECK(metric_name_error(std::string(65, 'a')) != nullptr);
  CHECK(metric_name_error("a=b") != nullptr);
}

TEST_CASE("the job takes each report of the scripts' metrics once, keeps the last of each name, and stops at the "
          "first that meets its target") {
  manual_clock clock;
  cluster_profile profile(0.5, 0.25, clock);
  for (uint32_t w = 0; w < 4; ++w)
    profile.membership(w, false);
  std::map<uint32_t, uint64_t> steps;
  auto step = [&](uint32_t worker, uint32_t samples, std::vector<wire::named_value> metrics) {
    wire::profile_report r;
    r.worker_id = worker;
    r.step = steps[worker]++;
    r.samples = samples;
    r.compute_ns = 1000000;
    r.metrics = std::move(metrics);
    profile.observe(r);
  };
  metric_log log{*parse_metric_target("val_ppl <= 150")};
  auto epoch = [](uint64_t samples) { return static_cast<double>(samples) / 1000.0; };
  step(0, 100, {});
  CHECK(profile.stats().metric_reports.empty());
  step(0, 100, {{"val_ppl", 300}, {"val_loss", 5.7}});
  step(1, 100, {});
  auto got = log.take(profile.stats().metric_reports, 1.5, epoch);
  REQUIRE(got.size() == 1);
  CHECK(got[0].samples == 200);
  CHECK(got[0].epoch == Approx(0.2));
  CHECK(got[0].seconds == 1.5);
  CHECK(got[0].values.size() == 2);
  CHECK(log.met_by() == nullptr);
  CHECK(log.take(profile.stats().metric_reports, 1.6, epoch).empty()); // taken once

  step(1, 100, {{"accuracy", 0.4}});
  step(0, 100, {{"val_ppl", 149}});
  step(0, 100, {{"val_ppl", 120}});
  got = log.take(profile.stats().metric_reports, 2.0, epoch);
  REQUIRE(got.size() == 3);
  REQUIRE(log.met_by() != nullptr);
  CHECK(log.met_by()->samples == 500); // the first that met it, not the last
  CHECK(log.met_by()->worker_id == 0);
  REQUIRE(log.last().size() == 3);
  CHECK(log.last()[0] == std::make_pair(std::string{"val_ppl"}, 120.0));
  CHECK(log.last()[1] == std::make_pair(std::string{"val_loss"}, 5.7));
  CHECK(log.last()[2] == std::make_pair(std::string{"accuracy"}, 0.4));
  CHECK(log.missed() == 0);

  // More reports than the profile keeps between two looks: the ones that fell out are counted.
  for (size_t i = 0; i < cluster_profile::kept_reports + 5; ++i)
    step(2, 1, {{"val_ppl", 100.0 + static_cast<double>(i)}});
  got = log.take(profile.stats().metric_reports, 3.0, epoch);
  CHECK(got.size() == cluster_profile::kept_reports);
  CHECK(log.missed() == 5);
  CHECK(log.last()[0].second == 100.0 + cluster_profile::kept_reports + 4);

  // Badly named metrics (a worker's own backend) never reach the job: its labels and keys.
  step(3, 1, {{"bad\"} 1\nashlar_x{", 1.0}, {"", 2.0}, {"ok", 3.0}});
  const auto last = profile.stats().metric_reports.back();
  REQUIRE(last.values.size() == 1);
  CHECK(last.values[0].name == "ok");

  metric_log none;
  CHECK(none.take(profile.stats().metric_reports, 3.0, epoch).size() == cluster_profile::kept_reports);
  CHECK(none.met_by() == nullptr);
}
