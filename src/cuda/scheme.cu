// cuda_quantize_scheme, cuda_quantize_absmax — the scaled formats of scheme.h and the block-absmax
// quantiser of quant.h on the GPU, bit-identical to the CPU: the arithmetic of a block is
// scheme_block.h / quant_block.h, the functions quantize_scheme and quantize_absmax themselves
// call; this file adds only the launches and the indexing.
//
// One group of threads per block (a warp for blocks of ≤ kWarpBlockMax elements, else all 256
// threads of a thread block), grid-stride over the blocks. The group reduces the block's extremes
// (maxima and minima are exact, so the order of the reduction does not matter), every thread
// derives the same BlockScale from them, and the group writes the block's elements; its thread 0
// writes the block's scale and counts it. Two-level schemes reduce the tensor's amax first (an
// atomic maximum of the bit patterns: non-negative binary64 values order as their bits).
#include <algorithm>
#include <vector>

#include "common.cuh"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "core/philox.h"
#include "core/quant_block.h"
#include "core/scheme_block.h"

namespace mantis {
namespace cuda_detail {
namespace {

constexpr int64_t kWarpBlockMax = 1024;  // blocks up to this many elements: one warp each
constexpr unsigned kFull = 0xffffffffu;

// The extremes of a group's threads joined; every thread of the group gets the result. kGroup =
// 32: one warp; 256: the thread block (the caller's loop is uniform across it).
template <int kGroup>
__device__ void group_merge(BlockAmax& a) {
  for (int o = 16; o > 0; o >>= 1) {
    BlockAmax b;
    b.amax = __shfl_xor_sync(MANTIS_PLANTED(kPlantShuffleMask) ? 0x0000ffffu : kFull, a.amax, o);
    b.lo = __shfl_xor_sync(kFull, a.lo, o);
    b.hi = __shfl_xor_sync(kFull, a.hi, o);
    b.bad = __shfl_xor_sync(kFull, int(a.bad), o) != 0;
    amax_merge(a, b);
  }
  if constexpr (kGroup > 32) {
    constexpr int kWarps = kGroup / 32;
    __shared__ double s_amax[kWarps], s_lo[kWarps], s_hi[kWarps];
    __shared__ int s_bad[kWarps];
    const int w = int(threadIdx.x) / 32;
    if (threadIdx.x % 32 == 0) s_amax[w] = a.amax, s_lo[w] = a.lo, s_hi[w] = a.hi, s_bad[w] = int(a.bad);
    __syncthreads();
    for (int k = 0; k < kWarps; ++k) {
      BlockAmax b;
      b.amax = s_amax[k], b.lo = s_lo[k], b.hi = s_hi[k], b.bad = s_bad[k] != 0;
      amax_merge(a, b);
    }
    __syncthreads();  // the shared slots are reused by the next block
  }
}

// The same for quant_block's group maximum (values of T, no NaN: absmax_step ignores them).
template <int kGroup, class T>
__device__ T group_max(T amax) {
  for (int o = 16; o > 0; o >>= 1) amax = absmax_step(amax, T(__shfl_xor_sync(kFull, amax, o)));
  if constexpr (kGroup > 32) {
    constexpr int kWarps = kGroup / 32;
    __shared__ double s_max[kWarps];  // T → double → T is exact
    if (threadIdx.x % 32 == 0) s_max[threadIdx.x / 32] = double(amax);
    __syncthreads();
    for (int k = 0; k < kWarps; ++k) amax = absmax_step(amax, T(s_max[k]));
    __syncthreads();
  }
  return amax;
}

// Two-level: the tensor's amax (NaN ignored) and whether it holds a NaN or ±inf, into w.
template <class T>
__global__ void tensor_amax_kernel(const T* x, size_t n, SchemeWork* w) {
  BlockAmax a;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) amax_add(a, double(x[i]));
  group_merge<32>(a);
  if (threadIdx.x % 32 == 0) {
    atomicMax(&w->amax_bits, (unsigned long long)to_bits(a.amax));
    if (a.bad) atomicOr(&w->tensor_nan, 1u);
  }
}

// The blocks of p, one per group; x and y may alias (a thread reads each of its elements before
// it writes it, and the group's reduction separates the block's reads from its writes).
template <Rounding M, int kGroup, class T>
__global__ void __launch_bounds__(kThreads) scheme_kernel(SchemeBlockPlan p, const T* x, T* y, uint64_t stream,
                                                          uint64_t index0, double* scales, double* zero_points,
                                                          SchemeWork* w) {
  constexpr int kPerBlock = int(kThreads) / kGroup;
  const int t = int(threadIdx.x) % kGroup;
  const TensorScale ts = tensor_scale(p, double_from_bits(w->amax_bits), w->tensor_nan != 0);
  const int64_t nblocks = p.nbr * p.nbc, step = int64_t(gridDim.x) * kPerBlock;
  unsigned long long clipped = 0;
  for (int64_t blk = int64_t(blockIdx.x) * kPerBlock + int64_t(threadIdx.x) / kGroup; blk < nblocks; blk += step) {
    const int64_t bi = blk / p.nbc, bj = blk - bi * p.nbc;
    const int64_t r0 = bi * p.br, c0 = bj * p.bc;
    const int64_t nr = p.br < p.rows - r0 ? p.br : p.rows - r0, nc = p.bc < p.cols - c0 ? p.bc : p.cols - c0;
    const int64_t n = nr * nc;
    BlockAmax a;
    for (int64_t e = t; e < n; e += kGroup) {
      const int64_t i = e / nc;
      amax_add(a, double(x[(r0 + i) * p.cols + c0 + (e - i * nc)]));
    }
    group_merge<kGroup>(a);
    const BlockScale b = block_scale(p, ts, a);
    const BlockKind kind = block_kind(a, b);
    if (t == 0) {
      if (scales) scales[blk] = b.reported;
      if (zero_points) zero_points[blk] = b.z;
      if (kind == BlockKind::nan) atomicAdd(&w->nan_blocks, 1ull);
      if (kind == BlockKind::zero) atomicAdd(&w->zero_blocks, 1ull);
    }
    const bool plain = plain_quotient<T>(p, b);
    for (int64_t e = t; e < n; e += kGroup) {
      const int64_t i = e / nc;
      const int64_t at = (r0 + i) * p.cols + c0 + (e - i * nc);
      const T v = x[at];
      if (kind == BlockKind::values) clipped += element_clipped(p, b, double(v));
      const uint32_t word = is_stochastic(M) ? sr_word(p.elem.seed, stream, index0 + uint64_t(at), p.elem.sr_pack) : 0u;
      y[at] = scheme_element<M>(p, b, kind, plain, v, word);
    }
  }
  if (clipped) atomicAdd(&w->clipped, clipped);
}

template <int kGroup, class T>
__global__ void __launch_bounds__(kThreads) absmax_kernel(const T* x, T* out, size_t rows, size_t cols,
                                                          size_t group, size_t per_row, double Q, bool sr,
                                                          uint64_t seed, uint64_t stream) {
  constexpr int kPerBlock = int(kThreads) / kGroup;
  const size_t t = threadIdx.x % kGroup, groups = rows * per_row, step = size_t(gridDim.x) * kPerBlock;
  for (size_t g = size_t(blockIdx.x) * kPerBlock + threadIdx.x / kGroup; g < groups; g += step) {
    const size_t r = g / per_row, g0 = (g - r * per_row) * group;
    const size_t n = (cols - g0 < group ? cols - g0 : group);
    const T* xr = x + r * cols + g0;
    T amax = 0;
    for (size_t e = t; e < n; e += kGroup) amax = absmax_step(amax, xr[e]);
    amax = group_max<kGroup>(amax);
    const T s = absmax_scale(amax, Q);
    for (size_t e = t; e < n; e += kGroup) {
      const size_t idx = r * cols + g0 + e;
      out[idx] = absmax_element(x[idx], s, Q, sr, sr ? random_word(seed, stream, idx) : 0u);
    }
  }
}

unsigned grid_for(int64_t groups, int per_block) {
  const int64_t b = (groups + per_block - 1) / per_block;
  return unsigned(std::clamp<int64_t>(b, 1, int64_t(kMaxBlocks)));
}

template <class T>
void scheme_device_impl(const SchemeBlockPlan& p, const T* x, T* y, uint64_t stream, uint64_t index0,
                        double* scales, double* zero_points, SchemeWork* w, cudaStream_t cs) {
  MANTIS_CUDA_CHECK(cudaMemsetAsync(w, 0, sizeof(SchemeWork), cs));
  if (p.two_level) {
    const size_t n = size_t(p.rows * p.cols);
    cuda_detail::launch("tensor_amax_kernel", tensor_amax_kernel<T>, blocks_for(n), kThreads, 0, cs, x, n, w);
    MANTIS_CUDA_CHECK_LAUNCH();
  }
  const int64_t nblocks = p.nbr * p.nbc;
  const bool warp = p.br * p.bc <= kWarpBlockMax;
  with_rounding(p.elem.mode, [&](auto mode) {
    constexpr Rounding R = decltype(mode)::value;
    if (warp)
      cuda_detail::launch("scheme_kernel", scheme_kernel<R, 32, T>, grid_for(nblocks, int(kThreads) / 32), kThreads, 0, cs, p, x, y, stream, index0,
                                                                                          scales, zero_points, w);
    else
      cuda_detail::launch("scheme_kernel", scheme_kernel<R, int(kThreads), T>, grid_for(nblocks, 1), kThreads, 0, cs, p, x, y, stream, index0, scales,
                                                                                   zero_points, w);
    MANTIS_CUDA_CHECK_LAUNCH();
  });
}

template <class T>
void absmax_device_impl(const T* x, T* out, size_t rows, size_t cols, const AbsmaxQuant& q, uint64_t stream,
                        cudaStream_t cs) {
  if (rows == 0 || cols == 0) return;
  const size_t group = q.block == 0 ? cols : q.block, per_row = (cols + group - 1) / group;
  const int64_t groups = int64_t(rows * per_row);
  const double Q = absmax_levels(q.bits);
  const bool sr = q.rounding == Rounding::sr;
  if (std::min(group, cols) <= size_t(kWarpBlockMax))
    cuda_detail::launch("absmax_kernel", absmax_kernel<32, T>, grid_for(groups, int(kThreads) / 32), kThreads, 0, cs, x, out, rows, cols, group, per_row,
                                                                                  Q, sr, q.seed, stream);
  else
    cuda_detail::launch("absmax_kernel", absmax_kernel<int(kThreads), T>, grid_for(groups, 1), kThreads, 0, cs, x, out, rows, cols, group, per_row, Q,
                                                                             sr, q.seed, stream);
  MANTIS_CUDA_CHECK_LAUNCH();
}

// Host arrays: upload, quantise in place on the device, download (synchronous).
template <class T>
SchemeStats scheme_host(const Scheme& s, const T* x, T* y, int64_t rows, int64_t cols, Rounding mode, int sr_bits,
                        uint64_t seed, uint64_t stream, uint64_t index0, std::vector<double>* scales,
                        std::vector<double>* zero_points) {
  SchemeStats st;
  st.elements = uint64_t(rows * cols);
  if (rows == 0 || cols == 0) return st;
  const SchemeBlockPlan p = plan_scheme_blocks(s, rows, cols, mode, sr_bits, seed);  // InputError as the CPU
  const size_t n = size_t(rows * cols), nb = size_t(p.nbr * p.nbc);
  DeviceBuffer<T> d(n);
  DeviceBuffer<double> ds(scales ? nb : 0), dz(zero_points ? nb : 0);
  DeviceBuffer<SchemeWork> dw(1);
  d.upload(x, n);
  scheme_device_impl(p, d.get(), d.get(), stream, index0, ds.get(), dz.get(), dw.get(), cudaStream_t(0));
  d.download(y, n);  // synchronous: also reports kernel execution errors
  SchemeWork w;
  dw.download(&w, 1);
  st.blocks = nb;
  st.nan_blocks = w.nan_blocks, st.zero_blocks = w.zero_blocks, st.clipped = w.clipped;
  if (s.two_level) st.global_scale = tensor_scale(p, double_from_bits(w.amax_bits), w.tensor_nan != 0).G;
  if (scales) scales->resize(nb), ds.download(scales->data(), nb);
  if (zero_points) zero_points->resize(nb), dz.download(zero_points->data(), nb);
  return st;
}

template <class T>
void absmax_host(const T* x, T* out, size_t rows, size_t cols, const AbsmaxQuant& q, uint64_t stream) {
  const size_t n = rows * cols;
  if (n == 0) return;
  DeviceBuffer<T> d(n);
  d.upload(x, n);
  absmax_device_impl(d.get(), d.get(), rows, cols, q, stream, cudaStream_t(0));
  d.download(out, n);
}

}  // namespace

void quantize_scheme_device(const SchemeBlockPlan& p, const float* x, float* y, uint64_t stream, uint64_t index0,
                            double* scales, double* zero_points, SchemeWork* w, cudaStream_t cs) {
  scheme_device_impl(p, x, y, stream, index0, scales, zero_points, w, cs);
}
void quantize_scheme_device(const SchemeBlockPlan& p, const double* x, double* y, uint64_t stream, uint64_t index0,
                            double* scales, double* zero_points, SchemeWork* w, cudaStream_t cs) {
  scheme_device_impl(p, x, y, stream, index0, scales, zero_points, w, cs);
}
void quantize_absmax_device(const float* x, float* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                            uint64_t stream, cudaStream_t cs) {
  absmax_device_impl(x, out, rows, cols, q, stream, cs);
}
void quantize_absmax_device(const double* x, double* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                            uint64_t stream, cudaStream_t cs) {
  absmax_device_impl(x, out, rows, cols, q, stream, cs);
}

}  // namespace cuda_detail

SchemeStats cuda_quantize_scheme(const Scheme& s, const float* x, float* y, int64_t rows, int64_t cols, Rounding mode,
                                 int sr_bits, uint64_t seed, uint64_t stream, uint64_t index0,
                                 std::vector<double>* scales, std::vector<double>* zero_points) {
  return cuda_detail::scheme_host(s, x, y, rows, cols, mode, sr_bits, seed, stream, index0, scales, zero_points);
}
SchemeStats cuda_quantize_scheme(const Scheme& s, const double* x, double* y, int64_t rows, int64_t cols,
                                 Rounding mode, int sr_bits, uint64_t seed, uint64_t stream, uint64_t index0,
                                 std::vector<double>* scales, std::vector<double>* zero_points) {
  return cuda_detail::scheme_host(s, x, y, rows, cols, mode, sr_bits, seed, stream, index0, scales, zero_points);
}

void cuda_quantize_absmax(const float* x, float* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                          uint64_t stream) {
  cuda_detail::absmax_host(x, out, rows, cols, q, stream);
}
void cuda_quantize_absmax(const double* x, double* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                          uint64_t stream) {
  cuda_detail::absmax_host(x, out, rows, cols, q, stream);
}

}  // namespace mantis
