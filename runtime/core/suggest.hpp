// "Did you mean ...?" for a mistyped name: a command, a config key, an environment variable.
#pragma once

#include <string>
#include <vector>

namespace ashlar {

/// Edits (insertions, deletions, substitutions, and swaps of two neighbours) that turn `a`
/// into `b`, compared without case.
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `word` if it is close enough to be what was meant: at most 1
/// edit for words up to 4 characters, 2 up to 8, else a quarter of the word's length; or
/// a candidate that `word` is a prefix of (at least 3 characters) when only one is. "" when
/// none is (or two are equally close).
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

/// " (did you mean 'X'?)" for closest(word, candidates), or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace ashlar
