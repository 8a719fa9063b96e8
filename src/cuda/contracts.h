// contracts — what the GPU backend promises, as one table (ggml's test-backend-ops is the model:
// one case list, every backend). A contract is an operation × shapes × formats × modes × seeds,
// run on the CPU reference path and on the GPU with the same inputs, and compared:
//   bit_exact  every output bit equal (NaNs: both NaN): rounding, quantisation, emulated GEMMs,
//              updates built from + − × ÷ √ only (IEEE-exact on both sides, no contraction);
//   tolerance  |gpu − cpu| ≤ tol · max_j |cpu_j| per value (relative to the case's largest CPU
//              value: a summation-order difference is relative to the terms' magnitude, not to a
//              result that cancelled to near 0), with the reason written down (native cuBLAS
//              GEMMs, another summation order, transcendental functions from other libraries).
// `mantis validate-gpu` runs the table and prints per contract: cases, values, mismatches, worst
// error, seconds; tests/test_cuda.cpp runs the same table. Plain C++ (no CUDA headers): the
// contracts call the host API of cuda.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace mantis {

enum class Agreement : uint8_t { bit_exact, tolerance };

struct ContractTally {
  uint64_t cases = 0;       // (shape, format, mode, seed) combinations run
  uint64_t values = 0;      // output values compared
  uint64_t mismatches = 0;  // values that differ in bits (bit_exact) or beyond the tolerance
  double worst = 0;         // the largest relative difference seen (bit_exact: to the value itself,
                            // tolerance: to the case's largest |cpu|; inf: a NaN against a number)
  std::string first;        // the first mismatches, described (at most 5)
  // Host check (no device): each case of a host_checkable contract passes its setting through the
  // GPU path's validation (InputError otherwise) and returns, computing nothing, so a table entry
  // that could never run fails in CI.
  bool check_only = false;
  // A systematic sample: one case in `every` runs (the others are skipped, not counted). The
  // sanitizer tiers, whose emulated kernels run 10–50× slower, take every 29th, a prime that no
  // loop of the table divides, so the sample walks across shapes, formats and modes; validate-gpu
  // and the release tier run every case (1). A host check takes every case.
  static constexpr uint64_t kSanitizerEvery = 29;
  uint64_t every = 1;
  uint64_t offered = 0;
  bool take() { return check_only || offered++ % every == 0; }

  // One case's outputs, cpu[0..n) against gpu[0..n); `what` names the case.
  template <class T>
  void compare(const std::string& what, const T* cpu, const T* gpu, size_t n, Agreement a, double tol) {
    ++cases;
    values += n;
    double scale = 0;  // tolerance: the case's largest finite |cpu|
    if (a == Agreement::tolerance)
      for (size_t i = 0; i < n; ++i)
        if (std::isfinite(double(cpu[i]))) scale = std::fmax(scale, std::fabs(double(cpu[i])));
    for (size_t i = 0; i < n; ++i) {
      const double c = double(cpu[i]), g = double(gpu[i]);
      const bool both_nan = std::isnan(c) && std::isnan(g);
      double rel = 0;
      if (!both_nan && !(c == g && std::signbit(c) == std::signbit(g)))
        rel = (std::isnan(c) || std::isnan(g) || std::isinf(c) || std::isinf(g))
                  ? (c == g ? 0 : HUGE_VAL)
                  : std::fabs(g - c) / std::fmax(a == Agreement::tolerance ? scale : std::fabs(c), 1e-30);
      bool bad;
      if (a == Agreement::bit_exact) {
        bad = !both_nan && std::memcmp(&cpu[i], &gpu[i], sizeof(T)) != 0;
        if (bad && rel == 0) rel = HUGE_VAL;  // ±0 or another bit pattern of the same value
      } else {
        bad = rel > tol;
      }
      if (rel > worst) worst = rel;
      if (bad) {
        if (++mismatches <= 5)
          first += fmt::format("{}{}: [{}] cpu {:a} gpu {:a}", first.empty() ? "" : "; ", what, i, c, g);
      }
    }
  }
  // Counts (LAMP selections and the like): equal or not.
  void compare_count(const std::string& what, uint64_t cpu, uint64_t gpu) {
    ++cases;
    ++values;
    if (cpu != gpu) {
      worst = HUGE_VAL;
      if (++mismatches <= 5) first += fmt::format("{}{}: cpu {} gpu {}", first.empty() ? "" : "; ", what, cpu, gpu);
    }
  }
};

struct Contract {
  std::string name;    // "round/float", "gemm/strict", …: unique; validate-gpu --only matches a prefix
  Agreement agreement = Agreement::bit_exact;
  double tol = 0;      // tolerance contracts: the largest relative difference allowed per value
  std::string why;     // tolerance contracts: why the two sides may differ
  std::string covers;  // the cases in words: shapes × formats × modes × seeds
  // Runs every case on both sides and tallies them; scale (0, 1] shrinks the sample sizes (tests).
  std::function<void(ContractTally&, double scale)> run;
  // run honours ContractTally::check_only (tests call it so where there is no device).
  bool host_checkable = false;
};

// The whole table, in the order validate-gpu prints it (contracts.cpp; each module of src/cuda
// adds its own through one add_*_contracts function).
const std::vector<Contract>& gpu_contracts();

void add_round_contracts(std::vector<Contract>& t);      // contracts.cpp
void add_gemm_contracts(std::vector<Contract>& t);       // contracts.cpp
void add_optimizer_contracts(std::vector<Contract>& t);  // contracts.cpp
void add_scheme_contracts(std::vector<Contract>& t);     // scheme_contracts.cpp
void add_quant_contracts(std::vector<Contract>& t);      // scheme_contracts.cpp
void add_attention_contracts(std::vector<Contract>& t);  // attention_contracts.cpp
void add_forward_contracts(std::vector<Contract>& t);    // forward_contracts.cpp

}  // namespace mantis
