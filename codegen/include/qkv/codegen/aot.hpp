// qkv/codegen/aot.hpp — ahead-of-time compilation of a whole graph into one C function.
//
//   qkv::Bindings sizes = qkv::bind_extents(graph, feeds);         // every extent concrete
//   qkv::codegen::AotOptions opt{.function = "mha", .cpu = "x86-64-v3"};
//   auto files = qkv::codegen::emit_aot(graph, sizes, opt, qkv::codegen::AotFormat::shared, "mha.so");
//   // files: {"mha.so", "mha.h"}
//
// The graph goes through the CPU pass pipeline, then the lowered graph becomes ONE LLVM module
// (cpu/module/module_builder.cpp, the same code generator the in-process executor uses), with
// every size fixed unless AotOptions::dynamic names it: each node's kernel kind
// (lowering/select.hpp) is emitted as in docs/architecture.md — the flash-style attention kernel
// per (batch, head, query block) with its masks combined as lowering/attention_call.hpp says, the
// register-blocked GEMM (Bᵀ packed by generated loops on each call, or once by _prepare), the row-wise kernels, and
// loop nests with the reference interpreter's semantics for everything else; views cost nothing.
// Intermediates live in one 64-byte aligned arena (aligned_alloc) per call, in slots shared by
// values whose lives do not overlap (lowering/lifetimes.hpp); outputs are computed in place. The
// generated code needs only the C library (aligned_alloc, free, memcpy, memset, sysconf,
// pthread_create, pthread_join) at run time: no qkv, no LLVM, no C++ runtime.
//
// Threads: the attention tasks (batch, head, block of query rows; heaviest first when causal),
// the GEMM's (row block, column block) tasks and the row-wise kernels' ranges (cpu/schedule.hpp)
// are shared between the calling thread and threads − 1 pthreads created for each parallel loop
// (an atomic task counter), when a loop has more than one task and about a million flops of
// work; the generic loop nests run on the calling thread. The split of the work does not depend
// on the thread count, so results are bitwise identical for any count.
//
// The C interface (the header emit_aot writes beside an object or a shared library):
//
//   int <function>([int64_t <size>, …,] const float* <input>, …, const uint8_t* <bool input>, …,
//                  const int64_t* <i64 input (token ids)>, …, float* <output>, …);
//   int <function>_packed([const int64_t* sizes,] void* const* args);   // the same, as arrays
//   int <function>_set_threads(int n);          // n >= 1 threads; 0 (default): one per online CPU
//   void* <function>_prepare([int64_t <size>, …,] const float* <param>, …);  // weights bound once
//   int <function>_run(void* handle, [int64_t <size>, …,] <the other arrays>…);
//   void <function>_release(void* handle);      // (+ _prepare_packed / _run_packed, as arrays)
//
// Arguments are the dynamic sizes (only with AotOptions::dynamic, in symbol order), then the
// graph's inputs and parameters in graph order, then its outputs; every array is dense,
// row-major, in the axis order the header lists. Returns 0; 1 when the arena cannot be allocated;
// 2 when dynamic sizes are invalid (negative, or failing a shape check of the model); _run also
// 4 when the parameters' sizes differ from the handle's and 5 for a NULL handle; every entry
// point 6 (NULL from _prepare) on a CPU that lacks a feature the code was compiled for, checked
// before anything else runs (cpuid / AT_HWCAP, once):
//
//   const char* <function>_required_features(void);   // "avx,avx2,bmi,bmi2,f16c,fma,…"
//   const char* <function>_check_cpu(void);            // NULL, or "code for x86-64-v4 needs …; this CPU lacks avx512f,
//   …"
//
// A handle holds
// the parameters' pointers, every linear layer's weights packed into the GEMM's panels once and
// the arena, kept between runs (docs/aot.md). Bool tensors (keep-masks: 1 = may attend) are one
// byte per element; i32 / i64 inputs (token ids, positions) int32_t / int64_t, read as integers;
// an integer output (argmax) is written as floats holding the integers (exact below 2^24).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

enum class AotFormat {
  ll,        // LLVM IR text, after the -O3 pipeline
  assembly,  // target assembly (.s)
  object,    // relocatable object (.o), position-independent, plus a C header
  shared,    // shared library (.so), linked with ld.lld (or the system `cc`), plus a C header
};

struct AotOptions {
  /// The C name of the entry point (a C identifier).
  std::string function = "qkv_model";
  /// The architecture or triple the code is for: "" (this host's), "x86_64", "aarch64", or a
  /// full triple (e.g. "aarch64-unknown-linux-gnu").
  std::string target{};
  /// "native" (this host's CPU and features, exactly as it reports them), "x86-64", "x86-64-v2",
  /// "x86-64-v3", "x86-64-v4", or any CPU name LLVM knows for the architecture (e.g. "znver4",
  /// "skylake-avx512"; aarch64: "generic", "neoverse-n1", "neoverse-v1").
  std::string cpu = "native";
  /// Features added to or removed from the CPU's ("+avx512bf16,-avx512f": LLVM's -mattr
  /// syntax; removing one removes those built on it).
  std::string features{};
  /// Symbols (e.g. "Seq", "Key") left as run-time sizes: the entry point takes them as int64_t
  /// arguments, before the arrays. Empty (the default): every size fixed, fully specialised code.
  std::vector<std::string> dynamic{};
};

/// One argument of the generated function.
struct AotArgument {
  std::string name;    // the graph's name (input, parameter or output)
  std::string c_name;  // a C identifier made of it (unique within the function)
  DType dtype = DType::f32;
  std::vector<Axis> axes;  // names and extents (concrete unless dynamic), in memory order
  std::int64_t numel = 0;  // -1 when it depends on a run-time size
  bool output = false;
  bool param = false;           // a parameter (weights): bound once by <function>_prepare
  bool integer_values = false;  // an integer output (argmax): f32 values holding the integers
};

/// A size the generated function takes at run time (`--dynamic`): the graph's symbol.
struct AotSize {
  std::string symbol;  // e.g. "Seq"
  std::string c_name;  // its parameter's C name
};

/// The generated function's arguments, in order: the run-time sizes (none unless some are
/// dynamic), then the arrays; and how many bytes its arena takes (when every size is fixed).
struct AotSignature {
  std::vector<AotSize> sizes;
  std::vector<AotArgument> args;
  std::size_t arena_bytes = 0;
  bool checks_ids = false;  // the model embeds token ids: it returns 3 for an id outside its table
};

/// The signature emit_aot would produce. Throws ShapeError when an extent is not bound, and
/// std::invalid_argument when the graph cannot be compiled ahead of time (a dtype other than
/// f32 / integer / bool at the boundary, a function name that is not a C identifier).
AotSignature aot_signature(const Graph& g, const Bindings& sizes, const AotOptions& options = {});

/// The C header for the function (include guard, extern "C", one comment line per argument).
std::string aot_header(const Graph& g, const Bindings& sizes, const AotOptions& options = {});

/// Compiles `g` under `sizes` and writes `path`; for object and shared formats also the header,
/// at `path` with its extension replaced by ".h". Returns the paths written. Throws
/// std::invalid_argument for an unknown CPU name or a graph that cannot be compiled, and
/// std::runtime_error when writing or linking fails (the message names the file or the linker).
std::vector<std::string> emit_aot(const Graph& g, const Bindings& sizes, const AotOptions& options, AotFormat format,
                                  const std::string& path);

/// The same module compiled in-process for this host (for tests, and to check an AOT build
/// against the interpreter without a C compiler): call it with the packed arguments. It is a
/// cpu::CompiledGraph (compiled_graph.hpp) of the lowered graph with every size but
/// options.dynamic fixed, and its own thread setting.
class AotModel {
 public:
  static std::unique_ptr<AotModel> compile(const Graph& g, const Bindings& sizes, const AotOptions& options = {});
  ~AotModel();
  AotModel(const AotModel&) = delete;
  AotModel& operator=(const AotModel&) = delete;
  [[nodiscard]] const AotSignature& signature() const;
  /// Calls the function with args[i] pointing at argument i of signature() (no dynamic sizes).
  int run(void* const* args) const;
  /// The same with the run-time sizes (signature().sizes) first.
  int run(const std::int64_t* sizes, void* const* args) const;
  /// Calls <function>_set_threads(n): n >= 1 threads per call, 0 one per online CPU.
  void set_threads(int n) const;

 private:
  struct Impl;
  explicit AotModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qkv::codegen
