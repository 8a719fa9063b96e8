// mantis lamp sweep CONFIG.toml — LAMP's study: KL / flips / perplexity / recompute rate over
// μ × rule × τ × {rule, random control}, beside uniform ps<μ> and FP32, on the same windows.
//
// Cells (index order): 0 = FP32 (native); then for each μ: uniform ps<μ> (LAMP's site, nothing
// recomputed), then strict τ × {rule, random}, then relaxed τ × {rule, random}. Each cell is
// independent: its result is DIR/cells/<index>.json (atomic), so a sweep resumes where it stopped,
// `--cell i` runs one cell (for separate processes or machines), and the merge (after a full run,
// or `--merge`) writes DIR/results.csv, DIR/results.json and DIR/manifest.json.
// Per cell, over every position of every window and every layer: mean KL(p_FP32 ‖ p_cell), top-1
// flip rate, perplexity of both, max |logit error|, recompute rate = recomputed scores / causal
// scores (Σ over layers and windows) — equal to the recomputed share of the score GEMM's
// FLOPs (each recomputed score is one HS-long dot product).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <toml++/toml.h>

#include "checkpoint.h"
#include "common.h"
#include "dataset.h"
#include "forward.h"
#include "mantis_git.h"
#include "metrics.h"
#include "policy.h"
#include "round_array.h"
#include "tokenizer.h"

namespace mantis::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct SweepConfig {
  std::string out, model, data = "test", tokenizer, recompute = "fp32";
  int seqs = 100, ctx = 0;
  std::vector<int> mu{4, 7, 10, 13, 16, 19, 22};
  std::vector<double> strict_tau{1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1, 2, 5, 10, 20, 50};
  std::vector<double> relaxed_tau{0.9, 0.3, 0.09, 0.03, 9e-3, 3e-3, 9e-4, 3e-4, 9e-5};
  bool random_control = true, length_scaling = false;
  uint64_t seed = 0;
  std::string text, path;
};

SweepConfig parse_sweep(const std::string& path) {
  SweepConfig c;
  c.path = path;
  c.text = read_file(path);
  toml::table t;
  try {
    t = toml::parse(c.text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}: malformed TOML: {}", path, e.source().begin.line, e.description()));
  }
  auto line = [&](const toml::node& n) { return fmt::format("{}:{}", path, n.source().begin.line); };
  static const char* keys[] = {"out", "model", "data", "tokenizer", "seqs", "ctx", "mu", "strict_tau", "relaxed_tau",
                               "random_control", "length_scaling", "recompute", "seed"};
  for (auto&& [k, v] : t)
    if (std::none_of(std::begin(keys), std::end(keys), [&](const char* x) { return k.str() == x; }))
      throw InputError(fmt::format("{}: unknown key '{}' (known: out, model, data, tokenizer, seqs, ctx, mu, strict_tau, "
                                   "relaxed_tau, random_control, length_scaling, recompute, seed)", line(v), k.str()));
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
    if (const toml::node* n = t.get(k)) {
      if (!n->is_array()) throw InputError(fmt::format("{}: '{}' must be an array of numbers", line(*n), k));
      dst.clear();
      for (auto& e : *n->as_array()) {
        if (e.is_integer()) dst.push_back(typename std::decay_t<decltype(dst)>::value_type(e.as_integer()->get()));
        else if (e.is_floating_point() && std::is_floating_point_v<typename std::decay_t<decltype(dst)>::value_type>)
          dst.push_back(typename std::decay_t<decltype(dst)>::value_type(e.as_floating_point()->get()));
        else throw InputError(fmt::format("{}: '{}' must be an array of numbers", line(e), k));
      }
    }
  };
  str("out", c.out), str("model", c.model), str("data", c.data), str("tokenizer", c.tokenizer);
  str("recompute", c.recompute);
  integer("seqs", c.seqs, 1, 1000000), integer("ctx", c.ctx, 0, 1 << 24), integer("seed", c.seed, 0, INT64_MAX);
  numbers("mu", c.mu), numbers("strict_tau", c.strict_tau), numbers("relaxed_tau", c.relaxed_tau);
  boolean("random_control", c.random_control), boolean("length_scaling", c.length_scaling);
  if (c.model.empty()) throw InputError(fmt::format("{}: 'model' (a checkpoint path) is required", path));
  for (int m : c.mu)
    if (m < 1 || m > 23) throw InputError(fmt::format("{}: μ = {} out of range 1..23", path, m));
  for (double x : c.strict_tau) if (!(x >= 0)) throw InputError(fmt::format("{}: strict τ = {} must be ≥ 0", path, x));
  for (double x : c.relaxed_tau) if (!(x >= 0)) throw InputError(fmt::format("{}: relaxed τ = {} must be ≥ 0", path, x));
  return c;
}

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

std::vector<Cell> cells_of(const SweepConfig& c) {
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

Policy policy_of(const SweepConfig& c, const Cell& cell) {
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

double finite_or_nan(double x) { return std::isfinite(x) ? x : std::nan(""); }
ojson num(double x) { return std::isfinite(x) ? ojson(x) : ojson(nullptr); }

}  // namespace

int run_lamp(const LampArgs& a) {
  apply_threads(a.threads);
  const SweepConfig c = parse_sweep(a.config);
  const auto cells = cells_of(c);
  if (a.list) {
    for (size_t i = 0; i < cells.size(); ++i) fmt::print("{}\t{}\n", i, cells[i].name());
    return 0;
  }
  const std::string out = a.out.empty() ? c.out : a.out;
  if (out.empty()) throw InputError(fmt::format("{}: no output directory: set out = \"…\" or pass --out", a.config));
  if (a.cell >= 0 && size_t(a.cell) >= cells.size())
    throw InputError(fmt::format("--cell {}: the sweep has cells 0..{} (see --cells)", a.cell, cells.size() - 1));
  std::error_code ec;
  fs::create_directories(out + "/cells", ec);
  if (ec) throw InputError(fmt::format("cannot create {}/cells: {}", out, ec.message()));

  const Model model = load_model(c.model);
  const int ctx = c.ctx == 0 ? model.cfg.ctx : c.ctx;
  if (ctx < 1 || ctx > model.cfg.ctx) throw InputError(fmt::format("ctx {} is outside 1..{}", ctx, model.cfg.ctx));
  const auto tok = make_tokenizer(!c.tokenizer.empty() ? c.tokenizer : model.cfg.vocab == 256 ? "bytes" : "gpt2");
  const TokenData data = load_tokens(c.data, *tok, data_root());
  const auto starts = window_starts(data.tokens.size(), size_t(c.seqs), size_t(ctx) + 1);
  auto window = [&](size_t w, std::vector<int32_t>& in, std::vector<int32_t>& tgt) {
    in.resize(size_t(ctx)), tgt.resize(size_t(ctx));
    for (int t = 0; t < ctx; ++t) {
      in[size_t(t)] = int32_t(data.tokens[starts[w] + size_t(t)]);
      tgt[size_t(t)] = int32_t(data.tokens[starts[w] + size_t(t) + 1]);
    }
  };
  std::map<size_t, Matrix<float>> ref_cache;  // window → FP32 logits [T,V]
  auto reference = [&](size_t w) -> const Matrix<float>& {
    auto it = ref_cache.find(w);
    if (it != ref_cache.end()) return it->second;
    std::vector<int32_t> in, tgt;
    window(w, in, tgt);
    return ref_cache.emplace(w, forward<float>(model, in)).first->second;
  };

  std::vector<size_t> pending;
  if (a.cell >= 0) pending.push_back(size_t(a.cell));
  else if (!a.merge)
    for (size_t i = 0; i < cells.size(); ++i)
      if (!fs::exists(fmt::format("{}/cells/{}.json", out, i))) pending.push_back(i);
  const bool bar = !a.quiet && stderr_is_tty();
  const Stopwatch total;
  for (size_t n = 0; n < pending.size(); ++n) {
    const size_t ci = pending[n];
    const Cell& cell = cells[ci];
    const Policy pol = policy_of(c, cell);
    MetricsAccumulator acc;
    uint64_t selected = 0, entries = 0;
    const Stopwatch sw;
    for (size_t w = 0; w < starts.size(); ++w) {
      std::vector<int32_t> in, tgt;
      window(w, in, tgt);
      ForwardStats st;
      const Matrix<float> test = forward<float>(model, in, pol, &st);  // [T,V]
      acc.add(reference(w), test, tgt);
      for (size_t l = 0; l < st.lamp_selected.size(); ++l) selected += st.lamp_selected[l], entries += st.lamp_entries[l];
      if (bar)
        fmt::print(stderr, "\rcell {}/{} ({}): window {}/{}   ", n + 1, pending.size(), cell.name(), w + 1, starts.size());
    }
    ojson r;
    r["cell"] = ci;
    r["name"] = cell.name();
    r["kind"] = cell.kind;
    r["mu"] = cell.kind == "fp32" ? ojson(nullptr) : ojson(cell.mu);
    r["rule"] = cell.kind == "lamp" ? ojson(to_string(cell.rule)) : ojson(nullptr);
    r["tau"] = cell.kind == "lamp" ? num(cell.tau) : ojson(nullptr);
    r["random_control"] = cell.random;
    r["kl"] = num(acc.mean_kl());
    r["flip_rate"] = num(acc.flip_rate());
    r["ppl_ref"] = num(acc.ppl_ref());
    r["ppl"] = num(acc.ppl_test());
    r["max_abs_logit_error"] = num(acc.max_abs_error());
    r["recompute_rate"] = cell.kind == "lamp" ? num(double(selected) / double(entries)) : ojson(0.0);
    r["recomputed"] = selected;
    r["causal_scores"] = entries;
    r["positions"] = acc.positions();
    r["seconds"] = sw.seconds();
    write_file_atomic(fmt::format("{}/cells/{}.json", out, ci), r.dump(1) + "\n");
    if (!bar && !a.quiet)
      fmt::print("cell {:>4} {:<36} KL {:.4e}  flips {:.4f}  recompute {:.5f}  {:.1f} s\n", ci, cell.name(),
                 finite_or_nan(acc.mean_kl()), acc.flip_rate(), r["recompute_rate"].get<double>(), sw.seconds());
  }
  if (bar) fmt::print(stderr, "\n");
  if (a.cell >= 0) return 0;  // one cell of a sharded sweep: merge later

  // merge
  ojson rows = ojson::array();
  std::string csv = "cell,name,kind,mu,rule,tau,random_control,kl,flip_rate,ppl_ref,ppl,max_abs_logit_error,"
                    "recompute_rate,seconds\n";
  size_t missing = 0;
  for (size_t i = 0; i < cells.size(); ++i) {
    const std::string f = fmt::format("{}/cells/{}.json", out, i);
    if (!fs::exists(f)) {
      ++missing;
      continue;
    }
    ojson r;
    try {
      r = ojson::parse(read_file(f));
    } catch (const ojson::exception& e) {
      throw InputError(fmt::format("{}: malformed cell result: {}", f, e.what()));
    }
    if (r.value("name", "") != cells[i].name())
      throw InputError(fmt::format("{}: holds cell '{}', but cell {} of this configuration is '{}' (another sweep's "
                                   "results in the same directory?)", f, r.value("name", ""), i, cells[i].name()));
    auto s = [](const ojson& x) { return x.is_null() ? std::string() : x.is_string() ? x.get<std::string>() : x.dump(); };
    csv += fmt::format("{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{}\n", i, cells[i].name(), s(r["kind"]), s(r["mu"]),
                       s(r["rule"]), s(r["tau"]), r["random_control"].get<bool>() ? 1 : 0, s(r["kl"]),
                       s(r["flip_rate"]), s(r["ppl_ref"]), s(r["ppl"]), s(r["max_abs_logit_error"]),
                       s(r["recompute_rate"]), s(r["seconds"]));
    rows.push_back(r);
  }
  write_file_atomic(out + "/results.csv", csv);
  write_file_atomic(out + "/results.json", ojson{{"cells", rows}}.dump(1) + "\n");
  ojson man;
  man["generator"] = "mantis lamp sweep";
  man["mantis_version"] = MANTIS_VERSION;
  man["git_commit"] = MANTIS_GIT_COMMIT;
  man["config_file"] = a.config;
  man["config_sha256"] = sha256_hex(c.text);
  man["config"] = c.text;
  man["model"] = c.model;
  ojson mf = ojson::array();
  for (const char* f : {"config.json", "model.safetensors"})
    if (fs::exists(c.model + "/" + f)) mf.push_back({{"file", c.model + "/" + f}, {"sha256", sha256_file(c.model + "/" + f)}});
  if (fs::is_regular_file(c.model)) mf.push_back({{"file", c.model}, {"sha256", sha256_file(c.model)}});
  man["model_files"] = mf;
  ojson src = ojson::array();
  for (auto& s : data.sources) src.push_back({{"name", s.name}, {"file", s.origin}, {"sha256", s.sha256}, {"tokens", s.tokens}});
  man["data"] = {{"spec", c.data}, {"tokenizer", tok->id()}, {"sources", src}, {"windows", starts.size()}, {"ctx", ctx},
                 {"window_starts", starts}};
  man["cells"] = cells.size();
  man["cells_missing"] = missing;
  man["seconds_this_process"] = total.seconds();
  write_file_atomic(out + "/manifest.json", man.dump(1) + "\n");
  fmt::print("merged {} of {} cells into {}/results.csv{}\n", cells.size() - missing, cells.size(), out,
             missing ? fmt::format(" ({} missing: run them with --cell i)", missing) : "");
  return 0;
}

}  // namespace mantis::cli
