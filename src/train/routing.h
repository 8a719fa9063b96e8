// routing — the controllers a training configuration names in its [controller] table: which
// units (nn/site.h: each layer's qkv, attention output, fc / gate-up, down projection; id
// "layer.<l>.<site>") run the recovery path at each step. The low-cost path is the run's own
// ([activation_quant], [precision]); the recovery path of a unit is
//   saved     [controller.recover] bits / block / rounding / seed / scheme (as [activation_quant];
//             none given: the exact activation), and
//   GEMMs     [controller.recover] policy = SPEC: that policy's entries in force for the unit's
//             site at its layer (forward, dx, dw) replace the run's there (train/controller.h).
// Controllers (name):
//   gnmr      train/gnmr.h on the units' gradient norms (before clipping); every knob there.
//   random    max_recover units drawn uniformly — the control at the same budget: a Fisher–Yates
//             prefix driven by Philox64(seed, 0x6a4d, b·U + i), b = ⌊(step − 1) / hold⌋ + 1, so the same
//             seed gives the same draws at any thread count. hold (default 1: a new draw every
//             step) keeps each draw for `hold` steps: hold = T_lock is GNMR's lock length, and a
//             hold of the whole run is a fixed random subset (no path switching at all).
//   static    nobody recovers (the low path throughout, with this controller's logs).
//   oracle    the max_recover units whose saved activation the low path damages most at this
//             step — relative RMS error sqrt(Σ(x̃−x)²/Σx²) over the step's sequences, measured for
//             recovered units too (UnitPath::low) — ties by id, units with no damage never. It
//             knows step t's damage, not step t+1's where the recovery acts: one step late, as
//             every controller here is unless it re-runs the step (rerun below).
// Finer units: unit_block = B > 0 (any controller; default 0: a unit per projection) makes every
// block of B consecutive columns of a projection's saved activation a unit of its own, id
// "layer.<l>.<site>.b<k>" (k = 0, 1, …; the last block may be narrower): its input features, so its
// norm is the L2 norm of those columns of the projection's weight gradients (biases excluded) and
// recovering it gives those columns of dW the recovery path's saved activation and leaves every
// other column bit for bit as it was (nn/backward.h SavedBlocks). With B = the head size, attn.proj's
// blocks are its heads (its saved activation is the heads' outputs side by side). The oracle's
// damage is then the block's own relative RMS error. Block units recover saved activations only:
// a [controller.recover] policy (whole GEMMs) is an InputError with them, and so is [lora] (an
// adapter's B gradient reads every input column).
// A unit selected at step t (1-based, = the trainer's step + 1) runs the recovery path at t + 1.
// rerun = true (any controller; default false): step t is also re-run at once — its forward and
// backward again on the same sequences with the same random words — with the units selected at t
// that ran the low path there switched to the recovery path, and the optimizer takes the re-run's
// gradients (controller.h rerun). The decisions are those of the first pass (its norms are the
// ones observed, logged and replayed), so a re-run changes the parameters, never the controller's
// arithmetic; it costs one more forward and backward on every step that selects a new unit.
// Logs (written with the trainer's):
//   controller.csv  step,unit,gnmr,dgnmr,exceeds,lock,recovered — `mantis gnmr replay`'s format,
//                   so a run's decisions can be replayed from its units.csv norms (scores empty
//                   for random and static)
//   norms.csv       step,unit,grad_norm (%.17g): replay's input, so `mantis gnmr replay --config
//                   OUT/config.toml --norms OUT/norms.csv` reproduces a gnmr run's controller.csv
//   recovery.csv    step,recovered,exceeded,units,recovered_units (ids separated by spaces)
// The state (the GNMR state and the log rows) is saved in every checkpoint and restored on resume.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/backward.h"
#include "nn/model.h"
#include "train/controller.h"
#include "train/gnmr.h"

namespace mantis {

struct ControllerConfig {
  std::string name;        // empty: no controller; gnmr | random | static | oracle
  GnmrOptions gnmr;        // gnmr: every key; random, oracle: max_recover
  uint64_t seed = 1;       // random
  uint64_t hold = 1;       // random: steps each draw is kept (≥ 1)
  bool rerun = false;      // re-run step t with the units selected at t recovered
  int unit_block = 0;      // > 0: a unit per block of this many saved-activation columns
  SavedQuant recover;      // the recovery path's saved activation (default: exact)
  std::string recover_policy;  // the recovery path's GEMM entries (empty: the run's)
};

inline constexpr const char* kControllerNames = "gnmr, random, static, oracle";

// The controller of `c` for model `m`; InputError if the recovery policy does not fit the model.
std::unique_ptr<TrainController> make_controller(const ControllerConfig& c, const ModelConfig& m);

// The unit ids in trainer order (layer-major: l·kUnitCount + unit; with unit_block > 0 each
// projection's blocks in column order).
std::vector<std::string> unit_ids(const ModelConfig& m, int unit_block = 0);

}  // namespace mantis
