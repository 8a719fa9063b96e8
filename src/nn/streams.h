// streams — every random-stream key of the forward and backward passes, defined once (shared
// with the CUDA twin: one drifted key breaks bit-exact stochastic rounding).
//
// The words of a stream are Philox (seed, stream, index) (core/philox.h). A site call's stream:
// 30 bits of layer + 1, 4 of site, 12 of slot, 16 of query row, and 2 low bits for the
// sub-streams +0..+3 (below). Slots: the head at the attention sites; ln_1 / ln_2 (0 / 1);
// gpt2's fused c_attn or q / k / v (0 / 1 / 2); c_fc or gate / up (0 / 1). Rows: the query row
// at the attention sites when they are random (a word then depends neither on the sequence length
// nor on the threads); 0 elsewhere. kMaxRandomRows keeps the rows' keys distinct.
#pragma once

#include <cstdint>

#include "core/accumulate.h"  // defines: kStreamA, kStreamB
#include "core/hd.h"
#include "nn/site.h"

namespace mantis {

constexpr int64_t kMaxRandomRows = int64_t(1) << 16;

// Sub-streams of a site call: gemm() accumulates on + 0 and rounds its operands on + kStreamA and
// + kStreamB (core/accumulate.h); a nonlinearity rounds its input on + kStreamA (silu's second
// input + kStreamB); every output rounding uses + kStreamOutput.
constexpr uint64_t kStreamOutput = 3;

// The fields' widths: layer + 1 in 30 bits, site 4, slot 12, row 16, 2 for the operand.
inline constexpr int kStreamMaxLayer = (1 << 30) - 2;
inline constexpr int64_t kStreamMaxSlot = (int64_t(1) << 12) - 1;
MANTIS_HD uint64_t stream_of(Site s, int layer, int64_t slot, int64_t row = 0) {
  return ((((uint64_t(layer + 1) << 4 | uint64_t(s)) << 12 | uint64_t(slot)) << 16 | uint64_t(row)) << 2);
}

// Forward pass, by site.
MANTIS_HD uint64_t norm_stream(int layer, int which) { return stream_of(Site::ln, layer, which); }  // final: (−1, 0)
MANTIS_HD uint64_t qkv_stream(int layer, int part) { return stream_of(Site::attn_qkv, layer, part); }
MANTIS_HD uint64_t qk_stream(int layer, int64_t head, int64_t row = 0) { return stream_of(Site::attn_qk, layer, head, row); }
MANTIS_HD uint64_t softmax_stream(int layer, int64_t head, int64_t row) { return stream_of(Site::softmax, layer, head, row); }
MANTIS_HD uint64_t pv_stream(int layer, int64_t head, int64_t row = 0) { return stream_of(Site::attn_pv, layer, head, row); }
MANTIS_HD uint64_t attn_proj_stream(int layer) { return stream_of(Site::attn_proj, layer, 0); }
MANTIS_HD uint64_t fc_stream(int layer, int part) { return stream_of(Site::mlp_fc, layer, part); }
MANTIS_HD uint64_t mlp_proj_stream(int layer) { return stream_of(Site::mlp_proj, layer, 0); }
MANTIS_HD uint64_t activation_stream(Site gelu_or_silu, int layer) { return stream_of(gelu_or_silu, layer, 0); }
MANTIS_HD uint64_t lm_head_stream() { return stream_of(Site::lm_head, -1, 0); }

// LAMP at attn.qk: the recomputed scores of a block (row 0) and the random control's draws of row
// i use the score key + 4·2^30, which adds 4 to the site field (kept for the committed results).
constexpr uint64_t kLampStreamOffset = uint64_t(4) << 30;
MANTIS_HD uint64_t lamp_stream(int layer, int64_t head, int64_t row = 0) {
  return qk_stream(layer, head, row) + kLampStreamOffset;
}
// [lamp_activation] / [lamp_layernorm] recompute on stream 0 (strict RNE or native: no words).
constexpr uint64_t kLampFixStream = 0;

// Backward GEMMs (backward.h): the forward key with slot + 1024·pass.
MANTIS_HD uint64_t grad_stream(Site s, int layer, int64_t slot, Pass p) {
  return stream_of(s, layer, slot + 1024 * int64_t(p));
}

// sr quantisation of a unit's saved activation (backward.h) at training step `step`.
MANTIS_HD uint64_t saved_stream(uint64_t step, int layer, Unit u) {
  return (step << 20) | uint64_t(layer) << 2 | uint64_t(u);
}

}  // namespace mantis
