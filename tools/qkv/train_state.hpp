// tools/qkv/train_state.hpp — what `qkv train` keeps of a run in trainer_state.json, and its
// reader (commands_train.cpp; fuzzed by tests/fuzz/fuzz_train_state.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::cli {

/// What decides the run's numbers: fixed when the run is resumed.
struct Hyper {
  std::string optimizer = "adamw", schedule = "cosine";
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, momentum = 0.9;
  double max_grad_norm = 1.0, label_smoothing = 0.0, val_fraction = 0.1;
  std::int64_t warmup = 0, batch = 8, seq = 64;
  std::int64_t accumulate = 1;  // micro-batches of `batch` rows per optimizer step
  std::string dtype = "f32";    // the compute dtype over f32 master weights: f32 or bf16
  std::uint64_t seed = 0;
};

struct History {
  std::vector<std::array<double, 4>> train;  // step, loss, lr, grad_norm
  std::vector<std::array<double, 2>> val;    // step, loss
};

/// trainer_state.json: the step reached, the settings, the text trained on, the loss history.
struct TrainerState {
  Hyper options;
  std::int64_t step = 0, steps = 0, eval_every = 1, eval_batches = 1;
  std::uint64_t data_bytes = 0;
  std::string data_fnv1a64;
  std::string tokenizer = "bytes";  // or "sentencepiece": tokenizer.model beside, its FNV-1a below
  std::string tokenizer_fnv1a64;
  History history;
};

/// Reads trainer_state.json's text; IoError of one line naming `what` and the key for anything
/// that is not a state `qkv train` wrote (malformed JSON, nesting deeper than 64, a missing key,
/// a value of the wrong type or out of the flags' ranges).
TrainerState parse_trainer_state(std::string_view text, const std::string& what);

}  // namespace qkv::cli
