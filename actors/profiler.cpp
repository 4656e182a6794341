#include "actors/profiler.hpp"

#include "runtime/metrics/cluster_profile.hpp"
#include "runtime/metrics/recorder.hpp"

namespace ashlar::actors {

namespace {

struct profiler_state {
  static constexpr const char* name = "ashlar.profiler";
  std::unique_ptr<cluster_profile> profile;
  std::shared_ptr<run_recorder> recorder;
};

using profiler_pointer = profiler_actor::stateful_pointer<profiler_state>;

// Routes the workers' step reports and membership to the cluster profile
// (runtime/metrics/cluster_profile.hpp) and the run's recorder; answers with its stats.
profiler_actor::behavior_type profiler_behavior(profiler_pointer self, double alpha,
                                                std::shared_ptr<run_recorder> recorder, double window) {
  self->state.profile = std::make_unique<cluster_profile>(alpha, window);
  self->state.recorder = std::move(recorder);
  return {
    [=](const wire::profile_report& r) {
      if (self->state.recorder)
        self->state.recorder->step(r);
      self->state.profile->observe(r);
    },
    [=](const wire::membership_change& m) -> caf::ok_atom {
      self->state.profile->membership(m.worker_id, m.kind != wire::membership_change::join);
      return caf::ok_atom::value;
    },
    [=](caf::get_atom) -> wire::cluster_stats { return self->state.profile->stats(); },
  };
}

}  // namespace

profiler_actor spawn_profiler(caf::actor_system& sys, double smoothing, std::shared_ptr<run_recorder> recorder,
                              double window) {
  // On a thread of its own: every worker reports every step, local steps included, so
  // the profiler must keep pace with all of them at once; sharing the scheduler's threads
  // with the workers, its mailbox grew behind them and every request to it waited.
  return sys.spawn<caf::detached>(profiler_behavior, smoothing, std::move(recorder), window);
}

}  // namespace ashlar::actors
