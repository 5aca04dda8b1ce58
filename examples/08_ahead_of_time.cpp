// Lesson 08 — compile a model ahead of time: one C function in a shared library, with a header.
//
// The encoder layer of lesson 06, with its sizes fixed (batch 2, 48 tokens), goes through the
// same passes as the JIT path, then every node becomes code in one LLVM module:
//
//   qkv::codegen::emit_aot(graph, sizes, {.function = "encoder", .cpu = "x86-64-v3"},
//                          qkv::codegen::AotFormat::shared, "encoder.so");   // + encoder.h
//
// The library needs only the C library at run time. This lesson writes it, prints the header a C
// program would include, then runs the same module in-process (AotModel) on seeded inputs and
// compares it with the reference interpreter — on 1 thread and on 2, which must agree bit for bit.
//
//     ./build/examples/08_ahead_of_time [output directory, default: <temp>/qkv_lesson_08]
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <qkv/codegen/aot.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

int main(int argc, char** argv) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(g, "src");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "src_keep");
  output(EncoderLayer<64, 4, 128, Activation::gelu>::make(g, "", NormPlacement::pre)(x, keep), "out");

  // Seeded weights and inputs; their shapes fix every dynamic extent.
  Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 48}, {"Key", 48}}, /*seed=*/8, 0.5f);
  feeds["src_keep"] = keep_first({48, 30}, 48);
  const Bindings sizes = bind_extents(g, feeds);

  // 1. The files a C program links against.
  const std::filesystem::path dir =
      argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path() / "qkv_lesson_08";
  std::filesystem::create_directories(dir);
  codegen::AotOptions options;
  options.function = "encoder";
  options.cpu = "x86-64-v3";  // AVX2 + FMA: runs on any x86-64 from the last decade
  const auto files = codegen::emit_aot(g, sizes, options, codegen::AotFormat::shared, (dir / "encoder.so").string());
  for (const auto& f : files) std::cout << "wrote " << f << "\n";
  std::ifstream header(files.at(1));
  std::stringstream text;
  text << header.rdbuf();
  const std::string h = text.str();
  const auto from = h.find("/* Arguments");
  std::cout << "\nencoder.h declares:\n\n" << h.substr(from, h.find("\n#define", from) - from) << "\n";

  // 2. The same module compiled in-process (for the host CPU), called through the packed entry.
  auto model = codegen::AotModel::compile(g, sizes, {.function = "encoder"});
  std::vector<std::vector<float>> data;
  std::vector<std::vector<std::uint8_t>> bytes;
  std::vector<void*> args;
  for (const auto& a : model->signature().args) {
    data.emplace_back();
    bytes.emplace_back();
    if (a.dtype == DType::boolean) {  // keep-masks: one byte per element, 1 = may attend
      for (float v : feeds.at(a.name).to_f32()) bytes.back().push_back(v != 0.0f ? 1 : 0);
      args.push_back(bytes.back().data());
    } else {
      data.back() = a.output ? std::vector<float>(static_cast<std::size_t>(a.numel)) : feeds.at(a.name).to_f32();
      args.push_back(data.back().data());
    }
  }
  std::vector<float> out_1, out_2;
  for (int threads : {1, 2}) {
    model->set_threads(threads);
    if (model->run(args.data()) != 0) return EXIT_FAILURE;
    (threads == 1 ? out_1 : out_2) = data.back();
  }

  const auto want = interpret(g, feeds).outputs.at("out").to_f32();
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst =
        std::max(worst, std::abs(static_cast<double>(out_1[i]) - want[i]) / std::max(1.0, std::abs(double{want[i]})));
  const bool close = out_1.size() == want.size() && worst < 1e-4;
  const bool same = std::memcmp(out_1.data(), out_2.data(), out_1.size() * sizeof(float)) == 0;
  std::cout << "AOT vs reference interpreter: max error " << worst << " over " << want.size()
            << " outputs: " << (close ? "ok" : "FAILED")
            << "\n1 thread vs 2 threads, bit for bit: " << (same ? "ok" : "FAILED") << "\n";
  return close && same ? EXIT_SUCCESS : EXIT_FAILURE;
}
