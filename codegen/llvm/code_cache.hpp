// codegen/llvm/code_cache.hpp — the on-disk object cache behind Jit (qkv/codegen/code_cache.hpp
// is its public side: settings and stats). Private to codegen.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include <qkv/codegen/code_cache.hpp>

namespace llvm {
class MemoryBuffer;
class Module;
class StringRef;
}  // namespace llvm

namespace qkv::codegen::disk_cache {

using Key = std::array<std::uint8_t, 32>;

/// The key of the unoptimised `module` compiled for `target_key` (SHA-256 of the module's text,
/// the target, LLVM's version and the build ID of the binary holding this code); nullopt when
/// the binary has no build ID to tell one qkv build from the next (then nothing is cached).
std::optional<Key> key_of(const llvm::Module& module, const std::string& target_key);

/// "qkv-" and the key in hex: the module identifier that tells notify_compiled which entry a
/// compiled object belongs to.
std::string module_name(const Key& key);
std::optional<Key> key_of_module_name(const std::string& name);

/// The object stored under `key`, its length and checksum verified; nullptr when there is none,
/// or when the entry is truncated or corrupt (then it is removed and counted as rejected).
std::unique_ptr<llvm::MemoryBuffer> load(const CodeCacheSettings& settings, const Key& key);

/// Writes `object` under `key` (a temporary file renamed into place), then evicts the least
/// recently used entries beyond settings.max_bytes. Failures are silent: the cache is optional.
void store(const CodeCacheSettings& settings, const Key& key, llvm::StringRef object);

}  // namespace qkv::codegen::disk_cache
