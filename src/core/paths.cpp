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

// A build tree's marker, or an install's share/mantis/data, in `dir` or above it.
std::string find_from(const fs::path& file) {
  std::error_code ec;
  for (fs::path dir = file.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (std::ifstream marker(dir / "mantis-source-root.txt"); marker) {
      std::string root;
      std::getline(marker, root);
      if (!root.empty()) return (fs::path(root) / "data").string();
    }
    if (fs::is_directory(dir / "share" / "mantis" / "data", ec)) return (dir / "share" / "mantis" / "data").string();
    if (dir == dir.root_path()) break;
  }
  return {};
}

}  // namespace

std::string data_root() {
  if (const char* e = std::getenv("MANTIS_DATA_DIR"); e != nullptr && *e != '\0') return e;
  std::string looked;
  for (const fs::path& f : own_files()) {
    if (std::string r = find_from(f); !r.empty()) return r;
    looked += (looked.empty() ? "" : ", ") + f.parent_path().string();
  }
  throw InputError(fmt::format("no data root: MANTIS_DATA_DIR is unset and no build tree (mantis-source-root.txt) "
                               "or install (share/mantis/data) is in or above {}; set MANTIS_DATA_DIR to a "
                               "directory like the source tree's data/",
                               looked.empty() ? "this program's directory" : looked));
}

}  // namespace mantis
