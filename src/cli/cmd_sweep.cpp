// mantis sweep CONFIG.toml — the policy sweep (exp/policy_sweep.h) when the configuration lists
// `sites`, else the μ-sweep (exp/mu_sweep.h), which is also `mantis mu-sweep`.
#include <fmt/format.h>

#include <cstdio>

#include "common.h"
#include "exp/mu_sweep.h"
#include "exp/policy_sweep.h"

namespace mantis::cli {

namespace {

struct SweepArgs {
  MuSweepOptions mu;          // config and out; the cell choice is policy's (for either sweep)
  PolicySweepOptions policy;
  bool list = false;
  DeviceArgs device;
  SlurmArgs slurm;
};

int run_mu(const SweepArgs& a) {
  if (a.device.device != "cpu") throw InputError("the μ-sweep runs on the CPU (--device cuda is for policy sweeps)");
  if (a.list) {
    const auto names = mu_sweep_cells(read_mu_sweep(a.mu.config));
    for (size_t i = 0; i < names.size(); ++i) fmt::print("{}\t{}\n", i, names[i]);
    return 0;
  }
  MuSweepOptions m = a.mu;
  static_cast<CellChoice&>(m) = a.policy;
  m.progress = shared().progress_mode();
  if (!a.slurm.emit.empty()) {
    if (a.mu.out.empty()) throw InputError("--emit-slurm needs --out DIR (where the shards' cells meet)");
    return emit_slurm(a.slurm, m, [&] { validate_mu_sweep(m); });
  }
  const MuSweepResult r = run_mu_sweep(m);
  std::fwrite(r.report.data(), 1, r.report.size(), stdout);
  if (r.merged) report_figures(m.out);
  return 0;
}

int run_policy(const SweepArgs& a) {
  if (a.list) {
    const auto names = policy_sweep_cells(read_policy_sweep(a.mu.config));
    for (size_t i = 0; i < names.size(); ++i) fmt::print("{}\t{}\n", i, names[i]);
    return 0;
  }
  PolicySweepOptions o = a.policy;
  o.config = a.mu.config, o.out = a.mu.out;
  o.progress = shared().progress_mode();
  o.device = a.device.device == "cpu" ? "cpu" : a.device.device + "/" + a.device.attention;
  if (!a.slurm.emit.empty()) return emit_slurm(a.slurm, o, [&] { validate_policy_sweep(o); });
  o.forward = device_forward(a.device);
  const PolicySweepResult r = run_policy_sweep(o);
  if (r.merged) report_figures(r.out);
  return 0;
}

void add_mu_options(CLI::App& sub, SweepArgs& a) {
  sub.add_option("config", a.mu.config, "TOML configuration")->required()->check(kPath);
  add_out(sub, a.mu.out, "write DIR/results.csv, results.json and manifest.json (one result set; the cells in DIR/cells)");
  add_figures(sub);
  add_threads(sub);
  add_progress(sub);
  sub.add_flag("--cells", a.list, "list the cells (index, name) and exit");
  add_cell_choice(sub, a.policy);
  add_slurm(sub, a.slurm);
}

}  // namespace

Runner setup_sweep(CLI::App& sub) {
  auto a = std::make_shared<SweepArgs>();
  sub.description(
      "policy sweep (a configuration with sites = [...]: a policy template and axes site × format or μ × rounding × "
      "accumulation × operand scheme, each combination a cell evaluated against FP32 on the same windows; resumable "
      "cells, shards, Slurm; src/exp/policy_sweep.h), or the μ-sweep of dot products and GEMMs (mu-sweep)");
  add_mu_options(sub, *a);
  add_device(sub, a->device);
  return [a] { return is_policy_sweep(a->mu.config) ? run_policy(*a) : run_mu(*a); };
}

Runner setup_mu_sweep(CLI::App& sub) {
  auto a = std::make_shared<SweepArgs>();
  sub.description(
      "mantissa-width sweep: relative error of strictly accumulated dot products and GEMMs in ps<μ> "
      "against exact / binary64 references (see experiments/mu-sweep.toml)");
  add_mu_options(sub, *a);
  return [a] {
    if (is_policy_sweep(a->mu.config))
      throw InputError(fmt::format("{} is a policy sweep (it lists sites): run it with `mantis sweep`", a->mu.config));
    return run_mu(*a);
  };
}

}  // namespace mantis::cli
