// mantis lamp sweep CONFIG.toml — LAMP's study (exp/lamp_sweep.h).
#include <fmt/format.h>

#include "common.h"
#include "exp/lamp_sweep.h"

namespace mantis::cli {

namespace {
struct LampArgs {
  std::string action;
  LampSweepOptions sweep;
  bool list = false;
  DeviceArgs device;
  SlurmArgs slurm;
};
}  // namespace

Runner setup_lamp(CLI::App& sub) {
  auto a = std::make_shared<LampArgs>();
  sub.description(
      "LAMP study: `mantis lamp sweep CONFIG.toml` runs FP32, uniform ps<μ> and LAMP (strict / relaxed τ, with and "
      "without the random control) on the same held-out windows; resumable cells, CSV + JSON + manifest "
      "(experiments/lamp/)");
  LampSweepOptions& o = a->sweep;
  sub.add_option("action", a->action, "sweep")->required()->check(CLI::IsMember({"sweep"}));
  sub.add_option("config", o.config, "sweep configuration (TOML)")->required()->check(kPath);
  sub.add_flag("--cells", a->list, "list the cells (index, name) and exit");
  add_cell_choice(sub, o);
  add_slurm(sub, a->slurm);
  add_out(sub, o.out, "output directory (overrides the config's out)");
  add_figures(sub);
  add_device(sub, a->device);
  add_threads(sub);
  add_progress(sub);
  return [a] {
    if (a->list) {
      const auto names = lamp_sweep_cells(read_lamp_sweep(a->sweep.config));
      for (size_t i = 0; i < names.size(); ++i) fmt::print("{}\t{}\n", i, names[i]);
      return 0;
    }
    LampSweepOptions o = a->sweep;
    o.progress = shared().progress_mode();
    o.device = a->device.device == "cpu" ? "cpu" : a->device.device + "/" + a->device.attention;
    if (!a->slurm.emit.empty()) return emit_slurm(a->slurm, o, [&] { validate_lamp_sweep(o); });
    o.forward = device_forward(a->device);
    const LampSweepResult r = run_lamp_sweep(o);
    if (r.merged) report_figures(r.out);
    return 0;
  };
}

}  // namespace mantis::cli
