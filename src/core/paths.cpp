#include "core/paths.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace mantis {

namespace fs = std::filesystem;

namespace {

// The files this code may live in, nearest first: the shared library or executable that holds this
// function (dladdr: the Python module's .so), then the running executable.
std::vector<fs::path> own_files() {
  std::vector<fs::path> files;
  std::error_code ec;
  Dl_info info{};
  // dladdr names the main program by argv[0], which may be relative to a directory since left.
  if (dladdr(reinterpret_cast<void*>(&data_root), &info) != 0 && info.dli_fname != nullptr &&
      fs::path(info.dli_fname).is_absolute())
    if (fs::path p = fs::canonical(info.dli_fname, ec); !ec) files.push_back(p);
  if (fs::path p = fs::canonical("/proc/self/exe", ec); !ec && (files.empty() || p != files.front()))
    files.push_back(p);
  return files;
}

// What a build tree's marker, or an install's share/mantis, in `dir` or above it, makes the shared
// root: the source root, or <prefix>/share/mantis (each holds data/ and tools/).
std::string find_from(const fs::path& file) {
  std::error_code ec;
  for (fs::path dir = file.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (std::ifstream marker(dir / "mantis-source-root.txt"); marker) {
      std::string root;
      std::getline(marker, root);
      if (!root.empty()) return root;
    }
    if (fs::is_directory(dir / "share" / "mantis" / "data", ec)) return (dir / "share" / "mantis").string();
    if (dir == dir.root_path()) break;
  }
  return {};
}

// The shared root found from this code's files; InputError "<what>: … where it looked; <fix>".
std::string shared_root(const char* what, const char* fix) {
  std::string looked;
  for (const fs::path& f : own_files()) {
    if (std::string r = find_from(f); !r.empty()) return r;
    looked += (looked.empty() ? "" : ", ") + f.parent_path().string();
  }
  throw InputError(fmt::format("{}: no build tree (mantis-source-root.txt) or install (share/mantis/data) is in or "
                               "above {}; {}",
                               what, looked.empty() ? "this program's directory" : looked, fix));
}

}  // namespace

std::string data_root() {
  if (const char* e = std::getenv("MANTIS_DATA_DIR"); e != nullptr && *e != '\0') return e;
  const std::string r = shared_root("no data root",
                                    "MANTIS_DATA_DIR is unset: set it to a directory like the source tree's data/");
  return (fs::path(r) / "data").string();
}

std::string tools_dir() {
  const std::string r = shared_root("no figure scripts", "install mantis (meson install) or run its build tree's binary");
  return (fs::path(r) / "tools").string();
}

}  // namespace mantis
