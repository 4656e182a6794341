#include "runtime/worker/report_batch.hpp"

#include <utility>

namespace ashlar {

report_batch::next report_batch::add(wire::profile_report r) {
  held_.push_back(std::move(r));
  if (window_ns_ == 0 || held_.size() >= most_)
    return next::send; // (a pending timer then finds the next batch, or nothing)
  if (armed_)
    return next::hold;
  armed_ = true;
  return next::arm_timer;
}

std::vector<wire::profile_report> report_batch::take() {
  std::vector<wire::profile_report> out;
  out.swap(held_);
  return out;
}

}  // namespace ashlar
