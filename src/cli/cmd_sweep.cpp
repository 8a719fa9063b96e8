// mantis sweep CONFIG.toml — the μ-sweep (exp/mu_sweep.h).
#include <cstdio>

#include "common.h"
#include "exp/mu_sweep.h"

namespace mantis::cli {

Runner setup_sweep(CLI::App& sub) {
  auto o = std::make_shared<MuSweepOptions>();
  sub.description(
      "mantissa-width sweep: relative error of strictly accumulated dot products and GEMMs in ps<μ> "
      "against exact / binary64 references (see experiments/mu-sweep.toml)");
  sub.add_option("config", o->config, "TOML configuration")->required()->check(kPath);
  add_out(sub, o->out, "write DIR/results.csv, results.json and manifest.json (one result set)");
  add_threads(sub);
  add_progress(sub);
  return [o] {
    MuSweepOptions m = *o;
    m.progress = shared().progress_mode();
    const MuSweepResult r = run_mu_sweep(m);
    std::fwrite(r.report.data(), 1, r.report.size(), stdout);
    return 0;
  };
}

}  // namespace mantis::cli
