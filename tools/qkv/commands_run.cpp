// qkv run mha | sdpa | encoder-layer | encoder: PyTorch's modules on .npy inputs and a
// safetensors state dict, through the reference interpreter.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/ir/grad.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/torch_import.hpp>

#include "commands.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"

namespace qkv::cli {

Backend parse_backend(const std::string& s) {
  if (s == "reference") return Backend::reference;
  if (s == "cpu") return Backend::cpu;
  if (s == "cuda") return Backend::cuda;
  throw UsageError("--backend must be reference, cpu or cuda, not '" + s + "'");
}

codegen::cpu::KernelTuning host_tuning() {
  const codegen::HostTarget host = codegen::jit_target();  // the host, or what --cpu chose
  return codegen::cpu::kernel_tuning(host, host.vector_floats);
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  throw UsageError("--dtype must be f32, bf16 or f16, not '" + s + "'");
}

std::vector<Converted> convert_feeds(const Graph& g, Feeds& feeds) {
  std::vector<Converted> done;
  for (const Node& n : g.nodes()) {
    if (!is_array_leaf(n) || !is_model_float(n.dtype)) continue;
    const auto it = feeds.find(n.name);
    if (it == feeds.end() || it->second.dtype == n.dtype || it->second.dtype == DType::boolean ||
        is_integer(it->second.dtype))
      continue;  // a missing or mistyped feed is the backend's one-line error
    done.push_back({n.name, it->second.dtype});
    it->second = it->second.converted(n.dtype);
  }
  return done;
}

Graph model_as(const Graph& g, DType dtype, Feeds& feeds, const std::vector<Converted>& earlier) {
  Graph out = with_float_dtype(g, dtype);
  std::vector<Converted> done = earlier;
  for (Converted& c : convert_feeds(out, feeds)) done.push_back(std::move(c));
  if (done.empty()) return out;
  std::map<DType, std::vector<std::string>> from;
  for (const auto& c : done) from[c.from].push_back(c.name);
  std::string what;
  for (const auto& [t, names] : from) {
    what +=
        (what.empty() ? "" : "; ") + std::to_string(names.size()) + " stored as " + std::string(dtype_name(t)) + " (";
    for (std::size_t i = 0; i < names.size() && i < 3; ++i) what += (i ? ", " : "") + names[i];
    if (names.size() > 3) what += ", ...";
    what += ")";
  }
  std::fprintf(stderr, "qkv: note: the model computes in %s (--dtype %s); converted on load: %s\n",
               std::string(dtype_name(dtype)).c_str(), std::string(dtype_name(dtype)).c_str(), what.c_str());
  return out;
}

Mods parse_mod_flags(const ModFlags& f, bool alibi, std::int64_t len_q, std::int64_t len_k) {
  Mods m;
  if (!f.align.empty()) m.align = f.align == "bottom-right" ? CausalAlign::bottom_right : CausalAlign::top_left;
  if (f.softcap) {
    if (!(*f.softcap > 0)) throw UsageError("--softcap must be a positive number");
    m.softcap = f.softcap;
  }
  if (!f.window.empty()) {
    const auto comma = f.window.find(',');
    std::int64_t left = 0, right = 0;
    try {
      std::size_t a = 0, b = 0;
      if (comma == std::string::npos) throw std::invalid_argument("no comma");
      left = std::stoll(f.window.substr(0, comma), &a);
      right = std::stoll(f.window.substr(comma + 1), &b);
      if (a != comma || b != f.window.size() - comma - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw UsageError("--window takes LEFT,RIGHT (integers, -1 = unbounded), not '" + f.window + "'");
    }
    if (left < -1 || right < -1) throw UsageError("--window: LEFT and RIGHT must be >= -1");
    m.window = {left, right};
  }
  m.prefix_len = f.prefix_len;
  if ((alibi || m.positional()) && !m.align && len_q != len_k)
    throw UsageError(std::to_string(len_q) + " queries and " + std::to_string(len_k) +
                     " keys, so the positions of --window / --alibi-slopes / --prefix-len need an alignment: say "
                     "--align top-left or --align bottom-right");
  return m;
}

Causal parse_causal(const std::optional<std::string>& flag, std::int64_t len_q, std::int64_t len_k) {
  if (!flag) return Causal::none;
  if (*flag == "top-left") return Causal::top_left;
  if (*flag == "bottom-right") return Causal::bottom_right;
  if (!flag->empty()) throw UsageError("--causal takes top-left or bottom-right, not '" + *flag + "'");
  if (len_q != len_k)
    throw UsageError("--causal: " + std::to_string(len_q) + " queries and " + std::to_string(len_k) +
                     " keys, so the alignment matters: say --causal top-left (PyTorch is_causal) or --causal "
                     "bottom-right (FlashAttention >= 2.1)");
  return Causal::top_left;
}

RunResult run_graph(const Graph& g, const Feeds& feeds, Backend backend, int threads, const Destinations& into,
                    codegen::cpu::Specialise specialise) {
  switch (backend) {
    case Backend::reference:
      return interpret(g, feeds);
    case Backend::cpu:
      return codegen::cpu::run(g, feeds, threads, into, specialise);
    case Backend::cuda:
      return codegen::cuda::run(g, feeds);  // throws cuda::NoGpu: "no CUDA driver/GPU found: <why>"
  }
  throw std::logic_error("qkv internal error: unknown backend");
}

NdArray load_npy(const std::string& path, const std::string& flag) {
  try {
    const NpyInfo info = read_npy_info(path);
    // An array that is not f32 is converted after it is read: room for both.
    const std::uint64_t f32 = checked_nbytes(info.shape, DType::f32, path);
    require_memory(info.nbytes + (info.dtype == DType::f32 || info.dtype == DType::boolean ? 0 : f32),
                   "reading " + flag + " " + path);
    return read_npy(path);
  } catch (const IoError& e) {
    throw IoError(flag + ": " + e.what());
  }
}

void protect_inputs(OutputGroup& outputs, std::initializer_list<NamedPath> inputs) {
  for (const auto& [path, flag] : inputs)
    if (!path.empty()) outputs.protect(path, flag);
}

void stage_npy(OutputGroup& outputs, std::size_t i, const NdArray& array) {
  const std::vector<std::byte> header = npy_header(array);
  outputs.write(i, {header, array.bytes});
}

RunResult run_model(const Graph& g, const Feeds& feeds, Backend backend, bool stats) {
  require_memory(run_bytes(g, bind_extents(g, feeds), backend));
  const Activity running("running the model");
  const codegen::JitStats before = codegen::jit_stats();
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = run_graph(g, feeds, backend);
  if (stats) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const codegen::JitStats after = codegen::jit_stats();
    std::fprintf(stderr,
                 "qkv: stats: %lld LLVM module(s) compiled in %.1f ms (%lld loaded from the code cache); the run "
                 "took %.1f ms in all%s\n",
                 static_cast<long long>(after.modules - before.modules), after.compile_ms - before.compile_ms,
                 static_cast<long long>(after.loaded_from_cache - before.loaded_from_cache), ms,
                 backend == Backend::cpu ? ("; kernels tuned as " + host_tuning().name).c_str() : "");
  }
  return r;
}

namespace {
/// What the state dict's tensors take once imported (as f32).
void require_memory_for(const SafetensorsFile& sd) {
  std::uint64_t total = 0;
  for (const auto& name : sd.names())
    if (__builtin_add_overflow(total, checked_nbytes(sd.get(name).shape, DType::f32, sd.what()), &total))
      total = std::numeric_limits<std::uint64_t>::max();
  require_memory(total, "reading the weights " + sd.what());
}
}  // namespace

std::string shape_str(const NdArray& a) { return shape_to_string(a.shape); }

namespace {
/// --alibi-slopes: f32 [H] or [B, H] into feeds["alibi_slopes"]; returns its rank, or IoError.
int load_alibi_slopes(const std::string& path, Feeds& feeds, std::int64_t batch, std::int64_t heads) {
  NdArray s = load_npy(path, "--alibi-slopes");
  if (s.dtype != DType::f32) throw IoError("--alibi-slopes: must be float32, got " + std::string(dtype_name(s.dtype)));
  int rank = 0;
  if (s.shape == std::vector<std::int64_t>{heads})
    rank = 1;
  else if (s.shape == std::vector<std::int64_t>{batch, heads})
    rank = 2;
  else
    throw IoError("--alibi-slopes: shape " + shape_str(s) + ", expected [H] = (" + std::to_string(heads) +
                  ") or [B, H]");
  feeds["alibi_slopes"] = std::move(s);
  return rank;
}
}  // namespace

constexpr std::int64_t kF32Bytes = sizeof(float);

void MaskBuilder::key_padding(const NdArray& kpm, const std::string& flag) {
  if (kpm.dtype != DType::boolean)
    throw IoError(flag + ": must be a bool array (true = ignore), got " + std::string(dtype_name(kpm.dtype)));
  if (kpm.shape != std::vector<std::int64_t>{batch, len_k})
    throw IoError(flag + ": shape " + shape_str(kpm) +
                  " must be [batch, S] = " + shape_to_string(std::vector{batch, len_k}));
  NdArray keep = kpm;
  for (bool& x : keep.as<bool>()) x = !x;  // PyTorch: true = ignore; qkv: true = may attend
  feeds["key_keep"] = std::move(keep);
  spec.key_padding = true;
}

void MaskBuilder::add(NdArray m, const std::string& flag, bool per_batch_head_rows) {
  if (m.dtype != DType::boolean && m.dtype != DType::f32 && m.dtype != DType::f64 && m.dtype != DType::f16 &&
      m.dtype != DType::bf16)  // as PyTorch: "only bool and floating types of masks are supported"
    throw IoError(flag + ": an integer mask (" + std::string(dtype_name(m.dtype)) +
                  ") is ambiguous; give bool (true = not allowed) or float (added)");
  if (per_batch_head_rows) {  // PyTorch MHA's 3-D attn_mask: [B*H, L, S], row b*H + h
    if (m.shape.size() != 3 || m.shape[0] != batch * heads)
      throw IoError(flag + ": shape " + shape_str(m) +
                    " must be [L, S] = " + shape_to_string(std::vector{len_q, len_k}) +
                    " or [batch*heads, L, S] = " + shape_to_string(std::vector{batch * heads, len_q, len_k}));
    m.shape = {batch, heads, m.shape[1], m.shape[2]};
  }
  const std::vector<std::int64_t> full{batch, heads, len_q, len_k};
  if (m.shape.size() > 4) throw IoError(flag + ": shape " + shape_str(m) + " has more than 4 axes");
  // NumPy broadcasting: align from the right; each axis 1 or equal to [B, H, L, S]'s.
  bool leading_ones = true;
  for (std::size_t k = 0; k < m.shape.size(); ++k) {
    const std::size_t a = m.shape.size() - 1 - k, t = 3 - k;
    if (m.shape[a] != 1 && m.shape[a] != full[t])
      throw IoError(flag + ": shape " + shape_str(m) +
                    " does not broadcast to [B, H, L, S] = " + shape_to_string(full));
    if (t < 2 && m.shape[a] != 1) leading_ones = false;
  }
  bias_sources.emplace_back(flag, m.shape);
  bias_from_bool = bias_from_bool || m.dtype == DType::boolean;
  // Keep the bias [L, S] (which the fused kernel takes) unless this mask varies over B or H.
  if (!bias) {
    require_memory(static_cast<std::uint64_t>(checked_mul(checked_mul(len_q, len_k, flag), kF32Bytes, flag)), flag);
    bias = NdArray::zeros(DType::f32, {len_q, len_k});
  }
  if (!leading_ones && bias->shape.size() == 2) {
    const std::int64_t wide_elements = checked_mul(checked_mul(batch, heads, flag), bias->numel(), flag);
    require_memory(static_cast<std::uint64_t>(checked_mul(wide_elements, kF32Bytes, flag)), flag);
    NdArray wide = NdArray::zeros(DType::f32, full);
    const auto src = bias->as<float>();
    auto dst = wide.as<float>();
    const std::size_t plane = src.size();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = src[i % plane];
    bias = std::move(wide);
  }
  const auto& d = bias->shape;
  const std::size_t off = 4 - d.size();  // target axes are the last d.size() of [B, H, L, S]
  std::vector<std::int64_t> stride(4, 0);
  std::int64_t st = 1;
  for (std::size_t k = 0; k < m.shape.size(); ++k) {
    const std::size_t a = m.shape.size() - 1 - k;
    stride[3 - k] = m.shape[a] == 1 ? 0 : st;
    st *= m.shape[a];
  }
  const std::vector<float> v = m.to_f32();
  auto out = bias->as<float>();
  std::vector<std::int64_t> idx(d.size(), 0);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::int64_t src = 0;
    for (std::size_t k = 0; k < d.size(); ++k) src += idx[k] * stride[k + off];
    const float x = v[static_cast<std::size_t>(src)];
    if (m.dtype == DType::boolean) {
      if (x != 0.0f) out[i] = -std::numeric_limits<float>::infinity();  // true = not allowed
    } else {
      out[i] += x;
    }
    for (std::size_t k = d.size(); k-- > 0;) {
      if (++idx[k] < d[k]) break;
      idx[k] = 0;
    }
  }
}

std::string MaskBuilder::bias_gradient_name() const { return bias_name_; }

Masks MaskBuilder::finish(Feeds& into) {
  if (bias && !bias_from_bool && bias_sources.size() == 1 && bias_sources[0].second == bias->shape) {
    bias_name_ = bias_sources[0].first.substr(2);  // "--attn-mask" -> "attn_mask"
    std::replace(bias_name_.begin(), bias_name_.end(), '-', '_');
  }
  for (auto& [name, a] : feeds) into[name] = std::move(a);
  if (bias) {
    spec.bias = bias->shape.size() == 2 ? Masks::Bias::query_key : Masks::Bias::per_head;
    into["attn_bias"] = std::move(*bias);
  }
  return spec;
}

namespace {

std::int64_t dim(const NdArray& a, std::size_t k) { return a.shape.at(k); }

void expect_rank(const NdArray& a, std::size_t rank, const std::string& flag, const std::string& layout) {
  if (a.shape.size() != rank)
    throw IoError(flag + ": shape " + shape_str(a) + " must be " + layout + " (" + std::to_string(rank) + " axes)");
  if (a.dtype == DType::boolean) throw IoError(flag + ": must be a float array, got bool");
}

/// PyTorch's unbatched form: `a` as a batch of one (a leading axis of 1 added).
NdArray as_batch_of_one(NdArray a) {
  a.shape.insert(a.shape.begin(), 1);
  return a;
}
/// The batch of one of an unbatched call dropped again from an output.
NdArray unbatched(NdArray a) {
  a.shape.erase(a.shape.begin());
  return a;
}

void expect_width(const NdArray& a, std::int64_t want, const std::string& flag, const std::string& what) {
  if (a.shape.back() != want)
    throw IoError(flag + ": the last axis is " + std::to_string(a.shape.back()) + " but " + what + " is " +
                  std::to_string(want) + " (from the weights)");
}

}  // namespace

namespace {

/// A file name for the gradient of `name`: d<name>.npy, any character but letters, digits, '.',
/// '-' and '_' replaced by '_' (a state dict's names are user data).
std::string gradient_file(const std::string& name) {
  std::string f = "d";
  for (const char c : name)
    f += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ? c : '_';
  return f + ".npy";
}

/// qkv grad: g's output "out" differentiated (GradRequest), its gradients written to the folder
/// and, with out_file, the forward output too; all outputs committed together.
int run_gradients(Graph g, Feeds feeds, const GradRequest& r, OutputGroup& outputs, std::optional<std::size_t> out_file,
                  Backend backend, bool stats, const std::map<std::string, std::string>& file_names = {}) {
  int out = -1;
  for (const auto& o : g.outputs())
    if (o.name == "out") out = o.node;
  if (out < 0) internal_error("qkv grad: the model has no output `out`");
  // dO: the output's shape (its sizes from the inputs), the output's dtype.
  const Bindings b = bind_extents(g, feeds);
  std::vector<std::int64_t> shape;
  for (const auto& a : g.node(out).axes) shape.push_back(a.extent.resolve(b).value_or(-1));
  NdArray d_out = load_npy(r.grad_output, "--grad-output");
  if (d_out.dtype != DType::f32 && d_out.dtype != DType::f16 && d_out.dtype != DType::bf16)
    throw IoError("--grad-output: must be a float array, not " + std::string(dtype_name(d_out.dtype)));
  if (d_out.shape != shape)
    throw IoError("--grad-output: shape " + shape_str(d_out) + " must be the output's " + shape_to_string(shape));
  // L = Σ out ⊙ dO; its gradients by every float input and weight fed. On the CPU backends the
  // forward is fused first, so an attention's gradient is the fused FlashAttention-2 backward
  // (O(L) memory); the GPU's plans do not run that node yet, so there it stays unfused.
  Node probe;
  probe.op = Op::input;
  probe.name = "grad_output";
  probe.axes = g.node(out).axes;
  probe.dtype = g.node(out).dtype;
  const int p = g.add(std::move(probe));
  feeds["grad_output"] = d_out.dtype == g.node(out).dtype ? std::move(d_out) : d_out.converted(g.node(out).dtype);
  grad_detail::Builder builder(g);
  std::vector<std::string> axes, names;
  for (const auto& a : g.node(out).axes) axes.push_back(a.name);
  std::vector<int> wrt;
  std::vector<std::string> shown_names;      // per gradient: the name of its file
  std::map<std::string, std::string> files;  // file -> the name it holds
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.node(static_cast<int>(i));
    if (!is_array_leaf(n) || n.name == "grad_output" || !feeds.contains(n.name)) continue;
    if (n.dtype != DType::f32 && n.dtype != DType::f16 && n.dtype != DType::bf16) continue;  // masks, ids
    const auto renamed = file_names.find(n.name);
    if (renamed != file_names.end() && renamed->second.empty()) continue;  // made from a bool mask: no gradient
    const std::string shown = renamed == file_names.end() ? n.name : renamed->second;
    if (const auto [at, fresh] = files.emplace(gradient_file(shown), n.name); !fresh)
      throw IoError("--grads-out: '" + at->second + "' and '" + n.name + "' would both be written to " + at->first);
    wrt.push_back(static_cast<int>(i));
    names.push_back(n.name);
    shown_names.push_back(shown);
  }
  int loss = builder.sum_over(builder.binary(Op::mul, out, p), axes);
  if (backend != Backend::cuda) {
    std::map<std::string, std::size_t> index;  // leaf name -> its place in wrt
    for (std::size_t k = 0; k < wrt.size(); ++k) index[names[k]] = k;
    codegen::ForwardForGradients f = codegen::fuse_for_gradients(g, loss);
    g = std::move(f.g);
    loss = f.loss;
    for (int id = 0; id < static_cast<int>(g.size()); ++id)
      if (is_array_leaf(g.node(id)))
        if (const auto it = index.find(g.node(id).name); it != index.end()) wrt[it->second] = id;
  }
  const std::vector<int> grads = append_gradients(g, loss, wrt);
  for (std::size_t k = 0; k < grads.size(); ++k) g.mark_output(grads[k], "d:" + names[k]);

  outputs.add_directory(r.grads_out, "--grads-out");
  std::vector<std::size_t> grad_files;
  for (const auto& n : shown_names)
    grad_files.push_back(outputs.add_file(std::filesystem::path(r.grads_out) / gradient_file(n), "--grads-out"));
  const RunResult result = run_model(g, feeds, backend, stats);

  const Activity writing("writing the gradients");
  if (out_file) stage_npy(outputs, *out_file, result.outputs.at("out"));
  for (std::size_t k = 0; k < names.size(); ++k) stage_npy(outputs, grad_files[k], result.outputs.at("d:" + names[k]));
  outputs.commit();
  return 0;
}

}  // namespace

int run_mha(const RunMha& o) {
  if (o.heads <= 0) throw UsageError("--heads must be positive");
  const bool want_weights = o.need_weights || o.per_head_weights || !o.weights_out.empty();
  if (want_weights && o.weights_out.empty())
    throw UsageError("--need-weights/--per-head-weights: say where with --weights-out");
  OutputGroup outputs;
  protect_inputs(outputs, {{o.weights, "--weights"},
                           {o.query, "--query"},
                           {o.key, "--key"},
                           {o.value, "--value"},
                           {o.key_padding_mask, "--key-padding-mask"},
                           {o.attn_mask, "--attn-mask"},
                           {o.alibi_slopes, "--alibi-slopes"},
                           {o.static_k, "--static-k"},
                           {o.static_v, "--static-v"},
                           {o.grad ? o.grad->grad_output : "", "--grad-output"}});
  const std::optional<std::size_t> out_file =
      o.out.empty() ? std::nullopt : std::optional(outputs.add_file(o.out, "--out"));
  const std::size_t weights_file = want_weights ? outputs.add_file(o.weights_out, "--weights-out") : 0;

  const Activity reading("reading the inputs");
  const SafetensorsFile sd = SafetensorsFile::open(o.weights);
  const MhaConfig cfg = infer_mha_config(sd, o.heads);
  require_memory_for(sd);
  Feeds feeds = import_mha(sd, cfg);
  check_no_unexpected_keys(sd, feeds, "nn.MultiheadAttention");

  NdArray q = load_npy(o.query, "--query");
  // nn.MultiheadAttention's unbatched call: query [L, E], key [S, kdim], value [S, vdim],
  // key_padding_mask [S]; the outputs without the batch axis.
  const bool batched = q.shape.size() != 2;
  const std::string b = batched ? "batch, " : "";
  expect_rank(q, batched ? 3 : 2, "--query", "[" + b + "L, embed_dim]");
  expect_width(q, cfg.embed_dim, "--query", "embed_dim");
  const bool cross = !o.key.empty() || !o.value.empty() || cfg.separate_qkv;
  NdArray k = o.key.empty() ? q : load_npy(o.key, "--key");
  NdArray v = o.value.empty() ? k : load_npy(o.value, "--value");
  expect_rank(k, batched ? 3 : 2, "--key", "[" + b + "S, kdim] (as the query)");
  expect_rank(v, batched ? 3 : 2, "--value", "[" + b + "S, vdim] (as the query)");
  if (!batched) {
    q = as_batch_of_one(std::move(q));
    k = as_batch_of_one(std::move(k));
    v = as_batch_of_one(std::move(v));
  }
  expect_width(k, cfg.kdim, "--key", "kdim");
  expect_width(v, cfg.vdim, "--value", "vdim");
  if (dim(k, 0) != dim(q, 0) || dim(v, 0) != dim(q, 0))
    throw IoError("--key/--value: batch " + std::to_string(dim(k, 0)) + "/" + std::to_string(dim(v, 0)) +
                  " must equal the query's batch " + std::to_string(dim(q, 0)));
  if (dim(k, 1) != dim(v, 1))
    throw IoError("--key has S = " + std::to_string(dim(k, 1)) + " positions but --value has " +
                  std::to_string(dim(v, 1)) + "; keys and values come from one sequence");
  const std::int64_t B = dim(q, 0), L = dim(q, 1);
  std::int64_t S = dim(k, 1);
  const std::int64_t extra = (cfg.add_bias_kv ? 1 : 0) + (o.add_zero_attn ? 1 : 0);
  // static_k / static_v: [B*H, S, head_dim] (unbatched: [H, S, head_dim]), fed as [B, H, S, head_dim].
  std::optional<NdArray> static_k, static_v;
  if (!o.static_k.empty() || !o.static_v.empty()) {
    if (cfg.add_bias_kv)
      throw UsageError(
          "--static-k/--static-v with add_bias_kv: PyTorch refuses them together (bias_k and bias_v are "
          "appended to projected keys and values)");
    if (cfg.separate_qkv)
      throw UsageError("--static-k/--static-v: supported with a fused in_proj_weight (kdim == vdim == embed_dim) only");
    const std::int64_t H = o.heads, D = cfg.embed_dim / o.heads;
    auto load_static = [&](const std::string& path, const std::string& flag) {
      NdArray a = load_npy(path, flag);
      if (a.shape.size() != 3 || a.shape[0] != B * H || a.shape[2] != D)
        throw IoError(flag + ": shape " + shape_str(a) + " must be [batch*heads, S, head_dim] = [" +
                      std::to_string(B * H) + ", S, " + std::to_string(D) + "]");
      a.shape = {B, H, a.shape[1], D};
      return a;
    };
    if (!o.static_k.empty()) static_k = load_static(o.static_k, "--static-k");
    if (!o.static_v.empty()) static_v = load_static(o.static_v, "--static-v");
    // The keys' length is the static tensors' (the sources' where they are projected here).
    const std::int64_t sk = static_k ? static_k->shape[2] : S, sv = static_v ? static_v->shape[2] : S;
    if (sk != sv)
      throw IoError("the keys have S = " + std::to_string(sk) + " positions but the values " + std::to_string(sv) +
                    " (--static-k/--static-v and the sources they replace must agree)");
    S = sk;
  }

  MhaModel m;
  m.heads = o.heads;
  m.cross = cross;
  m.separate_qkv = cfg.separate_qkv;
  m.bias = cfg.bias;
  m.add_bias_kv = cfg.add_bias_kv;
  m.add_zero_attn = o.add_zero_attn;
  m.weights = want_weights;
  m.static_k = static_k.has_value();
  m.static_v = static_v.has_value();
  m.masks.causal = parse_causal(o.causal, L, S);
  if (m.masks.causal != Causal::none && extra > 0)
    throw UsageError(
        "--causal cannot be combined with add_bias_kv/--add-zero-attn (the appended keys have no position); "
        "pass an --attn-mask instead");
  m.mods = parse_mod_flags(o.mods, !o.alibi_slopes.empty(), L, S);
  if (extra > 0 && (m.mods.positional() || m.mods.softcap || !o.alibi_slopes.empty()))
    throw UsageError(
        "--window / --alibi-slopes / --softcap / --prefix-len cannot be combined with add_bias_kv/--add-zero-attn "
        "(the appended keys have no position); pass an --attn-mask instead");
  if (!o.alibi_slopes.empty()) m.mods.alibi_rank = load_alibi_slopes(o.alibi_slopes, feeds, B, o.heads);
  MaskBuilder masks{B, o.heads, L, S};
  if (!o.key_padding_mask.empty()) {
    NdArray kpm = load_npy(o.key_padding_mask, "--key-padding-mask");
    if (!batched && kpm.shape.size() != 1)
      throw IoError("--key-padding-mask: shape " + shape_str(kpm) + " must be [S] for an unbatched query");
    masks.key_padding(batched ? std::move(kpm) : as_batch_of_one(std::move(kpm)), "--key-padding-mask");
  }
  if (!o.attn_mask.empty()) {
    NdArray am = load_npy(o.attn_mask, "--attn-mask");
    // nn.MultiheadAttention takes exactly these two forms (no broadcasting from fewer axes).
    const bool two_d = am.shape == std::vector<std::int64_t>{L, S};
    const bool three_d = am.shape.size() == 3 && am.shape[1] == L && am.shape[2] == S;
    if (!two_d && !three_d)
      throw IoError(
          "--attn-mask: shape " + shape_str(am) + " must be [L, S] = " + shape_to_string(std::vector{L, S}) +
          " or [batch*heads, L, S] = " + shape_to_string(std::vector{checked_mul(B, o.heads, "--attn-mask"), L, S}));
    masks.add(std::move(am), "--attn-mask", three_d);
  }
  const Causal causal = m.masks.causal;
  m.masks = masks.finish(feeds);
  m.masks.causal = causal;
  feeds["query"] = std::move(q);
  if (cross && !static_k) feeds["key"] = std::move(k);
  if (cross && !static_v) feeds["value"] = std::move(v);
  if (static_k) feeds["static_k"] = std::move(*static_k);
  if (static_v) feeds["static_v"] = std::move(*static_v);
  const Graph g = model_as(build_mha(m), o.dtype, feeds);
  if (o.grad) {
    if (!batched) throw UsageError("qkv grad mha: give batched inputs ([B, L, E])");
    if (want_weights) throw UsageError("qkv grad mha: --weights-out is run's; the gradients are of the output only");
    return run_gradients(g, std::move(feeds), *o.grad, outputs, out_file, o.backend, o.stats,
                         {{"attn_bias", masks.bias_gradient_name()}});
  }
  const RunResult r = run_model(g, feeds, o.backend, o.stats);

  const Activity writing("writing the outputs");
  const auto drop_batch = [&](NdArray a) { return batched ? a : unbatched(std::move(a)); };
  stage_npy(outputs, *out_file, drop_batch(r.outputs.at("out")));
  if (want_weights) {
    const NdArray& w = r.outputs.at("weights");
    stage_npy(outputs, weights_file, drop_batch(o.per_head_weights ? w : mean_over_axis(w, 1).converted(w.dtype)));
  }
  outputs.commit();
  return 0;
}

namespace {

/// An int64 copy of an integer .npy (document ids), or IoError.
NdArray ids_of(NdArray a, const std::string& flag, std::int64_t batch, std::int64_t len, const char* len_name) {
  if (a.dtype != DType::i32 && a.dtype != DType::i64)
    throw IoError(flag + ": document ids must be int32 or int64, got " + std::string(dtype_name(a.dtype)));
  if (a.shape != std::vector<std::int64_t>{batch, len})
    throw IoError(flag + ": shape " + shape_str(a) + ", expected [B, " + len_name + "] = (" + std::to_string(batch) +
                  ", " + std::to_string(len) + ")");
  return a;
}

/// run sdpa's mods: the shared flags, then --alibi-slopes and --q-doc-ids / --kv-doc-ids (their
/// inputs go into `feeds`).
Mods parse_mods(const RunSdpa& o, Feeds& feeds, std::int64_t B, std::int64_t H, std::int64_t L, std::int64_t S) {
  Mods m = parse_mod_flags(o.mods, !o.alibi_slopes.empty(), L, S);
  if (!o.alibi_slopes.empty()) m.alibi_rank = load_alibi_slopes(o.alibi_slopes, feeds, B, H);
  if (o.q_doc_ids.empty() != o.kv_doc_ids.empty()) throw UsageError("--q-doc-ids and --kv-doc-ids go together");
  if (!o.q_doc_ids.empty()) {
    feeds["q_doc_ids"] = ids_of(load_npy(o.q_doc_ids, "--q-doc-ids"), "--q-doc-ids", B, L, "L");
    feeds["kv_doc_ids"] = ids_of(load_npy(o.kv_doc_ids, "--kv-doc-ids"), "--kv-doc-ids", B, S, "S");
    m.documents = true;
  }
  return m;
}

}  // namespace

int run_sdpa(const RunSdpa& o) {
  if (!(o.dropout >= 0.0 && o.dropout < 1.0)) throw UsageError("--dropout must be in [0, 1)");
  if (o.scale && !std::isfinite(*o.scale)) throw UsageError("--scale must be a finite number");
  OutputGroup outputs;
  protect_inputs(outputs, {{o.query, "--query"},
                           {o.key, "--key"},
                           {o.value, "--value"},
                           {o.attn_bias, "--attn-bias"},
                           {o.attn_mask, "--attn-mask"},
                           {o.key_padding_mask, "--key-padding-mask"},
                           {o.alibi_slopes, "--alibi-slopes"},
                           {o.q_doc_ids, "--q-doc-ids"},
                           {o.kv_doc_ids, "--kv-doc-ids"},
                           {o.grad ? o.grad->grad_output : "", "--grad-output"}});
  const std::optional<std::size_t> out_file =
      o.out.empty() ? std::nullopt : std::optional(outputs.add_file(o.out, "--out"));
  const std::size_t weights_file = o.weights_out.empty() ? 0 : outputs.add_file(o.weights_out, "--weights-out");
  const std::size_t lse_file = o.lse_out.empty() ? 0 : outputs.add_file(o.lse_out, "--lse-out");

  const Activity reading("reading the inputs");
  NdArray q = load_npy(o.query, "--query"), k = load_npy(o.key, "--key"), v = load_npy(o.value, "--value");
  expect_rank(q, 4, "--query", "[batch, heads, L, D]");
  expect_rank(k, 4, "--key", "[batch, heads, S, D]");
  expect_rank(v, 4, "--value", "[batch, heads, S, Dv]");
  if (dim(k, 0) != dim(q, 0) || dim(v, 0) != dim(q, 0))
    throw IoError("batch of --key " + shape_str(k) + " and --value " + shape_str(v) + " must equal the query's " +
                  shape_str(q));
  // Fewer key/value heads than query heads: grouped-query attention (PyTorch's enable_gqa).
  if (dim(v, 1) != dim(k, 1) || dim(k, 1) < 1 || dim(q, 1) % dim(k, 1) != 0)
    throw IoError("heads: --key " + shape_str(k) + " and --value " + shape_str(v) +
                  " must have the same number of heads, dividing the query's " + shape_str(q));
  if (dim(k, 3) != dim(q, 3))
    throw IoError("--key: D = " + std::to_string(dim(k, 3)) + " but --query has D = " + std::to_string(dim(q, 3)));
  if (dim(v, 2) != dim(k, 2))
    throw IoError("--value has S = " + std::to_string(dim(v, 2)) + " but --key has S = " + std::to_string(dim(k, 2)));
  const std::int64_t B = dim(q, 0), H = dim(q, 1), L = dim(q, 2), S = dim(k, 2);

  SdpaModel m;
  m.heads = H;
  m.kv_heads = dim(k, 1);
  m.weights = !o.weights_out.empty();
  m.lse = !o.lse_out.empty();
  m.scale = o.scale;
  m.dropout = o.dropout;
  m.seed = o.seed;
  Feeds feeds{{"q", std::move(q)}, {"k", std::move(k)}, {"v", std::move(v)}};
  MaskBuilder masks{B, H, L, S};
  if (!o.attn_bias.empty()) {
    NdArray b = load_npy(o.attn_bias, "--attn-bias");
    if (b.dtype == DType::boolean) throw IoError("--attn-bias: must be float (use --attn-mask for a bool mask)");
    masks.add(std::move(b), "--attn-bias", false);
  }
  if (!o.attn_mask.empty()) {
    NdArray mk = load_npy(o.attn_mask, "--attn-mask");
    if (mk.dtype != DType::boolean)
      throw IoError("--attn-mask: must be bool (true = not allowed), got " + std::string(dtype_name(mk.dtype)) +
                    "; use --attn-bias for floats");
    masks.add(std::move(mk), "--attn-mask", false);
  }
  if (!o.key_padding_mask.empty())
    masks.key_padding(load_npy(o.key_padding_mask, "--key-padding-mask"), "--key-padding-mask");
  m.masks = masks.finish(feeds);
  m.masks.causal = parse_causal(o.causal, L, S);
  m.mods = parse_mods(o, feeds, B, H, L, S);
  const Graph g = model_as(build_sdpa(m), o.dtype, feeds);
  if (o.grad) {
    if (!o.weights_out.empty() || !o.lse_out.empty())
      throw UsageError("qkv grad sdpa: --weights-out and --lse-out are run's; the gradients are of the output only");
    return run_gradients(g, std::move(feeds), *o.grad, outputs, out_file, o.backend, o.stats,
                         {{"q", "query"}, {"k", "key"}, {"v", "value"}, {"attn_bias", masks.bias_gradient_name()}});
  }
  const RunResult r = run_model(g, feeds, o.backend, o.stats);

  const Activity writing("writing the outputs");
  stage_npy(outputs, *out_file, r.outputs.at("out"));
  if (!o.weights_out.empty()) stage_npy(outputs, weights_file, r.outputs.at("weights"));
  if (!o.lse_out.empty()) stage_npy(outputs, lse_file, r.outputs.at("lse"));
  outputs.commit();
  return 0;
}

int run_encoder(const RunEncoder& o) {
  if (o.heads <= 0) throw UsageError("--heads must be positive");
  if (o.activation != "relu" && o.activation != "gelu") throw UsageError("--activation must be relu or gelu");
  if (o.causal && !o.src_mask.empty()) throw UsageError("--src-mask and --causal are alternatives; give one");
  if (!(std::isfinite(o.eps) && o.eps > 0)) throw UsageError("--layer-norm-eps must be a positive finite number");
  OutputGroup outputs;
  protect_inputs(outputs, {{o.weights, "--weights"},
                           {o.src, "--src"},
                           {o.src_key_padding_mask, "--src-key-padding-mask"},
                           {o.src_mask, "--src-mask"},
                           {o.grad ? o.grad->grad_output : "", "--grad-output"}});
  const std::optional<std::size_t> out_file =
      o.out.empty() ? std::nullopt : std::optional(outputs.add_file(o.out, "--out"));

  const Activity reading("reading the inputs");
  const SafetensorsFile sd = SafetensorsFile::open(o.weights);
  EncoderModel m;
  m.heads = o.heads;
  m.gelu = o.activation == "gelu";
  m.norm_first = o.norm_first;
  m.eps = o.eps;
  m.stack = o.stack;
  Feeds feeds;
  std::int64_t E = 0;
  require_memory_for(sd);
  if (o.stack) {
    m.layers = encoder_layer_count(sd);
    for (std::int64_t i = 0; i < m.layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      const auto cfg = infer_encoder_layer_config(sd, o.heads, p);
      E = cfg.self_attn.embed_dim;
      feeds.merge(import_encoder_layer(sd, cfg, p));
    }
    m.final_norm = sd.contains("norm.weight") || sd.contains("norm.bias");
    if (m.final_norm) feeds.merge(import_layer_norm(sd, "norm", E));
    check_no_unexpected_keys(sd, feeds, "nn.TransformerEncoder");
  } else {
    const auto cfg = infer_encoder_layer_config(sd, o.heads);
    E = cfg.self_attn.embed_dim;
    feeds = import_encoder_layer(sd, cfg);
    check_no_unexpected_keys(sd, feeds, "nn.TransformerEncoderLayer");
  }
  NdArray src = load_npy(o.src, "--src");
  // PyTorch's unbatched call: src [L, d_model], src_key_padding_mask [L]; the output [L, d_model].
  const bool batched = src.shape.size() != 2;
  expect_rank(src, batched ? 3 : 2, "--src", batched ? "[batch, L, d_model]" : "[L, d_model]");
  expect_width(src, E, "--src", "d_model");
  if (!batched) src = as_batch_of_one(std::move(src));
  const std::int64_t B = dim(src, 0), L = dim(src, 1);
  MaskBuilder masks{B, o.heads, L, L};
  if (!o.src_key_padding_mask.empty()) {
    NdArray kpm = load_npy(o.src_key_padding_mask, "--src-key-padding-mask");
    if (!batched && kpm.shape.size() != 1)
      throw IoError("--src-key-padding-mask: shape " + shape_str(kpm) + " must be [L] for an unbatched --src");
    masks.key_padding(batched ? std::move(kpm) : as_batch_of_one(std::move(kpm)), "--src-key-padding-mask");
  }
  if (!o.src_mask.empty()) {
    NdArray sm = load_npy(o.src_mask, "--src-mask");
    if (sm.shape != std::vector<std::int64_t>{L, L})
      throw IoError("--src-mask: shape " + shape_str(sm) + " must be [L, L] = " + shape_to_string(std::vector{L, L}));
    masks.add(std::move(sm), "--src-mask", false);
  }
  m.masks = masks.finish(feeds);
  m.masks.causal = parse_causal(o.causal, L, L);
  feeds["src"] = std::move(src);
  const Graph g = model_as(build_encoder(m), o.dtype, feeds);
  if (o.grad) {
    if (!batched) throw UsageError("qkv grad encoder-layer: give a batched --src ([B, L, d_model])");
    return run_gradients(g, std::move(feeds), *o.grad, outputs, out_file, o.backend, o.stats,
                         {{"attn_bias", masks.bias_gradient_name()}});
  }
  const RunResult r = run_model(g, feeds, o.backend, o.stats);

  const Activity writing("writing the outputs");
  stage_npy(outputs, *out_file, batched ? r.outputs.at("out") : unbatched(r.outputs.at("out")));
  outputs.commit();
  return 0;
}

}  // namespace qkv::cli
