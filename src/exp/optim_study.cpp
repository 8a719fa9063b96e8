#include "exp/optim_study.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "core/file.h"
#include "core/toml.h"
#include "exp/bootstrap.h"
#include "exp/manifest.h"
#include "exp/study.h"
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "train/config.h"
#include "train/train.h"

extern char** environ;

namespace mantis {

namespace {

// Bumped whenever a change of mantis alters what a cell computes from the same key (2: binary32 exp
// and erf are crmath's correctly rounded functions; the gradient norm's sum order).
constexpr int kOptimStudySemantics = 2;

// Role names as nn/model.h spells the enumerators (no such table exists below exp).
const char* role_name(Role r) {
  static const char* const names[kRoleCount] = {"tok_emb", "pos_emb", "attn_qkv", "wq",       "wk",
                                                "wv",      "attn_proj", "mlp_fc", "mlp_gate", "mlp_up",
                                                "mlp_proj", "norm1",  "norm2",    "norm_f",   "lm_head"};
  return names[int(r)];
}

ojson option_json(const OptionValue& v) {
  return std::visit(
      [](const auto& x) -> ojson {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) return nullptr;
        else if constexpr (std::is_same_v<T, double>) return json_number(x);
        else return x;
      },
      v.value);
}

OptionValue option_of(const toml::node& v, const std::string& where) {
  OptionValue o;
  o.where = where;
  if (v.is_boolean()) o.value = v.as_boolean()->get();
  else if (v.is_integer()) o.value = v.as_integer()->get();
  else if (v.is_floating_point()) o.value = v.as_floating_point()->get();
  else if (v.is_string()) o.value = v.as_string()->get();
  return o;
}

bool lists(const OptimizerEntry& e, const std::string& key) {
  return std::find(e.keys.begin(), e.keys.end(), key) != e.keys.end();
}

// The optimizer options of a cell, and the shared keys that were applied.
OptimizerOptions cell_optimizer(const OptimStudyConfig& c, const OptimStudyCell& cell, std::vector<std::string>* applied) {
  OptimizerOptions o;
  o.name = cell.optimizer;
  o.source = c.path;
  const OptimizerEntry& e = find_optimizer(o);
  for (auto& [k, v] : c.hyper)
    if (lists(e, k)) {
      o.values[k] = v;
      if (applied) applied->push_back(k);
    }
  for (auto& var : c.variants)
    if (var.name == cell.variant)
      for (auto& [k, v] : var.options) o.values[k] = v;
  return o;
}

TrainConfig cell_train_config(const OptimStudyConfig& c, const OptimStudyCell& cell, std::vector<std::string>* applied) {
  TrainConfig t = load_train_config(c.models[cell.model]);
  for (auto& [k, v] : c.train) {
    if (k == "steps") t.steps = uint64_t(v);
    else if (k == "ctx") t.model.ctx = int(v);
    else if (k == "batch") t.batch = int(v);
    else if (k == "warmup") t.schedule.warmup = uint64_t(v);
    else if (k == "val_every") t.val_every = uint64_t(v);
    else if (k == "val_seqs") t.val_seqs = int(v);
  }
  t.schedule.steps = t.steps;
  validate(t.model);
  t.init_seed = t.seed = cell.seed;
  t.checkpoint_every = 0;
  t.out.clear();  // no checkpoints: a cell is the unit of resumption
  t.optimizer = cell_optimizer(c, cell, applied);
  return t;
}

bool analysed(const OptimStudyConfig& c, const OptimStudyCell& cell) {
  return c.analysis_every > 0 && std::find(c.analyse.begin(), c.analyse.end(), cell.optimizer) != c.analyse.end();
}

double shared_beta1(const OptimStudyConfig& c) {
  auto it = c.hyper.find("beta1");
  if (it == c.hyper.end()) return 0.9;
  if (auto* d = std::get_if<double>(&it->second.value)) return *d;
  return double(std::get<int64_t>(it->second.value));
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;  // Linux: KiB
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string csv_num(double x) { return std::isfinite(x) ? fmt::format("{:.9g}", x) : ""; }

ojson compute_cell(const OptimStudyConfig& c, const OptimStudyCell& cell, bool isolated,
                   const std::function<void()>& tick) {
  std::vector<std::string> applied;
  TrainConfig tc = cell_train_config(c, cell, &applied);
  Trainer tr(tc);
  std::unique_ptr<GefenProbe> probe;
  if (analysed(c, cell)) {
    probe = std::make_unique<GefenProbe>(param_set(tc.model), shared_beta1(c), c.analysis_every);
    tr.set_observer([&](const StepRecord& r, const GradMap<float>& g, const Optimizer& opt) { probe->observe(r.step, g, opt); });
  }
  ojson curve = ojson::array(), train_loss = ojson::array();
  std::vector<double> seconds;
  double final_val = std::nan("");
  tr.run([&](const StepRecord& r) {
    seconds.push_back(r.seconds);
    train_loss.push_back(json_number(r.loss));
    if (!std::isnan(r.val_loss)) {
      curve.push_back({r.step + 1, json_number(r.val_loss)});
      final_val = r.val_loss;
    }
    tick();
  });
  uint64_t params = 0;
  for (auto& [k, t] : tr.model().params) params += uint64_t(t.data.size());
  const uint64_t sb = tr.optimizer().state_bytes();
  ojson r;
  r["name"] = cell.name();
  r["model"] = cell.model_name;
  r["optimizer"] = cell.optimizer;
  r["variant"] = cell.variant;
  r["seed"] = cell.seed;
  r["steps"] = tc.steps;
  r["applied"] = applied;
  r["final_val_loss"] = json_number(final_val);
  r["final_val_ppl"] = json_number(std::exp(final_val));
  r["val_curve"] = curve;
  r["train_loss"] = train_loss;
  r["median_step_seconds"] = json_number(median(seconds));
  r["state_bytes"] = sb;
  r["params"] = params;
  r["bytes_per_param"] = json_number(double(sb) / double(params));
  r["peak_rss_bytes"] = peak_rss_bytes();
  r["rss_scope"] = isolated ? "cell process" : "whole process so far";
  if (probe) r["gefen"] = probe->json();
  return r;
}

ojson cell_key(const OptimStudyConfig& c, const OptimStudyCell& cell, const ojson& data) {
  const TrainConfig t = cell_train_config(c, cell, nullptr);
  ojson k;
  k["study"] = "mantis optim-study";
  k["semantics"] = kOptimStudySemantics;
  k["model"] = {{"config", std::filesystem::path(c.models[cell.model]).filename().string()},
                {"sha256", sha256_hex(t.text)}};
  ojson ov = ojson::object();
  for (auto& [kk, v] : c.train) ov[kk] = v;
  k["overrides"] = ov;
  k["data"] = data;
  ojson opt = ojson::object();
  for (auto& [kk, v] : t.optimizer.values) opt[kk] = option_json(v);
  k["optimizer"] = {{"name", cell.optimizer}, {"variant", cell.variant}, {"options", opt}};
  k["seed"] = cell.seed;
  k["analysis"] = analysed(c, cell) ? ojson{{"every", c.analysis_every}, {"beta1", json_number(shared_beta1(c))}}
                                    : ojson(nullptr);
  return k;
}

// Runs cell i as a child process (its peak RSS is then its own) and reads its cell file back.
ojson spawn_cell(const OptimStudyOptions& o, const std::string& out, size_t i) {
  std::vector<std::string> args{o.exe, "optim-study", o.config, "--cell", std::to_string(i), "--out", out, "--quiet"};
  if (o.overwrite) args.push_back("--overwrite");
  if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (int e = posix_spawn(&pid, o.exe.c_str(), nullptr, nullptr, argv.data(), environ))
    throw InputError(fmt::format("cell {}: cannot start {}: {}", i, o.exe, std::strerror(e)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw InputError(fmt::format("cell {}: waitpid: {}", i, std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw InputError(fmt::format("cell {}: its process failed ({} {})", i,
                                 WIFEXITED(status) ? "exit status" : "signal",
                                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)));
  ojson r = read_cell(cell_path(out, i));
  r.erase("key");
  return r;
}

void write_merged(const OptimStudyConfig& c, const std::vector<OptimStudyCell>& cells, const StudyRun& run,
                  const std::string& out, bool partial, std::FILE* log) {
  std::string results = "model,optimizer,variant,seed,steps,final_val_loss_nats,final_val_ppl,params,state_bytes,"
                        "bytes_per_param,median_step_seconds,peak_rss_bytes,rss_scope,applied\n";
  std::string curves = "model,optimizer,variant,seed,step,val_loss_nats\n";
  std::string gerr = "model,optimizer,variant,seed,step,role,rel_error\n";
  std::string gdist = "model,optimizer,variant,seed,step,bins,distortion_step0,distortion_relearned\n";
  std::string gper = "model,optimizer,variant,seed,tensor,period_elements,state_bytes\n";
  ojson jcells = ojson::array();
  // (model, label) → per-seed values, in cell order
  std::vector<std::pair<std::string, std::string>> groups;
  std::map<std::pair<std::string, std::string>, std::vector<const ojson*>> members;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (!run.cells[i]) continue;
    const ojson& r = *run.cells[i];
    const OptimStudyCell& cl = cells[i];
    const std::string pre = fmt::format("{},{},{},{}", cl.model_name, cl.optimizer, cl.variant, cl.seed);
    auto num = [&](const char* k) { return json_to_double(r.at(k), k); };
    std::string applied;
    for (auto& a : r.at("applied")) applied += (applied.empty() ? "" : " ") + a.get<std::string>();
    results += fmt::format("{},{},{},{},{},{},{},{},{},{},{}\n", pre, r.at("steps").get<uint64_t>(),
                           csv_num(num("final_val_loss")), csv_num(num("final_val_ppl")), r.at("params").get<uint64_t>(),
                           r.at("state_bytes").get<uint64_t>(), csv_num(num("bytes_per_param")),
                           csv_num(num("median_step_seconds")), r.at("peak_rss_bytes").get<uint64_t>(),
                           r.at("rss_scope").get<std::string>(), applied);
    for (auto& p : r.at("val_curve"))
      curves += fmt::format("{},{},{}\n", pre, p.at(0).get<uint64_t>(), csv_num(json_to_double(p.at(1), "val_loss")));
    if (r.contains("gefen")) {
      const ojson& g = r["gefen"];
      for (auto& e : g.at("rel_error"))
        gerr += fmt::format("{},{},{},{}\n", pre, e.at("step").get<uint64_t>(), e.at("role").get<std::string>(),
                            csv_num(json_to_double(e.at("rel_error"), "rel_error")));
      for (auto& e : g.at("distortion"))
        gdist += fmt::format("{},{},{},{},{}\n", pre, e.at("step").get<uint64_t>(), e.at("bins").get<uint64_t>(),
                             csv_num(json_to_double(e.at("step0"), "step0")),
                             csv_num(json_to_double(e.at("relearned"), "relearned")));
      for (auto& e : g.at("tensors"))
        gper += fmt::format("{},{},{},{}\n", pre, e.at("name").get<std::string>(), e.at("period").get<uint64_t>(),
                            e.at("state_bytes").get<uint64_t>());
    }
    const auto gk = std::make_pair(cl.model_name, cl.label());
    if (!members.count(gk)) groups.push_back(gk);
    members[gk].push_back(&r);
    jcells.push_back(r);
  }
  std::string summary = "model,optimizer,seeds,mean_final_val_loss_nats,t_lo_nats,t_hi_nats,boot_lo_nats,"
                        "boot_hi_nats,ppl,ppl_lo,ppl_hi,bytes_per_param,median_step_seconds,peak_rss_bytes,interval\n";
  ojson jsum = ojson::array();
  for (auto& gk : groups) {
    std::vector<double> loss, bpp, secs;
    uint64_t rss = 0;
    for (const ojson* r : members[gk]) {
      loss.push_back(json_to_double(r->at("final_val_loss"), "final_val_loss"));
      bpp.push_back(json_to_double(r->at("bytes_per_param"), "bytes_per_param"));
      secs.push_back(json_to_double(r->at("median_step_seconds"), "median_step_seconds"));
      rss = std::max(rss, r->at("peak_rss_bytes").get<uint64_t>());
    }
    const SeedInterval s = seed_interval(loss);
    const double b = std::accumulate(bpp.begin(), bpp.end(), 0.0) / double(bpp.size());
    const std::string kind = s.n >= 2 ? "t95" : "single-seed";
    summary += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", gk.first, gk.second, s.n, csv_num(s.mean),
                           csv_num(s.t_lo), csv_num(s.t_hi), csv_num(s.boot_lo), csv_num(s.boot_hi),
                           csv_num(std::exp(s.mean)), csv_num(std::exp(s.t_lo)), csv_num(std::exp(s.t_hi)), csv_num(b),
                           csv_num(median(secs)), rss, kind);
    jsum.push_back({{"model", gk.first}, {"optimizer", gk.second}, {"seeds", s.n},
                    {"mean_final_val_loss", json_number(s.mean)},
                    {"t95", {json_number(s.t_lo), json_number(s.t_hi)}},
                    {"bootstrap95", {json_number(s.boot_lo), json_number(s.boot_hi)}},
                    {"ppl", json_number(std::exp(s.mean))},
                    {"ppl_t95", {json_number(std::exp(s.t_lo)), json_number(std::exp(s.t_hi))}},
                    {"bytes_per_param", json_number(b)}, {"median_step_seconds", json_number(median(secs))},
                    {"peak_rss_bytes", rss}, {"interval", kind}});
  }
  ojson j;
  j["study"] = "mantis optim-study";
  j["config"] = c.path;
  j["partial"] = partial;
  j["missing"] = run.missing;
  j["summary"] = jsum;
  j["cells"] = jcells;
  ojson man = manifest_header("mantis optim-study");
  man["config"] = {{"file", c.path}, {"sha256", sha256_hex(c.text)}};
  man["cells"] = cells.size();
  man["partial"] = partial;
  man["missing"] = run.missing;
  write_result_set(out, {{"results.csv", results}, {"curves.csv", curves}, {"summary.csv", summary},
                         {"gefen_error.csv", gerr}, {"gefen_distortion.csv", gdist}, {"gefen_periods.csv", gper},
                         {"results.json", j.dump(1) + "\n"}},
                   man);
  if (log) {
    fmt::print(log, "{:<14} {:<18} {:>5} {:>10} {:>23} {:>8} {:>11}\n", "model", "optimizer", "seeds", "val loss",
               "95% (t)", "B/param", "step s");
    for (auto& e : jsum)
      fmt::print(log, "{:<14} {:<18} {:>5} {:>10.4f} {:>23} {:>8.3f} {:>11.4f}\n", e["model"].get<std::string>(),
                 e["optimizer"].get<std::string>(), e["seeds"].get<size_t>(),
                 json_to_double(e["mean_final_val_loss"], "loss"),
                 e["interval"] == "t95" ? fmt::format("[{:.4f}, {:.4f}]", json_to_double(e["t95"][0], "lo"),
                                                      json_to_double(e["t95"][1], "hi"))
                                        : std::string("single-seed"),
                 json_to_double(e["bytes_per_param"], "b"), json_to_double(e["median_step_seconds"], "s"));
    fmt::print(log, "wrote {}/results.csv, summary.csv, curves.csv, gefen_*.csv, results.json, manifest.json{}\n", out,
               partial ? " (partial)" : "");
  }
}

}  // namespace

std::string OptimStudyCell::name() const { return fmt::format("{} {} seed={}", model_name, label(), seed); }

OptimStudyConfig optim_study_from_toml(const std::string& text, const std::string& path) {
  OptimStudyConfig c;
  c.path = path, c.text = text;
  const toml::table t = parse_toml(text, path);
  auto line = [&](const toml::node& n) { return toml_where(path, n); };
  check_known_keys(t, path, {"out", "models", "optimizers", "seeds", "seeds_for", "train", "hyper", "analysis", "variant"});
  auto strings = [&](const toml::node& n, const std::string& what) {
    if (!n.is_array() || n.as_array()->empty())
      throw InputError(fmt::format("{}: '{}' must be a non-empty array of strings", line(n), what));
    std::vector<std::string> v;
    for (auto& e : *n.as_array()) {
      if (!e.is_string()) throw InputError(fmt::format("{}: '{}' must be an array of strings", line(e), what));
      v.push_back(e.as_string()->get());
    }
    return v;
  };
  auto seeds = [&](const toml::node& n, const std::string& what) { return toml_seeds(n, path, what); };
  auto table = [&](const char* k) -> const toml::table* {
    const toml::node* n = t.get(k);
    if (!n) return nullptr;
    if (!n->is_table()) throw InputError(fmt::format("{}: '{}' must be a table ([{}])", line(*n), k, k));
    return n->as_table();
  };
  if (const toml::node* n = t.get("out")) {
    if (!n->is_string()) throw InputError(fmt::format("{}: 'out' must be a string", line(*n)));
    c.out = n->as_string()->get();
  }
  const toml::node* m = t.get("models");
  if (!m) throw InputError(fmt::format("{}: 'models' is missing (the training TOMLs of the model shapes)", path));
  c.models = strings(*m, "models");
  refuse_repeated_models(line(*m), c.models);
  const toml::node* op = t.get("optimizers");
  if (!op) throw InputError(fmt::format("{}: 'optimizers' is missing", path));
  c.optimizers = strings(*op, "optimizers");
  for (auto& name : c.optimizers) {
    OptimizerOptions o;
    o.name = name, o.source = path;
    find_optimizer(o);
    if (std::count(c.optimizers.begin(), c.optimizers.end(), name) > 1)
      throw InputError(fmt::format("{}: 'optimizers' lists '{}' twice", line(*op), name));
  }
  if (const toml::node* n = t.get("seeds")) c.seeds = seeds(*n, "seeds");
  if (const toml::table* tt = table("train")) {
    check_known_keys(*tt, path, {"steps", "ctx", "batch", "warmup", "val_every", "val_seqs"}, " in [train]");
    for (auto&& [k, v] : *tt) {
      const std::string key(k.str());
      const bool zero_ok = key == "warmup" || key == "val_every";
      if (!v.is_integer() || v.as_integer()->get() < (zero_ok ? 0 : 1) || v.as_integer()->get() > (int64_t(1) << 31))
        throw InputError(fmt::format("{}: '{}' in [train] must be an integer in {}..2^31", line(v), key, zero_ok ? 0 : 1));
      c.train[key] = v.as_integer()->get();
    }
  }
  if (const toml::table* h = table("hyper")) {
    check_known_keys(*h, path, {"beta1", "beta2", "eps", "weight_decay"}, " in [hyper]");
    for (auto&& [k, v] : *h) {
      if (!v.is_number()) throw InputError(fmt::format("{}: '{}' in [hyper] must be a number", line(v), k.str()));
      OptionValue o = option_of(v, line(v));
      if (v.is_integer()) o.value = double(v.as_integer()->get());
      c.hyper[std::string(k.str())] = o;
    }
  }
  if (const toml::table* a = table("analysis")) {
    check_known_keys(*a, path, {"optimizers", "every"}, " in [analysis]");
    if (const toml::node* n = a->get("optimizers")) c.analyse = strings(*n, "optimizers");
    if (const toml::node* n = a->get("every")) {
      if (!n->is_integer() || n->as_integer()->get() < 1)
        throw InputError(fmt::format("{}: 'every' in [analysis] must be an integer ≥ 1", line(*n)));
      c.analysis_every = uint64_t(n->as_integer()->get());
    }
    if (!c.analyse.empty() && c.analysis_every == 0)
      throw InputError(fmt::format("{}: [analysis] needs 'every' (steps between measurements)", path));
  }
  if (const toml::node* n = t.get("variant")) {
    if (!n->is_array_of_tables()) throw InputError(fmt::format("{}: 'variant' must be an array of tables ([[variant]])", line(*n)));
    for (auto& e : *n->as_array()) {
      const toml::table& vt = *e.as_table();
      check_known_keys(vt, path, {"name", "optimizer", "options"}, " in [[variant]]");
      OptimStudyVariant v;
      for (const char* k : {"name", "optimizer"}) {
        const toml::node* s = vt.get(k);
        if (!s || !s->is_string() || s->as_string()->get().empty())
          throw InputError(fmt::format("{}: [[variant]] needs a non-empty string '{}'", line(e), k));
        (std::string(k) == "name" ? v.name : v.optimizer) = s->as_string()->get();
      }
      OptimizerOptions o;
      o.name = v.optimizer, o.source = path;
      const OptimizerEntry& entry = find_optimizer(o);
      if (const toml::node* opts = vt.get("options")) {
        if (!opts->is_table()) throw InputError(fmt::format("{}: 'options' in [[variant]] must be a table", line(*opts)));
        for (auto&& [k, val] : *opts->as_table()) {
          const std::string key(k.str());
          if (!lists(entry, key))
            throw InputError(fmt::format("{}: variant '{}': optimizer '{}' has no key '{}'", line(val), v.name,
                                         v.optimizer, key));
          v.options[key] = option_of(val, line(val));
        }
      }
      if (std::find(c.optimizers.begin(), c.optimizers.end(), v.name) != c.optimizers.end() ||
          std::any_of(c.variants.begin(), c.variants.end(), [&](auto& w) { return w.name == v.name; }))
        throw InputError(fmt::format("{}: variant name '{}' is already used", line(e), v.name));
      c.variants.push_back(std::move(v));
    }
  }
  if (const toml::table* sf = table("seeds_for"))
    for (auto&& [k, v] : *sf) {
      const std::string key(k.str());
      const bool known = std::find(c.optimizers.begin(), c.optimizers.end(), key) != c.optimizers.end() ||
                         std::any_of(c.variants.begin(), c.variants.end(), [&](auto& w) { return w.name == key; });
      if (!known)
        throw InputError(fmt::format("{}: [seeds_for] '{}' is neither an optimizer nor a variant of the study", line(v), key));
      c.seeds_for[key] = seeds(v, key);
    }
  // Every cell's optimizer settings and training configuration must be valid before anything runs.
  for (const OptimStudyCell& cell : optim_study_cells(c)) try {
      check_optimizer(cell_optimizer(c, cell, nullptr));
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {} with the study's settings: {}", path, cell.label(), e.what()));
    }
  for (size_t i = 0; i < c.models.size(); ++i) {
    OptimStudyCell cell;
    cell.model = i;
    cell.optimizer = c.optimizers.front();
    cell_train_config(c, cell, nullptr);
  }
  return c;
}

OptimStudyConfig read_optim_study(const std::string& path) {
  return optim_study_from_toml(read_text_file(path, "optimizer study configuration"), path);
}

std::vector<OptimStudyCell> optim_study_cells(const OptimStudyConfig& c) {
  std::vector<OptimStudyCell> v;
  for (size_t m = 0; m < c.models.size(); ++m) {
    auto add = [&](const std::string& opt, const std::string& variant) {
      const std::string label = variant.empty() ? opt : variant;
      auto it = c.seeds_for.find(label);
      for (uint64_t s : it == c.seeds_for.end() ? c.seeds : it->second)
        v.push_back({m, study_model_name(c.models[m]), opt, variant, s});
    };
    for (auto& o : c.optimizers) add(o, "");
    for (auto& var : c.variants) add(var.optimizer, var.name);
  }
  return v;
}

namespace {
// Everything a run checks before its first cell, loaded; nothing written.
struct Prepared {
  OptimStudyConfig c;
  std::vector<OptimStudyCell> cells;
  std::string out;
  StudyOptions so;
  std::map<size_t, ojson> data;  // per model whose cells the run touches: its data's key (SHA-256s)
};
Prepared prepare(const OptimStudyOptions& o) {
  Prepared p;
  p.c = read_optim_study(o.config);
  p.cells = optim_study_cells(p.c);
  p.out = study_out(o.out, p.c.out, p.c.path);
  p.so = study_options(o, p.cells.size(), p.out, o.progress, o.log);
  std::vector<size_t> model_of_cell;
  for (const auto& cell : p.cells) model_of_cell.push_back(cell.model);
  p.data = touched_data_keys(o, model_of_cell, p.c.models);
  return p;
}
}  // namespace

void validate_optim_study(const OptimStudyOptions& o) { (void)prepare(o); }

OptimStudyResult run_optim_study(const OptimStudyOptions& o) {
  const Prepared prepared = prepare(o);
  const OptimStudyConfig& c = prepared.c;
  const std::vector<OptimStudyCell>& cells = prepared.cells;
  const StudyOptions& so = prepared.so;
  OptimStudyResult res;
  res.out = prepared.out;
  res.cells = cells.size();
  auto data_of = [&](size_t m) -> const ojson& { return prepared.data.at(m); };
  const bool spawn = o.isolate && o.cell < 0;
  StudyPlan plan;
  plan.label = "optimizer study";
  plan.cells = cells.size();
  plan.unit = "steps";
  plan.work_per_cell = cells.empty() ? 1 : cell_train_config(c, cells[0], nullptr).steps;
  plan.name = [&](size_t i) { return cells[i].name(); };
  plan.key = [&](size_t i) { return cell_key(c, cells[i], data_of(cells[i].model)); };
  plan.compute = [&](size_t i, const std::function<void()>& tick) -> ojson {
    if (spawn) {
      ojson r = spawn_cell(o, res.out, i);
      const uint64_t steps = r.value("steps", uint64_t(0));
      for (uint64_t s = 0; s < steps && s < plan.work_per_cell; ++s) tick();
      return r;
    }
    // ticks beyond the plan's per-cell work (cells of another model may run longer) are dropped
    uint64_t ticks = 0;
    return compute_cell(c, cells[i], o.cell >= 0 && o.isolate, [&] { if (ticks++ < plan.work_per_cell) tick(); });
  };
  plan.done = [&](size_t i, const ojson& r, const Progress&) {
    if (o.log && o.progress != ProgressMode::bar && !spawn)  // a child prints its own line
      fmt::print(o.log, "cell {} ({}): final val loss {:.4f}, {:.3f} B/param\n", i, cells[i].name(),
                 json_to_double(r.at("final_val_loss"), "final_val_loss"),
                 json_to_double(r.at("bytes_per_param"), "bytes_per_param"));
  };
  const StudyRun run = run_study(plan, so);
  res.computed = run.computed.size();
  res.missing = run.missing;
  if (run.merge) {
    write_merged(c, cells, run, res.out, !run.missing.empty(), o.log);
    res.merged = true;
  }
  return res;
}

// ---------------------------------------------------------------- pieces

double student_t_975(int df) {
  if (df < 1) throw InputError(fmt::format("student_t_975: {} degrees of freedom", df));
  const double nu = df;
  const double c = std::exp(std::lgamma((nu + 1) / 2) - std::lgamma(nu / 2)) / std::sqrt(nu * M_PI);
  auto cdf = [&](double t) {  // 0.5 + ∫_0^t density, Simpson with 4000 panels
    const int n = 4000;
    const double h = t / n;
    auto f = [&](double x) { return c * std::pow(1 + x * x / nu, -(nu + 1) / 2); };
    double s = f(0) + f(t);
    for (int i = 1; i < n; ++i) s += (i % 2 ? 4 : 2) * f(i * h);
    return 0.5 + s * h / 3;
  };
  double lo = 0, hi = 1;
  while (cdf(hi) < 0.975) hi *= 2;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    (cdf(mid) < 0.975 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

SeedInterval seed_interval(std::span<const double> v) {
  SeedInterval s;
  s.n = v.size();
  s.t_lo = s.t_hi = s.boot_lo = s.boot_hi = std::nan("");
  if (v.empty()) {
    s.mean = std::nan("");
    return s;
  }
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  if (v.size() < 2) return s;
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  const double sd = std::sqrt(ss / double(v.size() - 1));
  const double half = student_t_975(int(v.size()) - 1) * sd / std::sqrt(double(v.size()));
  s.t_lo = s.mean - half, s.t_hi = s.mean + half;
  const std::vector<double> ones(v.size(), 1.0);
  const Interval b = Bootstrap(v.size()).ratio(v, ones);
  s.boot_lo = b.lo, s.boot_hi = b.hi;
  return s;
}

double codebook_distortion(std::span<const int64_t> counts, std::span<const float> codes) {
  double num = 0, den = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] == 0) continue;
    const double x = -1.0 + double(2 * j + 1) / 4096.0;  // the bin's centre
    // nearest code; ties to the lower one
    auto it = std::lower_bound(codes.begin(), codes.end(), float(x), [](float a, float b) { return a < b; });
    double best = INFINITY;
    if (it != codes.end()) best = std::abs(double(*it) - x);
    if (it != codes.begin()) best = std::min(best, std::abs(double(*(it - 1)) - x));
    num += double(counts[j]) * best * best;
    den += double(counts[j]);
  }
  return den > 0 ? num / den : std::nan("");
}

GefenProbe::GefenProbe(const ParamSet& params, double beta1, uint64_t every)
    : params_(params), w_(float(1.0 - beta1)), every_(every) {
  if (every == 0) throw InputError("Gefen analysis: 'every' must be ≥ 1");
  for (auto& p : params_.params) {
    size_t n = 1;
    for (int64_t d : p.shape) n *= size_t(d);
    shadow_[p.name].assign(n, 0.0f);
  }
}

void GefenProbe::observe(uint64_t step, const GradMap<float>& g, const Optimizer& opt) {
  for (auto& p : params_.params) {
    std::vector<float>& m = shadow_[p.name];
    const std::vector<float>& gp = g.at(p.name);
    for (size_t i = 0; i < m.size(); ++i) m[i] = std::fma(w_, gp[i] - m[i], m[i]);
  }
  if (step % every_ != 0) return;
  const std::vector<StateTensor> st = opt.state();
  std::map<std::string, const StateTensor*> by;
  for (auto& t : st) by[t.name] = &t;
  auto find = [&](const std::string& name, DType d) -> const StateTensor* {
    auto it = by.find(name);
    if (it == by.end()) return nullptr;
    if (it->second->dtype != d) throw InputError(fmt::format("Gefen analysis: state tensor {} is {}, not {}", name,
                                                             it->second->describe(), to_string(d)));
    return it->second;
  };
  const StateTensor* cb = find("codebook", DType::f32);
  if (!cb || cb->numel() != uint64_t(kGefenCodebookSize))
    throw InputError(fmt::format("Gefen analysis: optimizer '{}' has no f32 [256] state tensor 'codebook'", opt.name()));
  std::vector<float> codes(kGefenCodebookSize);
  cb->copy_to(std::span<float>(codes));
  std::map<std::string, uint64_t> period;
  for (auto& p : params_.params)
    if (const StateTensor* t = find(p.name + ".period", DType::u64)) {
      uint64_t v;
      t->copy_to(std::span<uint64_t>(&v, 1));
      period[p.name] = v;
    }
  if (step == 0) {
    codebook0_ = codes;
    for (auto& p : params_.params) {
      uint64_t bytes = 0;
      for (auto& t : st)
        if (t.name.starts_with(p.name + ".")) bytes += t.bytes.size();
      const uint64_t per = period.count(p.name) ? period[p.name] : 0;
      periods.emplace_back(p.name, per);
      state_bytes.emplace_back(p.name, bytes);
      if (per == 1) p1_bytes += bytes, p1_params += shadow_[p.name].size();
    }
  }
  // (a) relative error per role
  std::vector<double> diff(kRoleCount, 0), ref(kRoleCount, 0);
  std::vector<bool> seen(kRoleCount, false);
  for (auto& p : params_.params) {
    const std::vector<float>& m = shadow_[p.name];
    const size_t n = m.size();
    std::vector<float> deq(n);
    if (const StateTensor* idx = find(p.name + ".idx", DType::u8)) {
      const StateTensor* mag = find(p.name + ".mag", DType::f32);
      if (!mag || idx->numel() != n || mag->numel() == 0 || n % mag->numel() != 0)
        throw InputError(fmt::format("Gefen analysis: {}.idx / .mag do not describe {} elements", p.name, n));
      std::vector<uint8_t> code(n);
      std::vector<float> scale(mag->numel());
      idx->copy_to(std::span<uint8_t>(code));
      mag->copy_to(std::span<float>(scale));
      const size_t Q = n / scale.size();
      for (size_t i = 0; i < n; ++i) deq[i] = codes[code[i]] * scale[i / Q];
    } else if (const StateTensor* full = find(p.name + ".m", DType::f32)) {
      if (full->numel() != n) throw InputError(fmt::format("Gefen analysis: {}.m does not hold {} elements", p.name, n));
      full->copy_to(std::span<float>(deq));
    } else {
      continue;  // no first moment stored for this tensor
    }
    const int r = int(p.role);
    seen[size_t(r)] = true;
    for (size_t i = 0; i < n; ++i) {
      const double d = double(deq[i]) - double(m[i]);
      diff[size_t(r)] += d * d;
      ref[size_t(r)] += double(m[i]) * double(m[i]);
    }
  }
  for (int r = 0; r < kRoleCount; ++r)
    if (seen[size_t(r)])
      errors.push_back({step, role_name(Role(r)),
                        ref[size_t(r)] > 0 ? std::sqrt(diff[size_t(r)]) / std::sqrt(ref[size_t(r)])
                                           : (diff[size_t(r)] > 0 ? INFINITY : 0.0)});
  // (b) distortion of the step-0 codebook on this step's gradients, against a re-learned one
  if (step > 0 && !period.empty()) {
    std::vector<int64_t> counts(kGefenHistogramBins, 0);
    for (auto& p : params_.params)
      if (period.count(p.name)) add_to_gefen_histogram(g.at(p.name), size_t(period[p.name]), counts);
    uint64_t bins = 0;
    for (int64_t x : counts) bins += x > 0;
    if (bins > 0) {
      const GefenCodebook fresh = learn_gefen_codebook(counts);
      distortions.push_back({step, bins, codebook_distortion(counts, codebook0_), codebook_distortion(counts, fresh.codes)});
    }
  }
}

ojson GefenProbe::json() const {
  ojson e = ojson::array(), d = ojson::array(), t = ojson::array();
  for (auto& x : errors) e.push_back({{"step", x.step}, {"role", x.role}, {"rel_error", json_number(x.rel_error)}});
  for (auto& x : distortions)
    d.push_back({{"step", x.step}, {"bins", x.bins}, {"step0", json_number(x.step0)}, {"relearned", json_number(x.relearned)}});
  for (size_t i = 0; i < periods.size(); ++i)
    t.push_back({{"name", periods[i].first}, {"period", periods[i].second}, {"state_bytes", state_bytes[i].second}});
  return {{"every", every_}, {"rel_error", e}, {"distortion", d}, {"tensors", t}, {"p1_state_bytes", p1_bytes},
          {"p1_params", p1_params}};
}

}  // namespace mantis
