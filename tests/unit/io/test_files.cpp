// InputFile and OutputGroup (qkv/runtime/io/files.hpp): what is refused before any work, and that
// a group is written all or nothing.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <iterator>

#include <qkv/runtime/io/files.hpp>

#include "io_test_helpers.hpp"

namespace {

using namespace qkv::testing_io;
using qkv::InputFile;
using qkv::OutputGroup;
using qkv::OutputRefused;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void put(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
std::span<const std::byte> bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

/// The message of the OutputRefused `f` throws (a marker when it throws nothing).
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const OutputRefused& e) {
    return e.what();
  }
  return "<not refused>";
}

std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(InputFile, RefusesWhatIsNotARegularFileWithoutBlocking) {
  TempDir dir("qkv_files");
  ASSERT_EQ(::mkfifo((dir.path / "fifo").c_str(), 0644), 0);  // no writer: opening it blocking would hang
  EXPECT_IO_ERROR(InputFile::open(dir.path / "fifo"), "fifo: not a regular file (it is a FIFO)");
  EXPECT_IO_ERROR(InputFile::open(dir.path), "not a regular file (it is a directory)");
  EXPECT_IO_ERROR(InputFile::open(dir.path / "absent"), "absent: cannot open: No such file or directory");
  put(dir.path / "f", "0123456789");
  const InputFile f = InputFile::open(dir.path / "f");
  EXPECT_EQ(f.size(), 10u);
  std::vector<std::byte> mid(3);
  f.read_at(4, mid);
  EXPECT_EQ(std::to_integer<char>(mid[0]), '4');
  EXPECT_IO_ERROR(f.read_at(8, mid), "the file ended at byte 10");
  EXPECT_IO_ERROR((void)f.read_all(9, "tokens file"), "10 bytes is more than a tokens file may have (9)");
  EXPECT_EQ(f.read_all(10, "x").size(), 10u);
}

TEST(OutputGroup, RefusesOutputsItCannotWriteSafely) {
  TempDir dir("qkv_files");
  const fs::path in = dir.path / "in.npy", out = dir.path / "out.npy";
  put(in, "input");
  fs::create_hard_link(in, dir.path / "hard.npy");
  fs::create_directories(dir.path / "sub");
  ASSERT_EQ(::mkfifo((dir.path / "fifo").c_str(), 0644), 0);
  OutputGroup g;
  g.protect(in, "--query");
  EXPECT_NE(refusal([&] { g.add_file(in, "--out"); }).find("--out " + in.string() + ": is also the input --query"),
            std::string::npos);
  EXPECT_NE(refusal([&] { g.add_file(dir.path / "hard.npy"); }).find("is also the input"), std::string::npos);
  EXPECT_NE(refusal([&] { g.add_file(dir.path / "sub"); }).find("is a directory"), std::string::npos);
  EXPECT_NE(refusal([&] { g.add_file(dir.path / "sub/"); }).find("names a directory"), std::string::npos);
  EXPECT_NE(refusal([&] { g.add_file(dir.path / "fifo"); }).find("is a FIFO, not a regular file"), std::string::npos);
  EXPECT_NE(refusal([&] { g.add_file(dir.path / "no" / "x.npy"); }).find("No such file or directory"),
            std::string::npos);
  EXPECT_NE(refusal([&] { g.add_file(""); }).find("empty"), std::string::npos);
  g.add_file(out, "--out");
  EXPECT_NE(refusal([&] {
              g.add_file(dir.path / "sub" / ".." / "out.npy", "--weights-out");
            }).find("is the same file as --out"),
            std::string::npos);
  EXPECT_EQ(slurp(in), "input");
}

TEST(OutputGroup, CommitsEverythingOrNothing) {
  TempDir dir("qkv_files");
  const fs::path a = dir.path / "a.npy", b = dir.path / "b.npy";
  put(a, "old a");
  {
    OutputGroup g;
    const auto ia = g.add_file(a), ib = g.add_file(b);
    g.write(ia, {bytes("new "), bytes("a")});
    g.write(ib, {bytes("new b")});
    EXPECT_EQ(slurp(a), "old a");  // nothing is in place before commit
    EXPECT_EQ(g.staging_path(ia).filename(), "a.npy");
    EXPECT_EQ(g.staging_path(ia).parent_path().parent_path(), fs::canonical(dir.path));
  }  // destroyed without commit: nothing changes, nothing is left
  EXPECT_EQ(slurp(a), "old a");
  EXPECT_EQ(names(dir.path), std::vector<std::string>{"a.npy"});
  {
    OutputGroup g;
    const auto ia = g.add_file(a), ib = g.add_file(b);
    g.write(ia, {bytes("new a")});
    g.write(ib, {bytes("new b")});
    fs::create_directories(b);  // b became a directory since it was declared
    EXPECT_NE(refusal([&] { g.commit(); }).find("became a directory"), std::string::npos);
  }
  EXPECT_EQ(slurp(a), "old a");
  fs::remove(b);
  OutputGroup g;
  const auto ia = g.add_file(a), ib = g.add_file(b);
  g.write(ia, {bytes("new a")});
  g.write(ib, {bytes("new b")});
  g.commit();
  EXPECT_EQ(slurp(a), "new a");
  EXPECT_EQ(slurp(b), "new b");
  EXPECT_EQ(names(dir.path), (std::vector<std::string>{"a.npy", "b.npy"}));
}

TEST(OutputGroup, CreatesADeclaredDirectoryOnCommitOnly) {
  TempDir dir("qkv_files");
  const fs::path ex = dir.path / "example";
  {
    OutputGroup g;
    g.add_directory(ex, "--example-dir");
    const auto i = g.add_file(ex / "q.npy");
    g.write(i, {bytes("q")});
    EXPECT_FALSE(fs::exists(ex));
    EXPECT_NE(g.in_user_terms("cannot write " + g.staging_path(i).string()).find(ex.filename().string() + "/q.npy"),
              std::string::npos);
    EXPECT_EQ(g.in_user_terms(g.staging_path(i).string()), (fs::canonical(dir.path) / "example" / "q.npy").string());
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
  put(dir.path / "file", "x");
  OutputGroup refused;
  EXPECT_NE(refusal([&] { refused.add_directory(dir.path / "file"); }).find("not a directory"), std::string::npos);
  EXPECT_NE(refusal([&] { refused.add_directory(dir.path / "no" / "dir"); }).find("No such file or directory"),
            std::string::npos);
  OutputGroup g;
  g.add_directory(ex);
  g.write(g.add_file(ex / "q.npy"), {bytes("q")});
  g.commit();
  EXPECT_EQ(slurp(ex / "q.npy"), "q");
}

TEST(OutputGroup, AbandonStagedOutputsRemovesWhatLiveGroupsStaged) {
  TempDir dir("qkv_files");
  OutputGroup g;
  g.add_directory(dir.path / "new");
  g.write(g.add_file(dir.path / "x.npy"), {bytes("x")});
  g.write(g.add_file(dir.path / "new" / "y.npy"), {bytes("y")});
  EXPECT_EQ(names(dir.path).size(), 1u);  // the staging directory
  qkv::abandon_staged_outputs();          // what the out-of-memory handler calls before _exit
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(OutputGroup, WritesThroughASymbolicLinkToARegularFile) {
  TempDir dir("qkv_files");
  put(dir.path / "target", "old");
  fs::create_symlink(dir.path / "target", dir.path / "link");
  qkv::write_file_atomic(dir.path / "link", bytes("new"));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir.path / "link")));
  EXPECT_EQ(slurp(dir.path / "target"), "new");
}

}  // namespace
