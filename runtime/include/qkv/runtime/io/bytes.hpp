// qkv/runtime/io/bytes.hpp — the storage of an NdArray: bytes it owns, or a window onto memory
// that something else keeps alive (a checkpoint's tensor mapped from its file).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace qkv {

/// The bytes of an NdArray, used as a std::vector<std::byte> is (data, size, begin/end, [],
/// resize). Either owned (a vector), or a window: `size` bytes at `data` that `keep` holds alive.
/// SafetensorsFile::load gives a tensor a window onto a private mapping of its file, so that a
/// 1.9 GB checkpoint is read where the page cache holds it instead of copied (the copy, and the
/// faults of its fresh pages, were half of a first token). A window is writable: the mapping is
/// private, so a write copies that page for this process and never reaches the file.
///
/// An array is a value: copying a Bytes copies the bytes into owned storage, and anything that
/// changes the size (resize, pop_back, assign) first does so for a window. Moving keeps the
/// buffer, so pointers into it stay valid.
class Bytes {
 public:
  using value_type = std::byte;
  using iterator = std::byte*;
  using const_iterator = const std::byte*;

  Bytes() = default;
  Bytes(std::vector<std::byte> owned) noexcept : owned_(std::move(owned)) {}  // NOLINT: implicit, as a vector
  /// A window of `size` bytes at `data`, alive while `keep` is.
  static Bytes window(std::byte* data, std::size_t size, std::shared_ptr<void> keep) {
    Bytes b;
    b.window_ = data;
    b.window_size_ = size;
    b.keep_ = std::move(keep);
    return b;
  }

  Bytes(const Bytes& other) : owned_(other.begin(), other.end()) {}
  Bytes(Bytes&& other) noexcept
      : owned_(std::move(other.owned_)),
        window_(std::exchange(other.window_, nullptr)),
        window_size_(std::exchange(other.window_size_, 0)),
        keep_(std::move(other.keep_)) {}
  Bytes& operator=(const Bytes& other) {
    if (this != &other) *this = Bytes(other);
    return *this;
  }
  Bytes& operator=(Bytes&& other) noexcept {
    if (this != &other) {
      owned_ = std::move(other.owned_);
      window_ = std::exchange(other.window_, nullptr);
      window_size_ = std::exchange(other.window_size_, 0);
      keep_ = std::move(other.keep_);
    }
    return *this;
  }
  ~Bytes() = default;

  [[nodiscard]] std::byte* data() noexcept { return window_ ? window_ : owned_.data(); }
  [[nodiscard]] const std::byte* data() const noexcept { return window_ ? window_ : owned_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return window_ ? window_size_ : owned_.size(); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] std::byte* begin() noexcept { return data(); }
  [[nodiscard]] std::byte* end() noexcept { return data() + size(); }
  [[nodiscard]] const std::byte* begin() const noexcept { return data(); }
  [[nodiscard]] const std::byte* end() const noexcept { return data() + size(); }
  std::byte& operator[](std::size_t i) noexcept { return data()[i]; }
  const std::byte& operator[](std::size_t i) const noexcept { return data()[i]; }

  void resize(std::size_t n) {
    own();
    owned_.resize(n);
  }
  void pop_back() {
    own();
    owned_.pop_back();
  }
  template <class It>
  void assign(It first, It last) {
    *this = Bytes(std::vector<std::byte>(first, last));
  }

  /// Whether these bytes are a window (for tests and notes; nothing else needs to know).
  [[nodiscard]] bool is_window() const noexcept { return window_ != nullptr; }

  friend bool operator==(const Bytes& a, const Bytes& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

 private:
  void own() {
    if (window_) *this = Bytes(std::vector<std::byte>(begin(), end()));
  }

  std::vector<std::byte> owned_;
  std::byte* window_ = nullptr;
  std::size_t window_size_ = 0;
  std::shared_ptr<void> keep_;
};

}  // namespace qkv
