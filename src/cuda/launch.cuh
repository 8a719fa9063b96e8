// launch — every kernel launch of src/cuda goes through here: kernel<<<grid, block, shared,
// stream>>>(args…) under nvcc; in the emulated build (MANTIS_CUDA_EMU) the same kernel runs on
// cuda-emu (cuda_emu/emu.h), once per emulated CUDA thread. `name` names the kernel in the
// emulator's reports. Launch errors: cudaGetLastError after, as with <<<…>>>.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "mantis_config.h"
#if MANTIS_CUDA_EMU
#include "cuda_emu/emu.h"
#endif

namespace mantis::cuda_detail {

template <class... P>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t s,
            std::type_identity_t<P>... args) {
#if MANTIS_CUDA_EMU
  cuda_emu::launch(name, grid, block, shared, s, [=] { kernel(args...); });
#else
  (void)name;
  kernel<<<grid, block, shared, s>>>(args...);
#endif
}

}  // namespace mantis::cuda_detail

// Defects that tests/test_cuda_emu.cpp plants in the kernels, to show that cuda-emu reports each
// (cuda_emu::planted, set by that test only). Under nvcc MANTIS_PLANTED is false: no switch exists.
namespace mantis::cuda_detail {
enum : unsigned {
  kPlantFlashBarrier = 1,   // attention_flash: the barrier after a tile's scores left out (a race)
  kPlantTileBound = 2,      // gemm_tiled_kernel: its output store bound j ≤ N (out of bounds)
  kPlantShuffleMask = 4,    // scheme.cu group_merge: a shuffle with half the warp in its mask
  kPlantBranchBarrier = 8,  // gemm_tiled_kernel: its first barrier taken by half the block (deadlock)
  kPlantWorkspace = 16,     // site.cu: the GEMM's accumulator workspace one element short
};
}  // namespace mantis::cuda_detail
#if MANTIS_CUDA_EMU
#define MANTIS_PLANTED(d) ((::cuda_emu::planted & (d)) != 0)
#else
#define MANTIS_PLANTED(d) false
#endif

// `extern __shared__ T name[]`, the launch's dynamic shared memory.
#if MANTIS_CUDA_EMU
#define MANTIS_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::cuda_emu::dynamic_shared())
#else
#define MANTIS_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif
