// The two JSON writers the metrics code needs: numbers (non-finite ones as null) and
// escaped strings.
#pragma once

#include <string>

namespace ashlar {

/// `v` as a JSON number with 6 significant digits, or null if it is not finite.
std::string json_number(double v, int digits = 6);

/// `us` rounded to a whole microsecond, as a JSON integer (trace timestamps and durations:
/// six significant digits would be 100 us of resolution after 10 s). null if not finite.
std::string json_micros(double us);

/// `seconds` with microsecond resolution (fixed decimals, no exponent), or null.
std::string json_seconds(double seconds);

/// `s` as a quoted JSON string.
std::string json_string(const std::string& s);

}  // namespace ashlar
