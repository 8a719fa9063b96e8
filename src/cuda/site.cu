// site — see site.h.
#include "common.cuh"
#include "cuda/site.h"
#include "cuda/health.h"
#include "nn/streams.h"

namespace mantis::gpu {

using cuda_detail::at_least;
using cuda_detail::blocks_for;
using cuda_detail::kThreads;
using cuda_detail::native;

namespace {

// dst [K,N] = srcᵀ, src [N,K] (both row-major).
__global__ void transpose_kernel(const float* __restrict__ src, float* __restrict__ dst, size_t N, size_t K) {
  const size_t total = N * K, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const size_t k = e / N, j = e - k * N;
    dst[e] = src[j * K + k];
  }
}

// out[i,j] = (C[i,j] ÷ divisor) + bias[j], in binary32, C converted first (RNE) when it is binary64;
// the operations of linear.cpp's site_gemm_impl in its order.
template <class S>
__global__ void finish_kernel(const S* C, float* out, size_t M, size_t N, float divisor,  // C may be out
                              const float* __restrict__ bias) {
  const size_t total = M * N, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    float v = float(C[e]);
    if (divisor != 1.0f) v = v / divisor;
    if (bias) v = v + bias[e % N];
    out[e] = v;
  }
}

// An operand's own rounding (input_a / input_b) of x [rows, cols], in place, its overflows (a
// scheme's clipped elements) counted into h; work: a scheme's scratch, alive until the stream is
// synchronised.
void round_operand(const OperandStep& o, float* x, size_t rows, size_t cols, uint64_t stream,
                   Array<cuda_detail::SchemeWork>& work, SiteHealth* h, const Stream& s) {
  if (rows == 0 || cols == 0) return;  // quantize_scheme's early return (a scheme plan needs a block)
  if (o.round) {
    round_step(x, rows * cols, *o.round, stream, h, s);
    return;
  }
  // The scheme was validated when the policy was compiled; the plan only adds this call's shape.
  const SchemeBlockPlan bp = plan_scheme_blocks(*o.scheme, int64_t(rows), int64_t(cols), o.mode, o.sr_bits, o.seed);
  if (!work.size()) work = Array<cuda_detail::SchemeWork>(1);
  cuda_detail::quantize_scheme_device(bp, x, x, stream, 0, nullptr, nullptr, work.get(), native(s));
  add_overflow(h, &work.get()->clipped, s);
}

// The call's scratch, kept between calls of this host thread and only grown, so that a forward pass
// does not cudaMalloc / cudaFree (which synchronises the whole device) for every GEMM.
struct SiteScratch {
  Array<float> A, B;                    // the operands' rounded copies
  Array<double> C;                      // the emulated GEMM's accumulator values
  Array<cuda_detail::SchemeWork> work;  // scheme operands' scratch
};
SiteScratch& site_scratch() {
  thread_local SiteScratch s;
  return s;
}
}  // namespace

void site_gemm(const SitePlan& p, const float* A, const float* B, bool bt, float* out, size_t M, size_t N, size_t K,
               uint64_t stream, float divisor, const float* bias, const Stream& s, SiteHealth* health) {
  if (M == 0 || N == 0) return;
  const cudaStream_t cs = native(s);
  const bool rounds_operands = p.input || p.input_a || p.input_b || (p.gemm && p.gemm->input);
  SiteScratch& sc = site_scratch();
  float *Ar = nullptr, *Br = nullptr;  // [M,K], [K,N]: the operands' rounded copies (A and B are never written)
  const float *a = A, *b = B;
  bool b_transposed = bt;
  if (p.gemm || rounds_operands) {
    Ar = at_least(sc.A, M * K);
    MANTIS_CUDA_CHECK(cudaMemcpyAsync(Ar, A, M * K * sizeof(float), cudaMemcpyDeviceToDevice, cs));
    Br = at_least(sc.B, K * N);
    if (bt) {
      cuda_detail::launch("transpose_kernel", transpose_kernel, blocks_for(K * N), kThreads, 0, cs, B, Br, N, K);
      MANTIS_CUDA_CHECK_LAUNCH();
    } else {
      MANTIS_CUDA_CHECK(cudaMemcpyAsync(Br, B, K * N * sizeof(float), cudaMemcpyDeviceToDevice, cs));
    }
    a = Ar, b = Br, b_transposed = false;
    if (p.input) {  // rounded below (native) or inside gemm (emulated)
      count_overflow(Ar, M * K, p.input->max_finite, health, s);
      count_overflow(Br, K * N, p.input->max_finite, health, s);
    }
    if (p.input_a) round_operand(*p.input_a, Ar, M, K, stream + kStreamA, sc.work, health, s);
    if (p.input_b) round_operand(*p.input_b, Br, K, N, stream + kStreamB, sc.work, health, s);
  }
  if (p.gemm) {  // emulated: gemm rounds the inputs itself (streams + kStreamA, + kStreamB)
    double* C = at_least(sc.C, MANTIS_PLANTED(cuda_detail::kPlantWorkspace) && M * N > 1 ? M * N - 1 : M * N);  // [M,N] the accumulator values
    gemm(*p.gemm, Ar, Br, C, M, N, K, stream, s);
    cuda_detail::launch("finish_kernel", finish_kernel<double>, blocks_for(M * N), kThreads, 0, cs, C, out, M, N, divisor, bias);
  } else {
    if (p.input) {
      round(Ar, M * K, p.input->plan, stream + kStreamA, 0, s);
      round(Br, K * N, p.input->plan, stream + kStreamB, 0, s);
    }
    sgemm(a, b, out, M, N, K, s, b_transposed);
    if (divisor != 1.0f || bias) cuda_detail::launch("finish_kernel", finish_kernel<float>, blocks_for(M * N), kThreads, 0, cs, out, out, M, N, divisor, bias);
  }
  MANTIS_CUDA_CHECK_LAUNCH();
  if (p.output) round_step(out, M * N, *p.output, stream + kStreamOutput, health, s);
  count_nonfinite(out, M * N, health, s);
  s.synchronize();  // the scratch is this thread's next call's, maybe on another stream
}

}  // namespace mantis::gpu
