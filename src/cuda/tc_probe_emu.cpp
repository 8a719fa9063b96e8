// cuda_tensor_core_probe (cuda/cuda.h) in the cuda-emu build (tc_probe.cu's stand-in): the emulator has no tensor cores, so no probe
// instruction exists here — the answer a GPU without the instruction gives (empty). The matrix-unit
// models (core/matrix_unit.h) are what stands in for them on the CPU; validate-gpu and the probe
// command say the device is cuda-emu.
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda.h"

namespace mantis {

std::vector<float> cuda_tensor_core_probe(const std::string& input, const std::string&, const std::vector<float>& a,
                                          const std::vector<float>& b, const std::vector<float>& c, int K) {
  const bool fp8 = input == "e4m3" || input == "e5m2";
  const int kmax = fp8 ? 32 : input == "tf32" ? 8 : 16;
  const size_t n = c.size();
  if (n == 0 || K < 1 || K > kmax || a.size() != n * size_t(K) || b.size() != n * size_t(K))
    throw std::invalid_argument("cuda_tensor_core_probe: " + input + " takes 1.." + std::to_string(kmax) +
                                " products per test and a, b of n·K values");
  return {};
}

}  // namespace mantis
