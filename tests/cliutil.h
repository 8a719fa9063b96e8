// cliutil — running the `mantis` binary in tests: stdin in; status, stdout, stderr out.
// The binary's path comes from the environment variable MANTIS_BIN (set by Meson). Include after
// <catch2/catch.hpp>.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testutil.h"

extern char** environ;

namespace mantis_test_cli {

namespace fs = std::filesystem;


struct Result {
  int status = -1;
  std::string out, err;
};

using mantis::test::scratch_dir;
using mantis::test::slurp;
using mantis::test::spit;

inline std::string mantis_bin() {
  const char* b = std::getenv("MANTIS_BIN");
  if (!b || !*b) FAIL("MANTIS_BIN is not set (the path of the mantis executable)");
  return b;
}

// A child's wall-clock limit in run(); below the Meson timeout of the test that includes this.
inline int child_deadline_seconds = 200;

// Runs `mantis args…` with `input` on stdin. stdout_path, when given, receives stdout instead of
// the capture (/dev/full: every write fails, as on a full disk); stdin_path, when given, is stdin
// instead of `input` (/dev/zero: an endless source).
inline Result run(const std::vector<std::string>& args, const std::string& input = "",
                  const std::string& stdout_path = "", const std::string& stdin_path = "") {
  static int counter = 0;
  const fs::path dir = scratch_dir();
  const std::string tag = std::to_string(counter++);
  const fs::path in = dir / ("in" + tag), out = dir / ("out" + tag), err = dir / ("err" + tag);
  spit(in, input);
  const std::string bin = mantis_bin();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(bin.c_str()));
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, stdin_path.empty() ? in.c_str() : stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.empty() ? out.c_str() : stdout_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  // A child that runs past the deadline is killed and named: a CLI test must fail with the
  // command that hung, not time out as a whole (e.g. an "error" case that became a valid, long run).
  int ws = 0;
  pid_t w = 0;
  for (int ms = 0; (w = waitpid(pid, &ws, WNOHANG)) == 0; ms += 5) {
    if (ms >= child_deadline_seconds * 1000) {
      kill(pid, SIGKILL);
      waitpid(pid, &ws, 0);
      std::string cmd = "mantis";
      for (auto& a : args) cmd += " " + a;
      FAIL(cmd << " ran past " << child_deadline_seconds << " s and was killed");
    }
    usleep(5000);
  }
  REQUIRE(w == pid);
  Result r;
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(in);
  fs::remove(out);
  fs::remove(err);
  return r;
}

// One line for messages (TAP output is line-oriented).
inline std::string flat(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = '|';
  return s;
}

inline std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) v.push_back(l);
  return v;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += x + "\n";
  return s;
}

// Exit status 2, nothing on stdout, exactly one stderr line "mantis: error: …" containing `needle`.
inline void check_error(const Result& r, const std::vector<std::string>& needles) {
  INFO("stderr: " << flat(r.err) << " stdout: " << flat(r.out));
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  REQUIRE(!r.err.empty());
  CHECK(r.err.back() == '\n');
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("mantis: error: ", 0) == 0);
  for (auto& n : needles) CHECK(r.err.find(n) != std::string::npos);
}

inline fs::path write_config(const std::string& name, const std::string& text) {
  const fs::path p = scratch_dir() / name;
  spit(p, text);
  return p;
}

// The manifest fields every result-writing command records (src/exp/manifest.h).
inline void check_manifest_header(const nlohmann::json& m, const std::string& generator) {
  INFO(m.dump().substr(0, 400));
  CHECK(m["generator"] == generator);
  CHECK(m["command"].get<std::string>().find("mantis") != std::string::npos);
  CHECK(!m["git_commit"].get<std::string>().empty());
  CHECK(!m["started_utc"].get<std::string>().empty());
  CHECK(m["host"].is_string());
  CHECK(!m["build"]["type"].get<std::string>().empty());
  CHECK(m["build"]["flags"].get<std::string>().find("-ffp-contract=off") != std::string::npos);
  CHECK(!m["build"]["compiler"].get<std::string>().empty());
  CHECK(m["build"]["native"].is_boolean());
  CHECK(m["build"]["isa"].is_array());
  CHECK(m["cpu"]["model"].is_string());
  CHECK(m["cpu"]["isa"].is_array());
  CHECK(m["cpu"]["hardware_threads"].get<int>() >= 0);
  CHECK(m["timings_s"].is_object());
  CHECK(m["timings_s"].value("total", 0.0) >= 0);
  CHECK(m["seeds"].is_object());
}

}  // namespace mantis_test_cli
