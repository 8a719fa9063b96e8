// cuda-emu (src/cuda_emu/emu.h): its execution model on kernels written here, and the five defects
// that cuda/launch.cuh can plant in the project's own kernels, each reported. Built only where the
// CUDA backend runs on the emulator.
//
// A planted defect runs in a child process (this executable with --plant NAME): under the
// sanitizer tiers the report ends that process (AddressSanitizer aborts; ThreadSanitizer fails its
// exit code), and the parent asserts on what the child printed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sys/wait.h>
#include <unistd.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/contracts.h"
#include "cuda/launch.cuh"
#include "cuda_emu/emu.h"

using mantis::cuda_detail::launch;

namespace {

// cudaError_t → "" or the error with the emulator's description, clearing a sticky one.
std::string sync_error() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return "";
  const std::string s = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  cuda_emu::clear_error();
  return s;
}

template <class T>
T* device(size_t n) {
  T* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return p;
}
template <class T>
std::vector<T> host(const T* d, size_t n) {
  std::vector<T> v(n);
  REQUIRE(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}

// Every order the emulator offers, restored afterwards.
struct WithOrder {
  cuda_emu::Options saved = cuda_emu::options();
  WithOrder(cuda_emu::Order o, uint64_t seed = 0) { cuda_emu::options().order = o, cuda_emu::options().seed = seed; }
  ~WithOrder() { cuda_emu::options() = saved; }
};
const cuda_emu::Order kOrders[] = {cuda_emu::Order::forward, cuda_emu::Order::reverse, cuda_emu::Order::shuffle};

// ---------------------------------------------------------------- kernels
__global__ void ids_kernel(unsigned* out) {
  const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned per = blockDim.x * blockDim.y * blockDim.z;
  out[b * per + t] += b * per + t + 1;  // each element written by exactly one thread
}

// s[t] = x[t]; barrier; y[t] = s[n − 1 − t]: right only if the barrier orders the block.
template <bool kBarrier>
__global__ void reverse_kernel(const float* x, float* y) {
  __shared__ float s[128];
  const unsigned t = threadIdx.x, n = blockDim.x;
  s[t] = x[blockIdx.x * n + t];
  if (kBarrier) __syncthreads();
  y[blockIdx.x * n + t] = s[n - 1 - t];
}

__global__ void warp_sum_kernel(const int* x, int* y, unsigned mask) {
  int v = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  y[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void branch_barrier_kernel(float* x) {
  if (threadIdx.x < 16) __syncthreads();
  x[threadIdx.x] = 1.0f;
}

__global__ void early_exit_kernel(float* x) {
  if (threadIdx.x >= 8) return;
  __syncthreads();
  x[threadIdx.x] = 1.0f;
}

__global__ void write_past_kernel(float* x, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) x[i] = 2.0f;  // one past the end
}

__global__ void count_kernel(unsigned long long* c) { atomicAdd(c, 1ull); }

__global__ void dynamic_kernel(unsigned* out) {
  MANTIS_DYNAMIC_SHARED(unsigned, s);
  if (threadIdx.x == 0) out[0] = s[0];  // read before any write: the emulator's fill
  __syncthreads();
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[1 + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

__global__ void scale_kernel(float* x, unsigned n, float a) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) x[i] *= a;
}

}  // namespace

TEST_CASE("cuda-emu: every thread of every block runs once, with its indices") {
  for (cuda_emu::Order o : kOrders) {
    WithOrder w(o, 3);
    const dim3 grid(3, 2, 2), block(4, 3, 2);
    const size_t n = 12 * 24;
    unsigned* d = device<unsigned>(n);
    REQUIRE(cudaMemset(d, 0, n * sizeof(unsigned)) == cudaSuccess);
    launch("ids_kernel", ids_kernel, grid, block, 0, nullptr, d);
    CHECK(cudaGetLastError() == cudaSuccess);
    const auto v = host(d, n);
    for (size_t i = 0; i < n; ++i) CHECK(v[i] == i + 1);
    CHECK(cudaFree(d) == cudaSuccess);
  }
}

TEST_CASE("cuda-emu: __syncthreads orders shared memory; without it the orders disagree") {
  const unsigned n = 128, blocks = 3;
  std::vector<float> x(n * blocks);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  float *dx = device<float>(x.size()), *dy = device<float>(x.size());
  REQUIRE(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  std::set<std::vector<float>> without;
  for (cuda_emu::Order o : kOrders) {
    WithOrder w(o, 7);
    launch("reverse_kernel", reverse_kernel<true>, blocks, n, 0, nullptr, dx, dy);
    const auto y = host(dy, x.size());
    for (unsigned b = 0; b < blocks; ++b)
      for (unsigned t = 0; t < n; ++t) CHECK(y[b * n + t] == x[b * n + n - 1 - t]);
#if !defined(__SANITIZE_THREAD__)  // there the race is reported (the flash-barrier plant shows it)
    launch("reverse_kernel", reverse_kernel<false>, blocks, n, 0, nullptr, dx, dy);
    without.insert(host(dy, x.size()));
#endif
  }
#if !defined(__SANITIZE_THREAD__)
  CHECK(without.size() > 1);  // the missing barrier shows as results that depend on the order
#endif
  cudaFree(dx), cudaFree(dy);
}

TEST_CASE("cuda-emu: warp shuffles exchange within the mask; a wrong mask is reported") {
  const unsigned n = 64;
  std::vector<int> x(n);
  for (unsigned i = 0; i < n; ++i) x[i] = int(i * i % 97);
  int *dx = device<int>(n), *dy = device<int>(n);
  REQUIRE(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  launch("warp_sum_kernel", warp_sum_kernel, 1, n, 0, nullptr, dx, dy, 0xffffffffu);
  const auto y = host(dy, n);
  for (unsigned w = 0; w < 2; ++w) {
    int s = 0;
    for (unsigned l = 0; l < 32; ++l) s += x[w * 32 + l];
    for (unsigned l = 0; l < 32; ++l) CHECK(y[w * 32 + l] == s);
  }
  launch("warp_sum_kernel", warp_sum_kernel, 1, n, 0, nullptr, dx, dy, 0x0000ffffu);
  const std::string e = sync_error();
  CHECK(e.find("warp_sum_kernel") != std::string::npos);
  CHECK(e.find("leaves out the calling lane") != std::string::npos);
  cudaFree(dx), cudaFree(dy);
}

TEST_CASE("cuda-emu: a barrier not every thread reaches is a reported deadlock, not a hang") {
  float* d = device<float>(32);
  launch("branch_barrier_kernel", branch_barrier_kernel, 1, 32, 0, nullptr, d);
  std::string e = sync_error();
  CHECK(e.find("branch_barrier_kernel") != std::string::npos);
  CHECK(e.find("__syncthreads") != std::string::npos);
  launch("early_exit_kernel", early_exit_kernel, 2, 32, 0, nullptr, d);
  e = sync_error();
  CHECK(e.find("early_exit_kernel") != std::string::npos);
  CHECK(e.find("not reached by every thread") != std::string::npos);
  // the error was sticky until cleared: now the device works again
  launch("scale_kernel", scale_kernel, 1, 32, 0, nullptr, d, 32u, 2.0f);
  CHECK(sync_error().empty());
  cudaFree(d);
}

TEST_CASE("cuda-emu: device memory is checked: writes past an allocation, copies outside one") {
  float* d = device<float>(100);
  launch("write_past_kernel", write_past_kernel, 1, 128, 0, nullptr, d, 100u);
  const std::string e = sync_error();
  CHECK(e.find("write_past_kernel") != std::string::npos);
  CHECK(e.find("past the end of the device allocation of 400 bytes") != std::string::npos);
  std::vector<float> h(101);
  CHECK(cudaMemcpy(h.data(), d, 101 * 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h.data(), 100 * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaFree(h.data()) == cudaErrorInvalidValue);  // not a device allocation
  (void)cudaGetLastError();
  // fresh memory reads as 0xFF bytes: a NaN, never a plausible zero
  float* f = device<float>(4);
  CHECK(std::isnan(host(f, 4)[3]));
  cudaFree(d), cudaFree(f);
}

TEST_CASE("cuda-emu: atomics across concurrent blocks; dynamic shared memory; stream order") {
  unsigned long long* c = device<unsigned long long>(1);
  REQUIRE(cudaMemset(c, 0, 8) == cudaSuccess);
  launch("count_kernel", count_kernel, 37, 96, 0, nullptr, c);
  CHECK(host(c, 1)[0] == 37ull * 96);
  unsigned* o = device<unsigned>(65);
  launch("dynamic_kernel", dynamic_kernel, 1, 64, 64 * sizeof(unsigned), nullptr, o);
  const auto v = host(o, 65);
  CHECK(v[0] == 0xFFFFFFFFu);
  for (unsigned t = 0; t < 64; ++t) CHECK(v[1 + t] == 63 - t);
  // queued work runs in order: copy in, scale twice, copy out
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamDefault) == cudaSuccess);
  std::vector<float> x(1000, 1.5f), y(1000);
  float* d = device<float>(1000);
  CHECK(cudaMemcpyAsync(d, x.data(), 4000, cudaMemcpyHostToDevice, s) == cudaSuccess);
  launch("scale_kernel", scale_kernel, 2, 128, 0, s, d, 1000u, 2.0f);
  launch("scale_kernel", scale_kernel, 2, 128, 0, s, d, 1000u, -1.0f);
  CHECK(cudaMemcpyAsync(y.data(), d, 4000, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  for (float a : y) CHECK(a == -3.0f);
  // a bad configuration is a launch error at once
  launch("scale_kernel", scale_kernel, 1, 2048, 0, s, d, 1000u, 1.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  cudaStreamDestroy(s);
  cudaFree(c), cudaFree(o), cudaFree(d);
}

// ---------------------------------------------------------------- the planted defects
namespace {

struct Plant {
  const char* name;
  unsigned bit;
  const char* contracts;  // the prefix of the contracts that run the kernel
  std::vector<std::string> expect;  // the child's output holds one of these
};

const std::vector<Plant>& plants() {
  static const std::vector<Plant> p = {
#if defined(__SANITIZE_THREAD__)
      // ThreadSanitizer's own find; the other four are the emulator's (and AddressSanitizer's), shown
      // by the other builds
      {"flash-barrier", mantis::cuda_detail::kPlantFlashBarrier, "attention/flash", {"ThreadSanitizer: data race"}},
  };
#else
      {"flash-barrier", mantis::cuda_detail::kPlantFlashBarrier, "attention/flash", {"mismatch"}},
      {"tile-bound", mantis::cuda_detail::kPlantTileBound, "gemm/strict",
       {"past the end of the device allocation", "AddressSanitizer: heap-buffer-overflow"}},
      {"shuffle-mask", mantis::cuda_detail::kPlantShuffleMask, "scheme/float", {"leaves out the calling lane"}},
      {"branch-barrier", mantis::cuda_detail::kPlantBranchBarrier, "gemm/strict",
       {"a barrier in code that not every thread runs alike", "not reached by every thread"}},
      {"workspace", mantis::cuda_detail::kPlantWorkspace, "site/emulated",
       {"past the end of the device allocation", "AddressSanitizer: heap-buffer-overflow"}},
  };
#endif
  return p;
}

// The child: the contracts under `prefix` with the defect planted (none: the control run). Prints
// what went wrong; exits 0 when every case held.
int run_plant(const std::string& name) {
  const Plant* plant = nullptr;
  for (const Plant& p : plants())
    if (name == p.name || name == std::string("none:") + p.name) plant = &p;
  if (!plant) {
    std::fprintf(stderr, "--plant %s: unknown\n", name.c_str());
    return 2;
  }
  cuda_emu::planted = name.rfind("none:", 0) == 0 ? 0 : plant->bit;
  // The sanitizer tiers (MANTIS_TEST_SCALE < 1) run the systematic sample test_cuda runs there.
  const char* test_scale = std::getenv("MANTIS_TEST_SCALE");
  const bool sample = test_scale && std::atof(test_scale) < 1;
  int bad = 0;
  for (const mantis::Contract& c : mantis::gpu_contracts()) {
    if (c.name.rfind(plant->contracts, 0) != 0) continue;
    mantis::ContractTally t;
    t.every = sample ? mantis::ContractTally::kSanitizerEvery : 1;
    try {
      c.run(t, 0.01);
    } catch (const std::exception& e) {
      std::printf("%s: error: %s\n", c.name.c_str(), e.what());
      return 3;
    }
    std::printf("%s: %llu cases, %llu mismatches %s\n", c.name.c_str(), (unsigned long long)t.cases,
                (unsigned long long)t.mismatches, t.first.c_str());
    if (t.mismatches) std::printf("mismatch\n"), bad = 4;
  }
  return bad;
}

// This executable run with --plant NAME: (exit status, stdout + stderr).
std::pair<int, std::string> child(const std::string& name) {
  std::string exe(4096, '\0');
  const ssize_t len = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  REQUIRE(len > 0);
  exe.resize(size_t(len));
  FILE* f = popen((exe + " --plant " + name + " 2>&1").c_str(), "r");
  REQUIRE(f);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

}  // namespace

TEST_CASE("cuda-emu reports each defect planted in the project's kernels, and not without it") {
  for (const Plant& p : plants()) {
    DYNAMIC_SECTION(p.name) {
      const auto [ok_rc, ok_out] = child(std::string("none:") + p.name);
      INFO("control run:\n" << ok_out);
      CHECK(ok_rc == 0);
      const auto [rc, out] = child(p.name);
      INFO("planted run:\n" << out);
      CHECK(rc != 0);
      bool found = false;
      for (const std::string& e : p.expect) found |= out.find(e) != std::string::npos;
      CHECK(found);
    }
  }
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--plant") return run_plant(argv[2]);
  return Catch::Session().run(argc, argv);
}
