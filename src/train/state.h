// state — what a checkpoint directory holds of a run besides the model (io/checkpoint.h), how it
// is written and how it is verified on resume:
//   trainer.json   step, sequences done, the configuration's SHA-256, the optimizer (name, steps,
//                  state bytes, optimizer.bin's SHA-256 and its index of tensors), the data rule,
//                  every log row (numbers as round-tripping decimals; [step, loss, val_loss, lr,
//                  grad_norm, tokens, seconds, state_bytes], older checkpoints' rows without
//                  state_bytes still read, as 0 = not recorded), every units.csv row and, for a
//                  run with a [controller], its state (train/controller.h)
//   optimizer.bin  the optimizer's state tensors' bytes back to back, in state() order; the index
//                  in trainer.json gives each {name, dtype, shape, values (its element count)}
//                  ("format": 2). Format 1 (no "format" key; mantis before typed state): every
//                  tensor binary32, {name, values} only, its shape that of the optimizer's tensor
//                  of that name
//   manifest.json  each of those files' and the model files' size and SHA-256, and its own
//                  SHA-256 of the rest of it — so no file can change unnoticed
// OUT/latest names the newest complete checkpoint directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/optimizer.h"

namespace mantis {

struct StepRecord {
  uint64_t step = 0;
  double loss = 0, val_loss = 0, lr = 0, grad_norm = 0;  // val_loss NaN when not run
  uint64_t tokens = 0;                                   // tokens processed so far
  double seconds = 0;                                    // wall time of the step
  uint64_t state_bytes = 0;  // the optimizer's state_bytes() after the step; 0: not recorded (older checkpoints)
};

// A run's progress as a checkpoint records it.
struct TrainerState {
  uint64_t step = 0;  // steps done
  std::string optimizer;  // its name
  uint64_t optimizer_steps = 0, state_bytes = 0;
  std::vector<StateTensor> optimizer_state;
  std::vector<StepRecord> log;     // one row per step
  std::vector<std::string> units;  // units.csv rows, units_per_step per step
  nlohmann::json controller;       // the controller's state (train/controller.h); null: none
  bool adapters = false;           // read: the checkpoint holds adapters.safetensors (verified)
};

// What the run's configuration fixes of every checkpoint it writes (checked when one is read).
struct RunIdentity {
  std::string config_sha256, config_path;
  uint64_t steps = 0, sequences_per_step = 0, ctx = 0, units_per_step = 0, seed = 0;
};

// Writes optimizer.bin and trainer.json of `s` into DIR, then DIR/manifest.json over them and
// the model files save_model wrote there before (and adapters.safetensors when DIR holds one: a
// LoRA run's adapters); each file atomically.
void write_trainer_state(const std::string& dir, const TrainerState& s, const RunIdentity& run);
// Reads checkpoint CK, whose name says step `at`: every file verified against the manifest
// (a checkpoint without one is refused), every trainer.json field range-checked against `run`;
// `opt` is the optimizer expected (its name; format 1's shapes). One-line InputErrors naming the
// file. Does not read the model.
TrainerState read_trainer_state(const std::string& ck, uint64_t at, const RunIdentity& run, const Optimizer& opt);

// The checkpoint OUT/latest names (surrounding whitespace ignored), or nothing when there is none.
std::optional<std::string> latest_checkpoint(const std::string& out);
// A killed run's temporaries: in OUT and in each checkpoint directory (older layouts wrote there).
void remove_stale(const std::string& out);

}  // namespace mantis
