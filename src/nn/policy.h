// policy — the precision each site of a transformer forward pass computes in.
//
// A site is a named operation of the forward pass (forward.h):
//   GEMM sites
//     attn.qkv   the q/k/v projections (gpt2: the fused c_attn; llama: wq, wk, wv)
//     attn.qk    the scores Q·Kᵀ of every head (its `output` rounding comes AFTER the 1/√HS scaling)
//     attn.pv    softmax(scores)·V of every head
//     attn.proj  the attention output projection (gpt2 c_proj; llama wo)
//     mlp.fc     gpt2 c_fc; llama w1 (gate) and w3 (up)
//     mlp.proj   gpt2 mlp.c_proj; llama w2 (down)
//     lm_head    the output projection to the vocabulary (tied or not), after the final norm
//   nonlinearity sites (computed in binary32 between an optional input and output rounding)
//     ln         LayerNorm (gpt2) / RMSNorm (llama): ln_1, ln_2 (attention_norm, ffn_norm) and the
//                final ln_f (norm); the final one only follows the all-layers entry
//     softmax    the attention softmax (its input rounding sees only the causal, unmasked scores)
//     gelu       gpt2's GELU (input: the c_fc output; output: GELU's result)
//     silu       llama's SwiGLU product silu(w1·x) ⊙ (w3·x) (input: both w1·x and w3·x; output: the
//                product). A non-native `gelu` on a llama model or `silu` on a gpt2 model is an error.
//
// A site entry holds for every layer (`attn.qk`) or for one layer (`layer.3.attn.qk`). A layer
// entry REPLACES the all-layers entry for that layer as a whole: keys it does not give take their
// defaults, not the all-layers values. `lm_head` has no layer entries.
//
// GEMM site keys (TOML, under [site."<name>"]):
//   accumulation = native | strict | unfused | blocked | promoted | tensor_core   (default native:
//                  Eigen's binary32 product; the others gemm.h's)
//   accumulator  = format       required unless native; the accumulator of gemm.h's GemmSpec
//                  (promoted: the chunk's; the output is the binary32 accumulator)
//   block        = k_b          blocked, promoted, tensor_core (default 32)
//   align_bits   = F            tensor_core: bits kept below the block's largest term (default 24)
//   tensor_core  = GPU          that GPU's matrix unit bit for bit (v100, a100, a2, ada, l40s, h100,
//                  h200, b200; "h100:wgmma" / "h100:mma" choose the datapath; core/matrix_unit.h):
//                  accumulation tensor_core, accumulator = the unit's output (fp32 unless given:
//                  fp32 or fp16), `input` = the unit's input format (required); the unit rounds
//                  its own way, so `rounding` applies to the input and output roundings only
//   promote_every = P, split_k = S   with a GPU: the kernel's drive of the unit (core/matrix_unit.h
//                  MuKernel): each run of P products into a binary32 register (DeepGEMM: 128),
//                  K in S parts summed in binary32; defaults 0 and 1 (the unit over all of K)
//   tensor_core  = preset       (superseded: v100_fp16, a100_fp16, hopper_fp8) the older model with a
//                  preset's block, align_bits, accumulator and rounding (gemm.h
//                  tensor_core_presets), each unless given; kept so that committed results reproduce
//   input        = format       round both operands to it first (native too)
//   input_a, input_b = format or scheme   one operand's own rounding instead (not with `input`):
//                  a format rounds it element-wise (as `input` does); a scaled scheme (scheme.h:
//                  mxfp8_e4m3, nvfp4, deepseek_act, … or a scheme .toml) quantises it with its
//                  blocks along the reduction dimension: A [M,K] takes the scheme's block as given,
//                  B in its [K,N] orientation the block transposed (so [1, 32] runs along K for
//                  both, and int8_channel's per-row block is per output channel of a weight
//                  [out, in]). Random words: A's element (i, k) index i·K + k of stream + 1, B's
//                  (k, j) index k·N + j of stream + 2, as `input`. Saturated scheme elements count
//                  as the site's overflows. At the attention sites the operands are those of each
//                  call (a block of 64 queries against keys 0..its end; one query row with random
//                  rounding, and at attn.pv for a block whose values are not all finite:
//                  attention_row.h), so a scheme whose blocks span more than the reduction dimension
//                  (per tensor, 128×128) sees that call's operand.
//   output       = format       round the site's result: (A·B) / divisor + bias, in binary32
//   rounding     = mode         for every rounding at the site (input, accumulator, output); rne
//   seed, sr_bits               randomness of sr / sre (round_array.h); defaults 0 and 32
//   sr_packed = true            2 (sr_bits ≤ 16) or 4 (≤ 8) roundings per random word, as
//                               Blackwell's cvt.rs (philox.h sr_word); not with scheme operands
// Nonlinearity site keys: input, output, rounding, seed, sr_bits, sr_packed.
// Training (backward.h): a GEMM site entry may hold sub-tables `dx` and `dw` with the GEMM keys,
// the two backward GEMMs of that site — dX = dY·W (gradient of the first operand) and
// dW = dYᵀ·X (of the second: the weight; at attn.qk the keys, at attn.pv the values):
//   [site."mlp.fc".dw]
//   input = "bf16"
//   accumulation = "strict"
//   accumulator = "fp32"
// A missing dx / dw is native binary32 (it does not inherit the forward keys). Nonlinearity
// sites round only in the forward pass; their backward is straight-through (the derivative of a
// rounding is taken as 1) and computed in binary32.
// Formats go through format_lookup (format.h): named, ps<μ>, e<E>m<M> or a .toml path (relative to
// the working directory, not to the policy file). Input and output formats must fit binary32 (the
// float forward pass rounds binary32 values in place). An accumulator wider than binary32 (say
// fp64) is allowed; its result is converted to binary32 (RNE) before bias and output rounding.
//
// Example (LAMP's setup, Budzinskiy et al. 2026: only the score GEMM in PS(4), strict):
//   [site."attn.qk"]
//   accumulation = "strict"
//   accumulator = "ps4"
//   output = "ps4"
// LAMP (lamp.h), a top-level table: the scores attn.qk computes are checked row by row and the
// selected ones replaced by their recomputation in `recompute` (default fp32: the native
// binary32 product, exactly the FP32 reference's scores; a format: strict accumulation in it and
// the result rounded to it), before the softmax:
//   [lamp]
//   rule = "strict"          # or "relaxed"
//   tau = 1.0
//   length_scaling = false   # τ_i = min(1, τ·√(1024/(i+1)))
//   random = false           # the random control: as many entries per row, uniformly
//   seed = 0
//   recompute = "fp32"
//   [lamp_activation]        # κ_j = |σ'(y_j)|·|y_j| > τ on the mlp.fc output y (llama: the gate)
//   tau = 0.1
//   recompute = "fp32"
//   [lamp_layernorm]         # greedy on κ_j = |x_j|·|γ_j|/σ of the next norm's input x = r + y,
//   tau = 1.0                # recomputing the entries of y (the attn.proj / mlp.proj output)
//   recompute = "fp32"
// The empty policy (default-constructed) is everything native binary32.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/format.h"
#include "core/gemm.h"  // defines: GemmSpec, GemmPlan
#include "core/round_array.h"  // defines: RoundPlan
#include "core/scheme.h"
#include "nn/lamp.h"
#include "nn/model.h"
#include "nn/site.h"  // defines: Site, Pass

namespace mantis {

const char* to_string(Site s);                       // "attn.qk", ...
bool is_gemm(Site s);                                // attn.*, mlp.*, lm_head
std::optional<Site> site_from_string(std::string_view name);
std::string site_names();                            // "attn.qkv, attn.qk, ..., silu"

// One GEMM operand's own rounding (input_a / input_b): element-wise to a format, or a scaled
// scheme (exactly one of the two).
struct OperandQuant {
  std::optional<Format> format;
  std::optional<Scheme> scheme;
  const std::string& name() const { return format ? format->name : scheme->name; }
};

struct SitePolicy {
  std::optional<Accumulation> accumulation;  // GEMM sites; nullopt = native (Eigen, binary32)
  std::optional<Format> accumulator;         // set iff accumulation is set
  int block = 32;                            // k_b for blocked, promoted, tensor_core
  int align_bits = 24;                       // F for tensor_core
  std::string tensor_core;                   // tensor_core: a GPU's matrix unit (core/matrix_unit.h)
  int promote_every = 0, split_k = 1;        // .. how the kernel drives it (MuKernel)
  std::optional<Format> input, output;       // rounding of the operands / of the result
  std::optional<OperandQuant> input_a, input_b;  // GEMM sites: each operand's own (not with input)
  Rounding rounding = Rounding::rne;
  int sr_bits = 32;
  bool sr_packed = false;                    // 2 or 4 roundings per random word (philox.h sr_word)
  uint64_t seed = 0;

  // Plain binary32: native accumulation and no rounding at all.
  bool is_native() const { return !accumulation && !input && !output && !input_a && !input_b; }
  // The emulated GEMM's spec (accumulation must be set), input rounding included; gemm() uses
  // streams `stream` .. `stream` + 2 (gemm.h).
  GemmSpec gemm_spec(uint64_t stream) const;
};

struct Policy {
  std::array<SitePolicy, kSiteCount> all{};       // every layer (and the non-layer ln_f, lm_head)
  std::map<std::pair<int, Site>, SitePolicy> layer;  // (layer, site) → replaces `all` there
  // The backward GEMMs (Pass::dx, Pass::dw), indexed by int(pass) − 1; same rules as above.
  std::array<std::array<SitePolicy, kSiteCount>, 2> grad_all{};
  std::array<std::map<std::pair<int, Site>, SitePolicy>, 2> grad_layer;
  // LAMP at attn.qk (lamp.h, forward.h): recompute the selected scores of every row.
  std::optional<LampSpec> lamp;
  // LAMP's other closed forms (lamp.h): at the MLP activation (the mlp.fc output feeding GELU /
  // SiLU) and at every LayerNorm / RMSNorm input (the attn.proj / mlp.proj output added to the
  // residual stream just before it).
  std::optional<LampSiteSpec> lamp_activation, lamp_layernorm;

  // The entry in force for `site` at `layer` (−1: outside the layers: ln_f, lm_head).
  const SitePolicy& at(Site site, int layer = -1, Pass pass = Pass::forward) const;
  // True when every site of every layer is plain binary32, forward and backward.
  bool is_native() const;
  // True when the forward entries are (the backward ones may not be).
  bool forward_is_native() const;
  // InputError unless every entry is well formed (validate below: policies built in code are
  // checked here, before any threads start) and the policy fits the model: layer entries within
  // 0..L−1, no non-native gelu on llama or silu on gpt2.
  void check(const ModelConfig& c) const;
};

// InputError unless `p` is well formed for `site` (policy_from_toml guarantees it): an
// accumulator iff an accumulation, only at GEMM sites, a valid GemmSpec, input/output formats
// that fit binary32, valid sr_bits and block.
void validate(const SitePolicy& p, Site site);

// Parses the TOML form (header comment). `source` names the text in errors ("file:line: ...").
// Unknown top-level keys, sites or site keys are InputErrors listing the valid ones.
Policy policy_from_toml(const std::string& text, const std::string& source);
Policy load_policy(const std::string& path);
// LAMP's uniform low-precision setup: attn.qk strict with a ps<μ> accumulator, scores rounded
// to ps<μ> after the 1/√HS scaling, RNE; everything else binary32. μ = 1..23.
Policy lamp_policy(int mu);
// What a command line names: "native" (the empty policy), "lamp:<μ>" (lamp_policy(μ)) or the
// path of a TOML policy file.
Policy policy_from_spec(const std::string& spec);
// The policy with every entry's seed (forward and backward) replaced by
// random_word(seed, salt, 0)·2^32 + random_word(seed, salt, 1): fresh randomness per training
// sequence (train.h) that is still a pure function of the configuration.
Policy salted(const Policy& p, uint64_t salt);
// One line per non-native entry ("attn.qk: strict acc ps4, output ps4, rne"); "native" if none.
std::string describe(const Policy& p);

// LAMP's recomputed products (lamp.h): native binary32, or strict in f with the result rounded to f.
SitePolicy lamp_recompute_site(const std::optional<Format>& f);

// ---------------------------------------------------------------------------------------------
// Compiled policies: what the forward and backward passes call, validated once.

// One rounding of a site (its input or its output): the plan, and for the health counts the
// format's largest finite value.
struct RoundStep {
  RoundPlan plan;
  double max_finite = 0;
};

// A site entry compiled: the emulated GEMM's plan and the roundings' plans, so a call (~10⁵ per
// site and GPT-2-small forward at the attention sites) neither validates nor throws.
// input_a / input_b compiled: a rounding, or a scheme whose block is in the operand's own
// orientation (A [M,K]; B [K,N]: transposed), with the site's mode and randomness.
struct OperandStep {
  std::optional<RoundStep> round;
  std::optional<Scheme> scheme;
  Rounding mode = Rounding::rne;
  int sr_bits = 32;
  uint64_t seed = 0;
};

struct SitePlan {
  std::optional<GemmPlan> gemm;            // GEMM sites: strict / unfused / blocked; nullopt: native
  std::optional<RoundStep> input, output;  // the operands' / the result's rounding
  std::optional<OperandStep> input_a, input_b;  // or each operand's own
  bool random = false;                     // draws random words (sr / sre at some rounding)
  bool is_native() const { return !gemm && !input && !output && !input_a && !input_b; }
};

// InputError where the entry's calls would have failed: GemmSpec validation, an input or output
// format that does not fit binary32, sr_bits.
SitePlan plan_site(const SitePolicy& p);

// A Policy compiled for one model configuration: every (pass, layer, site) entry and LAMP's
// recompute products as SitePlans. Made once per forward / backward call (or once per run by a
// caller that holds it); the passes read it and never look at the Policy's entries again.
class PolicyPlan {
 public:
  // InputError from Policy::check (the one validation), before anything is compiled.
  PolicyPlan(const Policy& policy, const ModelConfig& c);

  // The entry in force for `site` at `layer` (−1: outside the layers), as Policy::at.
  const SitePlan& at(Site site, int layer = -1, Pass pass = Pass::forward) const {
    return plans_[index_[(size_t(pass) * size_t(layers_ + 1) + size_t(layer + 1)) * kSiteCount + size_t(site)]];
  }
  // LAMP's recomputed products: the scores ([lamp]), the mlp.fc output ([lamp_activation]) and
  // the projections before a norm ([lamp_layernorm]); native when the table is absent.
  const SitePlan& lamp_scores() const { return lamp_[0]; }
  const SitePlan& lamp_activation() const { return lamp_[1]; }
  const SitePlan& lamp_layernorm() const { return lamp_[2]; }

  const Policy& policy() const { return policy_; }  // the LAMP tables, describe()
  const ModelConfig& config() const { return cfg_; }

 private:
  Policy policy_;
  ModelConfig cfg_;
  int layers_;
  std::vector<SitePlan> plans_;  // one per distinct entry of the policy
  std::vector<uint32_t> index_;  // [pass][layer + 1][site] → plans_
  std::array<SitePlan, 3> lamp_;
};

}  // namespace mantis
