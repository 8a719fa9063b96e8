// tape — what a training forward pass keeps for the backward pass (internal to forward.cpp and
// backward.cpp). Every tensor is the value the next step of the forward pass consumed, after the
// site roundings of the producing step (forward.h), so the backward pass differentiates the
// computation actually performed (rounding steps straight-through).
#pragma once

#include <span>
#include <vector>

#include "nn/forward.h"

namespace mantis::detail {

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
  Matrix<T> aux;     // [T,H] the activation's erf / exp values for its backward, or empty (activation.h)
  Matrix<T> act;     // [T,H] GELU / SwiGLU output: the operand of mlp.proj
};

template <class T>
struct Tape {
  std::vector<LayerTape<T>> layers;
  Matrix<T> x_final;     // [T,C] residual stream after the last layer
  Matrix<T> xnf;         // [T,C] final norm output: the operand of lm_head
  Matrix<T> rcos, rsin;  // [T,HS/2] llama's RoPE tables
};

// What forward<T> checks before it compiles the policy: the configuration and the tokens.
void check_tokens(const Model& m, std::span<const int32_t> tokens);

// forward<T> (forward.h) that also fills `tape`; the logits are bit-identical to forward<T>'s.
template <class T>
Matrix<T> forward_tape(const Model& m, std::span<const int32_t> tokens, const Policy& policy, Tape<T>& tape);
template <class T>
Matrix<T> forward_tape(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& plan, Tape<T>& tape);

}  // namespace mantis::detail
