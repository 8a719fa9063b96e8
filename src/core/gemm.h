// gemm — emulated dot products and GEMM with a rounded accumulator.
//
// C[M×N] = A[M×K] · B[K×N], row-major binary32 operands. Semantics, per output element, with
// `round` = rounding to the accumulator format in the accumulator mode:
//   strict  (fused):  acc ← round(a_k·b_k + acc)            for k = 0..K−1 in order, acc₀ = 0
//   unfused:          acc ← round(acc + round(a_k·b_k))      for k = 0..K−1 in order
//   blocked(k_b):     c ← binary32 RNE fused sum of the chunk's products, in order (c₀ = 0),
//                     then acc ← round(acc + c), chunk by chunk
//   promoted(k_b):    p ← round(a_k·b_k + p) over the chunk (p₀ = 0, strict in the accumulator
//                     format), then f ← RN₃₂(f + p): a chunk's limited-precision sum promoted into a
//                     binary32 accumulator f, chunk by chunk; the output is f (DeepSeek-V3, §3.3.2:
//                     FP8 products summed on the tensor cores, promoted to FP32 every 128)
//   tensor_core with a GPU (spec.tensor_core = "h100", …): that GPU's matrix unit, bit for bit
//                     (matrix_unit.h: the block FMA fitted to measured hardware outputs); the
//                     accumulator format is the unit's output (fp32 or fp16) and its rounding is
//                     the unit's, the input format one the unit takes (fp16, bf16, tf32, e4m3, e5m2)
//   tensor_core(k_b, F) without a GPU (superseded; kept so that committed results reproduce): per
//                     block of k_b products, the block's exact products and acc are each truncated
//                     toward zero to a multiple of 2^(e_max − F) (e_max: the largest exponent among
//                     them), summed exactly, and acc ← round(sum): the block-FMA model of Fasi,
//                     Higham, Mikaitis, Pranesh 2021; presets in tensor_core_presets()
// The addend: acc₀ = C₀[i,j] rounded to nearest-even to the accumulator format (binary32 for
// promoted, whose output accumulator it is) where a C₀ is given, else 0: D = C₀ + A·B.
// Each rounding is of the exact value (products of binary32 are exact in binary64; sums are made
// exact by round-to-odd, round.h add_round_odd). Optionally A and B are first rounded to an input
// format. The k-loop of every output is sequential, so results are bit-identical to the scalar
// MPFR reference (oracle.h) and independent of the thread count.
//
// Two kernels compute these semantics with the same bits (gemm_kernel.h): the portable one, and a
// register-blocked AVX-512 one chosen at run time where the CPU has it (GemmPlan::kernel).
//
// The steps, and the random word (sr/sre) of every rounding — accumulation step k of output
// (i,j), and the operands' input rounding on streams stream + 1 (A) and stream + 2 (B) — are
// written once in accumulate.h, shared with the GPU kernels and the oracle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/accumulate.h"  // Accumulation
#include "core/format.h"
#include "core/matrix_unit.h"
#include "core/round.h"
#include "core/round_array.h"

namespace mantis {


// k_b's range (every accumulation's block must lie in it, used or not; policies and the CLI take it).
inline constexpr int kGemmMaxBlock = 1 << 30;
inline constexpr int kGemmMaxSplitK = 1 << 20;  // split_k's range is 1..this
struct GemmSpec {
  Format acc;                        // accumulator format (μ ≤ 50)
  Rounding acc_mode = Rounding::rne;
  Accumulation accumulation = Accumulation::strict;
  int block = 32;                    // k_b for blocked, promoted, tensor_core
  int align_bits = 24;               // F for tensor_core: bits kept below the largest term's leading bit
  std::string tensor_core;           // tensor_core: a GPU's matrix unit ("h100", "h100:wgmma"; matrix_unit.h)
  int promote_every = 0;             // .. promotion into a binary32 register every P products (0: none)
  int split_k = 1;                   // .. K in this many parts, summed in binary32 (matrix_unit.h MuKernel)
  std::optional<Format> input;       // round A and B to this format first (must fit binary32)
  Rounding input_mode = Rounding::rne;
  int sr_bits = 32;                  // for sr; strict needs sr_bits ≤ 52 − (μ+1)
  bool sr_packed = false;            // 2 (sr_bits ≤ 16) or 4 (≤ 8) roundings per random word (philox.h sr_word)
  uint64_t seed = 0, stream = 0;
};

// Throws InputError naming the problem.
void validate(const GemmSpec& s);
Accumulation accumulation_from_string(const std::string& s);  // strict | unfused | blocked | promoted | tensor_core
const char* to_string(Accumulation a);

// Parameter sets of the superseded tensor-core model (tensor_core without a GPU), with where they
// come from and how sure they are. A GPU's matrix unit (spec.tensor_core) replaces them.
struct TensorCorePreset {
  const char* name;
  int block, align_bits;
  const char* accumulator;  // format name
  Rounding mode;            // of the normalisation (the accumulator rounding)
  const char* source;       // the publication and what it supports; what is assumed
};
const std::vector<TensorCorePreset>& tensor_core_presets();
// The preset by name; InputError listing the known ones.
const TensorCorePreset& tensor_core_preset(const std::string& name);

// The kernel that computes a plan (all give the same bits; gemm_kernel.h): the portable one
// (vectorised across j by the compiler), or the register-blocked AVX-512 one in a binary32 or
// binary64 container, picked by plan_gemm from the spec and this CPU at run time.
enum class GemmKernel : uint8_t { portable, avx512_binary32, avx512_binary64 };
const char* to_string(GemmKernel k);

// A GemmSpec validated once, its targets precomputed. The policy layer compiles each site into
// one plan per pass, so the per-call path (~10⁵ calls per site and forward) neither validates nor
// throws InputError. The stream is per call (spec.stream is not part of the plan).
struct GemmPlan {
  Accumulation accumulation = Accumulation::strict;
  size_t block = 32;                 // k_b (≥ 1) for blocked, promoted, tensor_core
  int align_bits = 24;               // F for tensor_core
  std::optional<MatrixUnit> unit;    // tensor_core with a GPU
  MuKernel unit_kernel{};            // .. and how the kernel drives it over K
  Rounding acc_mode = Rounding::rne;
  uint64_t seed = 0;
  int sr_pack = 0;                   // log2 of the accumulator roundings per random word (philox.h sr_word)
  Target<double> acc{};              // the accumulator target in the double container
  Target<float> acc_f{};             // .. and in the float one (when the format fits binary32)
  GemmKernel kernel = GemmKernel::portable;  // a caller may lower it to portable, never raise it
  bool acc_fits_float = false;       // the float-C overload is allowed
  std::optional<RoundPlan> input;    // rounding of A and B (mode input_mode, same seed and sr_bits)
};

// Throws InputError exactly where validate(s) does.
GemmPlan plan_gemm(const GemmSpec& s);

// As gemm(…, GemmSpec) with spec.stream = stream. The float overload requires p.acc_fits_float.
// C0 (M×N, may be null): the addend (see the top of this file).
void gemm(const GemmPlan& p, const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
          uint64_t stream, const double* C0 = nullptr);
void gemm(const GemmPlan& p, const float* A, const float* B, float* C, size_t M, size_t N, size_t K,
          uint64_t stream, const double* C0 = nullptr);

// C is M×N. The double overload holds the exact accumulator values; the float one requires an
// accumulator format that fits binary32. Both are plan_gemm + the plan's gemm.
void gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
          const GemmSpec& s);
void gemm(const float* A, const float* B, float* C, size_t M, size_t N, size_t K,
          const GemmSpec& s);
double dot(const float* x, const float* y, size_t K, const GemmSpec& s);

}  // namespace mantis
