// Logging through spdlog: one process-wide logger set up once by the application.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

#include "runtime/core/error.hpp"

namespace ashlar {

/// Sets the level (trace, debug, info, warn, error, off) and a pattern with time and
/// level; `prefix` (e.g. a role) starts every line when non-empty. Logs go to stderr.
[[nodiscard]] caf::error init_logging(const std::string& level, const std::string& prefix = "");

}  // namespace ashlar
