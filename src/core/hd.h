// hd — MANTIS_HD marks code shared verbatim by the C++ and CUDA builds (__host__ __device__ under
// nvcc, plain inline elsewhere): rounding, random words and accumulation steps are written once.
#pragma once

#if defined(__CUDACC__)
#define MANTIS_HD __host__ __device__ __forceinline__
#else
#define MANTIS_HD inline
#endif
