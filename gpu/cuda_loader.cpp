// gpu/cuda_backend.hpp's functions in every process: built with CUDA, they open
// libashlar_cuda.so on first use and call into it (see gpu/cuda_module.hpp); built
// without, they say that there is no CUDA backend.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/cuda_module.hpp"

namespace ashlar::gpu {

namespace {

#ifdef ASHLAR_CUDA_MODULE_NAME
// The places the module is looked for, first found wins: $ASHLAR_CUDA_MODULE; beside the
// program (or library) that holds this code (a packed tree), and in ../LIBDIR/ashlar from
// there (an installed tree, wherever its prefix); where `cmake --install` puts it with the
// configured prefix; where the build made it.
std::vector<std::string> module_paths() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("ASHLAR_CUDA_MODULE"); env && *env)
    out.emplace_back(env);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&module_paths), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    auto slash = self.rfind('/');
    std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
    out.push_back(dir + "/" ASHLAR_CUDA_MODULE_NAME);
    out.push_back(dir + "/../" ASHLAR_CUDA_MODULE_LIBDIR "/" ASHLAR_CUDA_MODULE_NAME);
  }
  out.emplace_back(ASHLAR_CUDA_MODULE_INSTALLED);
  out.emplace_back(ASHLAR_CUDA_MODULE_BUILT);
  return out;
}

struct loaded {
  const detail::cuda_module* table = nullptr;
  std::string why; // when table is null
};

const loaded& load() {
  static loaded out;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    for (const auto& path : module_paths()) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* e = dlerror();
        // A file that is missing says little; one that exists and fails says why.
        std::string why = e ? e : "dlopen failed";
        if (why.find("No such file") == std::string::npos)
          tried += (tried.empty() ? "" : "; ") + why;
        continue;
      }
      auto entry = reinterpret_cast<const detail::cuda_module* (*)()>(dlsym(h, "ashlar_cuda_module"));
      const detail::cuda_module* table = entry ? entry() : nullptr;
      if (!table || table->abi != detail::cuda_module_abi) {
        tried += (tried.empty() ? "" : "; ") + path + " is from another build of Ashlar";
        continue; // left open: a module is never unloaded
      }
      out.table = table;
      return;
    }
    out.why = "the CUDA backend's module " ASHLAR_CUDA_MODULE_NAME " cannot be loaded ("
              + (tried.empty() ? std::string{"not found beside the program, in ../lib/ashlar, in "}
                                   + ASHLAR_CUDA_MODULE_INSTALLED + " or set by ASHLAR_CUDA_MODULE"
                               : tried)
              + ")";
  });
  return out;
}

caf::error unavailable() {
  return make_error(errc::device_error, load().why);
}
#else
const struct {
  const detail::cuda_module* table = nullptr;
} none;

const auto& load() {
  return none;
}

caf::error unavailable() {
  return make_error(errc::device_error, "this build has no CUDA backend (configured with ASHLAR_ENABLE_CUDA=OFF, "
                                        "or no CUDA toolkit was found)");
}
#endif

}  // namespace

bool built_with_cuda() {
#ifdef ASHLAR_CUDA_MODULE_NAME
  return true;
#else
  return false;
#endif
}

expected<std::vector<device_info>> list_devices() {
#ifdef ASHLAR_CUDA_MODULE_NAME
  // A host with no NVIDIA driver has none of its device files (/dev/dxg: CUDA on WSL 2):
  // then there is no device to find, and CUDA's libraries are not worth loading to say so.
  // (ASHLAR_CUDA_MODULE set: the module is loaded anyway.)
  const char* named = std::getenv("ASHLAR_CUDA_MODULE");
  if (!(named && *named) && ::access("/dev/nvidiactl", F_OK) != 0 && ::access("/dev/dxg", F_OK) != 0)
    return make_error(errc::device_error, "no usable CUDA device: no NVIDIA driver (/dev/nvidiactl is missing)");
#endif
  if (auto m = load().table)
    return m->list_devices();
  return unavailable();
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const mlp_spec& spec, int device, cuda_options options) {
  if (auto m = load().table)
    return m->make_mlp_backend(spec, device, options);
  return unavailable();
}

expected<std::unique_ptr<compute_backend>> make_cuda_backend(const model_spec& spec, int device,
                                                             cuda_options options) {
  if (auto m = load().table)
    return m->make_model_backend(spec, device, options);
  return unavailable();
}

std::shared_ptr<void> lock_host(void* p, size_t bytes) {
  if (auto m = load().table)
    return m->lock_host(p, bytes);
  return nullptr;
}

expected<double> time_step_compute(const mlp_spec& spec, size_t rows, int device, cuda_options options, int reps) {
  if (auto m = load().table)
    return m->time_step_compute(spec, rows, device, options, reps);
  return unavailable();
}

expected<transfer_rates> time_transfers(size_t bytes, int device, int reps) {
  if (auto m = load().table)
    return m->time_transfers(bytes, device, reps);
  return unavailable();
}

expected<double> time_gemms(const std::vector<gemm_shape>& shapes, int device, bool tf32, int reps) {
  if (auto m = load().table)
    return m->time_gemms(shapes, device, tf32, reps);
  return unavailable();
}

}  // namespace ashlar::gpu
