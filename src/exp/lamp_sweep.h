// lamp_sweep — LAMP's study: KL / flips / perplexity / recompute rate over μ × rule × τ ×
// {rule, random control}, beside uniform ps<μ> and FP32, on the same windows (experiments/lamp/).
//
// Cells (index order): 0 = FP32 (native); then for each μ: uniform ps<μ> (LAMP's site, nothing
// recomputed), then strict τ × {rule, random}, then relaxed τ × {rule, random}. Each cell is
// independent: its result is DIR/cells/<index>.json with the key of everything it depends on
// (study.h), so a sweep resumes where it stopped and never reuses a cell of another configuration;
// one cell can run alone (for separate processes or machines), and the merge (after a full run,
// or merge_only) checks every cell and writes DIR/results.csv, DIR/results.json and
// DIR/manifest.json as one result set. A merge with cells missing fails unless allow_partial
// (the manifest then says partial).
// Per cell and window: KL, positions, flips, recomputed scores, non-finite positions; per layer:
// recomputed and causal scores; per site and layer: range health (forward.h). The merge adds 95 %
// bootstrap intervals over windows (bootstrap.h) for KL and for KL(uniform ps<μ>) / KL(cell).
// Per cell, over every position of every window and every layer: mean KL(p_FP32 ‖ p_cell), top-1
// flip rate, perplexity of both, max |logit error|, recompute rate = recomputed scores / causal
// scores (Σ over layers and windows) — equal to the recomputed share of the score GEMM's
// FLOPs (each recomputed score is one HS-long dot product).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "nn/forward.h"  // ForwardFn

#include "core/progress.h"
#include "exp/study.h"  // CellChoice

namespace mantis {

// The sweep's TOML configuration (experiments/lamp/*.toml).
struct LampSweepConfig {
  std::string out, model, data = "test", tokenizer, recompute = "fp32";
  int seqs = 100, ctx = 0;  // ctx 0: the model's context
  std::vector<int> mu{4, 7, 10, 13, 16, 19, 22};
  std::vector<double> strict_tau{1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1, 2, 5, 10, 20, 50};
  std::vector<double> relaxed_tau{0.9, 0.3, 0.09, 0.03, 9e-3, 3e-3, 9e-4, 3e-4, 9e-5};
  bool random_control = true, length_scaling = false;
  uint64_t seed = 0;
  std::string text, path;  // the file as read
};
LampSweepConfig read_lamp_sweep(const std::string& path);

// The cells' names, in index order ("fp32", "uniform ps4", "ps4 strict tau=0.05 random", …).
std::vector<std::string> lamp_sweep_cells(const LampSweepConfig& c);

struct LampSweepOptions : CellChoice {  // which cells (a --cell, a --shard: merge later)
  std::string config;      // the TOML file
  std::string out;         // overrides the config's out
  ProgressMode progress = ProgressMode::automatic;
  std::FILE* log = stdout;  // a line per cell (where no bar is shown) and the merge's summary
  std::string device = "cpu";  // where the forward passes run: part of every cell's key when not the CPU
  ForwardFn forward;           // empty: the CPU; the GPU's: cuda/forward.h gpu::forward_fn
};
struct LampSweepResult {
  std::string out;
  size_t cells = 0, computed = 0;
  bool merged = false;
  std::vector<size_t> missing;
};
// InputError (before any cell runs) for a bad configuration, model, data or stored cell.
LampSweepResult run_lamp_sweep(const LampSweepOptions& o);
// What run_lamp_sweep checks before its first cell (the configuration, the output directory, the
// cell choice, the model, tokenizer, data and windows, every cell's policy against the model),
// checked by the same code; nothing is written (--emit-slurm calls it).
void validate_lamp_sweep(const LampSweepOptions& o);

}  // namespace mantis
