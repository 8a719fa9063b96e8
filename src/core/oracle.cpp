#include "core/oracle.h"

#include <gmp.h>
#include <mpfr.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "core/accumulate.h"
#include "core/matrix_unit.h"
#include "core/philox.h"

namespace mantis {

namespace {

// Exact working precision: enough for any sum of a binary32 product and a binary64 value.
constexpr mpfr_prec_t kExact = 2300;

// MPFR's exponent range is global (per thread in TLS builds): save, set, restore.
struct ExpRange {
  mpfr_exp_t emin = mpfr_get_emin(), emax = mpfr_get_emax();
  ~ExpRange() {
    mpfr_set_emin(emin);
    mpfr_set_emax(emax);
  }
};

struct Scratch {
  mpfr_t lo, hi, mid, t, x;
  Scratch() {
    mpfr_inits2(64, lo, hi, mid, (mpfr_ptr)0);
    mpfr_init2(t, kExact);
    mpfr_init2(x, 53);  // a binary64 input, exactly
  }
  ~Scratch() { mpfr_clears(lo, hi, mid, t, x, (mpfr_ptr)0); }
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// y ← x rounded to y's precision μ+1 in the format's exponent range with gradual underflow.
// Rounded first in MPFR's wide default range, then brought into range by mpfr_check_range and
// mpfr_subnormalize, which use the ternary value to avoid double rounding. MPFR significands lie
// in [1/2, 1): the smallest subnormal 2^(emin−μ) has MPFR exponent emin − μ + 1. Above, room is
// left past emax: overflow is resolved afterwards by the format's policy (resolve_overflow).
void round_p(mpfr_ptr y, mpfr_srcptr x, mpfr_rnd_t rnd, const Format& f) {
  int t = mpfr_set(y, x, rnd);
  ExpRange saved;
  mpfr_set_emin(f.emin - f.mu + 1);
  mpfr_set_emax(f.emax + 3);
  t = mpfr_check_range(y, t, rnd);
  if (f.subnormals) mpfr_subnormalize(y, t, rnd);
}

bool toward_zero(Rounding m, bool neg) {
  return m == Rounding::rz || m == Rounding::ro || (m == Rounding::rd && !neg) || (m == Rounding::ru && neg);
}

// floor(|x − lo| / gap · 2^R) for a power-of-two gap: exact.
uint64_t scaled_fraction(mpfr_srcptr x, mpfr_srcptr lo, mpfr_srcptr gap, int R) {
  Scratch& s = scratch();
  mpfr_sub(s.t, x, lo, MPFR_RNDN);  // exact at kExact bits
  mpfr_abs(s.t, s.t, MPFR_RNDN);
  mpfr_div(s.t, s.t, gap, MPFR_RNDN);  // exact: gap is a power of two
  mpfr_mul_2si(s.t, s.t, R, MPFR_RNDN);
  mpfr_floor(s.t, s.t);
  return mpfr_get_uj(s.t, MPFR_RNDN);
}

// The sign and zero rules of the format (format.h) applied to a result.
double finish(double r, const Format& f) {
  if (std::isnan(r)) return std::numeric_limits<double>::quiet_NaN();
  if (r == 0 && !f.has_zero) return min_normal(f);  // zero-less formats have no subnormals
  if (r == 0 && (!f.negative_zero || !f.is_signed)) return 0.0;
  return r;
}

// The format's overflow policy applied to a (possibly too large) result.
double resolve_overflow(double r, Rounding m, const Format& f) {
  const bool neg = std::signbit(r);
  const double lim = neg ? -min_finite(f) : max_finite(f);  // the largest magnitude of r's sign
  if (!(std::fabs(r) > lim)) return r;
  if (toward_zero(m, neg) || f.overflow == Overflow::saturate) return neg ? -lim : lim;
  return f.overflow == Overflow::inf ? (neg ? -INFINITY : INFINITY) : NAN;
}

double round_exact(mpfr_srcptr x, const Format& f, Rounding m, uint32_t rnd, int sr_bits) {
  if (mpfr_nan_p(x)) return NAN;
  const bool neg = mpfr_signbit(x);
  if (mpfr_zero_p(x)) return finish(neg ? -0.0 : 0.0, f);
  // An unsigned format's negative input is below its range.
  if (neg && !f.is_signed) return f.overflow == Overflow::saturate ? finish(0.0, f) : NAN;
  if (mpfr_inf_p(x)) {
    if (f.has_inf()) return neg ? -INFINITY : INFINITY;
    if (f.overflow == Overflow::saturate) return neg ? min_finite(f) : max_finite(f);
    return NAN;
  }

  Scratch& s = scratch();
  const int p = f.precision();
  // (mpfr_set_prec reallocates: only when the precision changes.)
  if (mpfr_get_prec(s.lo) != p) mpfr_set_prec(s.lo, p);
  if (mpfr_get_prec(s.hi) != p) mpfr_set_prec(s.hi, p);

  // Without subnormals, below 2^emin the only candidates are 0 and q = 2^emin.
  const double q_min = std::ldexp(1.0, f.emin);
  if (!f.subnormals) {
    mpfr_set_d(s.t, q_min, MPFR_RNDN);
    if (mpfr_cmpabs(x, s.t) < 0) {
      mpfr_set_d(s.t, q_min / 2, MPFR_RNDN);
      const int c = mpfr_cmpabs(x, s.t);  // vs the midpoint
      bool up = false;
      switch (m) {
        case Rounding::rne: up = c > 0; break;
        case Rounding::rna: up = c >= 0; break;
        case Rounding::rz: up = false; break;
        case Rounding::ru: up = !neg; break;
        case Rounding::rd: up = neg; break;
        case Rounding::ro: up = true; break;  // 0 is even, q is odd
        case Rounding::sre: up = rnd >> 31; break;
        case Rounding::sr: {
          mpfr_set_zero(s.lo, 1);
          mpfr_set_d(s.mid, q_min, MPFR_RNDN);
          up = (rnd >> (32 - sr_bits)) < scaled_fraction(x, s.lo, s.mid, sr_bits);
          break;
        }
      }
      const double r = up ? q_min : 0.0;
      return finish(neg ? -r : r, f);
    }
  }

  double r;
  if (m == Rounding::rne || m == Rounding::rz || m == Rounding::ru || m == Rounding::rd) {
    const mpfr_rnd_t mr = m == Rounding::rne ? MPFR_RNDN
                        : m == Rounding::rz ? MPFR_RNDZ
                        : m == Rounding::ru ? MPFR_RNDU : MPFR_RNDD;
    round_p(s.lo, x, mr, f);
    r = mpfr_get_d(s.lo, MPFR_RNDN);  // exact: the format fits binary64
  } else {
    round_p(s.lo, x, MPFR_RNDZ, f);
    round_p(s.hi, x, MPFR_RNDA, f);
    if (mpfr_equal_p(s.lo, s.hi)) {
      r = mpfr_get_d(s.lo, MPFR_RNDN);
    } else {
      bool up = false;
      // gap = |hi| − |lo|, a power of two (one quantum at lo).
      if (mpfr_get_prec(s.mid) != kExact) mpfr_set_prec(s.mid, kExact);
      mpfr_sub(s.mid, s.hi, s.lo, MPFR_RNDN);
      mpfr_abs(s.mid, s.mid, MPFR_RNDN);
      switch (m) {
        case Rounding::rna: {
          mpfr_add(s.t, s.lo, s.hi, MPFR_RNDN);          // exact at kExact bits
          mpfr_div_2ui(s.t, s.t, 1, MPFR_RNDN);           // the midpoint
          up = mpfr_cmpabs(x, s.t) >= 0;
          break;
        }
        case Rounding::ro: {
          // lo is odd iff lo / gap is an odd integer.
          mpfr_div(s.t, s.lo, s.mid, MPFR_RNDN);
          mpz_t z;
          mpz_init(z);
          mpfr_get_z(z, s.t, MPFR_RNDN);
          up = !mpz_odd_p(z);
          mpz_clear(z);
          break;
        }
        case Rounding::sr:
          up = (rnd >> (32 - sr_bits)) < scaled_fraction(x, s.lo, s.mid, sr_bits);
          break;
        case Rounding::sre: up = rnd >> 31; break;
        default: break;
      }
      r = mpfr_get_d(up ? s.hi : s.lo, MPFR_RNDN);
    }
  }
  return finish(resolve_overflow(r, m, f), f);
}

}  // namespace

namespace {

// f(x) correctly rounded to binary32: precision 24, binary32's exponent range (MPFR exponents:
// smallest subnormal 2^−149 = 0.5·2^−148, largest finite < 2^128), subnormalised with the
// ternary value (no double rounding), overflow to inf in RNDN.
float oracle_f32(float x, int (*f)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t)) {
  if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  Scratch& s = scratch();
  mpfr_t y;
  mpfr_init2(y, 24);
  mpfr_set_flt(s.x, x, MPFR_RNDN);  // exact
  float r;
  {
    ExpRange saved;
    mpfr_set_emin(-148);
    mpfr_set_emax(128);
    int t = f(y, s.x, MPFR_RNDN);
    t = mpfr_check_range(y, t, MPFR_RNDN);
    mpfr_subnormalize(y, t, MPFR_RNDN);
    r = mpfr_get_flt(y, MPFR_RNDN);  // exact
  }
  mpfr_clear(y);
  return r;
}

double oracle_64(float x, int (*f)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t)) {
  Scratch& s = scratch();
  mpfr_set_flt(s.x, x, MPFR_RNDN);
  f(s.mid, s.x, MPFR_RNDN);  // s.mid: 64 bits
  return mpfr_get_d(s.mid, MPFR_RNDN);
}

}  // namespace

float oracle_expf(float x) { return oracle_f32(x, mpfr_exp); }
float oracle_erff(float x) { return oracle_f32(x, mpfr_erf); }
float oracle_tanhf(float x) { return oracle_f32(x, mpfr_tanh); }
double oracle_exp64(float x) { return oracle_64(x, mpfr_exp); }
double oracle_erf64(float x) { return oracle_64(x, mpfr_erf); }
double oracle_tanh64(float x) { return oracle_64(x, mpfr_tanh); }

namespace {

// a / b at 300 bits rounded to odd (exact value between the RZ result and its successor: take the
// odd one), so that one more rounding to ≤ 298 bits is the rounding of the exact quotient.
void div_odd(mpfr_ptr q, double a, double b) {
  mpfr_t ma, mb;
  mpfr_inits2(64, ma, mb, (mpfr_ptr)0);
  mpfr_set_d(ma, a, MPFR_RNDN);
  mpfr_set_d(mb, b, MPFR_RNDN);
  if (mpfr_div(q, ma, mb, MPFR_RNDZ) != 0) {
    mpz_t z;
    mpz_init(z);
    const mpfr_exp_t e = mpfr_get_z_2exp(z, q);  // q = z·2^e, z with the precision's bits
    (void)e;
    if (!mpz_odd_p(z)) mpfr_signbit(q) ? mpfr_nextbelow(q) : mpfr_nextabove(q);
    mpz_clear(z);
  }
  mpfr_clears(ma, mb, (mpfr_ptr)0);
}

// One IEEE binary32 operation, rounded to nearest (binary32's range, subnormals).
double rn32_op(double a, double b, int (*op)(mpfr_ptr, mpfr_srcptr, mpfr_srcptr, mpfr_rnd_t)) {
  mpfr_t ma, mb, r;
  mpfr_inits2(64, ma, mb, (mpfr_ptr)0);
  mpfr_init2(r, 24);
  mpfr_set_d(ma, a, MPFR_RNDN);
  mpfr_set_d(mb, b, MPFR_RNDN);
  double out;
  {
    ExpRange saved;
    mpfr_set_emin(-148);
    mpfr_set_emax(128);
    int t = op(r, ma, mb, MPFR_RNDN);
    t = mpfr_check_range(r, t, MPFR_RNDN);
    mpfr_subnormalize(r, t, MPFR_RNDN);
    out = mpfr_get_d(r, MPFR_RNDN);
  }
  mpfr_clears(ma, mb, r, (mpfr_ptr)0);
  return out;
}

}  // namespace

std::vector<double> oracle_quantize(const Scheme& s, const std::vector<double>& x, int64_t rows, int64_t cols,
                                    bool to_float, Rounding mode, int sr_bits, uint64_t seed, uint64_t stream,
                                    uint64_t index0) {
  validate(s);
  std::vector<double> y(x.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (rows == 0 || cols == 0) return y;
  const int64_t br = s.block_rows ? std::min(s.block_rows, rows) : rows;
  const int64_t bc = s.block_cols ? std::min(s.block_cols, cols) : cols;
  const double M = max_finite(s.element), Ms = max_finite(s.scale);
  mpfr_t q, prod;
  mpfr_init2(q, 300);
  mpfr_init2(prod, 300);
  auto div_round = [&](double a, double b, const Format& f, Rounding m, uint32_t rnd) {
    div_odd(q, a, b);
    return round_exact(q, f, m, rnd, sr_bits);
  };
  auto out = [&](double qv, double S) {  // RN_T(q·S)
    mpfr_set_d(prod, qv, MPFR_RNDN);
    mpfr_mul_d(prod, prod, S, MPFR_RNDN);  // exact
    return to_float ? double(mpfr_get_flt(prod, MPFR_RNDN)) : mpfr_get_d(prod, MPFR_RNDN);
  };
  // the tensor's amax (two-level)
  double tamax = 0;
  bool tensor_bad = false;
  for (double v : x) tensor_bad |= !std::isfinite(v), tamax = std::isfinite(v) ? std::max(tamax, std::fabs(v)) : tamax;
  double G = 1, g_enc = 0, g_dec = 0;
  if (s.two_level && !tensor_bad) {
    if (s.division == Division::exact) {
      G = tamax == 0 ? 0.0 : double(float(div_round(tamax, M * Ms, format_lookup("fp32"), Rounding::rne, 0)));
    } else {
      g_enc = tamax == 0 ? 0.0 : div_round(M * Ms, tamax, format_lookup("fp32"), Rounding::rne, 0);
      g_dec = g_enc == 0 ? 0.0 : rn32_op(1.0, g_enc, mpfr_div);
      G = g_dec;
    }
  }
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t nr = std::min(br, rows - r0), nc = std::min(bc, cols - c0);
      double amax = 0, lo = 0, hi = 0;
      bool bad = s.two_level && tensor_bad;
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) {
          const double v = x[size_t((r0 + i) * cols + c0 + j)];
          if (!std::isfinite(v)) bad = true;
          else amax = std::max(amax, std::fabs(v)), lo = std::min(lo, v), hi = std::max(hi, v);
        }
      double S = nan, r = 0, z = 0;
      if (!bad) {
        if (s.rule == ScaleRule::minmax) {
          mpfr_set_d(q, hi, MPFR_RNDN);
          mpfr_sub_d(q, q, lo, MPFR_RNDN);                         // exact at 300 bits
          const double range = mpfr_get_d(q, MPFR_RNDN);            // RN64(hi − lo)
          S = div_round(range, M, s.scale, Rounding::rne, 0);
          if (S != 0 && std::isfinite(S)) {
            div_odd(q, -lo, S);
            mpfr_rint(q, q, MPFR_RNDN);                             // to nearest integer, ties to even
            z = std::min(M, std::max(0.0, mpfr_get_d(q, MPFR_RNDN)));
          }
        } else if (s.rule == ScaleRule::floor || s.rule == ScaleRule::ceil) {
          int k = -127;
          if (amax > 0) {
            // floor: the exponent e of amax, 2^e ≤ amax < 2^(e+1) (exact comparisons)
            int e = 0;
            while (std::ldexp(1.0, e) > amax) --e;
            while (std::ldexp(1.0, e + 1) <= amax) ++e;
            if (s.rule == ScaleRule::floor) {
              k = e - s.element.emax;
            } else {  // the smallest k with M·2^k ≥ amax
              k = -2000;
              while (std::ldexp(M, k) < amax) ++k;
            }
          }
          if (k <= 127) S = std::ldexp(1.0, std::max(k, -127));
        } else if (s.rule == ScaleRule::nearest) {
          const double e8 = amax == 0 ? std::ldexp(1.0, -127) : div_round(amax, M, s.scale, Rounding::rne, 0);
          if (std::isfinite(e8)) S = e8;
        } else if (!s.two_level) {
          S = div_round(amax, M, s.scale, Rounding::rne, 0);
        } else if (s.division == Division::exact) {
          S = G == 0 ? 0.0 : div_round(amax, M * G, s.scale, Rounding::rne, 0) * G;
        } else {
          const double inv_m = rn32_op(1.0, M, mpfr_div);
          const double t = rn32_op(g_enc, rn32_op(amax, inv_m, mpfr_mul), mpfr_mul);
          mpfr_set_d(q, t, MPFR_RNDN);
          const double sb = g_enc == 0 ? 0.0 : round_exact(q, s.scale, Rounding::rne, 0, 32);
          r = sb == 0 ? 0.0 : rn32_op(1.0, rn32_op(sb, g_dec, mpfr_mul), mpfr_div);
          S = sb * g_dec;
        }
      }
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) {
          const size_t at = size_t((r0 + i) * cols + c0 + j);
          const double v = x[at];
          if (!std::isfinite(S)) {
            y[at] = nan;
          } else if (amax == 0 || S == 0) {
            y[at] = std::signbit(v) && s.element.negative_zero ? -0.0 : 0.0;
          } else {
            const uint32_t rnd = random_word(seed, stream, index0 + at);
            double qv;
            if (s.rule == ScaleRule::minmax) {  // x/S + z, exact (2000 bits: |x/S| ≥ 2^−1202), rounded once
              mpfr_t w;
              mpfr_init2(w, 2000);
              div_odd(q, v, S);
              mpfr_add_d(w, q, z, MPFR_RNDN);
              qv = round_exact(w, s.element, mode, rnd, sr_bits) - z;  // q − z: exact
              mpfr_clear(w);
            } else if (s.division == Division::reciprocal) {
              mpfr_set_d(q, rn32_op(v, r, mpfr_mul), MPFR_RNDN);
              qv = round_exact(q, s.element, mode, rnd, sr_bits);
            } else {
              qv = div_round(v, S, s.element, mode, rnd);
            }
            y[at] = out(qv, S);
          }
        }
    }
  mpfr_clears(q, prod, (mpfr_ptr)0);
  return y;
}

bool oracle_thread_safe() { return mpfr_buildopt_tls_p() != 0; }

void oracle_thread_done() { mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE); }

double oracle_round(double x, const Format& f, Rounding m, uint32_t rnd, int sr_bits) {
  validate(f);
  Scratch& s = scratch();
  mpfr_set_d(s.x, x, MPFR_RNDN);  // exact
  return round_exact(s.x, f, m, rnd, sr_bits);
}

namespace {

// ⌊log2|x|⌋ of a nonzero finite double (MPFR: x ∈ [2^(e−1), 2^e)).
long oracle_exponent(double x) {
  mpfr_t t;
  mpfr_init2(t, 64);
  mpfr_set_d(t, x, MPFR_RNDN);
  const long e = long(mpfr_get_exp(t)) - 1;
  mpfr_clear(t);
  return e;
}

// The value (exact, at kExact bits) rounded as the unit's datapath or output rounds: to `prec` bits
// with minimum exponent emin (subnormals kept), toward zero or to nearest even, and ±inf where the
// magnitude reaches 2^(emax+1) after rounding. An exact zero is +0; a nonzero value that rounds to
// zero keeps its sign.
double unit_round(mpfr_srcptr v, int prec, int emin, int emax, bool rne) {
  if (mpfr_zero_p(v)) return 0.0;
  Format f;
  f.name = "unit";
  f.mu = prec - 1, f.emin = emin, f.emax = emax + 2;  // the range check is below, after rounding
  const double r = round_exact(v, f, rne ? Rounding::rne : Rounding::rz, 0, 32);
  if (std::abs(r) >= std::ldexp(1.0, emax + 1)) return std::copysign(std::numeric_limits<double>::infinity(), r);
  return r;
}

// One block of the datapath: products a[k]·b[k·ldb] for k in `ks`, addend c.
double unit_block(const MuDatapath& d, int in_prec, int in_emin, const double* a, const double* b, size_t ldb,
                  const std::vector<size_t>& ks, double c) {
  (void)in_prec;
  double plain = c;
  for (size_t k : ks) plain += a[k] * b[k * ldb];
  bool finite = std::isfinite(c);
  for (size_t k : ks) finite &= std::isfinite(a[k]) && std::isfinite(b[k * ldb]);
  if (!finite) return plain;  // IEEE's sum of the products and c
  struct Term { double v; long e; };
  std::vector<Term> terms;
  for (size_t k : ks) {
    const double x = a[k], y = b[k * ldb];
    if (x == 0 || y == 0) continue;
    long e = std::max(oracle_exponent(x), long(in_emin)) + std::max(oracle_exponent(y), long(in_emin));
    if (d.normalise && std::abs(x * y) >= std::ldexp(1.0, int(e) + 1)) ++e;
    terms.push_back({x * y, e});  // exact: ≤ 22 significant bits
  }
  if (c != 0) terms.push_back({c, std::max(oracle_exponent(c), -126L)});
  if (terms.empty()) return 0.0;
  long X = d.min_align;
  for (const Term& t : terms) X = std::max(X, t.e);
  mpfr_t t, sum;
  mpfr_inits2(kExact, t, sum, (mpfr_ptr)0);
  mpfr_set_zero(sum, 1);
  for (const Term& x : terms) {
    mpfr_set_d(t, x.v, MPFR_RNDN);
    mpfr_div_2si(t, t, X - d.frac_bits, MPFR_RNDN);  // exact
    mpfr_trunc(t, t);
    mpfr_mul_2si(t, t, X - d.frac_bits, MPFR_RNDN);
    mpfr_add(sum, sum, t, MPFR_RNDN);  // exact at kExact bits
  }
  const double r = unit_round(sum, d.out_prec, d.out_emin, d.out_emax, d.out_rne);
  mpfr_clears(t, sum, (mpfr_ptr)0);
  return r;
}

}  // namespace

double oracle_matrix_unit_dot(const MatrixUnit& u, const double* a, const double* b, size_t ldb, size_t K, double c) {
  const size_t kb = u.interleaved ? 32 : size_t(u.dp.block);
  for (size_t k0 = 0; k0 < K; k0 += kb) {
    const size_t k1 = std::min(K, k0 + kb);
    std::vector<size_t> all, low, high;
    for (size_t k = k0; k < k1; ++k) ((k - k0) % 4 < 2 ? low : high).push_back(k), all.push_back(k);
    if (!u.interleaved) {
      c = unit_block(u.dp, u.in_prec, u.in_emin, a, b, ldb, all, c);
    } else {
      const double d1 = unit_block(u.dp, u.in_prec, u.in_emin, a, b, ldb, low, 0.0);
      const double d2 = unit_block(u.dp, u.in_prec, u.in_emin, a, b, ldb, high, d1);
      if (!std::isfinite(d2) || !std::isfinite(c)) {
        c = d2 + c;
      } else {
        mpfr_t v;
        mpfr_init2(v, kExact);
        mpfr_set_d(v, d2, MPFR_RNDN);
        mpfr_add_d(v, v, c, MPFR_RNDN);  // exact
        c = unit_round(v, u.out_prec, u.out_emin, u.out_emax, true);
        mpfr_clear(v);
      }
    }
  }
  return c;
}

uint32_t oracle_sr_word(uint64_t seed, uint64_t stream, uint64_t index, int per_word) {
  if (per_word == 1) return random_word(seed, stream, index);
  // Slot s of P = per_word is the word's s-th field of 32/P bits counted from the top; rounding
  // reads the top sr_bits of its 32-bit word, so the field is moved there.
  const uint32_t lane = 32 / uint32_t(per_word), s = uint32_t(index % uint64_t(per_word));
  const uint32_t field = (random_word(seed, stream, index / uint64_t(per_word)) >> (32 - (s + 1) * lane)) &
                         ((uint32_t(1) << lane) - 1);
  return field << (32 - lane);
}

void oracle_gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K, const GemmSpec& spec,
                 const double* C0) {
  validate(spec);
  // Roundings per random word: 4 for sr_bits ≤ 8, 2 for ≤ 16 when packed (gemm.h sr_packed).
  const int per_word = !spec.sr_packed ? 1 : spec.sr_bits <= 8 ? 4 : 2;
  const int per_word_in = spec.input && is_stochastic(spec.input_mode) ? per_word : 1;
  std::vector<double> a(A, A + M * K), b(B, B + K * N);
  if (spec.input) {
    for (size_t i = 0; i < M * K; ++i)
      a[i] = oracle_round(a[i], *spec.input, spec.input_mode,
                          oracle_sr_word(spec.seed, spec.stream + kStreamA, i, per_word_in), spec.sr_bits);
    for (size_t i = 0; i < K * N; ++i)
      b[i] = oracle_round(b[i], *spec.input, spec.input_mode,
                          oracle_sr_word(spec.seed, spec.stream + kStreamB, i, per_word_in), spec.sr_bits);
  }
  Format fp32 = format_lookup("fp32");
  std::optional<MatrixUnit> unit;
  if (!spec.tensor_core.empty()) unit = matrix_unit(spec.tensor_core, *spec.input, spec.acc).unit;
  // acc₀: C0 rounded to nearest even into the accumulator format (promoted: binary32)
  auto start = [&](uint64_t o) {
    if (!C0) return 0.0;
    return oracle_round(C0[o], spec.accumulation == Accumulation::promoted ? fp32 : spec.acc, Rounding::rne);
  };
  mpfr_t acc, prod, v;
  mpfr_inits2(kExact, acc, prod, v, (mpfr_ptr)0);
  auto rw = [&](uint64_t idx) { return oracle_sr_word(spec.seed, spec.stream, idx, per_word); };
  for (size_t i = 0; i < M; ++i)
    for (size_t j = 0; j < N; ++j) {
      const uint64_t o = i * N + j;
      if (unit && !(spec.promote_every > 0 || spec.split_k > 1)) {
        // (no element is read for K = 0: the pointers are then not formed into empty vectors)
        C[o] = oracle_matrix_unit_dot(*unit, K ? a.data() + i * K : nullptr, K ? b.data() + j : nullptr, N, K, start(o));
        continue;
      }
      if (unit) {  // the kernel's drive (matrix_unit.h MuKernel): runs from 0, binary32 sums, C last
        auto rn32 = [&](double x, double y) {
          if (!std::isfinite(x) || !std::isfinite(y)) return double(float(x + y));
          mpfr_set_d(v, x, MPFR_RNDN);
          mpfr_add_d(v, v, y, MPFR_RNDN);  // exact
          return round_exact(v, fp32, Rounding::rne, 0, 32);
        };
        const size_t S = size_t(spec.split_k), part = S > 1 ? (K + S - 1) / S : K;
        const size_t P = spec.promote_every > 0 ? size_t(spec.promote_every) : std::max<size_t>(part, 1);
        double f = 0.0;
        for (size_t s0 = 0; s0 < K; s0 += part) {
          double g = 0.0;
          for (size_t r0 = s0; r0 < std::min(K, s0 + part); r0 += P)
            g = rn32(g, oracle_matrix_unit_dot(*unit, a.data() + i * K + r0, b.data() + r0 * N + j, N,
                                               std::min({K, s0 + part, r0 + P}) - r0, 0.0));
          f = rn32(f, g);
        }
        C[o] = C0 ? rn32(f, start(o)) : f;
        continue;
      }
      mpfr_set_d(acc, start(o), MPFR_RNDN);
      auto set_rounded = [&](mpfr_ptr dst, mpfr_srcptr val, uint64_t idx) {
        const double r = round_exact(val, spec.acc, spec.acc_mode, rw(idx), spec.sr_bits);
        mpfr_set_d(dst, r, MPFR_RNDN);
      };
      if (spec.accumulation == Accumulation::promoted) {
        // strict in the accumulator format within a chunk, then RN to binary32 into f
        const size_t kb = size_t(spec.block), nchunks = chunk_count(K, kb);
        mpfr_t f;
        mpfr_init2(f, kExact);
        mpfr_set(f, acc, MPFR_RNDN);  // the addend starts the binary32 accumulator
        for (size_t c = 0; c < nchunks; ++c) {
          mpfr_set_zero(acc, 1);
          for (size_t k = c * kb; k < std::min(K, (c + 1) * kb); ++k) {
            mpfr_set_d(prod, a[i * K + k], MPFR_RNDN);
            mpfr_mul_d(prod, prod, b[k * N + j], MPFR_RNDN);  // exact
            mpfr_add(v, acc, prod, MPFR_RNDN);                 // exact
            set_rounded(acc, v, strict_index(o, K, k));
          }
          mpfr_add(v, f, acc, MPFR_RNDN);  // exact
          mpfr_set_d(f, round_exact(v, fp32, Rounding::rne, 0, 32), MPFR_RNDN);
        }
        mpfr_set(acc, f, MPFR_RNDN);
        mpfr_clear(f);
      } else if (spec.accumulation == Accumulation::tensor_core) {
        // per block: the terms (products and acc) truncated toward zero to multiples of
        // 2^(e_max − F) — e_max = ⌊log2|t|⌋ largest over the nonzero terms — summed exactly, rounded
        const size_t kb = size_t(spec.block), nchunks = chunk_count(K, kb);
        mpfr_t t, sum;
        mpfr_inits2(kExact, t, sum, (mpfr_ptr)0);
        for (size_t c = 0; c < nchunks; ++c) {
          const size_t k0 = c * kb, k1 = std::min(K, k0 + kb);
          std::vector<double> terms = {mpfr_get_d(acc, MPFR_RNDN)};  // acc is a value of the format: exact
          for (size_t k = k0; k < k1; ++k) terms.push_back(double(a[i * K + k]) * double(b[k * N + j]));  // exact
          bool finite = true;
          for (double x : terms) finite &= std::isfinite(x);
          mpfr_set_zero(sum, 1);
          if (!finite) {  // an inf or NaN operand: IEEE's sum
            for (double x : terms) mpfr_add_d(sum, sum, x, MPFR_RNDN);
          } else {
            long emax = LONG_MIN;
            for (double x : terms)
              if (x != 0) {
                mpfr_set_d(t, x, MPFR_RNDN);
                emax = std::max(emax, long(mpfr_get_exp(t)) - 1);  // MPFR: x ∈ [2^(e−1), 2^e)
              }
            if (emax != LONG_MIN)
              for (double x : terms) {
                mpfr_set_d(t, x, MPFR_RNDN);
                mpfr_div_2si(t, t, emax - spec.align_bits, MPFR_RNDN);  // exact
                mpfr_trunc(t, t);
                mpfr_mul_2si(t, t, emax - spec.align_bits, MPFR_RNDN);
                mpfr_add(sum, sum, t, MPFR_RNDN);  // exact at kExact bits
              }
          }
          set_rounded(acc, sum, blocked_index(o, nchunks, c));
        }
        mpfr_clears(t, sum, (mpfr_ptr)0);
      } else if (spec.accumulation == Accumulation::blocked) {
        const size_t kb = size_t(spec.block), nchunks = chunk_count(K, kb);
        for (size_t c = 0; c < nchunks; ++c) {
          double cs = 0.0;  // binary32 RNE fused chunk sum, via the fp32 oracle
          for (size_t k = c * kb; k < std::min(K, (c + 1) * kb); ++k) {
            mpfr_set_d(prod, a[i * K + k], MPFR_RNDN);
            mpfr_mul_d(prod, prod, b[k * N + j], MPFR_RNDN);  // exact
            mpfr_add_d(v, prod, cs, MPFR_RNDN);                // exact
            cs = round_exact(v, fp32, Rounding::rne, 0, 32);
          }
          mpfr_add_d(v, acc, cs, MPFR_RNDN);
          set_rounded(acc, v, blocked_index(o, nchunks, c));
        }
      } else {
        for (size_t k = 0; k < K; ++k) {
          mpfr_set_d(prod, a[i * K + k], MPFR_RNDN);
          mpfr_mul_d(prod, prod, b[k * N + j], MPFR_RNDN);  // exact
          if (spec.accumulation == Accumulation::strict) {
            mpfr_add(v, acc, prod, MPFR_RNDN);  // exact
            set_rounded(acc, v, strict_index(o, K, k));
          } else {
            set_rounded(prod, prod, unfused_product_index(o, K, k));
            mpfr_add(v, acc, prod, MPFR_RNDN);
            set_rounded(acc, v, unfused_sum_index(o, K, k));
          }
        }
      }
      C[o] = mpfr_nan_p(acc) ? std::numeric_limits<double>::quiet_NaN() : mpfr_get_d(acc, MPFR_RNDN);
    }
  mpfr_clears(acc, prod, v, (mpfr_ptr)0);
}

}  // namespace mantis
