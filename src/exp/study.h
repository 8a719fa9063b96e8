// study — what every resumable study and every result-writing command shares: cell files that
// carry the key of everything that determines them, and result sets written as a set.
//
// Cells. A study is a list of independent cells; cell i's result is DIR/cells/<i>.json (written
// atomically) holding {"key": …, …numbers…}. The key is an ordered JSON object of every input
// that determines the cell's numbers (model file SHA-256s, data SHA-256s, window starts, rule
// settings, formats, seeds, the version of the semantics). A stored cell is reused only when its
// key equals the key of the current configuration; otherwise the run stops with a one-line error
// naming the first differing field, and `--overwrite` recomputes.
// Cells are hashed as result files are: beside each cell, DIR/cells/<i>.json.sha256 holds its
// SHA-256 as sha256sum writes it ("<64 hex>  <i>.json"), written just before the cell (a run
// killed between the two leaves a hash without its cell: the cell is missing and is computed
// again; one file per cell, so shards running at once never share one). Every read of a cell —
// resume, merge, a spawned cell read back — checks it: a cell whose bytes differ from its hash
// (its values edited after it was computed, or a rewrite interrupted), a cell without its hash
// (written before cells were hashed, or the hash removed) or a malformed hash is a one-line error
// naming the file, never reused and never silently recomputed; `--overwrite` recomputes it and
// says so on the study's log (stderr where it has none).
//
// Running. run_study() is the one driver of every study (the LAMP sweep, the μ-sweep): it
// decides which cells to compute (all, one shard `--cell i`, none for `--merge`), reuses stored
// cells under an equal key, computes the rest with one progress reporter, and for the merge reads
// every cell back (key checked) and refuses missing ones unless partial merges are allowed. A
// study without a cell directory (persistent = false) keeps its cells in memory: no resume, no
// shards, always merged.
//
// Result sets. A command's results (results.csv, results.json, …) and manifest.json are one set:
// the old manifest is removed first, each file is written atomically, and manifest.json is
// written last with the SHA-256 of every file of the set under "files". Readers hold every set to
// one rule (read_result_set here, for every C++ reader; tools/results.py for Python readers, whose
// docstring states the same rule in the same words):
//   The result-set rule. A directory DIR holds a valid result set when
//   1. DIR/manifest.json is a regular file (not a symbolic link) of at most 64 MiB holding one
//      JSON object (RFC 8259: UTF-8 without a byte-order mark, no NaN or Infinity, no number
//      beyond binary64's range, no unpaired surrogate), with no key twice in any object and at
//      most 100 levels of nesting;
//   2. its "files" is a non-empty object {name: SHA-256};
//   3. every name is a relative path inside DIR: '/'-separated, not absolute, with no empty, '.'
//      or '..' component, no backslash and no control character;
//   4. every SHA-256 is a string of 64 lower-case hexadecimal digits;
//   5. every file the reader reads is among the names;
//   6. every name is a regular file reached from DIR without following a symbolic link, and its
//      SHA-256 equals the listed one.
//   Anything else is refused with one line naming the manifest or the file.
//
// Column names. A CSV column (results, summaries, curves, training logs) whose numbers have a unit
// carries it as the last suffix of its name: `_seconds` (or `seconds`), `_bytes`
// (`bytes_per_param`: bytes per parameter), `_nats` (KL divergences and cross-entropy losses,
// natural log: `kl_nats`, `val_loss_nats`, and their interval ends `kl_lo_nats`, `t_lo_nats`, …),
// `_tokens` (`ctx_tokens`, or `tokens`), `_elements` (`period_elements`); a bracketed qualifier
// follows the unit (`val_loss_nats[kjv/validation]`). A column without one is dimensionless: counts
// (`steps`, `positions`, `flips`, `overflow`, `units`, …), `*_rate` fractions, ratios, perplexities
// (`ppl*`), relative errors, `gamma`, `lr`, `grad_norm`, activation statistics, design values
// (`mu`, `tau`, `seed`); `max_abs_logit_error` names its unit, logits. JSON keys (results.json,
// cells) are the in-memory names and carry no unit. merge.h's metric_unit() reads the unit back
// from the name.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/progress.h"
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

// A study's axis lists each value once: two entries that resolve to one value (a format and its
// alias or a file of its definition, "RNE" and "rne", μ = 4 and "ps4") would be two cells of one
// key. canonical[i] is entry i's resolved form; InputError at `where` naming both spellings (as
// written: spelled[i]) and `what` they are otherwise.
void refuse_repeats(const std::string& where, const std::string& axis, const std::string& what,
                    const std::vector<std::string>& spelled, const std::vector<std::string>& canonical);

// The name a training configuration's model has in a study's results: the file's stem without
// "train-" (experiments/train-gpt2-bytes.toml: gpt2-bytes).
std::string study_model_name(const std::string& train_config_path);
// A study's `models` (training configurations) each once, by that name (refuse_repeats).
void refuse_repeated_models(const std::string& where, const std::vector<std::string>& models);

// Writes a cell file and its hash (above).
void write_cell(const std::string& path, const ojson& cell);
// Reads a cell file: its bytes as its hash says, a JSON object with an object "key". InputError
// naming the file otherwise.
ojson read_cell(const std::string& path);

// Writes the result set (names relative to dir, written in order), then manifest.json with
// "files": {name: sha256} added. Creates dir.
void write_result_set(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files,
                      ojson manifest);
// Writes dir/manifest.json for files already in dir (a training run's logs), with their SHA-256s
// under "files", replacing the old manifest.
void write_manifest(const std::string& dir, const std::vector<std::string>& files, ojson manifest);
// A result set read back under the result-set rule (above): its manifest and the content of the
// files the reader reads (`reads`, each hashed from the bytes returned). InputError, one line,
// for anything the rule refuses.
struct ResultSet {
  ojson manifest;
  std::map<std::string, std::string> files;  // name → content, for the names in `reads`
};
ResultSet read_result_set(const std::string& dir, const std::vector<std::string>& reads);
// The set verified under the rule, nothing read: its manifest.
ojson verify_result_set(const std::string& dir);

// ---------------------------------------------------------------- running a study
struct StudyPlan {
  std::string label;               // for the progress reporter: "lamp sweep"
  size_t cells = 0;
  uint64_t work_per_cell = 1;      // progress units per cell (windows, …)
  std::string unit;                // their name: "windows"
  std::function<std::string(size_t)> name;
  std::function<ojson(size_t)> key;  // persistent studies: everything cell i depends on
  // The result of cell i (its key is added); `tick` after each unit of work.
  std::function<ojson(size_t, const std::function<void()>& tick)> compute;
  // After cell i is computed and stored (a line per cell where no bar is shown).
  std::function<void(size_t, const ojson&, const Progress&)> done;
};
// Which cells a run computes, and how it merges: the options every study command shares.
struct CellChoice {
  int cell = -1;            // ≥ 0: compute only this cell, no merge
  int shard = -1;           // with shards > 0: compute the cells i ≡ shard (mod shards), no merge
  int shards = 0;           //   (a cluster's array task; `--shard k/N`)
  bool merge_only = false;  // compute nothing, merge what is stored
  bool overwrite = false;   // recompute cells stored under another key (or malformed)
  bool allow_partial = false;
  bool merges() const { return cell < 0 && shards == 0; }  // this run writes the result set
};
// "k/N" (0 ≤ k < N) into c.shard / c.shards; InputError otherwise.
void parse_shard(const std::string& text, CellChoice& c);
// Whether a run with this choice checks cell i's key (computes, reuses or merges it): the chosen
// cell, the shard's cells, or every cell (a whole run, a merge).
bool touches(const CellChoice& c, size_t i);

struct StudyOptions : CellChoice {
  std::string out;          // persistent: cells in out/cells/<i>.json
  bool persistent = true;
  ProgressMode progress = ProgressMode::automatic;
  std::FILE* log = stdout;  // the study's messages; nullptr: none
};
struct StudyRun {
  std::vector<size_t> computed;
  bool merge = false;                       // every cell was read back: merge now
  std::vector<std::optional<ojson>> cells;  // when merging: the cells present, keys checked
  std::vector<size_t> missing;
  double seconds = 0;                       // this process
};
std::string cell_path(const std::string& out, size_t i);
// InputError for --merge with --cell or --shard, --cell with --shard, or a --cell outside
// 0..cells-1 (run_study checks it too; callers check it before loading what the cells need).
void check_cell_choice(size_t cells, const CellChoice& o);
// InputError before any cell is computed: a bad --cell, --merge with --cell, an uncreatable
// directory, a stored cell of another key (without overwrite).
StudyRun run_study(const StudyPlan& plan, const StudyOptions& o);
// The training data keys (manifest.h training_data_key) of the models whose cells a run with
// choice `c` touches: model index → key; cell i trains model model_of_cell[i] (a path in `models`).
std::map<size_t, ojson> touched_data_keys(const CellChoice& c, const std::vector<size_t>& model_of_cell,
                                          const std::vector<std::string>& models);
// A study's output directory: `given` (--out), else the configuration's `out`; InputError naming
// the configuration when neither is set.
std::string study_out(const std::string& given, const std::string& configured, const std::string& config_path);
// A study's options from its command's cell choice, checked against its cell count (check_cell_choice)
// before the study loads what its cells need.
StudyOptions study_options(const CellChoice& c, size_t cells, const std::string& out, ProgressMode progress,
                           std::FILE* log);

}  // namespace mantis
