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
#include "gpu/bench_timers.hpp"
#include "gpu/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu/cuda_model.hpp"
#include "gpu/cuda_util.hpp"
#include "gpu/kernels.hpp"
#include "gpu/backend_base.hpp"

namespace ashlar::gpu {

using namespace detail;

namespace {

// Seconds the work that `work` enqueues on `stream` takes (it returns an error or none):
// the median of `reps` runs timed with CUDA events, after `warmup` untimed ones.
template <class Work>
expected<double> median_seconds(cudaStream_t stream, int warmup, int reps, Work&& work) {
  cudaEvent_t start = nullptr, stop = nullptr;
  auto run = [&]() -> expected<double> {
    ASHLAR_CUDA(cudaEventCreate(&start));
    ASHLAR_CUDA(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int r = -warmup; r < reps; ++r) {
      ASHLAR_CUDA(cudaEventRecord(start, stream));
      if (auto err = work())
        return err;
      ASHLAR_CUDA(cudaEventRecord(stop, stream));
      ASHLAR_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      ASHLAR_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (r >= 0)
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms.empty() ? 0.0 : ms[ms.size() / 2] * 1e-3;
  };
  auto out = run();
  for (auto e : {start, stop})
    if (e)
      cudaEventDestroy(e);
  return out;
}

}  // namespace

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

// Two streams: `copy_` moves the batch and the parameters in and the gradient out,
// `stream_` computes. The parameters travel in pieces (a layer's rows of output units,
// at most options_.piece_floats each, the bias with the layer's last piece): a forward product
// over a piece's rows waits only for that piece, and a piece's gradient leaves as soon
// as backward has written it. So the transfers, most of a wide model's step, overlap
// the products, and the step comes close to its floor: every parameter in, then every
// gradient out (no gradient exists before the forward pass has every parameter).
// A piece of the parameters that travels on its own: output units [begin, end) of a layer.
struct piece {
  size_t layer = 0;
  uint32_t begin = 0, end = 0;
};

class cuda_backend final : public backend_base {
public:
  cuda_backend(mlp_spec spec, int device, cuda_options options)
    : backend_base(device, options, spec.num_params(), spec.input, spec.classes), spec_(std::move(spec)),
      model_(from_mlp(spec_)), layers_(layer_layout(spec_)) {
  }

  ~cuda_backend() override {
    drain();
  }

  caf::error init() {
    if (auto err = init_device(true))
      return err;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& L = layers_[l];
      const auto rows_per_piece =
        static_cast<uint32_t>(std::clamp<size_t>(options_.piece_floats / L.in, 1, L.out));
      for (uint32_t o = 0; o < L.out; o += rows_per_piece)
        pieces_.push_back({l, o, std::min(L.out, o + rows_per_piece)});
    }
    piece_in_.resize(pieces_.size());
    piece_grad_.resize(pieces_.size());
    for (auto* events : {&piece_in_, &piece_grad_})
      for (auto& ev : *events)
        ASHLAR_CUDA(cudaEventCreateWithFlags(&ev.e, cudaEventDisableTiming));
    return caf::none;
  }

  const model_spec& spec() const override {
    return model_;
  }

  /// Seconds one step's compute takes on the device (forward, loss, backward; no
  /// transfers), on random parameters and `rows` random samples: median of `reps`.
  expected<double> time_compute(size_t rows, int reps) {
    ASHLAR_CUDA(cudaSetDevice(device_));
    if (auto err = reserve(rows))
      return err;
    launch_fill_random(params_.p, 3, spec_.num_params(), stream_);
    launch_fill_random(x_.p, 4, rows * spec_.input, stream_);
    ASHLAR_LAUNCHED();
    for (size_t i = 0; i < rows; ++i)
      host_y_.p[i] = static_cast<uint8_t>((i * 7) % spec_.classes);
    ASHLAR_CUDA(cudaMemcpyAsync(y_.p, host_y_.p, rows, cudaMemcpyHostToDevice, stream_));
    return median_seconds(stream_, 3, reps, [&]() -> caf::error {
      if (auto err = forward_pieces(rows, false))
        return err;
      if (auto err = enqueue_loss(rows, true))
        return err;
      return backward(rows, nullptr);
    });
  }

private:
  caf::error reserve_layers(size_t n) override {
    acts_.resize(layers_.size());
    size_t widest = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (auto err = acts_[l].resize(n * layers_[l].out))
        return err;
      widest = std::max<size_t>({widest, layers_[l].in, layers_[l].out});
    }
    for (auto* b : {&delta_, &delta_prev_})
      if (auto err = b->resize(n * widest))
        return err;
    return caf::none;
  }

  // The parameters go in on the copy stream piece by piece, straight from the caller's
  // memory when it is page-locked, else through pinned staging (the host copy of one
  // piece overlapping the transfer of the one before); piece_in_[p] marks piece p's
  // arrival. With `b`, the batch follows the first layer's pieces: its host copy then
  // overlaps their transfer instead of delaying it.
  caf::error upload_pieces(const float* params, const batch_view* b) {
    const bool direct = page_locked(params);
    for (size_t p = 0; p < pieces_.size(); ++p) {
      const auto [off, count] = piece_range(pieces_[p]);
      const float* src = params + off;
      if (!direct) {
        std::memcpy(host_params_.p + off, src, count * sizeof(float));
        src = host_params_.p + off;
      }
      ASHLAR_CUDA(cudaMemcpyAsync(params_.p + off, src, count * sizeof(float), cudaMemcpyHostToDevice, copy_));
      ASHLAR_CUDA(cudaEventRecord(piece_in_[p].e, copy_));
      if (b && (p + 1 == pieces_.size() || pieces_[p + 1].layer != pieces_[p].layer) && pieces_[p].layer == 0)
        if (auto err = upload_batch(*b))
          return err;
    }
    return caf::none;
  }

  // Piece p's range of the parameter (and gradient) vector: its rows of weights, and the
  // layer's bias with its last piece (the bias follows the weights).
  std::pair<size_t, size_t> piece_range(const piece& p) const {
    const auto& L = layers_[p.layer];
    const size_t off = L.weight + size_t{p.begin} * L.in;
    size_t count = size_t{p.end - p.begin} * L.in;
    if (p.end == L.out)
      count += L.out;
    return {off, count};
  }

  // With `wait`, each product waits for its inputs on the copy stream (the batch, the
  // layer's parameters); without, the device buffers are used as they are (timing).
  caf::error forward_pieces(size_t n, bool wait) {
    const float one = 1.0f, zero = 0.0f;
    const float* in = x_.p;
    const auto rows = static_cast<int>(n);
    if (wait)
      ASHLAR_CUDA(cudaStreamWaitEvent(stream_, batch_in_.e, 0));
    for (size_t p = 0; p < pieces_.size(); ++p) {
      const auto& P = pieces_[p];
      const auto& L = layers_[P.layer];
      float* out = acts_[P.layer].p;
      if (wait)
        ASHLAR_CUDA(cudaStreamWaitEvent(stream_, piece_in_[p].e, 0));
      // Output units [begin, end): act^T rows begin.. = W[begin..end) . in^T
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(P.end - P.begin), rows,
                                static_cast<int>(L.in), &one, params_.p + L.weight + size_t{P.begin} * L.in,
                                static_cast<int>(L.in), in, static_cast<int>(L.in), &zero, out + P.begin,
                                static_cast<int>(L.out)));
      if (P.end == L.out) {
        launch_bias_act(out, params_.p + L.bias, n, L.out, P.layer + 1 < layers_.size(), stream_);
        ASHLAR_LAUNCHED();
        in = out;
      }
    }
    return caf::none;
  }


  // Backward from the last layer. Each layer's gradient (weights, then bias: one
  // contiguous range) leaves on the copy stream for `out` (host memory, page-locked) as
  // soon as it is written; with `out` null it stays on the device (timing).
  caf::error backward(size_t n, float* out) override {
    const float one = 1.0f, zero = 0.0f;
    const auto rows = static_cast<int>(n);
    float* delta = delta_.p;
    float* prev = delta_prev_.p;
    for (size_t p = pieces_.size(); p-- > 0;) {
      const auto& P = pieces_[p];
      const auto& L = layers_[P.layer];
      const float* in = P.layer == 0 ? x_.p : acts_[P.layer - 1].p;
      // Rows [begin, end) of dW: dW^T columns begin.. = in^T . delta[:, begin..end)
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(L.in),
                                static_cast<int>(P.end - P.begin), rows, &one, in, static_cast<int>(L.in),
                                delta + P.begin, static_cast<int>(L.out), &zero,
                                grad_.p + L.weight + size_t{P.begin} * L.in, static_cast<int>(L.in)));
      if (P.end == L.out)
        ASHLAR_CUBLAS(cublasSgemv(handle_, CUBLAS_OP_N, static_cast<int>(L.out), rows, &one, delta,
                                  static_cast<int>(L.out), ones_.p, 1, &zero, grad_.p + L.bias, 1));
      if (out) {
        const auto [off, count] = piece_range(P);
        ASHLAR_CUDA(cudaEventRecord(piece_grad_[p].e, stream_));
        ASHLAR_CUDA(cudaStreamWaitEvent(copy_, piece_grad_[p].e, 0));
        ASHLAR_CUDA(cudaMemcpyAsync(out + off, grad_.p + off, count * sizeof(float), cudaMemcpyDeviceToHost, copy_));
      }
      if (P.begin > 0)
        continue; // the layer's other pieces first
      if (P.layer == 0)
        break;
      ASHLAR_CUBLAS(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(L.in), rows,
                                static_cast<int>(L.out), &one, params_.p + L.weight, static_cast<int>(L.in), delta,
                                static_cast<int>(L.out), &zero, prev, static_cast<int>(L.in)));
      launch_relu_mask(prev, acts_[P.layer - 1].p, n * L.in, stream_);
      ASHLAR_LAUNCHED();
      std::swap(delta, prev);
    }
    return caf::none;
  }

  caf::error upload(const float* params, const batch_view* b) override {
    return upload_pieces(params, b);
  }

  caf::error forward(size_t n, bool /*training: an MLP has no dropout*/) override {
    return forward_pieces(n, true);
  }

  size_t eval_chunk() const override {
    return 8192;
  }

  float* logits() override {
    return acts_.back().p;
  }

  float* logits_grad() override {
    return delta_.p;
  }

  mlp_spec spec_;
  model_spec model_;
  std::vector<layer_offsets> layers_;
  device_buffer<float> delta_, delta_prev_;
  std::vector<device_buffer<float>> acts_;
  std::vector<piece> pieces_; // in layer order, rows ascending
  std::vector<sync_event> piece_in_, piece_grad_;
};

}  // namespace

namespace {

// Makes `device` this thread's current one; an error names a device the machine lacks.
caf::error select_device(int device) {
  auto devices = list_devices();
  if (!devices)
    return devices.error();
  if (device < 0 || static_cast<size_t>(device) >= devices->size())
    return make_error(errc::invalid_argument, "GPU " + std::to_string(device) + " does not exist (this machine has "
                                                + std::to_string(devices->size()) + ")");
  ASHLAR_CUDA(cudaSetDevice(device));
  return caf::none;
}

}  // namespace

expected<double> time_gemms(const std::vector<gemm_shape>& shapes, int device, bool tf32, int reps) {
  if (auto err = select_device(device))
    return err;
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
  auto run = [&]() -> expected<double> {
    ASHLAR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ASHLAR_CUBLAS(cublasCreate(&handle));
    ASHLAR_CUBLAS(cublasSetStream(handle, stream));
    ASHLAR_CUBLAS(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    launch_fill_random(A.p, 1, a, stream);
    launch_fill_random(B.p, 2, b, stream);
    ASHLAR_LAUNCHED();
    const float one = 1.0f, zero = 0.0f;
    return median_seconds(stream, 3, reps, [&]() -> caf::error {
      for (const auto& s : shapes) {
        const int lda = s.transpose_a ? s.k : s.m, ldb = s.transpose_b ? s.n : s.k;
        ASHLAR_CUBLAS(cublasSgemm(handle, s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.m, s.n, s.k, &one, A.p, lda, B.p, ldb,
                                  &zero, C.p, s.m));
      }
      return caf::none;
    });
  };
  auto out = run();
  if (handle)
    cublasDestroy(handle);
  if (stream)
    cudaStreamDestroy(stream);
  return out;
}

std::shared_ptr<void> lock_host(void* p, size_t bytes) {
  if (!p || bytes == 0)
    return nullptr;
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError(); // no device, or over the limit on locked memory: transfers stage instead
    return nullptr;
  }
  return std::shared_ptr<void>{p, [](void* q) { cudaHostUnregister(q); }};
}

expected<double> time_step_compute(const mlp_spec& spec, size_t rows, int device, cuda_options options, int reps) {
  auto b = make_cuda_backend(spec, device, options);
  if (!b)
    return b.error();
  return static_cast<cuda_backend&>(**b).time_compute(rows, reps);
}

expected<transfer_rates> time_transfers(size_t bytes, int device, int reps) {
  if (auto err = select_device(device))
    return err;
  const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
  device_buffer<float> dev;
  pinned_buffer<float> pinned;
  if (auto err = dev.resize(n))
    return err;
  if (auto err = pinned.resize(n))
    return err;
  std::vector<float> plain(n, 1.0f);
  std::memset(pinned.p, 0, n * sizeof(float));
  auto lock = lock_host(plain.data(), n * sizeof(float));
  if (!lock)
    return make_error(errc::device_error, "cudaHostRegister refused " + std::to_string(bytes) + " bytes");
  cudaStream_t stream = nullptr;
  auto rate = [&](void* dst, const void* src, cudaMemcpyKind kind) -> expected<double> {
    auto secs = median_seconds(stream, 2, reps, [&]() -> caf::error {
      ASHLAR_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), kind, stream));
      return caf::none;
    });
    if (!secs)
      return secs;
    return *secs <= 0 ? 0.0 : n * sizeof(float) / *secs * 1e-9;
  };
  auto run = [&]() -> expected<transfer_rates> {
    ASHLAR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    transfer_rates out;
    for (auto [field, dst, src, kind] :
         {std::tuple{&out.h2d_pinned, static_cast<void*>(dev.p), static_cast<void*>(pinned.p), cudaMemcpyHostToDevice},
          std::tuple{&out.d2h_pinned, static_cast<void*>(pinned.p), static_cast<void*>(dev.p), cudaMemcpyDeviceToHost},
          std::tuple{&out.h2d_locked, static_cast<void*>(dev.p), static_cast<void*>(plain.data()),
                     cudaMemcpyHostToDevice},
          std::tuple{&out.d2h_locked, static_cast<void*>(plain.data()), static_cast<void*>(dev.p),
                     cudaMemcpyDeviceToHost}}) {
      auto r = rate(dst, src, kind);
      if (!r)
        return r.error();
      *field = *r;
    }
    return out;
  };
  auto out = run();
  if (stream)
    cudaStreamDestroy(stream);
  return out;
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const mlp_spec& spec, int device, cuda_options options) {
  if (auto err = validate(spec))
    return err;
  if (auto err = select_device(device))
    return err;
  auto b = std::make_unique<cuda_backend>(spec, device, options);
  if (auto err = b->init())
    return err;
  return std::unique_ptr<compute_backend>{std::move(b)};
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const model_spec& spec, int device,
                                                             cuda_options options) {
  if (auto mlp = spec.as_mlp())
    return make_cuda_backend(*mlp, device, options);
  if (auto err = validate(spec))
    return err;
  if (auto err = select_device(device))
    return err;
  return make_cuda_model_backend(spec, device, options);
}

}  // namespace ashlar::gpu
