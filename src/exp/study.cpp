#include "exp/study.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>

#include "core/format.h"  // defines: InputError
#include "core/file.h"
#include "exp/manifest.h"  // training_data_key

namespace mantis {

namespace fs = std::filesystem;

ojson json_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

double json_to_double(const ojson& v, const std::string& where) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  throw InputError(fmt::format("{}: expected a number, found {}", where, v.dump().substr(0, 40)));
}

ojson format_json(const Format& f) {
  return {{"name", f.name},
          {"mu", f.mu},
          {"emin", f.emin},
          {"emax", f.emax},
          {"subnormals", f.subnormals},
          {"overflow", to_string(f.overflow)},
          {"specials", to_string(f.specials)}};
}

ojson model_files_json(const std::string& path, bool basenames) {
  ojson files = ojson::array();
  std::error_code ec;
  std::vector<fs::path> list;
  if (fs::is_directory(path, ec)) {
    for (const char* f : {"config.json", "model.safetensors"})
      if (fs::is_regular_file(fs::path(path) / f, ec)) list.push_back(fs::path(path) / f);
  } else {
    list.push_back(path);
  }
  for (auto& f : list)
    files.push_back({{"file", basenames ? f.filename().string() : f.string()}, {"sha256", sha256_file(f.string())}});
  return files;
}

namespace {
std::string shorten(const ojson& v) {
  std::string s = v.dump();
  return s.size() > 48 ? s.substr(0, 45) + "..." : s;
}

std::string diff_at(const ojson& a, const ojson& b, const std::string& path) {
  auto here = [&] { return path.empty() ? std::string("(the key)") : path; };
  if (a.type() != b.type() && !(a.is_number() && b.is_number()))
    return fmt::format("{}: {} in the cell, {} now", here(), shorten(a), shorten(b));
  if (a.is_object()) {
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string p = path.empty() ? it.key() : path + "." + it.key();
      if (!a.contains(it.key())) return fmt::format("{}: missing in the cell, {} now", p, shorten(it.value()));
      if (std::string d = diff_at(a.at(it.key()), it.value(), p); !d.empty()) return d;
    }
    for (auto it = a.begin(); it != a.end(); ++it)
      if (!b.contains(it.key()))
        return fmt::format("{}: {} in the cell, not a key field now", path.empty() ? it.key() : path + "." + it.key(),
                           shorten(it.value()));
    return "";
  }
  if (a.is_array()) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (std::string d = diff_at(a[i], b[i], fmt::format("{}[{}]", path, i)); !d.empty()) return d;
    if (a.size() != b.size()) return fmt::format("{}: {} entries in the cell, {} now", here(), a.size(), b.size());
    return "";
  }
  return a == b ? "" : fmt::format("{}: {} in the cell, {} now", here(), shorten(a), shorten(b));
}
}  // namespace

void HealthTable::add(const ForwardStats& st, int layers) {
  if (st.health.size() != size_t(kSiteCount) * size_t(layers + 1))
    throw std::logic_error("HealthTable::add: the forward pass did not count the site health");
  for (int s = 0; s < kSiteCount; ++s)
    for (int l = -1; l < layers; ++l) {
      const SiteHealth& h = st.health_at(Site(s), l);
      if (h.clean()) continue;
      SiteHealth& t = at[{s, l}];
      t.overflow += h.overflow, t.nan += h.nan, t.inf += h.inf;
    }
}

SiteHealth HealthTable::total() const {
  SiteHealth t;
  for (auto& [k, h] : at) t.overflow += h.overflow, t.nan += h.nan, t.inf += h.inf;
  return t;
}

namespace {
// Entries in the order the forward pass meets them: by layer (model-level calls last), then in
// the order of the sites within a layer; so the first entry is where trouble began. A layer's
// "ln" sums both of its norms and stands between attention and the MLP (before the MLP's norm).
std::vector<std::pair<std::pair<int, int>, SiteHealth>> forward_order(const std::map<std::pair<int, int>, SiteHealth>& at) {
  static const Site order[] = {Site::attn_qkv, Site::attn_qk, Site::softmax, Site::attn_pv, Site::attn_proj, Site::ln,
                               Site::mlp_fc,   Site::gelu,    Site::silu,    Site::mlp_proj, Site::lm_head};
  auto rank = [](const std::pair<int, int>& k) {
    const int pos = int(std::find(std::begin(order), std::end(order), Site(k.first)) - std::begin(order));
    return std::pair{k.second < 0 ? INT32_MAX : k.second, pos};
  };
  std::vector<std::pair<std::pair<int, int>, SiteHealth>> v(at.begin(), at.end());
  std::stable_sort(v.begin(), v.end(), [&](auto& a, auto& b) { return rank(a.first) < rank(b.first); });
  return v;
}
}  // namespace

ojson HealthTable::json() const {
  ojson a = ojson::array();
  for (auto& [k, h] : forward_order(at))
    a.push_back({{"site", to_string(Site(k.first))}, {"layer", k.second}, {"overflow", h.overflow}, {"nan", h.nan},
                 {"inf", h.inf}});
  return a;
}

std::string HealthTable::table() const {
  std::string t;
  for (auto& [k, h] : forward_order(at))
    t += fmt::format("  {:<10} {:<7} overflow {:>10}  nan {:>10}  inf {:>10}\n", to_string(Site(k.first)),
                     k.second < 0 ? std::string("model") : fmt::format("layer {}", k.second), h.overflow, h.nan, h.inf);
  return t;
}

std::string first_difference(const ojson& stored, const ojson& want) { return diff_at(stored, want, ""); }

void refuse_repeats(const std::string& where, const std::string& axis, const std::string& what,
                    const std::vector<std::string>& spelled, const std::vector<std::string>& canonical) {
  for (size_t j = 0; j < canonical.size(); ++j)
    for (size_t i = 0; i < j; ++i) {
      if (canonical[i] != canonical[j]) continue;
      if (spelled[i] == spelled[j])
        throw InputError(fmt::format("{}: '{}' lists {} twice", where, axis, escape_control(spelled[i])));
      throw InputError(fmt::format("{}: '{}' lists {} and {}: one {} twice", where, axis, escape_control(spelled[i]),
                                   escape_control(spelled[j]), what));
    }
}

std::string study_model_name(const std::string& train_config_path) {
  std::string s = fs::path(train_config_path).stem().string();
  if (s.starts_with("train-")) s = s.substr(6);
  return s;
}

void refuse_repeated_models(const std::string& where, const std::vector<std::string>& models) {
  std::vector<std::string> names;
  for (const std::string& m : models) names.push_back(study_model_name(m));
  refuse_repeats(where, "models", "model name in the results", models, names);
}

namespace {
std::string cell_hash_path(const std::string& cell) { return cell + ".sha256"; }

bool is_sha256_hex(std::string_view h) {
  return h.size() == 64 && std::all_of(h.begin(), h.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// JSON a reader walks, copies and writes out again (manifests, cells): at most kJsonMaxDepth levels,
// refused while parsing — a deeper value overflowed the stack when it was copied or dumped (`mantis
// merge` exited 139 on 300,000 levels). With `twice`, the first key repeated within an object.
constexpr int kJsonMaxDepth = 100;
ojson parse_bounded_json(const std::string& text, std::string* twice) {
  std::vector<std::set<std::string>> keys;  // per open object
  const ojson::parser_callback_t check = [&](int depth, ojson::parse_event_t ev, ojson& parsed) {
    const bool start = ev == ojson::parse_event_t::object_start || ev == ojson::parse_event_t::array_start;
    if (start && depth >= kJsonMaxDepth) throw InputError(fmt::format("more than {} levels of nesting", kJsonMaxDepth));
    if (!twice) return true;
    if (ev == ojson::parse_event_t::object_start) keys.emplace_back();
    else if (ev == ojson::parse_event_t::object_end) keys.pop_back();
    else if (ev == ojson::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second && twice->empty())
      *twice = parsed.get<std::string>();
    return true;
  };
  try {
    return ojson::parse(text, check);
  } catch (const ojson::exception& e) {
    throw InputError(e.what());
  }
}
// sha256sum's line for a file's bytes
std::string sha256_line(const std::string& content, const std::string& path) {
  return sha256_hex(content) + "  " + fs::path(path).filename().string() + "\n";
}
}  // namespace

void write_cell(const std::string& path, const ojson& cell) {
  const std::string content = cell.dump(1) + "\n";
  write_file_atomic(cell_hash_path(path), sha256_line(content, path));  // first: see study.h
  write_file_atomic(path, content);
}

ojson read_cell(const std::string& path) {
  const std::string content = read_text_file(path, "cell result"), hpath = cell_hash_path(path);
  std::error_code ec;
  if (!fs::exists(hpath, ec))
    throw InputError(fmt::format("{}: no {} beside it (written before cells were hashed, or the hash was removed): "
                                 "delete it or run with --overwrite to recompute it", path,
                                 fs::path(hpath).filename().string()));
  const std::string h = read_text_file(hpath, "cell hash", 4096);
  const std::string want = sha256_line(content, path);
  if (h.size() != want.size() || h.compare(64, std::string::npos, want, 64, std::string::npos) != 0 ||
      !is_sha256_hex(std::string_view(h).substr(0, 64)))
    throw InputError(fmt::format("{}: not the SHA-256 line of {} ('<64 hex digits>  {}'): delete the cell or run with "
                                 "--overwrite", hpath, path, fs::path(path).filename().string()));
  if (h != want)
    throw InputError(fmt::format("{}: its SHA-256 differs from {} (its values were edited after it was computed, or "
                                 "its rewrite was interrupted): delete it or run with --overwrite to recompute it",
                                 path, fs::path(hpath).filename().string()));
  ojson r;
  try {
    r = parse_bounded_json(content, nullptr);
  } catch (const std::exception& e) {  // a parse error, or parse_bounded_json's depth
    throw InputError(fmt::format("{}: malformed cell result ({}): delete it or run with --overwrite", path, e.what()));
  }
  if (!r.is_object() || !r.contains("key") || !r["key"].is_object())
    throw InputError(fmt::format("{}: not a cell result (no key object): delete it or run with --overwrite", path));
  return r;
}

void write_result_set(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files,
                      ojson manifest) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) throw InputError(fmt::format("cannot create directory {}", dir));
  // Every path the set replaces must be a regular file or missing, checked before the old set is
  // touched (a FIFO named manifest.json was removed: the old set stays valid on a refusal).
  check_output_path((fs::path(dir) / "manifest.json").string(), "result set file");
  for (auto& [name, content] : files) check_output_path((fs::path(dir) / name).string(), "result set file");
  // First invalidate the old set: from here until the new manifest exists, readers refuse it.
  fs::remove(fs::path(dir) / "manifest.json", ec);
  if (ec) throw InputError(fmt::format("{}/manifest.json: cannot remove the old manifest: {}", dir, ec.message()));
  ojson hashes = ojson::object();
  for (auto& [name, content] : files) {
    write_file_atomic((fs::path(dir) / name).string(), content);
    hashes[name] = sha256_hex(content);
  }
  manifest["files"] = hashes;
  write_file_atomic((fs::path(dir) / "manifest.json").string(), manifest.dump(1) + "\n");
}

void write_manifest(const std::string& dir, const std::vector<std::string>& files, ojson manifest) {
  ojson hashes = ojson::object();
  for (const std::string& name : files) hashes[name] = sha256_file((fs::path(dir) / name).string());
  manifest["files"] = hashes;
  write_file_atomic((fs::path(dir) / "manifest.json").string(), manifest.dump(1) + "\n");
}

namespace {

// Rule 1: the manifest's JSON, refusing what two readers could read two ways.
ojson parse_manifest(const std::string& text, const std::string& mpath) {
  auto bad = [&](const std::string& why) { return InputError(fmt::format("{}: malformed manifest ({})", mpath, why)); };
  if (text.starts_with("\xEF\xBB\xBF")) throw bad("a byte-order mark before the JSON");
  std::string twice;
  ojson m;
  try {
    m = parse_bounded_json(text, &twice);
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  if (!twice.empty()) throw bad(fmt::format("the key \"{}\" twice in one object", escape_control(twice)));
  return m;
}

// Rule 3: a relative path of plain components.
bool plain_relative_path(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (const char c : name)
    if (c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  for (size_t a = 0;;) {
    const size_t b = std::min(name.find('/', a), name.size());
    const std::string part = name.substr(a, b - a);
    if (part.empty() || part == "." || part == "..") return false;
    if (b == name.size()) return true;
    a = b + 1;
  }
}

bool sha256_string(const ojson& v) { return v.is_string() && is_sha256_hex(v.get_ref<const std::string&>()); }

}  // namespace

ResultSet read_result_set(const std::string& dir, const std::vector<std::string>& reads) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(fmt::format("{}: not a directory (expected a result set: its results and manifest.json)", dir));
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  const fs::file_status ms = fs::symlink_status(mpath, ec);
  if (!fs::exists(ms))
    throw InputError(fmt::format("{}: no manifest.json (an interrupted or partial result set)", dir));
  if (!fs::is_regular_file(ms))
    throw InputError(fmt::format("{}: not a regular file ({}): a result set's manifest is one", mpath,
                                 fs::is_symlink(ms) ? "a symbolic link" : "a directory or special file"));
  ResultSet set;
  set.manifest = parse_manifest(read_text_file(mpath, "manifest"), mpath);
  const ojson& m = set.manifest;
  if (!m.is_object()) throw InputError(fmt::format("{}: not a JSON object", mpath));
  if (!m.contains("files") || !m["files"].is_object() || m["files"].empty())
    throw InputError(fmt::format("{}: lists no files (\"files\": {{name: sha256}}): written before result sets "
                                 "carried them, or changed; write the set again", mpath));
  const ojson& files = m["files"];
  for (auto it = files.begin(); it != files.end(); ++it) {
    if (!plain_relative_path(it.key()))
      throw InputError(fmt::format("{}: lists '{}', which is not a path inside the result set", mpath,
                                   escape_control(it.key())));
    if (!sha256_string(it.value()))
      throw InputError(fmt::format("{}: the SHA-256 of '{}' is not 64 lower-case hex digits", mpath, it.key()));
  }
  for (const std::string& r : reads)
    if (!files.contains(r))
      throw InputError(fmt::format("{}: {} is not part of this result set (the manifest does not list it)", mpath, r));
  for (auto it = files.begin(); it != files.end(); ++it) {
    // every component from dir down, without following a link
    fs::path p = dir;
    const std::string& name = it.key();
    for (size_t a = 0; a <= name.size();) {
      const size_t b = std::min(name.find('/', a), name.size());
      p /= name.substr(a, b - a);
      const fs::file_status st = fs::symlink_status(p, ec);
      const bool last = b == name.size();
      if (fs::is_symlink(st))
        throw InputError(fmt::format("{}: a symbolic link, not a file of the result set ({} lists {})", p.string(),
                                     mpath, name));
      if (!fs::exists(st))
        throw InputError(fmt::format("{}: listed in {} but missing (an interrupted or mixed result set)", p.string(),
                                     mpath));
      if (last ? !fs::is_regular_file(st) : !fs::is_directory(st))
        throw InputError(fmt::format("{}: not a {} ({} lists {})", p.string(), last ? "regular file" : "directory",
                                     mpath, name));
      a = b + 1;
    }
    const bool read = std::find(reads.begin(), reads.end(), name) != reads.end();
    std::string content;
    if (read) content = read_text_file(p.string(), "result file");
    const std::string got = read ? sha256_hex(content) : sha256_file(p.string());
    const std::string& want = it.value().get_ref<const std::string&>();
    if (got != want)
      throw InputError(fmt::format("{}: SHA-256 {}… differs from the manifest's {}…: changed after the set was written "
                                   "(an interrupted or mixed result set)", p.string(), got.substr(0, 12),
                                   want.substr(0, 12)));
    if (read) set.files[name] = std::move(content);
  }
  return set;
}

ojson verify_result_set(const std::string& dir) { return read_result_set(dir, {}).manifest; }

}  // namespace mantis

namespace mantis {

std::string cell_path(const std::string& out, size_t i) { return fmt::format("{}/cells/{}.json", out, i); }

void parse_shard(const std::string& text, CellChoice& c) {
  const auto slash = text.find('/');
  long long k = -1, n = 0;
  size_t used_k = 0, used_n = 0;
  try {
    if (slash != std::string::npos) {
      k = std::stoll(text.substr(0, slash), &used_k);
      n = std::stoll(text.substr(slash + 1), &used_n);
    }
  } catch (const std::exception&) {
    k = -1;
  }
  if (slash == std::string::npos || used_k != slash || used_n != text.size() - slash - 1 || n < 1 || n > (1 << 20) ||
      k < 0 || k >= n)
    throw InputError(fmt::format("--shard '{}': expected k/N with 0 <= k < N (e.g. 0/4: cells 0, 4, 8, …)",
                                 escape_control(text)));
  c.shard = int(k);
  c.shards = int(n);
}

bool touches(const CellChoice& c, size_t i) {
  if (c.cell >= 0) return size_t(c.cell) == i;
  return c.shards == 0 || int(i % size_t(c.shards)) == c.shard;
}

void check_cell_choice(size_t cells, const CellChoice& o) {
  if (o.merge_only && o.cell >= 0) throw InputError("--merge and --cell cannot be combined: run cells, then merge");
  if (o.merge_only && o.shards > 0) throw InputError("--merge and --shard cannot be combined: run shards, then merge");
  if (o.cell >= 0 && o.shards > 0) throw InputError("--cell and --shard cannot be combined");
  if (o.cell >= 0 && size_t(o.cell) >= cells)
    throw InputError(fmt::format("--cell {}: the sweep has cells 0..{} (see --cells)", o.cell, cells - 1));
}

std::map<size_t, ojson> touched_data_keys(const CellChoice& c, const std::vector<size_t>& model_of_cell,
                                          const std::vector<std::string>& models) {
  std::map<size_t, ojson> keys;
  for (size_t i = 0; i < model_of_cell.size(); ++i)
    if (touches(c, i) && !keys.count(model_of_cell[i])) keys[model_of_cell[i]] = training_data_key(models[model_of_cell[i]]);
  return keys;
}

std::string study_out(const std::string& given, const std::string& configured, const std::string& config_path) {
  if (!given.empty()) return given;
  if (configured.empty())
    throw InputError(fmt::format("{}: no output directory: set out = \"…\" or pass --out", config_path));
  return configured;
}

StudyOptions study_options(const CellChoice& c, size_t cells, const std::string& out, ProgressMode progress,
                           std::FILE* log) {
  StudyOptions so;
  static_cast<CellChoice&>(so) = c;
  so.out = out, so.progress = progress, so.log = log;
  check_cell_choice(cells, so);
  return so;
}

StudyRun run_study(const StudyPlan& plan, const StudyOptions& o) {
  const Stopwatch total;
  check_cell_choice(plan.cells, o);
  if (o.persistent) {
    std::error_code ec;
    fs::create_directories(o.out + "/cells", ec);
    if (ec) throw InputError(fmt::format("cannot create {}/cells: {}", o.out, ec.message()));
  }
  auto file = [&](size_t i) { return cell_path(o.out, i); };
  auto stale = [&](size_t i, const std::string& d) {
    return InputError(fmt::format("{}: computed under another configuration ({}): use --overwrite to recompute, or "
                                  "another output directory", file(i), d));
  };
  // A stored cell is reused only under the same key; a different one is an error (or, with
  // overwrite, recomputed). Checked for every cell before anything runs.
  auto up_to_date = [&](size_t i) {
    if (!o.persistent || !fs::exists(file(i))) return false;
    ojson r;
    try {
      r = read_cell(file(i));
    } catch (const InputError& e) {
      if (!o.overwrite) throw;
      // an unreadable or edited cell is recomputed only when asked, and never without saying so
      fmt::print(o.log ? o.log : stderr, "recomputing (--overwrite): {}\n", e.what());
      return false;
    }
    const std::string d = first_difference(r["key"], plan.key(i));
    if (d.empty()) return true;
    if (o.overwrite) return false;
    throw stale(i, d);
  };
  StudyRun run;
  std::vector<size_t> pending;
  if (o.cell >= 0) {
    if (!up_to_date(size_t(o.cell))) pending.push_back(size_t(o.cell));
  } else if (!o.merge_only) {
    for (size_t i = 0; i < plan.cells; ++i)
      if (touches(o, i) && !up_to_date(i)) pending.push_back(i);
  }

  std::vector<std::optional<ojson>> memory(o.persistent ? 0 : plan.cells);
  {
    Progress progress(plan.label, pending.size() * plan.work_per_cell, pending.empty() ? ProgressMode::quiet : o.progress,
                      plan.unit);
    uint64_t done = 0;
    for (size_t n = 0; n < pending.size(); ++n) {
      const size_t ci = pending[n];
      const std::string note = fmt::format("cell {}/{} ({})", n + 1, pending.size(), plan.name(ci));
      progress.update(done, note);
      ojson r = plan.compute(ci, [&] { progress.update(++done, note); });
      if (o.persistent) {
        ojson cell;
        cell["key"] = plan.key(ci);
        for (auto it = r.begin(); it != r.end(); ++it) cell[it.key()] = it.value();
        write_cell(file(ci), cell);
        r = std::move(cell);
      }
      if (plan.done) {
        progress.interrupt();
        plan.done(ci, r, progress);
      }
      if (!o.persistent) memory[ci] = std::move(r);
      run.computed.push_back(ci);
    }
  }
  if (o.cell >= 0) {
    if (pending.empty() && o.log) fmt::print(o.log, "cell {} is up to date in {}\n", o.cell, file(size_t(o.cell)));
    run.seconds = total.seconds();
    return run;  // one cell of a sharded study: merge later
  }
  if (o.shards > 0) {
    if (o.log)
      fmt::print(o.log, "shard {}/{}: {} cell(s) computed, the rest of the shard up to date in {}/cells\n", o.shard,
                 o.shards, pending.size(), o.out);
    run.seconds = total.seconds();
    return run;  // one shard: merge later
  }

  // merge: every cell present is read back and its key checked before anything is written
  run.merge = true;
  run.cells.resize(plan.cells);
  for (size_t i = 0; i < plan.cells; ++i) {
    if (!o.persistent) {
      run.cells[i] = std::move(memory[i]);
      continue;
    }
    if (!fs::exists(file(i))) {
      run.missing.push_back(i);
      continue;
    }
    ojson r = read_cell(file(i));
    if (const std::string d = first_difference(r["key"], plan.key(i)); !d.empty())
      throw InputError(fmt::format("{}: computed under another configuration ({}): rerun the sweep with --overwrite, "
                                   "or merge into another output directory", file(i), d));
    run.cells[i] = std::move(r);
  }
  if (!run.missing.empty() && !o.allow_partial) {
    std::string list;
    for (size_t k = 0; k < std::min<size_t>(run.missing.size(), 8); ++k)
      list += fmt::format("{}{}", k ? ", " : "", run.missing[k]);
    throw InputError(fmt::format("{} of {} cells are missing ({}{}): run them (the sweep resumes, or --cell i), or "
                                 "merge with --allow-partial", run.missing.size(), plan.cells, list,
                                 run.missing.size() > 8 ? ", …" : ""));
  }
  run.seconds = total.seconds();
  return run;
}

}  // namespace mantis
