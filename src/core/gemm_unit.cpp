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
#include <cmath>
#include <vector>

#include "core/cpu.h"
#include "core/gemm.h"
#include "core/gemm_kernel.h"
#include "core/round.h"

#if defined(__x86_64__) || defined(__i386__)
#define MANTIS_X86 1
#endif

namespace mantis {

namespace {

constexpr int32_t kNoTerm = -(1 << 20);  // the nominal exponent of a zero: below every min_align

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

// One pass of the datapath over the products k0 ≤ k < k1 that `half` takes, for JB outputs j
// (B's row k at B + k·ldb, its exponents at EB + k·ldb): out[j] ← the block result with addend
// c[j] (out may be c). Every j-loop is branch-free (selects only) and of constant length, so that
// it vectorises and the block's sums stay in registers; the rounding takes round.h's normal-range
// shortcut and is redone by the general rounding where a value left that range.
template <bool kRne, bool kNarrow, size_t JB>
[[gnu::always_inline]] inline void unit_pass(const UnitConsts& uc, const float* a, const int32_t* ea, const float* B,
                                             const int32_t* EB, size_t ldb, size_t k0, size_t k1, MuHalf half,
                                             const double* c, double* out) {
  constexpr Rounding M = kRne ? Rounding::rne : Rounding::rz;
  constexpr uint64_t kSign = uint64_t(1) << 63, kInf = uint64_t(0x7FF) << 52;
  const MuDatapath& d = uc.u->dp;
  int32_t X[JB];
  double S[JB], sc[JB], v[JB];
  for (size_t j = 0; j < JB; ++j) {  // c's exponent: its binary32 exponent (≥ −126); zero and specials: none
    const uint64_t u = to_bits(c[j]) & ~kSign;
    const int32_t be = int32_t(u >> 52), ec = be - 1023;
    X[j] = u != 0 && be != 0x7FF ? (ec > -126 ? ec : -126) : kNoTerm;
  }
  for (size_t k = k0; k < k1; ++k) {
    if (!mu_takes(half, k - k0) || ea[k] == kNoTerm) continue;
    const int32_t e = ea[k];
    const int32_t* eb = EB + k * ldb;
    for (size_t j = 0; j < JB; ++j) X[j] = X[j] > e + eb[j] ? X[j] : e + eb[j];
  }
  for (size_t j = 0; j < JB; ++j) {
    // X below −400 means no nonzero term (every product's is ≥ −2·149 − 2): the sum is 0 at any
    // scale, and the clamp keeps 2^(±(F − X)) normal (v100's min_align is −1024).
    const int32_t x = X[j] > d.min_align ? X[j] : d.min_align;
    X[j] = x > -400 ? x : -400;
    sc[j] = pow2(d.frac_bits - X[j]);
    const double cf = (to_bits(c[j]) & kInf) != kInf ? c[j] : 0.0;
    S[j] = double(int32_t(cf * sc[j]));  // truncates: |·| < 2^28
  }
  if constexpr (kNarrow) {  // 16 lanes: see narrow_ok
    float scf[JB];
    int32_t Si[JB];
    for (size_t j = 0; j < JB; ++j) {
      scf[j] = float_from_bits(uint32_t(d.frac_bits - (X[j] > -60 ? X[j] : -60) + 127) << 23);
      Si[j] = 0;
    }
    for (size_t k = k0; k < k1; ++k) {
      if (!mu_takes(half, k - k0) || ea[k] == kNoTerm) continue;
      const float ak = a[k];
      const float* b = B + k * ldb;
      for (size_t j = 0; j < JB; ++j) Si[j] += int32_t(ak * b[j] * scf[j]);
    }
    for (size_t j = 0; j < JB; ++j) S[j] += double(Si[j]);
  } else {
    for (size_t k = k0; k < k1; ++k) {
      if (!mu_takes(half, k - k0) || ea[k] == kNoTerm) continue;
      const double ak = a[k];
      const float* b = B + k * ldb;
      for (size_t j = 0; j < JB; ++j) S[j] += double(int32_t(ak * double(b[j]) * sc[j]));
    }
  }
  uint64_t outside = 0;
  for (size_t j = 0; j < JB; ++j) {
    v[j] = S[j] * pow2(X[j] - d.frac_bits);
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

// unit_pass over outputs 0 ≤ j < N: chunks of kChunk, then single outputs.
constexpr size_t kChunk = 256;
template <bool kRne, bool kNarrow>
[[gnu::always_inline]] inline void unit_pass_row(const UnitConsts& uc, const float* a, const int32_t* ea,
                                                 const float* B, const int32_t* EB, size_t N, size_t k0, size_t k1,
                                                 MuHalf half, const double* c, double* out) {
  size_t j = 0;
  for (; j + kChunk <= N; j += kChunk)
    unit_pass<kRne, kNarrow, kChunk>(uc, a, ea, B + j, EB + j, N, k0, k1, half, c + j, out + j);
  for (; j < N; ++j) unit_pass<kRne, kNarrow, 1>(uc, a, ea, B + j, EB + j, N, k0, k1, half, c + j, out + j);
}

// The unit's chain over products kbeg ≤ k < kend of one row (blocks from kbeg), for outputs j < N:
// acc[j] is the addend on entry and the result on exit. d1, d2, zero: scratch [N].
template <bool kRne, bool kNarrow>
[[gnu::always_inline]] inline void chain_row(const UnitConsts& uc, const float* a, const int32_t* ea, const float* B,
                                             const int32_t* EB, size_t N, size_t kbeg, size_t kend, double* acc,
                                             double* d1, double* d2, const double* zero) {
  const MatrixUnit& u = *uc.u;
  const size_t kb = u.interleaved ? 32 : size_t(u.dp.block);
  for (size_t k0 = kbeg; k0 < kend; k0 += kb) {
    const size_t k1 = kend - k0 < kb ? kend : k0 + kb;
    if (!u.interleaved) {
      unit_pass_row<kRne, kNarrow>(uc, a, ea, B, EB, N, k0, k1, MuHalf::all, acc, acc);
    } else {
      unit_pass_row<kRne, kNarrow>(uc, a, ea, B, EB, N, k0, k1, MuHalf::low, zero, d1);
      unit_pass_row<kRne, kNarrow>(uc, a, ea, B, EB, N, k0, k1, MuHalf::high, d1, d2);
      for (size_t j = 0; j < N; ++j) {
        const double x = d2[j], y = acc[j];
        const bool fin = x - x == 0 && y - y == 0;
        const double s = add_round_odd(fin ? x : 0.0, fin ? y : 0.0);
        acc[j] = fin ? round_value<Rounding::rne>(s, uc.out) : x + y;
      }
    }
  }
}

// Rows [i0, i1) of D: the kernel's drive of the unit over K (matrix_unit.h MuKernel), each row's
// outputs j < N together.
template <bool kRne, bool kNarrow>
[[gnu::always_inline]] inline void unit_rows_impl(const UnitConsts& uc, const float* A, const int32_t* EA,
                                                  const float* B, const int32_t* EB, double* D, const double* C0,
                                                  size_t i0, size_t i1, size_t N, size_t K) {
  const MuKernel& kn = uc.kernel;
  std::vector<double> acc(N), f(N), g(N), d1(N), d2(N), zero(N, 0.0);
  for (size_t i = i0; i < i1; ++i) {
    const float* a = A + i * K;
    const int32_t* ea = EA + i * K;
    double* d = D + i * N;
    if (!kn.composed()) {
      for (size_t j = 0; j < N; ++j) acc[j] = C0 ? C0[i * N + j] : 0.0;
      chain_row<kRne, kNarrow>(uc, a, ea, B, EB, N, 0, K, acc.data(), d1.data(), d2.data(), zero.data());
      for (size_t j = 0; j < N; ++j) d[j] = acc[j];
      continue;
    }
    const size_t S = size_t(kn.split_k), part = S > 1 ? (K + S - 1) / S : K;
    const size_t P = kn.promote_every > 0 ? size_t(kn.promote_every) : std::max<size_t>(part, 1);
    for (size_t j = 0; j < N; ++j) f[j] = 0.0;
    for (size_t s0 = 0; s0 < K; s0 += part) {
      const size_t s1 = std::min(K, s0 + part);
      for (size_t j = 0; j < N; ++j) g[j] = 0.0;
      for (size_t r0 = s0; r0 < s1; r0 += P) {  // one run: the unit from 0, then into the register
        for (size_t j = 0; j < N; ++j) acc[j] = 0.0;
        chain_row<kRne, kNarrow>(uc, a, ea, B, EB, N, r0, std::min(s1, r0 + P), acc.data(), d1.data(), d2.data(), zero.data());
        for (size_t j = 0; j < N; ++j) g[j] = promote_step(g[j], acc[j]);
      }
      for (size_t j = 0; j < N; ++j) f[j] = promote_step(f[j], g[j]);
    }
    for (size_t j = 0; j < N; ++j) d[j] = C0 ? promote_step(f[j], C0[i * N + j]) : f[j];
  }
}

void unit_rows_portable(const UnitConsts& uc, const float* A, const int32_t* EA, const float* B, const int32_t* EB,
                        double* D, const double* C0, size_t i0, size_t i1, size_t N, size_t K) {
  const bool rne = uc.u->dp.out_rne, narrow = narrow_ok(*uc.u);
  if (rne && narrow) unit_rows_impl<true, true>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else if (rne) unit_rows_impl<true, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else if (narrow) unit_rows_impl<false, true>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else unit_rows_impl<false, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
}

#if defined(MANTIS_X86)
[[MANTIS_AVX512_TARGET]] void unit_rows_avx512(const UnitConsts& uc, const float* A, const int32_t* EA,
                                               const float* B, const int32_t* EB, double* D, const double* C0,
                                               size_t i0, size_t i1, size_t N, size_t K) {
  const bool rne = uc.u->dp.out_rne, narrow = narrow_ok(*uc.u);
  if (rne && narrow) unit_rows_impl<true, true>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else if (rne) unit_rows_impl<true, false>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
  else if (narrow) unit_rows_impl<false, true>(uc, A, EA, B, EB, D, C0, i0, i1, N, K);
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
  bool finite = !u.dp.normalise;
  for (size_t i = 0; finite && i < M * K; ++i) finite = A[i] - A[i] == 0;
  for (size_t i = 0; finite && i < K * N; ++i) finite = B[i] - B[i] == 0;
  const bool parallel = M > 1 && double(M) * double(N) * double(K) >= 1 << 16;
  if (!finite) {  // mu_dot per output: the special-value rules block by block
#pragma omp parallel for schedule(static) if (parallel)
    for (size_t i = 0; i < M; ++i)
      for (size_t j = 0; j < N; ++j)
        D[i * N + j] = mu_gemm_dot(u, p.unit_kernel, A + i * K, B + j, N, K, C0 ? C0[i * N + j] : 0.0, C0 != nullptr);
    return;
  }
  auto nominal = [&](const float* x, size_t n, std::vector<int32_t>& e) {
    e.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int32_t v = x[i] == 0 ? kNoTerm : exp_of(double(x[i]));
      e[i] = x[i] == 0 ? kNoTerm : (v > u.in_emin ? v : u.in_emin);
    }
  };
  std::vector<int32_t> EA, EB;
  nominal(A, M * K, EA);
  nominal(B, K * N, EB);
  UnitConsts uc{&u, p.unit_kernel, make_target<double>(unit_format(u.dp.out_prec, u.dp.out_emin, u.dp.out_emax + 1)),
                std::ldexp(1.0, u.dp.out_emax + 1), make_target<double>(unit_format(u.out_prec, u.out_emin, u.out_emax))};
  const bool avx = p.kernel != GemmKernel::portable;
  constexpr size_t kRows = 4;
  const size_t chunks = (M + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (parallel)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t i0 = c * kRows, i1 = std::min(M, i0 + kRows);
#if defined(MANTIS_X86)
    if (avx) {
      unit_rows_avx512(uc, A, EA.data(), B, EB.data(), D, C0, i0, i1, N, K);
      continue;
    }
#endif
    (void)avx;
    unit_rows_portable(uc, A, EA.data(), B, EB.data(), D, C0, i0, i1, N, K);
  }
}

}  // namespace mantis
