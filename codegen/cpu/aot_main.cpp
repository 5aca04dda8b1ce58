// The main() of a model generator (qkv/codegen/aot_main.hpp): its command line, then emit_aot.
#include <qkv/codegen/aot_main.hpp>

#include <charconv>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <qkv/codegen/aot.hpp>

namespace qkv::codegen {

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: <generator> -o OUT.so|OUT.o|OUT.ll|OUT.s --function NAME [--header OUT.h] [--cpu CPU] "
    "[--features +f,-g] [--target ARCH] [--dynamic A,B] [--sizes A=N,B=M]";

/// The items of a list separated by commas or semicolons (a CMake list), empty ones dropped.
std::vector<std::string> split(std::string s) {
  for (char& c : s)
    if (c == ';') c = ',';
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

/// "Batch=2,Seq=16" as bindings.
Bindings parse_sizes(const std::string& text) {
  Bindings sizes;
  for (const auto& item : split(text)) {
    const auto eq = item.find('=');
    std::int64_t v = -1;
    const char* end = item.data() + item.size();
    if (eq == std::string::npos || eq == 0 || std::from_chars(item.data() + eq + 1, end, v).ptr != end || v < 0)
      throw UsageError("--sizes: `" + item + "` is not NAME=N with N >= 0 (e.g. --sizes Batch=1,Seq=128)");
    sizes[item.substr(0, eq)] = v;
  }
  return sizes;
}

/// One line: the message with its line breaks (a linker's output) folded.
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

/// The format -o asks for, by its extension.
AotFormat format_of(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".so") return AotFormat::shared;
  if (ext == ".o") return AotFormat::object;
  if (ext == ".ll") return AotFormat::ll;
  if (ext == ".s") return AotFormat::assembly;
  throw UsageError("-o " + path + ": the file name must end in .so, .o, .ll or .s");
}

/// Moves the header emit_aot wrote beside the library to `to`, its first line naming the new file.
void move_header(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string h = text.str();
  const std::string was = "/* " + std::filesystem::path(from).filename().string() + ":";
  if (h.rfind(was, 0) == 0) h.replace(0, was.size(), "/* " + std::filesystem::path(to).filename().string() + ":");
  const std::string tmp = to + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << h;
    if (!out) throw ToolError("cannot write " + to);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, to, ec);
  if (ec) throw ToolError("cannot write " + to + ": " + ec.message());
  std::filesystem::remove(from, ec);
}

}  // namespace

int aot_main(int argc, const char* const* argv, const std::function<Graph()>& build) {
  const std::string self = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "generator";
  try {
    std::string out, header;
    AotOptions options;
    options.function.clear();
    Bindings sizes;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "-h" || flag == "--help") {
        std::cout << kUsage << "\n";
        return 0;
      }
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      const std::string value = argv[++i];
      if (flag == "-o")
        out = value;
      else if (flag == "--header")
        header = value;
      else if (flag == "--function")
        options.function = value;
      else if (flag == "--cpu")
        options.cpu = value;
      else if (flag == "--features")
        options.features = value;
      else if (flag == "--target")
        options.target = value;
      else if (flag == "--dynamic")
        for (const auto& d : split(value)) options.dynamic.push_back(d);
      else if (flag == "--sizes")
        for (const auto& [name, n] : parse_sizes(value)) sizes[name] = n;
      else
        throw UsageError("unknown option " + flag);
    }
    if (out.empty()) throw UsageError("-o OUT is required (OUT.so, OUT.o, OUT.ll or OUT.s)");
    if (options.function.empty()) throw UsageError("--function NAME is required");
    const AotFormat format = format_of(out);
    const Graph g = build();
    const auto written = emit_aot(g, sizes, options, format, out);
    if (!header.empty() && written.size() > 1 && written[1] != header) move_header(written[1], header);
    return 0;
  } catch (const UsageError& e) {
    std::cerr << self << ": error: " << e.what() << " (--help: usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << self << ": error: " << one_line(e.what()) << "\n";
    return 1;
  }
}

}  // namespace qkv::codegen
