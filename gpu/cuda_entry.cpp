// libashlar_cuda.so's entry point: the table of the backend's functions (see
// gpu/cuda_module.hpp). The only symbol the module exports.
#include "gpu/cuda_module.hpp"

namespace {

ashlar::expected<std::unique_ptr<ashlar::compute_backend>> make_mlp(const ashlar::mlp_spec& spec, int device,
                                                                    ashlar::gpu::cuda_options options) {
  return ashlar::gpu::make_cuda_backend(spec, device, options);
}

ashlar::expected<std::unique_ptr<ashlar::compute_backend>> make_model(const ashlar::model_spec& spec, int device,
                                                                      ashlar::gpu::cuda_options options) {
  return ashlar::gpu::make_cuda_backend(spec, device, options);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const ashlar::gpu::detail::cuda_module* ashlar_cuda_module() {
  namespace g = ashlar::gpu;
  static const g::detail::cuda_module table{g::detail::cuda_module_abi, &g::list_devices, &make_mlp, &make_model,
                                            &g::lock_host, &g::time_step_compute, &g::time_transfers,
                                            &g::time_gemms};
  return &table;
}
