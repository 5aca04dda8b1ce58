// libFuzzer target for `qkv train --resume`'s trainer_state.json (parse_trainer_state): it must
// return a checked state or throw qkv::IoError; any other exception, crash or sanitizer report is
// a finding. Accepted states are checked for the ranges the trainer relies on.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <qkv/runtime/io/files.hpp>

#include "train_state.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const qkv::cli::TrainerState s =
        qkv::cli::parse_trainer_state(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    if (s.options.batch < 1 || s.options.seq < 1 || s.steps < 1 || s.step < 0 || s.eval_every < 1 ||
        s.eval_batches < 1 || !(s.options.val_fraction >= 0 && s.options.val_fraction <= 0.9) ||
        (s.options.optimizer != "adamw" && s.options.optimizer != "sgd"))
      __builtin_trap();
  } catch (const qkv::IoError&) {
    return 0;  // rejected input: expected
  }
  return 0;
}
