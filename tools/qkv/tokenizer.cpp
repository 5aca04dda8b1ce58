// The SentencePiece tokenizer of a model folder (tokenizer.hpp). Built with QKV_HAVE_SENTENCEPIECE
// when CMake finds libsentencepiece; otherwise open() says how to get it.
#include "tokenizer.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <qkv/runtime/io/array.hpp>
#include <qkv/runtime/io/files.hpp>

#if QKV_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace qkv::cli {

#if QKV_HAVE_SENTENCEPIECE
namespace {

// libsentencepiece trusts a model's normalizer tables: a precompiled_charsmap (NormalizerSpec
// field 2) is a uint32 trie size, a Darts-clone double array of that many bytes, then NUL-ended
// replacement strings the trie's values index, and the library walks it without a bounds check.
// So qkv reads the model proto itself and checks every charsmap in it before the library sees
// the bytes: every state the trie can reach from any input, every value, and the number of
// matches along one input (the library keeps 32).

/// Protobuf wire format: calls `field(number, payload)` for each length-delimited field of
/// `msg`, skips the others; false when `msg` is not well-formed.
template <class F>
bool each_bytes_field(std::string_view msg, F&& field) {
  std::size_t at = 0;
  auto varint = [&](std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= msg.size()) return false;
      const auto b = static_cast<unsigned char>(msg[at++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (at < msg.size()) {
    std::uint64_t key = 0, v = 0;
    if (!varint(key)) return false;
    switch (key & 7) {
      case 0:
        if (!varint(v)) return false;
        break;
      case 1:
        if (msg.size() - at < 8) return false;
        at += 8;
        break;
      case 5:
        if (msg.size() - at < 4) return false;
        at += 4;
        break;
      case 2:
        if (!varint(v) || v > msg.size() - at) return false;
        if (!field(key >> 3, msg.substr(at, v))) return false;
        at += v;
        break;
      default:
        return false;  // groups: not in a SentencePiece model
    }
  }
  return true;
}

/// Why the charsmap `blob` is unsafe to hand to libsentencepiece, or "" when it is safe.
std::string charsmap_problem(std::string_view blob) {
  if (blob.empty()) return "";  // no normalization table
  if (blob.size() < 4) return "its normalization table is shorter than its 4-byte size";
  // Real tables are a few hundred KB (nmt_nfkc's ~240 KB); the walk below visits every state
  // once with 256 labels each, so a bound on the size bounds the time.
  if (blob.size() > (16u << 20)) return "its normalization table is larger than 16 MiB";
  std::uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes == 0 || trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4)
    return "its normalization table's trie size (" + std::to_string(trie_bytes) + " bytes) does not fit in its " +
           std::to_string(blob.size()) + " bytes";
  const std::size_t n = trie_bytes / 4;
  std::vector<std::uint32_t> unit(n);
  std::memcpy(unit.data(), blob.data() + 4, trie_bytes);
  const std::string_view text = blob.substr(4 + trie_bytes);
  // Darts-clone's unit: label = u & (1 << 31 | 0xff), has_leaf = bit 8, value = u & ~(1 << 31),
  // offset = (u >> 10) << ((u & (1 << 9)) >> 6).
  auto offset = [](std::uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  // Depth-first over the states (a node's index after its offset), iteratively: colour 1 on the
  // path, 2 done; leaves[s] = the most matches an input can collect from s on.
  std::vector<std::uint8_t> colour(n, 0);
  std::vector<int> leaves(n, 0);
  struct Frame {
    std::size_t state;
    int next_label;
  };
  const std::size_t root = offset(unit[0]);
  if (root >= n) return "its normalization trie points outside itself";
  std::vector<Frame> stack{{root, 0}};
  colour[root] = 1;
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next_label == 256) {
      colour[f.state] = 2;
      const std::size_t done = f.state;
      stack.pop_back();
      if (!stack.empty()) {
        const Frame& parent = stack.back();
        const std::uint32_t u = unit[parent.state ^ static_cast<std::size_t>(parent.next_label - 1)];
        leaves[parent.state] = std::max(leaves[parent.state], leaves[done] + static_cast<int>((u >> 8) & 1));
      }
      continue;
    }
    const auto c = static_cast<std::uint32_t>(f.next_label++);
    const std::size_t at = f.state ^ c;
    if (at >= n) return "its normalization trie points outside itself";
    const std::uint32_t u = unit[at];
    if ((u & (1u << 31 | 0xff)) != c) continue;  // no edge labelled c
    const std::size_t to = at ^ offset(u);
    if (to >= n) return "its normalization trie points outside itself";
    if ((u >> 8) & 1) {  // a match: unit[to]'s value indexes a NUL-ended replacement
      const std::size_t value = unit[to] & ~(1u << 31);
      if (value >= text.size() || text.find('\0', value) == std::string_view::npos)
        return "its normalization table names a replacement outside itself";
    }
    if (colour[to] == 1) return "its normalization trie has a cycle";
    if (colour[to] == 2) {
      leaves[f.state] = std::max(leaves[f.state], leaves[to] + static_cast<int>((u >> 8) & 1));
      continue;
    }
    colour[to] = 1;
    stack.push_back({to, 0});
  }
  if (leaves[root] > 32) return "its normalization trie matches more than 32 rules along one input";
  return "";
}

/// Why the model proto `bytes` is unsafe to load, or "": every precompiled_charsmap of its
/// normalizer_spec (field 3) and denormalizer_spec (field 5), each occurrence (protobuf merges
/// repeated messages, so any of them may be the one the library keeps).
std::string model_problem(std::string_view bytes) {
  std::string why;
  const bool ok = each_bytes_field(bytes, [&](std::uint64_t number, std::string_view spec) {
    if (number != 3 && number != 5) return true;
    return each_bytes_field(spec, [&](std::uint64_t inner, std::string_view blob) {
      if (inner == 2 && why.empty()) why = charsmap_problem(blob);
      return true;
    });
  });
  return ok ? why : "not a well-formed protobuf message";
}

}  // namespace
#endif

#if QKV_HAVE_SENTENCEPIECE
struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::vector<std::byte> bytes;  // the model file, as read
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
  return open_file(file, vocab, "--prompt");
}

Tokenizer Tokenizer::open_file(const std::filesystem::path& file, std::int64_t vocab, const std::string& flag) {
#if QKV_HAVE_SENTENCEPIECE
  auto impl = std::make_unique<Impl>();
  // libsentencepiece reports most bad files by its status, but some by throwing (its trie builder
  // throws on an empty piece): both are this one line.
  std::string why;
  impl->bytes = InputFile::open(file).read_all(256u << 20, "a SentencePiece model");
  const std::string_view proto(reinterpret_cast<const char*>(impl->bytes.data()), impl->bytes.size());
  if (const std::string problem = model_problem(proto); !problem.empty())
    throw IoError(flag + ": " + file.string() + ": not a SentencePiece model qkv can use safely (" + problem + ")");
  try {
    const auto status = impl->sp.LoadFromSerializedProto(proto);
    if (!status.ok()) why = status.ToString();
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) throw IoError(flag + ": " + file.string() + ": not a SentencePiece model (" + why + ")");
  if (impl->sp.GetPieceSize() > vocab)
    throw IoError(flag + ": " + file.string() + ": the tokenizer has " + std::to_string(impl->sp.GetPieceSize()) +
                  " pieces, more than the model's vocabulary of " + std::to_string(vocab));
  return Tokenizer(std::move(impl));
#else
  (void)file;
  (void)vocab;
  throw IoError(flag + ": this qkv was built without SentencePiece (install libsentencepiece-dev and rebuild" +
                (flag == "--prompt" ? ", or give token ids with --prompt-ids)" : ")"));
#endif
}

std::int64_t Tokenizer::pieces() const {
#if QKV_HAVE_SENTENCEPIECE
  return impl_->sp.GetPieceSize();
#else
  return 0;
#endif
}

std::span<const std::byte> Tokenizer::model_bytes() const {
#if QKV_HAVE_SENTENCEPIECE
  return impl_->bytes;
#else
  return {};
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
