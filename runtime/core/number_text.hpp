// Numbers in the text of logs, errors and rule notes: one printf format, one value.
#pragma once

#include <cstdio>
#include <string>

namespace ashlar {

/// `v` as the printf `format` for one double prints it: number_text("%.1f", 3.25) is "3.2",
/// number_text("%.4g", 0.079057) is "0.07906".
inline std::string number_text(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace ashlar
