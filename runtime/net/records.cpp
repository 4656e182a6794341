#include "runtime/net/records.hpp"

#include <algorithm>
#include <cstring>

#include <openssl/evp.h>

namespace ashlar::net {

struct record_cipher::ctx {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  int keyed = 0; // 1: for sealing, 2: for opening (the key schedule is made once)
  ~ctx() { EVP_CIPHER_CTX_free(c); }
};

record_cipher::record_cipher(const uint8_t (&key)[32]) : ctx_(std::make_unique<ctx>()) {
  std::memcpy(key_, key, sizeof key_);
}

record_cipher::~record_cipher() = default;

void record_cipher::next_nonce(uint8_t (&iv)[12]) {
  std::memset(iv, 0, 4);
  for (int i = 0; i < 8; ++i)
    iv[4 + i] = static_cast<uint8_t>(counter_ >> (56 - 8 * i));
  ++counter_;
}

bool record_cipher::keyed(bool sealing) {
  const int want = sealing ? 1 : 2;
  if (ctx_->c == nullptr)
    return false;
  if (ctx_->keyed == want)
    return true;
  const bool ok = sealing ? EVP_EncryptInit_ex(ctx_->c, EVP_aes_128_gcm(), nullptr, key_, nullptr) == 1
                          : EVP_DecryptInit_ex(ctx_->c, EVP_aes_128_gcm(), nullptr, key_, nullptr) == 1;
  ctx_->keyed = ok ? want : 0;
  return ok;
}

size_t record_cipher::length_of(const uint8_t* head) {
  return (size_t{head[0]} << 24) | (size_t{head[1]} << 16) | (size_t{head[2]} << 8) | head[3];
}

bool record_cipher::begin(uint8_t* head, size_t len) {
  head[0] = static_cast<uint8_t>(len >> 24);
  head[1] = static_cast<uint8_t>(len >> 16);
  head[2] = static_cast<uint8_t>(len >> 8);
  head[3] = static_cast<uint8_t>(len);
  uint8_t iv[12];
  next_nonce(iv);
  int outl = 0;
  return keyed(true) && EVP_EncryptInit_ex(ctx_->c, nullptr, nullptr, nullptr, iv) == 1
         && EVP_EncryptUpdate(ctx_->c, nullptr, &outl, head, record_head_bytes) == 1;
}

bool record_cipher::update(const uint8_t* in, size_t n, uint8_t* out) {
  int outl = 0;
  return EVP_EncryptUpdate(ctx_->c, out, &outl, in, static_cast<int>(n)) == 1;
}

bool record_cipher::finish(uint8_t* tag) {
  int outl = 0;
  uint8_t none[16];
  return EVP_EncryptFinal_ex(ctx_->c, none, &outl) == 1
         && EVP_CIPHER_CTX_ctrl(ctx_->c, EVP_CTRL_GCM_GET_TAG, record_tag_bytes, tag) == 1;
}

bool record_cipher::open(const uint8_t* head, uint8_t* data, size_t len, const uint8_t* tag) {
  uint8_t iv[12];
  next_nonce(iv);
  int outl = 0;
  uint8_t none[16];
  return keyed(false) && EVP_DecryptInit_ex(ctx_->c, nullptr, nullptr, nullptr, iv) == 1
         && EVP_DecryptUpdate(ctx_->c, nullptr, &outl, head, record_head_bytes) == 1
         && EVP_DecryptUpdate(ctx_->c, data, &outl, data, static_cast<int>(len)) == 1
         && EVP_CIPHER_CTX_ctrl(ctx_->c, EVP_CTRL_GCM_SET_TAG, record_tag_bytes, const_cast<uint8_t*>(tag)) == 1
         && EVP_DecryptFinal_ex(ctx_->c, none, &outl) == 1;
}

// ---- reader ----

uint8_t* record_reader::space(size_t& n, size_t want) {
  if (plain_at_ == plain_end_ && record_ > 0) { // what follows the used record moves to the front
    std::memmove(buf_.data(), buf_.data() + record_, end_ - record_);
    end_ -= record_;
    record_ = 0;
  }
  if (end_ == 0 && buf_.size() > 2 * want) // idle: a big record's buffer is given back
    std::vector<uint8_t>{}.swap(buf_);
  if (buf_.size() - end_ < want)
    buf_.resize(std::max(buf_.size(), end_ + want));
  n = buf_.size() - end_;
  return buf_.data() + end_;
}

bool record_reader::commit(size_t n) {
  end_ += std::min(n, buf_.size() - end_);
  size_t ignored = 0;
  return ready(ignored);
}

bool record_reader::open_next() {
  const size_t have = end_ - record_;
  if (have < record_head_bytes)
    return true;
  const uint8_t* head = buf_.data() + record_;
  const size_t len = record_cipher::length_of(head);
  if (len == 0 || len > max_record_bytes) {
    broken_ = true;
    why_ = "a sealed record of " + std::to_string(len) + " bytes (at most " + std::to_string(max_record_bytes)
           + "): not a sealed Ashlar stream, or altered on the way";
    return false;
  }
  const size_t whole = record_head_bytes + len + record_tag_bytes;
  if (have < whole) {
    if (buf_.size() < record_ + whole) // room for the whole record, so that it can arrive
      buf_.resize(record_ + whole);
    return true;
  }
  uint8_t* data = buf_.data() + record_ + record_head_bytes;
  if (!cipher_.open(head, data, len, data + len)) {
    broken_ = true;
    why_ = "a record failed authentication (altered, replayed or injected on the way, or sealed under "
           "another key)";
    return false;
  }
  plain_at_ = record_ + record_head_bytes;
  plain_end_ = plain_at_ + len;
  return true;
}

bool record_reader::ready(size_t& n) {
  n = 0;
  if (broken_)
    return false;
  if (plain_at_ == plain_end_ && !open_next())
    return false;
  n = plain_end_ - plain_at_;
  return true;
}

size_t record_reader::take(uint8_t* out, size_t n) {
  size_t have = 0;
  if (!ready(have))
    return 0;
  const size_t k = std::min(n, have);
  std::memcpy(out, buf_.data() + plain_at_, k);
  plain_at_ += k;
  if (plain_at_ == plain_end_ && k > 0) { // used up: the next record begins after its tag
    record_ = plain_end_ + record_tag_bytes;
    plain_at_ = plain_end_ = 0;
    if (record_ == end_)
      record_ = end_ = 0;
  }
  return k;
}

// ---- writer ----

size_t record_writer::seal(const uint8_t* data, size_t n) {
  const size_t len = std::min(n, write_record_bytes);
  if (len == 0)
    return 0;
  out_.resize(record_head_bytes + len + record_tag_bytes);
  at_ = 0;
  uint8_t* head = out_.data();
  if (!cipher_.begin(head, len) || !cipher_.update(data, len, head + record_head_bytes)
      || !cipher_.finish(head + record_head_bytes + len)) {
    out_.clear();
    return 0;
  }
  return len;
}

const uint8_t* record_writer::pending(size_t& n) const {
  n = out_.size() - at_;
  return out_.data() + at_;
}

void record_writer::sent(size_t n) {
  at_ = std::min(out_.size(), at_ + n);
  if (at_ == out_.size()) {
    out_.clear();
    at_ = 0;
  }
}

void record_writer::release() {
  if (idle())
    std::vector<uint8_t>{}.swap(out_);
}

}  // namespace ashlar::net
