// cpu — what the CPU running this binary can do, checked once at run time, so that one binary
// (built for any -march) picks the fastest kernel on every node: gemm_avx512, crmath.
#pragma once

namespace mantis {

// AVX-512 F, DQ, BW, VL and FMA: what the AVX-512 kernels use (compiled with MANTIS_AVX512_TARGET).
bool cpu_has_avx512();

}  // namespace mantis

#if defined(__x86_64__) || defined(__i386__)
#define MANTIS_AVX512_TARGET gnu::target("avx512f,avx512dq,avx512bw,avx512vl,fma")
#endif
