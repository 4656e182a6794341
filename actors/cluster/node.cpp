#include "actors/cluster/node.hpp"

#include "runtime/os/paths.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/cluster/data_plane.hpp"
#include "actors/job_driver.hpp"
#include "actors/server_shard.hpp"
#include "actors/worker.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/store/serve_again.hpp"

namespace ashlar::actors {

expected<std::vector<wire::role>> parse_roles(const std::string& text) {
  std::vector<wire::role> out;
  std::stringstream ss{text};
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "scheduler")
      out.push_back(wire::role::scheduler);
    else if (item == "server")
      out.push_back(wire::role::server);
    else if (item == "worker")
      out.push_back(wire::role::worker);
    else
      return make_error(errc::invalid_argument, "unknown role '" + item
                                                  + "' (roles: scheduler, server, worker)");
  }
  if (out.empty())
    return make_error(errc::invalid_argument, "--role needs at least one of scheduler, server, worker");
  return out;
}

std::string to_string(const std::vector<wire::role>& roles) {
  std::string s;
  for (auto r : roles) {
    const char* name = r == wire::role::scheduler ? "scheduler"
                       : r == wire::role::server  ? "server"
                       : r == wire::role::worker  ? "worker"
                                                  : "profiler";
    s += (s.empty() ? "" : ",") + std::string{name};
  }
  return s;
}

bool has_role(const std::vector<wire::role>& roles, wire::role r) {
  return std::find(roles.begin(), roles.end(), r) != roles.end();
}

namespace {

// A shard hosted here that keeps checkpoints: what it was asked for, where its store is,
// and its data-plane endpoint.
struct stored_shard {
  shard_actor shard;
  wire::spawn_shard req; // without its initial parameters
  std::string dir;
  std::string endpoint;
};

struct node_state {
  static constexpr const char* name = "ashlar.node";
  node_config cfg;
  std::vector<shard_actor> shards;
  std::map<caf::actor_addr, stored_shard> persistent; // the shards that keep checkpoints
  // Every shard and worker the node hosts and that still runs: they end with the node
  // (its process could not end while they ran, e.g. after losing the scheduler).
  std::shared_ptr<std::vector<caf::actor>> children = std::make_shared<std::vector<caf::actor>>();
  std::map<caf::actor_addr, worker_actor> workers;
  std::map<caf::actor_addr, uint32_t> gpu_slots; // the GPU each worker holds
  std::map<std::string, std::shared_ptr<const dataset>> data_cache;
  bool shutting_down = false;
  size_t checkpointing = 0; // shards taking their last checkpoint before they stop
  lease_watch leases;       // checkpoint stores held elsewhere that this node was asked to serve
  // Answered once every child has stopped after a (stop_atom): the count it stopped.
  std::vector<std::pair<caf::typed_response_promise<uint32_t>, uint32_t>> dropping;
};

// Keeps the process's count of hosted shards (node_config::shards_hosted) current.
void count_shards(const node_state& st) {
  if (st.cfg.shards_hosted)
    st.cfg.shards_hosted->store(static_cast<uint32_t>(st.shards.size()));
}


using node_pointer = node_actor::stateful_pointer<node_state>;

void maybe_report_shutdown(node_pointer self) {
  auto& st = self->state;
  if (st.shutting_down && st.workers.empty() && st.checkpointing == 0 && st.cfg.owner)
    caf::anon_send(st.cfg.owner, stop_atom::value);
}

// A shard for the job: its policy and optimizer, its checkpoints (confined to the node's
// work directory), and its data-plane endpoint when the node serves one.
caf::result<shard_actor, std::string> host_shard(node_pointer self, wire::spawn_shard req) {
  auto& st = self->state;
  if (!has_role(st.cfg.roles, wire::role::server))
    return make_error(errc::invalid_state, "node " + st.cfg.name + " has no server role");
  std::string dir = !st.cfg.checkpoint_dir.empty() ? st.cfg.checkpoint_dir : req.checkpoint_dir;
  std::shared_ptr<pinned_dir> pinned; // the job's directory, held open beneath the work directory
  if (st.cfg.checkpoint_dir.empty() && !req.checkpoint_dir.empty() && !st.cfg.work_dir.empty()) {
    auto inside = confine_path(st.cfg.work_dir, req.checkpoint_dir, "the job's checkpoint directory");
    if (!inside)
      return inside.error();
    dir = *inside;
    auto held = pin_confined_dir(st.cfg.work_dir, dir, "the job's checkpoint directory");
    if (!held)
      return held.error();
    pinned = std::move(*held);
  }
  // Asked again for a shard this node already serves from that store for the same job
  // (and is not stopping): the cluster's earlier request timed out while the store was
  // restored (serve_again.hpp).
  auto serving = [&](const shard_actor& s) {
    return std::find(st.shards.begin(), st.shards.end(), s) != st.shards.end();
  };
  if (req.resume && !req.checkpoint_dir.empty())
    for (const auto& [addr, held] : st.persistent)
      if (held.dir == dir && same_shard_of_job(held.req, req) && serving(held.shard)) {
        spdlog::info("node {}: already serves shard {}{}{} from {}; answering with it", st.cfg.name,
                     req.range.shard_id, req.job.empty() ? "" : " of job ", req.job, dir);
        return {held.shard, held.endpoint};
      }
  policy_config pc;
  pc.staleness_aware_lr = req.staleness_aware_lr;
  pc.staleness_bound = req.staleness_bound;
  pc.k = req.k;
  auto policy = make_policy(req.policy, pc);
  if (!policy)
    return policy.error();
  sgd_config opt;
  opt.lr = req.lr;
  opt.momentum = req.momentum;
  opt.weight_decay = req.weight_decay;
  opt.rule = req.rule;
  opt.beta1 = req.beta1;
  opt.beta2 = req.beta2;
  opt.eps = req.eps;
  auto core = std::make_unique<shard_core>(req.range, std::move(req.params), opt, std::move(*policy));
  core->keep_average(req.average_samples);
  if (st.cfg.plane && !req.data_key.empty()) // versions where co-located workers read them in place
    core->use_storage(st.cfg.plane->tensor_buffers(req.data_key), st.cfg.plane->tensor_reclaim(req.data_key));
  shard_persistence persistence;
  if (!req.checkpoint_dir.empty()) {
    auto p = open_shard_persistence(dir, req.checkpoint_keep, req.resume, *core,
                                    store_owner{"node " + st.cfg.name + ", " + default_lease_holder(), &st.leases,
                                                lease_stale_s, pinned});
    if (!p)
      return p.error();
    persistence = std::move(*p);
  }
  auto shard = spawn_shard(self->system(), std::move(core), std::move(persistence));
  st.shards.push_back(shard);
  count_shards(st);
  self->monitor(shard); // a shard its job stopped is no longer the node's to checkpoint
  st.children->push_back(caf::actor_cast<caf::actor>(shard));
  spdlog::info("node {}: hosting shard {} (parameters [{}, {}), policy {}{}{})", st.cfg.name,
               req.range.shard_id, req.range.begin, req.range.end, req.policy,
               req.job.empty() ? "" : ", job ", req.job);
  std::string endpoint;
  if (st.cfg.plane && !req.data_key.empty()) {
    auto ep = st.cfg.plane->serve(req.range.shard_id, shard, req.data_key, st.cfg.data_host, req.range.size());
    if (ep)
      endpoint = std::move(*ep);
    else
      spdlog::warn("node {}: shard {} is reachable over CAF only: {}", st.cfg.name, req.range.shard_id,
                   describe(ep.error()));
  }
  if (!req.checkpoint_dir.empty()) {
    req.params = {}; // (moved into the shard: the request is kept to compare)
    st.persistent.emplace(shard.address(), stored_shard{shard, std::move(req), dir, endpoint});
  }
  return {shard, endpoint};
}

// A worker in a free slot: the training set (loaded once per data description and
// shared), a GPU when the node has one free, then it registers with the scheduler.
caf::result<worker_actor> host_worker(node_pointer self, const wire::spawn_worker& req,
                                      const scheduler_actor& scheduler, const profiler_actor& profiler) {
  auto& st = self->state;
  if (!has_role(st.cfg.roles, wire::role::worker))
    return make_error(errc::invalid_state, "node " + st.cfg.name + " has no worker role");
  if (st.workers.size() >= st.cfg.slots)
    return make_error(errc::invalid_state, "node " + st.cfg.name + " has no free worker slot ("
                                             + std::to_string(st.cfg.slots) + " in use)");
  data_settings dc;
  dc.data_dir = st.cfg.data_dir.empty() ? req.data_dir : st.cfg.data_dir;
  auto source = parse_data_source(req.data_source);
  if (!source)
    return source.error();
  dc.data_source = *source;
  dc.train_limit = req.train_limit;
  dc.test_limit = 1;
  dc.crop_padding = req.crop_padding;
  dc.hflip = req.hflip;
  model_spec model;
  model.input = req.input;
  model.classes = req.classes;
  auto key = req.data_source + "|" + dc.data_dir + "|" + std::to_string(dc.train_limit) + "|"
             + std::to_string(req.seed) + "|" + model.input.to_string() + "|" + std::to_string(model.classes) + "|"
             + std::to_string(dc.crop_padding) + "|" + (dc.hflip ? "flip" : "");
  auto& data = st.data_cache[key];
  if (!data) {
    auto loaded = load_job_data(dc, model, req.seed);
    if (!loaded) {
      st.data_cache.erase(key);
      return loaded.error();
    }
    data = std::make_shared<const dataset>(std::move(loaded->train));
  }
  worker_config wc;
  wc.scheduler = scheduler;
  wc.profiler = profiler;
  wc.data = data;
  wc.requested_id = req.requested_id;
  wc.host = st.cfg.name;
  wc.plane = st.cfg.plane;
  if (!req.ring_key.empty()) {
    wc.ring_host = st.cfg.data_host;
    wc.ring_key = req.ring_key;
  }
  wc.give_back_between_steps = st.cfg.slots > std::max(1u, std::thread::hardware_concurrency());
  uint32_t gpu_slot = UINT32_MAX;
  if (st.cfg.make_backend)
    wc.make_backend = st.cfg.make_backend;
  else if (st.cfg.gpus)
    wc.make_backend = st.cfg.gpus->next_worker(&gpu_slot);
  auto w = spawn_worker(self->system(), wc);
  if (gpu_slot != UINT32_MAX)
    st.gpu_slots[w.address()] = gpu_slot;
  self->monitor(w);
  st.workers.emplace(w.address(), w);
  st.children->push_back(caf::actor_cast<caf::actor>(w));
  self->send(w, start_atom::value);
  return w;
}

// A clean shutdown: workers finish their step, each shard checkpoints its current
// version (if its job keeps checkpoints), then stops.
void shut_down(node_pointer self, const wire::ctl_request& req) {
  auto& st = self->state;
  if (req.op == wire::ctl_request::shutdown) {
    spdlog::info("node {}: shutting down ({} workers to stop)", st.cfg.name, st.workers.size());
    st.shutting_down = true;
    for (auto& [addr, w] : st.workers)
      self->send(w, stop_atom::value);
    // A clean shutdown: each shard checkpoints its current version (if its job keeps
    // checkpoints), then stops.
    for (auto& s : st.shards) {
      if (st.persistent.count(s.address()) == 0) {
        self->send_exit(s, caf::exit_reason::user_shutdown);
        continue;
      }
      ++st.checkpointing;
      auto done = [=] {
        self->send_exit(s, caf::exit_reason::user_shutdown);
        --self->state.checkpointing;
        maybe_report_shutdown(self);
      };
      self->request(s, std::chrono::seconds(30), checkpoint_atom::value)
        .then([=](uint64_t) { done(); },
              [=](caf::error& err) {
                spdlog::warn("node {}: a shard's last checkpoint failed: {}", self->state.cfg.name, describe(err));
                done();
              });
    }
    st.shards.clear();
    count_shards(st);
    maybe_report_shutdown(self);
  }
}

// The scheduler is gone: its job cannot go on here. Every shard and worker stops now (a
// shard's committed checkpoint cuts are on disk; the job's next scheduler restores one),
// and the node stays, ready to join again, once the last has stopped (its checkpoint
// store closed).
caf::result<uint32_t> drop_all(node_pointer self) {
  auto& st = self->state;
  auto n = static_cast<uint32_t>(st.children->size());
  if (n == 0)
    return uint32_t{0};
  spdlog::info("node {}: stopping its {} shard(s) and {} worker(s)", st.cfg.name, st.shards.size(),
               st.workers.size());
  for (const auto& c : *st.children)
    self->send_exit(c, caf::exit_reason::kill);
  st.shards.clear();
  count_shards(st);
  auto rp = self->make_response_promise<uint32_t>();
  st.dropping.emplace_back(rp, n);
  return rp;
}

node_actor::behavior_type node_behavior(node_pointer self, node_config cfg) {
  self->state.cfg = std::move(cfg);
  self->attach_functor([children = self->state.children](const caf::error&) {
    for (const auto& c : *children)
      caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& kids = *self->state.children;
    kids.erase(std::remove_if(kids.begin(), kids.end(), [&](const auto& c) { return c.address() == dm.source; }),
               kids.end());
    auto& shards = self->state.shards;
    shards.erase(std::remove_if(shards.begin(), shards.end(), [&](const auto& s) { return s.address() == dm.source; }),
                 shards.end());
    count_shards(self->state);
    self->state.persistent.erase(dm.source);
    self->state.workers.erase(dm.source);
    if (auto g = self->state.gpu_slots.find(dm.source); g != self->state.gpu_slots.end()) {
      self->state.cfg.gpus->release(g->second);
      self->state.gpu_slots.erase(g);
    }
    if (kids.empty()) {
      for (auto& [rp, n] : self->state.dropping)
        rp.deliver(n);
      self->state.dropping.clear();
    }
    maybe_report_shutdown(self);
  });
  return {
    [=](const wire::spawn_shard& req) -> caf::result<shard_actor, std::string> { return host_shard(self, req); },
    [=](const wire::spawn_worker& req, const scheduler_actor& scheduler,
        const profiler_actor& profiler) -> caf::result<worker_actor> {
      return host_worker(self, req, scheduler, profiler);
    },
    [=](const wire::ctl_request& req) { shut_down(self, req); },
    [=](stop_atom) -> caf::result<uint32_t> { return drop_all(self); },
    [=](ping_atom) { return caf::ok_atom::value; },
  };
}

}  // namespace

node_actor spawn_node(caf::actor_system& sys, node_config cfg) {
  // Workers are the unit of parallelism: one BLAS thread each, as in a local job (this also
  // keeps results bit-identical to a local run).
  set_blas_threads(1);
  return sys.spawn(node_behavior, std::move(cfg));
}

}  // namespace ashlar::actors
