// libFuzzer target for a Hugging Face model folder as a whole (qkv run causal-lm / generate):
// the input is split at the line "@@qkv-file@@" into config.json, model.safetensors.index.json
// and tokenizer.model (a missing or empty part is no file), written into a fresh folder beside
// the two weight shards of the qwen2 fixture, then opened as the CLI opens it: HfCheckpoint::open,
// and the tokenizer with encode and decode. Both must return or throw qkv::IoError; any other
// exception, crash or sanitizer report is a finding. A checkpoint it accepts must list the files
// it read, config.json first, and every one of them must be in the folder (what the CLI protects
// from being overwritten). tests/fuzz/corpus/make_model_folder_corpus.py writes the seeds.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <qkv/runtime/hf_checkpoint.hpp>

#include "tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

const fs::path& folder() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("qkv_fuzz_model_folder_" + std::to_string(::getpid()));
    fs::create_directories(d);
    const fs::path qwen2 = fs::path(QKV_FIXTURES_DIR).parent_path() / "llama_fixtures" / "qwen2";
    for (const auto& e : fs::directory_iterator(qwen2))
      if (e.path().extension() == ".safetensors")
        fs::copy_file(e.path(), d / e.path().filename(), fs::copy_options::overwrite_existing);
    return d;
  }();
  return dir;
}

void put(const fs::path& file, std::string_view bytes) {
  std::error_code ec;
  fs::remove(file, ec);
  if (bytes.empty()) return;
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::string_view kSplit = "\n@@qkv-file@@\n";
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::string_view part[3];
  for (auto& p : part) {
    const auto at = rest.find(kSplit);
    p = rest.substr(0, at);
    rest = at == std::string_view::npos ? std::string_view() : rest.substr(at + kSplit.size());
  }
  put(folder() / "config.json", part[0]);
  put(folder() / "model.safetensors.index.json", part[1]);
  put(folder() / "tokenizer.model", part[2]);
  std::int64_t vocab = 1 << 20;
  try {
    const qkv::HfCheckpoint ck = qkv::HfCheckpoint::open(folder());
    if (ck.files().empty() || ck.files().front().filename() != "config.json") __builtin_trap();
    for (const auto& f : ck.files())
      if (f.parent_path() != folder()) __builtin_trap();
    vocab = ck.config().vocab_size;
  } catch (const qkv::IoError&) {
    // rejected: expected; the tokenizer is still tried on its own
  }
  try {
    const qkv::cli::Tokenizer t = qkv::cli::Tokenizer::open(folder(), vocab);
    (void)t.decode(t.encode("the cat sat on the mat"));
  } catch (const qkv::IoError&) {
    return 0;
  }
  return 0;
}
