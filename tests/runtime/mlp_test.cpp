#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/backend/cpu_backend.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/model/mlp.hpp"

using namespace ashlar;

TEST_CASE("the MLP gradient matches central finite differences") {
  mlp_spec spec;
  spec.input = 6;
  spec.hidden = {5, 4};
  spec.classes = 3;
  auto data = make_synthetic(8, spec.input, spec.classes, 11);
  auto params = init_params(spec, 5);
  // Small random biases too, so every bias gradient is exercised away from zero.
  for (const auto& l : layer_layout(spec))
    for (uint32_t i = 0; i < l.out; ++i)
      params[l.bias + i] = 0.05f * static_cast<float>((i % 3)) - 0.05f;
  auto backend = make_cpu_backend(spec);
  std::vector<float> grad(params.size());
  auto stats = backend->train_step(params.data(), data.all(), grad.data());
  REQUIRE(stats);
  CHECK(stats->n == 8);

  // The loss in double precision around params, by a forward pass.
  auto loss_at = [&](std::vector<float>& p) {
    auto s = backend->evaluate(p.data(), data.all());
    REQUIRE(s);
    return s->mean_loss();
  };
  const float h = 1e-2f;
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto p = params;
    p[i] = params[i] + h;
    double up = loss_at(p);
    p[i] = params[i] - h;
    double down = loss_at(p);
    double numeric = (up - down) / (2.0 * h);
    double err = std::abs(numeric - grad[i]) / std::max(1e-2, std::abs(numeric) + std::abs(grad[i]));
    worst = std::max(worst, err);
  }
  CHECK(worst < 2e-2);
}

TEST_CASE("a batch whose width differs from the model is refused") {
  mlp_spec spec;
  spec.input = 6;
  spec.hidden = {4};
  spec.classes = 3;
  auto data = make_synthetic(4, 5, 3, 1);
  auto params = init_params(spec, 1);
  std::vector<float> grad(params.size());
  auto r = make_cpu_backend(spec)->train_step(params.data(), data.all(), grad.data());
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::shape_mismatch));
}

TEST_CASE("a label outside the model's classes is refused") {
  mlp_spec spec;
  spec.input = 3;
  spec.hidden = {};
  spec.classes = 2;
  std::vector<float> x(3, 0.5f);
  std::vector<uint8_t> y{7};
  auto params = init_params(spec, 1);
  std::vector<float> grad(params.size());
  auto r = make_cpu_backend(spec)->train_step(params.data(), batch_view{x.data(), y.data(), 1, 3},
                                              grad.data());
  REQUIRE_FALSE(r);
  CHECK(describe(r.error()).find("label 7") != std::string::npos);
}

TEST_CASE("the same seed gives the same initial parameters, another seed others") {
  mlp_spec spec;
  auto a = init_params(spec, 42), b = init_params(spec, 42), c = init_params(spec, 43);
  CHECK(a == b);
  CHECK(a != c);
}
