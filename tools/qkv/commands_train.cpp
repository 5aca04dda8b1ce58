// qkv train: a Hugging Face decoder (llama-family or gpt2) trained on a text file — forward,
// reverse mode and the optimizer as one compiled graph (models.hpp, build_training_step), batches
// drawn from the corpus by (seed, step), checkpoints a Hugging Face loader reads.
//
// What makes a resumed run equal an uninterrupted one bit for bit: the batch of step s depends on
// the seed and s alone (Philox, no generator state to save); the weights and the optimizer's
// moments are saved as they are (f32); the learning rate is a function of the step; the step graph
// is the same graph (hence the same compiled code), and the CPU kernels' results do not depend on
// the thread count.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <optional>
#include <type_traits>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <qkv/ir/hash.hpp>
#include <qkv/runtime/hf_checkpoint.hpp>
#include <qkv/runtime/io/files.hpp>
#include <qkv/runtime/io/json_depth.hpp>
#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/rng.hpp>

#include "commands.hpp"
#include "loss_plot.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"
#include "tokenizer.hpp"
#include "train_state.hpp"

namespace qkv::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "qkv-train 1";

// --- the corpus ---------------------------------------------------------------------------------

/// The text as tokens — its bytes (id = the byte), or a SentencePiece tokenizer's pieces — the
/// last val_fraction of them held out.
struct Corpus {
  std::vector<std::int64_t> ids;
  std::uint64_t text_bytes = 0;
  std::uint64_t hash = 0;     // FNV-1a 64 of the text: a resumed run must see the same text
  std::size_t train_end = 0;  // [0, train_end) trains, [train_end, size) validates
  const char* unit = "bytes";
};

std::uint64_t fnv1a(std::span<const std::byte> bytes) { return Fnv1a().bytes(bytes.data(), bytes.size()).value(); }

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Corpus read_corpus(const std::string& path, std::int64_t seq, double val_fraction, const Tokenizer* tokenizer) {
  const InputFile file = InputFile::open(path);  // a regular file: a FIFO, directory or device is refused
  require_memory(file.size() * (tokenizer ? 2 : 9), "reading --data");
  const std::vector<std::byte> raw = file.read_all(file.size(), "--data");
  if (raw.empty()) throw IoError("--data " + path + ": the file is empty; qkv train needs text to learn from");
  if (const auto nul = std::find(raw.begin(), raw.end(), std::byte{0}); nul != raw.end())
    throw IoError("--data " + path + ": a NUL byte at offset " + std::to_string(nul - raw.begin()) +
                  ": this is a binary file, not text");
  Corpus c;
  c.text_bytes = raw.size();
  c.hash = fnv1a(raw);
  if (tokenizer) {
    c.ids = tokenizer->encode(std::string(reinterpret_cast<const char*>(raw.data()), raw.size()));
    c.unit = "tokens";
  } else {
    c.ids.reserve(raw.size());
    for (const std::byte b : raw) c.ids.push_back(static_cast<std::uint8_t>(b));
  }
  const auto n = static_cast<std::int64_t>(c.ids.size());
  const auto val = static_cast<std::int64_t>(std::floor(static_cast<double>(n) * val_fraction));
  c.train_end = static_cast<std::size_t>(n - val);
  // A window is seq tokens and, shifted by one, their targets: seq + 1 tokens.
  if (static_cast<std::int64_t>(c.train_end) < seq + 1)
    throw IoError("--data " + path + ": " + std::to_string(c.train_end) + " " + c.unit + " to train on" +
                  (val ? " (after holding out " + std::to_string(val) + " for validation)" : std::string()) +
                  ", fewer than --seq + 1 = " + std::to_string(seq + 1));
  return c;
}

/// tokens, positions, targets [B, L] for windows starting at `starts`, set in `feeds` (beside the
/// weights, which every run then reads where they are).
void set_windows(Feeds& feeds, const Corpus& c, const std::vector<std::size_t>& starts, std::int64_t seq) {
  const auto B = static_cast<std::int64_t>(starts.size());
  NdArray tokens = NdArray::zeros(DType::i64, {B, seq}), positions = tokens, targets = tokens;
  auto t = tokens.as<std::int64_t>(), p = positions.as<std::int64_t>(), y = targets.as<std::int64_t>();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < seq; ++i) {
      const auto k = static_cast<std::size_t>(b * seq + i);
      const std::size_t at = starts[static_cast<std::size_t>(b)] + static_cast<std::size_t>(i);
      t[k] = c.ids[at];
      y[k] = c.ids[at + 1];
      p[k] = i;
    }
  feeds["tokens"] = std::move(tokens);
  feeds["positions"] = std::move(positions);
  feeds["targets"] = std::move(targets);
}

/// The windows of training step `step` (1-based): row b starts at a Philox draw of (seed; step, b),
/// uniform over the training part.
std::vector<std::size_t> batch_starts(const Corpus& c, std::uint64_t seed, std::int64_t step, std::int64_t batch,
                                      std::int64_t seq) {
  const std::uint64_t span = c.train_end - static_cast<std::size_t>(seq);  // starts 0 .. span - 1
  std::vector<std::size_t> starts;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto r = philox4x32({static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32),
                               static_cast<std::uint32_t>(b), 0x7261696eU /* "rain" */},
                              seed);
    const std::uint64_t u = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
    starts.push_back(static_cast<std::size_t>(u % span));
  }
  return starts;
}

/// The validation windows: consecutive, non-overlapping, from the held-out part; at most `max`.
std::vector<std::size_t> validation_starts(const Corpus& c, std::int64_t seq, std::int64_t max) {
  std::vector<std::size_t> starts;
  for (std::size_t at = c.train_end;
       at + static_cast<std::size_t>(seq) < c.ids.size() && static_cast<std::int64_t>(starts.size()) < max;
       at += static_cast<std::size_t>(seq))
    starts.push_back(at);
  return starts;
}

// --- the options a run keeps --------------------------------------------------------------------

json to_json(const Hyper& h) {
  return {{"optimizer", h.optimizer},
          {"schedule", h.schedule},
          {"lr", h.lr},
          {"min_lr", h.min_lr},
          {"warmup", h.warmup},
          {"weight_decay", h.weight_decay},
          {"beta1", h.beta1},
          {"beta2", h.beta2},
          {"eps", h.eps},
          {"momentum", h.momentum},
          {"max_grad_norm", h.max_grad_norm},
          {"label_smoothing", h.label_smoothing},
          {"val_fraction", h.val_fraction},
          {"batch", h.batch},
          {"accumulate", h.accumulate},
          {"dtype", h.dtype},
          {"seq", h.seq},
          {"seed", h.seed}};
}

/// The learning rate of step `step` (1-based) of `steps`: linear warmup from lr / warmup to lr,
/// then constant or a half cosine down to min_lr at the last step.
double lr_at(const Hyper& h, std::int64_t step, std::int64_t steps) {
  if (step <= h.warmup) return h.lr * static_cast<double>(step) / static_cast<double>(h.warmup);
  if (h.schedule == "constant") return h.lr;
  const double progress =
      static_cast<double>(step - h.warmup) / static_cast<double>(std::max<std::int64_t>(1, steps - h.warmup));
  return h.min_lr + 0.5 * (h.lr - h.min_lr) * (1.0 + std::cos(std::numbers::pi * std::min(1.0, progress)));
}

/// The flags given on the command line over `h` (a fresh run), or checked against it (a resumed
/// run: a flag that would change the numbers is refused).
void apply(Hyper& h, const Train& f, bool resumed) {
  auto set = [&](const char* flag, auto& field, const auto& given) {
    if (!given) return;
    if (resumed && field != *given)
      throw UsageError(std::string(flag) + " differs from the run being resumed (its trainer_state.json has " +
                       json(field).dump() + "); a resumed run keeps its settings");
    field = *given;
  };
  set("--optimizer", h.optimizer, f.optimizer);
  set("--schedule", h.schedule, f.schedule);
  set("--lr", h.lr, f.lr);
  if (!resumed && f.lr && !f.min_lr) h.min_lr = *f.lr / 10;
  set("--min-lr", h.min_lr, f.min_lr);
  set("--warmup", h.warmup, f.warmup);
  set("--weight-decay", h.weight_decay, f.weight_decay);
  set("--beta1", h.beta1, f.beta1);
  set("--beta2", h.beta2, f.beta2);
  set("--eps", h.eps, f.eps);
  set("--momentum", h.momentum, f.momentum);
  set("--max-grad-norm", h.max_grad_norm, f.max_grad_norm);
  set("--label-smoothing", h.label_smoothing, f.label_smoothing);
  set("--val-fraction", h.val_fraction, f.val_fraction);
  set("--batch", h.batch, f.batch);
  set("--accumulate", h.accumulate, f.accumulate);
  set("--dtype", h.dtype, f.dtype);
  set("--seq", h.seq, f.seq);
  set("--seed", h.seed, f.seed);
}

/// j[key], checked: present, of the type, in [lo, hi] (IoError naming the key otherwise).
template <class T>
T value_at(const json& j, const char* key, T lo, T hi) {
  const auto it = j.find(key);
  if (it == j.end()) throw IoError(std::string("no `") + key + "`");
  const bool typed = std::is_floating_point_v<T> ? it->is_number()
                     : std::is_unsigned_v<T>     ? it->is_number_unsigned()
                                                 : it->is_number_integer();
  if (!typed) throw IoError(std::string("`") + key + "` is a " + it->type_name() + ", not a number of its kind");
  const T v = it->get<T>();
  if (!(v >= lo && v <= hi)) throw IoError(std::string("`") + key + "` is out of range: " + it->dump());
  return v;
}

/// j[key]: a string, one of `allowed` (none given: any of at most 64 characters).
std::string name_at(const json& j, const char* key, std::initializer_list<const char*> allowed = {}) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) throw IoError(std::string("`") + key + "` is missing or not a string");
  const std::string v = it->get<std::string>();
  if (allowed.size() == 0 && v.size() <= 64) return v;
  for (const char* a : allowed)
    if (v == a) return v;
  throw IoError(std::string("`") + key + "` is not one of its names");
}

Hyper hyper_from(const json& j) {
  if (!j.is_object()) throw IoError("`options` is not an object");
  constexpr double kBig = 1e30;
  Hyper h;
  h.optimizer = name_at(j, "optimizer", {"adamw", "sgd"});
  h.schedule = name_at(j, "schedule", {"cosine", "constant"});
  h.lr = value_at(j, "lr", -kBig, kBig);
  h.min_lr = value_at(j, "min_lr", -kBig, kBig);
  h.weight_decay = value_at(j, "weight_decay", -kBig, kBig);
  h.beta1 = value_at(j, "beta1", 0.0, 1.0);
  h.beta2 = value_at(j, "beta2", 0.0, 1.0);
  h.eps = value_at(j, "eps", -kBig, kBig);
  h.momentum = value_at(j, "momentum", 0.0, 1.0);
  h.max_grad_norm = value_at(j, "max_grad_norm", 0.0, kBig);
  h.label_smoothing = value_at(j, "label_smoothing", 0.0, 1.0);
  h.val_fraction = value_at(j, "val_fraction", 0.0, 0.9);
  h.warmup = value_at<std::int64_t>(j, "warmup", 0, std::numeric_limits<std::int64_t>::max());
  h.batch = value_at<std::int64_t>(j, "batch", 1, std::int64_t{1} << 20);
  if (j.contains("accumulate"))  // states written before --accumulate: 1
    h.accumulate = value_at<std::int64_t>(j, "accumulate", 1, std::int64_t{1} << 20);
  if (j.contains("dtype")) {  // states written before --dtype: f32
    if (!j["dtype"].is_string() || (j["dtype"] != "f32" && j["dtype"] != "bf16"))
      throw IoError("`dtype` must be \"f32\" or \"bf16\"");
    h.dtype = j["dtype"].get<std::string>();
  }
  h.seq = value_at<std::int64_t>(j, "seq", 1, std::int64_t{1} << 24);
  h.seed = value_at<std::uint64_t>(j, "seed", 0, std::numeric_limits<std::uint64_t>::max());
  return h;
}

TrainSpec spec_of(const Hyper& h) {
  TrainSpec s;
  s.sgd = h.optimizer == "sgd";
  s.adamw = {.beta1 = h.beta1, .beta2 = h.beta2, .eps = h.eps, .weight_decay = h.weight_decay};
  s.sgd_options = {.momentum = h.momentum, .weight_decay = h.weight_decay};
  s.step = {.max_grad_norm = h.max_grad_norm};
  s.loss = {.ignore_index = -100, .label_smoothing = h.label_smoothing};
  s.compute = h.dtype == "bf16" ? DType::bf16 : DType::f32;
  return s;
}

// --- weights ------------------------------------------------------------------------------------

/// Hugging Face's initialisation (PreTrainedModel._init_weights of LlamaForCausalLM and
/// GPT2LMHeadModel): matrices and embeddings normal(0, 0.02), GPT-2's residual projections
/// (c_proj) normal(0, 0.02 / sqrt(2 · layers)), norm weights 1, biases 0. Philox-based, keyed by
/// the seed: the same weights on every machine.
Feeds initial_weights(const HfConfig& c, std::uint64_t seed) {
  Feeds w;
  std::uint32_t index = 0;
  for (const WeightShape& ws : hf_weight_shapes(c)) {
    NdArray a = NdArray::zeros(DType::f32, ws.shape);
    auto v = a.as<float>();
    const bool bias = ws.name.ends_with(".bias");
    if (!bias && ws.shape.size() == 1) {
      std::fill(v.begin(), v.end(), 1.0f);
    } else if (!bias) {
      const double sd = c.gpt2() && ws.name.ends_with("c_proj.weight")
                            ? 0.02 / std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers))
                            : 0.02;
      for (std::size_t i = 0; i < v.size(); i += 2) {
        const auto r = philox4x32(
            {static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), index, 0x696e6974U /* "init" */},
            seed);
        // Box–Muller from two uniforms in (0, 1].
        const double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967296.0,
                     u2 = static_cast<double>(r[1]) / 4294967296.0;
        const double rad = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * std::numbers::pi * u2;
        v[i] = static_cast<float>(sd * rad * std::cos(th));
        if (i + 1 < v.size()) v[i + 1] = static_cast<float>(sd * rad * std::sin(th));
      }
    }
    w[ws.name] = std::move(a);
    ++index;
  }
  return w;
}

/// A safetensors file's tensors `names` (each prefixed by `prefix` in the file) as f32 arrays of
/// the shapes given; IoError naming the file and the tensor otherwise. Copied, not windows onto
/// the file (as every tensor training reads: each step writes all of them in place, and a
/// window's pages would each be copied at the first write, 4 KiB at a time).
void load_tensors(Feeds& into, const fs::path& file, const std::vector<WeightShape>& want, const std::string& prefix) {
  const SafetensorsFile f = SafetensorsFile::open(file, /*windows=*/false);
  for (const WeightShape& ws : want) {
    if (!f.contains(prefix + ws.name))
      throw IoError(file.string() + ": no tensor `" + prefix + ws.name + "`: not a checkpoint of this run");
    NdArray a = f.load(prefix + ws.name);
    if (a.shape != ws.shape)
      throw IoError(file.string() + ": `" + prefix + ws.name + "` is " + shape_to_string(a.shape) +
                    ", the model's is " + shape_to_string(ws.shape));
    if (a.dtype != DType::f32) a = NdArray::from_f32(a.to_f32(), a.shape);
    into[ws.name] = std::move(a);
  }
}

// --- Ctrl-C -------------------------------------------------------------------------------------

std::atomic<int> g_stop{0};
struct sigaction g_previous[2];  // SIGINT, SIGTERM as they were

void on_stop_signal(int signal) {
  if (g_stop.fetch_add(1) == 0) {
    const char msg[] = "\nqkv: stopping after this step, then saving (Ctrl-C again to quit without saving)\n";
    (void)!::write(2, msg, sizeof msg - 1);
    return;
  }
  // The second signal: what it did before (remove what is staged, end the process).
  const struct sigaction& prev = g_previous[signal == SIGINT ? 0 : 1];
  sigaction(signal, &prev, nullptr);
  std::raise(signal);
}

/// While it lives, the first SIGINT / SIGTERM asks the loop to stop at the end of a step.
class StopOnSignal {
 public:
  StopOnSignal() {
    g_stop = 0;
    struct sigaction on{};
    on.sa_handler = on_stop_signal;
    sigemptyset(&on.sa_mask);
    for (int k = 0; k < 2; ++k) {
      sigaction(kSignals[k], nullptr, &g_previous[k]);
      if (g_previous[k].sa_handler != SIG_IGN) sigaction(kSignals[k], &on, nullptr);
    }
  }
  ~StopOnSignal() {
    for (int k = 0; k < 2; ++k) sigaction(kSignals[k], &g_previous[k], nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  [[nodiscard]] static bool requested() { return g_stop.load() > 0; }

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
};

// --- the run ------------------------------------------------------------------------------------

std::string duration(double s) {
  char buf[32];
  const auto t = static_cast<long long>(std::llround(std::max(0.0, s)));
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

heatmap::Image loss_plot(const History& h, const std::string& title) {
  heatmap::Series train{"train", {31, 119, 180}, {}, false}, val{"validation", {214, 39, 40}, {}, true};
  for (const auto& r : h.train) train.points.emplace_back(r[0], r[1]);
  for (const auto& r : h.val) val.points.emplace_back(r[0], r[1]);
  std::vector<heatmap::Series> series{train};
  if (!val.points.empty()) series.push_back(val);
  return heatmap::render_lines(series, title, "step", "loss");
}

}  // namespace

TrainerState parse_trainer_state(std::string_view text, const std::string& what) {
  try {
    if (const auto at = json_text::too_deep(text))
      throw IoError("nests arrays or objects deeper than " + std::to_string(json_text::kMaxDepth) +
                    " levels (at byte " + std::to_string(*at) + ")");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception&) {
      throw IoError("not valid JSON");
    }
    if (!j.is_object()) throw IoError("not a JSON object");
    if (!j.contains("format") || j.at("format") != kFormat)
      throw IoError("`format` is not \"" + std::string(kFormat) + "\" (not a qkv train state)");
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    TrainerState st;
    if (!j.contains("options")) throw IoError("no `options`");
    st.options = hyper_from(j.at("options"));
    st.step = value_at<std::int64_t>(j, "step", 0, kMax);
    st.steps = value_at<std::int64_t>(j, "steps", 1, kMax);
    st.eval_every = value_at<std::int64_t>(j, "eval_every", 1, kMax);
    st.eval_batches = value_at<std::int64_t>(j, "eval_batches", 1, std::int64_t{1} << 20);
    if (!j.contains("data") || !j.at("data").is_object()) throw IoError("no `data` object");
    st.data_bytes = value_at<std::uint64_t>(j.at("data"), "bytes", 0, std::numeric_limits<std::uint64_t>::max());
    st.data_fnv1a64 = name_at(j.at("data"), "fnv1a64");
    st.tokenizer = name_at(j, "tokenizer");
    if (st.tokenizer != "bytes" && st.tokenizer != "sentencepiece")
      throw IoError("`tokenizer` is neither \"bytes\" nor \"sentencepiece\"");
    if (st.tokenizer == "sentencepiece") st.tokenizer_fnv1a64 = name_at(j, "tokenizer_fnv1a64");
    if (!j.contains("history") || !j.at("history").is_object()) throw IoError("no `history` object");
    const json& hist = j.at("history");
    for (const char* key : {"train", "val"})
      if (!hist.contains(key) || !hist.at(key).is_array())
        throw IoError(std::string("history has no `") + key + "` array");
    for (const json& r : hist.at("train")) {
      if (!r.is_array() || r.size() != 4 ||
          !std::all_of(r.begin(), r.end(), [](const json& x) { return x.is_number(); }))
        throw IoError("history.train holds an entry that is not 4 numbers");
      st.history.train.push_back(r.get<std::array<double, 4>>());
    }
    for (const json& r : hist.at("val")) {
      if (!r.is_array() || r.size() != 2 ||
          !std::all_of(r.begin(), r.end(), [](const json& x) { return x.is_number(); }))
        throw IoError("history.val holds an entry that is not 2 numbers");
      st.history.val.push_back(r.get<std::array<double, 2>>());
    }
    return st;
  } catch (const IoError& e) {
    throw IoError(what + ": " + e.what());
  }
}

namespace {
/// Every step runs the compiled graph, which allocates its scratch arena afresh: hundreds of MB
/// (the new weights and moments go into arrays kept between steps: `spare` in train()). glibc
/// maps each large block with mmap and unmaps it on free, so every step page-faulted all of that
/// memory in again — half of a step's time on a VM, in the kernel's fault path. Served from the
/// heap and kept instead, freed blocks are reused without a fault: 848 → 1 600–1 900 tokens/s on
/// a 2-layer GPT-2 of width 384 (batch 8 × 256, 2 threads), at a peak resident memory of 435–650
/// MB instead of 426 (the heap fragments).
void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);              // large blocks from the heap, not one mapping each
  mallopt(M_TRIM_THRESHOLD, 1 << 30);  // the heap's free top kept between steps (up to 1 GiB)
  mallopt(M_TOP_PAD, 64 << 20);        // and grown 64 MiB at a time
}
}  // namespace

int train(const Train& f) {
  keep_freed_memory();
  if (f.config.empty() == f.model.empty() && f.resume.empty())
    throw UsageError("give the model as --config config.json (random weights) or --model DIR (a checkpoint)");
  if (!f.resume.empty() && !(f.config.empty() && f.model.empty()))
    throw UsageError("--resume DIR continues a run from its own checkpoint; leave out --config and --model");
  if (f.backend == Backend::cuda) throw UsageError("qkv train runs on the CPU (--backend cpu or reference)");
  const fs::path out = f.out;

  // The model and where training starts.
  std::string config_text;
  fs::path model_dir;
  Hyper h;
  std::int64_t done = 0;  // steps taken before this process
  History history;
  std::optional<TrainerState> resumed;
  if (!f.resume.empty()) {
    model_dir = f.resume;
    const fs::path state_path = model_dir / "trainer_state.json";
    const std::vector<std::byte> text =
        InputFile::open(state_path).read_all(std::uint64_t{1} << 30, "trainer_state.json");
    resumed = parse_trainer_state(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                                  state_path.string());
    h = resumed->options;
    done = resumed->step;
    history = resumed->history;
  } else {
    model_dir = f.model.empty() ? fs::path(f.config).parent_path() : fs::path(f.model);
  }
  apply(h, f, !f.resume.empty());
  const std::int64_t steps = f.steps.value_or(resumed ? resumed->steps : 100);
  if (steps <= done)
    throw UsageError("--steps " + std::to_string(steps) + ": the run being resumed has taken " + std::to_string(done) +
                     " steps already");
  if (h.optimizer != "adamw" && h.optimizer != "sgd") throw UsageError("--optimizer: adamw or sgd");
  if (h.schedule != "cosine" && h.schedule != "constant") throw UsageError("--schedule: cosine or constant");

  const fs::path config_path = f.config.empty() ? model_dir / "config.json" : fs::path(f.config);
  {
    const InputFile cf = InputFile::open(config_path);
    const std::vector<std::byte> text = cf.read_all(std::uint64_t{1} << 24, "config.json");
    config_text.assign(reinterpret_cast<const char*>(text.data()), text.size());
  }
  const HfConfig c = parse_hf_config(config_text, config_path.string());
  if (c.bert()) throw UsageError("qkv train trains decoders (llama, qwen2, mistral, gpt2); this config is bert's");
  // The tokens: bytes, or a SentencePiece model's pieces — a resumed run's own, kept with it.
  std::optional<Tokenizer> tokenizer;
  {
    fs::path file = f.tokenizer;
    if (resumed && resumed->tokenizer == "bytes" && !file.empty())
      throw UsageError("--tokenizer: the run being resumed trained on the text's bytes; it goes on with them");
    if (resumed && resumed->tokenizer == "sentencepiece" && file.empty()) file = model_dir / "tokenizer.model";
    if (!file.empty()) tokenizer = Tokenizer::open_file(file, c.vocab_size, "--tokenizer");
    if (resumed && tokenizer && hex(fnv1a(tokenizer->model_bytes())) != resumed->tokenizer_fnv1a64)
      throw UsageError("--tokenizer " + file.string() + ": not the tokenizer the run being resumed used (FNV-1a " +
                       resumed->tokenizer_fnv1a64 + ")");
  }
  if (!tokenizer && c.vocab_size < 256)
    throw UsageError(config_path.string() + ": vocab_size " + std::to_string(c.vocab_size) +
                     ": the byte-level tokenizer needs 256 ids (one per byte value)");
  if (h.seq > c.max_position_embeddings)
    throw UsageError("--seq " + std::to_string(h.seq) + " exceeds max_position_embeddings (" +
                     std::to_string(c.max_position_embeddings) + ") of the model");

  // Outputs: --out is a folder of checkpoints. It may be the folder being resumed (the files are
  // read whole first and replaced atomically), never the corpus or the --model folder.
  {
    std::error_code ec;
    if (fs::exists(out, ec) && !fs::is_directory(out, ec))
      throw OutputRefused("--out " + out.string() + " is a file, not a folder for checkpoints");
    if (!f.model.empty() && fs::exists(out, ec) && fs::equivalent(out, f.model, ec))
      throw OutputRefused("--out " + out.string() +
                          " is the --model folder: training would replace its weights; give another folder (or "
                          "--resume a run there)");
  }
  // Every output is checked now (a folder that cannot be written, a file where the folder should
  // be), not after hours of training.
  auto declare_outputs = [&](OutputGroup& outputs) {
    protect_inputs(outputs, {{f.data, "--data"}});
    std::error_code ec;  // the tokenizer a resumed run carries is rewritten in place, the same bytes
    if (!f.tokenizer.empty() && !fs::equivalent(f.tokenizer, out / "tokenizer.model", ec))
      protect_inputs(outputs, {{f.tokenizer, "--tokenizer"}});
    outputs.add_directory(out, "--out");
    std::vector<std::size_t> files;
    for (const char* name : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"})
      files.push_back(outputs.add_file(out / name, "--out"));
    if (tokenizer) files.push_back(outputs.add_file(out / "tokenizer.model", "--out"));
    if (!f.log_json.empty()) files.push_back(outputs.add_file(f.log_json, "--log-json"));
    if (!f.plot.empty()) files.push_back(outputs.add_file(f.plot, "--plot"));
    return files;
  };
  {
    OutputGroup check_outputs;  // staging a file tries the folder; the group removes it again
    for (const std::size_t i : declare_outputs(check_outputs)) (void)check_outputs.staging_path(i);
  }
  const Corpus corpus = read_corpus(f.data, h.seq, h.val_fraction, tokenizer ? &*tokenizer : nullptr);
  if (resumed && (resumed->data_bytes != corpus.text_bytes || resumed->data_fnv1a64 != hex(corpus.hash)))
    throw IoError("--data " + f.data + ": not the text the run being resumed trained on (" +
                  std::to_string(resumed->data_bytes) + " bytes, FNV-1a " + resumed->data_fnv1a64 + ")");

  // Weights and optimizer state.
  const TrainSpec spec = spec_of(h);
  // One graph per step, or with --accumulate N two: the gradients of each micro-batch, summed,
  // then the optimizer step on the sum.
  TrainGraph tg;
  AccumulatingTrainGraphs acc;
  if (h.accumulate > 1)
    acc = build_accumulating_training_step(c, spec, h.accumulate);
  else
    tg = build_training_step(c, spec);
  const TrainingStep& ts = h.accumulate > 1 ? acc.step : tg.step;
  const std::vector<WeightShape> shapes = hf_weight_shapes(c);
  Feeds feeds;
  {
    const Activity reading("reading the model");
    if (!f.config.empty()) {
      feeds = initial_weights(c, h.seed);
    } else if (!f.model.empty()) {
      const HfCheckpoint ck = HfCheckpoint::open(f.model, /*windows=*/false);  // as load_tensors
      for (const auto& name : ck.names()) {
        NdArray a = ck.load(name);
        feeds[name] = a.dtype == DType::f32 ? std::move(a) : NdArray::from_f32(a.to_f32(), a.shape);
      }
    } else {
      load_tensors(feeds, model_dir / "model.safetensors", shapes, "");
    }
    std::vector<WeightShape> state;
    for (const auto& s : ts.state)
      for (const WeightShape& ws : shapes) state.push_back({s + "." + ws.name, ws.shape});
    if (resumed) {
      load_tensors(feeds, model_dir / "optimizer.safetensors", state, "");
    } else {
      for (const WeightShape& ws : state) feeds[ws.name] = NdArray::zeros(DType::f32, ws.shape);
    }
  }
  std::vector<std::string> state_names;
  for (const auto& s : ts.state)
    for (const auto& p : ts.params) state_names.push_back(s + "." + p);

  std::uint64_t params = 0;
  for (const auto& p : ts.params) params += static_cast<std::uint64_t>(feeds.at(p).as<float>().size());
  // How often to validate, and on how much: kept by a resumed run unless given again.
  const std::int64_t eval_every =
      f.eval_every.value_or(resumed ? resumed->eval_every : std::max<std::int64_t>(1, steps / 10));
  const std::int64_t eval_batches = f.eval_batches.value_or(resumed ? resumed->eval_batches : 4);
  const std::int64_t save_every = f.save_every.value_or(0);
  const std::int64_t log_every = f.log_every.value_or(std::max<std::int64_t>(1, steps / 50));
  const std::vector<std::size_t> val_starts = validation_starts(corpus, h.seq, eval_batches * h.batch * h.accumulate);
  std::fprintf(stderr,
               "qkv: training a %s model of %.2f M parameters on %zu %s (%zu held out, %zu validation windows): "
               "steps %lld..%lld, batch %lld x %lld tokens%s, %s, lr %g%s\n",
               c.model_type.c_str(), static_cast<double>(params) / 1e6, corpus.ids.size(), corpus.unit,
               corpus.ids.size() - corpus.train_end, val_starts.size(), static_cast<long long>(done + 1),
               static_cast<long long>(steps), static_cast<long long>(h.batch), static_cast<long long>(h.seq),
               h.accumulate > 1 ? (" x " + std::to_string(h.accumulate) + " micro-batches").c_str() : "",
               h.optimizer.c_str(), h.lr, h.dtype == "bf16" ? ", computed in bf16 over f32 weights" : "");

  Graph loss_graph;
  if (!val_starts.empty()) loss_graph = build_causal_lm_loss(c, spec.loss);
  auto validation_loss = [&] {
    double sum = 0;
    std::size_t n = 0;
    for (std::size_t at = 0; at < val_starts.size(); at += static_cast<std::size_t>(h.batch)) {
      std::vector<std::size_t> rows(
          val_starts.begin() + static_cast<std::ptrdiff_t>(at),
          val_starts.begin() +
              static_cast<std::ptrdiff_t>(std::min(val_starts.size(), at + static_cast<std::size_t>(h.batch))));
      set_windows(feeds, corpus, rows, h.seq);  // the next step sets its own
      const RunResult r = run_graph(loss_graph, feeds, f.backend, f.threads);
      sum += static_cast<double>(r.outputs.at("loss").to_f32()[0]) * static_cast<double>(rows.size());
      n += rows.size();
    }
    return sum / static_cast<double>(n);
  };

  // A checkpoint: config.json, model.safetensors, optimizer.safetensors, trainer_state.json in
  // --out, all or none (OutputGroup); with --log-json and --plot beside.
  auto save = [&](std::int64_t step) {
    const Activity writing("writing a checkpoint");
    OutputGroup outputs;
    const std::vector<std::size_t> files = declare_outputs(outputs);
    const std::size_t cfg = files[0], model = files[1], opt = files[2], st = files[3];
    std::optional<std::size_t> tok, log, plot;
    std::size_t next = 4;
    if (tokenizer) tok = files[next++];
    if (!f.log_json.empty()) log = files[next++];
    if (!f.plot.empty()) plot = files[next++];
    if (tok) outputs.write(*tok, {tokenizer->model_bytes()});
    outputs.write(cfg, {std::as_bytes(std::span(config_text))});
    std::map<std::string, NdArray> w, s;
    for (const auto& p : ts.params) w[p] = feeds.at(p);
    for (const auto& n : state_names) s[n] = feeds.at(n);
    const std::vector<std::byte> wb = serialize_safetensors(w, {{"format", "pt"}});
    outputs.write(model, {wb});
    const std::vector<std::byte> sb = serialize_safetensors(s, {{"format", "pt"}});
    outputs.write(opt, {sb});
    json hist = {{"train", history.train}, {"val", history.val}};
    json state = {{"format", kFormat},
                  {"step", step},
                  {"steps", steps},
                  {"model_type", c.model_type},
                  {"parameters", params},
                  {"tokenizer", tokenizer ? "sentencepiece" : "bytes"},
                  {"data", {{"bytes", corpus.text_bytes}, {"fnv1a64", hex(corpus.hash)}}},
                  {"options", to_json(h)},
                  {"eval_every", eval_every},
                  {"eval_batches", eval_batches},
                  {"history", hist}};
    if (tokenizer) state["tokenizer_fnv1a64"] = hex(fnv1a(tokenizer->model_bytes()));
    const std::string text = state.dump(1) + "\n";
    outputs.write(st, {std::as_bytes(std::span(text))});
    if (log) {
      const std::string lt = json{{"step", step}, {"steps", steps}, {"history", hist}}.dump(1) + "\n";
      outputs.write(*log, {std::as_bytes(std::span(lt))});
    }
    if (plot) {
      const auto png = heatmap::encode_png(
          f.plot, loss_plot(history, c.model_type + ", " + std::to_string(params) + " parameters: loss by step"));
      outputs.write(*plot, {std::as_bytes(std::span(png))});
    }
    outputs.commit();
  };

  // The loop.
  const StopOnSignal stop;
  const auto tokens_per_step = static_cast<double>(h.batch * h.accumulate * h.seq);
  double compile_s = 0, steady_s = 0;
  std::int64_t steady_n = 0;
  std::int64_t step = done;
  const auto run_start = std::chrono::steady_clock::now();
  const std::int64_t last_step = std::min(steps, f.stop_at.value_or(steps));
  if (last_step <= done)
    throw UsageError("--stop-at " + std::to_string(last_step) + ": the run being resumed has taken " +
                     std::to_string(done) + " steps already");
  // Each step writes the new weights and moments into a second set of arrays, swapped with the
  // feeds after it: the same two sets serve every step, so none allocates (and page-faults in)
  // hundreds of MB of outputs again.
  Feeds spare;
  Destinations into;
  // One shape every step: the step's code is compiled for it, every size a constant (its loops
  // ran ≈ 14 % faster than code for any batch and length on the 6-layer GPT-2 of the benchmark).
  constexpr auto every_size = codegen::cpu::Specialise::every_size;
  std::vector<std::string> updated = ts.params;
  updated.insert(updated.end(), state_names.begin(), state_names.end());
  for (const auto& n : updated) {
    NdArray& a = spare[n] = NdArray::zeros(DType::f32, feeds.at(n).shape);
    into[n] = &a;
  }
  while (step < last_step && !StopOnSignal::requested()) {
    ++step;
    // The step's rows: batch × accumulate windows, micro-batch m the rows [m·batch, (m+1)·batch)
    // (so --accumulate 2 --batch 4 trains on the rows of --batch 8).
    const std::vector<std::size_t> rows = batch_starts(corpus, h.seed, step, h.batch * h.accumulate, h.seq);
    const double lr = lr_at(h, step, steps);
    feeds["lr"] = NdArray::from_f32({static_cast<float>(lr)}, {});
    feeds["step"] = NdArray::from_f32({static_cast<float>(step)}, {});
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r;
    double loss = 0;
    {
      const Activity running(step == done + 1 ? "compiling and running the first training step" : "training");
      if (h.accumulate == 1) {
        set_windows(feeds, corpus, rows, h.seq);
        if (step == done + 1) require_memory(run_bytes(tg.g, bind_extents(tg.g, feeds), f.backend), "a training step");
        r = run_graph(tg.g, feeds, f.backend, f.threads, into, every_size);
        loss = r.outputs.at("loss").to_f32()[0];
      } else {
        for (const auto& p : ts.params) feeds["grad." + p] = NdArray::zeros(DType::f32, feeds.at(p).shape);
        for (std::int64_t m = 0; m < h.accumulate; ++m) {
          const auto first = rows.begin() + static_cast<std::ptrdiff_t>(m * h.batch);
          set_windows(feeds, corpus, {first, first + static_cast<std::ptrdiff_t>(h.batch)}, h.seq);
          if (step == done + 1 && m == 0)
            require_memory(run_bytes(acc.gradients, bind_extents(acc.gradients, feeds), f.backend),
                           "a training step's gradients");
          RunResult micro = run_graph(acc.gradients, feeds, f.backend, f.threads, {}, every_size);
          loss += static_cast<double>(micro.outputs.at("loss").to_f32()[0]) / static_cast<double>(h.accumulate);
          for (const auto& p : ts.params) feeds["grad." + p] = std::move(micro.outputs.at("grad." + p));
        }
        r = run_graph(acc.update, feeds, f.backend, f.threads, into, every_size);
      }
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step == done + 1) {
      compile_s = dt;
    } else {
      steady_s += dt;
      ++steady_n;
    }
    const double norm = r.outputs.at("grad_norm").to_f32()[0];
    if (!std::isfinite(loss))
      throw std::runtime_error("step " + std::to_string(step) + ": the loss is not finite (" + std::to_string(loss) +
                               "); the last checkpoint is kept — try a smaller --lr or --max-grad-norm");
    for (const auto& n : updated) {
      // (a backend that did not write them in place returned them: Destinations' contract)
      if (auto it = r.outputs.find(n); it != r.outputs.end()) spare.at(n) = std::move(it->second);
      std::swap(feeds.at(n), spare.at(n));
    }
    history.train.push_back({static_cast<double>(step), loss, lr, norm});

    const bool last = step == last_step;
    std::string val_note;
    if (!val_starts.empty() && (step % eval_every == 0 || step == steps)) {
      const double v = validation_loss();
      history.val.push_back({static_cast<double>(step), v});
      char buf[48];
      std::snprintf(buf, sizeof buf, "  val %.4f", v);
      val_note = buf;
    }
    if (step % log_every == 0 || last || step == done + 1 || !val_note.empty()) {
      const double per_step = steady_n ? steady_s / static_cast<double>(steady_n) : dt;
      std::fprintf(stderr, "step %*lld/%lld  loss %.4f%s  lr %.3g  |g| %.3g  %.0f tok/s  ETA %s\n",
                   static_cast<int>(std::to_string(steps).size()), static_cast<long long>(step),
                   static_cast<long long>(steps), loss, val_note.c_str(), lr, norm, tokens_per_step / per_step,
                   duration(per_step * static_cast<double>(steps - step)).c_str());
    }
    if (save_every > 0 && step % save_every == 0 && !last) save(step);
  }
  save(step);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  char rate[64] = "";  // none when the first step was the only one
  if (steady_n)
    std::snprintf(rate, sizeof rate, ", then %.0f tokens/s",
                  tokens_per_step * static_cast<double>(steady_n) / steady_s);
  std::fprintf(stderr,
               "qkv: %s after step %lld of %lld: checkpoint in %s (%.1f s: first step incl. compiling %.1f s%s)\n",
               step < steps ? "stopped" : "done", static_cast<long long>(step), static_cast<long long>(steps),
               out.c_str(), wall, compile_s, rate);
  return StopOnSignal::requested() ? 130 : 0;
}

}  // namespace qkv::cli
