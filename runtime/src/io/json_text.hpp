// json_text.hpp — the two habits every JSON reader of qkv's runtime shares (hf_checkpoint.cpp,
// safetensors.cpp): a nesting depth checked on the text before nlohmann parses it, and values
// named in messages by a bounded excerpt (a container is never dumped: dump() recurses).
#pragma once

#include <nlohmann/json.hpp>

#include <qkv/runtime/io/quote.hpp>

#include <cstddef>
#include <optional>
#include <string>
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

/// A value for a message: a number, boolean or null as JSON writes it, a string quoted and
/// bounded, a container by its kind and size.
inline std::string excerpt(const nlohmann::json& v) {
  if (v.is_string()) return quote_text(v.get_ref<const std::string&>());
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " element(s)";
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " key(s)";
  return v.dump();  // a number, boolean or null: at most a few dozen characters
}

}  // namespace qkv::json_text
