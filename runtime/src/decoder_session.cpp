// decoder_session.cpp — the KV cache across calls (qkv/runtime/decoder_session.hpp).
#include <qkv/runtime/decoder_session.hpp>

#include <stdexcept>

namespace qkv {

namespace {
std::string layer_name(const char* what, std::int64_t i) { return what + std::to_string(i); }
}  // namespace

DecoderSession::DecoderSession(Graph step, Feeds weights, const Shape& shape, Runner run)
    : graph_(std::move(step)), shape_(shape), run_(std::move(run)), feeds_(std::move(weights)) {
  if (shape_.layers <= 0 || shape_.kv_heads <= 0 || shape_.head_dim <= 0 || shape_.batch <= 0 || shape_.capacity <= 0)
    throw std::invalid_argument("DecoderSession: layers, kv_heads, head_dim, batch and capacity must be positive");
  if (!run_) run_ = [](const Graph& g, const Feeds& f) { return interpret(g, f); };
  reset();
}

void DecoderSession::reset() {
  for (std::int64_t i = 0; i < shape_.layers; ++i)
    for (const char* kv : {"past_k.", "past_v."})
      feeds_[layer_name(kv, i)] = NdArray::zeros(DType::f32, {shape_.batch, shape_.kv_heads, 0, shape_.head_dim});
  position_ = 0;
}

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
  RunResult r = run_(graph_, feeds_);
  for (std::int64_t i = 0; i < shape_.layers; ++i) {
    feeds_[layer_name("past_k.", i)] = std::move(r.outputs.at(layer_name("present_k.", i)));
    feeds_[layer_name("past_v.", i)] = std::move(r.outputs.at(layer_name("present_v.", i)));
  }
  position_ += n;
  ++steps_;
  return std::move(r.outputs.at("logits"));
}

}  // namespace qkv
