// cuda_runtime.h of cuda-emu: what src/cuda/*.cu use of CUDA, for the host compiler, so that the
// kernel sources themselves run on the CPU (cuda_emu/emu.h says how). Found before any real CUDA
// header only in the emulated build (include path src/cuda_emu/include); never with nvcc.
#pragma once

// Device-side code guarded by __CUDACC__ that the emulator runs too tests for this.
#define __CUDA_EMU__ 1

#include <cstddef>
#include <cstdint>
#include <cstring>

// ---------------------------------------------------------------- qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Shared memory: one copy per block, because every block runs on a host thread of its own (and
// all threads of the block on that one, as fibers): a static thread_local is exactly that.
#define __shared__ static thread_local
#define __constant__

// ---------------------------------------------------------------- built-in variables
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
// The running CUDA thread's, through calls (the threads of a block share one host thread, so a
// thread_local would be one variable written by all of them).
namespace cuda_emu {
uint3 thread_index();
uint3 block_index();
dim3 block_dim();
dim3 grid_dim();
}  // namespace cuda_emu
#define threadIdx (::cuda_emu::thread_index())
#define blockIdx (::cuda_emu::block_index())
#define blockDim (::cuda_emu::block_dim())
#define gridDim (::cuda_emu::grid_dim())
constexpr int warpSize = 32;

// ---------------------------------------------------------------- synchronisation within a block
namespace cuda_emu {
void syncthreads();
void syncwarp(unsigned mask);
uint64_t shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width);
}  // namespace cuda_emu

inline void __syncthreads() { cuda_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { cuda_emu::syncwarp(mask); }
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  static_assert(sizeof(T) <= 8);
  uint64_t b = 0;
  std::memcpy(&b, &var, sizeof(T));
  b = cuda_emu::shfl_xor(mask, b, lane_mask, width);
  T r;
  std::memcpy(&r, &b, sizeof(T));
  return r;
}

// ---------------------------------------------------------------- atomics (real ones: blocks run concurrently)
template <class T>
T atomicAdd(T* p, T v) {
  if constexpr (sizeof(T) == 4 || sizeof(T) == 8) {
    if constexpr (__is_same(T, float) || __is_same(T, double)) {
      T old = __atomic_load_n(p, __ATOMIC_RELAXED);
      while (!__atomic_compare_exchange_n(p, &old, old + v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      }
      return old;
    } else {
      return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
  }
}
template <class T>
T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
T atomicOr(T* p, T v) {
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}

// ---------------------------------------------------------------- reinterpretations
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; std::memcpy(&x, &u, 4); return x; }
inline long long __double_as_longlong(double x) { long long u; std::memcpy(&u, &x, 8); return u; }
inline double __longlong_as_double(long long u) { double x; std::memcpy(&x, &u, 8); return x; }

// ---------------------------------------------------------------- runtime API
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
constexpr unsigned cudaStreamDefault = 0;

struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem, sharedMemPerBlock;
  int multiProcessorCount, maxThreadsPerBlock, warpSize;
};

cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
