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
//   global-norm clipping (optim/clip.h), then the optimizer ([optimizer] name, optim/optimizer.h)
//   at the schedule's learning rate (optim/schedule.h).
// Loss reported for a step: the mean cross-entropy of its sequences (before the update).
// Validation: the FP32 (native) mean cross-entropy of val_seqs fixed windows of ctx+1 tokens of
// the validation data (dataset.h window_starts), every val_every steps and after the last step.
//
// Saved-activation quantisation (backward.h): a TrainController chooses each unit's path before
// every step (default: every unit quantised to [activation_quant] bits, or none when bits = 0)
// and observes each unit's gradient norm (L2 over the unit's parameters, before clipping) and
// activation statistics after the backward pass. The configuration's [controller] (routing.h)
// is used unless the caller passes one; its state is part of every checkpoint.
//
// Output directory OUT:
//   config.toml            the configuration the run was started with
//   log.csv                step,loss_nats,val_loss_nats,lr,grad_norm,tokens,seconds,state_bytes (the
//                          mean cross-entropies in nats; val_loss_nats empty when not run;
//                          state_bytes: the optimizer's after the step, empty for rows resumed
//                          from a checkpoint that did not record it)
//   units.csv              step,layer,unit,bits,grad_norm,act_rms,act_absmax,quant_rel_rms (bits: k, 0 when
//                          exact, or the scheme's name)
//   checkpoint-<step>/     model.safetensors + config.json (checkpoint.h), adapters.safetensors ([lora]:
//                          the adapters, metadata lora_rank, lora_alpha), optimizer.bin (the
//                          optimizer's state tensors, indexed in trainer.json with each one's dtype
//                          and shape), trainer.json, manifest.json (each of those files' size and
//                          SHA-256, and its own SHA-256 of the rest of it)
//   controller.csv, recovery.csv   with a [controller] (routing.h)
//   latest                 the name of the newest complete checkpoint directory
//   merged/                a [lora] run's final model with its adapters merged (lora.h merge_lora),
//                          written after the last step, for anything that reads a checkpoint
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

#include "io/dataset.h"
#include "nn/backward.h"
#include "nn/model.h"
#include "nn/policy.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/config.h"
#include "train/controller.h"
#include "train/state.h"

namespace mantis {

class Trainer {
 public:
  // Starts a run: the model (init_model, or the [model] init checkpoint as loaded), a fresh
  // optimizer, the data.
  Trainer(TrainConfig c, TrainController* controller = nullptr);
  // Restores the newest checkpoint of `dir` (latest); InputError on a config mismatch or a
  // corrupt or inconsistent checkpoint.
  void resume(const std::string& dir);

  StepRecord step();             // one optimisation step (validation not included)
  double validation_loss();      // FP32, the fixed windows
  // The same measure on other data (a data spec, io/dataset.h: val_seqs windows of ctx + 1
  // tokens spread over it): a fine-tuned model on the corpora it was first trained on.
  double validation_loss_on(const std::string& spec) const;
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
  const TrainController& controller() const { return *controller_; }
  // Called at the end of every step() with its record (val_loss not yet set), the gradients as
  // the optimizer saw them (after clipping) and the optimizer after its update: for analyses
  // that watch training (exp/optim_study.h) without changing it.
  using StepObserver = std::function<void(const StepRecord&, const GradMap<float>&, const Optimizer&)>;
  void set_observer(StepObserver f) { observer_ = std::move(f); }
  // The data read (its sources and SHA-256s, for the run's manifest).
  const TokenData& train_data() const { return train_; }
  const TokenData& val_data() const { return val_; }

 private:
  RunIdentity identity() const;  // what every checkpoint of this run must match
  double mean_loss(const std::vector<uint32_t>& tokens, const std::vector<size_t>& starts) const;
  void write_logs() const;
  // One forward and backward pass of this step's sequences under `paths`: the summed gradient in
  // seq_grads_[0], the per-unit activation statistics in acts ([sequence][unit]); the mean loss.
  double gradient_pass(const std::vector<UnitPath>& paths, std::vector<std::vector<UnitActivation>>& acts);
  TrainConfig c_;
  TrainController* controller_;
  StepObserver observer_;
  TrainController default_controller_;
  std::unique_ptr<TrainController> owned_;  // the [controller] of the configuration
  Model model_;
  std::unique_ptr<Optimizer> opt_;
  Policy policy_;
  TokenData train_, val_;
  std::vector<size_t> val_starts_;
  uint64_t step_ = 0;
  std::vector<StepRecord> log_;
  std::vector<std::string> unit_rows_;  // units.csv lines
  std::vector<GradMap<float>> seq_grads_;  // [batch·accum] per-sequence gradients (step's scratch)
  std::vector<std::string> trained_;       // what the optimizer updates: the parameters, or the adapters
};

}  // namespace mantis
