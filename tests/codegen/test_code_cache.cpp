// The JIT's code cache on disk (qkv/codegen/code_cache.hpp): a second JIT loads what the first
// compiled; a truncated or corrupted entry is compiled again and replaced, never loaded;
// concurrent JITs leave one whole entry; the folder stays under its bound; off means no files; a
// large module is compiled in parts and cached as them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/code_cache.hpp>
#include <qkv/codegen/jit.hpp>

namespace qkv::codegen {
namespace {

namespace fs = std::filesystem;

using Fn = std::int64_t(std::int64_t);

/// Compiles `int64 name(int64 x) { return x * k + 7; }` in a JIT of its own and returns f(x), or
/// -1 if anything failed (the JIT dies with the call: the code is not used after).
std::int64_t compile_and_call(std::int64_t k, std::int64_t x, const std::string& name = "scaled") {
  std::string error;
  auto jit = Jit::create(&error);
  if (!jit) {
    ADD_FAILURE() << error;
    return -1;
  }
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto mod = std::make_unique<llvm::Module>("m", *ctx);
  llvm::IRBuilder<> b(*ctx);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getInt64Ty(), {b.getInt64Ty()}, false),
                                    llvm::GlobalValue::ExternalLinkage, name, *mod);
  b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", fn));
  b.CreateRet(b.CreateAdd(b.CreateMul(fn->getArg(0), b.getInt64(k)), b.getInt64(7)));
  if (!jit->add(std::move(mod), std::move(ctx), &error)) {
    ADD_FAILURE() << error;
    return -1;
  }
  Fn* f = jit->lookup<Fn>(name, &error);
  if (!f) {
    ADD_FAILURE() << error;
    return -1;
  }
  return f(x);
}

class CodeCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qkv_code_cache_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    set_code_cache(CodeCacheSettings{dir_});
  }
  void TearDown() override {
    set_code_cache(std::nullopt);
    fs::remove_all(dir_);
  }
  /// The folder's entries (name → size), temporary files included.
  [[nodiscard]] std::vector<std::pair<std::string, std::uintmax_t>> entries() const {
    std::vector<std::pair<std::string, std::uintmax_t>> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_)) out.emplace_back(e.path().filename().string(), e.file_size());
    return out;
  }
  fs::path dir_;
};

TEST_F(CodeCache, ASecondJitLoadsTheObjectTheFirstCompiled) {
  const CodeCacheStats s0 = code_cache_stats();
  const JitStats j0 = jit_stats();
  EXPECT_EQ(compile_and_call(3, 5), 22);
  const CodeCacheStats s1 = code_cache_stats();
  EXPECT_EQ(s1.stores - s0.stores, 1);
  EXPECT_EQ(s1.hits - s0.hits, 0);
  ASSERT_EQ(entries().size(), 1u);
  EXPECT_TRUE(entries()[0].first.ends_with(".o"));

  EXPECT_EQ(compile_and_call(3, 6), 25);
  const CodeCacheStats s2 = code_cache_stats();
  EXPECT_EQ(s2.hits - s1.hits, 1);
  EXPECT_EQ(s2.stores - s1.stores, 0);
  EXPECT_EQ(jit_stats().loaded_from_cache - j0.loaded_from_cache, 1);

  // Another module (another constant, another name) is another entry.
  EXPECT_EQ(compile_and_call(4, 5), 27);
  EXPECT_EQ(compile_and_call(3, 5, "other"), 22);
  EXPECT_EQ(code_cache_stats().hits - s2.hits, 0);
  EXPECT_EQ(entries().size(), 3u);
}

TEST_F(CodeCache, ATruncatedOrCorruptedEntryIsCompiledAgainNeverLoaded) {
  EXPECT_EQ(compile_and_call(9, 2), 25);
  ASSERT_EQ(entries().size(), 1u);
  const fs::path entry = dir_ / entries()[0].first;
  const std::uintmax_t size = entries()[0].second;

  auto damage = [&](const std::string& how) {
    if (how == "truncated") {
      fs::resize_file(entry, size / 2);
    } else if (how == "a byte flipped") {
      std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(size - 9));
      const char c = static_cast<char>(f.get());
      f.seekp(static_cast<std::streamoff>(size - 9));
      f.put(static_cast<char>(c ^ 0x10));
    } else if (how == "empty") {
      fs::resize_file(entry, 0);
    } else {  // grown: bytes appended
      std::ofstream(entry, std::ios::app | std::ios::binary) << "trailing";
    }
  };
  for (const std::string how : {"truncated", "a byte flipped", "empty", "grown"}) {
    damage(how);
    const CodeCacheStats before = code_cache_stats();
    EXPECT_EQ(compile_and_call(9, 3), 34) << how;
    const CodeCacheStats after = code_cache_stats();
    EXPECT_EQ(after.rejected - before.rejected, 1) << how;
    EXPECT_EQ(after.hits - before.hits, 0) << how;
    EXPECT_EQ(after.stores - before.stores, 1) << how;
    ASSERT_EQ(entries().size(), 1u) << how;
    EXPECT_EQ(entries()[0].second, size) << how << ": the entry is written whole again";
    // …and the rewritten entry loads.
    EXPECT_EQ(compile_and_call(9, 4), 43) << how;
    EXPECT_EQ(code_cache_stats().hits - after.hits, 1) << how;
  }
}

TEST_F(CodeCache, ConcurrentJitsLeaveOneWholeEntry) {
  std::vector<std::thread> threads;
  std::vector<std::int64_t> results(4, 0);
  for (std::size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] { results[t] = compile_and_call(11, static_cast<std::int64_t>(t)); });
  for (auto& t : threads) t.join();
  for (std::size_t t = 0; t < results.size(); ++t) EXPECT_EQ(results[t], 11 * static_cast<std::int64_t>(t) + 7);
  const auto e = entries();
  ASSERT_EQ(e.size(), 1u) << "no temporary file is left behind";
  const CodeCacheStats before = code_cache_stats();
  EXPECT_EQ(compile_and_call(11, 10), 117);
  EXPECT_EQ(code_cache_stats().hits - before.hits, 1);
}

TEST_F(CodeCache, TheFolderStaysUnderItsBoundLeastRecentlyUsedFirst) {
  EXPECT_EQ(compile_and_call(1, 1), 8);
  ASSERT_EQ(entries().size(), 1u);
  const std::uintmax_t one = entries()[0].second;
  const fs::path first = dir_ / entries()[0].first;
  set_code_cache(CodeCacheSettings{dir_, one * 5 / 2});  // room for two entries
  const CodeCacheStats before = code_cache_stats();
  EXPECT_EQ(compile_and_call(2, 1), 9);
  ASSERT_EQ(entries().size(), 2u);
  const fs::path second = dir_ / (entries()[0].first == first.filename() ? entries()[1] : entries()[0]).first;
  // Recency is the files' modification time: the two entries made an hour apart, the first older.
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(first, now - std::chrono::hours(2));
  fs::last_write_time(second, now - std::chrono::hours(1));
  // The first entry is used again, which makes it the most recent: the second goes next.
  EXPECT_EQ(compile_and_call(1, 2), 9);
  EXPECT_GT(fs::last_write_time(first), fs::last_write_time(second));
  EXPECT_EQ(compile_and_call(3, 1), 10);
  EXPECT_TRUE(fs::exists(first));
  EXPECT_FALSE(fs::exists(second));
  std::uintmax_t total = 0;
  for (const auto& [name, size] : entries()) total += size;
  EXPECT_LE(total, one * 5 / 2);
  EXPECT_EQ(entries().size(), 2u);
  EXPECT_EQ(code_cache_stats().evicted - before.evicted, 1);
  const CodeCacheStats mid = code_cache_stats();
  EXPECT_EQ(compile_and_call(1, 3), 10);  // kept: it was used after the one evicted
  EXPECT_EQ(compile_and_call(3, 2), 13);  // kept: the newest
  EXPECT_EQ(code_cache_stats().hits - mid.hits, 2);
}

/// A module of 60 internal functions f_i(x) = x + 500 + i (each 500 unoptimised adds: 30 000
/// instructions, compiled in 2 parts on 2 hardware threads or more), an internal table read by
/// them, and the exported `name`(x) = Σ f_i(x) + table[1] · k, added to `jit`; false on failure.
bool add_large_module(Jit& jit, const std::string& name, std::int64_t k) {
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto mod = std::make_unique<llvm::Module>("large", *ctx);
  llvm::IRBuilder<> b(*ctx);
  auto* i64 = b.getInt64Ty();
  auto* table_type = llvm::ArrayType::get(i64, 2);
  auto* table = new llvm::GlobalVariable(*mod, table_type, true, llvm::GlobalValue::InternalLinkage,
                                         llvm::ConstantArray::get(table_type, {b.getInt64(0), b.getInt64(k)}), "table");
  auto* type = llvm::FunctionType::get(i64, {i64}, false);
  auto* top = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, name, *mod);
  std::vector<llvm::Function*> parts;
  for (int i = 0; i < 60; ++i) {
    auto* f = llvm::Function::Create(type, llvm::GlobalValue::InternalLinkage, "f" + std::to_string(i), *mod);
    b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", f));
    llvm::Value* v = b.CreateAdd(f->getArg(0), b.getInt64(i));
    for (int j = 0; j < 500; ++j) v = b.CreateAdd(v, b.getInt64(1));
    b.CreateRet(v);
    parts.push_back(f);
  }
  b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", top));
  llvm::Value* sum = b.CreateLoad(i64, b.CreateConstInBoundsGEP2_64(table_type, table, 0, 1));
  for (llvm::Function* f : parts) sum = b.CreateAdd(sum, b.CreateCall(f, {top->getArg(0)}));
  b.CreateRet(sum);
  std::string error;
  if (!jit.add(std::move(mod), std::move(ctx), &error)) {
    ADD_FAILURE() << error;
    return false;
  }
  return true;
}

std::int64_t large_expected(std::int64_t k, std::int64_t x) { return k + 60 * (x + 500) + 59 * 60 / 2; }

// A large module (a decoder's step graph) is compiled in parts at once, one a hardware thread:
// its internal functions and table reached across the parts, two such modules with the same
// internal names in one JIT, cached as its parts (a second JIT loads them all; one part damaged:
// the module compiled again, all its parts stored again).
TEST_F(CodeCache, ALargeModuleIsCompiledInPartsAndCachedAsThem) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread: modules compile whole";
  std::string error;
  // Modules (name, k) in one JIT, each called at x: their results, or -1.
  auto run = [&](const std::vector<std::pair<std::string, std::int64_t>>& modules, std::int64_t x) {
    std::vector<std::int64_t> out;
    auto jit = Jit::create(&error);
    if (!jit) return out;
    for (const auto& [name, k] : modules)
      if (!add_large_module(*jit, name, k)) return out;
    for (const auto& [name, k] : modules) {
      Fn* f = jit->lookup<Fn>(name, &error);
      out.push_back(f ? f(x) : -1);
    }
    return out;
  };
  // The same internal names in another module of the same JIT.
  EXPECT_EQ(run({{"large_a", 3}, {"large_b", 4}}, 5),
            (std::vector<std::int64_t>{large_expected(3, 5), large_expected(4, 5)}))
      << error;
  ASSERT_EQ(entries().size(), 4u) << "two parts a module";
  const CodeCacheStats before = code_cache_stats();
  const JitStats j0 = jit_stats();
  EXPECT_EQ(run({{"large_a", 3}}, 7), std::vector<std::int64_t>{large_expected(3, 7)}) << error;
  EXPECT_EQ(code_cache_stats().hits - before.hits, 2);
  EXPECT_EQ(jit_stats().loaded_from_cache - j0.loaded_from_cache, 1);
  // One part of a module damaged.
  fs::remove_all(dir_);
  EXPECT_EQ(run({{"large_a", 3}}, 8), std::vector<std::int64_t>{large_expected(3, 8)}) << error;
  ASSERT_EQ(entries().size(), 2u);
  fs::resize_file(dir_ / entries()[0].first, entries()[0].second / 2);
  const CodeCacheStats damaged = code_cache_stats();
  const JitStats j1 = jit_stats();
  EXPECT_EQ(run({{"large_a", 3}}, 9), std::vector<std::int64_t>{large_expected(3, 9)}) << error;
  EXPECT_EQ(code_cache_stats().rejected - damaged.rejected, 1);
  EXPECT_EQ(code_cache_stats().stores - damaged.stores, 2);
  EXPECT_EQ(jit_stats().loaded_from_cache - j1.loaded_from_cache, 0);
}

TEST_F(CodeCache, OffWritesNothing) {
  set_code_cache(std::nullopt);
  const CodeCacheStats before = code_cache_stats();
  EXPECT_EQ(compile_and_call(5, 5), 32);
  EXPECT_EQ(compile_and_call(5, 5), 32);
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(code_cache_stats().stores, before.stores);
  EXPECT_EQ(code_cache_stats().hits, before.hits);
}

TEST_F(CodeCache, TheDefaultFolderFollowsTheEnvironment) {
  struct Saved {
    const char* name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* n : {"QKV_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "QKV_CACHE_MAX_MB"}) {
    const char* v = std::getenv(n);
    saved.push_back({n, v ? std::optional<std::string>(v) : std::nullopt});
  }
  ::setenv("HOME", "/home/u", 1);
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("QKV_CACHE_DIR");
  ::unsetenv("QKV_CACHE_MAX_MB");
  EXPECT_EQ(default_code_cache()->dir, fs::path("/home/u/.cache/qkv"));
  EXPECT_EQ(default_code_cache()->max_bytes, std::uint64_t{1} << 30);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(default_code_cache()->dir, fs::path("/xdg/qkv"));
  ::setenv("QKV_CACHE_DIR", "/mine", 1);
  ::setenv("QKV_CACHE_MAX_MB", "64", 1);
  EXPECT_EQ(default_code_cache()->dir, fs::path("/mine"));
  EXPECT_EQ(default_code_cache()->max_bytes, std::uint64_t{64} << 20);
  ::setenv("QKV_CACHE_MAX_MB", "lots", 1);
  EXPECT_EQ(default_code_cache()->max_bytes, std::uint64_t{1} << 30);
  ::unsetenv("QKV_CACHE_DIR");
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  EXPECT_FALSE(default_code_cache().has_value());
  for (const Saved& s : saved) {
    if (s.value)
      ::setenv(s.name, s.value->c_str(), 1);
    else
      ::unsetenv(s.name);
  }
}

}  // namespace
}  // namespace qkv::codegen
