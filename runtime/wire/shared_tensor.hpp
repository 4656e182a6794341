// Tensors as messages carry them: `tensor` (a buffer of floats sized without zero-fill)
// and `shared_tensor` (a read-only window of storage that any number of holders share).
// Light on purpose: the shard's state machine and the checkpoint writer hold parameter
// versions as shared tensors without the message definitions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/wire/blocks.hpp"

namespace ashlar::wire {

/// Leaves new elements uninitialized: message buffers are written whole right after they
/// are sized, so zero-filling them first would only cost time. Large buffers come from
/// the block cache (blocks.hpp): memory already mapped, not fresh pages.
template <class T>
struct uninitialized_allocator : std::allocator<T> {
  T* allocate(size_t n) {
    if (n * sizeof(T) >= block_threshold)
      return static_cast<T*>(take_block(n * sizeof(T)));
    return std::allocator<T>::allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) >= block_threshold)
      give_block(p, n * sizeof(T));
    else
      std::allocator<T>::deallocate(p, n);
  }
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  uninitialized_allocator() = default;
  template <class U>
  uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// A tensor carried in a message (parameters, gradients). Sizing it does not zero-fill:
/// receivers write it whole right after, from the socket or a decoder.
using tensor = std::vector<float, uninitialized_allocator<float>>;

/// A read-only tensor that may share its storage: a window of an immutable buffer (a
/// shard's parameter version, referenced by every reply that reads it) or a buffer of its
/// own (filled by a decoder). Copying one copies a reference, never the floats. The
/// storage lives as long as any shared_tensor refers to it; nobody writes it meanwhile.
class shared_tensor {
public:
  shared_tensor() = default;

  /// A window [offset, offset + n) of `buf`, which must not be written while referenced.
  shared_tensor(std::shared_ptr<const std::vector<float>> buf, size_t offset, size_t n)
    : data_(buf, buf->data() + offset), size_(n) {
  }

  shared_tensor(std::initializer_list<float> values) : shared_tensor(tensor(values)) {
  }

  /// `n` floats at `data`, which keeps their storage (a buffer shared with another
  /// process, a window of another tensor's).
  shared_tensor(std::shared_ptr<const float> data, size_t n) : data_(std::move(data)), size_(n) {
  }

  /// Takes `owned` as its storage.
  shared_tensor(tensor owned) {
    auto buf = std::make_shared<tensor>(std::move(owned));
    size_ = buf->size();
    data_ = std::shared_ptr<const float>(buf, buf->data());
  }

  /// Replaces the contents with `n` fresh, uninitialized floats of its own and returns
  /// them for the caller to fill before anyone else reads this tensor.
  float* reset(size_t n) {
    auto buf = std::make_shared<tensor>(n);
    float* out = buf->data();
    data_ = std::shared_ptr<const float>(buf, out);
    size_ = n;
    return out;
  }

  /// Fresh storage holding a copy of [first, last).
  template <class It>
  void assign(It first, It last) {
    std::copy(first, last, reset(static_cast<size_t>(std::distance(first, last))));
  }

  /// [offset, offset + n) of this tensor, sharing its storage.
  shared_tensor window(size_t offset, size_t n) const {
    return {std::shared_ptr<const float>(data_, data_.get() + offset), n};
  }

  /// What keeps the floats alive (whose owners count who holds them).
  const std::shared_ptr<const float>& storage() const { return data_; }

  const float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const float* begin() const { return data(); }
  const float* end() const { return data() + size_; }
  float operator[](size_t i) const { return data_.get()[i]; }

  /// The floats, copied (for tests and callers that need a vector).
  std::vector<float> to_vector() const { return {begin(), end()}; }

  /// Equal floats (not the same storage).
  friend bool operator==(const shared_tensor& a, const shared_tensor& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator!=(const shared_tensor& a, const shared_tensor& b) { return !(a == b); }
  friend bool operator==(const shared_tensor& a, const std::vector<float>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const std::vector<float>& a, const shared_tensor& b) { return b == a; }

private:
  std::shared_ptr<const float> data_;
  size_t size_ = 0;
};

/// Floats that something else owns, read where they lie (no reference is kept: valid
/// while the owner leaves them alone).
class float_view {
public:
  float_view() = default;
  float_view(const float* data, size_t n) : data_(data), size_(n) {}

  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  float operator[](size_t i) const { return data_[i]; }
  std::vector<float> to_vector() const { return {begin(), end()}; }

  friend bool operator==(const float_view& a, const float_view& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const float_view& a, const std::vector<float>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const std::vector<float>& a, const float_view& b) { return b == a; }

private:
  const float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ashlar::wire
