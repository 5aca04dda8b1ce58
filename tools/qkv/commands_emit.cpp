// qkv emit: a model given by shape, compiled ahead of time for the CPU (qkv/codegen/aot.hpp) or
// the GPU kernels it launches emitted as PTX (qkv/codegen/nvptx.hpp, planned by cuda/executor.hpp).
// Every file it writes is an output of one OutputGroup: emit_aot writes into the group's staging
// directory, and nothing reaches the user's paths unless everything was written.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <map>
#include <string_view>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/nvptx.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>

#include "commands.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"

namespace qkv::cli {

namespace {

namespace fs = std::filesystem;

codegen::AotFormat cpu_format(const std::string& f) {
  if (f == "ll") return codegen::AotFormat::ll;
  if (f == "asm") return codegen::AotFormat::assembly;
  if (f == "obj") return codegen::AotFormat::object;
  if (f == "so") return codegen::AotFormat::shared;
  throw UsageError("--format " + f + " is not a CPU format (ll, asm, obj, so)");
}

// --- --function: the C name of the generated function ------------------------------------------

// clang-format off
/// C (C23) and C++ keywords: the header is meant for both.
constexpr std::string_view kKeywords[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
    "char", "char8_t", "char16_t", "char32_t", "class", "co_await", "co_return", "co_yield", "compl", "concept",
    "const", "const_cast", "consteval", "constexpr", "constinit", "continue", "decltype", "default", "delete", "do",
    "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend",
    "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr",
    "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast", "requires",
    "restrict", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch",
    "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "typeof",
    "typeof_unqual", "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor",
    "xor_eq"};
// clang-format on

/// The C libraries every program that loads the library has: a symbol of theirs with the same
/// name would be displaced by (or displace) the generated one.
bool in_c_library(const std::string& symbol) {
  static const std::array<void*, 3> libs = {dlopen("libc.so.6", RTLD_LAZY), dlopen("libm.so.6", RTLD_LAZY),
                                            dlopen("libpthread.so.0", RTLD_LAZY)};
  for (void* lib : libs)
    if (lib && dlsym(lib, symbol.c_str())) return true;
  return false;
}

/// The header declares <f>, <f>_packed and <f>_set_threads and defines macros <F>_…: each must be
/// an identifier a C or C++ program can use without a clash (UsageError saying which rule fails).
void check_function_name(const std::string& f, bool user_given) {
  auto refuse = [&](const std::string& why) { throw UsageError("--function '" + f + "' " + why); };
  const bool identifier =
      !f.empty() && !std::isdigit(static_cast<unsigned char>(f[0])) &&
      std::all_of(f.begin(), f.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!identifier) refuse("is not a C identifier (letters, digits and '_', not starting with a digit)");
  if (std::find(std::begin(kKeywords), std::end(kKeywords), f) != std::end(kKeywords)) refuse("is a C or C++ keyword");
  if (f[0] == '_' && (f.size() == 1 || f[1] == '_' || std::isupper(static_cast<unsigned char>(f[1]))))
    refuse("is reserved to the C implementation (it starts with '__' or '_' and a capital)");
  // <stdint.h>, which the header includes, owns int*_t / uint*_t and INT*_ / UINT* macros.
  const bool ends_t = f.size() > 2 && f.compare(f.size() - 2, 2, "_t") == 0;
  if ((f.rfind("int", 0) == 0 || f.rfind("uint", 0) == 0) && ends_t) refuse("is a name <stdint.h> reserves");
  if (f.rfind("INT", 0) == 0 || f.rfind("UINT", 0) == 0 || f.rfind("SIZE_", 0) == 0 || f.rfind("PTRDIFF_", 0) == 0 ||
      f.rfind("WCHAR_", 0) == 0 || f.rfind("WINT_", 0) == 0 || f.rfind("SIG_ATOMIC_", 0) == 0)
    refuse("clashes with <stdint.h>'s macros");
  if (user_given && f.rfind("qkv_", 0) == 0)
    refuse("starts with 'qkv_', which the generated code's own symbols use; choose another prefix");
  for (const std::string& symbol : {f, f + "_packed", f + "_set_threads"})
    if (in_c_library(symbol))
      refuse(symbol == f ? "is a C library function or variable; the library would displace it"
                         : "makes '" + symbol + "', a C library symbol");
  if (f == "main") refuse("is the entry point of every C program that would call it");
  static const char* kMacros[] = {"errno", "assert", "stdin", "stdout", "stderr", "offsetof", "NULL"};
  if (std::find(std::begin(kMacros), std::end(kMacros), f) != std::end(kMacros)) refuse("is a C library macro");
}

// --- outputs ------------------------------------------------------------------------------------

/// The seeded inputs and the reference outputs, one .npy per argument of the generated function.
struct Example {
  std::vector<std::pair<std::string, std::size_t>> files;  // argument, output index
  std::size_t manifest = 0;                                // arguments.txt
};

/// Declares the example's files and checks there is memory for the reference run.
Example declare_example(OutputGroup& outputs, const Instance& in, const codegen::AotSignature& sig,
                        const std::string& dir) {
  outputs.add_directory(dir, "--example-dir");
  Example ex;
  for (const auto& a : sig.args)
    ex.files.emplace_back(a.name, outputs.add_file(fs::path(dir) / (a.c_name + ".npy"), "--example-dir"));
  ex.manifest = outputs.add_file(fs::path(dir) / "arguments.txt", "--example-dir");
  require_memory(feed_bytes(in.graph, in.sizes) + run_bytes(in.graph, in.sizes, Backend::reference),
                 "--example-dir (the reference run)");
  return ex;
}

void write_text(OutputGroup& outputs, std::size_t i, const std::string& text) {
  outputs.write(i, {std::as_bytes(std::span(text.data(), text.size()))});
}

/// arguments.txt: the function's arguments in order, one line each — "<c_name> input|output
/// <dtype>", after the run-time sizes as "<c_name> size" — for a program that calls any model
/// through <f>_packed (tests/e2e/aot/aot_check.c).
std::string manifest(const codegen::AotSignature& sig) {
  std::string text = "# the arguments of the generated function, in order: name, role, dtype (qkv emit)\n";
  for (const auto& s : sig.sizes) text += s.c_name + " size\n";
  for (const auto& a : sig.args)
    text += a.c_name + (a.output ? " output " : " input ") + std::string(dtype_name(a.dtype)) + "\n";
  return text;
}

void stage_example(OutputGroup& outputs, const Example& ex, const Instance& in, const ShapeModel& model,
                   const codegen::AotSignature& sig) {
  const Feeds feeds = seeded_feeds(in, model);
  const RunResult want = [&] {
    const Activity running("running the reference interpreter for --example-dir");
    return interpret(in.graph, feeds);
  }();
  for (std::size_t k = 0; k < ex.files.size(); ++k) {
    const auto& a = sig.args[k];
    const NdArray& v = a.output ? want.outputs.at(a.name) : feeds.at(a.name);
    // As the function takes it: bool as bytes, everything else in its storage dtype.
    stage_npy(outputs, ex.files[k].second, a.dtype == DType::boolean ? v : v.converted(a.dtype));
  }
  write_text(outputs, ex.manifest, manifest(sig));
}

std::string dims(const codegen::nvptx::Dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

/// --target nvptx: the kernels the GPU backend launches for the model (its plan), as PTX. With
/// one kernel, -o is its file; with several, -o is a directory (an existing one, or made) holding
/// one .ptx per kernel and launches.txt (per node: kernel, grid, block, dynamic shared memory).
int emit_ptx(const Emit& e, const Instance& in) {
  const std::string format = e.format.empty() ? "ptx" : e.format;
  if (format != "ptx") throw UsageError("--target nvptx writes --format ptx, not " + format);
  if (e.sm != 80 && e.sm != 86 && e.sm != 87 && e.sm != 89 && e.sm != 90)
    throw UsageError("--sm must be 80, 86, 87, 89 or 90, not " + std::to_string(e.sm));
  const Activity planning("planning the GPU kernels");
  const Graph lowered = codegen::lower(in.graph);
  const codegen::cuda::Plan plan = codegen::cuda::plan(lowered, in.sizes);
  std::map<std::string, codegen::nvptx::KernelRequest> requests;  // by kernel name, each once
  for (const auto& step : plan.steps)
    for (const auto& l : step.launches) requests.emplace(codegen::nvptx::kernel_name(l.request), l.request);
  if (requests.empty()) throw std::runtime_error("emit: the model launches no GPU kernel");

  OutputGroup outputs;
  std::map<std::string, std::size_t> files;
  std::size_t launches_file = 0;
  if (requests.size() == 1) {
    files[requests.begin()->first] = outputs.add_file(e.out, "-o");
  } else {
    std::error_code ec;
    if (fs::path(e.out).extension() == ".ptx" || (fs::exists(e.out, ec) && !fs::is_directory(e.out, ec)))
      throw UsageError("-o " + e.out + ": the model launches " + std::to_string(requests.size()) +
                       " kernels, so -o must name a directory (it gets one .ptx per kernel and launches.txt)");
    outputs.add_directory(e.out, "-o");
    for (const auto& [name, request] : requests)
      files[name] = outputs.add_file(fs::path(e.out) / (name + ".ptx"), "-o");
    launches_file = outputs.add_file(fs::path(e.out) / "launches.txt", "-o");
  }

  const Activity emitting("emitting PTX");
  std::map<std::string, codegen::nvptx::PtxKernel> kernels;
  for (const auto& [name, request] : requests) kernels.emplace(name, codegen::nvptx::emit_ptx(request, e.sm));
  std::string launches;
  for (std::size_t id = 0; id < plan.steps.size(); ++id) {
    const auto& step = plan.steps[id];
    const Node& n = lowered.node(static_cast<int>(id));
    if (step.kind == codegen::cuda::Step::Kind::host)
      launches += "%" + std::to_string(id) + " " + std::string(op_name(n.op)) + ": on the host (" + step.why + ")\n";
    for (const auto& l : step.launches) {
      const std::string name = codegen::nvptx::kernel_name(l.request);
      const auto& k = kernels.at(name);
      launches += "%" + std::to_string(id) + " " + std::string(op_name(n.op)) + ": " + name + " grid " + dims(l.grid) +
                  " block (" + std::to_string(k.block_x) + ", " + std::to_string(k.block_y) + ", " +
                  std::to_string(k.block_z) + ") shared " + std::to_string(k.shared_bytes) + " B\n";
    }
  }
  for (const auto& [name, k] : kernels) write_text(outputs, files.at(name), k.ptx);
  if (kernels.size() > 1) write_text(outputs, launches_file, launches);
  outputs.commit();
  if (kernels.size() == 1) {
    const auto& k = kernels.begin()->second;
    std::cout << "wrote " << e.out << ": .entry " << k.name << " (" << k.signature << ")\n  grid " << k.grid_rule
              << ", block (" << k.block_x << ", " << k.block_y << ", " << k.block_z << "), dynamic shared "
              << k.shared_bytes << " B, sm_" << k.sm << "\n";
  } else {
    std::cout << "wrote " << kernels.size() << " kernels (sm_" << e.sm << ") and launches.txt to " << e.out << "/\n";
  }
  return 0;
}

}  // namespace

int emit(const Emit& e) {
  if (e.out.empty()) throw UsageError("give the output file with -o / --out");
  if (e.target != "cpu" && e.target != "x86_64" && e.target != "aarch64" && e.target != "nvptx")
    throw UsageError("--target must be cpu, x86_64, aarch64 or nvptx, not " + e.target);
  if (e.target == "nvptx" && !e.example_dir.empty()) throw UsageError("--example-dir goes with a CPU target");
  if (e.target == "nvptx" && !e.dynamic.empty()) throw UsageError("--dynamic goes with a CPU target");
  if (e.target == "nvptx" && (!e.cpu.empty() || !e.features.empty()))
    throw UsageError("--cpu and --features go with a CPU target; nvptx takes --sm");
  const Instance in = instantiate(e.model);
  if (e.target == "nvptx") return emit_ptx(e, in);

  codegen::AotOptions options;
  options.target = e.target == "cpu" ? "" : e.target;
  const bool foreign = !options.target.empty() && options.target != codegen::target_arch(codegen::host_target().triple);
  options.cpu = !e.cpu.empty() ? e.cpu : foreign ? "generic" : "native";
  options.features = e.features;
  options.function = e.function;
  options.dynamic = e.dynamic;
  if (options.function.empty()) {  // qkv_sdpa, qkv_mha, qkv_encoder_layer
    options.function = "qkv_" + e.model.kind;
    std::replace(options.function.begin(), options.function.end(), '-', '_');
  }
  check_function_name(options.function, !e.function.empty());
  const codegen::AotFormat format = cpu_format(e.format.empty() ? "so" : e.format);
  const bool header = format == codegen::AotFormat::object || format == codegen::AotFormat::shared;

  OutputGroup outputs;
  const std::size_t code_file = outputs.add_file(e.out, "-o");
  const std::size_t header_file =
      header ? outputs.add_file(fs::path(e.out).replace_extension(".h"), "the C header beside -o") : 0;
  const codegen::AotSignature sig = [&] {
    try {
      return codegen::aot_signature(in.graph, in.sizes, options);
    } catch (const std::invalid_argument& x) {
      throw UsageError(x.what());
    }
  }();
  const Example example = e.example_dir.empty() ? Example{} : declare_example(outputs, in, sig, e.example_dir);

  // emit_aot writes the file (and the header beside it, with its extension replaced) itself: it
  // gets the staging path, which has the destination's file name.
  const fs::path staged = outputs.staging_path(code_file);
  if (header && outputs.staging_path(header_file) != fs::path(staged).replace_extension(".h"))
    throw std::logic_error("qkv internal error: the header is not staged beside the library");
  try {
    const Activity compiling("compiling the model");
    codegen::emit_aot(in.graph, in.sizes, options, format, staged.string());
  } catch (const std::invalid_argument& x) {
    throw UsageError(outputs.in_user_terms(x.what()));  // an unknown --cpu
  } catch (const std::exception& x) {
    if (describe_out_of_memory(x)) throw;
    throw std::runtime_error(outputs.in_user_terms(x.what()));
  }
  if (!e.example_dir.empty()) stage_example(outputs, example, in, e.model, sig);
  outputs.commit();
  std::cout << "wrote " << e.out << "\n";
  if (header) std::cout << "wrote " << outputs.path(header_file).string() << "\n";
  if (!e.example_dir.empty()) std::cout << "wrote inputs and reference outputs to " << e.example_dir << "/\n";
  return 0;
}

}  // namespace qkv::cli
