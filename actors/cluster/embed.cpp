#include "actors/cluster/embed.hpp"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "actors/cluster/node.hpp"
#include "runtime/net/socket.hpp"

namespace ashlar::actors {

namespace {

// Says hello for `node`; on a refusal the caller decides what becomes of the node.
expected<membership> introduce(caf::actor_system& sys, const cluster_actor& cluster, const join_options& opts,
                               const node_actor& node) {
  wire::hello h;
  h.protocol = opts.protocol;
  h.roles = opts.roles;
  h.replace_shard = opts.replace_shard;
  h.node = opts.name;
  h.slots = has_role(opts.roles, wire::role::worker) ? opts.slots : 0;
  caf::scoped_actor self{sys};
  membership m;
  caf::error refused;
  // 10 s: a node whose welcome is this late gives up (and says why) rather than stay half
  // joined; the scheduler loses it when it exits. (Waiting longer kept nodes that were
  // killed meanwhile counted live, their connections never reported closed.)
  const std::chrono::milliseconds wait = std::chrono::seconds(10);
  self->request(cluster, wait, h, node)
    .receive([&](const wire::welcome& w) { m.node_id = w.node_id; },
             [&](caf::error& err) { refused = std::move(err); });
  if (!refused) // the scheduler counts the node's slots once it knows the welcome arrived
    self->send(cluster, welcomed_atom::value, m.node_id);
  if (refused == caf::sec::request_timeout)
    return make_error(errc::peer_unreachable, "the scheduler did not answer this node's hello within "
                                                + std::to_string(wait.count() / 1000) + " s");
  if (refused)
    return refused;
  m.cluster = cluster;
  m.node = node;
  return m;
}

expected<caf::strong_actor_ptr> reach(caf::actor_system& sys, const endpoint& where, join_options& opts) {
  auto ptr = connect(sys, where, opts.timeout);
  if (ptr && opts.data_host.empty())
    opts.data_host = net::local_address_toward(where.host, where.port);
  return ptr;
}

caf::error refused_by(const endpoint& where, const caf::error& err) {
  if (is(err, errc::peer_unreachable)) // no answer is no refusal: a later try may get in
    return make_error(errc::peer_unreachable, "the scheduler at " + where.to_string() + ": " + describe(err));
  return make_error(errc::handshake_refused,
                    "the scheduler at " + where.to_string() + " refused this node: " + describe(err));
}

}  // namespace

expected<membership> join_cluster(caf::actor_system& sys, const cluster_actor& cluster,
                                  const join_options& opts) {
  node_config nc;
  nc.name = opts.name;
  nc.roles = opts.roles;
  nc.slots = has_role(opts.roles, wire::role::worker) ? opts.slots : 0;
  nc.data_dir = opts.data_dir;
  nc.owner = opts.owner;
  nc.plane = opts.plane;
  nc.checkpoint_dir = opts.checkpoint_dir;
  nc.work_dir = opts.work_dir;
  nc.gpus = opts.gpus;
  nc.make_backend = opts.make_backend;
  nc.shards_hosted = opts.shards_hosted;
  if (!opts.data_host.empty())
    nc.data_host = opts.data_host;
  auto node = spawn_node(sys, nc);
  auto m = introduce(sys, cluster, opts, node);
  if (!m)
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  return m;
}

expected<membership> join_cluster(caf::actor_system& sys, const endpoint& where,
                                  const join_options& opts) {
  auto with_host = opts;
  auto ptr = reach(sys, where, with_host);
  if (!ptr)
    return ptr.error();
  auto m = join_cluster(sys, caf::actor_cast<cluster_actor>(*ptr), with_host);
  if (!m)
    return refused_by(where, m.error());
  return m;
}

expected<membership> rejoin_cluster(caf::actor_system& sys, const endpoint& where, const join_options& opts,
                                    const node_actor& node) {
  auto with_host = opts;
  auto ptr = reach(sys, where, with_host);
  if (!ptr)
    return ptr.error();
  auto m = introduce(sys, caf::actor_cast<cluster_actor>(*ptr), with_host, node);
  if (!m)
    return refused_by(where, m.error());
  return m;
}

}  // namespace ashlar::actors
