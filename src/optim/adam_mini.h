// adam_mini — Adam-mini (Zhang et al. 2024; zyushun/Adam-mini adam_mini.py, version 1.1.1): Adam
// with one second moment v per block of a tensor, the blocks taken from the parameter roles
// (nn/model.h ParamInfo), never from names. m stays full binary32.
//
// Partition (the v entries a tensor gets; v1.1.1's name classes in brackets):
//   biases (ParamInfo::bias, norm biases too)      one v per element, plain Adam    ["bias"]
//   wq, wk                                         one v per head: head_blocks blocks of head_rows rows
//                                                  (grouped-query wk: NKV blocks)     [wqk_names]
//   gpt2's fused attn_qkv weight                   its 2·NH q and k head blocks, one v per head, then
//                                                  one v per row of its C v rows (the split v1.1.1 makes
//                                                  for separate q/k/v projections; by name it gives HF's
//                                                  c_attn a single v — papers addendum §5)
//   tok_emb, pos_emb, lm_head, wv, attn_proj,
//   mlp_fc / mlp_gate / mlp_up / mlp_proj          one v per output row             [embd, output, wv,
//                                                                                    attn_proj, mlp]
//   norm weights (norm1, norm2, norm_f)            one v per tensor                 [the "other" branch]
// Deviation by design: v1.1.1 matches embeddings by "embed", "embd", "wte" only, so HF GPT-2's wpe
// (and its c_attn, attn.c_proj) fall into the one-v-per-tensor branch; here pos_emb is an
// embedding (one v per position row) and attn_proj one v per row, as the partition says.
//
// One step, t = 1, 2, … (v1.1.1's order; scalars in binary64, rounded to binary32 where they meet
// a tensor, as PyTorch does; lerp and add-with-alpha as PyTorch's vectorised CPU kernels, i.e. with
// one fused multiply-add, the form the Gefen restatement matched bit for bit — papers.md §5.6):
//   bc1 = 1 − β1^t, bc2 = 1 − β2^t (binary64), w = f32(1 − β1)
//   lerp(m, g)  = fma(w, g − m, m)            if w < 0.5, else fma(w − 1, g − m, g)
//   block tensors (per head / row / tensor), block b of length L:
//     s_b  = gefen_torch_sum(g_i·g_i, i ∈ b) / f32(L)   (torch.mean(g·g, dim=1) and, for norms,
//                                               torch.sum(g·g) / numel: g·g in binary32, summed in
//                                               binary32 in ATen's 8-lane cascade order (optim/gefen.h),
//                                               then one binary32 division)
//     v_b  = fma(s_b, f32(1 − β2), f32(β2)·v_b)
//     p    = p·f32(1 − lr·wd)                  (only decays() tensors, only when wd > 0)
//     m    = lerp(m, g)
//     h_b  = √v_b / f32(√bc2) + f32(ε)
//     k_b  = (1 / h_b) · f32(1 / bc1)          (torch's scalar / tensor is reciprocal · scalar)
//     p    = p + (−((m·k_b)·f32(lr)))
//   biases (per element):
//     v = fma(f32(1 − β2)·g, g, f32(β2)·v)      (addcmul: torch 1.13's CPU kernel fuses it so)
//     p = p·f32(1 − lr·wd) (never: 1-D), m = lerp(m, g), h = √v / f32(√bc2) + f32(ε)
//     p = p + (f32(−lr / bc1)·m) / h           (addcdiv)
// Weight decay: v1.1.1 disables it for names containing "norm", "ln" or "bias"; decays() (≥ 2
// dimensions) picks the same tensors of both shipped model families.
// Checked once against adam_mini.py 1.1.1 itself (Debian's torch 1.13, CPU, one thread; a
// llama-named set of every role but the fused qkv, 5 steps, wd 0.1): every parameter bit-identical.
// Also measured there:
// torch 1.13's CPU addcmul, add(alpha) and lerp are fused as written above, addcdiv is not.
// State: <param>.m f32 [param shape]; <param>.v f32 [number of v blocks]; + the step count.
// [optimizer] keys: name = "adam-mini", beta1 (0.9), beta2 (0.999), eps (1e-8; v1.1.1's default,
// its docstring says 1e-6), weight_decay (0.0, v1.1.1's default).
// Needs parameter roles: a ParamSet without them (a replay file alone) is an InputError.
#pragma once

#include <memory>

#include "optim/optimizer.h"

namespace mantis {

struct AdamMiniConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

// How a tensor's row-major elements split into v blocks: `count` consecutive blocks of `length`
// elements each, segment after segment.
struct VSegment {
  uint64_t count = 0, length = 0;
};
struct AdamMiniPartition {
  bool adam = false;  // a bias: plain Adam, one v per element
  std::vector<VSegment> segments;
  uint64_t blocks() const;  // number of v entries
};
// The partition of one parameter from its role (InputError if its shape contradicts the role).
AdamMiniPartition adam_mini_partition(const ParamInfo& p);

// InputError unless 0 ≤ β < 1, ε > 0, wd ≥ 0.
void validate(const AdamMiniConfig& c);
std::unique_ptr<Optimizer> make_adam_mini(const ParamSet& p, const AdamMiniConfig& c);
OptimizerEntry adam_mini_entry();

}  // namespace mantis
