// Names in the order a person reads them: runs of digits compare as numbers, so
// "worker-2" < "worker-10". Used where nodes are taken in a stable, readable order (a
// cluster's worker slots: node "worker-0" hosts worker 0).
#pragma once

#include <cctype>
#include <string>

namespace ashlar {

inline bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie])))
        ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je])))
        ++je;
      // Compare the numbers without converting: leading zeros off, then length, then digits.
      size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0')
        ++is;
      while (js + 1 < je && b[js] == '0')
        ++js;
      if (ie - is != je - js)
        return ie - is < je - js;
      const int c = a.compare(is, ie - is, b, js, je - js);
      if (c != 0)
        return c < 0;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j])
      return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace ashlar
