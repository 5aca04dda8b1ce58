// tools/qkv/tokenizer.hpp — a SentencePiece tokenizer.model, for `qkv generate --prompt TEXT`
// (the model folder's) and `qkv train --tokenizer FILE` (an optional dependency: Debian's libsentencepiece-dev; without
// it, or without the file, token ids in and out still work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace qkv::cli {

class Tokenizer {
 public:
  /// Whether this qkv was built with SentencePiece.
  static bool available();
  /// Loads `model_dir`/tokenizer.model. Throws IoError, one line: no such file, a file
  /// SentencePiece cannot read, a vocabulary larger than `vocab` (ids the model cannot embed),
  /// or a qkv built without SentencePiece.
  static Tokenizer open(const std::filesystem::path& model_dir, std::int64_t vocab);
  /// Loads the model file `file`; its problems as open's, the line starting with `flag`.
  static Tokenizer open_file(const std::filesystem::path& file, std::int64_t vocab, const std::string& flag);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// The ids of `text`, after the model's BOS id when it defines one (as Llama's tokenizer adds
  /// it by default).
  [[nodiscard]] std::vector<std::int64_t> encode(const std::string& text) const;
  /// How many ids it yields (0 .. pieces() - 1).
  [[nodiscard]] std::int64_t pieces() const;
  /// The model file's bytes, as read (a training checkpoint carries them).
  [[nodiscard]] std::span<const std::byte> model_bytes() const;
  /// The text of `ids` (control ids such as BOS and EOS decode to nothing).
  [[nodiscard]] std::string decode(std::span<const std::int64_t> ids) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qkv::cli
