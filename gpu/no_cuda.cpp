// A build without the CUDA toolkit: no devices, and a backend request says why.
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

expected<double> time_gemms(const std::vector<gemm_shape>&, int, bool, int) {
  return make_error(errc::device_error, "this build has no CUDA backend (configured with ASHLAR_ENABLE_CUDA=OFF, "
                                        "or no CUDA toolkit was found)");
}

}  // namespace ashlar::gpu
