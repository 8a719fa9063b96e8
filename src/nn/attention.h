// attention — causal multi-head attention with grouped-query heads, RoPE, and LAMP at the scores.
//
//   scores = (Q_h·K_hᵀ)/√HS, softmax over keys 0..i, out_h = P_h·V_h. Query head h reads key/value
//   head h / (NH/NKV) (grouped-query attention; NKV = NH for gpt2). Heads are split over OpenMP
//   threads. The masked (future) scores are never used: rows are processed in blocks of 64
//   queries, each against keys 0..end of its block, so about half of Q·Kᵀ and P·V is computed.
//   Random attention sites work query row by query row (streams.h): row i's scores are the GEMM
//   q_i [1,HS] · K[0..i]ᵀ → [1, i+1], its softmax rounds key j at index j, and its output is
//   P_i [1, i+1] · V[0..i] → [1, HS]. (Deterministic sites are computed in 64-row blocks; P·V then
//   also adds the masked probabilities' zero products, which leave every value unchanged up to
//   the sign of a zero.)
//   LAMP (policy.lamp, lamp.h): per head and query row i, after attn.qk's scores y (rounded as
//   the site says) and before the softmax: select entries of y[0..i] by the rule, replace them by
//   the recomputed scores (the same block product in binary32 native — bit-identical to the FP32
//   reference's scores — or strict in the recompute format, rounded to it).
//   Backward, per head: dP = dO·Vᵀ (attn.pv dx), dV = Pᵀ·dO (attn.pv dw),
//   dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS·K/√HS (attn.qk dx), dK = dSᵀ·Q/√HS (attn.qk dw); over
//   full [T,T] matrices whose masked entries are 0. Grouped-query heads add into their key/value
//   head in head order.
// RoPE (llama): the llama2.c / Meta convention: consecutive pairs (x[2i], x[2i+1]) of every head
//   are rotated by the angle pos·θ^(−2i/HS), i = 0..HS/2−1 (NOT Hugging Face's rotate_half, which
//   pairs x[i] with x[i + HS/2]); cos and sin are computed in binary64 and then converted to T.
#pragma once

#include <vector>

#include "nn/ops.h"

namespace mantis::detail {

// q [T, NH·HS], k, v [T, NKV·HS] → out [T, NH·HS] at layer l's attn.qk, softmax and attn.pv sites
// (and policy.lamp); probs, when given, receives NH × [T,T] softmax rows (query i: keys 0..i, the
// rest 0). Returns how many scores LAMP recomputed.
template <class T>
uint64_t attention_forward(const PolicyPlan& pol, int l, const Eigen::Ref<const Matrix<T>>& q,
                           const Eigen::Ref<const Matrix<T>>& k, const Eigen::Ref<const Matrix<T>>& v, Eigen::Index NH,
                           Eigen::Index NKV, Eigen::Index HS, Matrix<T>& out, std::vector<Matrix<T>>* probs,
                           const AttentionHealth& health);

// datt [T,C] → dq [T,C], dk, dv [T,NKV·HS], from the forward's probs, q, k, v (llama: after RoPE).
template <class T>
void attention_backward(const PolicyPlan& pol, int l, const std::vector<Matrix<T>>& probs, const Matrix<T>& q,
                        const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& datt, Eigen::Index NH,
                        Eigen::Index NKV, Eigen::Index HS, Matrix<T>& dq, Matrix<T>& dk, Matrix<T>& dv);

// RoPE's angles for positions 0..T−1: cos_, sin_ [T, HS/2].
template <class T>
void rope_tables(Eigen::Index T_, Eigen::Index HS, double theta, Matrix<T>& cos_, Matrix<T>& sin_);
// Rotates the pairs of each of the nh heads of x [T, nh·HS] at position t by the angles of row t
// (inverse: by their negatives).
template <class T>
void rope_rotate(Matrix<T>& x, Eigen::Index nh, Eigen::Index HS, const Matrix<T>& cos_, const Matrix<T>& sin_,
                 bool inverse);
// RoPE on q or k, and its backward on their gradient.
template <class T>
void rope_forward(Matrix<T>& x, Eigen::Index nh, Eigen::Index HS, const Matrix<T>& cos_, const Matrix<T>& sin_) {
  rope_rotate(x, nh, HS, cos_, sin_, false);
}
template <class T>
void rope_backward(Matrix<T>& d, Eigen::Index nh, Eigen::Index HS, const Matrix<T>& cos_, const Matrix<T>& sin_) {
  rope_rotate(d, nh, HS, cos_, sin_, true);
}

}  // namespace mantis::detail
