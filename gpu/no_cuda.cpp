// A build without the CUDA toolkit: no devices, and a backend request says why.
#include "gpu/bench_timers.hpp"
#include "gpu/cuda_backend.hpp"

namespace ashlar::gpu {

bool built_with_cuda() {
  return false;
}

expected<std::vector<device_info>> list_devices() {
  return make_error(errc::device_error, "this build has no CUDA backend (configured with ASHLAR_ENABLE_CUDA=OFF, "
                                        "or no CUDA toolkit was found)");
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const mlp_spec&, int, cuda_options) {
  return list_devices().error(); // as the CUDA build says when it finds no device
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const model_spec&, int, cuda_options) {
  return list_devices().error();
}

expected<double> time_gemms(const std::vector<gemm_shape>&, int, bool, int) {
  return list_devices().error();
}

expected<transfer_rates> time_transfers(size_t, int, int) {
  return list_devices().error();
}

std::shared_ptr<void> lock_host(void*, size_t) {
  return nullptr;
}

expected<double> time_step_compute(const mlp_spec&, size_t, int, cuda_options, int) {
  return list_devices().error();
}

}  // namespace ashlar::gpu
