// backward — gradients of the next-token cross-entropy through the forward pass of forward.h.
//
// sequence_backward<T>(model, tokens, targets, policy, scale, grads, quant):
//   runs the forward pass of forward.h on one sequence (bit-identical logits, the same policy and
//   random words), the loss Σ_t −log softmax(logits_t)[target_t] over positions with a target
//   (targets[t] = −1: none), and ADDS scale · ∂loss/∂θ to grads for every parameter θ (one
//   gradient buffer per parameter, the parameter's layout). A batch is a sum over its sequences
//   in order (scale = 1 / targets in the batch gives the gradient of the batch mean).
//
// The backward pass, per layer in reverse (llm.c's order), in T:
//   lm_head      dX = dlogits·W (site lm_head, Pass::dx), dW += dlogitsᵀ·X (Pass::dw)
//   Linear y = x·Wᵀ + b at a GEMM site: dx = dy·W (Pass::dx), dW += dyᵀ·x_saved (Pass::dw),
//                db += Σ_rows dy (rows in order). x_saved is the operand the forward consumed, or
//                its k-bit quantisation when the unit's saved activation is quantised (below).
//   attention (with RoPE's inverse rotation), LayerNorm / RMSNorm, GELU / SwiGLU: the backward
//                formulas beside the forward ones (attention.h, norm.h, activation.h).
//   embeddings   dwte[token_t] += dx_t, dwpe[t] += dx_t, t in order (tied: plus lm_head's dW).
// Rounding steps of nonlinearity sites are straight-through; the backward GEMMs follow the
// policy's dx / dw entries (policy.h), with Philox streams of slot + 1024·pass (streams.h).
// Threads: heads over OpenMP, native GEMMs in fixed tiles: bit-identical for any thread count.
//
// Activation quantisation of saved activations (the "units", one projection operator per layer):
//   attn.qkv (saves ln_1's output), attn.proj (the attention output), mlp.fc (ln_2's output;
//   llama: shared by w1 and w3), mlp.proj (GELU / SwiGLU output). The forward pass uses the exact
//   values; the unit's dW uses the saved activation quantised to k bits (SavedQuant), symmetric
//   absmax: per row (a token) or per block of `block` consecutive elements of a row,
//   q = clamp(round(x / s), −Q, Q), x̃ = q·s, s = absmax / Q, Q = 2^(k−1) − 1 (all-zero groups stay
//   0). round: rne (nearbyint, ties to even), or sr: floor(x/s + u), u = word/2^32 from Philox
//   (seed, stream = unit id, index = row·cols + col). dx still uses the exact weight path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/scheme.h"
#include "nn/forward.h"
#include "nn/grad.h"  // defines: GradMap, zero_grads

namespace mantis {

// Unit, kUnitCount, site_of: site.h.
const char* to_string(Unit u);  // its site's name: "attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"
// The unit a parameter role belongs to (projection weights and biases; nullopt for the rest).
std::optional<Unit> unit_of(Role r);
// The parameters whose gradient is the unit's (weights and biases of the projection).
std::vector<std::string> unit_parameters(const ModelConfig& c, int layer, Unit u);

struct SavedQuant {
  int bits = 0;       // 0: keep the exact activation; 2..8: quantise to k bits
  int block = 0;      // 0: one scale per row (token); else per `block` consecutive elements of a row
  Rounding rounding = Rounding::rne;  // rne or sr
  uint64_t seed = 0;
  // Instead of bits / block: a scaled scheme (core/scheme.h), its blocks along the dW GEMM's
  // reduction dimension, the tokens: x [T, C] takes the scheme's block transposed (MX's 1×32
  // becomes 32 tokens × 1 feature, DeepSeek's 1×128 activation tiles 128×1, as in its Wgrad).
  // Element (t, c) draws index t·C + c (sr: min(32, 52 − p) random bits).
  std::optional<Scheme> scheme;
  bool active() const { return bits != 0 || scheme.has_value(); }
  std::string label() const;  // "0", "4", or the scheme's name (units.csv)
};
// InputError unless bits ∈ {0, 2..8}, block ≥ 0, rounding rne or sr, and a scheme (valid) comes
// without bits or block.
void validate(const SavedQuant& q);

// Finer units: column blocks of a saved activation x [T, cols]. Its columns are the projection's
// input features, so block b of dW's columns reads block b of x and nothing else: recovering a
// block changes exactly those columns of dW (the bias gradient never reads x). With block > 0 the
// columns split into ⌈cols / block⌉ blocks of `block` (the last may be shorter); block b's columns
// take `recover`'s quantisation of x (inactive: x itself; the unit's own random words, so element
// (t, c) draws the index it would draw quantised whole) when recovered[b], else the unit's
// SavedQuant — the whole activation quantised first, then the recovered columns replaced.
struct SavedBlocks {
  int block = 0;                   // 0: none (whole units)
  std::vector<uint8_t> recovered;  // [⌈cols / block⌉]
  SavedQuant recover;
  size_t count(size_t cols) const { return block > 0 ? (cols + size_t(block) - 1) / size_t(block) : 0; }
};
// The width of a unit's saved activation: its weights' input dimension (C; H for mlp.proj).
int64_t saved_cols(const ModelConfig& c, Unit u);

// Quantise x [rows, cols] row-major into out (may alias x) per SavedQuant (header comment).
template <class T>
void quantize_saved(const T* x, T* out, size_t rows, size_t cols, const SavedQuant& q, uint64_t stream);

// What one backward pass saw of each unit's saved activation (layer-major: layer·kUnitCount + unit).
struct UnitActivation {
  double absmax = 0;       // max |x| of the exact activation
  double sum_sq = 0;       // Σ x² (with count: the RMS), binary64, per call in 8 interleaved sums
  double err_sq = 0;       // Σ (x̃ − x)² of the quantisation (0 when exact), the same order
  double low_err_sq = 0;   // the same for the low-cost path (BackwardOptions::low), = err_sq on it
  uint64_t count = 0;
  // With SavedBlocks: per column block, Σ x² and the unit's own SavedQuant's Σ (x̃ − x)² (before
  // any block is recovered; low_err_sq is that path's whole error then), rows then columns in order.
  std::vector<double> block_sum_sq, block_low_err_sq;
};

struct BackwardOptions {
  // The saved-activation path of each unit for this pass (empty: all exact).
  std::function<SavedQuant(int layer, Unit u)> saved;
  uint64_t step = 0;                          // mixed into the sr streams of quantisation
  std::vector<UnitActivation>* activations = nullptr;  // accumulated into when set (size L·4)
  // With activations: the low-cost path of a unit that runs another one (nullopt: it runs the
  // low-cost path), quantised with the same random stream only to measure low_err_sq.
  std::function<std::optional<SavedQuant>(int layer, Unit u)> low;
  // The column blocks of a unit (nullptr or block 0: whole units).
  std::function<const SavedBlocks*(int layer, Unit u)> blocks;
  // false (LoRA fine-tuning, the base frozen): the base's GEMM weight gradients — dW and db of
  // every projection and of the output — are not computed and stay as given; dx, the adapters'
  // gradients and the element-wise ones (norms, embeddings: cheap) are unchanged.
  bool base_weight_grads = true;
};

struct LossSum {
  double sum = 0;      // Σ −log p(target) over positions with a target
  int64_t count = 0;   // how many
};

// The Policy overload compiles the policy (PolicyPlan) and calls the plan overload.
template <class T>
LossSum sequence_backward(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                          const Policy& policy, double scale, GradMap<T>& grads, const BackwardOptions& opt = {});
template <class T>
LossSum sequence_backward(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                          const PolicyPlan& plan, double scale, GradMap<T>& grads, const BackwardOptions& opt = {});

extern template LossSum sequence_backward<float>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                                 const Policy&, double, GradMap<float>&, const BackwardOptions&);
extern template LossSum sequence_backward<double>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                                  const Policy&, double, GradMap<double>&, const BackwardOptions&);
extern template LossSum sequence_backward<float>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                                 const PolicyPlan&, double, GradMap<float>&, const BackwardOptions&);
extern template LossSum sequence_backward<double>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                                  const PolicyPlan&, double, GradMap<double>&, const BackwardOptions&);

}  // namespace mantis
