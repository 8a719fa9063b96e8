// study — what every resumable study and every result-writing command shares: cell files that
// carry the key of everything that determines them, and result sets written as a set.
//
// Cells. A study is a list of independent cells; cell i's result is DIR/cells/<i>.json (written
// atomically) holding {"key": …, …numbers…}. The key is an ordered JSON object of every input
// that determines the cell's numbers (model file SHA-256s, data SHA-256s, window starts, rule
// settings, formats, seeds, the version of the semantics). A stored cell is reused only when its
// key equals the key of the current configuration; otherwise the run stops with a one-line error
// naming the first differing field, and `--overwrite` recomputes.
//
// Result sets. A command's results (results.csv, results.json, …) and manifest.json are one set:
// the old manifest is removed first, each file is written atomically, and manifest.json is
// written last with the SHA-256 of every file of the set under "files". A reader that finds no
// manifest, or a file whose SHA-256 differs, has an interrupted or mixed set and must refuse it
// (verify_result_set here; tools/results.py for Python readers).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/forward.h"  // defines: ForwardStats, SiteHealth

namespace mantis {

using ojson = nlohmann::ordered_json;

// A number for JSON: finite values as numbers; ±inf and NaN as the strings "inf", "-inf", "nan"
// (JSON has no such numbers; a null would hide which it was).
ojson json_number(double x);
// The inverse, for reading results: a number, or one of those three strings; InputError naming
// `where` otherwise.
double json_to_double(const ojson& v, const std::string& where);

// A format's full definition (for keys: a format read from a TOML file is keyed by what it
// defines, not by its path).
ojson format_json(const Format& f);

// The files a checkpoint path stands for (a directory: config.json, model.safetensors; else the
// file), each {"file": name, "sha256": …}. With `basenames`, file names without their directory
// (for keys: moving a checkpoint does not change what it computes).
ojson model_files_json(const std::string& path, bool basenames = false);

// The first dotted path where `stored` and `want` differ ("data.window_starts[3]"), with both
// values shortened, e.g. "data.window_starts[3]: 1200 in the cell, 1180 now"; empty if equal.
std::string first_difference(const ojson& stored, const ojson& want);

// Range health (forward.h SiteHealth) summed over the forward passes of a result.
struct HealthTable {
  std::map<std::pair<int, int>, SiteHealth> at;  // (site, layer) → counts; non-zero entries only
  void add(const ForwardStats& st, int layers);
  SiteHealth total() const;
  // In the order the forward pass meets them (layer by layer, the model-level sites last), so
  // the first entry is where values first left a range.
  ojson json() const;           // [{"site", "layer", "overflow", "nan", "inf"}, …]
  std::string table() const;    // one line per entry, for the terminal
};

// Reads a cell file: a JSON object with an object "key". InputError naming the file otherwise.
ojson read_cell(const std::string& path);

// Writes the result set (names relative to dir, written in order), then manifest.json with
// "files": {name: sha256} added. Creates dir.
void write_result_set(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files,
                      ojson manifest);
// InputError unless dir/manifest.json exists and every file it lists has the listed SHA-256.
void verify_result_set(const std::string& dir);

}  // namespace mantis
