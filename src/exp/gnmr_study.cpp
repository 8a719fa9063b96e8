#include "exp/gnmr_study.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "core/sample.h"
#include "core/toml.h"
#include "exp/manifest.h"
#include "exp/optim_study.h"  // seed_interval
#include "exp/study.h"
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "train/config.h"
#include "train/routing.h"
#include "train/train.h"

namespace mantis {

namespace {

// Bumped whenever a change of mantis alters what a cell computes from the same key.
constexpr int kGnmrStudySemantics = 1;
constexpr const char* kOverrides[] = {"steps", "ctx", "batch", "warmup", "val_every", "val_seqs"};

std::string csv_num(double x) { return std::isfinite(x) ? fmt::format("{:.9g}", x) : ""; }

TrainConfig cell_config(const GnmrStudyConfig& c, const GnmrStudyCell& cell) {
  const std::string& path = c.models[cell.model];
  TrainConfig t;
  try {
    t = train_config_from_toml(read_text_file(path, "training configuration") + "\n" + c.arms[cell.arm].config, path);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: arm '{}' on {}: {}", c.path, cell.arm_name, path, e.what()));
  }
  for (auto& [k, v] : c.train) {
    const uint64_t n = uint64_t(v);
    if (k == "steps") t.steps = n;
    else if (k == "ctx") t.model.ctx = int(n);
    else if (k == "batch") t.batch = int(n);
    else if (k == "warmup") t.schedule.warmup = n;
    else if (k == "val_every") t.val_every = n;
    else if (k == "val_seqs") t.val_seqs = int(n);
  }
  t.schedule.steps = t.steps;
  validate(t.model);
  t.init_seed = t.seed = t.lora_seed = cell.seed;
  t.checkpoint_every = 0;
  t.out.clear();
  return t;
}

// One recovery.csv line "step,recovered,exceeded,units,ids" split.
std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> f(1);
  for (char ch : line)
    if (ch == ',') f.emplace_back();
    else f.back().push_back(ch);
  return f;
}

ojson compute_cell(const GnmrStudyConfig& c, const GnmrStudyCell& cell, const std::function<void()>& tick) {
  const TrainConfig tc = cell_config(c, cell);
  Trainer tr(tc);
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
  ojson r;
  r["name"] = cell.name();
  r["model"] = cell.model_name;
  r["arm"] = cell.arm_name;
  r["seed"] = cell.seed;
  r["steps"] = tc.steps;
  r["final_val_loss"] = json_number(final_val);
  r["final_val_ppl"] = json_number(std::exp(final_val));
  r["val_curve"] = curve;
  r["train_loss"] = train_loss;
  r["median_step_seconds"] = json_number(median(seconds));
  r["controller"] = tc.controller.name;
  const size_t units = unit_ids(tc.model, tc.controller.unit_block).size();  // blocks with unit_block
  uint64_t recovered = 0, exceeded = 0;
  ojson rec = ojson::array();
  for (auto& [file, text] : tr.controller().logs()) {
    if (file != "recovery.csv") continue;
    std::istringstream in(text);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      const auto f = fields(line);
      recovered += std::stoull(f[1]), exceeded += std::stoull(f[2]);
      if (!f[4].empty()) rec.push_back({std::stoull(f[0]), f[4]});
    }
  }
  if (!c.also_validate.empty()) {
    ojson also = ojson::object();
    for (const std::string& spec : c.also_validate) also[spec] = json_number(tr.validation_loss_on(spec));
    r["also_val"] = also;
  }
  const uint64_t warm = tc.controller.name == "gnmr" ? tc.controller.gnmr.warmup : tc.steps;
  r["units"] = units;
  r["recovered"] = recovered;
  r["exceeded"] = exceeded;
  r["eligible"] = (tc.steps > warm ? tc.steps - warm : 0) * units;
  r["recoveries"] = rec;  // [step (1-based), "id id …"]
  return r;
}

ojson cell_key(const GnmrStudyConfig& c, const GnmrStudyCell& cell, const ojson& data, const ojson& also) {
  const TrainConfig t = cell_config(c, cell);
  ojson k;
  k["study"] = "mantis gnmr study";
  k["semantics"] = kGnmrStudySemantics;
  k["config"] = {{"model", std::filesystem::path(c.models[cell.model]).filename().string()},
                 {"arm", cell.arm_name},
                 {"sha256", sha256_hex(t.text)}};
  ojson ov = ojson::object();
  for (auto& [kk, v] : c.train) ov[kk] = v;
  k["overrides"] = ov;
  k["data"] = data;
  k["seed"] = cell.seed;
  if (!c.also_validate.empty()) k["also_validate"] = also;
  return k;
}

// Steps t ≥ 11 (1-based) whose training loss exceeds 1.1 × the mean of the 10 before.
uint64_t spikes(const ojson& losses) {
  std::vector<double> l;
  for (auto& v : losses) l.push_back(json_to_double(v, "train_loss"));
  uint64_t n = 0;
  for (size_t t = 10; t < l.size(); ++t) {
    double m = 0;
    for (size_t j = t - 10; j < t; ++j) m += l[j];
    n += l[t] > 1.1 * (m / 10);
  }
  return n;
}

void write_merged(const GnmrStudyConfig& c, const std::vector<GnmrStudyCell>& cells, const StudyRun& run,
                  const std::string& out, bool partial, std::FILE* log) {
  std::string also_head, also_sum_head;  // one column per also_validate spec (summary: mean, t interval)
  for (const std::string& spec : c.also_validate) {
    also_head += ",val_loss_nats[" + spec + "]";
    also_sum_head += ",val_loss_nats[" + spec + "],t_lo_nats[" + spec + "],t_hi_nats[" + spec + "]";
  }
  auto also_of = [&](const ojson& r, const std::string& spec) {
    return r.contains("also_val") && r["also_val"].contains(spec) ? json_to_double(r["also_val"][spec], "also_val")
                                                                  : std::nan("");
  };
  std::string results = "model,arm,seed,steps,final_val_loss_nats,final_val_ppl,median_step_seconds,controller,"
                        "units,recovered,exceeded,eligible,recovery_rate,exceedance_rate,loss_spikes" + also_head +
                        "\n";
  std::string curves = "model,arm,seed,step,val_loss_nats\n", recs = "model,arm,seed,step,unit\n";
  std::vector<std::pair<std::string, std::string>> groups;
  std::map<std::pair<std::string, std::string>, std::vector<const ojson*>> members;
  ojson jcells = ojson::array();
  auto rate = [](const ojson& r, const char* num, double den) {
    return den > 0 ? double(r.at(num).get<uint64_t>()) / den : std::nan("");
  };
  for (size_t i = 0; i < cells.size(); ++i) {
    if (!run.cells[i]) continue;
    const ojson& r = *run.cells[i];
    const GnmrStudyCell& cl = cells[i];
    const std::string pre = fmt::format("{},{},{}", cl.model_name, cl.arm_name, cl.seed);
    const double steps = double(r.at("steps").get<uint64_t>()), units = double(r.at("units").get<uint64_t>());
    results += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{}\n", pre, r.at("steps").get<uint64_t>(),
                           csv_num(json_to_double(r.at("final_val_loss"), "final_val_loss")),
                           csv_num(json_to_double(r.at("final_val_ppl"), "final_val_ppl")),
                           csv_num(json_to_double(r.at("median_step_seconds"), "median_step_seconds")),
                           r.at("controller").get<std::string>(), r.at("units").get<uint64_t>(),
                           r.at("recovered").get<uint64_t>(), r.at("exceeded").get<uint64_t>(),
                           r.at("eligible").get<uint64_t>(), csv_num(rate(r, "recovered", steps * units)),
                           csv_num(rate(r, "exceeded", double(r.at("eligible").get<uint64_t>()))), spikes(r.at("train_loss")));
    results.pop_back();  // the newline, after the also_validate columns
    for (const std::string& spec : c.also_validate) results += "," + csv_num(also_of(r, spec));
    results += "\n";
    for (auto& p : r.at("val_curve"))
      curves += fmt::format("{},{},{}\n", pre, p.at(0).get<uint64_t>(), csv_num(json_to_double(p.at(1), "val_loss")));
    for (auto& p : r.at("recoveries")) {
      std::istringstream ids(p.at(1).get<std::string>());
      for (std::string id; ids >> id;) recs += fmt::format("{},{},{}\n", pre, p.at(0).get<uint64_t>(), id);
    }
    const auto gk = std::make_pair(cl.model_name, cl.arm_name);
    if (!members.count(gk)) groups.push_back(gk);
    members[gk].push_back(&r);
    jcells.push_back(r);
  }
  std::string summary = "model,arm,seeds,mean_final_val_loss_nats,t_lo_nats,t_hi_nats,boot_lo_nats,boot_hi_nats,"
                        "ppl,ppl_lo,ppl_hi,recovery_rate,exceedance_rate,loss_spikes,median_step_seconds,interval" +
                        also_sum_head + "\n";
  ojson jsum = ojson::array();
  for (auto& gk : groups) {
    std::vector<double> loss, rec, exc, spk, secs;
    for (const ojson* r : members[gk]) {
      loss.push_back(json_to_double(r->at("final_val_loss"), "final_val_loss"));
      const double su = double(r->at("steps").get<uint64_t>()) * double(r->at("units").get<uint64_t>());
      rec.push_back(rate(*r, "recovered", su));
      exc.push_back(rate(*r, "exceeded", double(r->at("eligible").get<uint64_t>())));
      spk.push_back(double(spikes(r->at("train_loss"))));
      secs.push_back(json_to_double(r->at("median_step_seconds"), "median_step_seconds"));
    }
    auto mean = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); };
    const SeedInterval s = seed_interval(loss);
    const std::string kind = s.n >= 2 ? "t95" : "single-seed";
    summary += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", gk.first, gk.second, s.n, csv_num(s.mean),
                           csv_num(s.t_lo), csv_num(s.t_hi), csv_num(s.boot_lo), csv_num(s.boot_hi),
                           csv_num(std::exp(s.mean)), csv_num(std::exp(s.t_lo)), csv_num(std::exp(s.t_hi)),
                           csv_num(mean(rec)), csv_num(mean(exc)), csv_num(mean(spk)), csv_num(median(secs)), kind);
    summary.pop_back();
    ojson jalso = ojson::object();
    for (const std::string& spec : c.also_validate) {
      std::vector<double> v;
      for (const ojson* r : members[gk]) v.push_back(also_of(*r, spec));
      const SeedInterval a = seed_interval(v);
      summary += fmt::format(",{},{},{}", csv_num(a.mean), csv_num(a.t_lo), csv_num(a.t_hi));
      jalso[spec] = {{"mean", json_number(a.mean)}, {"t95", {json_number(a.t_lo), json_number(a.t_hi)}}};
    }
    summary += "\n";
    jsum.push_back({{"model", gk.first}, {"arm", gk.second}, {"seeds", s.n},
                    {"mean_final_val_loss", json_number(s.mean)},
                    {"t95", {json_number(s.t_lo), json_number(s.t_hi)}},
                    {"bootstrap95", {json_number(s.boot_lo), json_number(s.boot_hi)}},
                    {"recovery_rate", json_number(mean(rec))}, {"exceedance_rate", json_number(mean(exc))},
                    {"loss_spikes", json_number(mean(spk))}, {"median_step_seconds", json_number(median(secs))},
                    {"interval", kind}});
    if (!c.also_validate.empty()) jsum.back()["also_val"] = jalso;
  }
  ojson j;
  j["study"] = "mantis gnmr study";
  j["config"] = c.path;
  j["partial"] = partial;
  j["missing"] = run.missing;
  j["summary"] = jsum;
  j["cells"] = jcells;
  ojson man = manifest_header("mantis gnmr study");
  man["config"] = {{"file", c.path}, {"sha256", sha256_hex(c.text)}};
  man["cells"] = cells.size();
  man["partial"] = partial;
  man["missing"] = run.missing;
  write_result_set(out, {{"results.csv", results}, {"curves.csv", curves}, {"recoveries.csv", recs},
                         {"summary.csv", summary}, {"results.json", j.dump(1) + "\n"}},
                   man);
  if (log) {
    fmt::print(log, "{:<14} {:<16} {:>5} {:>10} {:>23} {:>9} {:>9}\n", "model", "arm", "seeds", "val loss", "95% (t)",
               "recovery", "exceed");
    for (auto& e : jsum)
      fmt::print(log, "{:<14} {:<16} {:>5} {:>10.4f} {:>23} {:>9} {:>9}\n", e["model"].get<std::string>(),
                 e["arm"].get<std::string>(), e["seeds"].get<size_t>(), json_to_double(e["mean_final_val_loss"], "l"),
                 e["interval"] == "t95" ? fmt::format("[{:.4f}, {:.4f}]", json_to_double(e["t95"][0], "lo"),
                                                      json_to_double(e["t95"][1], "hi"))
                                        : std::string("single-seed"),
                 csv_num(json_to_double(e["recovery_rate"], "r")), csv_num(json_to_double(e["exceedance_rate"], "e")));
    fmt::print(log, "wrote {}/results.csv, summary.csv, curves.csv, recoveries.csv, results.json, manifest.json{}\n", out,
               partial ? " (partial)" : "");
  }
}

}  // namespace

std::string GnmrStudyCell::name() const { return fmt::format("{} {} seed={}", model_name, arm_name, seed); }

GnmrStudyConfig gnmr_study_from_toml(const std::string& text, const std::string& path) {
  GnmrStudyConfig c;
  c.path = path, c.text = text;
  const toml::table t = parse_toml(text, path);
  check_known_keys(t, path, {"out", "models", "seeds", "train", "arm", "also_validate"});
  if (auto* n = t.get("also_validate")) {
    if (!n->is_array()) throw InputError(fmt::format("{}: 'also_validate' must be an array of data specs", toml_where(path, *n)));
    for (auto& e : *n->as_array()) {
      if (!e.is_string() || e.as_string()->get().empty() || e.as_string()->get().find_first_of(", \n\"") != std::string::npos)
        throw InputError(fmt::format("{}: 'also_validate' holds data specs (\"validation\", \"austen/test\", …)",
                                     toml_where(path, e)));
      c.also_validate.push_back(e.as_string()->get());
    }
    refuse_repeats(toml_where(path, *n), "also_validate", "", c.also_validate, c.also_validate);
  }
  if (auto* n = t.get("out")) {
    if (!n->is_string()) throw InputError(fmt::format("{}: 'out' must be a string", toml_where(path, *n)));
    c.out = n->as_string()->get();
  }
  const toml::node* m = t.get("models");
  if (!m || !m->is_array() || m->as_array()->empty())
    throw InputError(fmt::format("{}: 'models' must be a non-empty array of training configurations", path));
  for (auto& e : *m->as_array()) {
    if (!e.is_string()) throw InputError(fmt::format("{}: 'models' must hold strings", toml_where(path, e)));
    c.models.push_back(e.as_string()->get());
  }
  refuse_repeated_models(toml_where(path, *m), c.models);
  if (auto* n = t.get("seeds")) c.seeds = toml_seeds(*n, path, "seeds");
  if (auto* n = t.get("train")) {
    if (!n->is_table()) throw InputError(fmt::format("{}: 'train' must be a table", toml_where(path, *n)));
    check_known_keys(*n->as_table(), path, {"steps", "ctx", "batch", "warmup", "val_every", "val_seqs"}, " in [train]");
    for (const char* k : kOverrides)
      if (auto* v = n->as_table()->get(k)) {
        if (!v->is_integer() || v->as_integer()->get() < 1)
          throw InputError(fmt::format("{}: [train] {} must be an integer ≥ 1", toml_where(path, *v), k));
        c.train.push_back({k, double(v->as_integer()->get())});
      }
  }
  const toml::node* arms = t.get("arm");
  if (!arms || !arms->is_array_of_tables() || arms->as_array()->empty())
    throw InputError(fmt::format("{}: at least one [[arm]] is required", path));
  std::set<std::string> names;
  for (auto& e : *arms->as_array()) {
    const toml::table& a = *e.as_table();
    check_known_keys(a, path, {"name", "config", "seeds"}, " in [[arm]]");
    GnmrStudyArm arm;
    const toml::node* nm = a.get("name");
    if (!nm || !nm->is_string() || nm->as_string()->get().empty() ||
        nm->as_string()->get().find_first_of(", \n\"") != std::string::npos)
      throw InputError(fmt::format("{}: an [[arm]] needs a name without commas, spaces or quotes", toml_where(path, e)));
    arm.name = nm->as_string()->get();
    if (!names.insert(arm.name).second)
      throw InputError(fmt::format("{}: arm '{}' is named twice", toml_where(path, *nm), arm.name));
    if (auto* cf = a.get("config")) {
      if (!cf->is_string()) throw InputError(fmt::format("{}: arm '{}': config must be a string", toml_where(path, *cf), arm.name));
      arm.config = cf->as_string()->get();
    }
    if (auto* s = a.get("seeds")) arm.seeds = toml_seeds(*s, path, "seeds");
    c.arms.push_back(arm);
  }
  return c;
}

GnmrStudyConfig read_gnmr_study(const std::string& path) {
  return gnmr_study_from_toml(read_text_file(path, "study configuration"), path);
}

std::vector<GnmrStudyCell> gnmr_study_cells(const GnmrStudyConfig& c) {
  std::vector<GnmrStudyCell> v;
  for (size_t m = 0; m < c.models.size(); ++m) {
    const std::string name = study_model_name(c.models[m]);
    for (size_t a = 0; a < c.arms.size(); ++a)
      for (uint64_t s : c.arms[a].seeds.empty() ? c.seeds : c.arms[a].seeds) v.push_back({m, a, name, c.arms[a].name, s});
  }
  return v;
}

namespace {
// Everything a run checks before its first cell, loaded; nothing written.
struct Prepared {
  GnmrStudyConfig c;
  std::vector<GnmrStudyCell> cells;
  std::string out;
  StudyOptions so;
  std::map<size_t, ojson> data;  // per model whose cells the run touches: its data's key (SHA-256s)
  ojson also = ojson::object();  // the extra validation data: their sources' SHA-256s
};
Prepared prepare(const GnmrStudyOptions& o) {
  Prepared p;
  p.c = read_gnmr_study(o.config);
  const GnmrStudyConfig& c = p.c;
  p.cells = gnmr_study_cells(c);
  p.out = study_out(o.out, c.out, c.path);
  p.so = study_options(o, p.cells.size(), p.out, o.progress, o.log);
  // every (model, arm) configuration and its controller
  for (auto& cell : p.cells) {
    const TrainConfig t = cell_config(c, cell);
    if (!t.controller.name.empty()) make_controller(t.controller, t.model);
  }
  std::vector<size_t> model_of_cell;
  for (const auto& cell : p.cells) model_of_cell.push_back(cell.model);
  p.data = touched_data_keys(o, model_of_cell, c.models);
  if (!c.also_validate.empty()) {
    const auto tok = make_tokenizer(cell_config(c, p.cells[0]).tokenizer);
    for (const std::string& spec : c.also_validate) {
      ojson a = data_sources_json(load_tokens(spec, *tok));
      for (auto& src : a) src.erase("file");
      p.also[spec] = a;
    }
  }
  return p;
}
}  // namespace

void validate_gnmr_study(const GnmrStudyOptions& o) { (void)prepare(o); }

GnmrStudyResult run_gnmr_study(const GnmrStudyOptions& o) {
  const Prepared prepared = prepare(o);
  const GnmrStudyConfig& c = prepared.c;
  const std::vector<GnmrStudyCell>& cells = prepared.cells;
  const StudyOptions& so = prepared.so;
  const ojson& also = prepared.also;
  GnmrStudyResult res;
  res.out = prepared.out;
  res.cells = cells.size();
  auto data_of = [&](size_t m) -> const ojson& { return prepared.data.at(m); };
  StudyPlan plan;
  plan.label = "gnmr study";
  plan.cells = cells.size();
  plan.unit = "steps";
  plan.work_per_cell = cells.empty() ? 1 : cell_config(c, cells[0]).steps;
  plan.name = [&](size_t i) { return cells[i].name(); };
  plan.key = [&](size_t i) { return cell_key(c, cells[i], data_of(cells[i].model), also); };
  plan.compute = [&](size_t i, const std::function<void()>& tick) -> ojson {
    uint64_t ticks = 0;
    return compute_cell(c, cells[i], [&] { if (ticks++ < plan.work_per_cell) tick(); });
  };
  plan.done = [&](size_t i, const ojson& r, const Progress&) {
    if (o.log && o.progress != ProgressMode::bar)
      fmt::print(o.log, "cell {} ({}): final val loss {:.4f}, recovered {} unit-steps\n", i, cells[i].name(),
                 json_to_double(r.at("final_val_loss"), "final_val_loss"), r.at("recovered").get<uint64_t>());
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

}  // namespace mantis
