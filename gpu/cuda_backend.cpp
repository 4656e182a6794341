// The CUDA backend (see cuda_backend.hpp). Layouts follow the CPU backend: parameters
// and gradients are one float vector in layer_layout order (each layer's out x in weight,
// row-major, then its bias), activations and batches are row-major. cuBLAS is
// column-major, so a row-major n x k matrix is handed to it as a k x n one:
//   forward   act_l^T   = W_l      . act_{l-1}^T    (gemm T,N: m=out n=rows k=in)
//   weights   dW_l^T    = act_{l-1}^T . delta_l    (gemm N,T: m=in  n=out  k=rows)
//   bias      db_l      = delta_l^T . 1            (gemv N:   m=out n=rows)
//   back      delta_{l-1}^T = W_l^T . delta_l^T    (gemm N,N: m=in  n=rows k=out), ReLU mask
// The gradient is written by these products at its push-buffer offsets in one device
// vector and leaves the GPU in one transfer into pinned memory (or straight into the
// caller's buffer when that is page-locked).
#include "gpu/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu/kernels.hpp"

namespace ashlar::gpu {

namespace {

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string{base ? base + 1 : file} + ":" + std::to_string(line);
}

caf::error cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  return make_error(errc::device_error, std::string{call} + " failed at " + where(file, line) + ": "
                                          + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

caf::error cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  return make_error(errc::device_error, std::string{call} + " failed at " + where(file, line) + ": "
                                          + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

}  // namespace

// A CUDA or cuBLAS call whose failure returns an Ashlar error naming the call, file and line.
#define ASHLAR_CUDA(call)                                                                                   \
  do {                                                                                                      \
    if (cudaError_t ashlar_e_ = (call); ashlar_e_ != cudaSuccess)                                           \
      return cuda_error(ashlar_e_, #call, __FILE__, __LINE__);                                              \
  } while (false)
#define ASHLAR_CUBLAS(call)                                                                                 \
  do {                                                                                                      \
    if (cublasStatus_t ashlar_s_ = (call); ashlar_s_ != CUBLAS_STATUS_SUCCESS)                              \
      return cublas_error(ashlar_s_, #call, __FILE__, __LINE__);                                            \
  } while (false)
// After a kernel launch: a bad configuration shows here, a fault at the next sync.
#define ASHLAR_LAUNCHED() ASHLAR_CUDA(cudaGetLastError())

bool built_with_cuda() {
  return true;
}

expected<std::vector<device_info>> list_devices() {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    cudaGetLastError(); // clear it
    return make_error(errc::device_error, std::string{"no usable CUDA device: cudaGetDeviceCount: "}
                                            + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
  if (n == 0)
    return make_error(errc::device_error, "no usable CUDA device: cudaGetDeviceCount found none");
  std::vector<device_info> out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    ASHLAR_CUDA(cudaGetDeviceProperties(&p, i));
    out.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor, p.multiProcessorCount});
  }
  return out;
}

namespace {

// Memory that grows on demand and frees itself: on the device (cudaMalloc) or page-locked
// on the host (cudaMallocHost), for transfers that need no staging copy by the driver.
enum class memory { device, pinned };

template <class T, memory Where>
struct cuda_buffer {
  T* p = nullptr;
  size_t n = 0;
  cuda_buffer() = default;
  cuda_buffer(const cuda_buffer&) = delete;
  cuda_buffer& operator=(const cuda_buffer&) = delete;
  cuda_buffer(cuda_buffer&& o) noexcept : p(o.p), n(o.n) {
    o.p = nullptr;
    o.n = 0;
  }
  ~cuda_buffer() {
    release();
  }
  void release() {
    if (p)
      Where == memory::device ? cudaFree(p) : cudaFreeHost(p);
    p = nullptr;
    n = 0;
  }
  caf::error resize(size_t count) {
    if (count <= n)
      return caf::none;
    release();
    auto** out = reinterpret_cast<void**>(&p);
    if (Where == memory::device)
      ASHLAR_CUDA(cudaMalloc(out, count * sizeof(T)));
    else
      ASHLAR_CUDA(cudaMallocHost(out, count * sizeof(T)));
    n = count;
    return caf::none;
  }
};

template <class T>
using device_buffer = cuda_buffer<T, memory::device>;
template <class T>
using pinned_buffer = cuda_buffer<T, memory::pinned>;

class cuda_backend final : public compute_backend {
public:
  cuda_backend(mlp_spec spec, int device, cuda_options options)
    : spec_(std::move(spec)), layers_(layer_layout(spec_)), device_(device), options_(options) {
    name_ = "cuda:" + std::to_string(device);
  }

  ~cuda_backend() override {
    cudaSetDevice(device_);
    if (stream_)
      cudaStreamSynchronize(stream_);
    if (handle_)
      cublasDestroy(handle_);
    if (stream_)
      cudaStreamDestroy(stream_);
  }

  caf::error init() {
    ASHLAR_CUDA(cudaSetDevice(device_));
    ASHLAR_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASHLAR_CUBLAS(cublasCreate(&handle_));
    ASHLAR_CUBLAS(cublasSetStream(handle_, stream_));
    ASHLAR_CUBLAS(cublasSetMathMode(handle_, options_.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    const size_t p = spec_.num_params();
    if (auto err = params_.resize(p))
      return err;
    if (auto err = grad_.resize(p))
      return err;
    if (auto err = host_params_.resize(p))
      return err;
    if (auto err = host_grad_.resize(p))
      return err;
    if (auto err = totals_.resize(1))
      return err;
    if (auto err = correct_.resize(1))
      return err;
    if (auto err = host_totals_.resize(1))
      return err;
    if (auto err = host_correct_.resize(1))
      return err;
    return caf::none;
  }

  const char* name() const override {
    return name_.c_str();
  }

  const mlp_spec& spec() const override {
    return spec_;
  }

  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override {
    if (auto err = check_batch(spec_, b))
      return err;
    ASHLAR_CUDA(cudaSetDevice(device_));
    if (auto err = reserve(b.n))
      return err;
    if (auto err = upload_params(params))
      return err;
    if (auto err = upload_batch(b))
      return err;
    if (auto err = forward(b.n))
      return err;
    auto stats = loss(b.n, true);
    if (!stats)
      return stats;
    if (!std::isfinite(stats->loss_sum))
      return make_error(errc::numerical_error, "training loss is not finite on " + name_ + " (lr too high?)");
    if (auto err = backward(b.n))
      return err;
    if (auto err = download_grad(grad))
      return err;
    return stats;
  }

  expected<batch_stats> evaluate(const float* params, batch_view b) override {
    if (auto err = check_batch(spec_, b))
      return err;
    ASHLAR_CUDA(cudaSetDevice(device_));
    if (auto err = upload_params(params))
      return err;
    constexpr size_t chunk = 8192;
    batch_stats total;
    for (size_t off = 0; off < b.n; off += chunk) {
      batch_view part{b.x + off * b.dim, b.y + off, std::min(chunk, b.n - off), b.dim};
      if (auto err = reserve(part.n))
        return err;
      if (auto err = upload_batch(part))
        return err;
      if (auto err = forward(part.n))
        return err;
      auto s = loss(part.n, false);
      if (!s)
        return s;
      total.loss_sum += s->loss_sum;
      total.correct += s->correct;
      total.n += s->n;
    }
    return total;
  }

private:
  caf::error reserve(size_t n) {
    if (n <= capacity_)
      return caf::none;
    acts_.resize(layers_.size());
    size_t widest = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (auto err = acts_[l].resize(n * layers_[l].out))
        return err;
      widest = std::max<size_t>({widest, layers_[l].in, layers_[l].out});
    }
    if (auto err = delta_.resize(n * widest))
      return err;
    if (auto err = delta_prev_.resize(n * widest))
      return err;
    if (auto err = x_.resize(n * spec_.input))
      return err;
    if (auto err = y_.resize(n))
      return err;
    if (auto err = host_x_.resize(n * spec_.input))
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

  caf::error upload_params(const float* params) {
    const size_t bytes = spec_.num_params() * sizeof(float);
    // The pinned copy must not be overwritten while an earlier transfer may still read it.
    ASHLAR_CUDA(cudaStreamSynchronize(stream_));
    std::memcpy(host_params_.p, params, bytes);
    ASHLAR_CUDA(cudaMemcpyAsync(params_.p, host_params_.p, bytes, cudaMemcpyHostToDevice, stream_));
    return caf::none;
  }

  caf::error upload_batch(batch_view b) {
    ASHLAR_CUDA(cudaStreamSynchronize(stream_));
    std::memcpy(host_x_.p, b.x, b.n * b.dim * sizeof(float));
    std::memcpy(host_y_.p, b.y, b.n);
    ASHLAR_CUDA(cudaMemcpyAsync(x_.p, host_x_.p, b.n * b.dim * sizeof(float), cudaMemcpyHostToDevice, stream_));
    ASHLAR_CUDA(cudaMemcpyAsync(y_.p, host_y_.p, b.n, cudaMemcpyHostToDevice, stream_));
    return caf::none;
  }

  caf::error forward(size_t n) {
    const float one = 1.0f, zero = 0.0f;
    const float* in = x_.p;
    const auto rows = static_cast<int>(n);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& L = layers_[l];
      float* out = acts_[l].p;
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(L.out), rows,
                                static_cast<int>(L.in), &one, params_.p + L.weight, static_cast<int>(L.in), in,
                                static_cast<int>(L.in), &zero, out, static_cast<int>(L.out)));
      launch_bias_act(out, params_.p + L.bias, n, L.out, l + 1 < layers_.size(), stream_);
      ASHLAR_LAUNCHED();
      in = out;
    }
    return caf::none;
  }

  expected<batch_stats> loss(size_t n, bool grad) {
    ASHLAR_CUDA(cudaMemsetAsync(totals_.p, 0, sizeof(double), stream_));
    ASHLAR_CUDA(cudaMemsetAsync(correct_.p, 0, sizeof(unsigned long long), stream_));
    launch_softmax_xent(acts_.back().p, y_.p, n, layers_.back().out, grad ? delta_.p : nullptr, totals_.p,
                        correct_.p, stream_);
    ASHLAR_LAUNCHED();
    ASHLAR_CUDA(cudaMemcpyAsync(host_totals_.p, totals_.p, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ASHLAR_CUDA(cudaMemcpyAsync(host_correct_.p, correct_.p, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                stream_));
    ASHLAR_CUDA(cudaStreamSynchronize(stream_));
    batch_stats s;
    s.n = n;
    s.loss_sum = *host_totals_.p;
    s.correct = static_cast<size_t>(*host_correct_.p);
    return s;
  }

  caf::error backward(size_t n) {
    const float one = 1.0f, zero = 0.0f;
    const auto rows = static_cast<int>(n);
    float* delta = delta_.p;
    float* prev = delta_prev_.p;
    for (size_t li = layers_.size(); li-- > 0;) {
      const auto& L = layers_[li];
      const float* in = li == 0 ? x_.p : acts_[li - 1].p;
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(L.in), static_cast<int>(L.out),
                                rows, &one, in, static_cast<int>(L.in), delta, static_cast<int>(L.out), &zero,
                                grad_.p + L.weight, static_cast<int>(L.in)));
      ASHLAR_CUBLAS(cublasSgemv(handle_, CUBLAS_OP_N, static_cast<int>(L.out), rows, &one, delta,
                                static_cast<int>(L.out), ones_.p, 1, &zero, grad_.p + L.bias, 1));
      if (li == 0)
        break;
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(L.in), rows,
                                static_cast<int>(L.out), &one, params_.p + L.weight, static_cast<int>(L.in), delta,
                                static_cast<int>(L.out), &zero, prev, static_cast<int>(L.in)));
      launch_relu_mask(prev, acts_[li - 1].p, n * L.in, stream_);
      ASHLAR_LAUNCHED();
      std::swap(delta, prev);
    }
    return caf::none;
  }

  caf::error download_grad(float* grad) {
    const size_t bytes = spec_.num_params() * sizeof(float);
    cudaPointerAttributes attr{};
    const bool page_locked = cudaPointerGetAttributes(&attr, grad) == cudaSuccess && attr.type == cudaMemoryTypeHost;
    cudaGetLastError(); // pageable memory is no error
    ASHLAR_CUDA(cudaMemcpyAsync(page_locked ? grad : host_grad_.p, grad_.p, bytes, cudaMemcpyDeviceToHost, stream_));
    ASHLAR_CUDA(cudaStreamSynchronize(stream_));
    if (!page_locked)
      std::memcpy(grad, host_grad_.p, bytes);
    return caf::none;
  }

  mlp_spec spec_;
  std::vector<layer_offsets> layers_;
  int device_;
  cuda_options options_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  size_t capacity_ = 0;
  device_buffer<float> params_, grad_, x_, delta_, delta_prev_, ones_;
  device_buffer<uint8_t> y_;
  std::vector<device_buffer<float>> acts_;
  device_buffer<double> totals_;
  device_buffer<unsigned long long> correct_;
  pinned_buffer<float> host_params_, host_grad_, host_x_;
  pinned_buffer<uint8_t> host_y_;
  pinned_buffer<double> host_totals_;
  pinned_buffer<unsigned long long> host_correct_;
};

}  // namespace

expected<double> time_gemms(const std::vector<gemm_shape>& shapes, int device, bool tf32, int reps) {
  auto devices = list_devices();
  if (!devices)
    return devices.error();
  if (device < 0 || static_cast<size_t>(device) >= devices->size())
    return make_error(errc::invalid_argument, "GPU " + std::to_string(device) + " does not exist");
  ASHLAR_CUDA(cudaSetDevice(device));
  size_t a = 0, b = 0, c = 0;
  for (const auto& s : shapes) {
    a = std::max(a, size_t(s.m) * s.k);
    b = std::max(b, size_t(s.k) * s.n);
    c = std::max(c, size_t(s.m) * s.n);
  }
  device_buffer<float> A, B, C;
  if (auto err = A.resize(a))
    return err;
  if (auto err = B.resize(b))
    return err;
  if (auto err = C.resize(c))
    return err;
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  auto cleanup = [&] {
    if (start)
      cudaEventDestroy(start);
    if (stop)
      cudaEventDestroy(stop);
    if (handle)
      cublasDestroy(handle);
    if (stream)
      cudaStreamDestroy(stream);
  };
  auto run = [&]() -> expected<double> {
    ASHLAR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ASHLAR_CUBLAS(cublasCreate(&handle));
    ASHLAR_CUBLAS(cublasSetStream(handle, stream));
    ASHLAR_CUBLAS(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    ASHLAR_CUDA(cudaEventCreate(&start));
    ASHLAR_CUDA(cudaEventCreate(&stop));
    launch_fill_random(A.p, 1, a, stream);
    launch_fill_random(B.p, 2, b, stream);
    ASHLAR_LAUNCHED();
    const float one = 1.0f, zero = 0.0f;
    std::vector<float> times;
    for (int r = -3; r < reps; ++r) {
      ASHLAR_CUDA(cudaEventRecord(start, stream));
      for (const auto& s : shapes) {
        const int lda = s.transpose_a ? s.k : s.m, ldb = s.transpose_b ? s.n : s.k;
        ASHLAR_CUBLAS(cublasSgemm(handle, s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.m, s.n, s.k, &one, A.p, lda, B.p, ldb,
                                  &zero, C.p, s.m));
      }
      ASHLAR_CUDA(cudaEventRecord(stop, stream));
      ASHLAR_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      ASHLAR_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (r >= 0)
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times.empty() ? 0.0 : times[times.size() / 2] * 1e-3;
  };
  auto out = run();
  cleanup();
  return out;
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const mlp_spec& spec, int device, cuda_options options) {
  if (auto err = validate(spec))
    return err;
  auto devices = list_devices();
  if (!devices)
    return devices.error();
  if (device < 0 || static_cast<size_t>(device) >= devices->size())
    return make_error(errc::invalid_argument, "GPU " + std::to_string(device) + " does not exist (this machine has "
                                                + std::to_string(devices->size()) + ")");
  auto b = std::make_unique<cuda_backend>(spec, device, options);
  if (auto err = b->init())
    return err;
  return std::unique_ptr<compute_backend>{std::move(b)};
}

}  // namespace ashlar::gpu
