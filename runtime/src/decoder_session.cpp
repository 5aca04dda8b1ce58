// decoder_session.cpp — the KV cache across calls (qkv/runtime/decoder_session.hpp).
#include <qkv/runtime/decoder_session.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace qkv {

DecoderSession::DecoderSession(Graph step, Feeds weights, const Shape& shape, Runner run)
    : graph_(std::move(step)), shape_(shape), run_(std::move(run)), feeds_(std::move(weights)) {
  if (shape_.layers <= 0 || shape_.kv_heads <= 0 || shape_.head_dim <= 0 || shape_.batch <= 0 || shape_.capacity <= 0)
    throw std::invalid_argument("DecoderSession: layers, kv_heads, head_dim, batch and capacity must be positive");
  if (!run_) run_ = [](const Graph& g, const Feeds& f, const Destinations&) { return interpret(g, f); };
  // The caches, at their full capacity, once (NdArray::zeros throws IoError when they cannot be
  // sized; std::bad_alloc when there is no memory for them).
  // Each is stored as its input in the step graph is (f32, or bf16 / f16 for a half model).
  auto dtype_of = [&](const std::string& name) {
    for (const Node& n : graph_.nodes())
      if (is_array_leaf(n) && n.name == name)
        return n.dtype == DType::f16 || n.dtype == DType::bf16 ? n.dtype : DType::f32;
    return DType::f32;
  };
  for (std::int64_t i = 0; i < shape_.layers; ++i)
    for (const char* kv : {"k.", "v."}) {
      const std::string name = std::string("cache_") + kv + std::to_string(i);
      NdArray& cache = feeds_[name];
      cache = NdArray::zeros(dtype_of(name), {shape_.batch, shape_.kv_heads, shape_.capacity, shape_.head_dim});
      present_[std::string("present_") + kv + std::to_string(i)] = &cache;
    }
  for (const Node& n : graph_.nodes()) padded_ = padded_ || (is_array_leaf(n) && n.name == "first_key");
  reset();
}

void DecoderSession::reset() {  // the rows past position() are never read
  position_ = 0;
  first_.assign(static_cast<std::size_t>(shape_.batch), 0);
}

NdArray DecoderSession::prefill(const NdArray& tokens, const std::vector<std::int64_t>& first) {
  const std::int64_t n = tokens.shape.size() == 2 ? tokens.shape[1] : 0;
  if (!first.empty()) {
    if (!padded_)
      throw std::invalid_argument(
          "DecoderSession: a left-padded batch needs a step graph that takes first_key "
          "(declare_cached_step<..., StepRows::left_padded>)");
    if (static_cast<std::int64_t>(first.size()) != shape_.batch)
      throw InputError("DecoderSession: " + std::to_string(first.size()) + " first keys for a batch of " +
                       std::to_string(shape_.batch));
    for (const std::int64_t f : first)
      if (f < 0 || f >= n)
        throw InputError("DecoderSession: a row's padding of " + std::to_string(f) + " leaves none of its " +
                         std::to_string(n) + " tokens");
  }
  reset();
  if (!first.empty()) first_ = first;
  return step(tokens);
}

NdArray DecoderSession::decode(const NdArray& tokens) { return step(tokens); }

NdArray DecoderSession::step(const NdArray& tokens) {
  if (tokens.dtype != DType::i32 && tokens.dtype != DType::i64)
    throw InputError("DecoderSession: token ids must be int32 or int64, not " + std::string(dtype_name(tokens.dtype)));
  if (tokens.shape.size() != 2 || tokens.shape[0] != shape_.batch || tokens.shape[1] <= 0)
    throw InputError("DecoderSession: tokens must be [" + std::to_string(shape_.batch) + ", n > 0], not " +
                     shape_to_string(tokens.shape));
  const std::int64_t n = tokens.shape[1];
  if (n > shape_.capacity - position_)
    throw InputError("DecoderSession: " + std::to_string(n) + " more token(s) after position " +
                     std::to_string(position_) + " exceed the cache's capacity of " + std::to_string(shape_.capacity) +
                     " positions");
  // Row b's tokens from first_[b] on at positions 0, 1, ...; its padding at 0 (seen by no query).
  NdArray positions = NdArray::zeros(DType::i64, {shape_.batch, n});
  auto p = positions.as<std::int64_t>();
  for (std::size_t k = 0; k < p.size(); ++k)
    p[k] = std::max<std::int64_t>(
        0, position_ + static_cast<std::int64_t>(k) % n - first_[k / static_cast<std::size_t>(n)]);
  feeds_["tokens"] = tokens;
  feeds_["positions"] = std::move(positions);
  if (padded_) {
    NdArray first = NdArray::zeros(DType::i64, {shape_.batch});
    std::copy(first_.begin(), first_.end(), first.as<std::int64_t>().begin());
    feeds_["first_key"] = std::move(first);
  }
  NdArray past = NdArray::zeros(DType::i64, {});
  past.as<std::int64_t>()[0] = position_;
  feeds_["past_length"] = std::move(past);
  RunResult r = run_(graph_, feeds_, present_);
  for (const auto& [name, cache] : present_)  // a runner that did not write them in place
    if (auto it = r.outputs.find(name); it != r.outputs.end()) *cache = std::move(it->second);
  position_ += n;
  ++steps_;
  return std::move(r.outputs.at("logits"));
}

}  // namespace qkv
