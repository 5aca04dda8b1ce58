// Test helpers shared by the file-format tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <qkv/runtime/io/array.hpp>

namespace qkv::testing_io {

namespace fs = std::filesystem;

// The IoError message thrown by f, or a marker if nothing was thrown (other exceptions escape and
// fail the test).
inline std::string io_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const qkv::IoError& e) {
    return e.what();
  }
  return "<no IoError thrown>";
}

// Expects `stmt` to throw IoError whose message contains every one of the given substrings.
#define EXPECT_IO_ERROR(stmt, ...)                                                                         \
  do {                                                                                                     \
    const std::string msg_ = io_error_message([&] { (void)(stmt); });                                      \
    const std::vector<std::string> needles_{__VA_ARGS__};                                                  \
    for (const std::string& needle_ : needles_)                                                            \
      EXPECT_NE(msg_.find(needle_), std::string::npos) << "message: " << msg_ << "\n  lacks: " << needle_; \
  } while (0)

// A fresh directory for one test, removed afterwards.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// The bytes of v as stored on this (little-endian) machine.
template <class T>
inline std::vector<std::byte> le_bytes(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace qkv::testing_io
