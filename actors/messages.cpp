#include "actors/messages.hpp"

namespace ashlar::actors {

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<wire::register_worker>("ashlar.register_worker");
  cfg.add_message_type<wire::assignment>("ashlar.assignment");
  cfg.add_message_type<wire::membership_change>("ashlar.membership_change");
  cfg.add_message_type<wire::pull_request>("ashlar.pull_request");
  cfg.add_message_type<wire::pull_reply>("ashlar.pull_reply");
  cfg.add_message_type<wire::push>("ashlar.push");
  cfg.add_message_type<wire::push_ack>("ashlar.push_ack");
  cfg.add_message_type<wire::shard_status>("ashlar.shard_status");
  cfg.add_message_type<wire::profile_report>("ashlar.profile_report");
  cfg.add_message_type<wire::cluster_stats>("ashlar.cluster_stats");
  cfg.add_message_type<shard_actor>("ashlar.shard_actor");
  cfg.add_message_type<std::vector<shard_actor>>("ashlar.shard_actors");
  cfg.add_error_category(error_category_atom::value,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           return describe(caf::error{code, error_category_atom::value, ctx});
                         });
}

}  // namespace ashlar::actors
