// The GPU backend's run path: a plan (plan.cpp) executed on GPU 0 through the dlopen'd driver,
// and the benchmark's timing entry. See qkv/codegen/cuda/executor.hpp.
#include <qkv/codegen/cuda/executor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <utility>

#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/codegen/lowering/storage.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/runtime/cuda.hpp>
#include <qkv/runtime/io/array.hpp>

#include "cuda/grid.hpp"

namespace qkv::codegen::cuda {

using nvptx::Dim3;
using Shape = std::vector<std::int64_t>;

// --- execution ------------------------------------------------------------------------------

namespace {

/// GPU 0 and the sm its kernels are emitted for, opened once per process. Deliberately never
/// destroyed (nor the kernel cache): driver calls from static destructors at exit would race the
/// driver's own teardown.
struct Gpu {
  qkv::cuda::Device device;
  int sm;
};

const Gpu& gpu() {
  static std::mutex mutex;
  static Gpu* g = nullptr;
  std::lock_guard lock(mutex);
  if (!g) {
    qkv::cuda::Device d = qkv::cuda::Device::open();  // throws NoGpu
    int sm = 0;
    try {
      sm = pick_sm(d.cc_major(), d.cc_minor());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(d.name() + ": " + e.what());
    }
    g = new Gpu{std::move(d), sm};
  }
  return *g;
}

struct Compiled {
  qkv::cuda::Function function;
  unsigned block_x, block_y, block_z, shared_bytes;
  std::string name;
};

/// The loaded kernel for `request` on `g` (emitted, loaded and cached on first use).
const Compiled& compiled(const Gpu& g, const nvptx::KernelRequest& request) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::pair<std::string, int>, std::unique_ptr<const Compiled>>;
  const auto key = std::make_pair(nvptx::kernel_name(request), g.sm);
  std::lock_guard lock(mutex);
  auto it = cache->find(key);
  if (it == cache->end()) {
    const nvptx::PtxKernel k = nvptx::emit_ptx(request, g.sm);
    const qkv::cuda::Module module = g.device.load_ptx(k.ptx);
    it = cache
             ->emplace(key,
                       std::make_unique<const Compiled>(Compiled{
                           module.function(k.name), static_cast<unsigned>(k.block_x), static_cast<unsigned>(k.block_y),
                           static_cast<unsigned>(k.block_z), static_cast<unsigned>(k.shared_bytes), k.name}))
             .first;
  }
  return *it->second;
}

qkv::cuda::Dim3 dim3(const Dim3& d) {
  return {static_cast<unsigned>(d.x), static_cast<unsigned>(d.y), static_cast<unsigned>(d.z)};
}

/// Launches a loaded kernel with resolved parameter values.
void launch_compiled(const Compiled& k, const Dim3& grid, const std::vector<ParamValue>& values) {
  std::vector<ParamValue> v = values;  // the driver reads the values through these pointers
  std::vector<void*> params(v.size());
  for (std::size_t a = 0; a < v.size(); ++a) {
    switch (v[a].kind) {
      case Arg::Kind::buffer:
      case Arg::Kind::null:
        params[a] = &v[a].address;
        break;
      case Arg::Kind::i64:
        params[a] = &v[a].i64;
        break;
      case Arg::Kind::f32:
        params[a] = &v[a].f32;
        break;
    }
  }
  k.function.launch(dim3(grid), {k.block_x, k.block_y, k.block_z}, k.shared_bytes, params);
}

/// GPU 0 as a Machine.
class GpuMachine final : public Machine {
 public:
  explicit GpuMachine(const Gpu& g) : g_(g) {}
  std::uint64_t alloc(std::size_t bytes) override {
    if (bytes == 0) return 0;
    qkv::cuda::Buffer b = g_.device.alloc(bytes);
    const std::uint64_t a = b.ptr();
    buffers_.emplace(a, std::move(b));
    return a;
  }
  void free(std::uint64_t address) override { buffers_.erase(address); }
  void upload(std::uint64_t address, const void* src, std::size_t n) override {
    if (n > 0) buffers_.at(address).upload(src, n);
  }
  void download(void* dst, std::uint64_t address, std::size_t n) override {
    if (n > 0) buffers_.at(address).download(dst, n);
  }
  void launch(const Launch& l, const std::vector<ParamValue>& params) override {
    launch_compiled(compiled(g_, l.request), l.grid, params);
  }
  [[nodiscard]] int max_shared_bytes() const override { return g_.device.max_shared_per_block_optin(); }

 private:
  const Gpu& g_;
  std::map<std::uint64_t, qkv::cuda::Buffer> buffers_;
};

class Executor {
 public:
  Executor(Machine& m, const Graph& g, const Feeds& feeds, Plan plan)
      : m_(m), g_(g), feeds_(feeds), p_(std::move(plan)), addr_(p_.buffers.size(), 0), live_(p_.buffers.size(), false) {
    alloc_at_.resize(g.size());
    for (std::size_t b = 0; b < p_.buffers.size(); ++b)
      alloc_at_[static_cast<std::size_t>(p_.buffers[b].first)].push_back(static_cast<int>(b));
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor() {
    for (std::size_t b = 0; b < addr_.size(); ++b)
      if (live_[b]) m_.free(addr_[b]);
  }

  std::map<std::string, NdArray, std::less<>> run() {
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      for (int b : alloc_at_[static_cast<std::size_t>(id)]) {
        addr_[static_cast<std::size_t>(b)] = m_.alloc(p_.buffers[static_cast<std::size_t>(b)].bytes);
        live_[static_cast<std::size_t>(b)] = true;
      }
      step(id);
      for (int b : p_.free_after[static_cast<std::size_t>(id)]) {
        live_[static_cast<std::size_t>(b)] = false;
        m_.free(addr_[static_cast<std::size_t>(b)]);
      }
    }
    std::map<std::string, NdArray, std::less<>> outputs;
    for (const auto& o : g_.outputs()) outputs[o.name] = download(o.node);
    return outputs;
  }

 private:
  std::uint64_t address(int b) const {
    if (!live_.at(static_cast<std::size_t>(b))) internal_error("cuda: a step uses a buffer that is not allocated");
    return addr_[static_cast<std::size_t>(b)];
  }
  std::uint64_t address_of(int id) const { return address(p_.buffer[static_cast<std::size_t>(id)]); }
  const Shape& shape(int id) const { return p_.shape[static_cast<std::size_t>(id)]; }

  NdArray download(int id) {
    NdArray a = NdArray::zeros(storage_dtype(g_.node(id).dtype), shape(id));
    m_.download(a.bytes.data(), address_of(id), a.bytes.size());
    return a;
  }
  /// `a` stored as node `id` is (storage.hpp), at its address.
  void upload_to(int id, const NdArray& a) {
    const DType stored = storage_dtype(g_.node(id).dtype);
    if (a.dtype == stored || stored == DType::boolean) {
      m_.upload(address_of(id), a.bytes.data(), a.bytes.size());
    } else {
      const NdArray c = a.converted(stored);
      m_.upload(address_of(id), c.bytes.data(), c.bytes.size());
    }
  }

  void step(int id) {
    const Node& n = g_.node(id);
    const Step& s = p_.steps[static_cast<std::size_t>(id)];
    switch (s.kind) {
      case Step::Kind::upload:
        return upload_to(id, feeds_.find(n.name)->second);  // bind_extents checked it exists
      case Step::Kind::view:
      case Step::Kind::weights:
        return;
      case Step::Kind::gpu: {
        if (s.tensor_table >= 0) {
          // The mod's tensors: their device addresses, then their extents (then the backward's
          // partial sums of their gradients).
          const FusedAttentionCall& call = *s.call;
          std::vector<std::uint64_t> table;
          for (int m : call.tensor_inputs) table.push_back(address_of(n.inputs[static_cast<std::size_t>(m)]));
          for (std::int64_t e : call.tensor_extents) table.push_back(static_cast<std::uint64_t>(e));
          for (int b : s.tensor_partials) table.push_back(address(b));
          m_.upload(address(s.tensor_table), table.data(), table.size() * sizeof(std::uint64_t));
        }
        for (const Launch& l : s.launches) {
          std::vector<ParamValue> values(l.args.size());
          for (std::size_t a = 0; a < l.args.size(); ++a) {
            const Arg& arg = l.args[a];
            values[a].kind = arg.kind;
            values[a].i64 = arg.i64;
            values[a].f32 = arg.f32;
            if (arg.kind == Arg::Kind::buffer) {
              const std::uint64_t base = address(arg.buffer);
              values[a].address = base == 0 ? 0 : base + static_cast<std::uint64_t>(arg.offset);
            }
          }
          m_.launch(l, values);
        }
        return;
      }
      case Step::Kind::host:
        return host(id);
    }
  }

  /// The fallback: inputs downloaded, the node computed on the host, its value uploaded.
  void host(int id) {
    const Node& n = g_.node(id);
    const Step& s = p_.steps[static_cast<std::size_t>(id)];
    std::vector<NdArray> in;
    in.reserve(n.inputs.size());
    for (int x : n.inputs) in.push_back(download(x));
    std::vector<const NdArray*> ptrs;
    for (const auto& a : in) ptrs.push_back(&a);
    if (n.op != Op::fused_attention) {
      upload_to(id, evaluate_node(g_, id, ptrs, p_.sizes));
      return;
    }
    // An attention no GPU tiling fits: the CPU's fused kernel.
    const FusedAttentionCall& call = *s.call;
    std::vector<const void*> tensors;
    for (int m : call.tensor_inputs) tensors.push_back(in[static_cast<std::size_t>(m)].bytes.data());
    cpu::AttentionArgs args;
    args.batch = call.batch;
    args.len_q = call.len_q;
    args.len_k = call.len_k;
    args.seed = call.seed;
    args.q = in[0].bytes.data();  // stored as the spec says (f32 or bf16), as downloaded
    args.k = in[1].bytes.data();
    args.v = in[2].bytes.data();
    args.tensors = tensors.data();
    args.extents = call.tensor_extents.data();
    NdArray out = NdArray::zeros(call.spec.storage, call.out_shape), weights;
    args.out = out.bytes.data();
    if (call.spec.write_weights) {
      weights = NdArray::zeros(DType::f32, {call.batch, call.spec.hq, call.len_q, call.len_k});
      args.weights = weights.as<float>().data();
    }
    NdArray lse;
    if (call.spec.write_lse) {
      lse = NdArray::zeros(DType::f32, {call.batch, call.spec.hq, call.len_q});
      args.lse = lse.as<float>().data();
    }
    if (call.batch > 0 && call.len_q > 0) cpu::run_attention(call.spec, args);
    m_.upload(address_of(id), out.bytes.data(), out.bytes.size());
    if (s.weights_buffer >= 0) m_.upload(address(s.weights_buffer), weights.bytes.data(), weights.bytes.size());
    if (s.lse_buffer >= 0) m_.upload(address(s.lse_buffer), lse.bytes.data(), lse.bytes.size());
  }

  Machine& m_;
  const Graph& g_;
  const Feeds& feeds_;
  Plan p_;
  std::vector<std::uint64_t> addr_;
  std::vector<bool> live_;
  std::vector<std::vector<int>> alloc_at_;
};

}  // namespace

RunResult execute_on(Machine& machine, const Graph& lowered, const Feeds& feeds) {
  RunResult result;
  result.bindings = bind_extents(lowered, feeds);
  PlanOptions options;
  options.max_shared_bytes = machine.max_shared_bytes();
  Executor exec(machine, lowered, feeds, plan(lowered, result.bindings, options));
  result.outputs = exec.run();
  return result;
}

RunResult execute(const Graph& lowered, const Feeds& feeds) {
  GpuMachine machine(gpu());  // NoGpu first: without a GPU nothing else matters
  return execute_on(machine, lowered, feeds);
}

RunResult run(const Graph& g, const Feeds& feeds) {
  (void)gpu();
  return execute(*lower_cached(g), feeds);
}

// --- the benchmark's timing entry -----------------------------------------------------------

struct AttentionBench::State {
  const Gpu* gpu = nullptr;
  cpu::AttentionSpec spec;
  std::int64_t batch = 0, len_q = 0, len_k = 0;
  std::vector<std::unique_ptr<qkv::cuda::Buffer>> bufs;  // q, k, v, out
  const Compiled* kernel = nullptr;
  Dim3 grid;
  std::vector<ParamValue> params;
  bool backward = false;
  const Compiled* merge = nullptr;  // the decode kernel's merge, when it splits the keys; the backward's dkdv
  Dim3 merge_grid;
  std::vector<ParamValue> merge_params;
  std::string kernel_text, device_text;
};

namespace {
std::unique_ptr<qkv::cuda::Buffer> random_buffer(const Gpu& g, std::int64_t count, unsigned seed,
                                                 DType storage = DType::f32) {
  // A seeded block of values repeated over the buffer: the timing does not depend on the data,
  // and this keeps set-up short for the largest problems (GiBs). bf16 storage: their bf16 bits.
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> block(static_cast<std::size_t>(std::min<std::int64_t>(count, 1 << 20)));
  for (float& x : block) x = dist(gen);
  if (storage == DType::bf16) {
    std::vector<std::uint16_t> bits(block.size());
    for (std::size_t i = 0; i < block.size(); ++i) bits[i] = f32_to_bf16(block[i]);
    std::vector<std::uint16_t> host(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < host.size(); i += bits.size())
      std::memcpy(host.data() + i, bits.data(), std::min(bits.size(), host.size() - i) * 2);
    auto b = std::make_unique<qkv::cuda::Buffer>(g.device.alloc(host.size() * 2));
    b->upload(host.data(), host.size() * 2);
    return b;
  }
  std::vector<float> host(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < host.size(); i += block.size())
    std::memcpy(host.data() + i, block.data(), std::min(block.size(), host.size() - i) * sizeof(float));
  auto b = std::make_unique<qkv::cuda::Buffer>(g.device.alloc(host.size() * sizeof(float)));
  b->upload(host.data(), host.size() * sizeof(float));
  return b;
}
}  // namespace

AttentionBench::AttentionBench(const cpu::AttentionSpec& spec, std::int64_t batch, std::int64_t len_q,
                               std::int64_t len_k, bool backward)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.gpu = &gpu();
  s.spec = spec;
  s.backward = backward;
  s.spec.write_weights = false;
  s.spec.key_padding = false;
  s.spec.bias = false;
  if (!s.spec.tensors.empty())
    throw std::runtime_error("attention bench: the mod loads tensors, which the bench does not make");
  s.batch = batch;
  s.len_q = len_q;
  s.len_k = len_k;
  auto ptr = [](const qkv::cuda::Buffer& b) { return ParamValue{Arg::Kind::buffer, b.ptr(), 0, 0.0f}; };
  auto i64 = [](std::int64_t v) { return ParamValue{Arg::Kind::i64, 0, v, 0.0f}; };
  const ParamValue null{};
  s.device_text = s.gpu->device.name() + " (sm_" + std::to_string(s.gpu->sm) + ")";
  if (backward) {
    // The plan's two launches of a fused_attention_backward: dq (D, dQ), then dkdv (dK, dV).
    nvptx::AttentionBackwardKernel dq;
    dq.spec = s.spec;
    nvptx::AttentionBackwardKernel dkdv = dq;
    dkdv.part = nvptx::AttentionBackwardKernel::Part::dkdv;
    std::string why;
    if (!nvptx::attention_backward_supported(dq, &why) || !nvptx::attention_backward_supported(dkdv, &why))
      throw std::runtime_error(why);
    s.grid = nvptx::attention_backward_grid(dq, batch, len_q, len_k);
    s.merge_grid = nvptx::attention_backward_grid(dkdv, batch, len_q, len_k);
    if (empty_grid(s.grid) || !fits(s.grid) || empty_grid(s.merge_grid) || !fits(s.merge_grid))
      throw std::runtime_error("attention bench: nothing to launch or grid too large");
    const std::int64_t q_n = batch * spec.hq * len_q * spec.dk, o_n = batch * spec.hq * len_q * spec.dv,
                       k_n = batch * spec.hkv * len_k * spec.dk, v_n = batch * spec.hkv * len_k * spec.dv,
                       rows = batch * spec.hq * len_q;
    // q, k, v, out, dO and the gradients as stored (f32, or bf16: the tensor-core kernels); lse, delta f32.
    const DType st = s.spec.storage;
    const std::size_t elem = st == DType::bf16 ? 2 : sizeof(float);
    unsigned seed = 1;
    for (std::int64_t n : {q_n, k_n, v_n, o_n, o_n}) s.bufs.push_back(random_buffer(*s.gpu, n, seed++, st));
    s.bufs.push_back(random_buffer(*s.gpu, rows, seed++));  // lse
    s.bufs.push_back(
        std::make_unique<qkv::cuda::Buffer>(s.gpu->device.alloc(static_cast<std::size_t>(rows) * sizeof(float))));
    for (std::int64_t n : {q_n, k_n, v_n})  // dq, dk, dv
      s.bufs.push_back(std::make_unique<qkv::cuda::Buffer>(s.gpu->device.alloc(static_cast<std::size_t>(n) * elem)));
    for (const auto& b : s.bufs) s.params.push_back(ptr(*b));
    for (ParamValue v : {null, null, null, null, i64(batch), i64(len_q), i64(len_k), i64(0)}) s.params.push_back(v);
    s.merge_params = s.params;
    s.kernel = &compiled(*s.gpu, dq);
    s.merge = &compiled(*s.gpu, dkdv);
    s.kernel_text = s.kernel->name + " + " + s.merge->name +
                    (st == DType::bf16 ? " (bf16 backward, tensor cores) threads " : " (fp32 backward) threads ") +
                    std::to_string(dq.threads) + " smem " + std::to_string(s.kernel->shared_bytes / 1024) + " + " +
                    std::to_string(s.merge->shared_bytes / 1024) + " KiB";
    launch_ms(1);  // warm-up
    return;
  }
  if (len_q <= nvptx::kDecodeQueries && nvptx::decode_attention_supported(s.spec, nullptr)) {
    // A few query rows: the split-KV decode kernel and, when it splits the keys, its merge — the
    // launches the plan makes for such a call.
    const nvptx::DecodeAttentionKernel dk{s.spec};
    const nvptx::DecodeMergeKernel mk{s.spec};
    const nvptx::DecodeSplit split = nvptx::decode_split(dk, batch, len_q, len_k);
    s.grid = nvptx::decode_grid(dk, batch, len_q, len_k);
    if (empty_grid(s.grid) || !fits(s.grid))
      throw std::runtime_error("attention bench: nothing to launch or grid too large");
    s.bufs.push_back(random_buffer(*s.gpu, batch * spec.hq * len_q * spec.dk, 1));
    s.bufs.push_back(random_buffer(*s.gpu, batch * spec.hkv * len_k * spec.dk, 2));
    s.bufs.push_back(random_buffer(*s.gpu, batch * spec.hkv * len_k * spec.dv, 3));
    s.bufs.push_back(std::make_unique<qkv::cuda::Buffer>(
        s.gpu->device.alloc(static_cast<std::size_t>(batch * spec.hq * len_q * spec.dv) * sizeof(float))));
    ParamValue partials = null;
    if (split.chunks > 1) {
      s.bufs.push_back(std::make_unique<qkv::cuda::Buffer>(s.gpu->device.alloc(
          static_cast<std::size_t>(batch * spec.hq * len_q * split.chunks * cpu::decode_record_floats(spec)) *
          sizeof(float))));
      partials = ptr(*s.bufs[4]);
      s.merge = &compiled(*s.gpu, mk);
      s.merge_grid = nvptx::decode_merge_grid(mk, batch, len_q);
      s.merge_params = {ptr(*s.bufs[3]), null, partials, i64(batch), i64(len_q), i64(split.chunks)};
    }
    s.kernel = &compiled(*s.gpu, dk);
    s.params = {ptr(*s.bufs[0]),
                ptr(*s.bufs[1]),
                ptr(*s.bufs[2]),
                ptr(*s.bufs[3]),
                null,
                null,
                null,
                null,
                i64(batch),
                i64(len_q),
                i64(len_k),
                null,
                i64(split.chunk_len),
                partials};
    s.kernel_text = s.kernel->name + " (split-KV decode) chunks " + std::to_string(split.chunks) + " of " +
                    std::to_string(split.chunk_len) + " keys, threads " + std::to_string(dk.threads) +
                    (s.merge ? " + merge" : "");
    launch_ms(1);  // warm-up
    return;
  }
  std::string why;
  const auto kernel = choose_attention_kernel(s.spec, s.gpu->device.max_shared_per_block_optin(), &why);
  if (!kernel) throw std::runtime_error(why);
  const Dim3 grid = nvptx::attention_grid(*kernel, batch, len_q);
  if (empty_grid(grid) || !fits(grid)) throw std::runtime_error("attention bench: nothing to launch or grid too large");
  const DType st = s.spec.storage;  // f32, or bf16 (the tensor-core kernel)
  s.bufs.push_back(random_buffer(*s.gpu, batch * spec.hq * len_q * spec.dk, 1, st));
  s.bufs.push_back(random_buffer(*s.gpu, batch * spec.hkv * len_k * spec.dk, 2, st));
  s.bufs.push_back(random_buffer(*s.gpu, batch * spec.hkv * len_k * spec.dv, 3, st));
  s.bufs.push_back(std::make_unique<qkv::cuda::Buffer>(s.gpu->device.alloc(
      static_cast<std::size_t>(batch * spec.hq * len_q * spec.dv) * (st == DType::bf16 ? 2 : sizeof(float)))));
  s.kernel = &compiled(*s.gpu, *kernel);
  s.grid = grid;
  // All 14 parameters of the kernel (the driver reads as many as the kernel declares; lse last).
  s.params = {ptr(*s.bufs[0]), ptr(*s.bufs[1]), ptr(*s.bufs[2]), ptr(*s.bufs[3]), null, null, null, null, null,
              i64(batch),      i64(len_q),      i64(len_k),      i64(0),          null};
  s.kernel_text = s.kernel->name + (st == DType::bf16 ? " (bf16, tensor cores)" : "") + " block_q " +
                  std::to_string(kernel->block_q) + " block_k " + std::to_string(kernel->block_k) + " threads " +
                  std::to_string(kernel->threads) + " smem " + std::to_string(s.kernel->shared_bytes / 1024) + " KiB";
  launch_ms(1);  // warm-up
}

AttentionBench::~AttentionBench() = default;

double AttentionBench::launch_ms(int launches) {
  State& s = *s_;
  qkv::cuda::Event start = s.gpu->device.event(), stop = s.gpu->device.event();
  start.record();
  for (int i = 0; i < launches; ++i) {
    launch_compiled(*s.kernel, s.grid, s.params);
    if (s.merge) launch_compiled(*s.merge, s.merge_grid, s.merge_params);
  }
  stop.record();
  return static_cast<double>(qkv::cuda::Event::elapsed_ms(start, stop)) / std::max(1, launches);
}

double AttentionBench::flops() const {
  return s_->backward ? cpu::attention_backward_flops(s_->spec, s_->batch, s_->len_q, s_->len_k)
                      : cpu::attention_flops(s_->spec, s_->batch, s_->len_q, s_->len_k);
}
const std::string& AttentionBench::kernel() const { return s_->kernel_text; }
const std::string& AttentionBench::device() const { return s_->device_text; }

}  // namespace qkv::codegen::cuda
