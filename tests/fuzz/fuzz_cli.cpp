// libFuzzer target for the CLI: qkv::cli::run_cli over argv variants (a command, flags and values
// from fixed pools) and small input files (raw bytes, valid .npy arrays of fuzzed shapes, or the
// PyTorch fixtures' state dicts), in a fresh directory per input. run_cli must return 0, 1 or 2 —
// any crash, hang, leak or sanitizer report is a finding — and afterwards every file the command
// read (the value of an input flag) must be unchanged and no staging directory (.qkv-*) may be
// left: outputs never overwrite inputs and are committed whole or not at all. Run with
// -close_fd_mask=3 (the CLI prints).
//
// Input layout (missing bytes read as 0): [command] [flag count] ([flag] [value])... then, for
// each of the four input files, [mode] and its bytes: 0 raw (a length byte and that many bytes),
// 1 an f32 .npy and 2 a bool .npy ([rank] [dims...]: a byte b is b % 8, or 32 when b >= 200;
// then a byte per element byte), 3 and 4 a fixture's state dict. tests/fuzz/corpus/make_corpus.py
// writes the seeds in this layout.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <qkv/runtime/io/npy.hpp>

#include "commands.hpp"

namespace {

namespace fs = std::filesystem;

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t next() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_, at_ = 0;
};

// clang-format off
const char* const kCommands[][2] = {
    {"run", "mha"},   {"run", "sdpa"},  {"run", "encoder-layer"}, {"run", "encoder"}, {"shapes", "sdpa"},
    {"shapes", "mha"}, {"bench", "sdpa"}, {"verify", "mha"},        {"heatmap", ""},    {"emit", "sdpa"},
    {"generate", ""},  {"run", ""},
};
const char* const kFlags[] = {
    "--weights", "--query", "--key",  "--value",  "--src",  "--tokens-file", "--attn-mask", "--key-padding-mask",
    "--attn-bias", "--src-mask", "--src-key-padding-mask", "--out", "-o", "--weights-out", "--example-dir",
    "--heads", "--batch", "--seq", "--kv-seq", "--head-dim", "--embed-dim", "--kv-heads", "--ffn-dim", "--causal",
    "--scale", "--dropout", "--seed", "--backend", "--per-head-weights", "--need-weights", "--add-zero-attn",
    "--padding", "--norm-first", "--activation", "--layer-norm-eps", "--repeat", "--threads", "--tolerance",
    "--help", "--tokens", "--head", "--all-heads", "--batch-index", "--function", "--format", "--target", "--json",
    "--dump-after", "--cpu", "--sm"};
// "@x" is the file x in the input's directory.
const char* const kValues[] = {
    "@a.npy", "@b.npy", "@c.npy", "@w.safetensors", "@out.npy", "@out2.npy", "@", "@/", "@missing/x.npy", "@fifo",
    "@outdir", "0", "1", "2", "3", "4", "8", "-1", "-8", "99999999999999999999", "9223372036854775807",
    "4611686018427387904", "nan", "inf", "1e999", "0.5", "abc", "", "top-left", "bottom-right", "reference", "cpu",
    "cuda", "relu", "gelu", "so", "ll", "nvptx", "int", "memset", "x y z", "all", "x86-64-v2", "80"};
// clang-format on

template <class T, std::size_t N>
const T& pick(const T (&pool)[N], std::uint8_t b) {
  return pool[b % N];
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

/// Input file `name` from the fuzz bytes (see the layout above).
void make_file(const fs::path& p, Bytes& in) {
  const std::uint8_t mode = in.next() % 5;
  if (mode == 0) {
    std::string raw(in.next(), '\0');
    for (char& c : raw) c = static_cast<char>(in.next());
    write(p, raw);
  } else if (mode <= 2) {
    std::vector<std::int64_t> shape(1 + in.next() % 4);
    for (auto& d : shape) {
      const std::uint8_t b = in.next();
      d = b >= 200 ? 32 : b % 8;  // 32: the fixtures' embedding width
    }
    qkv::NdArray a = qkv::NdArray::zeros(mode == 1 ? qkv::DType::f32 : qkv::DType::boolean, shape);
    for (auto& b : a.bytes) b = static_cast<std::byte>(mode == 1 ? in.next() % 4 * 0x10 : in.next() % 2);
    qkv::write_npy(p, a);
  } else {
    const char* fixture = mode == 3 ? "key_padding" : "encoder_relu_post";
    fs::copy_file(fs::path(QKV_FIXTURES_DIR) / fixture / "weights.safetensors", p);
  }
}

/// A private directory for the inputs, removed when the fuzzer exits (never destroyed itself, so
/// the exit handler can still read it).
const fs::path& root() {
  static const fs::path* const r = [] {
    std::string t = (fs::temp_directory_path() / "qkv_fuzz_cli_XXXXXX").string();
    if (!::mkdtemp(t.data())) std::abort();
    return new fs::path(t);
  }();
  static const bool registered = std::atexit([] {
                                   std::error_code ec;
                                   fs::remove_all(*r, ec);
                                 }) == 0;
  (void)registered;
  return *r;
}

bool is_input_flag(const std::string& flag) {
  for (const char* f : {"--weights", "--query", "--key", "--value", "--src", "--tokens-file", "--attn-mask",
                        "--key-padding-mask", "--attn-bias", "--src-mask", "--src-key-padding-mask"})
    if (flag == f) return true;
  return false;
}

[[noreturn]] void finding(const std::string& what) {
  std::fputs(("fuzz_cli: " + what + "\n").c_str(), stderr);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = root() / "in";
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::mkfifo((dir / "fifo").c_str(), 0644);

  Bytes in(data, size);
  const auto& command = pick(kCommands, in.next());
  std::vector<std::string> args{"qkv", command[0]};
  if (*command[1]) args.emplace_back(command[1]);
  const int flags = in.next() % 24;
  for (int i = 0; i < flags; ++i) {
    args.emplace_back(pick(kFlags, in.next()));
    const std::uint8_t v = in.next();
    if (v == 255) continue;  // a flag without a value
    std::string value = pick(kValues, v);
    if (!value.empty() && value[0] == '@') value = (dir / value.substr(1)).string();
    args.push_back(value);
  }
  for (const char* name : {"a.npy", "b.npy", "c.npy", "w.safetensors"}) make_file(dir / name, in);
  // The files the command reads: the values of its input flags. No output may change them.
  std::vector<std::pair<fs::path, std::string>> inputs;
  for (std::size_t i = 2; i + 1 < args.size(); ++i)
    if (is_input_flag(args[i]) && fs::is_regular_file(args[i + 1]))
      inputs.emplace_back(args[i + 1], slurp(args[i + 1]));

  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int code = qkv::cli::run_cli(static_cast<int>(args.size()), argv.data());

  if (code < 0 || code > 2) finding("exit code " + std::to_string(code));
  for (const auto& [path, bytes] : inputs)
    if (!fs::is_regular_file(path) || slurp(path) != bytes) finding("input " + path.string() + " was changed");
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().rfind(".qkv-", 0) == 0) finding("left behind: " + e.path().string());
  return 0;
}
