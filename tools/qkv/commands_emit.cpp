// qkv emit: a model given by shape, compiled ahead of time for the CPU (qkv/codegen/aot.hpp) or
// the GPU kernels it launches emitted as PTX (qkv/codegen/nvptx.hpp, planned by cuda/executor.hpp).
// Every file it writes is an output of one OutputGroup: emit_aot writes into the group's staging
// directory, and nothing reaches the user's paths unless everything was written.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string_view>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/nvptx.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/runtime/hf_checkpoint.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/quantize.hpp>

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
void check_function_name(const std::string& f, bool user_given, const std::vector<std::string>& suffixes = {}) {
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
  std::vector<std::string> symbols{f, f + "_packed", f + "_set_threads"};
  for (const auto& suffix : suffixes) symbols.push_back(f + suffix);
  for (const std::string& symbol : symbols)
    if (in_c_library(symbol))
      refuse(symbol == f ? "is a C library function or variable; the library would displace it"
                         : "makes '" + symbol + "', a C library symbol");
  if (f == "main") refuse("is the entry point of every C program that would call it");
  static const char* kMacros[] = {"errno", "assert", "stdin", "stdout", "stderr", "offsetof", "NULL"};
  if (std::find(std::begin(kMacros), std::end(kMacros), f) != std::end(kMacros)) refuse("is a C library macro");
}

// --- the CPU compile both commands share --------------------------------------------------------

/// The AotOptions of the CPU flags (--target, --cpu, --features, --function): --cpu defaults to
/// native on this host's architecture and generic on another; the function name is checked.
codegen::AotOptions cpu_options(const std::string& target, const std::string& cpu, const std::string& features,
                                const std::string& function, const std::string& default_function,
                                const std::vector<std::string>& suffixes = {}) {
  codegen::AotOptions options;
  options.target = target == "cpu" ? "" : target;
  const bool foreign = !options.target.empty() && options.target != codegen::target_arch(codegen::host_target().triple);
  options.cpu = !cpu.empty() ? cpu : foreign ? "generic" : "native";
  options.features = features;
  options.function = function.empty() ? default_function : function;
  check_function_name(options.function, !function.empty(), suffixes);
  return options;
}

/// The outputs of one compile: the code and, for obj and so, the C header beside it.
struct AotFiles {
  codegen::AotFormat format = codegen::AotFormat::shared;
  std::size_t code = 0, header = 0;
  bool has_header = false;
};

AotFiles declare_aot_files(OutputGroup& outputs, const std::string& out, codegen::AotFormat format,
                           const std::string& label) {
  AotFiles f;
  f.format = format;
  f.has_header = format == codegen::AotFormat::object || format == codegen::AotFormat::shared;
  f.code = outputs.add_file(out, label);
  if (f.has_header) f.header = outputs.add_file(fs::path(out).replace_extension(".h"), "the C header beside " + label);
  return f;
}

/// aot_signature, with a graph the AOT compiler refuses as a UsageError.
codegen::AotSignature checked_signature(const Graph& g, const Bindings& sizes, const codegen::AotOptions& options) {
  try {
    return codegen::aot_signature(g, sizes, options);
  } catch (const std::invalid_argument& x) {
    throw UsageError(x.what());
  }
}

/// Compiles `g` under `sizes` into the staged files (nothing reaches the user's paths before
/// outputs.commit()); errors name the user's files.
void stage_aot(OutputGroup& outputs, const AotFiles& files, const Graph& g, const Bindings& sizes,
               const codegen::AotOptions& options, const char* activity) {
  // emit_aot writes the file (and the header beside it, with its extension replaced) itself: it
  // gets the staging path, which has the destination's file name.
  const fs::path staged = outputs.staging_path(files.code);
  if (files.has_header && outputs.staging_path(files.header) != fs::path(staged).replace_extension(".h"))
    throw std::logic_error("qkv internal error: the header is not staged beside the library");
  try {
    const Activity compiling(activity);
    codegen::emit_aot(g, sizes, options, files.format, staged.string());
  } catch (const std::invalid_argument& x) {
    throw UsageError(outputs.in_user_terms(x.what()));  // an unknown --cpu
  } catch (const std::exception& x) {
    if (describe_out_of_memory(x)) throw;
    throw std::runtime_error(outputs.in_user_terms(x.what()));
  }
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

/// `in`: the model as built, before --quantize (`quant`): its seeded float weights are quantized
/// as the CLI's loaders do, into the q and scales the quantized function takes.
void stage_example(OutputGroup& outputs, const Example& ex, const Instance& in, const ShapeModel& model,
                   const codegen::AotSignature& sig, std::optional<Quant> quant) {
  Feeds feeds = seeded_feeds(in, model);
  const Graph g = quant ? quantize_linear_weights(in.graph, feeds, *quant).graph : in.graph;
  const RunResult want = [&] {
    const Activity running("running the reference interpreter for --example-dir");
    return interpret(g, feeds);
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
  const Instance built = instantiate(e.model);
  Instance in = built;
  if (e.quant) {  // the linear layers' weights taken as q and scales (the caller quantizes them)
    if (e.target == "nvptx") throw UsageError("--quantize goes with a CPU target (the GPU backend reads f32 weights)");
    QuantizedModel m = quantize_linear_graph(built.graph, built.sizes, *e.quant);
    if (m.weights.empty())
      throw UsageError(
          "--quantize: the model has no linear layer weight that qkv quantizes (only linear layers' "
          "[out, in] weights are)");
    in.graph = std::move(m.graph);
    std::fprintf(stderr,
                 "qkv: note: %zu linear weights taken as %s: the function takes `name.%s` (int8) and "
                 "`name.%s_scale` (f16 bits) for each (%.1f KB in f32 -> %.1f KB; docs/aot.md, \"Quantized "
                 "weights\")\n",
                 m.weights.size(), quant_summary(m.formats).c_str(), std::string(quant_name(*e.quant)).c_str(),
                 std::string(quant_name(*e.quant)).c_str(), static_cast<double>(m.bytes_before) / 1e3,
                 static_cast<double>(m.bytes_after) / 1e3);
  }
  if (e.target == "nvptx") return emit_ptx(e, in);

  std::string default_function = "qkv_" + e.model.kind;  // qkv_sdpa, qkv_mha, qkv_encoder_layer
  std::replace(default_function.begin(), default_function.end(), '-', '_');
  codegen::AotOptions options = cpu_options(e.target, e.cpu, e.features, e.function, default_function);
  options.dynamic = e.dynamic;
  const codegen::AotFormat format = cpu_format(e.format.empty() ? "so" : e.format);

  OutputGroup outputs;
  const AotFiles files = declare_aot_files(outputs, e.out, format, "-o");
  const codegen::AotSignature sig = checked_signature(in.graph, in.sizes, options);
  const Example example = e.example_dir.empty() ? Example{} : declare_example(outputs, in, sig, e.example_dir);
  stage_aot(outputs, files, in.graph, in.sizes, options, "compiling the model");
  if (!e.example_dir.empty()) stage_example(outputs, example, built, e.model, sig, e.quant);
  outputs.commit();
  std::cout << "wrote " << e.out << "\n";
  if (files.has_header) std::cout << "wrote " << outputs.path(files.header).string() << "\n";
  if (!e.example_dir.empty()) std::cout << "wrote inputs and reference outputs to " << e.example_dir << "/\n";
  return 0;
}

// --- qkv emit train-step -------------------------------------------------------------------------

namespace {

std::string c_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

/// config.json: --config names the file, or a model folder that holds it.
HfConfig read_config(const std::string& path) {
  if (path.empty()) throw UsageError("give the model's config.json with --config (a file, or a model folder)");
  std::error_code ec;
  const HfConfig c = fs::is_directory(path, ec) ? read_hf_config(path) : read_hf_config_file(path);
  if (c.bert())
    throw UsageError("--config " + path +
                     ": a bert model is an encoder; emit train-step trains decoders (llama, "
                     "qwen2, mistral, gpt2)");
  return c;
}

/// The training step's sizes: Batch and Seq from the flags, every other symbol from the weights'
/// shapes that config.json implies (hf_weight_shapes, what HfCheckpoint::open checks).
Bindings train_sizes(const Graph& g, const HfConfig& c, std::int64_t batch, std::int64_t seq) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (auto& [name, shape] : hf_weight_shapes(c)) shapes[name] = shape;
  Bindings b;
  auto bind = [&](const Node& n, const std::vector<std::int64_t>& shape) {
    if (shape.size() != n.axes.size())
      throw std::logic_error("qkv internal error: `" + n.name + "` has " + std::to_string(n.axes.size()) +
                             " axes in the graph and " + std::to_string(shape.size()) + " in the checkpoint");
    for (std::size_t k = 0; k < shape.size(); ++k) {
      const Extent& e = n.axes[k].extent;
      if (e.is_dynamic() && e.num == 1 && e.den == 1 && e.plus == 0) b.emplace(e.symbol, shape[k]);
    }
  };
  for (const Node& n : g.nodes()) {
    if (n.op == Op::input && n.name == "tokens") bind(n, {batch, seq});
    if (n.op != Op::param) continue;
    const auto it = shapes.find(n.name);
    if (it == shapes.end())
      throw std::logic_error("qkv internal error: config.json implies no weight `" + n.name + "`");
    bind(n, it->second);
  }
  try {
    g.check(b);
  } catch (const ShapeError& x) {
    throw UsageError("--config: " + std::string(x.what()));
  }
  return b;
}

/// --out: the file, or <function>.<ext> in a directory (an existing one, or one ending in '/',
/// which commit() creates).
std::string train_step_file(OutputGroup& outputs, const std::string& out, const std::string& function,
                            codegen::AotFormat format) {
  std::error_code ec;
  if (!out.ends_with('/') && !fs::is_directory(out, ec)) return out;
  outputs.add_directory(out, "--out");
  const char* ext = format == codegen::AotFormat::shared   ? ".so"
                    : format == codegen::AotFormat::object ? ".o"
                    : format == codegen::AotFormat::ll     ? ".ll"
                                                           : ".s";
  return (fs::path(out) / (function + ext)).string();
}

/// What the optimizer and the loss are, in words (the header's comment).
std::string describe(const TrainSpec& s, const HfConfig& c) {
  std::ostringstream d;
  if (s.compute != DType::f32)
    d << "the model computed in " << dtype_name(s.compute)
      << " over the f32 weights (each read through one rounding), ";
  d << "cross-entropy over the vocabulary (" << c.vocab_size << " tokens; the mean over targets other than "
    << s.loss.ignore_index;
  if (s.loss.label_smoothing > 0) d << ", label smoothing " << s.loss.label_smoothing;
  d << "), its gradients";
  if (s.step.max_grad_norm > 0) d << " clipped to global norm " << s.step.max_grad_norm;
  if (s.sgd)
    d << ", then SGD (momentum " << s.sgd_options.momentum << ", weight decay " << s.sgd_options.weight_decay << ")";
  else
    d << ", then AdamW (betas " << s.adamw.beta1 << ", " << s.adamw.beta2 << "; eps " << s.adamw.eps
      << "; weight decay " << s.adamw.weight_decay << ")";
  return d.str();
}

/// The header's training-step section: sizes, the weights' and the state's names in the order
/// <f>_step takes them, and <f>_step itself (a static inline wrapper over <f>_packed).
std::string train_step_header(const codegen::AotSignature& sig, const TrainingStep& step, const TrainSpec& spec,
                              const HfConfig& c, const std::string& f, std::int64_t batch, std::int64_t seq) {
  const std::string F = upper(f);
  const std::size_t per_weight = step.state.size(), weights = step.params.size();
  std::map<std::string, std::int64_t> numel;
  for (const auto& a : sig.args) numel[a.name] = a.numel;
  // The section's comment, as paragraphs wrapped to the header's width.
  const std::vector<std::string> paragraphs{
      f + "() is one step of training the " + c.model_type + " model on " + std::to_string(batch) + " sequence" +
          (batch == 1 ? "" : "s") + " of " + std::to_string(seq) + " tokens: the forward pass, the loss (" +
          describe(spec, c) + ").",
      "Inputs: the weights (f32, Hugging Face's names and shapes), tokens, positions (usually 0 .. " +
          std::to_string(seq - 1) + " in every row) and targets (the next token; " +
          std::to_string(spec.loss.ignore_index) +
          " counts for nothing), lr (this step's learning rate) and step (the step's number, 1 for the first) -- "
          "inputs, so the caller drives the schedule -- and the optimizer state (zeros before the first step). "
          "Outputs: loss (before the update), grad_norm (the gradients' global L2 norm before clipping), the "
          "updated weights and the updated state.",
      "The updates go to SEPARATE buffers: no output may overlap an input (the weights are read after some "
      "updates are written), so keep two copies and swap them after each step.",
      "Train with " + f + "_step (below), " + f + " or " + f + "_packed, not with " + f +
          "_prepare / _run: a handle packs the weights once, and they change every step."};
  std::ostringstream h;
  h << "/* --- The training step (qkv emit train-step) ---------------------------------------------------\n";
  for (std::size_t k = 0; k < paragraphs.size(); ++k) {
    std::istringstream words(paragraphs[k]);
    std::string line = " *", word;
    while (words >> word) {
      if (line.size() + 1 + word.size() > 100) {
        h << line << "\n";
        line = " *";
      }
      line += " " + word;
    }
    h << line << (k + 1 < paragraphs.size() ? "\n *\n" : " */\n");
  }
  h << "#define " << F << "_BATCH " << batch << "\n#define " << F << "_SEQ " << seq << "\n";
  h << "#define " << F << "_NUM_WEIGHTS " << weights << "\n#define " << F << "_STATE_PER_WEIGHT " << per_weight
    << "\n#define " << F << "_NUM_STATE " << weights * per_weight << "\n\n";
  h << "/* The weights in the order of " << f << "_step's weights[] and new_weights[]: their names (as in\n"
    << " * model.safetensors) and element counts. */\n";
  h << "static const char* const " << f << "_weight_names[" << F << "_NUM_WEIGHTS] = {\n";
  for (const auto& p : step.params) h << "    " << c_string(p) << ",\n";
  h << "};\nstatic const int64_t " << f << "_weight_numel[" << F << "_NUM_WEIGHTS] = {\n   ";
  for (const auto& p : step.params) h << " " << numel.at(p) << ",";
  h << "\n};\n\n";
  if (per_weight > 0) {
    h << "/* The optimizer state: state[i * " << F << "_STATE_PER_WEIGHT + k] is state k of weight i, shaped\n"
      << " * as the weight (" << f << "_weight_numel[i] floats). */\n";
    h << "static const char* const " << f << "_state_names[" << F << "_NUM_STATE] = {\n";
    for (const auto& p : step.params)
      for (const auto& st : step.state) h << "    " << c_string(st + "." + p) << ",\n";
    h << "};\n\n";
  } else {
    h << "/* This optimizer keeps no state: " << f << "_step ignores state and new_state (NULL will do). */\n\n";
  }
  // The wrapper: every argument of the function by where it comes from.
  std::map<std::string, std::string> in, out;
  for (std::size_t i = 0; i < weights; ++i) {
    const std::string& p = step.params[i];
    in[p] = "weights[" + std::to_string(i) + "]";
    out[p] = "new_weights[" + std::to_string(i) + "]";
    for (std::size_t k = 0; k < per_weight; ++k) {
      const std::string j = std::to_string(i * per_weight + k);
      in[step.state[k] + "." + p] = "state[" + j + "]";
      out[step.state[k] + "." + p] = "new_state[" + j + "]";
    }
  }
  for (const char* name : {"tokens", "positions", "targets"}) in[name] = name;
  in["lr"] = "&lr";
  in["step"] = "&step";
  out["loss"] = "loss";
  out["grad_norm"] = "grad_norm";
  h << "/* " << f << "() with the weights and the state as arrays in the orders above. Returns as " << f
    << "() does\n * (0: done). */\n"
    << "static inline int " << f << "_step(const float* const* weights, const float* const* state,\n"
    << "    const int64_t* tokens, const int64_t* positions, const int64_t* targets, float lr, float step,\n"
    << "    float* const* new_weights, float* const* new_state, float* loss, float* grad_norm) {\n"
    << "  void* args[" << F << "_NUM_ARGS];\n"
    << "  (void)state;\n  (void)new_state;\n";
  for (std::size_t k = 0; k < sig.args.size(); ++k) {
    const auto& a = sig.args[k];
    const auto& from = a.output ? out : in;
    const auto it = from.find(a.name);
    if (it == from.end())
      throw std::logic_error("qkv internal error: the training step has an argument `" + a.name +
                             "` the wrapper does not know");
    h << "  args[" << k << "] = " << (a.output ? "" : "(void*)") << it->second << ";\n";
  }
  h << "  return " << f << "_packed(args);\n}\n\n";
  return h.str();
}

/// Adds `section` to the staged header, inside its include guard and extern "C" block.
void append_to_header(OutputGroup& outputs, std::size_t header, const std::string& section) {
  const fs::path staged = outputs.staging_path(header);
  std::string text;
  {
    std::ifstream file(staged, std::ios::binary);
    std::ostringstream all;
    all << file.rdbuf();
    text = all.str();
  }
  const std::string closing = "#ifdef __cplusplus\n}\n#endif\n";
  const std::size_t at = text.rfind(closing);
  if (at == std::string::npos) throw std::logic_error("qkv internal error: the header has no extern \"C\" block");
  text.insert(at, section);
  fs::remove(staged);
  write_text(outputs, header, text);
}

}  // namespace

int emit_train_step(const EmitTrainStep& e) {
  if (e.out.empty()) throw UsageError("give the output with --out (a file, or a directory)");
  if (e.target != "cpu" && e.target != "x86_64" && e.target != "aarch64")
    throw UsageError("--target must be cpu, x86_64 or aarch64, not " + e.target);
  if (e.seq <= 0 || e.batch <= 0) throw UsageError("--batch and --seq must be positive");
  TrainSpec spec;
  if (e.optimizer == "sgd") {
    spec.sgd = true;
    if (e.beta1 || e.beta2 || e.eps) throw UsageError("--beta1, --beta2 and --eps go with --optimizer adamw");
    spec.sgd_options.momentum = e.momentum.value_or(0.0);
    spec.sgd_options.weight_decay = e.weight_decay.value_or(0.0);
  } else if (e.optimizer == "adamw") {
    if (e.momentum) throw UsageError("--momentum goes with --optimizer sgd (AdamW's is --beta1)");
    spec.adamw = {.beta1 = e.beta1.value_or(0.9),
                  .beta2 = e.beta2.value_or(0.999),
                  .eps = e.eps.value_or(1e-8),
                  .weight_decay = e.weight_decay.value_or(1e-2)};
  } else {
    throw UsageError("--optimizer must be adamw or sgd, not " + e.optimizer);
  }
  spec.step.max_grad_norm = e.max_grad_norm;
  spec.loss = {.ignore_index = e.ignore_index, .label_smoothing = e.label_smoothing};
  if (e.dtype != "f32" && e.dtype != "bf16") throw UsageError("--dtype must be f32 or bf16, not " + e.dtype);
  spec.compute = e.dtype == "bf16" ? DType::bf16 : DType::f32;
  const codegen::AotFormat format = cpu_format(e.format.empty() ? "so" : e.format);
  const codegen::AotOptions options = cpu_options(e.target, e.cpu, e.features, e.function, "qkv_train", {"_step"});

  const HfConfig config = read_config(e.config);
  if (config.max_position_embeddings > 0 && e.seq > config.max_position_embeddings)
    throw UsageError("--seq " + std::to_string(e.seq) + " is longer than the model's max_position_embeddings (" +
                     std::to_string(config.max_position_embeddings) + ")");
  // The largest array the step holds (the logits, [Batch, Seq, Vocab] floats) must be addressable.
  if (static_cast<double>(e.batch) * static_cast<double>(e.seq) * static_cast<double>(config.vocab_size) * 4.0 > 0x1p56)
    throw UsageError("--batch " + std::to_string(e.batch) + " x --seq " + std::to_string(e.seq) + " x " +
                     std::to_string(config.vocab_size) + " logits is too large to compile for");

  OutputGroup outputs;
  const AotFiles files =
      declare_aot_files(outputs, train_step_file(outputs, e.out, options.function, format), format, "--out");
  const TrainGraph t = [&] {
    const Activity building("building the training step");
    return build_training_step(config, spec);
  }();
  const Bindings sizes = train_sizes(t.g, config, e.batch, e.seq);
  const codegen::AotSignature sig = checked_signature(t.g, sizes, options);
  const std::string section = train_step_header(sig, t.step, spec, config, options.function, e.batch, e.seq);
  stage_aot(outputs, files, t.g, sizes, options, "compiling the training step");
  if (files.has_header) append_to_header(outputs, files.header, section);
  outputs.commit();
  std::cout << "wrote " << outputs.path(files.code).string() << "\n";
  if (files.has_header) std::cout << "wrote " << outputs.path(files.header).string() << "\n";
  return 0;
}

}  // namespace qkv::cli
