// adafactor — Adafactor (Shazeer & Stern 2018) as Hugging Face's transformers.optimization.Adafactor
// with beta1 = None (no first moment): a factored second moment for matrices, a full one for
// vectors, update clipping by RMS, optional relative step and parameter scaling.
//
// One step, t = 1, 2, …, per tensor (HF's order; scalars in binary64, rounded to binary32 where they
// meet a tensor; add-with-alpha as PyTorch's vectorised CPU kernel, one fused multiply-add):
//   β2t  = 1 − t^decay_rate                              (binary64; t = 1 gives 0)
//   rms(x) = f32(√Σx²) / f32(√n)                          (Σ in binary64: each row in index order, the
//                                                          row sums in row order; √ in binary64 —
//                                                          torch's norm sums in binary32)
//   ρ    = relative_step ? min(warmup_init ? 1e-6·t : 1e-2, 1/√t) : lr     (lr: the step's lr)
//   α    = scale_parameter ? (rms(p) > eps2 ? rms(p)·f32(ρ) in binary32 : f32(eps2·ρ)) : f32(ρ)
//                                                         (rms(p) before this step; torch's tensor · float)
//   u    = g·g + f32(eps1)
//   matrix [R, C]:  vr_i = fma(f32(mean_j u_ij), f32(1 − β2t), f32(β2t)·vr_i)
//                   vc_j = fma(f32(mean_i u_ij), f32(1 − β2t), f32(β2t)·vc_j)
//                   (means: Σ in binary64 in index order, / in binary64, rounded once)
//                   r_i = 1/√(vr_i / f32(mean_i vr_i)),  c_j = 1/√vc_j      (HF's _approx_sq_grad:
//                   rsqrt = 1/√ in binary32, as torch's CPU rsqrt)
//                   x_ij = (r_i·c_j)·g_ij
//   vector [n]:     v = fma(u, f32(1 − β2t), f32(β2t)·v),  x = (1/√v)·g
//   x    = x / max(rms(x) / f32(clip_threshold), 1)       (binary32)
//   x    = x·α
//   p    = fma(p, f32(−wd·α'), p)                         (α' = α, or ρ in binary64 without scaling;
//                                                          HF's p.add_(p, alpha = −wd·lr), before the
//                                                          update; only decays() tensors — HF decays
//                                                          every tensor of its group, its Trainer leaves
//                                                          biases and norms out, as decays() does)
//   p    = p − x
// Checked once against HF's step (transcribed, Debian's torch 1.13, CPU; 5 steps, the defaults
// here and relative_step + scale_parameter): vectors bit-identical (but for rms(p) of norm gains
// under scale_parameter), matrices differ only through torch's binary32 means and norm (≤ 3e-6
// of the update).
// HF factors the last two dimensions of ≥ 2-D tensors; mantis's parameters are ≤ 2-D (more is an
// InputError), a 0-D one is a vector of 1.
// Defaults against HF's: HF has relative_step = true, scale_parameter = true (and then lr must be
// None); here both default to false, so the trainer's lr (its schedule) is used as given — HF's own
// "replace AdamW" example (relative_step = scale_parameter = warmup_init = False). With
// relative_step = true the step's lr is ignored, as HF ignores its (None) lr. beta1 is not offered.
// State: <param>.vr f32 [R], <param>.vc f32 [C] for matrices; <param>.v f32 [n] for vectors; + the
// step count (≈ 4(R + C)/(R·C) bytes per matrix element).
// [optimizer] keys: name = "adafactor", eps1 (1e-30), eps2 (1e-3), clip_threshold (1.0),
// decay_rate (−0.8), weight_decay (0.0), relative_step (false), scale_parameter (false),
// warmup_init (false).
#pragma once

#include <memory>

#include "optim/optimizer.h"

namespace mantis {

struct AdafactorConfig {
  double eps1 = 1e-30, eps2 = 1e-3, clip_threshold = 1.0, decay_rate = -0.8, weight_decay = 0.0;
  bool relative_step = false, scale_parameter = false, warmup_init = false;
};

// InputError unless eps1 > 0, eps2 ≥ 0, clip_threshold > 0, decay_rate < 0, wd ≥ 0, and
// warmup_init only with relative_step (as HF).
void validate(const AdafactorConfig& c);
std::unique_ptr<Optimizer> make_adafactor(const ParamSet& p, const AdafactorConfig& c);
OptimizerEntry adafactor_entry();

}  // namespace mantis
