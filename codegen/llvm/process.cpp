#include "llvm/process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace qkv::codegen::process {

std::string temp_file(const std::string& tag, const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  const std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/qkv-" + tag + "-XXXXXX" + suffix;
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const int fd = ::mkstemps(buf.data(), static_cast<int>(suffix.size()));
  if (fd < 0) return {};
  ::close(fd);
  return buf.data();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

Result run(const std::vector<std::string>& args, bool search_path) {
  Result r;
  const std::string log = temp_file("run", ".log");
  if (log.empty()) {
    r.error = std::string("cannot create a temporary file: ") + std::strerror(errno);
    return r;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_TRUNC | O_CREAT, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = search_path ? ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ)
                             : ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    r.error = "cannot start " + args[0] + ": " + std::strerror(rc);
  } else {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status))
      r.status = WEXITSTATUS(status);
    else
      r.error = args[0] + " was terminated by signal " + std::to_string(WTERMSIG(status));
  }
  r.output = slurp(log);
  ::unlink(log.c_str());
  return r;
}

}  // namespace qkv::codegen::process
