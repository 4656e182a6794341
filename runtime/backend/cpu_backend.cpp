#include "runtime/backend/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <cblas.h>

namespace ashlar {

compute_backend::~compute_backend() = default;

std::shared_ptr<void> compute_backend::lock_host_memory(void*, size_t) {
  return nullptr;
}

caf::error check_batch(const mlp_spec& spec, batch_view b) {
  if (b.n == 0)
    return make_error(errc::shape_mismatch, "empty batch");
  if (b.dim != spec.input)
    return make_error(errc::shape_mismatch, "batch rows have " + std::to_string(b.dim)
                                              + " features, model " + spec.to_string()
                                              + " expects " + std::to_string(spec.input));
  for (size_t i = 0; i < b.n; ++i)
    if (b.y[i] >= spec.classes)
      return make_error(errc::shape_mismatch, "label " + std::to_string(b.y[i]) + " of row "
                                                + std::to_string(i) + " is not below "
                                                + std::to_string(spec.classes) + " classes");
  return caf::none;
}

void set_blas_threads(int n) {
  openblas_set_num_threads(std::max(1, n));
}

namespace {

class cpu_backend final : public compute_backend {
public:
  explicit cpu_backend(mlp_spec spec) : spec_(std::move(spec)), layers_(layer_layout(spec_)) {
  }

  const char* name() const override {
    return "cpu";
  }

  const mlp_spec& spec() const override {
    return spec_;
  }

  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override {
    if (auto err = check_batch(spec_, b))
      return err;
    reserve(b.n);
    forward(params, b);
    auto stats = softmax_loss(b, true);
    if (!std::isfinite(stats.loss_sum))
      return make_error(errc::numerical_error, "training loss is not finite (lr too high?)");
    backward(params, b, grad);
    return stats;
  }

  expected<batch_stats> evaluate(const float* params, batch_view b) override {
    if (auto err = check_batch(spec_, b))
      return err;
    constexpr size_t chunk = 1024;
    batch_stats total;
    for (size_t off = 0; off < b.n; off += chunk) {
      batch_view part{b.x + off * b.dim, b.y + off, std::min(chunk, b.n - off), b.dim};
      reserve(part.n);
      forward(params, part);
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
    acts_.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l)
      acts_[l].assign(n * layers_[l].out, 0.0f);
    size_t widest = 0;
    for (const auto& l : layers_)
      widest = std::max<size_t>({widest, l.in, l.out});
    delta_.assign(n * widest, 0.0f);
    delta_prev_.assign(n * widest, 0.0f);
  }

  // acts_[l] = relu(A_{l-1} W_l^T + b_l); the last layer keeps the logits.
  void forward(const float* p, batch_view b) {
    const float* in = b.x;
    const auto n = static_cast<int>(b.n);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& L = layers_[l];
      float* out = acts_[l].data();
      const float* bias = p + L.bias;
      for (int r = 0; r < n; ++r)
        std::copy(bias, bias + L.out, out + static_cast<size_t>(r) * L.out);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(L.out),
                  static_cast<int>(L.in), 1.0f, in, static_cast<int>(L.in), p + L.weight,
                  static_cast<int>(L.in), 1.0f, out, static_cast<int>(L.out));
      if (l + 1 < layers_.size()) {
        size_t cnt = b.n * L.out;
        for (size_t i = 0; i < cnt; ++i)
          out[i] = out[i] > 0.0f ? out[i] : 0.0f;
      }
      in = out;
    }
  }

  // Softmax cross-entropy over the logits; with `grad`, leaves dLoss/dLogits
  // (mean over the batch) in delta_.
  batch_stats softmax_loss(batch_view b, bool grad) {
    const auto& L = layers_.back();
    const float* logits = acts_.back().data();
    batch_stats s;
    s.n = b.n;
    const float inv_n = 1.0f / static_cast<float>(b.n);
    for (size_t r = 0; r < b.n; ++r) {
      const float* z = logits + r * L.out;
      size_t arg = 0;
      float mx = z[0];
      for (size_t c = 1; c < L.out; ++c)
        if (z[c] > mx) {
          mx = z[c];
          arg = c;
        }
      double sum = 0;
      for (size_t c = 0; c < L.out; ++c)
        sum += std::exp(static_cast<double>(z[c] - mx));
      double log_sum = std::log(sum);
      s.loss_sum += log_sum - static_cast<double>(z[b.y[r]] - mx);
      s.correct += (arg == b.y[r]);
      if (grad) {
        float* d = delta_.data() + r * L.out;
        for (size_t c = 0; c < L.out; ++c)
          d[c] = static_cast<float>(std::exp(static_cast<double>(z[c] - mx) - log_sum)) * inv_n;
        d[b.y[r]] -= inv_n;
      }
    }
    return s;
  }

  void backward(const float* p, batch_view b, float* g) {
    const auto n = static_cast<int>(b.n);
    for (size_t li = layers_.size(); li-- > 0;) {
      const auto& L = layers_[li];
      const float* in = li == 0 ? b.x : acts_[li - 1].data();
      const float* d = delta_.data();
      // dW = delta^T * A_prev  [out x in]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(L.out),
                  static_cast<int>(L.in), n, 1.0f, d, static_cast<int>(L.out), in,
                  static_cast<int>(L.in), 0.0f, g + L.weight, static_cast<int>(L.in));
      // db = column sums of delta
      float* gb = g + L.bias;
      std::fill(gb, gb + L.out, 0.0f);
      for (size_t r = 0; r < b.n; ++r) {
        const float* row = d + r * L.out;
        for (size_t c = 0; c < L.out; ++c)
          gb[c] += row[c];
      }
      if (li == 0)
        break;
      // delta_prev = (delta * W) .* relu'(A_prev)
      float* dp = delta_prev_.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, static_cast<int>(L.in),
                  static_cast<int>(L.out), 1.0f, d, static_cast<int>(L.out), p + L.weight,
                  static_cast<int>(L.in), 0.0f, dp, static_cast<int>(L.in));
      size_t cnt = b.n * L.in;
      for (size_t i = 0; i < cnt; ++i)
        dp[i] = in[i] > 0.0f ? dp[i] : 0.0f;
      std::swap(delta_, delta_prev_);
    }
  }

  mlp_spec spec_;
  std::vector<layer_offsets> layers_;
  size_t capacity_ = 0;
  std::vector<std::vector<float>> acts_;
  std::vector<float> delta_;
  std::vector<float> delta_prev_;
};

}  // namespace

std::unique_ptr<compute_backend> make_cpu_backend(const mlp_spec& spec) {
  return std::make_unique<cpu_backend>(spec);
}

}  // namespace ashlar
