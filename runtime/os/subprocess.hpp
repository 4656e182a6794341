// Child processes for the launcher and the integration tests: start a program with its
// stdout and stderr on one pipe, signal it, reap it. POSIX only.
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

class subprocess {
public:
  subprocess() = default;
  subprocess(subprocess&& other) noexcept;
  subprocess& operator=(subprocess&& other) noexcept;
  subprocess(const subprocess&) = delete;
  subprocess& operator=(const subprocess&) = delete;
  /// Kills (SIGKILL) and reaps a child that is still running.
  ~subprocess();

  /// Starts argv[0] (searched in PATH) with `argv`; stdout and stderr go to one pipe that
  /// output_fd() reads, or to `log_file` (appended) when it is not empty. Fails with
  /// io_error naming the program. With `with_input`, its stdin is a pipe that input_fd()
  /// writes (else it shares this process's stdin).
  [[nodiscard]] static expected<subprocess> start(const std::vector<std::string>& argv,
                                                  const std::string& log_file = "", bool with_input = false);

  pid_t pid() const { return pid_; }
  /// Read end of the output pipe, or -1 when output goes to a file.
  int output_fd() const { return fd_; }

  /// Write end of its stdin pipe (with_input), -1 without one or once closed.
  int input_fd() const { return in_fd_; }
  /// Writes `text` whole to its stdin pipe; false when there is none or it is closed (the
  /// child's end is gone: the caller ignores SIGPIPE).
  bool write_input(const std::string& text);
  /// Closes its stdin pipe: the child reads the end of its input.
  void close_input();

  /// Sends `sig` (no effect once reaped).
  void signal(int sig);

  /// Non-blocking: true and the exit code (128 + signal if killed) once the child ended.
  bool poll_exit(int& code);

  /// Waits up to `seconds` for the child; kills it (SIGKILL) past that. Returns the code.
  int wait(double seconds);

  bool running() const { return pid_ > 0 && !reaped_; }

private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int in_fd_ = -1;
  bool reaped_ = false;
  int code_ = -1;
};

/// This executable's path (/proc/self/exe), for starting copies of it.
std::string self_executable();

/// This machine's host name ("host" where it cannot be read).
std::string host_name();

}  // namespace ashlar
