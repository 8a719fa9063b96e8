// lora — low-rank adapters (LoRA, Hu et al. 2021) on a model's projection weights, the base
// weights frozen: y = site(x·Wᵀ + b) + s·(x·Aᵀ)·Bᵀ, s = alpha / r, A [r,in], B [out,r].
//
// Where the adapter sits and how it rounds (T = float: the simulator; double: the reference):
//   forward   after the site's GEMM (its policy, bias and output rounding untouched), in T:
//             u = x·Aᵀ [N,r]; u ← s·u; y += u·Bᵀ — Eigen products on one thread (their order fixed
//             by the shapes alone), so the logits are the same for any thread count.
//   backward  with x̃ the unit's saved activation (backward.h: exact, or quantised as the unit's
//             path says — the adapter's weight gradients see what the base dW would), in T:
//             us = s·(x̃·Aᵀ); dB += dyᵀ·us; gs = s·(dy·B) [N,r]; dA += gsᵀ·x̃; dx += gs·A.
//             The trainer skips the frozen base's GEMM weight gradients (backward.h
//             base_weight_grads = false: a third of the backward GEMMs); a LoRA run's optimizer
//             never sees the base.
// Targets are units (nn/site.h): every weight of the unit at every layer gets an adapter (llama's
// qkv: wq, wk, wv; fc: w1 and w3); biases, norms, embeddings and lm_head never.
// Initialisation (PEFT's default): A ~ U(−1/√in, 1/√in) from Philox words (seed, stream = the
// adapter's index in lora_targets order, index i), B = 0, so a fresh adapter changes nothing.
// Merging: W ← round_binary32(W + s·B·A), the sum over r in binary64 in index order.
// LAMP's closed forms for activations and norms (policy lamp_activation / lamp_layernorm) recompute
// projections from the base weights alone, so they are refused with adapters (InputError).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/grad.h"
#include "nn/model.h"
#include "nn/ops.h"
#include "nn/site.h"

namespace mantis {

struct LoraSpec {
  int rank = 8;
  double alpha = 0;          // 0: alpha = rank (s = 1)
  std::vector<Unit> units;   // which projections carry adapters
};

// The adapted weights (base parameter names) of `units`, in parameter_infos order.
std::vector<std::string> lora_targets(const ModelConfig& c, const std::vector<Unit>& units);
// Fresh adapters (header comment). InputError: rank < 1 or above a target's smaller side, alpha
// negative or not finite, no units.
Adapters init_lora(const ModelConfig& c, const LoraSpec& spec, uint64_t seed);
// InputError naming the tensor unless every adapter tensor is "<projection weight>.lora_A|B" with
// its partner, the right shapes for the rank, finite values; rank ≥ 1 and alpha > 0 when any exist.
void validate(const Adapters& a, const ModelConfig& c);
inline double lora_scale(const Adapters& a) { return a.rank > 0 ? a.alpha / a.rank : 0.0; }
// The model with every adapter folded into its weight (header comment) and none left.
Model merge_lora(const Model& m);
// Parse "attn.qkv" | "attn.proj" | "mlp.fc" | "mlp.proj" (InputError naming the value otherwise).
Unit unit_from_name(const std::string& name);

namespace detail {

// The adapters of a model (and their gradient buffers, in backward) by (role, layer), resolved
// once per pass; T = double holds converted copies.
template <class T>
class LoraViews {
 public:
  explicit LoraViews(const Model& m, GradMap<T>* grads = nullptr);
  bool empty() const { return slots_.empty(); }
  // y [N,out] += s·(x·Aᵀ)·Bᵀ for the weight of `role` at layer l (nothing if it has no adapter).
  void forward(Role role, int l, const Matrix<T>& x, Eigen::Ref<Matrix<T>> y) const;
  // The adapter's gradients (into the grads given at construction) and its share of dx.
  void backward(Role role, int l, const Matrix<T>& dy, const Matrix<T>& x_saved, Matrix<T>& dx) const;

 private:
  struct Slot {
    Matrix<T> a, b;      // [r,in], [out,r]
    T* da = nullptr;     // [r,in] row-major gradient buffers (backward)
    T* db = nullptr;     // [out,r]
  };
  const Slot* find(Role role, int l) const;
  std::map<std::pair<int, int>, Slot> slots_;  // (role, layer)
  T scale_ = 0;
};

extern template class LoraViews<float>;
extern template class LoraViews<double>;

}  // namespace detail
}  // namespace mantis
