// libFuzzer target for a Hugging Face model folder's JSON files: config.json (parse_hf_config)
// and, when the input starts with 'I', model.safetensors.index.json (parse_weight_map). Each
// must return a checked result or throw qkv::IoError; any other exception, crash or sanitizer
// report is a finding. Accepted configs are checked for the invariants the model builder needs.
#include <qkv/runtime/hf_checkpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    if (!text.empty() && text.front() == 'I') {
      for (const auto& [name, file] : qkv::parse_weight_map(text.substr(1), "fuzz.index.json"))
        if (file.empty() || file.find('/') != std::string::npos) __builtin_trap();
      return 0;
    }
    const qkv::HfConfig c = qkv::parse_hf_config(text, "fuzz.config.json");
    if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.head_dim <= 0 ||
        (!c.gpt2() && !c.bert() && c.head_dim % 2 != 0) || c.num_attention_heads % c.num_key_value_heads != 0 ||
        c.vocab_size <= 0 || static_cast<std::int64_t>(c.windowed.size()) != c.num_hidden_layers)
      __builtin_trap();
  } catch (const qkv::IoError&) {
    return 0;  // rejected input: expected
  }
  return 0;
}
