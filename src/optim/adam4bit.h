// adam4bit — torchao's AdamW4bit (pytorch/ao 36027d8: torchao/optim/adam.py single_param_adam,
// subclass_4bit.py OptimState4bit, quant_utils.py), in binary32 with eager PyTorch's order of
// operations (torchao runs the same graph under torch.compile; no fused multiply-add here).
//
// Scalars: lr is a float32 tensor in torchao, so lr, wd, ε, β1, β2 are rounded to binary32;
// the lerp weights w1 = 1 − β1, w2 = 1 − β2 are Python (binary64) subtractions rounded to binary32
// as lerp.Scalar takes them. At step t = 1, 2, …
//   bc1 = 1 − β1^t,  bc2 = 1 − β2^t     (binary32; β^t is binary64 pow of the binary32 β, rounded
//                                        to binary32, the correctly rounded powf)
// per element, with m0, v0 the dequantised (or FP32) old moments:
//   p ← p − (lr·wd)·p                     (AdamW's decay, first; only tensors with ≥ 2 dimensions
//                                          and wd > 0)
//   m = lerp(m0, g, w1),  v = lerp(v0, g·g, w2),  lerp(a, b, w) = a + w·(b − a) if |w| < 0.5,
//       else b − (b − a)·(1 − w)          (ATen's two-branch formula)
//   p ← p − (lr·(m / bc1)) / ((√v / √bc2) + ε)      (the fp32 m and v, not the requantised ones)
// Quantised tensors (n ≥ min_size and n divisible by block): per block of `block` (128) elements a
// scale s = max(absmax, 1e-12f) (torch's clip; NaN propagates as amax does) and 4-bit codes of x / s
// by torchao's branchless search (quant_map.h: ties go up, below qmap[0] gives code 0); m uses
// dynamic_map(signed, 3, 4), v the 16 linear levels {1/16, …, 1}; dequantised as qmap[code]·s.
// Codes are packed two per byte, element 2k in the high nibble: byte k = c[2k] << 4 | c[2k+1].
// A new state is all-zero bytes and zero scales (torchao's zeros), i.e. m0 = qmap_m[0]·0 = −0, v0 = 0.
// Non-finite gradients are not special-cased (torchao has no guard): NaN reaches m, v, the scale.
//
// State tensors: quantised "<p>.m.codes", "<p>.v.codes" (u8 [n/2]), "<p>.m.absmax", "<p>.v.absmax"
// (f32 [n/block]: torchao's `scale`); FP32 "<p>.m", "<p>.v" (f32, the parameter's shape); when any
// tensor is quantised, the maps "qmap.m" (f32 [16]) and "qmap.v" (f32 [16]) once. torchao stores a
// copy of its map in every quantised state (128 B more per quantised parameter); the copies are
// identical, so mantis keeps and counts one. state_bytes = Σ bytes of state() + 8.
// [optimizer] keys: name = "adam4bit", beta1 (0.9), beta2 (0.999), eps (1e-8), weight_decay (0.01,
// AdamW4bit's default), block (128), min_size (4096).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>

#include "optim/optimizer.h"

namespace mantis {

struct Adam4bitConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  uint64_t block = 128, min_size = 4096;
};

// torch.lerp's binary32 formula (ATen Lerp.h).
inline float torch_lerp(float a, float b, float w) {
  return std::fabs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

// InputError unless 0 ≤ β < 1, ε > 0, wd ≥ 0, block even in [2, 2^20].
void validate(const Adam4bitConfig& c);
std::unique_ptr<Optimizer> make_adam4bit(const ParamSet& p, const Adam4bitConfig& c);
OptimizerEntry adam4bit_entry();

}  // namespace mantis
