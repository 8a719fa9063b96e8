// lamp — look-ahead mixed-precision selection rules (Budzinskiy et al., arXiv 2601.21623).
//
// A composition f(g(x)) is computed with g in low precision; the components of g whose error the
// next operator f amplifies most are recomputed in a higher precision. To first order
// |f(ĝ) − f(g)| ≤ u·Σ_{j∉S} κ_j with the look-ahead score κ_j = |g_j|·‖J_f(g) e_j‖.
//
// Attention scores (f = softmax of one causal row i, keys j = 0..i, y the low-precision scores
// after scaling and rounding, z = softmax(y) in binary64):
//   strict  : select j iff 2·z_j·(1 − z_j)·|y_j| > τ_i           (‖J e_j‖₁ = 2 z_j (1 − z_j))
//   relaxed : select j iff |y_j|·e^{y_j} > τ_i · max_k |y_k|·e^{y_k}, evaluated as
//             log|y_j| + y_j > log τ_i + max_k (log|y_k| + y_k) (no overflow, no normaliser)
//   τ_i = τ, or with length scaling τ_i = min(1, τ·√(1024/(i+1))).
//   ">" as the paper and the authors' code: at τ_i ≥ 1 the relaxed rule selects nothing (the row
//   maximum only ties with itself). τ_i ≤ 0 is the "recompute everything" end of the grid and
//   selects every entry (">" alone would skip entries whose κ is exactly 0); τ = ∞ selects none.
//   random control: for each row, exactly as many entries as the rule selected, drawn uniformly
//   without replacement among the row's i+1 causal positions (a partial Fisher–Yates shuffle
//   driven by Philox words (seed, stream = row key, index = draw)). The authors' code permutes
//   over all T columns and then re-masks, recomputing fewer; this one does not.
// Activations (diagonal Jacobian, f = σ elementwise on y): κ_j = |σ'(y_j)|·|y_j|, select κ_j > τ
//   (τ ≤ 0: every entry).
// LayerNorm (f = LN of the row y, J = (1/σ)·diag(γ)(I − 11ᵀ/n − ŷŷᵀ/n)): its columns have nearly
//   equal norms, so κ_j ∝ |y_j|/σ·|γ_j|; greedy: sort by κ descending and select the largest
//   until the remaining Σ κ_j ≤ τ (RMSNorm uses the same rule). Both are reconstructions (the
//   released code applies LAMP to attention scores only); experiments/lamp/README.md derives them.
//   The forward pass applies them as policy sites [lamp_activation] and [lamp_layernorm] (policy.h).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/format.h"

namespace mantis {

enum class LampRule : uint8_t { strict, relaxed };

// LAMP at an activation or a LayerNorm input (policy.h [lamp_activation], [lamp_layernorm]).
struct LampSiteSpec {
  double tau = 1.0;
  std::optional<Format> recompute;  // nullopt: binary32
};

struct LampSpec {
  LampRule rule = LampRule::strict;
  double tau = 1.0;
  bool length_scaled = false;
  bool random_control = false;
  uint64_t seed = 0;                 // random control
  std::optional<Format> recompute;   // nullopt: binary32 (the FP32 reference product)
};

LampRule lamp_rule_from_string(const std::string& s);  // strict | relaxed
const char* to_string(LampRule r);

// τ_i of query row i.
double lamp_tau(const LampSpec& s, int64_t row);

// Marks (1) the selected entries of one causal row: y [n] scores (n = row + 1), mark [n] out.
// Returns how many. z is computed here in binary64. With random_control, the same count is drawn
// uniformly among the n positions using Philox (seed, stream, ·).
size_t lamp_select_row(const LampSpec& s, std::span<const float> y, int64_t row, std::span<uint8_t> mark,
                       uint64_t stream);

// Activation rule: κ_j = |σ'(y_j)|·|y_j| > τ, σ' given per element; returns the count.
size_t lamp_select_activation(std::span<const double> y, std::span<const double> dsigma, double tau,
                              std::span<uint8_t> mark);
// LayerNorm rule: greedy by κ_j = |y_j|·|γ_j|/σ (σ of the row) until Σ unselected κ ≤ τ.
size_t lamp_select_layernorm(std::span<const double> y, std::span<const double> gamma, double eps, double tau,
                             std::span<uint8_t> mark);

}  // namespace mantis
