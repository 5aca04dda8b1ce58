// qkv/ir/error.hpp — the one home of qkv's error kinds (plain C++, every layer includes it).
//
// Two audiences, as Halide's user_assert / internal_assert split them:
//   - the user's mistakes, said in their terms (a tensor, an axis, a size, a flag) and fixable by
//     them: ShapeError (a shape check that failed once sizes were known), std::invalid_argument
//     (a value qkv cannot take: a CPU name, a thread count, a function name), qkv::IoError (files);
//     InputError (an input's value the graph cannot take: an embedding id outside the table);
//   - qkv's own bugs: InternalError, always "qkv internal error: …", never the user's fault.
// Failures of LLVM or of an external program (the linker, ptxas) are ToolError: LLVM's message
// comes back as text (codegen never lets LLVM abort the process), prefixed by what qkv was doing.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace qkv {

/// A shape check that failed once the dynamic extents were bound to concrete sizes. It carries
/// the same message the compile-time check would have printed, with the bound sizes filled in.
class ShapeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A value of an input that the graph cannot take, found while it runs (an embedding id outside
/// the table); the message names the input and the value.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// InputError's message for an embedding id outside its table (every backend says it alike).
inline std::string embedding_id_message(const std::string& table, double id, std::int64_t at, const std::string& ids,
                                        std::int64_t rows) {
  const std::string value = id == id ? std::to_string(static_cast<long long>(id)) : std::string("NaN");
  return "embedding" + (table.empty() ? std::string() : " " + table) + ": id " + value + " (at flat index " +
         std::to_string(at) + " of " + ids + ") is outside the table's " + std::to_string(rows) + " rows";
}

/// A rule the DSL enforces was broken by a graph, or codegen met a state it cannot be in.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error("qkv internal error: " + what) {}
};

/// LLVM or an external program (linker, ptxas) failed; the message names the step and the tool.
class ToolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void internal_error(const std::string& what) { throw InternalError(what); }

}  // namespace qkv
