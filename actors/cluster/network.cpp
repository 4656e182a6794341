#include "actors/cluster/network.hpp"

#include "actors/cluster/system.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/net/admitter.hpp"
#include "runtime/net/records.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

namespace ashlar::actors {

namespace {

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;
using caf::io::network::rw_state;

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// CAF names a connection by its socket's number, and BASP cleans a closed connection's
// state up after the socket is closed. A connection accepted in between could get the same
// number (the kernel hands out the lowest free one) and be taken for the closed one: its
// route erased with the old one's, its welcome sent nowhere, its own death never reported.
// (The storm bench lost welcomes that way while the scheduler took in the losses of nodes
// killed a moment before.) Each connection is moved to a number that cycles through the
// descriptor range instead, so that a number comes back only after thousands of others.
int fresh_number(int fd) {
  static std::atomic<uint32_t> next{0};
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return fd;
  const int lo = 256;
  const int hi = static_cast<int>(std::min<rlim_t>(rl.rlim_cur, rlim_t{1} << 16)) - 64;
  if (hi - lo < 64)
    return fd;
  const int floor = lo + static_cast<int>(next.fetch_add(1) % static_cast<uint32_t>(hi - lo));
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (moved < 0)
    moved = ::fcntl(fd, F_DUPFD_CLOEXEC, lo); // the numbers above are taken: any above lo
  if (moved < 0)
    return fd;
  ::close(fd);
  return moved;
}

// A node holds a connection per peer and a data connection per worker and shard: the soft
// limit on descriptors (often 1,024) is raised to the hard one.
void raise_descriptor_limit() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, rlim_t{1} << 20);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// How an admitted connection is protected: TLS (ssl), or sealed records under the keys of
// the gate's handshake (records.hpp).
struct protection {
  SSL* ssl = nullptr;
  bool sealed = false;
  bool server = false;
  net::session_keys keys;
  std::shared_ptr<void> hold; // the admitter's count of the source's open connections
};

protection protection_of(net::handshake& hs, bool server) {
  protection p;
  p.server = server;
  p.ssl = hs.release_ssl();
  p.sealed = hs.sealed();
  if (p.sealed)
    p.keys = hs.keys();
  return p;
}

// Reads and writes an admitted connection through TLS or sealed records, and checks each
// BASP header it reads before CAF sees it.
class guarded_policy {
public:
  guarded_policy(native_socket fd, protection p, uint64_t max_message, std::shared_ptr<net::inflight_budget> budget,
                 std::string peer)
    : ssl_(p.ssl), hold_(std::move(p.hold)), guard_(max_message, std::move(budget)), peer_(std::move(peer)) {
    guard_.watch(fd, peer_);
    if (p.sealed) {
      reader_.emplace(p.server ? p.keys.client_tx : p.keys.server_tx);
      writer_.emplace(p.server ? p.keys.server_tx : p.keys.client_tx);
    }
  }
  guarded_policy(const guarded_policy&) = delete;
  ~guarded_policy() {
    if (ssl_)
      SSL_free(ssl_);
  }

  rw_state read_some(size_t& result, native_socket fd, void* buf, size_t len) {
    result = 0;
    long n = reader_ ? read_sealed(fd, buf, len) : net::tls_io::read_some(ssl_, fd, buf, len);
    if (n < 0)
      return rw_state::failure;
    if (n > 0 && !guard_.inspect(static_cast<const uint8_t*>(buf), static_cast<size_t>(n))) {
      spdlog::warn("network: closed the connection from {}: {}", peer_, guard_.why());
      return rw_state::failure;
    }
    result = static_cast<size_t>(n);
    return rw_state::success;
  }

  rw_state write_some(size_t& result, native_socket fd, const void* buf, size_t len) {
    result = 0;
    long n = writer_ ? write_sealed(fd, static_cast<const uint8_t*>(buf), len)
                     : net::tls_io::write_some(ssl_, fd, buf, len);
    if (n < 0)
      return rw_state::failure;
    result = static_cast<size_t>(n);
    return rw_state::success;
  }

  // Bytes TLS or the record reader hold already are invisible to poll(): read them now.
  bool must_read_more(native_socket, size_t) {
    size_t n = 0;
    return ssl_ ? SSL_pending(ssl_) > 0 : reader_ && reader_->ready(n) && n > 0;
  }

private:
  long read_sealed(native_socket fd, void* buf, size_t len) {
    size_t have = 0;
    if (!reader_->ready(have))
      return broken();
    if (have == 0) {
      size_t room = 0;
      uint8_t* at = reader_->space(room);
      long got = net::tls_io::read_some(nullptr, fd, at, room);
      if (got < 0)
        return -1;
      if (!reader_->commit(static_cast<size_t>(got)))
        return broken();
    }
    return static_cast<long>(reader_->take(static_cast<uint8_t*>(buf), len));
  }

  long broken() {
    spdlog::warn("network: closed the connection from {}: {}", peer_, reader_->why());
    return -1;
  }

  // CAF offers the same bytes again until they are reported written: a record sealed from
  // them is reported once it is sent whole, and nothing new is sealed before.
  long write_sealed(native_socket fd, const uint8_t* buf, size_t len) {
    size_t done = 0;
    for (;;) {
      if (writer_->idle()) {
        done += std::exchange(sealed_, 0);
        if (done == len)
          break;
        sealed_ = writer_->seal(buf + done, len - done);
        if (sealed_ == 0)
          return -1;
      }
      size_t n = 0;
      const uint8_t* p = writer_->pending(n);
      long put = net::tls_io::write_some(nullptr, fd, p, n);
      if (put < 0)
        return -1;
      if (put == 0)
        break;
      writer_->sent(static_cast<size_t>(put));
    }
    if (done == len)
      writer_->release();
    return static_cast<long>(done);
  }

  SSL* ssl_;
  std::shared_ptr<void> hold_;
  std::optional<net::record_reader> reader_;
  std::optional<net::record_writer> writer_;
  size_t sealed_ = 0; // bytes of CAF's buffer in the record being sent
  net::basp_frame_guard guard_;
  std::string peer_;
};

class guarded_scribe : public caf::io::scribe {
public:
  guarded_scribe(default_multiplexer& mpx, native_socket fd, protection p, uint64_t max_message,
                 std::shared_ptr<net::inflight_budget> budget, std::string peer)
    : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)),
      stream_(mpx, fd, fd, p, max_message, std::move(budget), std::move(peer)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
    }
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string{};
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  bool launched_ = false;
  caf::io::network::stream_impl<guarded_policy> stream_;
};

class admitting_doorman : public caf::io::network::doorman_impl {
public:
  admitting_doorman(default_multiplexer& mpx, native_socket fd, std::shared_ptr<net::admitter> gk,
                    std::shared_ptr<net::inflight_budget> budget)
    : caf::io::network::doorman_impl(mpx, fd), gk_(std::move(gk)), budget_(std::move(budget)) {}

  bool new_connection() override {
    if (detached())
      return false;
    int fd = fresh_number(acceptor_.accepted_socket());
    set_nodelay(fd);
    caf::intrusive_ptr<admitting_doorman> door{this};
    bool taken = gk_->admit(fd, [door](net::admitter::admitted a) {
      if (!a.peer_name.empty())
        spdlog::debug("network: admitted {} ({})", a.peer, a.peer_name);
      protection p{a.ssl, a.sealed, true, a.keys, a.hold};
      door->mpx().dispatch([door, fd = a.fd, p, peer = a.peer] { door->hand_over(fd, p, peer); });
    });
    if (!taken)
      ::close(fd);
    return true;
  }

  // On the network thread, after admission: the connection becomes BASP's.
  void hand_over(int fd, const protection& p, const std::string& peer) {
    if (detached() || parent() == nullptr) {
      if (p.ssl)
        SSL_free(p.ssl);
      ::close(fd);
      return;
    }
    auto& mpx = acceptor_.backend();
    auto scribe = caf::make_counted<guarded_scribe>(mpx, fd, p, gk_->security().max_message, budget_, peer);
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    doorman::new_connection(&mpx, hdl);
  }

  default_multiplexer& mpx() { return acceptor_.backend(); }

private:
  std::shared_ptr<net::admitter> gk_;
  std::shared_ptr<net::inflight_budget> budget_;
};

// The middleman actor whose connect and open go through admission.
class admitting_middleman : public caf::io::middleman_actor_impl {
public:
  admitting_middleman(caf::actor_config& cfg, caf::actor broker, std::shared_ptr<net::admitter> gk)
    : caf::io::middleman_actor_impl(cfg, std::move(broker)), gk_(std::move(gk)),
      budget_(std::make_shared<net::inflight_budget>(gk_->security().max_in_flight)) {
    // A message that holds budget and stalls is cut at its deadline (checked each second).
    gk_->on_tick([budget = budget_] {
      for (const auto& why : budget->cut_expired(ashlar::steady_now()))
        spdlog::warn("network: closed the connection from {}", why);
    });
  }

  const char* name() const override { return "ashlar.middleman"; }

protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    const auto& sec = gk_->security();
    auto where = host + ":" + std::to_string(port);
    auto fd = caf::io::network::new_tcp_connection(host, port);
    if (!fd) // (connection_refused: see connect() in system.cpp)
      return make_error(errc::peer_unreachable, "cannot connect to " + where + ": "
                                                  + (fd.error() == caf::sec::cannot_connect_to_node
                                                       ? std::string{connection_refused}
                                                       : system().render(fd.error())));
    *fd = fresh_number(*fd);
    caf::io::network::nonblocking(*fd, true);
    set_nodelay(*fd);
    net::handshake hs{*fd, false, sec};
    if (net::run_handshake(hs, sec.handshake_timeout) != net::handshake::result::admitted) {
      ::close(*fd); // the handshake frees its TLS session
      return make_error(errc::handshake_refused, "connecting to " + where + ": " + hs.why());
    }
    return caf::io::scribe_ptr{caf::make_counted<guarded_scribe>(mpx(), *fd, protection_of(hs, false),
                                                                 sec.max_message, budget_, where)};
  }

  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd)
      return std::move(fd.error());
    return caf::io::doorman_ptr{caf::make_counted<admitting_doorman>(mpx(), *fd, gk_, budget_)};
  }

private:
  default_multiplexer& mpx() { return static_cast<default_multiplexer&>(system().middleman().backend()); }
  std::shared_ptr<net::admitter> gk_;
  std::shared_ptr<net::inflight_budget> budget_; // the process's bytes of messages in flight
};

std::mutex registry_mtx;
std::map<caf::actor_system*, std::weak_ptr<cluster_network>>& registry() {
  static std::map<caf::actor_system*, std::weak_ptr<cluster_network>> r;
  return r;
}

} // namespace

struct cluster_network::impl {
  caf::actor_system* sys = nullptr;
  std::shared_ptr<net::admitter> gk;
  caf::actor middleman;
  bool stopped = false;
};

cluster_network::cluster_network(std::unique_ptr<impl> p) : impl_(std::move(p)) {
}

cluster_network::~cluster_network() {
  stop();
  std::lock_guard<std::mutex> guard{registry_mtx};
  registry().erase(impl_->sys);
}

expected<std::shared_ptr<cluster_network>> cluster_network::start(caf::actor_system& sys, net::net_security sec) {
  raise_descriptor_limit();
  auto p = std::make_unique<impl>();
  p->sys = &sys;
  p->gk = std::make_shared<net::admitter>(std::move(sec), "network");
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  p->middleman = caf::actor_cast<caf::actor>(sys.spawn<admitting_middleman, caf::detached + caf::hidden>(broker, p->gk));
  std::shared_ptr<cluster_network> out{new cluster_network(std::move(p))};
  std::lock_guard<std::mutex> guard{registry_mtx};
  registry()[&sys] = out;
  return out;
}

expected<uint16_t> cluster_network::publish_ptr(caf::strong_actor_ptr whom, std::set<std::string> sigs,
                                                const endpoint& where) {
  caf::scoped_actor self{*impl_->sys};
  expected<uint16_t> out = make_error(errc::invalid_state, "no answer from the network layer");
  self->request(impl_->middleman, caf::infinite, caf::publish_atom::value, where.port, std::move(whom),
                std::move(sigs), where.host, true)
    .receive([&](uint16_t port) { out = port; },
             [&](caf::error& err) {
               out = make_error(errc::io_error, "cannot listen on " + where.to_string() + ": "
                                                  + impl_->sys->render(err));
             });
  return out;
}

const caf::actor& cluster_network::handle() const {
  return impl_->middleman;
}

const net::net_security& cluster_network::security() const {
  return impl_->gk->security();
}

void cluster_network::stop() {
  if (impl_->stopped)
    return;
  impl_->stopped = true;
  impl_->gk->stop();
  caf::scoped_actor self{*impl_->sys, true};
  self->send_exit(impl_->middleman, caf::exit_reason::kill);
  self->wait_for(impl_->middleman);
}

std::shared_ptr<cluster_network> network_of(caf::actor_system& sys) {
  std::lock_guard<std::mutex> guard{registry_mtx};
  auto it = registry().find(&sys);
  return it == registry().end() ? nullptr : it->second.lock();
}

}  // namespace ashlar::actors
