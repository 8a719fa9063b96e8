// mantis gnmr replay|study — the GNMR controller alone on a recorded norm stream (contract:
// src/exp/gnmr_replay.h), and the GNMR studies' resumable cells (src/exp/gnmr_study.h).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common.h"
#include "exp/gnmr_replay.h"
#include "exp/gnmr_study.h"

namespace mantis::cli {

namespace {

struct GnmrArgs {
  std::string action, study, config, norms, out;
  bool json = false, list = false;
  GnmrStudyOptions so;
  SlurmArgs slurm;
};

int run_replay(const GnmrArgs& a) {
  for (auto [v, flag] : {std::pair{&a.config, "--config"}, {&a.norms, "--norms"}, {&a.out, "--out"}})
    if (v->empty()) throw InputError(fmt::format("gnmr replay: {} is required", flag));
  if (!a.study.empty()) throw InputError("gnmr replay takes no study configuration (--config C.toml names the controller)");
  const GnmrOptions o = gnmr_replay_config(a.config);
  const GnmrReplayResult r = gnmr_replay(o, a.norms, a.out);
  const double rate = double(r.recovered) / double(r.steps * r.units);
  const double exceed = r.eligible ? double(r.exceeded) / double(r.eligible) : 0.0;
  if (a.json) {
    nlohmann::ordered_json j;
    j["steps"] = r.steps, j["units"] = r.units, j["recovered"] = r.recovered, j["recovery_rate"] = rate;
    j["exceeded"] = r.exceeded, j["eligible"] = r.eligible, j["exceedance_rate"] = exceed, j["held"] = r.held;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("gnmr replay: {} steps × {} units; recovered {} unit-steps ({:.3f} %); exceeded {} of {} eligible "
               "({:.3f} %); decisions in {}\n",
               r.steps, r.units, r.recovered, 100 * rate, r.exceeded, r.eligible, 100 * exceed, a.out);
    for (auto& h : r.held) fmt::print("gnmr replay: {} holds a recovery slot to the end\n", h);
  }
  return 0;
}

int run_study(const GnmrArgs& a) {
  if (a.study.empty()) throw InputError("gnmr study: the study configuration (STUDY.toml) is required");
  if (!a.config.empty() || !a.norms.empty()) throw InputError("gnmr study takes no --config or --norms");
  if (a.list) {
    const auto cells = gnmr_study_cells(read_gnmr_study(a.study));
    for (size_t i = 0; i < cells.size(); ++i) fmt::print("{}\t{}\n", i, cells[i].name());
    return 0;
  }
  GnmrStudyOptions o = a.so;
  o.config = a.study, o.out = a.out;
  o.progress = shared().progress_mode();
  if (!a.slurm.emit.empty()) return emit_slurm(a.slurm, o, [&] { validate_gnmr_study(o); });
  const GnmrStudyResult r = run_gnmr_study(o);
  if (r.merged) report_figures(r.out);
  return 0;
}

}  // namespace

Runner setup_gnmr(CLI::App& sub) {
  auto a = std::make_shared<GnmrArgs>();
  sub.description(
      "the GNMR controller: `mantis gnmr replay --config C.toml --norms N.csv --out D.csv` runs it on a recorded "
      "norm stream (C: a [controller] table; N: step,unit,grad_norm; D: step,unit,gnmr,dgnmr,exceeds,lock,recovered; "
      "contract: src/exp/gnmr_replay.h, the rule: src/train/gnmr.h); `mantis gnmr study STUDY.toml [--cells | --cell "
      "i | --merge]` runs a study's arms as resumable cells merged into one result set (src/exp/gnmr_study.h)");
  sub.add_option("action", a->action, "replay or study")->required()->check(CLI::IsMember({"replay", "study"}));
  sub.add_option("study", a->study, "study: the study configuration (TOML)")->check(kPath);
  sub.add_option("--config", a->config, "replay: a TOML file with a [controller] table (name = \"gnmr\")")->check(kPath);
  sub.add_option("--norms", a->norms, "replay: CSV step,unit,grad_norm, every unit at every step 1..T")->check(kPath);
  add_out(sub, a->out, "replay: the decisions (CSV); study: the output directory (overrides the config's out)");
  add_json(sub, a->json, "replay: print one JSON object (steps, units, recovered, exceeded, eligible, held)");
  sub.add_flag("--cells", a->list, "study: list the cells (index, name) and exit");
  add_cell_choice(sub, a->so, "study: ");
  add_figures(sub);
  add_slurm(sub, a->slurm);
  add_threads(sub);
  add_progress(sub);
  return [a] { return a->action == "replay" ? run_replay(*a) : run_study(*a); };
}

}  // namespace mantis::cli
