// mantis gnmr replay --config C.toml --norms N.csv --out D.csv — the GNMR controller alone on a
// recorded norm stream (the contract: src/exp/gnmr_replay.h).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common.h"
#include "exp/gnmr_replay.h"

namespace mantis::cli {

namespace {

struct GnmrArgs {
  std::string action, config, norms, out;
  bool json = false;
};

}  // namespace

Runner setup_gnmr(CLI::App& sub) {
  auto a = std::make_shared<GnmrArgs>();
  sub.description(
      "the GNMR controller on a recorded norm stream: `mantis gnmr replay --config C.toml --norms N.csv --out D.csv` "
      "(C: a [controller] table; N: step,unit,grad_norm; D: step,unit,gnmr,dgnmr,exceeds,lock,recovered; contract: "
      "src/exp/gnmr_replay.h, the rule: src/train/gnmr.h)");
  sub.add_option("action", a->action, "replay")->required()->check(CLI::IsMember({"replay"}));
  sub.add_option("--config", a->config, "a TOML file with a [controller] table (name = \"gnmr\")")->required()->check(kPath);
  sub.add_option("--norms", a->norms, "CSV step,unit,grad_norm: every unit at every step 1..T")->required()->check(kPath);
  add_out(sub, a->out, "the decisions, CSV step,unit,gnmr,dgnmr,exceeds,lock,recovered")->required();
  add_json(sub, a->json, "print one JSON object (steps, units, recovered, exceeded, eligible, held)");
  return [a] {
    const GnmrOptions o = gnmr_replay_config(a->config);
    const GnmrReplayResult r = gnmr_replay(o, a->norms, a->out);
    const double rate = double(r.recovered) / double(r.steps * r.units);
    const double exceed = r.eligible ? double(r.exceeded) / double(r.eligible) : 0.0;
    if (a->json) {
      nlohmann::ordered_json j;
      j["steps"] = r.steps, j["units"] = r.units, j["recovered"] = r.recovered, j["recovery_rate"] = rate;
      j["exceeded"] = r.exceeded, j["eligible"] = r.eligible, j["exceedance_rate"] = exceed, j["held"] = r.held;
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("gnmr replay: {} steps × {} units; recovered {} unit-steps ({:.3f} %); exceeded {} of {} eligible "
                 "({:.3f} %); decisions in {}\n",
                 r.steps, r.units, r.recovered, 100 * rate, r.exceeded, r.eligible, 100 * exceed, a->out);
      for (auto& h : r.held) fmt::print("gnmr replay: {} holds a recovery slot to the end\n", h);
    }
    return 0;
  };
}

}  // namespace mantis::cli
