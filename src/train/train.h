// train — the training loop: configuration, data order, steps, validation, checkpoints, logs.
//
// One step s (0-based) = accum × batch sequences of ctx tokens, each with its next-token targets:
//   sequence k (k = s·accum·batch + i, counted over the whole run) starts at token
//   (Philox64(seed, stream 0x7a11, k) mod (n − ctx)) of the training tokens (n of them), so the
//   data order is a pure function of (seed, k) and resuming needs only k;
//   each sequence's gradient (backward.h, scale 1/(accum·batch·ctx)) is computed into its own
//   zeroed buffer — sequences run in parallel over OpenMP threads, each single-threaded — and
//   the buffers are summed in sequence order: bit-identical for any thread count;
//   its policy is the run's policy with every seed replaced by Philox64(seed, k) (policy.h
//   salted), so stochastic rounding differs between sequences and steps but not between runs;
//   global-norm clipping, then the optimizer at the schedule's learning rate (optim/optimizer.h).
// Loss reported for a step: the mean cross-entropy of its sequences (before the update).
// Validation: the FP32 (native) mean cross-entropy of val_seqs fixed windows of ctx+1 tokens of
// the validation data (dataset.h window_starts), every val_every steps and after the last step.
//
// Saved-activation quantisation (backward.h): a TrainController chooses each unit's path before
// every step (default: every unit quantised to [activation_quant] bits, or none when bits = 0)
// and observes each unit's gradient norm (L2 over the unit's parameters, before clipping) and
// activation statistics after the backward pass. A GNMR-style controller plugs in here.
//
// Output directory OUT:
//   config.toml            the configuration the run was started with
//   log.csv                step,loss,val_loss,lr,grad_norm,tokens,seconds (val_loss empty when not run)
//   units.csv              step,layer,unit,bits,grad_norm,act_rms,act_absmax,quant_rel_rms
//   checkpoint-<step>/     model.safetensors + config.json (checkpoint.h), optimizer.bin, trainer.json,
//                          manifest.json (each of those files' size and SHA-256, and its own SHA-256
//                          of the rest of it)
//   latest                 the name of the newest complete checkpoint directory
// Every file is written atomically; a checkpoint directory is built under a temporary name and
// renamed into place whole before `latest` names it. Temporaries of killed runs (a dead writer's
// PID in their names) are removed when the Trainer opens OUT.
// Resume (--resume OUT): the newest checkpoint, refused unless every file matches its manifest, its
// config hash equals the current config's, and every trainer.json field is in range (step at most
// the configured steps, optimizer steps = step, one log row per step, ...); a checkpoint without a
// manifest (older mantis) is refused, though load_model still reads its model. The run continues
// bit-identically (parameters, optimizer state, step, data position, logs). A non-finite loss or
// gradient norm, or an update that makes a parameter non-finite, stops the run with an InputError
// naming the step and the last good checkpoint, before anything of that step is written.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nn/backward.h"
#include "io/dataset.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "nn/policy.h"

namespace mantis {

struct TrainConfig {
  ModelConfig model;
  uint64_t init_seed = 1;
  std::string tokenizer = "bytes", train_data = "train", val_data = "validation";
  uint64_t steps = 100;
  int batch = 8, accum = 1;
  Schedule schedule;  // lr, min_lr, warmup (steps is set from `steps`)
  double grad_clip = 1.0;
  AdamWConfig adamw;
  uint64_t seed = 1;
  uint64_t val_every = 0;  // 0: only after the last step
  int val_seqs = 16;
  uint64_t checkpoint_every = 0;  // 0: only after the last step
  std::string policy = "native";  // policy_from_spec
  SavedQuant act_quant;           // bits 0: none
  std::string out;                // output directory (the CLI may override)
  std::string text, path;         // the TOML source and its path
  std::string hash() const;       // SHA-256 of `text`
};

// Parses the TOML form (experiments/train-*.toml); unknown tables or keys are InputErrors naming
// the key and the file.
TrainConfig train_config_from_toml(const std::string& text, const std::string& path);
TrainConfig load_train_config(const std::string& path);

struct UnitStep {
  int layer;
  Unit unit;
  SavedQuant path;
  double grad_norm;
  UnitActivation act;
};

class TrainController {
 public:
  virtual ~TrainController() = default;
  // Before step `step`: paths[l·kUnitCount + u] holds the default; change any.
  virtual void choose(uint64_t step, std::vector<SavedQuant>& paths) { (void)step, (void)paths; }
  // After the backward pass of `step`.
  virtual void observe(uint64_t step, std::span<const UnitStep> units) { (void)step, (void)units; }
};

struct StepRecord {
  uint64_t step = 0;
  double loss = 0, val_loss = 0, lr = 0, grad_norm = 0;  // val_loss NaN when not run
  uint64_t tokens = 0;                                   // tokens processed so far
  double seconds = 0;                                    // wall time of the step
};

class Trainer {
 public:
  // Starts a run: initialises the model (init_model) and the optimizer, loads the data.
  Trainer(TrainConfig c, TrainController* controller = nullptr);
  // Restores the newest checkpoint of `dir` (latest); InputError on a config mismatch or a
  // corrupt or inconsistent checkpoint.
  void resume(const std::string& dir);

  StepRecord step();             // one optimisation step (validation not included)
  double validation_loss();      // FP32, the fixed windows
  void save_checkpoint();        // OUT/checkpoint-<step>, then OUT/latest; also the logs
  // Runs to the configured number of steps, validating and checkpointing as configured; calls
  // `progress` after every step.
  // `until` (0: the configured steps) stops earlier, as an interrupted run would.
  void run(const std::function<void(const StepRecord&)>& progress = {}, uint64_t until = 0);

  const Model& model() const { return model_; }
  const TrainConfig& config() const { return c_; }
  uint64_t next_step() const { return step_; }
  const std::vector<StepRecord>& log() const { return log_; }
  const Optimizer& optimizer() const { return *opt_; }
  // The data read (its sources and SHA-256s, for the run's manifest).
  const TokenData& train_data() const { return train_; }
  const TokenData& val_data() const { return val_; }

 private:
  void write_logs() const;
  TrainConfig c_;
  TrainController* controller_;
  TrainController default_controller_;
  Model model_;
  std::unique_ptr<Optimizer> opt_;
  Policy policy_;
  TokenData train_, val_;
  std::vector<size_t> val_starts_;
  uint64_t step_ = 0;
  std::vector<StepRecord> log_;
  std::vector<std::string> unit_rows_;  // units.csv lines
};

}  // namespace mantis
