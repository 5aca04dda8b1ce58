// json_text.hpp — the two habits every JSON reader of qkv's runtime shares (hf_checkpoint.cpp,
// safetensors.cpp): a nesting depth checked on the text before nlohmann parses it (json_depth.hpp,
// public: the CLI's readers check it too), and values
// named in messages by a bounded excerpt (a container is never dumped: dump() recurses).
#pragma once

#include <nlohmann/json.hpp>

#include <qkv/runtime/io/json_depth.hpp>
#include <qkv/runtime/io/quote.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace qkv::json_text {

/// A value for a message: a number, boolean or null as JSON writes it, a string quoted and
/// bounded, a container by its kind and size.
inline std::string excerpt(const nlohmann::json& v) {
  if (v.is_string()) return quote_text(v.get_ref<const std::string&>());
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " element(s)";
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " key(s)";
  return v.dump();  // a number, boolean or null: at most a few dozen characters
}

}  // namespace qkv::json_text
