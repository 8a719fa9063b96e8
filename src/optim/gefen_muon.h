// gefen_muon — GefenMuon (ndvbd/Gefen gefen_muon.py at 27f3a284, the non-fused path): Muon's
// Newton–Schulz orthogonalisation of a momentum that is stored as Gefen stores it (8-bit codes of
// the global 256-entry codebook, one absmax per magnitude block; optim/gefen.h), no second moment.
//
// Two parameter groups, as Muon is used in practice (Keller Jordan's Muon trains only the hidden
// matrices and leaves the rest to an Adam-type optimizer): the authors' GefenMuon accepts only 2-D
// parameters (their constructor raises on any other), so alone it cannot train a model, whose norm
// gains and biases are vectors. Here
//   the Muon group: every matrix (ndim = 2) except, by default, the embeddings and the output
//     matrix (roles tok_emb, pos_emb, lm_head; Muon's authors keep these out of Muon) — only when
//     the ParamSet knows the roles (a replay without --config: every matrix is in the Muon group);
//     `embeddings = "muon"` puts them in the Muon group too. Its step is the one below.
//   the rest group: every other parameter, through its own optim/gefen (rest = "gefen", default:
//     its own periods, codebook learned from the rest group's first gradients, weight decay only
//     on ≥ 2-D tensors, as gefen.h) or optim/adamw (rest = "adamw"), with rest_beta1, rest_beta2,
//     rest_eps, rest_weight_decay and (gefen) this optimizer's period_rule. Both groups take the
//     step's lr; the Muon group steps first (the groups are disjoint, so the order is immaterial).
//   rest = "refuse" is the released behaviour: every matrix (embeddings included) in the Muon
//     group and an InputError naming the first parameter that is not a matrix.
// First step: periods (gefen_period.h, rule "code" by default) and the codebook, exactly as Gefen.
// Step t, per tensor (m_old = C[idx]·mag, binary32):
//   m = lerp(m_old, g, f32(1 − μ)) (ATen's fma form, as gefen.h)
//   mag_q ← max_{i∈q} |m_i|; idx_i ← nearest(C, mag_q > 0 ? m_i / max(mag_q, FLT_MIN) : 0);
//   q_i = C[idx_i]·mag_q (the requantised m: what both the update and the state carry on)
//   u = Nesterov ? fma(g, f32(1 − μ), q·f32(μ)) : q     (torch's mul_(μ).add_(g, alpha = 1 − μ))
//   O = NS(u) (below, bf16), lr' = lr·ratio: "original" √max(1, rows/cols), "match_rms_adamw"
//       0.2·√max(rows, cols) (binary64, then rounded to binary32)
//   θ ← θ·f32(1 − lr·wd) if wd > 0 (the plain lr, as theirs), then θ ← fma(f32(O), f32(−lr'), θ)
// NS(G), `steps` times, bf16 tensors as torch's (bf16 = round to nearest even of a binary32, here
//   core/round.h with format "bf16"); each bf16 matmul accumulates in binary32 and rounds once to
//   bf16 [assumption: torch's CPU bf16 GEMM accumulates in fp32; we add the products — exact in
//   binary32, as bf16·bf16 has ≤ 16 significant bits — in ascending k, which may differ from
//   oneDNN's blocked order in the last binary32 bits before the bf16 rounding]:
//   X = bf16(G), transposed when rows > cols; X ← bf16(X / bf16(max(bf16(‖X‖_F), f32(eps))))
//       (‖X‖_F: the squares summed in binary64, √, then binary32 and bf16)
//   repeat: A = bf16(X·Xᵀ); B = bf16(f32(c)·(A·A) + f32(b)·A); X = bf16((B·X) + f32(a)·X)
//       (addmm: α·acc + β·C in binary32, the products first, then one rounding)
//   transposed back. Defaults (a, b, c) = (3.4445, −4.7750, 2.0315), 5 steps, eps 1e−7.
// Checked once against the authors' code on Debian's torch 1.13 CPU (not a test: no torch in the
// build): periods and codebook identical; NS bit for bit on a 40×24 Gaussian matrix (where torch's
// bf16 GEMMs take oneDNN); over 3 full steps the parameters of 40×24 and 96×256 matrices differ in
// about half the elements by 1–3 bf16 ulps of the update (oneDNN's fp32 summation order, amplified
// by the iteration). When a matrix's smaller side is ≤ 16 torch 1.13 takes another bf16 kernel for
// the r×r GEMMs whose rounding we have not identified (neither one rounding nor a bf16 rounding
// per k step matches), and NS differs by up to ~10% of its largest entry there.
// State: the Muon group as Gefen without v: "codebook" f32 [256] (present even when the group is
// empty); "<p>.idx" u8, "<p>.mag" f32 [n/Q], "<p>.period" u64 {} (0, with mag [0], before the first
// step); then, when the rest group is not empty, its optimizer's state tensors with their names
// prefixed "rest." ("rest.codebook", "rest.<p>.idx", …, "rest.<p>.v"; or AdamW's "rest.<p>.m",
// "rest.<p>.v"). A Muon-group parameter whose name begins "rest." is refused when a rest group
// exists (the names could collide). state_bytes = Σ bytes of state() + 8 (one step count).
// [optimizer] keys: name = "gefen-muon", momentum (0.95), nesterov (true), weight_decay (0.1),
// eps (1e-7), ns_steps (5), ns_a, ns_b, ns_c (the coefficients), adjust_lr_fn ("original" |
// "match_rms_adamw"), period_rule ("code" | "brief"); rest ("gefen" | "adamw" | "refuse"),
// rest_beta1 (0.9), rest_beta2 (0.999), rest_eps (1e-8), rest_weight_decay (0.0), embeddings
// ("rest" | "muon").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "optim/gefen_period.h"
#include "optim/optimizer.h"

namespace mantis {

enum class GefenMuonRest : uint8_t { gefen, adamw, refuse };

struct GefenMuonConfig {
  double momentum = 0.95, weight_decay = 0.1, eps = 1e-7;
  bool nesterov = true;
  double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  uint64_t ns_steps = 5;
  bool match_rms_adamw = false;  // adjust_lr_fn
  GefenPeriodRule period_rule = GefenPeriodRule::code;
  GefenMuonRest rest = GefenMuonRest::gefen;
  double rest_beta1 = 0.9, rest_beta2 = 0.999, rest_eps = 1e-8, rest_weight_decay = 0.0;
  bool embeddings_muon = false;  // embeddings = "muon"
};

void validate(const GefenMuonConfig& c);
// Whether p goes to the Muon group (above; `roles`: whether the set knows p's role).
bool gefen_muon_takes(const ParamInfo& p, bool roles, const GefenMuonConfig& c);
std::unique_ptr<Optimizer> make_gefen_muon(const ParamSet& p, const GefenMuonConfig& c);
OptimizerEntry gefen_muon_entry();

// NS(G) above for a rows × cols matrix (row-major); the bf16 results as binary32.
std::vector<float> gefen_newton_schulz(std::span<const float> G, size_t rows, size_t cols, const GefenMuonConfig& c);
// The learning-rate ratio of adjust_lr_fn for a rows × cols parameter.
double gefen_muon_lr_ratio(size_t rows, size_t cols, bool match_rms_adamw);

}  // namespace mantis
