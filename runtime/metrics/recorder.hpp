// What a run leaves behind to look at: a Chrome trace-event file (--trace; opens in
// Perfetto or chrome://tracing) with every worker's wait, pull, compute and push spans,
// stage changes and membership events; and metrics as JSON lines (--metrics): one line
// per worker step, per event and per test evaluation. The profiler, the scheduler and the
// job driver record into one recorder from their threads; it serialises them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

class run_recorder {
public:
  /// Opens (truncates) the files; an empty path records nothing there. With `root`,
  /// beneath it (runtime/os/paths.hpp: open_confined). Fails with io_error naming the path
  /// that cannot be written, invalid_argument for one that leads outside root.
  [[nodiscard]] static expected<std::shared_ptr<run_recorder>> open(const std::string& trace_path,
                                                                  const std::string& metrics_path,
                                                                  const std::string& root = "");
  ~run_recorder();
  run_recorder(const run_recorder&) = delete;
  run_recorder& operator=(const run_recorder&) = delete;

  /// Time zero of the run (now); timestamps are seconds (metrics) or microseconds
  /// (trace) from here. Set when open()ed.
  void mark_start();

  /// The run's settings, as a JSON object's members ("\"policy\": \"bsp\", ..."): the
  /// metrics file's first line, and the trace's process name.
  void describe_run(const std::string& name, const std::string& json_members);

  /// One finished worker step, with its phases as the worker measured them.
  void step(const wire::profile_report& r);

  /// Something that happened now: a stage change or a membership event (worker < 0:
  /// the job as a whole, drawn on the scheduler's track).
  void event(const std::string& name, const std::string& detail, int64_t worker = -1);

  /// A test evaluation of the parameters as they were `at` seconds into the run.
  void evaluation(double at, double epoch, double accuracy, double train_loss);

  /// A script's report of named metrics (ashlar.torch.report), `at` seconds into the run:
  /// a "metrics" line of the metrics file and a counter track per name in the trace.
  void user_metrics(double at, double epoch, uint32_t worker, const std::vector<std::pair<std::string, double>>& values);

  /// Finishes both files (the trace's closing bracket) and flushes them; later calls
  /// record nothing. Write failures (a full disk) are logged once, never thrown.
  void close();

private:
  run_recorder() = default;
  double now_seconds() const;
  void trace_line(const std::string& json);
  void metrics_line(const std::string& json);
  void name_thread(int64_t tid, const std::string& name);

  std::mutex mu_;
  std::map<int64_t, long long> track_end_us_; // where each track's last span ended
  std::FILE* trace_ = nullptr;
  std::FILE* metrics_ = nullptr;
  std::string trace_path_, metrics_path_;
  bool first_event_ = true;
  bool failed_ = false;
  uint64_t t0_ns_ = 0; // wall clock, ns since the Unix epoch
  std::set<int64_t> named_;
};

}  // namespace ashlar
