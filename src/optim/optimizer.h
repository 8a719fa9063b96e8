// optim — optimizers over a model's binary32 parameters, learning-rate schedule, clipping.
//
// Optimizer: one update of every parameter from its gradient at a given learning rate; reports
// its exact state size in bytes; saves and restores its state as named binary32 tensors plus a
// step count (checkpoints). Parameters are visited in parameter_shapes order.
//
// AdamW (Loshchilov & Hutter; PyTorch 1.13's torch.optim.AdamW, foreach=False), per element, in
// binary32 with the scalars computed in binary64 and then rounded to binary32, step t = 1, 2, …:
//   p ← p·(1 − lr·wd)                       (wd only on tensors with ≥ 2 dimensions)
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g·g
//   p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
// State: m and v, 8 bytes per parameter (+ the step count).
//
// Schedule (llm.c): linear warm-up lr·(s+1)/warmup for s < warmup, then cosine decay from lr to
// min_lr over the remaining steps: min_lr + ½(lr − min_lr)(1 + cos(π·(s − warmup)/(steps − warmup))).
// Clipping: the global L2 norm of all gradients (binary64 sum of squares, parameters in order);
// if it exceeds clip > 0, every gradient is multiplied by clip / norm (binary32).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/backward.h"
#include "nn/model.h"

namespace mantis {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  virtual void step(Model& m, const GradMap<float>& g, double lr) = 0;
  virtual uint64_t state_bytes() const = 0;
  virtual uint64_t steps() const = 0;
  // State as named tensors (names "<param>.<slot>") and its step count; load_state checks that
  // every tensor is present with the right size (InputError naming the offender).
  virtual std::map<std::string, std::vector<float>> state() const = 0;
  virtual void load_state(const std::map<std::string, std::vector<float>>& s, uint64_t steps) = 0;
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// InputError unless 0 ≤ β < 1, ε > 0, wd ≥ 0.
std::unique_ptr<Optimizer> make_adamw(const Model& m, const AdamWConfig& c);

struct Schedule {
  double lr = 1e-3, min_lr = 1e-4;
  uint64_t warmup = 0, steps = 1;
  double at(uint64_t step) const;
};

double grad_norm(const Model& m, const GradMap<float>& g);
// Clips in place; returns the norm before clipping.
double clip_grads(const Model& m, GradMap<float>& g, double clip);

}  // namespace mantis
