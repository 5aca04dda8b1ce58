// The CLI's output contract (docs/cli.md): every command's outputs are written as one group —
// all of them or none, existing files keep their content on any failure, nothing of qkv's is
// left behind and no file of the user's is touched; an output that is an input, is named twice,
// is not a regular file or has no directory is refused (exit 2) before any work, with a message
// that names the user's path. (Issue 13, items 4, 8–14, 21, 25, 28.)
#include "cli_test.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>

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

// Item 12: an output that is one of the inputs.
TEST_F(Outputs, AnOutputThatIsAnInputIsRefused) {
  const std::string q = slurp(tmp("q.npy"));
  fs::create_symlink(tmp("q.npy"), tmp("alias.npy"));
  for (const std::string& out : {tmp("q.npy"), tmp("alias.npy"), tmp("v.npy")}) {
    const Result r = run_argv(sdpa(out));
    expect_usage_error(r, "is also the input", out);
  }
  EXPECT_EQ(slurp(tmp("q.npy")), q);
  // run mha: --out on the state dict.
  fs::copy_file(fixture("key_padding", "weights.safetensors"), tmp("w.safetensors"));
  const std::string weights = slurp(tmp("w.safetensors"));
  const Result m = run_argv({"run", "mha", "--weights", tmp("w.safetensors"), "--query",
                             fixture("key_padding", "query.npy"), "--heads", "4", "--out", tmp("w.safetensors")});
  expect_usage_error(m, "is also the input --weights", "mha --out = --weights");
  EXPECT_EQ(slurp(tmp("w.safetensors")), weights);
  expect_nothing_left();
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
