// activation — GELU (gpt2), SwiGLU (llama) and the softmax's numerators: the element math, shared
// verbatim with the CUDA twin (MANTIS_HD), then the CPU operations on whole buffers at their sites.
//   GELU    exact 0.5·x·(1 + erf(x/√2)), or the tanh approximation (cfg.gelu_tanh)
//           0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))); derivative Φ(x) + x·φ(x), or
//           ½(1+tanh u) + ½x(1−tanh²u)·√(2/π)(1 + 3·0.044715x²).
//   SwiGLU  silu(g) ⊙ u, silu(g) = g / (1 + e^−g); d gate = dh ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))),
//           d up = dh ⊙ silu(g).
// Each expression is written once: the evaluation order is part of the bits. In binary32, exp, erf
// and tanh are crmath's correctly rounded functions (core/crmath.h: the same bits on every CPU, C
// library and GPU); the binary64 reference instantiation uses the C library's.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/crmath.h"
#include "core/hd.h"

namespace mantis::act {

template <class T>
MANTIS_HD T exp(T x) {
  if constexpr (std::is_same_v<T, float>) return cr_expf(x);
  else return std::exp(x);
}

template <class T>
MANTIS_HD T erf(T x) {
  if constexpr (std::is_same_v<T, float>) return cr_erff(x);
  else return std::erf(x);
}

template <class T>
MANTIS_HD T tanh(T x) {
  if constexpr (std::is_same_v<T, float>) return cr_tanhf(x);
  else return std::tanh(x);
}

// The tanh GELU's argument √(2/π)(v + 0.044715v³).
template <class T>
MANTIS_HD T gelu_tanh_arg(T v) {
  const T k = T(0.7978845608028654), c = T(0.044715);
  return k * (v + c * v * v * v);
}

template <class T>
MANTIS_HD T gelu(T v, bool tanh_approx) {
  const T r2 = T(0.7071067811865476);  // √½
  return tanh_approx ? T(0.5) * v * (T(1) + tanh(gelu_tanh_arg(v))) : T(0.5) * v * (T(1) + erf(v * r2));
}

// The tanh GELU's derivative from th = tanh(gelu_tanh_arg(v)) (the forward's, kept for the backward).
template <class T>
MANTIS_HD T gelu_grad_from_tanh(T v, T th) {
  const T k = T(0.7978845608028654), c = T(0.044715);
  return T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * k * (T(1) + T(3) * c * v * v);
}

// The exact GELU from its erf term e = erf(v·√½) (the forward's, kept for the backward).
template <class T>
MANTIS_HD T gelu_grad_from_erf(T v, T e) {
  const T inv_sqrt_2pi = T(0.3989422804014327);
  return T(0.5) * (T(1) + e) + v * inv_sqrt_2pi * exp(T(-0.5) * v * v);
}

template <class T>
MANTIS_HD T gelu_grad(T v, bool tanh_approx) {
  const T r2 = T(0.7071067811865476);
  if (tanh_approx) return gelu_grad_from_tanh(v, tanh(gelu_tanh_arg(v)));
  return gelu_grad_from_erf(v, erf(v * r2));
}

// silu(g) ⊙ u.
template <class T>
MANTIS_HD T swiglu(T g, T u) {
  return g / (T(1) + exp(-g)) * u;
}

// silu'(g) (LAMP's activation rule).
template <class T>
MANTIS_HD T silu_grad(T g) {
  const T sg = T(1) / (T(1) + exp(-g));
  return sg * (T(1) + g * (T(1) - sg));
}

// SwiGLU backward of one element from e = exp(−g): dh → (d gate, d up).
template <class T>
MANTIS_HD void swiglu_backward_from_exp(T dh, T g, T u, T e, T& d_gate, T& d_up) {
  const T sg = T(1) / (T(1) + e);
  d_up = dh * g * sg;                                 // dh ⊙ silu(g)
  d_gate = dh * u * sg * (T(1) + g * (T(1) - sg));    // dh ⊙ up ⊙ silu'(g)
}

template <class T>
MANTIS_HD void swiglu_backward(T dh, T g, T u, T& d_gate, T& d_up) {
  swiglu_backward_from_exp(dh, g, u, exp(-g), d_gate, d_up);
}

// The stable softmax's numerators over x [n] (attention's softmax, the loss): e[j] = exp(x[j] − mx)
// with mx = max x, returned in mx; returns Σ e[j], summed in order. e may be x.
template <class T>
MANTIS_HD T softmax_numerators(const T* x, T* e, int64_t n, T& mx) {
  mx = x[0];
  for (int64_t j = 1; j < n; ++j) mx = mx < x[j] ? x[j] : mx;  // std::max(mx, x[j])
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    e[j] = exp(x[j] - mx);
    sum += e[j];
  }
  return sum;
}

}  // namespace mantis::act

#if !defined(__CUDACC__)  // the buffer operations (Eigen): CPU only
#include "nn/ops.h"

namespace mantis::detail {

// The activation sites: binary32 (T) arithmetic between the input rounding (stream + 1; silu's
// second input + 2) and the output rounding (stream + 3).
// `aux` [T,H]: the forward's elementary-function values, kept for the backward — GELU erf(x·√½)
// (exact) or tanh(√(2/π)(x + 0.044715x³)) (tanh), SiLU exp(−g) — filled when given and the site
// rounds no input (the backward then differentiates at the same inputs); otherwise emptied, and the
// backward recomputes them.
// GELU in place on h [T,H].
template <class T>
void gelu_forward(const SitePlan& p, uint64_t stream, bool tanh_approx, Matrix<T>& h, SiteHealth* hl,
                  Matrix<T>* aux = nullptr);
// SwiGLU in place: g [T,H] ← silu(g) ⊙ u (u [T,H] is rounded in place too).
template <class T>
void silu_forward(const SitePlan& p, uint64_t stream, Matrix<T>& g, Matrix<T>& u, SiteHealth* h,
                  Matrix<T>* aux = nullptr);

// Backward (the roundings straight-through): d [T,H] ← d ⊙ GELU'(pre).
template <class T>
void gelu_backward(const Matrix<T>& pre, bool tanh_approx, Matrix<T>& d, const Matrix<T>* aux = nullptr);
// dh [T,H] → d gate in place, d up into dup [T,H]; gate, up: the forward's w1·x and w3·x.
template <class T>
void swiglu_backward(const Matrix<T>& gate, const Matrix<T>& up, Matrix<T>& dh, Matrix<T>& dup,
                     const Matrix<T>* aux = nullptr);

// act::softmax_numerators's values and sum, on the CPU: the max and the exponentials vectorised
// (crmath's array kernel), the sum in order.
template <class T>
T softmax_numerators(const T* x, T* e, int64_t n, T& mx);

// LAMP at the activation ([lamp_activation], lamp.h): y [T,N] = A·Wᵀ + b was computed at its
// site's precision; entries with |σ'(y)|·|y| > τ (σ: GELU, or silu for the llama gate) take the
// product recomputed at `recompute` (PolicyPlan::lamp_activation). Returns how many.
uint64_t lamp_activation_fix(const LampSiteSpec& s, const SitePlan& recompute, const Matrix<float>& A,
                             Eigen::Ref<const Matrix<float>> w, const float* bias, Matrix<float>& y, Site activation,
                             bool gelu_tanh);

}  // namespace mantis::detail
#endif
