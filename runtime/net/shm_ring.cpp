#include "runtime/net/shm_ring.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/core/clock.hpp"

namespace ashlar::net {

namespace {

constexpr uint64_t ring_magic = 0x474e49524c485341ull; // "ASHLRING"
constexpr size_t data_offset = 4096;                  // the header's page

size_t page_round(size_t n) {
  const size_t page = 4096;
  return (n + page - 1) / page * page;
}

// Waits while *word == seen, at most `wait`; returns at once if it differs.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::milliseconds wait) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(wait.count() / 1000);
  ts.tv_nsec = static_cast<long>((wait.count() % 1000) * 1000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) { // every waiter
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Waits for `pos` to move on from `seen` (or the ring to close), at most a second or
// `patience` if less, with `waits` raised so that the other end wakes this one.
void park(std::atomic<uint32_t>& waits, std::atomic<uint32_t>& seq, const std::atomic<uint64_t>& pos, uint64_t seen,
          const std::atomic<uint32_t>& closed, std::chrono::milliseconds patience) {
  // No spin first: measured on a busy 2-core host (6 processes of a job), spinning took
  // the cores the other end needed (a BSP job 10-20% slower) and large transfers gained
  // nothing, since the ends hand over in pieces of a quarter ring.
  waits.store(1);
  const uint32_t before = seq.load();
  if (pos.load() == seen && !closed.load()) // seq_cst: the other end sees `waits`, or this sees it move
    futex_wait(&seq, before, std::min<std::chrono::milliseconds>(patience, std::chrono::seconds(1)));
  waits.store(0);
}

// After this end moved its position: wakes the other end if it waits, once per wait (the
// flag is taken: a frame's later pieces, written before the woken end runs, make no
// further system calls; a wake costs ~10 us on a busy virtual machine).
void nudge(std::atomic<uint32_t>& waits, std::atomic<uint32_t>& seq) {
  if (waits.load() != 0 && waits.exchange(0) != 0) { // seq_cst: after this end's position moved
    seq.fetch_add(1);
    futex_wake(&seq);
  }
}

} // namespace

// Shared by both processes: every field is read as untrusted.
struct shm_ring::header {
  uint64_t magic;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> written; // moved on by the writer only
  std::atomic<uint32_t> data_seq;            // futex: bumped when bytes come and the reader waits
  std::atomic<uint32_t> reader_waits;
  alignas(64) std::atomic<uint64_t> read; // moved on by the reader only
  std::atomic<uint32_t> room_seq;         // futex: bumped when room comes and the writer waits
  std::atomic<uint32_t> writer_waits;
  alignas(64) std::atomic<uint32_t> closed;
  alignas(64) std::atomic<uint64_t> fetched; // moved on by the reader only: lent pieces copied
  std::atomic<uint32_t> fetch_seq;           // futex: bumped when a piece was copied and the writer waits
  std::atomic<uint32_t> fetch_waits;
  alignas(64) std::atomic<uint32_t> released[lease_slots]; // set by the reader: leases let go of
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the ring's positions are shared between processes: they must be lock-free");

namespace {
// The mapping of a ring, shared with the releasers of its leases.
expected<std::shared_ptr<void>> map_segment(int fd, size_t size, const std::string& name) {
  void* at = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED)
    return make_error(errc::io_error, "mapping ring " + name + ": " + std::strerror(errno));
  return std::shared_ptr<void>(at, [size](void* p) { ::munmap(p, size); });
}
} // namespace

shm_ring::~shm_ring() {
  if (fd_ >= 0)
    ::close(fd_);
}

shm_ring::shm_ring(shm_ring&& other) noexcept
  : fd_(std::exchange(other.fd_, -1)),
    map_(std::move(other.map_)),
    base_(std::exchange(other.base_, nullptr)),
    mapped_(std::exchange(other.mapped_, 0)),
    capacity_(std::exchange(other.capacity_, 0)),
    name_(std::move(other.name_)),
    watch_(std::move(other.watch_)) {
}

shm_ring& shm_ring::operator=(shm_ring&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    map_ = std::move(other.map_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    name_ = std::move(other.name_);
    watch_ = std::move(other.watch_);
  }
  return *this;
}

uint8_t* shm_ring::data() const {
  static_assert(sizeof(header) <= data_offset);
  return static_cast<uint8_t*>(base_) + data_offset;
}

caf::error shm_ring::broken(const std::string& why) const {
  return make_error(errc::malformed_message, "shared-memory ring " + name_ + ": " + why);
}

expected<shm_ring> shm_ring::create(size_t capacity, const std::string& name) {
  const size_t cap = page_round(std::max<size_t>(capacity, 4096));
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return make_error(errc::io_error, "memfd_create for ring " + name + ": " + std::strerror(errno));
  shm_ring r;
  r.fd_ = fd;
  r.name_ = name;
  // Its size is sealed: the peer cannot shrink it under this process's mapping.
  if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, static_cast<off_t>(data_offset + cap)) != 0
      || ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return make_error(errc::io_error, "sizing ring " + name + ": " + std::strerror(errno));
  r.mapped_ = data_offset + cap;
  auto map = map_segment(fd, r.mapped_, name);
  if (!map)
    return map.error();
  r.map_ = std::move(*map);
  r.base_ = r.map_.get();
  auto* h = new (r.base_) header{};
  h->magic = ring_magic;
  h->capacity = cap;
  r.capacity_ = cap;
  return r;
}

expected<shm_ring> shm_ring::attach(int fd, const std::string& name) {
  shm_ring r;
  r.name_ = name;
  r.fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (r.fd_ < 0)
    return make_error(errc::io_error, "ring " + name + ": " + std::strerror(errno));
  struct stat st{};
  const int seals = ::fcntl(r.fd_, F_GET_SEALS);
  if (::fstat(r.fd_, &st) != 0 || !S_ISREG(st.st_mode))
    return r.broken("not a memory segment");
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return r.broken("its size is not sealed (the peer could shrink it under this process)");
  const auto size = static_cast<size_t>(st.st_size);
  if (size <= data_offset || size % 4096 != 0 || size > (size_t{1} << 34))
    return r.broken("a segment of " + std::to_string(size) + " bytes");
  r.mapped_ = size;
  auto map = map_segment(r.fd_, size, name);
  if (!map)
    return map.error();
  r.map_ = std::move(*map);
  r.base_ = r.map_.get();
  // What the header says is checked once against the mapping; the size used from then on
  // is this process's own.
  if (r.head()->magic != ring_magic || r.head()->capacity != size - data_offset)
    return r.broken("not a ring of this segment's size (magic or capacity)");
  r.capacity_ = size - data_offset;
  return r;
}

void shm_ring::close() {
  if (base_ == nullptr)
    return;
  auto* h = head();
  h->closed.store(1);
  h->data_seq.fetch_add(1);
  h->room_seq.fetch_add(1);
  h->fetch_seq.fetch_add(1);
  futex_wake(&h->data_seq);
  futex_wake(&h->room_seq);
  futex_wake(&h->fetch_seq);
}

caf::error shm_ring::still_waiting(std::chrono::steady_clock::time_point since, std::chrono::milliseconds patience,
                                   const char* what) {
  const auto now = steady_now();
  if (now - since > patience)
    return make_error(errc::peer_unreachable, "shared-memory ring " + name_ + ": " + what + " within "
                                                + std::to_string(patience.count()) + " ms");
  if (watch_ && now - watched_ >= std::chrono::seconds(1)) {
    watched_ = now;
    return watch_();
  }
  return {};
}

void shm_ring::mark_fetched() {
  auto* h = head();
  h->fetched.fetch_add(1);
  nudge(h->fetch_waits, h->fetch_seq);
}

bool shm_ring::closed() const {
  return base_ == nullptr || head()->closed.load() != 0;
}

uint64_t shm_ring::fetched() const {
  return base_ == nullptr ? 0 : head()->fetched.load(std::memory_order_acquire);
}

uint32_t shm_ring::released(uint32_t slot) const {
  return base_ == nullptr || slot >= lease_slots ? 0 : head()->released[slot].load(std::memory_order_acquire);
}

std::function<bool()> shm_ring::released_check(uint32_t slot, uint32_t gen) const {
  if (base_ == nullptr || slot >= lease_slots)
    return [] { return true; };
  return [map = map_, word = &head()->released[slot], gen] { return word->load(std::memory_order_acquire) == gen; };
}

std::function<void()> shm_ring::releaser(uint32_t slot, uint32_t gen) const {
  if (base_ == nullptr || slot >= lease_slots)
    return [] {};
  return [map = map_, word = &head()->released[slot], gen] { word->store(gen, std::memory_order_release); };
}

caf::error shm_ring::await_fetched(uint64_t count, std::chrono::milliseconds patience) {
  if (base_ == nullptr)
    return make_error(errc::invalid_state, "shared-memory ring " + name_ + " is not open");
  auto* h = head();
  const auto since = steady_now();
  for (;;) {
    const uint64_t f = h->fetched.load(std::memory_order_acquire);
    if (f >= count) // a reader that claims more than it was lent only fools itself
      return {};
    if (h->closed.load())
      return make_error(errc::peer_unreachable, "shared-memory ring " + name_ + " closed");
    if (auto err = still_waiting(since, patience, "the peer took no lent buffer"))
      return err;
    park(h->fetch_waits, h->fetch_seq, h->fetched, f, h->closed, patience);
  }
}

caf::error shm_ring::write_all(const iovec* iov, int count, std::chrono::milliseconds patience) {
  if (base_ == nullptr)
    return make_error(errc::invalid_state, "shared-memory ring " + name_ + " is not open");
  auto* h = head();
  for (int k = 0; k < count; ++k) {
    auto* src = static_cast<const uint8_t*>(iov[k].iov_base);
    size_t left = iov[k].iov_len;
    auto waiting_since = steady_now();
    while (left > 0) {
      if (h->closed.load())
        return make_error(errc::peer_unreachable, "shared-memory ring " + name_ + " closed");
      const uint64_t w = h->written.load(std::memory_order_relaxed);
      const uint64_t r = h->read.load(std::memory_order_acquire);
      if (w - r > capacity_)
        return broken("positions " + std::to_string(r) + " and " + std::to_string(w) + " make no sense");
      const size_t room = capacity_ - static_cast<size_t>(w - r);
      if (room < std::min(left, hand_over())) { // in pieces, as the reader takes them
        nudge(h->reader_waits, h->data_seq); // what is written so far makes room once read
        if (auto err = still_waiting(waiting_since, patience, "no room"))
          return err;
        park(h->writer_waits, h->room_seq, h->read, r, h->closed, patience);
        continue;
      }
      const size_t n = std::min({left, room, hand_over()});
      const size_t at = static_cast<size_t>(w % capacity_), first = std::min(n, capacity_ - at); // then wraps
      std::memcpy(data() + at, src, first);
      std::memcpy(data(), src + first, n - first);
      h->written.store(w + n); // seq_cst: ordered before the look at reader_waits
      // A reader waiting for a frame is woken once the frame is all there (its header,
      // metadata and tensor are written one after another), or by each quarter ring of a
      // large one: one hand-off per frame, not one per part.
      if (n == hand_over())
        nudge(h->reader_waits, h->data_seq);
      src += n;
      left -= n;
      waiting_since = steady_now();
    }
  }
  nudge(h->reader_waits, h->data_seq);
  return {};
}

caf::error shm_ring::read_exact(void* buf, size_t n, std::chrono::milliseconds patience) {
  if (base_ == nullptr)
    return make_error(errc::invalid_state, "shared-memory ring " + name_ + " is not open");
  auto* h = head();
  auto* out = static_cast<uint8_t*>(buf);
  auto waiting_since = steady_now();
  while (n > 0) {
    const uint64_t r = h->read.load(std::memory_order_relaxed);
    const uint64_t w = h->written.load(std::memory_order_acquire);
    if (w - r > capacity_)
      return broken("positions " + std::to_string(r) + " and " + std::to_string(w) + " make no sense");
    const size_t have = static_cast<size_t>(w - r);
    // Bytes are taken in pieces of a quarter ring (or what the read still needs): the two
    // ends trading small pieces would spend their time on each other's cache lines.
    const bool closed = h->closed.load();
    if (have < std::min(n, hand_over()) && !(closed && have > 0)) {
      if (closed)
        return make_error(errc::peer_unreachable, "shared-memory ring " + name_ + " closed");
      if (auto err = still_waiting(waiting_since, patience, "nothing"))
        return err;
      park(h->reader_waits, h->data_seq, h->written, w, h->closed, patience);
      continue;
    }
    const size_t take = std::min(n, have);
    const size_t at = static_cast<size_t>(r % capacity_), first = std::min(take, capacity_ - at); // then wraps
    std::memcpy(out, data() + at, first);
    std::memcpy(out + first, data(), take - first);
    h->read.store(r + take); // seq_cst: ordered before the look at writer_waits
    nudge(h->writer_waits, h->room_seq);
    out += take;
    n -= take;
    waiting_since = steady_now();
  }
  return {};
}

}  // namespace ashlar::net
