#include "runtime/backend/held_model.hpp"

#include <algorithm>
#include <vector>

#include "runtime/optim/local_steps.hpp"

namespace ashlar {

namespace {

class held_model_backend final : public compute_backend {
public:
  explicit held_model_backend(std::unique_ptr<compute_backend> inner) : inner_(std::move(inner)) {
    const auto n = static_cast<size_t>(inner_->spec().num_params());
    params_.assign(n, 0.0f);
    velocity_.assign(n, 0.0f);
    acc_.assign(n, 0.0f);
    grad_.assign(n, 0.0f);
  }

  const char* name() const override { return inner_->name(); }
  const model_spec& spec() const override { return inner_->spec(); }
  std::string details() const override { return inner_->details(); }
  expected<batch_stats> train_step(const float* params, batch_view batch, float* grad) override {
    return inner_->train_step(params, batch, grad);
  }
  expected<batch_stats> evaluate(const float* params, batch_view batch) override {
    return inner_->evaluate(params, batch);
  }
  std::shared_ptr<void> lock_host_memory(void* p, size_t bytes) override { return inner_->lock_host_memory(p, bytes); }

  bool keeps_local_model() const override { return true; }

  expected<batch_stats> local_step(const float* load, const float* velocity, const float* commit, batch_view batch,
                                   float lr, float momentum) override {
    const size_t n = params_.size();
    if (load) {
      std::copy(load, load + n, params_.begin());
      if (velocity)
        std::copy(velocity, velocity + n, velocity_.begin());
      if (commit)
        std::copy(commit, commit + n, acc_.begin());
      else
        std::fill(acc_.begin(), acc_.end(), 0.0f);
    }
    auto stats = inner_->train_step(params_.data(), batch, grad_.data());
    if (!stats) {
      if (is(stats.error(), errc::numerical_error))
        std::fill(velocity_.begin(), velocity_.end(), 0.0f);
      return stats;
    }
    local_steps::apply_momentum(grad_.data(), velocity_.data(), momentum, n);
    local_steps::accumulate(acc_.data(), grad_.data(), n);
    local_steps::move(params_.data(), grad_.data(), lr, n);
    return stats;
  }

  caf::error take_commit(float* out, float scale, float* velocity_out) override {
    if (out)
      local_steps::take(out, acc_.data(), scale, acc_.size());
    if (velocity_out)
      std::copy(velocity_.begin(), velocity_.end(), velocity_out);
    return caf::none;
  }

  caf::error rebase(const float* pulled, float lr) override {
    local_steps::rebase(params_.data(), pulled, acc_.data(), lr, params_.size());
    return caf::none;
  }

private:
  std::unique_ptr<compute_backend> inner_;
  std::vector<float> params_, velocity_, acc_, grad_;
};

}  // namespace

std::unique_ptr<compute_backend> hold_local_model(std::unique_ptr<compute_backend> inner) {
  return std::make_unique<held_model_backend>(std::move(inner));
}

}  // namespace ashlar
