// qkv — the command-line tool. Subcommands grow with the project (run, emit, bench, verify,
// shapes, heatmap); today: `qkv host` and `qkv --version`.
//
// Exit codes: 0 success, 2 usage errors (unknown flag, bad value), 1 everything else.
#include <cstdio>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include <qkv/codegen/target.hpp>

namespace {

int cmd_host() {
  const auto t = qkv::codegen::host_target();
  std::cout << "triple:   " << t.triple << "\n"
            << "cpu:      " << t.cpu << "\n"
            << "vector:   " << t.vector_floats << " x f32" << (t.has_fma ? ", FMA" : ", no FMA") << "\n"
            << "backends:";
  for (const auto& b : qkv::codegen::available_backends()) std::cout << " " << b;
  std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qkv: attention models with shapes in the type system, compiled to fused kernels"};
  app.set_version_flag("--version", std::string("qkv ") + QKV_VERSION);
  app.require_subcommand(1);
  auto* host = app.add_subcommand("host", "Print the host CPU as the code generator sees it")
                   ->footer("Example: qkv host");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // every usage error exits 2, whatever CLI11's own code
  }
  try {
    if (*host) return cmd_host();
  } catch (const std::exception& e) {
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
