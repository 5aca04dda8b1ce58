// Portable generated code (qkv/codegen/target.hpp): targets carry every feature explicitly, the
// code built for a CPU whose AVX-512 is masked holds no EVEX instruction (JIT and AOT), and the
// CPU check of an emitted library refuses a CPU without a required feature.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <dlfcn.h>
#include <unistd.h>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/MCAsmInfo.h>
#include <llvm/MC/MCContext.h>
#include <llvm/MC/MCDisassembler/MCDisassembler.h>
#include <llvm/MC/MCInst.h>
#include <llvm/MC/MCRegisterInfo.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/MCTargetOptions.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "cpu/module/module_builder.hpp"

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

namespace qkv::nn {
namespace {

using codegen::HostTarget;

QKV_AXIS(Query);  // the decode-shaped call's few query rows
QKV_AXIS(Key2);   // ... and its many keys

bool has(const HostTarget& t, const std::string& flag) {
  return std::find(t.features.begin(), t.features.end(), flag) != t.features.end();
}

TEST(Target, FeatureFlagsPassDisabledFeaturesToo) {
  // As a Zen 4 VM whose hypervisor hides AVX-512 reports itself: the disabled ones are said too.
  EXPECT_THAT(codegen::feature_flags({{"avx512f", false}, {"avx2", true}, {"fma", true}, {"avx512bw", false}}),
              ElementsAre("+avx2", "-avx512bw", "-avx512f", "+fma"));  // sorted by name
}

TEST(Target, TheHostStatesEveryFeatureItKnows) {
  const HostTarget host = codegen::host_target();
  for (const auto& f : host.features) EXPECT_TRUE(f[0] == '+' || f[0] == '-') << f;
  if (codegen::target_arch(host.triple) == "x86_64") {
    // Present or absent, AVX-512 is said either way: never left to the CPU name's defaults.
    EXPECT_NE(has(host, "+avx512f"), has(host, "-avx512f"));
    EXPECT_EQ(host.vector_floats, has(host, "+avx512f") ? 16 : has(host, "+avx") ? 8 : 4);
  }
}

TEST(Target, AZnver4WithAvx512MaskedIsAnAvx2Target) {
  const HostTarget t = codegen::make_target("x86_64", "znver4", "-avx512f");
  EXPECT_EQ(t.cpu, "znver4");
  EXPECT_EQ(t.vector_floats, 8);
  for (const char* f : {"-avx512f", "-avx512bw", "-avx512vl", "-avx512bf16", "+avx2", "+fma"})
    EXPECT_TRUE(has(t, f)) << f;
  for (const auto& f : codegen::required_features(t)) EXPECT_EQ(f.find("avx512"), std::string::npos) << f;
  const HostTarget full = codegen::make_target("x86_64", "znver4");
  EXPECT_EQ(full.vector_floats, 16);
  EXPECT_THAT(codegen::required_features(full), Contains("avx512bf16"));
}

TEST(Target, LevelsRequireWhatTheirNamesSay) {
  const auto v2 = codegen::required_features(codegen::make_target("x86_64", "x86-64-v2"));
  const auto v3 = codegen::required_features(codegen::make_target("x86_64", "x86-64-v3"));
  const auto v4 = codegen::required_features(codegen::make_target("x86_64", "x86-64-v4"));
  EXPECT_THAT(v2, Contains("sse4.2"));
  EXPECT_THAT(v2, Contains("popcnt"));
  EXPECT_THAT(v2, Not(Contains("avx")));
  for (const char* f : {"avx", "avx2", "fma", "bmi2", "f16c", "movbe", "lzcnt"}) EXPECT_THAT(v3, Contains(f));
  EXPECT_THAT(v3, Not(Contains("avx512f")));
  for (const char* f : {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}) EXPECT_THAT(v4, Contains(f));
  // v4 on a v3 CPU: exactly the AVX-512 foundation is missing.
  const auto missing = codegen::missing_features(codegen::make_target("x86_64", "x86-64-v4"),
                                                 codegen::make_target("x86_64", "x86-64-v3"));
  EXPECT_THAT(missing, ElementsAre("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"));
  EXPECT_THAT(codegen::cpu_error(codegen::make_target("x86_64", "x86-64-v4"), missing),
              HasSubstr("code for x86-64-v4 needs "));
  EXPECT_THAT(codegen::cpu_error(codegen::make_target("x86_64", "x86-64-v4"), missing),
              HasSubstr("; this CPU lacks avx512bw, avx512cd, avx512dq, avx512f, avx512vl"));
}

TEST(Target, Aarch64CpusAndTheirFeatures) {
  const HostTarget generic = codegen::make_target("aarch64", "generic");
  EXPECT_EQ(codegen::target_arch(generic.triple), "aarch64");
  EXPECT_EQ(generic.vector_floats, 4);
  EXPECT_THAT(codegen::required_features(generic), Contains("neon"));
  const auto v1 = codegen::required_features(codegen::make_target("aarch64", "neoverse-v1"));
  for (const char* f : {"sve", "bf16", "dotprod", "i8mm", "neon"}) EXPECT_THAT(v1, Contains(f));
  // Another architecture's code never runs here.
  EXPECT_FALSE(codegen::missing_features(generic, codegen::make_target("x86_64", "x86-64-v4")).empty());
}

TEST(Target, UnknownNamesAreRefused) {
  EXPECT_THROW(codegen::make_target("x86_64", "no-such-cpu"), std::invalid_argument);
  EXPECT_THROW(codegen::make_target("x86_64", "x86-64-v3", "-no-such-feature"), std::invalid_argument);
  EXPECT_THROW(codegen::make_target("x86_64", "x86-64-v3", "avx2"), std::invalid_argument);  // no sign
  EXPECT_THROW(codegen::make_target("aarch64", "znver4"), std::invalid_argument);
  if (codegen::target_arch(codegen::host_target().triple) == "x86_64") {
    EXPECT_THROW(codegen::make_target("aarch64", "native"), std::invalid_argument);
  }
}

// --- machine code ---------------------------------------------------------------------------

struct Scan {
  int instructions = 0;
  int evex = 0;  // instructions whose opcode starts with the EVEX prefix 0x62 (64-bit mode)
  int zmm = 0;   // instructions with a zmm register operand
};

/// Disassembles every text section of the x86-64 object `bytes` with LLVM's MC disassembler.
Scan scan_x86_object(const std::string& bytes) {
  static const bool init = [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllDisassemblers();
    return true;
  }();
  (void)init;
  Scan s;
  auto object = llvm::object::ObjectFile::createObjectFile(llvm::MemoryBufferRef(bytes, "code"));
  if (!object) {
    ADD_FAILURE() << "not an object file: " << llvm::toString(object.takeError());
    return s;
  }
  const std::string triple = "x86_64-unknown-linux-gnu";
  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, error);
  std::unique_ptr<llvm::MCRegisterInfo> mri(target->createMCRegInfo(triple));
  llvm::MCTargetOptions options;
  std::unique_ptr<llvm::MCAsmInfo> mai(target->createMCAsmInfo(*mri, triple, options));
  // The disassembler must know every instruction: decode as the widest x86 there is.
  std::unique_ptr<llvm::MCSubtargetInfo> sti(target->createMCSubtargetInfo(triple, "sapphirerapids", ""));
  llvm::MCContext ctx(llvm::Triple(triple), mai.get(), mri.get(), sti.get());
  std::unique_ptr<llvm::MCDisassembler> dis(target->createMCDisassembler(*sti, ctx));
  for (const auto& section : (*object)->sections()) {
    if (!section.isText()) continue;
    auto contents = section.getContents();
    if (!contents) continue;
    const auto data =
        llvm::ArrayRef<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(contents->data()), contents->size());
    for (std::uint64_t at = 0; at < data.size();) {
      llvm::MCInst inst;
      std::uint64_t size = 0;
      if (dis->getInstruction(inst, size, data.slice(at), at, llvm::nulls()) != llvm::MCDisassembler::Success) {
        at += std::max<std::uint64_t>(size, 1);  // padding or data: skip a byte
        continue;
      }
      ++s.instructions;
      std::uint64_t p = at;
      auto legacy_prefix = [](std::uint8_t b) {
        return b == 0x66 || b == 0x67 || b == 0xF0 || b == 0xF2 || b == 0xF3 || b == 0x2E || b == 0x36 || b == 0x3E ||
               b == 0x26 || b == 0x64 || b == 0x65;
      };
      while (p < at + size && legacy_prefix(data[p])) ++p;
      if (p < at + size && data[p] == 0x62) ++s.evex;
      bool zmm = false;
      for (const auto& op : inst)
        if (op.isReg() && op.getReg() && std::string_view(mri->getName(op.getReg())).starts_with("ZMM")) zmm = true;
      s.zmm += zmm;
      at += size;
    }
  }
  return s;
}

Scan scan_all(const std::vector<std::string>& objects) {
  Scan total;
  for (const auto& o : objects) {
    const Scan s = scan_x86_object(o);
    total.instructions += s.instructions;
    total.evex += s.evex;
    total.zmm += s.zmm;
  }
  return total;
}

/// One graph with the CPU backend's kernel kinds: the fused attention (with the GEMMs of an
/// nn.MultiheadAttention around it), the split-KV decode kernel (2 queries over 300 keys), the
/// row-wise kernels (layer norm, softmax's rows) and generic loop nests (an unfused chain).
Graph every_kernel_kind() {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto out = MultiHeadAttention<64, 4>::make(g)(x, keep).first;
  output(layer_norm(out, layer_norm_params<Model<64>>(g, "ln")), "out");
  auto q = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Group<2>, Query<dyn>, HeadDim<32>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Key2<dyn>, HeadDim<32>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Key2<dyn>, ValueDim<32>>>(g, "v");
  auto s = causal<Query, Key2>(scaled(contract<HeadDim>(q, k)), bottom_right);
  output(contract<Key2>(softmax<Key2>(s), v), "decoded");
  auto y = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<8>>>(g, "y");
  auto b = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, Key<dyn>>>(g, "b");
  auto yk = rename<Seq, Key>(y);
  auto p = softmax<Key>(scale(biased(unscaled(contract<HeadDim>(y, yk)), b), 0.5));
  output(permute<Batch, Seq, Heads, HeadDim>(contract<Key>(p, yk)), "unfused");
  return g;
}

const Bindings kSizes{{"Batch", 2}, {"Seq", 16}, {"Key", 16}, {"Query", 2}, {"Key2", 300}};

/// The JIT's object code for the graph compiled for `target` (inspect mode: nothing runs).
std::vector<std::string> jit_objects(const HostTarget& target, std::string* lookup_error) {
  const Graph lowered = codegen::lower(every_kernel_kind());
  std::string error;
  auto jit = codegen::Jit::create(codegen::JitOptions{.target = target, .inspect = true}, &error);
  EXPECT_TRUE(jit) << error;
  if (!jit) return {};
  const auto plan = codegen::cpu::plan_module(lowered, kSizes, target);
  const auto sig = codegen::cpu::module_signature(lowered, codegen::AotOptions{.function = "all"}, plan);
  EXPECT_FALSE(plan.decode.empty()) << "the decode-shaped call should take the split-KV kernel";
  EXPECT_FALSE(plan.gemm.empty()) << "the linears should run on the GEMM";
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = codegen::cpu::build_graph_module(*context, lowered, sig, plan, target, "all", false);
  EXPECT_TRUE(jit->add(std::move(module), std::move(context), &error)) << error;
  const bool found = jit->lookup_address("all_entry", lookup_error) != nullptr;
  if (found) lookup_error->clear();
  return jit->objects();
}

std::string aot_object(const std::string& cpu, const std::string& features) {
  const auto path = std::filesystem::temp_directory_path() / ("qkv_port_" + std::to_string(::getpid()) + ".o");
  codegen::AotOptions opt;
  opt.function = "all";
  opt.cpu = cpu;
  opt.features = features;
  opt.target = "x86_64";
  codegen::emit_aot(every_kernel_kind(), kSizes, opt, codegen::AotFormat::object, path.string());
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove(path);
  std::filesystem::remove(std::filesystem::path(path).replace_extension(".h"));
  return ss.str();
}

/// The host target of a Zen 4 VM whose hypervisor hides AVX-512, as host_target() builds it:
/// LLVM's CPU name `znver4`, every feature the CPU has reported enabled except AVX-512's.
HostTarget masked_znver4_host() {
  std::map<std::string, bool> reported;
  for (const auto& f : codegen::make_target("x86_64", "znver4").features)
    reported[f.substr(1)] = f[0] == '+' && f.find("avx512") == std::string::npos;
  HostTarget t;
  t.triple = "x86_64-unknown-linux-gnu";
  t.cpu = "znver4";
  t.features = codegen::feature_flags(reported);
  t.vector_floats = 8;
  t.has_fma = true;
  return t;
}

TEST(NoEvex, Znver4WithAvx512MaskedInTheJit) {
  const HostTarget masked = masked_znver4_host();
  std::string error;
  const Scan s = scan_all(jit_objects(masked, &error));
  EXPECT_GT(s.instructions, 1000);
  EXPECT_EQ(s.evex, 0);
  EXPECT_EQ(s.zmm, 0);
  // The JIT hands out the code only where this CPU runs it.
  const auto missing = codegen::missing_features(masked, codegen::host_target());
  EXPECT_EQ(error.empty(), missing.empty()) << error;
  if (!missing.empty()) {
    EXPECT_THAT(error, HasSubstr("this CPU lacks"));
  }
}

TEST(NoEvex, Znver4WithAvx512MaskedAheadOfTime) {
  const Scan masked = scan_x86_object(aot_object("znver4", "-avx512f"));
  EXPECT_GT(masked.instructions, 1000);
  EXPECT_EQ(masked.evex, 0);
  EXPECT_EQ(masked.zmm, 0);
  // The scan itself: the same CPU unmasked is full of EVEX and zmm.
  const Scan full = scan_x86_object(aot_object("znver4", ""));
  EXPECT_GT(full.evex, 100);
  EXPECT_GT(full.zmm, 100);
}

TEST(NoEvex, AJitForTheFullZnver4IsRefusedWhereAvx512IsMissing) {
  const HostTarget full = codegen::make_target("x86_64", "znver4");
  std::string error;
  auto jit = codegen::Jit::create(codegen::JitOptions{.target = full}, &error);
  const auto missing = codegen::missing_features(full, codegen::host_target());
  EXPECT_EQ(jit == nullptr, !missing.empty());
  if (!missing.empty()) {
    EXPECT_THAT(error, HasSubstr("code for znver4 needs"));
    EXPECT_THROW(codegen::set_jit_target(full), std::invalid_argument);
  }
}

// --- the CPU check of an emitted library ------------------------------------------------------

using CheckFn = const char*();
using DirectFn = int(const float*, const float*, const float*, float*);

/// Emits q·kᵀ attention for `cpu` as a shared library, loads it, and returns the handle.
void* load_attention(const std::string& cpu, const std::string& dir) {
  Graph g;
  auto q = input<Tensor<f32, Heads<2>, Seq<dyn>, HeadDim<16>>>(g, "q");
  auto k = input<Tensor<f32, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "k");
  auto v = input<Tensor<f32, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "v");
  output(attention(q, k, v).first, "out");
  codegen::AotOptions opt;
  opt.function = "att";
  opt.cpu = cpu;
  const std::string path = dir + "/att_" + cpu + ".so";
  codegen::emit_aot(g, {{"Seq", 8}, {"Key", 8}}, opt, codegen::AotFormat::shared, path);
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(lib, nullptr) << dlerror();
  return lib;
}

TEST(CpuCheck, ALibraryForACpuThisHostIsNotReturnsSixAndSaysWhy) {
  if (codegen::target_arch(codegen::host_target().triple) != "x86_64") GTEST_SKIP() << "x86-64 levels";
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_cpucheck_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<float> q(256, 0.5f), k(256, 0.25f), v(256, 1.0f);
  for (const char* cpu : {"x86-64-v2", "x86-64-v4", "native"}) {
    void* lib = load_attention(cpu, dir.string());
    ASSERT_NE(lib, nullptr);
    auto* required = reinterpret_cast<CheckFn*>(dlsym(lib, "att_required_features"));
    auto* check = reinterpret_cast<CheckFn*>(dlsym(lib, "att_check_cpu"));
    auto* run = reinterpret_cast<DirectFn*>(dlsym(lib, "att"));
    ASSERT_TRUE(required && check && run);
    const HostTarget target = codegen::make_target("", cpu);
    std::string want;
    for (const auto& f : codegen::required_features(target)) want += (want.empty() ? "" : ",") + f;
    EXPECT_EQ(std::string(required()), want) << cpu;
    const auto missing = codegen::missing_features(target, codegen::host_target());
    std::vector<float> out(256, -1.0f);
    if (missing.empty()) {
      EXPECT_EQ(check(), nullptr) << cpu << ": " << check();
      EXPECT_EQ(run(q.data(), k.data(), v.data(), out.data()), 0) << cpu;
      EXPECT_FLOAT_EQ(out[0], 1.0f) << cpu;
    } else {  // x86-64-v4 on a host without AVX-512: refused, nothing written
      ASSERT_NE(check(), nullptr) << cpu;
      EXPECT_EQ(std::string(check()), codegen::cpu_error(target, missing)) << cpu;
      EXPECT_EQ(run(q.data(), k.data(), v.data(), out.data()), 6) << cpu;
      EXPECT_EQ(out[0], -1.0f);
      EXPECT_EQ(check(), check());  // the cached answer
    }
    dlclose(lib);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qkv::nn
