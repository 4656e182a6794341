#include "runtime/net/shm_arena.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ashlar::net {

namespace {

constexpr size_t page = 4096;
constexpr int populate_write = 23; // MADV_POPULATE_WRITE (Linux 5.14); older kernels refuse it, harmlessly

size_t page_round(size_t n) {
  return (n + page - 1) / page * page;
}

// (through syscall: the C library of some systems declares no wrappers)
int pidfd_open(int pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
int pidfd_getfd(int pidfd, int fd) {
  return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
}

std::string errno_text() {
  return std::strerror(errno);
}

// The arenas of this process by job key (a key is the job's secret: it stays in memory).
std::mutex registry_mtx;
std::map<std::string, std::weak_ptr<shm_arena>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<shm_arena>>; // outlives every arena
  return *r;
}

} // namespace

expected<std::shared_ptr<shm_arena>> shm_arena::make(size_t reserved) {
  std::shared_ptr<shm_arena> a{new shm_arena};
  a->fd_ = ::memfd_create("ashlar-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd_ < 0)
    return make_error(errc::io_error, "memfd_create for a shared-memory arena: " + errno_text());
  a->size_ = page_round(reserved);
  // Sealed at its size: a peer's mapping can never lose pages under it (SIGBUS).
  if (::fchmod(a->fd_, 0600) != 0 || ::ftruncate(a->fd_, static_cast<off_t>(a->size_)) != 0
      || ::fcntl(a->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return make_error(errc::io_error, "sizing a shared-memory arena of " + std::to_string(a->size_)
                                        + " bytes: " + errno_text());
  void* at = ::mmap(nullptr, a->size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd_, 0);
  if (at == MAP_FAILED)
    return make_error(errc::io_error, "mapping a shared-memory arena: " + errno_text());
  a->base_ = static_cast<uint8_t*>(at);
  return a;
}

expected<std::shared_ptr<shm_arena>> shm_arena::for_job(const std::string& key) {
  std::lock_guard<std::mutex> guard{registry_mtx};
  auto& r = registry();
  if (auto a = r[key].lock())
    return a;
  for (auto it = r.begin(); it != r.end();) // arenas of jobs gone
    it = it->second.expired() ? r.erase(it) : std::next(it);
  auto a = make();
  if (a)
    r[key] = *a;
  return a;
}

shm_arena::~shm_arena() {
  if (base_ != nullptr)
    ::munmap(base_, size_);
  if (fd_ >= 0)
    ::close(fd_);
}

void shm_arena::hold_until(std::function<bool()> released, int pid, std::shared_ptr<void> owner) {
  std::lock_guard<std::mutex> guard{mtx_};
  held_.push_back(held{std::move(released), pid, std::move(owner)});
}

void shm_arena::sweep_held() {
  std::vector<std::shared_ptr<void>> gone; // let go outside the lock (their buffers come back here)
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->released() || (::kill(it->pid, 0) != 0 && errno == ESRCH)) {
        gone.push_back(std::move(it->owner));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

std::shared_ptr<float> shm_arena::allocate(size_t n) {
  sweep_held();
  const size_t bytes = page_round(std::max<size_t>(n * sizeof(float), 1));
  size_t offset = 0;
  bool fresh = true; // no resident pages yet
  {
    std::lock_guard<std::mutex> guard{mtx_};
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      auto& list = it->second;
      // A resident block first: its pages need no faults.
      auto pick = std::find_if(list.rbegin(), list.rend(), [](const free_block& b) { return b.resident; });
      auto chosen = pick != list.rend() ? std::prev(pick.base()) : std::prev(list.end());
      offset = chosen->offset;
      fresh = !chosen->resident;
      if (chosen->resident)
        cached_ -= bytes;
      list.erase(chosen);
    } else {
      if (bytes > size_ - top_)
        return nullptr;
      offset = top_;
      top_ += bytes;

    }
    in_use_ += bytes;
  }
  if (fresh) // its pages all at once: a fault per page costs more (in a VM above all)
    (void) ::madvise(base_ + offset, bytes, populate_write);
  auto self = shared_from_this();
  return std::shared_ptr<float>(reinterpret_cast<float*>(base_ + offset),
                                [self, offset, bytes](float*) { self->let_go(offset, bytes); });
}

void shm_arena::let_go(size_t offset, size_t bytes) {
  std::lock_guard<std::mutex> guard{mtx_};
  in_use_ -= bytes;
  bool resident = true;
  // The cache holds at least two of the largest buffers (each of their pages would be a
  // fault for both processes on the next use: shared memory has no huge pages here).
  largest_ = std::max(largest_, bytes);
  if (cached_ + bytes > std::max(resident_cache, 2 * largest_)) {
    // Its pages go back to the system; the range stays reserved for the same size.
    ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(bytes));
    resident = false;
  } else {
    cached_ += bytes;
  }
  free_[bytes].push_back(free_block{offset, resident});
}

bool shm_arena::contains(const void* p, size_t bytes) const {
  auto* b = static_cast<const uint8_t*>(p);
  return b >= base_ && bytes <= size_ && static_cast<size_t>(b - base_) <= size_ - bytes;
}

std::optional<wire::shared_tensor> shm_arena::share(const wire::shared_tensor& t, std::optional<uint64_t> version) {
  const size_t bytes = t.size() * sizeof(float);
  if (bytes < min_share_bytes)
    return std::nullopt;
  if (contains(t.data(), bytes))
    return t;
  const version_key key{t.data(), t.size(), version.value_or(0)};
  std::vector<shared_version> gone; // let go outside the lock (their buffers come back here)
  if (version) {
    std::lock_guard<std::mutex> guard{mtx_};
    // Copies of versions whose storage is gone are let go (the shard moved on).
    for (auto it = versions_.begin(); it != versions_.end();) {
      if (it->second.source.expired()) {
        gone.push_back(std::move(it->second));
        it = versions_.erase(it);
      } else {
        ++it;
      }
    }
    auto it = versions_.find(key);
    if (it != versions_.end()) {
      it->second.used = ++uses_;
      return it->second.copy;
    }
  }
  auto block = allocate(t.size());
  if (!block)
    return std::nullopt;
  std::memcpy(block.get(), t.data(), bytes);
  wire::shared_tensor copy{std::shared_ptr<const float>(std::move(block)), t.size()};
  if (version) {
    std::lock_guard<std::mutex> guard{mtx_};
    // An older version of the same storage will not be asked for again (it was written
    // in place since).
    for (auto it = versions_.begin(); it != versions_.end();) {
      if (it->first.data == key.data && it->first.size == key.size && it->first.version != key.version) {
        gone.push_back(std::move(it->second));
        it = versions_.erase(it);
      } else {
        ++it;
      }
    }
    if (versions_.size() >= max_versions) {
      auto oldest = std::min_element(versions_.begin(), versions_.end(),
                                     [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
      gone.push_back(std::move(oldest->second));
      versions_.erase(oldest);
    }
    auto [at, fresh] = versions_.emplace(key, shared_version{t.storage(), copy, ++uses_});
    (void)at;
    (void)fresh; // (another thread made the same copy at once: this one goes with its reply)
  }
  return copy;
}

size_t shm_arena::bytes_in_use() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return in_use_;
}

size_t shm_arena::bytes_cached() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return cached_;
}

peer_arena::~peer_arena() {
  if (at != nullptr)
    ::munmap(const_cast<uint8_t*>(at), size);
}

expected<std::shared_ptr<peer_arena>> map_peer_arena(int pid, int fd, uint64_t base, size_t size) {
  const std::string what = "the arena of process " + std::to_string(pid);
  if (fd < 0 || size == 0 || size % page != 0 || size > (size_t{1} << 46))
    return make_error(errc::malformed_message, what + ": descriptor " + std::to_string(fd) + ", "
                                                 + std::to_string(size) + " bytes");
  const int pidfd = pidfd_open(pid);
  if (pidfd < 0)
    return make_error(errc::peer_unreachable, what + ": pidfd_open: " + errno_text());
  const int mine = pidfd_getfd(pidfd, fd);
  const int e = errno;
  ::close(pidfd);
  if (mine < 0)
    return make_error(errc::handshake_refused, what + ": pidfd_getfd: " + std::strerror(e));
  struct stat st{};
  const int seals = ::fcntl(mine, F_GET_SEALS);
  caf::error err;
  if (::fstat(mine, &st) != 0 || !S_ISREG(st.st_mode))
    err = make_error(errc::malformed_message, what + " is not a memory segment");
  else if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    err = make_error(errc::malformed_message, what + ": its size is not sealed (it could shrink under this process)");
  else if (static_cast<uint64_t>(st.st_size) < size)
    err = make_error(errc::malformed_message, what + " holds " + std::to_string(st.st_size) + " bytes, not "
                                                + std::to_string(size));
  if (err) {
    ::close(mine);
    return err;
  }
  // One mapping per peer arena in this process, whatever the number of connections to it
  // (a node of 32 workers reading one server's versions maps its pages once).
  static std::mutex mapped_mtx;
  static auto* mapped = new std::map<std::tuple<int, dev_t, ino_t>, std::weak_ptr<peer_arena>>;
  std::lock_guard<std::mutex> guard{mapped_mtx};
  const auto key = std::make_tuple(pid, st.st_dev, st.st_ino);
  if (auto m = (*mapped)[key].lock(); m && m->base == base && m->size == size) {
    ::close(mine);
    return m;
  }
  void* at = ::mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, mine, 0);
  ::close(mine);
  if (at == MAP_FAILED)
    return make_error(errc::io_error, "mapping " + what + ": " + errno_text());
  auto m = std::make_shared<peer_arena>();
  m->at = static_cast<const uint8_t*>(at);
  m->base = base;
  m->size = size;
  for (auto it = mapped->begin(); it != mapped->end();) // mappings of peers gone
    it = it->second.expired() ? mapped->erase(it) : std::next(it);
  (*mapped)[key] = m;
  return m;
}

}  // namespace ashlar::net
