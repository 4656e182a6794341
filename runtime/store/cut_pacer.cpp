#include "runtime/store/cut_pacer.hpp"

#include <algorithm>

namespace ashlar {

cut_pacer::cut_pacer(uint64_t every, bool lockstep, uint64_t last_committed, double timeout_s)
  : every_(every), lockstep_(lockstep), last_committed_(last_committed), next_(last_committed + 1),
    timeout_s_(timeout_s) {}

std::optional<uint64_t> cut_pacer::in_flight() const {
  if (!flight_)
    return std::nullopt;
  return flight_->cut;
}

cut_action cut_pacer::begin(uint64_t at_version, double now) {
  flight_ = flight{next_++, now};
  cut_action a;
  a.kind = cut_action::start;
  a.cut = flight_->cut;
  a.at_version = at_version;
  return a;
}

cut_action cut_pacer::on_status(const std::vector<shard_cut_view>& shards, double now) {
  if (shards.empty())
    return {};
  if (flight_) {
    const uint64_t cut = flight_->cut;
    bool all = true;
    for (size_t i = 0; i < shards.size(); ++i) {
      if (shards[i].cut >= cut)
        continue;
      all = false;
      if (!shards[i].error.empty()) {
        flight_.reset();
        return {cut_action::abandon, cut, 0, "shard " + std::to_string(i) + ": " + shards[i].error};
      }
    }
    if (all) {
      flight_.reset();
      committed_before_ = last_committed_;
      last_committed_ = cut;
      return {cut_action::commit, cut, 0, ""};
    }
    if (now - flight_->since > timeout_s_) {
      flight_.reset();
      return {cut_action::abandon, cut, 0,
              "not every shard wrote it within " + std::to_string(static_cast<int>(timeout_s_)) + " s"};
    }
    return {};
  }
  const uint64_t v0 = shards.front().version;
  if (!base_)
    base_ = v0;
  if (every_ == 0 || v0 < *base_ + every_)
    return {};
  const uint64_t newest =
    std::max_element(shards.begin(), shards.end(), [](const auto& a, const auto& b) { return a.version < b.version; })
      ->version;
  const uint64_t at = lockstep_ ? newest + margin_ : 0;
  base_ = at != 0 ? at : v0;
  return begin(at, now);
}

std::optional<cut_action> cut_pacer::missed(uint64_t cut, const std::string& why) {
  if (!flight_ || flight_->cut != cut)
    return std::nullopt;
  flight_.reset();
  margin_ = std::min<uint64_t>(margin_ * 2, 1 << 16);
  return cut_action{cut_action::abandon, cut, 0, why};
}

void cut_pacer::commit_failed(uint64_t cut) {
  if (cut == last_committed_)
    last_committed_ = committed_before_;
}

cut_action cut_pacer::final_cut(double now) { return begin(0, now); }

std::optional<cut_action> cut_pacer::shard_lost() {
  if (!flight_)
    return std::nullopt;
  cut_action a{cut_action::abandon, flight_->cut, 0, "a shard was lost while writing it"};
  flight_.reset();
  return a;
}

}  // namespace ashlar
