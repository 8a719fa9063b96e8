// cuda — the GPU kernels behind a plain C++ host API (no CUDA headers here, so CPU code may
// include it). Built only when meson finds nvcc (MANTIS_HAVE_CUDA); link `cuda_deps`.
//
// Same semantics, validation and random-word indexing as the CPU paths (round_array.h, gemm.h):
// results are bit-identical to round_array / gemm for every format, mode, seed and shape. The
// functions take HOST pointers; they copy to the device, run, and copy back (synchronously).
//
// Errors: input problems throw mantis::InputError exactly where the CPU path does; CUDA runtime
// failures throw std::runtime_error("file:line: call: CUDA error string").
#pragma once

#include <cstddef>

#include "core/format.h"
#include "core/gemm.h"
#include "core/round_array.h"

namespace mantis {

// Whether a usable CUDA device is present (cudaGetDeviceCount > 0). Never throws: false when the
// driver or the device is missing.
bool cuda_device_available();

// Element i uses random_word(o.seed, o.stream, o.index0 + i), as round_array. In place allowed.
void cuda_round_array(const float* in, float* out, size_t n, const Format& f, const RoundOptions& o);
void cuda_round_array(const double* in, double* out, size_t n, const Format& f, const RoundOptions& o);

// C (M×N, row-major, host) = A (M×K) · B (K×N) with the accumulation of gemm.h: strict, unfused
// and blocked, optional input-format rounding of A and B. One GPU thread per output element.
void cuda_gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
               const GemmSpec& s);

}  // namespace mantis
