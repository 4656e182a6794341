#include "runtime/store/cut_schedule.hpp"

#include <string>

namespace ashlar {

expected<bool> cut_schedule::ask(uint64_t cut, uint64_t at_version, uint64_t version, uint32_t shard_id) {
  if (cut == 0)
    return make_error(errc::invalid_argument, "checkpoint cut 0 is not a cut");
  due_.reset();
  if (at_version != 0 && at_version < version)
    return make_error(errc::invalid_state, "shard " + std::to_string(shard_id) + " was at version "
                                             + std::to_string(version) + ", past the cut's version "
                                             + std::to_string(at_version));
  if (at_version > version) {
    due_.emplace(cut, at_version);
    return false;
  }
  return true;
}

std::optional<uint64_t> cut_schedule::on_version(uint64_t version) {
  if (!due_ || version < due_->second)
    return std::nullopt;
  const uint64_t cut = due_->first;
  due_.reset();
  return cut;
}

std::optional<uint64_t> cut_schedule::due() const {
  if (!due_)
    return std::nullopt;
  return due_->first;
}

}  // namespace ashlar
