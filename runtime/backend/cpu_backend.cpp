#include "runtime/backend/cpu_backend.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <string>
#include <vector>

#include <cblas.h>

#include "runtime/backend/cpu_layers.hpp"
#include "runtime/backend/onednn_conv.hpp"
#include "runtime/core/clock.hpp"

namespace ashlar {

compute_backend::~compute_backend() = default;

std::string compute_backend::details() const {
  return {};
}

std::shared_ptr<void> compute_backend::lock_host_memory(void*, size_t) {
  return nullptr;
}

void compute_backend::release_scratch() {}

bool compute_backend::keeps_local_model() const {
  return false;
}

namespace {
caf::error keeps_none(const compute_backend& b) {
  return make_error(errc::invalid_state, std::string{"backend "} + b.name() + " keeps no local model");
}
}  // namespace

expected<batch_stats> compute_backend::local_step(const float*, const float*, const float*, batch_view, float,
                                                  float) {
  return keeps_none(*this);
}

caf::error compute_backend::take_commit(float*, float, float*) {
  return keeps_none(*this);
}

caf::error compute_backend::rebase(const float*, float) {
  return keeps_none(*this);
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

namespace {
// The thread count of set_blas_threads, applied to oneDNN's kernels on each call.
std::atomic<int> compute_threads{1};
}  // namespace

void set_blas_threads(int n) {
  openblas_set_num_threads(std::max(1, n));
  compute_threads = std::max(1, n);
}

namespace {

// Each backend draws its dropout masks from its own stream.
std::atomic<uint64_t> backend_instances{0};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = steady_now();
  f();
  return std::chrono::duration<double>(steady_now() - t0).count();
}

// Executes a compiled model layer by layer. Activations of every node are kept for the
// backward pass. A flatten (and a dropout with p = 0) shares its input's buffers. A
// node's output gradient is written by the first node that reads it (in backward order)
// and added into by the others.
class cpu_backend final : public compute_backend {
public:
  cpu_backend(model_spec spec, model_plan plan, cpu_conv conv, uint64_t seed)
    : spec_(std::move(spec)), plan_(std::move(plan)), conv_(conv),
      seed_(seed ? seed : 0x5eed0000ULL + backend_instances++) {
    const auto count = plan_.nodes.size();
    acts_.resize(count);
    grads_.resize(count);
    aux_.resize(count);
    argmax_.resize(count);
    onednn_.resize(count);
    buffer_ = plan_.output_owners();
    needs_grad_ = plan_.gradients_needed();
  }

  const char* name() const override {
    return "cpu";
  }

  const model_spec& spec() const override {
    return spec_;
  }

  std::string details() const override {
    return conv_choice_;
  }

  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override {
    if (auto err = check_batch(spec_, b))
      return err;
    try {
      prepare(b.n);
      ++steps_;
      forward(params, b, true);
      auto stats = softmax_loss(b, true);
      if (!std::isfinite(stats.loss_sum))
        return make_error(errc::numerical_error, "training loss is not finite (lr too high?)");
      backward(params, b, grad);
      return stats;
    } catch (const std::exception& e) {
      return make_error(errc::device_error, std::string{"CPU backend: "} + e.what());
    }
  }

  void release_scratch() override {
    for (auto* v : {&acts_, &grads_, &aux_})
      for (auto& buf : *v)
        std::vector<float>().swap(buf);
    for (auto& buf : argmax_)
      decltype(argmax_)::value_type().swap(buf);
    capacity_ = 0;
  }

  expected<batch_stats> evaluate(const float* params, batch_view b) override {
    if (auto err = check_batch(spec_, b))
      return err;
    // Parts whose activations stay within about 64 MB.
    const size_t per_sample = std::max<uint64_t>(plan_.activation_floats, 1) * sizeof(float);
    const size_t chunk = std::clamp<size_t>((size_t{64} << 20) / per_sample, 16, 1024);
    batch_stats total;
    try {
      for (size_t off = 0; off < b.n; off += chunk) {
        batch_view part{b.x + off * b.dim, b.y + off, std::min(chunk, b.n - off), b.dim};
        prepare(part.n);
        forward(params, part, false);
        auto s = softmax_loss(part, false);
        total.loss_sum += s.loss_sum;
        total.correct += s.correct;
        total.n += s.n;
      }
    } catch (const std::exception& e) {
      return make_error(errc::device_error, std::string{"CPU backend: "} + e.what());
    }
    return total;
  }

private:
  void prepare(size_t n) {
    if (!convs_chosen_)
      choose_convs(n);
    cpu::set_onednn_threads(compute_threads.load());
    if (n <= capacity_)
      return;
    capacity_ = n;
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      const auto& node = plan_.nodes[i];
      const size_t size = n * node.out.size();
      if (buffer_[i] == static_cast<int>(i)) {
        acts_[i].assign(size, 0.0f);
        grads_[i].assign(size, 0.0f);
      }
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

  // Per conv2d layer, oneDNN or im2col + OpenBLAS: with cpu_conv::measure, whichever
  // computes a forward and backward pass of this batch size (up to 32 samples) faster,
  // best of two runs each on the same synthetic data.
  void choose_convs(size_t n) {
    convs_chosen_ = true;
    cpu::set_onednn_threads(compute_threads.load());
    const size_t m = std::clamp<size_t>(n, 1, 32);
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      const auto& node = plan_.nodes[i];
      if (node.spec.kind != layer_kind::conv2d || conv_ == cpu_conv::im2col)
        continue;
      std::string label = node.spec.name + ": ";
      std::unique_ptr<cpu::onednn_conv> d;
      try {
        d = std::make_unique<cpu::onednn_conv>(node);
      } catch (const std::exception& e) {
        conv_choice_ += label + "im2col (" + e.what() + "); ";
        continue;
      }
      if (conv_ == cpu_conv::measure) {
        const bool wants_dx = node.input >= 0 && needs_grad_[static_cast<size_t>(node.input)];
        std::vector<float> x(m * node.in.size()), y(m * node.out.size()), dy(y.size()), dx(x.size());
        std::vector<float> w(node.weight_size), b(node.bias_size), dw(w.size()), db(b.size());
        for (size_t k = 0; k < x.size(); ++k)
          x[k] = static_cast<float>(k % 13) * 0.1f - 0.6f;
        for (size_t k = 0; k < w.size(); ++k)
          w[k] = static_cast<float>(k % 7) * 0.01f - 0.03f;
        for (size_t k = 0; k < dy.size(); ++k)
          dy[k] = static_cast<float>(k % 5) * 0.01f - 0.02f;
        float* dxp = wants_dx ? dx.data() : nullptr;
        auto gemm = [&] {
          cpu::conv2d_forward(node, m, x.data(), w.data(), b.data(), y.data(), scratch_);
          cpu::conv2d_backward(node, m, x.data(), w.data(), dy.data(), dw.data(), db.data(), dxp, false, scratch_);
        };
        auto dnnl = [&] {
          d->forward(m, x.data(), w.data(), b.data(), y.data());
          d->backward(m, x.data(), w.data(), dy.data(), dw.data(), db.data(), dxp, false);
        };
        gemm();
        dnnl();
        double t_gemm = 1e30, t_dnnl = 1e30;
        for (int rep = 0; rep < 2; ++rep) {
          t_gemm = std::min(t_gemm, seconds_of(gemm));
          t_dnnl = std::min(t_dnnl, seconds_of(dnnl));
        }
        char times[96];
        std::snprintf(times, sizeof times, " (%.0f vs %.0f us/sample)", t_dnnl * 1e6 / m, t_gemm * 1e6 / m);
        if (t_gemm <= t_dnnl) {
          conv_choice_ += label + "im2col" + times + "; ";
          continue;
        }
        label += "onednn " + d->kernels() + times;
      } else {
        label += "onednn " + d->kernels();
      }
      conv_choice_ += label + "; ";
      onednn_[i] = std::move(d);
    }
    if (conv_choice_.size() >= 2)
      conv_choice_.resize(conv_choice_.size() - 2);
  }

  float* act(size_t i, batch_view b) {
    return buffer_[i] < 0 ? const_cast<float*>(b.x) : acts_[static_cast<size_t>(buffer_[i])].data();
  }

  const float* input_of(int index, batch_view b) {
    return index < 0 ? b.x : act(static_cast<size_t>(index), b);
  }

  void forward(const float* p, batch_view b, bool training) {
    const size_t n = b.n;
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      if (buffer_[i] != static_cast<int>(i))
        continue; // shares its input's buffer
      const auto& node = plan_.nodes[i];
      const float* x = input_of(node.input, b);
      float* y = acts_[i].data();
      const size_t count = n * node.out.size();
      switch (node.spec.kind) {
        case layer_kind::dense:
          cpu::dense_forward(node, n, x, p + node.weight, p + node.bias, y);
          break;
        case layer_kind::conv2d:
          if (onednn_[i])
            onednn_[i]->forward(n, x, p + node.weight, p + node.bias, y);
          else
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
          std::copy(x, x + count, y); // only as the last node
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

  // Where node `index`'s input gradient goes, or null when nothing needs it (the model's
  // input, or a node with no parameters upstream). `accumulate` tells whether another
  // reader delivered into that buffer already in this backward pass.
  float* deliver_to(int index, bool& accumulate) {
    if (index < 0 || !needs_grad_[static_cast<size_t>(index)])
      return nullptr;
    const auto owner = static_cast<size_t>(buffer_[static_cast<size_t>(index)]);
    accumulate = written_[owner];
    written_[owner] = true;
    return grads_[owner].data();
  }

  void backward(const float* p, batch_view b, float* g) {
    const size_t n = b.n;
    written_.assign(plan_.nodes.size(), false);
    written_.back() = true; // by the loss
    for (size_t i = plan_.nodes.size(); i-- > 0;) {
      if (!needs_grad_[i] || buffer_[i] != static_cast<int>(i))
        continue; // an identity's gradient lands in its input's buffer directly
      const auto& node = plan_.nodes[i];
      const float* x = input_of(node.input, b);
      const float* y = acts_[i].data();
      const size_t count = n * node.out.size();
      if (!written_[i]) // no reader: the output is unused
        std::fill(grads_[i].begin(), grads_[i].begin() + static_cast<std::ptrdiff_t>(count), 0.0f);
      const float* dy = grads_[i].data();
      bool acc = false;
      float* dx = deliver_to(node.input, acc);
      switch (node.spec.kind) {
        case layer_kind::dense:
          cpu::dense_backward(node, n, x, p + node.weight, dy, g + node.weight, g + node.bias, dx, acc);
          break;
        case layer_kind::conv2d:
          if (onednn_[i])
            onednn_[i]->backward(n, x, p + node.weight, dy, g + node.weight, g + node.bias, dx, acc);
          else
            cpu::conv2d_backward(node, n, x, p + node.weight, dy, g + node.weight, g + node.bias, dx, acc, scratch_);
          break;
        case layer_kind::maxpool:
          if (dx)
            cpu::maxpool_backward(node, n, argmax_[i].data(), dy, dx, acc);
          break;
        case layer_kind::avgpool:
          if (dx)
            cpu::avgpool_backward(node, n, dy, dx, acc);
          break;
        case layer_kind::relu:
          if (dx)
            cpu::relu_backward(count, y, dy, dx, acc);
          break;
        case layer_kind::flatten:
          if (dx)
            cpu::pass_backward(count, dy, dx, acc);
          break;
        case layer_kind::dropout:
          if (dx) {
            if (node.spec.p > 0)
              cpu::dropout_backward(count, aux_[i].data(), dy, dx, acc);
            else
              cpu::pass_backward(count, dy, dx, acc);
          }
          break;
        case layer_kind::groupnorm:
          cpu::groupnorm_backward(node, n, x, p + node.weight, aux_[i].data(), dy, g + node.weight, g + node.bias,
                                  dx, acc);
          break;
        case layer_kind::add: {
          if (dx)
            cpu::pass_backward(count, dy, dx, acc);
          bool acc_other = false;
          if (float* dother = deliver_to(node.from, acc_other))
            cpu::pass_backward(count, dy, dother, acc_other);
          break;
        }
        case layer_kind::external:
          std::abort();
      }
    }
  }

  model_spec spec_;
  model_plan plan_;
  cpu_conv conv_;
  uint64_t seed_;
  uint64_t steps_ = 0;
  size_t capacity_ = 0;
  std::vector<int> buffer_;                    // node whose buffers hold this node's output; -1: the batch
  std::vector<std::vector<float>> acts_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> aux_;        // dropout masks, groupnorm statistics
  std::vector<std::vector<uint32_t>> argmax_;  // maxpool winners
  std::vector<bool> needs_grad_;
  std::vector<bool> written_;                  // per buffer, in the current backward pass
  std::vector<std::unique_ptr<cpu::onednn_conv>> onednn_;
  bool convs_chosen_ = false;
  std::string conv_choice_;
  std::vector<float> scratch_;
};

}  // namespace

expected<std::unique_ptr<compute_backend>> make_cpu_backend(const model_spec& spec, cpu_conv conv, uint64_t seed) {
  auto plan = compile(spec);
  if (!plan)
    return plan.error();
  if (auto err = refuse_external(*plan, "the CPU backend"))
    return err;
  return std::unique_ptr<compute_backend>{std::make_unique<cpu_backend>(spec, std::move(*plan), conv, seed)};
}

std::unique_ptr<compute_backend> make_cpu_backend(const mlp_spec& spec) {
  auto b = make_cpu_backend(from_mlp(spec));
  if (!b)
    std::abort();
  return std::move(*b);
}

}  // namespace ashlar
