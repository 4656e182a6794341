#include "tests/sim/cluster_sim.hpp"

#include "runtime/data/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>

#include "runtime/control/cluster_membership.hpp"
#include "runtime/control/job_lifecycle.hpp"
#include "runtime/control/job_roster.hpp"
#include "runtime/control/launch_supervisor.hpp"
#include "runtime/control/member_plan.hpp"
#include "runtime/control/node_lifecycle.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/policy/assignment.hpp"
#include "runtime/store/checkpoint.hpp"
#include "runtime/store/cut_pacer.hpp"
#include "runtime/store/cut_schedule.hpp"
#include "runtime/store/job_store.hpp"
#include "runtime/store/kv_store.hpp"
#include "runtime/worker/step_machine.hpp"

#include <spdlog/spdlog.h>

namespace ashlar::sim {

namespace {

constexpr uint64_t ms = 1000000ull;
constexpr uint64_t sec = 1000 * ms;
// A frozen or cut-off node is found lost after the heartbeat timeout; a crashed one as
// soon as its connection drops.
constexpr uint64_t heartbeat_timeout = 4 * sec;
constexpr uint32_t batch = 32;

struct world;

// One node process: a worker node with slots (node 0 is the scheduler's own process).
struct node_state {
  uint32_t id = 0;     // as the scheduler numbered it (0: not joined)
  bool up = true;      // not crashed
  bool frozen = false; // SIGSTOPped: takes nothing until thawed
  bool cut = false;    // partitioned from the scheduler
  uint32_t slots = 0;
  bool stable = false; // never faulted by the schedule
  uint32_t life = 0;    // which run of the process (a restart is a new one)
  // Its lifecycle once it joined (control::node_lifecycle): it loses, probes, settles and
  // rejoins its scheduler by the rule `ashlar node` follows.
  std::shared_ptr<control::node_lifecycle> lifecycle;
  bool welcome_lost = false; // its next welcome does not arrive (as a connection taken for another's)
};

struct worker_state {
  uint32_t id = 0;
  size_t node = 0;        // index into world::nodes
  double speed = 1.0;
  bool alive = true;      // its process runs
  uint64_t raise_at = 0;  // its script raises before this step (0: never)
  // The worker's own step machine (runtime/worker/step_machine.hpp), as a worker actor runs
  // it: its steps, its data part and the directives' parts, its corrections and reports.
  std::shared_ptr<step_machine> machine;
  bool computing = false;
};

// What the scheduler tells a worker: its start, or a directive of a membership change
// (runtime/control/member_plan), its new part from step `from`.
struct worker_order {
  uint64_t steps = 0;            // in all (0: as it was)
  uint64_t begin = 0, part = 0;  // its part of the set (part 0: as it was)
  uint64_t from = 0;
  bool start = false;            // its start (or admission), not a directive
};

struct member {
  uint32_t id = 0;
  size_t node = 0;
  uint32_t node_id = 0; // the node it registered through, as the scheduler numbered it
  bool failed = false;  // lost (its node), not left on its own
  bool live = true;
  uint64_t steps = 0; // assigned
  uint64_t done = 0;  // pushes the shard took (buffered or applied), as it answers a loss
  uint64_t reported = 0;   // steps as the worker last reported them (the profiler's count)
  uint32_t directives = 0; // directives sent to it
  bool handed = false;
  uint64_t part = 0;  // samples in its part of the set
  uint64_t begin = 0; // where the part starts
  std::vector<std::pair<uint64_t, double>> earlier; // what its steps trained before its part took effect
  member_part ledger() const { return member_part{batch, begin, part, steps, earlier}; }
};

// A store in memory whose disk can fill: while `full`, every write fails as RocksDB's does
// on a full disk, and nothing of the batch lands.
class filling_store : public kv_store {
public:
  explicit filling_store(std::string name) : name_(std::move(name)) {}
  bool full = false;
  caf::error write(const kv_batch& b) override {
    if (full)
      return make_error(errc::io_error, name_ + ": IO error: No space left on device");
    return mem_->write(b);
  }
  expected<std::optional<std::string>> get(const std::string& key) const override { return mem_->get(key); }
  expected<std::vector<std::string>> keys(const std::string& prefix) const override { return mem_->keys(prefix); }
  std::string where() const override { return name_; }

private:
  std::string name_;
  std::unique_ptr<kv_store> mem_ = make_memory_store();
};

// A server shard's checkpoints: its versions (one per BSP round), the cut it was asked for
// at a later version (the real cut_schedule), and its records in the real checkpoint_log.
struct shard_disk {
  uint32_t id = 0;
  std::unique_ptr<filling_store> disk;
  std::unique_ptr<checkpoint_log> log;
  cut_schedule cuts;
  uint64_t version = 0;
  uint64_t newest_cut = 0; // on disk
  std::string error;       // why its last write failed
  uint64_t kept = 0;       // the job's last committed cut, as the driver said
};

struct event {
  uint64_t t;
  uint64_t seq;
  std::function<void()> fn;
  bool operator>(const event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct world {
  sim_options opt;
  sim_result res;
  manual_clock clock;
  std::mt19937_64 rng;
  std::priority_queue<event, std::vector<event>, std::greater<event>> q;
  uint64_t seq = 0;
  // the scheduler process
  control::cluster_membership members{control::membership_limits{256, 4096}};
  std::optional<control::job_lifecycle> life;
  bool job_running = false, job_over = false, stopping = false;
  std::map<uint32_t, member> table;   // the scheduler's members
  std::set<uint32_t> handover_due;
  bool handover_asked = false;
  std::map<uint32_t, uint64_t> handed_samples, owed_at_loss;
  uint64_t train_size = 0, budget = 0;
  double applied = 0; // samples trained: each step what a step of its member's part trains
  uint32_t job_workers = 0, epochs = 0;
  uint64_t round = 0;
  std::string job_error;
  // the world
  std::vector<node_state> nodes;
  std::map<uint32_t, worker_state> workers;
  std::map<uint32_t, uint64_t> node_lost_at; // scheduler node id -> when its process died (for the check)
  uint32_t next_worker = 0;
  std::string true_cause; // what happened first that ends the job early
  bool nodes_never_come = false;
  uint64_t wait_ns = 60 * sec;
  uint64_t sample_ns = ms / 2; // a sample's compute at speed 1

  uint64_t now() const { return clock.steady_ns(); }
  double now_s() const { return static_cast<double>(now() - 1000000000ull) * 1e-9; }

  void at(uint64_t t, std::function<void()> fn) { q.push(event{t, seq++, std::move(fn)}); }
  void after(uint64_t d, std::function<void()> fn) { at(now() + d, std::move(fn)); }
  uint64_t latency() { return 100000 + rng() % (2 * ms); }

  void note(const std::string& what) {
    if (opt.verbose)
      res.trace.push_back(fmt_time() + " " + what);
  }
  std::string fmt_time() const {
    char b[32];
    std::snprintf(b, sizeof b, "[%9.3fs]", now_s());
    return b;
  }
  void violate(const std::string& what) {
    if (!res.ok)
      return;
    res.ok = false;
    res.violation = fmt_time() + " " + what;
  }

  // A message from the scheduler to node `n` (or back): lost if either end is down or
  // cut off; held while the receiver is frozen.
  void send_to_node(size_t n, std::function<void()> fn) { send_to_node(n, std::move(fn), nodes[n].id); }
  // A frozen or cut-off node's connection holds what is sent until it thaws or heals, as
  // TCP does, unless the scheduler dropped the node meanwhile: then it is lost.
  // A connection delivers in order (TCP): a message never overtakes one sent before it.
  std::map<std::pair<size_t, bool>, uint64_t> link_last;
  uint64_t fifo(size_t n, bool to_node) {
    auto& last = link_last[{n, to_node}];
    last = std::max(now() + latency(), last + 1);
    return last;
  }
  void send_to_node(size_t n, std::function<void()> fn, uint32_t conn) {
    ++res.control_work;
    at(fifo(n, true), [this, n, fn, conn] { deliver_at_node(n, fn, conn); });
  }
  void deliver_at_node(size_t n, std::function<void()> fn, uint32_t conn) { deliver({n, true}, std::move(fn), conn); }
  void send_to_scheduler(size_t from, std::function<void()> fn) {
    auto& nd = nodes[from];
    if (!nd.up || nd.frozen)
      return;
    const uint32_t conn = nd.id;
    at(fifo(from, false), [this, from, fn, conn] { deliver({from, false}, fn, conn); });
  }
  // A link (node, towards the node) holds what arrives while its receiver is frozen or the
  // link is cut, and delivers it in order once it can (TCP keeps the order).
  using link = std::pair<size_t, bool>;
  std::map<link, std::deque<std::pair<std::function<void()>, uint32_t>>> in_link;
  bool blocked(const link& l) const { return nodes[l.first].cut || (l.second && nodes[l.first].frozen); }
  void deliver(const link& l, std::function<void()> fn, uint32_t conn) {
    auto& h = in_link[l];
    if (h.empty() && !blocked(l)) {
      const auto& nd = nodes[l.first];
      if (nd.up && nd.id == conn)
        fn();
      return;
    }
    h.emplace_back(std::move(fn), conn);
    if (h.size() == 1)
      after(100 * ms, [this, l] { flush(l); });
  }
  void flush(const link& l) {
    auto& h = in_link[l];
    while (!h.empty()) {
      if (blocked(l))
        return after(100 * ms, [this, l] { flush(l); });
      auto [fn, conn] = std::move(h.front());
      h.pop_front();
      const auto& nd = nodes[l.first];
      if (nd.up && nd.id == conn)
        fn();
    }
  }

  // ---- the scheduler: membership and the job's lifecycle ---------------------------------
  void act(const std::vector<control::job_action>& acts) {
    for (const auto& a : acts) {
      switch (a.kind) {
        case control::job_action::start:
          note("job starts");
          start_job();
          break;
        case control::job_action::waiting:
          note("job waits: it " + a.text);
          break;
        case control::job_action::stop_workers:
          note("stopping the workers: " + a.text);
          stopping = true;
          if (roster)
            roster->stop_before_start();
          for (auto& [id, m] : table)
            if (m.live)
              stop_worker(id);
          maybe_end_run();
          break;
        case control::job_action::ended:
          note("job ended: " + a.text);
          job_over = true;
          res.outcome = a.text;
          res.end_s = now_s();
          if (launch)
            scheduler_exits();
          break;
      }
    }
  }

  void node_hello(size_t n) {
    auto& nd = nodes[n];
    if (!nd.up || nd.id != 0)
      return;
    if (nd.frozen || nd.cut) // it cannot reach the scheduler yet: it tries again
      return after(500 * ms, [this, n] { node_hello(n); });
    const uint32_t id = static_cast<uint32_t>(n) + 1000 * static_cast<uint32_t>(++hellos[n]);
    auto adm = members.on_join(id, n == 0, nd.slots);
    if (!adm.admitted)
      return;
    nd.id = id;
    res.control_work += 1;
    if (adm.slots > members.limits().slots_per_node)
      violate("node " + std::to_string(id) + " was granted " + std::to_string(adm.slots) + " slots, past the limit");
    note("node " + std::to_string(id) + " joined with " + std::to_string(adm.slots) + " slots");
    // Welcomed; it serves once it confirms, and is lost if it has not in time.
    after(members.limits().confirm_within_ns, [this, n, id] {
      if (!members.confirm_due(id))
        return;
      note("node " + std::to_string(id) + " did not confirm its welcome in time");
      node_down(n, id);
      if (nodes[n].up && nodes[n].id == 0 && !nodes[n].lifecycle) // its join failed: it joins again
        after(sec, [this, n] { node_hello(n); });
    });
    if (nd.welcome_lost) {
      nd.welcome_lost = false;
      note("node " + std::to_string(id) + "'s welcome is lost");
      return;
    }
    send_to_node(n, [this, n, id] {
      auto& nd = nodes[n];
      if (!nd.lifecycle && n != 0)
        nd.lifecycle = std::make_shared<control::node_lifecycle>(clock, "the scheduler", control::node_timing{});
      send_to_scheduler(n, [this, n, id] { on_welcomed(n, id); });
    });
  }

  // Node `id` confirmed its welcome: it serves, and takes the job's workers it lacks.
  void on_welcomed(size_t n, uint32_t id) {
    if (!members.on_confirmed(id))
      return;
    if (job_running && !stopping) {
      const uint32_t k = members.to_start_on(id);
      members.placed(id, k);
      for (uint32_t j = 0; j < k; ++j)
        start_worker(n);
    }
    if (life)
      act(life->on_capacity(members.free()));
  }
  std::map<size_t, uint32_t> hellos;
  std::set<uint32_t> lost_ids;
  uint64_t short_samples = 0; // steps assigned to members that had finished, with nobody left to take them
  // What a member's steps left train, as the planner counts them (runtime/policy/assignment.hpp).
  static uint64_t owed_by(const member& m) {
    return static_cast<uint64_t>(std::ceil(samples_left(m.ledger(), m.done)));
  }

  // The scheduler's connection to node `id` (once process n) ended: the node is lost, with
  // every member that registered through it, whatever process n runs now.
  void node_down(size_t n, uint32_t id) {
    if (id == 0 || lost_ids.count(id) > 0)
      return;
    lost_ids.insert(id);
    fault_at.erase(n); // found lost: nothing of it is counted from now on (checked below)
    const uint32_t k = members.on_lost(id);
    if (nodes[n].id == id)
      nodes[n].id = 0;
    node_lost_at.erase(id);
    note("node " + std::to_string(id) + " lost, with " + std::to_string(k) + " workers");
    for (auto wid : by_proc[n])
      if (table[wid].live && table[wid].node_id == id)
        lose_member(wid);
    for (auto i = starting.begin(); i != starting.end();)
      i = i->second.second == id ? starting.erase(i) : std::next(i);
    // Joiners registered through it and not yet admitted are lost too, as the scheduler
    // counts them: they trained nothing and hand nothing over.
    for (auto i = joins_due.begin(); i != joins_due.end();)
      if (i->second.node_id == id) {
        note("worker " + std::to_string(i->first) + ", not yet admitted, is lost with it");
        unadmitted_lost[i->first] = i->second;
        owed_at_loss[i->first] = 0;
        i = joins_due.erase(i);
        ask_replan();
      } else {
        ++i;
      }
    // Nodes that joined before the loss was seen take up the workers the job now lacks.
    if (job_running && !stopping && !job_over)
      for (size_t j = 1; j < nodes.size(); ++j)
        if (nodes[j].id != 0) {
          const uint32_t more = members.to_start_on(nodes[j].id);
          members.placed(nodes[j].id, more);
          for (uint32_t x = 0; x < more; ++x)
            start_worker(j);
        }
    if (life)
      act(life->on_capacity(members.free()));
    check_round();
    maybe_end_run();
  }

  void start_job() {
    job_running = true;
    if (launch) // the scheduler writes "running" to the launch's job-state file
      launch_act(launch->on_job_running());
    // The scheduler's roster: its start timeout (30 s here) and its wait for a joiner (60 s).
    roster.emplace(clock, job_workers, 30 * sec, 60 * sec);
    std::map<uint32_t, uint32_t> placed;
    uint32_t k = 0;
    std::vector<size_t> order;
    for (size_t n = 1; n < nodes.size(); ++n)
      if (members.serving(nodes[n].id))
        order.push_back(n);
    for (size_t n : order)
      for (uint32_t s = 0; s < nodes[n].slots && k < job_workers; ++s, ++k) {
        placed[nodes[n].id] += 1;
        start_worker(n);
      }
    members.job_started(job_workers, placed);
  }

  void start_worker(size_t n) {
    if (!members.serving(nodes[n].id))
      violate("a worker started on node " + std::to_string(nodes[n].id) + ", which has not confirmed its welcome");
    worker_state w;
    w.id = next_worker++;
    w.node = n;
    w.speed = 0.5 + static_cast<double>(rng() % 100) / 50.0;
    if (raise_worker && *raise_worker == w.id)
      w.raise_at = raise_step;
    workers[w.id] = w;
    starting[w.id] = {n, nodes[n].id};
    res.max_workers_held = std::max<uint32_t>(res.max_workers_held, held());
    const uint32_t id = w.id;
    send_to_node(n, [this, id, n] {
      // the node starts the worker, which registers
      send_to_scheduler(n, [this, id, n] { register_member(id, n); });
    });
  }

  // Workers the scheduler started that have not registered: their node, as numbered then.
  std::map<uint32_t, std::pair<size_t, uint32_t>> starting;
  // The workers the scheduler holds: its live members and those it started that may still
  // register (their node still a member).
  uint32_t held() const {
    return live_count + static_cast<uint32_t>(starting.size());
  }

  uint32_t live_count = 0;                          // live members
  std::map<size_t, std::vector<uint32_t>> by_proc;  // members by the process that hosts them
  void add_member(const member& m) {
    table[m.id] = m;
    ++live_count;
    by_proc[m.node].push_back(m.id);
  }
  void mark_gone(member& m) {
    if (!m.live)
      return;
    m.live = false;
    --live_count;
    if (pushes.count(m.id) > 0)
      --live_pushed; // its push stays in the round; the round no longer waits for it
    held_pulls.erase(m.id); // (its buffered push stays in the round, as the BSP policy keeps it)
  }

  void register_member(uint32_t id, size_t n) {
    starting.erase(id);
    if (job_over || stopping)
      return stop_worker_direct(id);
    member m;
    m.id = id;
    m.node = n;
    m.node_id = nodes[n].id;
    const uint64_t part = train_size / job_workers;
    m.part = part;
    m.steps = (part + batch - 1) / batch * epochs; // a pass a step per batch, as make_assignment
    if (!round_started) { // before the start every registration joins the barrier, as the scheduler's
      add_member(m);
      if (roster->ready() == control::job_roster::action::start)
        begin_rounds();
      else if (!barrier_timer) {
        barrier_timer = true;
        after(roster->next_timer() - now(), [this] {
          if (roster->timer() == control::job_roster::action::start)
            begin_rounds();
        });
      }
      return;
    }
    // joins the running job: planned with the other changes (control::plan_member_changes)
    joins_due[id] = m;
    ask_replan();
  }
  bool round_started = false, barrier_timer = false;
  std::optional<uint32_t> raise_worker;
  uint64_t raise_step = 0;

  void begin_rounds() {
    round_started = true;
    after(100 * ms, [this] { cut_tick(); });
    note("training starts with " + std::to_string(table.size()) + " workers");
    // Fewer than the job's workers registered in time: the parts of those that did not are
    // owed as a lost worker's would be, and go to those that did.
    // (A member lost before the start is missing too, as the scheduler's start_training counts.)
    std::map<uint32_t, member_part> live;
    for (auto& [id, m] : table)
      if (m.live)
        live[id] = member_part{batch, 0, m.part, m.steps};
    if (live.size() < job_workers && !live.empty()) {
      const uint64_t per = train_size / job_workers * epochs; // samples each missing member owed
      auto h = hand_over_lockstep(live, {}, (job_workers - live.size()) * per, train_size, false);
      for (auto& [id, d] : h.parts) {
        if (d.data_count > 0 && (d.data_count != table[id].part || d.data_begin != table[id].begin))
          table[id].part = d.data_count, table[id].begin = d.data_begin;
        if (d.steps > 0)
          table[id].steps = d.steps;
      }
    }
    for (auto& [id, m] : table)
      if (m.live)
        tell_worker(id, worker_order{m.steps, m.begin, m.part, 0, true});
  }

  void tell_worker(uint32_t id, worker_order o) {
    auto w = workers.find(id);
    if (w == workers.end())
      return;
    if (!o.start)
      ++table[id].directives;
    send_to_node(w->second.node, [this, id, o] { take_order(id, o); });
  }

  // ---- a worker: its real step machine, its compute a paced delay ------------------------
  static constexpr uint64_t model_params = 4;
  dataset data; // the training set the workers' cursors walk (one feature a sample)

  void take_order(uint32_t id, const worker_order& o) {
    auto& w = workers[id];
    if (!w.alive)
      return;
    if (o.start) {
      if (w.machine)
        return;
      wire::assignment a;
      a.worker_id = id;
      a.shards = {shard_range{0, 0, model_params}};
      a.batch_size = batch;
      a.data_begin = o.begin;
      a.data_count = o.part;
      a.steps = o.steps;
      a.seed = id + 1;
      a.policy = "bsp";
      a.chunks_in_flight = 2;
      w.machine = std::make_shared<step_machine>(a, data, model_params, clock);
      w.machine->begin();
      return drive(id);
    }
    if (!w.machine)
      return;
    // (The version before directives led: the part moves at the worker's next step, and
    // its steps are taken as they are.)
    const uint64_t from = opt.uncorrected_directives ? w.machine->steps_done() + (w.computing ? 1 : 0) : o.from;
    w.machine->on_batch(batch, from, o.part > 0 ? o.begin : w.machine->job().data_begin,
                        o.part > 0 ? o.part : w.machine->job().data_count, o.steps);
    drive(id);
  }

  // Carries out what worker `id`'s step machine asked for.
  void drive(uint32_t id) {
    auto& w = workers[id];
    if (!w.machine)
      return;
    for (auto& act : w.machine->take_actions()) {
      if (!w.alive)
        return;
      if (auto* p = std::get_if<step::send_pull>(&act)) {
        const uint64_t gen = p->gen;
        const bool ahead = p->ahead;
        send_to_scheduler(w.node, [this, id, gen, ahead] { shard_pull(id, gen, ahead); });
      } else if (auto* p = std::get_if<step::send_push>(&act)) {
        const uint64_t gen = p->gen, floats = p->floats;
        const double samples = p->msg.batch_size;
        send_to_scheduler(w.node, [this, id, gen, floats, samples] { shard_push(id, gen, floats, samples); });
      } else if (auto* c = std::get_if<step::compute>(&act)) {
        compute(id, c->batch.n);
      } else if (auto* r = std::get_if<step::report>(&act)) {
        const uint64_t done = r->rep.step + 1, target = r->rep.steps_target;
        const uint32_t dirs = r->rep.directives;
        send_to_scheduler(w.node, [this, id, done, target, dirs] { on_report(id, done, target, dirs); });
      } else if (std::holds_alternative<step::next_step>(act)) {
        after(0, [this, id] {
          auto& w = workers[id];
          if (w.alive && w.machine) {
            w.machine->on_step();
            drive(id);
          }
        });
      } else if (std::holds_alternative<step::finish>(act)) {
        w.alive = false;
        send_to_scheduler(w.node, [this, id] { on_leave(id); });
      } else if (auto* f = std::get_if<step::fail>(&act)) {
        violate("worker " + std::to_string(id) + " failed: " + f->why);
        w.alive = false;
      } else {
        violate("worker " + std::to_string(id) + "'s step machine asked for what a BSP worker does not");
      }
    }
  }

  void compute(uint32_t id, size_t n) {
    auto& w = workers[id];
    w.computing = true;
    const uint64_t d = static_cast<uint64_t>(static_cast<double>(batch * sample_ns) / w.speed);
    after(d, [this, id, n] {
      auto& w = workers[id];
      if (!w.alive)
        return;
      if (nodes[w.node].frozen) // a frozen process computes nothing until it thaws
        return after(50 * ms, [this, id, n] { finish_compute(id, n); });
      finish_compute(id, n);
    });
  }
  void finish_compute(uint32_t id, size_t n) {
    auto& w = workers[id];
    if (!w.alive)
      return;
    if (nodes[w.node].frozen)
      return after(50 * ms, [this, id, n] { finish_compute(id, n); });
    w.computing = false;
    if (w.raise_at != 0 && w.machine->steps_done() + 1 >= w.raise_at) {
      w.alive = false;
      if (true_cause.empty() || true_cause.rfind("stopped", 0) == 0) // an error outranks a stop
        true_cause = "failed: worker " + std::to_string(id) + "'s computation failed";
      note("worker " + std::to_string(id) + "'s script raises");
      return send_to_scheduler(w.node, [this, id] { on_error(id); });
    }
    batch_stats st;
    st.n = n;
    st.loss_sum = static_cast<double>(n);
    w.machine->on_computed(st);
    drive(id);
  }

  void stop_worker(uint32_t id) {
    auto w = workers.find(id);
    if (w == workers.end())
      return;
    send_to_node(w->second.node, [this, id] { stop_worker_direct(id); });
  }
  void stop_worker_direct(uint32_t id) {
    auto& w = workers[id];
    if (!w.alive)
      return;
    if (w.machine) { // it leaves after its step in flight
      w.machine->on_stop();
      return drive(id);
    }
    w.alive = false;
    send_to_scheduler(w.node, [this, id] { on_leave(id); });
  }

  // ---- the shard (BSP) and the scheduler's ledger -----------------------------------------
  // A pull waits while the worker's push of this round is not applied (BSP); a push is
  // acknowledged as buffered, and applied with the round.
  // (A read sent ahead behind a push is held the same way; the push is acknowledged at
  // once, before that read's reply, as a shard without held acknowledgements would.)
  std::map<uint32_t, std::pair<uint64_t, bool>> held_pulls;
  void shard_pull(uint32_t id, uint64_t gen, bool ahead) {
    auto m = table.find(id);
    if (m == table.end() || !m->second.live)
      return; // a member dropped already: its read is refused
    if (pushes.count(id) > 0) {
      held_pulls[id] = {gen, ahead};
      return;
    }
    answer_pull(id, gen, ahead);
  }
  void answer_pull(uint32_t id, uint64_t gen, bool ahead) {
    auto w = workers.find(id);
    if (w == workers.end())
      return;
    send_to_node(w->second.node, [this, id, gen, ahead] {
      auto& w = workers[id];
      if (!w.alive || !w.machine)
        return;
      wire::pull_reply r;
      r.version = round;
      r.total = model_params;
      r.params = wire::tensor(model_params, 0.0f);
      if (ahead)
        w.machine->on_read_ahead(0, gen, r);
      else
        w.machine->on_pull_reply(0, gen, r);
      drive(id);
    });
  }
  void shard_push(uint32_t id, uint64_t gen, uint64_t floats, double samples) {
    auto m = table.find(id);
    if (m == table.end() || !m->second.live)
      return; // a member dropped already: its push is refused
    if (pushes.count(id) == 0)
      ++live_pushed;
    pushes[id] = samples;
    m->second.done += 1; // taken: what the shard answers a membership change with
    auto w = workers.find(id);
    send_to_node(w->second.node, [this, id, gen, floats] {
      auto& w = workers[id];
      if (!w.alive || !w.machine)
        return;
      w.machine->on_push_ack(0, gen, floats, wire::push_ack{});
      drive(id);
    });
    check_round();
  }
  std::map<uint32_t, double> pushes; // this round's, and the samples each trained
  size_t live_pushed = 0;             // of those, pushes of members still live (kept as they come and go)

  void check_round() {
    if (!round_started)
      return;
    // The shard waits for every live member (it knows members, not their step counts): a
    // member whose steps are done leaves, and is then no longer waited for. A push of a
    // member that has gone since is applied with the round.
    if (live_count == 0 || pushes.empty())
      return;
    if (live_pushed < live_count)
      return;
    ++round;
    ++res.rounds;
    shard_made_version();
    for (auto [id, samples] : pushes) {
      applied += samples;
      res.control_work += 1;
    }
    auto applied_now = pushes;
    pushes.clear();
    live_pushed = 0;
    check_bounds();
    for (auto [id, samples] : applied_now) {
      auto h = held_pulls.find(id);
      if (h == held_pulls.end() || !table[id].live)
        continue;
      const auto [gen, ahead] = h->second;
      held_pulls.erase(h);
      answer_pull(id, gen, ahead);
    }
  }

  // A step report: the profiler's count, and the worker's own steps where it has taken every
  // directive sent (the scheduler's plan_membership does the same with the profiler's figures).
  void on_report(uint32_t id, uint64_t done, uint64_t target, uint32_t directives) {
    auto m = table.find(id);
    if (m == table.end() || !m->second.live)
      return;
    m->second.reported = std::max(m->second.reported, done);
    if (directives == m->second.directives && target > 0 && !opt.uncorrected_directives)
      m->second.steps = target;
  }

  void on_leave(uint32_t id) {
    auto m = table.find(id);
    if (m == table.end() || !m->second.live)
      return;
    mark_gone(m->second);
    note("worker " + std::to_string(id) + " leaves after " + std::to_string(m->second.done) + " of "
         + std::to_string(m->second.steps) + " steps");
    // A member that left on its own with steps still assigned (more came after it had
    // finished): the live ones take them; with none left, the job ends without them.
    const bool any_live = live_count > 0;
    if (m->second.done < m->second.steps && !stopping && !job_over && any_live)
      lose_member(id, false);
    else if (m->second.done < m->second.steps)
      m->second.handed = true, short_samples += owed_by(m->second);
    check_round();
    maybe_end_run();
  }

  void on_error(uint32_t id) {
    auto m = table.find(id);
    if (m == table.end() || !m->second.live)
      return;
    mark_gone(m->second);
    if (life)
      act(life->on_worker_error("worker " + std::to_string(id) + "'s computation failed"));
    else
      job_error = "worker " + std::to_string(id) + "'s computation failed";
    if (!stopping) {
      stopping = true;
      if (roster)
        roster->stop_before_start();
      for (auto& [wid, mm] : table)
        if (mm.live)
          stop_worker(wid);
    }
    check_round();
    maybe_end_run();
  }

  void lose_member(uint32_t id, bool mark = true) {
    auto& m = table[id];
    if (mark) {
      mark_gone(m);
      m.failed = true;
    }
    if (!round_started) { // before the start: a missing member, counted then; owed nothing after
      m.handed = true;
      return;
    }
    if (stopping || job_over)
      return;
    owed_at_loss[id] = m.steps > m.done ? (m.steps - m.done) * batch : 0;
    handover_due.insert(id);
    ask_replan();
  }

  // As the scheduler does: the changes that came while the profiler's figures were asked
  // for, in one plan, and no plan sooner than 250 ms after one that told live workers
  // anything.
  std::map<uint32_t, member> joins_due;
  std::map<uint32_t, member> unadmitted_lost; // joiners lost before their plan
  bool replan_cooling = false;
  void ask_replan() {
    if (handover_asked || replan_cooling)
      return;
    handover_asked = true;
    after(latency(), [this] { plan_changes(); });
  }

  void record_handover(uint32_t id, uint64_t samples) {
    if (handed_samples.count(id) > 0)
      violate("worker " + std::to_string(id) + "'s share was handed over twice");
    handed_samples[id] = samples;
    if (owed_at_loss.count(id) > 0 && samples > owed_at_loss[id])
      violate("worker " + std::to_string(id) + "'s hand-over of " + std::to_string(samples)
              + " samples exceeds the " + std::to_string(owed_at_loss[id]) + " it had left");
  }

  void plan_changes() {
    handover_asked = false;
    auto due = std::move(handover_due);
    handover_due.clear();
    auto joins = std::move(joins_due);
    joins_due.clear();
    if (stopping || job_over) {
      for (auto& [id, m] : joins)
        stop_worker_direct(id);
      return;
    }
    std::map<uint32_t, control::ledger_entry> ledger;
    std::map<uint32_t, uint64_t> done;
    for (auto& [id, m] : table) {
      ledger[id] = control::ledger_entry{m.ledger(), !m.live, m.failed, true, 0};
      done[id] = m.live ? m.reported : m.done; // the profiler's count; a lost one's, the shard's
    }
    std::set<uint32_t> newcomers;
    for (auto& [id, m] : joins) {
      ledger[id] = control::ledger_entry{member_part{batch, 0, m.part, 0}, false, false, false, 0};
      newcomers.insert(id);
    }
    std::set<uint32_t> lost;
    for (auto id : due)
      if (!table[id].handed)
        lost.insert(id);
    for (auto& [id, m] : unadmitted_lost) {
      ledger[id] = control::ledger_entry{m.ledger(), true, true, false, 0};
      lost.insert(id);
    }
    auto unadmitted = std::move(unadmitted_lost);
    unadmitted_lost.clear();
    // (The hand-over before this one, kept to show the storm invariant catches it: each
    // loss on its own, rounded up to a round of every live worker; joins in equal rounds.)
    auto p = control::plan_member_changes(ledger, opt.legacy_handover ? std::set<uint32_t>{} : lost, newcomers, done,
                                          train_size, true, opt.legacy_handover,
                                          opt.uncorrected_directives ? 0 : directive_lead);
    if (opt.legacy_handover && live_count > 0)
      for (auto id : lost) {
        auto& m = table[id];
        const uint64_t owed_i = (m.steps - std::min(m.steps, m.done)) * batch;
        const uint64_t extra = (owed_i + uint64_t{batch} * live_count - 1) / (uint64_t{batch} * live_count);
        p.live = live_count;
        p.lost_steps[id] = m.done;
        for (auto& [lid, lm] : table)
          if (lm.live) {
            auto& d = p.directives[lid];
            d.steps = (d.steps > 0 ? d.steps : lm.steps) + extra;
          }
      }
    if (p.live == 0) {
      // Lost members' steps wait for a joiner; those of members that left on their own
      // stay untrained, as the job ends (the scheduler's check_done).
      for (auto id : due)
        if (!table[id].failed && !table[id].handed && table[id].steps > table[id].done) {
          table[id].handed = true;
          short_samples += owed_by(table[id]);
        }
      maybe_end_run();
      return;
    }
    for (const auto& [id, steps] : p.lost_steps) {
      if (auto u = unadmitted.find(id); u != unadmitted.end()) { // it was owed nothing
        record_handover(id, (u->second.steps - std::min(u->second.steps, steps)) * batch);
        continue;
      }
      auto& m = table[id];
      record_handover(id, (m.steps - std::min(m.steps, steps)) * batch);
      m.handed = true;
      m.steps = steps;
    }
    res.control_work += p.live;
    for (auto& [id, m] : joins) {
      m.steps = p.newcomer_steps[id];
      if (auto d = p.directives.find(id); d != p.directives.end() && d->second.data_count > 0)
        m.part = d->second.data_count, m.begin = d->second.data_begin;
      add_member(m);
      roster->joined(); // a wait for a joiner is over
      note("worker " + std::to_string(id) + " joins for " + std::to_string(m.steps) + " steps");
      tell_worker(id, worker_order{m.steps, m.begin, m.part, 0, true});
    }
    for (auto& [id, d] : p.directives) {
      auto t = table.find(id);
      if (t == table.end() || newcomers.count(id) > 0)
        continue;
      const auto now = after_directive(t->second.ledger(), d);
      t->second.part = now.data_count, t->second.begin = now.data_begin, t->second.steps = now.steps;
      t->second.earlier = now.earlier;
      note("worker " + std::to_string(id) + ": " + std::to_string(d.steps) + " steps in all, part of "
           + std::to_string(t->second.part) + " from step " + std::to_string(d.from_step) + " (reported "
           + std::to_string(done[id]) + ", at the shard " + std::to_string(t->second.done) + ")");
      tell_worker(id, worker_order{d.steps, d.data_begin, d.data_count, d.from_step, false});
    }
    if (!lost.empty())
      note(std::to_string(p.handed_samples) + " samples of " + std::to_string(lost.size()) + " lost workers handed to "
           + std::to_string(p.live));
    replan_cooling = true;
    after(250 * ms, [this] {
      replan_cooling = false;
      if (!handover_due.empty() || !joins_due.empty())
        ask_replan();
    });
    check_round();
  }

  void maybe_end_run() {
    if (!job_running || job_over || (!round_started && !stopping) || live_count > 0)
      return;
    // Every member gone: the roster says whether the run is over, or whether a joiner is
    // waited for to take up what lost members owed (a stable node always remains in these
    // schedules).
    uint64_t owed = 0;
    uint32_t lost = 0;
    for (auto& [id, m] : table)
      if (m.failed) {
        ++lost;
        if (!m.handed && m.steps > m.done)
          owed += m.steps - m.done;
      }
    const bool stops = stopping || (life && life->state() != control::job_lifecycle::phase::running);
    switch (roster->all_left(lost, owed, stops, !job_error.empty())) {
      case control::job_roster::action::wait_for_joiner:
        after(roster->next_timer() - now(), [this] {
          if (roster->timer() == control::job_roster::action::end)
            end_run("every worker was lost and none joined within 60 s");
        });
        return;
      case control::job_roster::action::end:
        return end_run(job_error);
      default:
        return;
    }
  }
  std::optional<control::job_roster> roster;

  void end_run(const std::string& error) {
    if (job_over || ending)
      return;
    for (auto& [id, m] : table) // steps that came after their member had finished
      if (!m.failed && !m.handed && m.steps > m.done) {
        m.handed = true;
        short_samples += owed_by(m);
      }
    job_running = false;
    if (pacer && !ending) { // the clean end: every shard writes the last cut first
      ending = true;
      end_error = error;
      end_began = now();
      auto a = pacer->final_cut(now_s());
      final_cut = a.cut;
      disk_full_at_end = any_disk_full();
      cut_act(a);
      // (the driver polls once the shards answered the order)
      return after(10 * ms, [this] { final_cut_tick(); });
    }
    if (life)
      act(life->on_run_ended(error, applied + 1e-6 >= static_cast<double>(budget)));
  }

  // ---- checkpoint cuts ---------------------------------------------------------------------
  // The job driver's cut_pacer, two shards' cut_schedule and checkpoint_log, the job's record
  // of committed cuts (save_job_record), each on a store whose disk can fill: a lockstep cut
  // every few rounds, and the last one as the job ends.
  std::vector<shard_disk> shard_disks;
  std::mt19937_64 disk_rng; // draws of the disks' own, apart from the schedule's
  std::unique_ptr<filling_store> job_disk;
  std::optional<cut_pacer> pacer;
  std::map<uint64_t, uint64_t> cut_version; // cut -> the version it was asked at (0: each its own)
  double cut_samples = 0;                   // the samples as the cut in flight started
  bool ending = false;                      // the run ended; its last cut is being written
  std::string end_error;
  uint64_t end_began = 0;
  uint64_t commits = 0;
  uint64_t final_cut = 0;
  bool disk_full_at_end = false; // a disk was full while the last cut was written
  std::string last_abandon;
  bool any_disk_full() const {
    bool full = job_disk->full;
    for (const auto& d : shard_disks)
      full = full || d.disk->full;
    return full;
  }

  void setup_checkpoints(uint64_t every) {
    job_disk = std::make_unique<filling_store>("the job's store");
    for (uint32_t k = 0; k < 2; ++k) {
      shard_disk d;
      d.id = k;
      d.disk = std::make_unique<filling_store>("shard " + std::to_string(k) + "'s store");
      d.log = std::make_unique<checkpoint_log>(*d.disk, k, 3);
      shard_disks.push_back(std::move(d));
    }
    job_record start; // the job's start record, in before any shard writes a cut
    if (auto e = save_job_record(*job_disk, start))
      violate("the job's start record: " + describe(e));
    pacer.emplace(every, true, 0);
  }
  shard_disk* disk_of(const std::string& what) {
    for (auto& d : shard_disks)
      if (what == "shard " + std::to_string(d.id))
        return &d;
    return nullptr;
  }
  void fill_disk(const std::string& what, bool full) {
    auto* d = disk_of(what);
    (d ? *d->disk : *job_disk).full = full;
    disk_full_at_end = disk_full_at_end || (ending && full);
    note("the disk of " + what + (full ? " is full" : " has room again"));
  }

  // A BSP round made a version on every shard: a cut due at it is written.
  void shard_made_version() {
    for (auto& d : shard_disks) {
      ++d.version;
      if (auto c = d.cuts.on_version(d.version))
        write_cut(d, *c);
    }
  }
  // The shard hands the version over to its writer (async_checkpointer), which has it on
  // disk (or fails) a little later.
  void write_cut(shard_disk& d, uint64_t cut) {
    const uint64_t version = d.version;
    const uint32_t k = d.id;
    after(ms + disk_rng() % (30 * ms), [this, k, cut, version] {
      auto& d = shard_disks[k];
      std::vector<float> params(4, static_cast<float>(version)); // what the shard held at that version
      auto r = d.log->save(version, cut, 0, params.size(), params.data(), nullptr, nullptr, 0, d.kept);
      if (!r) {
        d.error = describe(r.error());
        note("shard " + std::to_string(d.id) + " could not write cut " + std::to_string(cut) + ": " + d.error);
        return check_cuts();
      }
      d.error.clear();
      d.newest_cut = std::max(d.newest_cut, cut);
      note("shard " + std::to_string(d.id) + " wrote cut " + std::to_string(cut) + " at version "
           + std::to_string(version));
    });
  }
  // The driver's order reaches shard k: it keeps the last committed cut, and writes now,
  // later, or refuses (past the version).
  void order_cut(shard_disk& d, uint64_t cut, uint64_t at, uint64_t committed) {
    d.kept = std::max(d.kept, committed);
    if (!opt.stale_cut_error)
      d.error.clear(); // (async_checkpointer::new_cut)
    auto now_or_later = d.cuts.ask(cut, at, d.version, d.id);
    if (!now_or_later) {
      const std::string why = describe(now_or_later.error());
      return after(latency(), [this, cut, why] {
        if (auto a = pacer->missed(cut, why))
          cut_act(*a);
      });
    }
    if (*now_or_later)
      write_cut(d, cut);
  }
  void cut_act(const cut_action& a) {
    switch (a.kind) {
      case cut_action::none:
        return;
      case cut_action::start: {
        cut_samples = applied;
        cut_version[a.cut] = a.at_version;
        const uint64_t committed = pacer->last_committed();
        note("checkpoint cut " + std::to_string(a.cut) + " asked at version " + std::to_string(a.at_version));
        for (size_t k = 0; k < shard_disks.size(); ++k)
          after(latency(), [this, k, a, committed] { order_cut(shard_disks[k], a.cut, a.at_version, committed); });
        return;
      }
      case cut_action::commit: {
        job_record r;
        r.cut = a.cut;
        r.samples = static_cast<uint64_t>(cut_samples);
        if (auto e = save_job_record(*job_disk, r)) {
          note("committing cut " + std::to_string(a.cut) + " failed: " + describe(e));
          if (!opt.uncommitted_cut_kept)
            pacer->commit_failed(a.cut);
        } else {
          ++commits;
          note("checkpoint cut " + std::to_string(a.cut) + " committed");
          check_cut_versions(a.cut);
        }
        return check_cuts();
      }
      case cut_action::abandon:
        last_abandon = a.why;
        note("checkpoint cut " + std::to_string(a.cut) + " abandoned: " + a.why);
        return check_cuts();
    }
  }
  void cut_tick() {
    if (!pacer || !job_running || ending)
      return;
    cut_act(pacer->on_status(cut_views(), now_s()));
    after(100 * ms, [this] { cut_tick(); });
  }
  std::vector<shard_cut_view> cut_views() const {
    std::vector<shard_cut_view> v;
    for (const auto& d : shard_disks)
      v.push_back({d.version, d.newest_cut, d.error});
    return v;
  }
  // The job's last cut, at each shard's version as the run ended; the outcome once it is
  // committed, abandoned, or 60 s passed (as job_checkpoints::final_cut).
  void final_cut_tick() {
    cut_act(pacer->on_status(cut_views(), now_s()));
    if (pacer->in_flight() && now() < end_began + 60 * sec)
      return after(10 * ms, [this] { final_cut_tick(); });
    check_cuts();
    // Where every disk had room while it was written, the last cut went in.
    if (!disk_full_at_end && pacer->last_committed() != final_cut)
      violate("the job's last cut " + std::to_string(final_cut) + " was not committed, though every disk had room"
              + (last_abandon.empty() ? std::string{} : " (abandoned: " + last_abandon + ")"));
    if (life)
      act(life->on_run_ended(end_error, applied + 1e-6 >= static_cast<double>(budget)));
  }

  // A committed cut is one version of the model: every shard's record of it at the version
  // the cut was asked at (lockstep), holding what the shard had then.
  void check_cut_versions(uint64_t cut) {
    std::optional<uint64_t> v;
    for (auto& d : shard_disks) {
      auto rec = d.log->load(cut);
      if (!rec)
        return violate("committed cut " + std::to_string(cut) + ": shard " + std::to_string(d.id)
                       + "'s record: " + describe(rec.error()));
      const uint64_t at = cut_version[cut];
      if ((at != 0 && rec->version != at) || (v && *v != rec->version))
        return violate("committed cut " + std::to_string(cut) + " mixes versions: shard " + std::to_string(d.id)
                       + " wrote version " + std::to_string(rec->version) + " (asked at "
                       + std::to_string(at) + ", another shard wrote " + std::to_string(v.value_or(at)) + ")");
      for (float x : rec->params)
        if (x != static_cast<float>(rec->version))
          return violate("committed cut " + std::to_string(cut) + ": shard " + std::to_string(d.id)
                         + " wrote parameters of another version than " + std::to_string(rec->version));
      v = rec->version;
    }
  }
  // Nothing committed is lost: the newest cut the job's record names is intact on every
  // shard, and a resume starts from it.
  void check_cuts() {
    if (!pacer)
      return;
    auto records = load_job_cuts(*job_disk);
    if (!records)
      return violate("the job's record does not load: " + describe(records.error()));
    std::vector<uint64_t> committed;
    for (const auto& r : *records)
      committed.push_back(r.cut);
    const uint64_t newest = committed.empty() ? 0 : *std::max_element(committed.begin(), committed.end());
    std::vector<shard_cuts> held;
    for (auto& d : shard_disks) {
      auto intact = d.log->intact_cuts();
      if (!intact)
        return violate("shard " + std::to_string(d.id) + "'s cuts do not load: " + describe(intact.error()));
      held.push_back({d.id, *intact});
    }
    auto choice = choose_cut(committed, held, "the job's checkpoints");
    if (!choice)
      return violate("a resume would fail: " + describe(choice.error()));
    if (choice->cut != newest)
      return violate("a resume would start from cut " + std::to_string(choice->cut) + ", not the newest committed, "
                     + std::to_string(newest) + " (" + choice->passed_over + ")");
  }

  // ---- invariants --------------------------------------------------------------------------
  // 1.05x the job's samples, or one batch past them where a batch is more than 5% of the
  // job (a plan's last step is a whole step).
  double over_bound() const {
    return static_cast<double>(budget) + std::max(static_cast<double>(budget) / 20, static_cast<double>(batch));
  }
  void check_bounds() {
    if (budget > 0 && applied > over_bound())
      violate("trained " + std::to_string(applied) + " samples, over 1.05x the job's " + std::to_string(budget));
  }

  void check_after_event() {
    // every member the scheduler counts exists, or its loss is still within detection
    for (const auto& [n, since] : fault_at) {
      if (now() <= since + heartbeat_timeout + 100 * ms)
        continue;
      for (auto id : by_proc[n])
        if (table[id].live && (!nodes[n].up || nodes[n].frozen || nodes[n].cut))
          violate("the scheduler still counts worker " + std::to_string(id) + " of a node lost "
                  + std::to_string(static_cast<double>(now() - since) * 1e-9) + " s ago");
    }
    const uint32_t k = held();
    if (job_workers > 0 && k > job_workers)
      violate("the scheduler holds " + std::to_string(k) + " workers for a job of " + std::to_string(job_workers));

  }
  std::map<size_t, uint64_t> fault_at;

  // The launch's end: every process it started exited, soon after the job; its exit code
  // is the job's outcome (0: trained or stopped; 1: failed), 130 after a Ctrl-C, or the
  // code of the member that failed the start; no member lost once the job ran failed it.
  void check_launch() {
    if (launch->state() != control::launch_supervisor::phase::ended) {
      std::string left;
      for (size_t i = 0; i < launch_members; ++i)
        if (!launch_exited[i])
          left += " " + std::to_string(i);
      return violate("the launch did not end: its processes" + left + " still run");
    }
    const auto bound = 3 * control::launch_timing{}.term_ns + sec;
    if (job_over_at > 0 && now() > job_over_at + bound)
      violate("the launch ended " + std::to_string(static_cast<double>(now() - job_over_at) * 1e-9)
              + " s after its job, past " + std::to_string(bound / sec) + " s");
    const int code = launch->exit_code();
    res.launch_code = code;
    res.launch_path = !launch_failed_start.empty() ? "failed start"
                      : launch_interrupted         ? "interrupted"
                      : lost_after_start           ? "lost member"
                                                   : "plain";
    const bool failed = res.outcome.rfind("failed", 0) == 0;
    if (!launch_failed_start.empty()) {
      if (launch->failure().rfind(launch_failed_start + " exited", 0) != 0 || code == 0)
        violate("the launch's start failed by " + launch_failed_start + ", but it ended with code "
                + std::to_string(code) + " naming '" + launch->failure() + "'");
      if (res.outcome == "trained")
        violate("a member exited before the job had its members, yet the job trained");
    } else if (launch_interrupted) {
      if (code != 130)
        violate("the launch was interrupted, but it ended with code " + std::to_string(code));
    } else if (!launch->failure().empty()) {
      violate("a member lost once the job ran failed the launch: " + launch->failure());
    } else if (code != (failed ? 1 : 0)) {
      violate("the job ended '" + res.outcome + "', but the launch with code " + std::to_string(code));
    }
  }

  // A stop request reaches the scheduler (`ashlar ctl stop-job`, or a signal to its
  // process): the job stops, and the first cause of an early end is that stop.
  void request_stop(const std::string& what, const std::string& reason) {
    if (job_over)
      return;
    note(what);
    if (true_cause.empty() && life && life->state() == control::job_lifecycle::phase::waiting)
      true_cause = "stopped while waiting for the job's nodes";
    else if (true_cause.empty() && applied + 1e-6 < static_cast<double>(budget))
      true_cause = "stopped: " + reason;
    if (life)
      act(life->on_stop(reason));
  }

  // ---- ashlar launch: the real launch_supervisor over the scheduler's process (node 0) and
  // the worker nodes' first processes; their exits, the scheduler's job state and a Ctrl-C
  // in as events, its signals out to the simulated processes (as cmd_launch.cpp's glue).
  std::optional<control::launch_supervisor> launch;
  size_t launch_members = 0;
  std::vector<bool> launch_exited;
  bool launch_interrupted = false;
  std::string launch_failed_start; // a member that exited before the job had its members
  uint64_t job_over_at = 0;

  bool launched(size_t n) const { return launch && n < launch_members && nodes[n].life == 0; }
  void launch_exit(size_t n, int code, const std::string& last) {
    if (!launched(n) || launch_exited[n])
      return;
    launch_exited[n] = true;
    note("[launch] process " + std::to_string(n) + " exited with " + control::describe_exit(code));
    if (n != 0 && code != 0 && launch->state() == control::launch_supervisor::phase::starting
        && launch_failed_start.empty())
      launch_failed_start = "node " + std::to_string(n);
    if (n != 0 && code != 0 && launch->state() == control::launch_supervisor::phase::running) {
      lost_after_start = true;
      if (opt.launch_stops_on_lost_member && !job_over && life) { // the old launcher's rule
        note("[launch] node " + std::to_string(n) + " exited before the job ended; stopping the job");
        act(life->on_stop("stopped on request"));
      }
    }
    launch_act(launch->on_exit(n, code, last));
  }
  void launch_act(const std::vector<control::launch_action>& acts) {
    for (const auto& a : acts) {
      if (a.kind == control::launch_action::say)
        note("[launch] " + a.text);
      if (a.kind != control::launch_action::signal)
        continue;
      for (size_t i = 0; i < launch_members; ++i)
        if ((a.member < 0 || static_cast<size_t>(a.member) == i) && !launch_exited[i])
          launch_signal(i, a.sig);
    }
    if (auto d = launch->deadline())
      at(std::max(*d, now()), [this] { launch_act(launch->on_time()); });
  }
  // A signal from the launcher reaches process `n` (a little later).
  void launch_signal(size_t n, int sig) {
    after(latency(), [this, n, sig] {
      if (launch_exited[n])
        return;
      if (n == 0) {
        if (sig == SIGKILL) {
          if (!job_over)
            violate("the launch killed the scheduler before its job ended (it was asked to stop "
                    + std::to_string(control::launch_timing{}.job_stop_ns / sec) + " s before)");
          return launch_exit(0, 128 + SIGKILL, "");
        }
        return request_stop("the scheduler's process gets " + std::string{sig == SIGINT ? "SIGINT" : "SIGTERM"},
                            "stopped by a signal to the scheduler (ashlar launch)");
      }
      auto& nd = nodes[n];
      if (!nd.up)
        return;
      if (sig == SIGKILL)
        return crash(n);
      if (!nd.lifecycle) { // a node not yet joined exits on a signal at once
        nd.up = false;
        return launch_exit(n, 128 + sig, "");
      }
      node_act(n, nd.lifecycle->on_signal(sig == SIGINT ? "SIGINT" : "SIGTERM"));
    });
  }
  // The job ended: the scheduler (--exit-after-job) tells its nodes to shut down, then exits
  // with the job's outcome (1 for a failed job, as finish_run). The job's own traffic stops.
  void scheduler_exits() {
    job_over_at = now();
    q = decltype(q){};
    for (auto& [id, wk] : workers)
      wk.alive = false;
    for (size_t n = 1; n < nodes.size(); ++n)
      if (nodes[n].up && nodes[n].lifecycle && !nodes[n].frozen && !nodes[n].cut)
        after(latency(), [this, n] {
          if (nodes[n].up && nodes[n].lifecycle)
            node_act(n, nodes[n].lifecycle->on_shutdown());
        });
    const int code = res.outcome.rfind("failed", 0) == 0 ? 1 : 0;
    after(5 * ms, [this, code] { launch_exit(0, code, res.outcome); });
  }
  bool lost_after_start = false;

  // ---- faults ------------------------------------------------------------------------------
  void crash(size_t n) {
    auto& nd = nodes[n];
    if (!nd.up)
      return;
    nd.up = false;
    // Behind a partition or frozen, its connection's end is only seen at the heartbeat
    // timeout; otherwise the connection drops at once.
    const uint64_t seen = nd.cut || nd.frozen ? std::max(now() + latency(), fault_at[n] + heartbeat_timeout)
                                              : now() + latency();
    if (!(nd.cut || nd.frozen))
      fault_at[n] = now();
    note("node process " + std::to_string(n) + " crashes");
    for (auto& [id, w] : workers)
      if (w.node == n)
        w.alive = false;
    const uint32_t id = nd.id;
    if (!job_over)
      at(seen, [this, n, id] { node_down(n, id); });
    launch_exit(n, 128 + SIGKILL, "");
  }
  void restart(size_t n) {
    auto& nd = nodes[n];
    if (nd.up)
      return;
    nd = node_state{0, true, false, false, nd.slots, false, nd.life + 1, nullptr};
    fault_at.erase(n);
    note("node process " + std::to_string(n) + " restarts");
    after(latency(), [this, n] { node_hello(n); });
  }
  void isolate(size_t n, bool freeze, uint64_t how_long) {
    auto& nd = nodes[n];
    if (!nd.up || nd.frozen || nd.cut)
      return;
    (freeze ? nd.frozen : nd.cut) = true;
    fault_at[n] = now();
    note(std::string{"node process "} + std::to_string(n) + (freeze ? " frozen" : " cut off"));
    const uint32_t id = nd.id, life = nd.life;
    if (how_long > heartbeat_timeout)
      after(heartbeat_timeout, [this, n, id] { node_down(n, id); });
    after(how_long, [this, n, freeze, id, life] {
      auto& nd = nodes[n];
      if (!nd.up || nd.life != life)
        return; // it crashed meanwhile: its restart joins
      (freeze ? nd.frozen : nd.cut) = false;
      fault_at.erase(n);
      note(std::string{"node process "} + std::to_string(n) + (freeze ? " thawed" : " reachable again"));
      if (id != 0 && nd.id != id && nd.lifecycle) // it was dropped: it finds its connection closed
        node_act(n, nd.lifecycle->on_scheduler_down("its connection closed"));
    });
  }

  // A draining node's workers have all left: its lifecycle hears so.
  void drain_poll(size_t n, uint32_t run) {
    after(50 * ms, [this, n, run] {
      auto& nd = nodes[n];
      if (nd.life != run || !nd.up || !nd.lifecycle)
        return;
      for (const auto& [wid, w] : workers)
        if (w.node == n && w.alive)
          return drain_poll(n, run);
      node_act(n, nd.lifecycle->on_drained());
    });
  }
  // The node's side: its lifecycle's actions on this world.
  void node_act(size_t n, const std::vector<control::node_action>& acts) {
    auto& nd = nodes[n];
    auto life = nd.lifecycle;
    if (!life)
      return;
    const bool reachable = nd.up && !nd.frozen && !nd.cut;
    for (const auto& a : acts) {
      switch (a.kind) {
        case control::node_action::stop_hosted:
          for (auto& [wid, w] : workers)
            if (w.node == n)
              w.alive = false;
          break;
        case control::node_action::probe:
          node_act(n, life->on_probe(reachable ? control::node_lifecycle::answer::admitted
                                               : control::node_lifecycle::answer::failed,
                                     "connection refused"));
          break;
        case control::node_action::rejoin:
          if (reachable && nd.id == 0)
            node_hello(n);
          node_act(n, life->on_rejoin(nd.id != 0 ? control::node_lifecycle::answer::admitted
                                                 : control::node_lifecycle::answer::failed,
                                      nd.id != 0 ? "node " + std::to_string(nd.id) : "timed out"));
          break;
        case control::node_action::exit:
          note("node process " + std::to_string(n) + " exits: " + a.text);
          nd.up = false;
          for (auto& [wid, w] : workers)
            if (w.node == n)
              w.alive = false;
          launch_exit(n, a.code, a.text);
          break;
        case control::node_action::drain: // its workers finish their step and leave
          note("node process " + std::to_string(n) + " drains: " + a.text);
          for (auto& [wid, w] : workers)
            if (w.node == n && w.alive)
              stop_worker_direct(wid);
          drain_poll(n, nd.life);
          break;
        default:
          if (!a.text.empty())
            note("node process " + std::to_string(n) + ": " + a.text);
          break;
      }
    }
    if (auto d = life->deadline()) {
      const uint32_t run = nodes[n].life;
      at(std::max(*d, now()), [this, n, run] {
        if (nodes[n].life == run && nodes[n].lifecycle)
          node_act(n, nodes[n].lifecycle->on_time());
      });
    }
  }
};

}  // namespace

namespace {
std::string fmt_num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}
}  // namespace

sim_result run(const sim_options& opt) {
  // The workers' step machines log as a worker does; a run of thousands of them says only
  // what goes wrong.
  struct quiet {
    spdlog::level::level_enum was = spdlog::get_level();
    quiet() { spdlog::set_level(spdlog::level::warn); }
    ~quiet() { spdlog::set_level(was); }
  } keep_quiet;
  world w;
  w.opt = opt;
  w.rng.seed(opt.seed * 0x9E3779B97F4A7C15ull + 1);
  auto& rng = w.rng;
  std::mt19937_64 side_rng(opt.seed * 0xD1B54A32D192ED03ull + 7); // draws that leave rng's sequence as it was
  auto side = [&side_rng] { return side_rng(); };
  const bool scale = opt.workers > 0;
  // The job.
  const uint32_t worker_nodes = scale ? std::max<uint32_t>(1, opt.nodes) : 1 + static_cast<uint32_t>(rng() % 6);
  const uint32_t slots = scale ? (opt.workers + worker_nodes - 1) / worker_nodes : 1 + static_cast<uint32_t>(rng() % 4);
  w.job_workers = scale ? opt.workers : std::max<uint32_t>(1, worker_nodes * slots - static_cast<uint32_t>(rng() % 2));
  // Scale runs: parts of 40 batches, or (odd seeds) of a little less than a batch, as the
  // real storm's (60,000 samples over 1,024 workers at batch 64): losses grow them past a
  // batch, and a step on the new part trains half what one on the old part did.
  const uint64_t scale_steps = opt.seed % 2 ? 1 : 40;
  w.epochs = scale ? std::max<uint32_t>(1, static_cast<uint32_t>(opt.minutes * 60 / static_cast<double>(scale_steps) * 1.2))
                   : 1 + static_cast<uint32_t>(rng() % 3);
  if (scale)
    w.sample_ns = sec / batch; // a step a second: the storm's minutes are rounds, not samples
  // Parts of whole batches, of a batch and a remnant, or of less than a batch (a large job
  // on a small set: its passes are one step, and grow to two as members are lost).
  const uint64_t per_worker = scale ? (scale_steps == 1 ? uint64_t{batch} - 2 : uint64_t{batch} * 40)
                                    : std::max<uint64_t>(1, uint64_t{batch} * (rng() % 3 == 0 ? rng() % 3 : 20 + rng() % 40)
                                                              + (rng() % 2 ? rng() % batch : 0));
  w.train_size = uint64_t{w.job_workers} * per_worker;
  w.data = make_synthetic(w.train_size, 1, 2, opt.seed);
  w.budget = w.train_size * w.epochs;
  w.nodes.resize(1 + worker_nodes);
  w.nodes[0].slots = 0;
  w.nodes[0].stable = true;
  for (size_t n = 1; n < w.nodes.size(); ++n)
    w.nodes[n].slots = slots;
  w.nodes[1].stable = true; // a node the schedule never faults: somebody is left to train
  // The schedule.
  enum kind { crash, freeze, partition, join, huge, raise, stop, shutdown_waiting, never_join };
  std::vector<kind> draws;
  if (!scale) {
    const int n = static_cast<int>(rng() % 5);
    for (int i = 0; i < n; ++i)
      draws.push_back(static_cast<kind>(rng() % 9));
  }
  bool shutdown_wait = false, never = false;
  for (auto k : draws) {
    shutdown_wait = shutdown_wait || k == shutdown_waiting;
    never = never || k == never_join;
  }
  w.clock.advance(0);
  w.life.emplace(w.clock, control::job_needs{1, w.job_workers}, w.wait_ns);
  // Nodes join over the first second (unless they never come).
  w.at(w.now() + w.latency(), [&w] { w.node_hello(0); });
  for (size_t n = 1; n < w.nodes.size(); ++n) {
    if ((never || shutdown_wait) && n > 1)
      continue;
    w.at(w.now() + (rng() % 1000) * ms, [&w, n] { w.node_hello(n); });
  }
  const uint64_t est = static_cast<uint64_t>(static_cast<double>(w.budget / w.job_workers) * 0.5 * ms * 1.5) + sec;
  if (shutdown_wait)
    w.at(w.now() + 5 * sec, [&w] {
      if (w.job_over)
        return;
      w.note("ashlar ctl shutdown");
      if (w.true_cause.empty() && w.life && w.life->state() == control::job_lifecycle::phase::waiting)
        w.true_cause = "stopped while waiting for the job's nodes";
      else if (w.true_cause.empty() && w.applied + 1e-6 < static_cast<double>(w.budget))
        w.true_cause = "stopped: the cluster was shut down";
      if (w.life)
        w.act(w.life->on_stop("the cluster was shut down by ashlar ctl shutdown"));
    });
  // Checkpoint cuts every few rounds; in some schedules a disk fills for a while (a shard's,
  // or the job's store): drawn apart, so the other draws stay as they were.
  auto& disk_rng = w.disk_rng;
  disk_rng.seed(opt.seed * 0x94D049BB133111EBull + 13);
  w.setup_checkpoints(2 + disk_rng() % 6);
  if (disk_rng() % 3 == 0) {
    const uint64_t which = disk_rng() % 3;
    const std::string what = which == 2 ? std::string{"the job's store"} : "shard " + std::to_string(which);
    const uint64_t t = w.now() + sec + disk_rng() % std::max<uint64_t>(1, est);
    const uint64_t d = 100 * ms + disk_rng() % std::max<uint64_t>(1, est / 2);
    w.at(t, [&w, what] { w.fill_disk(what, true); });
    w.at(t + d, [&w, what] { w.fill_disk(what, false); });
  }
  // `ashlar launch` started the scheduler and the first worker nodes' processes: the launch's
  // own faults (a member that exits before the job has its members, a Ctrl-C to the
  // launcher, a shutdown of the cluster while the job trains) are drawn apart, so the other
  // draws stay as they were.
  const bool legacy = opt.legacy_handover || opt.uncorrected_directives || opt.uncommitted_cut_kept || opt.stale_cut_error
                      || opt.launch_stops_on_lost_member;
  if (!scale) {
    std::vector<control::launch_member> lm{{control::launch_member::scheduler, "the scheduler", false}};
    for (size_t n = 1; n <= worker_nodes; ++n)
      lm.push_back({control::launch_member::worker, "node " + std::to_string(n), false});
    w.launch_members = lm.size();
    w.launch_exited.assign(lm.size(), false);
    w.launch.emplace(w.clock, std::move(lm));
    std::mt19937_64 launch_rng(opt.seed * 0xA24BAED4963EE407ull + 29);
    const uint64_t fault = legacy || !opt.launch_faults ? 0 : 1 + launch_rng() % 6;
    if (fault == 1 && worker_nodes >= 2) { // a worker node's process fails before it joins
      const size_t n = 2 + launch_rng() % (worker_nodes - 1);
      w.at(w.now(), [&w, n] {
        w.nodes[n].up = false;
        w.note("node process " + std::to_string(n) + " exits with code 1 before it joins");
        w.launch_exit(n, 1, "cannot read the data set");
      });
    } else if (fault == 3) { // ashlar ctl shutdown while the job trains: the job stops first, then the nodes
      const uint64_t t = w.now() + sec + launch_rng() % std::max<uint64_t>(1, est);
      w.at(t, [&w] {
        if (w.life && w.life->state() == control::job_lifecycle::phase::running)
          w.request_stop("ashlar ctl shutdown (the job trains)", "the cluster was shut down by ashlar ctl shutdown");
      });
    } else if (fault == 2) { // Ctrl-C to the launcher, at any time of the job
      const uint64_t t = w.now() + launch_rng() % std::max<uint64_t>(1, 2 * est);
      w.at(t, [&w] {
        if (w.launch->state() == control::launch_supervisor::phase::ended)
          return;
        w.note("[launch] SIGINT (Ctrl-C)");
        w.launch_interrupted = true;
        w.launch_act(w.launch->on_stop_signal(SIGINT));
      });
    }
  }
  w.act(w.life->on_capacity(w.members.free()));
  w.at(w.now() + w.wait_ns, [&w] {
    if (w.true_cause.empty() && w.life && w.life->state() == control::job_lifecycle::phase::waiting)
      w.true_cause = "the job's nodes did not join in time";
    if (w.life)
      w.act(w.life->on_time());
  });
  for (auto k : draws) {
    const uint64_t t = w.now() + sec + rng() % std::max<uint64_t>(1, est);
    const size_t n = 2 + rng() % std::max<size_t>(1, w.nodes.size() - 2);
    const bool has_victim = w.nodes.size() > 2;
    switch (k) {
      case crash:
        if (has_victim) {
          w.at(t, [&w, n] { w.crash(n); });
          w.at(t + (1 + rng() % 10) * sec, [&w, n] { w.restart(n); });
        }
        break;
      case freeze:
      case partition:
        if (has_victim) {
          const uint64_t d = (rng() % 2 == 0 ? 1 : 6) * sec;
          w.at(t, [&w, n, k, d] { w.isolate(n, k == freeze, d); });
        }
        break;
      case join: {
        w.nodes.push_back(node_state{0, true, false, false, 1 + static_cast<uint32_t>(rng() % 3), false, 0, nullptr});
        const size_t m = w.nodes.size() - 1;
        // Some joining nodes never get their welcome, and some of those die before the
        // scheduler gives up on them; some die as their workers register (drawn apart, so
        // the other draws stay as they were).
        const uint64_t fate = side() % 4;
        w.nodes[m].welcome_lost = fate >= 2;
        w.at(t, [&w, m] { w.node_hello(m); });
        if (fate == 3)
          w.at(t + (1 + side() % 5) * sec, [&w, m] { w.crash(m); });
        if (fate == 1) // killed as its workers register, before the plan that admits them
          w.at(t + side() % (8 * ms), [&w, m] { w.crash(m); });
        break;
      }
      case huge: {
        w.nodes.push_back(node_state{0, true, false, false, 100000, false, 0, nullptr});
        const size_t m = w.nodes.size() - 1;
        w.at(t, [&w, m] { w.node_hello(m); });
        break;
      }
      case raise:
        w.raise_worker = static_cast<uint32_t>(rng() % w.job_workers);
        w.raise_step = 1 + rng() % 5;
        break;
      case stop:
        w.at(t, [&w] { w.request_stop("ashlar ctl stop-job", "stopped by ashlar ctl stop-job"); });
        break;
      default:
        break;
    }
  }
  if (scale) {
    // Every period (a simulated minute) 10% of the nodes (or `churn`) crash, and as many new
    // ones join (after `join_delay_s`: a node process takes a while to start).
    const uint64_t period = static_cast<uint64_t>(opt.period_s * 1e9);
    const uint32_t churn = opt.churn > 0 ? opt.churn : std::max<uint32_t>(1, worker_nodes / 10);
    const uint64_t join_delay = static_cast<uint64_t>(opt.join_delay_s * 1e9);
    for (uint64_t t = period / 2; t < static_cast<uint64_t>(opt.minutes * 60) * sec; t += period) {
      w.at(w.now() + t, [&w, churn, join_delay] {
        std::vector<size_t> up;
        for (size_t n = 2; n < w.nodes.size(); ++n)
          if (w.nodes[n].up && w.nodes[n].id != 0)
            up.push_back(n);
        std::shuffle(up.begin(), up.end(), w.rng);
        for (uint32_t i = 0; i < churn && i < up.size(); ++i)
          w.crash(up[i]);
        for (uint32_t i = 0; i < churn; ++i) {
          w.nodes.push_back(node_state{0, true, false, false, w.nodes[1].slots, false, 0, nullptr});
          const size_t m = w.nodes.size() - 1;
          w.after(join_delay + w.latency() + i * ms, [&w, m] { w.node_hello(m); });
        }
      });
    }
  }
  // Run until the job ends, or past any bound it should have ended within.
  const uint64_t limit = w.now() + w.wait_ns + 30 * est + 600 * sec;
  while (!w.q.empty() && w.res.ok) {
    auto e = w.q.top();
    w.q.pop();
    if (e.t > limit)
      break;
    if (e.t > w.now())
      w.clock.advance(e.t - w.now());
    e.fn();
    ++w.res.events;
    if (!w.job_over)
      w.check_after_event();
    if (w.job_over && w.res.ok && (!w.launch || w.launch->state() == control::launch_supervisor::phase::ended))
      break;
  }
  auto& r = w.res;
  r.epochs = w.epochs;
  r.trained_epochs = w.train_size ? static_cast<double>(w.applied) / static_cast<double>(w.train_size) : 0;
  // A stop that came as the last round was applied finds the job trained.
  if (w.true_cause.rfind("stopped: ", 0) == 0 && w.applied + 1e-6 >= static_cast<double>(w.budget))
    w.true_cause.clear();
  r.expected = w.true_cause.empty() ? "trained" : w.true_cause;
  if (!w.job_over && opt.verbose)
    for (const auto& [id, m] : w.table) {
      const auto& wk = w.workers[id];
      w.note("member " + std::to_string(id) + (m.live ? " live" : " gone") + " steps " + std::to_string(m.steps)
             + " done " + std::to_string(m.done) + "; worker " + (wk.alive ? "alive" : "ended") + " steps "
             + std::to_string(wk.machine ? wk.machine->job().steps : 0) + " done "
             + std::to_string(wk.machine ? wk.machine->steps_done() : 0) + (wk.computing ? " computing" : "")
             + (w.pushes.count(id) ? " (push in)" : ""));
    }
  if (r.ok && !w.job_over)
    w.violate("the job did not end within " + std::to_string((limit - 1000000000ull) / sec) + " simulated s");
  if (r.ok && w.launch)
    w.check_launch();
  if (r.ok) {
    // one true outcome: the first cause that happened, named
    const bool match = r.expected == "trained" ? r.outcome == "trained" : r.outcome.rfind(r.expected, 0) == 0;
    if (!match)
      w.violate("the job ended '" + r.outcome + "', but what happened was '" + r.expected + "'");
    if (r.outcome == "trained" && w.budget > 0) {
      // (less what finished members were given too late, when nobody was left: a step each)
      const double x = static_cast<double>(w.applied + w.short_samples) / static_cast<double>(w.budget);
      if (w.short_samples > uint64_t{batch} * w.job_workers)
        w.violate("members that had finished left " + std::to_string(w.short_samples) + " samples untrained");
      // (a step trains a fraction of samples on average: sums in double)
      if (x < 1.0 - 1e-9 || static_cast<double>(w.applied + w.short_samples) > w.over_bound())
        w.violate("the job trained " + std::to_string(x) + "x its epochs' samples (1.00-1.05x)");
    }
  }
  r.replay = "ashlar-sim --seed " + std::to_string(opt.seed) + (opt.workers ? " --workers " + std::to_string(opt.workers)
             + " --nodes " + std::to_string(opt.nodes) + " --minutes " + fmt_num(opt.minutes)
             + (opt.period_s != 60 ? " --period " + fmt_num(opt.period_s) : std::string{})
             + (opt.churn > 0 ? " --churn " + std::to_string(opt.churn) : std::string{})
             + (opt.join_delay_s > 0 ? " --join-delay " + fmt_num(opt.join_delay_s) : std::string{}) : std::string{}) + (opt.legacy_handover ? " --legacy-handover" : "")
             + (opt.uncorrected_directives ? " --uncorrected-directives" : "")
             + (opt.uncommitted_cut_kept ? " --uncommitted-cut-kept" : "")
             + (opt.stale_cut_error ? " --stale-cut-error" : "")
             + (opt.launch_stops_on_lost_member ? " --launch-stops-on-lost-member" : "")
             + (!opt.launch_faults ? " --no-launch-faults" : "")
             + " --verbose";
  return r;
}

}  // namespace ashlar::sim
