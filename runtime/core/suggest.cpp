#include "runtime/core/suggest.hpp"

#include <algorithm>
#include <cctype>

namespace ashlar {

size_t edit_distance(const std::string& a, const std::string& b) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  const size_t n = a.size(), m = b.size();
  // Optimal string alignment: Levenshtein plus a swap of two neighbours as one edit.
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= m; ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.empty())
    return {};
  const size_t limit = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : std::max<size_t>(2, word.size() / 4);
  std::string best;
  size_t best_d = limit + 1;
  bool tie = false;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best = c;
      best_d = d;
      tie = false;
    } else if (d == best_d && c != best) {
      tie = true;
    }
  }
  if (!best.empty() && !tie)
    return best;
  if (word.size() < 3)
    return {};
  std::string prefixed;
  for (const auto& c : candidates)
    if (c.size() > word.size() && edit_distance(word, c.substr(0, word.size())) == 0) {
      if (!prefixed.empty())
        return {};
      prefixed = c;
    }
  return prefixed;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  auto c = closest(word, candidates);
  return c.empty() ? std::string{} : " (did you mean '" + c + "'?)";
}

}  // namespace ashlar
