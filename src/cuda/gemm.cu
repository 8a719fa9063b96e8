// cuda_gemm — gemm (gemm.h) on the GPU, bit-identical to the CPU path and the MPFR oracle.
//
// One thread per output element (i, j), flattened as o = i·N + j so that a warp reads a
// contiguous row segment of B and one broadcast element of A. Each thread runs its k-loop in
// order with exactly the operations of gemm.h: exact binary64 products (the module is built with
// --fmad=false, so nothing is contracted), round-to-odd sums (add_round_odd) and one
// round_value per step. Random words come from the same (seed, stream, index) as on the CPU.
#include <string>

#include "common.cuh"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "core/gemm.h"
#include "core/philox.h"
#include "core/round.h"

namespace mantis {
namespace cuda_detail {
namespace {

// Sequential random words random_word(seed, stream, idx), idx = first, first+1, ...: one Philox
// block per four indices.
template <bool kOn>
struct WordStream {
  uint64_t seed, stream, idx;
  Philox4 blk;
  __device__ WordStream(uint64_t seed_, uint64_t stream_, uint64_t first)
      : seed(seed_), stream(stream_), idx(first) {
    if constexpr (kOn) {
      if (idx & 3) blk = random_block(seed, stream, idx >> 2);  // else next() loads it
    }
  }
  __device__ uint32_t next() {
    if constexpr (!kOn) {
      return 0u;
    } else {
      if ((idx & 3) == 0) blk = random_block(seed, stream, idx >> 2);  // (re)load at a boundary
      return blk.v[idx++ & 3];
    }
  }
};

// strict: acc ← round(a·b + acc); index (i·N + j)·K + k.
template <Rounding M>
__global__ void gemm_strict_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                   double* __restrict__ C, size_t Mr, size_t N, size_t K,
                                   Target<double> t, uint64_t seed, uint64_t stream) {
  constexpr bool kRand = M == Rounding::sr || M == Rounding::sre;
  const size_t total = Mr * N;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t o = size_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const size_t i = o / N, j = o - i * N;
    const float* a = A + i * K;
    const float* b = B + j;
    WordStream<kRand> rs(seed, stream, uint64_t(o) * K);
    double acc = 0.0;
    for (size_t k = 0; k < K; ++k) {
      const double p = double(a[k]) * double(b[k * N]);  // exact
      const double v = add_round_odd(p, acc);
      acc = round_value<M>(v, t, rs.next());
    }
    C[o] = acc;
  }
}

// unfused: acc ← round(acc + round(a·b)); product index 2·((i·N + j)·K + k), sum index that + 1.
template <Rounding M>
__global__ void gemm_unfused_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                    double* __restrict__ C, size_t Mr, size_t N, size_t K,
                                    Target<double> t, uint64_t seed, uint64_t stream) {
  constexpr bool kRand = M == Rounding::sr || M == Rounding::sre;
  const size_t total = Mr * N;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t o = size_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const size_t i = o / N, j = o - i * N;
    const float* a = A + i * K;
    const float* b = B + j;
    WordStream<kRand> rs(seed, stream, 2 * (uint64_t(o) * K));
    double acc = 0.0;
    for (size_t k = 0; k < K; ++k) {
      const double p = double(a[k]) * double(b[k * N]);  // exact
      const double q = round_value<M>(p, t, rs.next());
      const double v = add_round_odd(q, acc);
      acc = round_value<M>(v, t, rs.next());
    }
    C[o] = acc;
  }
}

// blocked(kb): c ← binary32 RNE fused sum of the chunk's products in order (c₀ = 0; fmaf is the
// exactly rounded a·b + c), then acc ← round(acc + c); index (i·N + j)·nchunks + chunk.
template <Rounding M>
__global__ void gemm_blocked_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                    double* __restrict__ C, size_t Mr, size_t N, size_t K,
                                    size_t kb, Target<double> t, uint64_t seed, uint64_t stream) {
  constexpr bool kRand = M == Rounding::sr || M == Rounding::sre;
  const size_t total = Mr * N;
  const size_t nchunks = (K + kb - 1) / kb;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t o = size_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const size_t i = o / N, j = o - i * N;
    const float* a = A + i * K;
    const float* b = B + j;
    WordStream<kRand> rs(seed, stream, uint64_t(o) * nchunks);
    double acc = 0.0;
    for (size_t k0 = 0; k0 < K; k0 += kb) {
      const size_t k1 = k0 + kb < K ? k0 + kb : K;
      float c = 0.0f;
      for (size_t k = k0; k < k1; ++k) c = __fmaf_rn(a[k], b[k * N], c);
      const double v = add_round_odd(double(c), acc);
      acc = round_value<M>(v, t, rs.next());
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

  if (p.input) {  // A[i,k]: index i·K + k of stream + 1; B[k,j]: index k·N + j of stream + 2
    round_device(dA.get(), M * K, p.input->tf, p.input->mode, p.seed, s.stream + 1, 0);
    round_device(dB.get(), K * N, p.input->tf, p.input->mode, p.seed, s.stream + 2, 0);
  }

  const unsigned grid = blocks_for(M * N);
  dispatch_mode(p.acc_mode, [&]<Rounding R>() {
    switch (p.accumulation) {
      case Accumulation::strict:
        gemm_strict_kernel<R><<<grid, kThreads>>>(dA.get(), dB.get(), dC.get(), M, N, K, t,
                                                  p.seed, s.stream);
        break;
      case Accumulation::unfused:
        gemm_unfused_kernel<R><<<grid, kThreads>>>(dA.get(), dB.get(), dC.get(), M, N, K, t,
                                                   p.seed, s.stream);
        break;
      case Accumulation::blocked:
        gemm_blocked_kernel<R><<<grid, kThreads>>>(dA.get(), dB.get(), dC.get(), M, N, K,
                                                   p.block, t, p.seed, s.stream);
        break;
    }
    MANTIS_CUDA_CHECK_LAUNCH();
  });
  dC.download(C, M * N);  // synchronous: also reports kernel execution errors
}

}  // namespace mantis
