// replay — one optimizer run on a recorded gradient stream: how an optimizer here is checked
// against another implementation of it (`mantis optim replay`, issue 11).
//
// The contract:
//   P (params): a safetensors file of binary32 (F32) tensors, one per parameter, by name; their
//     order in the file (data offsets) is the order of the parameter set unless a model
//     configuration gives one.
//   G (grads): for each step t = 0..N−1 and each parameter n of P, the F32 tensor `t.<t>.<n>`
//     (t in decimal, no leading zeros) of n's shape; nothing else (a tensor of another name, or
//     of a step ≥ N, is refused).
//   Step t calls the optimizer's step once with G's step-t tensors at the constant learning rate
//     lr (default 1e-3): no schedule, no gradient clipping, no loss scaling. Weight decay is the
//     optimizer's own, decoupled, only on tensors with ≥ 2 dimensions (optim/optimizer.h decays()).
//   Settings: `values` become the optimizer's [optimizer] keys (beta1, beta2, eps, weight_decay,
//     …); a key the optimizer does not have is refused; absent keys take the optimizer's defaults.
//   Roles: without a config the parameter set has names and shapes only (roles unknown;
//     optimizers that need roles, such as Adam-mini, refuse it). With `config` (a config.json as
//     save_model or Hugging Face GPT-2 write it) P must hold exactly parameter_infos(config) by
//     name and shape, and the set is parameter_infos(config), in its order, roles known.
//   OUT (if given): the final parameters, F32, P's names in P's order, written atomically.
//   Every check runs before the first step: unknown optimizer (the known ones listed), N ≤ 0, a
//     non-F32 tensor, a missing step tensor (named), a shape mismatch (both shapes named), an
//     unknown or extra tensor in G, a non-finite value in P or G (tensor and index named), N
//     beyond G's steps (checked before anything is allocated for N). Each is a one-line InputError.
//   A step whose update leaves a parameter non-finite (a huge lr) is an InputError naming the step,
//     the tensor and the index; OUT is then not written (no command writes non-finite weights).
//   Result: the optimizer's name, N, its state_bytes() after the last step, the element count of
//     P, state_bytes / params; and when its state holds a tensor `codebook` and tensors
//     `<p>.period` (Gefen's naming), the codebook's values (as doubles) and each p's period;
//     gefen-muon: `codebook` is its Muon group's, and the periods are both groups' (the rest
//     group's `rest.<p>.period` reported as p's; its own `rest.codebook` only in `state`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "optim/optimizer.h"

namespace mantis {

struct ReplayOptions {
  std::string optimizer = "adamw";
  std::string params, grads, out;  // out empty: not written
  std::string config;              // optional model config.json (roles)
  int64_t steps = 0;
  double lr = 1e-3;
  std::map<std::string, double> values;  // [optimizer] keys given (beta1, …)
};

struct ReplayResult {
  std::string optimizer;
  int64_t steps = 0;
  uint64_t state_bytes = 0, params = 0;
  double bytes_per_param = 0;
  std::vector<NamedTensor> final_params;  // P's order
  std::map<std::string, uint64_t> periods;  // Gefen-style state only
  std::vector<double> codebook;             // Gefen-style state only
  std::vector<StateTensor> state;           // the optimizer's state after the last step
};

ReplayResult replay(const ReplayOptions& o);

// Structured random replay inputs for a model's parameter set (`mantis optim synth`): what the
// state-bytes study replays at GPT-2-small scale. Tensor k of parameter_infos(model) (rows = the
// product of all dimensions but the last, a 1-D tensor one row), element (i, j) of row i:
//   u(stream, counter) = (Philox64(seed, stream, counter) >> 40) · 2⁻²³ − 1   (in [−1, 1), exact)
//   P[k](i, j)      = binary32(0.02 · u(k, flat index))
//   G[t][k](i, j)   = binary32(s_k,i · 1e−3 · u(((t + 1) << 32) | k, flat index)),
//   s_k,i = 2^((Philox64(seed, (1 << 62) | k, i) mod 9) − 4)      (the same row scales every step)
// so the rows of every matrix are blocks of visibly different magnitude (Gefen's row period).
// Writes P (F32, parameter_infos order), G (`t.<t>.<name>`, steps in order) and, if config_out
// is given, the model's config.json (io/checkpoint.h's own format) for replay's --config.
struct SynthOptions {
  ModelConfig model;
  int64_t steps = 1;
  uint64_t seed = 1;
  std::string params, grads, config_out;
};
void synth_replay_inputs(const SynthOptions& o);

}  // namespace mantis
