#include "actors/job_checkpoints.hpp"
#include "runtime/core/clock.hpp"

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

namespace ashlar::actors {

namespace {
constexpr auto ask_timeout = std::chrono::seconds(60);
constexpr double poll_interval = 0.1;
constexpr auto poll_timeout = std::chrono::seconds(2);
constexpr auto order_timeout = std::chrono::seconds(5);
}  // namespace

job_checkpoints::job_checkpoints(caf::scoped_actor& self, job_store& store, const std::string& dir, uint64_t every,
                                 bool lockstep)
  : self_(self), store_(store), dir_(dir), every_(every), lockstep_(lockstep) {}

caf::error job_checkpoints::take_up(const std::vector<shard_actor>& shards) {
  std::vector<shard_cuts> held;
  caf::error err;
  for (size_t i = 0; i < shards.size() && !err; ++i)
    self_->request(shards[i], ask_timeout, checkpoint_atom::value, caf::get_atom::value)
      .receive([&](std::vector<uint64_t>& cuts) { held.push_back({static_cast<uint32_t>(i), std::move(cuts)}); },
               [&](caf::error& e) {
                 // A shard that answers with a reason (its store unreadable, a record in a
                 // newer format) says so; one that does not answer is unreachable.
                 err = e.category() == error_category_atom::value
                         ? located(e, "shard " + std::to_string(i))
                         : make_error(errc::peer_unreachable, "shard " + std::to_string(i)
                                                                + " did not say which checkpoints it holds: "
                                                                + describe(e));
               });
  if (err)
    return err;
  auto choice = choose_cut(store_.committed_cuts(), held, dir_);
  if (!choice)
    return choice.error();
  if (!choice->passed_over.empty())
    spdlog::warn("job: resuming from checkpoint cut {}, the newest every shard holds intact; passed over: {}",
                 choice->cut, choice->passed_over);
  if (choice->cut == 0)
    for (const auto& h : held)
      if (!h.intact.empty())
        spdlog::warn("job: {} names no committed checkpoint cut yet: the job starts from the beginning and shard "
                     "{} drops the {} uncommitted cut(s) it holds",
                     dir_, h.shard_id, h.intact.size());
  // Cut 0 on a resume (the job's start record alone) asks every shard to drop what it
  // holds: uncommitted cuts, and a stop record of the run that was stopped.
  const bool resumed = !store_.committed_cuts().empty();
  for (size_t i = 0; i < shards.size() && !err; ++i)
    if (choice->cut != 0 || resumed || !held[i].intact.empty())
      self_->request(shards[i], ask_timeout, restore_atom::value, choice->cut)
        .receive([](uint64_t) {}, [&](caf::error& e) { err = std::move(e); });
  if (err)
    return err;
  if (auto e = store_.adopt(choice->cut))
    return e;
  pacer_.emplace(every_, lockstep_, choice->cut);
  return {};
}

std::optional<std::vector<shard_cut_view>> job_checkpoints::poll(const std::vector<shard_actor>& shards) {
  std::vector<shard_cut_view> out;
  bool ok = true;
  // Asked all at once, with a short timeout: a request to a shard whose node just died
  // ends only at its timeout, and the driver notices the loss only after this returns.
  std::vector<decltype(self_->request(shards.front(), poll_timeout, status_atom::value))> asked;
  for (const auto& s : shards)
    asked.push_back(self_->request(s, poll_timeout, status_atom::value));
  for (auto& h : asked)
    h.receive([&](const wire::shard_status& st) { out.push_back({st.version, st.cut, st.cut_error}); },
              [&](caf::error&) { ok = false; });
  if (!ok)
    return std::nullopt;
  return out;
}

void job_checkpoints::act(const cut_action& a, const std::vector<shard_actor>& shards,
                          const std::function<cut_progress()>& progress) {
  switch (a.kind) {
    case cut_action::none:
      return;
    case cut_action::start: {
      pending_ = progress();
      // Asked all at once: the sooner every shard has it, the fewer rounds it needs ahead.
      // A shard only takes the order here (it writes in the background): a short timeout,
      // so that a shard whose node just died holds the driver up only briefly.
      // Each shard keeps the last committed cut beside the newest ones it writes.
      const uint64_t committed = pacer_->last_committed();
      std::vector<decltype(self_->request(shards.front(), order_timeout, checkpoint_atom::value, a.cut,
                                          a.at_version, committed))>
        asked;
      for (const auto& s : shards)
        asked.push_back(self_->request(s, order_timeout, checkpoint_atom::value, a.cut, a.at_version, committed));
      std::string refused;
      for (auto& h : asked)
        h.receive([](uint64_t) {},
                  [&](caf::error& e) {
                    if (refused.empty())
                      refused = describe(e);
                  });
      if (!refused.empty()) {
        if (auto m = pacer_->missed(a.cut, refused))
          spdlog::info("job: checkpoint cut {} not taken ({}); the next looks {} rounds ahead", a.cut, refused,
                       pacer_->margin());
      }
      return;
    }
    case cut_action::commit:
      if (auto err = store_.commit(a.cut, pending_.samples, pending_.seconds, pending_.workers, pending_.stage)) {
        // The shards keep the cut the record names, not this one.
        pacer_->commit_failed(a.cut);
        abandoned_.push_back("cut " + std::to_string(a.cut) + ": its record in " + dir_ + " was not written ("
                             + describe(err) + ")");
        spdlog::error("job: committing checkpoint cut {} to {} failed: {}; the job goes on, and a resume starts "
                      "from cut {}",
                      a.cut, dir_, describe(err), pacer_->last_committed());
      } else
        spdlog::debug("job: checkpoint cut {} committed ({} samples)", a.cut, pending_.samples);
      return;
    case cut_action::abandon:
      abandoned_.push_back("cut " + std::to_string(a.cut) + ": " + a.why);
      spdlog::error("job: checkpoint cut {} abandoned ({}); the job goes on, and a resume starts from cut {}",
                    a.cut, a.why, pacer_->last_committed());
      return;
  }
}

void job_checkpoints::tick(const std::vector<shard_actor>& shards, double now,
                           const std::function<cut_progress()>& progress) {
  if (!pacer_ || now - last_poll_ < poll_interval)
    return;
  last_poll_ = now;
  if (auto views = poll(shards))
    act(pacer_->on_status(*views, now), shards, progress);
}

void job_checkpoints::shard_lost() {
  if (!pacer_)
    return;
  if (auto a = pacer_->shard_lost())
    act(*a, {}, [] { return cut_progress{}; });
}

caf::error job_checkpoints::realign(const shard_actor& shard, uint32_t shard_id) {
  if (!pacer_ || pacer_->last_committed() == 0)
    return {};
  const auto cut = pacer_->last_committed();
  caf::error err;
  self_->request(shard, ask_timeout, restore_atom::value, cut)
    .receive([](uint64_t) {}, [&](caf::error& e) { err = std::move(e); });
  if (!err)
    spdlog::info("job: shard {} is back at checkpoint cut {}, the last the job committed", shard_id, cut);
  return err;
}

void job_checkpoints::final_cut(const std::vector<shard_actor>& shards, double now, const cut_progress& progress) {
  if (!pacer_)
    return;
  auto last = [&] { return progress; };
  act(pacer_->final_cut(now), shards, last);
  // The shards write in the background: their status says when it is on disk.
  const auto until = steady_now() + ask_timeout;
  double t = now;
  while (pacer_->in_flight()) {
    auto views = poll(shards);
    if (views)
      act(pacer_->on_status(*views, t), shards, last);
    if (!pacer_->in_flight())
      break;
    if (steady_now() > until) {
      abandoned_.push_back("cut " + std::to_string(*pacer_->in_flight()) + " (the final one): "
                           + (views ? "not written by every shard within 60 s" : "a shard did not answer within 60 s"));
      spdlog::error("job: the final checkpoint cut {} was not written by every shard{}; a resume starts from "
                    "cut {}",
                    *pacer_->in_flight(), views ? " within 60 s" : " (a shard did not answer within 60 s)",
                    pacer_->last_committed());
      return;
    }
    pause_for(std::chrono::milliseconds(10));
    t += 0.01;
  }
}

}  // namespace ashlar::actors
