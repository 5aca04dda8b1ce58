// tools/qkv/cli_flags.hpp — the pieces of the command line every command's flags are made of:
// CLI11 validators that say what was wrong in one line (integers in a range, written in decimal;
// finite numbers) and the flags several commands share (--causal, --backend with --cpu,
// --features and --no-cache, --dtype). Included by cli.cpp only: CLI11 costs ~6 s per
// translation unit.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include <qkv/codegen/code_cache.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/target.hpp>

#include "commands.hpp"
#include "run_common.hpp"

namespace qkv::cli::flags {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

/// An integer in [lo, hi], written in decimal (CLI11 alone would clamp 99999999999999999999).
inline CLI::Validator integer_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return {[lo, hi, range](std::string& s) -> std::string {
            std::int64_t v = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec == std::errc::result_out_of_range ||
                (ec == std::errc() && end == s.data() + s.size() && (v < lo || v > hi)))
              return "'" + s + "' is out of range: give an integer in " + range;
            if (ec != std::errc() || end != s.data() + s.size()) return "'" + s + "' is not an integer";
            return "";
          },
          "INT in " + range, "integer_in"};
}

/// A non-negative integer that fits in 64 bits (for seeds).
inline CLI::Validator unsigned_integer() {
  return {[](std::string& s) -> std::string {
            std::uint64_t v = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec == std::errc::result_out_of_range) return "'" + s + "' is larger than 2^64 - 1";
            if (ec != std::errc() || end != s.data() + s.size()) return "'" + s + "' is not a non-negative integer";
            return "";
          },
          "UINT", "unsigned_integer"};
}

/// A finite number (no nan, inf or overflow such as 1e999).
inline CLI::Validator finite_number() {
  return {[](std::string& s) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (s.empty() || end != s.c_str() + s.size()) return "'" + s + "' is not a number";
            if (!std::isfinite(v)) return "'" + s + "' is not a finite number";
            return "";
          },
          "FLOAT", "finite_number"};
}

/// A finite number in [lo, hi] ([lo, hi) when `below_hi`).
inline CLI::Validator number_in(double lo, double hi, bool below_hi = false) {
  std::ostringstream range;
  range << "[" << lo << ", " << hi << (below_hi ? ")" : "]");
  return {[lo, hi, below_hi, r = range.str()](std::string& s) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (s.empty() || end != s.c_str() + s.size()) return "'" + s + "' is not a number";
            if (!std::isfinite(v) || v < lo || v > hi || (below_hi && v == hi))
              return "'" + s + "' is out of range: give a number in " + r;
            return "";
          },
          "FLOAT in " + range.str(), "number_in"};
}

/// --causal [top-left|bottom-right]: a flag with an optional value.
struct CausalFlag {
  std::string value;
  CLI::Option* opt = nullptr;
  void add(CLI::App* app) {
    opt = app->add_option("--causal", value,
                          "Causal mask; with L != S say top-left (PyTorch is_causal) or bottom-right (FlashAttention)")
              ->expected(0, 1);
  }
  [[nodiscard]] std::optional<std::string> get() const {
    if (!opt || opt->count() == 0) return std::nullopt;
    return value;
  }
};

/// --backend, and for the cpu backend the CPU its code is compiled for (--cpu, --features): the
/// code a library emitted for that CPU would run, timed on this host — refused, with the features
/// this CPU lacks, where it would raise SIGILL.
struct BackendFlag {
  std::string value = "cpu";
  std::string cpu, features;
  bool no_cache = false;
  CLI::Option *cpu_opt = nullptr, *features_opt = nullptr;
  void add(CLI::App* app, const std::string& help = "cpu (compiled kernels) | reference (the interpreter) | cuda") {
    app->add_option("--backend", value, help)
        ->check(CLI::IsMember({"reference", "cpu", "cuda"}))
        ->capture_default_str();
    cpu_opt = app->add_option("--cpu", cpu,
                              "cpu backend: compile for this CPU (native | x86-64-v2 | x86-64-v3 | x86-64-v4 | an LLVM "
                              "CPU name; default native), refused if this CPU cannot run its code");
    features_opt = app->add_option("--features", features, "cpu backend: features added or removed, e.g. -avx512f");
    app->add_flag("--no-cache", no_cache,
                  "cpu backend: compile every module afresh, without the code cache ($QKV_CACHE_DIR, else "
                  "$XDG_CACHE_HOME/qkv or ~/.cache/qkv; bounded by $QKV_CACHE_MAX_MB, default 1024)");
  }
  [[nodiscard]] Backend get() const {
    codegen::set_code_cache(no_cache ? std::nullopt : codegen::default_code_cache());
    const Backend b = parse_backend(value);
    if (cpu_opt->count() + features_opt->count() == 0) return b;
    if (b != Backend::cpu) throw UsageError("--cpu and --features go with --backend cpu");
    codegen::HostTarget target;
    try {
      target = codegen::make_target("", cpu.empty() ? "native" : cpu, features);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    try {
      codegen::set_jit_target(target);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());  // this CPU cannot run the code: a failure, not a usage error
    }
    return b;
  }
};

struct DTypeFlag {
  std::string value = "f32";
  void add(CLI::App* app) {
    app->add_option("--dtype", value,
                    "How the model stores its floats: f32 | bf16 | f16 (inputs and weights stored otherwise are "
                    "converted on load, with a note; kernels accumulate in f32)")
        ->check(CLI::IsMember({"f32", "bf16", "f16"}))
        ->capture_default_str();
  }
  [[nodiscard]] DType get() const { return parse_dtype(value); }
};

struct QuantizeFlag {
  std::string value = "none";
  void add(CLI::App* app) {
    app->add_option("--quantize", value,
                    "none | q8 | q4: the linear layers' weights as 8-bit integers (llama.cpp's Q8_0 layout) or 4-bit "
                    "ones (Q4_0's; q8 for a weight whose rows are not whole groups), an f16 scale per 32, quantized "
                    "on load and read as stored by the kernels")
        ->check(CLI::IsMember({"none", "q8", "q4"}))
        ->capture_default_str();
  }
  [[nodiscard]] std::optional<Quant> get() const { return parse_quant(value); }
};

}  // namespace qkv::cli::flags
