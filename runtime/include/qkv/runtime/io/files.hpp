// qkv/runtime/io/files.hpp — opening input files without surprises, and writing a command's output
// files as one transaction (all of them or none).
//
// Inputs: InputFile opens regular files only. The type is checked with stat before the open and
// again with fstat after it (opened O_NONBLOCK), so a FIFO without a writer, a device or a
// directory is refused at once instead of blocking or being read.
//
// Outputs: an OutputGroup is declared first (add_file / add_directory), before any work, and
// refuses (OutputRefused) what it could not write safely: an output that is an input
// (protect), that is named twice (by path, symbolic link or hard link), that exists and is not
// a regular file (a directory, FIFO, socket or device node is never replaced), or whose
// directory does not exist. Then every output is written into a private directory made with
// mkdtemp beside its destination (staging_path / write), under its own file name, and commit()
// fsyncs them and renames them all into place while holding a lock (flock) on every destination
// directory, so two groups committing to the same files never interleave. If a rename fails,
// the renames already done are undone from hard links of the previous files. A group destroyed
// without commit() removes what it staged: a failure leaves no output and no temporary behind,
// and existing files keep their content. A symbolic link to a regular file is written through:
// its target is replaced and the link stays. Messages name the user's paths.
#pragma once

#include <qkv/runtime/io/array.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace qkv {

/// An output path that cannot be written as asked, found before any work was done (a usage
/// error: the qkv CLI exits 2).
class OutputRefused : public IoError {
 public:
  using IoError::IoError;
};

/// Writes `data` to `path` atomically, as a one-file OutputGroup (below): staged
/// in a private directory beside `path`, fsync'ed and renamed over it. On failure nothing is left,
/// `path` is untouched and IoError is thrown (OutputRefused for a path it will not replace: a
/// directory, device or FIFO, or a missing directory). (Defined in runtime/src/io/files.cpp.)
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> data);

/// A regular file open for reading. Errors are IoError "<path>: <problem>".
class InputFile {
 public:
  static InputFile open(const std::filesystem::path& path);
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  [[nodiscard]] int fd() const { return fd_; }
  [[nodiscard]] std::uint64_t size() const { return size_; }
  [[nodiscard]] const std::string& what() const { return what_; }
  /// Reads exactly dst.size() bytes at `offset`; IoError if the file ends first.
  void read_at(std::uint64_t offset, std::span<std::byte> dst) const;
  /// The whole file; IoError if it is larger than `limit` bytes (`role` says what it is for).
  [[nodiscard]] std::vector<std::byte> read_all(std::uint64_t limit, const std::string& role) const;

 private:
  InputFile(int fd, std::uint64_t size, std::string what) : fd_(fd), size_(size), what_(std::move(what)) {}
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string what_;
};

/// The output files of one command, committed together (see the file comment). Not copyable;
/// used from one thread.
class OutputGroup {
 public:
  OutputGroup();
  ~OutputGroup();  // removes everything staged and not committed
  OutputGroup(const OutputGroup&) = delete;
  OutputGroup& operator=(const OutputGroup&) = delete;

  /// No output may be this file (when it exists): same device and inode, so also through
  /// symbolic and hard links. `label` names it in messages (e.g. "--query").
  void protect(const std::filesystem::path& input, const std::string& label = "");
  /// Declares an output file and checks it now (OutputRefused naming `label` and `path`).
  /// Returns its index.
  std::size_t add_file(const std::filesystem::path& path, const std::string& label = "");
  /// Declares a directory for outputs: an existing directory, or a new one created by commit()
  /// (its parent must exist). Declare it before the files in it.
  void add_directory(const std::filesystem::path& path, const std::string& label = "");

  /// Where output `i` must be written before commit(): a path in a private directory beside
  /// its destination, with the destination's file name (outputs in one directory share it).
  [[nodiscard]] std::filesystem::path staging_path(std::size_t i);
  /// Writes the concatenated `chunks` as output `i` (at its staging path) and fsyncs it.
  void write(std::size_t i, std::initializer_list<std::span<const std::byte>> chunks);
  /// Renames every output into place (see the file comment). Every output must be staged.
  void commit();

  /// The user's path of output `i`, as given.
  [[nodiscard]] const std::filesystem::path& path(std::size_t i) const { return outputs_.at(i).user; }
  /// `message` with every staging directory replaced by the destination it stands for, so a
  /// writer's error (e.g. from a compiler that wrote into staging_path) names the user's files.
  [[nodiscard]] std::string in_user_terms(std::string message) const;

 private:
  struct Identity {
    std::uint64_t dev = 0, ino = 0;
    friend bool operator==(const Identity&, const Identity&) = default;
  };
  struct Output {
    std::filesystem::path user;  // as given
    std::string label;
    std::filesystem::path dest;  // absolute, symbolic links resolved
    bool existed = false;
    Identity id;
  };
  struct Directory {  // a destination directory that commit() creates
    std::filesystem::path user, dest;
    std::string label;
  };
  struct Protected {
    std::filesystem::path user;
    std::string label;
    Identity id;
  };

  [[nodiscard]] std::string name(const std::filesystem::path& user, const std::string& label) const;
  [[nodiscard]] const std::filesystem::path& scratch_for(const std::filesystem::path& existing_dir,
                                                         const std::string& who);
  [[nodiscard]] const Directory* created_directory(const std::filesystem::path& dest) const;
  void refuse_same(const std::filesystem::path& dest, const Identity* id, const std::string& who) const;
  void abandon() noexcept;

  std::vector<Protected> protected_;
  std::vector<Output> outputs_;
  std::vector<Directory> directories_;
  std::map<std::filesystem::path, std::filesystem::path> scratch_;  // existing directory -> its private one
  std::vector<int> registry_slots_;                                 // of the private directories
  bool committed_ = false;
};

/// Removes what every live OutputGroup has staged, without allocating memory: for a handler that
/// ends the process when memory runs out. Safe to call once, from one thread.
void abandon_staged_outputs() noexcept;

/// For a handler of a signal that ends the process (SIGINT, SIGTERM): abandon_staged_outputs()
/// and true, or, while a group is renaming its outputs into place, false: the signal is raised
/// again once the renames are done, so a group is never left half renamed. Async-signal-safe.
bool abandon_staged_outputs_for_signal(int signal) noexcept;

}  // namespace qkv
