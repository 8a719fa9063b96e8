// cuda — the GPU kernels behind a plain C++ host API (no CUDA headers here, so CPU code may
// include it). Built only when meson finds nvcc (MANTIS_HAVE_CUDA); link `cuda_deps`.
// device.h: the same operations on device-resident arrays and streams (no host copy per call);
// contracts.h: the table that validates all of it against the CPU (`mantis validate-gpu`).
//
// Same semantics, validation and random-word indexing as the CPU paths (round_array.h, gemm.h):
// results are bit-identical to round_array / gemm for every format, mode, seed and shape. The
// functions take HOST pointers; they copy to the device, run, and copy back (synchronously).
//
// Errors: input problems throw mantis::InputError exactly where the CPU path does; CUDA runtime
// failures throw std::runtime_error("file:line: call: CUDA error string").
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/format.h"
#include "core/gemm.h"
#include "core/quant.h"
#include "core/round_array.h"
#include "core/scheme.h"
#include "nn/policy.h"  // defines: PolicyPlan (attention)

namespace mantis {

// Whether a usable CUDA device is present (cudaGetDeviceCount > 0). Never throws: false when the
// driver or the device is missing.
bool cuda_device_available();

// Element i uses random_word(o.seed, o.stream, o.index0 + i), as round_array. In place allowed.
void cuda_round_array(const float* in, float* out, size_t n, const Format& f, const RoundOptions& o);
void cuda_round_array(const double* in, double* out, size_t n, const Format& f, const RoundOptions& o);

// The device's name and compute capability ("NVIDIA H200, sm_90"); "" without a device.
std::string cuda_device_name();

// Inner products through this GPU's own tensor cores (tc_probe.cu), as the measured data were
// taken: input fp16 / bf16 / tf32 (wmma) or e4m3 / e5m2 (mma.sync m16n8k32), output fp32 / fp16;
// a, b: n tests × K values (K ≤ 16, 8 for tf32, 32 for FP8), c: n addends. D per test; empty
// where this GPU lacks the instruction (FP8 before compute capability 8.9; tf32, bf16 → fp16).
std::vector<float> cuda_tensor_core_probe(const std::string& input, const std::string& output,
                                          const std::vector<float>& a, const std::vector<float>& b,
                                          const std::vector<float>& c, int K);

// C (M×N, row-major, host) = C0 + A (M×K) · B (K×N) with the accumulation of gemm.h (every
// Accumulation), optional input-format rounding of A and B; C0 (host, or null) the addend.
// Tiled (gpu::gemm, device.h).
void cuda_gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
               const GemmSpec& s, const double* C0 = nullptr);

// ---------------------------------------------------------------- scaled formats, block absmax
// quantize_scheme (scheme.h) on the GPU: the same arguments, validation (InputError from the same
// place), random words, outputs, scales, zero points and SchemeStats (every count, and G).
SchemeStats cuda_quantize_scheme(const Scheme& s, const float* x, float* y, int64_t rows, int64_t cols, Rounding mode,
                                 int sr_bits = 32, uint64_t seed = 0, uint64_t stream = 0, uint64_t index0 = 0,
                                 std::vector<double>* scales = nullptr, std::vector<double>* zero_points = nullptr);
SchemeStats cuda_quantize_scheme(const Scheme& s, const double* x, double* y, int64_t rows, int64_t cols,
                                 Rounding mode, int sr_bits = 32, uint64_t seed = 0, uint64_t stream = 0,
                                 uint64_t index0 = 0, std::vector<double>* scales = nullptr,
                                 std::vector<double>* zero_points = nullptr);

// quantize_absmax (quant.h) on the GPU (out may alias x).
void cuda_quantize_absmax(const float* x, float* out, size_t rows, size_t cols, const AbsmaxQuant& q, uint64_t stream);
void cuda_quantize_absmax(const double* x, double* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                          uint64_t stream);

// ---------------------------------------------------------------- attention (attention.cu)
// One layer's causal attention, as detail::attention_forward (nn/attention.h) at layer l's
// attn.qk, softmax and attn.pv sites and [lamp]: q [T, NH·HS], k, v [T, NKV·HS] (NKV divides NH)
// → out [T, NH·HS], row-major binary32 on the host. row_counts, when given: [NH, T] LAMP
// selections per (head, query row); probs (materialised only): [NH, T, T], the CPU's probs.
// Returns the total count. Exactness (attention.cu): emulated scores and probabilities
// bit-identical; native scores, native attn.pv and the flash kernel's output within a tolerance.
// InputError: shapes, operand rounding at these sites, a flash kernel with the strict rule, random
// control, a non-native attn.pv or softmax output rounding.
enum class AttentionKernel : uint8_t { materialised, flash };
uint64_t cuda_attention_forward(const PolicyPlan& pol, int layer, const float* q, const float* k, const float* v,
                                size_t T, size_t NH, size_t NKV, size_t HS, float* out, AttentionKernel kernel,
                                uint64_t* row_counts = nullptr, float* probs = nullptr);

}  // namespace mantis
