// nn_ops — see nn_ops.h.
#include "common.cuh"
#include "cuda/nn_ops.h"
#include "cuda/health.h"
#include "nn/activation.h"
#include "nn/norm_row.h"
#include "nn/streams.h"

namespace mantis::gpu {

using cuda_detail::blocks_for;
using cuda_detail::kThreads;
using cuda_detail::native;

namespace {

#define MANTIS_GRID_STRIDE(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void embed_kernel(const int32_t* tokens, const float* wte, const float* wpe, float* x, size_t T, size_t C) {
  MANTIS_GRID_STRIDE(e, T * C) {
    const size_t t = e / C, c = e - t * C;
    const float v = wte[size_t(tokens[t]) * C + c];
    x[e] = wpe ? v + wpe[e] : v;
  }
}

__global__ void norm_kernel(const float* x, const float* w, const float* b, float eps, float* out, size_t T, size_t C) {
  MANTIS_GRID_STRIDE(t, T) detail::norm_row<float>(x + t * C, out + t * C, w, b, eps, int64_t(C));
}

// The CPU's GELU (activation.cpp): 0.5·x·(1 + erf(x·√½)) or the tanh form, crmath's functions.
__global__ void gelu_kernel(float* h, size_t n, bool tanh_approx) {
  MANTIS_GRID_STRIDE(i, n) h[i] = act::gelu(h[i], tanh_approx);
}

__global__ void silu_kernel(float* g, const float* u, size_t n) {
  MANTIS_GRID_STRIDE(i, n) g[i] = act::swiglu(g[i], u[i]);
}

__global__ void add_kernel(float* x, const float* y, size_t n) {
  MANTIS_GRID_STRIDE(i, n) x[i] = x[i] + y[i];
}

// One pair (x[2i], x[2i+1]) of one head at one position per element.
__global__ void rope_kernel(float* x, size_t T, size_t nh, size_t HS, const float* cos_, const float* sin_) {
  const size_t half = HS / 2;
  MANTIS_GRID_STRIDE(e, T * nh * half) {
    const size_t t = e / (nh * half), r = e - t * nh * half, h = r / half, i = r - h * half;
    float* v = x + t * nh * HS + h * HS;
    const float c = cos_[t * half + i], sn = sin_[t * half + i], v0 = v[2 * i], v1 = v[2 * i + 1];
    v[2 * i] = v0 * c - v1 * sn;
    v[2 * i + 1] = v0 * sn + v1 * c;
  }
}

__global__ void columns_kernel(const float* src, size_t ld, size_t c0, float* dst, size_t T, size_t w) {
  MANTIS_GRID_STRIDE(e, T * w) {
    const size_t t = e / w, c = e - t * w;
    dst[e] = src[t * ld + c0 + c];
  }
}

#undef MANTIS_GRID_STRIDE

}  // namespace

void embed(const int32_t* tokens, const float* wte, const float* wpe, float* x, size_t T, size_t C, const Stream& s) {
  cuda_detail::launch("embed_kernel", embed_kernel, blocks_for(T * C), kThreads, 0, native(s), tokens, wte, wpe, x, T, C);
  MANTIS_CUDA_CHECK_LAUNCH();
}

void norm(const SitePlan& p, uint64_t stream, const float* x, const float* w, const float* b, float eps, float* out,
          float* scratch, size_t T, size_t C, const Stream& s, SiteHealth* h) {
  const float* in = x;
  if (p.input) {  // the residual stream stays unrounded: round a copy
    MANTIS_CUDA_CHECK(cudaMemcpyAsync(scratch, x, T * C * sizeof(float), cudaMemcpyDeviceToDevice, native(s)));
    round_step(scratch, T * C, *p.input, stream + kStreamA, h, s);
    in = scratch;
  }
  // One thread per row: the row's sums are sequential (norm_row), as on the CPU.
  cuda_detail::launch("norm_kernel", norm_kernel, unsigned((T + 127) / 128), 128, 0, native(s), in, w, b, eps, out, T, C);
  MANTIS_CUDA_CHECK_LAUNCH();
  if (p.output) round_step(out, T * C, *p.output, stream + kStreamOutput, h, s);
  count_nonfinite(out, T * C, h, s);
}

void gelu(const SitePlan& p, uint64_t stream, bool tanh_approx, float* x, size_t n, const Stream& s, SiteHealth* h) {
  if (p.input) round_step(x, n, *p.input, stream + kStreamA, h, s);
  cuda_detail::launch("gelu_kernel", gelu_kernel, blocks_for(n), kThreads, 0, native(s), x, n, tanh_approx);
  MANTIS_CUDA_CHECK_LAUNCH();
  if (p.output) round_step(x, n, *p.output, stream + kStreamOutput, h, s);
  count_nonfinite(x, n, h, s);
}

void silu(const SitePlan& p, uint64_t stream, float* g, float* u, size_t n, const Stream& s, SiteHealth* h) {
  if (p.input) {
    round_step(g, n, *p.input, stream + kStreamA, h, s);
    round_step(u, n, *p.input, stream + kStreamB, h, s);
  }
  cuda_detail::launch("silu_kernel", silu_kernel, blocks_for(n), kThreads, 0, native(s), g, u, n);
  MANTIS_CUDA_CHECK_LAUNCH();
  if (p.output) round_step(g, n, *p.output, stream + kStreamOutput, h, s);
  count_nonfinite(g, n, h, s);
}

void add(float* x, const float* y, size_t n, const Stream& s) {
  cuda_detail::launch("add_kernel", add_kernel, blocks_for(n), kThreads, 0, native(s), x, y, n);
  MANTIS_CUDA_CHECK_LAUNCH();
}

void rope(float* x, size_t T, size_t nh, size_t HS, const float* cos_, const float* sin_, const Stream& s) {
  cuda_detail::launch("rope_kernel", rope_kernel, blocks_for(T * nh * (HS / 2)), kThreads, 0, native(s), x, T, nh, HS, cos_, sin_);
  MANTIS_CUDA_CHECK_LAUNCH();
}

void columns(const float* src, size_t ld, size_t c0, float* dst, size_t T, size_t w, const Stream& s) {
  cuda_detail::launch("columns_kernel", columns_kernel, blocks_for(T * w), kThreads, 0, native(s), src, ld, c0, dst, T, w);
  MANTIS_CUDA_CHECK_LAUNCH();
}

}  // namespace mantis::gpu
