// cuda_round_array — round_array (round_array.h) on the GPU, bit-identical to the CPU path.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "core/philox.h"
#include "core/round.h"
#include "core/round_array.h"

namespace mantis {
namespace cuda_detail {
namespace {

// Deterministic modes: one element per thread (grid-stride), no random words.
template <Rounding M, class T>
__global__ void round_kernel(T* d, size_t n, Target<T> t) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = round_value<M>(d[i], t, 0u);
}

// sr / sre: one Philox block (4 words) per thread, so every word is generated once; a word serves
// 2^pack consecutive elements (philox.h sr_word), so a block serves Q = 4·2^pack. Group g covers
// local elements [Q·g − lead, Q·g − lead + Q) ∩ [0, n), with lead = index0 mod Q; its block is
// (index0 + i) >> (2 + pack) for each of them (mod 2^(62 − pack), as the CPU's wrapping index0 + i
// would give).
template <Rounding M, class T>
__global__ void round_stochastic_kernel(T* d, size_t n, Target<T> t, uint64_t seed,
                                        uint64_t stream, uint64_t index0, int pack) {
  const int qlog = 2 + pack;
  const uint64_t q = uint64_t(1) << qlog, lead = index0 & (q - 1);
  const uint64_t groups = (lead + n + q - 1) >> qlog;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t g = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const uint64_t block = ((index0 >> qlog) + g) & ((uint64_t(1) << (62 - pack)) - 1);
    const Philox4 r = random_block(seed, stream, block);
    for (uint64_t e = 0; e < q; ++e) {
      const uint64_t v = q * g + e;  // = i + lead
      if (v >= lead && v - lead < n) {
        const size_t i = size_t(v - lead);
        const uint32_t slot = uint32_t(e) & ((1u << pack) - 1);
        d[i] = round_value<M>(d[i], t, r.v[e >> pack] << (slot << (5 - pack)));
      }
    }
  }
}

template <class T>
void round_device_impl(T* d, size_t n, const Target<T>& t, Rounding m, uint64_t seed,
                       uint64_t stream, uint64_t index0, int pack, cudaStream_t cs) {
  if (n == 0) return;
  with_rounding(m, [&](auto mode) {
    constexpr Rounding M = decltype(mode)::value;
    if constexpr (is_stochastic(M)) {
      const uint64_t q = uint64_t(4) << pack;
      const size_t groups = size_t(((index0 & (q - 1)) + n + q - 1) >> (2 + pack));
      cuda_detail::launch("round_stochastic_kernel", round_stochastic_kernel<M, T>, blocks_for(groups), kThreads, 0, cs, d, n, t, seed, stream, index0, pack);
    } else {
      cuda_detail::launch("round_kernel", round_kernel<M, T>, blocks_for(n), kThreads, 0, cs, d, n, t);
    }
    MANTIS_CUDA_CHECK_LAUNCH();
  });
}

// Host arrays are processed in chunks so device memory stays bounded for any n.
constexpr size_t kChunkBytes = size_t(1) << 29;

template <class T>
void round_host(const T* in, T* out, size_t n, const Target<T>& t, const RoundOptions& o, int pack) {
  if (n == 0) return;
  const size_t chunk = std::min(n, kChunkBytes / sizeof(T));
  DeviceBuffer<T> buf(chunk);
  for (size_t off = 0; off < n; off += chunk) {
    const size_t len = std::min(chunk, n - off);
    buf.upload(in + off, len);
    round_device_impl(buf.get(), len, t, o.mode, o.seed, o.stream, o.index0 + off, pack, cudaStream_t(0));
    buf.download(out + off, len);  // synchronous: also reports kernel execution errors
  }
}

}  // namespace

void round_device(float* d, size_t n, const Target<float>& t, Rounding m, uint64_t seed,
                  uint64_t stream, uint64_t index0, int pack, cudaStream_t cs) {
  round_device_impl(d, n, t, m, seed, stream, index0, pack, cs);
}
void round_device(double* d, size_t n, const Target<double>& t, Rounding m, uint64_t seed,
                  uint64_t stream, uint64_t index0, int pack, cudaStream_t cs) {
  round_device_impl(d, n, t, m, seed, stream, index0, pack, cs);
}

}  // namespace cuda_detail

bool cuda_device_available() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the (non-sticky) error: no driver or no device
    return false;
  }
  return count > 0;
}

std::string cuda_device_name() {
  if (!cuda_device_available()) return "";
  int dev = 0;
  cudaDeviceProp prop{};
  MANTIS_CUDA_CHECK(cudaGetDevice(&dev));
  MANTIS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  if (MANTIS_CUDA_EMU) return prop.name;  // "cuda-emu (…)": no compute capability
  return std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
}

void cuda_round_array(const float* in, float* out, size_t n, const Format& f,
                      const RoundOptions& o) {
  require_fits_float(f);  // before validate(f), as round_array
  const RoundPlan p = plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed);
  cuda_detail::round_host(in, out, n, p.tf, o, p.sr_pack);
}

void cuda_round_array(const double* in, double* out, size_t n, const Format& f,
                      const RoundOptions& o) {
  const RoundPlan p = plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed);
  cuda_detail::round_host(in, out, n, p.td, o, p.sr_pack);
}

}  // namespace mantis
