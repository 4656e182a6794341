// Sealed records: what crosses an admitted connection after the gate. Each record is
//
//   [plaintext length, 4 bytes big-endian][ciphertext][16-byte GCM tag]
//
// under AES-128-GCM (the first 16 bytes of a 32-byte key, as TLS's default suite), one key
// per direction, the nonce a per-direction record counter and the length authenticated
// data. A record altered, dropped, replayed, reordered or swapped in from another
// connection fails authentication, and the reader stops there.
//
// Keys come from the TLS session (tls_export_keys) or, without TLS, from the gate's
// handshake (gate.hpp: session_keys), so no byte after the hello is accepted from anyone
// who does not hold the token the peer proved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ashlar::net {

constexpr size_t record_head_bytes = 4;
constexpr size_t record_tag_bytes = 16;
/// Largest plaintext of one record a reader accepts: 1 MiB.
constexpr size_t max_record_bytes = size_t{1} << 20;
/// What writers put in one record: small enough that a record is still in cache when the
/// kernel copies it out (sealing) or when it is opened after the kernel copied it in.
constexpr size_t write_record_bytes = size_t{1} << 18;
/// What a data connection seals into before sending: records stream through it, so its
/// memory does not grow with the size of the messages it writes.
constexpr size_t seal_buffer_bytes = size_t{1} << 16;

/// One direction's key and record counter.
class record_cipher {
public:
  explicit record_cipher(const uint8_t (&key)[32]);
  ~record_cipher();
  record_cipher(const record_cipher&) = delete;
  record_cipher& operator=(const record_cipher&) = delete;

  /// Sealing one record of `len` bytes: begin() writes its head, update() encrypts the
  /// plaintext piece by piece (out may equal in), finish() writes the tag.
  bool begin(uint8_t* head, size_t len);
  bool update(const uint8_t* in, size_t n, uint8_t* out);
  bool finish(uint8_t* tag);

  /// Opens a whole record in place: its head as received, its len bytes, its tag.
  bool open(const uint8_t* head, uint8_t* data, size_t len, const uint8_t* tag);

  /// The plaintext length a head announces.
  static size_t length_of(const uint8_t* head);

private:
  void next_nonce(uint8_t (&iv)[12]);
  // The key schedule, made once for the direction's use (sealing or opening).
  bool keyed(bool sealing);
  struct ctx;
  std::unique_ptr<ctx> ctx_;
  uint8_t key_[32];
  uint64_t counter_ = 0;
};

/// The receiving half of a sealed stream, for a non-blocking connection: the caller puts
/// what the socket gives into space() and commit()s it, then takes the plaintext.
class record_reader {
public:
  explicit record_reader(const uint8_t (&key)[32]) : cipher_(key) {}

  /// Room for at least `want` more received bytes (fewer only if a record is pending);
  /// `n` is set to the room there is.
  /// An idle reader gives a big record's buffer back.
  uint8_t* space(size_t& n, size_t want = 64 * 1024);
  /// `n` bytes were put into space(). False once a record is malformed or fails
  /// authentication (why() says which).
  bool commit(size_t n);
  /// Plaintext ready now (opens the next whole record if none is). False: broken (why()).
  bool ready(size_t& n);
  /// Copies up to n bytes of plaintext out; returns how many.
  size_t take(uint8_t* out, size_t n);
  const std::string& why() const { return why_; }

private:
  bool open_next();

  record_cipher cipher_;
  std::vector<uint8_t> buf_;
  size_t end_ = 0;        // bytes received into buf_
  size_t record_ = 0;     // start of the record being read
  size_t plain_at_ = 0;   // plaintext of the open record: [plain_at_, plain_end_)
  size_t plain_end_ = 0;
  bool broken_ = false;
  std::string why_;
};

/// The sending half: seals plaintext into records the caller sends.
class record_writer {
public:
  explicit record_writer(const uint8_t (&key)[32]) : cipher_(key) {}

  /// Seals up to max_record_bytes of data into one record waiting to be sent; returns
  /// how many plaintext bytes it took (0 on a cipher failure). Call only when idle().
  size_t seal(const uint8_t* data, size_t n);
  /// The bytes still to send, and how many.
  const uint8_t* pending(size_t& n) const;
  void sent(size_t n);
  bool idle() const { return at_ == out_.size(); }
  /// Gives the buffer of a sent record back (when the caller has nothing more to send).
  void release();

private:
  record_cipher cipher_;
  std::vector<uint8_t> out_;
  size_t at_ = 0;
};

}  // namespace ashlar::net
