// AOT: the target machine for a CPU name, the pass pipeline, files (.ll, .s, .o, .so + C header)
// and the in-process twin used by tests. The IR itself comes from cpu/aot_module.cpp.
#include <qkv/codegen/aot.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Host.h>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/pipeline.hpp>

#include "cpu/module/module_builder.hpp"
#include "llvm/optimize.hpp"
#include "llvm/process.hpp"

namespace qkv::codegen {

namespace {

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("aot: " + what); }
[[noreturn]] void failed(const std::string& what) { throw ToolError("aot: " + what); }

bool is_c_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

void init_llvm() {
  static const bool done = [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
    llvm::InitializeAllAsmParsers();  // the CPU check's cpuid is inline assembly
    return true;
  }();
  (void)done;
}

/// The machine code is generated for, and what the kernel generators need to know of it.
struct EmitTarget {
  HostTarget target;
  std::unique_ptr<llvm::TargetMachine> tm;
};

/// The target of `options` (make_target: every feature explicit) and its LLVM machine.
EmitTarget machine_for(const AotOptions& options) {
  init_llvm();
  EmitTarget m;
  try {
    m.target = make_target(options.target, options.cpu, options.features);
  } catch (const std::invalid_argument& e) {
    invalid(e.what());
  }
  const std::string arch = target_arch(m.target.triple);
  if (arch != "x86_64" && arch != "aarch64")
    invalid("target " + m.target.triple + ": qkv emits CPU code for x86_64 and aarch64");
  std::string error;
  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(m.target.triple, error);
  if (!t) failed("no LLVM target for " + m.target.triple + ": " + error);
  m.tm.reset(t->createTargetMachine(m.target.triple, m.target.cpu, joined_features(m.target), llvm::TargetOptions(),
                                    llvm::Reloc::PIC_, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (!m.tm) failed("cannot create a target machine for " + m.target.triple + " (" + m.target.cpu + ")");
  return m;
}

struct Compiled {
  Graph lowered;
  cpu::ModulePlan plan;
  AotSignature signature;
};

/// The sizes the code is specialised on: every binding except the symbols named dynamic.
Bindings fixed_sizes(const Graph& lowered, const Bindings& sizes, const AotOptions& options) {
  Bindings fixed = sizes;
  const std::vector<std::string> kernel = cpu::specialised_sizes(lowered);
  for (const auto& d : options.dynamic) {
    bool found = false;
    for (const auto& n : lowered.nodes())
      for (const auto& a : n.axes) found = found || (a.extent.is_dynamic() && a.extent.symbol == d);
    if (!found) invalid("--dynamic " + d + ": the model has no dynamic size named " + d);
    if (std::find(kernel.begin(), kernel.end(), d) != kernel.end())
      invalid("--dynamic " + d + ": the attention kernel is specialised on " + d + "; it must be a fixed size");
    fixed.erase(d);
  }
  return fixed;
}

Compiled prepare(const Graph& g, const Bindings& sizes, const AotOptions& options, const HostTarget& target) {
  if (!is_c_identifier(options.function)) invalid("the function name '" + options.function + "' is not a C identifier");
  Compiled c;
  c.lowered = fuse_elementwise(lower(g));  // the module's graph, as compiled_for builds it
  c.plan = cpu::plan_module(c.lowered, fixed_sizes(c.lowered, sizes, options), target);
  for (const auto& s : c.plan.dynamic)
    if (std::find(options.dynamic.begin(), options.dynamic.end(), s) == options.dynamic.end())
      throw ShapeError("aot: `" + s + "` is not bound; give its size (or make it --dynamic)");
  c.signature = cpu::module_signature(c.lowered, options, c.plan);
  for (const auto& n : c.lowered.nodes()) c.signature.checks_ids = c.signature.checks_ids || n.op == Op::embedding;
  // Integer inputs (token ids, positions) are int32_t / int64_t arrays, read as such; an integer
  // output (argmax) is written as floats holding the integers (exact below 2^24), as the header says.
  auto check_dtype = [&](const std::string& name, const Node& n) {
    if (n.dtype == DType::f64)
      invalid("`" + name + "` is " + std::string(dtype_name(n.dtype)) +
              "; compiled functions take f32, f16, bf16, integer and bool tensors only");
  };
  for (const auto& n : c.lowered.nodes())
    if (n.op == Op::input || n.op == Op::param) check_dtype(n.name, n);
  for (const auto& o : c.lowered.outputs()) check_dtype(o.name, c.lowered.node(o.node));
  return c;
}

/// Writes through a temporary file renamed into place, so a failure leaves no partial output.
void write_file(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::remove(tmp.c_str());
      failed("cannot write " + path);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    failed("cannot write " + path + ": " + ec.message());
  }
}

std::string machine_code(llvm::Module& module, llvm::TargetMachine& tm, llvm::CodeGenFileType type) {
  llvm::SmallString<0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, type)) failed("the target cannot emit this file type");
  pm.run(module);
  return std::string(buffer.begin(), buffer.end());
}

/// What a linker says when it ran out of memory: ENOMEM, a thread that could not start (EAGAIN),
/// an allocation that failed.
constexpr std::array<const char*, 4> kOutOfMemory{"Cannot allocate memory", "Resource temporarily unavailable",
                                                  "out of memory", "bad_alloc"};

/// Links `object` into the shared library `path` (DT_SONAME `soname`) with the first linker that
/// can be started. The library's references to the C library stay undefined, to be bound by the
/// process that loads it (every C program has libc).
void link_shared(const std::string& object, const std::string& path, const std::string& soname) {
  // One object file needs no linker threads, and lld's pool (one per core, 8 MiB of stack each)
  // is what fails first under the caller's address-space limit, which the linker inherits.
  const std::vector<std::string> lld_args{"--threads=1", "-shared", "-soname", soname, "-o", path, object};
  auto lld = [&](const std::string& program) {
    std::vector<std::string> argv{program};
    argv.insert(argv.end(), lld_args.begin(), lld_args.end());
    return argv;
  };
  std::vector<std::vector<std::string>> candidates;
#ifdef QKV_LLD
  candidates.push_back(lld(QKV_LLD));
#endif
  candidates.push_back(lld("ld.lld-19"));
  candidates.push_back(lld("ld.lld"));
  candidates.push_back({"cc", "-shared", "-Wl,-soname," + soname, "-o", path, object});
  std::string tried;
  for (const auto& argv : candidates) {
    const process::Result r = process::run(argv, true);
    if (r.status == 0) return;
    const bool started = r.status > 0 || r.error.find("terminated by signal") != std::string::npos;
    if (!started) {
      tried += (tried.empty() ? "" : ", ") + argv[0];
      continue;
    }
    // One line: the linker's own lines joined; a linker that ran out of memory (an address-space
    // limit is inherited) says so in the words of every other out-of-memory error.
    std::string said = r.output.empty() ? r.error : r.output;
    while (!said.empty() && std::isspace(static_cast<unsigned char>(said.back()))) said.pop_back();
    std::replace(said.begin(), said.end(), '\n', ';');
    const bool oom = std::any_of(kOutOfMemory.begin(), kOutOfMemory.end(),
                                 [&](const char* sign) { return said.find(sign) != std::string::npos; });
    failed((oom ? "out of memory while linking " : "linking ") + path + " with " + argv[0] +
           (oom ? " (" + said + ")" : " failed: " + said));
  }
  failed("no linker found to make " + path + " (tried " + tried + "); install lld-19 or a C compiler");
}

std::string upper(const std::string& s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

/// The C type of an array argument stored as `t`: uint8_t for bool, uint16_t for the bits of f16
/// and bf16, int32_t / int64_t for integer inputs, float for everything else.
std::string c_pointer_type(DType t) {
  switch (t) {
    case DType::boolean:
      return "uint8_t* ";
    case DType::f16:
    case DType::bf16:
      return "uint16_t* ";
    case DType::i32:
      return "int32_t* ";
    case DType::i64:
      return "int64_t* ";
    case DType::i8:
      return "int8_t* ";
    case DType::f32:
    case DType::f64:
      return "float* ";
  }
  return "float* ";
}

std::string header_text(const AotSignature& sig, const AotOptions& options, const HostTarget& target,
                        const std::string& file) {
  std::string needs;
  for (const auto& f : required_features(target)) {
    const std::size_t line = needs.size() - (needs.rfind('\n') == std::string::npos ? 0 : needs.rfind('\n') + 1);
    needs += (needs.empty() ? "" : line > 80 ? ",\n *   " : ", ") + f;
  }
  const std::string& f = options.function;
  const std::string guard = upper(f) + "_H";
  const bool dynamic = !sig.sizes.empty();
  std::ostringstream h;
  h << "/* " << file << ": generated by the qkv AOT compiler (qkv emit); do not edit.\n"
    << " *\n"
    << " * " << f << "() computes the model for "
    << (dynamic ? "the sizes it is given (int64_t arguments, first) and the fixed sizes below"
                : "exactly the sizes below")
    << ",\n * with machine code for " << target_arch(target.triple) << ", CPU `" << target.cpu
    << "`. It needs only the C library (and its pthreads) at\n"
    << " * run time. Every array is dense and row-major, axes listed outermost first; bool tensors take\n"
    << " * one byte per element (keep-masks: 1 = may attend, 0 = masked out).\n";
  h << " *\n * CPU check: the code uses these instruction-set features, and every entry point first checks\n"
    << " * that the CPU running it has them ("
    << (target_arch(target.triple) == "x86_64" ? "cpuid and the OS's saved register state" : "getauxval(AT_HWCAP)")
    << "; once, cached):\n *   " << (needs.empty() ? "(none beyond the architecture's baseline)" : needs) << "\n"
    << " * On a CPU without one it returns " << cpu::kCpuLacksFeatures << " (" << f
    << "_prepare returns NULL) and executes nothing\n"
    << " * else; " << f << "_check_cpu() then gives the line that says which are missing.\n *\n";
  if (sig.checks_ids)
    h << " * Token ids: a return of 3 says an id was outside its embedding table (its row reads as row 0).\n";
  if (dynamic)
    h << " * Returns 0; 1 when its scratch arena (sized from the sizes, aligned_alloc'd per call) cannot be\n"
      << " * allocated; 2 when the sizes are invalid (negative, or failing one of the model's shape checks). */\n";
  else
    h << " * Returns 0, or 1 when its scratch arena (" << sig.arena_bytes
      << " bytes, aligned_alloc'd per call) cannot\n * be allocated. */\n";
  h << "#ifndef " << guard << "\n#define " << guard << "\n\n#include <stdint.h>\n\n"
    << "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n";
  h << "/* Arguments, in order:\n";
  for (const auto& s : sig.sizes) h << " *   " << s.c_name << ": the size " << s.symbol << " (int64_t)\n";
  for (const auto& a : sig.args) {
    std::string axes = "[";
    for (std::size_t k = 0; k < a.axes.size(); ++k)
      axes += (k ? ", " : "") + a.axes[k].name + "=" +
              (a.axes[k].extent.is_static() ? std::to_string(a.axes[k].extent.value) : a.axes[k].extent.str());
    axes += "]";
    h << " *   " << a.c_name << (a.c_name != a.name ? " (" + a.name + ")" : "") << ": "
      << (a.output ? "output " : "input ") << dtype_name(a.dtype) << " " << axes
      << (a.integer_values ? " (integer values as floats, exact below 2^24)" : "")
      << (a.dtype == DType::bf16  ? " (bfloat16 bits: the top half of the f32)"
          : a.dtype == DType::f16 ? " (IEEE 754 binary16 bits)"
                                  : "")
      << "\n";
  }
  if (dynamic)
    h << " * (a size written Name? is the run-time size Name; Name?/4, Name?*2, Name?+1 are derived from it)\n";
  std::vector<std::string> params;
  std::size_t width = f.size() + 6;
  for (const auto& s : sig.sizes) {
    params.push_back("int64_t " + s.c_name);
    width += params.back().size() + 2;
  }
  for (const auto& a : sig.args) {
    params.push_back(std::string(a.output ? "" : "const ") + c_pointer_type(a.dtype) + a.c_name);
    width += params.back().size() + 2;
  }
  h << " */\nint " << f << "(";
  for (std::size_t k = 0; k < params.size(); ++k)  // one per line when they do not fit on one
    h << (k == 0 ? "" : width > 100 ? ",\n    " : ", ") << (k == 0 && width > 100 ? "\n    " : "") << params[k];
  h << ");\n\n";
  if (dynamic)
    h << "/* The same, with sizes[i] the i-th size and args[i] pointing at array i. */\nint " << f
      << "_packed(const int64_t* sizes, void* const* args);\n\n";
  else
    h << "/* The same, with args[i] pointing at argument i. */\nint " << f << "_packed(void* const* args);\n\n";
  // The prepared pair: the parameters bound once, their linear layers' weights packed once.
  auto prototype = [&](const std::string& ret, const std::string& name, std::vector<std::string> ps) {
    std::size_t w = ret.size() + name.size() + 2;
    for (const auto& p : ps) w += p.size() + 2;
    h << ret << " " << name << "(" << (ps.empty() ? "void" : "");
    for (std::size_t k = 0; k < ps.size(); ++k)
      h << (k == 0 ? "" : w > 100 ? ",\n    " : ", ") << (k == 0 && w > 100 ? "\n    " : "") << ps[k];
    h << ");\n\n";
  };
  std::vector<std::string> prep_params, run_params{"void* handle"};
  for (const auto& s : sig.sizes) {
    prep_params.push_back("int64_t " + s.c_name);
    run_params.push_back("int64_t " + s.c_name);
  }
  for (std::size_t k = 0; k < sig.args.size(); ++k)
    (sig.args[k].param ? prep_params : run_params).push_back(params[sig.sizes.size() + k]);
  h << "/* Bound once: a handle holding the parameters (which must outlive it, unchanged), every linear\n"
    << " * layer's weights packed into the GEMM's panel layout, and a scratch arena kept between runs\n"
    << " * (grown when a run needs more). NULL when memory runs out. Sizes no parameter has are not read. */\n";
  prototype("void*", f + "_prepare", prep_params);
  h << "/* " << f << "() on a handle: the arrays that are not parameters, in the same order. Returns as " << f
    << "()\n * does; also 4 when the sizes of the parameters differ from the handle's, 5 for a NULL handle.\n"
    << " * One call at a time per handle. */\n";
  prototype("int", f + "_run", run_params);
  h << "/* The same with arrays: params[i] the i-th parameter; args[i] the i-th array that is not one. */\n";
  prototype("void*", f + "_prepare_packed",
            dynamic ? std::vector<std::string>{"const int64_t* sizes", "void* const* params"}
                    : std::vector<std::string>{"void* const* params"});
  prototype("int", f + "_run_packed",
            dynamic ? std::vector<std::string>{"void* handle", "const int64_t* sizes", "void* const* args"}
                    : std::vector<std::string>{"void* handle", "void* const* args"});
  h << "/* Frees a handle (NULL: nothing). */\nvoid " << f << "_release(void* handle);\n\n";
  h << "/* Threads for later calls: n >= 1, or 0 (the default) for one per online CPU. Returns 0, or 1\n"
    << " * for n < 0. Not to be called while " << f << " runs. */\nint " << f << "_set_threads(int n);\n\n";
  h << "/* Your thread pool for later calls (NULL, the default: threads are created per parallel region\n"
    << " * and joined at its end). hook(body, ctx, n, threads) runs body(ctx, i) for every i in [0, n) on up\n"
    << " * to `threads` threads and returns 0, or returns non-zero having run none (the call then uses\n"
    << " * its own threads). Not to be called while " << f << " runs. */\nvoid " << f
    << "_set_parallel(int (*hook)(void (*body)(void*, int64_t), void* ctx, int64_t n, int threads));\n\n";
  h << "/* The features of the CPU check above, comma-separated (\"\" when none). */\nconst char* " << f
    << "_required_features(void);\n\n";
  h << "/* NULL when this CPU has every required feature; otherwise a line naming the missing ones:\n"
    << " * \"code for " << target.cpu << " needs …; this CPU lacks …\" (static storage). */\nconst char* " << f
    << "_check_cpu(void);\n\n";
  h << "/* What every entry point returns on a CPU without a required feature. */\n#define " << upper(f)
    << "_ERROR_CPU " << cpu::kCpuLacksFeatures << "\n";
  h << "#define " << upper(f) << "_NUM_SIZES " << sig.sizes.size() << "\n";
  h << "#define " << upper(f) << "_NUM_ARGS " << sig.args.size() << "\n";
  for (const auto& a : sig.args)
    if (a.numel >= 0) h << "#define " << upper(f) << "_" << upper(a.c_name) << "_NUMEL " << a.numel << "\n";
  h << "\n#ifdef __cplusplus\n}\n#endif\n\n#endif /* " << guard << " */\n";
  return h.str();
}

}  // namespace

AotSignature aot_signature(const Graph& g, const Bindings& sizes, const AotOptions& options) {
  return prepare(g, sizes, options, host_target()).signature;
}

std::string aot_header(const Graph& g, const Bindings& sizes, const AotOptions& options) {
  const EmitTarget m = machine_for(options);
  return header_text(prepare(g, sizes, options, m.target).signature, options, m.target, options.function + ".h");
}

std::vector<std::string> emit_aot(const Graph& g, const Bindings& sizes, const AotOptions& options, AotFormat format,
                                  const std::string& path) {
  EmitTarget m = machine_for(options);
  const Compiled c = prepare(g, sizes, options, m.target);
  llvm::LLVMContext context;
  auto module = cpu::build_graph_module(context, c.lowered, c.signature, c.plan, m.target, options.function, true);
  std::string error;
  if (!optimize_module(*module, *m.tm, "aot", &error)) failed(error);

  std::vector<std::string> written{path};
  switch (format) {
    case AotFormat::ll: {
      std::string text;
      llvm::raw_string_ostream os(text);
      module->print(os, nullptr);
      os.flush();
      write_file(path, text);
      return written;
    }
    case AotFormat::assembly:
      write_file(path, machine_code(*module, *m.tm, llvm::CodeGenFileType::AssemblyFile));
      return written;
    case AotFormat::object:
      write_file(path, machine_code(*module, *m.tm, llvm::CodeGenFileType::ObjectFile));
      break;
    case AotFormat::shared: {
      const std::string object = path + ".o.tmp";
      write_file(object, machine_code(*module, *m.tm, llvm::CodeGenFileType::ObjectFile));
      const std::string tmp = path + ".tmp";
      try {
        link_shared(object, tmp, std::filesystem::path(path).filename().string());
      } catch (...) {
        std::remove(object.c_str());
        std::remove(tmp.c_str());
        throw;
      }
      std::remove(object.c_str());
      std::error_code ec;
      std::filesystem::rename(tmp, path, ec);
      if (ec) failed("cannot write " + path + ": " + ec.message());
      break;
    }
  }
  const std::string header = std::filesystem::path(path).replace_extension(".h").string();
  write_file(header, header_text(c.signature, options, m.target, std::filesystem::path(header).filename().string()));
  written.push_back(header);
  return written;
}

struct AotModel::Impl {
  std::shared_ptr<const cpu::CompiledGraph> compiled;
  std::atomic<int> threads{0};
};

AotModel::AotModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AotModel::~AotModel() = default;

std::unique_ptr<AotModel> AotModel::compile(const Graph& g, const Bindings& sizes, const AotOptions& options) {
  auto impl = std::make_unique<Impl>();
  const Compiled c = prepare(g, sizes, options, host_target());
  impl->compiled = cpu::CompiledGraph::compile(c.lowered, c.plan.fixed, options.function);
  return std::unique_ptr<AotModel>(new AotModel(std::move(impl)));
}

const AotSignature& AotModel::signature() const { return impl_->compiled->signature(); }

int AotModel::run(void* const* args) const { return impl_->compiled->run(nullptr, args, impl_->threads.load()); }

int AotModel::run(const std::int64_t* sizes, void* const* args) const {
  return impl_->compiled->run(sizes, args, impl_->threads.load());
}

void AotModel::set_threads(int n) const {
  if (n < 0) throw std::invalid_argument("aot: the thread count must be >= 0");
  impl_->threads = n;
}

}  // namespace qkv::codegen
