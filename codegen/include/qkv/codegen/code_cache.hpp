// qkv/codegen/code_cache.hpp — the JIT's object files kept on disk, so that a second process
// compiling the same module loads its machine code instead of running -O3 and code generation
// again (a decoder's step graph: seconds of compile, milliseconds of load).
//
//   qkv::codegen::set_code_cache(qkv::codegen::CodeCacheSettings{*qkv::codegen::default_code_cache_dir()});
//
// Off until set (the library never writes to a user's folders unasked); the qkv CLI turns it on
// (`--no-cache` leaves it off). What a cached object is keyed by — the unoptimised module's text,
// the target's CPU and features, LLVM's version, and the build ID of the binary holding qkv's
// code generator — changes whenever the object could: a rebuilt qkv never loads an old object.
//
// Every entry is written to a temporary file in the folder and renamed into place, so that
// concurrent processes each see a whole entry or none; each holds its length and a checksum,
// checked before it is loaded (a truncated or corrupted entry is compiled again and replaced,
// never loaded). When the folder passes max_bytes, the least recently used entries go. Failing
// to read or write the cache never fails a compilation: it compiles as if there were none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

namespace qkv::codegen {

struct CodeCacheSettings {
  std::filesystem::path dir;
  std::uint64_t max_bytes = std::uint64_t{1} << 30;
};

/// $QKV_CACHE_DIR, else $XDG_CACHE_HOME/qkv, else $HOME/.cache/qkv; nullopt when none is set.
/// The size bound: $QKV_CACHE_MAX_MB (MiB) when set, else 1 GiB.
std::optional<CodeCacheSettings> default_code_cache();

/// The cache JITs created from now on use (nullopt: none). Thread-safe.
void set_code_cache(std::optional<CodeCacheSettings> settings);
std::optional<CodeCacheSettings> code_cache();

/// What the cache did in this process: objects loaded instead of compiled, objects written,
/// entries refused as truncated or corrupt (then compiled again), entries evicted for size.
struct CodeCacheStats {
  std::int64_t hits = 0, stores = 0, rejected = 0, evicted = 0;
};
CodeCacheStats code_cache_stats();

}  // namespace qkv::codegen
