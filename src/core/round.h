// round — the rounding core: one value of a float or double container rounded once to a Format.
//
// Header code shared verbatim by the CPU (auto-vectorised loops in round_array.cpp, gemm.cpp)
// and the CUDA kernels (src/cuda). Branch-free integer manipulation of the IEEE bit pattern:
//
//   x = ±a (a = |x| as bits). With e = max(E,1) − bias the exponent of x, the target's quantum
//   at x is 2^(max(e, emin) − μ), i.e. the low s = MANT − μ + max(0, emin − e) bits of a
//   (plus μ more without subnormals). If s ≤ MANT the quantum is a bit position of the pattern:
//   truncate, decide "up" from the remainder, add one quantum (a carry into the exponent field
//   is the correct next binade). If s > MANT, |x| is below one quantum q: the result is 0 or q.
//   Results above the largest finite value are resolved by the overflow policy.
//
// Every mode is decided from (remainder, half-quantum, lsb, sign, random word): see up_decision.
// The result lies in the same container as the input; it is exactly representable in the other
// container whenever the format fits there (format.h: fits_float / fits_double).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/bits.h"
#include "core/format.h"
#include "core/philox.h"

namespace mantis {

// ---------------------------------------------------------------- container traits
template <class T> struct Container;
template <> struct Container<float> {
  using U = uint32_t;
  static constexpr int kMant = 23, kBias = 127, kWidth = 32;
};
template <> struct Container<double> {
  using U = uint64_t;
  static constexpr int kMant = 52, kBias = 1023, kWidth = 64;
};

template <class T> MANTIS_HD T from_bits(typename Container<T>::U u);
template <> MANTIS_HD float from_bits<float>(uint32_t u) { return float_from_bits(u); }
template <> MANTIS_HD double from_bits<double>(uint64_t u) { return double_from_bits(u); }

// ---------------------------------------------------------------- precomputed target
// Everything the hot loop needs about (format, container, sr_bits); built once on the host.
template <class T> struct Target {
  using U = typename Container<T>::U;
  int32_t drop;        // MANT − μ: bits cleared for a normal result
  int32_t emin;        // target emin
  int32_t extra;       // additional shift below 2^emin: 0 with subnormals, μ without
  int32_t sr_shift;    // 32 − sr_bits: the random word's top sr_bits bits are used
  U max_bits;          // |largest finite| as a container pattern
  U neg_max_bits;      // |most negative finite|: max_bits, or 2^(emax+1) for two's complement
  U tiny_bits;         // the quantum below 2^emin: 2^(emin−μ), or 2^emin without subnormals
  U ovf_bits;          // what an overflowing finite value becomes under overflow = inf / nan
  U nan_bits;          // canonical quiet NaN
  U below_bits;        // unsigned formats: what a negative input becomes (0, 2^emin or NaN)
  // Flags, 0 or 1 (integers, so that loops vectorise):
  U saturate;          // overflow = saturate: an overflowing (or infinite) value becomes ±largest
  U has_inf;           // the format has infinities (ieee, p3109)
  U unsigned_zero;     // −0 → +0 (fnuz, p3109, negative_zero = false)
  U unsigned_fmt;      // no negative values
  U no_zero;           // no zero: zero results become tiny_bits
  U general_only;      // round_normal does not apply (unsigned or zero-less formats)
  U normal_lo;         // |x| pattern range where round_normal applies: 2^emin ..
  U normal_hi;         // .. largest finite
};

// Pattern of 2^e (normal in the container) — host helper for make_target.
template <class T> typename Container<T>::U pow2_bits(int e) {
  using C = Container<T>;
  using U = typename C::U;
  if (e >= 1 - C::kBias) return U(e + C::kBias) << C::kMant;
  return U(1) << (e + C::kBias - 1 + C::kMant);  // container subnormal
}

// Requires validate(f) and that f fits the container T; 1 ≤ sr_bits ≤ 32.
template <class T> Target<T> make_target(const Format& f, int sr_bits = 32) {
  using C = Container<T>;
  using U = typename C::U;
  Target<T> t{};
  t.drop = C::kMant - f.mu;
  t.emin = f.emin;
  t.extra = f.subnormals ? 0 : f.mu;
  t.sr_shift = 32 - sr_bits;
  const U exp_mask = ((U(1) << (C::kWidth - 1 - C::kMant)) - 1) << C::kMant;
  const U top = pow2_bits<T>(f.emax);
  const U frac = ((U(1) << f.mu) - 1) << t.drop;        // all-ones stored fraction
  t.max_bits = top | frac;
  if (f.specials == Specials::fn || f.specials == Specials::p3109) t.max_bits -= U(1) << t.drop;  // NaN / inf code
  t.neg_max_bits = f.twos_complement ? pow2_bits<T>(f.emax + 1) : t.max_bits;
  t.tiny_bits = f.subnormals ? pow2_bits<T>(f.emin - f.mu) : pow2_bits<T>(f.emin);
  t.nan_bits = exp_mask | (U(1) << (C::kMant - 1));
  t.ovf_bits = f.overflow == Overflow::inf ? exp_mask : t.nan_bits;  // saturate: the flag below
  t.saturate = f.overflow == Overflow::saturate;
  t.has_inf = f.has_inf();
  t.unsigned_zero = !f.negative_zero;
  t.unsigned_fmt = !f.is_signed;
  t.no_zero = !f.has_zero;
  t.below_bits = f.overflow == Overflow::saturate ? (f.has_zero ? U(0) : t.tiny_bits) : t.nan_bits;
  t.general_only = !f.is_signed || !f.has_zero;
  t.normal_lo = pow2_bits<T>(f.emin);
  t.normal_hi = t.max_bits;
  return t;
}

// ---------------------------------------------------------------- the rounding of one value
// Whether to add one quantum (1) or not (0), from the exact remainder `rem` (in units of the
// container pattern; the quantum is 2^shift), its half, the truncated value's last bit `lsb`,
// the sign `neg` (0/1) and a 32-bit random word. Flags are integers of the container width
// combined by selects, never bools or short-circuit logic: the loops stay branch-free and
// vectorise (GCC does not vectorise 1-bit bool arithmetic).
template <Rounding M, class U, class I>
MANTIS_HD U up_decision(U rem, U half, I shift, U lsb, U neg, uint32_t rnd, int sr_shift) {
  const U inexact = rem != 0 ? U(1) : U(0);
  if constexpr (M == Rounding::rne) {
    const U up = rem > half ? U(1) : (rem == half ? lsb : U(0));
    return up & inexact;
  }
  if constexpr (M == Rounding::rna) return rem >= half ? inexact : U(0);
  if constexpr (M == Rounding::rz) return U(0);
  if constexpr (M == Rounding::ru) return inexact & (neg ^ 1);
  if constexpr (M == Rounding::rd) return inexact & neg;
  if constexpr (M == Rounding::ro) return inexact & (lsb ^ 1);
  if constexpr (M == Rounding::sre) return inexact & U(rnd >> 31);
  if constexpr (M == Rounding::sr) {
    // P(up) = floor(rem/2^s · 2^R) / 2^R with R = 32 − sr_shift random bits: exact when s ≤ R.
    const I R = 32 - sr_shift;
    constexpr I W = I(sizeof(U) * 8);
    const I down = shift - R, upsh = R - shift;
    const U dn = rem >> (down < W ? (down > 0 ? down : I(0)) : I(0));
    const U upv = rem << (upsh > 0 && upsh < W ? upsh : I(0));  // upsh ≥ W only when rem = 0
    const U scaled = shift >= R ? (down >= W ? U(0) : dn) : upv;
    return U(rnd >> sr_shift) < scaled ? U(1) : U(0);
  }
  return U(0);
}

template <Rounding M, class T>
MANTIS_HD T round_value(T x, const Target<T>& t, uint32_t rnd = 0) {
  using C = Container<T>;
  using U = typename C::U;
  constexpr U kSign = U(1) << (C::kWidth - 1);
  constexpr U kExpMask = ((U(1) << (C::kWidth - 1 - C::kMant)) - 1) << C::kMant;
  constexpr U kHidden = U(1) << C::kMant;

  const U u = to_bits(x);
  const U sign = u & kSign;
  const U a = u ^ sign;
  const U neg = sign >> (C::kWidth - 1);
  // Exponent arithmetic in a signed integer of the container's width: one lane type per loop.
  using I = std::make_signed_t<U>;
  const I E = I(a >> C::kMant);
  const I e = (E > 1 ? E : I(1)) - C::kBias;
  const I d = I(t.emin) - e > 0 ? I(t.emin) - e : I(0);
  const I s = I(t.drop) + d + ((E == 0) | (d > 0) ? I(t.extra) : I(0));  // extra only below 2^emin
  const bool tiny = s > C::kMant;

  // Quantisation at bit s of the pattern (s ≤ MANT), or against the quantum q (tiny).
  const I sp = tiny ? I(0) : s;                                // keeps shifts defined
  const U mask = (U(1) << sp) - 1;
  const U sig = (a & (kHidden - 1)) | (E != 0 ? kHidden : U(0));  // value in units 2^(e−MANT)
  const U rem = tiny ? sig : (a & mask);
  const U trunc = tiny ? U(0) : (a & ~mask);
  const U inc = tiny ? t.tiny_bits : (U(1) << sp);
  const I sh = tiny ? (s < C::kMant + 2 ? s : I(C::kMant + 2)) : sp;  // half fits in U
  const U half = (U(1) << sh) >> 1;
  const U lsb = tiny ? U(0) : ((sig >> sp) & 1);             // at s = MANT: the hidden bit
  const U up = up_decision<M>(rem, half, s, lsb, neg, rnd, t.sr_shift);
  U r = trunc + (up != 0 ? inc : U(0));

  // Overflow: toward-zero directions (and saturation) stop at the largest finite value of the sign.
  const U toward_zero = M == Rounding::rz || M == Rounding::ro ? U(1)
                      : M == Rounding::rd ? (neg ^ 1)
                      : M == Rounding::ru ? neg : U(0);
  const U lim = neg != 0 ? t.neg_max_bits : t.max_bits;
  const U ovf = (toward_zero | t.saturate) != 0 ? lim : t.ovf_bits;
  r = r > lim ? ovf : r;
  r = a == kExpMask ? (t.has_inf != 0 ? kExpMask : t.saturate != 0 ? lim : t.nan_bits) : r;
  r = (neg & t.unsigned_fmt) != 0 && a != 0 ? t.below_bits : r;  // a negative input of an unsigned format
  r = r == 0 && t.no_zero != 0 ? t.tiny_bits : r;
  r = a > kExpMask ? t.nan_bits : r;
  const bool drop_sign = ((r & kExpMask) == kExpMask && (r & (kHidden - 1)) != 0) ||  // NaN
                         (r == 0 && t.unsigned_zero != 0) || t.unsigned_fmt != 0;
  return from_bits<T>((drop_sign ? U(0) : sign) | r);
}

// The shortcut for the common case: x = ±0 or 2^emin ≤ |x| ≤ largest finite. There the quantum
// is the fixed bit `drop` of the pattern and no overflow, underflow or special value can occur,
// so this is round_value with those cases removed (same decisions, same random bits).
// 0 when round_normal applies to x, 1 otherwise (an integer, so a loop can OR it up).
template <class T> MANTIS_HD typename Container<T>::U outside_normal_range(T x, const Target<T>& t) {
  using U = typename Container<T>::U;
  const U a = to_bits(x) & ~(U(1) << (Container<T>::kWidth - 1));
  const U nonzero = a != 0 ? U(1) : U(0);
  return (a - t.normal_lo > t.normal_hi - t.normal_lo ? nonzero : U(0)) | t.general_only;
}

template <Rounding M, class T>
MANTIS_HD T round_normal(T x, const Target<T>& t, uint32_t rnd = 0) {
  using C = Container<T>;
  using U = typename C::U;
  using I = std::make_signed_t<U>;
  constexpr U kSign = U(1) << (C::kWidth - 1);
  const U u = to_bits(x);
  const U sign = u & kSign;
  const U a = u ^ sign;
  const U mask = (U(1) << t.drop) - 1;
  const U half = (U(1) << t.drop) >> 1;
  const U lsb = ((a | (U(1) << C::kMant)) >> t.drop) & 1;  // at drop = MANT: the hidden bit
  const U up = up_decision<M>(a & mask, half, I(t.drop), lsb, sign >> (C::kWidth - 1), rnd, t.sr_shift);
  const U r = (a & ~mask) + (up != 0 ? (U(1) << t.drop) : U(0));
  return from_bits<T>(((r == 0) & (t.unsigned_zero != 0) ? U(0) : sign) | r);
}

// ---------------------------------------------------------------- the runtime mode
// Whether the mode draws a random word per rounding.
MANTIS_HD constexpr bool is_stochastic(Rounding m) { return m == Rounding::sr || m == Rounding::sre; }

// The one runtime → compile-time dispatch of the mode: f(std::integral_constant<Rounding, M>{})
// for M = m (kernels are templated on the mode, so loops hoist this). Host lambdas from CUDA host
// code are fine: the device instantiation is never used for them.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
MANTIS_HD decltype(auto) with_rounding(Rounding m, F&& f) {
  using R = Rounding;
  switch (m) {
    case R::rne: return f(std::integral_constant<R, R::rne>{});
    case R::rna: return f(std::integral_constant<R, R::rna>{});
    case R::rz: return f(std::integral_constant<R, R::rz>{});
    case R::ru: return f(std::integral_constant<R, R::ru>{});
    case R::rd: return f(std::integral_constant<R, R::rd>{});
    case R::ro: return f(std::integral_constant<R, R::ro>{});
    case R::sr: return f(std::integral_constant<R, R::sr>{});
    case R::sre: break;
  }
  return f(std::integral_constant<R, R::sre>{});  // the enum has no other value
}

// Runtime-mode rounding of one value (scalar use: CLI, tests); loops should hoist the dispatch.
template <class T>
MANTIS_HD T round_value(T x, const Target<T>& t, Rounding m, uint32_t rnd = 0) {
  return with_rounding(m, [&](auto mode) { return round_value<decltype(mode)::value>(x, t, rnd); });
}

// ---------------------------------------------------------------- exact sums for accumulation
// Round-to-odd of a + b in binary64 (Boldo & Melquiond): exact TwoSum, then the odd neighbour.
// Rounding this once more to any precision p ≤ 51 equals rounding the exact sum directly,
// for every mode here (and sr with sr_bits ≤ 52 − p). Needs IEEE double without contraction.
MANTIS_HD double add_round_odd(double a, double b) {
  const double s = a + b;
  const double bb = s - a;
  const double err = (a - (s - bb)) + (b - bb);
  const uint64_t bits = to_bits(s);
  constexpr uint64_t kExpMask = uint64_t(0x7FF) << 52;
  // Keep s when exact, already odd, or not finite; else step to the odd neighbour on err's side.
  // Integer selects only (no bool arithmetic), so that loops over it vectorise.
  const uint64_t inexact = err != 0 ? uint64_t(1) : uint64_t(0);
  const uint64_t finite = (bits & kExpMask) != kExpMask ? inexact : uint64_t(0);
  const uint64_t change = (bits & 1) != 0 ? uint64_t(0) : finite;
  const uint64_t err_sign = to_bits(err) >> 63, s_sign = bits >> 63;
  const uint64_t step = err_sign == s_sign ? uint64_t(1) : ~uint64_t(0);
  return double_from_bits(change != 0 ? bits + step : bits);
}

}  // namespace mantis
