// qkv/codegen/aot_main.hpp — the main() of a model generator: a program that builds a user's
// qkv::Graph and compiles it ahead of time (emit_aot) as the build runs, the way Halide's
// generators work. CMake's qkv_add_library (docs/aot.md, lesson 13) builds the program from the
// user's sources and runs it; the user writes only the function that builds the graph:
//
//   #include <qkv/codegen/aot_main.hpp>
//   #include <qkv/qkv.hpp>
//   qkv::Graph tiny_lm() { qkv::Graph g; …; qkv::output(logits, "logits"); return g; }
//   QKV_AOT_MAIN(tiny_lm)
//
// The program's command line (what qkv_add_library passes):
//
//   <generator> -o OUT.so|OUT.o|OUT.ll|OUT.s --function NAME [--header OUT.h] [--cpu CPU]
//               [--features +f,-g] [--target ARCH] [--dynamic A,B] [--sizes A=N,B=M]
//
// -o's extension picks the format (.so: shared library, .o: object file, .ll / .s: IR or
// assembly); the header goes to --header, or beside -o with its extension replaced by .h. Every
// size of the graph that is not --dynamic must be given by --sizes. An error is one line on
// stderr and exit status 2 (usage) or 1 (the graph cannot be compiled or a file not written).
#pragma once

#include <functional>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

/// Parses the generator's command line (above), calls `build` once and compiles its graph.
/// Returns the exit status.
int aot_main(int argc, const char* const* argv, const std::function<Graph()>& build);

}  // namespace qkv::codegen

/// Defines main() for a generator whose graph `build()` returns (a function or a callable object).
#define QKV_AOT_MAIN(build)                                                            \
  int main(int argc, char** argv) {                                                    \
    return ::qkv::codegen::aot_main(argc, argv, [] { return ::qkv::Graph(build()); }); \
  }
