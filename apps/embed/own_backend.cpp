// A host application that trains a model Ashlar does not describe, with a compute backend
// of its own: Ashlar's shards, policies, allocation and checkpoints move the parameters,
// the host computes the gradients. Here the host's "network" is a hand-written softmax
// regression; a real host would call its own library (LibTorch, ONNX Runtime, ...) in
// train_step and evaluate. Build target: ashlar-embed-backend-example.
//
//   ashlar-embed-backend-example [EPOCHS] [TRAIN_LIMIT]
//
// The model is described to Ashlar as one `external` layer: its parameter count and its
// output width. The shards split those parameters like any others; every worker of this
// process (and the test evaluations) compute through the host's backend, handed over
// in job_hooks::make_backend (join_options::make_backend does the same for a process
// that joins a cluster).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "actors/local_job.hpp"
#include "runtime/core/log.hpp"

using namespace ashlar;

namespace {

// Softmax regression on flattened images: logits = W x + b, W [classes x dim], then b.
class softmax_regression final : public compute_backend {
public:
  explicit softmax_regression(model_spec spec) : spec_(std::move(spec)) {
  }
  const char* name() const override {
    return "host:softmax-regression";
  }
  const model_spec& spec() const override {
    return spec_;
  }
  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override {
    return run(params, b, grad);
  }
  expected<batch_stats> evaluate(const float* params, batch_view b) override {
    return run(params, b, nullptr);
  }

private:
  expected<batch_stats> run(const float* p, batch_view b, float* grad) {
    if (auto err = check_batch(spec_, b))
      return err;
    const size_t dim = b.dim, classes = spec_.classes;
    const float* w = p;
    const float* bias = p + classes * dim;
    if (grad)
      std::fill(grad, grad + classes * dim + classes, 0.0f);
    batch_stats s;
    s.n = b.n;
    std::vector<double> z(classes);
    for (size_t r = 0; r < b.n; ++r) {
      const float* x = b.x + r * dim;
      double mx = -1e300;
      size_t arg = 0;
      for (size_t c = 0; c < classes; ++c) {
        double acc = bias[c];
        for (size_t j = 0; j < dim; ++j)
          acc += double{w[c * dim + j]} * x[j];
        z[c] = acc;
        if (acc > mx) {
          mx = acc;
          arg = c;
        }
      }
      double sum = 0;
      for (size_t c = 0; c < classes; ++c)
        sum += std::exp(z[c] - mx);
      s.loss_sum += std::log(sum) - (z[b.y[r]] - mx);
      s.correct += arg == b.y[r];
      if (!grad)
        continue;
      for (size_t c = 0; c < classes; ++c) {
        const auto d = static_cast<float>((std::exp(z[c] - mx) / sum - (c == b.y[r] ? 1.0 : 0.0)) / b.n);
        for (size_t j = 0; j < dim; ++j)
          grad[c * dim + j] += d * x[j];
        grad[classes * dim + c] += d;
      }
    }
    if (!std::isfinite(s.loss_sum))
      return make_error(errc::numerical_error, "softmax regression: the loss is not finite");
    return s;
  }

  model_spec spec_;
};

}  // namespace

int main(int argc, char** argv) {
  if (auto err = init_logging("warn", "host"))
    return 2;
  train_config cfg;
  cfg.epochs = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 3;
  cfg.train_limit = argc > 2 ? static_cast<uint64_t>(std::atoll(argv[2])) : 0;
  cfg.workers = 2;
  cfg.servers = 2;
  cfg.optimizer.lr = 0.1f;
  cfg.progress_interval = 0;
  cfg.log_level = "warn";
  cfg.gpus = "none";
  // The model Ashlar does not describe: its parameter count and output, nothing more.
  const uint64_t params = uint64_t{cfg.model.classes} * cfg.model.input.size() + cfg.model.classes;
  auto layers = parse_layers("external name=host params=" + std::to_string(params));
  if (!layers)
    return 2;
  cfg.model.layers = *layers;

  actors::job_hooks hooks;
  hooks.make_backend = [](const model_spec& spec) {
    return actors::backend_choice{std::make_unique<softmax_regression>(spec), "on the host's softmax regression"};
  };
  auto report = actors::run_local_job(cfg, hooks);
  if (!report) {
    std::fprintf(stderr, "host: %s\n", describe(report.error()).c_str());
    return 1;
  }
  std::printf("host backend: test accuracy %.4f after %u epochs (%llu parameters computed by the host)\n",
              report->test_accuracy, cfg.epochs, static_cast<unsigned long long>(params));
  return 0;
}
