#include "core/gemm.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "mantis_config.h"
#include "core/accumulate.h"
#include "core/gemm_kernel.h"
#include "core/round.h"
#include "core/round_array.h"

namespace mantis {

void validate(const GemmSpec& s) {
  validate(s.acc);
  validate_sr_bits(s.sr_bits);
  validate_sr_packed(s.sr_packed, s.sr_bits,
                     is_stochastic(s.acc_mode) || (s.input && is_stochastic(s.input_mode)));
  const int p = s.acc.precision();
  // Exact accumulation goes through binary64 round-to-odd: it needs two spare bits.
  if (p > 51)
    throw InputError(fmt::format("accumulator format {}: μ = {} > 50 cannot be emulated exactly "
                                 "(binary64 round-to-odd needs μ+3 ≤ 53 bits)", s.acc.name, s.acc.mu));
  if ((s.acc.subnormals ? s.acc.emin - s.acc.mu : s.acc.emin) < -1072)
    throw InputError(fmt::format("accumulator format {}: quantum below 2^-1072 cannot be emulated exactly",
                                 s.acc.name));
  if (s.acc_mode == Rounding::sr && s.sr_bits > 52 - p)
    throw InputError(fmt::format("sr accumulation in {} (μ = {}) is exact only with sr_bits ≤ {}; got {}",
                                 s.acc.name, s.acc.mu, 52 - p, s.sr_bits));
  // Every accumulation: strict and unfused do not use the block, but the kernels still count chunks
  // by it (block = 0 divided by zero: SIGFPE, issue 32).
  if (s.block < 1 || s.block > kGemmMaxBlock)
    throw InputError(fmt::format("block = {} is outside 1..{} (k_b of blocked, promoted and tensor_core accumulation)",
                                 s.block, kGemmMaxBlock));
  if (s.accumulation == Accumulation::tensor_core) {
    int lg = 0;  // ⌈log2(block + 1)⌉: the exact sum of block + 1 terms of F + 1 bits must fit binary64
    while ((int64_t(1) << lg) < int64_t(s.block) + 1) ++lg;
    // Compared without arithmetic on align_bits (align_bits + 1 + lg overflowed for align_bits near
    // INT_MAX and let it through): this is the one check the CLI, Python and policies all reach.
    if (s.align_bits < 0 || s.align_bits > 52 - lg)
      throw InputError(fmt::format("tensor_core: align_bits = {} with a block of {} (F + 1 + ⌈log2(block + 1)⌉ "
                                   "must be ≤ 53 for an exact sum)", s.align_bits, s.block));
    if (s.acc.emax > 1000)
      throw InputError(fmt::format("tensor_core: accumulator {} reaches 2^{} (at most 2^1000: the block sums are exact "
                                   "binary64)", s.acc.name, s.acc.emax));
  }
  if (s.input) {
    validate(*s.input);
    if (!fits_float(*s.input))
      throw InputError(fmt::format("input format {} does not fit binary32 operands", s.input->name));
  }
  if (s.split_k < 1 || s.split_k > kGemmMaxSplitK)
    throw InputError(fmt::format("split_k = {} is outside 1..{}", s.split_k, kGemmMaxSplitK));
  if (s.tensor_core.empty() && (s.promote_every != 0 || s.split_k != 1))
    throw InputError("promote_every and split_k drive a GPU's matrix unit: they need tensor_core = a GPU");
  if (!s.tensor_core.empty()) {
    if (s.accumulation != Accumulation::tensor_core)
      throw InputError(fmt::format("tensor core '{}' needs accumulation = tensor_core (got {})", s.tensor_core,
                                   to_string(s.accumulation)));
    if (!s.input)
      throw InputError(fmt::format("tensor core {}: give the input format (fp16, bf16, tf32, e4m3 or e5m2) that A and B "
                                   "are rounded to", s.tensor_core));
    const MatrixUnit& u = matrix_unit(s.tensor_core, *s.input, s.acc).unit;  // throws for unknown names and combinations
    const int kb = u.interleaved ? 32 : u.dp.block;
    if (s.promote_every < 0 || s.promote_every > kGemmMaxBlock || s.promote_every % kb != 0)
      throw InputError(fmt::format("tensor core {}: promote_every = {} must be 0 (no promotion) or a multiple of the "
                                   "unit's {}-product block up to {}", s.tensor_core, s.promote_every, kb,
                                   kGemmMaxBlock));
    if (s.acc_mode != Rounding::rne)
      throw InputError(fmt::format("tensor core {}: the unit rounds its own way (toward zero into fp32, to nearest into "
                                   "fp16); leave the accumulator rounding unset (got {})", s.tensor_core,
                                   to_string(s.acc_mode)));
  }
}

Accumulation accumulation_from_string(const std::string& s) {
  for (Accumulation a : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked, Accumulation::promoted,
                         Accumulation::tensor_core})
    if (s == to_string(a)) return a;
  throw InputError(fmt::format("unknown accumulation '{}' (known: strict, unfused, blocked, promoted, tensor_core)", s));
}

const char* to_string(Accumulation a) {
  static const char* n[] = {"strict", "unfused", "blocked", "promoted", "tensor_core"};
  return n[int(a)];
}

const std::vector<TensorCorePreset>& tensor_core_presets() {
  static const std::vector<TensorCorePreset> p = {
      {"v100_fp16", 4, 24, "fp32", Rounding::rz,
       "Fasi, Higham, Mikaitis, Pranesh, Numerical behavior of NVIDIA tensor cores (PeerJ CS 2021), V100 with "
       "binary16 inputs and a binary32 accumulator: exact products, 4-term blocks with the accumulator aligned to the "
       "largest exponent, bits shifted past the binary32 significand truncated, normalisation toward zero. The "
       "paper's description; not compared with hardware here"},
      {"a100_fp16", 8, 24, "fp32", Rounding::rz,
       "the same model with the 8-term blocks Fasi et al. report for the A100 (binary16 / bfloat16 inputs); "
       "whether the A100 keeps extra alignment bits is not settled by the paper: an assumption"},
      {"hopper_fp8", 32, 13, "fp32", Rounding::rz,
       "DeepSeek-V3 technical report (arXiv 2412.19437, §3.3.2): FP8 GEMMs on H800 tensor cores keep about 14 bits "
       "of accumulation precision. F = 13, the 32-product block (one WGMMA's K for FP8) and truncation are "
       "assumptions"}};
  return p;
}

const TensorCorePreset& tensor_core_preset(const std::string& name) {
  std::string known;
  for (const TensorCorePreset& p : tensor_core_presets()) {
    if (name == p.name) return p;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  std::string gpus;
  for (const std::string& g : matrix_unit_gpus()) gpus += (gpus.empty() ? "" : ", ") + g;
  throw InputError(fmt::format("unknown tensor-core preset '{}' (GPUs: {}, optionally :mma or :wgmma; superseded "
                               "presets: {})", name, gpus, known));
}

const char* to_string(GemmKernel k) {
  static const char* n[] = {"portable", "avx512-binary32", "avx512-binary64"};
  return n[int(k)];
}

namespace {

// One k step of a row: dst[j] ← round(value(j)), with word(j) the random word of output j.
// One vectorised pass rounds with the normal-range shortcut and records whether every value was
// zero or normal; if not, the step is redone from v[] with the general rounding.
template <Rounding M, class Value, class Word>
void round_step(double* dst, double* v, size_t N, const Target<double>& t, Value value, Word word) {
  uint64_t outside = 0;
  for (size_t j = 0; j < N; ++j) {
    const double x = value(j);
    v[j] = x;
    outside |= outside_normal_range(x, t);
    dst[j] = round_normal<M>(x, t, word(j));
  }
  if (outside != 0)
    for (size_t j = 0; j < N; ++j) dst[j] = round_value<M>(v[j], t, word(j));
}

// gemm_row for the hardware models (promoted, tensor_core without a GPU; accumulate.h): per
// output, sequential.
template <Rounding M>
void gemm_row_hw(const float* a, const float* B, size_t ldb, double* acc, double* v, double* f, const double* c0,
                 uint64_t o0, size_t N, size_t K, const Target<double>& t, const GemmPlan& s, uint64_t stream) {
  constexpr bool kRandom = is_stochastic(M);
  const size_t kb = s.block, nchunks = chunk_count(K, kb);
  const bool promoted = s.accumulation == Accumulation::promoted;
  for (size_t j = 0; j < N; ++j) acc[j] = !promoted && c0 ? c0[j] : 0.0, f[j] = promoted && c0 ? c0[j] : 0.0;
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t k0 = c * kb, k1 = std::min(K, k0 + kb);
    if (s.accumulation == Accumulation::promoted) {
      for (size_t j = 0; j < N; ++j) v[j] = 0.0;  // the chunk's sum p
      for (size_t k = k0; k < k1; ++k) {
        const float ak = a[k];
        const float* b = B + k * ldb;
        round_step<M>(v, acc, N, t, [&](size_t j) { return strict_value(v[j], ak, b[j]); },
                      [&](size_t j) { return kRandom ? sr_word(s.seed, stream, strict_index(o0 + j, K, k), s.sr_pack) : 0u; });
      }
      for (size_t j = 0; j < N; ++j) f[j] = promote_step(f[j], v[j]);
    } else {
      for (size_t j = 0; j < N; ++j) {
        const double sum = tc_block_sum(acc[j], a + k0, B + k0 * ldb + j, ldb, k1 - k0, s.align_bits);
        acc[j] = round_value<M>(sum, t, kRandom ? sr_word(s.seed, stream, blocked_index(o0 + j, nchunks, c), s.sr_pack) : 0u);
      }
    }
  }
  if (s.accumulation == Accumulation::promoted)
    for (size_t j = 0; j < N; ++j) acc[j] = f[j];
}

// N consecutive outputs o0 + j (j < N) of one row of C: a[K] the row of A, B its columns (row k
// at B + k·ldb), acc[N] the accumulators (binary64 values of the accumulator format), c0[N] their
// start (null: zeros); v[N], prod[N] and chunk[N] are scratch. The j-loops vectorise; k stays
// sequential per output.
template <Rounding M>
void gemm_row(const float* a, const float* B, size_t ldb, double* acc, double* v, double* prod, float* chunk,
              const double* c0, uint64_t o0, size_t N, size_t K, const Target<double>& t, const GemmPlan& s,
              uint64_t stream) {
  if (s.accumulation == Accumulation::promoted || s.accumulation == Accumulation::tensor_core) {
    gemm_row_hw<M>(a, B, ldb, acc, v, prod, c0, o0, N, K, t, s, stream);
    return;
  }
  constexpr bool kRandom = is_stochastic(M);
  for (size_t j = 0; j < N; ++j) acc[j] = c0 ? c0[j] : 0.0;
  // The steps and word indices of accumulate.h.
  switch (s.accumulation) {
    case Accumulation::strict:
      for (size_t k = 0; k < K; ++k) {
        const float ak = a[k];
        const float* b = B + k * ldb;
        round_step<M>(acc, v, N, t, [&](size_t j) { return strict_value(acc[j], ak, b[j]); },
                      [&](size_t j) { return kRandom ? sr_word(s.seed, stream, strict_index(o0 + j, K, k), s.sr_pack) : 0u; });
      }
      break;
    case Accumulation::unfused:
      for (size_t k = 0; k < K; ++k) {
        const float ak = a[k];
        const float* b = B + k * ldb;
        round_step<M>(prod, v, N, t, [&](size_t j) { return exact_product(ak, b[j]); },
                      [&](size_t j) { return kRandom ? sr_word(s.seed, stream, unfused_product_index(o0 + j, K, k), s.sr_pack) : 0u; });
        round_step<M>(acc, v, N, t, [&](size_t j) { return sum_value(acc[j], prod[j]); },
                      [&](size_t j) { return kRandom ? sr_word(s.seed, stream, unfused_sum_index(o0 + j, K, k), s.sr_pack) : 0u; });
      }
      break;
    case Accumulation::blocked: {
      const size_t kb = s.block, nchunks = chunk_count(K, kb);
      for (size_t c = 0; c < nchunks; ++c) {
        for (size_t j = 0; j < N; ++j) chunk[j] = 0.0f;
        for (size_t k = c * kb; k < std::min(K, (c + 1) * kb); ++k) {
          const float ak = a[k];
          const float* b = B + k * ldb;
          for (size_t j = 0; j < N; ++j) chunk[j] = chunk_step(chunk[j], ak, b[j]);
        }
        round_step<M>(acc, v, N, t, [&](size_t j) { return sum_value(acc[j], double(chunk[j])); },
                      [&](size_t j) { return kRandom ? sr_word(s.seed, stream, blocked_index(o0 + j, nchunks, c), s.sr_pack) : 0u; });
      }
      break;
    }
  }
}

template <Rounding M>
void gemm_mode(const float* A, const float* B, double* C, const double* C0, size_t M_, size_t N, size_t K,
               const GemmPlan& p, uint64_t stream) {
  const Target<double> t = p.acc;
  const bool parallel = M_ > 1 && double(M_) * double(N) * double(K) >= 1 << 16;
#pragma omp parallel if (parallel)
  {
    std::vector<double> v(N), prod(N);
    std::vector<float> chunk(N);
#pragma omp for schedule(static)
    for (size_t i = 0; i < M_; ++i)
      gemm_row<M>(A + i * K, B, N, C + i * N, v.data(), prod.data(), chunk.data(), C0 ? C0 + i * N : nullptr, i * N, N,
                  K, t, p, stream);
  }
}

}  // namespace

void gemm_tile_portable(const GemmPlan& p, const float* A, const float* B, double* C, size_t N, size_t K,
                       size_t i0, size_t i1, size_t j0, size_t j1, uint64_t stream) {
  const size_t n = j1 - j0;
  std::vector<double> v(n), prod(n);
  std::vector<float> chunk(n);
  with_rounding(p.acc_mode, [&](auto mode) {
    for (size_t i = i0; i < i1; ++i)
      gemm_row<decltype(mode)::value>(A + i * K, B + j0, N, C + i * N + j0, v.data(), prod.data(), chunk.data(),
                                      nullptr, i * N + j0, n, K, p.acc, p, stream);
  });
}

GemmPlan plan_gemm(const GemmSpec& s) {
  validate(s);
  GemmPlan p;
  p.accumulation = s.accumulation;
  p.block = size_t(s.block);
  p.align_bits = s.align_bits;
  if (!s.tensor_core.empty()) p.unit = matrix_unit(s.tensor_core, *s.input, s.acc).unit;
  p.unit_kernel = MuKernel{s.promote_every, s.split_k};
  p.acc_mode = s.acc_mode;
  p.seed = s.seed;
  p.sr_pack = sr_pack(s.sr_bits, s.sr_packed);
  p.acc = make_target<double>(s.acc, s.sr_bits);
  p.acc_fits_float = fits_float(s.acc);
  if (p.acc_fits_float) p.acc_f = make_target<float>(s.acc, s.sr_bits);
  p.kernel = fastest_kernel(s);
  if (s.input)
    p.input = plan_round(*s.input, s.input_mode, s.sr_bits, s.seed, s.sr_packed && is_stochastic(s.input_mode));
  return p;
}

void gemm(const GemmPlan& p, const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
          uint64_t stream, const double* C0) {
  // The rounded operands and addend live in per-thread scratch kept across calls (gemm_kernel.h).
  thread_local std::vector<float> Ar, Br;
  thread_local std::vector<double> Cr;
  if (C0) {  // the addend in the accumulator format (promoted: its binary32 output accumulator)
    double* c = gemm_scratch(Cr, M * N);
    for (size_t i = 0; i < M * N; ++i)
      c[i] = p.accumulation == Accumulation::promoted ? double(float(C0[i])) : round_value<Rounding::rne>(C0[i], p.acc, 0u);
    C0 = c;
  }
  if (p.input) {  // operands rounded once to the input format, each on its own stream
    float* a = gemm_scratch(Ar, M * K);
    float* b = gemm_scratch(Br, K * N);
    round_array(*p.input, A, a, M * K, stream + kStreamA);
    round_array(*p.input, B, b, K * N, stream + kStreamB);
    A = a;
    B = b;
  }
  if (p.unit)
    gemm_unit(p, A, B, C, M, N, K, C0);
  else if (p.kernel != GemmKernel::portable && !C0)  // the AVX-512 kernel starts from zero
    gemm_avx512(p, A, B, C, M, N, K, stream);
  else
    with_rounding(p.acc_mode, [&](auto mode) { gemm_mode<decltype(mode)::value>(A, B, C, C0, M, N, K, p, stream); });
}

void gemm(const GemmPlan& p, const float* A, const float* B, float* C, size_t M, size_t N, size_t K,
          uint64_t stream, const double* C0) {
  std::vector<double> Cd(M * N);
  gemm(p, A, B, Cd.data(), M, N, K, stream, C0);
  for (size_t i = 0; i < M * N; ++i) C[i] = float(Cd[i]);  // exact: the values are in the format
}

void gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K, const GemmSpec& s) {
  gemm(plan_gemm(s), A, B, C, M, N, K, s.stream);
}

void gemm(const float* A, const float* B, float* C, size_t M, size_t N, size_t K, const GemmSpec& s) {
  if (!fits_float(s.acc))
    throw InputError(fmt::format("accumulator format {} does not fit binary32 output; use a double C", s.acc.name));
  gemm(plan_gemm(s), A, B, C, M, N, K, s.stream);
}

double dot(const float* x, const float* y, size_t K, const GemmSpec& s) {
  double c = 0;
  gemm(x, y, &c, 1, 1, K, s);
  return c;
}

}  // namespace mantis
