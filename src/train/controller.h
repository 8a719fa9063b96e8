// controller — the hook that picks each unit's path before every training step and observes
// every unit after its backward pass (a GNMR-style controller plugs in here; train.h's loop calls
// it). Units are the projection operators of each layer (nn/backward.h Unit), layer-major:
// index l·kUnitCount + unit; each one's GEMM site is the site of the same name (nn/policy.h).
//
// A unit's path for one step:
//   saved        the quantisation of the activation its weight gradient uses (SavedQuant)
//   forward, dx, dw   optional replacements for the run policy's entries of the unit's GEMM at
//                its layer, forward and the two backward products. Each becomes that step's
//                layer entry (layer.<l>.<site>, its dx / dw sub-table), replacing whatever the
//                run's policy holds there as a whole — exactly as the same entry written in a
//                static policy file would (a test checks it bit for bit). Seeds are salted per
//                sequence as every policy's are (train.h).
// The loop checks every path before the step runs (InputError naming the step and the unit).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "nn/backward.h"
#include "nn/policy.h"

namespace mantis {

struct UnitPath {
  SavedQuant saved;
  std::optional<SitePolicy> forward, dx, dw;
  // Set by a controller that needs it: the saved-activation path this unit left, quantised too
  // (same random stream) only to measure its error (UnitActivation::low_err_sq).
  std::optional<SavedQuant> low;
  // Set by a controller of finer units (routing.h unit_block): the column blocks of the saved
  // activation that take another path (nn/backward.h SavedBlocks).
  SavedBlocks blocks;
};

// InputError "step S: unit layer.L.SITE: …" unless paths holds one valid path per unit of the
// model (saved in range, every override a valid entry for its site, blocks that fit the unit).
void check_paths(const std::vector<UnitPath>& paths, const ModelConfig& m, uint64_t step);
// True when some path overrides a GEMM entry.
bool has_overrides(const std::vector<UnitPath>& paths);
// The run's policy with every override of `paths` written in as a layer entry (header comment).
Policy with_overrides(const Policy& run, const std::vector<UnitPath>& paths);

struct UnitStep {
  int layer;
  Unit unit;
  UnitPath path;
  double grad_norm;
  UnitActivation act;
  // With path.blocks: per column block, the L2 norm of the block's columns of the unit's weight
  // gradients (before clipping; biases excluded: they never read the saved activation).
  std::vector<double> block_norms;
};

class TrainController {
 public:
  virtual ~TrainController() = default;
  // Before step `step`: paths[l·kUnitCount + u] holds the default (the run's [activation_quant],
  // no overrides); change any.
  virtual void choose(uint64_t step, std::vector<UnitPath>& paths) { (void)step, (void)paths; }
  // After the backward pass of `step`.
  virtual void observe(uint64_t step, std::span<const UnitStep> units) { (void)step, (void)units; }
  // After observe: return true to re-run `step` (its forward and backward, same data and random
  // words) with `paths` (those it ran, changed here); the optimizer then takes the re-run's
  // gradients and the step's loss is the re-run's. The re-run is not observed.
  virtual bool rerun(uint64_t step, std::vector<UnitPath>& paths) { return (void)step, (void)paths, false; }
  // What a checkpoint keeps of it (null: nothing) and its restoration (InputError if it does not fit).
  virtual nlohmann::json state() const { return nullptr; }
  virtual void load_state(const nlohmann::json& s) { (void)s; }
  // Files it writes beside the trainer's logs: (name, content).
  virtual std::vector<std::pair<std::string, std::string>> logs() const { return {}; }
  // Lines for the end of a run (what it recovered; units holding a recovery slot).
  virtual std::vector<std::string> summary() const { return {}; }
  // A short note for the progress line ("" none), about the last observed step.
  virtual std::string progress() const { return ""; }
};

}  // namespace mantis
