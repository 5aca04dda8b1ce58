// The SentencePiece tokenizer of a model folder (tokenizer.hpp). Built with QKV_HAVE_SENTENCEPIECE
// when CMake finds libsentencepiece; otherwise open() says how to get it.
#include "tokenizer.hpp"

#include <exception>
#include <string>

#include <qkv/runtime/io/array.hpp>

#if QKV_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace qkv::cli {

#if QKV_HAVE_SENTENCEPIECE
struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};
bool Tokenizer::available() { return true; }
#else
struct Tokenizer::Impl {};
bool Tokenizer::available() { return false; }
#endif

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::open(const std::filesystem::path& model_dir, std::int64_t vocab) {
  const std::filesystem::path file = model_dir / "tokenizer.model";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw IoError("--prompt: " + file.string() +
                  ": no SentencePiece tokenizer.model in the model folder (give token ids with --prompt-ids)");
#if QKV_HAVE_SENTENCEPIECE
  auto impl = std::make_unique<Impl>();
  // libsentencepiece reports most bad files by its status, but some by throwing (its trie builder
  // throws on an empty piece): both are this one line.
  std::string why;
  try {
    const auto status = impl->sp.Load(file.string());
    if (!status.ok()) why = status.ToString();
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) throw IoError("--prompt: " + file.string() + ": not a SentencePiece model (" + why + ")");
  if (impl->sp.GetPieceSize() > vocab)
    throw IoError("--prompt: " + file.string() + ": the tokenizer has " + std::to_string(impl->sp.GetPieceSize()) +
                  " pieces, more than the model's vocabulary of " + std::to_string(vocab));
  return Tokenizer(std::move(impl));
#else
  (void)vocab;
  throw IoError(
      "--prompt: this qkv was built without SentencePiece (install libsentencepiece-dev and rebuild, or "
      "give token ids with --prompt-ids)");
#endif
}

std::vector<std::int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<std::int64_t> out;
#if QKV_HAVE_SENTENCEPIECE
  if (impl_->sp.bos_id() >= 0) out.push_back(impl_->sp.bos_id());
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw IoError("--prompt: the text cannot be encoded (" + status.ToString() + ")");
  out.insert(out.end(), ids.begin(), ids.end());
#else
  (void)text;
#endif
  return out;
}

std::string Tokenizer::decode(std::span<const std::int64_t> ids) const {
  std::string text;
#if QKV_HAVE_SENTENCEPIECE
  std::vector<int> v;
  for (std::int64_t id : ids)
    if (id >= 0 && id < impl_->sp.GetPieceSize()) v.push_back(static_cast<int>(id));
  const auto status = impl_->sp.Decode(v, &text);
  if (!status.ok()) throw IoError("the generated ids cannot be decoded (" + status.ToString() + ")");
#else
  (void)ids;
#endif
  return text;
}

}  // namespace qkv::cli
