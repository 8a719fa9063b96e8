// forward — one transformer forward pass (gpt2, llama) over Eigen, every step at a policy site.
//
// forward<T>(model, tokens, policy) → logits [T_seq, V]. One implementation, two scalars:
//   float   the simulator: every GEMM goes through its site (policy.h). native → Eigen's binary32
//           product; strict / unfused / blocked → mantis::gemm (gemm.h) on row-major binary32
//           operands, its double result converted to float (exact whenever the accumulator fits
//           binary32). Nonlinearities compute in binary32 between their optional roundings.
//   double  the numerical reference (tests): binary64 throughout from the same binary32 weights;
//           only the all-native policy is allowed (anything else is an InputError).
//
// The model (llm.c's dimension alphabet, model.h): T sequence length, C width, NH heads, NKV
// key/value heads, HS = C/NH head size, H MLP width, V vocabulary.
//   gpt2 : x = wte[tok] + wpe[pos]; per layer  x += proj(attn(LN_1(x))),  x += mlp(LN_2(x)) with
//          mlp = c_proj(GELU(c_fc(·))) (exact erf, or tanh per cfg.gelu_tanh); LN_f; logits = x·wteᵀ.
//   llama: x = tok_embeddings[tok]; per layer x += wo(attn(RMSNorm(x))), x += w2(silu(w1·) ⊙ w3·)
//          after RMSNorm; final RMSNorm; logits = x·outputᵀ (tok_embeddingsᵀ when tied).
//   LayerNorm: (x − mean)/√(var + eps)·γ + β, biased variance; RMSNorm: x/√(mean(x²) + eps)·γ.
//   Attention: causal, scores = (Q_h·K_hᵀ)/√HS, softmax over keys 0..i, out_h = P_h·V_h. Query
//          head h reads key/value head h / (NH/NKV) (grouped-query attention; NKV = NH for gpt2).
//   RoPE (llama): the llama2.c / Meta convention: consecutive pairs (x[2i], x[2i+1]) of every head
//          are rotated by the angle pos·θ^(−2i/HS), i = 0..HS/2−1 (NOT Hugging Face's rotate_half,
//          which pairs x[i] with x[i + HS/2]); cos and sin are computed in binary64 and then
//          converted to T. Applied to q and k after the attn.qkv site, before attn.qk.
// LAMP (policy.lamp, lamp.h): per head and query row i, after attn.qk's scores y (rounded as the
// site says) and before the softmax: select entries of y[0..i] by the rule, replace them by the
// recomputed scores (the same block product in binary32 native — bit-identical to the FP32
// reference's scores — or strict in the recompute format, rounded to it), then softmax as usual.
// Random control words: seed, stream = stream_of(attn.qk, layer, head, i) + 4·2^30.
// Order at a GEMM site (site_gemm): product → ÷ divisor (attn.qk: √HS) → + bias → output rounding.
// At attn.qk the masked (future) scores are never used; rows are processed in blocks of 64
// queries, each against keys 0..end of its block, so about half of Q·Kᵀ and P·V is computed.
//
// Threads: heads are split over OpenMP threads; native GEMMs are cut into fixed tiles (not
// depending on the thread count) each multiplied by Eigen on one thread (Eigen's own threading
// is switched off: Eigen::setNbThreads(1)); emulated GEMMs are thread-invariant by construction.
// The logits are therefore bit-identical for any thread count.
//
// Randomness (sr / sre sites): each call of a site draws from its own Philox stream, a function
// of (site, layer, slot: head, q/k/v, gate/up or ln_1/ln_2; query row for attn.qk, softmax and
// attn.pv); a GEMM site's gemm() uses stream + 0..2 and its output rounding stream + 3; a
// nonlinearity rounds its input with stream + 1 (silu's second input + 2) and its output with
// stream + 3, element (i, j) of a [rows, cols] buffer at index i·cols + j. The attention sites
// work query row by query row: row i's scores are the GEMM q_i [1,HS] · K[0..i]ᵀ → [1, i+1], its
// softmax rounds key j at index j, and its output is P_i [1, i+1] · V[0..i] → [1, HS] (operands
// rounded per row). So a random word never depends on the sequence length or on the threads; with
// every GEMM site emulated (Eigen's native products choose their summation order by shape), the
// logits of a prefix equal the first rows of the logits of the whole sequence bit for bit.
// (Deterministic attention sites are computed in 64-row blocks; P·V then also adds the masked
// probabilities' zero products, which leave every value unchanged up to the sign of a zero.)
// Sequences with random attention sites are limited to 65,536 tokens.
#pragma once

#include <Eigen/Dense>

#include <cstdint>
#include <span>
#include <vector>

#include "nn/model.h"
#include "nn/policy.h"

namespace mantis {

template <class T> using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Range health of one site at one layer, summed over the site's calls:
//   overflow  values whose magnitude exceeded the largest finite number of the format they were
//             rounded to, at one of the site's input or output roundings (they became ±inf, ±max
//             under `saturate`, or NaN, as the format's overflow rule says). Roundings inside an
//             emulated GEMM's accumulator are not seen here: an accumulator that overflows to
//             inf (or NaN) shows in `inf` / `nan` of the output.
//   nan, inf  NaNs and infinities in the site's output (binary32 overflow of a native product
//             or nonlinearity included).
struct SiteHealth {
  uint64_t overflow = 0, nan = 0, inf = 0;
  bool clean() const { return overflow == 0 && nan == 0 && inf == 0; }
};

// What a forward pass can report besides its logits.
struct ForwardStats {
  // LAMP (policy.lamp), per layer: scores recomputed, and causal scores (NH·T(T+1)/2).
  std::vector<uint64_t> lamp_selected, lamp_entries;
  // [lamp_activation], [lamp_layernorm], per layer: recomputed entries and entries considered.
  std::vector<uint64_t> act_selected, act_entries, ln_selected, ln_entries;
  // [kSiteCount × (layers + 1)]: site s at layer l at s·(layers + 1) + l + 1; layer −1 holds the
  // model-level calls (the final norm and lm_head).
  std::vector<SiteHealth> health;
  SiteHealth& health_at(Site s, int layer) {
    return health[size_t(s) * (lamp_selected.size() + 1) + size_t(layer + 1)];
  }
  const SiteHealth& health_at(Site s, int layer) const {
    return health[size_t(s) * (lamp_selected.size() + 1) + size_t(layer + 1)];
  }
};

// Logits [T_seq, V]. InputError: empty sequence, T_seq > ctx, a token outside [0, V), a missing
// or mis-shaped parameter, a policy that does not fit the model (Policy::check), or T = double
// with a non-native policy. `stats`, when given, is filled (sized by layers).
template <class T>
Matrix<T> forward(const Model& m, std::span<const int32_t> tokens, const Policy& policy = {},
                  ForwardStats* stats = nullptr);

extern template Matrix<float> forward<float>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
extern template Matrix<double> forward<double>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);

// The GEMM of one site call, as the forward pass does it (exposed for tests):
//   out[M,N] = round_output((A[M,K] · B) / divisor + bias)
// with B given as [K,N], or as its transpose [N,K] when b_transposed (Linear weights [out,in],
// keys [T,HS]); bias: N values or null. Input rounding (if any) applies to A and to B in its
// [K,N] orientation: A[i,k] uses index i·K + k of stream + 1, B[k,j] index k·N + j of stream + 2
// (as gemm.h); output rounding of out[i,j] uses index i·N + j of stream + 3.
// `health`, when given, receives the call's range events (SiteHealth; thread-safe).
template <class T>
void site_gemm(const SitePolicy& p, Eigen::Ref<const Matrix<T>> A, Eigen::Ref<const Matrix<T>> B, bool b_transposed,
               Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor = T(1), const T* bias = nullptr,
               SiteHealth* health = nullptr);

extern template void site_gemm<float>(const SitePolicy&, Eigen::Ref<const Matrix<float>>,
                                      Eigen::Ref<const Matrix<float>>, bool, Eigen::Ref<Matrix<float>>, uint64_t,
                                      float, const float*, SiteHealth*);
extern template void site_gemm<double>(const SitePolicy&, Eigen::Ref<const Matrix<double>>,
                                       Eigen::Ref<const Matrix<double>>, bool, Eigen::Ref<Matrix<double>>, uint64_t,
                                       double, const double*, SiteHealth*);

}  // namespace mantis
