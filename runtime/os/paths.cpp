#include "runtime/os/paths.hpp"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>
#include <mutex>
#include <map>

#include <caf/message.hpp>

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ashlar {

namespace fs = std::filesystem;

expected<std::string> confine_path(const std::string& root, const std::string& path, const std::string& what) {
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::absolute(root, ec), ec);
  if (ec)
    return make_error(errc::invalid_argument, "cannot resolve the work directory " + root + ": " + ec.message());
  fs::path p{path};
  if (p.is_relative())
    p = base / p;
  const fs::path resolved = fs::weakly_canonical(p.lexically_normal(), ec);
  if (ec)
    return make_error(errc::invalid_argument, what + " " + path + " cannot be resolved: " + ec.message());
  auto rel = resolved.lexically_relative(base);
  if (rel.empty() || *rel.begin() == "..")
    return make_error(errc::invalid_argument, what + " " + path + " lies outside this node's work directory "
                                                + base.string() + " (--work-dir)");
  return resolved.string();
}

namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

// The work directory `root` resolved (base) and `path` relative to it (rel, "..." first
// where it leads out), as open_confined and pin_confined_dir take them.
caf::error beneath(const std::string& root, const std::string& path, const std::string& what, fs::path& base,
                   fs::path& rel) {
  std::error_code ec;
  base = fs::canonical(root, ec);
  if (ec)
    return make_error(errc::io_error, what + ": the work directory " + root + " cannot be opened: " + ec.message());
  const fs::path p{path};
  rel = p.is_absolute() ? p.lexically_normal().lexically_relative(base) : p.lexically_normal();
  return caf::none;
}

// openat2(RESOLVE_BENEATH), or where the kernel lacks it (before 5.6) a walk of the
// path one component at a time with O_NOFOLLOW, which refuses every symbolic link.
int open_beneath(int dirfd, const fs::path& rel, int flags, unsigned mode) {
#ifdef SYS_openat2
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof how);
  if (fd >= 0 || errno != ENOSYS)
    return static_cast<int>(fd);
#endif
  int at = ::dup(dirfd);
  std::vector<fs::path> parts(rel.begin(), rel.end());
  for (size_t i = 0; at >= 0 && i < parts.size(); ++i) {
    if (parts[i] == ".." ) {
      ::close(at);
      errno = EXDEV;
      return -1;
    }
    const bool last = i + 1 == parts.size();
    int next = ::openat(at, parts[i].c_str(), last ? flags | O_NOFOLLOW : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                        mode);
    ::close(at);
    at = next;
  }
  return at;
}

} // namespace

expected<int> open_confined(const std::string& root, const std::string& path, int flags, const std::string& what,
                            unsigned mode) {
  flags |= O_CLOEXEC;
  if (root.empty()) {
    int fd = ::open(path.c_str(), flags, mode);
    if (fd < 0)
      return make_error(errc::io_error, what + ": cannot open " + path + ": " + errno_text(errno));
    return fd;
  }
  fs::path base, rel;
  if (auto err = beneath(root, path, what, base, rel))
    return err;
  const auto outside = [&] {
    return make_error(errc::invalid_argument, what + " " + path + " lies outside this node's work directory "
                                                + base.string() + " (--work-dir), through .. or a symbolic link");
  };
  if (rel.empty() || *rel.begin() == "..")
    return outside();
  int dirfd = ::open(base.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0)
    return make_error(errc::io_error, what + ": the work directory " + base.string() + " cannot be opened: "
                                        + errno_text(errno));
  int fd = open_beneath(dirfd, rel, flags, mode);
  const int e = errno;
  ::close(dirfd);
  if (fd >= 0)
    return fd;
  if (e == EXDEV || e == ELOOP)
    return outside();
  return make_error(errc::io_error, what + ": cannot open " + path + ": " + errno_text(e));
}

pinned_dir::~pinned_dir() {
  if (fd_ >= 0)
    ::close(fd_);
}

pinned_dir& pinned_dir::operator=(pinned_dir&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

std::string pinned_dir::path() const {
  return "/proc/self/fd/" + std::to_string(fd_);
}

std::string pinned_dir::named(std::string text, const std::string& as) const {
  const std::string at = path();
  for (size_t i = text.find(at); i != std::string::npos;) {
    const size_t end = i + at.size();
    if (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) { // fd 12 is not fd 123
      i = text.find(at, end);
      continue;
    }
    text.replace(i, at.size(), as);
    i = text.find(at, i + as.size());
  }
  return text;
}

caf::error pinned_dir::named(const caf::error& err, const std::string& as) const {
  if (!err || err.category() != error_category_atom::value || !err.context().match_elements<std::string>())
    return err;
  return make_error(static_cast<errc>(err.code()), named(err.context().get_as<std::string>(0), as));
}

namespace {

expected<pinned_dir> pin_dir(const std::string& root, const std::string& path, const std::string& what) {
  fs::path base, rel;
  if (auto err = beneath(root, path, what, base, rel))
    return err;
  if (rel.empty() || *rel.begin() == "..")
    return make_error(errc::invalid_argument, what + " " + path + " lies outside this node's work directory "
                                                + base.string() + " (--work-dir)");
  pinned_dir at{::open(base.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)};
  if (!at.valid())
    return make_error(errc::io_error, what + ": the work directory " + base.string() + " cannot be opened: "
                                        + errno_text(errno));
  for (const auto& part : rel) {
    if (part.empty() || part == ".")
      continue;
    if (part == "..")
      return make_error(errc::invalid_argument, what + " " + path + " leads out through ..");
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 2; ++tries) {
      fd = ::openat(at.fd(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT && ::mkdirat(at.fd(), part.c_str(), 0755) != 0 && errno != EEXIST)
        break;
    }
    if (fd < 0) {
      const int e = errno;
      if (e == ENOTDIR || e == ELOOP)
        return make_error(errc::invalid_argument, what + " " + path + ": " + part.string()
                                                    + " on the way is not a directory (a symbolic link or a file)");
      return make_error(errc::io_error, what + ": cannot make or open " + path + ": " + errno_text(e));
    }
    at = pinned_dir{fd};
  }
  return at;
}

} // namespace

expected<std::shared_ptr<pinned_dir>> pin_confined_dir(const std::string& root, const std::string& path,
                                                       const std::string& what) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<pinned_dir>> pins; // by root and path as given
  std::error_code ec;
  const std::string key = fs::absolute(root, ec).lexically_normal().string() + '\n'
                          + fs::path{path}.lexically_normal().string();
  std::lock_guard lock{mutex};
  for (auto it = pins.begin(); it != pins.end();)
    it = it->second.expired() ? pins.erase(it) : std::next(it);
  if (auto held = pins[key].lock())
    return held;
  auto made = pin_dir(root, path, what);
  if (!made)
    return made.error();
  auto held = std::make_shared<pinned_dir>(std::move(*made));
  pins[key] = held;
  return held;
}

expected<std::string> read_small_file(const std::string& root, const std::string& path, size_t limit,
                                      const std::string& what) {
  auto fd = open_confined(root, path, O_RDONLY | O_NONBLOCK, what);
  if (!fd)
    return fd.error();
  struct stat st {};
  std::string out;
  caf::error err;
  if (::fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode))
    err = make_error(errc::invalid_argument, what + " " + path + " is not a regular file");
  else if (static_cast<uint64_t>(st.st_size) > limit)
    err = make_error(errc::invalid_argument, what + " " + path + " has " + std::to_string(st.st_size)
                                               + " bytes, more than the " + std::to_string(limit) + " allowed");
  char buf[65536];
  while (!err) {
    ssize_t n = ::read(*fd, buf, sizeof buf);
    if (n == 0)
      break;
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      err = make_error(errc::io_error, what + ": cannot read " + path + ": " + errno_text(errno));
    else if (out.size() + static_cast<size_t>(n) > limit) // it grew since fstat
      err = make_error(errc::invalid_argument, what + " " + path + " has more than the "
                                                 + std::to_string(limit) + " bytes allowed");
    else
      out.append(buf, static_cast<size_t>(n));
  }
  ::close(*fd);
  if (err)
    return err;
  return out;
}

caf::error check_output_file(const std::string& path, const std::string& key) {
  std::error_code ec;
  const fs::path p{path};
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path{"."};
  auto fail = [&](const std::string& why) {
    return make_error(errc::io_error, key + ": cannot write " + path + ": " + why);
  };
  if (fs::is_directory(p, ec))
    return fail("it is a directory");
  if (!fs::is_directory(dir, ec))
    return fail("the directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    return fail("the directory " + dir.string() + " is not writable");
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0)
    return fail("the file is not writable");
  return caf::none;
}

}  // namespace ashlar
