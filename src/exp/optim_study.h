// optim_study — the optimizer study of issue 11 (experiments/optim/): every optimizer trains the
// shipped model shapes from the same initialisation and data order with the same recipe, and
// Gefen's 8-bit momentum is measured against an FP32 shadow.
//
// Cells (index order): for each model (a training TOML), for each optimizer, then each variant,
// for each of its seeds: one training run of that model with that optimizer. The run is the
// model's configuration with the study's [train] overrides (steps, ctx, batch, warmup, val_every,
// val_seqs), init_seed = seed = the cell's seed (same initial weights and data order for every
// optimizer), no checkpoints, and the model's lr / min_lr / warmup / grad_clip for every optimizer.
// The optimizer gets the study's shared [hyper] keys (beta1, beta2, eps, weight_decay) only where
// its registry entry lists the key (the cell records which were applied), then the variant's own
// keys. Each cell is a study.h cell (resume, --cell shards, merge). Its key: the semantics
// version, the model TOML's SHA-256, the overrides, the training and validation data's SHA-256s,
// the optimizer's name and options, the seed, the analysis settings.
//
// A cell's numbers: the validation-loss curve [(steps done, FP32 val loss)] at every val_every
// and after the last step; the training-loss curve; final validation loss and perplexity
// exp(loss); median step time (s; the Trainer's StepRecord::seconds, validation excluded);
// state_bytes (Optimizer::state_bytes after the run), parameter count, bytes per parameter;
// peak resident memory (getrusage ru_maxrss of the process that computed the cell: with
// isolate (the CLI default without --cell) each cell is a child process `mantis optim-study
// CONFIG --cell i`, so it is that cell's alone; in-process (tests, --in-process) it is the
// process's peak so far, and the cell says so in "rss_scope").
//
// Gefen analyses (cells whose optimizer is listed in [analysis] optimizers, every k steps), from
// the Trainer's step observer (the clipped gradients the optimizer saw and its state after the
// step); the optimizer's state must use Gefen's names: `<param>.idx` u8 [param shape],
// `<param>.mag` f32 [n/Q], `<param>.period` u64 scalar, global `codebook` f32 [256]
// (dequantised m_i = codebook[idx_i]·mag[⌊i/Q⌋], Q = n / numel(mag)); a tensor with `<param>.m`
// f32 instead is read as is.
//  (a) relative error per role: sqrt(Σ‖m_deq − m_fp32‖²) / sqrt(Σ‖m_fp32‖²) over the role's
//      tensors (binary64 sums in parameter order), at steps s with s mod k = 0 (0-based, after
//      step s). m_fp32: an FP32 shadow m ← fma(f32(1 − β1), g − m, m) from m = 0, the lerp form
//      of Gefen's non-fused path (papers.md §3 item 6), β1 = the study's beta1 (default 0.9).
//  (b) codebook distortion at steps s > 0 with s mod k = 0: the histogram of that step's
//      gradients (gefen_codebook.h add_to_gefen_histogram, each tensor with its period); the
//      weighted MSE Σ_j c_j·(x_j − nearest code)² / Σ_j c_j over the occupied bins' centres x_j
//      (nearest: ties to the lower code) of the step-0 codebook and of the codebook re-learned
//      on that histogram (learn_gefen_codebook; O(K·B²) per measurement).
//  (c) per tensor: its period, its state bytes; the P = 1 tensors' total state bytes and params.
//
// Merge: results.csv (a row per cell), curves.csv (step, val_loss_nats per cell), summary.csv (per
// model and optimizer or variant: seeds, mean final val loss with a 95 % Student-t interval and
// a bootstrap percentile interval over seeds — "single-seed" where there is one — and the
// perplexity exp(mean loss) with exp of the t interval, mean state bytes per parameter, median
// step time, peak RSS), gefen_error.csv, gefen_distortion.csv, gefen_periods.csv (period_elements:
// the block length P in elements), results.json (every cell and the summary), manifest.json: one
// result set (study.h). Losses are in nats, their columns named so (final_val_loss_nats, t_lo_nats, …).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "nn/grad.h"
#include "optim/optimizer.h"
#include "optim/gefen_codebook.h"
#include "exp/study.h"  // CellChoice

namespace mantis {

struct OptimStudyVariant {
  std::string name, optimizer;
  std::map<std::string, OptionValue> options;  // added to the optimizer's keys
};

// The study's TOML (experiments/optim/*.toml):
//   out = "DIR"; models = ["experiments/train-gpt2-bytes.toml", …]; optimizers = ["adamw", …];
//   seeds = [1, 2, 3]
//   [seeds_for]  NAME = [1]            (per optimizer or variant: replaces `seeds`)
//   [train]      steps, ctx, batch, warmup, val_every, val_seqs (overrides; absent: the model's)
//   [hyper]      beta1, beta2, eps, weight_decay (shared; given to optimizers that list the key)
//   [analysis]   optimizers = ["gefen"], every = k (≥ 1)
//   [[variant]]  name, optimizer, options = { key = value, … }
// Unknown keys, unregistered optimizers, a variant key its optimizer does not list: InputError.
struct OptimStudyConfig {
  std::string out, path, text;
  std::vector<std::string> models, optimizers;
  std::vector<uint64_t> seeds{1};
  std::map<std::string, std::vector<uint64_t>> seeds_for;
  std::map<std::string, int64_t> train;  // the overrides given
  std::map<std::string, OptionValue> hyper;
  std::vector<OptimStudyVariant> variants;
  std::vector<std::string> analyse;
  uint64_t analysis_every = 0;
};
OptimStudyConfig read_optim_study(const std::string& path);
OptimStudyConfig optim_study_from_toml(const std::string& text, const std::string& path);

struct OptimStudyCell {
  size_t model = 0;
  std::string model_name;   // the TOML's stem without "train-": "gpt2-bytes"
  std::string optimizer;    // the registry's name
  std::string variant;      // "" or the variant's name
  uint64_t seed = 1;
  std::string label() const { return variant.empty() ? optimizer : variant; }
  std::string name() const;  // "gpt2-bytes gefen seed=1"
};
std::vector<OptimStudyCell> optim_study_cells(const OptimStudyConfig& c);

struct OptimStudyOptions : CellChoice {  // a --cell runs in this process
  std::string config;   // the TOML file
  std::string out;      // overrides the config's out
  // Without `cell`: each cell in a child process (exe optim-study … --cell i). With `cell`: this
  // process computes only that cell, so its peak RSS is the cell's ("rss_scope": "cell process").
  bool isolate = true;
  std::string exe = "/proc/self/exe";
  int threads = 0;      // passed to the children (0: their default)
  ProgressMode progress = ProgressMode::automatic;
  std::FILE* log = stdout;
};
struct OptimStudyResult {
  std::string out;
  size_t cells = 0, computed = 0;
  bool merged = false;
  std::vector<size_t> missing;
};
OptimStudyResult run_optim_study(const OptimStudyOptions& o);
// What run_optim_study checks before its first cell (the configuration with every cell's training
// configuration and optimizer, the output directory, the cell choice, the training and validation
// data of every model whose cells the run touches), checked by the same code; nothing is written
// (--emit-slurm calls it).
void validate_optim_study(const OptimStudyOptions& o);

// ---------------------------------------------------------------- pieces (tested on their own)
// t_{0.975, df}: the Student-t quantile, by bisection on the CDF (Simpson's rule on the density).
double student_t_975(int df);
struct SeedInterval {
  size_t n = 0;
  double mean = 0, t_lo = 0, t_hi = 0, boot_lo = 0, boot_hi = 0;  // intervals NaN when n < 2
};
// Mean of per-seed values with the 95 % t interval mean ± t·s/√n (s: sample standard deviation)
// and the bootstrap percentile interval over seeds (bootstrap.h, 2000 resamples, seed 0).
SeedInterval seed_interval(std::span<const double> v);

// Σ c_j (x_j − nearest code)² / Σ c_j over the occupied bins of a 4096-bin Gefen histogram.
double codebook_distortion(std::span<const int64_t> counts, std::span<const float> codes);

// The Gefen analyses of one run (see the header comment), fed by the Trainer's observer.
class GefenProbe {
 public:
  GefenProbe(const ParamSet& params, double beta1, uint64_t every);
  void observe(uint64_t step, const GradMap<float>& g, const Optimizer& opt);
  nlohmann::ordered_json json() const;

  struct Error { uint64_t step; std::string role; double rel_error; };
  struct Distortion { uint64_t step; uint64_t bins; double step0, relearned; };
  std::vector<Error> errors;
  std::vector<Distortion> distortions;
  std::vector<std::pair<std::string, uint64_t>> periods;      // per tensor (state order)
  std::vector<std::pair<std::string, uint64_t>> state_bytes;  // per tensor: Σ its state tensors
  uint64_t p1_bytes = 0, p1_params = 0;

 private:
  ParamSet params_;
  float w_;  // f32(1 − β1)
  uint64_t every_;
  std::map<std::string, std::vector<float>> shadow_;
  std::vector<float> codebook0_;
};

}  // namespace mantis
