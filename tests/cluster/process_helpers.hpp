// Helpers for tests that start `ashlar` processes on loopback, as a user would.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/os/subprocess.hpp"
#include "../runtime/temp_dir.hpp"

namespace ashlar::test {

using namespace std::chrono_literals;

inline const std::string exe = ASHLAR_BINARY;

// Every process these tests start inherits the cluster token (a test that needs another
// passes --token-file, which wins).
inline const bool token_set = [] {
  ::setenv("ASHLAR_TOKEN", "cluster-process-test-token", 1);
  return true;
}();
inline const std::string config = std::string{ASHLAR_SOURCE_DIR} + "/ops/configs/fmnist-mlp.toml";

// Writes a token file as a user should: readable by this user only (others' eyes refuse it).
inline void write_token(const std::string& path, const std::string& token) {
  { std::ofstream{path} << token << "\n"; }
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

inline std::string slurp(const std::string& path) {
  std::ifstream in{path};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits until `pred(text of file)` holds; false after `limit`.
template <class Pred>
bool wait_for_file(const std::string& path, Pred pred, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(slurp(path)))
      return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

inline subprocess start(const std::vector<std::string>& argv, const std::string& log) {
  auto p = subprocess::start(argv, log);
  REQUIRE(p);
  return std::move(*p);
}

inline double json_number(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re{"\"" + key + "\": ([-0-9.e]+)"};
  REQUIRE(std::regex_search(json, m, re));
  return std::stod(m[1]);
}

// A running scheduler with its port.
struct scheduler_proc {
  subprocess proc;
  std::string join;
};

inline scheduler_proc start_scheduler(const temp_dir& dir, std::vector<std::string> extra) {
  std::vector<std::string> argv = {exe, "node", "--role", "scheduler", "--listen", "127.0.0.1:0",
                                   "--port-file", dir.file("port")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  scheduler_proc s{start(argv, dir.file("scheduler.log")), ""};
  REQUIRE(wait_for_file(dir.file("port"), [](const std::string& t) { return !t.empty(); }, 20s));
  auto port = slurp(dir.file("port"));
  port.erase(port.find_last_not_of("\n ") + 1);
  s.join = "127.0.0.1:" + port;
  return s;
}

}  // namespace ashlar::test
