// gemm — gemm.h on the GPU, bit-identical to the CPU path and the MPFR oracle.
//
// Tiled: a block of 16×16 threads owns a (16·TM)×(16·TN) tile of C; thread (ty, tx) owns outputs
// (ty + 16r, tx + 16c). K is walked in slices of kBK: the block stages A's [rows × kBK] and B's
// [kBK × cols] slices in shared memory, then every thread advances each of its outputs over the
// slice's k in order (accumulate.h OutputAccumulator: the same steps and random-word indices as
// the CPU, one rounding per step). Each output's k order is kept, so tiling changes no bit. The
// module is built with --fmad=false, so nothing is contracted.
// tensor_core accumulation needs each block of k_b products at once (tc_block_sum): one thread
// per output reads them from global memory.
#include <string>

#include "common.cuh"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "cuda/device.h"
#include "core/accumulate.h"
#include "core/gemm.h"
#include "core/philox.h"
#include "core/round.h"

namespace mantis {
namespace cuda_detail {
namespace {

constexpr int kTX = 16, kTY = 16, kBK = 16;

template <Rounding M, Accumulation kAcc, int TM, int TN>
__global__ void __launch_bounds__(kTX * kTY)
gemm_tiled_kernel(const float* __restrict__ A, const float* __restrict__ B, double* __restrict__ C,
                  const double* __restrict__ C0, size_t Mr, size_t N, size_t K, size_t kb, Target<double> t,
                  uint64_t seed, uint64_t stream, int pack) {
  constexpr int BM = kTY * TM, BN = kTX * TN;
  __shared__ float As[BM][kBK + 1];  // [rows, k] (+1: no bank conflicts on the column writes)
  __shared__ float Bs[kBK][BN];      // [k, cols]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kTX + tx;
  const size_t i0 = size_t(blockIdx.y) * BM, j0 = size_t(blockIdx.x) * BN;
  const uint64_t nchunks = chunk_count(K, kb);

  OutputAccumulator<M, kAcc> acc[TM][TN];
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      acc[r][c] = OutputAccumulator<M, kAcc>(seed, stream, pack);
      const size_t i = i0 + ty + kTY * r, j = j0 + tx + kTX * c;
      if (C0 && i < Mr && j < N) acc[r][c].acc = C0[i * N + j];  // promoted: its binary32 accumulator
    }

  for (size_t k0 = 0; k0 < K; k0 += kBK) {
    for (int e = tid; e < BM * kBK; e += kTX * kTY) {  // A slice: 16 consecutive k per row
      const int r = e / kBK, kk = e % kBK;
      const size_t i = i0 + r, k = k0 + kk;
      As[r][kk] = (i < Mr && k < K) ? A[i * K + k] : 0.0f;
    }
    for (int e = tid; e < kBK * BN; e += kTX * kTY) {  // B slice: BN consecutive columns per k
      const int kk = e / BN, c = e % BN;
      const size_t k = k0 + kk, j = j0 + c;
      Bs[kk][c] = (k < K && j < N) ? B[k * N + j] : 0.0f;
    }
    if (!MANTIS_PLANTED(kPlantBranchBarrier) || tid < kTX * kTY / 2) __syncthreads();
    const int kend = K - k0 < size_t(kBK) ? int(K - k0) : kBK;
    for (int kk = 0; kk < kend; ++kk) {
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        const float a = As[ty + kTY * r][kk];
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          const uint64_t o = (i0 + ty + kTY * r) * N + (j0 + tx + kTX * c);  // unused past the edge
          acc[r][c].step(a, Bs[kk][tx + kTX * c], t, o, K, k0 + kk, kb, nchunks);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const size_t i = i0 + ty + kTY * r, j = j0 + tx + kTX * c;
      if (i < Mr && (j < N || (MANTIS_PLANTED(kPlantTileBound) && j == N))) C[i * N + j] = acc[r][c].value();
    }
}

// tensor_core: output o = i·N + j per thread, blocks of kb products straight from global memory.
template <Rounding M>
__global__ void gemm_tc_kernel(const float* __restrict__ A, const float* __restrict__ B, double* __restrict__ C,
                               const double* __restrict__ C0, size_t Mr, size_t N, size_t K, size_t kb, int align_bits,
                               Target<double> t, uint64_t seed, uint64_t stream, int pack) {
  const size_t total = Mr * N;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t o = size_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const size_t i = o / N, j = o - i * N;
    const float* a = A + i * K;
    const float* b = B + j;
    WordCache<is_stochastic(M)> rs(seed, stream, pack);
    double acc = C0 ? C0[o] : 0.0;
    const size_t nchunks = chunk_count(K, kb);
    for (size_t c = 0; c < nchunks; ++c) {
      const size_t k0 = c * kb, k1 = k0 + kb < K ? k0 + kb : K;
      acc = round_value<M>(tc_block_sum(acc, a + k0, b + k0 * N, N, k1 - k0, align_bits), t,
                           rs.at(blocked_index(o, nchunks, c)));
    }
    C[o] = acc;
  }
}

// tensor_core with a GPU: that GPU's matrix unit (core/matrix_unit.h), one output per thread.
__global__ void gemm_unit_kernel(const float* __restrict__ A, const float* __restrict__ B, double* __restrict__ C,
                                 const double* __restrict__ C0, size_t Mr, size_t N, size_t K, MatrixUnit u,
                                 MuKernel kn) {
  const size_t total = Mr * N;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t o = size_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const size_t i = o / N, j = o - i * N;
    C[o] = mu_gemm_dot(u, kn, A + i * K, B + j, N, K, C0 ? C0[o] : 0.0, C0 != nullptr);
  }
}

// The addend in the accumulator format, as gemm.cpp: nearest-even into it (promoted: into its
// binary32 output accumulator).
__global__ void addend_kernel(const double* __restrict__ C0, double* __restrict__ out, size_t n, Target<double> t,
                              bool promoted) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = promoted ? double(float(C0[i])) : round_value<Rounding::rne>(C0[i], t, 0u);
}

template <Rounding R, Accumulation kAcc>
void launch_tiled(const GemmPlan& p, const float* A, const float* B, double* C, const double* C0, size_t M, size_t N,
                  size_t K, uint64_t stream, cudaStream_t cs) {
  // Stochastic modes keep a Philox block per output in registers: fewer outputs per thread.
  constexpr int TM = is_stochastic(R) ? 2 : 4, TN = TM;
  const size_t gy = (M + kTY * TM - 1) / (kTY * TM);
  if (gy > 65535) throw std::runtime_error("cuda gemm: M = " + std::to_string(M) + " rows exceed the grid (at most " +
                                           std::to_string(65535 * kTY * TM) + ")");
  const dim3 block(kTX, kTY), grid(unsigned((N + kTX * TN - 1) / (kTX * TN)), unsigned(gy));
  cuda_detail::launch("gemm_tiled_kernel", gemm_tiled_kernel<R, kAcc, TM, TN>, grid, block, 0, cs, A, B, C, C0, M, N, K, p.block, p.acc, p.seed,
                                                                    stream, p.sr_pack);
}

}  // namespace
}  // namespace cuda_detail

void gpu::gemm(const GemmPlan& p, float* A, float* B, double* C, size_t M, size_t N, size_t K, uint64_t stream,
               const Stream& s, const double* C0) {
  using namespace cuda_detail;
  if (M == 0 || N == 0) return;
  const cudaStream_t cs = native(s);
  if (p.input) {  // A[i,k]: index i·K + k of stream + kStreamA; B[k,j]: index k·N + j of + kStreamB
    round_device(A, M * K, p.input->tf, p.input->mode, p.seed, stream + kStreamA, 0, p.input->sr_pack, cs);
    round_device(B, K * N, p.input->tf, p.input->mode, p.seed, stream + kStreamB, 0, p.input->sr_pack, cs);
  }
  DeviceBuffer<double> c0;  // the addend in the accumulator format
  if (C0) {
    c0 = DeviceBuffer<double>(M * N);
    cuda_detail::launch("addend_kernel", addend_kernel, blocks_for(M * N), kThreads, 0, cs, C0, c0.get(), M * N, p.acc,
                                                          p.accumulation == Accumulation::promoted);
    MANTIS_CUDA_CHECK_LAUNCH();
  }
  const double* c = C0 ? c0.get() : nullptr;
  with_rounding(p.acc_mode, [&](auto mode) {
    constexpr Rounding R = decltype(mode)::value;
    switch (p.accumulation) {
      case Accumulation::strict: launch_tiled<R, Accumulation::strict>(p, A, B, C, c, M, N, K, stream, cs); break;
      case Accumulation::unfused: launch_tiled<R, Accumulation::unfused>(p, A, B, C, c, M, N, K, stream, cs); break;
      case Accumulation::blocked: launch_tiled<R, Accumulation::blocked>(p, A, B, C, c, M, N, K, stream, cs); break;
      case Accumulation::promoted: launch_tiled<R, Accumulation::promoted>(p, A, B, C, c, M, N, K, stream, cs); break;
      case Accumulation::tensor_core:
        if (p.unit) {
          cuda_detail::launch("gemm_unit_kernel", gemm_unit_kernel, blocks_for(M * N), kThreads, 0, cs, A, B, C, c, M, N, K, *p.unit, p.unit_kernel);
          break;
        }
        cuda_detail::launch("gemm_tc_kernel", gemm_tc_kernel<R>, blocks_for(M * N), kThreads, 0, cs, A, B, C, c, M, N, K, p.block, p.align_bits, p.acc,
                                                                  p.seed, stream, p.sr_pack);
        break;
    }
    MANTIS_CUDA_CHECK_LAUNCH();
  });
  // c0 is freed here; cudaFree waits for the kernels that read it
}

void cuda_gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K, const GemmSpec& s,
               const double* C0) {
  const GemmPlan p = plan_gemm(s);  // validate(s): also block ≥ 1 and the input format fits binary32
  if (M == 0 || N == 0) return;
  gpu::Array<float> dA(M * K), dB(K * N);
  gpu::Array<double> dC(M * N), dC0(C0 ? M * N : 0);
  dA.upload(A, M * K);
  dB.upload(B, K * N);
  if (C0) dC0.upload(C0, M * N);
  gpu::gemm(p, dA.get(), dB.get(), dC.get(), M, N, K, s.stream, gpu::Stream(), C0 ? dC0.get() : nullptr);
  dC.download(C, M * N);  // synchronous: also reports kernel execution errors
}

}  // namespace mantis
