// matrix_unit — bit-accurate models of GPU matrix units (NVIDIA tensor cores): the block FMA.
//
// Shared verbatim by the CPU GEMM (gemm.cpp), the CUDA kernels and the tests; the parameters are
// data (MatrixUnit), one preset per GPU and (input, output) pair in matrix_unit.cpp with its
// source and what hardware data validate it. The MPFR oracle (oracle.cpp) restates the same
// semantics independently.
//
// One block of n products and an addend c, every value finite (a, b exact in the input format of
// precision p and minimum exponent emin_in; c a value of the output format):
//   1. each nonzero product a·b is kept exactly, unnormalised: |a·b| = m·2^(E − 2(p−1)) with
//      E = e_a + e_b, e_x = max(⌊log2|x|⌋, emin_in), so m·2^−2(p−1) ∈ (0, 4); with `normalise`
//      E is raised by one where that significand is ≥ 2. c ≠ 0 has E = max(⌊log2|c|⌋, −126)
//      (its binary32 exponent) and joins the products.
//   2. the alignment exponent is X = max(min_align, the largest E); each term is truncated
//      toward zero to a multiple of 2^(X − F);
//   3. the truncated terms are summed exactly and the sum rounded once, rz or rne, to out_prec
//      bits with minimum exponent out_emin (subnormal results kept); a result of magnitude
//      ≥ 2^(out_emax+1) after rounding is ±inf (the authors' model; no hardware data reach it).
//      A zero sum is +0; a nonzero sum that rounds to zero keeps its sign (as the authors' model).
//   A non-finite term: the IEEE sum of the products and c (NaN, or ±inf).
//
// A dot product of any length K: blocks of `block` products in k order (the last one shorter),
// each block's result the next one's addend, the first one's the given C.
// `interleaved` (mma.sync FP8 on Hopper and Blackwell, which runs on the fp16 datapath): each block
// of 32 is two blocks of 16, the products with k mod 4 ∈ {0, 1} from addend 0, then those with
// k mod 4 ∈ {2, 3} from the first's result, and then C is added to that by one correctly rounded
// (rne) addition in the output format; that is the next block's C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/accumulate.h"  // promote_step: the binary32 register's step
#include "core/bits.h"
#include "core/hd.h"
#include "core/round.h"  // add_round_odd

namespace mantis {

// One block-FMA datapath and the format of its result.
struct MuDatapath {
  int32_t block = 16;       // products per block (k_b)
  int32_t frac_bits = 25;   // F: the grid is 2^(X − F) (NVIDIA's 23 + extra alignment bits)
  int32_t min_align = -133; // X ≥ min_align
  int32_t out_prec = 24;    // bits of the block result (24 binary32, 11 binary16, 14 Hopper FP8)
  int32_t out_emin = -126, out_emax = 127;
  uint8_t out_rne = 0;      // 0: toward zero, 1: to nearest even
  uint8_t normalise = 0;    // products normalised to [1, 2) before alignment
};

// The unit of one GPU for one (input, output) pair: resolved by matrix_unit() (matrix_unit.cpp).
struct MatrixUnit {
  MuDatapath dp;
  int32_t in_prec = 11, in_emin = -14;      // the input format (precision with the hidden bit)
  int32_t out_prec = 24, out_emin = -126, out_emax = 127;  // the output format (binary32 / binary16)
  uint8_t interleaved = 0;                  // mma.sync FP8 on the fp16 datapath (see above)
};

// |x| = m·2^(e − (p−1)) for x finite, nonzero and exact in (p, emin): e = max(⌊log2|x|⌋, emin).
struct MuNum {
  int64_t m;
  int32_t e;
};
MANTIS_HD MuNum mu_decompose(double x, int p, int emin) {
  const uint64_t u = to_bits(x) & ~(uint64_t(1) << 63);
  const int be = int(u >> 52);  // every value here is normal in binary64
  const int e = be - 1023;
  const uint64_t full = (u & ((uint64_t(1) << 52) - 1)) | (uint64_t(1) << 52);
  const int ee = e > emin ? e : emin;
  return {int64_t(full >> (52 - (p - 1) + (ee - e))), ee};
}

// m·2^s rounded to (p, emin, emax): rz or rne, subnormals kept, ±inf at or past 2^(emax+1).
MANTIS_HD double mu_round(int64_t m, int s, int p, int emin, int emax, bool rne) {
  if (m == 0) return 0.0;
  const bool neg = m < 0;
  uint64_t u = neg ? uint64_t(0) - uint64_t(m) : uint64_t(m);
  int L = 63;
  while (!(u >> L)) --L;
  const int top = L + s;                                 // ⌊log2|value|⌋
  const int q = (top > emin ? top : emin) - (p - 1);     // the result's quantum 2^q
  const int sh = q - s;
  if (sh > 0) {
    if (sh > 63) {
      u = 0;  // |value| < 2^63·2^s ≤ half a quantum: rz and rne both give 0
    } else {
      const uint64_t r = u >> sh, rem = u - (r << sh), half = uint64_t(1) << (sh - 1);
      u = r + ((rne && (rem > half || (rem == half && (r & 1)))) ? 1 : 0);
    }
    s = q;
  }
#if defined(__CUDA_ARCH__)
  double v = ldexp(double(u), s);
  const double lim = ldexp(1.0, emax + 1);
#else
  double v = std::ldexp(double(u), s);
  const double lim = std::ldexp(1.0, emax + 1);
#endif
  if (v >= lim) v = double_from_bits(uint64_t(0x7FF) << 52);  // +inf
  return neg ? -v : v;
}

// Which of a block's products a datapath pass takes: all, or one half of the interleaving.
enum class MuHalf : uint8_t { all, low, high };  // low: k mod 4 ∈ {0, 1}; high: k mod 4 ∈ {2, 3}

MANTIS_HD bool mu_takes(MuHalf h, size_t k) {
  return h == MuHalf::all || ((k & 2) == 0) == (h == MuHalf::low);
}

// One pass of the datapath over products k < n of a (stride 1) and b (stride ldb), addend c.
MANTIS_HD double mu_block(const MuDatapath& d, int in_p, int in_emin, const float* a, const float* b, size_t ldb,
                          size_t n, double c, MuHalf half) {
  // Non-finite operands: the IEEE sum (NaN beats inf; inf − inf is NaN; 0·inf is NaN).
  bool special = !(c - c == 0);
  for (size_t k = 0; k < n; ++k)
    if (mu_takes(half, k) && !(double(a[k]) * 0.0 == 0 && double(b[k * ldb]) * 0.0 == 0)) special = true;
  if (special) {
    double s = c;
    for (size_t k = 0; k < n; ++k)
      if (mu_takes(half, k)) s += double(a[k]) * double(b[k * ldb]);
    return s;
  }
  const int pf = 2 * (in_p - 1);  // fraction bits of an exact product's significand
  const bool c_in = c != 0;
  MuNum cn{0, 0};
  if (c != 0) cn = mu_decompose(c, 24, -126);
  int X = c_in ? cn.e : -100000;
  for (size_t k = 0; k < n; ++k) {
    if (!mu_takes(half, k) || a[k] == 0 || b[k * ldb] == 0) continue;
    const MuNum x = mu_decompose(a[k], in_p, in_emin), y = mu_decompose(b[k * ldb], in_p, in_emin);
    int E = x.e + y.e;
    if (d.normalise && (x.m * y.m >> (pf + 1)) != 0) ++E;
    X = E > X ? E : X;
  }
  if (X == -100000) return 0.0;  // no nonzero term: +0
  X = X > d.min_align ? X : d.min_align;
  // term value m·2^(E − f) truncated to a multiple of 2^(X − F): m·2^(E − f − X + F), toward zero
  auto aligned = [&](int64_t m, int E, int f) -> int64_t {
    const int sh = (X - E) + f - d.frac_bits;  // right shift (negative: left)
    if (sh <= 0) return m << -sh;
    return sh > 62 ? 0 : (m >> sh);
  };
  int64_t sum = 0;
  for (size_t k = 0; k < n; ++k) {
    if (!mu_takes(half, k) || a[k] == 0 || b[k * ldb] == 0) continue;
    const MuNum x = mu_decompose(a[k], in_p, in_emin), y = mu_decompose(b[k * ldb], in_p, in_emin);
    const int64_t t = aligned(x.m * y.m, x.e + y.e, pf);
    sum += ((a[k] < 0) != (b[k * ldb] < 0)) ? -t : t;
  }
  if (c_in) {
    const int64_t t = aligned(cn.m, cn.e, 23);
    sum += c < 0 ? -t : t;
  }
  return mu_round(sum, X - d.frac_bits, d.out_prec, d.out_emin, d.out_emax, d.out_rne);
}

// x + y correctly rounded to nearest even in (p, emin, emax), p ≤ 51, x and y finite: the sum
// rounded to odd in binary64 (round.h add_round_odd) rounds once more to the same bits.
MANTIS_HD double mu_add_rne(double x, double y, int p, int emin, int emax) {
  if (!(x - x == 0) || !(y - y == 0)) return x + y;
  const double s = add_round_odd(x, y);
  if (s == 0) return 0.0;
  const MuNum n = mu_decompose(s, 53, -1022);
  return mu_round(s < 0 ? -n.m : n.m, n.e - 52, p, emin, emax, true);
}

// D = c + Σ_k a[k]·b[k·ldb] through the unit, for any K (see the top of this file).
MANTIS_HD double mu_dot(const MatrixUnit& u, const float* a, const float* b, size_t ldb, size_t K, double c) {
  const size_t kb = size_t(u.interleaved ? 32 : u.dp.block);
  for (size_t k0 = 0; k0 < K; k0 += kb) {
    const size_t n = K - k0 < kb ? K - k0 : kb;
    if (!u.interleaved) {
      c = mu_block(u.dp, u.in_prec, u.in_emin, a + k0, b + k0 * ldb, ldb, n, c, MuHalf::all);
    } else {
      const double d1 = mu_block(u.dp, u.in_prec, u.in_emin, a + k0, b + k0 * ldb, ldb, n, 0.0, MuHalf::low);
      const double d2 = mu_block(u.dp, u.in_prec, u.in_emin, a + k0, b + k0 * ldb, ldb, n, d1, MuHalf::high);
      c = mu_add_rne(d2, c, u.out_prec, u.out_emin, u.out_emax);
    }
  }
  return c;
}

// ---------------------------------------------------------------- kernel-level accumulation
// How a GEMM kernel drives the unit over K (compositions of a unit with a promotion rule):
//   promote_every = P > 0 (a multiple of the unit's block; 32 for the interleaved units): the unit
//     chains the blocks of each run of P products from addend 0, and each run's result is added
//     into a binary32 register, f ← RN₃₂(f + p) — DeepGEMM's promotion (P = 128 in DeepSeek-V3's
//     recipe), CUTLASS's promotion every n MMA instructions (P = n × the instruction's K);
//   split_k = S > 1: K is cut into S contiguous parts of ⌈K/S⌉ (the last shorter), each computed
//     on its own from 0 (with promotion when P > 0) and the parts summed in order in binary32:
//     f ← RN₃₂(f + part), f₀ = +0 (cuBLAS's split-K reduction);
//   neither (P = 0, S = 1): the unit's chain over the whole K, C its first addend (cuBLASLt's fast
//     accumulation: no promotion).
// With promotion or split-K the result is the binary32 register, and C is added last,
// D = RN₃₂(f + C) (the epilogue of CUTLASS and cuBLAS).
struct MuKernel {
  int32_t promote_every = 0;
  int32_t split_k = 1;
  MANTIS_HD bool composed() const { return promote_every > 0 || split_k > 1; }
};

// D = C + Σ_k a[k]·b[k·ldb] through the unit driven by kernel `kn` (has_c: whether C is given).
MANTIS_HD double mu_gemm_dot(const MatrixUnit& u, const MuKernel& kn, const float* a, const float* b, size_t ldb,
                             size_t K, double c, bool has_c) {
  if (!kn.composed()) return mu_dot(u, a, b, ldb, K, c);
  const size_t S = size_t(kn.split_k), part = S > 1 ? (K + S - 1) / S : K;
  double f = 0.0;
  for (size_t s0 = 0; s0 < K || (s0 == 0 && K == 0); s0 += part) {
    const size_t s1 = K - s0 < part ? K : s0 + part;
    double g = 0.0;
    if (kn.promote_every > 0) {
      const size_t P = size_t(kn.promote_every);
      for (size_t r0 = s0; r0 < s1; r0 += P)
        g = promote_step(g, mu_dot(u, a + r0, b + r0 * ldb, ldb, (s1 - r0 < P ? s1 - r0 : P), 0.0));
    } else {
      g = mu_dot(u, a + s0, b + s0 * ldb, ldb, s1 - s0, 0.0);
    }
    f = promote_step(f, g);
    if (part == 0) break;
  }
  return has_c ? promote_step(f, c) : f;
}

// ---------------------------------------------------------------- presets (host; matrix_unit.cpp)
struct Format;

// A GPU's unit for one (input, output) pair, with where its parameters come from.
struct MatrixUnitPreset {
  std::string gpu;       // v100, a100, a2, ada, l40s, h100, h200, b200
  std::string path;      // the instruction family: "mma" (wmma / mma.sync) or "wgmma"
  std::string input;     // fp16, bf16, tf32, e4m3, e5m2
  std::string output;    // fp32, fp16
  MatrixUnit unit;
  bool validated;        // reproduced bit for bit by measured hardware data (tests/data/tensor_core)
  std::string evidence;  // which data, or why none
};

// Every preset, in listing order.
const std::vector<MatrixUnitPreset>& matrix_unit_presets();
// The known GPU names.
const std::vector<std::string>& matrix_unit_gpus();
// The preset for "gpu" or "gpu:path" (case-insensitive) with these formats: a bare name takes the
// datapath of the measured data (Hopper FP8: wgmma for an fp32 output, mma for fp16). InputError
// for an unknown name, a format that is not a matrix-unit input (fp16, bf16, tf32, e4m3, e5m2) or
// output (fp32, fp16), or a combination the GPU lacks.
const MatrixUnitPreset& matrix_unit(const std::string& name, const Format& input, const Format& output);
// Whether `name` names a matrix unit (a GPU, with or without ":path"), for callers that also take
// the superseded tensor-core presets (gemm.h tensor_core_presets).
bool is_matrix_unit_name(const std::string& name);

// ---------------------------------------------------------------- measured outputs (host)
// One set of inner products measured on a GPU (tests/data/tensor_core/<gpu>_<input>_<output>.txt,
// the layout its README.md gives): A and B hold K values exact in the input format, C the addend
// (binary32; rounded to nearest-even into an fp16 output when used), D what the GPU produced.
struct MeasuredTest {
  std::vector<float> a, b;
  float c = 0, d = 0;
};
struct MeasuredSet {
  std::string gpu, input, output;
  std::vector<MeasuredTest> tests;
};
// Every set in `dir`, in name order; InputError naming the file and line for a malformed one.
std::vector<MeasuredSet> read_measured_sets(const std::string& dir);

// The sets' test vectors grouped by (input, output) and K: what `mantis probe-tensor-cores` runs
// through a GPU, one launch per group (tests of several GPUs' sets side by side).
struct ProbeGroup {
  std::string input, output;
  int K = 0;
  std::vector<float> a, b, c;  // test t: a[t·K ..], b[t·K ..], c[t]
};
std::vector<ProbeGroup> probe_groups(const std::vector<MeasuredSet>& sets);
// How many of a group's tests preset p reproduces bit for bit (NaN matches NaN), d[t] being the
// GPU's output for test t; the addend enters as the harnesses pass it (rounded to nearest-even
// into an fp16 output).
size_t probe_matches(const MatrixUnitPreset& p, const ProbeGroup& g, const std::vector<float>& d);

}  // namespace mantis
