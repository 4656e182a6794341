// GPU actors: one per CUDA device, owning it (stream, cuBLAS handle, memory) and serving
// the compute calls of the workers given that device. A worker without a GPU computes
// on the CPU. Heavy CAF headers stay in gpu_actor.cpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/core/error.hpp"
#include "runtime/model/mlp.hpp"

namespace caf {
class actor_system;
}

namespace ashlar::actors {

/// A worker's compute backend and the one log line that says where it computes.
struct backend_choice {
  std::unique_ptr<compute_backend> backend;
  std::string note; // e.g. "on cuda:0 (NVIDIA H100 80GB HBM3)" or "on the CPU: no GPU found"
  bool quiet = false; // the plain outcome (no GPU asked for or found): the note is a debug line
};
/// Makes a worker's backend once the model is known. A null backend means none could be
/// made; the note then says why (the worker fails with it).
using backend_factory = std::function<backend_choice(const model_spec&)>;

/// The CPU backend for `spec` with `note`, or a null backend and the reason.
backend_choice cpu_choice(const model_spec& spec, std::string note);

/// The CUDA devices a --gpus value names, by index, and why there are none when so.
struct gpu_selection {
  std::vector<int> devices;
  std::vector<std::string> names; // the devices' names, in the same order
  std::string why_none;           // "" when there are devices
};

/// `spec`: "auto" (every visible device; none is no error, why_none says why), "none"
/// (CPU only), or a list such as "0,1" (each must exist: invalid_argument otherwise,
/// naming it). A malformed spec fails with invalid_config.
[[nodiscard]] expected<gpu_selection> select_gpus(const std::string& spec);

/// The GPUs of one process (an `ashlar train` or a node): a GPU actor per device, handed
/// to workers one device each, in order; the workers beyond them compute on the CPU.
class gpu_pool {
public:
  /// `devices`: as select_gpus takes them. `tf32`: let cuBLAS use TF32 tensor cores.
  /// `keep_models`: under local steps a worker's model, velocity and open commit stay on
  /// its device between commits (compute_backend::keeps_local_model), instead of the
  /// parameters going in and the gradient out every step.
  [[nodiscard]] static expected<std::shared_ptr<gpu_pool>> start(caf::actor_system& sys, const std::string& devices,
                                                                bool tf32, bool keep_models = true);
  /// A backend for one model on a device; the GPU actor calls it once per model.
  using backend_maker = std::function<expected<std::unique_ptr<compute_backend>>(const model_spec&)>;
  /// `devices` GPU actors whose backends come from `make` instead of CUDA (tests check
  /// the actors, the blocking calls and the hand-out on machines without a GPU).
  static std::shared_ptr<gpu_pool> start_emulated(caf::actor_system& sys, uint32_t devices, backend_maker make,
                                                  bool keep_models = true);

  /// Stops the GPU actors and lets go of them (their actor system waits for them before
  /// it ends). Workers still holding a device get an error from their next call; later
  /// workers compute on the CPU.
  void stop();
  ~gpu_pool();

  /// The backend factory for the next worker: the next free GPU, else the CPU. The
  /// device is the worker's until release(slot) (or for good, if never released).
  backend_factory next_worker(uint32_t* slot = nullptr);
  void release(uint32_t slot);

  /// The devices in the pool, e.g. "cuda:0 (NVIDIA H100 80GB HBM3)".
  std::vector<std::string> labels() const;
  /// Why the pool has no GPU ("" when it has some).
  const std::string& why_none() const;

  struct impl;

private:
  explicit gpu_pool(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace ashlar::actors
