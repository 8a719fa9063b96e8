// figures — the PNG(s) of a result set, drawn by tools/figures.py (matplotlib, headless) in a child
// process right after a command has written the set (every study, eval, train, bench).
//
// The interpreter is $MANTIS_PYTHON (a path, or a name looked up in PATH), else /usr/bin/python3
// (Debian's, where python3-matplotlib installs); the script is core/paths.h's
// tools_dir()/figures.py. The figures go into the set's own
// directory as <dir name>-<figure>.png; they are drawings of the verified set, so they are not
// listed in its manifest. Figures are a convenience beside the numbers: when they cannot be drawn
// (no interpreter, no matplotlib), the command says so in one line and its results stand.
// $MANTIS_NO_FIGURES=1 or a command's --no-figures skips them (the test suites set the former).
#pragma once

#include <string>
#include <vector>

namespace mantis {

struct Figures {
  std::vector<std::string> written;  // the PNG paths
  std::string problem;               // non-empty: not drawn, and why (one line)
};
Figures draw_figures(const std::string& dir);

// Whether figures are wanted: not with `no_figures` (--no-figures) or MANTIS_NO_FIGURES set non-empty and not "0".
bool figures_wanted(bool no_figures);

}  // namespace mantis
