// cuda_gemm — gemm (gemm.h) on the GPU, bit-identical to the CPU path and the MPFR oracle.
//
// One thread per output element (i, j), flattened as o = i·N + j so that a warp reads a
// contiguous row segment of B and one broadcast element of A. Each thread runs its k-loop in
// order with the steps and random-word indices of accumulate.h (the module is built with
// --fmad=false, so nothing is contracted) and one round_value per step.
#include <string>

#include "common.cuh"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "core/accumulate.h"
#include "core/gemm.h"
#include "core/philox.h"
#include "core/round.h"

namespace mantis {
namespace cuda_detail {
namespace {

// The random words of (seed, stream) at the indices of accumulate.h: one Philox block per four
// indices (a thread's indices are consecutive, so each block is generated once).
template <bool kOn>
struct Words {
  uint64_t seed, stream;
  uint64_t block = ~uint64_t(0);  // the block held in blk; ~0: none yet (idx >> 2 < 2^62)
  Philox4 blk;
  __device__ uint32_t at(uint64_t idx) {
    if constexpr (!kOn) {
      return 0u;
    } else {
      if ((idx >> 2) != block) blk = random_block(seed, stream, block = idx >> 2);
      return blk.v[idx & 3];
    }
  }
};

// The steps of accumulate.h for output o = i·N + j; b points at column j of B (stride N); kb is
// the block of blocked, promoted and tensor_core accumulation, align_bits the tensor-core model's F.
template <Rounding M, Accumulation kAcc>
__global__ void gemm_kernel(const float* __restrict__ A, const float* __restrict__ B,
                            double* __restrict__ C, size_t Mr, size_t N, size_t K, size_t kb, int align_bits,
                            Target<double> t, uint64_t seed, uint64_t stream) {
  const size_t total = Mr * N;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t o = size_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const size_t i = o / N, j = o - i * N;
    const float* a = A + i * K;
    const float* b = B + j;
    Words<is_stochastic(M)> rs{seed, stream};
    double acc = 0.0;
    if constexpr (kAcc == Accumulation::strict) {
      for (size_t k = 0; k < K; ++k)
        acc = round_value<M>(strict_value(acc, a[k], b[k * N]), t, rs.at(strict_index(o, K, k)));
    } else if constexpr (kAcc == Accumulation::unfused) {
      for (size_t k = 0; k < K; ++k) {
        const double q = round_value<M>(exact_product(a[k], b[k * N]), t, rs.at(unfused_product_index(o, K, k)));
        acc = round_value<M>(sum_value(acc, q), t, rs.at(unfused_sum_index(o, K, k)));
      }
    } else if constexpr (kAcc == Accumulation::blocked) {
      const size_t nchunks = chunk_count(K, kb);
      for (size_t c = 0; c < nchunks; ++c) {
        const size_t k1 = (c + 1) * kb < K ? (c + 1) * kb : K;
        float cs = 0.0f;
        for (size_t k = c * kb; k < k1; ++k) cs = chunk_step(cs, a[k], b[k * N]);
        acc = round_value<M>(sum_value(acc, double(cs)), t, rs.at(blocked_index(o, nchunks, c)));
      }
    } else if constexpr (kAcc == Accumulation::promoted) {
      const size_t nchunks = chunk_count(K, kb);
      double f = 0.0;
      for (size_t c = 0; c < nchunks; ++c) {
        const size_t k1 = (c + 1) * kb < K ? (c + 1) * kb : K;
        double p = 0.0;
        for (size_t k = c * kb; k < k1; ++k)
          p = round_value<M>(strict_value(p, a[k], b[k * N]), t, rs.at(strict_index(o, K, k)));
        f = promote_step(f, p);
      }
      acc = f;
    } else {  // tensor_core
      const size_t nchunks = chunk_count(K, kb);
      for (size_t c = 0; c < nchunks; ++c) {
        const size_t k0 = c * kb, k1 = k0 + kb < K ? k0 + kb : K;
        acc = round_value<M>(tc_block_sum(acc, a + k0, b + k0 * N, N, k1 - k0, align_bits), t,
                             rs.at(blocked_index(o, nchunks, c)));
      }
    }
    C[o] = acc;
  }
}

}  // namespace
}  // namespace cuda_detail

void cuda_gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
               const GemmSpec& s) {
  using namespace cuda_detail;
  const GemmPlan p = plan_gemm(s);  // validate(s): also block ≥ 1 and the input format fits binary32
  if (M == 0 || N == 0) return;
  const Target<double>& t = p.acc;

  DeviceBuffer<float> dA(M * K), dB(K * N);
  DeviceBuffer<double> dC(M * N);
  dA.upload(A, M * K);
  dB.upload(B, K * N);

  if (p.input) {  // A[i,k]: index i·K + k of stream + kStreamA; B[k,j]: index k·N + j of + kStreamB
    round_device(dA.get(), M * K, p.input->tf, p.input->mode, p.seed, s.stream + kStreamA, 0);
    round_device(dB.get(), K * N, p.input->tf, p.input->mode, p.seed, s.stream + kStreamB, 0);
  }

  const unsigned grid = blocks_for(M * N);
  with_rounding(p.acc_mode, [&](auto mode) {
    constexpr Rounding R = decltype(mode)::value;
    auto launch = [&](auto kernel) {
      kernel<<<grid, kThreads>>>(dA.get(), dB.get(), dC.get(), M, N, K, p.block, p.align_bits, t, p.seed, s.stream);
    };
    switch (p.accumulation) {
      case Accumulation::strict: launch(gemm_kernel<R, Accumulation::strict>); break;
      case Accumulation::unfused: launch(gemm_kernel<R, Accumulation::unfused>); break;
      case Accumulation::blocked: launch(gemm_kernel<R, Accumulation::blocked>); break;
      case Accumulation::promoted: launch(gemm_kernel<R, Accumulation::promoted>); break;
      case Accumulation::tensor_core: launch(gemm_kernel<R, Accumulation::tensor_core>); break;
    }
    MANTIS_CUDA_CHECK_LAUNCH();
  });
  dC.download(C, M * N);  // synchronous: also reports kernel execution errors
}

}  // namespace mantis
