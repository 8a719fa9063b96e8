// gemm_avx512 — the register-blocked AVX-512 kernel of gemm_kernel.h.
//
// Compiled for AVX-512 through function attributes whatever -march is, and run only where
// cpu_has_avx512(): one binary serves every x86 node. Nothing here is a template with external
// linkage, so no AVX-512 instantiation can stand in for a portable one at link time.
//
// A tile is MR rows × NV vectors of L lanes; its accumulators stay in registers for all of k.
// Containers: binary32 (L = 16) when the accumulator has p ≤ 22 bits and emin ≥ −126, so that the
// round-to-odd value RO₂₄ has two spare bits and is a binary32 normal wherever the format's is;
// binary64 (L = 8) otherwise (p ≤ 51, emin ≥ −1022). In both, round(RO(x)) = round(x) for every
// mode (and sr with sr_bits ≤ container bits − 1 − p: plan_gemm checks it).
#include "core/gemm_kernel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/accumulate.h"
#include "core/philox.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MANTIS_X86 1
// GCC 12 reports the undefined-value idiom inside its own intrinsics (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mantis {

GemmKernel fastest_kernel(const GemmSpec& s) {
  if (!s.tensor_core.empty())  // the matrix-unit kernel (gemm_unit.cpp): vectorised for AVX-512 as a whole
    return cpu_has_avx512() ? GemmKernel::avx512_binary64 : GemmKernel::portable;
  const Format& f = s.acc;
  const int p = f.precision();
  // μ = 0 (the quantum bit is the exponent's) and formats beyond ieee / fn (Format::plain) keep the
  // portable kernel.
  if (!cpu_has_avx512() || f.mu < 1 || !f.plain() || s.accumulation == Accumulation::promoted ||
      s.accumulation == Accumulation::tensor_core)
    return GemmKernel::portable;
  const bool sr = s.acc_mode == Rounding::sr;
  if (fits_float(f) && p <= 22 && f.emin >= -126 && (!sr || s.sr_bits <= 23 - p))
    return GemmKernel::avx512_binary32;
  if (f.emin >= -1022) return GemmKernel::avx512_binary64;  // validate: p ≤ 51, sr_bits ≤ 52 − p
  return GemmKernel::portable;
}

#if !defined(MANTIS_X86)

void gemm_avx512(const GemmPlan&, const float*, const float*, double*, size_t, size_t, size_t, uint64_t) {
  __builtin_trap();  // unreachable: fastest_kernel never picks it here
}

#else

#define AVX [[MANTIS_AVX512_TARGET, gnu::always_inline]] inline

namespace {

constexpr int kRD = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
constexpr int kRU = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
constexpr int kRZ = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;

// ---------------------------------------------------------------- the two containers
// Lane ops of the accumulator (V: values, __m512i: their bits) and of the blocked chunk sums
// (CV: binary32 vectors of the same lane count).
struct F32 {
  using V = __m512;
  using CV = __m512;
  using Mk = __mmask16;
  using S = uint32_t;
  static constexpr int L = 16;
  AVX static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  AVX static V load(const float* p, Mk m) { return _mm512_maskz_loadu_ps(m, p); }
  AVX static V zero() { return _mm512_setzero_ps(); }
  AVX static V from_bits(__m512i u) { return _mm512_castsi512_ps(u); }
  AVX static __m512i bits(V x) { return _mm512_castps_si512(x); }
  template <int R> AVX static V fma_r(V a, V b, V c) { return _mm512_fmadd_round_ps(a, b, c, R); }
  template <int R> AVX static V mul_r(V a, V b) { return _mm512_mul_round_ps(a, b, R); }
  template <int R> AVX static V add_r(V a, V b) { return _mm512_add_round_ps(a, b, R); }
  AVX static __m512i set1(S x) { return _mm512_set1_epi32(int32_t(x)); }
  AVX static __m512i add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  AVX static __m512i sub(__m512i a, __m512i b) { return _mm512_sub_epi32(a, b); }
  AVX static __m512i max_u(__m512i a, __m512i b) { return _mm512_max_epu32(a, b); }
  AVX static __m512i min_u(__m512i a, __m512i b) { return _mm512_min_epu32(a, b); }
  AVX static __m512i srl(__m512i a, __m128i n) { return _mm512_srl_epi32(a, n); }
  AVX static __m512i sll(__m512i a, __m128i n) { return _mm512_sll_epi32(a, n); }
  AVX static __m512i rotl(__m512i a, int n) { return _mm512_rolv_epi32(a, _mm512_set1_epi32(n)); }
  // max(|a|, |b|) of the values, sign cleared; a NaN stays NaN (vrangeps): one instruction
  AVX static __m512i max_abs(__m512i a, __m512i b) {
    return bits(_mm512_range_ps(from_bits(a), from_bits(b), 0b1011));
  }
  AVX static Mk test(__m512i a, __m512i b) { return _mm512_test_epi32_mask(a, b); }
  AVX static Mk testn(__m512i a, __m512i b) { return _mm512_testn_epi32_mask(a, b); }
  AVX static Mk lt_u(__m512i a, __m512i b) { return _mm512_cmplt_epu32_mask(a, b); }
  AVX static Mk gt_u(__m512i a, __m512i b) { return _mm512_cmpgt_epu32_mask(a, b); }
  AVX static __m512i mask_add(__m512i src, Mk k, __m512i a, __m512i b) { return _mm512_mask_add_epi32(src, k, a, b); }
  AVX static __m512i mask_or(__m512i src, Mk k, __m512i a, __m512i b) { return _mm512_mask_or_epi32(src, k, a, b); }
  AVX static __m512i blend(Mk k, __m512i a, __m512i b) { return _mm512_mask_blend_epi32(k, a, b); }
  AVX static CV cbcast(const float* p) { return _mm512_set1_ps(*p); }
  AVX static CV cload(const float* p, Mk m) { return _mm512_maskz_loadu_ps(m, p); }
  AVX static CV czero() { return _mm512_setzero_ps(); }
  AVX static CV cfma(CV a, CV b, CV c) { return _mm512_fmadd_ps(a, b, c); }  // binary32 RNE: chunk_step
  AVX static V widen(CV c) { return c; }
  AVX static void store(double* c, Mk m, V x) {
    const __m256 lo = _mm512_castps512_ps256(x);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    _mm512_mask_storeu_pd(c, __mmask8(m), _mm512_cvtps_pd(lo));
    _mm512_mask_storeu_pd(c + 8, __mmask8(m >> 8), _mm512_cvtps_pd(hi));
  }
};

struct F64 {
  using V = __m512d;
  using CV = __m256;
  using Mk = __mmask8;
  using S = uint64_t;
  static constexpr int L = 8;
  AVX static V bcast(const float* p) { return _mm512_set1_pd(double(*p)); }
  AVX static V load(const float* p, Mk m) { return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p)); }
  AVX static V zero() { return _mm512_setzero_pd(); }
  AVX static V from_bits(__m512i u) { return _mm512_castsi512_pd(u); }
  AVX static __m512i bits(V x) { return _mm512_castpd_si512(x); }
  template <int R> AVX static V fma_r(V a, V b, V c) { return _mm512_fmadd_round_pd(a, b, c, R); }
  template <int R> AVX static V mul_r(V a, V b) { return _mm512_mul_round_pd(a, b, R); }
  template <int R> AVX static V add_r(V a, V b) { return _mm512_add_round_pd(a, b, R); }
  AVX static __m512i set1(S x) { return _mm512_set1_epi64(int64_t(x)); }
  AVX static __m512i add(__m512i a, __m512i b) { return _mm512_add_epi64(a, b); }
  AVX static __m512i sub(__m512i a, __m512i b) { return _mm512_sub_epi64(a, b); }
  AVX static __m512i max_u(__m512i a, __m512i b) { return _mm512_max_epu64(a, b); }
  AVX static __m512i min_u(__m512i a, __m512i b) { return _mm512_min_epu64(a, b); }
  AVX static __m512i srl(__m512i a, __m128i n) { return _mm512_srl_epi64(a, n); }
  AVX static __m512i sll(__m512i a, __m128i n) { return _mm512_sll_epi64(a, n); }
  AVX static __m512i rotl(__m512i a, int n) { return _mm512_rolv_epi64(a, _mm512_set1_epi64(n)); }
  AVX static __m512i max_abs(__m512i a, __m512i b) {
    return bits(_mm512_range_pd(from_bits(a), from_bits(b), 0b1011));
  }
  AVX static Mk test(__m512i a, __m512i b) { return _mm512_test_epi64_mask(a, b); }
  AVX static Mk testn(__m512i a, __m512i b) { return _mm512_testn_epi64_mask(a, b); }
  AVX static Mk lt_u(__m512i a, __m512i b) { return _mm512_cmplt_epu64_mask(a, b); }
  AVX static Mk gt_u(__m512i a, __m512i b) { return _mm512_cmpgt_epu64_mask(a, b); }
  AVX static __m512i mask_add(__m512i src, Mk k, __m512i a, __m512i b) { return _mm512_mask_add_epi64(src, k, a, b); }
  AVX static __m512i mask_or(__m512i src, Mk k, __m512i a, __m512i b) { return _mm512_mask_or_epi64(src, k, a, b); }
  AVX static __m512i blend(Mk k, __m512i a, __m512i b) { return _mm512_mask_blend_epi64(k, a, b); }
  AVX static CV cbcast(const float* p) { return _mm256_set1_ps(*p); }
  AVX static CV cload(const float* p, Mk m) { return _mm256_maskz_loadu_ps(m, p); }
  AVX static CV czero() { return _mm256_setzero_ps(); }
  AVX static CV cfma(CV a, CV b, CV c) { return _mm256_fmadd_ps(a, b, c); }  // binary32 RNE: chunk_step
  AVX static V widen(CV c) { return _mm512_cvtps_pd(c); }
  AVX static void store(double* c, Mk m, V x) { _mm512_mask_storeu_pd(c, m, x); }
};

// ---------------------------------------------------------------- random words (philox.h, 8 lanes)
// Philox4x32-10 of 8 counters at once, one per 64-bit lane (the word in its low half); the key
// schedule and the stream half of the counter are the same for every lane.
struct Rng {
  __m512i stream_lo, stream_hi, k0[10], k1[10];
};

// v = x in every lane of width S, built in default-target code (the plan side has no AVX-512).
template <class S> void splat(__m512i& v, S x) {
  alignas(64) S a[64 / sizeof(S)];
  std::fill(a, a + 64 / sizeof(S), x);
  std::memcpy(&v, a, 64);
}

Rng make_rng(uint64_t seed, uint64_t stream) {
  Rng g{};
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    splat<uint64_t>(g.k0[r], k0);
    splat<uint64_t>(g.k1[r], k1);
  }
  splat<uint64_t>(g.stream_lo, uint32_t(stream));
  splat<uint64_t>(g.stream_hi, uint32_t(stream >> 32));
  return g;
}

// w[i][0..3] = the words of blocks q[i] (philox.h random_block) for G independent counter
// vectors, round by round so that the chains' multiply latencies overlap. Each word is in the low
// half of its lane; the high halves are garbage (the multiplies read low halves only): callers
// mask or pack. A product's high half reaches the low one by a dword swap (a shuffle, off the
// multiplier's port), not a shift.
AVX __m512i swap_halves(__m512i x) { return _mm512_shuffle_epi32(x, _MM_PERM_CDAB); }

template <int G> AVX void philox8(const Rng& g, const __m512i* q, __m512i (*w)[4]) {
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  __m512i c0[G], c1[G], c2[G], c3[G];
  for (int i = 0; i < G; ++i) c0[i] = q[i], c1[i] = swap_halves(q[i]), c2[i] = g.stream_lo, c3[i] = g.stream_hi;
  for (int r = 0; r < 10; ++r)
    for (int i = 0; i < G; ++i) {
      const __m512i p0 = _mm512_mul_epu32(c0[i], m0), p1 = _mm512_mul_epu32(c2[i], m1);
      c0[i] = _mm512_ternarylogic_epi64(swap_halves(p1), c1[i], g.k0[r], 0x96);  // a ^ b ^ c
      c1[i] = p1;
      c2[i] = _mm512_ternarylogic_epi64(swap_halves(p0), c3[i], g.k1[r], 0x96);
      c3[i] = p0;
    }
  for (int i = 0; i < G; ++i) w[i][0] = c0[i], w[i][1] = c1[i], w[i][2] = c2[i], w[i][3] = c3[i];
}

AVX __m512i low_halves(__m512i x) { return _mm512_and_si512(x, _mm512_set1_epi64(0xFFFFFFFF)); }

// The rounding word of each lane's index (any index), 2^pack per random word (philox.h sr_word):
// one Philox block per lane, word (idx >> pack) & 3 of it, its slot moved to the top of the low half.
AVX __m512i word8(const Rng& g, __m512i idx, int pack) {
  __m512i w[1][4];
  const __m512i wi = _mm512_srl_epi64(idx, _mm_cvtsi32_si128(pack));
  const __m512i q = _mm512_srli_epi64(wi, 2);
  philox8<1>(g, &q, w);
  const __m512i sel = _mm512_and_si512(wi, _mm512_set1_epi64(3));
  __m512i r = w[0][0];
  r = _mm512_mask_mov_epi64(r, _mm512_cmpeq_epi64_mask(sel, _mm512_set1_epi64(1)), w[0][1]);
  r = _mm512_mask_mov_epi64(r, _mm512_cmpeq_epi64_mask(sel, _mm512_set1_epi64(2)), w[0][2]);
  r = _mm512_mask_mov_epi64(r, _mm512_cmpeq_epi64_mask(sel, _mm512_set1_epi64(3)), w[0][3]);
  if (pack == 0) return r;
  // (idx mod 2^pack)·32/2^pack in each lane's low dword (its high dword, garbage, gets count 0)
  const __m512i slot = _mm512_and_si512(idx, _mm512_set1_epi64((1 << pack) - 1));
  return _mm512_sllv_epi32(r, _mm512_sll_epi64(slot, _mm_cvtsi32_si128(5 - pack)));
}

// The low halves of two × 8 lanes as 16 × 32-bit (lanes 0..7 from lo8, 8..15 from hi8): one vpermt2d.
AVX __m512i pack16(__m512i lo8, __m512i hi8) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_permutex2var_epi32(lo8, even, hi8);
}

// The lane indices of one tile vector: index t of the vector's outputs is base + t + lane·stride.
template <class C> struct LaneIndex;
template <> struct LaneIndex<F32> {
  static constexpr int kHalves = 2;
  __m512i off[2];  // lanes 0..7 and 8..15
  AVX __m512i word(const Rng& g, uint64_t at, int pack) const {
    const __m512i b = _mm512_set1_epi64(int64_t(at));
    return pack16(word8(g, _mm512_add_epi64(b, off[0]), pack), word8(g, _mm512_add_epi64(b, off[1]), pack));
  }
  // The Philox block of each lane of half h when at + lane·stride ≡ 0 (mod 4·2^pack), and the 16
  // words of one step from the two halves' blocks.
  AVX __m512i block(uint64_t at, int h, int pack) const {
    return _mm512_add_epi64(_mm512_set1_epi64(int64_t(at >> (2 + pack))),
                            _mm512_srl_epi64(off[h], _mm_cvtsi32_si128(2 + pack)));
  }
  AVX static __m512i words(const __m512i* half) { return pack16(half[0], half[1]); }
};
template <> struct LaneIndex<F64> {
  static constexpr int kHalves = 1;
  __m512i off[1];
  AVX __m512i word(const Rng& g, uint64_t at, int pack) const {
    return low_halves(word8(g, _mm512_add_epi64(_mm512_set1_epi64(int64_t(at)), off[0]), pack));
  }
  AVX __m512i block(uint64_t at, int, int pack) const {
    return _mm512_add_epi64(_mm512_set1_epi64(int64_t(at >> (2 + pack))),
                            _mm512_srl_epi64(off[0], _mm_cvtsi32_si128(2 + pack)));
  }
  AVX static __m512i words(const __m512i* half) { return low_halves(half[0]); }
};

// ---------------------------------------------------------------- one rounding, normal range
// The constants of round_normal for a target in container C (drop ≥ 1: μ ≥ 1 and p ≤ MANT − 1).
template <class C> struct Consts {
  __m512i mask, notmask, half, half_m1, quantum, one, sign, absmask, lo_m1, hi, inf;
  // sr (drop > R = sr_bits: fastest_kernel): the remainder's bits at and above 2^(drop − R), where
  // Words::get rotates the rounding's R random bits
  __m512i sr_mask;
  int drop;
};

template <class C, class T> Consts<C> make_consts(const Target<T>& t) {
  using S = typename C::S;
  Consts<C> k{};
  const S q = S(1) << t.drop;
  splat<S>(k.mask, q - 1);
  splat<S>(k.notmask, ~(q - 1));
  splat<S>(k.half, q >> 1);
  splat<S>(k.half_m1, (q >> 1) - 1);
  splat<S>(k.quantum, q);
  splat<S>(k.one, 1);
  splat<S>(k.sign, S(1) << (sizeof(S) * 8 - 1));
  splat<S>(k.absmask, ~(S(1) << (sizeof(S) * 8 - 1)));
  splat<S>(k.lo_m1, S(t.normal_lo) - 1);
  splat<S>(k.hi, S(t.normal_hi));
  splat<S>(k.inf, S(((S(1) << (sizeof(S) * 8 - 1 - Container<T>::kMant)) - 1) << Container<T>::kMant));
  const int R = 32 - t.sr_shift;
  splat<S>(k.sr_mask, t.drop > R ? (q - 1) & ~((S(1) << (t.drop - R)) - 1) : 0);
  k.drop = t.drop;
  return k;
}

// round_normal<M> of the bits u of a value that is zero or in the normal range (the sign stays:
// fnuz formats keep the portable kernel); the guard below says where it is also right outside it.
// rnd: the random word of each lane (sr, sre).
template <class C, Rounding M>
AVX __m512i round_fast(const Consts<C>& k, __m512i u, __m512i rnd) {
  using R = Rounding;
  const __m512i trunc = _mm512_and_si512(u, k.notmask);
  if constexpr (M == R::rne) {  // carry iff rem > half, or rem = half and the kept lsb is 1
    const __m512i t = C::add(u, k.half_m1);
    return _mm512_and_si512(C::mask_add(t, C::test(u, k.quantum), t, k.one), k.notmask);
  }
  if constexpr (M == R::rna) return _mm512_and_si512(C::add(u, k.half), k.notmask);
  if constexpr (M == R::rz) return trunc;
  if constexpr (M == R::ru) return _mm512_and_si512(C::mask_add(u, C::testn(u, k.sign), u, k.mask), k.notmask);
  if constexpr (M == R::rd) return _mm512_and_si512(C::mask_add(u, C::test(u, k.sign), u, k.mask), k.notmask);
  if constexpr (M == R::ro) return C::mask_or(trunc, C::test(u, k.mask), trunc, k.quantum);
  if constexpr (M == R::sre)
    return C::mask_add(trunc, C::test(u, k.mask) & C::test(rnd, C::set1(typename C::S(0x80000000u))), trunc,
                       k.quantum);
  if constexpr (M == R::sr) {
    // round.h's test r < ⌊rem / 2^(drop−R)⌋ (r: the rounding's R random bits, which rnd holds at
    // bits drop − R .. drop − 1, among others that sr_mask drops) as a carry: the remainder plus
    // (2^R − 1 − r)·2^(drop−R) reaches 2^drop exactly then, the bits below 2^(drop − R) never
    // tipping it; add and truncate, no compare
    return _mm512_and_si512(C::add(u, _mm512_andnot_si512(rnd, k.sr_mask)), k.notmask);
  }
  return trunc;
}

// Round-to-odd from the two directed roundings lo ≤ hi of one exact value: equal → exact, else
// the neighbour with the odd last bit. An exact zero from cancellation gives RD −0, RU +0: hi,
// as binary64 RNE addition gives.
template <class C> AVX __m512i round_odd(const Consts<C>& k, typename C::V lo, typename C::V hi) {
  const __m512i l = C::bits(lo);
  return C::blend(C::test(l, k.one), C::bits(hi), l);
}

// One operation's exact result in the container, as round_fast<M> and the guard need it: RO from
// the two directed roundings; for sr, RZ alone (one instruction instead of three). RZ differs from
// RO in the last bit only, which sr never reads (only the remainder at and above 2^(drop − R),
// drop > R: fastest_kernel); and where the guard sees RZ's value but not RO's — an inexact value
// just past the largest finite, or one below the container's least subnormal, which RZ makes ±0 —
// the exact value is within one container ulp of RZ's, below sr's grid, and rounds as RZ's does.
enum class Op { fma, mul, add };
template <class C, Op O, int R> AVX typename C::V apply(typename C::V a, typename C::V b, typename C::V c) {
  if constexpr (O == Op::fma) return C::template fma_r<R>(a, b, c);
  if constexpr (O == Op::mul) return C::template mul_r<R>(a, b);
  if constexpr (O == Op::add) return C::template add_r<R>(a, b);
}
template <class C, Rounding M, Op O>
AVX __m512i exact(const Consts<C>& k, typename C::V a, typename C::V b, typename C::V c = C::zero()) {
  if constexpr (M == Rounding::sr)
    return C::bits(apply<C, O, kRZ>(a, b, c));
  else
    return round_odd<C>(k, apply<C, O, kRD>(a, b, c), apply<C, O, kRU>(a, b, c));
}

// The tile's range guard, per step: the largest |x| and the smallest |x| − 1 (zero wraps to the
// top). Three strengths (G):
//   kGuardBoth  both ends.
//   kGuardTop   no lower end, where the format's subnormals are the container's at a coarser
//               quantum (emin = the container's, with subnormals): the pattern is linear in the
//               value across 2^emin, so the fixed-bit rounding is right below it too, and RO in
//               the container's subnormals keeps ≥ 2 spare bits.
//   kGuardNaN   nothing per step, where moreover the format's top is the container's (emax the
//               container's, overflow to inf, IEEE specials) and the mode is deterministic: then
//               add-and-mask carries an overflowing value into the inf pattern, truncation stops at
//               the largest finite value, and inf stays inf — as the general rounding does (RO of
//               a value past the container's range is its largest finite, odd, which rounds the
//               same way). Only a NaN's sign and payload would differ, and a NaN never leaves the
//               accumulator: a tile ending with one is redone. (Under sr/sre a value past 2^128
//               must overflow whatever the word; RO's clamp would let it round down: guarded.)
constexpr int kGuardNaN = 0, kGuardTop = 1, kGuardBoth = 2;
struct Guard {
  __m512i mx, mn;
};
template <class C, int G> AVX void track(const Consts<C>& k, Guard& g, __m512i x) {
  if constexpr (G == kGuardTop) {
    g.mx = C::max_abs(g.mx, x);
  } else if constexpr (G == kGuardBoth) {
    const __m512i a = _mm512_and_si512(x, k.absmask);
    g.mx = C::max_u(g.mx, a);
    g.mn = C::min_u(g.mn, C::sub(a, k.one));
  }
}

// ---------------------------------------------------------------- the tile
template <class C> struct Ctx {
  const float* A;  // M×K
  const float* B;  // K×N
  double* Cm;      // M×N
  const float* zero_row;  // K zeros: the A row of a tile row past M
  size_t M, N, K, kb, nchunks, stride;  // stride: rounding words per output
  int pack;                              // 2^pack rounding words per random word (philox.h sr_word)
  Consts<C> k;
  Rng rng;
  LaneIndex<C> lanes;
};

// The rounding word of step t of a tile vector. Aligned: every lane's index is ≡ 0 (mod Q =
// 4·2^pack) at t ≡ 0, so one Philox block serves Q steps; the tile's blocks for those steps are
// drawn together (independent chains overlap) by prepare(t), and step t takes word (t >> pack)
// mod 4 of them shifted to its slot. Else one block per word.
template <class C, Rounding Mode, bool Aligned, int MR, int NV> struct Words {
  static constexpr bool kBuffered = is_stochastic(Mode) && Aligned;
  static constexpr int H = LaneIndex<C>::kHalves, kChains = MR * NV * H;
  __m512i buf[kBuffered ? MR : 1][kBuffered ? NV : 1][4];
  // Not inlined: its 160 vectors of chains would crowd the tile's accumulators out of registers.
  [[MANTIS_AVX512_TARGET, gnu::noinline]] void refill(const Ctx<C>& c, const uint64_t (*base)[NV], uint64_t t) {
    static_assert(kChains % 4 == 0);
    __m512i q[kChains], w[kChains][4];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        for (int h = 0; h < H; ++h) q[(r * NV + v) * H + h] = c.lanes.block(base[r][v] + t, h, c.pack);
    for (int i = 0; i < kChains; i += 4) philox8<4>(c.rng, q + i, w + i);
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        for (int d = 0; d < 4; ++d) {
          __m512i half[H];
          for (int h = 0; h < H; ++h) half[h] = w[(r * NV + v) * H + h][d];
          buf[r][v][d] = LaneIndex<C>::words(half);
        }
  }
  // Before the vectors of step t ask: the blocks of steps t .. t + Q − 1 when t starts them (kept
  // out of the vectors' loop, so that it stays unrolled with the accumulators in registers).
  // The steps one refill serves (K: all, when none is needed); the tile's step loops are split
  // into runs of that many, refilled at each run's start, so that no call sits in the inner loop.
  AVX static uint64_t run(const Ctx<C>& c) {
    return kBuffered ? uint64_t(4) << c.pack : ~uint64_t(0);
  }
  AVX void prepare(const Ctx<C>& c, const uint64_t (*base)[NV], uint64_t t) {
    if constexpr (kBuffered)
      if (t % (uint64_t(4) << c.pack) == 0) refill(c, base, t);
  }
  AVX __m512i get(const Ctx<C>& c, const uint64_t (*base)[NV], int r, int v, uint64_t t) {
    if constexpr (!is_stochastic(Mode)) {
      return _mm512_setzero_si512();
    } else if constexpr (Aligned) {
      // every lane at slot t mod 2^pack (the lanes' indices differ by multiples of Q), whose top
      // bit is `at` below the word's; at = 0 when unpacked: no branch, and the same for the
      // step's every vector (hoisted)
      const int at = int(t & ((uint64_t(1) << c.pack) - 1)) << (5 - c.pack);
      return place(c, buf[r][v][(t >> c.pack) & 3], at);
    } else {
      return place(c, c.lanes.word(c.rng, base[r][v] + t, c.pack), 0);
    }
  }
  // The word (in each lane's low 32 bits) as round_fast<Mode> reads it: sre, the slot's top bit as
  // the word's; sr, the slot rotated to end at bit drop (its first R bits at drop − R .. drop − 1).
  AVX static __m512i place(const Ctx<C>& c, __m512i w, int at) {
    if constexpr (Mode == Rounding::sr)
      return C::rotl(w, (c.k.drop - 32 + at) & (int(sizeof(typename C::S)) * 8 - 1));
    else
      return _mm512_sll_epi32(w, _mm_cvtsi32_si128(at));
  }
};

// The r and v loops are unrolled by pragma, so that the accumulators stay in registers whatever
// the size of a mode's step (GCC's own limit for complete unrolling is below the stochastic ones).
template <class C, Rounding Mode, Accumulation Acc, int MR, int NV, bool Aligned, int G>
[[MANTIS_AVX512_TARGET]] bool tile(const Ctx<C>& c, size_t i0, size_t j0) {
  using V = typename C::V;
  using CV = typename C::CV;
  using Mk = typename C::Mk;
  constexpr int L = C::L;
  const Consts<C>& k = c.k;
  const size_t N = c.N, K = c.K;

  Mk m[NV];
  for (int v = 0; v < NV; ++v) {
    const size_t j = j0 + size_t(v) * L;
    const size_t left = j < N ? N - j : 0;
    m[v] = left >= size_t(L) ? Mk(~Mk(0)) : Mk((Mk(1) << left) - 1);
  }
  const float* a[MR];
  uint64_t base[MR][NV];  // word index of each vector's lane 0 at t = 0
  for (int r = 0; r < MR; ++r) {
    a[r] = i0 + r < c.M ? c.A + (i0 + r) * K : c.zero_row;
    for (int v = 0; v < NV; ++v) base[r][v] = ((i0 + r) * N + j0 + size_t(v) * L) * c.stride;
  }
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = C::zero();
  Guard g{_mm512_setzero_si512(), _mm512_set1_epi64(-1)};
  Words<C, Mode, Aligned, MR, NV> w;

  if constexpr (Acc == Accumulation::strict) {
    const size_t q = size_t(std::min<uint64_t>(w.run(c), K));
    for (size_t k0 = 0; k0 < K; k0 += q) {
      w.prepare(c, base, k0);
      for (size_t kk = k0; kk < std::min(K, k0 + q); ++kk) {
        V b[NV];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = C::load(c.B + kk * N + j0 + size_t(v) * L, m[v]);
        #pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const V av = C::bcast(a[r] + kk);
          #pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            const __m512i x = exact<C, Mode, Op::fma>(k, av, b[v], acc[r][v]);
            track<C, G>(k, g, x);
            acc[r][v] = C::from_bits(round_fast<C, Mode>(k, x, w.get(c, base, r, v, kk)));
          }
        }
      }
    }
  } else if constexpr (Acc == Accumulation::unfused) {
    const size_t q = size_t(std::min<uint64_t>(w.run(c) / 2, K));  // two words a step
    for (size_t k0 = 0; k0 < K; k0 += q) {
      w.prepare(c, base, 2 * k0);
      for (size_t kk = k0; kk < std::min(K, k0 + q); ++kk) {
        V b[NV];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = C::load(c.B + kk * N + j0 + size_t(v) * L, m[v]);
        #pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const V av = C::bcast(a[r] + kk);
          #pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            const __m512i x = exact<C, Mode, Op::mul>(k, av, b[v]);
            track<C, G>(k, g, x);
            const V pr = C::from_bits(round_fast<C, Mode>(k, x, w.get(c, base, r, v, 2 * kk)));
            const __m512i y = exact<C, Mode, Op::add>(k, acc[r][v], pr);
            track<C, G>(k, g, y);
            acc[r][v] = C::from_bits(round_fast<C, Mode>(k, y, w.get(c, base, r, v, 2 * kk + 1)));
          }
        }
      }
    }
  } else {
    for (size_t ch = 0; ch < c.nchunks; ++ch) {
      CV s[MR][NV];
      #pragma GCC unroll 4
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) s[r][v] = C::czero();
      const size_t k1 = std::min(K, (ch + 1) * c.kb);
      for (size_t kk = ch * c.kb; kk < k1; ++kk) {
        CV b[NV];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = C::cload(c.B + kk * N + j0 + size_t(v) * L, m[v]);
        #pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const CV av = C::cbcast(a[r] + kk);
          #pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) s[r][v] = C::cfma(av, b[v], s[r][v]);
        }
      }
      w.prepare(c, base, ch);
      #pragma GCC unroll 4
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          const V cv = C::widen(s[r][v]);
          const __m512i x = exact<C, Mode, Op::add>(k, acc[r][v], cv);
          track<C, G>(k, g, x);
          acc[r][v] = C::from_bits(round_fast<C, Mode>(k, x, w.get(c, base, r, v, ch)));
        }
    }
  }

  bool ok = (C::gt_u(g.mx, k.hi) | (G == kGuardBoth ? C::lt_u(g.mn, k.lo_m1) : 0)) == 0;
  if constexpr (G == kGuardNaN)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) ok &= C::gt_u(_mm512_and_si512(C::bits(acc[r][v]), k.absmask), k.inf) == 0;
  if (ok)
    for (int r = 0; r < MR && i0 + r < c.M; ++r)
      for (int v = 0; v < NV; ++v) C::store(c.Cm + (i0 + r) * N + j0 + size_t(v) * L, m[v], acc[r][v]);
  return ok;
}

template <class C, class T, Rounding Mode, Accumulation Acc>
void run_kernel(const GemmPlan& p, const Target<T>& t, const float* A, const float* B, double* Cm, size_t M,
                size_t N, size_t K, uint64_t stream) {
  constexpr int MR = 4, NV = Acc == Accumulation::blocked ? 2 : 4, L = C::L;
  constexpr size_t NR = size_t(NV) * L;
  std::vector<float> zero_row(K, 0.0f);
  Ctx<C> c{};
  c.A = A, c.B = B, c.Cm = Cm, c.zero_row = zero_row.data();
  c.M = M, c.N = N, c.K = K, c.kb = p.block;
  c.nchunks = chunk_count(K, p.block);
  c.stride = Acc == Accumulation::strict ? K : Acc == Accumulation::unfused ? 2 * K : c.nchunks;
  c.pack = p.sr_pack;
  c.k = make_consts<C>(t);
  c.rng = make_rng(p.seed, stream);
  {
    alignas(64) uint64_t off[16];
    for (int l = 0; l < 16; ++l) off[l] = uint64_t(l) * c.stride;
    std::memcpy(c.lanes.off, off, sizeof(c.lanes.off));
  }
  // Aligned: every lane's word index is ≡ 0 (mod 4·2^pack) at t = 0, so one Philox block serves
  // 4·2^pack steps.
  const bool aligned = c.stride % (size_t(4) << c.pack) == 0;
  using U = typename Container<T>::U;
  constexpr int kMinExp = 1 - Container<T>::kBias;
  constexpr U kInf = ((U(1) << (sizeof(U) * 8 - 1 - Container<T>::kMant)) - 1) << Container<T>::kMant;
  const bool low = !(t.emin == kMinExp && t.extra == 0);
  const bool top = t.max_bits >> Container<T>::kMant == (kInf >> Container<T>::kMant) - 1 && t.ovf_bits == kInf &&
                   t.has_inf != 0 && t.saturate == 0;
  const int guard = low ? kGuardBoth : top && !is_stochastic(Mode) ? kGuardNaN : kGuardTop;
  const size_t row_tiles = (M + MR - 1) / MR, panels = (N + NR - 1) / NR, tiles = row_tiles * panels;
  const bool parallel = tiles > 1 && double(M) * double(N) * double(K) >= 1 << 16;
  // Panel-major: a thread's run of tiles reuses each B panel across row tiles while it is in cache.
#pragma omp parallel for schedule(static) if (parallel)
  for (size_t ti = 0; ti < tiles; ++ti) {
    const size_t i0 = (ti % row_tiles) * MR, j0 = (ti / row_tiles) * NR;
    bool ok;
    if constexpr (is_stochastic(Mode))
      ok = guard == kGuardBoth ? (aligned ? tile<C, Mode, Acc, MR, NV, true, kGuardBoth>(c, i0, j0)
                                          : tile<C, Mode, Acc, MR, NV, false, kGuardBoth>(c, i0, j0))
                               : (aligned ? tile<C, Mode, Acc, MR, NV, true, kGuardTop>(c, i0, j0)
                                          : tile<C, Mode, Acc, MR, NV, false, kGuardTop>(c, i0, j0));
    else
      ok = guard == kGuardBoth  ? tile<C, Mode, Acc, MR, NV, false, kGuardBoth>(c, i0, j0)
           : guard == kGuardTop ? tile<C, Mode, Acc, MR, NV, false, kGuardTop>(c, i0, j0)
                                : tile<C, Mode, Acc, MR, NV, false, kGuardNaN>(c, i0, j0);
    if (!ok) gemm_tile_portable(p, A, B, Cm, N, K, i0, std::min(M, i0 + MR), j0, std::min(N, j0 + NR), stream);
  }
}

}  // namespace

void gemm_avx512(const GemmPlan& p, const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
                 uint64_t stream) {
  with_rounding(p.acc_mode, [&](auto mode) {
    constexpr Rounding Mode = decltype(mode)::value;
    auto go = [&](auto acc) {
      constexpr Accumulation Acc = decltype(acc)::value;
      if (p.kernel == GemmKernel::avx512_binary32)
        run_kernel<F32, float, Mode, Acc>(p, p.acc_f, A, B, C, M, N, K, stream);
      else
        run_kernel<F64, double, Mode, Acc>(p, p.acc, A, B, C, M, N, K, stream);
    };
    switch (p.accumulation) {
      case Accumulation::strict: go(std::integral_constant<Accumulation, Accumulation::strict>{}); break;
      case Accumulation::unfused: go(std::integral_constant<Accumulation, Accumulation::unfused>{}); break;
      case Accumulation::blocked: go(std::integral_constant<Accumulation, Accumulation::blocked>{}); break;
    }
  });
}

#endif

}  // namespace mantis
