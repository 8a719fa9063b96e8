// attention_contracts — the contracts (contracts.h) of causal attention with LAMP on the GPU
// (cuda.h cuda_attention_forward) against the CPU's detail::attention_forward on the same inputs
// and PolicyPlan.
//
// LAMP counts: the GPU evaluates the rules' binary64 exp and log with CUDA's functions, the CPU
// with the C library's (attention_row.h): a selection may differ where a rule's comparison is within
// a few binary64 ulps of τ. The counts are compared exactly on these fixed samples (none has such a
// near-tie); a mismatch here would be one, and worth a look rather than a wider tolerance.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/format.h"
#include "core/philox.h"
#include "cuda/contracts.h"
#include "cuda/nn_ops.h"  // attention_check
#include "cuda/cuda.h"
#include "nn/attention.h"
#include "nn/policy.h"

namespace mantis {

namespace {

struct AttnShape {
  size_t T, NH, NKV, HS;
};

// T ∈ {1, 17, 64, 130} (130 crosses the CPU's 64-row query blocks; dropped below scale 1) ×
// HS ∈ {8, 64} × (NH, NKV) ∈ {(1, 1), (4, 4), (4, 1)}.
std::vector<AttnShape> attn_shapes(double scale) {
  std::vector<AttnShape> s;
  for (size_t T : {size_t(1), size_t(17), size_t(64), size_t(130)}) {
    if (T > 17 && double(T) > 130 * scale) continue;
    for (size_t HS : {size_t(8), size_t(64)})
      for (auto [NH, NKV] : {std::pair<size_t, size_t>{1, 1}, {4, 4}, {4, 1}}) s.push_back({T, NH, NKV, HS});
  }
  return s;
}

// Uniform in [lo, hi) from Philox (seed, stream, ·).
Matrix<float> uniform(size_t rows, size_t cols, float lo, float hi, uint64_t seed, uint64_t stream) {
  Matrix<float> m{Eigen::Index(rows), Eigen::Index(cols)};
  for (size_t i = 0; i < rows * cols; ++i)
    m.data()[i] = lo + (hi - lo) * float(double(random_word(seed, stream, i)) / 4294967296.0);
  return m;
}

// A policy of the attention sites: attn.qk strict with a ps<μ> accumulator and ps<μ> scores
// (lamp_policy) in `mode` (μ = 0: native scores), attn.pv strict fp32 (emulated: bit-exact) or
// native, the softmax's output rounded to bf16 in `mode` or not.
Policy attn_policy(int mu, Rounding mode, bool pv_emulated, bool sm_round, uint64_t seed) {
  Policy p = mu > 0 ? lamp_policy(mu) : Policy{};
  SitePolicy& qk = p.all[int(Site::attn_qk)];
  qk.rounding = mode, qk.seed = seed;
  if (pv_emulated) {
    SitePolicy& pv = p.all[int(Site::attn_pv)];
    pv.accumulation = Accumulation::strict, pv.accumulator = format_lookup("fp32"), pv.rounding = mode, pv.seed = seed;
    pv.sr_bits = 24;  // strict sr into fp32: sr_bits ≤ 52 − 24
  }
  if (sm_round) {
    SitePolicy& sm = p.all[int(Site::softmax)];
    sm.output = format_lookup("bf16"), sm.rounding = mode, sm.seed = seed + 1;
  }
  return p;
}

std::optional<LampSpec> lamp_spec(LampRule rule, double tau, bool length_scaled, bool random_control,
                                  bool fp32_recompute, uint64_t seed) {
  LampSpec s;
  s.rule = rule, s.tau = tau, s.length_scaled = length_scaled, s.random_control = random_control, s.seed = seed;
  if (fp32_recompute) s.recompute = format_lookup("fp32");  // strict in binary32: emulated, bit-exact
  return s;
}

// One case: the CPU's attention and the GPU's kernel on the same inputs; outputs (and, for the
// materialised kernel, probabilities) by `a`, the LAMP total exactly when `counts`.
void attn_case(ContractTally& tl, const std::string& what, const Policy& policy, const AttnShape& s, uint64_t seed,
               AttentionKernel kernel, Agreement a, double tol, bool counts) {
  if (!tl.take()) return;
  ModelConfig c;
  c.arch = Arch::llama, c.layers = 1, c.heads = int(s.NH), c.kv_heads = int(s.NKV), c.dim = int(s.NH * s.HS);
  const PolicyPlan pol(policy, c);
  if (tl.check_only) {
    gpu::attention_check(pol, 0, s.NH, s.NKV, s.HS, kernel);
    return;
  }
  const Matrix<float> q = uniform(s.T, s.NH * s.HS, -2, 2, seed, 1), k = uniform(s.T, s.NKV * s.HS, -2, 2, seed, 2);
  const Matrix<float> v = uniform(s.T, s.NKV * s.HS, 0.5f, 1.5f, seed, 3);  // > 0: no cancellation in P·V
  Matrix<float> out{Eigen::Index(s.T), Eigen::Index(s.NH * s.HS)};
  std::vector<Matrix<float>> probs;
  const uint64_t cpu_count = detail::attention_forward<float>(pol, 0, q, k, v, Eigen::Index(s.NH), Eigen::Index(s.NKV),
                                                              Eigen::Index(s.HS), out, &probs, {});
  std::vector<float> gout(s.T * s.NH * s.HS), gprobs(kernel == AttentionKernel::materialised ? s.NH * s.T * s.T : 0);
  const uint64_t gpu_count = cuda_attention_forward(pol, 0, q.data(), k.data(), v.data(), s.T, s.NH, s.NKV, s.HS,
                                                    gout.data(), kernel, nullptr, gprobs.empty() ? nullptr : gprobs.data());
  const std::string w = fmt::format("{} T {} NH {} NKV {} HS {} seed {}", what, s.T, s.NH, s.NKV, s.HS, seed);
  tl.compare(w + " out", out.data(), gout.data(), gout.size(), a, tol);
  if (!gprobs.empty())
    for (size_t h = 0; h < s.NH; ++h)
      tl.compare(w + fmt::format(" probs h{}", h), probs[h].data(), gprobs.data() + h * s.T * s.T, s.T * s.T, a, tol);
  if (counts) tl.compare_count(w + " LAMP count", cpu_count, gpu_count);
}

const char* mode_name(Rounding m) { return m == Rounding::sr ? "sr" : "rne"; }

// Emulated scores (ps4 / ps7 / ps10, rne and sr), emulated attn.pv, LAMP's recompute strict fp32:
// the materialised kernel bit for bit, its LAMP counts exactly.
void materialised_emulated(ContractTally& tl, double scale) {
  for (int mu : {4, 7, 10})
    for (Rounding mode : {Rounding::rne, Rounding::sr})
      for (int variant = 0; variant < 5; ++variant)
        for (uint64_t seed : {uint64_t(1), uint64_t(2)}) {
          Policy p = attn_policy(mu, mode, true, variant % 2 == 1, seed);
          if (variant == 1) p.lamp = lamp_spec(LampRule::strict, 0.05, false, false, true, seed);
          if (variant == 2) p.lamp = lamp_spec(LampRule::relaxed, 0.03, false, false, true, seed);
          if (variant == 3) p.lamp = lamp_spec(LampRule::strict, 0.002, true, true, true, seed);
          if (variant == 4) p.lamp = lamp_spec(LampRule::relaxed, 0.0, false, false, true, seed);
          for (const AttnShape& s : attn_shapes(scale))
            attn_case(tl, fmt::format("ps{} {} variant {}", mu, mode_name(mode), variant), p, s, seed,
                      AttentionKernel::materialised, Agreement::bit_exact, 0, p.lamp.has_value());
        }
}

// Native binary32 scores or attn.pv, native LAMP recompute: the materialised kernel within a tolerance.
void materialised_native(ContractTally& tl, double scale) {
  for (int variant = 0; variant < 3; ++variant)
    for (uint64_t seed : {uint64_t(1), uint64_t(2)}) {
      Policy p = attn_policy(variant == 2 ? 7 : 0, Rounding::rne, false, false, seed);
      if (variant >= 1) p.lamp = lamp_spec(variant == 1 ? LampRule::strict : LampRule::relaxed, 0.05, false, false,
                                           false, seed);
      for (const AttnShape& s : attn_shapes(scale))
        attn_case(tl, fmt::format("native variant {}", variant), p, s, seed, AttentionKernel::materialised,
                  Agreement::tolerance, 1e-4, variant == 2);  // variant 2: emulated scores, so exact counts
    }
}

// The flash kernel: emulated scores (ps4 / ps7 / ps10, rne and sr), native attn.pv, the relaxed rule
// (τ = 0.03, length-scaled 0.01, 0, ∞; recompute fp32 or native) or no LAMP: outputs within a
// tolerance, LAMP counts exactly.
void flash(ContractTally& tl, double scale) {
  for (int mu : {4, 7, 10})
    for (Rounding mode : {Rounding::rne, Rounding::sr})
      for (int variant = 0; variant < 5; ++variant)
        for (uint64_t seed : {uint64_t(1), uint64_t(2)}) {
          Policy p = attn_policy(mu, mode, false, false, seed);
          if (variant == 1) p.lamp = lamp_spec(LampRule::relaxed, 0.03, false, false, true, seed);
          if (variant == 2) p.lamp = lamp_spec(LampRule::relaxed, 0.01, true, false, false, seed);
          if (variant == 3) p.lamp = lamp_spec(LampRule::relaxed, 0.0, false, false, true, seed);
          if (variant == 4) p.lamp = lamp_spec(LampRule::relaxed, HUGE_VAL, false, false, true, seed);
          for (const AttnShape& s : attn_shapes(scale))
            attn_case(tl, fmt::format("flash ps{} {} variant {}", mu, mode_name(mode), variant), p, s, seed,
                      AttentionKernel::flash, Agreement::tolerance, 1e-4, p.lamp.has_value());
        }
}

}  // namespace

void add_attention_contracts(std::vector<Contract>& t) {
  const std::string shapes = "T {1, 17, 64, 130} × HS {8, 64} × (NH, NKV) {(1,1), (4,4), (4,1)} × 2 seeds";
  t.push_back({"attention/materialised/emulated", Agreement::bit_exact, 0, "",
               "attn.qk strict ps{4,7,10} (rne, sr), attn.pv strict fp32; no LAMP, strict τ 0.05, relaxed τ 0.03, "
               "strict length-scaled random control, relaxed τ 0; recompute strict fp32; softmax bf16 or not × " +
                   shapes + "; outputs, probabilities, LAMP counts",
               materialised_emulated, true});
  t.push_back({"attention/materialised/native", Agreement::tolerance, 1e-4,
               "native binary32 products: the CPU's are Eigen's blocked GEMMs (scores, P·V, LAMP recompute), the "
               "GPU's sequential k loops; values in [0.5, 1.5) keep P·V free of cancellation",
               "native scores (no LAMP, strict τ 0.05), ps7 scores with relaxed τ 0.05 (exact counts); native P·V "
               "and recompute × " + shapes,
               materialised_native, true});
  t.push_back({"attention/flash", Agreement::tolerance, 1e-4,
               "the online softmax sums the exponentials and P·V in another order (rescaled as the max rises), "
               "P·V natively; the scores and LAMP's selection are the CPU's bit for bit (counts compared exactly)",
               "attn.qk strict ps{4,7,10} (rne, sr); no LAMP, relaxed τ 0.03, length-scaled 0.01 (native recompute), "
               "τ 0, τ ∞ × " + shapes,
               flash, true});
}

}  // namespace mantis
