// bits — the IEEE bit pattern of a binary32 / binary64 value and back, on the CPU (memcpy) and in
// CUDA device code (the intrinsics): shared by the rounding core and crmath.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace mantis {

MANTIS_HD uint32_t to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u; std::memcpy(&u, &x, 4); return u;
#endif
}
MANTIS_HD uint64_t to_bits(double x) {
#if defined(__CUDA_ARCH__)
  return uint64_t(__double_as_longlong(x));
#else
  uint64_t u; std::memcpy(&u, &x, 8); return u;
#endif
}
MANTIS_HD float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x; std::memcpy(&x, &u, 4); return x;
#endif
}
MANTIS_HD double double_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)u);
#else
  double x; std::memcpy(&x, &u, 8); return x;
#endif
}
}  // namespace mantis
