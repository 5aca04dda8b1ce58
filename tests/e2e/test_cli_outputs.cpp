// The CLI's output contract (docs/cli.md): every command's outputs are written as one group —
// all of them or none, existing files keep their content on any failure, nothing of qkv's is
// left behind and no file of the user's is touched; an output that is an input, is named twice,
// is not a regular file or has no directory is refused (exit 2) before any work, with a message
// that names the user's path. (Issue 13, items 4, 8–14, 21, 25, 28.)
#include "cli_test.hpp"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <string_view>

using ::testing::HasSubstr;
using ::testing::Not;

namespace qkv {
namespace {

using namespace qkv::test;

class Outputs : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    write_sdpa_inputs(dir_, 4, 512);
  }
  /// run sdpa on the inputs in the test directory (reference backend: no compile time).
  [[nodiscard]] std::vector<std::string> sdpa(const std::string& out, const std::string& weights_out = "") const {
    std::vector<std::string> a{"run",     "sdpa",       "--query",   tmp("q.npy"), "--key", tmp("k.npy"),
                               "--value", tmp("v.npy"), "--backend", "reference",  "--out", out};
    if (!weights_out.empty()) a.insert(a.end(), {"--weights-out", weights_out});
    return a;
  }
  /// No staging directory or temporary of qkv's (now or formerly named) in `in` (the test
  /// directory by default), other than the user's own files `mine`.
  void expect_nothing_left(const fs::path& in = {}, const std::vector<std::string>& mine = {}) const {
    for (const auto& name : listing(in)) {
      if (std::find(mine.begin(), mine.end(), name) != mine.end()) continue;
      EXPECT_THAT(name, Not(HasSubstr(".qkv-"))) << "left behind";
      EXPECT_THAT(name, Not(HasSubstr("qkv-partial"))) << "left behind";
      EXPECT_THAT(name, Not(HasSubstr(".tmp"))) << "left behind";
    }
  }
  static const std::string kOld;
};
const std::string Outputs::kOld = "the previous content\n";

// Item 8: two runs racing for the same two outputs: both succeed, and the two files always come
// from the same run (the group is committed under a lock on the directory).
TEST_F(Outputs, ConcurrentRunsNeverFailAndNeverMixTheirOutputs) {
  for (const char* d : {"a", "b"}) fs::create_directories(dir_ / d);
  write_sdpa_inputs(dir_ / "a", 4, 512, 0.0f);
  write_sdpa_inputs(dir_ / "b", 4, 512, 1.0f);
  auto args = [&](const std::string& in, const std::string& out, const std::string& w) {
    return std::vector<std::string>{"run",           "sdpa",
                                    "--query",       tmp(in + "/q.npy"),
                                    "--key",         tmp(in + "/k.npy"),
                                    "--value",       tmp(in + "/v.npy"),
                                    "--backend",     "reference",
                                    "--out",         out,
                                    "--weights-out", w};
  };
  for (const char* in : {"a", "b"}) {
    const Result r = run_argv(args(in, tmp(std::string(in) + "/o.npy"), tmp(std::string(in) + "/w.npy")));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const std::string oa = slurp(tmp("a/o.npy")), wa = slurp(tmp("a/w.npy"));
  const std::string ob = slurp(tmp("b/o.npy")), wb = slurp(tmp("b/w.npy"));
  ASSERT_NE(oa, ob);
  ASSERT_NE(wa, wb);
  int mixed = 0, failed = 0;
  for (int round = 0; round < 50; ++round) {
    const Process pa = start(args("a", tmp("o.npy"), tmp("w.npy")));
    const Process pb = start(args("b", tmp("o.npy"), tmp("w.npy")));
    const Result ra = wait(pa), rb = wait(pb);
    failed += ra.code != 0 || rb.code != 0;
    EXPECT_EQ(ra.code, 0) << "round " << round << ": " << ra.err;
    EXPECT_EQ(rb.code, 0) << "round " << round << ": " << rb.err;
    const std::string o = slurp(tmp("o.npy")), w = slurp(tmp("w.npy"));
    const bool from_a = o == oa && w == wa, from_b = o == ob && w == wb;
    mixed += !from_a && !from_b;
    EXPECT_TRUE(from_a || from_b) << "round " << round << ": o.npy and w.npy come from different runs";
  }
  EXPECT_EQ(mixed, 0);
  EXPECT_EQ(failed, 0);
  expect_nothing_left();
}

// Item 9: the same output twice, by any spelling or link.
TEST_F(Outputs, TheSameFileAsTwoOutputsIsRefused) {
  write_text(tmp("same.npy"), kOld);
  fs::create_hard_link(tmp("same.npy"), tmp("hard.npy"));
  fs::create_symlink(tmp("same.npy"), tmp("soft.npy"));
  for (const std::string& other : {tmp("same.npy"), tmp("./same.npy"), (dir_ / "a" / ".." / "same.npy").string(),
                                   tmp("hard.npy"), tmp("soft.npy")}) {
    if (other.find("/a/") != std::string::npos) fs::create_directories(dir_ / "a");
    const Result r = run_argv(sdpa(tmp("same.npy"), other));
    expect_usage_error(r, "same file", other);
    EXPECT_EQ(slurp(tmp("same.npy")), kOld) << other;
  }
  expect_nothing_left();
}

// Item 10: one output cannot be written, so none is: neither when that is known up front (a
// directory) nor when it fails while writing (a file-size limit, like a full disk).
TEST_F(Outputs, OutputsAreCommittedAsAGroup) {
  write_text(tmp("o.npy"), kOld);
  fs::create_directories(tmp("wdir"));
  const Result r = run_argv(sdpa(tmp("o.npy"), tmp("wdir")));
  expect_usage_error(r, "is a directory", "--weights-out wdir");
  EXPECT_EQ(slurp(tmp("o.npy")), kOld);

  // o.npy (a few hundred bytes) fits under the limit, w.npy (16 KiB of weights) does not.
  Limits small_files;
  small_files.file_size = 4096;
  const Result f = run_argv(sdpa(tmp("o.npy"), tmp("w.npy")), small_files);
  EXPECT_EQ(f.signal, 0) << "SIGXFSZ must be a write error, not a signal";
  EXPECT_EQ(f.code, 1) << f.err;
  EXPECT_THAT(f.err, HasSubstr(tmp("w.npy")));
  EXPECT_THAT(f.err, HasSubstr("File too large"));
  EXPECT_EQ(std::count(f.err.begin(), f.err.end(), '\n'), 1) << f.err;
  EXPECT_EQ(slurp(tmp("o.npy")), kOld);
  EXPECT_FALSE(fs::exists(tmp("w.npy")));
  expect_nothing_left();
}

// Item 11: an output that is a FIFO or a device node (or a link to one) is never replaced; a link
// to a regular file is written through and stays a link.
TEST_F(Outputs, DeviceNodesFifosAndLinksToThemAreNeverReplaced) {
  ASSERT_EQ(::mkfifo(tmp("fifo").c_str(), 0644), 0);
  fs::create_symlink(tmp("fifo"), tmp("link_to_fifo"));
  std::vector<std::string> nodes{"fifo", "link_to_fifo"};
  // A character device with /dev/full's numbers, made here (needs root; never the system's /dev).
  if (::mknod(tmp("full").c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) {
    fs::create_symlink(tmp("full"), tmp("link_to_full"));
    nodes.insert(nodes.end(), {"full", "link_to_full"});
  }
  for (const std::string& n : nodes) {
    const Result r = run_argv(sdpa(tmp(n)));
    expect_usage_error(r, "not a regular file", n);
    EXPECT_THAT(r.err, HasSubstr(tmp(n))) << n;
  }
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(tmp("fifo"))));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(tmp("link_to_fifo"))));
  if (fs::exists(fs::symlink_status(tmp("full")))) {
    EXPECT_TRUE(fs::is_character_file(fs::symlink_status(tmp("full"))));
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(tmp("link_to_full"))));
  }
  write_text(tmp("target.npy"), kOld);
  fs::create_symlink(tmp("target.npy"), tmp("link.npy"));
  const Result ok = run_argv(sdpa(tmp("link.npy")));
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(tmp("link.npy"))));
  EXPECT_EQ(read_npy(tmp("target.npy")).shape, (std::vector<std::int64_t>{1, 2, 4, 8}));
  expect_nothing_left();
}

// Issue 13 item 12 and issue 28 item 1: no command writes over a file it reads — any of the
// --model folder's files (config, index, every shard, tokenizer.model), a prompt, an .npy or
// safetensors input — named as it is, through a symbolic link or through a hard link (compared by
// device and inode). One table for every command that reads files.
TEST_F(Outputs, NoCommandWritesOverAFileItReads) {
  const fs::path fixtures = fs::path(QKV_FIXTURES_DIR);
  const fs::path model = dir_ / "qwen2";  // a sharded checkpoint
  fs::copy(fixtures.parent_path() / "llama_fixtures" / "qwen2", model, fs::copy_options::recursive);
  fs::copy_file(fixtures.parent_path() / "tokenizer" / "tokenizer.model", model / "tokenizer.model");
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(model))
    if (e.path().filename().string().find("-of-") != std::string::npos) shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_EQ(shards.size(), 2u);
  write_npy(tmp("prompt.npy"), read_npy((model / "tokens.npy").string()));
  fs::copy_file(fixture("key_padding", "weights.safetensors"), tmp("mha.safetensors"));
  fs::copy_file(fixture("encoder_relu_post", "weights.safetensors"), tmp("layer.safetensors"));
  fs::copy_file(fixture("encoder_relu_post", "src.npy"), tmp("src.npy"));
  write_text(tmp("tokens.txt"), "a b c d\n");

  const std::string m = model.string(), config = (model / "config.json").string(),
                    index = (model / "model.safetensors.index.json").string();
  using Args = std::vector<std::string>;
  const Args sdpa_args = sdpa("");
  const Args mha{"run", "mha", "--weights", tmp("mha.safetensors"), "--query", tmp("q.npy"), "--heads", "4"};
  const Args layer{"run",   "encoder-layer", "--weights", tmp("layer.safetensors"),
                   "--src", tmp("src.npy"),  "--heads",   "2"};
  const Args heatmap{"heatmap", "--weights", tmp("q.npy"), "--tokens-file", tmp("tokens.txt")};
  const Args causal{"run", "causal-lm", "--model", m, "--tokens", tmp("prompt.npy")};
  const Args generate{"generate", "--model", m, "--prompt-ids", tmp("prompt.npy"), "--new-tokens", "2"};
  const Args generate_text{"generate", "--model", m, "--prompt", "the cat", "--new-tokens", "2"};
  const Args bench{"bench", "generate", "--model", m, "--prompt-ids", tmp("prompt.npy"), "--new-tokens", "2"};
  struct Case {
    Args args;  // without the output flag
    std::string flag, input, label;
  };
  Args sdpa_no_out(sdpa_args.begin(), sdpa_args.end() - 2);  // sdpa("") ends with --out ""
  const std::vector<Case> cases{
      {sdpa_no_out, "--out", tmp("q.npy"), "--query"},
      {sdpa_no_out, "--out", tmp("k.npy"), "--key"},
      {sdpa_no_out, "--out", tmp("v.npy"), "--value"},
      {mha, "--out", tmp("mha.safetensors"), "--weights"},
      {mha, "--out", tmp("q.npy"), "--query"},
      {layer, "--out", tmp("layer.safetensors"), "--weights"},
      {layer, "--out", tmp("src.npy"), "--src"},
      {heatmap, "--out", tmp("q.npy"), "--weights"},
      {heatmap, "--out", tmp("tokens.txt"), "--tokens-file"},
      {causal, "--logits-out", tmp("prompt.npy"), "--tokens"},
      {causal, "--logits-out", config, "--model"},
      {causal, "--logits-out", index, "--model"},
      {causal, "--logits-out", shards[0], "--model"},
      {causal, "--logits-out", shards[1], "--model"},
      {generate, "--out", tmp("prompt.npy"), "--prompt-ids"},
      {generate, "--out", shards[1], "--model"},
      {generate, "--out", (model / "tokenizer.model").string(), "--model"},
      {generate_text, "--out", (model / "tokenizer.model").string(), "--model"},
      {generate, "--logits-out", shards[0], "--model"},
      {generate, "--logits-out", config, "--model"},
      {bench, "--out", shards[0], "--model"},
      {bench, "--out", index, "--model"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string before = slurp(c.input);
    const std::string soft = tmp("soft" + std::to_string(n)), hard = tmp("hard" + std::to_string(n));
    ++n;
    fs::create_symlink(c.input, soft);
    fs::create_hard_link(c.input, hard);
    for (const std::string& out : {c.input, soft, hard}) {
      Args a = c.args;
      if (c.flag == "--logits-out" && a[0] == "generate") a.insert(a.end(), {"--out", tmp("ids.npy")});
      a.insert(a.end(), {c.flag, out});
      const std::string what = a[0] + " " + a[1] + " " + c.flag + " " + out;
      const Result r = run_argv(a);
      expect_usage_error(r, "is also the input " + c.label, what);
      EXPECT_EQ(slurp(c.input), before) << what;
    }
    fs::remove(soft);
    fs::remove(hard);
  }
  EXPECT_FALSE(fs::exists(tmp("ids.npy")));
  expect_nothing_left();
  expect_nothing_left(model);
}

// Issue 28 item 7: SIGTERM or SIGINT while the outputs are being written (emit compiles its
// library into the staging directory) ends qkv by that signal, with no staging directory left
// and no output; the user's existing file keeps its content.
TEST_F(Outputs, ASignalWhileWritingLeavesNoTemporaryBehind) {
  write_text(tmp("lib.so"), kOld);
  for (const int sig : {SIGTERM, SIGINT}) {
    // Told by the kernel when anything is created in the directory (inotify) or when qkv ends
    // (its pidfd): no polling on a clock.
    const int created = ::inotify_init1(IN_CLOEXEC);
    ASSERT_GE(created, 0);
    ASSERT_GE(::inotify_add_watch(created, dir_.c_str(), IN_CREATE), 0);
    const Process p = start({"emit", "encoder-layer", "--heads", "4", "--seq", "64", "--embed-dim", "128",
                             "--example-dir", tmp("ex"), "-o", tmp("lib.so")});
    const int ended = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
    ASSERT_GE(ended, 0);
    // Wait for the staging directory (or for qkv to end first, which fails the test below).
    bool staged = false, exited = false;
    while (!staged && !exited) {
      pollfd fds[2] = {{created, POLLIN, 0}, {ended, POLLIN, 0}};
      if (::poll(fds, 2, 120'000) <= 0) break;  // a deadline against a hang, not a pace
      exited = (fds[1].revents & POLLIN) != 0;
      if (fds[0].revents & POLLIN) {
        alignas(inotify_event) char events[4096];
        const ssize_t n = ::read(created, events, sizeof events);
        for (ssize_t at = 0; at < n;) {
          const auto* e = reinterpret_cast<const inotify_event*>(events + at);
          staged |= e->len > 0 && std::string_view(e->name).starts_with(".qkv-");
          at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
        }
      }
    }
    ::close(created);
    ::close(ended);
    ASSERT_TRUE(staged) << "emit ended before it staged anything";
    ::kill(p.pid, sig);
    const Result r = wait(p);
    EXPECT_EQ(r.signal, sig) << r.err;
    EXPECT_EQ(slurp(tmp("lib.so")), kOld);
    EXPECT_FALSE(fs::exists(tmp("lib.h")));
    EXPECT_FALSE(fs::exists(tmp("ex")));
    expect_nothing_left();
  }
}

// Items 13 and 4: emit's outputs (the library, its header, the example directory) are checked
// like any other before anything is compiled.
TEST_F(Outputs, EmitRefusesOutputsInTheWayAndLeavesNothing) {
  const std::vector<std::string> model{"emit", "sdpa",  "--batch", "1",          "--heads",
                                       "2",    "--seq", "9",       "--head-dim", "16"};
  auto emit = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = model;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_argv(a);
  };
  fs::create_directories(tmp("adir"));
  fs::create_directories(tmp("lib.h"));
  write_text(tmp("ex"), kOld);
  const auto before = listing();
  expect_usage_error(emit({"-o", tmp("adir")}), "is a directory", "-o adir");
  expect_usage_error(emit({"-o", tmp("lib.so")}), "is a directory", "lib.h a directory");
  const Result ex = emit({"-o", tmp("ex.so"), "--example-dir", tmp("ex")});
  expect_usage_error(ex, "not a directory", "--example-dir a file");
  EXPECT_THAT(ex.err, Not(HasSubstr("filesystem error")));
  const Result h = emit({"--format", "so", "-o", tmp("x.h")});
  expect_usage_error(h, "same file", "-o x.h --format so");
  EXPECT_THAT(h.out, Not(HasSubstr("wrote")));
  EXPECT_EQ(listing(), before);
  EXPECT_EQ(slurp(tmp("ex")), kOld);
  EXPECT_TRUE(fs::is_empty(tmp("adir")));
}

// Item 14: files of the user's that look like the temporaries qkv once used survive a run.
TEST_F(Outputs, TheUsersFilesAreNeverTouched) {
  const std::vector<std::string> mine{"o.npy.qkv-partial", ".o.npy.tmp", "x.so.tmp",
                                      "x.so.o.tmp",        "x.h.tmp",    "x.h.qkv-partial"};
  for (const auto& f : mine) write_text(tmp(f), kOld);
  ASSERT_EQ(run_argv(sdpa(tmp("o.npy"))).code, 0);
  const Result e = run_argv({"emit", "sdpa", "--batch", "1", "--heads", "2", "--seq", "9", "--head-dim", "16", "-o",
                             tmp("x.so"), "--example-dir", tmp("example")});
  ASSERT_EQ(e.code, 0) << e.err;
  for (const auto& f : mine) EXPECT_EQ(slurp(tmp(f)), kOld) << f;
  EXPECT_TRUE(fs::exists(tmp("x.so")));
  EXPECT_TRUE(fs::exists(tmp("x.h")));
  EXPECT_TRUE(fs::exists(tmp("example/q.npy")));
  expect_nothing_left({}, mine);
  expect_nothing_left(tmp("example"));
}

// Item 21: --out naming a directory, with or without a trailing slash.
TEST_F(Outputs, OutNamingADirectoryIsOneLine) {
  fs::create_directories(tmp("odir"));
  for (const std::string& out : {tmp("odir"), tmp("odir") + "/", tmp("missing") + "/"}) {
    const Result r = run_argv(sdpa(out));
    expect_usage_error(r, tmp(out.back() == '/' ? out.substr(0, out.size() - 1) : out), out);
    EXPECT_THAT(r.err, Not(HasSubstr("filesystem error"))) << out;
  }
  EXPECT_TRUE(fs::is_empty(tmp("odir")));
  expect_nothing_left();
}

// Item 25: the longest legal file name works, and a write error names the user's path, never a
// temporary one.
TEST_F(Outputs, LongNamesWorkAndWriteErrorsNameTheUsersPath) {
  const std::string longest = std::string(250, 'a') + ".npy";  // 254 bytes
  const Result r = run_argv(sdpa(tmp(longest)));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_npy(tmp(longest)).shape, (std::vector<std::int64_t>{1, 2, 4, 8}));

  Limits small_files;
  small_files.file_size = 4096;  // the weights do not fit: like a full disk
  const std::string w = std::string(246, 'w') + ".npy";
  const Result full = run_argv(sdpa(tmp("o.npy"), tmp(w)), small_files);
  EXPECT_EQ(full.code, 1) << full.err;
  EXPECT_THAT(full.err, HasSubstr("--weights-out " + tmp(w) + ": cannot write"));
  EXPECT_THAT(full.err, Not(HasSubstr(".qkv-")));
  EXPECT_THAT(full.err, Not(HasSubstr("partial")));

  // A directory nothing can be created in (/proc is not writable).
  const Result ro = run_argv(sdpa("/proc/self/o.npy"));
  EXPECT_EQ(ro.code, 1) << ro.err;
  EXPECT_THAT(ro.err, HasSubstr("--out /proc/self/o.npy: "));
  EXPECT_THAT(ro.err, Not(HasSubstr(".qkv-")));
  EXPECT_THAT(ro.err, Not(HasSubstr("partial")));
  expect_nothing_left();
}

// Item 28: a model that launches several GPU kernels needs a directory for them.
TEST_F(Outputs, NvptxWithSeveralKernelsSaysThatOutMustBeADirectory) {
  const std::vector<std::string> mha{"emit", "mha",         "--batch", "1",        "--heads", "2", "--seq",
                                     "9",    "--embed-dim", "16",      "--target", "nvptx",   "-o"};
  auto emit = [&](const std::string& out) {
    std::vector<std::string> a = mha;
    a.push_back(out);
    return run_argv(a);
  };
  const Result fresh = emit(tmp("k.ptx"));
  expect_usage_error(fresh, "kernels, so -o must name a directory", "-o k.ptx");
  EXPECT_FALSE(fs::exists(tmp("k.ptx")));
  write_text(tmp("k.txt"), kOld);
  expect_usage_error(emit(tmp("k.txt")), "must name a directory", "-o an existing file");
  EXPECT_EQ(slurp(tmp("k.txt")), kOld);
  const Result dir = emit(tmp("kernels"));
  ASSERT_EQ(dir.code, 0) << dir.err;
  EXPECT_TRUE(fs::exists(tmp("kernels/launches.txt")));
  expect_nothing_left();
}

}  // namespace
}  // namespace qkv
