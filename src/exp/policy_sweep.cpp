#include "exp/policy_sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/file.h"
#include "core/scheme.h"
#include "core/toml.h"
#include "exp/eval.h"  // kEvalMaxSeqs, kEvalMaxCtx
#include "exp/bootstrap.h"
#include "exp/manifest.h"
#include "exp/study_windows.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/windows.h"
#include "nn/metrics.h"
#include "nn/policy.h"

namespace mantis {

namespace {

constexpr int kBootstrapResamples = 2000;
constexpr uint64_t kBootstrapSeed = 0;
// Bumped whenever a change of mantis alters what a cell computes from the same key.
constexpr int kPolicySweepSemantics = 1;

struct Cell {
  bool base = true;  // the template itself
  Site site = Site::attn_qk;
  std::string format, scheme;
  Rounding mode = Rounding::rne;
  std::optional<Accumulation> acc;
  std::string name() const {
    if (base) return "template";
    std::string n = fmt::format("{} {} {}", to_string(site), format, to_string(mode));
    if (acc) n += fmt::format(" {}", to_string(*acc));
    if (!scheme.empty()) n += " operands " + scheme;
    return n;
  }
};

bool sets(const PolicySweepConfig& c, const char* field) {
  return std::find(c.set.begin(), c.set.end(), field) != c.set.end();
}

std::vector<Cell> cells_of(const PolicySweepConfig& c) {
  std::vector<Cell> v{Cell{}};
  for (const std::string& sn : c.sites) {
    const Site site = *site_from_string(sn);
    const bool gemm = is_gemm(site);
    std::vector<std::optional<Accumulation>> accs{std::nullopt};
    if (gemm && sets(c, "accumulator")) {
      accs.clear();
      for (const auto& a : c.accumulations) accs.push_back(accumulation_from_string(a));
    }
    const std::vector<std::string> schemes = gemm && !c.schemes.empty() ? c.schemes : std::vector<std::string>{""};
    for (const std::string& f : c.formats)
      for (const std::string& r : c.roundings)
        for (const auto& a : accs)
          for (const std::string& s : schemes) {
            Cell cell;
            cell.base = false, cell.site = site, cell.format = f, cell.mode = rounding_from_string(r), cell.acc = a;
            cell.scheme = s;
            v.push_back(cell);
          }
  }
  return v;
}

// The template with the cell's site set in every layer (the template's per-layer entries of that
// site give way), validated.
Policy policy_of(const PolicySweepConfig& c, const Policy& base, const Cell& cell) {
  if (cell.base) return base;
  Policy p = base;
  std::erase_if(p.layer, [&](const auto& kv) { return kv.first.second == cell.site; });
  SitePolicy& e = p.all[size_t(cell.site)];
  const Format f = format_lookup(cell.format);
  e.rounding = cell.mode;
  e.seed = c.seed;
  if (cell.acc) e.accumulation = cell.acc, e.accumulator = f;
  if (sets(c, "output")) e.output = f;
  if (sets(c, "input")) e.input = f;  // never with a scheme (read_policy_sweep)
  if (!cell.scheme.empty()) {
    OperandQuant q;
    q.scheme = scheme_lookup(cell.scheme);
    e.input_a = e.input_b = q;
  }
  validate(e, cell.site);
  return p;
}

// What a format or scheme computes, its name aside: an axis lists each once (an alias, a name in
// capitals or a file of the same definition is the same format).
std::string definition(const Format& f) {
  return fmt::format("mu={} emin={} emax={} subnormals={} overflow={} specials={} signed={} zero={} negative_zero={} "
                     "twos_complement={}", f.mu, f.emin, f.emax, f.subnormals, to_string(f.overflow),
                     to_string(f.specials), f.is_signed, f.has_zero, f.negative_zero, f.twos_complement);
}
std::string definition(const Scheme& s) {
  return fmt::format("element[{}] block={}x{} rule={} scale[{}] two_level={} division={}", definition(s.element),
                     s.block_rows, s.block_cols, to_string(s.rule), definition(s.scale), s.two_level, int(s.division));
}

// A scheme or format named by a .toml path is keyed by its content, not its path.
ojson named_json(const std::string& name) {
  ojson j = {{"name", name}};
  if (name.size() > 5 && name.ends_with(".toml") && std::filesystem::exists(name))
    j["sha256"] = sha256_hex(read_text_file(name, "definition"));
  return j;
}

ojson cell_key(const PolicySweepConfig& c, const Policy& base, const Cell& cell, const ojson& model, const ojson& data) {
  ojson k;
  k["study"] = "mantis policy sweep";
  k["semantics"] = kPolicySweepSemantics;
  k["model"] = model;
  k["data"] = data;
  k["template"] = c.templ;
  if (!cell.base) {
    k["cell"] = {{"site", to_string(cell.site)},
                 {"format", format_json(format_lookup(cell.format))},
                 {"set", c.set},
                 {"rounding", to_string(cell.mode)},
                 {"accumulation", cell.acc ? ojson(to_string(*cell.acc)) : ojson(nullptr)},
                 {"scheme", cell.scheme.empty() ? ojson(nullptr) : named_json(cell.scheme)},
                 {"seed", c.seed}};
  }
  std::string d = describe(policy_of(c, base, cell));
  while (!d.empty() && d.back() == '\n') d.pop_back();
  k["policy"] = d;
  return k;
}

std::string csv_num(double x) { return std::isnan(x) ? "" : fmt::format("{:.9g}", x); }

}  // namespace

bool is_policy_sweep(const std::string& path) {
  const toml::table t = parse_toml(read_text_file(path, "sweep configuration"), path);
  return t.contains("sites");
}

PolicySweepConfig read_policy_sweep(const std::string& path) {
  PolicySweepConfig c;
  c.path = path;
  c.text = read_text_file(path, "sweep configuration");
  const toml::table t = parse_toml(c.text, path);
  auto line = [&](const toml::node& n) { return toml_where(path, n); };
  check_known_keys(t, path, {"out", "model", "data", "tokenizer", "seqs", "ctx", "template", "sites", "formats", "mu",
                             "set", "roundings", "accumulations", "schemes", "seed"});
  auto str = [&](const char* k, std::string& dst) {
    if (const toml::node* n = t.get(k)) {
      if (!n->is_string()) throw InputError(fmt::format("{}: '{}' must be a string", line(*n), k));
      dst = n->as_string()->get();
    }
  };
  auto integer = [&](const char* k, auto& dst, int64_t lo, int64_t hi) {
    if (const toml::node* n = t.get(k)) {
      if (!n->is_integer() || n->as_integer()->get() < lo || n->as_integer()->get() > hi)
        throw InputError(fmt::format("{}: '{}' must be an integer in {}..{}", line(*n), k, lo, hi));
      dst = decltype(dst + 0)(n->as_integer()->get());
    }
  };
  // an array of strings, each checked and resolved by `resolve` (which throws its own InputError),
  // no value twice once resolved (`what` a value is, for that message); the resolved forms
  auto strings = [&](const char* k, std::vector<std::string>& dst, const char* what, auto resolve) {
    std::vector<std::string> resolved;
    const toml::node* n = t.get(k);
    if (!n) return resolved;
    if (!n->is_array()) throw InputError(fmt::format("{}: '{}' must be an array of strings", line(*n), k));
    dst.clear();
    for (auto& e : *n->as_array()) {
      if (!e.is_string()) throw InputError(fmt::format("{}: '{}' must be an array of strings", line(e), k));
      dst.push_back(e.as_string()->get());
      try {
        resolved.push_back(resolve(dst.back()));
      } catch (const InputError& err) {
        throw InputError(fmt::format("{}: '{}': {}", line(e), k, err.what()));
      }
    }
    refuse_repeats(line(*n), k, what, dst, resolved);
    return resolved;
  };
  str("out", c.out), str("model", c.model), str("data", c.data), str("tokenizer", c.tokenizer), str("template", c.templ);
  integer("seqs", c.seqs, 1, kEvalMaxSeqs), integer("ctx", c.ctx, 0, kEvalMaxCtx), integer("seed", c.seed, 0, INT64_MAX);
  strings("sites", c.sites, "site", [](const std::string& s) {
    if (!site_from_string(s)) throw InputError(fmt::format("unknown site \"{}\" (sites: {})", s, site_names()));
    return s;
  });
  std::vector<std::string> formats =
      strings("formats", c.formats, "format", [](const std::string& s) { return definition(format_lookup(s)); });
  if (const toml::node* n = t.get("mu")) {
    if (!n->is_array()) throw InputError(fmt::format("{}: 'mu' must be an array of integers", line(*n)));
    for (auto& e : *n->as_array()) {
      if (!e.is_integer() || e.as_integer()->get() < 1 || e.as_integer()->get() > 23)
        throw InputError(fmt::format("{}: 'mu' must hold integers in 1..23", line(e)));
      c.formats.push_back(fmt::format("ps{}", e.as_integer()->get()));
      formats.push_back(definition(format_lookup(c.formats.back())));
    }
    refuse_repeats(line(*n), "formats / mu", "format", c.formats, formats);
  }
  strings("set", c.set, "field", [](const std::string& s) {
    if (s != "accumulator" && s != "output" && s != "input")
      throw InputError(fmt::format("\"{}\" is not accumulator, output or input", s));
    return s;
  });
  strings("roundings", c.roundings, "rounding mode",
          [](const std::string& s) { return std::string(to_string(rounding_from_string(s))); });
  strings("accumulations", c.accumulations, "accumulation",
          [](const std::string& s) { return std::string(to_string(accumulation_from_string(s))); });
  strings("schemes", c.schemes, "scheme", [](const std::string& s) { return definition(scheme_lookup(s)); });
  if (c.model.empty()) throw InputError(fmt::format("{}: 'model' (a checkpoint path) is required", path));
  if (c.sites.empty()) throw InputError(fmt::format("{}: 'sites' lists no site", path));
  if (c.formats.empty()) throw InputError(fmt::format("{}: give the cells' formats: 'formats' and / or 'mu'", path));
  if (c.set.empty()) throw InputError(fmt::format("{}: 'set' is empty", path));
  if (c.roundings.empty() || c.accumulations.empty())
    throw InputError(fmt::format("{}: 'roundings' and 'accumulations' must not be empty", path));
  if (sets(c, "input") && !c.schemes.empty())
    throw InputError(fmt::format("{}: set = \"input\" and 'schemes' both round the GEMM operands: choose one", path));
  for (const std::string& s : c.sites)
    if (!is_gemm(*site_from_string(s)) && !sets(c, "output") && !sets(c, "input"))
      throw InputError(fmt::format("{}: site {} is a nonlinearity: 'set' needs output or input for it", path, s));
  (void)policy_from_toml(c.templ, path + ": template");
  return c;
}

std::vector<std::string> policy_sweep_cells(const PolicySweepConfig& c) {
  std::vector<std::string> names;
  for (const Cell& cell : cells_of(c)) names.push_back(cell.name());
  return names;
}

namespace {
// Everything a run checks before its first cell, loaded; nothing written.
struct Prepared {
  PolicySweepConfig c;
  Policy base;
  std::vector<Cell> cells;
  std::string out;
  StudyOptions so;
  StudyWindows ws;
  std::vector<Policy> policies;  // per cell
};
Prepared prepare(const PolicySweepOptions& o) {
  Prepared p;
  p.c = read_policy_sweep(o.config);
  p.base = policy_from_toml(p.c.templ, o.config + ": template");
  p.cells = cells_of(p.c);
  p.out = study_out(o.out, p.c.out, o.config);
  p.so = study_options(o, p.cells.size(), p.out, o.progress, o.log);
  p.ws = open_study_windows(p.c.model, p.c.ctx, p.c.tokenizer, p.c.data, p.c.seqs, "tokenizer = \"…\" in " + o.config,
                            o.forward);
  for (const Cell& cell : p.cells) {  // every entry compiled against the model, before any thread
    p.policies.push_back(policy_of(p.c, p.base, cell));
    (void)PolicyPlan(p.policies.back(), p.ws.model.cfg);
  }
  return p;
}
}  // namespace

void validate_policy_sweep(const PolicySweepOptions& o) { (void)prepare(o); }

PolicySweepResult run_policy_sweep(const PolicySweepOptions& o) {
  Prepared prepared = prepare(o);
  const PolicySweepConfig& c = prepared.c;
  const Policy& base = prepared.base;
  const std::vector<Cell>& cells = prepared.cells;
  const StudyOptions& so = prepared.so;
  StudyWindows& ws = prepared.ws;
  const std::vector<Policy>& policies = prepared.policies;
  PolicySweepResult res;
  res.out = prepared.out;
  res.cells = cells.size();
  const Model& model = ws.model;
  const int ctx = ws.ctx;
  const TokenData& data = ws.data;
  const std::vector<size_t>& starts = ws.starts;
  const ojson &model_key = ws.model_key, &data_key = ws.data_key;
  auto reference = [&](size_t w) -> const Matrix<float>& { return ws.reference(w); };
  const int layers = model.cfg.layers;

  StudyPlan plan;
  plan.label = "policy sweep";
  plan.cells = cells.size();
  plan.work_per_cell = starts.size();
  plan.unit = "windows";
  plan.name = [&](size_t i) { return cells[i].name(); };
  plan.key = [&](size_t i) {
    ojson k = cell_key(c, base, cells[i], model_key, data_key);
    if (o.device != "cpu") k["device"] = o.device;
    return k;
  };
  plan.compute = [&](size_t ci, const std::function<void()>& tick) {
    MetricsAccumulator acc;
    HealthTable health;
    ojson wkl = ojson::array(), wpos = ojson::array(), wflips = ojson::array();
    const Stopwatch sw;
    for (size_t w = 0; w < starts.size(); ++w) {
      const Window win = window_at(data.tokens, starts[w], ctx);
      ForwardStats st;
      const Matrix<float> test = forward_on(o.forward, model, win.inputs, policies[ci], &st);  // [T,V]
      MetricsAccumulator one;
      one.add(reference(w), test, win.targets);
      acc.add(reference(w), test, win.targets);
      health.add(st, layers);
      wkl.push_back(json_number(one.mean_kl())), wpos.push_back(one.positions()), wflips.push_back(one.flips());
      tick();
    }
    const Cell& cell = cells[ci];
    ojson r;
    r["cell"] = ci;
    r["name"] = cell.name();
    r["site"] = cell.base ? ojson(nullptr) : ojson(to_string(cell.site));
    r["format"] = cell.base ? ojson(nullptr) : ojson(cell.format);
    r["rounding"] = cell.base ? ojson(nullptr) : ojson(to_string(cell.mode));
    r["accumulation"] = cell.acc ? ojson(to_string(*cell.acc)) : ojson(nullptr);
    r["scheme"] = cell.scheme.empty() ? ojson(nullptr) : ojson(cell.scheme);
    r["kl"] = json_number(acc.mean_kl());
    r["flip_rate"] = json_number(acc.flip_rate());
    r["ppl_ref"] = json_number(acc.ppl_ref());
    r["ppl"] = json_number(acc.ppl_test());
    r["max_abs_logit_error"] = json_number(acc.max_abs_error());
    r["positions"] = acc.positions();
    r["nonfinite_positions"] = acc.nonfinite_positions();
    r["seconds"] = sw.seconds();
    r["windows"] = {{"start", starts}, {"kl", wkl}, {"positions", wpos}, {"flips", wflips}};
    r["health"] = health.json();
    if (o.device != "cpu") r["device"] = o.device;
    return r;
  };
  plan.done = [&](size_t ci, const ojson& r, const Progress& progress) {
    if (o.log && !progress.shows_bar() && !progress.quiet())
      fmt::print(o.log, "cell {:>4} {:<40} KL {:.4e}  flips {:.4f}  {:.1f} s\n", ci, cells[ci].name(),
                 json_to_double(r["kl"], "kl"), json_to_double(r["flip_rate"], "flip_rate"), r["seconds"].get<double>());
  };
  const StudyRun run = run_study(plan, so);
  res.computed = run.computed.size();
  res.missing = run.missing;
  if (!run.merge) return res;

  // merge: every stored cell's numbers checked, then one result set with bootstrap intervals
  const Bootstrap boot(starts.size(), kBootstrapResamples, kBootstrapSeed);
  ojson rows = ojson::array();
  std::string csv = "cell,name,site,format,rounding,accumulation,scheme,kl_nats,kl_lo_nats,kl_hi_nats,flip_rate,"
                    "ppl_ref,ppl,max_abs_logit_error,nonfinite_positions,overflow,nan,inf,seconds\n";
  auto s = [](const ojson& x) { return x.is_null() ? std::string() : x.is_string() ? x.get<std::string>() : x.dump(); };
  for (size_t i = 0; i < cells.size(); ++i) {
    if (!run.cells[i]) continue;
    ojson r = *run.cells[i];
    const std::string f = cell_path(res.out, i);
    auto bad = [&](const std::string& what) {
      return InputError(fmt::format("{}: malformed cell result: {} (delete it, or run with --overwrite)", f, what));
    };
    std::vector<double> klsum, pos;
    try {
      const ojson& w = r.at("windows");
      if (w.at("kl").size() != starts.size() || w.at("positions").size() != starts.size())
        throw bad(fmt::format("windows do not hold {} values", starts.size()));
      for (size_t k = 0; k < starts.size(); ++k) {
        const double kl = json_to_double(w["kl"][k], "kl"), n = double(w["positions"][k].get<uint64_t>());
        if (!(kl >= -1e-12)) throw bad(fmt::format("windows.kl[{}] = {} is negative", k, kl));
        klsum.push_back(kl * n), pos.push_back(n);
      }
      if (!(json_to_double(r.at("kl"), "kl") >= -1e-12)) throw bad("KL is negative");
    } catch (const nlohmann::json::exception& e) {
      throw bad(e.what());
    }
    uint64_t overflow = 0, nan = 0, inf = 0;
    const bool counted = !r["health"].is_null();
    for (const ojson& h : counted ? r["health"] : ojson::array())
      overflow += h.value("overflow", uint64_t(0)), nan += h.value("nan", uint64_t(0)), inf += h.value("inf", uint64_t(0));
    const Interval kl = boot.ratio(klsum, pos);
    r.erase("key");
    r["kl_interval"] = {json_number(kl.lo), json_number(kl.hi)};
    if (counted) r["overflow"] = overflow, r["nan"] = nan, r["inf"] = inf;
    else r["overflow"] = r["nan"] = r["inf"] = nullptr;
    csv += fmt::format("{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", i, cells[i].name(), s(r["site"]),
                       s(r["format"]), s(r["rounding"]), s(r["accumulation"]), s(r["scheme"]), s(r["kl"]),
                       csv_num(kl.lo), csv_num(kl.hi), s(r["flip_rate"]), s(r["ppl_ref"]), s(r["ppl"]),
                       s(r["max_abs_logit_error"]), s(r["nonfinite_positions"]), s(r["overflow"]), s(r["nan"]),
                       s(r["inf"]), s(r["seconds"]));
    rows.push_back(r);
  }
  ojson man = manifest_header("mantis policy sweep");
  man["config_file"] = o.config;
  man["config_sha256"] = sha256_hex(c.text);
  man["config"] = c.text;
  man["semantics"] = kPolicySweepSemantics;
  man["model"] = c.model;
  man["model_files"] = model_files_json(c.model);
  man["data"] = ws.manifest_data(c.data);
  man["intervals"] = {{"method", "percentile bootstrap over windows (paired across cells), 95 %"},
                      {"resamples", kBootstrapResamples}, {"seed", kBootstrapSeed}};
  man["cells"] = cells.size();
  man["partial"] = !run.missing.empty();
  man["cells_missing"] = run.missing;
  man["seeds"] = {{"policy", c.seed}, {"bootstrap", kBootstrapSeed}};
  man["timings_s"] = {{"total", run.seconds}};
  write_result_set(res.out, {{"results.csv", csv}, {"results.json", ojson{{"cells", rows}}.dump(1) + "\n"}}, man);
  res.merged = true;
  if (o.log)
    fmt::print(o.log, "merged {} of {} cells into {}/results.csv{}\n", cells.size() - run.missing.size(), cells.size(),
               res.out, run.missing.empty() ? "" : fmt::format(" (PARTIAL: {} missing, marked in the manifest)", run.missing.size()));
  return res;
}

}  // namespace mantis
