// The CPU code generator: one LLVM module for a whole lowered graph (module_builder.hpp).
//
//   i32 <f>_entry(const i64* sizes, void* const* args, i32 threads)
//     load the dynamic sizes; check them (2 when invalid)
//     arena = aligned_alloc(64, its size for these sizes) (1 when that fails)
//     for each node, in graph order: its code, reading its inputs' buffers, writing its own
//       (a call: each node's code is outlined into a function of its own, outline_node_regions)
//     copy the outputs not computed in place into their arguments; free(arena); return 0
//
// Every size is an ir::Int: a constant when the size is fixed (the builder folds the arithmetic,
// so specialised code has the constants a specialising compiler would write), a run-time value
// otherwise. Values live in the arena slots plan_module chose; leaves are the arguments, views
// share their input's buffer, and outputs are computed in place where they can be. Kernels
// (attention, GEMM, row-wise) are emitted into the same module with internal linkage.
#include "cpu/module/module_builder_impl.hpp"

#include <cstddef>

#include <llvm/IR/Instructions.h>

#include <qkv/runtime/io/array.hpp>

namespace qkv::codegen::cpu {

namespace detail {

llvm::Value* ModuleBuilder::aligned_alloc(const I& bytes) {
  auto* fn = m_.getOrInsertFunction("aligned_alloc", ptr_, i64_, i64_).getCallee();
  const I size = round_up(imax(bytes, 64), 64);
  llvm::Value* p = b_.CreateCall(llvm::cast<llvm::Function>(fn), {c64(64).v(), size.v()});
  if (target_.triple.find("linux") != std::string::npos) {
    const I at(b_, b_.CreatePtrToInt(p, i64_));
    const I start = round_up(at, 4096), end = (at + size) / 4096 * 4096;
    const auto big = static_cast<std::int64_t>(qkv::detail::kHugePageBytes);  // the runtime's threshold too
    branch(ir::Bool(b_, b_.CreateIsNotNull(p)) && end - start >= big, [&] {
      auto* madvise = m_.getOrInsertFunction("madvise", i32_, ptr_, i64_, i32_).getCallee();
      constexpr int kMadvHugepage = 14;  // <sys/mman.h>
      b_.CreateCall(llvm::cast<llvm::Function>(madvise),
                    {b_.CreateIntToPtr(start.v(), ptr_), (end - start).v(), b_.getInt32(kMadvHugepage)});
    });
  }
  return p;
}

std::vector<llvm::BasicBlock*> ModuleBuilder::emit_region(const std::function<void()>& body) {
  auto* start = llvm::BasicBlock::Create(ctx_, "node", fn_);
  before_region_ = b_.CreateBr(start);
  b_.SetInsertPoint(start);
  body();
  before_region_ = nullptr;
  auto* next = llvm::BasicBlock::Create(ctx_, "next", fn_);
  b_.CreateBr(next);
  b_.SetInsertPoint(next);
  // The node's blocks: appended to the function after `start`, as the builder creates them.
  std::vector<llvm::BasicBlock*> region;
  for (auto it = start->getIterator(); &*it != next; ++it) region.push_back(&*it);
  return region;
}

/// y[M, N] = x[M, K]·W[N, K]ᵀ + b on the GEMM kernel: Bᵀ packed into panels of NR columns
/// (zero-padded), the bias padded alike, then the tasks of schedule.hpp's gemm_blocks.
void ModuleBuilder::emit_gemm(int id) {
  const Node& n = g_.node(id);
  const Dims w = shape(n.inputs[1]);
  const I nn = w[0], k = w[1];
  const I m = pick(k > 0, numel(shape(n.inputs[0])) / imax(k, 1), c64(0));
  llvm::Value *x = buf(n.inputs[0]), *wt = buf(n.inputs[1]), *y = buf(id);
  llvm::Value* bias = n.inputs.size() > 2 ? buf(n.inputs[2]) : nullptr;
  branch(
      k == 0,
      [&] {  // an empty sum: the bias alone
        const I rows = pick(nn > 0, numel(shape(id)) / imax(nn, 1), c64(0));
        nest({rows, nn}, {{nn, c64(1)}}, {c64(0)}, [&](const Dims& idx, const Dims& off) {
          store(bias ? load(f32_, bias, idx[1]) : llvm::ConstantFP::get(f32_, 0.0), y, off[0]);
        });
      },
      [&] { emit_gemm_call(id, x, wt, bias, y, m, nn, k); });
}

GemmConfig ModuleBuilder::gemm_config(int id) const { return plan_.gemm_config.at(id); }

void ModuleBuilder::emit_gemm_call(int id, llvm::Value* x, llvm::Value* wt, llvm::Value* bias, llvm::Value* y,
                                   const I& m, const I& nn, const I& k) {
  gemm_cfg_ = gemm_config(id);
  auto [packed, bias_pad] = gemm_blocks_.at(id);
  if (gemm_cfg_.quant_group > 0) {  // wt is its q (the dequantize's buffer), the scales its second input
    emit_pad_bias(bias, bias_pad, nn);
    emit_quantized_linear(id, wt, buf(g_.node(g_.node(id).inputs[1]).inputs[1]), packed, bias_pad, y, m, nn, k);
    return;
  }
  if (const std::int64_t group = gemm_cfg_.round_group; group > 0) {  // W dequantized into memory
    emit_round_activations(g_.node(id).inputs[0], group, packed, m, k, /*int8=*/false);
    x = packed;
    packed = b_.CreateGEP(i8_, packed, round_up(rounded_activation_bytes(group, m, k), 64).v());
  }
  // A prepared linear under a handle: its panels and padded bias were made once, by prepare.
  const auto it = std::find(plan_.prepared.begin(), plan_.prepared.end(), id);
  ir::Bool pack(b_, b_.getTrue());
  if (it != plan_.prepared.end()) {
    const std::size_t j = slot_prepared(static_cast<std::size_t>(it - plan_.prepared.begin()));
    pack = unprepared();
    llvm::Value* at = ir::entry_alloca(b_, ptr_, 2, 8, "panels_at");
    llvm::Value* at_bias = b_.CreateConstGEP1_64(ptr_, at, 1);
    b_.CreateStore(packed, at);
    b_.CreateStore(bias_pad, at_bias);
    // The slots' address comes in as an argument: the same linear of every layer outlines to one
    // function (merge_identical_functions).
    llvm::Value* slots = outside_region([&] { return slot(handle_, j); });
    branch(prepared(), [&] {
      b_.CreateStore(b_.CreateLoad(ptr_, slots), at);
      b_.CreateStore(b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(i64_, slots, 1)), at_bias);
    });
    packed = b_.CreateLoad(ptr_, at);
    bias_pad = b_.CreateLoad(ptr_, at_bias);
  }
  branch(pack, [&] { emit_pad_bias(bias, bias_pad, nn); });
  // A few rows (a decode step): the GEMV kernel reads W in place.
  branch(
      m <= kGemvMaxRows, [&] { emit_gemv_call(x, wt, bias_pad, y, m, nn, k, nullptr); },
      [&] {
        branch(pack, [&] { emit_pack_panels(wt, packed, nn, k); });
        emit_gemm_packed(x, packed, bias_pad, y, m, nn, k);
      });
}

void ModuleBuilder::emit_pad_bias(llvm::Value* bias, llvm::Value* bias_pad, const I& nn) {
  memset0(bias_pad, ceil_div(nn, gemm_cfg_.cols()) * gemm_cfg_.cols() * 4);
  if (bias) b_.CreateMemCpy(bias_pad, llvm::MaybeAlign(4), bias, llvm::MaybeAlign(4), (nn * 4).v());
}

/// bp[(p·K + kk)·NR + r] = W[p·NR + r][kk] (f32; a bf16 or f16 W's bits as they are, half_panels;
/// a quantized W's q · scale, exact: an 8-bit or 4-bit integer times an f16); zeros past N. With dpbf16 the
/// panels hold pairs of K: bf16 element ((p·K2 + kk / 2)·NR + r)·2 + kk % 2, K2 = ceil(K / 2),
/// zeros past N and past K. The whole panels are shared out among the threads. `columns`: W
/// (f32 or bf16) given as B itself, [K, N] rows (W[row][kk] at kk·N + row).
void ModuleBuilder::emit_pack_panels(llvm::Value* wt, llvm::Value* packed, const I& nn, const I& k, llvm::Value* scales,
                                     bool columns) {
  const std::int64_t nr = gemm_cfg_.cols();
  if (columns && gemm_cfg_.quant_group > 0) internal_error("codegen: quantized panels from [K, N] rows");
  const I panels = ceil_div(nn, nr);
  const I full = nn / nr, rest = nn % nr;
  const I zero = c64(0), one = c64(1), two = c64(2);
  // W's strides: a row, a step of K.
  const I row_step = columns ? one : k, k_step = columns ? nn : one;
  if (gemm_cfg_.dpbf16) {
    llvm::Type* i16 = b_.getInt16Ty();
    const I k2 = ceil_div(k, 2), whole = k / 2, odd = k % 2;
    const I panel = k2 * (nr * 2), pair = c64(nr * 2);
    auto copy = [&](const Dims&, const Dims& off) { store(load(i16, wt, off[1]), packed, off[0]); };
    branch(rest != 0 || odd != 0, [&] { memset0(packed, panels * panel * 2); });
    // Whole panels, W as rows: `lanes` rows × `lanes` pairs at a time, a pair of a row one 32-bit
    // word, the block transposed in registers (each pair of K then one vector of columns). B given
    // as [K, N] rows (columns): a pair of K is two rows' `lanes` columns, interleaved.
    I kdone = zero;
    if (columns && nr % gemm_cfg_.lanes == 0) {
      const int lanes = gemm_cfg_.lanes;
      auto* half = llvm::FixedVectorType::get(i16, static_cast<unsigned>(lanes));
      kdone = whole;
      nest_parallel({full, whole, c64(nr / lanes)}, {}, {}, c64(lanes), [&](const Dims& i, const Dims&) {
        const I col = i[0] * nr + i[2] * lanes;
        auto row = [&](const I& kk) {
          return b_.CreateAlignedLoad(half, b_.CreateGEP(i16, wt, (kk * nn + col).v()), llvm::Align(2));
        };
        b_.CreateAlignedStore(b_.CreateShuffleVector(row(i[1] * 2), row(i[1] * 2 + 1), ir::interleave_halves(lanes)),
                              b_.CreateGEP(i16, packed, (i[0] * panel + i[1] * pair + i[2] * lanes * 2).v()),
                              llvm::Align(4));
      });
    }
    if (!columns && nr % gemm_cfg_.lanes == 0) {
      const int lanes = gemm_cfg_.lanes;
      auto* words = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(lanes));
      const I blocks = whole / lanes;
      kdone = blocks * lanes;
      nest_parallel({full, c64(nr / lanes), blocks}, {}, {}, c64(lanes * lanes), [&](const Dims& i, const Dims&) {
        const I row0 = i[0] * nr + i[1] * lanes, kp0 = i[2] * lanes;
        std::vector<llvm::Value*> rows;
        for (int j = 0; j < lanes; ++j)
          rows.push_back(
              b_.CreateAlignedLoad(words, b_.CreateGEP(i16, wt, ((row0 + j) * k + kp0 * 2).v()), llvm::Align(2)));
        rows = ir::transpose_square(b_, std::move(rows));  // rows[w]: pair kp0 + w of each row
        for (int w = 0; w < lanes; ++w)
          b_.CreateAlignedStore(rows[static_cast<std::size_t>(w)],
                                b_.CreateGEP(i16, packed, (i[0] * panel + (kp0 + w) * pair + i[1] * lanes * 2).v()),
                                llvm::Align(4));
      });
    }
    // The rest of the whole panels: (p, kp, r, half); then the last K of each row when K is odd.
    nest_parallel({full, whole - kdone, c64(nr), two},
                  {{panel, pair, two, one}, {row_step * nr, k_step * 2, row_step, k_step}},
                  {kdone * pair, kdone * k_step * 2}, c64(2), copy);
    branch(odd != 0, [&] {
      nest({full, c64(nr)}, {{panel, two}, {row_step * nr, row_step}}, {whole * pair, (k - 1) * k_step}, copy);
    });
    // The last panel's `rest` columns.
    nest({whole, rest, two}, {{pair, two, one}, {k_step * 2, row_step, k_step}}, {full * panel, full * nr * row_step},
         copy);
    branch(odd != 0, [&] {
      nest({rest}, {{two}, {row_step}}, {full * panel + whole * pair, full * nr * row_step + (k - 1) * k_step}, copy);
    });
    return;
  }
  const bool halves = half_panels(gemm_cfg_);  // W's bits as they are, 2 bytes an entry
  llvm::Type* elem_t = halves ? b_.getInt16Ty() : f32_;
  branch(rest != 0, [&] { memset0(packed, panels * k * nr * (halves ? 2 : 4)); });
  // Whole panels of W as rows a lanes × lanes tile at a time (each row's `lanes` entries loaded —
  // f32 or 16-bit as they are, or dequantized — as a vector, the tile transposed in registers): the
  // panels are packed on every call but a prepared one (a quantized W's always). What is left
  // (K's last entries short of a vector, the last panel's `rest` rows; B given as [K, N]) goes
  // entry by entry below.
  I kdone = c64(0);
  const bool quantized = gemm_cfg_.quant_group > 0;
  if (!columns && nr % gemm_cfg_.lanes == 0 && (!quantized || gemm_cfg_.quant_group % gemm_cfg_.lanes == 0)) {
    const int lanes = gemm_cfg_.lanes;
    auto* vf = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes));
    auto* vb = llvm::FixedVectorType::get(i8_, static_cast<unsigned>(lanes));
    auto* vh = llvm::FixedVectorType::get(b_.getInt16Ty(), static_cast<unsigned>(lanes));
    const I group = c64(std::max(gemm_cfg_.quant_group, 1)), groups = ceil_div(k, group), chunks = k / lanes;
    nest_parallel({full, c64(nr / lanes), chunks}, {}, {}, c64(lanes * lanes * 4), [&](const Dims& i, const Dims&) {
      const I kk = i[2] * lanes;
      std::vector<llvm::Value*> tile;
      for (int j = 0; j < lanes; ++j) {
        const I row = i[0] * nr + i[1] * lanes + j;
        if (!quantized) {
          tile.push_back(halves ? b_.CreateAlignedLoad(vh, b_.CreateGEP(elem_t, wt, (row * k + kk).v()), llvm::Align(2))
                                : b_.CreateAlignedLoad(vf, b_.CreateGEP(f32_, wt, (row * k + kk).v()), llvm::Align(4)));
          continue;
        }
        llvm::Value* scale = ir::half_to_f32(b_, load(b_.getInt16Ty(), scales, row * groups + kk / group), false);
        llvm::Value* q;
        if (gemm_cfg_.q4) {  // one nibble of `lanes` bytes (a vector never straddles a group's halves)
          q = b_.CreateAlignedLoad(vb, b_.CreateGEP(i8_, wt, (row * (k / 2) + q4_byte(kk, group)).v()), llvm::Align(1));
          q = ir::q4_nibbles(b_, q, q4_high(kk, group).v(), /*centered=*/true);
        } else {
          q = b_.CreateAlignedLoad(vb, b_.CreateGEP(i8_, wt, (row * k + kk).v()), llvm::Align(1));
        }
        tile.push_back(
            b_.CreateFMul(b_.CreateSIToFP(q, vf), b_.CreateVectorSplat(static_cast<unsigned>(lanes), scale)));
      }
      tile = ir::transpose_square(b_, std::move(tile));
      for (int t = 0; t < lanes; ++t)
        b_.CreateAlignedStore(tile[t], b_.CreateGEP(elem_t, packed, ((i[0] * k + kk + t) * nr + i[1] * lanes).v()),
                              llvm::Align(halves ? 2 : 4));
    });
    kdone = chunks * lanes;
  }
  // Element (row, kk) of W, at offset `at` of wt.
  auto weight = [&](const I& row, const I& kk, const I& at) -> llvm::Value* {
    if (gemm_cfg_.quant_group > 0) {
      const I group = c64(gemm_cfg_.quant_group);
      llvm::Value* s = load(b_.getInt16Ty(), scales, row * ceil_div(k, group) + kk / group);
      llvm::Value* q = gemm_cfg_.q4 ? q4_entry(wt, row * (k / 2), kk, group) : load(i8_, wt, at);
      return b_.CreateFMul(b_.CreateSIToFP(q, f32_), ir::half_to_f32(b_, s, /*brain=*/false));
    }
    return load(elem_t, wt, at);  // f32, or (halves) the bits as they are
  };
  // Whole panels (p, kk, r) from kdone on, then the last panel's `rest` columns (kk, r).
  nest_parallel({full, k - kdone, c64(nr)}, {{k * nr, c64(nr), one}, {row_step * nr, k_step, row_step}},
                {kdone * nr, kdone * k_step}, c64(2), [&](const Dims& i, const Dims& off) {
                  store(weight(i[0] * nr + i[2], kdone + i[1], off[1]), packed, off[0]);
                });
  nest({k, rest}, {{c64(nr), one}, {k_step, row_step}}, {full * k * nr, full * nr * row_step},
       [&](const Dims& i, const Dims& off) { store(weight(full * nr + i[1], i[0], off[1]), packed, off[0]); });
}

void ModuleBuilder::emit_gemv_call(llvm::Value* x, llvm::Value* wt, llvm::Value* bias_pad, llvm::Value* y, const I& m,
                                   const I& nn, const I& k, llvm::Value* scales) {
  auto kernel = [&](int rows) {
    const std::string name =
        "qkv_gemv" + std::string(half_suffix(gemm_cfg_)) + "_" +
        (gemm_cfg_.quant_group > 0 ? (gemm_cfg_.q4 ? "q4g" : "q8g") + std::to_string(gemm_cfg_.quant_group) + "_"
                                   : "") +
        std::to_string(rows);
    if (!m_.getFunction(name)) emit_gemv_kernel(m_, gemm_cfg_, rows, name);
    return callee(name);
  };
  auto* args_type = llvm::StructType::get(ctx_, {ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_, ptr_});
  llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "gemv_args");
  const Values fields{x, wt, bias_pad, y, m.v(), nn.v(), k.v(), scales ? scales : llvm::ConstantPointerNull::get(ptr_)};
  for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
  auto run = [&](int rows) {
    llvm::Function* fn = kernel(rows);
    const Ranges<I> r = ranges(nn, 4 * gemv_outputs(rows, gemm_cfg_.lanes), gemv_outputs(rows, gemm_cfg_.lanes));
    parallel_for(r.tasks, m * nn * k * 2, [&](I t) {
      const I n0 = t * r.block;
      b_.CreateCall(fn, {args, n0.v(), imin(n0 + r.block, nn).v()});
    });
  };
  branch(m == 1, [&] { run(1); }, [&] { branch(m == 2, [&] { run(2); }, [&] { run(kGemvMaxRows); }); });
}

/// The GEMM kernel's tasks over x and the packed panels.
void ModuleBuilder::emit_gemm_packed(llvm::Value* x, llvm::Value* packed, llvm::Value* bias_pad, llvm::Value* y,
                                     const I& m, const I& nn, const I& k, llvm::Value* x_scales) {
  const std::string name =
      gemm_cfg_.int8_dot ? "qkv_gemm_i8g" + std::to_string(gemm_cfg_.quant_group)
                         : "qkv_gemm" + std::string(half_suffix(gemm_cfg_)) + (gemm_cfg_.a_transposed ? "_at" : "");
  auto* args_type = llvm::StructType::get(ctx_, {ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_, ptr_});
  llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "gemm_args");
  const Values fields{x,     packed, bias_pad, y,
                      m.v(), nn.v(), k.v(),    x_scales ? x_scales : llvm::ConstantPointerNull::get(ptr_)};
  for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
  auto tasks = [&](const GemmConfig& cfg, const std::string& kernel_name) {
    if (!m_.getFunction(kernel_name)) emit_gemm_kernel(m_, cfg, kernel_name);
    llvm::Function* kernel = callee(kernel_name);
    const GemmBlocks<I> blocks = gemm_blocks(m, nn, cfg.rows, cfg.cols(), a_in_place(cfg));
    const I cols = blocks.panels_per * cfg.cols();
    parallel_for(blocks.tasks(), m * nn * k * 2, [&](I t) {
      const I m0 = (t / blocks.nblocks) * blocks.mc, n0 = (t % blocks.nblocks) * cols;
      b_.CreateCall(kernel, {args, m0.v(), imin(m0 + blocks.mc, m).v(), n0.v(), imin(n0 + cols, nn).v()});
    });
  };
  GemmConfig small = gemm_cfg_;
  small.rows = gemm_cfg_.small_rows;
  if (small.rows <= 0 || small.rows >= gemm_cfg_.rows) return tasks(gemm_cfg_, name);
  // Few rows that the small tile covers with fewer rows computed (16: two tiles of 8, not 12 + 12).
  branch(
      m <= 2 * gemm_cfg_.rows && round_up(m, small.rows) < round_up(m, gemm_cfg_.rows),
      [&] { tasks(small, name + "_r" + std::to_string(small.rows)); }, [&] { tasks(gemm_cfg_, name); });
}

std::pair<llvm::Value*, llvm::Value*> ModuleBuilder::mod_tensor_arrays(const Node& n, const AttentionCall& call) {
  llvm::Value* null = llvm::ConstantPointerNull::get(ptr_);
  if (call.tensor_inputs.empty()) return {null, null};
  std::size_t rank_sum = 0;
  for (int m : call.tensor_inputs) rank_sum += g_.node(n.inputs[static_cast<std::size_t>(m)]).axes.size();
  llvm::Value* tensors = ir::entry_alloca(b_, ptr_, call.tensor_inputs.size(), 8, "mod_tensors");
  llvm::Value* extents = ir::entry_alloca(b_, i64_, std::max<std::size_t>(rank_sum, 1), 8, "mod_extents");
  std::uint64_t e = 0;
  for (std::size_t t = 0; t < call.tensor_inputs.size(); ++t) {
    const int tid = n.inputs[static_cast<std::size_t>(call.tensor_inputs[t])];
    b_.CreateStore(buf(tid), b_.CreateConstInBoundsGEP1_64(ptr_, tensors, t));
    for (const auto& x : g_.node(tid).axes)
      b_.CreateStore(dim(x.extent).v(), b_.CreateConstInBoundsGEP1_64(i64_, extents, e++));
  }
  return {tensors, extents};
}

void ModuleBuilder::emit_attention(int id) {
  const AttentionCall& call = plan_.attention.at(id);
  const AttentionSpec& spec = call.spec;
  if (spec.dk < 1 || spec.dv < 1 || spec.hq < 1 || spec.hkv < 1 || spec.hq % spec.hkv != 0)
    throw std::invalid_argument("codegen: fused attention with dk " + std::to_string(spec.dk) + ", dv " +
                                std::to_string(spec.dv) + ", " + std::to_string(spec.hq) + " query heads over " +
                                std::to_string(spec.hkv) + " key/value heads cannot be compiled");
  if (!(spec.dropout_p >= 0.0 && spec.dropout_p < 1.0))
    throw std::invalid_argument("codegen: dropout probability must be in [0, 1)");
  const Node& n = g_.node(id);
  const KernelConfig cfg = choose_kernel_config(spec, target_);
  const std::string name = "qkv_attention_" + std::to_string(id);
  const I batch = dim(call.batch), lq = dim(call.len_q), lk = dim(call.len_k);

  llvm::Value* null = llvm::ConstantPointerNull::get(ptr_);
  const auto [tensors, extents] = mod_tensor_arrays(n, call);
  llvm::Value* weights = spec.write_weights ? weights_.at(id) : null;
  llvm::Value* lse = spec.write_lse ? lse_.at(id) : null;
  const auto cache = plan_.kv_rows.find(id);  // K and V read in place out of KV caches
  llvm::Value* kv_rows = (cache != plan_.kv_rows.end() ? dim(cache->second) : c64(0)).v();

  // AttentionArgs, field by field (attention.hpp: its layout is the kernel ABI).
  auto* args_type = llvm::StructType::get(
      ctx_, {ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_, i64_, ptr_, i64_});
  llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "attention_args");
  const Values fields{buf(n.inputs[0]),
                      buf(n.inputs[1]),
                      buf(n.inputs[2]),
                      buf(id),
                      weights,
                      null,
                      null,
                      tensors,
                      extents,
                      batch.v(),
                      lq.v(),
                      lk.v(),
                      c64(static_cast<std::int64_t>(call.seed)).v(),
                      lse,
                      kv_rows};
  for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
  const I bh = batch * spec.hq;
  const I work = bh * lq * lk * (spec.dk + spec.dv) * 2;
  auto fused = [&] {
    emit_attention_kernel(m_, spec, cfg, name);
    llvm::Function* kernel = callee(name);
    const std::int64_t rows = cfg.query_rows();
    const I blocks = ceil_div(lq, rows);
    const bool causal = triangular_work(spec);
    parallel_for(bh * blocks, work, [&](I t) {
      const AttentionTask<I> task = attention_task(t, blocks, spec.hq, spec.hkv, causal);
      b_.CreateCall(kernel, {args, task.batch.v(), task.head.v(), (task.row_block * rows).v()});
    });
  };
  const auto decode = plan_.decode.find(id);
  const auto fixed_lq = lq.constant();
  if (decode == plan_.decode.end() || (fixed_lq && *fixed_lq > decode->second.max_queries)) {
    fused();
    return;
  }
  // A few query rows: the split-KV decode kernel (the same split as run_attention's).
  const ModulePlan::Decode& d = decode->second;
  emit_decode_kernels(m_, spec, cfg, name + "_decode");
  llvm::Function* chunk_kernel = callee(name + "_decode");
  llvm::Function* merge = callee(name + "_decode_merge");
  branch(
      lq <= d.max_queries,
      [&] {
        const I units = batch * spec.hkv * d.config.nblocks * lq;
        const SplitKv<I> split = split_kv(units, lk, d.config.key_tile, spec.decode_chunk);
        llvm::Value* partials = b_.CreateSelect((split.chunks > 1).v(), split_.at(id), null);
        parallel_for(units * split.chunks, work, [&](I t) {
          b_.CreateCall(chunk_kernel, {args, (t / split.chunks).v(), (t % split.chunks).v(), split.chunk_len.v(),
                                       split.chunks.v(), partials});
        });
        branch(split.chunks > 1, [&] {
          parallel_for(units, units * split.chunks * spec.dv * 4,
                       [&](I u) { b_.CreateCall(merge, {args, u.v(), split.chunks.v(), partials}); });
        });
      },
      fused);
}

void ModuleBuilder::emit_backward(int id) {
  const ModulePlan::Backward& bw = plan_.backward.at(id);
  const AttentionSpec& spec = bw.call.spec;
  const BackwardConfig& cfg = bw.config;
  const BackwardBuffers& bufs = backward_.at(id);
  const Node& n = g_.node(id);
  const I batch = dim(bw.call.batch), lq = dim(bw.call.len_q), lk = dim(bw.call.len_k);
  const I rows = batch * spec.hq * lq;  // query rows over every (batch, query head)

  // D = rowsum(dO ∘ O), row by row, in double (O and dO widened from their storage).
  parallel_ranges(rows, 64, 1, c64(spec.dv * 2), [&](I r0, I r1) {
    loop(
        r0, r1,
        [&](I r) {
          llvm::Value* d = sum(c64(spec.dv), [&](const I& k) {
            const I at = r * spec.dv + k;
            return b_.CreateFMul(b_.CreateFPExt(value(n.inputs[3], at), f64_),
                                 b_.CreateFPExt(value(n.inputs[4], at), f64_));
          });
          store(b_.CreateFPTrunc(d, f32_), bufs.delta, r);
        },
        "bwd.delta");
  });

  // The tasks (batch, kv head, chunk of key blocks): each owns its dK / dV rows and adds into
  // its own chunk's dQ partial sums (zeroed first).
  const BackwardChunks<I> split = backward_chunks(batch * spec.hkv, ceil_div(lk, std::int64_t{cfg.keys}));
  const I padded = round_up(lq, cfg.rows);
  const I per_chunk = batch * spec.hq * padded * cfg.dkp;
  memset0(bufs.partial, split.chunks * per_chunk * 4);
  llvm::Value* null = llvm::ConstantPointerNull::get(ptr_);
  const auto [tensors, extents] = mod_tensor_arrays(n, bw.call);
  llvm::Value* args = ir::entry_alloca(b_, i8_, sizeof(AttentionBackwardArgs), 8, "backward_args");
  auto set = [&](std::size_t offset, llvm::Value* v) {
    b_.CreateStore(v, b_.CreateConstInBoundsGEP1_64(i8_, args, offset));
  };
  constexpr std::size_t fwd = offsetof(AttentionBackwardArgs, forward);
  set(fwd + offsetof(AttentionArgs, q), buf(n.inputs[0]));
  set(fwd + offsetof(AttentionArgs, k), buf(n.inputs[1]));
  set(fwd + offsetof(AttentionArgs, v), buf(n.inputs[2]));
  set(fwd + offsetof(AttentionArgs, out), buf(n.inputs[3]));
  set(fwd + offsetof(AttentionArgs, weights), null);
  set(fwd + offsetof(AttentionArgs, key_keep), null);
  set(fwd + offsetof(AttentionArgs, bias), null);
  set(fwd + offsetof(AttentionArgs, tensors), tensors);
  set(fwd + offsetof(AttentionArgs, extents), extents);
  set(fwd + offsetof(AttentionArgs, batch), batch.v());
  set(fwd + offsetof(AttentionArgs, len_q), lq.v());
  set(fwd + offsetof(AttentionArgs, len_k), lk.v());
  set(fwd + offsetof(AttentionArgs, seed), c64(static_cast<std::int64_t>(bw.call.seed)).v());
  set(fwd + offsetof(AttentionArgs, lse), buf(n.inputs[5]));
  set(fwd + offsetof(AttentionArgs, kv_rows), c64(0).v());
  set(offsetof(AttentionBackwardArgs, d_out), buf(n.inputs[4]));
  set(offsetof(AttentionBackwardArgs, dq), buf(id));
  set(offsetof(AttentionBackwardArgs, dk), bufs.dk);
  set(offsetof(AttentionBackwardArgs, dv), bufs.dv);
  set(offsetof(AttentionBackwardArgs, delta), bufs.delta);
  set(offsetof(AttentionBackwardArgs, dq_partial), bufs.partial);
  set(offsetof(AttentionBackwardArgs, chunk_blocks), split.chunk_blocks.v());
  set(offsetof(AttentionBackwardArgs, padded_rows), padded.v());
  set(offsetof(AttentionBackwardArgs, chunks), split.chunks.v());
  // The tensor gradients' partial sums, zeroed: one block per spec.tensor_grads entry, its
  // attention_dtensor nodes the gradient's entries.
  std::vector<I> slots, entries;
  std::vector<std::vector<int>> grad_nodes(spec.tensor_grads.size());
  if (!spec.tensor_grads.empty()) {
    llvm::Value* table = ir::entry_alloca(b_, ptr_, spec.tensor_grads.size(), 8, "tensor_partials");
    for (std::size_t t = 0; t < spec.tensor_grads.size(); ++t) {
      grad_nodes[t] = tensor_grad_nodes(g_, id, spec.tensor_grads[t].tensor);
      I count = c64(1);
      for (const auto& x : g_.node(grad_nodes[t].at(0)).axes) count = count * dim(x.extent);
      entries.push_back(count);
      slots.push_back(tensor_grad_slots(spec.tensor_grads[t], batch, spec.hkv, split.chunks));
      memset0(bufs.tensor_partial.at(t), slots[t] * count * 4);
      b_.CreateStore(bufs.tensor_partial[t], b_.CreateConstInBoundsGEP1_64(ptr_, table, t));
    }
    set(offsetof(AttentionBackwardArgs, tensor_partials), table);
  }
  const std::string name = "qkv_attention_backward_" + std::to_string(id);
  emit_attention_backward(m_, spec, cfg, name);
  llvm::Function* kernel = callee(name);
  const I work = rows * lk * (spec.dk + spec.dv) * 5;  // attention_backward_flops
  parallel_for(batch * spec.hkv * split.chunks, work, [&](I t) {
    const I kv = t / split.chunks;  // batch · hkv + kv head
    b_.CreateCall(kernel, {args, (kv / spec.hkv).v(), (kv % spec.hkv).v(), (t % split.chunks).v()});
  });

  // Σ_k buffer[k · stride + at] for k = 0, 1, …, count − 1 in that order (f32): the partial sums
  // of the tasks, added the same way whatever the thread count.
  auto in_order = [&](llvm::Value* buffer, const I& count, const I& stride, const I& at, const char* label) {
    return ir::emit_loop(
        b_, c64(0).v(), count.v(), 1, {llvm::ConstantFP::get(f32_, 0.0)},
        [&](llvm::Value* k, const std::vector<llvm::Value*>& cur) {
          return std::vector<llvm::Value*>{b_.CreateFAdd(cur[0], load(f32_, buffer, I(b_, k) * stride + at))};
        },
        label)[0];
  };
  // dQ = scale · Σ_chunk partial, stored as dQ is (rounded to bf16 with bf16 storage).
  llvm::Value* scale = llvm::ConstantFP::get(f32_, static_cast<float>(spec.effective_scale()));
  parallel_for(batch * spec.hq, rows * spec.dk * (split.chunks + 1), [&](I bh) {
    loop(
        c64(0), lq,
        [&](I i) {
          const I at = (bh * lq + i) * spec.dk, part = (bh * padded + i) * cfg.dkp;
          loop(
              c64(0), c64(spec.dk),
              [&](I d) {
                put(b_.CreateFMul(in_order(bufs.partial, split.chunks, per_chunk, part + d, "dq.chunks"), scale), id,
                    at + d);
              },
              "dq.cols");
        },
        "dq.rows");
  });

  // Each tensor gradient: its slots added in order, into every attention_dtensor node of it.
  for (std::size_t t = 0; t < spec.tensor_grads.size(); ++t)
    for (int c : grad_nodes[t]) {
      const I count = entries[t];
      llvm::Value *partial = bufs.tensor_partial[t], *to = buf(c);
      parallel_ranges(count, 256, 1, slots[t], [&](I e0, I e1) {
        loop(e0, e1, [&](I e) { store(in_order(partial, slots[t], count, e, "dtensor.slots"), to, e); }, "dtensor.sum");
      });
    }
}

}  // namespace detail

std::unique_ptr<llvm::Module> build_graph_module(llvm::LLVMContext& context, const Graph& lowered,
                                                 const AotSignature& signature, const ModulePlan& plan,
                                                 const HostTarget& target, const std::string& function, bool aot) {
  auto module = std::make_unique<llvm::Module>(function, context);
  detail::ModuleBuilder(*module, lowered, signature, plan, target).build(function, aot);
  // After outlining: one function for the same node of every layer, one for the same packing.
  detail::merge_identical_functions(*module);
  return module;
}

}  // namespace qkv::codegen::cpu
