// codegen/llvm/code_cache.hpp — the on-disk object cache behind Jit (qkv/codegen/code_cache.hpp
// is its public side: settings and stats). Private to codegen.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <qkv/codegen/code_cache.hpp>

namespace llvm {
class MemoryBuffer;
class Module;
class StringRef;
}  // namespace llvm

namespace qkv::codegen::disk_cache {

/// The key of the unoptimised `module` compiled for `target_key`: the SHA-256, in hex, of the
/// module's text, the target, LLVM's version and the build ID of the binary holding this code;
/// nullopt when the binary has no build ID to tell one qkv build from the next (then nothing is
/// cached). It names the entry's file and, prefixed by "qkv-", the module (module_name), which
/// tells the compiled object's store which entry it is.
std::optional<std::string> key_of(const llvm::Module& module, const std::string& target_key);
std::string module_name(const std::string& key);
/// The key of part `part` of `parts` of the module `key` names (a module compiled in parts:
/// split_compile.hpp), a key like any other.
std::string part_key(const std::string& key, int part, int parts);
/// The key a module_name names, or nullopt for another module.
std::optional<std::string> key_of_module(const llvm::Module& module);

/// The object stored under `key`, its length and checksum verified; nullptr when there is none,
/// or when the entry is truncated or corrupt (then it is removed and counted as rejected).
std::unique_ptr<llvm::MemoryBuffer> load(const CodeCacheSettings& settings, const std::string& key);

/// Writes `object` under `key` (a temporary file renamed into place), then evicts the least
/// recently used entries beyond settings.max_bytes. Failures are silent: the cache is optional.
void store(const CodeCacheSettings& settings, const std::string& key, llvm::StringRef object);

}  // namespace qkv::codegen::disk_cache
