#include "runtime/control/node_lifecycle.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace ashlar::control {

namespace {

std::string seconds(uint64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(ns) * 1e-9);
  return b;
}

}  // namespace

node_lifecycle::node_lifecycle(const clock_source& clock, std::string scheduler, node_timing timing, bool may_rejoin)
  : clock_(clock), scheduler_(std::move(scheduler)), t_(timing), may_rejoin_(may_rejoin) {
}

std::vector<node_action> node_lifecycle::give_up(const std::string& why) {
  phase_ = phase::ended;
  return {node_action{node_action::exit, "lost the scheduler at " + scheduler_ + " (" + reason_ + ")" + why, 1, 0}};
}

std::vector<node_action> node_lifecycle::on_scheduler_down(const std::string& reason) {
  if (phase_ == phase::draining && holding_) { // the job is over with its scheduler
    phase_ = phase::ended;
    return {node_action{node_action::log_info, "the scheduler has gone (" + reason + "); exiting", 0, 0},
            node_action{node_action::exit, {}, 0, 0}};
  }
  if (phase_ != phase::serving)
    return {};
  phase_ = phase::lost;
  reason_ = reason;
  until_ = clock_.steady_ns() + t_.lost_grace_ns;
  return {};
}

std::vector<node_action> node_lifecycle::on_shutdown() {
  if (phase_ == phase::ended)
    return {};
  phase_ = phase::ended;
  return {node_action{node_action::exit, {}, 0, 0}};
}

std::vector<node_action> node_lifecycle::on_signal(const std::string& signal, bool holds_shards) {
  switch (phase_) {
    case phase::serving:
      phase_ = phase::draining;
      until_ = clock_.steady_ns() + t_.drain_ns;
      holding_ = holds_shards;
      if (holds_shards)
        return {node_action{node_action::log_info,
                            signal + " received: its shards serve the running job until the scheduler ends it (at "
                              "most " + seconds(t_.drain_ns) + " s; again: exit now)",
                            0, 0}};
      return {node_action{node_action::log_info, signal + " received, stopping", 0, 0},
              node_action{node_action::drain, {}, 0, 0}};
    case phase::draining: // a second signal: leave now
      phase_ = phase::ended;
      return {node_action{node_action::exit, {}, 0, 0}};
    case phase::lost:
    case phase::probing:
    case phase::settling:
    case phase::rejoining:
      phase_ = phase::ended;
      return {node_action{node_action::log_info, signal + " received while waiting for the scheduler; exiting", 0, 0},
              node_action{node_action::exit, {}, 0, 0}};
    case phase::ended:
      return {};
  }
  return {};
}

std::vector<node_action> node_lifecycle::on_drained() {
  if (phase_ != phase::draining)
    return {};
  phase_ = phase::ended;
  return {node_action{node_action::exit, {}, 0, 0}};
}

std::vector<node_action> node_lifecycle::rejoin_now() {
  const uint64_t now = clock_.steady_ns();
  if (now >= give_up_at_)
    return give_up(": it did not come back within " + seconds(t_.rejoin_ns) + " s; exiting");
  phase_ = phase::rejoining;
  return {node_action{node_action::rejoin, {}, 0, std::min<uint64_t>(give_up_at_ - now, 2000000000ull)}};
}

std::vector<node_action> node_lifecycle::on_probe(answer a, const std::string& detail) {
  if (phase_ != phase::probing)
    return {};
  const uint64_t now = clock_.steady_ns();
  switch (a) {
    case answer::refused:
      return give_up(": " + detail);
    case answer::failed:
      last_failure_ = detail;
      if (now >= give_up_at_)
        return give_up(": it did not come back within " + seconds(t_.rejoin_ns) + " s; exiting (the last try: "
                       + last_failure_ + ")");
      until_ = now + t_.probe_gap_ns;
      return {};
    case answer::admitted:
      break;
  }
  // A scheduler that was frozen past the heartbeat timeout still holds its connection to
  // this node until its own heartbeat check drops it: join once that has happened.
  phase_ = phase::settling;
  until_ = std::min<uint64_t>(give_up_at_ + 2000000000ull, now + t_.settle_ns);
  give_up_at_ = std::max<uint64_t>(give_up_at_, until_ + 2000000000ull); // one join attempt at least
  return {node_action{node_action::log_info,
                      "the scheduler at " + scheduler_ + " answers; joining it again in " + seconds(t_.settle_ns)
                        + " s, once it has dropped its connections of before",
                      0, 0}};
}

std::vector<node_action> node_lifecycle::on_rejoin(answer a, const std::string& detail) {
  if (phase_ != phase::rejoining)
    return {};
  switch (a) {
    case answer::admitted:
      phase_ = phase::serving;
      ++rejoins_;
      return {node_action{node_action::log_info,
                          "joined the scheduler at " + scheduler_ + " again" + (detail.empty() ? "" : " as " + detail), 0,
                          0}};
    case answer::refused:
      return give_up(": " + detail);
    case answer::failed:
      last_failure_ = detail;
      return rejoin_now();
  }
  return {};
}

std::vector<node_action> node_lifecycle::on_time() {
  const uint64_t now = clock_.steady_ns();
  if (now < until_)
    return {};
  switch (phase_) {
    case phase::lost: {
      if (!may_rejoin_ || t_.rejoin_ns == 0)
        return give_up("");
      phase_ = phase::probing;
      give_up_at_ = now + t_.rejoin_ns;
      until_ = UINT64_MAX; // the probe's answer sets the next
      return {node_action{node_action::log_warn,
                          "lost the scheduler at " + scheduler_ + " (" + reason_
                            + "); stopping its shards and workers and waiting up to " + seconds(t_.rejoin_ns)
                            + " s for it to come back (--rejoin-timeout)",
                          0, 0},
              node_action{node_action::stop_hosted, {}, 0, 0}, node_action{node_action::probe, {}, 0, 0}};
    }
    case phase::probing:
      until_ = UINT64_MAX;
      return {node_action{node_action::probe, {}, 0, 0}};
    case phase::settling:
      return rejoin_now();
    case phase::draining:
      phase_ = phase::ended;
      return {node_action{node_action::log_warn,
                          (holding_ ? "the job did not end within " : "workers did not stop within ")
                            + seconds(t_.drain_ns) + " s; exiting",
                          0, 0},
              node_action{node_action::exit, {}, 0, 0}};
    case phase::serving:
    case phase::rejoining:
    case phase::ended:
      return {};
  }
  return {};
}

std::optional<uint64_t> node_lifecycle::deadline() const {
  switch (phase_) {
    case phase::lost:
    case phase::probing:
    case phase::settling:
    case phase::draining:
      return until_;
    default:
      return std::nullopt;
  }
}

}  // namespace ashlar::control
