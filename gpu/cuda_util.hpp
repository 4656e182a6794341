// What the CUDA backends share (internal to gpu/): CUDA and cuBLAS failures as Ashlar
// errors naming the call, file and line; device and pinned buffers that grow on demand;
// events for ordering streams.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/core/error.hpp"

namespace ashlar::gpu::detail {

inline std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string{base ? base + 1 : file} + ":" + std::to_string(line);
}

inline caf::error cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  return make_error(errc::device_error, std::string{call} + " failed at " + where(file, line) + ": "
                                          + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

inline caf::error cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  return make_error(errc::device_error, std::string{call} + " failed at " + where(file, line) + ": "
                                          + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

}  // namespace ashlar::gpu::detail

// A CUDA or cuBLAS call whose failure returns an Ashlar error naming the call, file and line.
#define ASHLAR_CUDA(call)                                                                                   \
  do {                                                                                                      \
    if (cudaError_t ashlar_e_ = (call); ashlar_e_ != cudaSuccess)                                           \
      return ::ashlar::gpu::detail::cuda_error(ashlar_e_, #call, __FILE__, __LINE__);                       \
  } while (false)
#define ASHLAR_CUBLAS(call)                                                                                 \
  do {                                                                                                      \
    if (cublasStatus_t ashlar_s_ = (call); ashlar_s_ != CUBLAS_STATUS_SUCCESS)                              \
      return ::ashlar::gpu::detail::cublas_error(ashlar_s_, #call, __FILE__, __LINE__);                     \
  } while (false)
// After a kernel launch: a bad configuration shows here, a fault at the next sync.
#define ASHLAR_LAUNCHED() ASHLAR_CUDA(cudaGetLastError())

namespace ashlar::gpu::detail {

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

// Whether `p` is page-locked host memory (cudaMallocHost, or registered by lock_host), from
// which a transfer is a DMA with no staging copy.
inline bool page_locked(const void* p) {
  cudaPointerAttributes attr{};
  const bool locked = cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeHost;
  cudaGetLastError(); // pageable memory is no error
  return locked;
}

// A CUDA event without timing, for ordering work between streams.
struct sync_event {
  cudaEvent_t e = nullptr;
  sync_event() = default;
  sync_event(const sync_event&) = delete;
  sync_event& operator=(const sync_event&) = delete;
  sync_event(sync_event&& o) noexcept : e(o.e) {
    o.e = nullptr;
  }
  ~sync_event() {
    if (e)
      cudaEventDestroy(e);
  }
};

}  // namespace ashlar::gpu::detail
