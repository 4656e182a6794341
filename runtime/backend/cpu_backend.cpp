#include "runtime/backend/cpu_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <cblas.h>

#include "runtime/backend/cpu_layers.hpp"

namespace ashlar {

compute_backend::~compute_backend() = default;

std::shared_ptr<void> compute_backend::lock_host_memory(void*, size_t) {
  return nullptr;
}

caf::error check_batch(const model_spec& spec, batch_view b) {
  if (b.n == 0)
    return make_error(errc::shape_mismatch, "empty batch");
  if (b.dim != spec.input.size())
    return make_error(errc::shape_mismatch, "batch rows have " + std::to_string(b.dim) + " features, model "
                                              + spec.to_string() + " expects " + std::to_string(spec.input.size())
                                              + " (" + spec.input.to_string() + ")");
  for (size_t i = 0; i < b.n; ++i)
    if (b.y[i] >= spec.classes)
      return make_error(errc::shape_mismatch, "label " + std::to_string(b.y[i]) + " of row " + std::to_string(i)
                                                + " is not below " + std::to_string(spec.classes) + " classes");
  return caf::none;
}

void set_blas_threads(int n) {
  openblas_set_num_threads(std::max(1, n));
}

namespace {

// Each backend draws its dropout masks from its own stream.
std::atomic<uint64_t> backend_instances{0};

// Executes a compiled model layer by layer. Activations of every node are kept for the
// backward pass; a node's output gradient accumulates from every node that reads it.
class cpu_backend final : public compute_backend {
public:
  cpu_backend(model_spec spec, model_plan plan)
    : spec_(std::move(spec)), plan_(std::move(plan)), seed_(0x5eed0000ULL + backend_instances++) {
    const auto count = plan_.nodes.size();
    acts_.resize(count);
    grads_.resize(count);
    aux_.resize(count);
    argmax_.resize(count);
    // A node's output gradient is needed only if parameters lie upstream of it.
    needs_grad_.assign(count, false);
    for (size_t i = 0; i < count; ++i) {
      const auto& n = plan_.nodes[i];
      needs_grad_[i] = n.param_count() > 0 || (n.input >= 0 && needs_grad_[static_cast<size_t>(n.input)])
                       || (n.from >= 0 && needs_grad_[static_cast<size_t>(n.from)]);
    }
  }

  const char* name() const override {
    return "cpu";
  }

  const model_spec& spec() const override {
    return spec_;
  }

  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override {
    if (auto err = check_batch(spec_, b))
      return err;
    reserve(b.n);
    ++steps_;
    forward(params, b, true);
    auto stats = softmax_loss(b, true);
    if (!std::isfinite(stats.loss_sum))
      return make_error(errc::numerical_error, "training loss is not finite (lr too high?)");
    backward(params, b, grad);
    return stats;
  }

  expected<batch_stats> evaluate(const float* params, batch_view b) override {
    if (auto err = check_batch(spec_, b))
      return err;
    // Parts whose activations stay within about 64 MB.
    const size_t per_sample = std::max<uint64_t>(plan_.activation_floats, 1) * sizeof(float);
    const size_t chunk = std::clamp<size_t>((size_t{64} << 20) / per_sample, 16, 1024);
    batch_stats total;
    for (size_t off = 0; off < b.n; off += chunk) {
      batch_view part{b.x + off * b.dim, b.y + off, std::min(chunk, b.n - off), b.dim};
      reserve(part.n);
      forward(params, part, false);
      auto s = softmax_loss(part, false);
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.n += s.n;
    }
    return total;
  }

private:
  void reserve(size_t n) {
    if (n <= capacity_)
      return;
    capacity_ = n;
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      const auto& node = plan_.nodes[i];
      const size_t size = n * node.out.size();
      acts_[i].assign(size, 0.0f);
      grads_[i].assign(size, 0.0f);
      switch (node.spec.kind) {
        case layer_kind::maxpool:
          argmax_[i].assign(size, 0);
          break;
        case layer_kind::dropout:
          aux_[i].assign(size, 0.0f);
          break;
        case layer_kind::groupnorm:
          aux_[i].assign(2 * n * node.spec.groups, 0.0f);
          break;
        default:
          break;
      }
    }
  }

  const float* input_of(int index, batch_view b) const {
    return index < 0 ? b.x : acts_[static_cast<size_t>(index)].data();
  }

  void forward(const float* p, batch_view b, bool training) {
    const size_t n = b.n;
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      const auto& node = plan_.nodes[i];
      const float* x = input_of(node.input, b);
      float* y = acts_[i].data();
      const size_t count = n * node.out.size();
      switch (node.spec.kind) {
        case layer_kind::dense:
          cpu::dense_forward(node, n, x, p + node.weight, p + node.bias, y);
          break;
        case layer_kind::conv2d:
          cpu::conv2d_forward(node, n, x, p + node.weight, p + node.bias, y, scratch_);
          break;
        case layer_kind::maxpool:
          cpu::maxpool_forward(node, n, x, y, argmax_[i].data());
          break;
        case layer_kind::avgpool:
          cpu::avgpool_forward(node, n, x, y);
          break;
        case layer_kind::relu:
          cpu::relu_forward(count, x, y);
          break;
        case layer_kind::flatten:
          std::copy(x, x + count, y);
          break;
        case layer_kind::dropout:
          if (training && node.spec.p > 0)
            cpu::dropout_forward(node, count, x, y, aux_[i].data(), seed_ * 0x100000001b3ULL + steps_ * 131 + i);
          else
            std::copy(x, x + count, y);
          break;
        case layer_kind::groupnorm:
          cpu::groupnorm_forward(node, n, x, p + node.weight, p + node.bias, y, aux_[i].data());
          break;
        case layer_kind::add: {
          const float* other = input_of(node.from, b);
          for (size_t k = 0; k < count; ++k)
            y[k] = x[k] + other[k];
          break;
        }
        case layer_kind::external:
          std::abort(); // refused by make_cpu_backend
      }
    }
  }

  // Softmax cross-entropy over the last node's logits; with `grad`, leaves dLoss/dLogits
  // (mean over the batch) in the last node's gradient.
  batch_stats softmax_loss(batch_view b, bool grad) {
    const size_t classes = plan_.classes;
    const float* logits = acts_.back().data();
    batch_stats s;
    s.n = b.n;
    const float inv_n = 1.0f / static_cast<float>(b.n);
    for (size_t r = 0; r < b.n; ++r) {
      const float* z = logits + r * classes;
      size_t arg = 0;
      float mx = z[0];
      for (size_t c = 1; c < classes; ++c)
        if (z[c] > mx) {
          mx = z[c];
          arg = c;
        }
      double sum = 0;
      for (size_t c = 0; c < classes; ++c)
        sum += std::exp(static_cast<double>(z[c] - mx));
      double log_sum = std::log(sum);
      s.loss_sum += log_sum - static_cast<double>(z[b.y[r]] - mx);
      s.correct += (arg == b.y[r]);
      if (grad) {
        float* d = grads_.back().data() + r * classes;
        for (size_t c = 0; c < classes; ++c)
          d[c] = static_cast<float>(std::exp(static_cast<double>(z[c] - mx) - log_sum)) * inv_n;
        d[b.y[r]] -= inv_n;
      }
    }
    return s;
  }

  // The gradient buffer a node's input gradient adds into, or null when nothing needs it
  // (the model's input, or a node with no parameters upstream).
  float* grad_of(int index) {
    return index < 0 || !needs_grad_[static_cast<size_t>(index)] ? nullptr : grads_[static_cast<size_t>(index)].data();
  }

  void backward(const float* p, batch_view b, float* g) {
    const size_t n = b.n;
    // Every gradient but the last (set by the loss) accumulates: start from zero.
    for (size_t i = 0; i + 1 < plan_.nodes.size(); ++i)
      std::fill(grads_[i].begin(), grads_[i].begin() + static_cast<std::ptrdiff_t>(n * plan_.nodes[i].out.size()),
                0.0f);
    for (size_t i = plan_.nodes.size(); i-- > 0;) {
      if (!needs_grad_[i])
        continue;
      const auto& node = plan_.nodes[i];
      const float* x = input_of(node.input, b);
      const float* y = acts_[i].data();
      const float* dy = grads_[i].data();
      float* dx = grad_of(node.input);
      const size_t count = n * node.out.size();
      switch (node.spec.kind) {
        case layer_kind::dense:
          cpu::dense_backward(node, n, x, p + node.weight, dy, g + node.weight, g + node.bias, dx);
          break;
        case layer_kind::conv2d:
          cpu::conv2d_backward(node, n, x, p + node.weight, dy, g + node.weight, g + node.bias, dx, scratch_);
          break;
        case layer_kind::maxpool:
          if (dx)
            cpu::maxpool_backward(node, n, argmax_[i].data(), dy, dx);
          break;
        case layer_kind::avgpool:
          if (dx)
            cpu::avgpool_backward(node, n, dy, dx);
          break;
        case layer_kind::relu:
          if (dx)
            cpu::relu_backward(count, y, dy, dx);
          break;
        case layer_kind::flatten:
          if (dx)
            for (size_t k = 0; k < count; ++k)
              dx[k] += dy[k];
          break;
        case layer_kind::dropout:
          if (dx) {
            if (node.spec.p > 0)
              cpu::dropout_backward(count, aux_[i].data(), dy, dx);
            else
              for (size_t k = 0; k < count; ++k)
                dx[k] += dy[k];
          }
          break;
        case layer_kind::groupnorm:
          cpu::groupnorm_backward(node, n, x, p + node.weight, aux_[i].data(), dy, g + node.weight, g + node.bias,
                                  dx);
          break;
        case layer_kind::add: {
          if (dx)
            for (size_t k = 0; k < count; ++k)
              dx[k] += dy[k];
          if (float* dother = grad_of(node.from))
            for (size_t k = 0; k < count; ++k)
              dother[k] += dy[k];
          break;
        }
        case layer_kind::external:
          std::abort();
      }
    }
  }

  model_spec spec_;
  model_plan plan_;
  uint64_t seed_;
  uint64_t steps_ = 0;
  size_t capacity_ = 0;
  std::vector<std::vector<float>> acts_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> aux_;        // dropout masks, groupnorm statistics
  std::vector<std::vector<uint32_t>> argmax_;  // maxpool winners
  std::vector<bool> needs_grad_;
  std::vector<float> scratch_;
};

}  // namespace

expected<std::unique_ptr<compute_backend>> make_cpu_backend(const model_spec& spec) {
  auto plan = compile(spec);
  if (!plan)
    return plan.error();
  for (size_t i = 0; i < plan->nodes.size(); ++i)
    if (plan->nodes[i].spec.kind == layer_kind::external)
      return make_error(errc::unknown_name, "model.layers[" + std::to_string(i) + "] '" + plan->nodes[i].spec.name
                                              + "' is an external layer: only a host application's own backend "
                                                "computes it (worker_config::make_backend), the CPU backend cannot");
  return std::unique_ptr<compute_backend>{std::make_unique<cpu_backend>(spec, std::move(*plan))};
}

std::unique_ptr<compute_backend> make_cpu_backend(const mlp_spec& spec) {
  auto b = make_cpu_backend(from_mlp(spec));
  if (!b)
    std::abort();
  return std::move(*b);
}

}  // namespace ashlar
