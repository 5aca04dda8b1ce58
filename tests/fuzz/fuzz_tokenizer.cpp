// libFuzzer target for a model folder's tokenizer.model (qkv generate --prompt): the bytes are
// written as <tmp>/tokenizer.model and opened with cli::Tokenizer; a model it accepts encodes and
// decodes a fixed text. Tokenizer::open must return or throw qkv::IoError; any other exception,
// crash or sanitizer report is a finding (in qkv's code or in libsentencepiece's parser).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <qkv/runtime/io/array.hpp>

#include "tokenizer.hpp"

namespace {

const std::filesystem::path& folder() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("qkv_fuzz_tokenizer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(folder() / "tokenizer.model", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const qkv::cli::Tokenizer t = qkv::cli::Tokenizer::open(folder(), 1 << 20);
    const auto ids = t.encode("the cat sat on the mat");
    (void)t.decode(ids);
  } catch (const qkv::IoError&) {
    return 0;  // rejected input: expected
  }
  return 0;
}
