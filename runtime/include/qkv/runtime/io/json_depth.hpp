// qkv/runtime/io/json_depth.hpp — the nesting depth of a JSON text, checked before a recursive
// parser (nlohmann's) sees it: a file of a million '[' would otherwise overflow the stack.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace qkv::json_text {

/// The JSON files qkv reads nest 3 or 4 levels; 64 leaves room and bounds every recursion.
inline constexpr std::size_t kMaxDepth = 64;

/// The byte offset where `text` first opens its (max + 1)-th nested array or object, if it
/// does; strings (with their escapes) are skipped. Linear, no recursion.
inline std::optional<std::size_t> too_deep(std::string_view text, std::size_t max = kMaxDepth) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

}  // namespace qkv::json_text
