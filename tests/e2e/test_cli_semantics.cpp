// Flags and state dicts that must not give a silently wrong result (issue 13, items 1–3, 5–7,
// 20, 23, 24, 27, 29): each command sees its own flags; state dicts are checked against the model;
// masks, scales and sizes PyTorch would refuse are refused; an empty key sequence gives zeros on
// every backend.
#include "cli_test.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

using ::testing::HasSubstr;
using ::testing::Not;

namespace qkv {
namespace {

using namespace qkv::test;

double max_diff(const NdArray& a, const NdArray& b) {
  EXPECT_EQ(a.shape, b.shape);
  const auto x = a.to_f32(), y = b.to_f32();
  double d = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) d = std::max(d, std::abs(double(x[i]) - y[i]));
  return d;
}

/// bool [L, L], true above the diagonal (not allowed): the causal mask spelled out.
NdArray upper_triangle(std::int64_t L) {
  NdArray m = NdArray::zeros(DType::boolean, {L, L});
  auto v = m.as<bool>();
  for (std::int64_t i = 0; i < L; ++i)
    for (std::int64_t j = i + 1; j < L; ++j) v[static_cast<std::size_t>(i * L + j)] = true;
  return m;
}

/// A state dict edited: `edit` changes the tensors of fixture `name`.
template <class F>
void edited(const std::string& name, const fs::path& to, F edit) {
  const auto sd = SafetensorsFile::open((fs::path(QKV_FIXTURES_DIR) / name / "weights.safetensors"));
  std::map<std::string, NdArray> t;
  for (const auto& k : sd.names()) t[k] = sd.load(k);
  edit(t);
  write_safetensors(to, t);
}

// Item 1: --causal reaches every command that has it (one flag object per command), and equals
// the same mask written out; --causal with --src-mask is a usage error on both encoder commands.
TEST_F(Cli, CausalIsHonouredByEveryCommand) {
  const std::string layer = "encoder_relu_post";
  edited(layer, tmp("stack.safetensors"), [](auto& t) {
    std::map<std::string, NdArray> s;
    for (auto& [k, v] : t) s["layers.0." + k] = v;
    t = s;
  });
  const NdArray src = read_npy(fixture(layer, "src.npy"));
  const std::int64_t L = src.shape[1];
  write_npy(tmp("tri.npy"), upper_triangle(L));
  struct Command {
    std::string name, base, mask_flag;
  };
  write_sdpa_inputs(dir_, 6, 6);
  const std::vector<Command> commands{
      {"encoder-layer",
       "run encoder-layer --weights " + fixture(layer, "weights.safetensors") + " --src " + fixture(layer, "src.npy") +
           " --heads 4",
       "--src-mask"},
      {"encoder",
       "run encoder --weights " + tmp("stack.safetensors") + " --src " + fixture(layer, "src.npy") + " --heads 4",
       "--src-mask"},
      {"mha",
       "run mha --weights " + fixture("key_padding", "weights.safetensors") + " --query " +
           fixture("key_padding", "query.npy") + " --heads 4",
       "--attn-mask"},
      {"sdpa", "run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy"),
       "--attn-mask"},
  };
  for (const auto& c : commands) {
    // mha's fixture has L = 6, like sdpa's inputs; the encoder's has its own L.
    const std::string tri = c.name == "mha" || c.name == "sdpa" ? tmp("tri6.npy") : tmp("tri.npy");
    if (!fs::exists(tri)) write_npy(tri, upper_triangle(6));
    for (const char* backend : {"reference", "cpu"}) {
      const std::string b = std::string(" --backend ") + backend;
      ASSERT_EQ(run(c.base + b + " -o " + tmp("plain.npy")).code, 0) << c.name;
      const Result causal = run(c.base + b + " --causal -o " + tmp("causal.npy"));
      ASSERT_EQ(causal.code, 0) << c.name << ": " << causal.err;
      const Result spelled = run(c.base + b + " " + c.mask_flag + " " + tri + " -o " + tmp("spelled.npy"));
      ASSERT_EQ(spelled.code, 0) << c.name << ": " << spelled.err;
      EXPECT_LE(max_diff(read_npy(tmp("causal.npy")), read_npy(tmp("spelled.npy"))), 1e-5) << c.name << b;
      EXPECT_GT(max_diff(read_npy(tmp("causal.npy")), read_npy(tmp("plain.npy"))), 1e-3)
          << c.name << b << ": --causal was ignored";
    }
    if (c.mask_flag == "--src-mask") {
      const Result both = run(c.base + " --causal --src-mask " + tri + " -o " + tmp("both.npy"));
      expect_usage_error(both, "alternatives", c.name + " --causal --src-mask");
      EXPECT_FALSE(fs::exists(tmp("both.npy")));
    }
  }
}

// Item 2: layers.0 and layers.2 without layers.1.
TEST_F(Cli, EncoderStackWithALayerGapIsRefused) {
  edited("encoder_relu_post", tmp("gap.safetensors"), [](auto& t) {
    std::map<std::string, NdArray> s;
    for (auto& [k, v] : t) {
      s["layers.0." + k] = v;
      s["layers.2." + k] = v;
    }
    t = s;
  });
  const Result r = run("run encoder --weights " + tmp("gap.safetensors") + " --src " +
                       fixture("encoder_relu_post", "src.npy") + " --heads 4 -o " + tmp("o.npy"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("has 'layers.2.*' but no 'layers.1.*'"));
  expect_one_line_error(r);
  EXPECT_FALSE(fs::exists(tmp("o.npy")));
}

// Item 3: bias sets are all or nothing, and a key the model does not take is refused.
TEST_F(Cli, StateDictsAreCheckedAgainstTheModel) {
  struct Case {
    std::string file, command, says;
  };
  const std::string mha = " --query " + fixture("key_padding", "query.npy") + " --heads 4";
  const std::string enc = " --src " + fixture("encoder_relu_post", "src.npy") + " --heads 4";
  edited("key_padding", tmp("no_in_bias.safetensors"), [](auto& t) { t.erase("in_proj_bias"); });
  edited("key_padding", tmp("extra.safetensors"), [](auto& t) { t["extra.weight"] = NdArray::zeros(DType::f32, {2}); });
  edited("add_bias_kv", tmp("no_bias_v.safetensors"), [](auto& t) { t.erase("bias_v"); });
  edited("encoder_relu_post", tmp("no_lin_bias.safetensors"), [](auto& t) { t.erase("linear2.bias"); });
  edited("encoder_relu_post", tmp("no_attn_bias.safetensors"), [](auto& t) {
    t.erase("self_attn.in_proj_bias");
    t.erase("self_attn.out_proj.bias");
  });
  edited("encoder_relu_post", tmp("half_norm.safetensors"), [](auto& t) {
    std::map<std::string, NdArray> s;
    for (auto& [k, v] : t) s["layers.0." + k] = v;
    s["norm.bias"] = t.at("norm1.bias");
    t = s;
  });
  const std::vector<Case> cases{
      {"no_in_bias", "run mha" + mha, "missing key 'in_proj_bias' (there is 'out_proj.bias'"},
      {"extra", "run mha" + mha, "unexpected key 'extra.weight'"},
      {"no_bias_v", "run mha" + mha, "missing key 'bias_v' (there is 'bias_k'"},
      {"no_lin_bias", "run encoder-layer" + enc, "missing key 'linear2.bias'"},
      {"no_attn_bias", "run encoder-layer" + enc, "missing key 'self_attn.in_proj_bias'"},
      {"half_norm", "run encoder" + enc, "missing key 'norm.weight'"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.command + " --weights " + tmp(c.file + ".safetensors") + " -o " + tmp("o.npy"));
    EXPECT_EQ(r.code, 1) << c.file << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.file;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("o.npy"))) << c.file;
  }
}

// Items 5 and 23: --function must be usable from C and C++ and not displace a C library symbol.
TEST_F(Cli, EmitRefusesFunctionNamesThatBreakTheHeaderOrTheCLibrary) {
  const std::string model = "emit sdpa --batch 1 --heads 2 --seq 9 --head-dim 16 -o " + tmp("x.so") + " --function ";
  for (const std::string name : {"int", "memset", "free", "class", "errno", "uint8_t", "INT8_MAX", "__x", "_Foo",
                                 "qkv_gemm", "my-fn", "9lives", "printf", "malloc", "sin", "pthread_create"}) {
    const Result r = run(model + "'" + name + "'");
    expect_usage_error(r, "--function '" + name + "'", name);
    EXPECT_FALSE(fs::exists(tmp("x.so"))) << name;
    EXPECT_FALSE(fs::exists(tmp("x.h"))) << name;
  }
  const Result ok = run(model + "attention_layer");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(slurp(tmp("x.h")), HasSubstr("int attention_layer(const float* q,"));
}

// Item 6: integer masks are refused (PyTorch takes bool or float masks only), naming the dtype.
TEST_F(Cli, IntegerMasksAreRefused) {
  const std::int64_t L = 6;
  NdArray im = NdArray::zeros(DType::i32, {L, L});
  write_npy(tmp("i32.npy"), im);
  write_npy(tmp("i64.npy"), NdArray::zeros(DType::i64, {L, L}));
  write_npy(tmp("i64_5.npy"), NdArray::zeros(DType::i64, {5, 5}));
  write_sdpa_inputs(dir_, L, L);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"run mha --weights " + fixture("key_padding", "weights.safetensors") + " --query " +
           fixture("key_padding", "query.npy") + " --heads 4 --attn-mask " + tmp("i32.npy"),
       "i32"},
      {"run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy") + " --attn-bias " +
           tmp("i32.npy"),
       "i32"},
      {"run encoder-layer --weights " + fixture("encoder_relu_post", "weights.safetensors") + " --src " +
           fixture("encoder_relu_post", "src.npy") + " --heads 4 --src-mask " + tmp("i64_5.npy"),
       "i64"},
  };
  for (const auto& [args, dtype] : cases) {
    const Result r = run(args + " -o " + tmp("o.npy"));
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("integer mask (" + dtype + ")")) << args;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("o.npy"))) << args;
  }
}

// Item 7: a non-finite --scale or --dropout (and --layer-norm-eps) is a usage error on every backend.
TEST_F(Cli, NonFiniteScaleAndDropoutAreUsageErrorsOnEveryBackend) {
  write_sdpa_inputs(dir_, 3, 5);
  const std::string base = "run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy");
  for (const char* backend : {"reference", "cpu", "cuda"}) {
    for (const std::string flag : {"--scale nan", "--scale inf", "--scale -inf", "--scale 1e999", "--dropout nan",
                                   "--dropout inf", "--dropout -0.5", "--dropout 1"}) {
      const Result r = run(base + " " + flag + " --backend " + backend + " -o " + tmp("o.npy"));
      expect_usage_error(r, flag.substr(0, flag.find(' ')), flag + " on " + backend);
      EXPECT_FALSE(fs::exists(tmp("o.npy"))) << flag;
    }
  }
  const Result eps =
      run("run encoder-layer --weights " + fixture("encoder_relu_post", "weights.safetensors") + " --src " +
          fixture("encoder_relu_post", "src.npy") + " --heads 4 --layer-norm-eps nan -o " + tmp("o.npy"));
  expect_usage_error(eps, "--layer-norm-eps", "--layer-norm-eps nan");
}

// Item 20: no keys (S = 0): zero outputs and empty weights on every backend, as the reference.
TEST_F(Cli, ZeroKeysGiveZerosOnEveryBackend) {
  write_sdpa_inputs(dir_, 3, 0);
  for (const char* backend : {"reference", "cpu"}) {
    const Result r = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy") +
                         " --backend " + backend + " -o " + tmp("o.npy") + " --weights-out " + tmp("w.npy"));
    ASSERT_EQ(r.code, 0) << backend << ": " << r.err;
    const NdArray o = read_npy(tmp("o.npy")), w = read_npy(tmp("w.npy"));
    EXPECT_EQ(o.shape, (std::vector<std::int64_t>{1, 2, 3, 8})) << backend;
    for (float x : o.to_f32()) EXPECT_EQ(x, 0.0f) << backend;
    EXPECT_EQ(w.shape, (std::vector<std::int64_t>{1, 2, 3, 0})) << backend;
  }
}

// Item 24: negative sizes, sizes beyond int64, overflowing products and negative unsigned
// options are usage errors on every command that takes them.
TEST_F(Cli, BadSizesAreUsageErrors) {
  write_sdpa_inputs(dir_, 3, 3);
  const std::string ok = " --batch 1 --heads 2 --seq 4 --head-dim 8";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"shapes sdpa --heads 2 --seq 4 --head-dim -8", "--head-dim"},
      {"shapes mha --heads 2 --seq 4 --embed-dim -16", "--embed-dim"},
      {"shapes sdpa --heads 99999999999999999999 --seq 4 --head-dim 8", "--heads"},
      {"shapes sdpa --heads 2 --seq 4 --head-dim 8 --kv-seq -3", "--kv-seq"},
      {"shapes sdpa --batch 4611686018427387904 --heads 4 --seq 4 --head-dim 8", "overflow"},
      {"shapes mha --heads 4611686018427387904 --seq 4 --head-dim 8", "overflow"},
      {"bench sdpa" + ok + " --seed -1", "--seed"},
      {"bench sdpa" + ok + " --threads -1", "--threads"},
      {"bench sdpa" + ok + " --repeat 99999999999", "--repeat"},
      {"verify sdpa" + ok + " --tolerance nan", "--tolerance"},
      {"emit sdpa" + ok + " --sm -1 --target nvptx -o " + tmp("k.ptx"), "--sm"},
      {"emit sdpa --heads 2 --seq 4 --head-dim 8 --batch 0 -o " + tmp("x.so"), "--batch"},
      {"run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy") + " --seed -1 -o " +
           tmp("o.npy"),
       "--seed"},
      {"run mha --weights " + fixture("key_padding", "weights.safetensors") + " --query " +
           fixture("key_padding", "query.npy") + " --heads -4 -o " + tmp("o.npy"),
       "--heads"},
      {"heatmap --weights " + tmp("q.npy") + " --batch-index -1 -o " + tmp("h.png"), "--batch-index"},
  };
  for (const auto& [args, says] : cases) expect_usage_error(run(args), says, args);
  EXPECT_EQ(listing(), (std::vector<std::string>{"k.npy", "q.npy", "v.npy"}));
}

// Item 27: nn.MultiheadAttention takes an attn_mask [L, S] or [B*H, L, S], nothing broadcast.
TEST_F(Cli, MhaRefusesAnAttnMaskOfAnotherRank) {
  write_npy(tmp("s.npy"), NdArray::zeros(DType::boolean, {6}));
  write_npy(tmp("bls.npy"), NdArray::zeros(DType::boolean, {1, 1, 6, 6}));
  for (const char* mask : {"s.npy", "bls.npy"}) {
    const Result r =
        run("run mha --weights " + fixture("key_padding", "weights.safetensors") + " --query " +
            fixture("key_padding", "query.npy") + " --heads 4 --attn-mask " + tmp(mask) + " -o " + tmp("o.npy"));
    EXPECT_EQ(r.code, 1) << mask << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("must be [L, S] = (6, 6) or [batch*heads, L, S] = (12, 6, 6)")) << mask;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("o.npy")));
  }
}

// Item 29: an unknown command is an error even with --help. ("generate" was the example until
// it became a command; "finetune" is not one.)
TEST_F(Cli, AnUnknownCommandWithHelpIsAUsageError) {
  for (const std::string args : {"finetune --help", "finetune", "run finetune --help", "run mha2 -h"}) {
    const Result r = run(args);
    const std::string word = args.rfind("run ", 0) == 0 ? args.substr(4, args.find(' ', 4) - 4) : "finetune";
    expect_usage_error(r, "unknown command '" + word + "'", args);
    EXPECT_EQ(r.out, "") << args;
  }
}

/// The integer after `key` in a one-line JSON object (-1 when absent).
long long json_int(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::atoll(json.c_str() + at + key.size() + 4);
}

// One compilation per shape class, as the CLI reports it: `bench --json` counts the LLVM modules
// the warm-up compiled (at least one on the cpu backend) and those the timed runs compiled (none);
// `run --stats` says on stderr what a run compiled.
TEST_F(Cli, CompileStatisticsAreReported) {
  const Result b = run("bench encoder-layer --batch 2 --heads 2 --seq 9 --embed-dim 16 --repeat 3 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_GE(json_int(b.out, "modules_compiled"), 1) << b.out;
  EXPECT_EQ(json_int(b.out, "modules_compiled_timed"), 0) << b.out;
  EXPECT_NE(b.out.find("\"compile_ms\": "), std::string::npos) << b.out;
  const Result ref =
      run("bench encoder-layer --batch 2 --heads 2 --seq 9 --embed-dim 16 --repeat 2 --json "
          "--backend reference");
  ASSERT_EQ(ref.code, 0) << ref.err;
  EXPECT_EQ(json_int(ref.out, "modules_compiled"), 0) << ref.out;  // the interpreter compiles nothing

  write_sdpa_inputs(dir_, 5, 7);
  const Result r = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy") +
                       " -o " + tmp("o.npy") + " --stats");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("qkv: stats: 1 LLVM module(s) compiled in "), std::string::npos) << r.err;
  const Result quiet = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy") +
                           " -o " + tmp("o.npy"));
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("stats"), std::string::npos) << quiet.err;
}

}  // namespace
}  // namespace qkv
