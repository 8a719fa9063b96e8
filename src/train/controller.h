// controller — the hook that picks each unit's path before every training step and observes
// every unit after its backward pass (a GNMR-style controller plugs in here; train.h's loop calls it).
// Units are the projection operators of each layer (nn/backward.h Unit), layer-major:
// index l·kUnitCount + unit.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "nn/backward.h"

namespace mantis {

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

}  // namespace mantis
