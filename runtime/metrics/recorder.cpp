#include "runtime/metrics/recorder.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/core/clock.hpp"
#include "runtime/metrics/json.hpp"
#include "runtime/os/paths.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace ashlar {

namespace {

uint64_t wall_ns() { return static_cast<uint64_t>(unix_ns()); }

// The trace's track for a worker (tid 0 is the job's own track).
int64_t track(int64_t worker) { return worker < 0 ? 0 : worker + 1; }

// Whole microseconds; the end is rounded, not the duration, so that a span starting where
// another ends never overlaps it. A span that would start before the track's last one
// ended (a step's parts overlap when its pull and computation run in a pipeline, or its
// push runs on while the next step begins) is clipped to start at that end: one track
// shows one thing at a time, and stays on wall time.
std::string span(const char* name, double ts_us, double dur_us, int64_t tid, const std::string& args,
                 long long& track_end) {
  const long long start = std::max(std::llround(ts_us), track_end);
  const long long end = std::max(start, std::llround(ts_us + dur_us));
  track_end = end;
  return "{\"name\":\"" + std::string(name) + "\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":" + std::to_string(start)
         + ",\"dur\":" + std::to_string(end - start) + ",\"pid\":1,\"tid\":" + std::to_string(tid) + ",\"args\":{" + args
         + "}}";
}

}  // namespace

expected<std::shared_ptr<run_recorder>> run_recorder::open(const std::string& trace_path,
                                                           const std::string& metrics_path, const std::string& root) {
  std::shared_ptr<run_recorder> r{new run_recorder};
  auto open_one = [&root](const std::string& path, const char* what, std::FILE*& f) -> caf::error {
    if (path.empty())
      return caf::none;
    auto fd = open_confined(root, path, O_WRONLY | O_CREAT | O_TRUNC, what);
    if (!fd)
      return fd.error();
    f = ::fdopen(*fd, "w");
    if (!f) {
      ::close(*fd);
      return make_error(errc::io_error, "cannot write " + path + ": " + std::strerror(errno));
    }
    return caf::none;
  };
  if (auto err = open_one(trace_path, "run.trace", r->trace_))
    return err;
  if (auto err = open_one(metrics_path, "run.metrics", r->metrics_))
    return err;
  r->trace_path_ = trace_path;
  r->metrics_path_ = metrics_path;
  if (r->trace_)
    std::fputs("[\n", r->trace_);
  r->mark_start();
  return r;
}

run_recorder::~run_recorder() { close(); }

void run_recorder::mark_start() {
  std::lock_guard<std::mutex> lock{mu_};
  t0_ns_ = wall_ns();
}

double run_recorder::now_seconds() const { return static_cast<double>(wall_ns() - t0_ns_) * 1e-9; }

void run_recorder::trace_line(const std::string& json) {
  if (!trace_)
    return;
  if (!first_event_)
    std::fputs(",\n", trace_);
  first_event_ = false;
  std::fputs(json.c_str(), trace_);
}

void run_recorder::metrics_line(const std::string& json) {
  if (!metrics_)
    return;
  std::fputs(json.c_str(), metrics_);
  std::fputc('\n', metrics_);
}

void run_recorder::name_thread(int64_t tid, const std::string& name) {
  if (!trace_ || !named_.insert(tid).second)
    return;
  trace_line("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid)
             + ",\"args\":{\"name\":" + json_string(name) + "}}");
  trace_line("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid)
             + ",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}");
}

void run_recorder::describe_run(const std::string& name, const std::string& json_members) {
  std::lock_guard<std::mutex> lock{mu_};
  trace_line("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":" + json_string(name) + "}}");
  name_thread(0, "job");
  metrics_line("{\"type\":\"run\"," + json_members + "}");
}

void run_recorder::step(const wire::profile_report& r) {
  std::lock_guard<std::mutex> lock{mu_};
  if (!trace_ && !metrics_)
    return;
  const double begin = r.start_ns > t0_ns_ ? static_cast<double>(r.start_ns - t0_ns_) * 1e-9 : 0.0;
  const double us = 1e-3; // ns -> us
  const double step_ns = static_cast<double>(r.compute_ns + r.pull_ns + r.push_ns + r.wait_ns);
  if (trace_) {
    const int64_t tid = track(r.worker_id);
    name_thread(tid, "worker " + std::to_string(r.worker_id));
    const std::string args = "\"step\":" + std::to_string(r.step) + ",\"samples\":" + std::to_string(r.samples);
    double t = begin * 1e6;
    // A step that pulled: the policy's hold (wait), the transfer, then the computation.
    // One that did not (a local step, a ring step): the computation first, then the
    // all-reduce (wait), then any push.
    if (r.pull_ns > 0) {
      if (r.wait_ns > 0)
        trace_line(span("wait", t, r.wait_ns * us, tid, args, track_end_us_[tid]));
      t += r.wait_ns * us;
      trace_line(span("pull", t, r.pull_ns * us, tid, args, track_end_us_[tid]));
      t = begin * 1e6 + std::max<double>(r.compute_offset_ns * us, (r.wait_ns + r.pull_ns) * us);
      trace_line(span("compute", t, r.compute_ns * us, tid, args, track_end_us_[tid]));
      t += r.compute_ns * us;
    } else {
      t += r.compute_offset_ns * us;
      trace_line(span("compute", t, r.compute_ns * us, tid, args, track_end_us_[tid]));
      t += r.compute_ns * us;
      if (r.wait_ns > 0)
        trace_line(span("wait", t, r.wait_ns * us, tid, args, track_end_us_[tid]));
      t += r.wait_ns * us;
    }
    if (r.push_ns > 0)
      trace_line(span("push", t, r.push_ns * us, tid, args + ",\"staleness\":" + std::to_string(r.staleness),
                      track_end_us_[tid]));
  }
  if (metrics_) {
    const double s = 1e-9;
    metrics_line("{\"type\":\"step\",\"t\":" + json_seconds(begin + step_ns * s) + ",\"worker\":"
                 + std::to_string(r.worker_id) + ",\"step\":" + std::to_string(r.step) + ",\"samples\":"
                 + std::to_string(r.samples) + ",\"step_seconds\":" + json_number(step_ns * s)
                 + ",\"compute_seconds\":" + json_number(r.compute_ns * s) + ",\"pull_seconds\":"
                 + json_number(r.pull_ns * s) + ",\"push_seconds\":" + json_number(r.push_ns * s)
                 + ",\"wait_seconds\":" + json_number(r.wait_ns * s) + ",\"samples_per_second\":"
                 + json_number(step_ns > 0 ? r.samples / (step_ns * s) : 0.0) + ",\"staleness\":"
                 + std::to_string(r.staleness) + ",\"bytes\":" + std::to_string(r.bytes) + ",\"loss\":"
                 + json_number(r.loss) + "}");
  }
}

void run_recorder::event(const std::string& name, const std::string& detail, int64_t worker) {
  std::lock_guard<std::mutex> lock{mu_};
  const double t = now_seconds();
  if (trace_) {
    const int64_t tid = track(worker);
    name_thread(tid, worker < 0 ? "job" : "worker " + std::to_string(worker));
    trace_line("{\"name\":" + json_string(name) + ",\"cat\":\"event\",\"ph\":\"i\",\"s\":\""
               + std::string(worker < 0 ? "g" : "t") + "\",\"ts\":" + json_micros(t * 1e6)
               + ",\"pid\":1,\"tid\":" + std::to_string(tid) + ",\"args\":{\"detail\":" + json_string(detail) + "}}");
  }
  metrics_line("{\"type\":\"event\",\"t\":" + json_seconds(t) + ",\"name\":" + json_string(name)
               + ",\"worker\":" + std::to_string(worker) + ",\"detail\":" + json_string(detail) + "}");
}

void run_recorder::evaluation(double at, double epoch, double accuracy, double train_loss) {
  std::lock_guard<std::mutex> lock{mu_};
  trace_line("{\"name\":\"test accuracy\",\"ph\":\"C\",\"ts\":" + json_micros(at * 1e6)
             + ",\"pid\":1,\"tid\":0,\"args\":{\"accuracy\":" + json_number(accuracy) + "}}");
  metrics_line("{\"type\":\"eval\",\"t\":" + json_seconds(at) + ",\"epoch\":" + json_number(epoch)
               + ",\"test_accuracy\":" + json_number(accuracy) + ",\"train_loss\":" + json_number(train_loss) + "}");
}

void run_recorder::user_metrics(double at, double epoch, uint32_t worker,
                                const std::vector<std::pair<std::string, double>>& values) {
  std::lock_guard<std::mutex> lock{mu_};
  std::string members;
  for (const auto& [name, value] : values) {
    members += "," + json_string(name) + ":" + json_number(value, 10);
    trace_line("{\"name\":" + json_string(name) + ",\"ph\":\"C\",\"ts\":" + json_micros(at * 1e6)
               + ",\"pid\":1,\"tid\":0,\"args\":{\"value\":" + json_number(value) + "}}");
  }
  metrics_line("{\"type\":\"metrics\",\"t\":" + json_seconds(at) + ",\"epoch\":" + json_number(epoch)
               + ",\"worker\":" + std::to_string(worker) + ",\"values\":{" + (members.empty() ? "" : members.substr(1))
               + "}}");
}

void run_recorder::close() {
  std::lock_guard<std::mutex> lock{mu_};
  auto finish = [this](std::FILE*& f, const std::string& path) {
    if (!f)
      return;
    bool bad = std::ferror(f) != 0;
    bad = std::fclose(f) != 0 || bad;
    f = nullptr;
    if (bad && !failed_) {
      failed_ = true;
      spdlog::warn("recorder: writing {} failed (disk full?); the file is incomplete", path);
    }
  };
  if (trace_)
    std::fputs("\n]\n", trace_);
  finish(trace_, trace_path_);
  finish(metrics_, metrics_path_);
}

}  // namespace ashlar
