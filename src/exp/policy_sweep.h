// policy_sweep — the general policy sweep (`mantis sweep CONFIG` with `sites = [...]`): a policy
// template and axes — site × format (or μ: ps<μ>) × rounding × accumulation × operand scheme —
// each combination a cell that sets one site's entry of the template; every cell evaluated against
// FP32 on the same windows of real text, the FP32 logits of a window computed once per process and
// shared by every cell. The cells are the study driver's (study.h): keyed, resumable, one at a time
// (--cell), in shards (--shard k/N, Slurm) and merged into results.csv / results.json / manifest.json
// with 95 % bootstrap intervals of KL over windows (bootstrap.h).
//
// Configuration (TOML):
//   out, model, data = "test", tokenizer = "", seqs = 16, ctx = 0 (the model's)
//   template = "<policy TOML>"   the entries every cell starts from (default: native everywhere)
//   sites = ["attn.qk", …]       required: the site each cell sets (its every-layer entry)
//   formats = ["ps4", "bf16"]    and/or mu = [4, 7] (ps<μ>): the format of the cell
//   set = ["accumulator", "output"]  which fields take the format: accumulator (GEMM sites, with an
//                                     accumulation), output, input; nonlinearity sites use output / input
//   roundings = ["rne"]          the entry's rounding mode
//   accumulations = ["strict"]   GEMM sites, when "accumulator" is set
//   schemes = []                 GEMM sites: both operands through this scaled format (input_a / input_b)
//   seed = 0                     the entry's seed (stochastic rounding)
// Cell 0 is the template itself; then site-major, then format, rounding, accumulation, scheme.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "core/progress.h"
#include "exp/study.h"  // CellChoice
#include "nn/forward.h"  // ForwardFn

namespace mantis {

struct PolicySweepConfig {
  std::string out, model, data = "test", tokenizer, templ;
  int seqs = 16, ctx = 0;
  std::vector<std::string> sites, formats, set{"accumulator", "output"}, roundings{"rne"}, accumulations{"strict"},
      schemes;
  uint64_t seed = 0;
  std::string text, path;
};
// InputError naming the file and key for anything malformed (unknown sites, formats, …).
PolicySweepConfig read_policy_sweep(const std::string& path);
// Whether a sweep configuration is a policy sweep (it has `sites`), not the μ-sweep.
bool is_policy_sweep(const std::string& path);
std::vector<std::string> policy_sweep_cells(const PolicySweepConfig& c);

struct PolicySweepOptions : CellChoice {
  std::string config, out;
  ProgressMode progress = ProgressMode::automatic;
  std::FILE* log = stdout;
  std::string device = "cpu";
  ForwardFn forward;
};
struct PolicySweepResult {
  std::string out;
  size_t cells = 0, computed = 0;
  bool merged = false;
  std::vector<size_t> missing;
};
// InputError before any cell runs for a bad configuration, model, data, context or policy.
PolicySweepResult run_policy_sweep(const PolicySweepOptions& o);
// What run_policy_sweep checks before its first cell (the configuration, the output directory,
// the cell choice, the model, tokenizer, data and windows, every cell's policy compiled against the
// model), checked by the same code; nothing is written (--emit-slurm calls it).
void validate_policy_sweep(const PolicySweepOptions& o);

}  // namespace mantis
