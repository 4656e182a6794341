// The supervision of one `ashlar launch` (and of any launcher that starts a job's processes
// itself): the scheduler process, the server processes and the worker processes, from the
// start to the last exit. One rule for lost members: before the job has its members, a
// member that exits fails the start at once, naming it; once the job runs, a member process
// that dies (a signal, a crash, a node that exits) is lost, and the job goes on: the
// scheduler hands its samples to the others and fails the job itself when fewer than
// train.min_workers workers remain. A worker script that exits with an error still fails
// the job (every worker runs the same script, so every one would raise the same). The
// scheduler's exit ends the job: the others get a polite stop, then a hard one; worker
// scripts first get time to end by themselves (a script may save its model after its
// loop). A stop signal asks the scheduler to stop the job after the workers' step; a
// second stops every process.
//
// Pure: events in, actions out, time from a clock_source. The launcher turns process exits,
// the scheduler's job-state file and signals into these events and carries out the actions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/clock.hpp"

namespace ashlar::control {

struct launch_member {
  enum role_t : uint8_t { scheduler, server, worker };
  role_t role = worker;
  std::string name;    ///< "worker 0", named in messages
  bool script = false; ///< a worker process that runs the user's script
  uint32_t workers = 1; ///< a worker process's workers (a node of N slots under `launch --hosts`)
};

struct launch_timing {
  /// The scheduler's time to stop a job it was asked to stop. Default: 30 s.
  uint64_t job_stop_ns = 30000000000ull;
  /// After a polite stop (SIGTERM), before the hard one (SIGKILL). Default: 10 s.
  uint64_t term_ns = 10000000000ull;
  /// After the job ended, the worker scripts' time to end by themselves. Default: 10 s.
  uint64_t linger_ns = 10000000000ull;
};

struct launch_action {
  enum kind_t : uint8_t {
    signal,    ///< send `sig` to member `member` (-1: every member that has not exited)
    note_left, ///< worker `member` ended: its scripts' collectives stop waiting for it
    say,       ///< `text` for the launch's own output
  };
  kind_t kind;
  int member = -1;
  int sig = 0;
  std::string text;
};

/// An exit code in words: "code 3", "killed by SIGKILL" (a code of 128 + N is signal N).
std::string describe_exit(int code);

class launch_supervisor {
public:
  /// starting: the job waits for its members; running: it has them; stopping_job: the
  /// scheduler was asked to stop the job; ending: the job is over, the others are stopped;
  /// ended: every process exited.
  enum class phase : uint8_t { starting, running, stopping_job, ending, ended };

  /// `members[0]` is the scheduler; `min_workers`: the job's train.min_workers (the
  /// scheduler applies it; the supervision says what a loss means).
  launch_supervisor(const clock_source& clock, std::vector<launch_member> members, launch_timing timing = {},
                    uint32_t min_workers = 1);

  /// The scheduler says the job has its members (its job-state file): a member lost from
  /// now on does not end the job.
  std::vector<launch_action> on_job_running();
  /// Member `i` exited with `code` (128 + N: killed by signal N); `last`: what it said last.
  std::vector<launch_action> on_exit(size_t i, int code, const std::string& last);
  /// A stop signal (SIGINT or SIGTERM) reached the launcher.
  std::vector<launch_action> on_stop_signal(int sig);
  /// Time passed: call at deadline() or later (earlier calls do nothing).
  std::vector<launch_action> on_time();

  std::optional<uint64_t> deadline() const;
  phase state() const { return phase_; }
  /// The launch's exit code: the scheduler's (the job's outcome), 130 after a stop signal,
  /// or the failed member's.
  int exit_code() const { return code_; }
  /// The member that failed the job and what it said last; "" when none did.
  const std::string& failure() const { return failure_; }
  /// Members lost while the job ran.
  uint32_t lost() const { return lost_; }
  bool exited(size_t i) const { return i < exited_.size() && exited_[i]; }

private:
  std::vector<launch_action> fail(size_t i, int code, const std::string& last, const char* when);
  std::vector<launch_action> stop_job(std::vector<launch_action> out);
  std::vector<launch_action> job_over(int code);
  void check_all_exited();

  const clock_source& clock_;
  std::vector<launch_member> members_;
  launch_timing timing_;
  uint32_t min_workers_;
  std::vector<bool> exited_;
  phase phase_ = phase::starting;
  int code_ = 0;
  bool interrupted_ = false;     // a signal (or a failed member) asked the scheduler to stop the job
  bool scripts_waiting_ = false; // the job is over; worker scripts are given time to end
  uint64_t deadline_ns_ = 0;
  uint32_t lost_ = 0;
  std::string failure_;
};

}  // namespace ashlar::control
