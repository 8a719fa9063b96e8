#include "exp/lamp_sweep.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>

#include "core/file.h"
#include "core/toml.h"
#include "exp/bootstrap.h"
#include "exp/eval.h"  // kEvalMaxSeqs, kEvalMaxCtx
#include "exp/manifest.h"
#include "exp/study.h"
#include "exp/study_windows.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/windows.h"
#include "nn/forward.h"
#include "nn/metrics.h"
#include "nn/policy.h"

namespace mantis {

namespace {

constexpr int kBootstrapResamples = 2000;
constexpr uint64_t kBootstrapSeed = 0;

struct Cell {
  std::string kind;  // fp32 | uniform | lamp
  int mu = 23;
  LampRule rule = LampRule::strict;
  double tau = 0;
  bool random = false;
  std::string name() const {
    if (kind == "fp32") return "fp32";
    if (kind == "uniform") return fmt::format("uniform ps{}", mu);
    return fmt::format("ps{} {} tau={:g}{}", mu, to_string(rule), tau, random ? " random" : "");
  }
};

std::vector<Cell> cells_of(const LampSweepConfig& c) {
  std::vector<Cell> v{{"fp32"}};
  for (int mu : c.mu) {
    v.push_back({"uniform", mu});
    for (LampRule rule : {LampRule::strict, LampRule::relaxed})
      for (double tau : rule == LampRule::strict ? c.strict_tau : c.relaxed_tau)
        for (bool random : {false, true})
          if (!random || c.random_control) v.push_back({"lamp", mu, rule, tau, random});
  }
  return v;
}

Policy policy_of(const LampSweepConfig& c, const Cell& cell) {
  if (cell.kind == "fp32") return {};
  Policy p = lamp_policy(cell.mu);
  if (cell.kind == "lamp") {
    LampSpec s;
    s.rule = cell.rule, s.tau = cell.tau, s.random_control = cell.random, s.length_scaled = c.length_scaling;
    s.seed = c.seed;
    if (c.recompute != "fp32") s.recompute = format_lookup(c.recompute);
    p.lamp = s;
  }
  return p;
}

// Bumped whenever a change of mantis alters what a cell computes from the same key (2: the rules
// select with '>' as the paper; per-window and per-layer data; site health; 3: binary32 exp and erf
// are crmath's correctly rounded functions, no longer the C library's).
constexpr int kLampSemantics = 3;

// Everything a cell's numbers depend on (study.h): the model's files, the data and its windows,
// the cell's rule settings and the policy they make, the recompute format's definition, seeds.
ojson cell_key(const LampSweepConfig& c, const Cell& cell, const ojson& model, const ojson& data) {
  const Policy pol = policy_of(c, cell);
  ojson k;
  k["study"] = "mantis lamp sweep";
  k["semantics"] = kLampSemantics;
  k["model"] = model;
  k["data"] = data;
  k["cell"] = {{"kind", cell.kind},
               {"mu", cell.kind == "fp32" ? ojson(nullptr) : ojson(cell.mu)},
               {"rule", cell.kind == "lamp" ? ojson(to_string(cell.rule)) : ojson(nullptr)},
               {"tau", cell.kind == "lamp" ? json_number(cell.tau) : ojson(nullptr)},
               {"random_control", cell.random},
               {"length_scaling", cell.kind == "lamp" && c.length_scaling},
               {"recompute", cell.kind == "lamp" ? c.recompute : ""},
               {"seed", cell.kind == "lamp" ? c.seed : 0}};
  // the recompute format in full (it may come from a TOML file whose content changes); the
  // score formats are the built-in ps<μ>, fixed by μ
  if (cell.kind == "lamp" && pol.lamp->recompute) k["cell"]["recompute_format"] = format_json(*pol.lamp->recompute);
  std::string d = describe(pol);
  while (!d.empty() && d.back() == '\n') d.pop_back();
  k["policy"] = d;
  return k;
}

// A cell file's checked numbers (merge). Everything is validated before any is used.
struct CellData {
  ojson json;
  std::vector<double> kl_w, pos_w;  // per window: mean KL, positions
  std::vector<uint64_t> rec_l, ent_l;
  uint64_t overflow = 0, nan = 0, inf = 0;
};

CellData check_cell(const std::string& f, ojson r, size_t windows, int layers, bool lamp) {
  auto bad = [&](const std::string& what) {
    return InputError(fmt::format("{}: malformed cell result: {} (delete it, or run with --overwrite)", f, what));
  };
  auto number = [&](const ojson& o, const char* k) {
    if (!o.contains(k)) throw bad(fmt::format("no '{}'", k));
    try {
      return json_to_double(o.at(k), k);
    } catch (const InputError&) {
      throw bad(fmt::format("'{}' is not a number", k));
    }
  };
  auto count = [&](const ojson& v, const std::string& what) {
    if (!v.is_number_unsigned()) throw bad(fmt::format("{} is not a count", what));
    return v.get<uint64_t>();
  };
  CellData d;
  const double kl = number(r, "kl");
  // KL ≥ 0; rounding can make an almost-exact cell's mean a hair negative (metrics.h), no more
  if (!(kl >= -1e-12)) throw bad(fmt::format("KL {} is negative", kl));
  for (const char* k : {"flip_rate", "ppl_ref", "ppl", "max_abs_logit_error", "recompute_rate", "seconds"})
    if (!(number(r, k) >= 0)) throw bad(fmt::format("'{}' is negative or NaN", k));
  if (!r.contains("windows") || !r["windows"].is_object()) throw bad("no 'windows' object");
  const ojson& w = r["windows"];
  for (const char* k : {"kl", "positions"})
    if (!w.contains(k) || !w[k].is_array() || w[k].size() != windows)
      throw bad(fmt::format("windows.{} does not hold {} values", k, windows));
  for (size_t i = 0; i < windows; ++i) {
    double x;
    try {
      x = json_to_double(w["kl"][i], "kl");
    } catch (const InputError&) {
      throw bad(fmt::format("windows.kl[{}] is not a number", i));
    }
    if (!(x >= -1e-12)) throw bad(fmt::format("windows.kl[{}] = {} is negative", i, x));
    d.kl_w.push_back(x);
    d.pos_w.push_back(double(count(w["positions"][i], fmt::format("windows.positions[{}]", i))));
  }
  if (!r.contains("per_layer") || !r["per_layer"].is_object()) throw bad("no 'per_layer' object");
  for (auto [k, dst] : {std::pair{"recomputed", &d.rec_l}, {"causal_scores", &d.ent_l}}) {
    const ojson& a = r["per_layer"].value(k, ojson());
    if (!a.is_array() || a.size() != size_t(layers)) throw bad(fmt::format("per_layer.{} does not hold {} counts", k, layers));
    for (size_t l = 0; l < a.size(); ++l) dst->push_back(count(a[l], fmt::format("per_layer.{}[{}]", k, l)));
  }
  for (size_t l = 0; lamp && l < d.rec_l.size(); ++l)
    if (d.rec_l[l] > d.ent_l[l]) throw bad(fmt::format("layer {} recomputed more scores than it has", l));
  if (!r.contains("health") || !r["health"].is_array()) throw bad("no 'health' array");
  for (const ojson& h : r["health"]) {
    if (!h.is_object()) throw bad("a health entry is not an object");
    d.overflow += count(h.value("overflow", ojson()), "health.overflow");
    d.nan += count(h.value("nan", ojson()), "health.nan");
    d.inf += count(h.value("inf", ojson()), "health.inf");
  }
  d.json = std::move(r);
  return d;
}

std::string csv_num(double x) { return std::isnan(x) ? "" : fmt::format("{:.9g}", x); }

}  // namespace

LampSweepConfig read_lamp_sweep(const std::string& path) {
  LampSweepConfig c;
  c.path = path;
  c.text = read_text_file(path, "sweep configuration");
  const toml::table t = parse_toml(c.text, path);
  auto line = [&](const toml::node& n) { return toml_where(path, n); };
  check_known_keys(t, path, {"out", "model", "data", "tokenizer", "seqs", "ctx", "mu", "strict_tau", "relaxed_tau",
                             "random_control", "length_scaling", "recompute", "seed"});
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
  auto boolean = [&](const char* k, bool& dst) {
    if (const toml::node* n = t.get(k)) {
      if (!n->is_boolean()) throw InputError(fmt::format("{}: '{}' must be true or false", line(*n), k));
      dst = n->as_boolean()->get();
    }
  };
  auto numbers = [&](const char* k, auto& dst) {
    using T = typename std::decay_t<decltype(dst)>::value_type;
    if (const toml::node* n = t.get(k)) {
      if (!n->is_array()) throw InputError(fmt::format("{}: '{}' must be an array of numbers", line(*n), k));
      dst.clear();
      for (auto& e : *n->as_array()) {
        if (e.is_integer()) dst.push_back(T(e.as_integer()->get()));
        else if (e.is_floating_point() && std::is_floating_point_v<T>) dst.push_back(T(e.as_floating_point()->get()));
        else throw InputError(fmt::format("{}: '{}' must be an array of numbers", line(e), k));
      }
    }
  };
  str("out", c.out), str("model", c.model), str("data", c.data), str("tokenizer", c.tokenizer);
  str("recompute", c.recompute);
  integer("seqs", c.seqs, 1, kEvalMaxSeqs), integer("ctx", c.ctx, 0, kEvalMaxCtx), integer("seed", c.seed, 0, INT64_MAX);
  numbers("mu", c.mu), numbers("strict_tau", c.strict_tau), numbers("relaxed_tau", c.relaxed_tau);
  boolean("random_control", c.random_control), boolean("length_scaling", c.length_scaling);
  if (c.model.empty()) throw InputError(fmt::format("{}: 'model' (a checkpoint path) is required", path));
  for (int m : c.mu)
    if (m < 1 || m > 23) throw InputError(fmt::format("{}: μ = {} out of range 1..23", path, m));
  for (double x : c.strict_tau) if (!(x >= 0)) throw InputError(fmt::format("{}: strict τ = {} must be ≥ 0", path, x));
  for (double x : c.relaxed_tau) if (!(x >= 0)) throw InputError(fmt::format("{}: relaxed τ = {} must be ≥ 0", path, x));
  // a value listed twice would make two cells of the same key (0.1 and 1e-1, 0 and -0 are one τ)
  auto once = [&](const char* k, const auto& v) {
    std::vector<std::string> listed;
    for (auto x : v) listed.push_back(fmt::format("{}", x + 0));
    refuse_repeats(path, k, "", listed, listed);
  };
  once("mu", c.mu), once("strict_tau", c.strict_tau), once("relaxed_tau", c.relaxed_tau);
  if (c.recompute != "fp32") {
    const Format f = format_lookup(c.recompute);
    if (!fits_float(f))
      throw InputError(fmt::format("{}: recompute = \"{}\": LAMP recomputes binary32 scores, so the format must fit "
                                   "binary32 (μ ≤ 23 and binary32's exponent range); use \"fp32\" for the FP32 product",
                                   path, c.recompute));
  }
  return c;
}

std::vector<std::string> lamp_sweep_cells(const LampSweepConfig& c) {
  std::vector<std::string> names;
  for (const Cell& cell : cells_of(c)) names.push_back(cell.name());
  return names;
}

namespace {
// Everything a run checks before its first cell, loaded; nothing written.
struct Prepared {
  LampSweepConfig c;
  std::vector<Cell> cells;
  std::string out;
  StudyOptions so;
  StudyWindows ws;
};
Prepared prepare(const LampSweepOptions& o) {
  Prepared p;
  p.c = read_lamp_sweep(o.config);
  p.cells = cells_of(p.c);
  p.out = study_out(o.out, p.c.out, o.config);
  p.so = study_options(o, p.cells.size(), p.out, o.progress, o.log);
  p.ws = open_study_windows(p.c.model, p.c.ctx, p.c.tokenizer, p.c.data, p.c.seqs, "tokenizer = \"…\" in " + o.config,
                            o.forward);
  for (const Cell& cell : p.cells) policy_of(p.c, cell).check(p.ws.model.cfg);  // every setting, before any thread
  return p;
}
}  // namespace

void validate_lamp_sweep(const LampSweepOptions& o) { (void)prepare(o); }

LampSweepResult run_lamp_sweep(const LampSweepOptions& o) {
  Prepared prepared = prepare(o);
  const LampSweepConfig& c = prepared.c;
  const std::vector<Cell>& cells = prepared.cells;
  const StudyOptions& so = prepared.so;
  StudyWindows& ws = prepared.ws;
  LampSweepResult res;
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
  plan.label = "lamp sweep";
  plan.cells = cells.size();
  plan.work_per_cell = starts.size();
  plan.unit = "windows";
  plan.name = [&](size_t i) { return cells[i].name(); };
  // A cell computed on another device is another result (native sites: cuBLAS's summation order):
  // the device is part of the key (absent for the CPU, so the committed keys stay valid).
  plan.key = [&](size_t i) {
    ojson k = cell_key(c, cells[i], model_key, data_key);
    if (o.device != "cpu") k["device"] = o.device;
    return k;
  };
  plan.compute = [&](size_t ci, const std::function<void()>& tick) {
    const Cell& cell = cells[ci];
    const Policy pol = policy_of(c, cell);
    MetricsAccumulator acc;
    HealthTable health;
    std::vector<uint64_t> rec_l(size_t(layers), 0), ent_l(size_t(layers), 0);
    ojson wkl = ojson::array(), wpos = ojson::array(), wflips = ojson::array(), wrec = ojson::array(),
          wnonfinite = ojson::array();
    const Stopwatch sw;
    for (size_t w = 0; w < starts.size(); ++w) {
      const Window win = window_at(data.tokens, starts[w], ctx);
      ForwardStats st;
      const Matrix<float> test = forward_on(o.forward, model, win.inputs, pol, &st);  // [T,V]
      MetricsAccumulator one;
      one.add(reference(w), test, win.targets);
      acc.add(reference(w), test, win.targets);
      uint64_t rec = 0;
      for (size_t l = 0; l < size_t(layers); ++l) rec_l[l] += st.lamp_selected[l], ent_l[l] += st.lamp_entries[l];
      for (uint64_t x : st.lamp_selected) rec += x;
      health.add(st, layers);
      wkl.push_back(json_number(one.mean_kl())), wpos.push_back(one.positions()), wflips.push_back(one.flips());
      wrec.push_back(rec), wnonfinite.push_back(one.nonfinite_positions());
      tick();
    }
    uint64_t selected = 0, entries = 0;
    for (size_t l = 0; l < size_t(layers); ++l) selected += rec_l[l], entries += ent_l[l];
    ojson r;
    r["cell"] = ci;
    r["name"] = cell.name();
    r["kind"] = cell.kind;
    r["mu"] = cell.kind == "fp32" ? ojson(nullptr) : ojson(cell.mu);
    r["rule"] = cell.kind == "lamp" ? ojson(to_string(cell.rule)) : ojson(nullptr);
    r["tau"] = cell.kind == "lamp" ? json_number(cell.tau) : ojson(nullptr);
    r["random_control"] = cell.random;
    r["kl"] = json_number(acc.mean_kl());
    r["flip_rate"] = json_number(acc.flip_rate());
    r["ppl_ref"] = json_number(acc.ppl_ref());
    r["ppl"] = json_number(acc.ppl_test());
    r["max_abs_logit_error"] = json_number(acc.max_abs_error());
    r["recompute_rate"] = cell.kind == "lamp" ? json_number(double(selected) / double(entries)) : ojson(0.0);
    r["recomputed"] = selected;
    r["causal_scores"] = entries;
    r["positions"] = acc.positions();
    r["nonfinite_positions"] = acc.nonfinite_positions();
    r["seconds"] = sw.seconds();
    r["per_layer"] = {{"recomputed", rec_l}, {"causal_scores", ent_l}};
    r["windows"] = {{"start", starts}, {"kl", wkl},        {"positions", wpos},
                    {"flips", wflips}, {"recomputed", wrec}, {"nonfinite_positions", wnonfinite}};
    r["health"] = health.json();
    if (o.device != "cpu") r["device"] = o.device;
    return r;
  };
  plan.done = [&](size_t ci, const ojson& r, const Progress& progress) {
    if (!o.log) return;
    const uint64_t nonfinite = r["nonfinite_positions"].get<uint64_t>();
    if (!progress.shows_bar() && !progress.quiet())
      fmt::print(o.log, "cell {:>4} {:<36} KL {:.4e}  flips {:.4f}  recompute {:.5f}  {:.1f} s\n", ci, cells[ci].name(),
                 json_to_double(r["kl"], "kl"), json_to_double(r["flip_rate"], "flip_rate"),
                 r["recompute_rate"].get<double>(), r["seconds"].get<double>());
    if (nonfinite)
      fmt::print(o.log, "cell {:>4}: non-finite logits at {} of {} positions: KL and perplexity are inf (see its health)\n",
                 ci, nonfinite, r["positions"].get<uint64_t>());
  };
  StudyRun run = run_study(plan, so);
  res.computed = run.computed.size();
  res.missing = run.missing;
  if (!run.merge) return res;

  // merge: every cell present is validated (key and numbers) before anything is written
  std::vector<std::optional<CellData>> got(cells.size());
  for (size_t i = 0; i < cells.size(); ++i)
    if (run.cells[i])
      got[i] = check_cell(cell_path(res.out, i), std::move(*run.cells[i]), starts.size(), layers, cells[i].kind == "lamp");

  // intervals: windows resampled jointly for every cell (bootstrap.h)
  const Bootstrap boot(starts.size(), kBootstrapResamples, kBootstrapSeed);
  std::map<int, size_t> uniform_of;  // μ → its uniform cell
  for (size_t i = 0; i < cells.size(); ++i)
    if (cells[i].kind == "uniform") uniform_of[cells[i].mu] = i;
  auto kl_sums = [](const CellData& d) {  // per window: Σ KL over its positions
    std::vector<double> s(d.kl_w.size());
    for (size_t w = 0; w < s.size(); ++w) s[w] = d.kl_w[w] * d.pos_w[w];
    return s;
  };

  ojson rows = ojson::array();
  std::string csv = "cell,name,kind,mu,rule,tau,random_control,kl_nats,kl_lo_nats,kl_hi_nats,kl_ratio,kl_ratio_lo,"
                    "kl_ratio_hi,flip_rate,ppl_ref,ppl,max_abs_logit_error,recompute_rate,nonfinite_positions,overflow,"
                    "nan,inf,seconds";
  for (int l = 0; l < layers; ++l) csv += fmt::format(",recompute_rate_l{}", l);
  csv += "\n";
  auto s = [](const ojson& x) { return x.is_null() ? std::string() : x.is_string() ? x.get<std::string>() : x.dump(); };
  for (size_t i = 0; i < cells.size(); ++i) {
    if (!got[i]) continue;
    const CellData& d = *got[i];
    ojson r = d.json;
    r.erase("key");
    const Interval kl = boot.ratio(kl_sums(d), d.pos_w);
    r["kl_interval"] = {json_number(kl.lo), json_number(kl.hi)};
    double ratio = std::nan(""), rlo = std::nan(""), rhi = std::nan("");
    if (cells[i].kind != "fp32" && got[uniform_of.at(cells[i].mu)]) {
      const CellData& u = *got[uniform_of.at(cells[i].mu)];
      const auto su = kl_sums(u), sc = kl_sums(d);
      double nu = 0, nc = 0;
      for (size_t w = 0; w < su.size(); ++w) nu += su[w], nc += sc[w];
      ratio = nu / nc;
      const Interval ri = boot.ratio(su, sc);
      rlo = ri.lo, rhi = ri.hi;
      r["kl_ratio"] = json_number(ratio);
      r["kl_ratio_interval"] = {json_number(rlo), json_number(rhi)};
    }
    r["overflow"] = d.overflow, r["nan"] = d.nan, r["inf"] = d.inf;
    csv += fmt::format("{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", i, cells[i].name(),
                       s(r["kind"]), s(r["mu"]), s(r["rule"]), s(r["tau"]), r["random_control"].get<bool>() ? 1 : 0,
                       s(r["kl"]), csv_num(kl.lo), csv_num(kl.hi), csv_num(ratio), csv_num(rlo), csv_num(rhi),
                       s(r["flip_rate"]), s(r["ppl_ref"]), s(r["ppl"]), s(r["max_abs_logit_error"]),
                       s(r["recompute_rate"]), s(r["nonfinite_positions"]), s(r["overflow"]), s(r["nan"]), s(r["inf"]),
                       s(r["seconds"]));
    for (int l = 0; l < layers; ++l)
      csv += "," + (cells[i].kind == "lamp" ? csv_num(double(d.rec_l[size_t(l)]) / double(d.ent_l[size_t(l)])) : "0");
    csv += "\n";
    rows.push_back(r);
  }
  ojson man = manifest_header("mantis lamp sweep");
  man["config_file"] = o.config;
  man["config_sha256"] = sha256_hex(c.text);
  man["config"] = c.text;
  man["semantics"] = kLampSemantics;
  man["model"] = c.model;
  man["model_files"] = model_files_json(c.model);
  man["data"] = ws.manifest_data(c.data);
  man["intervals"] = {{"method", "percentile bootstrap over windows (paired across cells), 95 %"},
                      {"resamples", kBootstrapResamples}, {"seed", kBootstrapSeed}};
  man["cells"] = cells.size();
  man["partial"] = !run.missing.empty();
  man["cells_missing"] = run.missing;
  man["seeds"] = {{"lamp_random_control", c.seed}, {"bootstrap", kBootstrapSeed}};
  man["seconds_this_process"] = run.seconds;
  man["timings_s"] = {{"total", run.seconds}};
  write_result_set(res.out, {{"results.csv", csv}, {"results.json", ojson{{"cells", rows}}.dump(1) + "\n"}}, man);
  res.merged = true;
  if (o.log)
    fmt::print(o.log, "merged {} of {} cells into {}/results.csv{}\n", cells.size() - run.missing.size(), cells.size(),
               res.out, run.missing.empty() ? "" : fmt::format(" (PARTIAL: {} missing, marked in the manifest)", run.missing.size()));
  return res;
}

}  // namespace mantis
