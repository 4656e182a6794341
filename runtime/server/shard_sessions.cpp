#include "runtime/server/shard_sessions.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace ashlar {

bool shard_sessions::may_answer(const wire::pull_request& req) const {
  // A push being applied piece by piece is not a version yet: reads wait for it.
  return !core_.applying() && (req.snapshot || core_.may_read(req.worker_id));
}

expected<shard_sessions::read_answer> shard_sessions::on_read(const wire::pull_request& req) {
  if (req.read_id != 0)
    return continue_read(req);
  if (may_answer(req)) {
    read_answer a{begin_read(req, 0), 0, {}};
    if (!req.snapshot)
      release_ack(req.worker_id, a.acks);
    return a;
  }
  held_.push_back(held_read{req, next_ticket_, clock_.steady_ns()});
  return read_answer{std::nullopt, next_ticket_++};
}

// A later chunk of a read already begun.
expected<shard_sessions::read_answer> shard_sessions::continue_read(const wire::pull_request& req) {
  auto i = reads_.find(req.worker_id);
  if (i == reads_.end() || i->second.id != req.read_id)
    return make_error(errc::invalid_state, "shard " + std::to_string(core_.range().shard_id) + " has no read "
                                             + std::to_string(req.read_id) + " of worker "
                                             + std::to_string(req.worker_id));
  const auto& data = i->second.data;
  if (req.offset >= data.size() || req.max_floats == 0)
    return make_error(errc::invalid_argument, "chunk offset " + std::to_string(req.offset)
                                                + " is outside the range of " + std::to_string(data.size()));
  uint64_t len = std::min<uint64_t>(req.max_floats, data.size() - req.offset);
  auto r = chunk_of(i->second.data, i->second.version, req.offset, len);
  r.read_id = req.read_id;
  if (req.offset + len == data.size())
    reads_.erase(i); // chunks are requested in order: this was the last
  return read_answer{std::move(r), 0, {}};
}

// A reply referencing [offset, offset + len) of a parameter version: no floats are copied.
wire::pull_reply shard_sessions::chunk_of(const wire::shared_tensor& data, uint64_t version,
                                          uint64_t offset, uint64_t len) const {
  wire::pull_reply r;
  r.shard_id = core_.range().shard_id;
  r.version = version;
  r.begin = core_.range().begin;
  r.params = data.window(offset, len);
  r.offset = offset;
  r.total = data.size();
  return r;
}

// A delta read (pull compression with error feedback): the entries where the current
// parameters differ most from the worker's view, as their current values; the view takes
// them. Whatever is not sent stays in the difference and goes with a later read.
wire::pull_reply shard_sessions::delta_read(pull_view& view, const wire::pull_request& req) {
  const uint64_t total = core_.params().size();
  // The ratio came as a float: 0.2f x 10 is a hair above 2, which is 2 entries, not 3.
  const auto k = static_cast<size_t>(
    std::ceil(static_cast<double>(req.topk_ratio) * static_cast<double>(total) * (1 - 1e-6)));
  std::vector<uint32_t> index;
  delta_topk(core_.params().data(), view.params, std::clamp<size_t>(k, 1, total), topk_, diff_, index, values_);
  wire::pull_reply r;
  r.shard_id = core_.range().shard_id;
  r.version = core_.version();
  r.begin = core_.range().begin;
  r.total = total;
  r.sparse = true;
  r.index = std::move(index);
  std::copy(values_.begin(), values_.end(), r.params.reset(values_.size()));
  view.seq = next_view_seq_++;
  r.view_seq = view.seq;
  return r;
}

// Starts a read the policy allows: the whole range in one reply, or its first chunk with
// the rest frozen for the requests that follow. With pull compression asked for, a worker
// whose view the shard knows gets a delta read; any other gets this dense read, and the
// shard starts a view of it (the worker's reply names it).
wire::pull_reply shard_sessions::begin_read(const wire::pull_request& req, uint64_t wait_ns) {
  const uint64_t total = core_.params().size();
  pull_view* view = nullptr;
  // A view is a copy of the range: only the job's members get one, so a peer inventing
  // worker ids makes the shard hold no more memory.
  if (req.topk_ratio > 0 && !req.snapshot && members_.count(req.worker_id) > 0) {
    view = &views_[req.worker_id];
    if (view->seq != 0 && view->seq == req.view_seq && view->params.size() == total) {
      auto r = delta_read(*view, req);
      r.wait_ns = wait_ns;
      return r;
    }
    view->params = core_.params().to_vector();
    view->seq = next_view_seq_++;
  }
  wire::pull_reply r;
  // An evaluation's snapshot reads the running average where the shard keeps one.
  auto data = req.snapshot && req.average ? core_.average_copy() : core_.shared_params();
  if (req.max_floats == 0 || req.max_floats >= total) {
    r = chunk_of(data, core_.version(), 0, total);
  } else {
    frozen_read f{next_read_++, std::move(data), core_.version()};
    r = chunk_of(f.data, f.version, 0, req.max_floats);
    r.read_id = f.id;
    reads_[req.worker_id] = std::move(f);
  }
  r.wait_ns = wait_ns;
  r.view_seq = view ? view->seq : 0;
  return r;
}

// Answers every held read the policy now allows, in arrival order.
void shard_sessions::released(outcome& out) {
  const uint64_t now = clock_.steady_ns();
  auto keep = held_.begin();
  for (auto i = held_.begin(); i != held_.end(); ++i) {
    if (may_answer(i->req)) {
      out.released.emplace_back(i->ticket, begin_read(i->req, now > i->since_ns ? now - i->since_ns : 0));
      if (!i->req.snapshot)
        release_ack(i->req.worker_id, out.acks);
    } else {
      if (keep != i)
        *keep = std::move(*i);
      ++keep;
    }
  }
  held_.erase(keep, held_.end());
}

// The acknowledgement held for `worker`'s read, if any, goes with what is answered now.
void shard_sessions::release_ack(uint32_t worker, held_acks& to) {
  auto i = held_acks_.find(worker);
  if (i == held_acks_.end())
    return;
  to.push_back(std::move(i->second));
  held_acks_.erase(i);
  held_ack_since_.erase(worker);
}

shard_sessions::outcome shard_sessions::release() {
  outcome out;
  released(out);
  return out;
}

// After a version was made: the cut waiting for it, if this is its version.
// (Not while another push is applied in pieces: the parameters are not a version then.)
void shard_sessions::after_version(outcome& out) {
  if (core_.applying())
    return;
  if (auto cut = cuts_.on_version(core_.version()))
    out.cut = *cut;
}

// The push into the core: a sparse one densified, a chunk of a larger one used as it
// arrives (the policy decides at the first), a whole one at once.
expected<push_outcome> shard_sessions::apply_push(const wire::push& msg, bool& complete) {
  const uint64_t range = core_.range().size();
  const size_t n = msg.grad.size();
  const auto id = std::to_string(core_.range().shard_id);
  complete = true;
  if (msg.sparse) {
    // Top-k: the entries sent, every other one zero. The policy sees a whole push.
    auto bad = [&](const std::string& what) {
      return make_error(errc::shape_mismatch, "shard " + id + " got a sparse push from worker "
                                                + std::to_string(msg.worker_id) + " " + what);
    };
    if (msg.offset != 0 || (msg.total != 0 && msg.total != range))
      return bad("at offset " + std::to_string(msg.offset) + " of " + std::to_string(msg.total)
                 + "; sparse pushes are whole (its range holds " + std::to_string(range) + ")");
    if (msg.index.size() != n)
      return bad("with " + std::to_string(msg.index.size()) + " indices for " + std::to_string(n) + " values");
    dense_.assign(range, 0.0f);
    for (size_t j = 0; j < n; ++j) {
      if (msg.index[j] >= range)
        return bad("with index " + std::to_string(msg.index[j]) + " outside its range of " + std::to_string(range));
      dense_[msg.index[j]] += msg.grad[j];
    }
    return core_.push(msg.worker_id, msg.base_version, msg.batch_size, dense_.data(), range);
  }
  if (msg.total != 0 && !(msg.offset == 0 && n == msg.total)) {
    if (msg.total != range || msg.offset + n > range || n == 0)
      return make_error(errc::shape_mismatch, "shard " + id + " got a chunk [" + std::to_string(msg.offset) + ", +"
                                                + std::to_string(n) + ") of " + std::to_string(msg.total)
                                                + " from worker " + std::to_string(msg.worker_id)
                                                + ", its range holds " + std::to_string(range));
    expected<push_outcome> out{push_outcome{}};
    if (msg.offset == 0)
      out = core_.begin_push(msg.worker_id, msg.base_version, msg.batch_size, range);
    if (out)
      out = core_.push_piece(msg.worker_id, msg.offset, msg.grad.data(), n);
    complete = msg.offset + n == range;
    return out;
  }
  return core_.push(msg.worker_id, msg.base_version, msg.batch_size, msg.grad.data(), n);
}

expected<shard_sessions::push_answer> shard_sessions::on_push(const wire::push& msg, outcome& out) {
  release_ack(msg.worker_id, out.acks); // its read did not follow: the earlier push is answered now
  bool complete = true;
  auto pushed = apply_push(msg, complete);
  if (!pushed)
    return std::move(pushed.error());
  if (pushed->version_bumped || (!held_.empty() && !core_.applying()))
    released(out);
  if (pushed->version_bumped)
    after_version(out);
  wire::push_ack ack;
  ack.shard_id = core_.range().shard_id;
  ack.version = pushed->version;
  ack.staleness = pushed->staleness;
  ack.complete = complete;
  ack.outcome = pushed->kind == push_decision::apply    ? wire::push_ack::applied
                : pushed->kind == push_decision::buffer ? wire::push_ack::buffered
                                                        : wire::push_ack::dropped;
  if (complete && ack.outcome != wire::push_ack::dropped)
    ++taken_[msg.worker_id];
  if (complete && msg.read_follows && members_.count(msg.worker_id) > 0) {
    held_acks_[msg.worker_id] = {next_ticket_, ack};
    held_ack_since_[msg.worker_id] = clock_.steady_ns();
    return push_answer{std::nullopt, next_ticket_++};
  }
  return push_answer{ack, 0};
}

shard_sessions::outcome shard_sessions::on_member(const wire::membership_change& m) {
  outcome out;
  if (m.kind == wire::membership_change::join) {
    core_.join(m.worker_id);
    members_.insert(m.worker_id);
    return out;
  }
  bool bumped = core_.leave(m.worker_id);
  release_ack(m.worker_id, out.acks);
  reads_.erase(m.worker_id);
  views_.erase(m.worker_id);
  members_.erase(m.worker_id);
  // A leaving worker's own held reads are never answered by the policy: release them.
  if (bumped || !held_.empty())
    released(out);
  if (bumped)
    after_version(out);
  return out;
}

// A cut due now while a push is applied in pieces waits for the version that push makes
// (only a policy that applies pushes alone does so: its cuts need no common version).
expected<bool> shard_sessions::ask_cut(uint64_t cut, uint64_t at_version) {
  const uint64_t v = core_.version();
  if (core_.applying() && (at_version == 0 || at_version == v))
    return cuts_.ask(cut, v + 1, v, core_.range().shard_id); // (false: due later)
  return cuts_.ask(cut, at_version, v, core_.range().shard_id);
}

double shard_sessions::oldest_held_seconds() const {
  const uint64_t now = clock_.steady_ns();
  uint64_t oldest = now;
  for (const auto& h : held_)
    oldest = std::min(oldest, h.since_ns);
  for (const auto& [worker, since] : held_ack_since_)
    oldest = std::min(oldest, since);
  return static_cast<double>(now - oldest) * 1e-9;
}

}  // namespace ashlar
