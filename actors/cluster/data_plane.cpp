#include "actors/cluster/data_plane.hpp"
#include "runtime/os/threads.hpp"

#include <algorithm>
#include <charconv>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/cluster/network.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/net/admitter.hpp"
#include "runtime/net/shm_channel.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/tensor_frames.hpp"

#include <condition_variable>
#include <fcntl.h>
#include <openssl/ssl.h>
#include <unistd.h>

namespace ashlar::actors {

namespace {

using lost_atom = caf::atom_constant<caf::atom("dplost")>;

/// Requests a shard node takes from one connection before it reads no further (the peer
/// then waits on TCP): pushes cannot pile up in memory faster than the shard applies them.
constexpr int max_in_flight = 32;

/// One TCP connection, shared by its reader thread and the actor that writes to it.
struct connection {
  net::tcp_socket sock;
  // A peer on this host, once both proved it: frames go through shared memory, and the
  // socket above carries nothing more but says when the peer is gone.
  std::unique_ptr<net::shm_channel> shm;
  std::atomic<bool> on_shm{false}; // shm is set (for other threads' counts)
  net::byte_channel& chan() { return shm ? static_cast<net::byte_channel&>(*shm) : sock; }
  std::shared_ptr<void> hold; // shard side: the admitter's count of the source's open connections
  std::atomic<bool> done{false};
  // Shard side: requests handed to the shard and not yet answered, each with the bytes it
  // holds of the node's in-flight budget (a push's tensor), given back when it is answered
  // or, at the latest, when the connection is gone.
  std::shared_ptr<net::inflight_budget> budget;
  std::mutex mtx;
  std::condition_variable cv;
  int in_flight = 0;
  uint64_t next_ticket = 0;
  std::map<uint64_t, uint64_t> held; // ticket -> budgeted bytes

  ~connection() {
    for (const auto& [ticket, bytes] : held)
      budget->give(bytes);
  }

  // Blocks while max_in_flight requests are outstanding; then the request holding `bytes`
  // of the budget gets a ticket. Nothing once the connection ends.
  std::optional<uint64_t> acquire(uint64_t bytes) {
    std::unique_lock<std::mutex> lock{mtx};
    cv.wait(lock, [&] { return in_flight < max_in_flight || done; });
    if (done)
      return std::nullopt;
    ++in_flight;
    if (bytes > 0)
      held.emplace(next_ticket, bytes);
    return next_ticket++;
  }
  // The tensor of the request with `ticket` is let go (the shard took what it needed): its
  // bytes go back to the node's budget, the request still counts until it is answered.
  void give_bytes(uint64_t ticket) {
    uint64_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock{mtx};
      if (auto it = held.find(ticket); it != held.end()) {
        bytes = it->second;
        held.erase(it);
      }
    }
    if (bytes > 0)
      budget->give(bytes);
  }
  // The request with `ticket` was answered.
  void release(uint64_t ticket) {
    uint64_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock{mtx};
      --in_flight;
      if (auto it = held.find(ticket); it != held.end()) {
        bytes = it->second;
        held.erase(it);
      }
    }
    if (bytes > 0)
      budget->give(bytes);
    cv.notify_one();
  }
  // Wakes whoever reads or writes; the reader thread then ends the connection.
  void cut() {
    sock.shutdown();
    if (shm)
      shm->close();
  }
  void end() {
    cut();
    {
      std::lock_guard<std::mutex> lock{mtx};
      done = true;
    }
    cv.notify_all();
    if (budget)
      budget->wake(); // a reader waiting for room in it stops waiting
  }
};

using connection_ptr = std::shared_ptr<connection>;

// A push's tensor gives its bytes of the node's budget back when the last reference to it
// goes (the shard has applied or buffered it), not when the push is answered: a shard
// holds the answer to a push whose worker's read follows until that read is answered (a
// whole BSP round), and the pushes of a round would otherwise hold the budget the round's
// last push needs.
void tie_to_budget(const connection_ptr& c, uint64_t ticket, wire::push& p) {
  const auto n = p.grad.size();
  auto storage = p.grad.storage();
  if (!storage)
    return;
  std::weak_ptr<connection> conn = c;
  const float* at = p.grad.data();
  p.grad = wire::shared_tensor{std::shared_ptr<const float>(at, [storage, conn, ticket](const float*) {
                                 if (auto cc = conn.lock())
                                   cc->give_bytes(ticket);
                               }),
                               n};
}

/// Admitted connections a node serves at once. Default: 1024.
constexpr size_t max_data_connections = 1024;

// TLS credentials (given to the data plane, else its process's cluster network's, if
// any) and `key` as the token.
net::net_security data_security(caf::actor_system& sys, const std::shared_ptr<net::tls_context>& tls,
                                const std::string& key) {
  net::net_security sec;
  if (auto net = network_of(sys))
    sec = net->security();
  if (tls)
    sec.tls = tls;
  sec.token = key;
  // The workers of a host reach a shard node from one address, up to the node's whole
  // connection cap: the cap, not a share per address, bounds them here.
  sec.max_per_source = max_data_connections;
  return sec;
}

// After admission: back to a blocking socket, sealed with keys from the TLS session, or
// without TLS from the gate's handshake.
expected<net::tcp_socket> admitted_socket(int fd, SSL* ssl, const net::session_keys* keys, const std::string& peer,
                                          bool server) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  net::tcp_socket sock{fd, peer};
  if (keys) {
    if (server)
      sock.seal(keys->server_tx, keys->client_tx);
    else
      sock.seal(keys->client_tx, keys->server_tx);
  } else if (ssl) {
    uint8_t client_tx[32], server_tx[32];
    bool ok = net::tls_export_keys(ssl, client_tx, server_tx);
    SSL_free(ssl);
    if (!ok)
      return make_error(errc::handshake_refused, "cannot derive data-plane keys for " + peer + ": "
                                                   + net::tls_error_text());
    if (server)
      sock.seal(server_tx, client_tx);
    else
      sock.seal(client_tx, server_tx);
  }
  return sock;
}

// ---- shard side ----

/// Serves one connection's requests: asks the local shard and writes each reply as soon
/// as the shard gives it (held reads do not block later requests). Detached: its writes
/// may block on the socket.
caf::behavior shard_server(caf::event_based_actor* self, connection_ptr c, shard_actor shard) {
  name_this_thread("ashlar.dp-write"); // (a detached actor: its own thread)
  auto fail = [=](uint64_t seq, uint64_t ticket, const caf::error& e) {
    if (auto err = net::write_text_frame(c->chan(), net::frame_kind::error, seq, describe(e)))
      c->cut();
    c->release(ticket);
  };
  return {
    [=](uint64_t seq, uint64_t ticket, wire::pull_request& r) {
      self->request(shard, caf::infinite, std::move(r))
        .then(
          [=](wire::pull_reply& rep) {
            if (auto err = net::write_frame(c->chan(), seq, rep))
              c->cut();
            c->release(ticket);
          },
          [=](caf::error& e) { fail(seq, ticket, e); });
    },
    [=](uint64_t seq, uint64_t ticket, wire::push& p) {
      self->request(shard, caf::infinite, std::move(p))
        .then(
          [=](wire::push_ack& ack) {
            if (auto err = net::write_frame(c->chan(), seq, ack))
              c->cut();
            c->release(ticket);
          },
          [=](caf::error& e) { fail(seq, ticket, e); });
    },
  };
}

// ---- worker side ----

struct proxy_state {
  static constexpr const char* name = "ashlar.shard-proxy";
  connection_ptr conn;
  caf::actor remote;
  uint32_t shard_id = 0;
  std::string endpoint;
  uint64_t next_seq = 1;
  std::map<uint64_t, caf::response_promise> pending;
  bool broken = false;
  ~proxy_state() {
    if (conn)
      conn->cut();
  }
};

using proxy_pointer = caf::stateful_actor<proxy_state>*;

void connection_lost(proxy_pointer self, const caf::error& why) {
  auto& st = self->state;
  if (st.broken)
    return;
  st.broken = true;
  st.conn->cut();
  spdlog::warn("data plane: connection to shard {} at {} lost ({}); its pulls and pushes go over "
               "CAF from now on",
               st.shard_id, st.endpoint, describe(why));
  auto err = make_error(errc::peer_unreachable, "data connection to shard " + std::to_string(st.shard_id)
                                                  + " at " + st.endpoint + " lost: " + describe(why));
  for (auto& [seq, rp] : st.pending)
    rp.deliver(err);
  st.pending.clear();
}

template <class Request>
void forward(proxy_pointer self, Request& req) {
  auto& st = self->state;
  if (st.broken) {
    self->delegate(st.remote, std::move(req));
    return;
  }
  uint64_t seq = st.next_seq++;
  st.pending.emplace(seq, self->make_response_promise());
  if (auto err = net::write_frame(st.conn->chan(), seq, req))
    connection_lost(self, err);
}

template <class Reply>
void settle(proxy_pointer self, uint64_t seq, Reply&& reply) {
  auto& st = self->state;
  auto it = st.pending.find(seq);
  if (it == st.pending.end())
    return; // failed already when the connection was lost
  it->second.deliver(std::forward<Reply>(reply));
  st.pending.erase(it);
}

caf::behavior shard_proxy(proxy_pointer self, connection_ptr conn, shard_actor remote, uint32_t shard_id,
                          std::string endpoint, caf::actor owner) {
  name_this_thread("ashlar.dp-proxy"); // (a detached actor: its own thread)
  auto& st = self->state;
  st.conn = std::move(conn);
  st.remote = caf::actor_cast<caf::actor>(remote);
  st.shard_id = shard_id;
  st.endpoint = std::move(endpoint);
  self->monitor(st.remote);
  self->monitor(owner);
  auto remote_addr = st.remote.address();
  self->set_down_handler([=](caf::down_msg& dm) {
    self->quit(dm.source == remote_addr ? dm.reason : caf::error{caf::exit_reason::normal});
  });
  return {
    [=](wire::pull_request& r) { forward(self, r); },
    [=](wire::push& p) { forward(self, p); },
    [=](wire::membership_change& m) { self->delegate(self->state.remote, std::move(m)); },
    [=](status_atom a) { self->delegate(self->state.remote, a); },
    [=](checkpoint_atom a) { self->delegate(self->state.remote, a); },
    [=](checkpoint_atom a, uint64_t cut, uint64_t at) { self->delegate(self->state.remote, a, cut, at); },
    [=](checkpoint_atom a, caf::get_atom g) { self->delegate(self->state.remote, a, g); },
    [=](restore_atom a, uint64_t cut) { self->delegate(self->state.remote, a, cut); },
    [=](restore_atom a, std::vector<float>& p) { self->delegate(self->state.remote, a, std::move(p)); },
    [=](tune_atom a, uint32_t k, bool async) { self->send(self->state.remote, a, k, async); },
    [=](bound_atom a, uint64_t s, float lr) { self->send(self->state.remote, a, s, lr); },
    [=](lr_atom a, float f) { self->send(self->state.remote, a, f); },
    // From the connection's reader thread:
    [=](uint64_t seq, wire::pull_reply& r) { settle(self, seq, std::move(r)); },
    [=](uint64_t seq, wire::push_ack& a) { settle(self, seq, std::move(a)); },
    [=](uint64_t seq, caf::error& e) { settle(self, seq, std::move(e)); },
    [=](lost_atom, caf::error& e) { connection_lost(self, e); },
  };
}

/// Reads replies for a proxy until the connection ends.
void proxy_reader(connection_ptr c, caf::actor_addr proxy, uint32_t shard_id) {
  name_this_thread("ashlar.dp-reply");
  for (;;) {
    net::inbound_frame f;
    auto err = net::read_frame(c->chan(), f);
    auto to = caf::actor_cast<caf::actor>(proxy);
    if (!to)
      break;
    if (err) {
      caf::anon_send(to, lost_atom::value, std::move(err));
      break;
    }
    if (f.kind == net::frame_kind::pull_reply) {
      caf::anon_send(to, f.seq, std::move(f.reply));
    } else if (f.kind == net::frame_kind::push_ack) {
      caf::anon_send(to, f.seq, std::move(f.ack));
    } else if (f.kind == net::frame_kind::error) {
      caf::anon_send(to, f.seq, make_error(errc::invalid_state, "shard " + std::to_string(shard_id)
                                                                  + " refused the request: " + f.text));
    } else {
      caf::anon_send(to, lost_atom::value,
                     make_error(errc::malformed_message, "unexpected frame kind "
                                                           + std::to_string(static_cast<uint32_t>(f.kind))));
      break;
    }
  }
  c->done = true;
}

// A ring's stand-in for the next worker: writes the chunks sent to it on the connection,
// in order, on a thread of its own (a write waits while the next worker's node is slow to
// read). Nothing comes back on a ring connection.
struct ring_proxy_state {
  static constexpr const char* name = "ashlar.ring-proxy";
  connection_ptr conn;
  caf::actor next;
  caf::actor owner;
  std::string endpoint;
  bool broken = false;
  std::string why; // how it broke
  ~ring_proxy_state() {
    if (conn) {
      conn->cut();
      conn->done = true;
    }
  }
};

/// How long a ring's stand-in waits, after its connection broke, to hear that the next
/// worker is gone (then the ring is formed again without it) before it takes the
/// connection itself for lost with the peer alive.
constexpr std::chrono::seconds ring_break_grace{10};

// A chunk written before the connection broke may not have reached the next worker (a
// write ends in the kernel's buffers), and the ring would wait for it forever: unless the
// next worker turns out to be gone, its owner fails after ring_break_grace, and the others
// form a ring without it (the chunks after the break go over CAF meanwhile).
caf::behavior ring_proxy(caf::stateful_actor<ring_proxy_state>* self, connection_ptr conn, caf::actor next,
                         std::string endpoint, caf::actor owner) {
  name_this_thread("ashlar.dp-ring"); // (a detached actor: its own thread)
  auto& st = self->state;
  st.conn = std::move(conn);
  st.next = std::move(next);
  st.owner = std::move(owner);
  st.endpoint = std::move(endpoint);
  self->monitor(st.next);
  self->monitor(st.owner);
  self->set_down_handler([=](caf::down_msg&) { self->quit(); });
  return {
    [=](wire::ring_message& m) {
      auto& st = self->state;
      if (!st.broken) {
        auto err = net::write_frame(st.conn->chan(), 0, m);
        if (!err)
          return;
        st.broken = true;
        st.why = describe(err);
        st.conn->cut();
        spdlog::warn("data plane: ring connection to the next worker at {} lost ({}); its chunks go over CAF "
                     "from now on",
                     st.endpoint, st.why);
        self->delayed_send(self, ring_break_grace, ring_atom::value);
      }
      self->send(st.next, std::move(m));
    },
    [=](ring_atom) { // the next worker is still there (else this stand-in had quit)
      auto& st = self->state;
      caf::anon_send(st.owner, ring_atom::value,
                     "the ring connection to the next worker at " + st.endpoint + " broke (" + st.why
                       + ") while it stayed in the job: chunks may have been lost");
      self->quit();
    },
  };
}

// ---- over shared memory: no actor in between ----
//
// A write over shared memory does not wait for the peer: its lent buffers are kept until
// the peer has copied them (shm_channel::lend_until_fetched), a frame puts a few hundred
// bytes at most into the ring, and a connection has at most max_in_flight requests
// unanswered (a worker keeps at most 2 x max_chunks_in_flight on one), so the ring has
// room even while the peer's reader is stopped. The actors at both ends therefore write
// their frames on their own threads, and each reader thread hands what it read straight to
// the actor it is for: a request goes from the worker's mailbox into the shard's, and its
// reply back, one mailbox each way instead of three hand-overs between threads. (Over TCP
// a write may wait on the network: the stand-in and shard_server actors above write on
// threads of their own.)

/// What a shared-memory stand-in shares with its connection's reader thread.
struct link_state {
  struct waiting {
    caf::strong_actor_ptr sender;
    caf::message_id mid;
  };
  connection_ptr conn;
  caf::actor remote;
  uint32_t shard_id = 0;
  std::string endpoint;
  std::mutex mtx; // the connection's writes, the sequence and what waits for a reply
  uint64_t next_seq = 1;
  std::map<uint64_t, waiting> pending;
  bool broken = false;
};
using link_ptr = std::shared_ptr<link_state>;

// Answers the message `mid` of `to` with `msg`, as the shard would: the response to a
// request, or a message of its own to a plain send.
void respond(const caf::strong_actor_ptr& to, caf::message_id mid, caf::message msg) {
  if (to)
    to->enqueue(caf::make_mailbox_element(nullptr, mid.is_request() ? mid.response_id() : caf::make_message_id(), {},
                                          std::move(msg)),
                nullptr);
}

// The connection is lost: every request waiting fails, later ones go over CAF.
void link_lost(const link_ptr& l, const caf::error& why, bool quiet) {
  l->conn->cut(); // first: wakes a write that waits (under the lock) for room
  std::map<uint64_t, link_state::waiting> pending;
  {
    std::lock_guard<std::mutex> guard{l->mtx};
    if (l->broken)
      return;
    l->broken = true;
    pending.swap(l->pending);
  }
  if (!quiet)
    spdlog::warn("data plane: connection to shard {} at {} lost ({}); its pulls and pushes go over "
                 "CAF from now on",
                 l->shard_id, l->endpoint, describe(why));
  auto err = make_error(errc::peer_unreachable, "data connection to shard " + std::to_string(l->shard_id) + " at "
                                                  + l->endpoint + " lost: " + describe(why));
  for (auto& [seq, w] : pending)
    respond(w.sender, w.mid, caf::make_message(err));
}

/// The worker side's stand-in for a shard over shared memory: not a scheduled actor but a
/// mailbox of its own making, like CAF's proxies for remote actors. A pull or push sent to
/// it is written to the connection on the sender's thread; the reply comes from the reader
/// thread straight into the sender's mailbox, as the response to its request. Everything
/// else (and everything once the connection is lost) goes to the shard over CAF, from the
/// sender. Monitors see it go down with the shard's exit reason when the shard goes down,
/// and normally when its owner does.
class shard_link final : public caf::monitorable_actor {
public:
  shard_link(caf::actor_config& cfg, link_ptr state) : caf::monitorable_actor(cfg), st_(std::move(state)) {
  }

  const char* name() const override { return "ashlar.shard-link"; }

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) override {
    auto& msg = what->content();
    if (msg.match_elements<caf::exit_msg>()) {
      auto reason = msg.get_as<caf::exit_msg>(0).reason;
      if (reason != caf::exit_reason::normal) // (ignored, as by any actor not trapping exits)
        quit(std::move(reason));
      return;
    }
    if (getf(is_cleaned_up_flag)) {
      bounce(what);
      return;
    }
    const bool direct = what->stages.empty() && !what->mid.is_response();
    const bool pull = direct && msg.match_elements<wire::pull_request>();
    if (pull || (direct && msg.match_elements<wire::push>()))
      if (!write(what, pull))
        return;
    st_->remote->enqueue(std::move(what), host); // from the sender, over CAF
  }

  void quit(caf::error reason) { cleanup(std::move(reason), nullptr); }

  // The last handle is gone (a worker that replaced its shard): the connection ends too.
  void on_destroy() override {
    cleanup(caf::exit_reason::unreachable, nullptr); // (once: a no-op after quit)
    st_->conn->cut();
    caf::monitorable_actor::on_destroy();
  }

protected:
  void on_cleanup(const caf::error&) override { st_->conn->cut(); }

private:
  // Writes the request; false once it is sent (or answered with an error), true when the
  // connection is lost and it goes over CAF instead.
  bool write(caf::mailbox_element_ptr& what, bool pull) {
    std::unique_lock<std::mutex> guard{st_->mtx};
    if (st_->broken)
      return true;
    if (st_->pending.size() >= max_in_flight) {
      // More unanswered than the shard's node reads ahead (requests abandoned by timeouts):
      // the ring could fill, and this thread wait. The request fails instead, at once.
      guard.unlock();
      respond(what->sender, what->mid,
              caf::make_message(make_error(errc::busy, "the data connection to shard " + std::to_string(st_->shard_id)
                                                         + " at " + st_->endpoint + " has "
                                                         + std::to_string(max_in_flight)
                                                         + " requests unanswered, the most it takes")));
      return false;
    }
    const uint64_t seq = st_->next_seq++;
    st_->pending.emplace(seq, link_state::waiting{what->sender, what->mid});
    std::shared_ptr<caf::mailbox_element> keep{std::move(what)}; // its tensor is lent
    auto& msg = keep->content();
    auto& chan = *st_->conn->shm;
    chan.lend_until_fetched(keep);
    caf::error err;
    if (pull) {
      err = net::write_frame(chan, seq, msg.get_as<wire::pull_request>(0));
    } else {
      auto& p = msg.get_mutable_as<wire::push>(0);
      // Buffers of earlier pushes the shard let go of go back first: the copy then goes
      // to the one let go last, warm in the cache.
      chan.release_fetched();
      if (!p.sparse)
        chan.share(p.grad); // the shard reads it in place
      err = net::write_frame(chan, seq, p);
    }
    chan.lend_until_fetched(nullptr); // (a frame refused before its write leaves none behind)
    guard.unlock();
    if (err)
      link_lost(st_, err, false); // answers this request too
    return false;
  }

  link_ptr st_;
};

/// Reads a shard_link's replies until the connection ends.
void link_reader(link_ptr l) {
  name_this_thread("ashlar.dp-reply");
  for (;;) {
    net::inbound_frame f;
    auto err = net::read_frame(l->conn->chan(), f);
    if (!err && f.kind != net::frame_kind::pull_reply && f.kind != net::frame_kind::push_ack
        && f.kind != net::frame_kind::error)
      err = make_error(errc::malformed_message, "unexpected frame kind " + std::to_string(static_cast<uint32_t>(f.kind)));
    if (err) {
      bool quiet = false;
      {
        std::lock_guard<std::mutex> guard{l->mtx};
        quiet = l->pending.empty() && is(err, errc::peer_unreachable); // ended with nothing in flight
      }
      link_lost(l, err, quiet);
      break;
    }
    link_state::waiting w;
    {
      std::lock_guard<std::mutex> guard{l->mtx};
      l->conn->shm->release_fetched(); // what the shard has read or let go of by now goes
      auto it = l->pending.find(f.seq);
      if (it == l->pending.end())
        continue; // failed already when the connection was lost
      w = std::move(it->second);
      l->pending.erase(it);
    }
    if (f.kind == net::frame_kind::pull_reply)
      respond(w.sender, w.mid, caf::make_message(std::move(f.reply)));
    else if (f.kind == net::frame_kind::push_ack)
      respond(w.sender, w.mid, caf::make_message(std::move(f.ack)));
    else
      respond(w.sender, w.mid, caf::make_message(make_error(errc::invalid_state, "shard " + std::to_string(l->shard_id)
                                                                                    + " refused the request: " + f.text)));
  }
  l->conn->done = true;
}

/// This process's shared-memory arena for the job of `key` (nullptr where none can be
/// made: tensors are then copied between the processes).
std::shared_ptr<net::shm_arena> job_arena(const std::string& key) {
  auto a = net::shm_arena::for_job(key);
  if (!a) {
    spdlog::warn("data plane: {}; tensors to peers on this host are copied", describe(a.error()));
    return nullptr;
  }
  return *a;
}

/// How a shared-memory connection's tensors cross, for its log line.
std::string in_place(const net::shm_channel& ch) {
  if (ch.reads_in_place() && ch.peer_reads_in_place())
    return ", tensors read in place";
  if (ch.reads_in_place() || ch.peer_reads_in_place())
    return std::string{", tensors read in place "} + (ch.reads_in_place() ? "here" : "by the peer") + " only";
  return ", tensors copied";
}

/// The longest error text a shard's node writes over shared memory (the rest is cut).
constexpr size_t max_error_text = 200;

/// The shard side's sender of a shared-memory connection's requests: the shard's replies
/// come to it (on the shard's thread) and it writes them to the connection there.
class reply_link final : public caf::monitorable_actor {
public:
  reply_link(caf::actor_config& cfg, connection_ptr c) : caf::monitorable_actor(cfg), c_(std::move(c)) {
  }

  const char* name() const override { return "ashlar.reply-link"; }

  /// Lets go of replies the peer is done with (their versions may then be written in
  /// place), from any thread.
  void release_fetched() {
    std::lock_guard<std::mutex> guard{mtx_};
    c_->shm->release_fetched();
  }

  /// A request read from the connection (`seq`, holding `ticket` of the node's budget):
  /// the id its reply will come back with.
  caf::message_id expect(uint64_t seq, uint64_t ticket) {
    std::lock_guard<std::mutex> guard{mtx_};
    c_->shm->release_fetched(); // replies the peer has read no longer hold their versions
    const uint64_t id = next_id_++;
    waiting_.emplace(id, std::make_pair(seq, ticket));
    return caf::make_message_id(id);
  }

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit*) override {
    if (!what->mid.is_response())
      return;
    std::unique_lock<std::mutex> guard{mtx_};
    auto it = waiting_.find(what->mid.request_id().integer_value());
    if (it == waiting_.end())
      return;
    const auto [seq, ticket] = it->second;
    waiting_.erase(it);
    std::shared_ptr<caf::mailbox_element> keep{std::move(what)}; // a reply's tensor is lent
    auto& msg = keep->content();
    auto& chan = *c_->shm;
    caf::error err;
    if (msg.match_elements<wire::pull_reply>()) {
      auto& r = msg.get_mutable_as<wire::pull_reply>(0);
      if (!r.sparse)
        chan.share(r.params, r.version); // one copy of a version for every worker of this host
      chan.lend_until_fetched(keep);
      err = net::write_frame(chan, seq, r);
      chan.lend_until_fetched(nullptr);
    } else if (msg.match_elements<wire::push_ack>()) {
      err = net::write_frame(chan, seq, msg.get_as<wire::push_ack>(0));
    } else {
      auto why = msg.match_elements<caf::error>() ? describe(msg.get_as<caf::error>(0))
                                                   : std::string{"the shard's reply is of an unexpected type"};
      if (why.size() > max_error_text) // into the ring whole: never a wait for the peer
        why = why.substr(0, max_error_text - 3) + "...";
      err = net::write_text_frame(chan, net::frame_kind::error, seq, why);
    }
    guard.unlock();
    if (err)
      c_->cut();
    c_->release(ticket);
  }

private:
  connection_ptr c_;
  std::mutex mtx_; // the writes and the requests waiting
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> waiting_; // id -> (seq, ticket)
};

// Tries `once(timeout of the try, busy)` until it succeeds, fails for good, or `timeout`
// runs out. A node admitting more connections at once than its bound drops the oldest
// handshakes (hundreds of workers starting together): such a refusal, before the gate said
// anything (`busy`), is tried again after a random backoff (50 ms doubling to 1.6 s). A
// refusal by the gate (another job's key, ...) is final.
template <class Once>
auto with_backoff(std::chrono::milliseconds timeout, Once once) {
  thread_local std::minstd_rand jitter{std::random_device{}()};
  const auto deadline = steady_now() + timeout;
  std::chrono::milliseconds backoff{50};
  for (;;) {
    bool busy = false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_now());
    auto out = once(std::min(left, std::chrono::milliseconds{5000}), busy);
    auto wait = std::chrono::milliseconds{std::uniform_int_distribution<int64_t>{backoff.count() / 2,
                                                                                 backoff.count()}(jitter)};
    if (out || !busy || steady_now() + wait >= deadline)
      return out;
    pause_for(wait);
    backoff = std::min(backoff * 2, std::chrono::milliseconds{1600});
  }
}

} // namespace

struct data_plane::impl {
  struct served {
    shard_actor shard;
    std::string key;
    uint64_t max_payload = wire::max_message_bytes;
  };
  struct running {
    connection_ptr conn;
    std::thread thread;
  };

  explicit impl(caf::actor_system& s) : sys(s) {
  }

  static constexpr size_t max_connections = max_data_connections;

  caf::actor_system& sys;
  std::shared_ptr<net::tls_context> tls;
  std::mutex mtx;
  bool stopped = false;
  std::unique_ptr<net::admitter> admit;
  std::optional<net::tcp_listener> listener;
  std::string endpoint;
  std::thread acceptor;
  std::map<uint32_t, served> shards;
  // Ring inboxes: workers of this node whose previous worker on the ring sends its chunks
  // here, by the worker actor's id.
  struct ring_inbox {
    caf::actor_addr inbox;
    std::string key;
    uint64_t max_payload = wire::max_message_bytes;
  };
  std::map<caf::actor_id, ring_inbox> rings;
  std::list<running> conns;
  // The tensors of requests this node reads and has not answered, over all connections:
  // the process's --max-in-flight-mb, a budget of its own (the cluster network's bounds
  // CAF's messages). A tensor waits for room rather than being refused, since a shard
  // applies pushes without waiting for others.
  std::shared_ptr<net::inflight_budget> budget;
  std::chrono::milliseconds grace{30000};
  // Peers on this host may switch to shared memory (both ends must allow it).
  bool shared_memory = true;

  // Caller holds mtx.
  const std::shared_ptr<net::inflight_budget>& the_budget() {
    if (!budget) {
      auto net = network_of(sys);
      budget = std::make_shared<net::inflight_budget>(net ? net->security().max_in_flight
                                                          : net::net_security{}.max_in_flight);
    }
    return budget;
  }

  // Before a request's tensor of `bytes` is allocated: room in the budget (waited for),
  // and a deadline for the tensor to arrive whole.
  caf::error reserve(connection& c, uint64_t bytes, uint64_t& taken) {
    const auto allowed = net::message_deadline(bytes, grace);
    const bool took = c.budget->take_within(bytes, allowed, &c.done);
    if (!took && c.done)
      return make_error(errc::peer_unreachable, "the connection ended while its tensor waited for room");
    if (!took)
      return make_error(errc::busy, "a tensor of " + std::to_string(bytes >> 20) + " MiB waited "
                                      + std::to_string(allowed.count() / 1000) + " s for room in this node's budget "
                                      + "for tensors in flight (" + std::to_string(c.budget->total() >> 20)
                                      + " MiB, --max-in-flight-mb; " + std::to_string(c.budget->used() >> 20)
                                      + " MiB taken by other connections)");
    taken = bytes;
    c.chan().set_read_deadline(steady_now() + allowed);
    return {};
  }

  // Joins the threads of connections that ended. Caller holds mtx.
  void reap() {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->conn->done) {
        if (it->thread.joinable())
          it->thread.join();
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Connections admitted (the peer proved a served job's key) and still open.
  size_t open_connections() const {
    size_t n = 0;
    for (const auto& r : conns)
      n += r.conn->done ? 0 : 1;
    return n;
  }

  // The keys of the jobs whose shards are served here: a peer must prove one of them.
  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> guard{mtx};
    std::vector<std::string> out;
    for (const auto& [id, s] : shards)
      if (std::find(out.begin(), out.end(), s.key) == out.end())
        out.push_back(s.key);
    for (const auto& [id, r] : rings)
      if (std::find(out.begin(), out.end(), r.key) == out.end())
        out.push_back(r.key);
    if (out.empty())
      out.push_back(net::random_hex(32)); // no job: nobody gets in
    return out;
  }

  // On the admitter's thread: the peer proved `a.token`; serve it on a thread of its own.
  void on_admitted(net::admitter::admitted a) {
    auto sock = admitted_socket(a.fd, a.ssl, a.sealed ? &a.keys : nullptr, a.peer, true);
    if (!sock) {
      spdlog::warn("data plane: {}", describe(sock.error()));
      return;
    }
    auto c = std::make_shared<connection>();
    c->sock = std::move(*sock);
    c->hold = std::move(a.hold);
    std::lock_guard<std::mutex> guard{mtx};
    c->budget = the_budget();
    reap();
    if (stopped)
      return;
    if (open_connections() >= max_connections) {
      spdlog::warn("data plane: refused {}: {} connections are open, the most this node serves", a.peer,
                   max_connections);
      return;
    }
    try {
      conns.push_back(running{c, std::thread{[this, c, key = std::move(a.token)] { serve_connection(c, key); }}});
    } catch (const std::system_error& e) { // no thread to be had: refused (c closes it)
      spdlog::warn("data plane: refused {}: cannot start a thread for it ({})", a.peer, e.what());
    }
  }

  // What a connection serves: a shard, or a worker's ring inbox.
  struct target {
    shard_actor shard;
    caf::actor_addr inbox;
    uint64_t max_payload = wire::max_message_bytes;
    std::string what; // for the log: "shard 3", "the ring inbox of worker actor 12"
  };

  // After admission: the hello names a shard, or a worker's ring inbox ("ring <actor
  // id>"); the peer learns only about those of the job whose key it proved. Nothing if
  // refused (the peer is told why).
  std::optional<target> read_hello(const connection_ptr& c, const std::string& key, std::string& hello) {
    auto refuse = [&](const std::string& why) {
      spdlog::warn("data plane: refused a connection from {}: {}", c->sock.peer(), why);
      (void) net::write_text_frame(c->sock, net::frame_kind::error, 0, why);
      return std::nullopt;
    };
    net::inbound_frame f;
    if (auto err = c->sock.set_timeout(std::chrono::seconds(5)))
      return std::nullopt;
    if (auto err = net::read_frame(c->sock, f); err || f.kind != net::frame_kind::hello)
      return refuse(err ? describe(err) : "the first frame is not a hello");
    hello = f.text;
    std::istringstream in{f.text};
    uint32_t protocol = 0;
    std::string name;
    in >> protocol >> name;
    if (protocol != wire::protocol_version)
      return refuse("protocol version mismatch: this node speaks " + std::to_string(wire::protocol_version)
                    + ", the peer " + std::to_string(protocol));
    if (name == "ring") { // not-a-policy-name: a ring inbox connection
      caf::actor_id id = 0;
      in >> id;
      std::lock_guard<std::mutex> guard{mtx};
      auto it = rings.find(id);
      if (!in || it == rings.end() || it->second.key != key)
        return refuse("no ring inbox of worker actor " + std::to_string(id) + " of this job is served here");
      return target{{}, it->second.inbox, it->second.max_payload, "the ring inbox of worker actor " + std::to_string(id)};
    }
    uint32_t shard_id = 0;
    const auto parsed = std::from_chars(name.data(), name.data() + name.size(), shard_id);
    std::lock_guard<std::mutex> guard{mtx};
    auto it = shards.find(shard_id);
    if (name.empty() || parsed.ec != std::errc{} || parsed.ptr != name.data() + name.size() || it == shards.end()
        || it->second.key != key)
      return refuse("no shard " + name + " of this job is served here");
    return target{it->second.shard, {}, it->second.max_payload, "shard " + name};
  }

  // The welcome, and with it the path: shared memory where the peer offered it and both
  // proved they share this host (runtime/net/shm_channel.hpp), else TCP. False if the
  // connection broke.
  // `arena_key`: the job whose arena (this process's) is offered to a peer on this host
  // that sends pulls and pushes; "": none (ring chunks are summed into: copied).
  bool welcome(const connection_ptr& c, const std::string& hello, const std::string& what,
               const std::string& arena_key) {
    std::string text, why = "the peer offered no shared memory";
    net::shm_pending pending;
    auto name = net::shm_name_in_hello(hello);
    if (name && !shared_memory)
      why = "this node serves over TCP only";
    else if (name) {
      auto offer = net::shm_server_offer(*name, pending, std::chrono::seconds(5),
                                         arena_key.empty() ? nullptr : job_arena(arena_key));
      if (offer)
        text = *offer;
      else
        why = describe(offer.error());
    }
    const bool offered = !text.empty();
    if (name && !offered)
      text = "tcp " + why; // the peer logs why its path is TCP
    if (net::write_text_frame(c->sock, net::frame_kind::welcome, 0, text))
      return false;
    if (offered) {
      auto ch = net::shm_switch_server(c->sock, pending, std::chrono::seconds(5), why);
      if (!ch)
        return false;
      c->shm = std::move(*ch);
      c->on_shm = c->shm != nullptr;
    }
    if (c->sock.set_timeout(std::chrono::milliseconds{0}))
      return false;
    spdlog::debug("data plane: {} connected to {} over {}", c->sock.peer(), what,
                  c->shm ? "shared memory" + in_place(*c->shm) : "TCP (" + why + ")");
    return true;
  }

  // The bound on the chunks of the ring inbox `id` now (tighter once its worker has its
  // model), or `fallback` once it is no longer served.
  uint64_t ring_bound(caf::actor_id id, uint64_t fallback) {
    std::lock_guard<std::mutex> guard{mtx};
    auto it = rings.find(id);
    return it == rings.end() ? fallback : it->second.max_payload;
  }

  // A ring inbox's connection: each chunk that comes goes to the worker, until the
  // connection ends (or the worker did). One closed for a malformed frame (an unexpected
  // kind, a chunk past the bound) may have cost a chunk the ring waits for: the worker
  // fails, naming why, and the others form a ring without it.
  void serve_ring_connection(const connection_ptr& c, const target& t) {
    const auto id = t.inbox.id();
    for (;;) {
      net::inbound_frame f;
      auto err = net::read_frame(c->chan(), f, ring_bound(id, t.max_payload));
      if (!err && f.kind != net::frame_kind::ring)
        err = make_error(errc::malformed_message, "unexpected frame kind " + std::to_string(static_cast<uint32_t>(f.kind))
                                                    + " on a ring connection");
      auto to = caf::actor_cast<caf::actor>(t.inbox);
      if (err && !is(err, errc::peer_unreachable)) {
        const auto why = "closing the ring connection from " + c->sock.peer() + ": " + describe(err);
        spdlog::warn("data plane: {}", why);
        if (to)
          caf::anon_send(to, ring_atom::value, "data plane: " + why + " (a chunk may have been lost)");
      }
      if (err || !to)
        break;
      caf::anon_send(to, std::move(f.ring));
    }
    c->end();
  }

  // After admission: hello, welcome, then a ring inbox's chunks go to its worker, or a
  // shard's requests to a shard_server actor.
  void serve_connection(const connection_ptr& c, const std::string& key) {
    name_this_thread("ashlar.dp-serve");
    std::string hello;
    auto served = read_hello(c, key, hello);
    if (!served || !welcome(c, hello, served->what, served->shard ? key : std::string{})) {
      c->end();
      return;
    }
    if (served->inbox)
      return serve_ring_connection(c, *served);
    if (c->shm)
      return serve_shm_connection(c, served->shard, served->max_payload);
    auto server = sys.spawn<caf::detached>(shard_server, c, served->shard);
    for (;;) {
      net::inbound_frame req;
      auto ticket = read_request(c, req, served->max_payload);
      if (!ticket)
        break;
      if (req.kind == net::frame_kind::pull) {
        caf::anon_send(server, req.seq, *ticket, std::move(req.pull));
      } else {
        tie_to_budget(c, *ticket, req.push);
        caf::anon_send(server, req.seq, *ticket, std::move(req.push));
      }
    }
    caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
    c->end();
  }

  // A shard's connection over shared memory: each request goes from here into the shard's
  // mailbox, as a request of a reply_link that writes the reply (see shard_link).
  void serve_shm_connection(const connection_ptr& c, const shard_actor& shard, uint64_t max_payload) {
    caf::actor_config cfg;
    auto link = caf::make_actor<reply_link, caf::strong_actor_ptr>(sys.next_actor_id(), sys.node(), &sys, cfg, c);
    auto* replies = static_cast<reply_link*>(caf::actor_cast<caf::abstract_actor*>(link));
    auto* to = caf::actor_cast<caf::abstract_actor*>(shard);
    // A shard about to copy a version a reply still references first lets go of the
    // replies whose views the peer gave back (shard_core::use_storage): a worker that
    // copied its pull sends nothing more on this connection until its next step.
    std::shared_ptr<void> reclaiming;
    if (const auto& arena = c->shm->arena())
      reclaiming = arena->add_reclaimer([replies] { replies->release_fetched(); });
    for (;;) {
      net::inbound_frame req;
      auto ticket = read_request(c, req, max_payload);
      if (!ticket)
        break;
      const auto mid = replies->expect(req.seq, *ticket);
      if (req.kind == net::frame_kind::push)
        tie_to_budget(c, *ticket, req.push);
      auto msg = req.kind == net::frame_kind::pull ? caf::make_message(std::move(req.pull))
                                                   : caf::make_message(std::move(req.push));
      to->enqueue(caf::make_mailbox_element(link, mid, {}, std::move(msg)), nullptr);
    }
    c->end();
  }

  // Reads a shard's next request (a pull or a push, its tensor within `max_payload` and the
  // node's budget) and waits until the connection may have one more in flight: its ticket.
  // Nothing once the connection ended or broke (said in the log unless the peer left).
  std::optional<uint64_t> read_request(const connection_ptr& c, net::inbound_frame& req, uint64_t max_payload) {
    uint64_t taken = 0; // of the budget, for this request's tensor
    auto err = net::read_frame(c->chan(), req, max_payload, [&](uint64_t bytes) { return reserve(*c, bytes, taken); });
    c->chan().set_read_deadline(std::nullopt);
    auto ticket = err ? std::nullopt : std::optional<uint64_t>{0};
    if (err) {
      if (!is(err, errc::peer_unreachable) || describe(err).find("deadline") != std::string::npos)
        spdlog::warn("data plane: closing the connection from {}: {}", c->sock.peer(), describe(err));
    } else if (req.kind != net::frame_kind::pull && req.kind != net::frame_kind::push) {
      spdlog::warn("data plane: closing the connection from {}: unexpected frame kind {}", c->sock.peer(),
                   static_cast<uint32_t>(req.kind));
      ticket.reset();
    } else {
      ticket = c->acquire(taken);
    }
    if (!ticket)
      c->budget->give(taken);
    return ticket;
  }

  void accept_loop() {
    for (;;) {
      auto s = listener->accept();
      if (!s) {
        std::lock_guard<std::mutex> guard{mtx};
        if (stopped)
          return;
        spdlog::warn("data plane: {}", describe(s.error()));
        pause_for(std::chrono::milliseconds(100));
        continue;
      }
      int fd = s->release();
      // Admission (TLS, the job's key) on the admitter's thread, with its deadline and cap.
      if (!admit->admit(fd, [this](net::admitter::admitted a) { on_admitted(std::move(a)); }))
        ::close(fd);
    }
  }
};

data_plane::data_plane(caf::actor_system& sys) : impl_(std::make_shared<impl>(sys)) {
}

void data_plane::limit_in_flight(uint64_t total, std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  impl_->budget = std::make_shared<net::inflight_budget>(total);
  impl_->grace = grace;
}

uint64_t data_plane::in_flight_bytes() const {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  return impl_->budget ? impl_->budget->used() : 0;
}

void data_plane::use_shared_memory(bool allow) {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  impl_->shared_memory = allow;
}

size_t data_plane::shared_memory_connections() const {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  size_t n = 0;
  for (const auto& r : impl_->conns)
    n += r.conn->on_shm && !r.conn->done ? 1 : 0;
  return n;
}

namespace {

// This process's arena for the job of `key` where the data plane shares memory (nullptr:
// it does not, or none can be made).
std::shared_ptr<net::shm_arena> shared_arena(data_plane::impl& d, const std::string& key) {
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    if (!d.shared_memory)
      return nullptr;
  }
  return job_arena(key);
}

} // namespace

std::function<void()> data_plane::tensor_reclaim(const std::string& key) const {
  auto arena = shared_arena(*impl_, key);
  if (!arena)
    return {};
  return [arena] { arena->reclaim(); };
}

std::function<std::shared_ptr<float>(size_t)> data_plane::tensor_buffers(const std::string& key) const {
  auto arena = shared_arena(*impl_, key);
  if (!arena)
    return {};
  return [arena](size_t n) { // (a small push is copied through the ring: the heap)
    return n * sizeof(float) >= net::shm_arena::min_share_bytes ? arena->allocate(n) : nullptr;
  };
}

void data_plane::use_tls(std::shared_ptr<net::tls_context> tls) {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  impl_->tls = std::move(tls);
}

data_plane::~data_plane() {
  stop();
}

expected<std::string> data_plane::listen(const std::string& host) {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  if (d.stopped)
    return make_error(errc::invalid_state, "the data plane is stopped");
  if (!d.listener) {
    auto l = net::tcp_listener::open(host, 0);
    if (!l)
      return l.error();
    d.listener.emplace(std::move(*l));
    d.admit = std::make_unique<net::admitter>(data_security(d.sys, d.tls, ""), "data plane",
                                              [&d] { return d.keys(); });
    d.endpoint = host + ":" + std::to_string(d.listener->port());
    d.acceptor = std::thread{[&d] {
      name_this_thread("ashlar.accept");
      d.accept_loop();
    }};
    spdlog::info("data plane: listening on {}", d.endpoint);
  }
  return d.endpoint;
}

void data_plane::serve_ring(const caf::actor& inbox, const std::string& key, uint64_t max_payload) {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  impl_->rings[inbox.id()] = impl::ring_inbox{inbox.address(), key, max_payload};
}

void data_plane::unserve_ring(caf::actor_id inbox) {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  impl_->rings.erase(inbox);
}

expected<std::string> data_plane::serve(uint32_t shard_id, const shard_actor& shard, const std::string& key,
                                        const std::string& host, uint64_t range_floats) {
  auto endpoint = listen(host);
  if (!endpoint)
    return endpoint;
  std::lock_guard<std::mutex> guard{impl_->mtx};
  // A sparse push carries values and indices: up to twice the range's floats.
  impl_->shards[shard_id] =
    impl::served{shard, key, range_floats > 0 ? 2 * range_floats * sizeof(float) : wire::max_message_bytes};
  return endpoint;
}

namespace {

// One try at an admitted connection to the data plane at `endpoint` for `what` ("shard
// 3", "the next worker's ring inbox"), with `head` as its hello ("<protocol> <shard id>",
// "<protocol> ring <actor id>"): TLS (if this process has credentials) and proof of the
// job's key (the key itself never crosses the wire), then shared memory where the peer is
// on this host. `busy`: the node closed or ran out of time before its gate answered.
expected<connection_ptr> open_connection(caf::actor_system& sys, const std::shared_ptr<net::tls_context>& tls,
                                         bool shared_memory, const std::string& endpoint, const std::string& key,
                                         const std::string& head, const std::string& what,
                                         std::chrono::milliseconds timeout, bool& busy) {
  auto colon = endpoint.rfind(':');
  int port = colon == std::string::npos ? 0 : std::atoi(endpoint.c_str() + colon + 1);
  if (port <= 0 || port > 65535)
    return make_error(errc::invalid_argument, "bad data endpoint '" + endpoint + "' for " + what
                                                + " (expected HOST:PORT)");
  auto raw = net::connect_tcp(endpoint.substr(0, colon), static_cast<uint16_t>(port), timeout);
  if (!raw)
    return raw.error();
  int fd = raw->release();
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  net::handshake hs{fd, false, data_security(sys, tls, key)};
  if (net::run_handshake(hs, timeout) != net::handshake::result::admitted) {
    ::close(fd);
    busy = hs.status() == net::gate_status::ok; // closed or out of time before the gate answered
    return make_error(errc::handshake_refused,
                      "the data plane at " + endpoint + " refused " + what + ": "
                        + (hs.status() == net::gate_status::wrong_token ? "wrong data-plane key (not this job's)"
                                                                         : hs.why()));
  }
  SSL* ssl = hs.release_ssl();
  const auto keys = hs.keys();
  auto sock = admitted_socket(fd, ssl, hs.sealed() ? &keys : nullptr, endpoint, false);
  if (!sock)
    return sock.error();
  auto c = std::make_shared<connection>();
  c->sock = std::move(*sock);
  if (auto err = c->sock.set_timeout(timeout))
    return err;
  // Offers shared memory: a peer on this host passes its rings to this socket.
  std::optional<net::shm_offer> offer;
  std::string why = "this process uses TCP only";
  if (shared_memory) {
    if (auto o = net::offer_shm())
      offer.emplace(std::move(*o));
    else
      why = describe(o.error());
  }
  if (auto err = net::write_text_frame(c->sock, net::frame_kind::hello, 0,
                                       head + (offer ? net::shm_hello_part(*offer) : "")))
    return err;
  net::inbound_frame f;
  if (auto err = net::read_frame(c->sock, f))
    return err;
  if (f.kind == net::frame_kind::error)
    return make_error(errc::handshake_refused, "the data plane at " + endpoint + " refused " + what + ": " + f.text);
  if (f.kind != net::frame_kind::welcome)
    return make_error(errc::malformed_message, "the data plane at " + endpoint + " answered the hello with "
                                                 "frame kind " + std::to_string(static_cast<uint32_t>(f.kind)));
  if (offer) {
    const bool ring = head.find(" ring ") != std::string::npos; // (chunks are summed into: copied)
    auto ch = net::shm_switch_client(c->sock, *offer, f.text, timeout, why, ring ? nullptr : job_arena(key));
    if (!ch)
      return ch.error();
    c->shm = std::move(*ch);
    c->on_shm = c->shm != nullptr;
  }
  spdlog::info("data plane: {} at {} over {}", what, endpoint,
               c->shm ? "shared memory (same host" + in_place(*c->shm) + ")" : "TCP (" + why + ")");
  if (auto err = c->sock.set_timeout(std::chrono::milliseconds{0}))
    return err;
  return c;
}

// open_connection with this data plane's credentials and path choice, tried again while
// the node is busy (with_backoff), for up to `timeout`.
expected<connection_ptr> dial(data_plane::impl& d, const std::string& endpoint, const std::string& key,
                              const std::string& head, const std::string& what, std::chrono::milliseconds timeout) {
  bool shm = false;
  std::shared_ptr<net::tls_context> tls;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    shm = d.shared_memory;
    tls = d.tls;
  }
  return with_backoff(timeout, [&](std::chrono::milliseconds t, bool& busy) {
    return open_connection(d.sys, tls, shm, endpoint, key, head, what, t, busy);
  });
}

}  // namespace

expected<shard_actor> data_plane::connect(const shard_actor& remote, uint32_t shard_id, const std::string& endpoint,
                                          const std::string& key, const caf::actor& owner,
                                          std::chrono::milliseconds timeout) {
  auto d = impl_;
  auto c = dial(*d, endpoint, key, std::to_string(wire::protocol_version) + " " + std::to_string(shard_id),
                "shard " + std::to_string(shard_id), timeout);
  if (!c)
    return c.error();
  std::lock_guard<std::mutex> guard{d->mtx};
  if (d->stopped)
    return make_error(errc::invalid_state, "the data plane is stopped");
  d->reap();
  if ((*c)->shm) {
    auto l = std::make_shared<link_state>();
    l->conn = *c;
    l->remote = caf::actor_cast<caf::actor>(remote);
    l->shard_id = shard_id;
    l->endpoint = endpoint;
    caf::actor_config cfg;
    auto link = caf::make_actor<shard_link, caf::strong_actor_ptr>(d->sys.next_actor_id(), d->sys.node(), &d->sys,
                                                                    cfg, l);
    auto stop = [addr = caf::actor_cast<caf::actor_addr>(link)](caf::error reason) {
      if (auto p = caf::actor_cast<caf::strong_actor_ptr>(addr))
        static_cast<shard_link*>(caf::actor_cast<caf::abstract_actor*>(p))->quit(std::move(reason));
    };
    l->remote->attach_functor([stop](const caf::error& reason) { stop(reason); });
    owner->attach_functor([stop] { stop(caf::exit_reason::normal); });
    d->conns.push_back(impl::running{*c, std::thread{link_reader, l}});
    return caf::actor_cast<shard_actor>(link);
  }
  auto proxy = d->sys.spawn<caf::detached>(shard_proxy, *c, remote, shard_id, endpoint, owner);
  d->conns.push_back(impl::running{*c, std::thread{proxy_reader, *c, proxy.address(), shard_id}});
  return caf::actor_cast<shard_actor>(proxy);
}

expected<caf::actor> data_plane::connect_ring(const caf::actor& next, const std::string& endpoint,
                                              const std::string& key, const caf::actor& owner,
                                              std::chrono::milliseconds timeout) {
  auto d = impl_;
  auto c = dial(*d, endpoint, key, std::to_string(wire::protocol_version) + " ring " + std::to_string(next.id()),
                "the next worker's ring inbox", timeout);
  if (!c)
    return c.error();
  std::lock_guard<std::mutex> guard{d->mtx};
  if (d->stopped)
    return make_error(errc::invalid_state, "the data plane is stopped");
  auto proxy = d->sys.spawn<caf::detached>(ring_proxy, *c, next, endpoint, owner);
  d->reap();
  d->conns.push_back(impl::running{*c, std::thread{}}); // (no reader: nothing comes back)
  return proxy;
}

void data_plane::stop() {
  auto& d = *impl_;
  std::list<impl::running> conns;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    if (d.stopped)
      return;
    d.stopped = true;
    if (d.listener)
      d.listener->shutdown();
    for (auto& r : d.conns)
      r.conn->end();
    conns.swap(d.conns);
  }
  if (d.acceptor.joinable())
    d.acceptor.join();
  if (d.admit)
    d.admit->stop();
  for (auto& r : conns)
    if (r.thread.joinable())
      r.thread.join();
}

std::string make_data_key() {
  return net::random_hex(16);
}

}  // namespace ashlar::actors
