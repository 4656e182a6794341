// The typed interfaces of Ashlar's actors, their atoms, and the glue that makes the
// wire structs CAF message types: inside one actor_system they are passed as they are,
// between nodes CAF serializes them as Cap'n Proto bytes (runtime/wire/codec.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>

#include "runtime/wire/codec.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar::actors {

using start_atom = caf::atom_constant<caf::atom("start")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using job_atom = caf::atom_constant<caf::atom("job")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using paced_atom = caf::atom_constant<caf::atom("paced")>;
using local_steps_atom = caf::atom_constant<caf::atom("localsteps")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using tune_atom = caf::atom_constant<caf::atom("tune")>;
using batch_atom = caf::atom_constant<caf::atom("batch")>;
using stage_atom = caf::atom_constant<caf::atom("stage")>;
using bound_atom = caf::atom_constant<caf::atom("bound")>;
using ring_atom = caf::atom_constant<caf::atom("ring")>;
using checkpoint_atom = caf::atom_constant<caf::atom("checkpt")>;
using shard_atom = caf::atom_constant<caf::atom("shard")>;
using lr_atom = caf::atom_constant<caf::atom("lrfactor")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using wait_atom = caf::atom_constant<caf::atom("wait")>;
using replan_atom = caf::atom_constant<caf::atom("replan")>;
/// The scheduler's liveness ping of a node (runtime/control/node_watch.hpp).
using ping_atom = caf::atom_constant<caf::atom("ping")>;
/// A node got its welcome (its id): the scheduler starts workers on it and counts its slots
/// from then on.
using welcomed_atom = caf::atom_constant<caf::atom("welcomed")>;

/// One server shard: serves pulls (held back while its policy says wait), takes pushes,
/// follows membership changes (answering with the pushes of that worker it took: a lost
/// lockstep worker's steps that count), reports its status. tune_atom: gradients per update and
/// async or not, for policies that adapt (see sync_policy::tune). bound_atom (a stage's
/// settings): its learning-rate factor (second argument) and the clocks a
/// worker may run ahead of the slowest from now on (see sync_policy::set_staleness_bound).
/// Checkpoints (if the shard keeps them): (checkpoint_atom, cut, at_version, committed)
/// writes checkpoint cut `cut` of the job in the background, at the current version or
/// once the shard reaches `at_version` (answers the current version; its status shows the
/// newest cut on disk), and keeps cut `committed`, the job's last committed one, whatever
/// its store's number of cuts to keep; (checkpoint_atom, get_atom) answers the cuts its
/// store holds intact; (restore_atom, cut) restores one (answers its version) and keeps
/// it as the committed cut; (checkpoint_atom) writes the
/// current version as the shard's stop record and answers once it is on disk. lr_atom:
/// the learning-rate schedule's factor from now on (train.lr_schedule; the job driver
/// follows the epochs).
using shard_actor = caf::typed_actor<
  caf::replies_to<wire::pull_request>::with<wire::pull_reply>,
  caf::replies_to<wire::push>::with<wire::push_ack>,
  caf::replies_to<wire::membership_change>::with<uint64_t>,
  caf::replies_to<status_atom>::with<wire::shard_status>,
  caf::reacts_to<tune_atom, uint32_t, bool>,
  caf::reacts_to<bound_atom, uint64_t, float>,
  caf::reacts_to<lr_atom, float>,
  caf::replies_to<checkpoint_atom, uint64_t, uint64_t, uint64_t>::with<uint64_t>,
  caf::replies_to<checkpoint_atom, caf::get_atom>::with<std::vector<uint64_t>>,
  caf::replies_to<restore_atom, uint64_t>::with<uint64_t>,
  caf::replies_to<restore_atom, std::vector<float>>::with<uint64_t>,
  caf::replies_to<checkpoint_atom>::with<uint64_t>>;

/// The profiler: takes per-step timing reports, answers with per-worker statistics.
/// A membership change comes from the scheduler with the worker's actor: a worker's
/// reports are taken from that actor only.
using profiler_actor = caf::typed_actor<
  caf::reacts_to<wire::profile_report>,
  caf::replies_to<wire::membership_change, caf::actor_addr>::with<caf::ok_atom>,
  caf::replies_to<caf::get_atom>::with<wire::cluster_stats>>;

/// The scheduler: registers workers (assigning shard map, data share and batch share),
/// learns when they leave, and tells its observer when every worker is done.
/// start_atom: start training with the workers registered so far, without waiting for
/// the rest (sent by the scheduler to itself when start_timeout passes). lr_atom: the
/// learning-rate schedule's factor, passed on to every worker (and to those that join).
using scheduler_actor = caf::typed_actor<
  caf::replies_to<wire::register_worker>::with<wire::assignment, std::vector<shard_actor>>,
  caf::reacts_to<wire::membership_change>, caf::reacts_to<start_atom>, caf::reacts_to<tick_atom>,
  caf::reacts_to<replan_atom>, // (to itself) a membership plan may follow the last
  caf::reacts_to<wait_atom>,   // (to itself) the stall watch's look (runtime/control/stall_watch.hpp)
  caf::reacts_to<lr_atom, float>,
  caf::replies_to<wire::ctl_request>::with<std::string>,
  caf::reacts_to<shard_atom, uint32_t, shard_actor, std::string>,
  // The cluster lost the node of this name: every live member it hosted is lost with it,
  // whether or not each worker's own loss is ever reported.
  caf::reacts_to<nodes_atom, std::string>>;

/// A worker: registers on start, then loops pull -> compute -> push until its steps are done.
/// stop_atom: finish the current step, leave, and quit (on a ring: after the next
/// all-reduce, in which the worker votes to leave; the others wait for a new ring).
/// paced_atom: the emulated compute time of the step of this generation is over (pacing;
/// a step abandoned for a lost shard has an older generation).
/// local_steps_atom: from now on, commit every H steps (H >= 1; see wire::assignment).
/// batch_atom: from step S on (S, the second argument), take this many samples per step
/// from the part [begin, begin + count) of the training set (the third and fourth)
/// (allocation; lockstep workers switch at the same round), and, when the fifth is not
/// 0, train that many steps in all (a lost member's rounds handed over).
/// stage_atom: a training stage begins (ASHL: "profiling", "ahl", "shl") with H local
/// steps per commit, a learning-rate factor for local steps and the pull compression
/// (the fraction of each range a delta read carries, 0: dense pulls); the worker changes
/// behaviour at its next step boundary.
/// ring_atom (decentralized mode): the ring's generation (a ring re-formed after a member
/// was lost is the next one), this worker's rank, the ring's size, the next worker on the
/// ring (a worker_actor) and the data-plane endpoint that takes its chunks ("": CAF's path
/// only); wire::ring_message: a chunk from the previous one. (ring_atom, next, stand-in):
/// the data-plane stand-in for the next worker is connected (the next worker itself if it
/// could not be; made on a thread of its own). (ring_atom, why): a ring connection to or
/// from this worker broke with the peer alive, so chunks may be lost: the worker fails,
/// and the others form a ring without it.
/// (shard_atom, index, shard, data endpoint): shard `index` was lost and is served again
/// by `shard` (restored from its checkpoints); (shard_atom, generation): the wait for a
/// lost shard is over (sent by the worker to itself); (shard_atom, index, stand-in): the
/// data-plane stand-in for shard `index` is connected (made on a thread of its own, so the
/// worker's thread is never held while a connection is made). lr_atom: the learning-rate
/// schedule's factor for the steps the worker applies itself (local steps, the ring).
using worker_actor = caf::typed_actor<caf::reacts_to<start_atom>, caf::reacts_to<step_atom>,
                                      caf::reacts_to<stop_atom>, caf::reacts_to<paced_atom, uint64_t>,
                                      caf::reacts_to<local_steps_atom, uint32_t>,
                                      caf::reacts_to<batch_atom, uint32_t, uint64_t, uint64_t, uint64_t, uint64_t>,
                                      caf::reacts_to<stage_atom, std::string, uint32_t, float, float>,
                                      caf::reacts_to<ring_atom, uint32_t, uint32_t, uint32_t, caf::actor, std::string>,
                                      caf::reacts_to<ring_atom, caf::actor, caf::actor>,
                                      caf::reacts_to<ring_atom, std::string>,
                                      caf::reacts_to<wire::ring_message>,
                                      caf::reacts_to<shard_atom, uint32_t, shard_actor, std::string>,
                                      caf::reacts_to<shard_atom, uint64_t>,
                                      caf::reacts_to<shard_atom, uint32_t, shard_actor>,
                                      caf::reacts_to<lr_atom, float>, caf::reacts_to<tick_atom>>;

/// The actor every node process runs: it hosts shards and workers on the scheduler's
/// request and carries out control requests (remove a worker, shut down). stop_atom (local
/// to the node's process, after losing its scheduler): stops every shard and worker it
/// hosts at once and replies, once each has stopped, with how many there were.
using node_actor = caf::typed_actor<
  caf::replies_to<wire::spawn_shard>::with<shard_actor, std::string>, // and its data endpoint, or ""
  caf::replies_to<wire::spawn_worker, scheduler_actor, profiler_actor>::with<worker_actor>,
  caf::reacts_to<wire::ctl_request>,
  caf::replies_to<stop_atom>::with<uint32_t>,
  caf::replies_to<ping_atom>::with<caf::ok_atom>>; // the scheduler's liveness ping

/// A job a cluster placement started: what a node joining mid-run needs to add workers.
struct running_job {
  scheduler_actor scheduler;
  profiler_actor profiler;
  std::vector<shard_actor> shards;
  wire::spawn_worker worker_template;
  /// How each shard was spawned (to host one again after its node was lost), and the
  /// job driver, told of a replacement with (shard_atom, index, shard, data endpoint)
  /// and of each try to serve it again with (shard_atom, index, why).
  std::vector<wire::spawn_shard> shard_templates;
  caf::actor driver;
  /// The most workers the job grows to (train.max_workers), and how many were placed on
  /// each node (by node id): a node that joins while the job runs is given workers for
  /// its free slots up to that bound.
  uint32_t workers = 0;
  std::map<uint32_t, uint32_t> placed;
  /// The samples the job trains in all (its epochs of the training set, what a resumed job
  /// has left) and the training set's: `ashlar status` and `train --join` show epochs and
  /// the time left from them.
  uint64_t job_samples = 0;
  uint64_t train_samples = 0;
};

/// The scheduler process's front door, published on its listen address: nodes say hello
/// here, clients ask for status, send control requests and submit jobs.
using cluster_actor = caf::typed_actor<
  caf::replies_to<wire::hello, node_actor>::with<wire::welcome>,
  caf::replies_to<status_atom>::with<wire::cluster_status>,
  caf::replies_to<wire::ctl_request>::with<std::string>,
  caf::replies_to<wire::job_request>::with<wire::job_result>,
  // Local to the scheduler process (the job runner):
  caf::replies_to<nodes_atom>::with<wire::cluster_status, std::vector<node_actor>>,
  // The job about to run waits for its nodes: (shards, workers, longest wait in ms);
  // answered once the cluster has them, or with an error naming what it lacked when the
  // wait ran out or the job was stopped (runtime/control/job_lifecycle.hpp).
  caf::replies_to<wait_atom, uint32_t, uint32_t, uint64_t>::with<caf::ok_atom>,
  caf::reacts_to<tick_atom>,               // (to itself) the wait's deadline
  caf::reacts_to<stop_atom, std::string>, // the job runner: stop the waiting job (why)
  caf::reacts_to<job_atom, running_job>,
  caf::reacts_to<job_atom, caf::error>,
  caf::reacts_to<job_atom, wire::job_result>,
  caf::reacts_to<job_atom, std::string>,
  caf::reacts_to<caf::publish_atom, std::string>,
  caf::reacts_to<job_atom>,
  caf::reacts_to<shard_atom>,  // (to itself) re-host the running job's lost shards
  caf::reacts_to<ping_atom>,   // (to itself) ping the live nodes, lose the silent ones
  caf::reacts_to<welcomed_atom, uint32_t>, // a node confirms its welcome (its id)
  caf::reacts_to<wait_atom, uint32_t>>;    // (to itself) a node's time to confirm is over

/// Registers every Ashlar message type with `cfg` under names shared by all nodes.
void register_types(caf::actor_system_config& cfg);

/// Fair turns on the scheduler's threads: an actor takes at most a few messages before
/// others get a turn. CAF's default lets an actor run for as long as its mailbox has
/// messages, and a worker whose local steps post the next step to itself never has an
/// empty one: with more workers than threads the profiler, the scheduler and the job
/// driver's requests starved (progress lines stopped, and a job ran far past its epochs).
void set_fair_scheduling(caf::actor_system_config& cfg);

}  // namespace ashlar::actors

namespace ashlar::wire {

template <class T>
struct is_wire_message : std::false_type {};

#define ASHLAR_WIRE_MESSAGE(type)                                                            \
  template <>                                                                                \
  struct is_wire_message<type> : std::true_type {};
ASHLAR_WIRE_MESSAGE(hello)
ASHLAR_WIRE_MESSAGE(welcome)
ASHLAR_WIRE_MESSAGE(spawn_shard)
ASHLAR_WIRE_MESSAGE(spawn_worker)
ASHLAR_WIRE_MESSAGE(job_request)
ASHLAR_WIRE_MESSAGE(job_result)
ASHLAR_WIRE_MESSAGE(ctl_request)
ASHLAR_WIRE_MESSAGE(cluster_status)
ASHLAR_WIRE_MESSAGE(register_worker)
ASHLAR_WIRE_MESSAGE(assignment)
ASHLAR_WIRE_MESSAGE(membership_change)
ASHLAR_WIRE_MESSAGE(pull_request)
ASHLAR_WIRE_MESSAGE(pull_reply)
ASHLAR_WIRE_MESSAGE(push)
ASHLAR_WIRE_MESSAGE(push_ack)
ASHLAR_WIRE_MESSAGE(ring_message)
ASHLAR_WIRE_MESSAGE(shard_status)
ASHLAR_WIRE_MESSAGE(profile_report)
ASHLAR_WIRE_MESSAGE(cluster_stats)
#undef ASHLAR_WIRE_MESSAGE

/// CAF's inspect for wire messages. Serializers get the Cap'n Proto encoding as one raw
/// byte sequence (a single memcpy, not a float at a time); deserializers get it back
/// through the checked decoder, so a malformed message is an error, never a crash.
template <class Inspector, class T>
std::enable_if_t<is_wire_message<T>::value, typename Inspector::result_type>
inspect(Inspector& f, T& x) {
  if constexpr (std::is_base_of<caf::serializer, Inspector>::value) {
    auto w = encode(x);
    size_t n = w.size() * sizeof(uint64_t);
    return caf::error::eval([&] { return f.begin_sequence(n); },
                            [&] { return f.apply_raw(n, w.data()); },
                            [&] { return f.end_sequence(); });
  } else if constexpr (std::is_base_of<caf::deserializer, Inspector>::value) {
    size_t n = 0;
    if (auto err = f.begin_sequence(n))
      return err;
    if (n % sizeof(uint64_t) != 0 || n > max_message_bytes)
      return caf::error{caf::sec::invalid_argument};
    // A length beyond the bytes the message holds is refused before the buffer for it is
    // allocated (an admitted peer cannot make a 100-byte message cost a gigabyte).
    if (auto* bytes = dynamic_cast<caf::binary_deserializer*>(&f); bytes && n > bytes->remaining())
      return caf::error{caf::sec::invalid_argument};
    words w(n / sizeof(uint64_t));
    if (auto err = f.apply_raw(n, w.data()))
      return err;
    if (auto err = f.end_sequence())
      return err;
    return decode(w, x);
  } else {
    // Stringification (logs, to_string): a short summary.
    return f(std::string{"<wire message>"});
  }
}

}  // namespace ashlar::wire

namespace ashlar::actors {

/// Local only (never crosses the wire): stringified for logs.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, running_job& x) {
  return f(caf::meta::type_name("running_job"), x.scheduler, x.profiler, x.shards);
}

}  // namespace ashlar::actors
