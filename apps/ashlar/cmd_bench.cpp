// `ashlar bench step`: the CPU backend's training step time (forward, backward and the
// SGD update) per sample, for comparison with other frameworks on the same MLP.
#include <chrono>
#include <cstdio>

#include "apps/ashlar/commands.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/optim/sgd.hpp"

namespace ashlar::cli {

namespace {

struct bench_options {
  uint32_t batch = 64;
  std::string hidden = "256,128";
  uint32_t steps = 300;
  uint32_t warmup = 30;
  int threads = 1;
  bool json = false;
};

int run_step_bench(const bench_options& o) {
  train_config cfg;
  if (auto err = apply_setting(cfg, "model.hidden", o.hidden)) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(err).c_str());
    return 2;
  }
  if (o.batch == 0 || o.steps == 0) {
    std::fprintf(stderr, "ashlar bench: --batch and --steps must be at least 1\n");
    return 2;
  }
  set_blas_threads(o.threads);
  const auto& spec = cfg.model;
  auto data = make_synthetic(size_t{o.batch} * 16, spec.input, spec.classes, 7);
  auto params = init_params(spec, 1);
  std::vector<float> grad(params.size()), velocity(params.size());
  sgd_config opt;
  opt.lr = 0.01f;
  auto backend = make_cpu_backend(spec);
  batch_cursor cursor{data, 0, data.n, 3};
  auto step = [&] {
    auto b = cursor.next(o.batch);
    auto s = backend->train_step(params.data(), b, grad.data());
    if (!s)
      return false;
    sgd_apply(opt, 1.0f, params.data(), velocity.data(), grad.data(), params.size());
    return true;
  };
  for (uint32_t i = 0; i < o.warmup; ++i)
    if (!step())
      return 1;
  auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < o.steps; ++i)
    if (!step())
      return 1;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double us_step = secs * 1e6 / o.steps;
  double us_sample = us_step / o.batch;
  if (o.json)
    std::printf("{\"framework\": \"ashlar\", \"model\": \"%s\", \"batch\": %u, \"threads\": %d, "
                "\"us_per_step\": %.3f, \"us_per_sample\": %.4f}\n",
                spec.to_string().c_str(), o.batch, o.threads, us_step, us_sample);
  else
    std::printf("ashlar cpu step: model %s, batch %u, %d thread(s): %.1f us/step, %.3f us/sample\n",
                spec.to_string().c_str(), o.batch, o.threads, us_step, us_sample);
  return 0;
}

}  // namespace

command_fn add_bench(CLI::App& app) {
  auto o = std::make_shared<bench_options>();
  auto* cmd = app.add_subcommand("bench", "Benchmarks that print figures");
  cmd->require_subcommand(1);
  auto* step = cmd->add_subcommand("step", "CPU training step time per sample (forward, backward, SGD)");
  step->add_option("--batch", o->batch, "mini-batch size")->capture_default_str();
  step->add_option("--hidden", o->hidden, "hidden widths, comma-separated")->capture_default_str();
  step->add_option("--steps", o->steps, "timed steps")->capture_default_str();
  step->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  step->add_option("--threads", o->threads, "OpenBLAS threads")->capture_default_str();
  step->add_flag("--json", o->json, "print one JSON object");
  return [o, step] {
    if (step->parsed())
      return run_step_bench(*o);
    return 2;
  };
}

}  // namespace ashlar::cli
