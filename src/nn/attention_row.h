// attention_row — the per-row and per-element steps of causal attention with LAMP, written once for
// the CPU (lamp.cpp, attention.cpp) and the GPU (src/cuda/attention.cu): MANTIS_HD, plain pointers.
//
//   lamp_row_select   the strict or relaxed rule on one causal row y [n] (lamp.h), then the random
//                     control; the whole-row form that lamp_select_row is.
//   softmax_row       the causal softmax of one row in attention.cpp's order: max, numerators via
//                     act::exp, their sum in index order, division (the CPU takes the numerators
//                     from its vectorised twin, detail::softmax_numerators: the same bits).
//   RelaxedScan       the relaxed rule computed tile by tile with a running maximum (the flash
//                     kernel): conservative pruning of a candidate set, the exact rule at the end.
//   online_softmax_*  the flash kernel's running max / sum / output rescaling.
//   attention_score, attention_recomputed, attention_pv   one element of the attention's site
//                     calls with the CPU call's semantics, stream and random-word indices (the GPU
//                     kernels' per-element work; tests/test_lamp.cpp runs them against the CPU).
//
// Binary64 exp and log (the strict rule's z, the relaxed rule's log|y|): the C library's on the
// host, CUDA's on the device. Neither is correctly rounded (glibc ≤ 0.502 ulp, CUDA ≤ 1 ulp), so
// the two sides may differ in the last bit; a selection can then differ only where a rule's two
// sides are within a few binary64 ulps of each other (probability ~1e-15 per entry on continuous
// data). The CPU keeps the C library's functions so that no committed LAMP result moves: the GPU's
// LAMP counts are exact up to such near-ties (src/cuda/attention_contracts.cpp's header says so).
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/accumulate.h"  // defines: OutputAccumulator, tc_block_sum, the word indices
#include "core/matrix_unit.h"  // defines: mu_dot
#include "core/hd.h"
#include "core/philox.h"
#include "core/round.h"
#include "nn/activation.h"  // defines: act::softmax_numerators
#include "nn/policy.h"      // defines: PolicyPlan (attention_args, host only)
#include "nn/site_health.h"
#include "nn/streams.h"

namespace mantis {

namespace row_math {
MANTIS_HD double exp64(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
MANTIS_HD double log64(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}
MANTIS_HD double abs64(double x) { return x < 0 ? -x : (x == 0 ? 0.0 : x); }  // |−0| = +0, NaN stays NaN
MANTIS_HD double max64(double a, double b) { return a < b ? b : a; }  // std::max: NaN b is skipped
}  // namespace row_math

// τ_i of query row i (lamp_tau): τ, or min(1, τ·√(1024/(i+1))) with length scaling.
MANTIS_HD double lamp_row_tau(double tau, bool length_scaled, int64_t row) {
#if defined(__CUDA_ARCH__)
  const double s = tau * ::sqrt(1024.0 / double(row + 1));
#else
  const double s = tau * std::sqrt(1024.0 / double(row + 1));
#endif
  if (!length_scaled) return tau;
  return s < 1.0 ? s : 1.0;  // std::min(1.0, s)
}

// The strict rule's normaliser: mx = max y (binary64), returns Σ exp(y_j − mx) in index order.
MANTIS_HD double lamp_strict_sum(const float* y, size_t n, double& mx) {
  mx = -INFINITY;
  for (size_t j = 0; j < n; ++j) mx = row_math::max64(mx, double(y[j]));
  double sum = 0;
  for (size_t j = 0; j < n; ++j) sum += row_math::exp64(double(y[j]) - mx);
  return sum;
}
// strict: 2·z·(1 − z)·|y_j| > τ with z = exp(y_j − mx)/sum (τ ≤ 0: every entry).
MANTIS_HD bool lamp_strict_marked(float yj, double mx, double sum, double tau) {
  const double z = row_math::exp64(double(yj) - mx) / sum;
  return tau <= 0 || 2 * z * (1 - z) * row_math::abs64(double(yj)) > tau;
}

// relaxed: the key log|y_j| + (y_j − my) (my = max y: both sides scaled by e^(−my), so log τ is
// not absorbed when |y| is huge; log 0 = −inf, never above a finite bound), and the bound
// log τ + max key (τ = 0: −inf).
MANTIS_HD double lamp_relaxed_key(float yj, double my) {
  return row_math::log64(row_math::abs64(double(yj))) + (double(yj) - my);
}
MANTIS_HD double lamp_relaxed_bound(double tau, double max_key) { return row_math::log64(tau) + max_key; }
MANTIS_HD bool lamp_relaxed_marked(double key, double bound, double tau) { return tau <= 0 || key > bound; }

// Random control: `count` of the n positions drawn uniformly without replacement (a partial
// Fisher–Yates shuffle on Philox (seed, stream, draw)); mark [n] is rewritten, idx [n] is scratch.
MANTIS_HD void lamp_random_marks(uint64_t seed, uint64_t stream, size_t n, size_t count, uint8_t* mark,
                                 uint32_t* idx) {
  for (size_t j = 0; j < n; ++j) idx[j] = uint32_t(j);
  for (size_t k = 0; k < count; ++k) {
    const uint64_t w = random_word64(seed, stream, k);
    const size_t pick = k + size_t(w % uint64_t(n - k));  // bias ≤ n/2^64
    const uint32_t t = idx[k];
    idx[k] = idx[pick];
    idx[pick] = t;
  }
  for (size_t j = 0; j < n; ++j) mark[j] = 0;
  for (size_t k = 0; k < count; ++k) mark[idx[k]] = 1;
}

// One causal row (lamp.h lamp_select_row): marks mark [n] (1 = selected) from the scores y [n]
// with τ_i = tau; returns how many. idx [n]: scratch of the random control (unused without it).
MANTIS_HD size_t lamp_row_select(bool strict, double tau, bool random_control, uint64_t seed, const float* y,
                                 size_t n, uint8_t* mark, uint32_t* idx, uint64_t stream) {
  size_t count = 0;
  if (strict) {
    double mx;
    const double sum = lamp_strict_sum(y, n, mx);
    for (size_t j = 0; j < n; ++j) count += mark[j] = lamp_strict_marked(y[j], mx, sum, tau);
  } else {
    double my = -INFINITY;
    for (size_t j = 0; j < n; ++j) my = row_math::max64(my, double(y[j]));
    double mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) mx = row_math::max64(mx, lamp_relaxed_key(y[j], my));
    const double bound = lamp_relaxed_bound(tau, mx);
    for (size_t j = 0; j < n; ++j) count += mark[j] = lamp_relaxed_marked(lamp_relaxed_key(y[j], my), bound, tau);
  }
  if (random_control && count > 0 && count < n) lamp_random_marks(seed, stream, n, count, mark, idx);
  return count;
}

// The causal softmax of one row in place, x [n] → probabilities: numerators (act::softmax_numerators:
// max, exp, sum in order), then each divided by the sum.
template <class T>
MANTIS_HD void softmax_divide(T* x, int64_t n, T sum) {
  for (int64_t j = 0; j < n; ++j) x[j] /= sum;
}
template <class T>
MANTIS_HD void softmax_row(T* x, int64_t n) {
  T mx;
  const T sum = act::softmax_numerators(x, x, n, mx);
  softmax_divide(x, n, sum);
}

// ---------------------------------------------------------------- the relaxed rule, tile by tile
// The flash kernel sees a row's scores in tiles and knows the row maximum my only at the end,
// while the rule's keys log|y_j| + (y_j − my) are rounded with the final my. The keys are
// shift-invariant in exact arithmetic: key_j − max key does not depend on my, and the bound only
// rises as keys arrive. So an entry whose key, computed with the running maximum, lies below the
// running bound by more than `lamp_relaxed_slack` (2^−40 of the magnitudes involved, against
// rounding errors of 2^−52 of them) is below the final bound too and is dropped for good; the rest
// are kept as candidates (index and score) and decided at the end by the CPU's formula with the
// final my, the final max key (the row's arg-max key is always a candidate) and the bound. The
// decision is then lamp_row_select's (tests/test_lamp.cpp: ties, zeros, ±3e38, rising rows).
// τ ≤ 0 (all) and τ ≥ 1 (none: the bound is at least every key) need no candidates; random
// control needs the count before its draws (not supported here).

// 0: no entry is selected, 1: every entry, 2: decided by the keys (0 < τ < 1).
MANTIS_HD int lamp_relaxed_trivial(double tau) { return tau <= 0 ? 1 : (tau >= 1 || tau != tau ? 0 : 2); }

MANTIS_HD double lamp_relaxed_slack(float yj, double key, double my, double max_key, double log_tau) {
  using row_math::abs64;
  return 0x1p-40 * (abs64(double(yj)) + 2 * abs64(my) + abs64(key) + 2 * abs64(max_key) + abs64(log_tau) + 300.0);
}

struct RelaxedScan {
  double my = -INFINITY;  // the running max of the scores (NaN skipped, as std::max)
  size_t n = 0;           // candidates held
};

// Adds the score y of key j to the candidates cj, cy (capacity: the row length).
MANTIS_HD void relaxed_scan_add(RelaxedScan& s, uint32_t* cj, float* cy, uint32_t j, float y) {
  s.my = row_math::max64(s.my, double(y));
  cj[s.n] = j;
  cy[s.n] = y;
  ++s.n;
}

// Drops the candidates that can no longer be selected (0 < τ < 1); drop(j, y) is called for each,
// in candidate order. The rest keep their order. Does nothing while the running max is not finite.
template <class F>
MANTIS_HD void relaxed_scan_prune(RelaxedScan& s, uint32_t* cj, float* cy, double tau, F&& drop) {
  if (!(s.my - s.my == 0)) return;
  double mk = -INFINITY;
  for (size_t c = 0; c < s.n; ++c) mk = row_math::max64(mk, lamp_relaxed_key(cy[c], s.my));
  if (!(mk - mk == 0)) return;
  const double lt = row_math::log64(tau);
  size_t w = 0;
  for (size_t c = 0; c < s.n; ++c) {
    const double key = lamp_relaxed_key(cy[c], s.my);
    // NaN keys (a NaN or infinite score) stay NaN at the end; −inf (a zero score) stays −inf
    const bool gone = key != key || key == -INFINITY || key + lamp_relaxed_slack(cy[c], key, s.my, mk, lt) < lt + mk;
    if (gone) {
      drop(cj[c], cy[c]);
    } else {
      cj[w] = cj[c];
      cy[w] = cy[c];
      ++w;
    }
  }
  s.n = w;
}

// The final decision on the candidates: decide(j, y, selected) for each, in candidate order;
// returns how many are selected.
template <class F>
MANTIS_HD size_t relaxed_scan_finish(const RelaxedScan& s, const uint32_t* cj, const float* cy, double tau,
                                     F&& decide) {
  double mk = -INFINITY;
  for (size_t c = 0; c < s.n; ++c) mk = row_math::max64(mk, lamp_relaxed_key(cy[c], s.my));
  const double bound = lamp_relaxed_bound(tau, mk);
  size_t count = 0;
  for (size_t c = 0; c < s.n; ++c) {
    const bool sel = lamp_relaxed_marked(lamp_relaxed_key(cy[c], s.my), bound, tau);
    count += sel;
    decide(cj[c], cy[c], sel);
  }
  return count;
}

// ---------------------------------------------------------------- online softmax (flash)
// Running max m, sum l and unnormalised output acc [d] of one row; each key adds exp(x − m)
// (act::exp), rescaling l and acc by exp(m_old − m_new) when the max rises. The result acc / l
// equals the softmax's P·V up to the summation order (not bit-identical to softmax_row + P·V).
template <class T>
struct OnlineSoftmax {
  T m = -INFINITY;
  T l = 0;
};
// One key x: the scalar step (updates m and l; acc is to be scaled by r and p·v added) ..
template <class T>
MANTIS_HD void online_softmax_step(OnlineSoftmax<T>& s, T x, T& r, T& p) {
  r = T(1), p = T(0);
  if (x != x) {  // a NaN score: the softmax row is NaN
    s.l = x;
    return;
  }
  if (x > s.m) {
    r = s.m == -INFINITY ? T(0) : act::exp(s.m - x);
    s.l *= r;
    s.m = x;
  }
  p = s.m == -INFINITY ? T(0) : act::exp(x - s.m);  // an all −inf row: 0/0 at the end, as the CPU's NaN
  s.l += p;
}
// .. and its output update, acc [d] ← acc·r + p·v (v: the key's value row [d]).
template <class T>
MANTIS_HD void online_softmax_apply(T* acc, T r, T p, const T* v, int64_t d) {
  for (int64_t c = 0; c < d; ++c) acc[c] = acc[c] * r + p * v[c];
}
template <class T>
MANTIS_HD void online_softmax_add(OnlineSoftmax<T>& s, T* acc, T x, const T* v, int64_t d) {
  T r, p;
  online_softmax_step(s, x, r, p);
  online_softmax_apply(acc, r, p, v, d);
}
// The softmax's health without its probabilities: softmax_row of the same n scores gives NaN in
// every entry when one is NaN or +inf, or all are −inf (the sum or a numerator is NaN), and finite
// probabilities otherwise (each numerator in [0, 1], the arg-max's 1 in the sum) — exactly when
// the online sum l ends NaN or 0. So the row adds n NaNs, or nothing.
template <class T>
MANTIS_HD bool online_softmax_nan(const OnlineSoftmax<T>& s) {
  return !(s.l > T(0));
}
// out [d] = acc / l.
template <class T>
MANTIS_HD void online_softmax_finish(const OnlineSoftmax<T>& s, const T* acc, T* out, int64_t d) {
  for (int64_t c = 0; c < d; ++c) out[c] = acc[c] / s.l;
}

// ---------------------------------------------------------------- one element of the site calls
// The CPU (attention.cpp) multiplies the scores of a 64-query block in one site_gemm call (or, when
// attn.qk or attn.pv draws random words, one call per query row), LAMP's recomputed scores in one
// call per block, and P·V likewise. One element of such a call, here, has that call's semantics:
// the product (emulated: accumulate.h's steps; native: a sequential binary32 sum, which is NOT
// Eigen's blocked order), ÷ divisor when it is not 1, the output rounding, each with the call's
// stream and the element's index o in it (linear.h: o = row·N + column of the call's output).

constexpr int64_t kAttentionQueryBlock = 64;  // attention.cpp's query block

// An elementwise rounding (a site's output, the softmax's input or output): round_array's element
// semantics; max_finite: the format's largest finite value (the health's overflow rule).
struct ElementRound {
  bool on = false;
  Rounding mode = Rounding::rne;
  uint64_t seed = 0;
  int sr_pack = 0;  // roundings per random word, log2 (philox.h sr_word)
  Target<float> t{};
  double max_finite = 0;
};

// A GEMM site compiled for one element at a time (from a validated SitePlan without operand rounding).
struct ElementSite {
  bool emulated = false;
  Accumulation acc = Accumulation::strict;
  Rounding mode = Rounding::rne;
  uint64_t block = 32, seed = 0;
  int sr_pack = 0;
  int align_bits = 24;
  bool has_unit = false;  // tensor_core with a GPU: its matrix unit
  MatrixUnit unit{};
  Target<double> t{};
  ElementRound out;  // the output rounding
};

// One layer's attention call: q [T, NH·HS], k, v [T, NKV·HS] (row-major), its sites and LAMP.
struct AttentionArgs {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t T = 0, NH = 1, NKV = 1, HS = 1;
  int layer = 0;
  float divisor = 1;  // √HS in binary32
  bool by_row = false;  // attn.qk or attn.pv draws random words: one call per query row (streams.h)
  ElementSite qk, pv, rec;
  ElementRound sm_in, sm_out;
  // [NKV, ⌈T/64⌉]: 1 where a 64-row block's values hold a non-finite number (attention_values_finite),
  // so that its P·V goes row by row; null: every block finite. Filled by the caller.
  const uint8_t* v_nonfinite = nullptr;
  bool lamp = false, strict_rule = true, length_scaled = false, random_control = false;
  double tau = 0;
  uint64_t lamp_seed = 0;
};

// x rounded by r with word `index` of (r.seed, stream); an overflow counted into *h when given.
MANTIS_HD float round_element(const ElementRound& r, float x, uint64_t stream, uint64_t index,
                              SiteHealth* h = nullptr) {
  if (h) health_count_overflow(*h, x, r.max_finite);
  const uint32_t w = is_stochastic(r.mode) ? sr_word(r.seed, stream, index, r.sr_pack) : 0u;
  return round_value(x, r.t, r.mode, w);
}

// Output o of an emulated GEMM of depth K: a [K] (stride 1) · b [K] (stride ldb), gemm.h's steps.
template <Rounding M, Accumulation kAcc>
MANTIS_HD double emulated_element(const ElementSite& s, const float* a, const float* b, int64_t ldb, int64_t K,
                                  uint64_t stream, uint64_t o) {
  if constexpr (kAcc == Accumulation::tensor_core) {
    if (s.has_unit) return mu_dot(s.unit, a, b, size_t(ldb), size_t(K), 0.0);
    WordCache<is_stochastic(M)> words(s.seed, stream, s.sr_pack);
    const uint64_t nchunks = chunk_count(size_t(K), size_t(s.block));
    double acc = 0.0;
    for (uint64_t c = 0; c < nchunks; ++c) {
      const uint64_t k0 = c * s.block, k1 = k0 + s.block < uint64_t(K) ? k0 + s.block : uint64_t(K);
      acc = round_value<M>(tc_block_sum(acc, a + k0, b + k0 * uint64_t(ldb), size_t(ldb), size_t(k1 - k0), s.align_bits),
                           s.t, words.at(blocked_index(o, nchunks, c)));
    }
    return acc;
  } else {
    OutputAccumulator<M, kAcc> acc(s.seed, stream, s.sr_pack);
    const uint64_t nchunks = chunk_count(size_t(K), size_t(s.block));
    for (int64_t k = 0; k < K; ++k) acc.step(a[k], b[k * ldb], s.t, o, uint64_t(K), uint64_t(k), s.block, nchunks);
    return acc.value();
  }
}

MANTIS_HD double emulated_element(const ElementSite& s, const float* a, const float* b, int64_t ldb, int64_t K,
                                  uint64_t stream, uint64_t o) {
  return with_rounding(s.mode, [&](auto mode) -> double {
    constexpr Rounding M = decltype(mode)::value;
    switch (s.acc) {
      case Accumulation::strict: return emulated_element<M, Accumulation::strict>(s, a, b, ldb, K, stream, o);
      case Accumulation::unfused: return emulated_element<M, Accumulation::unfused>(s, a, b, ldb, K, stream, o);
      case Accumulation::blocked: return emulated_element<M, Accumulation::blocked>(s, a, b, ldb, K, stream, o);
      case Accumulation::promoted: return emulated_element<M, Accumulation::promoted>(s, a, b, ldb, K, stream, o);
      case Accumulation::tensor_core: break;
    }
    return emulated_element<M, Accumulation::tensor_core>(s, a, b, ldb, K, stream, o);
  });
}

// One output of a site call: the product, ÷ divisor when it is not 1 (site_gemm's order), the
// output rounding at index o of stream + kStreamOutput. With h: the call's health of this output
// (site_gemm's: an overflow of the output rounding, a NaN or ±inf result) added to *h.
MANTIS_HD float site_element(const ElementSite& s, const float* a, const float* b, int64_t ldb, int64_t K,
                             uint64_t stream, uint64_t o, float divisor, SiteHealth* h = nullptr) {
  float y;
  if (s.emulated) {
    y = float(emulated_element(s, a, b, ldb, K, stream, o));
  } else {
    y = 0.0f;
    for (int64_t k = 0; k < K; ++k) y += a[k] * b[k * ldb];
  }
  if (divisor != 1.0f) y /= divisor;
  if (s.out.on) y = round_element(s.out, y, stream + kStreamOutput, o, h);
  if (h) health_count_nonfinite(*h, y);
  return y;
}

// The CPU's block of query i: rows r0..r1−1, keys 0..r1−1.
MANTIS_HD void attention_block(const AttentionArgs& A, int64_t i, int64_t& r0, int64_t& r1) {
  r0 = i / kAttentionQueryBlock * kAttentionQueryBlock;
  r1 = r0 + kAttentionQueryBlock < A.T ? r0 + kAttentionQueryBlock : A.T;
}

// The score y_ij of query head h: attn.qk's call for row i (random sites) or for i's block; with
// hl, its health (attn.qk's) added to *hl.
MANTIS_HD float attention_score(const AttentionArgs& A, int64_t h, int64_t i, int64_t j, SiteHealth* hl = nullptr) {
  int64_t r0, r1;
  attention_block(A, i, r0, r1);
  const float* a = A.q + i * A.NH * A.HS + h * A.HS;
  const float* b = A.k + j * A.NKV * A.HS + (h / (A.NH / A.NKV)) * A.HS;
  const uint64_t stream = A.by_row ? qk_stream(A.layer, h, i) : qk_stream(A.layer, h);
  const uint64_t o = A.by_row ? uint64_t(j) : uint64_t((i - r0) * r1 + j);
  return site_element(A.qk, a, b, 1, A.HS, stream, o, A.divisor, hl);
}

// LAMP's recomputed score: the recompute plan on i's block (stream lamp_stream(l, h)).
MANTIS_HD float attention_recomputed(const AttentionArgs& A, int64_t h, int64_t i, int64_t j) {
  int64_t r0, r1;
  attention_block(A, i, r0, r1);
  const float* a = A.q + i * A.NH * A.HS + h * A.HS;
  const float* b = A.k + j * A.NKV * A.HS + (h / (A.NH / A.NKV)) * A.HS;
  return site_element(A.rec, a, b, 1, A.HS, lamp_stream(A.layer, h), uint64_t((i - r0) * r1 + j), A.divisor);
}

// The values of rows r0..r1−1 of v [·, ld] in columns c0..c0+HS−1 are all finite. attn.pv multiplies
// a deterministic 64-row block's probabilities by its values in one call of depth r1; a masked
// zero of row i then meets the values of the later keys i+1..r1−1, and 0·inf or 0·NaN would make row
// i NaN — a value no causal attention lets row i see. So a block whose rows are not all finite goes
// row by row, each to depth i + 1, as random sites do (no random words drawn: an emulated site's
// values of a finite row are the block call's; a native one's are the CPU's product of one row,
// another summation order than Eigen's block product).
template <class T>
MANTIS_HD bool attention_values_finite(const T* v, int64_t ld, int64_t c0, int64_t HS, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < HS; ++c) {
      const T x = v[r * ld + c0 + c];
      if (x - x != T(0)) return false;  // NaN or ±inf
    }
  return true;
}

// Output column c of query i at head h from its probabilities P [r1] (zero beyond i): attn.pv's
// call for row i (depth i + 1: random sites, or a block with a non-finite value) or for i's block
// (depth r1: the masked zeros included);
// with hl, its health (attn.pv's) added to *hl.
MANTIS_HD float attention_pv(const AttentionArgs& A, const float* P, int64_t h, int64_t i, int64_t c,
                             SiteHealth* hl = nullptr) {
  int64_t r0, r1;
  attention_block(A, i, r0, r1);
  const int64_t g = h / (A.NH / A.NKV);
  const float* b = A.v + g * A.HS + c;
  const int64_t nblocks = (A.T + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  const bool rowwise = A.by_row || (A.v_nonfinite && A.v_nonfinite[g * nblocks + r0 / kAttentionQueryBlock]);
  const uint64_t stream = rowwise ? pv_stream(A.layer, h, i) : pv_stream(A.layer, h);
  const uint64_t o = rowwise ? uint64_t(c) : uint64_t((i - r0) * A.HS + c);
  return site_element(A.pv, P, b, A.NKV * A.HS, rowwise ? i + 1 : r1, stream, o, 1.0f, hl);
}

// The attention call of layer l of a PolicyPlan (validated: no operand rounding at these sites);
// host only (plain inline: nvcc's device pass parses, never generates them).
inline ElementRound element_round(const std::optional<RoundStep>& r) {
  ElementRound d;
  if (r) d.on = true, d.mode = r->plan.mode, d.seed = r->plan.seed, d.sr_pack = r->plan.sr_pack, d.t = r->plan.tf, d.max_finite = r->max_finite;
  return d;
}
inline ElementSite element_site(const SitePlan& p) {
  ElementSite d;
  if (p.gemm) {
    d.emulated = true, d.acc = p.gemm->accumulation, d.mode = p.gemm->acc_mode, d.block = p.gemm->block;
    d.seed = p.gemm->seed, d.sr_pack = p.gemm->sr_pack, d.align_bits = p.gemm->align_bits, d.t = p.gemm->acc;
    if (p.gemm->unit) d.has_unit = true, d.unit = *p.gemm->unit;
  }
  d.out = element_round(p.output);
  return d;
}
inline AttentionArgs attention_args(const PolicyPlan& pol, int l, const float* q, const float* k, const float* v,
                                    int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
  const SitePlan &qk = pol.at(Site::attn_qk, l), &pv = pol.at(Site::attn_pv, l), &sm = pol.at(Site::softmax, l);
  AttentionArgs A;
  A.q = q, A.k = k, A.v = v, A.T = T, A.NH = NH, A.NKV = NKV, A.HS = HS, A.layer = l;
  A.divisor = std::sqrt(float(HS));  // attention.cpp's std::sqrt(T(HS))
  A.by_row = qk.random || pv.random;
  A.qk = element_site(qk), A.pv = element_site(pv), A.rec = element_site(pol.lamp_scores());
  A.sm_in = element_round(sm.input), A.sm_out = element_round(sm.output);
  if (const std::optional<LampSpec>& lamp = pol.policy().lamp) {
    A.lamp = true, A.strict_rule = lamp->rule == LampRule::strict, A.length_scaled = lamp->length_scaled;
    A.random_control = lamp->random_control, A.tau = lamp->tau, A.lamp_seed = lamp->seed;
  }
  return A;
}

}  // namespace mantis
