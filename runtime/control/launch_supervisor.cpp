#include "runtime/control/launch_supervisor.hpp"

#include <csignal>

namespace ashlar::control {

namespace {

const char* signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    default: return nullptr;
  }
}

launch_action say(std::string text) {
  return launch_action{launch_action::say, -1, 0, std::move(text)};
}

launch_action send(int member, int sig) {
  return launch_action{launch_action::signal, member, sig, {}};
}

} // namespace

std::string describe_exit(int code) {
  if (code < 128 || code > 128 + 64) // (255: what ssh exits with when it, or the remote side, failed)
    return "code " + std::to_string(code);
  const int sig = code - 128;
  const char* name = signal_name(sig);
  return std::string{"killed by "} + (name ? name : ("signal " + std::to_string(sig)).c_str());
}

launch_supervisor::launch_supervisor(const clock_source& clock, std::vector<launch_member> members,
                                     launch_timing timing, uint32_t min_workers)
  : clock_(clock), members_(std::move(members)), timing_(timing), min_workers_(min_workers),
    exited_(members_.size(), false) {}

std::vector<launch_action> launch_supervisor::on_job_running() {
  if (phase_ == phase::starting)
    phase_ = phase::running;
  return {};
}

// Asks the scheduler to stop the job after the workers' step, with its evaluation and report.
std::vector<launch_action> launch_supervisor::stop_job(std::vector<launch_action> out) {
  interrupted_ = true;
  phase_ = phase::stopping_job;
  deadline_ns_ = clock_.steady_ns() + timing_.job_stop_ns;
  out.push_back(send(0, SIGTERM));
  return out;
}

// Member `i` failed the job (`when`: "before the job started", ...): the scheduler stops it.
std::vector<launch_action> launch_supervisor::fail(size_t i, int code, const std::string& last, const char* when) {
  const auto& m = members_[i];
  failure_ = m.name + " exited with " + describe_exit(code) + (last.empty() ? std::string{} : ": " + last);
  code_ = code > 0 && code < 128 ? code : 1;
  return stop_job({say(m.name + " exited with " + describe_exit(code) + " " + when
                       + (last.empty() ? std::string{} : ": " + last) + "; stopping the job")});
}

// The scheduler exited: the job is over. The others get a polite stop (worker scripts, which
// end by themselves, only once their time is up), then a hard one.
std::vector<launch_action> launch_supervisor::job_over(int code) {
  if (!interrupted_)
    code_ = code;
  phase_ = phase::ending;
  scripts_waiting_ = false;
  std::vector<launch_action> out;
  for (size_t i = 1; i < members_.size(); ++i) {
    if (exited_[i])
      continue;
    if (members_[i].script && !interrupted_)
      scripts_waiting_ = true;
    else
      out.push_back(send(static_cast<int>(i), SIGTERM));
  }
  deadline_ns_ = clock_.steady_ns() + (scripts_waiting_ ? timing_.linger_ns : timing_.term_ns);
  return out;
}

std::vector<launch_action> launch_supervisor::on_exit(size_t i, int code, const std::string& last) {
  if (i >= members_.size() || exited_[i])
    return {};
  exited_[i] = true;
  std::vector<launch_action> out;
  const auto& m = members_[i];
  if (m.role == launch_member::worker)
    out.push_back(launch_action{launch_action::note_left, static_cast<int>(i), 0, {}});
  if (i == 0) {
    auto over = phase_ == phase::ending ? std::vector<launch_action>{} : job_over(code);
    out.insert(out.end(), over.begin(), over.end());
  } else if (phase_ == phase::starting && code != 0) {
    auto failed = fail(i, code, last, "before the job had its members");
    out.insert(out.end(), failed.begin(), failed.end());
  } else if (phase_ == phase::running && code != 0) {
    if (m.script && code < 128) {
      // The script itself failed (it raised): every worker runs it, every one would fail.
      auto failed = fail(i, code, last, "(its script failed; every worker runs the same script)");
      out.insert(out.end(), failed.begin(), failed.end());
    } else {
      ++lost_;
      // (What it said last is in its output above: a killed process's last line says nothing of why.)
      std::string next;
      if (m.role != launch_member::worker) {
        next = "the scheduler decides whether the job can go on without it";
      } else {
        uint32_t live = 0;
        for (size_t k = 1; k < members_.size(); ++k)
          live += members_[k].role == launch_member::worker && !exited_[k] ? members_[k].workers : 0;
        next = live < min_workers_ ? std::to_string(live) + " workers remain, fewer than train.min_workers = "
                                       + std::to_string(min_workers_) + ": the job fails"
               : m.script ? "the job goes on with the other " + std::to_string(live)
                              + " (their data loaders decide what each trains)"
                          : "the job goes on with the other " + std::to_string(live)
                              + " (the scheduler hands its samples to them)";
      }
      out.push_back(say(m.name + " was lost (exited with " + describe_exit(code) + "); " + next));
    }
  }
  check_all_exited();
  return out;
}

std::vector<launch_action> launch_supervisor::on_stop_signal(int sig) {
  const char* what = sig == SIGINT ? "interrupted" : "terminated";
  code_ = 130;
  if (phase_ == phase::starting || phase_ == phase::running)
    return stop_job({say(std::string{what} + ": stopping the job after the workers' current step (again: stop "
                                             "every process now)")});
  if (phase_ == phase::ended)
    return {};
  std::vector<launch_action> out{say(std::string{what} + " again: stopping every process")};
  out.push_back(send(-1, phase_ == phase::ending ? SIGKILL : SIGTERM));
  if (phase_ == phase::stopping_job) {
    phase_ = phase::ending;
    scripts_waiting_ = false;
    deadline_ns_ = clock_.steady_ns() + 2 * timing_.term_ns;
  }
  return out;
}

std::vector<launch_action> launch_supervisor::on_time() {
  const uint64_t now = clock_.steady_ns();
  if (now < deadline_ns_)
    return {};
  if (phase_ == phase::stopping_job) {
    // The scheduler did not stop the job in time.
    phase_ = phase::ending;
    deadline_ns_ = now + timing_.term_ns;
    return {say("the scheduler did not stop the job in time: stopping every process"), send(-1, SIGTERM)};
  }
  if (phase_ != phase::ending)
    return {};
  deadline_ns_ = now + timing_.term_ns;
  if (scripts_waiting_) {
    // The scripts had their time: now the polite stop, then the hard one.
    scripts_waiting_ = false;
    std::vector<launch_action> out;
    for (size_t i = 1; i < members_.size(); ++i)
      if (members_[i].script && !exited_[i])
        out.push_back(send(static_cast<int>(i), SIGTERM));
    return out;
  }
  return {send(-1, SIGKILL)};
}

std::optional<uint64_t> launch_supervisor::deadline() const {
  if (phase_ == phase::stopping_job || phase_ == phase::ending)
    return deadline_ns_;
  return std::nullopt;
}

void launch_supervisor::check_all_exited() {
  for (bool e : exited_)
    if (!e)
      return;
  phase_ = phase::ended;
}

}  // namespace ashlar::control
