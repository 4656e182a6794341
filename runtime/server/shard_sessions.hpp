// A shard's sessions with its workers and its cut schedule, out of the shard actor: reads
// (answered at once, held until the policy allows them, or continued chunk by chunk from
// the version they began at), delta reads against what a worker holds, pushes (whole, in
// chunks, sparse), membership, and the checkpoint cut asked for at a version the shard has
// not reached yet. Pure and single-threaded, on a clock_source: the actor turns messages
// into calls and delivers what comes back (a held read's reply goes to the promise kept
// under its ticket; a due cut goes to the checkpoint writer).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "runtime/compress/topk.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/core/error.hpp"
#include "runtime/server/shard_core.hpp"
#include "runtime/store/cut_schedule.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

class shard_sessions {
public:
  shard_sessions(shard_core& core, const clock_source& clock) : core_(core), clock_(clock) {}

  /// Acknowledgements of pushes held for the read that follows them (ticket, ack).
  using held_acks = std::vector<std::pair<uint64_t, wire::push_ack>>;
  /// A read's answer: its reply now, or a ticket under which the read waits (released
  /// by a later call's outcome); with a reply, the acknowledgement of the worker's push
  /// that waited for this read, to be sent after the reply.
  struct read_answer {
    std::optional<wire::pull_reply> reply;
    uint64_t ticket = 0;
    held_acks acks;
  };
  /// A push's answer: its acknowledgement now, or a ticket under which it waits for the
  /// read that follows it (wire::push::read_follows).
  struct push_answer {
    std::optional<wire::push_ack> ack;
    uint64_t ticket = 0;
  };
  /// What an event released: held reads now answered (ticket, reply) in arrival order,
  /// then the acknowledgements held for them or for workers that left (to be sent after
  /// those replies), and the cut whose version the shard just made (to be written now).
  struct outcome {
    std::vector<std::pair<uint64_t, wire::pull_reply>> released;
    held_acks acks;
    std::optional<uint64_t> cut;
  };

  /// A pull request: a later chunk of a read begun (from the version it began at), or a
  /// new read, answered or held as the policy says. Errors: a chunk of no read of this
  /// worker's, or outside the range.
  expected<read_answer> on_read(const wire::pull_request& req);

  /// A push (whole, a chunk of one, or sparse): the policy's answer, and the reads and
  /// the cut it released. Errors: a malformed push (names the shard, the worker and what).
  /// The whole push (its last piece) of a worker whose next read follows it
  /// (read_follows) is acknowledged once that read is answered, after its reply: a step's
  /// acknowledgement and the next step's parameters then reach the worker in one hand-off.
  /// Such an acknowledgement is held for no longer than that: the worker's next push, or
  /// its leaving, releases it too.
  expected<push_answer> on_push(const wire::push& msg, outcome& out);

  /// A worker joined or left: a leaving one's reads and view are dropped, and what its
  /// leaving released is returned.
  outcome on_member(const wire::membership_change& m);
  /// The pushes of `worker` this shard took into a version or a round (not dropped), whole:
  /// under a lockstep policy, the steps of it that count, its last one included when it
  /// pushed before it was lost (the scheduler hands over only what is left after them).
  uint64_t pushes_of(uint32_t worker) const {
    auto i = taken_.find(worker);
    return i == taken_.end() ? 0 : i->second;
  }

  /// The policy changed (a wider staleness bound): the held reads it now lets go.
  outcome release();

  /// A cut of the job asked for at `at_version` (0: now). Returns whether to write it now
  /// (false: once the shard makes that version, an outcome's `cut`); an error if the
  /// shard is past that version already. A new ask replaces one still due.
  expected<bool> ask_cut(uint64_t cut, uint64_t at_version);

  /// The parameters were replaced (a restore): delta reads start over from a dense read.
  void forget_views() { views_.clear(); }

  size_t held_reads() const { return held_.size(); }
  /// Seconds the oldest held read or held acknowledgement has waited (0: none held).
  double oldest_held_seconds() const;
  size_t held_pushes() const { return held_acks_.size(); }
  size_t views() const { return views_.size(); }

private:
  struct held_read {
    wire::pull_request req;
    uint64_t ticket = 0;
    uint64_t since_ns = 0;
  };
  // A read larger than one chunk: a reference to the parameter version it began at, so
  // every chunk of it belongs to that version (the shard never writes a referenced one).
  struct frozen_read {
    uint64_t id = 0;
    wire::shared_tensor data;
    uint64_t version = 0;
  };
  // Pull compression: what one worker holds of this shard's range, as far as the shard
  // knows, and the sequence number of the read that brought it there.
  struct pull_view {
    std::vector<float> params;
    uint64_t seq = 0;
  };

  bool may_answer(const wire::pull_request& req) const;
  expected<read_answer> continue_read(const wire::pull_request& req);
  wire::pull_reply begin_read(const wire::pull_request& req, uint64_t wait_ns);
  wire::pull_reply delta_read(pull_view& view, const wire::pull_request& req);
  wire::pull_reply chunk_of(const wire::shared_tensor& data, uint64_t version,
                            uint64_t offset, uint64_t len) const;
  expected<push_outcome> apply_push(const wire::push& msg, bool& complete);
  void released(outcome& out);
  void release_ack(uint32_t worker, held_acks& to);
  void after_version(outcome& out);

  shard_core& core_;
  const clock_source& clock_;
  std::vector<held_read> held_;
  uint64_t next_ticket_ = 1;
  std::map<uint32_t, frozen_read> reads_; // by worker
  uint64_t next_read_ = 1;
  std::vector<float> dense_;              // a sparse push, densified
  std::map<uint32_t, pull_view> views_;   // delta reads: by worker, members only
  std::set<uint32_t> members_;            // workers the scheduler announced (join, not yet left)
  std::map<uint32_t, uint64_t> taken_;    // whole pushes taken (applied or buffered), by worker
  std::map<uint32_t, std::pair<uint64_t, wire::push_ack>> held_acks_; // by worker: waiting for its read
  std::map<uint32_t, uint64_t> held_ack_since_; // by worker: when its acknowledgement was held (steady ns)
  uint64_t next_view_seq_ = 1;
  topk_scratch topk_;                     // delta reads: selection scratch
  std::vector<float> diff_, values_;      //   the difference from the view, the values sent
  cut_schedule cuts_;                     // the cut asked for at a later version
};

}  // namespace ashlar
