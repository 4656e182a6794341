#include "runtime/core/clock.hpp"
#include "runtime/os/subprocess.hpp"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <thread>
#include <unistd.h>
#include <sys/wait.h>

namespace ashlar {

subprocess::subprocess(subprocess&& other) noexcept
  : pid_(other.pid_), fd_(other.fd_), in_fd_(other.in_fd_), reaped_(other.reaped_), code_(other.code_) {
  other.pid_ = -1;
  other.fd_ = -1;
  other.in_fd_ = -1;
}

subprocess& subprocess::operator=(subprocess&& other) noexcept {
  if (this != &other) {
    this->~subprocess();
    pid_ = other.pid_;
    fd_ = other.fd_;
    in_fd_ = other.in_fd_;
    reaped_ = other.reaped_;
    code_ = other.code_;
    other.pid_ = -1;
    other.fd_ = -1;
    other.in_fd_ = -1;
  }
  return *this;
}

subprocess::~subprocess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (fd_ >= 0)
    ::close(fd_);
  close_input();
  pid_ = -1;
  fd_ = -1;
}

expected<subprocess> subprocess::start(const std::vector<std::string>& argv,
                                       const std::string& log_file, bool with_input) {
  if (argv.empty())
    return make_error(errc::invalid_argument, "no program to start");
  int infd[2] = {-1, -1};
  if (with_input && ::pipe2(infd, O_CLOEXEC) != 0)
    return make_error(errc::io_error, std::string{"pipe: "} + std::strerror(errno));
  int pipefd[2] = {-1, -1};
  int out_fd = -1;
  // Every descriptor made here is closed on a failure below.
  auto close_all = [&] {
    for (int fd : {infd[0], infd[1], pipefd[0], pipefd[1], out_fd})
      if (fd >= 0)
        ::close(fd);
  };
  if (log_file.empty()) {
    if (::pipe2(pipefd, O_CLOEXEC) != 0) {
      const std::string why = std::strerror(errno);
      close_all();
      return make_error(errc::io_error, "pipe: " + why);
    }
  } else {
    out_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0) {
      const std::string why = std::strerror(errno);
      close_all();
      return make_error(errc::io_error, "cannot open " + log_file + ": " + why);
    }
  }
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    const std::string why = std::strerror(errno);
    close_all();
    return make_error(errc::io_error, "fork: " + why);
  }
  if (pid == 0) {
    int target = log_file.empty() ? pipefd[1] : out_fd;
    ::dup2(target, STDOUT_FILENO);
    ::dup2(target, STDERR_FILENO);
    if (with_input)
      ::dup2(infd[0], STDIN_FILENO);
    ::setpgid(0, 0);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot start %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  subprocess p;
  p.pid_ = pid;
  if (with_input) {
    ::close(infd[0]);
    p.in_fd_ = infd[1];
  }
  if (log_file.empty()) {
    ::close(pipefd[1]);
    p.fd_ = pipefd[0];
  } else {
    ::close(out_fd);
  }
  return p;
}

bool subprocess::write_input(const std::string& text) {
  size_t done = 0;
  while (in_fd_ >= 0 && done < text.size()) {
    ssize_t n = ::write(in_fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    done += static_cast<size_t>(n);
  }
  return in_fd_ >= 0;
}

void subprocess::close_input() {
  if (in_fd_ >= 0)
    ::close(in_fd_);
  in_fd_ = -1;
}

void subprocess::signal(int sig) {
  if (running())
    ::kill(pid_, sig);
}

bool subprocess::poll_exit(int& code) {
  if (pid_ <= 0)
    return false;
  if (!reaped_) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r != pid_)
      return false;
    reaped_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  code = code_;
  return true;
}

int subprocess::wait(double seconds) {
  auto deadline = steady_now() + std::chrono::duration<double>(seconds);
  int code = -1;
  while (!poll_exit(code)) {
    if (steady_now() > deadline) {
      signal(SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return code_;
    }
    pause_for(std::chrono::milliseconds(20));
  }
  return code;
}

std::string host_name() {
  char host[256] = "host";
  ::gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  return host;
}

std::string self_executable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return "ashlar";
  buf[n] = '\0';
  return buf;
}

}  // namespace ashlar
