#include "apps/ashlar/launcher_channel.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "apps/ashlar/host.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/os/remote_start.hpp"

namespace ashlar::cli {

namespace {

std::mutex g_dir_mutex;
std::string g_dir; // the credentials' directory while the node runs

void remove_dir() {
  std::lock_guard<std::mutex> lock{g_dir_mutex};
  if (g_dir.empty())
    return;
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
  g_dir.clear();
}

[[noreturn]] void exit_now(int code) {
  remove_dir();
  std::_Exit(code);
}

// Writes `body` to `path`, readable by this user only; false when it cannot.
bool write_private(const std::string& path, const std::string& body) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return false;
  size_t done = 0;
  while (done < body.size()) {
    ssize_t n = ::write(fd, body.data() + done, body.size() - done);
    if (n <= 0) {
      ::close(fd);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return ::close(fd) == 0;
}

// Reads the channel after the credentials: signals, then its end.
void watch_channel() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const int sig = parse_signal_line(line);
    if (sig == SIGKILL)
      exit_now(128 + SIGKILL);
    if (sig != 0)
      request_stop(sig);
  }
  // The launcher (or its ssh) is gone: stop as on SIGTERM, and go whatever happens.
  request_stop(SIGTERM);
  pause_for(std::chrono::seconds(30));
  exit_now(1);
}

} // namespace

launcher_channel::~launcher_channel() {
  remove_dir();
}

expected<std::unique_ptr<launcher_channel>> open_launcher_channel(security_options& sec) {
  std::signal(SIGPIPE, SIG_IGN);
  credentials_reader reader;
  std::string line;
  auto st = credentials_reader::status::more;
  while (st == credentials_reader::status::more && std::getline(std::cin, line))
    st = reader.feed(line);
  if (st == credentials_reader::status::bad)
    return make_error(errc::invalid_argument, "--launcher-stdin: " + reader.error());
  if (st != credentials_reader::status::done)
    return make_error(errc::invalid_argument,
                      "--launcher-stdin: the launcher's channel (stdin) ended before its credentials");
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string{tmp && *tmp ? tmp : "/tmp"} + "/ashlar-node-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    return make_error(errc::io_error, "cannot make a private directory " + tmpl + ": " + std::strerror(errno));
  auto channel = std::make_unique<launcher_channel>();
  channel->dir = tmpl;
  {
    std::lock_guard<std::mutex> lock{g_dir_mutex};
    g_dir = tmpl;
  }
  const auto& c = reader.credentials();
  if (!c.token.empty()) {
    sec.token_file = tmpl + "/token";
    if (!write_private(sec.token_file, c.token + "\n"))
      return make_error(errc::io_error, "cannot write " + sec.token_file);
  }
  if (!c.files.empty()) {
    sec.tls_dir = tmpl + "/tls";
    if (::mkdir(sec.tls_dir.c_str(), 0700) != 0)
      return make_error(errc::io_error, "cannot make " + sec.tls_dir);
    for (const auto& [name, body] : c.files)
      if (!write_private(sec.tls_dir + "/" + name, body))
        return make_error(errc::io_error, "cannot write " + sec.tls_dir + "/" + name);
  }
  std::thread{watch_channel}.detach();
  return channel;
}

}  // namespace ashlar::cli
