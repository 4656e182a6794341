#include "runtime/pacing/contention.hpp"
#include "runtime/os/paths.hpp"

#include <fstream>
#include <sstream>

#include "runtime/core/number_text.hpp"

namespace ashlar {

expected<contention_profile> parse_contention(const std::string& text, const std::string& origin) {
  contention_profile out;
  std::istringstream in{text};
  std::string line;
  for (size_t no = 1; std::getline(in, line); ++no) {
    if (auto hash = line.find('#'); hash != std::string::npos)
      line.erase(hash);
    std::istringstream ls{line};
    std::string who;
    if (!(ls >> who))
      continue;
    contention_interval c;
    std::string extra;
    if (!(ls >> c.start_s >> c.end_s >> c.factor) || (ls >> extra))
      return make_error(errc::invalid_config, origin + ":" + std::to_string(no)
                                                + ": expected `WORKER START_S END_S FACTOR`");
    if (who == "*") {
      c.all_workers = true;
    } else {
      char* end = nullptr;
      unsigned long id = std::strtoul(who.c_str(), &end, 10);
      if (*end != '\0' || who[0] == '-')
        return make_error(errc::invalid_config, origin + ":" + std::to_string(no) + ": worker '"
                                                  + who + "' is neither an id nor *");
      c.worker = static_cast<uint32_t>(id);
    }
    if (c.start_s < 0 || c.end_s <= c.start_s || !(c.factor >= 1))
      return make_error(errc::invalid_config,
                        origin + ":" + std::to_string(no)
                          + ": need 0 <= START_S < END_S and FACTOR >= 1 (a slowdown)");
    out.push_back(c);
  }
  return out;
}

expected<contention_profile> load_contention(const std::string& path, const std::string& root) {
  auto text = read_small_file(root, path, max_contention_bytes, "train.contention");
  if (!text)
    return text.error();
  return parse_contention(*text, path);
}

double slowdown(const contention_profile& p, uint32_t worker, double t_s) {
  double f = 1;
  for (const auto& c : p)
    if ((c.all_workers || c.worker == worker) && t_s >= c.start_s && t_s < c.end_s)
      f *= c.factor;
  return f;
}

contention_profile for_worker(const contention_profile& p, uint32_t worker) {
  contention_profile out;
  for (const auto& c : p)
    if (c.all_workers || c.worker == worker) {
      auto mine = c;
      mine.all_workers = false;
      mine.worker = worker;
      out.push_back(mine);
    }
  return out;
}

std::string contention_text(const contention_profile& p) {
  std::string s;
  for (const auto& c : p)
    s += (c.all_workers ? std::string{"*"} : std::to_string(c.worker)) + " " + number_text("%g", c.start_s) + " "
         + number_text("%g", c.end_s) + " " + number_text("%g", c.factor) + "\n";
  return s;
}

}  // namespace ashlar
