// The GPU backend against the CPU reference: every contract of the table that `mantis validate-gpu`
// runs (src/cuda/contracts.h: rounding, the emulated GEMMs, quantisation, attention, optimizer
// updates), at the test scale, plus the input errors the CUDA entry points share with the CPU.
//
// Without a CUDA device (CI, most developer machines) only the [host] cases run (the table is well
// formed); then the executable prints "SKIP: no CUDA device" and exits 77, which Meson reports as
// SKIP.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <set>
#include <vector>

#include "cuda/contracts.h"
#include "cuda/cuda.h"
#include "core/gemm.h"
#include "core/round_array.h"
#include "mantis_config.h"
#include "testutil.h"

using namespace mantis;
using namespace mantis::test;

TEST_CASE("the contract table is well formed", "[host]") {
  std::set<std::string> names;
  for (const Contract& c : gpu_contracts()) {
    INFO(c.name);
    CHECK(names.insert(c.name).second);  // unique: --only and the report key on it
    CHECK(!c.covers.empty());
    CHECK(bool(c.run));
    if (c.agreement == Agreement::tolerance) {
      CHECK(c.tol > 0);
      CHECK(!c.why.empty());  // every tolerance says why the two sides may differ
    }
  }
  CHECK(names.size() >= 9);
}

TEST_CASE("every contract's settings pass the GPU path's validation", "[host]") {
  for (const Contract& c : gpu_contracts())
    if (c.host_checkable) {
      INFO(c.name);
      ContractTally t;
      t.check_only = true;
      CHECK_NOTHROW(c.run(t, 1.0));
    }
}

TEST_CASE("ContractTally compares bits, NaNs and tolerances", "[host]") {
  const float cpu[] = {1.0f, 0.0f, NAN, 2.0f}, gpu[] = {1.0f, -0.0f, NAN, 2.0000002f};
  ContractTally t;
  t.compare("x", cpu, gpu, 4, Agreement::bit_exact, 0);
  CHECK(t.mismatches == 2);  // −0 against +0, and one ulp
  CHECK(t.values == 4);
  ContractTally u;
  u.compare("x", cpu + 3, gpu + 3, 1, Agreement::tolerance, 1e-6);
  CHECK(u.mismatches == 0);
  CHECK(u.worst > 0);
  ContractTally w;
  w.compare_count("c", 3, 4);
  CHECK(w.mismatches == 1);
}

TEST_CASE("every GPU contract holds", "[cuda]") {
  // cuda-emu runs each CUDA thread as a fiber: a smaller sample keeps the suite in minutes there;
  // under the sanitizers (MANTIS_TEST_SCALE < 1) every 29th case of each contract too.
  const double sc = std::min(1.0, (MANTIS_CUDA_EMU ? 0.02 : 0.25) * scale());
  for (const Contract& c : gpu_contracts()) {
    DYNAMIC_SECTION(c.name) {
      ContractTally t;
      t.every = MANTIS_CUDA_EMU && scale() < 1 ? ContractTally::kSanitizerEvery : 1;
      c.run(t, sc);
      INFO(fmt::format("{}: {} cases, {} values, {} mismatches, worst {}: {}", c.name, t.cases, t.values, t.mismatches,
                       t.worst, t.first));
      CHECK(t.cases > 0);
      CHECK(t.mismatches == 0);
    }
  }
}

TEST_CASE("cuda_round_array rejects what the CPU path rejects", "[cuda][round]") {
  std::vector<float> x(4, 1.0f), y(4);
  std::vector<double> xd(4, 1.0), yd(4);
  RoundOptions o;
  CHECK_THROWS_AS(cuda_round_array(x.data(), y.data(), 4, format_lookup("fp64"), o), InputError);
  o.sr_bits = 0;
  CHECK_THROWS_AS(cuda_round_array(xd.data(), yd.data(), 4, format_lookup("bf16"), o), InputError);
  o.sr_bits = 33;
  CHECK_THROWS_AS(cuda_round_array(x.data(), y.data(), 4, format_lookup("bf16"), o), InputError);
}

TEST_CASE("cuda_gemm rejects what gemm rejects", "[cuda][gemm]") {
  std::vector<float> A(4, 1.0f), B(4, 1.0f);
  std::vector<double> C(4);
  GemmSpec s;
  s.acc = format_lookup("fp64");  // μ = 52 > 50
  CHECK_THROWS_AS(cuda_gemm(A.data(), B.data(), C.data(), 2, 2, 1, s), InputError);
  s.acc = format_lookup("fp32");
  s.acc_mode = Rounding::sr;
  s.sr_bits = 32;  // > 52 − 24
  CHECK_THROWS_AS(cuda_gemm(A.data(), B.data(), C.data(), 2, 2, 1, s), InputError);
  s.acc_mode = Rounding::rne;
  s.accumulation = Accumulation::blocked;
  s.block = 0;
  CHECK_THROWS_AS(cuda_gemm(A.data(), B.data(), C.data(), 2, 2, 1, s), InputError);
}

int main(int argc, char** argv) {
  if (!cuda_device_available()) {
    Catch::Session session;
    session.configData().testsOrTags = {"[host]"};
    if (const int rc = session.run(argc, argv)) return rc;
    std::puts("SKIP: no CUDA device (the [cuda] cases did not run)");
    std::fflush(stdout);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
