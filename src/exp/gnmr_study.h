// gnmr_study — the GNMR studies (experiments/gnmr/): training runs that differ only in their
// saved-activation / GEMM recipe and [controller], on the same initialisation and data order.
//
// The study's TOML:
//   out = "DIR"; models = ["experiments/train-llama-bytes.toml", …]; seeds = [1, 2, 3]
//   [train]   steps, ctx, batch, warmup, val_every, val_seqs (overrides; absent: the model's)
//   also_validate = ["validation", …]   data specs (io/dataset.h) the final model is also
//             validated on, as the run's own validation (val_seqs windows, FP32): a fine-tuned
//             model on the corpora it was first trained on
//   [[arm]]   name = "static4", config = """[activation_quant]\nbits = 4\n"""  — TOML appended to
//             the model's training configuration (any of its tables the model's file lacks:
//             [activation_quant], [controller], [precision]); seeds = [...] replaces `seeds`.
// Cells (index order): for each model, for each arm, for each of its seeds: one run with
// init_seed = seed = lora_seed = the cell's seed (the same initial weights, adapters and data
// order in every arm), no checkpoints. A cell is a study.h cell (resume, --cell shards, merge); its key: the semantics
// version, the SHA-256 of the combined configuration text, the overrides, the data's SHA-256s and
// the seed (and the also_validate data's SHA-256s when given).
//
// A cell's numbers: the validation curve [(steps done, FP32 val loss)], the training losses,
// the final validation loss and perplexity, the median step time (validation excluded); with a
// [controller]: the units, the unit-steps recovered, the unit-steps exceeding and the eligible
// unit-steps (after the controller's warm-up; GNMR only), and every step's recovered unit ids.
//
// Merge (one result set, study.h): results.csv (a row per cell), curves.csv, recoveries.csv
// (model, arm, seed, step, unit: one row per recovered unit-step — the heatmap's data),
// summary.csv (per model and arm: seeds, mean final val loss with the 95 % Student-t and
// bootstrap intervals over seeds, perplexity, mean recovery rate = recovered / (steps·units),
// mean exceedance rate = exceeded / eligible, mean loss spikes — steps t ≥ 11 whose training loss
// exceeds 1.1 × the mean of the 10 before — and the median step time; per also_validate spec
// the mean loss with its t interval, columns val_loss_nats[SPEC], t_lo_nats[SPEC],
// t_hi_nats[SPEC]; results.csv: val_loss_nats[SPEC] per cell), results.json, manifest.json. Losses
// are in nats, their columns named so (study.h's convention: final_val_loss_nats, t_lo_nats, …).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/progress.h"
#include "exp/study.h"  // CellChoice

namespace mantis {

struct GnmrStudyArm {
  std::string name, config;
  std::vector<uint64_t> seeds;  // empty: the study's
};

struct GnmrStudyConfig {
  std::string out, path, text;
  std::vector<std::string> models;
  std::vector<uint64_t> seeds{1};
  std::vector<std::pair<std::string, double>> train;  // the overrides given
  std::vector<GnmrStudyArm> arms;
  std::vector<std::string> also_validate;  // data specs the final model is also validated on
};
GnmrStudyConfig gnmr_study_from_toml(const std::string& text, const std::string& path);
GnmrStudyConfig read_gnmr_study(const std::string& path);

struct GnmrStudyCell {
  size_t model = 0, arm = 0;
  std::string model_name, arm_name;
  uint64_t seed = 1;
  std::string name() const;  // "llama-bytes static4 seed=1"
};
std::vector<GnmrStudyCell> gnmr_study_cells(const GnmrStudyConfig& c);

struct GnmrStudyOptions : CellChoice {
  std::string config, out;  // out overrides the config's
  ProgressMode progress = ProgressMode::automatic;
  std::FILE* log = stdout;
};
struct GnmrStudyResult {
  std::string out;
  size_t cells = 0, computed = 0;
  bool merged = false;
  std::vector<size_t> missing;
};
// Every arm's configuration is parsed (and its controller built) before any cell runs.
GnmrStudyResult run_gnmr_study(const GnmrStudyOptions& o);
// What run_gnmr_study checks before its first cell (the study, every (model, arm) training
// configuration and its controller, the output directory, the cell choice, the data of every
// model whose cells the run touches and the also_validate data), checked by the same code;
// nothing is written (--emit-slurm calls it).
void validate_gnmr_study(const GnmrStudyOptions& o);

}  // namespace mantis
