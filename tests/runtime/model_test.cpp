#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "runtime/backend/cpu_backend.hpp"
#include "runtime/backend/cpu_layers.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/model/model.hpp"

using namespace ashlar;

namespace {

model_spec model_of(tensor_shape input, uint32_t classes, const std::string& layers) {
  model_spec m;
  m.input = input;
  m.classes = classes;
  auto l = parse_layers(layers);
  REQUIRE(l);
  m.layers = *l;
  return m;
}

std::string refusal(const model_spec& m) {
  auto p = compile(m);
  REQUIRE_FALSE(p);
  return describe(p.error());
}

// Worst relative difference between backprop's gradient and central finite differences
// of the evaluated loss, over every parameter where the loss is smooth within the step: a
// ReLU or max pooling whose kink lies within h of a sample makes the one-sided
// differences disagree, and central differences mean nothing there. At most a tenth of
// the parameters may be skipped so.
double worst_gradient_error(const model_spec& spec, uint64_t seed, cpu_conv conv) {
  auto data = make_synthetic(6, spec.input.size(), spec.classes, seed);
  auto params = init_params(spec, seed);
  REQUIRE(params.size() == spec.num_params());
  // Nonzero biases and betas, so each of their gradients is exercised away from zero.
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i] == 0.0f)
      params[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  auto made = make_cpu_backend(spec, conv);
  REQUIRE(made);
  auto& backend = **made;
  std::vector<float> grad(params.size());
  REQUIRE(backend.train_step(params.data(), data.all(), grad.data()));
  auto loss_at = [&](std::vector<float>& p) {
    auto s = backend.evaluate(p.data(), data.all());
    REQUIRE(s);
    return s->mean_loss();
  };
  const float h = 2e-3f;
  double worst = 0;
  size_t kinks = 0;
  auto centre = params;
  const double mid = loss_at(centre);
  for (size_t i = 0; i < params.size(); ++i) {
    auto p = params;
    p[i] = params[i] + h;
    double up = loss_at(p);
    p[i] = params[i] - h;
    double down = loss_at(p);
    const double fwd = (up - mid) / h, bwd = (mid - down) / h;
    if (std::abs(fwd - bwd) > 0.05 * std::max({std::abs(fwd), std::abs(bwd), 1e-2})) {
      ++kinks;
      continue;
    }
    double numeric = (up - down) / (2.0 * h);
    double err = std::abs(numeric - grad[i]) / std::max(1e-2, std::abs(numeric) + std::abs(grad[i]));
    worst = std::max(worst, err);
  }
  CHECK(kinks * 10 <= params.size());
  return worst;
}

}  // namespace

TEST_CASE("the MLP short form compiles to the MLP's parameter layout and initial bits") {
  model_spec m;
  m.hidden = {256, 128};
  mlp_spec mlp;
  REQUIRE(m.num_params() == mlp.num_params());
  CHECK(init_params(m, 7) == init_params(mlp, 7));
  auto plan = compile(m);
  REQUIRE(plan);
  auto layers = layer_layout(mlp);
  size_t dense = 0;
  for (const auto& n : plan->nodes)
    if (n.spec.kind == layer_kind::dense) {
      CHECK(n.weight == layers[dense].weight);
      CHECK(n.bias == layers[dense].bias);
      ++dense;
    }
  CHECK(dense == 3);
  REQUIRE(m.as_mlp());
  CHECK(m.as_mlp()->to_string() == "784-256-128-10");
  CHECK(m.to_string() == "784-256-128-10");
  // The same MLP written out as layers is recognized as one; a CNN is not.
  auto written = model_of({1, 28, 28}, 10, "flatten; dense out=256; relu; dense out=128; relu; dense out=10");
  REQUIRE(written.as_mlp());
  CHECK(written.as_mlp()->hidden == std::vector<uint32_t>{256, 128});
  CHECK_FALSE(model_of({1, 8, 8}, 10, "conv2d out=2; flatten; dense out=10").as_mlp());
}

TEST_CASE("the layer text form round-trips and names layers by kind and index") {
  const std::string text = "conv2d name=c1 out=8 kernel=5 stride=2 padding=2; relu; maxpool kernel=3 stride=2 "
                           "padding=1; avgpool kernel=2; groupnorm groups=2 eps=0.001; layernorm eps=1e-05; "
                           "dropout p=0.3; add from=c1; conv2d input=c1 out=4 kernel=1; flatten; "
                           "dense out=10; external params=12 out=3";
  auto l = parse_layers(text);
  REQUIRE(l);
  REQUIRE(l->size() == 12);
  CHECK(layers_text(*l) == text);
  auto again = parse_layers(layers_text(*l));
  REQUIRE(again);
  CHECK(layers_text(*again) == text);
  model_spec m = model_of({1, 28, 28}, 10, "conv2d out=4 padding=1; relu; flatten; dense out=10");
  auto r = m.resolved();
  CHECK(r[0].name == "conv2d0");
  CHECK(r[3].name == "dense3");
}

TEST_CASE("a layer list that does not parse is refused naming the layer and the key") {
  auto bad_kind = parse_layers("conv2d out=4; softmax");
  REQUIRE_FALSE(bad_kind);
  CHECK(describe(bad_kind.error()).find("model.layers[1] 'softmax': unknown layer kind 'softmax'") != std::string::npos);
  auto bad_key = parse_layers("dense width=4");
  REQUIRE_FALSE(bad_key);
  CHECK(describe(bad_key.error()).find("dense takes no key 'width' (keys: name, input, out)") != std::string::npos);
  auto bad_value = parse_layers("conv2d out=-4");
  REQUIRE_FALSE(bad_value);
  CHECK(describe(bad_value.error()).find("out '-4' is not a non-negative integer") != std::string::npos);
  CHECK_FALSE(parse_layers("dense out"));
}

TEST_CASE("a layer that does not fit its input is refused in one line naming the layer, its index and both shapes") {
  CHECK(refusal(model_of({1, 28, 28}, 10, "conv2d out=4; dense out=10"))
        == "invalid_config: model.layers[1] 'dense1': dense needs a flat input (add flatten before it), got input "
           "4x26x26");
  CHECK(refusal(model_of({1, 4, 4}, 10, "conv2d out=2 kernel=7; flatten; dense out=10"))
          .find("model.layers[0] 'conv2d0': conv2d kernel 7 with padding 0 does not fit, got input 1x4x4")
        != std::string::npos);
  CHECK(refusal(model_of({3, 8, 8}, 10, "conv2d name=a out=4 padding=1; conv2d out=8 padding=1; add from=a; flatten; "
                                        "dense out=10"))
        == "invalid_config: model.layers[2] 'add2': add needs equal shapes, got input 8x8x8 and 'a' 4x8x8");
  CHECK(refusal(model_of({3, 8, 8}, 10, "groupnorm groups=2; flatten; dense out=10"))
          .find("groupnorm groups 2 must divide the channels, got input 3x8x8")
        != std::string::npos);
  CHECK(refusal(model_of({1, 28, 28}, 10, "flatten; dense out=7"))
          .find("the last layer's output must be the 10 classes (softmax cross-entropy), got 7")
        != std::string::npos);
  CHECK(refusal(model_of({1, 28, 28}, 10, "flatten; add from=nowhere; dense out=10"))
          .find("add from 'nowhere' names no earlier layer")
        != std::string::npos);
  CHECK(refusal(model_of({1, 28, 28}, 10, "flatten name=x; dense name=x out=10"))
          .find("the name is used by layer 0")
        != std::string::npos);
}

TEST_CASE("a config with model.layers is checked when it loads, from TOML strings, tables or --set text") {
  train_config cfg;
  REQUIRE_FALSE(apply_toml_text(cfg, R"(
[model]
input = [1, 28, 28]
layers = ["conv2d out=8 kernel=5 padding=2", "relu", "maxpool", "flatten", "dense out=10"]
)", "strings.toml"));
  CHECK_FALSE(validate(cfg));
  CHECK(cfg.model.layers.size() == 5);
  train_config tables;
  REQUIRE_FALSE(apply_toml_text(tables, R"(
[[model.layers]]
type = "conv2d"
out = 8
kernel = 5
padding = 2
[[model.layers]]
type = "relu"
[[model.layers]]
type = "maxpool"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
out = 10
)", "tables.toml"));
  CHECK(layers_text(tables.model.layers) == layers_text(cfg.model.layers));
  train_config set;
  REQUIRE_FALSE(apply_setting(set, "model.layers", setting_text(cfg, "model.layers")));
  CHECK(set.model.num_params() == cfg.model.num_params());
  // A shape error fails validation with the layer's line.
  train_config wrong;
  REQUIRE_FALSE(apply_toml_text(wrong, "[model]\nlayers = \"conv2d out=8; dense out=10\"\n", "wrong.toml"));
  auto err = validate(wrong);
  REQUIRE(err);
  CHECK(describe(err).find("model.layers[1] 'dense1': dense needs a flat input") != std::string::npos);
  // A bad layer in a file names the file and line.
  train_config bad;
  auto e = apply_toml_text(bad, "[model]\n\nlayers = [\"conv2d out=8\", \"pool\"]\n", "bad.toml");
  REQUIRE(e);
  CHECK(describe(e).find("bad.toml:3") != std::string::npos);
  CHECK(describe(e).find("unknown layer kind 'pool'") != std::string::npos);
}

TEST_CASE("every layer kind's gradient matches central finite differences") {
  const std::vector<std::pair<const char*, model_spec>> cases = {
    {"dense", model_of({2, 3, 3}, 3, "flatten; dense out=5; relu; dense out=3")},
    {"conv2d with stride and padding",
     model_of({2, 7, 7}, 3, "conv2d out=3 kernel=3 stride=2 padding=1; relu; flatten; dense out=3")},
    {"conv2d 1x1", model_of({3, 4, 4}, 3, "conv2d out=2 kernel=1; flatten; dense out=3")},
    {"conv2d whose stride leaves the last row and column unread",
     model_of({2, 6, 6}, 3, "conv2d out=3 kernel=3 padding=1; relu; conv2d out=2 kernel=1 stride=2; flatten; "
                            "dense out=3")},
    {"two conv2d (input gradient)",
     model_of({2, 6, 6}, 3, "conv2d out=3 kernel=3 padding=1; relu; conv2d out=2 kernel=2 stride=2; flatten; "
                            "dense out=3")},
    {"maxpool with padding",
     model_of({2, 6, 6}, 3, "conv2d out=3 kernel=3 padding=1; maxpool kernel=3 stride=2 padding=1; flatten; "
                            "dense out=3")},
    {"avgpool", model_of({2, 6, 6}, 3, "conv2d out=3 kernel=3 padding=1; avgpool kernel=2; flatten; dense out=3")},
    {"groupnorm",
     model_of({2, 5, 5}, 3, "conv2d out=4 kernel=3 padding=1; groupnorm groups=2; relu; flatten; dense out=3")},
    {"layernorm", model_of({8, 1, 1}, 3, "dense out=6; layernorm; relu; dense out=3")},
    {"dropout (identity in evaluation, p=0 in training)",
     model_of({4, 1, 1}, 3, "dense out=5; dropout p=0; relu; dense out=3")},
    {"residual add and a projection shortcut",
     model_of({2, 6, 6}, 3, "conv2d name=a out=2 kernel=3 padding=1; relu; conv2d name=b out=2 kernel=3 padding=1; "
                            "add name=s from=a; conv2d name=p input=a out=2 kernel=1; add from=s; relu; flatten; "
                            "dense out=3")},
  };
  for (auto conv : {cpu_conv::im2col, cpu_conv::onednn})
    for (const auto& [what, spec] : cases) {
      INFO(what << (conv == cpu_conv::onednn ? " (oneDNN convolutions)" : " (im2col convolutions)"));
      REQUIRE_FALSE(validate(spec));
      auto worst = worst_gradient_error(spec, 11, conv);
      CHECK(worst < 2e-2);
    }
}

TEST_CASE("oneDNN's and im2col's convolutions give the same gradients on a CNN batch, and the default picks one by "
          "measurement") {
  // Both convolutions, a shared input (a residual branch) and a strided, padded layer.
  auto spec = model_of({3, 16, 16}, 5, "conv2d name=a out=8 kernel=5 padding=2; relu; conv2d name=b out=8 kernel=3 "
                                       "padding=1; add from=a; maxpool; conv2d out=6 kernel=3 stride=2 padding=1; "
                                       "relu; flatten; dense out=5");
  auto data = make_synthetic(40, spec.input.size(), spec.classes, 5);
  auto params = init_params(spec, 5);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (auto conv : {cpu_conv::im2col, cpu_conv::onednn, cpu_conv::measure}) {
    auto b = make_cpu_backend(spec, conv);
    REQUIRE(b);
    std::vector<float> grad(params.size());
    auto s = (*b)->train_step(params.data(), data.all(), grad.data());
    REQUIRE(s);
    losses.push_back(s->mean_loss());
    grads.push_back(grad);
    const auto details = (*b)->details();
    INFO(details);
    if (conv == cpu_conv::onednn)
      CHECK(details.find("a: onednn") != std::string::npos);
    if (conv == cpu_conv::measure)
      CHECK(details.find(" us/sample") != std::string::npos);
    if (conv == cpu_conv::im2col)
      CHECK(details.empty());
  }
  for (size_t k = 1; k < grads.size(); ++k) {
    CHECK(losses[k] == Approx(losses[0]).epsilon(1e-5));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < params.size(); ++i)
      scale = std::max(scale, static_cast<double>(std::abs(grads[0][i])));
    for (size_t i = 0; i < params.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(grads[k][i]) - grads[0][i]) / scale);
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("a CPU backend that gives its step's memory back between steps computes the same gradients, bit for "
          "bit, at any batch size") {
  // (Without dropout: each backend draws its masks from a stream of its own.)
  auto spec = model_of({3, 8, 8}, 4, "conv2d out=4 kernel=3 padding=1; groupnorm groups=2; relu; maxpool; "
                                     "flatten; dense out=4");
  auto data = make_synthetic(24, spec.input.size(), spec.classes, 3);
  auto params = init_params(spec, 3);
  auto kept = make_cpu_backend(spec, cpu_conv::im2col);
  auto given = make_cpu_backend(spec, cpu_conv::im2col);
  REQUIRE(kept);
  REQUIRE(given);
  const auto all = data.all();
  for (size_t n : {8, 24, 4, 24}) {
    batch_view b{all.x, all.y, n, all.dim};
    std::vector<float> g1(params.size()), g2(params.size());
    auto s1 = (*kept)->train_step(params.data(), b, g1.data());
    auto s2 = (*given)->train_step(params.data(), b, g2.data());
    (*given)->release_scratch();
    REQUIRE(s1);
    REQUIRE(s2);
    CHECK(s1->loss_sum == s2->loss_sum);
    CHECK(g1 == g2);
  }
}

TEST_CASE("dropout zeroes a fraction p of the activations, scales the rest by 1/(1-p), and backward uses the same "
          "mask") {
  auto plan = compile(model_of({1000, 1, 1}, 2, "dropout p=0.3; dense out=2"));
  REQUIRE(plan);
  const auto& node = plan->nodes[0];
  std::vector<float> x(1000, 2.0f), y(1000), mask(1000), mask2(1000), dy(1000, 1.0f), dx(1000, 0.0f);
  cpu::dropout_forward(node, 1000, x.data(), y.data(), mask.data(), 42);
  size_t zero = 0;
  for (size_t i = 0; i < 1000; ++i) {
    if (y[i] == 0.0f)
      ++zero;
    else
      CHECK(y[i] == Approx(2.0 / 0.7));
  }
  CHECK(zero > 240);
  CHECK(zero < 360);
  cpu::dropout_forward(node, 1000, x.data(), y.data(), mask2.data(), 42);
  CHECK(mask == mask2);
  cpu::dropout_forward(node, 1000, x.data(), y.data(), mask2.data(), 43);
  CHECK(mask != mask2);
  cpu::dropout_backward(1000, mask.data(), dy.data(), dx.data(), false);
  CHECK(dx == mask);
}

TEST_CASE("an external layer is refused by the CPU backend with the reason") {
  auto m = model_of({1, 28, 28}, 10, "external params=100");
  REQUIRE_FALSE(validate(m));
  CHECK(m.num_params() == 100);
  auto b = make_cpu_backend(m);
  REQUIRE_FALSE(b);
  CHECK(describe(b.error()).find("only a host application's own backend computes it") != std::string::npos);
}

TEST_CASE("a CNN trains on the CPU: the loss falls over a few steps of SGD") {
  auto spec = model_of({1, 12, 12}, 4, "conv2d out=4 kernel=3 padding=1; relu; maxpool; groupnorm groups=2; flatten; "
                                       "dropout p=0.1; dense out=4");
  auto data = make_synthetic(64, spec.input.size(), 4, 3);
  auto params = init_params(spec, 3);
  auto b = make_cpu_backend(spec);
  REQUIRE(b);
  std::vector<float> grad(params.size());
  auto first = (*b)->evaluate(params.data(), data.all());
  REQUIRE(first);
  for (int step = 0; step < 30; ++step) {
    REQUIRE((*b)->train_step(params.data(), data.all(), grad.data()));
    for (size_t i = 0; i < params.size(); ++i)
      params[i] -= 0.05f * grad[i];
  }
  auto last = (*b)->evaluate(params.data(), data.all());
  REQUIRE(last);
  CHECK(last->mean_loss() < 0.5 * first->mean_loss());
}

TEST_CASE("a compiled model says which nodes share their input's buffers and which need output gradients") {
  // 0 relu (no parameters upstream), 1 flatten (shares relu's), 2 dense, 3 dropout p=0
  // (shares dense's), 4 dense, 5 flatten (the last node: its own buffers)
  auto plan = compile(model_of({1, 4, 4}, 10, "relu; flatten; dense out=8; dropout p=0; dense out=10; flatten"));
  REQUIRE(plan);
  CHECK(plan->output_owners() == std::vector<int>{0, 0, 2, 2, 4, 5});
  CHECK(plan->gradients_needed() == std::vector<bool>{false, false, true, true, true, true});
  // A flatten straight on the input shares the batch itself.
  auto direct = compile(model_of({1, 4, 4}, 10, "flatten; dense out=10"));
  REQUIRE(direct);
  CHECK(direct->output_owners() == std::vector<int>{-1, 1});
}
