// gemm_unit — the GEMM kernel of the GPU matrix units (matrix_unit.h), vectorised across j.
//
// The same bits as mu_dot, computed for a whole row of outputs at once: per block (per half for
// the interleaved units), X[j] = max(min_align, the largest nominal exponent e_a + e_b among the
// nonzero products of output j, c's exponent); each term truncated to a multiple of 2^(X − F) is
// trunc(t · 2^(F − X)) — exact in binary64 (t = a·b has ≤ 22 bits, the scale is a power of two, and
// |t · 2^(F−X)| < 2^28 fits the int32 conversion, which truncates) — and the terms' integer sum is
// exact in binary64 (< 2^34). The block result is round.h's rounding of sum · 2^(X − F) to the
// datapath's (precision, emin) with the exponent range one binade wider, then ±inf from
// 2^(emax+1) on (matrix_unit.h's overflow rule). Operands' nominal exponents are computed once per
// GEMM. Non-finite operands or normalised products take mu_dot per output instead (same bits).
// Compiled twice: portable and, chosen at run time where the CPU has it, for AVX-512.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cpu.h"
#include "core/gemm.h"
#include "core/gemm_kernel.h"
#include "core/round.h"

#if defined(__x86_64__) || defined(__i386__)
#define MANTIS_X86 1
#include <immintrin.h>
#endif

namespace mantis {

namespace {

constexpr int32_t kNoTerm = -(1 << 20);  // the nominal exponent of a zero: below every min_align
constexpr int16_t kNoTerm16 = -(1 << 14);  // .. in the AVX-512 tile's int16 exponents

// ⌊log2|x|⌋ from the bits of a double that is finite, nonzero and normal in binary64.
inline int32_t exp_of(double x) { return int32_t((to_bits(x) >> 52) & 0x7FF) - 1023; }
inline double pow2(int32_t e) { return double_from_bits(uint64_t(int64_t(e) + 1023) << 52); }  // |e| ≤ 1022

struct UnitConsts {
  const MatrixUnit* u;
  MuKernel kernel;
  Target<double> dp;   // the datapath's result format, its exponent range one binade wider
  double dp_lim;       // 2^(out_emax + 1) of the datapath: ±inf from there on
  Target<double> out;  // the output format (the interleaved units' last addition)
};

// One pass of the datapath over the products k0 ≤ k < k1 that `half` takes, for JB outputs j,
// in four steps: unit_x_from_c and a max over the products' nominal exponents (the alignment
// exponents X[j]), unit_scale (X clamped, the scales, c[j] aligned into S[j]), the products'
// aligned sum into S, and unit_finish (out[j] ← the block result; out may be c). Every j-loop is
// branch-free (selects only) and of constant length, so that it vectorises; the rounding takes
// round.h's normal-range shortcut and is redone by the general rounding where a value left that
// range. A zero operand's nominal exponent kNoTerm keeps its product below every X (X is clamped
// to ≥ −400 below), and its product adds 0: no test per k is needed.
template <size_t JB>
[[gnu::always_inline]] inline void unit_x_from_c(const double* c, int32_t* X) {
  constexpr uint64_t kSign = uint64_t(1) << 63;
  for (size_t j = 0; j < JB; ++j) {  // c's exponent: its binary32 exponent (≥ −126); zero and specials: none
    const uint64_t u = to_bits(c[j]) & ~kSign;
    const int32_t be = int32_t(u >> 52), ec = be - 1023;
    X[j] = u != 0 && be != 0x7FF ? (ec > -126 ? ec : -126) : kNoTerm;
  }
}

template <size_t JB>
[[gnu::always_inline]] inline void unit_scale(const MuDatapath& d, const double* c, int32_t* X, double* S,
                                              float* scf) {
  constexpr uint64_t kInf = uint64_t(0x7FF) << 52;
  for (size_t j = 0; j < JB; ++j) {
    // X below −400 means no nonzero term (every product's is ≥ −2·149 − 2): the sum is 0 at any
    // scale, and the clamp keeps 2^(±(F − X)) normal (v100's min_align is −1024).
    const int32_t x = X[j] > d.min_align ? X[j] : d.min_align;
    X[j] = x > -400 ? x : -400;
    const double cf = (to_bits(c[j]) & kInf) != kInf ? c[j] : 0.0;
    S[j] = double(int32_t(cf * pow2(d.frac_bits - X[j])));  // truncates: |·| < 2^28
    // the narrow path's scale (narrow_ok): products below 2^(X − 60) truncate to 0 either way
    scf[j] = float_from_bits(uint32_t(d.frac_bits - (X[j] > -60 ? X[j] : -60) + 127) << 23);
  }
}

template <bool kRne, size_t JB>
[[gnu::always_inline]] inline void unit_finish(const UnitConsts& uc, const int32_t* X, double* S, const double* c,
                                               double* out) {
  constexpr Rounding M = kRne ? Rounding::rne : Rounding::rz;
  constexpr uint64_t kSign = uint64_t(1) << 63, kInf = uint64_t(0x7FF) << 52;
  const int F = uc.u->dp.frac_bits;
  double v[JB];
  uint64_t outside = 0;
  for (size_t j = 0; j < JB; ++j) {
    v[j] = S[j] * pow2(X[j] - F);
    outside |= outside_normal_range(v[j], uc.dp);
    S[j] = round_normal<M>(v[j], uc.dp, 0u);
  }
  if (outside != 0)
    for (size_t j = 0; j < JB; ++j) S[j] = round_value<M>(v[j], uc.dp);
  const uint64_t lim = to_bits(uc.dp_lim);
  for (size_t j = 0; j < JB; ++j) {
    const uint64_t r = to_bits(S[j]), cu = to_bits(c[j]);
    const uint64_t ovf = (r & ~kSign) >= lim ? (r & kSign) | kInf : r;
    // a non-finite addend: the IEEE sum with finite products is the addend
    out[j] = double_from_bits((cu & kInf) == kInf ? cu : ovf);
  }
}

// The pass for JB outputs (B's row k at B + k·ldb, its exponents at EB + k·ldb).
template <bool kRne, bool kNarrow, size_t JB>
[[gnu::always_inline]] inline void unit_pass(const UnitConsts& uc, const float* a, const int32_t* ea, const float* B,
                                             const int32_t* EB, size_t ldb, size_t k0, size_t k1, MuHalf half,
                                             const double* c, double* out) {
  int32_t X[JB];
  double S[JB];
  float scf[JB];
  unit_x_from_c<JB>(c, X);
  for (size_t k = k0; k < k1; ++k) {
    if (!mu_takes(half, k - k0)) continue;
    const int32_t e = ea[k];
    const int32_t* eb = EB + k * ldb;
    for (size_t j = 0; j < JB; ++j) X[j] = X[j] > e + eb[j] ? X[j] : e + eb[j];
  }
  unit_scale<JB>(uc.u->dp, c, X, S, scf);
  if constexpr (kNarrow) {  // 16 lanes: see narrow_ok
    int32_t Si[JB] = {};
    for (size_t k = k0; k < k1; ++k) {
      if (!mu_takes(half, k - k0)) continue;
      const float ak = a[k];
      const float* b = B + k * ldb;
      for (size_t j = 0; j < JB; ++j) Si[j] += int32_t(ak * b[j] * scf[j]);
    }
    for (size_t j = 0; j < JB; ++j) S[j] += double(Si[j]);
  } else {
    double sc[JB];
    for (size_t j = 0; j < JB; ++j) sc[j] = pow2(uc.u->dp.frac_bits - X[j]);
    for (size_t k = k0; k < k1; ++k) {
      if (!mu_takes(half, k - k0)) continue;
      const double ak = a[k];
      const float* b = B + k * ldb;
      for (size_t j = 0; j < JB; ++j) S[j] += double(int32_t(ak * double(b[j]) * sc[j]));
    }
  }
  unit_finish<kRne, JB>(uc, X, S, c, out);
}

// Whether a unit's products can be aligned in binary32 and summed in int32 (unit_pass's narrow
// path, twice the lanes): inputs of at most 11 bits whose products stay normal binary32 numbers
// (emin ≥ −14: fp16, e4m3, e5m2; a·b is then exact in binary32, and so is its scaling by
// 2^(F − X) whenever the result is ≥ 1, which truncates to the same integer otherwise), and a
// block whose aligned products (each < 2^(F+2), the significand being < 4) sum below 2^31.
bool narrow_ok(const MatrixUnit& u) {
  const int64_t n = u.interleaved ? 16 : u.dp.block;
  return u.in_prec <= 11 && u.in_emin >= -14 && !u.dp.normalise && u.dp.frac_bits + 2 < 31 &&
         n * (int64_t(1) << (u.dp.frac_bits + 2)) <= (int64_t(1) << 31);
}

// The unit's chain over products kbeg ≤ k < kend (blocks from kbeg): acc[0..n) the addends on
// entry and the results on exit; pass(k0, k1, half, c, out) one pass of the datapath over n
// outputs; d1, d2, zero: scratch [n].
template <class Pass>
[[gnu::always_inline]] inline void unit_chain(const UnitConsts& uc, size_t kbeg, size_t kend, size_t n, double* acc,
                                              double* d1, double* d2, const double* zero, Pass pass) {
  const MatrixUnit& u = *uc.u;
  const size_t kb = u.interleaved ? 32 : size_t(u.dp.block);
  for (size_t k0 = kbeg; k0 < kend; k0 += kb) {
    const size_t k1 = kend - k0 < kb ? kend : k0 + kb;
    if (!u.interleaved) {
      pass(k0, k1, MuHalf::all, acc, acc);
    } else {
      pass(k0, k1, MuHalf::low, zero, d1);
      pass(k0, k1, MuHalf::high, d1, d2);
      for (size_t j = 0; j < n; ++j) {
        const double x = d2[j], y = acc[j];
        const bool fin = x - x == 0 && y - y == 0;
        const double s = add_round_odd(fin ? x : 0.0, fin ? y : 0.0);
        acc[j] = fin ? round_value<Rounding::rne>(s, uc.out) : x + y;
      }
    }
  }
}

// The kernel's drive of the unit over K (matrix_unit.h MuKernel) for n outputs: d[0..n) ← D with
// addends c0 (null: none); chain(kbeg, kend, acc) runs the unit over those products into acc.
// acc, f, g: scratch [n].
template <class Chain>
[[gnu::always_inline]] inline void unit_drive(const MuKernel& kn, size_t K, size_t n, const double* c0, double* d,
                                              double* acc, double* f, double* g, Chain chain) {
  if (!kn.composed()) {
    for (size_t j = 0; j < n; ++j) acc[j] = c0 ? c0[j] : 0.0;
    chain(0, K, acc);
    for (size_t j = 0; j < n; ++j) d[j] = acc[j];
    return;
  }
  const size_t S = size_t(kn.split_k), part = S > 1 ? (K + S - 1) / S : K;
  const size_t P = kn.promote_every > 0 ? size_t(kn.promote_every) : std::max<size_t>(part, 1);
  for (size_t j = 0; j < n; ++j) f[j] = 0.0;
  for (size_t s0 = 0; s0 < K; s0 += part) {
    const size_t s1 = std::min(K, s0 + part);
    for (size_t j = 0; j < n; ++j) g[j] = 0.0;
    for (size_t r0 = s0; r0 < s1; r0 += P) {  // one run: the unit from 0, then into the register
      for (size_t j = 0; j < n; ++j) acc[j] = 0.0;
      chain(r0, std::min(s1, r0 + P), acc);
      for (size_t j = 0; j < n; ++j) g[j] = promote_step(g[j], acc[j]);
    }
    for (size_t j = 0; j < n; ++j) f[j] = promote_step(f[j], g[j]);
  }
  for (size_t j = 0; j < n; ++j) d[j] = c0 ? promote_step(f[j], c0[j]) : f[j];
}

// Rows [i0, i1) of D, each row's outputs j < N together: unit_pass over chunks of kChunk
// outputs, then single ones.
constexpr size_t kChunk = 256;
template <bool kRne, bool kNarrow>
[[gnu::always_inline]] inline void unit_rows_impl(const UnitConsts& uc, const float* A, const int32_t* EA,
                                                  const float* B, const int32_t* EB, double* D, const double* C0,
                                                  size_t i0, size_t i1, size_t N, size_t K) {
  std::vector<double> acc(N), f(N), g(N), d1(N), d2(N), zero(N, 0.0);
  for (size_t i = i0; i < i1; ++i) {
    const float* a = A + i * K;
    const int32_t* ea = EA + i * K;
    // always_inline: a lambda does not take the enclosing function's target (the AVX-512 instance)
    auto pass = [&](size_t k0, size_t k1, MuHalf half, const double* c, double* out) __attribute__((always_inline)) {
      size_t j = 0;
      for (; j + kChunk <= N; j += kChunk)
        unit_pass<kRne, kNarrow, kChunk>(uc, a, ea, B + j, EB + j, N, k0, k1, half, c + j, out + j);
      for (; j < N; ++j) unit_pass<kRne, kNarrow, 1>(uc, a, ea, B + j, EB + j, N, k0, k1, half, c + j, out + j);
    };
    unit_drive(uc.kernel, K, N, C0 ? C0 + i * N : nullptr, D + i * N, acc.data(), f.data(), g.data(),
               [&](size_t kbeg, size_t kend, double* x) __attribute__((always_inline)) {
                 unit_chain(uc, kbeg, kend, N, x, d1.data(), d2.data(), zero.data(), pass);
               });
  }
}

// The register tile of the AVX-512 narrow kernel below (rows × outputs); rows are also the
// portable kernel's work item.
constexpr size_t kTileRows = 4, kTileCols = 32;

void unit_rows_portable(const UnitConsts& uc, const float* A, const int32_t* EA, const float* B, const int32_t* EB,
                        double* D, const double* C0, size_t i0, size_t i1, size_t N, size_t K) {
  const bool rne = uc.u->dp.out_rne, narrow = narrow_ok(*uc.u);
  if (rne && narrow) unit_rows_impl<true, true>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else if (rne) unit_rows_impl<true, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else if (narrow) unit_rows_impl<false, true>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else unit_rows_impl<false, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
}

#if defined(MANTIS_X86)
// The narrow units on AVX-512, register-blocked: a tile of kTileRows rows × kTileCols outputs
// keeps each pass's alignment exponents, scales and int32 sums in registers, and each row of B
// (and of its exponents) loaded once serves every row of the tile. The same arithmetic as
// unit_pass<kRne, true>: max of int32 exponents, (a·b)·scf in binary32 truncated to int32, summed.
// unit_finish for one row of a tile, kTileCols outputs of S + Si (int32), in registers, 8 lanes of
// binary64 at a time: the same bit operations as round.h's round_normal and unit_finish's
// overflow and addend rules. False, with nothing written, when a value is outside the datapath's
// normal range (or the target has no shortcut): the caller takes unit_finish.
template <bool kRne>
[[MANTIS_AVX512_TARGET, gnu::always_inline]] inline bool unit_finish_tile(const UnitConsts& uc, const int32_t* X,
                                                                           const double* S, const int32_t* Si,
                                                                           const double* c, double* out) {
  constexpr size_t G = kTileCols / 8;
  const Target<double>& t = uc.dp;
  if (t.general_only) return false;
  const int F = uc.u->dp.frac_bits;
  const __m512i sign = _mm512_set1_epi64(int64_t(uint64_t(1) << 63)), inf = _mm512_set1_epi64(int64_t(0x7FFull << 52));
  const __m512i lo = _mm512_set1_epi64(int64_t(t.normal_lo)), span = _mm512_set1_epi64(int64_t(t.normal_hi - t.normal_lo));
  const __m512i keep = _mm512_set1_epi64(int64_t(~((uint64_t(1) << t.drop) - 1)));
  const __m512i half_m1 = _mm512_set1_epi64(int64_t((uint64_t(1) << t.drop) / 2 - 1));
  const __m512i hidden = _mm512_set1_epi64(int64_t(uint64_t(1) << 52)), one = _mm512_set1_epi64(1);
  const __m512i bias = _mm512_set1_epi64(1023 - F), lim = _mm512_set1_epi64(int64_t(to_bits(uc.dp_lim)));
  const __m128i drop = _mm_cvtsi32_si128(t.drop);
  __m512i r[G], cb[G];
  __mmask8 outside = 0;
  for (size_t g = 0; g < G; ++g) {
    const __m512d s = _mm512_add_pd(_mm512_load_pd(S + 8 * g),
                                    _mm512_cvtepi32_pd(_mm256_load_si256(reinterpret_cast<const __m256i*>(Si + 8 * g))));
    const __m512i x = _mm512_cvtepi32_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(X + 8 * g)));
    const __m512d v = _mm512_mul_pd(s, _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(x, bias), 52)));
    const __m512i u = _mm512_castpd_si512(v), sg = _mm512_and_si512(u, sign), a = _mm512_andnot_si512(sign, u);
    outside |= _mm512_mask_cmpgt_epu64_mask(_mm512_test_epi64_mask(a, a), _mm512_sub_epi64(a, lo), span);
    __m512i m;
    if constexpr (kRne) {
      const __m512i lsb = _mm512_and_si512(_mm512_srl_epi64(_mm512_or_si512(a, hidden), drop), one);
      m = _mm512_and_si512(_mm512_add_epi64(_mm512_add_epi64(a, half_m1), lsb), keep);
    } else {
      m = _mm512_and_si512(a, keep);
    }
    // −0 → +0 where the format has no negative zero (round_normal's unsigned_zero)
    const __m512i sgn = t.unsigned_zero ? _mm512_maskz_mov_epi64(_mm512_test_epi64_mask(m, m), sg) : sg;
    // 2^(emax+1) and beyond: ±inf (unit_finish)
    r[g] = _mm512_mask_or_epi64(_mm512_or_si512(sgn, m), _mm512_cmpge_epu64_mask(m, lim), sgn, inf);
    cb[g] = _mm512_load_si512(c + 8 * g);
  }
  if (outside) return false;
  for (size_t g = 0; g < G; ++g) {
    const __mmask8 cinf = _mm512_cmpeq_epi64_mask(_mm512_and_si512(cb[g], inf), inf);  // a non-finite addend stays
    _mm512_store_si512(out + 8 * g, _mm512_mask_mov_epi64(r[g], cinf, cb[g]));
  }
  return true;
}

// unit_x_from_c for one row of a tile in registers: x[0], x[1] the two halves of its kTileCols
// alignment exponents (int32), from the addends c.
[[MANTIS_AVX512_TARGET, gnu::always_inline]] inline void unit_x_tile(const double* c, __m512i* x) {
  const __m512i abs = _mm512_set1_epi64(int64_t(~(uint64_t(1) << 63))), top = _mm512_set1_epi64(0x7FF);
  const __m512i bias = _mm512_set1_epi64(1023), lo = _mm512_set1_epi64(-126), none = _mm512_set1_epi64(kNoTerm);
  for (int h = 0; h < 2; ++h) {
    __m256i part[2];
    for (int q = 0; q < 2; ++q) {
      const __m512i u = _mm512_and_si512(_mm512_load_si512(c + 16 * h + 8 * q), abs), be = _mm512_srli_epi64(u, 52);
      const __mmask8 some = _mm512_test_epi64_mask(u, u) & _mm512_cmpneq_epi64_mask(be, top);
      part[q] = _mm512_cvtepi64_epi32(_mm512_mask_mov_epi64(none, some, _mm512_max_epi64(_mm512_sub_epi64(be, bias), lo)));
    }
    x[h] = _mm512_inserti64x4(_mm512_castsi256_si512(part[0]), part[1], 1);
  }
}

// unit_scale for one row of a tile in registers: x clamped in place, S (kTileCols) the addends
// aligned, sc the narrow path's scales.
[[MANTIS_AVX512_TARGET, gnu::always_inline]] inline void unit_scale_tile(const MuDatapath& d, const double* c,
                                                                          __m512i* x, double* S, __m512* sc) {
  const int F = d.frac_bits;
  const __m512i inf = _mm512_set1_epi64(int64_t(0x7FFull << 52)), up = _mm512_set1_epi64(F + 1023);
  for (int h = 0; h < 2; ++h) {
    x[h] = _mm512_max_epi32(_mm512_max_epi32(x[h], _mm512_set1_epi32(d.min_align)), _mm512_set1_epi32(-400));
    const __m512i xs = _mm512_max_epi32(x[h], _mm512_set1_epi32(-60));
    sc[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(F + 127), xs), 23));
    for (int q = 0; q < 2; ++q) {
      const __m512i xg = _mm512_cvtepi32_epi64(q ? _mm512_extracti64x4_epi64(x[h], 1) : _mm512_castsi512_si256(x[h]));
      const __m512i cb = _mm512_load_si512(c + 16 * h + 8 * q);
      const __m512d cf = _mm512_castsi512_pd(
          _mm512_maskz_mov_epi64(_mm512_cmpneq_epi64_mask(_mm512_and_si512(cb, inf), inf), cb));
      const __m512d p = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_sub_epi64(up, xg), 52));  // 2^(F − X)
      _mm512_store_pd(S + 16 * h + 8 * q, _mm512_cvtepi32_pd(_mm512_cvttpd_epi32(_mm512_mul_pd(cf, p))));
    }
  }
}

// GCC 12 warns that _mm512_max_epi32's and _mm512_cvttps_epi32's internal "undefined" source
// vector may be used uninitialised (a false positive: the unmasked forms ignore it).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool kRne>
[[MANTIS_AVX512_TARGET]] void unit_tile_pass(const UnitConsts& uc, const float* const* ap, const int32_t* const* eap,
                                             const float* B, const int16_t* EB, size_t ldb, const __mmask16* mp,
                                             size_t k0, size_t k1, MuHalf half, const double* c, double* out) {
  constexpr size_t R = kTileRows, W = kTileCols;
  alignas(64) int32_t X[R][W], Si[R][W];
  alignas(64) double S[R][W];
  // locals, so that the loops below keep everything in registers (no aliasing with the stores)
  const __mmask16 m0 = mp[0], m1 = mp[1];
  const float* a[R];
  const int32_t* ea[R];
#pragma GCC unroll 4
  for (size_t r = 0; r < R; ++r) a[r] = ap[r], ea[r] = eap[r];
  // The exponent maxima in int16, a row of the tile per vector (the nominal exponents of these
  // units lie within ±40; "no term" saturates at −32768, below every clamp of unit_scale).
  __m512i x[R][2], x16[R];
  const __mmask32 m16 = __mmask32(m0) | __mmask32(m1) << 16;
  for (size_t r = 0; r < R; ++r) {
    unit_x_tile(c + r * W, x[r]);
    x16[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(x[r][0])),
                                _mm512_cvtsepi32_epi16(x[r][1]), 1);
  }
  for (size_t k = k0; k < k1; ++k) {
    if (!mu_takes(half, k - k0)) continue;
    const __m512i eb = _mm512_maskz_loadu_epi16(m16, EB + k * ldb);
#pragma GCC unroll 4
    for (size_t r = 0; r < R; ++r) {
      const __m512i e = _mm512_set1_epi16(int16_t(std::max(ea[r][k], int32_t(kNoTerm16))));
      x16[r] = _mm512_max_epi16(x16[r], _mm512_adds_epi16(e, eb));
    }
  }
#pragma GCC unroll 4
  for (size_t r = 0; r < R; ++r) {
    x[r][0] = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(x16[r]));
    x[r][1] = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(x16[r], 1));
  }
  __m512 sc[R][2];
  __m512i si[R][2];
#pragma GCC unroll 4
  for (size_t r = 0; r < R; ++r) {
    unit_scale_tile(uc.u->dp, c + r * W, x[r], S[r], sc[r]);
    _mm512_store_si512(X[r], x[r][0]), _mm512_store_si512(X[r] + 16, x[r][1]);
    si[r][0] = si[r][1] = _mm512_setzero_si512();
  }
  for (size_t k = k0; k < k1; ++k) {
    if (!mu_takes(half, k - k0)) continue;
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, B + k * ldb), b1 = _mm512_maskz_loadu_ps(m1, B + k * ldb + 16);
#pragma GCC unroll 4
    for (size_t r = 0; r < R; ++r) {
      const __m512 ak = _mm512_set1_ps(a[r][k]);
      si[r][0] = _mm512_add_epi32(si[r][0], _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(ak, b0), sc[r][0])));
      si[r][1] = _mm512_add_epi32(si[r][1], _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(ak, b1), sc[r][1])));
    }
  }
#pragma GCC unroll 4
  for (size_t r = 0; r < R; ++r) _mm512_store_si512(Si[r], si[r][0]), _mm512_store_si512(Si[r] + 16, si[r][1]);
  for (size_t r = 0; r < R; ++r)
    if (!unit_finish_tile<kRne>(uc, X[r], S[r], Si[r], c + r * W, out + r * W)) {
      for (size_t j = 0; j < W; ++j) S[r][j] += double(Si[r][j]);
      unit_finish<kRne, W>(uc, X[r], S[r], c + r * W, out + r * W);
    }
}
#pragma GCC diagnostic pop

// The tile of rows [i0, i1) (at most kTileRows) and outputs j0 .. j0 + kTileCols (those < N);
// rows past i1 compute zeros (zero_a, zero_e: a row of zeros, K long) and are dropped.
template <bool kRne>
[[MANTIS_AVX512_TARGET]] void unit_tile_avx512(const UnitConsts& uc, const float* A, const int32_t* EA,
                                               const float* B, const int16_t* EB, double* D, const double* C0,
                                               size_t i0, size_t i1, size_t j0, size_t N, size_t K,
                                               const float* zero_a, const int32_t* zero_e) {
  constexpr size_t R = kTileRows, W = kTileCols, n = R * W;
  const float* a[R];
  const int32_t* ea[R];
  for (size_t r = 0; r < R; ++r) {
    a[r] = i0 + r < i1 ? A + (i0 + r) * K : zero_a;
    ea[r] = i0 + r < i1 ? EA + (i0 + r) * K : zero_e;
  }
  alignas(64) double c0[n], d[n], acc[n], f[n], g[n], d1[n], d2[n], zero[n] = {};
  const size_t w = std::min(W, N - j0);
  const __mmask16 m[2] = {__mmask16(w >= 16 ? 0xFFFF : (1u << w) - 1),
                          __mmask16(w >= 32 ? 0xFFFF : w > 16 ? (1u << (w - 16)) - 1 : 0)};
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < W; ++j) c0[r * W + j] = C0 && i0 + r < i1 && j < w ? C0[(i0 + r) * N + j0 + j] : 0.0;
  auto pass = [&](size_t k0, size_t k1, MuHalf half, const double* c, double* out) {
    unit_tile_pass<kRne>(uc, a, ea, B + j0, EB + j0, N, m, k0, k1, half, c, out);
  };
  unit_drive(uc.kernel, K, n, C0 ? c0 : nullptr, d, acc, f, g,
             [&](size_t kbeg, size_t kend, double* x) { unit_chain(uc, kbeg, kend, n, x, d1, d2, zero, pass); });
  for (size_t r = 0; r < R && i0 + r < i1; ++r)
    for (size_t j = 0; j < w; ++j) D[(i0 + r) * N + j0 + j] = d[r * W + j];
}

[[MANTIS_AVX512_TARGET]] void unit_rows_avx512(const UnitConsts& uc, const float* A, const int32_t* EA,
                                               const float* B, const int32_t* EB, double* D, const double* C0,
                                               size_t i0, size_t i1, size_t N, size_t K) {
  if (uc.u->dp.out_rne) unit_rows_impl<true, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else unit_rows_impl<false, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
}
#endif

Format unit_format(int prec, int emin, int emax) {
  Format f;
  f.name = "unit";
  f.mu = prec - 1, f.emin = emin, f.emax = emax;
  return f;
}

}  // namespace

void gemm_unit(const GemmPlan& p, const float* A, const float* B, double* D, size_t M, size_t N, size_t K,
               const double* C0) {
  const MatrixUnit& u = *p.unit;
  const bool parallel = M > 1 && double(M) * double(N) * double(K) >= 1 << 16;
  const bool avx = p.kernel != GemmKernel::portable;
  // The AVX-512 register tile for the narrow units (B's exponents in int16 there); else rows.
  const bool tiled = avx && narrow_ok(u);
  // The operands' nominal exponents (zero: kNoTerm), and whether every operand is finite.
  auto nominal = [&](const float* x, size_t n, auto* e) {
    using E = std::remove_pointer_t<decltype(e)>;
    constexpr E none = sizeof(E) == 2 ? E(kNoTerm16) : E(kNoTerm);
    int finite = 1;
#pragma omp parallel for schedule(static) reduction(& : finite) if (parallel && n >= 1 << 16)
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = to_bits(x[i]) & 0x7FFFFFFFu;
      finite &= bits < 0x7F800000u;
      const int32_t v = bits >= 0x00800000u ? int32_t(bits >> 23) - 127 : exp_of(double(x[i]));  // subnormal: via binary64
      e[i] = bits == 0 ? none : E(v > u.in_emin ? v : u.in_emin);
    }
    return finite != 0;
  };
  thread_local std::vector<int32_t> ea_scratch, eb_scratch;
  thread_local std::vector<int16_t> eb16_scratch;
  int32_t* EA = gemm_scratch(ea_scratch, M * K);
  int32_t* EB = tiled ? nullptr : gemm_scratch(eb_scratch, K * N);
  int16_t* EB16 = tiled ? gemm_scratch(eb16_scratch, K * N) : nullptr;
  const bool finite =
      nominal(A, M * K, EA) && (tiled ? nominal(B, K * N, EB16) : nominal(B, K * N, EB)) && !u.dp.normalise;
  if (!finite) {  // mu_dot per output: the special-value rules block by block
#pragma omp parallel for schedule(static) if (parallel)
    for (size_t i = 0; i < M; ++i)
      for (size_t j = 0; j < N; ++j)
        D[i * N + j] = mu_gemm_dot(u, p.unit_kernel, A + i * K, B + j, N, K, C0 ? C0[i * N + j] : 0.0, C0 != nullptr);
    return;
  }
  UnitConsts uc{&u, p.unit_kernel, make_target<double>(unit_format(u.dp.out_prec, u.dp.out_emin, u.dp.out_emax + 1)),
                std::ldexp(1.0, u.dp.out_emax + 1), make_target<double>(unit_format(u.out_prec, u.out_emin, u.out_emax))};
  // Work items of kTileRows rows × `cols` outputs (the AVX-512 narrow units: one register tile;
  // else whole rows), panel-major: a thread's run of items reuses each panel of B across row
  // groups while it is in cache.
  const size_t cols = tiled ? kTileCols : std::max<size_t>(N, 1);
  const size_t groups = (M + kTileRows - 1) / kTileRows, items = groups * ((N + cols - 1) / cols);
  const std::vector<float> zero_a(tiled ? K : 0, 0.0f);
  const std::vector<int32_t> zero_e(tiled ? K : 0, kNoTerm);
#pragma omp parallel for schedule(static) if (parallel)
  for (size_t t = 0; t < items; ++t) {
    const size_t i0 = (t % groups) * kTileRows, i1 = std::min(M, i0 + kTileRows), j0 = (t / groups) * cols;
#if defined(MANTIS_X86)
    if (tiled) {
      if (u.dp.out_rne)
        unit_tile_avx512<true>(uc, A, EA, B, EB16, D, C0, i0, i1, j0, N, K, zero_a.data(), zero_e.data());
      else
        unit_tile_avx512<false>(uc, A, EA, B, EB16, D, C0, i0, i1, j0, N, K, zero_a.data(), zero_e.data());
      continue;
    }
    if (avx) {
      unit_rows_avx512(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
      continue;
    }
#endif
    unit_rows_portable(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  }
}

}  // namespace mantis
