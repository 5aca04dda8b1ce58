// decoder_session.cpp — the KV cache across calls (qkv/runtime/decoder_session.hpp).
#include <qkv/runtime/decoder_session.hpp>

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
  reset();
}

void DecoderSession::reset() { position_ = 0; }  // the rows past position() are never read

NdArray DecoderSession::prefill(const NdArray& tokens) {
  reset();
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
  NdArray positions = NdArray::zeros(DType::i64, {shape_.batch, n});
  auto p = positions.as<std::int64_t>();
  for (std::size_t k = 0; k < p.size(); ++k) p[k] = position_ + static_cast<std::int64_t>(k) % n;
  feeds_["tokens"] = tokens;
  feeds_["positions"] = std::move(positions);
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
