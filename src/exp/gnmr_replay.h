// gnmr_replay — the GNMR controller (train/gnmr.h) alone on a recorded norm stream: how anyone
// checks it against another implementation.
//   config  a TOML file with a [controller] table: name = "gnmr" and the keys of train/gnmr.h
//           (kGnmrKeys), each optional with its documented default. The training-only keys
//           (seed, [controller.recover]) are accepted and unused; any other key is an error. Other
//           top-level tables are ignored, so a training configuration can be given as it is.
//   norms   CSV, header `step,unit,grad_norm`; steps 1..T, every unit at every step exactly once,
//           rows in any order; unit ids non-empty, without ',', '"' or line breaks; norms finite
//           and ≥ 0 (strtod syntax).
//   out     CSV, header `step,unit,gnmr,dgnmr,exceeds,lock,recovered`: one row per step and unit,
//           by step then unit id (byte order); numbers %.17g, empty where undefined; exceeds and
//           recovered 0/1; lock after the update; recovered = 1 when the unit was selected at that
//           step (the recovery path at step + 1; the last step too). In replay a unit ran the
//           low-cost path at t unless it was selected at t − 1. Written atomically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/gnmr.h"

namespace mantis {

struct GnmrReplayResult {
  uint64_t steps = 0, units = 0;
  uint64_t recovered = 0;  // unit-steps selected
  uint64_t exceeded = 0;   // unit-steps exceeding (after warm-up)
  uint64_t eligible = 0;   // unit-steps after warm-up
  std::vector<std::string> held;  // "UNIT since step S": units holding a recovery slot at the end
};

// The controller's options from CONFIG's [controller] table (name must be "gnmr").
GnmrOptions gnmr_replay_config(const std::string& config_path);
GnmrReplayResult gnmr_replay(const GnmrOptions& o, const std::string& norms_path, const std::string& out_path);

}  // namespace mantis
