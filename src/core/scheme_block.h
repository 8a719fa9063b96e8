// scheme_block — the arithmetic of one block of a scaled format (scheme.h), written once for the
// CPU (scheme.cpp: quantize_scheme) and the GPU (src/cuda/scheme.cu), MANTIS_HD: the block's
// amax, its scale by every rule, and each element's quotient, rounding and output.
//
// A plan (SchemeBlockPlan: the validated scheme's numbers and the element rounding, made once on
// the host by plan_scheme_blocks) and, for two-level schemes, the tensor's scales (tensor_scale,
// from the tensor's amax) are all a block needs. Per block:
//   BlockAmax a;  amax_add(a, x) over its elements (any order; amax_merge joins partial ones)
//   BlockScale b = block_scale(plan, tensor, a);   BlockKind k = block_kind(a, b)
//   y = scheme_element<M>(plan, b, k, plain_quotient<T>(plan, b), x, word)   for each element;
// element (i, j) of the matrix takes word random_word(seed, stream, index0 + i·cols + j).
// Nothing here throws: the plan is made from a validated scheme.
#pragma once

#include <cstdint>
#include <type_traits>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/bits.h"
#include "core/hd.h"
#include "core/round.h"
#include "core/round_array.h"
#include "core/scheme.h"

namespace mantis {

// ---------------------------------------------------------------- binary64 helpers, host and device
namespace scheme_math {

MANTIS_HD bool finite(double v) { return (to_bits(v) & (uint64_t(0x7FF) << 52)) != (uint64_t(0x7FF) << 52); }
MANTIS_HD double abs(double v) { return double_from_bits(to_bits(v) & ~(uint64_t(1) << 63)); }
MANTIS_HD bool signbit(double v) { return (to_bits(v) >> 63) != 0; }
// std::max / std::min exactly (the first argument wins unless the second compares past it): a NaN
// second argument is ignored.
MANTIS_HD double max(double a, double b) { return a < b ? b : a; }
MANTIS_HD double min(double a, double b) { return b < a ? b : a; }
// The neighbour of a finite nonzero d one ulp toward +inf (up) or −inf: std::nextafter.
MANTIS_HD double step(double d, bool up) {
  return double_from_bits(to_bits(d) + (up == (d > 0) ? uint64_t(1) : ~uint64_t(0)));
}
MANTIS_HD double fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return ::fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MANTIS_HD int ilogb(double a) {
#if defined(__CUDA_ARCH__)
  return ::ilogb(a);
#else
  return std::ilogb(a);
#endif
}
MANTIS_HD double ldexp(double a, int e) {
#if defined(__CUDA_ARCH__)
  return ::ldexp(a, e);
#else
  return std::ldexp(a, e);
#endif
}
// Nearest integer, ties to even (the default rounding direction on the host).
MANTIS_HD double nearbyint(double a) {
#if defined(__CUDA_ARCH__)
  return ::nearbyint(a);
#else
  return std::nearbyint(a);
#endif
}

}  // namespace scheme_math

// Round-to-odd of a / b in binary64 (scheme.h: div_round_odd, which calls this).
MANTIS_HD double div_odd(double a, double b) {
  namespace m = scheme_math;
  const double d = a / b;
  if (d == 0 || m::abs(d) < 0x1p-1000)
    return a == 0 ? d : double_from_bits(to_bits(0x1p-1060) | (to_bits(d) & (uint64_t(1) << 63)));
  if (!m::finite(d)) return d;
  const double r = m::fma(-d, b, a);  // exact: the remainder of a correctly rounded quotient
  if (r == 0 || (to_bits(d) & 1)) return d;  // exact or already odd
  return m::step(d, (r > 0) == (b > 0));     // the exact quotient is d + r/b: one ulp toward it
}

// Round-to-odd of a · b in binary64 (the exact product is p + e, e from one fma).
MANTIS_HD double mul_odd(double a, double b) {
  namespace m = scheme_math;
  const double p = a * b;
  if (!m::finite(p) || p == 0) return p;
  const double e = m::fma(a, b, -p);
  if (e == 0 || (to_bits(p) & 1)) return p;
  return m::step(p, e > 0);
}

// The binary32 operations of NVFP4's reciprocal order, each rounded once to nearest from its
// exact value (through round-to-odd in binary64, so that a binary64 operand loses nothing).
MANTIS_HD float mul32(double a, double b) { return float(mul_odd(a, b)); }
MANTIS_HD float div32(double a, double b) { return float(div_odd(a, b)); }

// ---------------------------------------------------------------- the plan
struct SchemeBlockPlan {
  ScaleRule rule = ScaleRule::floor;
  bool two_level = false;
  bool reciprocal = false;   // division = reciprocal
  int elem_emax = 0, elem_mu = 0;
  bool negative_zero = true; // the element format keeps −0 (a zero block's −0 inputs)
  double M = 0, Ms = 0;      // the element's and the scale's largest finite values
  double half = 0;           // half the element grid's step at M: saturation decides past M + half
  Target<double> scale{};    // the scale format, ties to even (nearest, absmax, minmax rules)
  RoundPlan elem;            // the element rounding: mode, sr_bits, seed, its double target
  int64_t rows = 0, cols = 0;
  int64_t br = 1, bc = 1;    // the block shape, clipped to the matrix
  int64_t nbr = 0, nbc = 0;  // blocks per column and per row
};

// Host: the plan of s (validated) on a rows × cols matrix (both ≥ 1) with the element rounding
// (mode, sr_bits, seed). Throws InputError where plan_round does (sr_bits out of range).
SchemeBlockPlan plan_scheme_blocks(const Scheme& s, int64_t rows, int64_t cols, Rounding mode, int sr_bits,
                                   uint64_t seed);

// ---------------------------------------------------------------- the tensor's scale (two-level)
struct TensorScale {
  double G = 1;                  // the per-tensor scale (reciprocal order: RN32(1/g))
  double g_enc = 0, g_dec = 0;   // the reciprocal order's g and RN32(1/g)
  bool nan = false;              // a NaN or ±inf in the tensor: every block NaN
};

// From the tensor's amax (NaN ignored, ±inf counted) and whether it held a NaN or ±inf. One-level
// schemes: G = 1, no NaN.
MANTIS_HD TensorScale tensor_scale(const SchemeBlockPlan& p, double amax, bool nan) {
  TensorScale t;
  if (!p.two_level) return t;
  t.nan = nan;
  if (!p.reciprocal) {
    t.G = amax == 0 ? 0.0 : double(div32(amax, p.M * p.Ms));
  } else {
    t.g_enc = amax == 0 ? 0.0 : double(div32(p.M * p.Ms, amax));
    t.g_dec = t.g_enc == 0 ? 0.0 : double(div32(1.0, t.g_enc));
    t.G = t.g_dec;
  }
  return t;
}

// ---------------------------------------------------------------- the block's extremes
struct BlockAmax {
  double amax = 0;         // max |x| (NaN ignored)
  double lo = 0, hi = 0;   // min(min x, 0), max(max x, 0) (minmax)
  bool bad = false;        // a NaN or ±inf seen
};

MANTIS_HD void amax_add(BlockAmax& a, double v) {
  namespace m = scheme_math;
  a.bad = a.bad || !m::finite(v);
  a.amax = m::max(a.amax, m::abs(v));
  a.lo = m::min(a.lo, v), a.hi = m::max(a.hi, v);
}

// Partial extremes joined (exact, so the order of joining does not matter: neither holds a NaN).
MANTIS_HD void amax_merge(BlockAmax& a, const BlockAmax& b) {
  namespace m = scheme_math;
  a.bad = a.bad || b.bad;
  a.amax = m::max(a.amax, b.amax);
  a.lo = m::min(a.lo, b.lo), a.hi = m::max(a.hi, b.hi);
}

// ---------------------------------------------------------------- the block's scale
struct BlockScale {
  double S = 0;         // the effective scale, exact in binary64; not finite: a NaN block
  double reported = 0;  // what `scales` receives (two-level: S_b)
  double r = 0;         // the reciprocal order's multiplier RN32(1 / RN32(S_b · RN32(1/g)))
  double z = 0;         // minmax: the zero point
  double lim = 0;       // |x| past lim saturates (symmetric rules)
  double lim_lo = 0, lim_hi = 0;  // minmax: x outside [lim_lo, lim_hi] saturates
};

// Power-of-two rules: the exponent k of S = 2^k (amax > 0 or 0), or false for a NaN block.
MANTIS_HD bool pow2_scale(const SchemeBlockPlan& p, double amax, int& k) {
  namespace m = scheme_math;
  if (amax == 0) {
    k = -127;
    return true;
  }
  if (p.rule == ScaleRule::floor) {
    k = m::ilogb(amax) - p.elem_emax;  // ⌊log2 amax⌋ exactly, from the exponent
  } else if (p.rule == ScaleRule::ceil) {
    k = m::ilogb(amax) - m::ilogb(p.M);
    while (m::ldexp(p.M, k) < amax) ++k;  // exact comparisons (M has few bits)
    while (m::ldexp(p.M, k - 1) >= amax) --k;
  } else {  // nearest: E8M0's rounding of the exact quotient
    const double q = round_value<Rounding::rne>(div_odd(amax, p.M), p.scale, 0u);
    if (!m::finite(q)) return false;
    k = m::ilogb(q);
    return true;
  }
  if (k > 127) return false;
  k = k > -127 ? k : -127;
  return true;
}

MANTIS_HD BlockScale block_scale(const SchemeBlockPlan& p, const TensorScale& t, const BlockAmax& a) {
  namespace m = scheme_math;
  const double nan = double_from_bits(uint64_t(0x7FF8) << 48);
  BlockScale b;
  b.S = b.reported = nan;
  if (!(a.bad || t.nan)) {
    if (p.rule == ScaleRule::minmax) {
      b.S = b.reported = round_value<Rounding::rne>(div_odd(a.hi - a.lo, p.M), p.scale, 0u);
      if (b.S != 0 && m::finite(b.S)) b.z = m::min(p.M, m::max(0.0, m::nearbyint(div_odd(-a.lo, b.S))));
    } else if (p.rule != ScaleRule::absmax) {
      int k;
      if (pow2_scale(p, a.amax, k)) b.S = m::ldexp(1.0, k);
      b.reported = b.S;
    } else if (!p.two_level) {
      b.S = b.reported = round_value<Rounding::rne>(div_odd(a.amax, p.M), p.scale, 0u);
    } else if (!p.reciprocal) {
      b.reported = t.G == 0 ? 0.0 : round_value<Rounding::rne>(div_odd(a.amax, p.M * t.G), p.scale, 0u);
      b.S = b.reported * t.G;  // exact: ≤ 4 + 24 significant bits
    } else {
      const double inv_m = div32(1.0, p.M);
      b.reported = t.g_enc == 0 ? 0.0
                                : round_value<Rounding::rne>(double(mul32(t.g_enc, double(mul32(a.amax, inv_m)))),
                                                             p.scale, 0u);
      b.r = b.reported == 0 ? 0.0 : double(div32(1.0, double(mul32(b.reported, t.g_dec))));
      b.S = b.reported * t.g_dec;  // exact
    }
  }
  // past the midpoint between the largest value and the next grid step: where saturation, not
  // rounding, decides the element (exact: ≤ p + 1 bits times ≤ 28 bits); minmax: outside
  // [−1/2, Q + 1/2] after the shift by z
  b.lim = (p.M + p.half) * b.S;
  b.lim_hi = (p.M + p.half - b.z) * b.S;
  b.lim_lo = (-p.half - b.z) * b.S;
  return b;
}

enum class BlockKind : uint8_t { nan, zero, values };

MANTIS_HD BlockKind block_kind(const BlockAmax& a, const BlockScale& b) {
  if (!scheme_math::finite(b.S)) return BlockKind::nan;
  if (a.amax == 0 || b.S == 0) return BlockKind::zero;
  return BlockKind::values;
}

// ---------------------------------------------------------------- the elements
// Whether the element saturates rather than rounds (SchemeStats::clipped).
MANTIS_HD bool element_clipped(const SchemeBlockPlan& p, const BlockScale& b, double v) {
  return p.rule == ScaleRule::minmax ? (v > b.lim_hi || v < b.lim_lo) : scheme_math::abs(v) > b.lim;
}

// Binary32 data, a scale of ≤ 24 significant bits, a grid of ≤ 24 and a deterministic mode: the
// correctly rounded binary64 quotient rounds to the element grid as the exact one does, so the
// round-to-odd step is skipped (the proof is in scheme.cpp; tested bit for bit).
template <class T>
MANTIS_HD bool plain_quotient(const SchemeBlockPlan& p, const BlockScale& b) {
  return std::is_same_v<T, float> && p.rule != ScaleRule::minmax && !p.reciprocal && !is_stochastic(p.elem.mode) &&
         p.elem_mu <= 23 && double(float(b.S)) == b.S;
}

// The value the element rounding receives for x = v: x / S (round-to-odd, or plain where
// plain_quotient allows); minmax: x/S + z rounded once (round-to-odd twice, then the integer
// rounding: exact for |x/S + z| < 2^18; beyond, both saturate); reciprocal: RN32(x · r).
template <bool kPlain>
MANTIS_HD double element_quotient(const SchemeBlockPlan& p, const BlockScale& b, double v) {
  if constexpr (kPlain) {
    return v / b.S;
  } else {
    return p.rule == ScaleRule::minmax ? add_round_odd(div_odd(v, b.S), b.z)
           : p.reciprocal              ? double(mul32(v, b.r))
                                       : div_odd(v, b.S);
  }
}

// y = (q − z) · S, exact in binary64, rounded once to T.
template <class T>
MANTIS_HD T element_output(const BlockScale& b, double q) {
  return T((q - b.z) * b.S);
}

// A NaN block's elements: the quiet NaN of T (the CPU's T(quiet NaN) bits).
template <class T>
MANTIS_HD T nan_output() {
  if constexpr (std::is_same_v<T, float>) return float_from_bits(0x7FC00000u);
  else return double_from_bits(uint64_t(0x7FF8) << 48);
}

// A zero block's elements: ±0, −0 kept where the element format has it.
template <class T>
MANTIS_HD T zero_output(const SchemeBlockPlan& p, T x) {
  return T(scheme_math::signbit(double(x)) && p.negative_zero ? -0.0 : 0.0);
}

// One element end to end: x of a block of kind k and scale b, rounded in mode M (p.elem.mode) with
// the random word of its index.
template <Rounding M, class T>
MANTIS_HD T scheme_element(const SchemeBlockPlan& p, const BlockScale& b, BlockKind k, bool plain, T x,
                           uint32_t word) {
  if (k == BlockKind::nan) return nan_output<T>();
  if (k == BlockKind::zero) return zero_output(p, x);
  const double v = double(x);
  const double q = plain ? element_quotient<true>(p, b, v) : element_quotient<false>(p, b, v);
  return element_output<T>(b, round_value<M>(q, p.elem.td, word));
}

}  // namespace mantis
