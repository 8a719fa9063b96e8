// clip — the global L2 norm of all gradients (binary64 sum of squares: per parameter in
// core/reduce.h's order, parameters summed in parameter_shapes order) and clipping by it: if it exceeds clip > 0, every gradient is
// multiplied by clip / norm (binary32).
#pragma once

#include "nn/grad.h"
#include "nn/model.h"

#include <string>
#include <vector>

namespace mantis {

double grad_norm(const Model& m, const GradMap<float>& g);
// Clips in place; returns the norm before clipping.
double clip_grads(const Model& m, GradMap<float>& g, double clip);
// The same over the gradients `names` only, in that order (a LoRA run: its adapters); only they
// are scaled.
double clip_grads(const std::vector<std::string>& names, GradMap<float>& g, double clip);

}  // namespace mantis
