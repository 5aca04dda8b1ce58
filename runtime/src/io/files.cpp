// files.cpp — InputFile and OutputGroup (see qkv/runtime/io/files.hpp), and write_file_atomic,
// the one-file group every writer of the library uses.
#include <qkv/runtime/io/files.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace qkv {
namespace fs = std::filesystem;

namespace {

std::string errno_text(int e) { return std::strerror(e); }

/// What a non-regular file is, for messages.
std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

// --- the registry of staging directories, for abandon_staged_outputs() ---------------------------

struct Slot {
  std::atomic<bool> used{false};
  char path[PATH_MAX] = {};
};
std::array<Slot, 32> g_slots;

int register_scratch(const fs::path& dir) noexcept {
  const std::string& s = dir.native();
  if (s.size() >= PATH_MAX) return -1;
  for (std::size_t i = 0; i < g_slots.size(); ++i) {
    bool expected = false;
    if (g_slots[i].used.load() || !g_slots[i].used.compare_exchange_strong(expected, true)) continue;
    std::memcpy(g_slots[i].path, s.c_str(), s.size() + 1);
    return static_cast<int>(i);
  }
  return -1;  // full: that directory is still removed by its group, just not by the handler
}

void unregister_scratch(int slot) noexcept {
  if (slot >= 0) g_slots[static_cast<std::size_t>(slot)].used.store(false);
}

/// Removes the entries of the open directory `dirfd` (and of its subdirectories, `depth` levels
/// down) without allocating: getdents64 into a stack buffer, unlinkat.
void remove_entries(int dirfd, int depth) noexcept {
  struct Entry {  // struct linux_dirent64
    std::uint64_t ino;
    std::int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
  };
  alignas(8) char buf[4096];
  for (int pass = 0; pass < 1000; ++pass) {
    ::lseek(dirfd, 0, SEEK_SET);
    const long n = ::syscall(SYS_getdents64, dirfd, buf, sizeof buf);
    if (n <= 0) return;
    bool removed = false;
    for (long off = 0; off < n;) {
      const auto* e = reinterpret_cast<const Entry*>(buf + off);
      off += e->reclen;
      if (std::strcmp(e->name, ".") == 0 || std::strcmp(e->name, "..") == 0) continue;
      if (e->type == DT_DIR && depth > 0) {
        const int sub = ::openat(dirfd, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) {
          remove_entries(sub, depth - 1);
          ::close(sub);
        }
        removed |= ::unlinkat(dirfd, e->name, AT_REMOVEDIR) == 0;
      } else {
        removed |= ::unlinkat(dirfd, e->name, 0) == 0;
      }
    }
    if (!removed) return;
  }
}

void remove_tree_noalloc(const char* dir) noexcept {
  const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  remove_entries(fd, 2);  // a staging directory holds files and new directories of files
  ::close(fd);
  ::rmdir(dir);
}

}  // namespace

void abandon_staged_outputs() noexcept {
  for (auto& s : g_slots)
    if (s.used.load()) remove_tree_noalloc(s.path);
}

namespace {
std::atomic<int> g_committing{0};       // OutputGroups renaming their outputs into place now
std::atomic<int> g_deferred_signal{0};  // a signal that arrived meanwhile
}  // namespace

bool abandon_staged_outputs_for_signal(int signal) noexcept {
  if (g_committing.load() > 0) {
    g_deferred_signal.store(signal);
    return false;
  }
  abandon_staged_outputs();
  return true;
}

// --- InputFile -----------------------------------------------------------------------------------

InputFile InputFile::open(const fs::path& path) {
  const std::string what = path.string();
  auto fail = [&](const std::string& problem) -> void { throw IoError(what + ": " + problem); };
  struct stat before{};
  if (::stat(path.c_str(), &before) != 0) fail("cannot open: " + errno_text(errno));
  if (!S_ISREG(before.st_mode)) fail("not a regular file (it is " + kind_of(before.st_mode) + ")");
  // O_NONBLOCK: should the name be swapped for a FIFO after the stat, the open still returns.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) fail("cannot open: " + errno_text(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != before.st_dev || st.st_ino != before.st_ino) {
    ::close(fd);
    fail("not a regular file (it changed while being opened)");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return InputFile(fd, static_cast<std::uint64_t>(st.st_size), what);
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), what_(std::move(other.what_)) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    what_ = std::move(other.what_);
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(std::uint64_t offset, std::span<std::byte> dst) const {
  std::size_t got = 0;
  while (got < dst.size()) {
    const ssize_t r = ::pread(fd_, dst.data() + got, dst.size() - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(what_ + ": read failed: " + errno_text(errno));
    if (r == 0)
      throw IoError(what_ + ": the file ended at byte " + std::to_string(offset + got) +
                    " (it shrank while being read)");
    got += static_cast<std::size_t>(r);
  }
}

std::vector<std::byte> InputFile::read_all(std::uint64_t limit, const std::string& role) const {
  if (size_ > limit)
    throw IoError(what_ + ": " + std::to_string(size_) + " bytes is more than a " + role + " may have (" +
                  std::to_string(limit) + ")");
  std::vector<std::byte> out(static_cast<std::size_t>(size_));
  read_at(0, out);
  return out;
}

// --- OutputGroup ---------------------------------------------------------------------------------

namespace {

[[noreturn]] void refuse(const std::string& who, const std::string& problem) {
  throw OutputRefused(who + ": " + problem);
}

/// An existing directory, absolute with symbolic links resolved; refuses a missing one.
fs::path existing_directory(const fs::path& dir, const std::string& who) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) {
    refuse(who, "cannot create a temporary file in '" + dir.string() + "': " + errno_text(errno));
  }
  if (!S_ISDIR(st.st_mode)) refuse(who, "'" + dir.string() + "' is not a directory");
  std::error_code ec;
  fs::path canonical = fs::canonical(dir, ec);
  if (ec) refuse(who, "cannot resolve the directory '" + dir.string() + "': " + ec.message());
  return canonical;
}

fs::path parent_or_dot(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

}  // namespace

OutputGroup::OutputGroup() = default;

OutputGroup::~OutputGroup() { abandon(); }

std::string OutputGroup::name(const fs::path& user, const std::string& label) const {
  return label.empty() ? user.string() : label + " " + user.string();
}

void OutputGroup::protect(const fs::path& input, const std::string& label) {
  struct stat st{};
  if (input.empty() || ::stat(input.c_str(), &st) != 0) return;  // reading it will say what is wrong
  const Identity id{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
  for (const Output& o : outputs_)
    if (o.existed && o.id == id) refuse(name(o.user, o.label), "is also the input " + name(input, label));
  protected_.push_back({input, label, id});
}

void OutputGroup::refuse_same(const fs::path& dest, const Identity* id, const std::string& who) const {
  for (const Output& o : outputs_)
    if (o.dest == dest || (id && o.existed && o.id == *id))
      refuse(who, "is the same file as " + name(o.user, o.label) + "; give each output its own path");
  for (const Directory& d : directories_)
    if (d.dest == dest) refuse(who, "is the directory " + name(d.user, d.label));
  if (id)
    for (const Protected& p : protected_)
      if (p.id == *id) refuse(who, "is also the input " + name(p.user, p.label) + "; write the output elsewhere");
}

const OutputGroup::Directory* OutputGroup::created_directory(const fs::path& dest) const {
  for (const Directory& d : directories_)
    if (d.dest == dest) return &d;
  return nullptr;
}

std::size_t OutputGroup::add_file(const fs::path& path, const std::string& label) {
  const std::string who = name(path, label);
  if (path.empty()) refuse(label.empty() ? "output" : label, "the output path is empty");
  if (!path.has_filename()) refuse(who, "names a directory (it ends in '/'); give a file name");
  Output o{path, label, {}, false, {}};
  struct stat ls{};
  if (::lstat(path.c_str(), &ls) == 0) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0)
      refuse(who, S_ISLNK(ls.st_mode) ? "is a symbolic link to a missing file" : errno_text(errno));
    if (S_ISDIR(st.st_mode)) refuse(who, "is a directory; give a file name");
    if (!S_ISREG(st.st_mode)) refuse(who, "is " + kind_of(st.st_mode) + ", not a regular file; qkv never replaces one");
    std::error_code ec;
    o.dest = fs::canonical(path, ec);
    if (ec) refuse(who, "cannot resolve the path: " + ec.message());
    o.existed = true;
    o.id = {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
  } else if (errno == ENOENT) {
    const fs::path parent = parent_or_dot(path);
    std::error_code ec;
    const fs::path guess = fs::weakly_canonical(fs::absolute(parent, ec), ec);
    if (const Directory* d = created_directory(guess)) {
      o.dest = d->dest / path.filename();
    } else {
      o.dest = existing_directory(parent, who) / path.filename();
    }
  } else if (errno == ENOTDIR) {
    refuse(who, "a part of the path before the file name is not a directory");
  } else {
    refuse(who, errno_text(errno));
  }
  refuse_same(o.dest, o.existed ? &o.id : nullptr, who);
  outputs_.push_back(std::move(o));
  return outputs_.size() - 1;
}

void OutputGroup::add_directory(const fs::path& path, const std::string& label) {
  const std::string who = name(path, label);
  if (path.empty()) refuse(label.empty() ? "output directory" : label, "the directory path is empty");
  const fs::path p = path.has_filename() ? path : path.parent_path();
  struct stat st{};
  if (::stat(p.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) refuse(who, "is " + kind_of(st.st_mode) + ", not a directory");
    return;  // files in it are outputs like any other
  }
  if (errno != ENOENT) refuse(who, errno_text(errno));
  struct stat ls{};
  if (::lstat(p.c_str(), &ls) == 0) refuse(who, "is a symbolic link to a missing file");
  Directory d{path, existing_directory(parent_or_dot(p), who) / p.filename(), label};
  refuse_same(d.dest, nullptr, who);
  directories_.push_back(std::move(d));
}

const fs::path& OutputGroup::scratch_for(const fs::path& existing_dir, const std::string& who) {
  auto it = scratch_.find(existing_dir);
  if (it != scratch_.end()) return it->second;
  std::string tmpl = (existing_dir / ".qkv-XXXXXX").string();
  // Created and registered with the ending signals held back: a signal in between would find
  // the directory not yet registered, and leave it behind.
  sigset_t ending, before;
  sigemptyset(&ending);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&ending, sig);
  ::pthread_sigmask(SIG_BLOCK, &ending, &before);
  if (::mkdtemp(tmpl.data()) == nullptr) {
    const int e = errno;
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw IoError(who + ": cannot create a temporary file in '" + existing_dir.string() + "': " + errno_text(e));
  }
  const int slot = register_scratch(fs::path(tmpl));
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  it = scratch_.emplace(existing_dir, fs::path(tmpl)).first;
  registry_slots_.push_back(slot);
  return it->second;
}

fs::path OutputGroup::staging_path(std::size_t i) {
  const Output& o = outputs_.at(i);
  const std::string who = name(o.user, o.label);
  const fs::path dir = o.dest.parent_path();
  if (const Directory* d = created_directory(dir)) {
    const fs::path staged_dir = scratch_for(d->dest.parent_path(), who) / d->dest.filename();
    if (::mkdir(staged_dir.c_str(), 0777) != 0 && errno != EEXIST)
      throw IoError(who + ": cannot create a temporary directory: " + errno_text(errno));
    return staged_dir / o.dest.filename();
  }
  return scratch_for(dir, who) / o.dest.filename();
}

void OutputGroup::write(std::size_t i, std::initializer_list<std::span<const std::byte>> chunks) {
  const fs::path p = staging_path(i);
  const std::string who = name(outputs_[i].user, outputs_[i].label);
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw IoError(who + ": cannot create a temporary file: " + errno_text(errno));
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(p.c_str());
    throw IoError(who + ": " + what + ": " + errno_text(e));
  };
  for (const auto& chunk : chunks) {
    std::size_t done = 0;
    while (done < chunk.size()) {
      const ssize_t w = ::write(fd, chunk.data() + done, chunk.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("cannot write");
      done += static_cast<std::size_t>(w);
    }
  }
  if (::fsync(fd) != 0) fail("cannot write (fsync)");
  if (::close(fd) != 0) {
    ::unlink(p.c_str());
    throw IoError(who + ": cannot write (close): " + errno_text(errno));
  }
}

std::string OutputGroup::in_user_terms(std::string message) const {
  for (const auto& [dir, scratch] : scratch_) {
    const std::string from = scratch.string(), to = dir.string();
    for (std::size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
      message.replace(at, from.size(), to);
  }
  return message;
}

void OutputGroup::commit() {
  if (committed_) throw std::logic_error("qkv internal error: OutputGroup::commit called twice");
  struct Move {
    std::string from, to, backup, who;
    bool directory = false, existed = false, backed_up = false;
  };
  std::vector<Move> moves;
  for (const Directory& d : directories_) {
    const std::string who = name(d.user, d.label);
    const fs::path staged = scratch_for(d.dest.parent_path(), who) / d.dest.filename();
    if (::mkdir(staged.c_str(), 0777) != 0 && errno != EEXIST)
      throw IoError(who + ": cannot create a temporary directory: " + errno_text(errno));
    moves.push_back({staged.string(), d.dest.string(), "", who, true});
  }
  for (std::size_t i = 0; i < outputs_.size(); ++i) {
    const Output& o = outputs_[i];
    const std::string who = name(o.user, o.label);
    const fs::path staged = staging_path(i);
    const int fd = ::open(staged.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw std::logic_error("qkv internal error: output " + who + " was not written");
    const bool synced = ::fsync(fd) == 0;
    const int e = errno;
    ::close(fd);
    if (!synced) throw IoError(who + ": cannot write (fsync): " + errno_text(e));
    if (created_directory(o.dest.parent_path())) continue;  // moves with its directory
    moves.push_back(
        {staged.string(), o.dest.string(), (staged.parent_path() / (".old-" + std::to_string(i))).string(), who});
  }

  // Lock every destination directory, in one order for every process (no deadlock), so that
  // groups committing to the same files take turns.
  struct Locked {
    int fd;
    Identity id;
  };
  std::vector<Locked> locks;
  auto unlock = [&] {
    for (const Locked& l : locks) ::close(l.fd);  // closing releases the flock
    locks.clear();
  };
  for (const auto& [dir, scratch] : scratch_) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st{};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      const int e = errno;
      if (fd >= 0) ::close(fd);
      unlock();
      throw IoError("cannot open the directory '" + dir.string() + "': " + errno_text(e));
    }
    locks.push_back({fd, {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)}});
  }
  std::sort(locks.begin(), locks.end(), [](const Locked& a, const Locked& b) {
    return a.id.dev != b.id.dev ? a.id.dev < b.id.dev : a.id.ino < b.id.ino;
  });
  for (const Locked& l : locks)
    while (::flock(l.fd, LOCK_EX) != 0 && errno == EINTR) {
    }

  // Under the locks: the destinations again (something may have appeared since add_file), and a
  // hard link of each existing file, to undo its rename if a later one fails.
  for (Move& m : moves) {
    struct stat st{};
    if (::stat(m.to.c_str(), &st) != 0) continue;
    if (m.directory) {
      unlock();
      refuse(m.who, "appeared while qkv was running; nothing was written");
    }
    if (!S_ISREG(st.st_mode)) {
      unlock();
      refuse(m.who, "became " + kind_of(st.st_mode) + " while qkv was running; nothing was written");
    }
    m.existed = true;
    m.backed_up = ::link(m.to.c_str(), m.backup.c_str()) == 0;
  }
  // From here to the end of the renames nothing allocates, so running out of memory cannot
  // leave half a group.
  // A signal handler that abandons the staged outputs (abandon_staged_outputs_for_signal) waits
  // for the renames: a group is renamed whole or not at all, and the signal is raised after.
  g_committing.fetch_add(1);
  int failed_errno = 0;
  std::size_t failed = moves.size();
  for (std::size_t k = 0; k < moves.size(); ++k) {
    if (::rename(moves[k].from.c_str(), moves[k].to.c_str()) == 0) continue;
    failed_errno = errno;
    failed = k;
    for (std::size_t j = k; j-- > 0;) {
      const Move& m = moves[j];
      if (m.directory)
        ::rename(m.to.c_str(), m.from.c_str());
      else if (m.backed_up)
        ::rename(m.backup.c_str(), m.to.c_str());
      else if (!m.existed)
        ::unlink(m.to.c_str());
    }
    break;
  }
  for (const Locked& l : locks) ::fsync(l.fd);
  unlock();
  if (g_committing.fetch_sub(1) == 1)
    if (const int signal = g_deferred_signal.exchange(0)) ::raise(signal);
  if (failed < moves.size()) {
    abandon();
    throw IoError(moves[failed].who + ": cannot write (rename): " + errno_text(failed_errno) +
                  "; no output was changed");
  }
  committed_ = true;
  abandon();  // the hard links of the replaced files and the empty private directories
}

void OutputGroup::abandon() noexcept {
  for (const auto& [dir, scratch] : scratch_) {
    std::error_code ec;
    fs::remove_all(scratch, ec);
  }
  scratch_.clear();
  for (int slot : registry_slots_) unregister_scratch(slot);
  registry_slots_.clear();
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> data) {
  OutputGroup group;
  const std::size_t i = group.add_file(path);
  group.write(i, {data});
  group.commit();
}

}  // namespace qkv
