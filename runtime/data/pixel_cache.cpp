#include "runtime/data/pixel_cache.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <dirent.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

namespace ashlar {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The directory, made if missing (0700); "" unless it is a directory of this user's.
std::string usable_dir() {
  const auto dir = pixel_cache_dir();
  if (dir.empty())
    return "";
  // Its parent may be missing too ($HOME/.cache on a fresh account).
  for (size_t at = dir.find('/', 1); at != std::string::npos; at = dir.find('/', at + 1))
    ::mkdir(dir.substr(0, at).c_str(), 0700);
  ::mkdir(dir.c_str(), 0700);
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    return "";
  return dir;
}

// Maps `path` if it is this user's regular file of `size` bytes starting with `header`.
std::shared_ptr<const uint8_t> map_cached(const std::string& path, size_t size, const uint8_t (&header)[16]) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return nullptr;
  struct stat st{};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid()
      && static_cast<size_t>(st.st_size) == size)
    base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED)
    return nullptr;
  if (std::memcmp(base, header, sizeof header) != 0) {
    ::munmap(base, size);
    return nullptr;
  }
  std::shared_ptr<const uint8_t> whole{static_cast<const uint8_t*>(base),
                                       [size](const uint8_t* p) { ::munmap(const_cast<uint8_t*>(p), size); }};
  return std::shared_ptr<const uint8_t>(whole, whole.get() + sizeof header); // the pixels after the header
}

// Writes the copy under a name of this process's, then renames it into place: a reader
// never maps a half-written file.
bool write_cached(const std::string& path, const uint8_t (&header)[16], const std::vector<uint8_t>& pixels) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return false;
  bool ok = ::write(fd, header, sizeof header) == static_cast<ssize_t>(sizeof header);
  for (size_t at = 0; ok && at < pixels.size();) {
    const ssize_t n = ::write(fd, pixels.data() + at, pixels.size() - at);
    ok = n > 0;
    at += ok ? static_cast<size_t>(n) : 0;
  }
  ok = ::close(fd) == 0 && ok;
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok)
    ::unlink(tmp.c_str());
  return ok;
}

// Removes the copies of earlier versions of the same source (same path, another inode,
// size or time): one copy per source path is kept.
void forget_older(const std::string& dir, const std::string& prefix, const std::string& keep) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return;
  while (auto* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0 && name != keep && name.find(".tmp.") == std::string::npos)
      ::unlink((dir + "/" + name).c_str());
  }
  ::closedir(d);
}

} // namespace

std::string pixel_cache_dir() {
  const auto own = env("ASHLAR_CACHE_DIR");
  if (own == "off")
    return "";
  if (!own.empty())
    return own;
  if (const auto xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg[0] == '/')
    return xdg + "/ashlar";
  if (const auto home = env("HOME"); !home.empty() && home[0] == '/')
    return home + "/.cache/ashlar";
  return "";
}

namespace {

// The cache file's name for `source` (its path, device, inode, size and time), "" where
// there is no cache directory or no such file.
std::string cache_path(const std::string& dir, const std::string& source, std::string* key_out = nullptr) {
  struct stat src{};
  if (dir.empty() || ::stat(source.c_str(), &src) != 0)
    return "";
  char key[160]; // the time to the nanosecond: a file rewritten in place within a second is another file
  std::snprintf(key, sizeof key, "%016zx-%lx-%lx-%lx-%lx.%lx", std::hash<std::string>{}(source),
                static_cast<unsigned long>(src.st_dev), static_cast<unsigned long>(src.st_ino),
                static_cast<unsigned long>(src.st_size), static_cast<unsigned long>(src.st_mtim.tv_sec),
                static_cast<unsigned long>(src.st_mtim.tv_nsec));
  if (key_out)
    *key_out = key;
  return dir + "/pixels-" + key;
}

}  // namespace

std::shared_ptr<const uint8_t> cached_pixels(const std::string& source, const uint8_t (&header)[16], size_t pixels) {
  const auto path = cache_path(usable_dir(), source);
  return path.empty() ? nullptr : map_cached(path, sizeof header + pixels, header);
}

std::shared_ptr<const uint8_t> share_pixels(const std::string& source, const uint8_t (&header)[16],
                                            std::vector<uint8_t> decoded) {
  auto owned = [&] {
    auto v = std::make_shared<std::vector<uint8_t>>(std::move(decoded));
    return std::shared_ptr<const uint8_t>(v, v->data());
  };
  const auto dir = usable_dir();
  std::string key;
  const auto path = cache_path(dir, source, &key);
  if (path.empty())
    return owned();
  const auto source_key = std::hash<std::string>{}(source);
  const size_t size = sizeof header + decoded.size();
  if (auto mapped = map_cached(path, size, header))
    return mapped;
  if (write_cached(path, header, decoded)) {
    char prefix[48];
    std::snprintf(prefix, sizeof prefix, "pixels-%016zx-", source_key);
    forget_older(dir, prefix, std::string{"pixels-"} + key);
    if (auto mapped = map_cached(path, size, header))
      return mapped;
  }
  spdlog::debug("data: no shared copy of {} in {} (this process keeps its own)", source, dir);
  return owned();
}

}  // namespace ashlar
