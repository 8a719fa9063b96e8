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
//   LayerNorm / RMSNorm (norm.h), GELU / SwiGLU (activation.h), causal attention with
//          grouped-query heads, RoPE (llama: applied to q and k after the attn.qkv site, before
//          attn.qk) and LAMP at the scores (attention.h), a site's GEMM (linear.h).
// LAMP's other closed forms (policy.lamp_activation / lamp_layernorm, lamp.h) recompute entries of
// the mlp.fc output and of the projections added to the residual stream before the next norm.
//
// Threads: heads are split over OpenMP threads; native GEMMs are cut into fixed tiles (linear.h);
// emulated GEMMs are thread-invariant by construction. The logits are therefore bit-identical for
// any thread count.
//
// Randomness (sr / sre sites): each call of a site draws from its own Philox stream, a function
// of (site, layer, slot; query row for attn.qk, softmax and attn.pv): streams.h defines every key.
// Element (i, j) of a [rows, cols] buffer is rounded at index i·cols + j. So a random word never
// depends on the sequence length or on the threads; with every GEMM site emulated (Eigen's native
// products choose their summation order by shape), the logits of a prefix equal the first rows of
// the logits of the whole sequence bit for bit. Sequences with random attention sites are limited
// to 65,536 tokens (kMaxRandomRows).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "nn/linear.h"  // defines: Matrix, SiteHealth, site_gemm
#include "nn/model.h"
#include "nn/policy.h"

namespace mantis {

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
// The Policy overload compiles the policy (PolicyPlan, policy.h) and calls the plan overload; a
// caller running many sequences under one policy can compile it once. A plan compiled for
// another configuration is an InputError.
template <class T>
Matrix<T> forward(const Model& m, std::span<const int32_t> tokens, const Policy& policy = {},
                  ForwardStats* stats = nullptr);
template <class T>
Matrix<T> forward(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& plan,
                  ForwardStats* stats = nullptr);

// A binary32 forward pass's implementation, chosen by the caller (`--device`): empty means
// forward<float> on the CPU; the GPU's comes from cuda/forward.h (gpu::forward_fn). Every backend
// fills stats (the site health included) as forward<float> does.
using ForwardFn = std::function<Matrix<float>(const Model&, std::span<const int32_t>, const PolicyPlan&, ForwardStats*)>;
// fn's forward, or forward<float> when fn is empty.
Matrix<float> forward_on(const ForwardFn& fn, const Model& m, std::span<const int32_t> tokens, const Policy& policy,
                         ForwardStats* stats = nullptr);

extern template Matrix<float> forward<float>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
extern template Matrix<double> forward<double>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
extern template Matrix<float> forward<float>(const Model&, std::span<const int32_t>, const PolicyPlan&, ForwardStats*);
extern template Matrix<double> forward<double>(const Model&, std::span<const int32_t>, const PolicyPlan&,
                                               ForwardStats*);

}  // namespace mantis
