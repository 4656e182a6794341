#include "runtime/net/shm_arena.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

// (older kernel headers name neither; the numbers are the same on every architecture)
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace ashlar::net {

namespace {

constexpr size_t page = 4096;
constexpr int populate_write = 23; // MADV_POPULATE_WRITE (Linux 5.14); older kernels refuse it, harmlessly

size_t page_round(size_t n) {
  return (n + page - 1) / page * page;
}

// (through syscall: the C library of some systems declares no wrapper)
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

// The segment and its buffers (free lists by size, a bump pointer). Every buffer handed
// out holds it, so the mapping outlives the last of them; the arena (its version copies)
// may go first.
struct shm_arena::pages : std::enable_shared_from_this<pages> {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t size = 0;
  std::mutex mtx;
  size_t top = 0;     // the bump pointer
  size_t in_use = 0;  // bytes handed out
  size_t cached = 0;  // resident bytes in free_
  size_t largest = 0; // the largest buffer let go
  struct free_block {
    size_t offset;
    bool resident;
  };
  std::unordered_map<size_t, std::vector<free_block>> free; // by size in bytes

  ~pages() {
    if (base != nullptr)
      ::munmap(base, size);
    if (fd >= 0)
      ::close(fd);
  }

  std::shared_ptr<float> allocate(size_t n) {
    const size_t bytes = page_round(std::max<size_t>(n * sizeof(float), 1));
    size_t offset = 0;
    bool fresh = true; // no resident pages yet
    {
      std::lock_guard<std::mutex> guard{mtx};
      auto it = free.find(bytes);
      if (it != free.end() && !it->second.empty()) {
        auto& list = it->second;
        // A resident block first: its pages need no faults.
        auto pick = std::find_if(list.rbegin(), list.rend(), [](const free_block& b) { return b.resident; });
        auto chosen = pick != list.rend() ? std::prev(pick.base()) : std::prev(list.end());
        offset = chosen->offset;
        fresh = !chosen->resident;
        if (chosen->resident)
          cached -= bytes;
        list.erase(chosen);
      } else {
        if (bytes > size - top)
          return nullptr;
        offset = top;
        top += bytes;
      }
      in_use += bytes;
    }
    if (fresh) // its pages all at once: a fault per page costs more (in a VM above all)
      (void) ::madvise(base + offset, bytes, populate_write);
    auto self = shared_from_this();
    return std::shared_ptr<float>(reinterpret_cast<float*>(base + offset),
                                  [self, offset, bytes](float*) { self->let_go(offset, bytes); });
  }

  void let_go(size_t offset, size_t bytes) {
    std::lock_guard<std::mutex> guard{mtx};
    in_use -= bytes;
    bool resident = true;
    // The cache holds at least two of the largest buffers (each of their pages would be
    // a fault for both processes on the next use: shared memory has no huge pages here).
    largest = std::max(largest, bytes);
    if (cached + bytes > std::max(resident_cache, 2 * largest)) {
      // Its pages go back to the system; the range stays reserved for the same size.
      ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes));
      resident = false;
    } else {
      cached += bytes;
    }
    free[bytes].push_back(free_block{offset, resident});
  }
};

namespace {

// Buffers that closed connections' peers may still read in place, for the whole process.
struct held {
  std::function<bool()> released;
  int pidfd; // the peer's process: readable once it ended (-1: none)
  int pid;
  std::shared_ptr<void> owner;
};
std::mutex held_mtx;
std::vector<held>& held_buffers() {
  static auto* h = new std::vector<held>; // outlives every arena
  return *h;
}

// Only when it is certain: a buffer let go while the peer still reads it would be
// written under it.
bool process_ended(int pidfd, int pid) {
  if (pidfd < 0)
    return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// Lets go of held buffers whose peer let go or ended (outside the lock: their deleters
// take arena locks).
void sweep_held() {
  std::vector<std::shared_ptr<void>> gone;
  {
    std::lock_guard<std::mutex> guard{held_mtx};
    auto& h = held_buffers();
    for (auto it = h.begin(); it != h.end();) {
      if (it->released() || process_ended(it->pidfd, it->pid)) {
        if (it->pidfd >= 0)
          ::close(it->pidfd);
        gone.push_back(std::move(it->owner));
        it = h.erase(it);
      } else {
        ++it;
      }
    }
  }
}

} // namespace

void shm_arena::hold_until(std::function<bool()> released, int pidfd, int pid, std::shared_ptr<void> owner) {
  std::lock_guard<std::mutex> guard{held_mtx};
  held_buffers().push_back(held{std::move(released), pidfd, pid, std::move(owner)});
}

expected<std::shared_ptr<shm_arena>> shm_arena::make(size_t reserved) {
  std::shared_ptr<shm_arena> a{new shm_arena};
  a->pages_ = std::make_shared<pages>();
  auto& p = *a->pages_;
  p.fd = ::memfd_create("ashlar-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (p.fd < 0)
    return make_error(errc::io_error, "memfd_create for a shared-memory arena: " + errno_text());
  p.size = page_round(reserved);
  // Sealed at its size: a peer's mapping can never lose pages under it (SIGBUS).
  if (::fchmod(p.fd, 0600) != 0 || ::ftruncate(p.fd, static_cast<off_t>(p.size)) != 0
      || ::fcntl(p.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return make_error(errc::io_error, "sizing a shared-memory arena of " + std::to_string(p.size)
                                        + " bytes: " + errno_text());
  void* at = ::mmap(nullptr, p.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, p.fd, 0);
  if (at == MAP_FAILED)
    return make_error(errc::io_error, "mapping a shared-memory arena: " + errno_text());
  p.base = static_cast<uint8_t*>(at);
  return a;
}

expected<std::shared_ptr<shm_arena>> shm_arena::for_job(const std::string& key) {
  sweep_held();
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
  std::map<version_key, shared_version> gone;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    gone.swap(versions_); // (their buffers go back to the pages, outside the lock)
  }
}

std::shared_ptr<float> shm_arena::allocate(size_t n) {
  sweep_held();
  return pages_->allocate(n);
}

std::shared_ptr<void> shm_arena::add_reclaimer(std::function<void()> r) {
  std::lock_guard<std::mutex> guard{reclaim_mtx_};
  const uint64_t id = next_reclaimer_++;
  reclaimers_.emplace(id, std::move(r));
  std::weak_ptr<shm_arena> self = shared_from_this();
  return std::shared_ptr<void>(nullptr, [self, id](void*) {
    if (auto a = self.lock()) {
      std::lock_guard<std::mutex> guard{a->reclaim_mtx_};
      a->reclaimers_.erase(id);
    }
  });
}

void shm_arena::reclaim() {
  std::lock_guard<std::mutex> guard{reclaim_mtx_};
  for (auto& [id, r] : reclaimers_)
    r();
}

int shm_arena::fd() const {
  return pages_->fd;
}

uint64_t shm_arena::base() const {
  return reinterpret_cast<uint64_t>(pages_->base);
}

size_t shm_arena::size() const {
  return pages_->size;
}

bool shm_arena::contains(const void* p, size_t bytes) const {
  auto* b = static_cast<const uint8_t*>(p);
  return b >= pages_->base && bytes <= pages_->size && static_cast<size_t>(b - pages_->base) <= pages_->size - bytes;
}

std::optional<wire::shared_tensor> shm_arena::share(const wire::shared_tensor& t, std::optional<uint64_t> version) {
  const size_t bytes = t.size() * sizeof(float);
  if (bytes < min_share_bytes)
    return std::nullopt;
  const version_key key{t.data(), t.size(), version.value_or(0)};
  std::vector<shared_version> gone; // let go outside the lock (their buffers come back here)
  if (version) {
    std::lock_guard<std::mutex> guard{mtx_};
    // Copies of versions whose storage is gone are let go (the shard moved on), also when
    // this version needs none (a shard whose versions came back to the arena).
    for (auto it = versions_.begin(); it != versions_.end();) {
      if (it->second.source.expired()) {
        gone.push_back(std::move(it->second));
        it = versions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (contains(t.data(), bytes))
    return t;
  if (version) {
    std::lock_guard<std::mutex> guard{mtx_};
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
  std::lock_guard<std::mutex> guard{pages_->mtx};
  return pages_->in_use;
}

size_t shm_arena::bytes_cached() const {
  std::lock_guard<std::mutex> guard{pages_->mtx};
  return pages_->cached;
}

peer_arena::~peer_arena() {
  if (at != nullptr)
    ::munmap(const_cast<uint8_t*>(at), size);
}

int open_pidfd(int pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

expected<std::shared_ptr<peer_arena>> map_peer_arena(int pid, int fd, uint64_t base, size_t size) {
  const std::string what = "the arena of process " + std::to_string(pid);
  if (fd < 0 || size == 0 || size % page != 0 || size > shm_arena::reserved_bytes)
    return make_error(errc::malformed_message, what + ": descriptor " + std::to_string(fd) + ", "
                                                 + std::to_string(size) + " bytes");
  const int pidfd = open_pidfd(pid);
  if (pidfd < 0)
    return make_error(errc::peer_unreachable, what + ": pidfd_open: " + errno_text());
  const int mine = pidfd_getfd(pidfd, fd);
  const int e = errno;
  ::close(pidfd);
  if (mine < 0)
    return make_error(errc::handshake_refused, what + ": pidfd_getfd: " + std::strerror(e));
  struct stat st{};
  struct statfs fs{};
  const int seals = ::fcntl(mine, F_GET_SEALS);
  caf::error err;
  // Plain shared memory only: a segment of huge pages could fault (SIGBUS) on a read
  // once the host's pool of them runs out.
  if (::fstat(mine, &st) != 0 || !S_ISREG(st.st_mode) || ::fstatfs(mine, &fs) != 0
      || fs.f_type != TMPFS_MAGIC)
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
