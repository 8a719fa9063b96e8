// mantis optim-study CONFIG.toml — the optimizer study of issue 11 (exp/optim_study.h).
// Without --cell every cell runs as a child process of this binary (so its peak RSS is its own)
// unless --in-process; with --cell i only that cell runs, here.
#include <fmt/format.h>

#include "common.h"
#include "exp/optim_study.h"

namespace mantis::cli {

namespace {
struct OptimStudyArgs {
  OptimStudyOptions study;
  bool list = false, in_process = false;
  SlurmArgs slurm;
};
}  // namespace

Runner setup_optim_study(CLI::App& sub) {
  auto a = std::make_shared<OptimStudyArgs>();
  sub.description(
      "optimizer study: each optimizer trains the shipped model shapes from the same initialisation and data "
      "order; validation curves, state bytes, step time, peak RSS, Gefen's momentum error and codebook "
      "distortion; resumable cells merged into one result set (experiments/optim/)");
  OptimStudyOptions& o = a->study;
  sub.add_option("config", o.config, "study configuration (TOML)")->required()->check(kPath);
  sub.add_flag("--cells", a->list, "list the cells (index, name) and exit");
  add_cell_choice(sub, o);  // --cell: that cell in this process
  add_slurm(sub, a->slurm);
  sub.add_flag("--in-process", a->in_process,
               "run every cell in this process (peak RSS is then the process's, not the cell's)");
  add_out(sub, o.out, "output directory (overrides the config's out)");
  add_figures(sub);
  add_threads(sub);
  add_progress(sub);
  return [a] {
    if (a->list) {
      const auto cells = optim_study_cells(read_optim_study(a->study.config));
      for (size_t i = 0; i < cells.size(); ++i) fmt::print("{}\t{}\n", i, cells[i].name());
      return 0;
    }
    OptimStudyOptions o = a->study;
    o.isolate = !a->in_process;
    o.threads = shared().threads;
    o.progress = shared().progress_mode();
    if (!a->slurm.emit.empty()) return emit_slurm(a->slurm, o, [&] { validate_optim_study(o); });
    const OptimStudyResult r = run_optim_study(o);
    if (r.merged) report_figures(r.out);
    return 0;
  };
}

}  // namespace mantis::cli
