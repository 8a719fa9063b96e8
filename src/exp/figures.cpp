#include "exp/figures.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/file.h"

extern char** environ;

namespace mantis {

namespace fs = std::filesystem;

bool figures_wanted(bool no_figures) {
  const char* e = std::getenv("MANTIS_NO_FIGURES");
  return !no_figures && (e == nullptr || *e == '\0' || std::string(e) == "0");
}

Figures draw_figures(const std::string& dir) {
  Figures f;
  std::string script;
  try {
    script = tools_dir() + "/figures.py";
  } catch (const InputError& e) {
    f.problem = e.what();
    return f;
  }
  const char* env = std::getenv("MANTIS_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
  // The script's output (its "wrote PATH" lines, or its one-line reason) goes to a temporary file.
  std::string log = (fs::temp_directory_path() / "mantis-figures-XXXXXX").string();
  const int fd = ::mkstemp(log.data());
  if (fd < 0) {
    f.problem = fmt::format("no temporary file for the figure script's output in {}",
                            fs::temp_directory_path().string());
    return f;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> args = {python, script, dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, python.c_str(), &fa, nullptr, argv.data(), environ);  // a bare name: PATH
  posix_spawn_file_actions_destroy(&fa);
  ::close(fd);
  int status = 0;
  if (err == 0)
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  std::string out;
  try {
    out = read_file(log);
  } catch (const std::exception&) {
  }
  ::unlink(log.c_str());
  if (err != 0) {
    f.problem = fmt::format("{} cannot be run ({}); set MANTIS_PYTHON to a python3 with matplotlib", python,
                            std::strerror(err));
    return f;
  }
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.rfind("wrote ", 0) == 0) f.written.push_back(line.substr(6));
    if (!line.empty()) last = line;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    f.problem = last.empty() ? fmt::format("{} {} failed (status {})", python, script, status) : last;
  return f;
}

}  // namespace mantis
