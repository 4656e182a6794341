#include "actors/interfaces.hpp"

namespace ashlar::actors {

namespace {

// Messages an actor takes per turn on a scheduler thread (see set_fair_scheduling).
constexpr size_t fair_throughput = 4;

}  // namespace

void set_fair_scheduling(caf::actor_system_config& cfg) {
  cfg.set("scheduler.max-throughput", size_t{fair_throughput});
}

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<wire::register_worker>("ashlar.register_worker");
  cfg.add_message_type<wire::assignment>("ashlar.assignment");
  cfg.add_message_type<wire::membership_change>("ashlar.membership_change");
  cfg.add_message_type<wire::pull_request>("ashlar.pull_request");
  cfg.add_message_type<wire::pull_reply>("ashlar.pull_reply");
  cfg.add_message_type<wire::push>("ashlar.push");
  cfg.add_message_type<wire::push_ack>("ashlar.push_ack");
  cfg.add_message_type<wire::ring_message>("ashlar.ring_message");
  cfg.add_message_type<wire::shard_status>("ashlar.shard_status");
  cfg.add_message_type<wire::profile_report>("ashlar.profile_report");
  cfg.add_message_type<wire::cluster_stats>("ashlar.cluster_stats");
  cfg.add_message_type<wire::hello>("ashlar.hello");
  cfg.add_message_type<wire::welcome>("ashlar.welcome");
  cfg.add_message_type<wire::spawn_shard>("ashlar.spawn_shard");
  cfg.add_message_type<wire::spawn_worker>("ashlar.spawn_worker");
  cfg.add_message_type<wire::job_request>("ashlar.job_request");
  cfg.add_message_type<wire::job_result>("ashlar.job_result");
  cfg.add_message_type<wire::ctl_request>("ashlar.ctl_request");
  cfg.add_message_type<wire::cluster_status>("ashlar.cluster_status");
  cfg.add_message_type<shard_actor>("ashlar.shard_actor");
  cfg.add_message_type<worker_actor>("ashlar.worker_actor");
  cfg.add_message_type<scheduler_actor>("ashlar.scheduler_actor");
  cfg.add_message_type<profiler_actor>("ashlar.profiler_actor");
  cfg.add_message_type<node_actor>("ashlar.node_actor");
  cfg.add_message_type<cluster_actor>("ashlar.cluster_actor");
  cfg.add_message_type<std::vector<node_actor>>("ashlar.node_actors");
  cfg.add_message_type<std::vector<shard_actor>>("ashlar.shard_actors");
  cfg.add_message_type<std::vector<uint64_t>>("ashlar.u64s");
  cfg.add_message_type<std::vector<float>>("ashlar.floats");
  cfg.add_error_category(error_category_atom::value,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           return describe(caf::error{code, error_category_atom::value, ctx});
                         });
}

}  // namespace ashlar::actors
