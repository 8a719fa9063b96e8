// gefen — the Gefen optimizer (Ben-David et al.) exactly as released (ndvbd/Gefen gefen.py at
// 27f3a284, the non-fused torch path that its CPU runs take; ../shared/reference/papers.md §3.2
// and §5), in binary32 with scalars computed in binary64 and rounded to binary32.
//
// Per tensor (n elements, flattened row-major): a period P (gefen_period.h, from the first step's
// gradient, rule "code" by default), a magnitude block Q (gefen_magnitude_block: P, or for P = 1
// the largest divisor of n ≤ 256); one global codebook C of 256 ascending binary32 codes
// (gefen_codebook.h: the 4096-bin histogram of the first step's gradients, each normalised by the
// absmax of its P-block, then the exact DP).
// State: idx (u8 per element), mag (f32 per Q-block: the absmax of m), v (f32 per P-block).
// Step t = 1, 2, … (the step count is incremented before the bias corrections), per P-block b and
// element i, in this order and float order (papers.md §5.6):
//   v_b ← fma(ms_b, f32(1−β2), f32(β2)·v_b), ms_b = gefen_torch_sum(f32(g_i·g_i), i ∈ b) / f32(P)
//       (torch.mean(g·g, dim=1) on CPU: a binary32 sum in ATen's cascade order, then the division)
//   θ_i ← θ_i·f32(1 − lr·wd)   only if wd > 0 and the tensor has ≥ 2 dimensions (optimizer.h decays)
//   h_b = √v_b / f32(√(1−β2^t)) + f32(ε);  s_b = f32(1/h_b) · f32(1/(1−β1^t))   (torch's scalar / tensor
//       is reciprocal · scalar)
//   m_i = lerp(C[idx_i]·mag_q, g_i, w), w = f32(1−β1): fma(w, g − m_old, m_old) when |w| < 0.5,
//       else fma(w − 1, g − m_old, g) (ATen's vectorised lerp; q = i's Q-block, the old mag)
//   mag_q ← max_{i∈q} |m_i|
//   idx_i ← nearest(C, mag_q > 0 ? m_i / mag_q : 0): k = lower_bound(C, x) (searchsorted), then
//       the lower neighbour k−1 if |x − C[k−1]| ≤ |x − C[k]| (binary32; ties to the lower index)
//   θ_i ← θ_i − f32(f32(C[idx_i]·mag_q)·s_b)·f32(lr)     (the update uses the requantised m)
// [assumption, after papers.md §5.6: every element takes ATen's vectorised kernels (fmadd in lerp
// and in add(alpha)); ATen's scalar tail loop (the last n mod 8 or 16 elements of a tensor)
// computes a + w·b, which a compiler may or may not contract, so those can differ in the last bit]
// Deviation (project rule): weight decay only on tensors with ≥ 2 dimensions (the authors decay
// every tensor given a weight_decay). Non-finite first-step gradients are an InputError (the
// period rule's logs would be NaN).
// Study option (not in the paper; default off): relearn_every = k > 0 re-learns the codebook from
// the current gradient (same periods) at the start of steps k+1, 2k+1, … and re-quantises m with
// it: mag is kept and each idx_i becomes nearest(C_new, C_old[idx_i]).
// Checked once against the authors' gefen.py (torch 1.13 CPU, fused=False; not a test: no torch in
// the build) on 6 tensors (matrices, P = 1 vectors, a prime length, n = 1, a zero gradient), 3–8
// steps, β1 ∈ {0.3, 0.9, 0.95}, wd ∈ {0, 0.05, 0.1}: periods, codebook and every parameter equal
// bit for bit; and with Gaussian gradients (their DP replaced by our codebook, as pure-Python DP on
// ~4,000 bins takes hours) periods and every parameter again bit for bit over 4–5 steps.
// Before the first step the periods and the codebook are unset: state() then reports every
// `.period` as 0, `.mag` and `.v` with shape [0], `.idx` zeros and a zero codebook; load_state
// takes that form back (all periods 0, or none).
// State tensors: "codebook" f32 [256]; per parameter, in parameter order, "<p>.idx" u8 (p's shape),
// "<p>.mag" f32 [n/Q], "<p>.v" f32 [n/P], "<p>.period" u64 {}. state_bytes = Σ their bytes + 8.
// Threads: every block is independent and reductions are within a block, so 1 and N threads
// agree bit for bit.
// [optimizer] keys: name = "gefen", beta1 (0.9), beta2 (0.999), eps (1e-8), weight_decay (0.0, the
// authors' default), period_rule ("code" | "brief"), relearn_every (0 = never).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "optim/gefen_block.h"  // the update of one block, shared with the CUDA kernel
#include "optim/gefen_period.h"
#include "optim/nearest_code.h"  // gefen_nearest_code: idx_i's rule
#include "optim/optimizer.h"

namespace mantis {

struct GefenConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  GefenPeriodRule period_rule = GefenPeriodRule::code;
  uint64_t relearn_every = 0;
};

// InputError unless 0 ≤ β < 1, ε > 0, wd ≥ 0.
void validate(const GefenConfig& c);
std::unique_ptr<Optimizer> make_gefen(const ParamSet& p, const GefenConfig& c);
OptimizerEntry gefen_entry();

// ATen's (torch 1.13 CPU) binary32 sum of n contiguous floats, restated: for n ≥ L (the lanes of
// its Vectorized<float>: 8 in the AVX2 kernels that torch 1.13 runs here; AVX-512 builds use 16),
// the ⌊n/L⌋ vectors are summed lane-wise by row_sum (4 interleaved accumulators, each a 4-level
// cascade of 2^max(4, ⌈log2(⌊n/L⌋/4)⌉/4)-vector chunks), then the scalar tail from 0 in order,
// then the L lanes in order; for n < L the same row_sum over single floats. Checked against
// torch.mean(x·x, dim=1) · n on Gaussian rows of n = 1 … 5000: equal in every case.
// (gefen_block.h: gefen_aten_sum, kGefenTorchLanes.)
float gefen_torch_sum(const float* x, size_t n);

// The codebook learned from gradients (each flattened) with their periods: the histogram over all
// of them (in order), then learn_gefen_codebook; 256 codes.
std::vector<float> gefen_learn_codebook(const std::vector<std::span<const float>>& grads,
                                        const std::vector<size_t>& periods);

// For studies: the dequantised momentum of `param` (C[idx_i]·mag[i/Q], binary32, flattened) from a
// Gefen (or GefenMuon: its Muon group; its rest group's tensors with the "rest." prefix removed)
// state(); InputError if the tensors are missing; zeros before the first step.
std::vector<float> gefen_momentum(const std::vector<StateTensor>& state, const std::string& param);

}  // namespace mantis
