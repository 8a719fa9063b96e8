// tape — what a training forward pass keeps for the backward pass (internal to forward.cpp and
// backward.cpp). Every tensor is the value the next step of the forward pass consumed, after the
// site roundings of the producing step (forward.h), so the backward pass differentiates the
// computation actually performed (rounding steps straight-through).
#pragma once

#include <cmath>
#include <span>
#include <vector>

#include "nn/forward.h"

namespace mantis::detail {

// The Philox stream of one site call (forward.h, "Randomness"): 30 bits of layer + 1, 4 of site,
// 12 of slot, 16 of query row (attention sites; kMaxRandomRows keeps streams distinct), and 2 low
// bits for the sub-streams +0..+3. The backward GEMMs (backward.h) use slot + 1024·pass.
constexpr Eigen::Index kMaxRandomRows = Eigen::Index(1) << 16;
inline uint64_t stream_of(Site s, int layer, Eigen::Index slot, Eigen::Index row = 0) {
  return ((((uint64_t(layer + 1) << 4 | uint64_t(s)) << 12 | uint64_t(slot)) << 16 | uint64_t(row)) << 2);
}

// Derivatives of the activations (backward pass and LAMP's activation rule).
template <class T>
T gelu_grad(T v, bool tanh_approx) {
  const T k = T(0.7978845608028654), c = T(0.044715), r2 = T(0.7071067811865476), inv_sqrt_2pi = T(0.3989422804014327);
  if (tanh_approx) {
    const T th = std::tanh(k * (v + c * v * v * v));
    return T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * k * (T(1) + T(3) * c * v * v);
  }
  return T(0.5) * (T(1) + std::erf(v * r2)) + v * inv_sqrt_2pi * std::exp(T(-0.5) * v * v);
}
template <class T>
T silu_grad(T g) {
  const T sg = T(1) / (T(1) + std::exp(-g));
  return sg * (T(1) + g * (T(1) - sg));
}

// True when the site draws random words (sr / sre on some rounding it does).
inline bool is_random(const SitePolicy& p) {
  return !p.is_native() && (p.rounding == Rounding::sr || p.rounding == Rounding::sre);
}

template <class T>
struct LayerTape {
  Matrix<T> x_in;    // [T,C] residual stream entering the layer (input of ln_1 / attention_norm)
  Matrix<T> xn1;     // [T,C] its normalisation: the operand of attn.qkv
  Matrix<T> q, k, v; // [T,C], [T,NKV·HS], [T,NKV·HS] (llama: q and k after RoPE)
  std::vector<Matrix<T>> probs;  // NH × [T,T]: softmax rows (query i: keys 0..i, the rest 0)
  Matrix<T> att;     // [T,C] attention output: the operand of attn.proj
  Matrix<T> x_mid;   // [T,C] residual stream after attention (input of ln_2 / ffn_norm)
  Matrix<T> xn2;     // [T,C] its normalisation: the operand of mlp.fc
  Matrix<T> pre;     // [T,H] gpt2: c_fc output (GELU's input); llama: w1·x (silu's input)
  Matrix<T> up;      // [T,H] llama: w3·x
  Matrix<T> act;     // [T,H] GELU / SwiGLU output: the operand of mlp.proj
};

template <class T>
struct Tape {
  std::vector<LayerTape<T>> layers;
  Matrix<T> x_final;     // [T,C] residual stream after the last layer
  Matrix<T> xnf;         // [T,C] final norm output: the operand of lm_head
  Matrix<T> rcos, rsin;  // [T,HS/2] llama's RoPE tables
};

// forward<T> (forward.h) that also fills `tape`; the logits are bit-identical to forward<T>'s.
template <class T>
Matrix<T> forward_tape(const Model& m, std::span<const int32_t> tokens, const Policy& policy, Tape<T>& tape);

}  // namespace mantis::detail
