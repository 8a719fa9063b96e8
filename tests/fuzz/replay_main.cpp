// replay_main — mantis_fuzz without libFuzzer (the ordinary build, g++): every input given is run
// once through a target, so the seed corpus and the reproducers of past findings
// (tests/fuzz/regress/<target>/) are a Meson test in every build.
//   mantis_fuzz --target=NAME [--root DIR] [--seeds LIST]... [FILE | DIR]...
// LIST: a file of glob patterns relative to --root (one a line, '#' comments), the seeds a
// target takes from the source tree (tests/fuzz/seeds/<target>.seeds); DIR: its regular files,
// in name order (a missing DIR is none). Exits non-zero when no input was run; a finding aborts.
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz.h"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> expand_seeds(const std::string& list, const std::string& root) {
  std::ifstream in(list);
  if (!in) {
    std::fprintf(stderr, "mantis_fuzz: cannot read %s\n", list.c_str());
    std::exit(2);
  }
  std::vector<std::string> files;
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty() || line[0] == '#') continue;
    glob_t g{};
    if (glob((root + "/" + line).c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
    else
      std::fprintf(stderr, "mantis_fuzz: %s: '%s' matches nothing under %s\n", list.c_str(), line.c_str(),
                   root.c_str());
    globfree(&g);
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name, root = ".";
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.starts_with("--target=")) {
      name = a.substr(9);
    } else if (a == "--root" && i + 1 < argc) {
      root = argv[++i];
    } else if (a == "--seeds" && i + 1 < argc) {
      for (auto& f : expand_seeds(argv[++i], root)) inputs.push_back(f);
    } else if (fs::is_directory(a)) {
      std::vector<std::string> dir;
      for (auto& e : fs::directory_iterator(a))
        if (e.is_regular_file()) dir.push_back(e.path().string());
      std::sort(dir.begin(), dir.end());
      inputs.insert(inputs.end(), dir.begin(), dir.end());
    } else if (fs::exists(a)) {
      inputs.push_back(a);
    }
  }
  const mantis::fuzz::Target run = mantis::fuzz::target(name);
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("%s: %s (%zu bytes)\n", name.c_str(), path.c_str(), bytes.size());
    std::fflush(stdout);
    run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%s: %zu inputs, no finding\n", name.c_str(), inputs.size());
  return inputs.empty() ? 1 : 0;
}
