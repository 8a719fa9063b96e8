// tc_probe — inner products through this GPU's own tensor cores, as the measured data were taken
// (tests/data/tensor_core/README.md): `wmma` for fp16 / bf16 / tf32 inputs (m16n16k16, k8 for
// tf32), `mma.sync m16n8k32` for e4m3 / e5m2 (compute capability 8.9 and later). One warp per test:
// row 0 of A and column 0 of B hold its K values (the rest zero), C[0][0] its addend, and D[0][0]
// comes back. `mantis probe-tensor-cores` compares the results with every matrix-unit preset.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.cuh"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "cuda/device.h"

namespace mantis {
namespace cuda_detail {
namespace {

using namespace nvcuda;

// The storage type of each wmma input, and the conversion the authors' harness used (to nearest).
struct InFp16 {
  using S = half;
  using Frag = half;
  static constexpr int kK = 16;
  __device__ static S cvt(float x) { return __float2half_rn(x); }
};
struct InBf16 {
  using S = __nv_bfloat16;
  using Frag = __nv_bfloat16;
  static constexpr int kK = 16;
  __device__ static S cvt(float x) { return __float2bfloat16_rn(x); }
};
struct InTf32 {
  using S = float;
  using Frag = wmma::precision::tf32;
  static constexpr int kK = 8;
  __device__ static S cvt(float x) { return wmma::__float_to_tf32(x); }
};

template <class Acc> __device__ Acc acc_of(float x);
template <> __device__ float acc_of<float>(float x) { return x; }
template <> __device__ half acc_of<half>(float x) { return __float2half_rn(x); }

// a, b: [n, K] (K ≤ In::kK), c, d: [n]; one warp (block) per test.
template <class In, class Acc>
__global__ void probe_wmma(const float* a, const float* b, const float* c, float* d, int K) {
#if __CUDA_ARCH__ >= 800
  __shared__ typename In::S As[16 * In::kK], Bs[16 * In::kK];
  __shared__ Acc Cs[16 * 16];
  const int t = blockIdx.x, lane = threadIdx.x;
  for (int i = lane; i < 16 * In::kK; i += 32) {  // A row-major 16×kK, B column-major kK×16
    const int r = i / In::kK, k = i % In::kK;
    As[i] = In::cvt(r == 0 && k < K ? a[t * K + k] : 0.0f);
    Bs[i] = In::cvt(r == 0 && k < K ? b[t * K + k] : 0.0f);
  }
  for (int i = lane; i < 256; i += 32) Cs[i] = acc_of<Acc>(i == 0 ? c[t] : 0.0f);
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, In::kK, typename In::Frag, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, In::kK, typename In::Frag, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, In::kK, Acc> fc;
  wmma::load_matrix_sync(fa, As, In::kK);
  wmma::load_matrix_sync(fb, Bs, In::kK);
  wmma::load_matrix_sync(fc, Cs, 16, wmma::mem_row_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(Cs, fc, 16, wmma::mem_row_major);
  __syncwarp();
  if (lane == 0) d[t] = float(Cs[0]);
#endif
}

// mma.sync m16n8k32 with FP8 inputs: lane (g = lane/4, q = lane%4) holds A row g, k = 4q..4q+3 in
// register 0 and 16+4q.. in register 2 (registers 1 and 3: row g+8, zero here); B column g, the
// same k in its two registers; D[0][0] is lane 0's first accumulator (its low half for fp16).
template <bool kE5M2, bool kOut16>
__global__ void probe_mma_fp8(const float* a, const float* b, const float* c, float* d, int K) {
#if __CUDA_ARCH__ >= 890
  const int t = blockIdx.x, lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  uint32_t ra[4] = {0, 0, 0, 0}, rb[2] = {0, 0};
  auto code = [&](const float* v, int k) -> uint32_t {
    const float x = k < K ? v[t * K + k] : 0.0f;
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kE5M2 ? __NV_E5M2 : __NV_E4M3);
  };
  if (g == 0)
    for (int i = 0; i < 4; ++i) {
      ra[0] |= code(a, 4 * q + i) << (8 * i);
      ra[2] |= code(a, 16 + 4 * q + i) << (8 * i);
      rb[0] |= code(b, 4 * q + i) << (8 * i);
      rb[1] |= code(b, 16 + 4 * q + i) << (8 * i);
    }
  if constexpr (!kOut16) {
    float acc[4] = {lane == 0 ? c[t] : 0.0f, 0.0f, 0.0f, 0.0f}, out[4];
    if constexpr (kE5M2)
      asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%10,%11,%12,%13};\n"
                   : "=f"(out[0]), "=f"(out[1]), "=f"(out[2]), "=f"(out[3])
                   : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]), "f"(acc[0]),
                     "f"(acc[1]), "f"(acc[2]), "f"(acc[3]));
    else
      asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%10,%11,%12,%13};\n"
                   : "=f"(out[0]), "=f"(out[1]), "=f"(out[2]), "=f"(out[3])
                   : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]), "f"(acc[0]),
                     "f"(acc[1]), "f"(acc[2]), "f"(acc[3]));
    if (lane == 0) d[t] = out[0];
  } else {
    const half c0 = __float2half_rn(lane == 0 ? c[t] : 0.0f), z = __float2half_rn(0.0f);
    const uint32_t acc0 = uint32_t(__half_as_ushort(c0)) | (uint32_t(__half_as_ushort(z)) << 16), acc1 = 0;
    uint32_t out[2];
    if constexpr (kE5M2)
      asm volatile("mma.sync.aligned.m16n8k32.row.col.f16.e5m2.e5m2.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
                   : "=r"(out[0]), "=r"(out[1])
                   : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]), "r"(acc0), "r"(acc1));
    else
      asm volatile("mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
                   : "=r"(out[0]), "=r"(out[1])
                   : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]), "r"(acc0), "r"(acc1));
    if (lane == 0) d[t] = __half2float(__ushort_as_half(uint16_t(out[0] & 0xFFFF)));
  }
#endif
}

}  // namespace
}  // namespace cuda_detail

std::vector<float> cuda_tensor_core_probe(const std::string& input, const std::string& output,
                                          const std::vector<float>& a, const std::vector<float>& b,
                                          const std::vector<float>& c, int K) {
  using namespace cuda_detail;
  int dev = 0;
  cudaDeviceProp prop{};
  MANTIS_CUDA_CHECK(cudaGetDevice(&dev));
  MANTIS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const int cc = prop.major * 10 + prop.minor;
  const bool fp8 = input == "e4m3" || input == "e5m2", out16 = output == "fp16";
  const int kmax = fp8 ? 32 : input == "tf32" ? 8 : 16;
  const size_t n = c.size();
  if (n == 0 || K < 1 || K > kmax || a.size() != n * size_t(K) || b.size() != n * size_t(K))
    throw std::invalid_argument("cuda_tensor_core_probe: " + input + " takes 1.." + std::to_string(kmax) +
                                " products per test and a, b of n·K values");
  if ((fp8 && cc < 89) || cc < 80 || (out16 && input != "fp16" && !fp8) || (input == "tf32" && out16))
    return {};  // not on this GPU (or no such instruction)
  gpu::Array<float> da(a.size()), db(b.size()), dc(n), dd(n);
  da.upload(a.data(), a.size());
  db.upload(b.data(), b.size());
  dc.upload(c.data(), n);
  const unsigned blocks = unsigned(n);
  if (input == "fp16" && !out16) cuda_detail::launch("probe_wmma", probe_wmma<InFp16, float>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "fp16" && out16) cuda_detail::launch("probe_wmma", probe_wmma<InFp16, half>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "bf16") cuda_detail::launch("probe_wmma", probe_wmma<InBf16, float>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "tf32") cuda_detail::launch("probe_wmma", probe_wmma<InTf32, float>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "e4m3" && !out16) cuda_detail::launch("probe_mma_fp8", probe_mma_fp8<false, false>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "e4m3" && out16) cuda_detail::launch("probe_mma_fp8", probe_mma_fp8<false, true>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "e5m2" && !out16) cuda_detail::launch("probe_mma_fp8", probe_mma_fp8<true, false>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  if (input == "e5m2" && out16) cuda_detail::launch("probe_mma_fp8", probe_mma_fp8<true, true>, blocks, 32, 0, nullptr, da.get(), db.get(), dc.get(), dd.get(), K);
  MANTIS_CUDA_CHECK_LAUNCH();
  std::vector<float> d(n);
  dd.download(d.data(), n);
  return d;
}

}  // namespace mantis
