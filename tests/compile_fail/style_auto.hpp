// The compile-fail harness's second style (cmake/QkvCompileFail.cmake, STYLE=auto). The harness
// rewrites the bad statement of every negative test — the line after `// expected-error:`,
// `<type> <name> = <expr>;` — into
//
//     <type> <name> = [&] { return <expr>; }(); qkv_cf_style::use(<name>);
//
// so that the result of the mistake is computed inside a lambda, captured, and flows on into
// output() (through pairs and arrays, as the blocks return them). qkv's message must still be
// the first error, and the rewritten program may print no more errors than the original.
#pragma once

#include <qkv/qkv.hpp>

namespace qkv_cf_style {

// Deduced return types: each use is instantiated where it is called, so a follow-on error
// would be printed in source order (g++ defers functions with declared return types).
template <class T>
auto use_one(const T& x) {
  if constexpr (qkv::TensorType<T> || qkv::is_poison<T>) {
    qkv::output(x, "style_auto");
  } else if constexpr (requires { x.first, x.second; }) {
    use_one(x.first);
    use_one(x.second);
  } else if constexpr (requires { x.size(), x[0]; }) {
    for (const auto& e : x) use_one(e);
  }
  return 0;  // anything else (an id, a count) has no tensor in it
}

template <class... T>
auto use(const T&... x) {
  return (0 + ... + use_one(x));
}

}  // namespace qkv_cf_style
