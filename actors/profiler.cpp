#include "actors/profiler.hpp"

#include <map>

#include "runtime/metrics/cluster_profile.hpp"
#include "runtime/metrics/recorder.hpp"

#include <spdlog/spdlog.h>

namespace ashlar::actors {

namespace {

struct profiler_state {
  static constexpr const char* name = "ashlar.profiler";
  std::unique_ptr<cluster_profile> profile;
  std::shared_ptr<run_recorder> recorder;
  std::map<uint32_t, caf::actor_addr> senders; // each member's worker actor, as the scheduler said
};

using profiler_pointer = profiler_actor::stateful_pointer<profiler_state>;

// A refused report is logged the first time and then at every tenfold count (a member
// that floods gets a few lines, not one per report), with the sender's node.
void log_refusal(profiler_pointer self, const std::string& why) {
  const auto n = self->state.profile->refused();
  uint64_t mark = 1;
  while (mark * 10 <= n)
    mark *= 10;
  if (n != mark)
    return;
  auto sender = self->current_sender();
  spdlog::warn("profiler: refused a step report ({}; from {}); {} refused so far", why,
               sender ? to_string(sender->node()) : std::string{"an unknown sender"}, n);
}

// Routes the workers' step reports and membership to the cluster profile
// (runtime/metrics/cluster_profile.hpp) and the run's recorder; answers with its stats.
// Membership comes from the scheduler, in this process: from elsewhere it is refused.
profiler_actor::behavior_type profiler_behavior(profiler_pointer self, double alpha,
                                                std::shared_ptr<run_recorder> recorder, double window,
                                                uint64_t step_samples_max) {
  self->state.profile = std::make_unique<cluster_profile>(alpha, window);
  self->state.profile->bound_step_samples(step_samples_max);
  self->state.recorder = std::move(recorder);
  return {
    [=](const wire::profile_report& r) {
      auto& st = self->state;
      auto from = st.senders.find(r.worker_id);
      if (from != st.senders.end() && from->second != caf::actor_cast<caf::actor_addr>(self->current_sender())) {
        st.profile->count_refused();
        return log_refusal(self, "worker " + std::to_string(r.worker_id) + "'s report came from another actor");
      }
      if (auto why = st.profile->observe(r))
        return log_refusal(self, *why);
      if (self->state.recorder)
        self->state.recorder->step(r);
    },
    [=](const wire::membership_change& m, const caf::actor_addr& worker) -> caf::result<caf::ok_atom> {
      auto sender = self->current_sender();
      if (!sender || sender->node() != self->node())
        return make_error(errc::invalid_state, "the profiler takes membership changes from its scheduler only");
      const bool join = m.kind == wire::membership_change::join;
      self->state.profile->membership(m.worker_id, !join);
      if (join && worker)
        self->state.senders[m.worker_id] = worker;
      else if (!join)
        self->state.senders.erase(m.worker_id);
      return caf::ok_atom::value;
    },
    [=](caf::get_atom) -> wire::cluster_stats { return self->state.profile->stats(); },
  };
}

}  // namespace

profiler_actor spawn_profiler(caf::actor_system& sys, double smoothing, std::shared_ptr<run_recorder> recorder,
                              double window, uint64_t step_samples_max) {
  // On a thread of its own: every worker reports every step, local steps included, so
  // the profiler must keep pace with all of them at once; sharing the scheduler's threads
  // with the workers, its mailbox grew behind them and every request to it waited.
  return sys.spawn<caf::detached>(profiler_behavior, smoothing, std::move(recorder), window, step_samples_max);
}

}  // namespace ashlar::actors
