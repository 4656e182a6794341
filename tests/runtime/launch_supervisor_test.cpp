// The launcher's supervision (runtime/control/launch_supervisor.hpp): one rule for lost
// members, stop signals, and the stop of every process after the job, on a manual clock.
#include <catch2/catch.hpp>

#include <csignal>

#include "runtime/control/launch_supervisor.hpp"

using namespace ashlar;
using namespace ashlar::control;
using sup_t = launch_supervisor;

namespace {

// The scheduler, one server and `workers` worker processes (scripts if `scripts`).
std::vector<launch_member> job_members(int workers, bool scripts = false) {
  std::vector<launch_member> m{{launch_member::scheduler, "scheduler", false}, {launch_member::server, "server 0", false}};
  for (int i = 0; i < workers; ++i)
    m.push_back({launch_member::worker, "worker " + std::to_string(i), scripts});
  return m;
}

int signals_to(const std::vector<launch_action>& out, int member, int sig) {
  int n = 0;
  for (const auto& a : out)
    n += a.kind == launch_action::signal && a.member == member && a.sig == sig;
  return n;
}

std::string said(const std::vector<launch_action>& out) {
  std::string s;
  for (const auto& a : out)
    if (a.kind == launch_action::say)
      s += a.text + "\n";
  return s;
}

bool noted_left(const std::vector<launch_action>& out, int member) {
  for (const auto& a : out)
    if (a.kind == launch_action::note_left && a.member == member)
      return true;
  return false;
}

} // namespace

TEST_CASE("exit codes are said in words, a signal by its name") {
  CHECK(describe_exit(3) == "code 3");
  CHECK(describe_exit(137) == "killed by SIGKILL");
  CHECK(describe_exit(139) == "killed by SIGSEGV");
  CHECK(describe_exit(128 + 40) == "killed by signal 40");
  CHECK(describe_exit(255) == "code 255"); // ssh's own failure, not a signal
}

TEST_CASE("a lost node of several workers counts all of them against train.min_workers") {
  manual_clock clock;
  // launch --hosts: one worker node of 4 workers and one of 2.
  std::vector<launch_member> m{{launch_member::scheduler, "scheduler", false},
                               {launch_member::server, "server-0@h1", false},
                               {launch_member::worker, "worker@h1", false, 4},
                               {launch_member::worker, "worker@h2", false, 2}};
  sup_t sup{clock, m, {}, 3};
  sup.on_job_running();
  auto out = sup.on_exit(3, 255, "");
  CHECK(said(out).find("worker@h2 was lost (exited with code 255); the job goes on with the other 4") != std::string::npos);
  sup_t strict{clock, m, {}, 3};
  strict.on_job_running();
  out = strict.on_exit(2, 137, "");
  CHECK(said(out).find("2 workers remain, fewer than train.min_workers = 3: the job fails") != std::string::npos);
}

TEST_CASE("a member that exits before the job has its members fails the start at once, naming it") {
  manual_clock clock;
  sup_t sup{clock, job_members(2)};
  auto out = sup.on_exit(3, 1, "cannot reach the scheduler");
  CHECK(signals_to(out, 0, SIGTERM) == 1); // the scheduler stops waiting for it
  CHECK(said(out).find("worker 1 exited with code 1 before the job had its members: cannot reach") != std::string::npos);
  CHECK(sup.failure() == "worker 1 exited with code 1: cannot reach the scheduler");
  CHECK(sup.state() == sup_t::phase::stopping_job);
  // The scheduler ends (its code is not the launch's: the member's is), then the others.
  out = sup.on_exit(0, 1, "");
  CHECK(signals_to(out, 1, SIGTERM) == 1);
  CHECK(signals_to(out, 2, SIGTERM) == 1);
  sup.on_exit(1, 0, "");
  sup.on_exit(2, 0, "");
  CHECK(sup.state() == sup_t::phase::ended);
  CHECK(sup.exit_code() == 1);
  // Killed before the start: the failure says so, and the code is 1, not the signal's.
  sup_t killed{clock, job_members(1)};
  killed.on_exit(2, 137, "");
  CHECK(killed.failure() == "worker 0 exited with killed by SIGKILL");
  CHECK(killed.exit_code() == 1);
}

TEST_CASE("a worker process lost once the job runs leaves the job running, and the scheduler's code is the launch's") {
  manual_clock clock;
  sup_t sup{clock, job_members(3)};
  sup.on_job_running();
  auto out = sup.on_exit(3, 137, "step 40");
  CHECK(noted_left(out, 3));
  CHECK(signals_to(out, -1, SIGTERM) + signals_to(out, -1, SIGKILL) + signals_to(out, 0, SIGTERM) == 0);
  CHECK(said(out).find("worker 1 was lost (exited with killed by SIGKILL); the job goes on with the other 2 (the "
                       "scheduler hands its samples to them)") != std::string::npos);
  CHECK(sup.state() == sup_t::phase::running);
  CHECK(sup.lost() == 1);
  CHECK(sup.failure().empty());
  // A node that exits with an error after the start (it lost its connection) is lost too.
  out = sup.on_exit(4, 1, "");
  CHECK(sup.state() == sup_t::phase::running);
  CHECK(sup.lost() == 2);
  // No deadline while the job runs: nothing happens however long it takes.
  CHECK(!sup.deadline());
  clock.advance(std::chrono::hours(5));
  CHECK(sup.on_time().empty());
  // The job ends: the scheduler's code (0, it trained its epochs) is the launch's.
  out = sup.on_exit(0, 0, "");
  CHECK(signals_to(out, 1, SIGTERM) == 1);
  CHECK(signals_to(out, 2, SIGTERM) == 1);
  CHECK(signals_to(out, 3, SIGTERM) == 0); // (exited already)
  sup.on_exit(1, 0, "");
  sup.on_exit(2, 0, "");
  CHECK(sup.state() == sup_t::phase::ended);
  CHECK(sup.exit_code() == 0);
  // A job that fails (too few workers left) ends the launch with the scheduler's code.
  sup_t short_of{clock, job_members(2), {}, 2};
  short_of.on_job_running();
  out = short_of.on_exit(2, 137, "");
  CHECK(said(out).find("1 workers remain, fewer than train.min_workers = 2: the job fails") != std::string::npos);
  CHECK(short_of.state() == sup_t::phase::running); // (the scheduler fails it, with the cause in its report)
  short_of.on_exit(0, 1, "");
  CHECK(short_of.exit_code() == 1);
}

TEST_CASE("a lost server process is left to the scheduler, its loss said") {
  manual_clock clock;
  sup_t sup{clock, job_members(2)};
  sup.on_job_running();
  auto out = sup.on_exit(1, 137, "");
  CHECK(said(out).find("server 0 was lost") != std::string::npos);
  CHECK(!noted_left(out, 1));
  CHECK(sup.state() == sup_t::phase::running);
}

TEST_CASE("a worker script that fails once the job runs fails the job, one killed is lost") {
  manual_clock clock;
  sup_t sup{clock, job_members(3, true)};
  sup.on_job_running();
  auto out = sup.on_exit(2, 137, "");
  CHECK(sup.state() == sup_t::phase::running);
  CHECK(noted_left(out, 2));
  out = sup.on_exit(3, 1, "ValueError: bad shape");
  CHECK(signals_to(out, 0, SIGTERM) == 1);
  CHECK(sup.failure() == "worker 1 exited with code 1: ValueError: bad shape");
  CHECK(said(out).find("its script failed") != std::string::npos);
  CHECK(sup.state() == sup_t::phase::stopping_job);
  // The scheduler stops the job; the scripts left are stopped at once (the job failed).
  out = sup.on_exit(0, 1, "");
  CHECK(signals_to(out, 4, SIGTERM) == 1);
  CHECK(sup.exit_code() == 1);
  // A script that ends well before the others is no failure.
  sup_t early{clock, job_members(2, true)};
  early.on_job_running();
  early.on_exit(2, 0, "");
  CHECK(early.state() == sup_t::phase::running);
  CHECK(early.lost() == 0);
}

TEST_CASE("after the job the worker scripts get time to end by themselves, then the polite stop, then the hard one") {
  manual_clock clock;
  launch_timing t;
  sup_t sup{clock, job_members(2, true), t};
  sup.on_job_running();
  auto out = sup.on_exit(0, 0, "");
  CHECK(signals_to(out, 1, SIGTERM) == 1); // the server: at once
  CHECK(signals_to(out, 2, SIGTERM) == 0); // the scripts: not yet
  CHECK(*sup.deadline() == clock.steady_ns() + t.linger_ns);
  sup.on_exit(1, 0, "");
  sup.on_exit(2, 0, ""); // one script ends by itself
  clock.advance(t.linger_ns - 1);
  CHECK(sup.on_time().empty());
  clock.advance(1);
  out = sup.on_time();
  CHECK(signals_to(out, 3, SIGTERM) == 1);
  CHECK(signals_to(out, 2, SIGTERM) == 0);
  clock.advance(t.term_ns);
  out = sup.on_time();
  CHECK(signals_to(out, -1, SIGKILL) == 1);
  sup.on_exit(3, 137, "");
  CHECK(sup.state() == sup_t::phase::ended);
  CHECK(sup.exit_code() == 0);
}

TEST_CASE("a stop signal asks the scheduler to stop the job, and a second or the scheduler's silence, stops every process") {
  manual_clock clock;
  launch_timing t;
  sup_t sup{clock, job_members(2), t};
  sup.on_job_running();
  auto out = sup.on_stop_signal(SIGINT);
  CHECK(signals_to(out, 0, SIGTERM) == 1);
  CHECK(signals_to(out, -1, SIGTERM) == 0);
  CHECK(said(out).find("interrupted: stopping the job after the workers' current step") != std::string::npos);
  // A worker lost while the job stops is no failure.
  sup.on_exit(2, 137, "");
  CHECK(sup.failure().empty());
  // The scheduler does not stop it in time: every process gets the polite stop, then the hard one.
  clock.advance(t.job_stop_ns);
  out = sup.on_time();
  CHECK(signals_to(out, -1, SIGTERM) == 1);
  CHECK(sup.state() == sup_t::phase::ending);
  clock.advance(t.term_ns);
  CHECK(signals_to(sup.on_time(), -1, SIGKILL) == 1);
  for (size_t i = 0; i < 4; ++i)
    sup.on_exit(i, 137, "");
  CHECK(sup.state() == sup_t::phase::ended);
  CHECK(sup.exit_code() == 130); // interrupted, whatever the processes said

  // A second signal while the job stops: every process the polite stop; a third the hard one.
  sup_t twice{clock, job_members(1)};
  twice.on_stop_signal(SIGTERM);
  out = twice.on_stop_signal(SIGTERM);
  CHECK(signals_to(out, -1, SIGTERM) == 1);
  CHECK(said(out).find("terminated again: stopping every process") != std::string::npos);
  CHECK(signals_to(twice.on_stop_signal(SIGTERM), -1, SIGKILL) == 1);
  // The scheduler's exit after it was asked to stop the job: the scripts are not waited for.
  sup_t asked{clock, job_members(1, true)};
  asked.on_job_running();
  asked.on_stop_signal(SIGINT);
  out = asked.on_exit(0, 1, "");
  CHECK(signals_to(out, 2, SIGTERM) == 1);
  CHECK(asked.exit_code() == 130);
}
