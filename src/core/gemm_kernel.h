// gemm_kernel — the register-blocked AVX-512 GEMM kernel (gemm_avx512.cpp) and what it shares
// with the portable one (gemm.cpp). Internal to core: callers use gemm.h.
//
// The AVX-512 kernel computes the semantics of gemm.h with a tile of accumulators held in
// registers across k. Per step it forms the binary32 (or binary64) round-to-odd value of the exact
// a·b + acc from two FMAs with embedded directed rounding (RD and RU: equal → exact, else the odd
// one), then rounds it to the accumulator format with integer add-and-mask. That shortcut is right
// only while every value is zero or in the format's normal range: the tile tracks its extreme
// magnitudes, and a tile that left the range is recomputed by gemm_tile_portable (the portable
// kernel, right for any value), so the result is bit-identical either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cpu.h"
#include "core/gemm.h"

namespace mantis {

// Which kernel a spec gets on this CPU (plan_gemm's choice).
GemmKernel fastest_kernel(const GemmSpec& s);

// C[M×N] for a plan whose kernel is avx512_binary32 or avx512_binary64 (operands already rounded
// to the input format).
void gemm_avx512(const GemmPlan& p, const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
                 uint64_t stream);

// D = C0 + A·B through the plan's matrix unit (gemm_unit.cpp; operands already rounded to the
// input format; C0 in the output format, or null). p.kernel: portable, or AVX-512 (either label).
void gemm_unit(const GemmPlan& p, const float* A, const float* B, double* D, size_t M, size_t N, size_t K,
               const double* C0);

// At least n elements of a per-thread scratch vector (grown, never shrunk; contents unspecified):
// a GEMM's rounded operands and exponents are M·K and K·N long, and fresh pages for them on every
// call cost page faults that took a quarter of a 512³ matrix-unit GEMM (perf, this project's VMs).
template <class T> T* gemm_scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Rows [i0, i1) × columns [j0, j1) of C by the portable kernel (any value, any range).
void gemm_tile_portable(const GemmPlan& p, const float* A, const float* B, double* C, size_t N, size_t K,
                       size_t i0, size_t i1, size_t j0, size_t j1, uint64_t stream);

}  // namespace mantis
