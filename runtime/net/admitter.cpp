#include "runtime/core/clock.hpp"
#include "runtime/os/threads.hpp"
#include "runtime/net/admitter.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <list>
#include <mutex>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ashlar::net {

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
  } else {
    return "local";
  }
  return std::string{host} + ":" + std::to_string(port);
}

namespace {

// At most `per_second` refusals a second are logged; the rest are counted and reported
// with the next one logged (a flood of refused peers must not become a flood of lines).
class refusal_log {
public:
  void note(const std::string& what, const std::string& peer, const std::string& why) {
    std::lock_guard<std::mutex> guard{mtx_};
    auto now = steady_now();
    if (now - window_ > std::chrono::seconds(1)) {
      window_ = now;
      logged_ = 0;
    }
    if (logged_ >= per_second) {
      ++suppressed_;
      return;
    }
    ++logged_;
    if (suppressed_ > 0)
      spdlog::warn("{}: refused a connection from {}: {} ({} more refused, not logged)", what, peer, why,
                   std::exchange(suppressed_, 0));
    else
      spdlog::warn("{}: refused a connection from {}: {}", what, peer, why);
  }

private:
  static constexpr int per_second = 5;
  std::mutex mtx_;
  std::chrono::steady_clock::time_point window_{};
  int logged_ = 0;
  uint64_t suppressed_ = 0;
};

refusal_log& refusals() {
  static refusal_log log;
  return log;
}

} // namespace

struct admitter::impl {
  struct entry {
    int fd = -1;
    std::unique_ptr<handshake> hs;
    on_admitted done;
    std::chrono::steady_clock::time_point deadline;
    std::string peer;
    std::string source; // the peer's address without its port
    std::shared_ptr<void> counted; // in its source's count while being admitted
  };

  net_security sec;
  std::string what;
  // Connections open per source address, admitted or being admitted (shared with the
  // holds handed out). A connection counts from its accept on: one whose handshake just
  // ended is never missed by the next accept (its peer may connect again before the
  // admitted one's hold is taken).
  struct open_counts {
    std::mutex mtx;
    std::map<std::string, size_t> by_source;
  };
  std::shared_ptr<open_counts> open = std::make_shared<open_counts>();

  // A hold on one of `source`'s connections: given back when its owner drops it. Caller
  // holds open->mtx.
  std::shared_ptr<void> hold_locked(const std::string& source) {
    ++open->by_source[source];
    auto counts = open;
    return std::shared_ptr<void>(counts.get(), [counts, source](void*) { // (never null: a hold is one)
      std::lock_guard<std::mutex> guard{counts->mtx};
      auto it = counts->by_source.find(source);
      if (it != counts->by_source.end() && --it->second == 0)
        counts->by_source.erase(it);
    });
  }

  // A hold for a connection from `source` being admitted, or nothing if the source holds
  // as many as it may.
  std::shared_ptr<void> count_in(const std::string& source) {
    std::lock_guard<std::mutex> guard{open->mtx};
    auto it = open->by_source.find(source);
    if (it != open->by_source.end() && it->second >= sec.max_per_source)
      return nullptr;
    return hold_locked(source);
  }
  tokens_fn tokens;
  std::mutex mtx;
  std::function<void()> tick; // on_tick()
  bool stopped = false;
  std::deque<entry> incoming;
  int wake[2] = {-1, -1};
  std::thread thread;

  void poke() {
    char c = 1;
    (void) !::write(wake[1], &c, 1);
  }

  void finish(entry& e, handshake::result r) {
    if (r == handshake::result::admitted) {
      admitted a;
      a.fd = e.fd;
      a.peer = e.peer;
      a.peer_name = e.hs->peer_name();
      a.token = e.hs->matched();
      a.ssl = e.hs->release_ssl();
      a.sealed = e.hs->sealed();
      if (a.sealed)
        a.keys = e.hs->keys();
      a.hold = std::move(e.counted); // the count taken at its accept goes with it
      // `done` owns the connection from here; it must not let an exception out, and one
      // that does is logged rather than ending the process.
      try {
        e.done(std::move(a));
      } catch (const std::exception& ex) {
        spdlog::error("{}: could not serve {}: {}", what, e.peer, ex.what());
      }
    } else {
      refusals().note(what, e.peer, e.hs->why());
      e.hs.reset();
      ::close(e.fd);
    }
    e.fd = -1;
  }

  // Beyond the cap, the source with the most connections being admitted loses its
  // oldest: a flood from one address pushes out only its own connections, never another's,
  // and a peer that holds connections open without finishing the handshake delays no one
  // for long.
  void make_room(std::list<entry>& pending) {
    if (pending.size() <= sec.max_pending)
      return;
    std::map<std::string, size_t> per_source;
    for (const auto& e : pending)
      ++per_source[e.source];
    while (pending.size() > sec.max_pending) {
      auto most = std::max_element(per_source.begin(), per_source.end(),
                                   [](const auto& x, const auto& y) { return x.second < y.second; });
      auto old = std::find_if(pending.begin(), pending.end(), [&](const entry& e) { return e.source == most->first; });
      old->hs->expire("more than " + std::to_string(sec.max_pending) + " connections were being admitted at once; "
                      "the oldest of the source with the most (" + most->first + ", "
                      + std::to_string(most->second) + ") was dropped");
      finish(*old, handshake::result::refused);
      pending.erase(old);
      --most->second;
    }
  }

  void run() {
    std::list<entry> pending;
    std::vector<pollfd> fds;
    for (;;) {
      {
        std::lock_guard<std::mutex> guard{mtx};
        if (stopped)
          break;
        while (!incoming.empty()) {
          pending.push_back(std::move(incoming.front()));
          incoming.pop_front();
        }
      }
      make_room(pending);
      std::function<void()> each_tick;
      {
        std::lock_guard<std::mutex> guard{mtx};
        each_tick = tick;
      }
      if (each_tick)
        each_tick();
      auto now = steady_now();
      for (auto it = pending.begin(); it != pending.end();) {
        auto r = it->hs->step();
        if (r == handshake::result::pending && now > it->deadline)
          r = it->hs->expire("it did not finish the handshake within "
                             + std::to_string(sec.handshake_timeout.count() / 1000.0).substr(0, 4) + " s");
        if (r != handshake::result::pending) {
          finish(*it, r);
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      fds.clear();
      fds.push_back(pollfd{wake[0], POLLIN, 0});
      auto next = now + std::chrono::seconds(1);
      for (auto& e : pending) {
        fds.push_back(pollfd{e.fd, e.hs->events(), 0});
        next = std::min(next, e.deadline);
      }
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
      ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(wait, 1)));
      if (fds[0].revents & POLLIN) {
        char buf[64];
        while (::read(wake[0], buf, sizeof buf) > 0) {
        }
      }
    }
    for (auto& e : pending) {
      e.hs.reset();
      ::close(e.fd);
    }
    std::lock_guard<std::mutex> guard{mtx};
    for (auto& e : incoming) {
      e.hs.reset();
      ::close(e.fd);
    }
    incoming.clear();
  }
};

admitter::admitter(net_security sec, std::string what, tokens_fn tokens) : impl_(std::make_unique<impl>()) {
  impl_->sec = std::move(sec);
  impl_->what = std::move(what);
  impl_->tokens = std::move(tokens);
  if (::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0)
    impl_->wake[0] = impl_->wake[1] = -1;
  impl_->thread = std::thread{[p = impl_.get()] {
    name_this_thread("ashlar.admit");
    p->run();
  }};
}

admitter::~admitter() {
  stop();
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

const net_security& admitter::security() const {
  return impl_->sec;
}

bool admitter::admit(int fd, on_admitted done) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  impl::entry e;
  e.fd = fd;
  e.done = std::move(done);
  e.peer = peer_address(fd);
  e.source = e.peer.substr(0, e.peer.rfind(':'));
  e.counted = impl_->count_in(e.source);
  if (!e.counted) {
    refusals().note(impl_->what, e.peer, std::to_string(impl_->sec.max_per_source) + " connections from "
                                             + e.source + " are open, the most one address may hold");
    ::close(fd);
    return true;
  }
  e.deadline = steady_now() + impl_->sec.handshake_timeout;
  e.hs = std::make_unique<handshake>(fd, true, impl_->sec,
                                     impl_->tokens ? impl_->tokens() : std::vector<std::string>{});
  {
    std::lock_guard<std::mutex> guard{impl_->mtx};
    if (impl_->stopped)
      return false;
    impl_->incoming.push_back(std::move(e));
  }
  impl_->poke();
  return true;
}

void admitter::on_tick(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> guard{impl_->mtx};
    impl_->tick = std::move(f);
  }
  impl_->poke();
}

void admitter::stop() {
  {
    std::lock_guard<std::mutex> guard{impl_->mtx};
    if (impl_->stopped)
      return;
    impl_->stopped = true;
  }
  impl_->poke();
  if (impl_->thread.joinable())
    impl_->thread.join();
}

}  // namespace ashlar::net
