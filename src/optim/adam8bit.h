// adam8bit — bitsandbytes' AdamW8bit (bnb 95f9af3: bitsandbytes/optim/adamw.py, optimizer.py
// Optimizer2State, csrc/kernels.cu kOptimizerStatic8bit2StateBlockwise and kOptimizer32bit2State),
// in binary32 on the CPU, with the kernels' order of operations.
//
// Scalars (Python passes them to the kernel as C floats): β1, β2, ε, lr, wd are rounded to binary32
// once; a1 = 1 − β1, a2 = 1 − β2, d = 1 − lr·wd in binary32; at step t = 1, 2, …
//   c1 = 1 − β1^t,  c2 = √(1 − β2^t),  step_size = (−lr·c2) / c1        (binary32)
// β^t is binary64 pow of the binary32 β, rounded to binary32: the CUDA kernels' powf / __powf are
// approximations no CPU reproduces; this is their correctly rounded value.
//
// Quantised tensors (n ≥ min_8bit_size): per element codes c_m, c_v (u8) and per block of
// `block` (256) consecutive elements the absmax A_m, A_v (f32); maps "dynamic" (signed) for m and
// "udynamic" for v (quant_map.h). A new state has every code 0 and every absmax 0 (bnb's zeros).
// Per block, with A the old absmax:
//   finite g:  v = (map_v[c_v]·A_v)·β2 + (a2·g)·g;   m = (map_m[c_m]·A_m)·β1 + a1·g
//   non-finite g: m = v = 0 and the parameter is left alone (no step, no decay)
//   A_m' = max |m|, A_v' = max |v| over the block's `block` lanes (fmax: NaN is ignored). In a last
//     partial block the kernel's padding lanes take part: g = 0, c_m = 128, c_v = 0, so they add
//     |(map_m[128]·A_m)·β1 + a1·0| and (map_v[0]·A_v)·β2 + (a2·0)·0 — as bnb's BlockReduce does.
//   p ← p + step_size · (m / (√v + c2·ε))                    (the new, unquantised m and v)
//   p ← p · d                                                (after the step; wd > 0 on ≥ 2-D tensors)
//   c_m = nearest(m / A_m') then bnb's sign nudge: if signbit(map_m[c_m]) ≠ signbit(m), c_m += 1
//     when m > 0 else c_m −= 1 (uint8 wrap-around, as the kernel's unsigned char);
//   c_v = nearest(v / A_v')   (nearest: quant_map.h bnb_nearest_code; an all-zero block divides
//     0/0 = NaN, giving c_m = 255, c_v = 0, which dequantise to 0 with absmax 0, exactly as bnb)
// The kernel divides with __fdividef (an approximation); here every division is IEEE binary32.
//
// FP32 tensors (n < min_8bit_size: bnb's plain 32-bit Adam, kOptimizer32bit2State):
//   m = m·β1 + a1·g;   v = v·β2 + a2·(g·g);   p ← p + step_size · (m / (√v + ε·c2));   p ← p·d
//   (no non-finite guard: NaN propagates, as in bnb's 32-bit kernel)
//
// State tensors: quantised "<p>.m.codes", "<p>.v.codes" (u8 [n]), "<p>.m.absmax", "<p>.v.absmax"
// (f32 [⌈n/block⌉]); FP32 "<p>.m", "<p>.v" (f32, the parameter's shape); and, when any tensor is
// quantised, the maps "qmap.m", "qmap.v" (f32 [256]; bnb keeps one map per optimizer in its state).
// state_bytes = Σ bytes of those + 8 (the step count).
// [optimizer] keys: name = "adam8bit", beta1 (0.9), beta2 (0.999), eps (1e-8), weight_decay (0.01,
// AdamW8bit's default), min_8bit_size (4096), block (256; bnb hard-codes 256, 2048 before 2024-09).
#pragma once

#include <cstdint>
#include <memory>

#include "optim/optimizer.h"

namespace mantis {

struct Adam8bitConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  uint64_t min_8bit_size = 4096, block = 256;
};

// InputError unless 0 ≤ β < 1, ε > 0, wd ≥ 0, 1 ≤ block ≤ 2^20.
void validate(const Adam8bitConfig& c);
std::unique_ptr<Optimizer> make_adam8bit(const ParamSet& p, const Adam8bitConfig& c);
OptimizerEntry adam8bit_entry();

}  // namespace mantis
