// forward (cuda) — forward<float> (nn/forward.h) of both model families on the GPU, under a policy:
// the same graph (gpt2_forward / llama_forward in forward.cpp), its buffers on the device, each
// operation the CPU's (site.h, nn_ops.h, the attention kernels). Emulated GEMM sites, roundings,
// norms, activations, RoPE and the materialised attention compute the CPU's bits; native GEMM
// sites go through cuBLAS SGEMM (a tolerance: another summation order), and so does everything
// downstream of one. Plain C++.
//
// Not on the GPU (InputError before any kernel): LoRA adapters, [lamp_activation] and
// [lamp_layernorm]. ForwardStats: LAMP's counts per layer and the site health (range events),
// counted on the device by the CPU's rules (nn/site_health.h): equal to the CPU's where the values
// are (emulated sites), the GPU's own values' counts downstream of a native one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/cuda.h"
#include "cuda/device.h"
#include "nn/forward.h"

namespace mantis::gpu {

// A model's parameters on the device, uploaded once (the checks of detail::Weights: InputError
// naming a missing or mis-shaped parameter).
class DeviceModel {
 public:
  explicit DeviceModel(const Model& m);
  const ModelConfig& config() const { return cfg_; }
  bool has_lora() const { return has_lora_; }
  // The weight (bias) of `role` at `layer` (−1: outside the layers); bias: null where none.
  const float* operator()(Role r, int layer = -1) const;
  const float* bias(Role r, int layer = -1) const;

 private:
  ModelConfig cfg_;
  bool has_lora_ = false;
  std::vector<int> slot_;              // (layer + 1, role, bias) → arrays_, −1: none
  std::vector<Array<float>> arrays_;   // parameter_infos order
};

// What the GPU forward refuses (InputError, before any kernel): the CPU forward's checks
// (tokens, the plan's configuration, random rows), LoRA adapters, lamp_activation /
// lamp_layernorm, and what the attention kernel refuses at any layer.
// Host only (no device needed): tests check a setting with it where there is no GPU.
void check_forward(const ModelConfig& c, bool has_lora, std::span<const int32_t> tokens, const PolicyPlan& plan,
                   AttentionKernel kernel);

// The logits [T, V] of tokens under plan (check_forward first).
Matrix<float> forward(const DeviceModel& m, std::span<const int32_t> tokens, const PolicyPlan& plan,
                      ForwardStats* stats = nullptr, AttentionKernel kernel = AttentionKernel::materialised);

// forward as a ForwardFn (nn/forward.h) for the studies' `--device cuda`: the model's parameters are
// uploaded at the first call and kept while later calls pass the same Model object, which must not
// change meanwhile (the cache is keyed by its address).
ForwardFn forward_fn(AttentionKernel kernel = AttentionKernel::materialised);

}  // namespace mantis::gpu
