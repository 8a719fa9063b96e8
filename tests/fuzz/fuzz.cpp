#include "fuzz.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string_view>
#include <system_error>

#include "io/checkpoint.h"

namespace mantis::fuzz {

namespace fs = std::filesystem;

namespace {
std::map<std::string, Target>& table() {
  static std::map<std::string, Target> t;
  return t;
}
}  // namespace

Registration::Registration(const char* name, Target t) { table()[name] = t; }

Target target(const std::string& name) {
  if (auto it = table().find(name); it != table().end()) return it->second;
  std::fprintf(stderr, "mantis_fuzz: unknown target '%s' (known:", name.c_str());
  for (auto& [n, t] : table()) std::fprintf(stderr, " %s", n.c_str());
  std::fprintf(stderr, "); choose one with --target=NAME\n");
  std::exit(2);
}

const std::string& scratch() {
  // Removed at exit by its own destructor (an atexit handler would run after the string's).
  struct Dir {
    std::string path;
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir{[] {
    std::error_code ec;
    const char* env = std::getenv("MANTIS_FUZZ_SCRATCH");
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = env && *env                        ? env
                             : fs::is_directory("/dev/shm", ec) ? "/dev/shm"
                             : tmp && *tmp                      ? tmp
                                                                : "/tmp";
    std::string t = base + "/mantis-fuzz-XXXXXX";
    if (!mkdtemp(t.data())) {
      std::perror(("fuzz: mkdtemp " + t).c_str());
      std::abort();
    }
    return t;
  }()};
  return dir.path;
}

std::string put(const std::string& name, std::string_view bytes) {
  const fs::path p = name.starts_with('/') ? fs::path(name) : fs::path(scratch()) / name;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror(("fuzz: cannot write " + p.string()).c_str());
    std::abort();
  }
  return p.string();
}

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: FINDING: %s\n", what);
  std::abort();
}

ModelConfig tiny_config(Arch arch) {
  ModelConfig c;
  c.arch = arch, c.vocab = 16, c.ctx = 8, c.layers = 2, c.heads = 2, c.dim = 8;
  c.kv_heads = arch == Arch::llama ? 1 : 2;
  c.hidden = arch == Arch::llama ? 16 : 32;
  c.tied = arch == Arch::gpt2;
  return c;
}

std::string tiny_checkpoint(const std::string& name, Arch arch, bool hf) {
  const std::string dir = scratch() + "/" + name;
  const Model m = init_model(tiny_config(arch), 1);
  hf ? save_model_hf(m, dir) : save_model(m, dir);
  return dir;
}

}  // namespace mantis::fuzz

#ifndef MANTIS_FUZZ_REPLAY
// libFuzzer's entry points: the target named by --target=NAME.
namespace {
mantis::fuzz::Target chosen = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::string name;
  for (int i = 1; i < *argc; ++i)
    if (std::string_view a = (*argv)[i]; a.starts_with("--target=")) name = a.substr(9);
  chosen = mantis::fuzz::target(name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return chosen(data, size); }
#endif
