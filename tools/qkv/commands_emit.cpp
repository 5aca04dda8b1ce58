// qkv emit: a model given by shape, compiled ahead of time for the CPU (qkv/codegen/aot.hpp) or
// the GPU kernels it launches emitted as PTX (qkv/codegen/nvptx.hpp, planned by cuda/executor.hpp).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/nvptx.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>

#include "commands.hpp"
#include "run_common.hpp"

namespace qkv::cli {

namespace {

codegen::AotFormat cpu_format(const std::string& f) {
  if (f == "ll") return codegen::AotFormat::ll;
  if (f == "asm") return codegen::AotFormat::assembly;
  if (f == "obj") return codegen::AotFormat::object;
  if (f == "so") return codegen::AotFormat::shared;
  throw UsageError("--format " + f + " is not a CPU format (ll, asm, obj, so)");
}

/// The seeded inputs and the reference outputs, one .npy per argument of the generated function.
void write_example(const Instance& in, const Bindings& sizes, const codegen::AotOptions& options,
                   const std::string& dir) {
  std::filesystem::create_directories(dir);
  const codegen::AotSignature sig = codegen::aot_signature(in.graph, sizes, options);
  const RunResult want = interpret(in.graph, in.feeds);
  std::vector<std::pair<std::string, NdArray>> files;
  for (const auto& a : sig.args) {
    const NdArray& v = a.output ? want.outputs.at(a.name) : in.feeds.at(a.name);
    files.emplace_back((std::filesystem::path(dir) / (a.c_name + ".npy")).string(),
                       a.dtype == DType::boolean || v.dtype == DType::f32 ? v : NdArray::from_f32(v.to_f32(), v.shape));
  }
  write_all(files);
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".qkv-partial";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out) {
      std::filesystem::remove(tmp);
      throw std::runtime_error("emit: cannot write " + path);
    }
  }
  std::filesystem::rename(tmp, path);
}

std::string dims(const codegen::nvptx::Dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

/// --target nvptx: the kernels the GPU backend launches for the model (its plan), as PTX. With
/// one kernel, -o is its file; with several, -o is a directory holding one .ptx per kernel and
/// launches.txt (per node: kernel, grid, block, dynamic shared memory, in order).
int emit_ptx(const Emit& e, const Instance& in, const Bindings& sizes) {
  const std::string format = e.format.empty() ? "ptx" : e.format;
  if (format != "ptx") throw UsageError("--target nvptx writes --format ptx, not " + format);
  if (e.sm != 80 && e.sm != 86 && e.sm != 87 && e.sm != 89 && e.sm != 90)
    throw UsageError("--sm must be 80, 86, 87, 89 or 90, not " + std::to_string(e.sm));
  const Graph lowered = codegen::lower(in.graph);
  const codegen::cuda::Plan plan = codegen::cuda::plan(lowered, sizes);
  std::map<std::string, codegen::nvptx::PtxKernel> kernels;
  std::string launches;
  for (std::size_t id = 0; id < plan.steps.size(); ++id) {
    const auto& step = plan.steps[id];
    const Node& n = lowered.node(static_cast<int>(id));
    if (step.kind == codegen::cuda::Step::Kind::host)
      launches += "%" + std::to_string(id) + " " + std::string(op_name(n.op)) + ": on the host (" + step.why + ")\n";
    for (const auto& l : step.launches) {
      const std::string name = codegen::nvptx::kernel_name(l.request);
      auto it = kernels.find(name);
      if (it == kernels.end()) it = kernels.emplace(name, codegen::nvptx::emit_ptx(l.request, e.sm)).first;
      const auto& k = it->second;
      launches += "%" + std::to_string(id) + " " + std::string(op_name(n.op)) + ": " + name + " grid " + dims(l.grid) +
                  " block (" + std::to_string(k.block_x) + ", " + std::to_string(k.block_y) + ", " +
                  std::to_string(k.block_z) + ") shared " + std::to_string(k.shared_bytes) + " B\n";
    }
  }
  if (kernels.empty()) throw std::runtime_error("emit: the model launches no GPU kernel");
  if (kernels.size() == 1) {
    const auto& k = kernels.begin()->second;
    write_text(e.out, k.ptx);
    std::cout << "wrote " << e.out << ": .entry " << k.name << " (" << k.signature << ")\n  grid " << k.grid_rule
              << ", block (" << k.block_x << ", " << k.block_y << ", " << k.block_z << "), dynamic shared "
              << k.shared_bytes << " B, sm_" << k.sm << "\n";
    return 0;
  }
  std::filesystem::create_directories(e.out);
  for (const auto& [name, k] : kernels) write_text((std::filesystem::path(e.out) / (name + ".ptx")).string(), k.ptx);
  write_text((std::filesystem::path(e.out) / "launches.txt").string(), launches);
  std::cout << "wrote " << kernels.size() << " kernels (sm_" << e.sm << ") and launches.txt to " << e.out << "/\n";
  return 0;
}

}  // namespace

int emit(const Emit& e) {
  if (e.out.empty()) throw UsageError("give the output file with -o / --out");
  const Instance in = instantiate(e.model);
  const Bindings sizes = bind_extents(in.graph, in.feeds);
  if (e.target == "nvptx") {
    if (!e.example_dir.empty()) throw UsageError("--example-dir goes with --target cpu");
    return emit_ptx(e, in, sizes);
  }
  if (e.target != "cpu") throw UsageError("--target must be cpu or nvptx, not " + e.target);
  codegen::AotOptions options;
  options.cpu = e.cpu;
  options.function = e.function.empty() ? "qkv_" + e.model.kind : e.function;
  for (char& c : options.function)
    if (c == '-') c = '_';
  const codegen::AotFormat format = cpu_format(e.format.empty() ? "so" : e.format);
  std::vector<std::string> written;
  try {
    written = codegen::emit_aot(in.graph, sizes, options, format, e.out);
  } catch (const std::invalid_argument& x) {
    throw UsageError(x.what());  // an unknown --cpu, a --function that is not a C identifier
  }
  if (!e.example_dir.empty()) write_example(in, sizes, options, e.example_dir);
  for (const auto& w : written) std::cout << "wrote " << w << "\n";
  if (!e.example_dir.empty()) std::cout << "wrote inputs and reference outputs to " << e.example_dir << "/\n";
  return 0;
}

}  // namespace qkv::cli
