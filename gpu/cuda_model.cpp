// The CUDA backend for models described by layers (conv2d, pooling, groupnorm, dropout,
// residual add, dense): runtime/model/model.hpp's plan executed on one GPU, node by node
// as the CPU backend executes it (runtime/backend/cpu_backend.cpp), with the same buffer
// sharing and gradient delivery. Products go through cuBLAS: dense layers as in the MLP
// backend, conv2d as im2col + SGEMM over groups of samples side by side; the other
// layers are the kernels of gpu/layer_kernels.cu. Dropout draws the CPU backend's masks,
// so the two give the same gradients for the same seed.
#include "gpu/cuda_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda_util.hpp"
#include "gpu/kernels.hpp"
#include "gpu/layer_kernels.hpp"
#include "gpu/backend_base.hpp"

namespace ashlar::gpu {

using namespace detail;

namespace {

std::atomic<uint64_t> model_backends{0};

geometry geometry_of(const plan_node& n) {
  geometry g;
  g.c = n.in.c;
  g.h = n.in.h;
  g.w = n.in.w;
  g.oc = n.out.c;
  g.oh = n.out.h;
  g.ow = n.out.w;
  g.k = std::max(1u, n.spec.kernel);
  g.s = std::max(1u, n.spec.stride);
  g.p = n.spec.padding;
  return g;
}

// im2col buffers of at most this many floats per conv2d product (256 MB).
constexpr size_t col_floats = size_t{1} << 26;

// Samples a conv2d layer unfolds side by side: its col, product and dcol within col_floats.
size_t conv_group(const plan_node& n, size_t batch) {
  const size_t P = size_t{n.out.h} * n.out.w, per = (2 * n.fan_in + n.out.c) * P;
  return std::clamp<size_t>(col_floats / std::max<size_t>(per, 1), 1, std::max<size_t>(batch, 1));
}

class cuda_model_backend final : public backend_base {
public:
  cuda_model_backend(model_spec spec, model_plan plan, int device, cuda_options options)
    : backend_base(device, options, plan.num_params, plan.input.size(), plan.classes), spec_(std::move(spec)),
      plan_(std::move(plan)), seed_(options.seed ? options.seed : 0x5eed8000ULL + model_backends++) {
    const size_t count = plan_.nodes.size();
    acts_.resize(count);
    grads_.resize(count);
    aux_.resize(count);
    partial_.resize(count);
    argmax_.resize(count);
    buffer_ = plan_.output_owners();
    needs_grad_ = plan_.gradients_needed();
  }

  ~cuda_model_backend() override {
    drain();
  }

  caf::error init() {
    return init_device(false);
  }

  const model_spec& spec() const override {
    return spec_;
  }

  std::string details() const override {
    return "cuBLAS SGEMM for dense layers and conv2d (im2col, up to " + std::to_string(col_floats >> 20)
           + "M floats a product), CUDA kernels for the other layers";
  }

private:
  caf::error reserve_layers(size_t n) override {
    size_t col = 0, out = 0;
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      const auto& node = plan_.nodes[i];
      const size_t size = n * node.out.size();
      if (buffer_[i] == static_cast<int>(i)) {
        if (auto err = acts_[i].resize(size))
          return err;
        if (auto err = grads_[i].resize(size))
          return err;
      }
      switch (node.spec.kind) {
        case layer_kind::maxpool:
          if (auto err = argmax_[i].resize(size))
            return err;
          break;
        case layer_kind::dropout:
          if (auto err = aux_[i].resize(size))
            return err;
          break;
        case layer_kind::groupnorm:
          if (auto err = aux_[i].resize(2 * n * node.spec.groups))
            return err;
          if (auto err = partial_[i].resize(2 * n * node.in.c))
            return err;
          break;
        case layer_kind::conv2d: {
          const size_t g = conv_group(node, n), cols = g * node.out.h * node.out.w;
          col = std::max<size_t>(col, node.fan_in * cols);
          out = std::max<size_t>(out, node.out.c * cols);
          break;
        }
        default:
          break;
      }
    }
    for (auto* b : {&col_, &dcol_})
      if (auto err = b->resize(std::max<size_t>(col, 1)))
        return err;
    return conv_out_.resize(std::max<size_t>(out, 1));
  }

  caf::error upload(const float* params, const batch_view* b) override {
    if (auto err = copy_to_device(params_.p, params, plan_.num_params, host_params_, stream_))
      return err;
    return b ? upload_batch(*b) : caf::none;
  }

  // Parts whose activations stay within about 1 GB.
  size_t eval_chunk() const override {
    const size_t per_sample = std::max<uint64_t>(plan_.activation_floats, 1) * sizeof(float);
    return std::clamp<size_t>((size_t{1} << 30) / per_sample, 16, 8192);
  }

  float* logits() override {
    return acts_.back().p;
  }

  float* logits_grad() override {
    return grads_.back().p;
  }

  float* act(size_t i) {
    return buffer_[i] < 0 ? x_.p : acts_[static_cast<size_t>(buffer_[i])].p;
  }

  const float* input_of(int index) {
    return index < 0 ? x_.p : act(static_cast<size_t>(index));
  }

  caf::error dense_forward(const plan_node& node, size_t n, const float* x, float* y) {
    const float one = 1.0f, zero = 0.0f;
    const int in = static_cast<int>(node.in.c), out = static_cast<int>(node.out.c), rows = static_cast<int>(n);
    // y^T [out x n] = W [out x in] . x^T
    ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, params_.p + node.weight, in, x,
                              in, &zero, y, out));
    launch_bias_act(y, params_.p + node.bias, n, node.out.c, false, stream_);
    ASHLAR_LAUNCHED();
    return caf::none;
  }

  caf::error dense_backward(const plan_node& node, size_t n, const float* x, const float* dy, float* dx, bool acc) {
    const float one = 1.0f, zero = 0.0f, beta = acc ? 1.0f : 0.0f;
    const int in = static_cast<int>(node.in.c), out = static_cast<int>(node.out.c), rows = static_cast<int>(n);
    // dW^T [in x out] = x^T . dy
    ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, &one, x, in, dy, out, &zero,
                              grad_.p + node.weight, in));
    ASHLAR_CUBLAS(cublasSgemv(handle_, CUBLAS_OP_N, out, rows, &one, dy, out, ones_.p, 1, &zero, grad_.p + node.bias,
                              1));
    if (dx) // dx^T [in x n] = W^T . dy^T
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &one, params_.p + node.weight, in, dy,
                                out, &beta, dx, in));
    return caf::none;
  }

  // Per group of g samples: col [K x gP] = im2col(x); out [oc x gP] = W [oc x K] . col;
  // then y = out + bias, scattered back to samples. (Row-major matrices are cuBLAS's
  // column-major transposes.)
  caf::error conv_forward(const plan_node& node, size_t n, const float* x, float* y) {
    const float one = 1.0f, zero = 0.0f;
    const auto l = geometry_of(node);
    const size_t group = conv_group(node, n), P = size_t{l.oh} * l.ow, K = node.fan_in;
    for (size_t s0 = 0; s0 < n; s0 += group) {
      const size_t g = std::min(group, n - s0);
      const int cols = static_cast<int>(g * P);
      launch_im2col(l, g, x + s0 * node.in.size(), col_.p, stream_);
      ASHLAR_LAUNCHED();
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, cols, static_cast<int>(l.oc), static_cast<int>(K),
                                &one, col_.p, cols, params_.p + node.weight, static_cast<int>(K), &zero, conv_out_.p,
                                cols));
      launch_conv_bias_scatter(l, g, conv_out_.p, params_.p + node.bias, y + s0 * node.out.size(), stream_);
      ASHLAR_LAUNCHED();
    }
    return caf::none;
  }

  // db = per-channel sums of dy; per group: dout [oc x gP] gathered from dy,
  // dW (+)= dout . col^T, dcol = W^T . dout folded back into dx.
  caf::error conv_backward(const plan_node& node, size_t n, const float* x, const float* dy, float* dx, bool acc) {
    const float one = 1.0f, zero = 0.0f;
    const auto l = geometry_of(node);
    const size_t group = conv_group(node, n), P = size_t{l.oh} * l.ow;
    const int K = static_cast<int>(node.fan_in), oc = static_cast<int>(l.oc);
    launch_channel_sums(l, n, dy, grad_.p + node.bias, stream_);
    ASHLAR_LAUNCHED();
    for (size_t s0 = 0; s0 < n; s0 += group) {
      const size_t g = std::min(group, n - s0);
      const int cols = static_cast<int>(g * P);
      launch_im2col(l, g, x + s0 * node.in.size(), col_.p, stream_);
      launch_conv_gather(l, g, dy + s0 * node.out.size(), conv_out_.p, stream_);
      ASHLAR_LAUNCHED();
      // dW (column-major K x oc) = col^T-as-stored (K x gP) . dout^T-as-stored (gP x oc)
      const float beta = s0 == 0 ? 0.0f : 1.0f;
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, K, oc, cols, &one, col_.p, cols, conv_out_.p, cols,
                                &beta, grad_.p + node.weight, K));
      if (!dx)
        continue;
      // dcol (column-major gP x K) = dout (gP x oc) . W^T (oc x K)
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, cols, K, oc, &one, conv_out_.p, cols,
                                params_.p + node.weight, K, &zero, dcol_.p, cols));
      launch_col2im(l, g, dcol_.p, dx + s0 * node.in.size(), acc, stream_);
      ASHLAR_LAUNCHED();
    }
    return caf::none;
  }

  caf::error forward(size_t n, bool training) override {
    if (training)
      ++steps_; // a new step's dropout masks
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      if (buffer_[i] != static_cast<int>(i))
        continue; // shares its input's buffer
      const auto& node = plan_.nodes[i];
      const float* x = input_of(node.input);
      float* y = acts_[i].p;
      const size_t count = n * node.out.size();
      switch (node.spec.kind) {
        case layer_kind::dense:
          if (auto err = dense_forward(node, n, x, y))
            return err;
          break;
        case layer_kind::conv2d:
          if (auto err = conv_forward(node, n, x, y))
            return err;
          break;
        case layer_kind::maxpool:
          launch_maxpool_forward(geometry_of(node), n, x, y, argmax_[i].p, stream_);
          break;
        case layer_kind::avgpool:
          launch_avgpool_forward(geometry_of(node), n, x, y, stream_);
          break;
        case layer_kind::relu:
          launch_relu_forward(count, x, y, stream_);
          break;
        case layer_kind::flatten:
          ASHLAR_CUDA(cudaMemcpyAsync(y, x, count * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
          break;
        case layer_kind::dropout:
          if (training && node.spec.p > 0) {
            const double p = node.spec.p;
            launch_dropout_forward(count, static_cast<uint64_t>(p * 0x1.0p53), static_cast<float>(1.0 / (1.0 - p)),
                                   seed_ * 0x100000001b3ULL + steps_ * 131 + i, x, y, aux_[i].p, stream_);
          } else {
            ASHLAR_CUDA(cudaMemcpyAsync(y, x, count * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
          }
          break;
        case layer_kind::groupnorm:
          launch_groupnorm_forward(n, node.in.c, size_t{node.in.h} * node.in.w, node.spec.groups, node.spec.eps, x,
                                   params_.p + node.weight, params_.p + node.bias, y, aux_[i].p, stream_);
          break;
        case layer_kind::add:
          launch_add(count, x, input_of(node.from), y, stream_);
          break;
        case layer_kind::external:
          return make_error(errc::unknown_name, "the CUDA backend cannot compute external layer " + node.spec.name);
      }
      ASHLAR_LAUNCHED();
    }
    return caf::none;
  }

  // Where node `index`'s input gradient goes (null: nothing upstream needs it); see the
  // CPU backend.
  float* deliver_to(int index, bool& accumulate) {
    if (index < 0 || !needs_grad_[static_cast<size_t>(index)])
      return nullptr;
    const auto owner = static_cast<size_t>(buffer_[static_cast<size_t>(index)]);
    accumulate = written_[owner];
    written_[owner] = true;
    return grads_[owner].p;
  }

  caf::error backward(size_t n, float* out) override {
    if (auto err = backward_nodes(n))
      return err;
    if (out)
      ASHLAR_CUDA(cudaMemcpyAsync(out, grad_.p, plan_.num_params * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    return caf::none;
  }

  caf::error backward_nodes(size_t n) {
    written_.assign(plan_.nodes.size(), false);
    written_.back() = true; // by the loss
    for (size_t i = plan_.nodes.size(); i-- > 0;) {
      if (!needs_grad_[i] || buffer_[i] != static_cast<int>(i))
        continue;
      const auto& node = plan_.nodes[i];
      const float* x = input_of(node.input);
      const float* y = acts_[i].p;
      const size_t count = n * node.out.size();
      if (!written_[i]) // no reader: the output is unused
        ASHLAR_CUDA(cudaMemsetAsync(grads_[i].p, 0, count * sizeof(float), stream_));
      const float* dy = grads_[i].p;
      bool acc = false;
      float* dx = deliver_to(node.input, acc);
      switch (node.spec.kind) {
        case layer_kind::dense:
          if (auto err = dense_backward(node, n, x, dy, dx, acc))
            return err;
          break;
        case layer_kind::conv2d:
          if (auto err = conv_backward(node, n, x, dy, dx, acc))
            return err;
          break;
        case layer_kind::maxpool:
          if (dx)
            launch_maxpool_backward(geometry_of(node), n, argmax_[i].p, dy, dx, acc, stream_);
          break;
        case layer_kind::avgpool:
          if (dx)
            launch_avgpool_backward(geometry_of(node), n, dy, dx, acc, stream_);
          break;
        case layer_kind::relu:
          if (dx)
            launch_relu_backward(count, y, dy, dx, acc, stream_);
          break;
        case layer_kind::flatten:
          if (dx)
            launch_scale_backward(count, nullptr, dy, dx, acc, stream_);
          break;
        case layer_kind::dropout:
          if (dx)
            launch_scale_backward(count, node.spec.p > 0 ? aux_[i].p : nullptr, dy, dx, acc, stream_);
          break;
        case layer_kind::groupnorm:
          launch_groupnorm_backward(n, node.in.c, size_t{node.in.h} * node.in.w, node.spec.groups, x,
                                    params_.p + node.weight, aux_[i].p, dy, partial_[i].p, grad_.p + node.weight,
                                    grad_.p + node.bias, dx, acc, stream_);
          break;
        case layer_kind::add: {
          if (dx)
            launch_scale_backward(count, nullptr, dy, dx, acc, stream_);
          bool acc_other = false;
          if (float* dother = deliver_to(node.from, acc_other))
            launch_scale_backward(count, nullptr, dy, dother, acc_other, stream_);
          break;
        }
        case layer_kind::external:
          return make_error(errc::unknown_name, "the CUDA backend cannot compute external layer " + node.spec.name);
      }
      ASHLAR_LAUNCHED();
    }
    return caf::none;
  }

  model_spec spec_;
  model_plan plan_;
  uint64_t seed_;
  uint64_t steps_ = 0;
  std::vector<int> buffer_;
  std::vector<bool> needs_grad_, written_;
  device_buffer<float> col_, dcol_, conv_out_;
  std::vector<device_buffer<float>> acts_, grads_, aux_, partial_;
  std::vector<device_buffer<uint32_t>> argmax_;
};

}  // namespace

expected<std::unique_ptr<compute_backend>> make_cuda_model_backend(const model_spec& spec, int device,
                                                                   cuda_options options) {
  auto plan = compile(spec);
  if (!plan)
    return plan.error();
  if (auto err = refuse_external(*plan, "the CUDA backend"))
    return err;
  auto b = std::make_unique<cuda_model_backend>(spec, std::move(*plan), device, options);
  if (auto err = b->init())
    return err;
  return std::unique_ptr<compute_backend>{std::move(b)};
}

}  // namespace ashlar::gpu
