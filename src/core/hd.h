// hd — MANTIS_HD marks code shared verbatim by the C++ and CUDA builds (__host__ __device__ under
// nvcc, plain inline elsewhere): rounding, random words and accumulation steps are written once.
#pragma once

#if defined(__CUDACC__)
#define MANTIS_HD __host__ __device__ __forceinline__
#else
#define MANTIS_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace mantis {

// The binary32 operations whose spelling differs between host and device, correctly rounded on
// both (nvcc: --prec-sqrt=true, no fast math): fma (one rounding), sqrt, |x|.
MANTIS_HD float hd_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MANTIS_HD float hd_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
MANTIS_HD float hd_abs(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return std::abs(x);
#endif
}

}  // namespace mantis
