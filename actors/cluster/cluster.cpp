#include "actors/actor_clock.hpp"
#include "actors/cluster/cluster.hpp"

#include <algorithm>

#include "runtime/core/natural_order.hpp"

#include <map>
#include <memory>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>

#include "actors/cluster/data_plane.hpp"
#include "actors/cluster/network.hpp"
#include "actors/cluster/node.hpp"
#include "runtime/control/cluster_membership.hpp"
#include "runtime/control/job_lifecycle.hpp"
#include "runtime/control/node_watch.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/net/gate.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/policy/ring.hpp"
#include "runtime/store/serve_again.hpp"

namespace ashlar::actors {

namespace {

using namespace std::chrono_literals;

struct node_entry {
  wire::node_info info;
  node_actor handle;
  // (Whether it confirmed its welcome, and so serves, is the membership's: a welcome can
  // miss its node, and one killed before it arrived would otherwise count live, holding its
  // workers in every round, while its loss is never reported.)
  int64_t replace_shard = -1; // the shard its hello asked to serve again, once confirmed
};

struct cluster_state {
  static constexpr const char* name = "ashlar.cluster";
  cluster_config cfg;
  // The actor system's clock, the one its timers run on: its machines read it.
  actor_clock_source clock;
  // ashlar ctl shutdown while a job runs: the job stops first (its workers finish their
  // step, it reports that it was stopped), then the nodes; by this time at the latest.
  std::optional<wire::ctl_request> shutdown_after_job;
  uint64_t shutdown_by_ns = 0;
  std::map<uint32_t, node_entry> nodes;
  uint32_t next_node = 1;
  bool job_running = false;
  running_job job;
  std::string job_text;
  std::string waiting_for; // what a submitted job still lacks, as its wait last said
  caf::typed_response_promise<wire::job_result> job_promise;
  bool have_promise = false;
  std::set<uint32_t> lost_shards;     // the running job's shards (ids) whose actor went down
  std::set<uint32_t> rehosting;       // of those, the ones a node is restoring now
  bool retry_due = false;             // a retry of rehost_lost is on its way (a store was busy)
  // The nodes' slots (bounded per node) and the running job's workers on each.
  control::cluster_membership members;
  // The job about to run, from its wait for nodes to its start, and the runner's request
  // that waits with it.
  std::optional<control::job_lifecycle> life;
  caf::typed_response_promise<caf::ok_atom> wait_promise;
  bool waiting = false;
  // The scheduler's own liveness pings of the live nodes (a backstop for a loss the
  // transport never reports), and whether the ping loop runs.
  control::node_watch watch{clock};
  bool pinging = false;
};

using cluster_pointer = cluster_actor::stateful_pointer<cluster_state>;

// Starts one worker of the running job on `node` (a node that joined late).
// Its slot counts as taken from the request on, so that nodes joining meanwhile are not
// given the same missing workers.
void add_worker_on(cluster_pointer self, uint32_t node_id) {
  auto& st = self->state;
  auto i = st.nodes.find(node_id);
  if (!st.job_running || i == st.nodes.end())
    return;
  auto req = st.job.worker_template;
  req.requested_id = wire::any_worker;
  st.members.placed(node_id, 1);
  self->request(i->second.handle, 60s, req, st.job.scheduler, st.job.profiler)
    .then([=](const worker_actor&) { spdlog::info("cluster: started a worker on node {}", node_id); },
          [=](caf::error& err) {
            self->state.members.ended(node_id, 1);
            spdlog::warn("cluster: node {} could not start a worker: {}", node_id, describe(err));
          });
}

// Starts on node `node_id` the workers the running job may still take there (its free
// slots, up to train.max_workers: control::cluster_membership::to_start_on).
void start_workers_on(cluster_pointer self, uint32_t node_id) {
  const uint32_t k = self->state.job_running ? self->state.members.to_start_on(node_id) : 0;
  if (k > 0)
    spdlog::info("cluster: node {} starts {} worker(s) for the job", node_id, k);
  for (uint32_t j = 0; j < k; ++j)
    add_worker_on(self, node_id);
}

// Carries out what the job's lifecycle decided.
void act(cluster_pointer self, const std::vector<control::job_action>& actions) {
  auto& st = self->state;
  for (const auto& a : actions) {
    switch (a.kind) {
      case control::job_action::start:
        st.waiting_for.clear();
        if (st.waiting) {
          st.waiting = false;
          st.wait_promise.deliver(caf::ok_atom::value);
        }
        break;
      case control::job_action::waiting:
        st.waiting_for = a.text;
        spdlog::info("cluster: waiting for the job's nodes: it {}", a.text);
        break;
      case control::job_action::stop_workers:
        spdlog::info("cluster: stopping the job ({}): its workers finish their step, then it reports", a.text);
        if (st.job_running && st.job.driver)
          caf::anon_send(st.job.driver, stop_atom::value, a.text);
        else if (st.job_running)
          caf::anon_send(st.job.scheduler, wire::ctl_request{wire::ctl_request::shutdown, 0, 0});
        break;
      case control::job_action::ended: {
        const auto& out = st.life->outcome();
        if (out.kind == control::job_outcome::trained)
          spdlog::info("cluster: the job ended: {}", a.text);
        else
          spdlog::error("cluster: the job ended: {}", a.text);
        st.waiting_for.clear();
        if (st.waiting) {
          st.waiting = false;
          st.wait_promise.deliver(make_error(
            out.kind == control::job_outcome::stopped ? errc::cancelled : errc::peer_unreachable, a.text));
        }
        st.life.reset();
        break;
      }
    }
  }
}

// The cluster's capacity changed: the waiting job may start.
void capacity_changed(cluster_pointer self) {
  auto& st = self->state;
  if (st.life)
    act(self, st.life->on_capacity(st.members.free()));
}

// The running job's index of shard `shard_id` (its templates' order), or the number of
// its shards if it has none of that id.
size_t shard_index(const cluster_state& st, uint32_t shard_id) {
  for (size_t i = 0; i < st.job.shard_templates.size(); ++i)
    if (st.job.shard_templates[i].range.shard_id == shard_id)
      return i;
  return st.job.shard_templates.size();
}

// Tells the job's driver why lost shard `shard_id` is not served yet: the error the job
// ends with, if it never is, says so.
void tell_why_not_served(cluster_pointer self, uint32_t shard_id, std::string why) {
  auto& st = self->state;
  const size_t index = shard_index(st, shard_id);
  if (st.job.driver && index < st.job.shard_templates.size())
    caf::anon_send(st.job.driver, shard_atom::value, static_cast<uint32_t>(index), std::move(why));
}

// How long the cluster waits for a node to serve a lost shard again before it asks again.
constexpr caf::timespan serve_timeout = 60s;

// Whether request `req` is the running job's (its job id): an answer to an earlier job's is stale.
bool for_running_job(const cluster_state& st, const wire::spawn_shard& req) {
  const size_t index = shard_index(st, req.range.shard_id);
  return st.job_running && index < st.job.shard_templates.size() && st.job.shard_templates[index].job == req.job;
}

// Whether `shard` is what the running job uses as its shard `shard_id`.
bool used_by_job(const cluster_state& st, uint32_t shard_id, const shard_actor& shard) {
  const size_t index = shard_index(st, shard_id);
  return st.job_running && index < st.job.shards.size() && st.job.shards[index].address() == shard.address();
}

// Once more asks node `node_id`, which had not answered request `req` of a job that has
// ended since, and stops the shard it answers with: else a restore that outlasted the job
// would leave the node serving a shard nobody stops, holding its store.
void stop_late_shard(cluster_pointer self, uint32_t node_id, const wire::spawn_shard& req) {
  auto n = self->state.nodes.find(node_id);
  if (n == self->state.nodes.end() || !n->second.info.alive)
    return;
  const uint32_t shard_id = req.range.shard_id;
  self->request(n->second.handle, 10 * serve_timeout, req)
    .then(
      [=](const shard_actor& shard, const std::string&) {
        if (used_by_job(self->state, shard_id, shard)) // (the running job's, from the same store)
          return;
        spdlog::info("cluster: node {} served shard {} of a job that has ended; stopping it", node_id, shard_id);
        self->send_exit(shard, caf::exit_reason::user_shutdown);
      },
      [=](caf::error& err) {
        spdlog::info("cluster: node {} did not serve shard {} of a job that has ended: {}", node_id, shard_id,
                     describe(err));
      });
}

void rehost_shard(cluster_pointer self, uint32_t node_id, uint32_t shard_id);

// Node `node_id` serves shard `shard_id` (the job's shard `index`) again: the job driver
// takes it up, unless the job ended or another started meanwhile.
void on_shard_served(cluster_pointer self, uint32_t node_id, uint32_t shard_id, size_t index,
                     const wire::spawn_shard& req, const shard_actor& shard, const std::string& endpoint) {
  auto& st = self->state;
  if (!for_running_job(st, req) || st.lost_shards.count(shard_id) == 0) {
    // The job ended, or another started, while the node restored it: nobody wants it
    // (unless it is what the running job uses already).
    if (!used_by_job(st, shard_id, shard)) {
      spdlog::info("cluster: node {} serves shard {} again, but its job no longer waits for it; stopping it",
                   node_id, shard_id);
      self->send_exit(shard, caf::exit_reason::user_shutdown);
    }
    return;
  }
  st.lost_shards.erase(shard_id);
  st.rehosting.erase(shard_id);
  self->monitor(shard);
  if (index < st.job.shards.size())
    st.job.shards[index] = shard;
  if (st.job.driver)
    caf::anon_send(st.job.driver, shard_atom::value, static_cast<uint32_t>(index), shard, endpoint);
}

// Node `node_id` could not serve shard `shard_id` again: ask it again, another node, or
// nobody (runtime/store/serve_again.hpp decides).
void on_serve_failed(cluster_pointer self, uint32_t node_id, uint32_t shard_id, const wire::spawn_shard& req,
                     caf::error& err) {
  auto& st = self->state;
  if (!for_running_job(st, req)) {
    if (err == caf::sec::request_timeout)
      stop_late_shard(self, node_id, req);
    return;
  }
  st.rehosting.erase(shard_id);
  auto n = st.nodes.find(node_id);
  const bool alive = n != st.nodes.end() && n->second.info.alive;
  tell_why_not_served(self, shard_id,
                      "node " + std::to_string(node_id)
                        + (n == st.nodes.end() ? std::string{} : " (" + n->second.info.name + ")")
                        + " could not serve it: " + describe(err));
  const auto failure = is(err, errc::busy)                 ? serve_failure::busy
                       : err == caf::sec::request_timeout ? serve_failure::timed_out
                                                           : serve_failure::refused;
  const auto retry = after_failed_serve(failure, alive);
  switch (retry.target) {
    case serve_retry::same_node:
      spdlog::warn("cluster: node {} has not answered for shard {} in {} s (restoring a large store?); "
                   "asking it again",
                   node_id, shard_id, std::chrono::duration_cast<std::chrono::seconds>(serve_timeout).count());
      rehost_shard(self, node_id, shard_id);
      return;
    case serve_retry::any_node:
      if (alive) // its store is still held (by the lost node, frozen, or about to let go)
        spdlog::info("cluster: node {} cannot serve shard {} yet ({}); asking again in {} ms", node_id,
                     shard_id, describe(err), retry.after.count());
      else
        spdlog::error("cluster: node {} could not serve shard {} again: {}; asking the next server node",
                      node_id, shard_id, describe(err));
      if (!st.retry_due) {
        st.retry_due = true;
        self->delayed_send(self, retry.after, shard_atom::value);
      }
      return;
    case serve_retry::nobody:
      spdlog::error("cluster: node {} could not serve shard {} again: {}", node_id, shard_id, describe(err));
      return;
  }
}

// Hosts shard `shard_id` of the running job on `node_id` again (its node was lost): the
// node restores it from its checkpoints and the job driver takes it from there.
void rehost_shard(cluster_pointer self, uint32_t node_id, uint32_t shard_id) {
  auto& st = self->state;
  auto n = st.nodes.find(node_id);
  const size_t index = shard_index(st, shard_id);
  if (!st.job_running || n == st.nodes.end() || index == st.job.shard_templates.size()) {
    spdlog::warn("cluster: node {} offers to serve shard {}, but no running job has that shard", node_id, shard_id);
    return;
  }
  if (st.lost_shards.count(shard_id) == 0 || st.rehosting.count(shard_id) > 0) {
    spdlog::info("cluster: node {} offers to serve shard {}, which is {}; nothing to do", node_id, shard_id,
                 st.lost_shards.count(shard_id) == 0 ? "served" : "being served again by another node");
    return;
  }
  if (st.job.shard_templates[index].checkpoint_dir.empty()) {
    spdlog::warn("cluster: node {} offers to serve shard {}, but the job keeps no checkpoints to restore it from",
                 node_id, shard_id);
    return;
  }
  st.rehosting.insert(shard_id);
  auto req = st.job.shard_templates[index];
  req.resume = true;
  spdlog::info("cluster: node {} serves shard {} again, from its checkpoints", node_id, shard_id);
  tell_why_not_served(self, shard_id,
                      "node " + std::to_string(node_id) + " (" + n->second.info.name
                        + ") was asked to serve it from its checkpoints and had not answered");
  self->request(n->second.handle, serve_timeout, req)
    .then([=](const shard_actor& shard, const std::string& endpoint) {
            on_shard_served(self, node_id, shard_id, index, req, shard, endpoint);
          },
          [=](caf::error& err) { on_serve_failed(self, node_id, shard_id, req, err); });
}

// Every lost shard of the running job that no node restores yet goes to the server node
// that joined last (a node that rejoined after losing the scheduler, a fresh one, or one
// that hosts shards already: a node hosts several).
void rehost_lost(cluster_pointer self) {
  auto& st = self->state;
  if (!st.job_running || st.lost_shards.empty())
    return;
  uint32_t target = 0;
  for (const auto& [id, n] : st.nodes)
    if (n.info.alive && st.members.serving(id) && has_role(n.info.roles, wire::role::server))
      target = id;
  if (target == 0) { // the next server node to join takes them
    for (auto s : st.lost_shards)
      tell_why_not_served(self, s, "no server node of the cluster is up to serve it");
    return;
  }
  std::vector<uint32_t> todo;
  for (auto s : st.lost_shards)
    if (st.rehosting.count(s) == 0)
      todo.push_back(s);
  for (auto s : todo)
    rehost_shard(self, target, s);
}

// An add-worker request in progress: the worker nodes still to ask, and how many
// workers have started.
struct placement {
  uint32_t want = 1;
  uint32_t started = 0;
  size_t next = 0;
  std::vector<uint32_t> nodes;
  std::vector<std::string> refusals;
  std::map<std::string, uint32_t> placed_on; // node name -> workers started there
  caf::response_promise promise;
};

// Asks the next worker node for a worker, until `want` have started or no node is left;
// answers with what started, or fails naming why each node refused.
void place_next(cluster_pointer self, std::shared_ptr<placement> plan) {
  auto& st = self->state;
  if (plan->started == plan->want || plan->next >= plan->nodes.size() || !st.job_running) {
    if (plan->started > 0) {
      std::string where;
      for (const auto& [name, k] : plan->placed_on)
        where += (where.empty() ? "" : ", ") + name + (k > 1 ? " (" + std::to_string(k) + ")" : "");
      plan->promise.deliver("started " + std::to_string(plan->started) + " of " + std::to_string(plan->want)
                            + " worker(s), on " + where + "; each registers with the scheduler under the next "
                            "free id (`ashlar status` lists them)");
      return;
    }
    std::string why;
    for (const auto& r : plan->refusals)
      why += (why.empty() ? " (" : "; ") + r;
    plan->promise.deliver(make_error(errc::invalid_state, "no node has a free worker slot" + (why.empty() ? "" : why + ")")
                                                            + ": start one with `ashlar node --role worker --join "
                                                            + st.cfg.address + "`"));
    return;
  }
  const uint32_t node_id = plan->nodes[plan->next];
  auto n = st.nodes.find(node_id);
  if (n == st.nodes.end() || !n->second.info.alive) {
    ++plan->next;
    return place_next(self, plan);
  }
  auto req = st.job.worker_template;
  req.requested_id = wire::any_worker;
  self->request(n->second.handle, 60s, req, st.job.scheduler, st.job.profiler)
    .then(
      [=](const worker_actor&) {
        spdlog::info("cluster: started a worker on node {}", node_id);
        self->state.members.placed(node_id, 1);
        ++plan->started;
        auto at = self->state.nodes.find(node_id);
        ++plan->placed_on[at != self->state.nodes.end() ? at->second.info.name : "node " + std::to_string(node_id)];
        place_next(self, plan);
      },
      [=](caf::error& err) {
        plan->refusals.push_back(describe(err));
        ++plan->next;
        place_next(self, plan);
      });
}

void lose_node(cluster_pointer self, uint32_t id, const std::string& why);

// The peer process the message being handled came from ("" for this process, whose nodes
// may be many: a local job's).
std::string connection_of(cluster_pointer self) {
  auto sender = self->current_sender();
  if (!sender || sender->node() == self->node())
    return {};
  return to_string(sender->node());
}

// Lost nodes kept for `ashlar status` (the most recent): beyond, the oldest are forgotten,
// so that joins and losses without end hold a bounded table.
constexpr size_t kept_lost_nodes = 64;

void forget_old_nodes(cluster_state& st) {
  size_t lost = 0;
  for (const auto& [id, n] : st.nodes)
    lost += n.info.alive ? 0 : 1;
  for (auto i = st.nodes.begin(); i != st.nodes.end() && lost > kept_lost_nodes;)
    if (!i->second.info.alive) {
      i = st.nodes.erase(i);
      --lost;
    } else {
      ++i;
    }
}

// A node says hello: admitted if it speaks this protocol and its slots are within the
// cluster's bound; it serves once it confirms the welcome (on_welcomed).
caf::result<wire::welcome> on_hello(cluster_pointer self, const wire::hello& h, const node_actor& node) {
  auto& st = self->state;
  if (h.protocol != wire::protocol_version) {
    spdlog::warn("cluster: refused node {}: protocol version expected {}, actual {}", h.node,
                 wire::protocol_version, h.protocol);
    return make_error(errc::handshake_refused,
                      "protocol version mismatch: scheduler " + st.cfg.address + " expects "
                        + std::to_string(wire::protocol_version) + ", this node speaks "
                        + std::to_string(h.protocol));
  }
  // The same node saying hello again gets its welcome again; another node over the same
  // connection replaces the one there (runtime/control/cluster_membership.hpp).
  for (const auto& [other, n] : st.nodes)
    if (n.info.alive && n.handle == node)
      return wire::welcome{other, st.cfg.address};
  const uint32_t id = st.next_node;
  const auto admitted = st.members.on_join(id, has_role(h.roles, wire::role::server),
                                           has_role(h.roles, wire::role::worker) ? h.slots : 0,
                                           connection_of(self));
  if (!admitted.admitted) {
    spdlog::warn("cluster: refused node {}: {}", h.node, admitted.note);
    return make_error(errc::busy, "scheduler " + st.cfg.address + " refused node " + h.node + ": " + admitted.note);
  }
  ++st.next_node;
  if (admitted.replaces)
    lose_node(self, *admitted.replaces, "node " + h.node + " said hello over its connection (one connection is one node)");
  node_entry e;
  e.info.node_id = id;
  e.info.name = h.node;
  e.info.roles = h.roles;
  e.info.slots = admitted.slots;
  e.handle = node;
  e.replace_shard = h.replace_shard;
  st.nodes[id] = e;
  self->monitor(node);
  st.watch.watch(id);
  if (!st.pinging) {
    st.pinging = true;
    self->delayed_send(self, std::chrono::nanoseconds{st.watch.timing().interval_ns}, ping_atom::value);
  }
  spdlog::info("cluster: node {} ({}) joined with roles {}, {} worker slots{}", id, h.node, to_string(h.roles),
               e.info.slots, admitted.note.empty() ? std::string{} : " (" + admitted.note + ")");
  // It serves once it confirms its welcome (on_welcomed).
  self->delayed_send(self, std::chrono::nanoseconds{st.members.limits().confirm_within_ns}, wait_atom::value, id);
  return wire::welcome{id, st.cfg.address};
}

// Node `id` confirmed its welcome: a node joining the running job starts workers in its
// free slots, up to the job's bound (train.max_workers); a server node serves the shard it
// asked for, or the job's lost ones, from their checkpoints.
void on_welcomed(cluster_pointer self, uint32_t id) {
  auto& st = self->state;
  auto i = st.nodes.find(id);
  if (i == st.nodes.end() || !i->second.info.alive || !st.members.on_confirmed(id))
    return;
  start_workers_on(self, id);
  capacity_changed(self);
  if (i->second.replace_shard >= 0)
    rehost_shard(self, id, static_cast<uint32_t>(i->second.replace_shard));
  else if (has_role(i->second.info.roles, wire::role::server))
    rehost_lost(self);
}

// Node `id`'s time to confirm its welcome is over: one that did not is lost.
void on_confirm_due(cluster_pointer self, uint32_t id) {
  auto& st = self->state;
  auto i = st.nodes.find(id);
  if (i != st.nodes.end() && i->second.info.alive && st.members.confirm_due(id))
    lose_node(self, id, "it did not confirm its welcome within "
                          + std::to_string(st.members.limits().confirm_within_ns / 1000000000ull)
                          + " s (it never got it, or died first)");
}

// The cluster's nodes, and while a job runs, its statistics and each shard's status.
caf::result<wire::cluster_status> cluster_status(cluster_pointer self) {
  auto& st = self->state;
  auto out = std::make_shared<wire::cluster_status>();
  for (const auto& [id, n] : st.nodes)
    out->nodes.push_back(n.info);
  // A submitted job waits for its nodes before it trains.
  out->stage = st.job_running    ? "training"
               : st.have_promise ? "job submitted, waiting for its nodes"
                                     + (st.waiting_for.empty() ? std::string{} : ": " + st.waiting_for)
                                 : "idle";
  out->job = st.job_text;
  out->job_samples = st.job.job_samples;
  out->train_samples = st.job.train_samples;
  if (!st.job_running)
    return *out;
  auto promise = self->make_response_promise<wire::cluster_status>();
  auto pending = std::make_shared<size_t>(st.job.shards.size() + 1);
  auto one = [=]() mutable {
    if (--*pending == 0)
      promise.deliver(*out);
  };
  self->request(st.job.profiler, 5s, caf::get_atom::value)
    .then([=](const wire::cluster_stats& s) mutable { out->stats = s; one(); },
          [=](caf::error&) mutable { one(); });
  for (auto& shard : st.job.shards)
    self->request(shard, 5s, status_atom::value)
      .then([=](const wire::shard_status& s) mutable { out->shards.push_back(s); one(); },
            [=](caf::error&) mutable { one(); });
  return promise;
}

void shut_down_nodes(cluster_pointer self, const wire::ctl_request& req);

caf::result<std::string> on_ctl(cluster_pointer self, const wire::ctl_request& req) {
  auto& st = self->state;
  switch (req.op) {
    case wire::ctl_request::remove_worker: {
      if (!st.job_running)
        return make_error(errc::invalid_state, "no job is running");
      auto promise = self->make_response_promise<std::string>();
      self->request(st.job.scheduler, 10s, req)
        .then([=](const std::string& s) mutable { promise.deliver(s); },
              [=](caf::error& e) mutable { promise.deliver(e); });
      return promise;
    }
    case wire::ctl_request::add_worker: {
      if (!st.job_running)
        return make_error(errc::invalid_state, "no job is running");
      // Each worker node is asked in turn: the node knows its free slots (workers that
      // ended have freed theirs), and one that has none refuses.
      auto plan = std::make_shared<placement>();
      plan->want = std::max<uint32_t>(1, req.count);
      for (const auto& [id, n] : st.nodes)
        if (n.info.alive && st.members.serving(id) && n.info.slots > 0)
          plan->nodes.push_back(id);
      plan->promise = self->make_response_promise<std::string>();
      place_next(self, plan);
      return plan->promise;
    }
    case wire::ctl_request::shutdown: {
      if (st.life) // a job waiting for its nodes ends now, saying so
        act(self, st.life->on_stop("the cluster was shut down by ashlar ctl shutdown"));
      uint32_t k = 0;
      for (auto& [id, n] : st.nodes)
        k += n.info.alive ? 1 : 0;
      if (st.job_running && st.job.driver) {
        // The job first: its nodes' shards and workers stay until it has stopped and reported.
        st.shutdown_after_job = req;
        st.shutdown_by_ns = st.clock.steady_ns() + 60ull * 1000000000ull;
        caf::anon_send(st.job.driver, stop_atom::value, std::string{"the cluster was shut down by ashlar ctl shutdown"});
        self->delayed_send(self, std::chrono::seconds(61), tick_atom::value);
        spdlog::info("cluster: shutting down on request: the running job stops first, then {} nodes", k);
        return "shutting down the cluster: the running job (its workers finish their step), then " + std::to_string(k)
               + " nodes";
      }
      shut_down_nodes(self, req);
      spdlog::info("cluster: shutting down on request: {} nodes", k);
      return "shutting down the cluster: " + std::to_string(k) + " nodes";
    }
    case wire::ctl_request::stop_job: {
      if (st.life) {
        act(self, st.life->on_stop("stopped by ashlar ctl stop-job"));
        return std::string{"the job waiting for its nodes was stopped"};
      }
      if (!st.job_running)
        return make_error(errc::invalid_state, "no job is running or waiting on this cluster");
      if (st.job.driver)
        caf::anon_send(st.job.driver, stop_atom::value, std::string{"stopped by ashlar ctl stop-job"});
      else
        caf::anon_send(st.job.scheduler, wire::ctl_request{wire::ctl_request::shutdown, 0, 0});
      spdlog::info("cluster: stopping the running job on request");
      return std::string{"stopping the job: its workers finish their step, then it reports"};
    }
  }
  return make_error(errc::invalid_argument, "unknown control request");
}

// Node `id` is lost (`why`): its workers all at once; nodes that joined before the loss
// was seen take up the workers the job now lacks.
void lose_node(cluster_pointer self, uint32_t id, const std::string& why) {
  auto& st = self->state;
  auto i = st.nodes.find(id);
  if (i == st.nodes.end() || !i->second.info.alive)
    return;
  auto& n = i->second;
  n.info.alive = false;
  self->demonitor(n.handle.address());
  st.watch.forget(id);
  const uint32_t workers = st.members.on_lost(id);
  // (a node that shut down with the cluster, or on its own between jobs, is no warning)
  spdlog::log(workers > 0 || st.job_running || why != "it shut down" ? spdlog::level::warn : spdlog::level::info,
              "cluster: node {} ({}) {}: {}{}", id, n.info.name, why == "it shut down" ? "left" : "lost", why,
              workers > 0 ? ", with " + std::to_string(workers) + " of the job's workers" : std::string{});
  // The job's scheduler loses the node's workers with it: their own losses are not always
  // reported (a node killed while its connections were still being set up).
  if (st.job_running && workers > 0 && st.job.scheduler)
    self->send(st.job.scheduler, nodes_atom::value, n.info.name);
  if (st.job_running)
    for (const auto& [other, m] : st.nodes)
      if (m.info.alive)
        start_workers_on(self, other);
  capacity_changed(self);
  forget_old_nodes(st);
}

// A monitored actor went down: a shard of the running job (served again from its
// checkpoints), or a node.
void on_down(cluster_pointer self, const caf::down_msg& dm) {
  auto& st = self->state;
  bool shard_lost = false;
  if (st.job_running)
    for (size_t i = 0; i < st.job.shards.size() && i < st.job.shard_templates.size(); ++i)
      if (st.job.shards[i].address() == dm.source && !st.job.shard_templates[i].checkpoint_dir.empty()) {
        st.lost_shards.insert(st.job.shard_templates[i].range.shard_id);
        shard_lost = true;
      }
  std::vector<uint32_t> gone;
  for (const auto& [id, n] : st.nodes)
    if (n.handle.address() == dm.source && n.info.alive)
      gone.push_back(id);
  for (auto id : gone)
    lose_node(self, id, dm.reason == caf::exit_reason::user_shutdown ? std::string{"it shut down"}
                        : dm.reason == caf::exit_reason::remote_link_unreachable
                          ? std::string{"its connection was lost"}
                          : to_string(dm.reason));
  if (gone.empty())
    capacity_changed(self);
  // The shard's own node may be going down too: its loss comes first or soon after.
  if (shard_lost)
    self->delayed_send(self, std::chrono::milliseconds(500), shard_atom::value);
}

// Pings the live nodes that are due and loses those that answered none for the watch's
// timeout (runtime/control/node_watch.hpp).
void ping_nodes(cluster_pointer self) {
  auto& st = self->state;
  const auto timeout = std::chrono::nanoseconds{st.watch.timing().timeout_ns};
  for (auto id : st.watch.to_ping()) {
    auto i = st.nodes.find(id);
    if (i == st.nodes.end() || !i->second.info.alive) {
      st.watch.forget(id);
      continue;
    }
    self->request(i->second.handle, timeout, ping_atom::value)
      .then([=](caf::ok_atom) { self->state.watch.answered(id); }, [](caf::error&) {});
  }
  const auto secs = std::to_string(st.watch.timing().timeout_ns / 1000000000ull);
  for (auto id : st.watch.silent())
    lose_node(self, id, "it answered no liveness ping of the scheduler's for " + secs + " s");
  self->delayed_send(self, std::chrono::nanoseconds{st.watch.timing().interval_ns} / 2, ping_atom::value);
}

// A job submitted with `train --join`: the runner (the scheduler process's main thread)
// runs it; the answer waits for its result.
caf::result<wire::job_result> on_job_request(cluster_pointer self, const wire::job_request& req) {
  auto& st = self->state;
  if (!st.cfg.runner)
    return make_error(errc::invalid_state, "this scheduler does not accept submitted jobs");
  if (st.job_running || st.have_promise)
    return make_error(errc::invalid_state, "a job is already running on this cluster");
  st.job_promise = self->make_response_promise<wire::job_result>();
  st.have_promise = true;
  caf::anon_send(st.cfg.runner, req);
  return st.job_promise;
}

// The live nodes and their handles (for the job runner's placement).
caf::result<wire::cluster_status, std::vector<node_actor>> live_nodes(const cluster_state& st) {
  wire::cluster_status live;
  std::vector<node_actor> handles;
  for (const auto& [id, n] : st.nodes)
    if (n.info.alive && st.members.serving(id)) {
      live.nodes.push_back(n.info);
      handles.push_back(n.handle);
    }
  return caf::make_result(std::move(live), std::move(handles));
}

// The job about to run waits for its nodes (runtime/control/job_lifecycle.hpp).
caf::result<caf::ok_atom> on_wait(cluster_pointer self, uint32_t shards, uint32_t workers, uint64_t wait_ms) {
  auto& st = self->state;
  if (st.life || st.job_running)
    return make_error(errc::invalid_state, "a job is already running or waiting on this cluster");
  st.life.emplace(st.clock, control::job_needs{shards, workers}, wait_ms * 1000000ull);
  st.wait_promise = self->make_response_promise<caf::ok_atom>();
  st.waiting = true;
  auto promise = st.wait_promise;
  act(self, st.life->on_capacity(st.members.free()));
  if (st.life && st.life->state() == control::job_lifecycle::phase::waiting)
    self->delayed_send(self, std::chrono::milliseconds(wait_ms), tick_atom::value);
  return promise;
}

// The job runs: the job driver follows it from here.
void on_job_started(cluster_pointer self, const running_job& job) {
  auto& st = self->state;
  st.job = job;
  st.job_running = true;
  st.members.job_started(job.workers, job.placed);
  st.life.reset();
  st.lost_shards.clear();
  st.rehosting.clear();
  for (const auto& s : job.shards)
    self->monitor(s);
  st.job_text = std::to_string(job.shards.size()) + " shards";
  st.waiting_for.clear();
}

// The cluster's end: every node shuts down, and the process that runs the cluster.
void shut_down_nodes(cluster_pointer self, const wire::ctl_request& req) {
  auto& st = self->state;
  st.shutdown_after_job.reset();
  for (auto& [id, n] : st.nodes)
    if (n.info.alive)
      self->send(n.handle, req);
  if (st.cfg.runner)
    caf::anon_send(st.cfg.runner, stop_atom::value);
}

void on_job_ended(cluster_state& st) {
  st.members.job_ended();
  st.job_running = false;
  st.job = running_job{};
  st.lost_shards.clear();
  st.rehosting.clear();
  st.job_text.clear();
}

cluster_actor::behavior_type cluster_behavior(cluster_pointer self, cluster_config cfg) {
  self->state.cfg = std::move(cfg);
  self->state.clock.bind(self->system());
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  return {
    [=](ping_atom) { ping_nodes(self); },
    [=](welcomed_atom, uint32_t id) { on_welcomed(self, id); },
    [=](wait_atom, uint32_t id) { on_confirm_due(self, id); },
    [=](const wire::hello& h, const node_actor& node) -> caf::result<wire::welcome> {
      return on_hello(self, h, node);
    },
    [=](status_atom) -> caf::result<wire::cluster_status> { return cluster_status(self); },
    [=](const wire::ctl_request& req) -> caf::result<std::string> { return on_ctl(self, req); },
    [=](const wire::job_request& req) { return on_job_request(self, req); },
    [=](nodes_atom) { return live_nodes(self->state); },
    [=](wait_atom, uint32_t shards, uint32_t workers, uint64_t wait_ms) {
      return on_wait(self, shards, workers, wait_ms);
    },
    [=](tick_atom) {
      if (self->state.life)
        act(self, self->state.life->on_time());
      // A job that did not stop within the shutdown's grace: the nodes go anyway.
      if (self->state.shutdown_after_job && self->state.clock.steady_ns() >= self->state.shutdown_by_ns) {
        spdlog::warn("cluster: the running job did not stop within 60 s; shutting the nodes down");
        shut_down_nodes(self, *self->state.shutdown_after_job);
      }
    },
    [=](stop_atom, const std::string& who) {
      if (self->state.life)
        act(self, self->state.life->on_stop(who));
    },
    [=](job_atom, const running_job& job) { on_job_started(self, job); },
    [=](job_atom, const std::string& lacking) { self->state.waiting_for = lacking; },
    // Where the cluster is published (known once its port is): named in errors and hints.
    [=](caf::publish_atom, const std::string& address) { self->state.cfg.address = address; },
    [=](job_atom, const wire::job_result& res) {
      auto& st = self->state;
      if (st.have_promise)
        st.job_promise.deliver(res);
      st.have_promise = false;
    },
    [=](job_atom, const caf::error& err) {
      auto& st = self->state;
      if (st.have_promise)
        st.job_promise.deliver(err);
      st.have_promise = false;
    },
    [=](shard_atom) {
      self->state.retry_due = false;
      rehost_lost(self);
    },
    [=](job_atom) {
      on_job_ended(self->state);
      // A job that ended after its start and before it trained (a file refused as it was
      // prepared): the lifecycle that followed it ends it, and with it the job's hold on
      // the cluster.
      auto& life = self->state.life;
      if (life && life->state() != control::job_lifecycle::phase::waiting)
        act(self, life->on_run_ended("it ended before it trained", false));
      if (self->state.shutdown_after_job)
        shut_down_nodes(self, *self->state.shutdown_after_job);
    },
  };
}

}  // namespace

cluster_actor spawn_cluster(caf::actor_system& sys, cluster_config cfg) {
  return sys.spawn(cluster_behavior, std::move(cfg));
}

namespace {

struct node_list {
  std::vector<wire::node_info> infos;
  std::vector<node_actor> handles;
};

expected<node_list> list_nodes(caf::scoped_actor& self, const cluster_actor& cluster) {
  node_list out;
  caf::error err;
  self->request(cluster, 10s, nodes_atom::value)
    .receive(
      [&](wire::cluster_status& live, std::vector<node_actor>& handles) {
        out.infos = std::move(live.nodes);
        out.handles = std::move(handles);
      },
      [&](caf::error& e) { err = std::move(e); });
  if (err)
    return err;
  return out;
}

// A shard's parameters cross the cluster network whole (to host it, to restore it, to a
// worker whose data connection is lost): a shard past what a message may carry would be
// refused by the node it is sent to. Such a job is refused here, saying how many shards
// it needs.
caf::error check_shard_sizes(caf::actor_system& sys, const std::vector<shard_range>& ranges) {
  auto net = network_of(sys);
  const uint64_t limit = net ? net->security().max_message : net::net_security{}.max_message;
  uint64_t largest = 0, total = 0;
  for (const auto& r : ranges) {
    largest = std::max<uint64_t>(largest, r.end - r.begin);
    total += r.end - r.begin;
  }
  const uint64_t room = limit > (1u << 20) ? limit - (1u << 20) : limit; // the message's other fields
  if (largest * sizeof(float) <= room)
    return {};
  const uint64_t need = (total * sizeof(float) + room - 1) / room;
  return make_error(errc::invalid_config, "a shard of " + std::to_string(largest) + " parameters ("
                                            + std::to_string(largest * sizeof(float) >> 20) + " MiB) is more than a "
                                            + "message between nodes may carry (--max-message-mb "
                                            + std::to_string(limit >> 20) + "): give the job at least "
                                            + std::to_string(need) + " shards (--servers)");
}

}  // namespace

cluster_placement::cluster_placement(caf::actor_system& sys, cluster_actor cluster)
  : sys_(sys), cluster_(std::move(cluster)) {
}

expected<std::vector<shard_actor>>
cluster_placement::make_shards(const std::vector<shard_range>& ranges, const std::vector<float>& init,
                               const train_config& cfg, double average_samples) {
  caf::scoped_actor self{sys_};
  auto nodes = list_nodes(self, cluster_);
  if (!nodes)
    return nodes.error();
  std::vector<size_t> servers;
  for (size_t i = 0; i < nodes->infos.size(); ++i)
    if (has_role(nodes->infos[i].roles, wire::role::server))
      servers.push_back(i);
  if (servers.empty())
    return make_error(errc::invalid_state, "no server node has joined the cluster");
  if (auto err = check_shard_sizes(sys_, ranges))
    return err;
  std::vector<shard_actor> out;
  std::vector<std::string> endpoints;
  key_ = cfg.data_plane ? make_data_key() : std::string{};
  // The job's id in every request for its shards: a node asked again for a shard it still
  // serves answers with it only for the same job (same_shard_of_job), never for a later
  // job with the same settings while the earlier job's shard stops.
  const std::string job_id = net::random_hex(8); // (8 random bytes, 16 hex digits)
  for (size_t k = 0; k < ranges.size(); ++k) {
    const auto& r = ranges[k];
    size_t n = servers[k % servers.size()];
    wire::spawn_shard req;
    req.range = r;
    req.params.assign(init.begin() + r.begin, init.begin() + r.end);
    req.policy = cfg.policy;
    const auto opt = shard_optimizer(cfg.policy, job_optimizer(cfg));
    req.lr = opt.lr;
    req.momentum = opt.momentum;
    req.weight_decay = opt.weight_decay;
    req.rule = opt.rule;
    req.beta1 = opt.beta1;
    req.beta2 = opt.beta2;
    req.eps = opt.eps;
    req.staleness_aware_lr = cfg.policy_settings.staleness_aware_lr;
    req.staleness_bound = cfg.policy_settings.staleness_bound;
    req.k = cfg.policy_settings.k;
    req.data_key = key_;
    req.checkpoint_dir = cfg.checkpoint_dir;
    req.checkpoint_keep = cfg.checkpoint_keep;
    req.resume = false; // a resume's shards are restored by the job driver, from the cut they all hold
    req.average_samples = average_samples;
    req.job = job_id;
    templates_.push_back(req);
    caf::error err;
    self->request(nodes->handles[n], 60s, req)
      .receive(
        [&](shard_actor& s, std::string& endpoint) {
          out.push_back(std::move(s));
          endpoints.push_back(std::move(endpoint));
        },
               [&](caf::error& e) { err = std::move(e); });
    if (err)
      return make_error(errc::peer_unreachable, "node " + nodes->infos[n].name + " could not host shard "
                                                  + std::to_string(r.shard_id) + ": " + describe(err));
  }
  shards_ = out;
  endpoints_ = key_.empty() ? std::vector<std::string>{} : endpoints;
  return out;
}

namespace {
// What every worker of the job is spawned from (a node fills in its id). A ring job's
// nodes take their workers' ring chunks on their data planes, under the job's key.
wire::spawn_worker worker_template(const train_config& cfg, const dataset& train, const std::string& key) {
  wire::spawn_worker tmpl;
  tmpl.data_dir = cfg.data_dir;
  tmpl.data_source = to_string(cfg.data_source);
  tmpl.train_limit = cfg.data_source == data_source_kind::synthetic ? train.n : cfg.train_limit;
  tmpl.seed = cfg.seed;
  tmpl.input_width = static_cast<uint32_t>(cfg.model.input.size());
  tmpl.input = cfg.model.input;
  tmpl.classes = cfg.model.classes;
  tmpl.crop_padding = cfg.crop_padding;
  tmpl.hflip = cfg.hflip;
  if (traits_of(cfg.policy).ring)
    tmpl.ring_key = key;
  return tmpl;
}
}  // namespace

caf::error cluster_placement::start_workers(const train_config& cfg, const scheduler_actor& scheduler,
                                            const profiler_actor& profiler,
                                            std::shared_ptr<const dataset> train) {
  caf::scoped_actor self{sys_};
  auto nodes = list_nodes(self, cluster_);
  if (!nodes)
    return nodes.error();
  const auto tmpl = worker_template(cfg, *train, key_);
  // Worker ids go to the nodes' slots in the order of the nodes' names ("worker-0" before
  // "worker-1", "worker-10"), not of their joining: a launched cluster's node worker-i hosts worker i.
  std::vector<size_t> order(nodes->infos.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return natural_less(nodes->infos[x].name, nodes->infos[y].name); });
  // Tell the cluster first, with where the workers go, so a node joining from now on is
  // given the workers the job lacks.
  // A job grows to train.max_workers as nodes join (0: twice train.workers), no further.
  const uint32_t cap = most_workers(cfg);
  running_job job{scheduler, profiler, shards_, tmpl, templates_, driver_, cap, {}};
  job.train_samples = train->n;
  job.job_samples = static_cast<uint64_t>(static_cast<double>(train->n) * cfg.epochs);
  {
    uint32_t k = 0;
    for (size_t i : order)
      for (uint32_t slot = 0; slot < nodes->infos[i].slots && k < cfg.workers; ++slot, ++k)
        job.placed[nodes->infos[i].node_id] += 1;
  }
  caf::anon_send(cluster_, job_atom::value, std::move(job));
  // Every node is asked at once, then every answer awaited: each node loads its data set
  // for its worker, and one after another they would keep training waiting for the sum.
  struct asked_worker {
    size_t node;
    uint32_t id;
    decltype(self->request(nodes->handles[0], 60s, tmpl, scheduler, profiler)) answer;
  };
  std::vector<asked_worker> asked;
  uint32_t next = 0;
  for (size_t i : order) {
    if (next >= cfg.workers)
      break;
    for (uint32_t slot = 0; slot < nodes->infos[i].slots && next < cfg.workers; ++slot) {
      auto req = tmpl;
      req.requested_id = next;
      asked.push_back({i, next, self->request(nodes->handles[i], 60s, req, scheduler, profiler)});
      ++next;
    }
  }
  // A node lost while it starts its workers (a storm of losses, a node killed as the job
  // starts) leaves its workers missing: the scheduler's start barrier and hand-over cover
  // them as they cover any worker lost before the start. Only a job none of whose workers
  // started fails here.
  caf::error first;
  std::map<std::string, std::pair<uint32_t, std::string>> failed; // node name -> workers, why
  for (auto& a : asked) {
    caf::error err;
    a.answer.receive([&](worker_actor& w) { workers_.push_back(std::move(w)); },
                     [&](caf::error& e) { err = std::move(e); });
    if (!err)
      continue;
    if (!first)
      first = make_error(errc::peer_unreachable, "node " + nodes->infos[a.node].name + " could not start worker "
                                                   + std::to_string(a.id) + ": " + describe(err));
    auto& f = failed[nodes->infos[a.node].name];
    ++f.first;
    f.second = describe(err);
  }
  if (first && workers_.empty())
    return first;
  for (const auto& [name, f] : failed)
    spdlog::warn("cluster: node {} did not start {} worker(s) of the job ({}); the job goes on without them, "
                 "their share going to the others",
                 name, f.first, f.second);
  if (next < cfg.workers)
    spdlog::warn("cluster: only {} worker slots for {} workers; training starts when the "
                 "scheduler's start timeout passes or more worker nodes join",
                 next, cfg.workers);
  return caf::none;
}

void cluster_placement::on_job_end() {
  for (auto& w : workers_)
    caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  workers_.clear();
  caf::anon_send(cluster_, job_atom::value);
}

caf::error wait_for_nodes(caf::actor_system& sys, const cluster_actor& cluster, uint32_t servers,
                          uint32_t worker_slots, std::chrono::milliseconds timeout,
                          const std::function<bool()>& stopping) {
  // The cluster actor's job lifecycle decides (runtime/control/job_lifecycle.hpp); this
  // thread only turns the process's stop signal into a stop request.
  caf::scoped_actor self{sys};
  self->send(cluster, wait_atom::value, servers, worker_slots, static_cast<uint64_t>(timeout.count()));
  caf::error result;
  bool answered = false, asked_stop = false;
  while (!answered) {
    self->receive([&](caf::ok_atom) { answered = true; },
                  [&](caf::error& err) {
                    result = std::move(err);
                    answered = true;
                  },
                  caf::after(std::chrono::milliseconds(200)) >> [&] {
                    if (asked_stop || !stopping || !stopping())
                      return;
                    asked_stop = true;
                    self->send(cluster, stop_atom::value, std::string{"a stop signal to the scheduler node"});
                  });
  }
  return result;
}

}  // namespace ashlar::actors
