// norm — LayerNorm (gpt2) and RMSNorm (llama) of every row, forward and backward, and LAMP's
// recompute rule at a norm's input ([lamp_layernorm], lamp.h).
//   LayerNorm: (x − mean)/√(var + eps)·γ + β, biased variance; RMSNorm: x/√(mean(x²) + eps)·γ.
//   backward, LayerNorm: dx = rstd·(g − mean(g) − x̂·mean(g ⊙ x̂)), g = dy ⊙ γ; dγ += Σ dy ⊙ x̂, dβ += Σ dy.
//             RMSNorm:   dx = r·(g − x·r²·mean(g ⊙ x)), r = 1/√(mean(x²)+eps); dγ += Σ dy ⊙ x·r.
#pragma once

#include <cstdint>

#include "nn/ops.h"

namespace mantis::detail {

// LayerNorm (b non-null) or RMSNorm (b null) of every row of x [T,C] into out [T,C], binary32 (T)
// arithmetic between the site's input rounding (stream + 1; x itself is left untouched) and
// output rounding (stream + 3).
template <class T>
void norm_forward(const SitePlan& p, uint64_t stream, const Matrix<T>& x, const T* w, const T* b, T eps,
                  Matrix<T>& out, SiteHealth* h);

// The gradient of norm_forward with weight w (rounding steps straight-through): dx += ∂, dw += Σ,
// db += Σ (LayerNorm only; rows in order).
template <class T>
void norm_backward(const Matrix<T>& x, const T* w, T eps, bool layer_norm, const Matrix<T>& dy, Matrix<T>& dx,
                   T* dw, T* db);

// y [T,C] = A·Wᵀ + b (a projection, computed at its site's precision) is about to be added to the
// residual stream r [T,C], whose sum the next norm (weight γ) reads: greedy on
// κ_j = |r_j + y_j|·|γ_j|/σ, the selected y_j take the product recomputed at `recompute`
// (PolicyPlan::lamp_layernorm). Returns how many.
uint64_t lamp_layernorm_fix(const LampSiteSpec& s, const SitePlan& recompute, const Matrix<float>& A,
                            Eigen::Ref<const Matrix<float>> w, const float* bias, const Matrix<float>& r,
                            Matrix<float>& y, const float* gamma, float eps);

}  // namespace mantis::detail
