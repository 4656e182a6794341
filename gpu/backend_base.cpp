#include "gpu/backend_base.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu/kernels.hpp"

namespace ashlar::gpu::detail {

backend_base::backend_base(int device, cuda_options options, size_t num_params, size_t input_floats, size_t classes)
  : device_(device), options_(options), num_params_(num_params), input_floats_(input_floats), classes_(classes),
    name_("cuda:" + std::to_string(device)) {
}

backend_base::~backend_base() {
  drain();
  if (handle_)
    cublasDestroy(handle_);
  for (auto s : {copy_, stream_})
    if (s)
      cudaStreamDestroy(s);
}

void backend_base::drain() {
  cudaSetDevice(device_);
  for (auto s : {copy_, stream_})
    if (s)
      cudaStreamSynchronize(s);
}

caf::error backend_base::init_device(bool copy_stream) {
  ASHLAR_CUDA(cudaSetDevice(device_));
  ASHLAR_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (copy_stream) {
    ASHLAR_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    ASHLAR_CUDA(cudaEventCreateWithFlags(&batch_in_.e, cudaEventDisableTiming));
  }
  ASHLAR_CUBLAS(cublasCreate(&handle_));
  ASHLAR_CUBLAS(cublasSetStream(handle_, stream_));
  ASHLAR_CUBLAS(cublasSetMathMode(handle_, options_.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  for (auto* b : {&params_, &grad_})
    if (auto err = b->resize(num_params_))
      return err;
  for (auto* b : {&host_params_, &host_grad_})
    if (auto err = b->resize(num_params_))
      return err;
  if (auto err = totals_.resize(1))
    return err;
  if (auto err = correct_.resize(1))
    return err;
  if (auto err = host_totals_.resize(1))
    return err;
  return host_correct_.resize(1);
}

std::shared_ptr<void> backend_base::lock_host_memory(void* p, size_t bytes) {
  return lock_host(p, bytes);
}

caf::error backend_base::begin() {
  ASHLAR_CUDA(cudaSetDevice(device_));
  return finish(); // a call that failed half-way may have left work in flight
}

caf::error backend_base::finish() {
  ASHLAR_CUDA(cudaStreamSynchronize(stream_));
  if (copy_)
    ASHLAR_CUDA(cudaStreamSynchronize(copy_));
  return caf::none;
}

caf::error backend_base::reserve(size_t n) {
  if (n <= capacity_)
    return caf::none;
  if (auto err = finish()) // buffers in use are not freed under the device
    return err;
  if (auto err = reserve_layers(n))
    return err;
  if (auto err = x_.resize(n * input_floats_))
    return err;
  if (auto err = y_.resize(n))
    return err;
  if (auto err = host_x_.resize(n * input_floats_))
    return err;
  if (auto err = host_y_.resize(n))
    return err;
  if (auto err = ones_.resize(n))
    return err;
  launch_fill(ones_.p, 1.0f, n, stream_);
  ASHLAR_LAUNCHED();
  capacity_ = n;
  return caf::none;
}

caf::error backend_base::upload_batch(batch_view b) {
  std::memcpy(host_x_.p, b.x, b.n * b.dim * sizeof(float));
  std::memcpy(host_y_.p, b.y, b.n);
  cudaStream_t s = copy_ ? copy_ : stream_;
  ASHLAR_CUDA(cudaMemcpyAsync(x_.p, host_x_.p, b.n * b.dim * sizeof(float), cudaMemcpyHostToDevice, s));
  ASHLAR_CUDA(cudaMemcpyAsync(y_.p, host_y_.p, b.n, cudaMemcpyHostToDevice, s));
  if (copy_)
    ASHLAR_CUDA(cudaEventRecord(batch_in_.e, copy_));
  return caf::none;
}

caf::error backend_base::enqueue_loss(size_t n, bool grad) {
  ASHLAR_CUDA(cudaMemsetAsync(totals_.p, 0, sizeof(double), stream_));
  ASHLAR_CUDA(cudaMemsetAsync(correct_.p, 0, sizeof(unsigned long long), stream_));
  launch_softmax_xent(logits(), y_.p, n, classes_, grad ? logits_grad() : nullptr, totals_.p, correct_.p, stream_);
  ASHLAR_LAUNCHED();
  ASHLAR_CUDA(cudaMemcpyAsync(host_totals_.p, totals_.p, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  ASHLAR_CUDA(
    cudaMemcpyAsync(host_correct_.p, correct_.p, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_));
  return caf::none;
}

batch_stats backend_base::read_loss(size_t n) const {
  batch_stats s;
  s.n = n;
  s.loss_sum = *host_totals_.p;
  s.correct = static_cast<size_t>(*host_correct_.p);
  return s;
}

caf::error backend_base::start_call(batch_view b, size_t rows) {
  if (auto err = check_batch(spec(), b))
    return err;
  if (auto err = begin())
    return err;
  return reserve(rows);
}

expected<batch_stats> backend_base::train_step(const float* params, batch_view b, float* grad) {
  if (auto err = start_call(b, b.n))
    return err;
  if (auto err = upload(params, &b))
    return err;
  if (auto err = forward(b.n, true))
    return err;
  if (auto err = enqueue_loss(b.n, true))
    return err;
  const bool direct = page_locked(grad);
  if (auto err = backward(b.n, direct ? grad : host_grad_.p))
    return err;
  if (auto err = finish())
    return err;
  auto stats = read_loss(b.n);
  if (!std::isfinite(stats.loss_sum))
    return make_error(errc::numerical_error, "training loss is not finite on " + name_ + " (lr too high?)");
  if (!direct)
    std::memcpy(grad, host_grad_.p, num_params_ * sizeof(float));
  return stats;
}

expected<batch_stats> backend_base::evaluate(const float* params, batch_view b) {
  const size_t chunk = eval_chunk();
  if (auto err = start_call(b, std::min(chunk, b.n)))
    return err;
  if (auto err = upload(params, nullptr))
    return err;
  batch_stats total;
  for (size_t off = 0; off < b.n; off += chunk) {
    batch_view part{b.x + off * b.dim, b.y + off, std::min(chunk, b.n - off), b.dim};
    if (auto err = upload_batch(part))
      return err;
    if (auto err = forward(part.n, false))
      return err;
    if (auto err = enqueue_loss(part.n, false))
      return err;
    if (auto err = finish()) // the staging buffers are free again for the next part
      return err;
    auto s = read_loss(part.n);
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.n += s.n;
  }
  return total;
}

expected<batch_stats> backend_base::local_step(const float* load, const float* velocity, const float* commit,
                                               batch_view b, float lr, float momentum) {
  if (auto err = start_call(b, b.n))
    return err;
  if (auto err = local_.reserve(num_params_, stream_))
    return err;
  if (load) {
    if (auto err = upload(load, &b))
      return err;
    if (auto err = local_.load(velocity, commit, stream_))
      return err;
  } else if (auto err = upload_batch(b)) {
    return err;
  }
  if (auto err = forward(b.n, true))
    return err;
  if (auto err = enqueue_loss(b.n, true))
    return err;
  if (auto err = backward(b.n, nullptr))
    return err;
  if (auto err = finish())
    return err;
  auto stats = read_loss(b.n);
  if (!std::isfinite(stats.loss_sum)) {
    if (auto err = local_.zero_velocity(stream_))
      return err;
    return make_error(errc::numerical_error, "training loss is not finite on " + name_ + " (lr too high?)");
  }
  if (auto err = local_.update(params_.p, grad_.p, lr, momentum, stream_))
    return err;
  return stats;
}

caf::error backend_base::take_commit(float* out, float scale, float* velocity_out) {
  if (auto err = begin())
    return err;
  if (auto err = local_.reserve(num_params_, stream_))
    return err;
  return local_.take(out, scale, velocity_out, grad_.p, stream_);
}

caf::error backend_base::rebase(const float* pulled, float lr) {
  if (auto err = begin())
    return err;
  if (auto err = local_.reserve(num_params_, stream_))
    return err;
  if (auto err = copy_to_device(params_.p, pulled, num_params_, host_params_, stream_))
    return err;
  if (auto err = local_.rebase(params_.p, lr, stream_))
    return err;
  return finish();
}

}  // namespace ashlar::gpu::detail
