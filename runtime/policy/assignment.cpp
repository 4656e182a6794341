#include "runtime/policy/assignment.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/config/train_config.hpp"

namespace ashlar {

wire::assignment make_assignment(const assignment_context& ctx, uint32_t id, uint32_t registered) {
  const train_config& job = *ctx.job;
  const uint64_t n = ctx.train_size, k = std::max<uint32_t>(1, job.workers);
  const uint32_t slot = id < job.workers ? id : static_cast<uint32_t>(registered % k);
  wire::assignment a;
  a.worker_id = id;
  a.model = job.model;
  a.batch_size = job.batch_size;
  a.data_begin = n * slot / k;
  a.data_count = n * (slot + 1) / k - a.data_begin;
  uint64_t per_epoch = (a.data_count + job.batch_size - 1) / job.batch_size;
  a.steps = per_epoch * job.epochs;
  if (job.allocation != allocation_mode::equal) {
    a.data_begin = 0;
    a.data_count = n;
    uint64_t global = uint64_t{job.batch_size} * k;
    a.steps = (n * job.epochs + global - 1) / global;
  }
  if (!ctx.traits.lockstep)
    a.steps = (n * job.epochs + job.batch_size - 1) / job.batch_size;
  if (script_optimizer(job)) // the scripts' loops end the job: no count of steps of its own
    a.steps = uint64_t{1} << 40;
  else if (ctx.remaining < 1.0)
    a.steps = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(static_cast<double>(a.steps) * ctx.remaining)));
  a.local_steps = 1;
  a.local_lr = job.optimizer.lr;
  // Policies with commits scale every commit alike, one step or many, as one worker's
  // share of a model average; for the others a push is the step's gradient.
  a.commit_scale = !ctx.traits.commits    ? 1.0f
                   : job.commit_scale > 0 ? static_cast<float>(job.commit_scale)
                                          : 1.0f / static_cast<float>(k);
  a.seed = job.seed * 1000003ull + id;
  a.policy = job.policy;
  a.chunk_floats = job.chunk_floats;
  a.topk_ratio = static_cast<float>(push_topk_ratio(job));
  // Pull compression as configured; a planner may decide it later (ASHL's stages).
  a.pull_topk_ratio = static_cast<float>(job.pull_topk_ratio);
  a.overlap_commits = job.overlap_commits;
  a.momentum = job.optimizer.momentum;
  a.local_momentum = ctx.traits.commits ? static_cast<float>(job.local_momentum) : 0.0f;
  a.weight_decay = job.optimizer.weight_decay;
  a.rule = job_optimizer(job).rule;
  a.beta1 = job.optimizer.beta1;
  a.beta2 = job.optimizer.beta2;
  a.eps = job.optimizer.eps;
  a.chunks_in_flight = job.chunks_in_flight;
  // A lost shard can come back from its checkpoints: workers wait for it, bounded.
  a.shard_wait_s = job.checkpoint_dir.empty() ? 0.0 : job.shard_wait;
  if (ctx.contention != nullptr)
    a.contention = for_worker(*ctx.contention, id);
  if (!job.speeds.empty())
    a.pace_ns_per_sample = static_cast<uint64_t>(job.sample_ms * 1e6 / job.speeds[id % job.speeds.size()]);
  return a;
}

std::optional<std::string> apply_resumed(wire::assignment& a, const resumed_worker& r,
                                         const assignment_context& ctx) {
  const auto& p = r.position;
  if (r.batch == 0 || p.count == 0 || p.begin + p.count > ctx.train_size)
    return "worker " + std::to_string(a.worker_id) + "'s checkpointed data position [" + std::to_string(p.begin)
           + ", " + std::to_string(p.begin + p.count) + ") does not fit the " + std::to_string(ctx.train_size)
           + " training samples; it starts afresh";
  a.data_begin = p.begin;
  a.data_count = p.count;
  a.seed = p.seed;
  a.cursor_epoch = p.epoch;
  a.cursor_pos = p.pos;
  if (ctx.job->allocation != allocation_mode::equal)
    a.batch_size = r.batch;
  return std::nullopt;
}

uint64_t steps_left(const std::map<uint32_t, uint64_t>& assigned, const std::map<uint32_t, uint64_t>& done) {
  uint64_t left = 0;
  for (const auto& [id, steps] : assigned) {
    auto d = done.find(id);
    uint64_t n = d == done.end() ? 0 : d->second;
    left = std::max(left, steps > n ? steps - n : 0);
  }
  return left;
}

namespace {

// The set [0, n) split over `live` in id order, in proportion to each batch share.
void resplit(const std::map<uint32_t, member_part>& live, uint64_t n, handover& h) {
  uint64_t total = 0;
  for (const auto& [id, m] : live)
    total += std::max<uint32_t>(1, m.batch);
  if (total == 0 || n == 0)
    return;
  uint64_t begin = 0, acc = 0;
  size_t i = 0;
  for (const auto& [id, m] : live) {
    acc += std::max<uint32_t>(1, m.batch);
    const uint64_t end = ++i == live.size() ? n : n * acc / total;
    batch_directive d;
    d.share = m.batch;
    d.from_step = 0; // at its next step
    d.data_begin = std::min(begin, n - 1);
    d.data_count = std::max<uint64_t>(1, end - begin);
    if (d.data_begin != m.data_begin || d.data_count != m.data_count)
      h.parts[id] = d;
    begin = end;
  }
}

}  // namespace

handover hand_over_lost(const member_part& lost, uint64_t done_steps, const std::map<uint32_t, member_part>& live,
                        uint64_t train_size, bool lockstep) {
  handover h;
  if (live.empty())
    return h;
  if (lockstep)
    h.reassigned_samples = (lost.steps > done_steps ? lost.steps - done_steps : 0) * std::max<uint32_t>(1, lost.batch);
  resplit(live, train_size, h);
  if (lockstep && h.reassigned_samples > 0) {
    uint64_t per_round = 0;
    for (const auto& [id, m] : live)
      per_round += std::max<uint32_t>(1, m.batch);
    h.extra_rounds = (h.reassigned_samples + per_round - 1) / per_round;
    for (const auto& [id, m] : live) {
      auto& d = h.parts[id];
      if (d.data_count == 0) // its part stays: only its steps change
        d = batch_directive{m.batch, 0, m.data_begin, m.data_count};
      d.steps = m.steps + h.extra_rounds;
    }
  }
  return h;
}

double step_samples(const member_part& m) {
  const uint64_t b = std::max<uint32_t>(1, m.batch);
  if (m.data_count == 0)
    return static_cast<double>(b);
  const uint64_t steps_per_pass = (m.data_count + b - 1) / b;
  return static_cast<double>(m.data_count) / static_cast<double>(steps_per_pass);
}

double samples_between(const member_part& m, uint64_t a, uint64_t b) {
  double out = 0;
  uint64_t begin = 0;
  for (const auto& [end, samples] : m.earlier) {
    const uint64_t lo = std::max(a, begin), hi = std::min(b, end);
    if (hi > lo)
      out += static_cast<double>(hi - lo) * samples;
    begin = std::max(begin, end);
  }
  const uint64_t lo = std::max(a, begin);
  if (b > lo)
    out += static_cast<double>(b - lo) * step_samples(m);
  return out;
}

double samples_left(const member_part& m, uint64_t done) { return samples_between(m, done, m.steps); }

member_part after_directive(const member_part& m, const batch_directive& d) {
  member_part out = m;
  out.earlier.clear();
  // What its steps before d.from_step train stays as it was planned.
  uint64_t begin = 0;
  for (const auto& [end, samples] : m.earlier) {
    if (begin >= d.from_step)
      break;
    out.earlier.emplace_back(std::min(end, d.from_step), samples);
    begin = end;
  }
  const double now = step_samples(m);
  if (begin < d.from_step) {
    if (!out.earlier.empty() && out.earlier.back().second == now)
      out.earlier.back().first = d.from_step;
    else
      out.earlier.emplace_back(d.from_step, now);
  }
  if (d.share > 0)
    out.batch = d.share;
  if (d.data_count > 0)
    out.data_begin = d.data_begin, out.data_count = d.data_count;
  if (d.steps > 0)
    out.steps = d.steps;
  return out;
}

uint64_t steps_after_directive(uint64_t steps, uint64_t from, uint64_t taken, double old_step, double new_step) {
  if (steps == 0 || taken <= from || new_step <= 0)
    return steps;
  const double planned = static_cast<double>(steps > from ? steps - from : 0) * new_step;
  const double rest = planned - static_cast<double>(taken - from) * old_step;
  // Up, not to the nearest: a step short of the plan leaves samples nobody trains (the
  // handover of a lost ring member came out 40 samples short of 8 epochs), a step over it
  // trains at most one batch more.
  return taken + (rest > 0 ? static_cast<uint64_t>(std::ceil(rest / new_step - 1e-6)) : 0);
}

handover hand_over_lockstep(const std::map<uint32_t, member_part>& live, const std::map<uint32_t, uint64_t>& done,
                            uint64_t lost_owed, uint64_t train_size, bool even_rounds, uint64_t lead_steps) {
  handover h;
  if (live.empty())
    return h;
  h.reassigned_samples = lost_owed;
  auto done_of = [&](uint32_t id) {
    auto d = done.find(id);
    return d == done.end() ? uint64_t{0} : d->second;
  };
  // Owed in samples: each live member's steps left at what a step of its part trains.
  double owed = static_cast<double>(lost_owed);
  for (const auto& [id, m] : live)
    owed += samples_left(m, done_of(id));
  resplit(live, train_size, h);
  // A member goes on with its old part for the steps a directive takes to reach it (its
  // step in flight, and one more); its new part starts at `from` (a ring's members switch
  // at their next step and keep equal steps, and one without a count in `done` has not
  // started: no lead).
  std::map<uint32_t, uint64_t> from;
  for (const auto& [id, m] : live) {
    const uint64_t d = done_of(id);
    const bool counted = done.count(id) > 0; // not yet started: its part moves at once
    const uint64_t lead = even_rounds || !counted ? 0 : std::min(lead_steps, m.steps > d ? m.steps - d : 0);
    from[id] = d + lead;
    owed -= samples_between(m, d, d + lead);
  }
  // The rest is spread over what a step trains on each member's new part.
  std::map<uint32_t, double> per_step;
  double round = 0;
  for (const auto& [id, m] : live) {
    auto now = m;
    if (auto p = h.parts.find(id); p != h.parts.end() && p->second.data_count > 0) {
      now.data_begin = p->second.data_begin;
      now.data_count = p->second.data_count;
    }
    per_step[id] = step_samples(now);
    round += per_step[id];
  }
  owed = std::max(0.0, owed);
  const auto base = static_cast<uint64_t>(owed / round);
  double rest = owed - static_cast<double>(base) * round;
  for (const auto& [id, m] : live) {
    uint64_t rounds = base;
    if (rest > 1e-6) {
      rounds += 1;
      if (!even_rounds)
        rest -= per_step[id];
    }
    const uint64_t steps = from[id] + rounds;
    auto moved = h.parts.find(id);
    if (steps == m.steps && moved == h.parts.end())
      continue;
    auto& dir = h.parts[id];
    if (dir.data_count == 0) // its part stays: only its steps change
      dir = batch_directive{m.batch, 0, m.data_begin, m.data_count};
    dir.from_step = from[id];
    dir.steps = steps;
  }
  return h;
}

left_member hand_over_left(const member_part& left, uint64_t reported, uint64_t counted,
                           const std::map<uint32_t, member_part>& live, uint64_t train_size, bool lockstep) {
  left_member out;
  out.done_steps = std::max(reported, counted);
  out.finished = out.done_steps >= left.steps;
  if (!out.finished)
    out.h = hand_over_lost(left, out.done_steps, live, train_size, lockstep);
  return out;
}

handover hand_over_joined(const std::map<uint32_t, member_part>& live, uint64_t train_size) {
  handover h;
  resplit(live, train_size, h);
  return h;
}

lockstep_join hand_over_joined_lockstep(const std::map<uint32_t, member_part>& live,
                                        const std::map<uint32_t, member_part>& lost,
                                        const std::map<uint32_t, uint64_t>& done, uint32_t newcomer,
                                        uint64_t train_size, bool even_rounds) {
  lockstep_join j;
  auto owed_by = [&](uint32_t id, const member_part& m) -> uint64_t {
    auto d = done.find(id);
    const uint64_t n = d == done.end() ? 0 : d->second;
    return (m.steps > n ? m.steps - n : 0) * std::max<uint32_t>(1, m.batch);
  };
  uint64_t lost_owed = 0;
  for (const auto& [id, m] : lost)
    lost_owed += owed_by(id, m);
  j.owed_samples = lost_owed;
  for (const auto& [id, m] : live)
    if (id != newcomer)
      j.owed_samples += owed_by(id, m);
  if (live.empty())
    return j;
  // The newcomer has trained nothing and owes nothing: it only takes a part of what is owed.
  auto with_newcomer = live;
  with_newcomer[newcomer].steps = 0;
  auto from = done;
  from[newcomer] = 0;
  j.h = hand_over_lockstep(with_newcomer, from, lost_owed, train_size, even_rounds);
  j.h.reassigned_samples = 0;
  auto n = j.h.parts.find(newcomer);
  if (n == j.h.parts.end())
    return j;
  j.rounds = n->second.steps;
  // The newcomer's steps come with its assignment; a directive only if its part moved.
  const auto& mine = live.at(newcomer);
  if (n->second.data_begin == mine.data_begin && n->second.data_count == mine.data_count)
    j.h.parts.erase(n);
  else
    n->second.steps = 0;
  return j;
}

}  // namespace ashlar
