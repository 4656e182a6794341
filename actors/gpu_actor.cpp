#include "actors/gpu_actor.hpp"
#include "actors/gpu_call.hpp"

#include <map>
#include <mutex>
#include <sstream>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "gpu/cuda_backend.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/config/train_config.hpp"

namespace ashlar::actors {

namespace {

struct gpu_state {
  std::string device_name;
  gpu_pool::backend_maker make;
  bool keep_models = true; // let backends that can keep workers' local models
  std::map<std::string, std::unique_ptr<compute_backend>> backends; // per model
  static constexpr const char* name = "ashlar.gpu";
};

// Owns one device; runs on a thread of its own (spawned detached), one call at a time.
gpu_actor::behavior_type gpu_behavior(gpu_actor::stateful_pointer<gpu_state> self, std::string name,
                                      gpu_pool::backend_maker make, bool keep_models) {
  self->state.device_name = std::move(name);
  self->state.make = std::move(make);
  self->state.keep_models = keep_models;
  return {
    [=](const gpu_call& c) {
      auto& st = self->state;
      gpu_reply r;
      if (!c.spec || !c.model) {
        r.err = make_error(errc::invalid_argument, "a GPU call without its model");
        return r;
      }
      auto& b = st.backends[*c.model];
      if (!b) {
        auto made = st.make(*c.spec);
        if (!made) {
          st.backends.erase(*c.model);
          r.err = made.error();
          return r;
        }
        b = std::move(*made);
        spdlog::debug("gpu {}: model {} ready", st.device_name, *c.model);
      }
      r.name = std::string{b->name()} + " (" + st.device_name + ")";
      r.keeps_model = st.keep_models && b->keeps_local_model();
      expected<batch_stats> s = batch_stats{};
      switch (c.kind) {
        case gpu_call::prepare:
          return r;
        case gpu_call::train:
          s = b->train_step(c.params, c.batch, c.grad);
          break;
        case gpu_call::evaluate:
          s = b->evaluate(c.params, c.batch);
          break;
        case gpu_call::local_step:
          s = b->local_step(c.params, c.velocity, c.commit, c.batch, c.lr, c.momentum);
          break;
        case gpu_call::take_commit:
          r.err = b->take_commit(c.grad, c.scale, c.velocity_out);
          return r;
        case gpu_call::rebase:
          r.err = b->rebase(c.params, c.lr);
          return r;
      }
      if (s)
        r.stats = *s;
      else
        r.err = s.error();
      return r;
    },
  };
}

// The worker's side: a compute_backend whose calls the GPU actor runs. Each call blocks
// its caller until the reply (as a CPU computation would), so the pointers it passes
// stay valid for the GPU actor's use.
class gpu_proxy final : public compute_backend {
public:
  gpu_proxy(caf::actor_system& sys, gpu_actor gpu, model_spec spec)
    : sys_(sys), gpu_(std::move(gpu)), spec_(std::move(spec)), key_(model_key(spec_)) {
  }

  caf::error prepare() {
    gpu_call c;
    c.kind = gpu_call::prepare;
    auto r = call(std::move(c));
    return r ? caf::error{} : r.error();
  }

  const char* name() const override {
    return name_.c_str();
  }
  const model_spec& spec() const override {
    return spec_;
  }
  expected<batch_stats> train_step(const float* params, batch_view batch, float* grad) override {
    gpu_call c;
    c.kind = gpu_call::train;
    c.params = params;
    c.batch = batch;
    c.grad = grad;
    return call(std::move(c));
  }
  expected<batch_stats> evaluate(const float* params, batch_view batch) override {
    gpu_call c;
    c.kind = gpu_call::evaluate;
    c.params = params;
    c.batch = batch;
    return call(std::move(c));
  }
  bool keeps_local_model() const override {
    return keeps_model_;
  }
  expected<batch_stats> local_step(const float* load, const float* velocity, const float* commit, batch_view batch,
                                   float lr, float momentum) override {
    gpu_call c;
    c.kind = gpu_call::local_step;
    c.params = load;
    c.velocity = velocity;
    c.commit = commit;
    c.batch = batch;
    c.lr = lr;
    c.momentum = momentum;
    return call(std::move(c));
  }
  caf::error take_commit(float* out, float scale, float* velocity_out) override {
    gpu_call c;
    c.kind = gpu_call::take_commit;
    c.grad = out;
    c.scale = scale;
    c.velocity_out = velocity_out;
    auto r = call(std::move(c));
    return r ? caf::error{} : r.error();
  }
  caf::error rebase(const float* pulled, float lr) override {
    gpu_call c;
    c.kind = gpu_call::rebase;
    c.params = pulled;
    c.lr = lr;
    auto r = call(std::move(c));
    return r ? caf::error{} : r.error();
  }
  // Locking host memory is a CUDA runtime call that any thread may make.
  std::shared_ptr<void> lock_host_memory(void* p, size_t bytes) override {
    return gpu::lock_host(p, bytes);
  }

  gpu_route route() const {
    return {&gpu_, &spec_, &key_};
  }

private:
  expected<batch_stats> call(gpu_call c) {
    c.spec = &spec_;
    c.model = &key_;
    expected<batch_stats> out = batch_stats{};
    // One blocking actor for the proxy's life, not one per call (creating it cost a step
    // of a small model). Hidden: the actor system's end does not wait for it.
    if (!self_)
      self_ = std::make_unique<caf::scoped_actor>(sys_, true);
    auto& self = *self_;
    self->request(gpu_, caf::infinite, std::move(c))
      .receive(
        [&](gpu_reply& r) {
          if (!r.name.empty())
            name_ = r.name;
          keeps_model_ = r.keeps_model;
          if (r.err)
            out = std::move(r.err);
          else
            out = r.stats;
        },
        [&](caf::error& err) {
          out = make_error(errc::device_error, "the GPU actor did not answer: " + describe(err));
        });
    return out;
  }

  caf::actor_system& sys_;
  gpu_actor gpu_;
  model_spec spec_;
  std::string key_;
  std::string name_ = "cuda";
  bool keeps_model_ = false;
  std::unique_ptr<caf::scoped_actor> self_;
};

}  // namespace

struct gpu_pool::impl {
  caf::actor_system* sys = nullptr;
  struct device {
    gpu_actor actor;
    std::string label; // "cuda:0 (NVIDIA ...)"
    bool taken = false;
  };
  std::vector<device> devices;
  std::string why_none;
  std::mutex mu;
};

expected<gpu_selection> select_gpus(const std::string& spec) {
  if (auto err = validate_gpu_list(spec))
    return err;
  gpu_selection out;
  if (spec == "none" || spec.empty()) {
    out.why_none = spec.empty() ? "no GPU asked for (--gpus auto uses the GPUs there are)" : "no GPU: --gpus none";
    return out;
  }
  auto found = gpu::list_devices();
  if (spec == "auto") {
    // None found is no error under "auto": the details only for a debug log.
    if (!found || found->empty()) {
      out.why_none = "no GPU found";
      spdlog::debug("GPUs: {}", found ? std::string{"no CUDA device"} : describe(found.error()));
    }
    else
      for (const auto& d : *found) {
        out.devices.push_back(d.index);
        out.names.push_back(d.name);
      }
    return out;
  }
  if (!found)
    return make_error(errc::invalid_argument, "--gpus " + spec + ": " + describe(found.error()));
  std::stringstream in{spec};
  std::string item;
  while (std::getline(in, item, ',')) {
    int i = std::stoi(item);
    if (static_cast<size_t>(i) >= found->size())
      return make_error(errc::invalid_argument, "--gpus " + spec + ": GPU " + item + " does not exist (this "
                                                  "machine has " + std::to_string(found->size()) + ")");
    out.devices.push_back(i);
    out.names.push_back((*found)[static_cast<size_t>(i)].name);
  }
  return out;
}

expected<std::shared_ptr<gpu_pool>> gpu_pool::start(caf::actor_system& sys, const std::string& devices, bool tf32,
                                                    bool keep_models) {
  auto selected = select_gpus(devices);
  if (!selected)
    return selected.error();
  auto p = std::make_unique<impl>();
  p->sys = &sys;
  p->why_none = selected->why_none;
  gpu::cuda_options options;
  options.tf32 = tf32;
  for (size_t k = 0; k < selected->devices.size(); ++k) {
    const int i = selected->devices[k];
    const auto& name = selected->names[k];
    impl::device dev;
    dev.actor = sys.spawn<caf::detached>(gpu_behavior, name, [i, options](const model_spec& spec)
                                           -> expected<std::unique_ptr<compute_backend>> {
      return gpu::make_cuda_backend(spec, i, options);
    }, keep_models);
    dev.label = "cuda:" + std::to_string(i) + " (" + name + ")";
    p->devices.push_back(std::move(dev));
  }
  return std::shared_ptr<gpu_pool>{new gpu_pool(std::move(p))};
}

std::shared_ptr<gpu_pool> gpu_pool::start_emulated(caf::actor_system& sys, uint32_t devices, backend_maker make,
                                                   bool keep_models) {
  auto p = std::make_unique<impl>();
  p->sys = &sys;
  for (uint32_t i = 0; i < devices; ++i) {
    impl::device dev;
    dev.actor = sys.spawn<caf::detached>(gpu_behavior, "emulated", make, keep_models);
    dev.label = "emulated:" + std::to_string(i);
    p->devices.push_back(std::move(dev));
  }
  return std::shared_ptr<gpu_pool>{new gpu_pool(std::move(p))};
}

gpu_pool::gpu_pool(std::unique_ptr<impl> p) : impl_(std::move(p)) {
}

void gpu_pool::stop() {
  std::lock_guard<std::mutex> lock{impl_->mu};
  for (auto& d : impl_->devices)
    caf::anon_send_exit(d.actor, caf::exit_reason::user_shutdown);
  // Drop the handles too: a detached actor's thread (and so its actor system's end)
  // waits until the last handle to it is gone.
  if (!impl_->devices.empty()) {
    impl_->devices.clear();
    impl_->why_none = "this process's GPU actors were stopped";
  }
}

gpu_pool::~gpu_pool() {
  stop();
}

backend_factory gpu_pool::next_worker(uint32_t* slot) {
  std::lock_guard<std::mutex> lock{impl_->mu};
  for (size_t i = 0; i < impl_->devices.size(); ++i) {
    auto& d = impl_->devices[i];
    if (d.taken)
      continue;
    d.taken = true;
    if (slot)
      *slot = static_cast<uint32_t>(i);
    auto* sys = impl_->sys;
    auto actor = d.actor;
    auto label = d.label;
    return [sys, actor, label](const model_spec& spec) {
      auto proxy = std::make_unique<gpu_proxy>(*sys, actor, spec);
      if (auto err = proxy->prepare())
        return cpu_choice(spec, "on the CPU: " + label + " could not take the model: " + describe(err));
      std::string note = std::string{"on "} + proxy->name();
      return backend_choice{std::move(proxy), std::move(note)};
    };
  }
  if (slot)
    *slot = UINT32_MAX;
  std::string why = impl_->devices.empty() ? impl_->why_none
                                           : "every GPU of this process (" + std::to_string(impl_->devices.size())
                                               + ") is taken by another worker";
  const bool quiet = impl_->devices.empty(); // not one taken by another worker: nothing to say per worker
  return [why, quiet](const model_spec& spec) {
    auto c = cpu_choice(spec, "on the CPU: " + why);
    c.quiet = quiet && c.backend != nullptr;
    return c;
  };
}

std::string model_key(const model_spec& spec) {
  return spec.input.to_string() + "|" + std::to_string(spec.classes) + "|" + layers_text(spec.resolved());
}

gpu_route route_of(const compute_backend& backend) {
  auto* proxy = dynamic_cast<const gpu_proxy*>(&backend);
  return proxy != nullptr ? proxy->route() : gpu_route{};
}

backend_choice cpu_choice(const model_spec& spec, std::string note) {
  auto b = make_cpu_backend(spec);
  if (!b)
    return backend_choice{nullptr, describe(b.error())};
  return backend_choice{std::move(*b), std::move(note)};
}

void gpu_pool::release(uint32_t slot) {
  std::lock_guard<std::mutex> lock{impl_->mu};
  if (slot < impl_->devices.size())
    impl_->devices[slot].taken = false;
}

std::vector<std::string> gpu_pool::labels() const {
  std::vector<std::string> out;
  for (const auto& d : impl_->devices)
    out.push_back(d.label);
  return out;
}

const std::string& gpu_pool::why_none() const {
  return impl_->why_none;
}

}  // namespace ashlar::actors
