// The two JSON writers the metrics code needs: numbers (non-finite ones as null) and
// escaped strings.
#pragma once

#include <string>

namespace ashlar {

/// `v` as a JSON number with 6 significant digits, or null if it is not finite.
std::string json_number(double v);

/// `s` as a quoted JSON string.
std::string json_string(const std::string& s);

}  // namespace ashlar
