#pragma once
// Where the run-time data (data/: gpt2/, corpora/, shards/; data/README.md) is, decided at run time so
// that no path of the source or build tree is compiled into a binary and an installed `mantis` or
// Python module works from any directory.

#include <string>

namespace mantis {

// The data root, the first of:
//   1. $MANTIS_DATA_DIR when set and non-empty: a directory laid out like the source tree's data/
//      (gpt2/{encoder.json,vocab.bpe}, corpora/manifest.json, corpora/<corpus>/<split>.txt.gz,
//      shards/<tokenizer>/<corpus>/<split>.tok);
//   2. found from this code's own file (the executable, or the Python module's shared library), going up
//      its directories: one holding mantis-source-root.txt (a build tree: meson writes the source root
//      there at configure time) gives <source root>/data; one holding share/mantis/data (an install:
//      <prefix>/bin/mantis, <prefix>/lib/…/mantis/_mantis….so) gives that;
//   3. else an InputError naming where it looked.
std::string data_root();

// The directory of the figure scripts (tools/figures.py, tools/results.py): <source root>/tools in a
// build tree, <prefix>/share/mantis/tools in an install (found as in 2. above); InputError otherwise.
std::string tools_dir();

}  // namespace mantis
