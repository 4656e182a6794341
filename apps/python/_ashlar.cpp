// The Python package's native part: runs the `ashlar` command line in the Python process
// (a local job, a worker node that joins a cluster, any other command) with a compute
// backend written in Python, so that a PyTorch model is what Ashlar's workers train.
//
// A backend is a Python object with two methods, called on Ashlar's worker threads with
// the GIL held (a train_step that raises ashlar.bridge.Closed ends its worker without
// failing the job: the script stopped taking steps):
//   train_step(params, x, y, grad) -> (loss_sum, correct)
//   evaluate(params, x, y) -> (loss_sum, correct)
// params (float32, the model's flat parameters), x (float32 [n, C, H, W] for a model whose
// input has a shape, else [n, dim]), y (uint8 [n]) and
// grad (float32, written by train_step: the mean gradient over the batch) are NumPy arrays
// over Ashlar's own buffers, no copy; they are valid for the call only. The layout of
// params and grad is Ashlar's (each layer's weight, then its bias, as PyTorch stores
// them; see ops/ashlar_torch.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "apps/ashlar/host.hpp"
#include "runtime/backend/compute_backend.hpp"
#include "runtime/metrics/metric_target.hpp"
#include "runtime/model/model.hpp"

namespace py = pybind11;

namespace ashlar {
namespace {

// A NumPy array over `p`, without a copy and without ownership (its base, a capsule,
// frees nothing).
template <class T>
py::array_t<T> view(const T* p, std::vector<py::ssize_t> shape, bool writable) {
  static int anchor = 0;
  py::capsule base(&anchor, [](void*) {});
  py::array_t<T> a(shape, const_cast<T*>(p), base);
  if (!writable)
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

class python_backend final : public compute_backend {
public:
  // Made and dropped with the GIL held; tells the Python object (worker_started,
  // worker_done, where it has them) so that a script's loop ends with its worker.
  python_backend(py::object impl, model_spec spec, std::string name)
    : impl_(std::move(impl)), spec_(std::move(spec)), name_(std::move(name)) {
    // The job's model, as the config's [model] table would give it (input [C, H, W],
    // classes, the layers' text form): what the script builds its network from.
    py::dict model;
    model["input"] = py::make_tuple(spec_.input.c, spec_.input.h, spec_.input.w);
    model["classes"] = spec_.classes;
    model["layers"] = layers_text(spec_.resolved());
    notify("model_given", model);
    notify("worker_started");
  }

  ~python_backend() override {
    py::gil_scoped_acquire gil;
    notify("worker_done");
    impl_ = py::object{};
  }

  const char* name() const override { return name_.c_str(); }
  const model_spec& spec() const override { return spec_; }

  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override {
    return call("train_step", params, b, grad);
  }
  expected<batch_stats> evaluate(const float* params, batch_view b) override {
    return call("evaluate", params, b, nullptr);
  }

private:
  template <class... Args>
  void notify(const char* method, Args&&... args) {
    try {
      if (py::hasattr(impl_, method))
        impl_.attr(method)(std::forward<Args>(args)...);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(method);
    }
  }

  expected<batch_stats> call(const char* method, const float* params, batch_view b, float* grad) {
    if (auto err = check_batch(spec_, b))
      return err;
    const auto n = static_cast<py::ssize_t>(spec_.num_params());
    py::gil_scoped_acquire gil;
    try {
      auto p = view(params, {n}, false);
      // Samples shaped as the model's input ([n, C, H, W]) where it has a shape, else [n, dim].
      const auto rows = static_cast<py::ssize_t>(b.n);
      const auto& in = spec_.input;
      auto x = !in.flat() && in.size() == b.dim
                 ? view(b.x, {rows, py::ssize_t{in.c}, py::ssize_t{in.h}, py::ssize_t{in.w}}, false)
                 : view(b.x, {rows, static_cast<py::ssize_t>(b.dim)}, false);
      auto y = view(b.y, {static_cast<py::ssize_t>(b.n)}, false);
      py::object out = grad ? impl_.attr(method)(p, x, y, view(grad, {n}, true)) : impl_.attr(method)(p, x, y);
      // (loss_sum, correct), or (loss_sum, correct, n) from a backend whose batch is its
      // own (a script's DataLoader): n samples, not Ashlar's batch.
      auto t = out.cast<py::tuple>();
      if (t.size() < 2 || t.size() > 4)
        throw py::cast_error("");
      batch_stats s;
      s.n = b.n;
      s.loss_sum = t[0].cast<double>();
      const auto correct = t[1].cast<long long>();
      s.correct = correct < 0 ? 0 : static_cast<size_t>(correct);
      if (t.size() == 4) { // named metrics the script reported: {name: value}
        for (auto [k, v] : t[3].cast<py::dict>()) {
          auto name = k.cast<std::string>();
          const double value = v.cast<double>();
          if (auto why = metric_name_error(name))
            return make_error(errc::invalid_config, name_ + "." + method + ": metric '" + name + "': " + why);
          if (s.metrics.size() >= 64)
            return make_error(errc::invalid_config, name_ + "." + method + ": at most 64 metrics a report");
          s.metrics.emplace_back(std::move(name), value);
        }
      }
      if (t.size() >= 3) {
        const auto own = t[2].cast<long long>();
        if (own < 0)
          return make_error(errc::invalid_state, name_ + "." + method + ": the batch's size must be at least 0");
        s.n = static_cast<size_t>(own);
        s.own_batch = true;
      }
      if (!std::isfinite(s.loss_sum))
        return make_error(errc::numerical_error, name_ + "." + method + ": the loss is not finite");
      return s;
    } catch (py::error_already_set& e) {
      // ashlar.bridge.Closed: the script stopped taking steps (it left its loop, or
      // shut down); the worker leaves without failing the job.
      if (e.matches(py::module_::import("ashlar.bridge").attr("Closed")))
        return make_error(errc::cancelled, name_ + "." + method + ": " + py::str(e.value()).cast<std::string>());
      return make_error(errc::invalid_state, name_ + "." + method + " raised " + e.what());
    } catch (const py::cast_error&) {
      return make_error(errc::invalid_state, name_ + "." + method
                                               + " must return (loss_sum, correct), (loss_sum, correct, n) or "
                                                 "(loss_sum, correct, n, {metric: value}): a float, ints and a dict "
                                                 "of floats");
    }
  }

  py::object impl_;
  model_spec spec_;
  std::string name_;
};

// What a command writes to stderr still goes there, and its own messages ("ashlar train:
// invalid_config: ...", the lines the command line starts with its name) are kept, so that
// the Python caller can raise them: in a notebook, stderr of the process is not shown. One
// command at a time is watched (a second one running meanwhile, such as a status query
// beside a worker node, is not); the watch ends with the command.
class stderr_watch {
public:
  stderr_watch() {
    if (active_.exchange(true))
      return;
    int p[2];
    std::fflush(stderr);
    if (::pipe(p) != 0) {
      active_ = false;
      return;
    }
    saved_ = ::dup(2);
    if (saved_ < 0 || ::dup2(p[1], 2) < 0) {
      ::close(p[0]);
      ::close(p[1]);
      if (saved_ >= 0)
        ::close(saved_);
      saved_ = -1;
      active_ = false;
      return;
    }
    ::close(p[1]);
    {
      std::lock_guard<std::mutex> lock{mu_};
      lines_.clear();
    }
    reader_ = std::thread([fd = p[0], out = saved_] {
      char buf[4096];
      std::string line;
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
          continue;
        if (n <= 0)
          break;
        for (ssize_t off = 0; off < n;) { // passed on whole
          const ssize_t w = ::write(out, buf + off, static_cast<size_t>(n - off));
          if (w < 0 && errno == EINTR)
            continue;
          if (w <= 0)
            break;
          off += w;
        }
        for (ssize_t i = 0; i < n; ++i) {
          if (buf[i] != '\n') {
            if (line.size() < 4096)
              line += buf[i];
            continue;
          }
          keep(line);
          line.clear();
        }
      }
      keep(line);
      ::close(fd);
    });
  }

  ~stderr_watch() {
    if (saved_ < 0)
      return;
    std::fflush(stderr);
    ::dup2(saved_, 2); // the pipe's last writer gone: the reader sees its end
    reader_.join();
    ::close(saved_);
    active_ = false;
  }

  /// The command line's own messages of the last watched command.
  static std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock{mu_};
    return lines_;
  }

private:
  static void keep(const std::string& line) {
    if (line.rfind("ashlar", 0) != 0)
      return;
    std::lock_guard<std::mutex> lock{mu_};
    if (lines_.size() >= 20)
      lines_.erase(lines_.begin());
    lines_.push_back(line);
  }

  int saved_ = -1;
  std::thread reader_;
  static inline std::atomic<bool> active_{false};
  static inline std::mutex mu_;
  static inline std::vector<std::string> lines_;
};

// ashlar <args...> with `backend` (None: Ashlar's own) for the workers it starts here.
int run(const std::vector<std::string>& args, py::object backend) {
  if (backend.is_none()) {
    cli::set_host_backend({});
  } else {
    for (const char* m : {"train_step", "evaluate"})
      if (!py::hasattr(backend, m))
        throw py::type_error(std::string{"ashlar: the backend has no "} + m + " method");
    std::string name = "python:" + py::str(backend.attr("__class__").attr("__name__")).cast<std::string>();
    // The factory is copied and dropped on Ashlar's threads without the GIL: it holds the
    // Python object through a shared pointer whose last owner takes the GIL to let it go.
    std::shared_ptr<py::object> impl(new py::object(backend), [](py::object* o) {
      py::gil_scoped_acquire gil;
      delete o;
    });
    cli::set_host_backend([impl, name](const model_spec& spec) {
      py::gil_scoped_acquire gil;
      return actors::backend_choice{std::make_unique<python_backend>(*impl, spec, name), "on " + name};
    });
  }
  std::vector<std::string> argv{"ashlar"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> ptrs;
  for (auto& a : argv)
    ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  // The factory holds `backend`: dropped here, with the GIL, however the command ends.
  struct reset {
    ~reset() { cli::set_host_backend({}); }
  } reset_backend;
  py::gil_scoped_release release;
  stderr_watch watch;
  return cli::run_cli(static_cast<int>(argv.size()), ptrs.data());
}

}  // namespace
}  // namespace ashlar

PYBIND11_MODULE(_ashlar, m) {
  m.doc() = "Ashlar's command line and workers in a Python process (see the ashlar package)";
  ashlar::cli::leave_signals_to_host();
  m.def("run", &ashlar::run, py::arg("args"), py::arg("backend") = py::none(),
        "Runs `ashlar ARGS...` in this process and returns its exit code; the workers it starts here "
        "compute with `backend` (an object with train_step and evaluate), or Ashlar's own when None. "
        "Releases the GIL while it runs.");
  m.def("messages", &ashlar::stderr_watch::lines,
        "The command line's own messages (the lines it wrote to stderr starting with 'ashlar', such as "
        "'ashlar train: invalid_config: ...') of the last command run, at most 20.");
  m.def("reset_stop", [] { ashlar::cli::request_stop(0); },
        "Clears a stop request: called before a command starts (one of an earlier command must not stop it).");
  m.def("request_stop", [] { ashlar::cli::request_stop(SIGTERM); },
        "Asks the running command to stop as SIGTERM would: a job stops its workers after their step and "
        "reports; a worker node leaves the cluster.");
}
