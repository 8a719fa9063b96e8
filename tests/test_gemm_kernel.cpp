// The register-blocked AVX-512 GEMM kernel (core/gemm_kernel.h) == the portable kernel == MPFR,
// bit for bit: every mode, strict / unfused / blocked, both containers, ragged shapes that do not
// fill a tile, wide-exponent data, subnormal-, overflow- and NaN-producing data (the range guard's
// redo), sums past the largest finite value (overflow without a guard), exact cancellations, the
// constructed hard case of a plain FMA shortcut; 1 thread == 2.
//
// On a CPU without AVX-512 the kernel cannot run: the executable prints "SKIP: …" and exits 77,
// which Meson reports as SKIP (the portable kernel is tested by test_gemm everywhere).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/gemm.h"
#include "core/gemm_kernel.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "core/threads.h"
#include "testutil.h"

using namespace mantis;

namespace {

enum class Data { normal, wide, tiny, huge, special, cancel, top };

// Entries of a test matrix: uniform in (−1, 1), optionally with a wide exponent spread, some
// exact zeros, and per kind a few entries that push products out of the normal range.
std::vector<float> matrix(size_t n, uint64_t seed, Data d) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = random_word(seed, 1, i), e = random_word(seed, 2, i), s = random_word(seed, 3, i);
    double x = (double(r) / 4294967296.0) * 2 - 1;
    if (d != Data::normal && d != Data::cancel) x = std::ldexp(x, int(e % 40) - 20);
    if (s % 17 == 0) x = 0;
    if (s % 97 == 1) {
      if (d == Data::tiny) x = std::ldexp(x, -70);   // products below 2^-126: subnormal in binary32
      if (d == Data::huge) x = std::ldexp(x, 62);    // products near and past 2^127
      if (d == Data::special) x = s % 2 ? INFINITY : NAN;
    }
    if (d == Data::cancel) x = std::round(x * 8) / 8;  // short values: exact sums and cancellations
    if (d == Data::top) x = std::ldexp(x < 0 ? x - 1 : x + 1, 63);  // products 2^126..2^128: sums past the top
    v[i] = float(x);
  }
  return v;
}

const char* name(Data d) {
  static const char* n[] = {"normal", "wide", "tiny", "huge", "special", "cancel", "top"};
  return n[int(d)];
}

// Outputs whose bits differ (NaN bits included: both kernels give the canonical NaN).
size_t mismatches(const std::vector<double>& a, const std::vector<double>& b, std::string& first) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 8) != 0 && bad++ < 3) first += fmt::format(" [{}] {} vs {}", i, test::hex(a[i]), test::hex(b[i]));
  return bad;
}

GemmPlan portable(GemmPlan p) {
  p.kernel = GemmKernel::portable;
  return p;
}

}  // namespace

TEST_CASE("the kernel a spec gets") {
  auto kernel = [](const char* f, Rounding m = Rounding::rne, int sr_bits = 32) {
    GemmSpec s{.acc = format_lookup(f), .acc_mode = m, .sr_bits = sr_bits};
    return fastest_kernel(s);
  };
  CHECK(kernel("ps4") == GemmKernel::avx512_binary32);
  CHECK(kernel("bf16") == GemmKernel::avx512_binary32);
  CHECK(kernel("ps21") == GemmKernel::avx512_binary32);            // p = 22
  CHECK(kernel("ps22") == GemmKernel::avx512_binary64);            // p = 23: too few spare bits in binary32
  CHECK(kernel("fp32") == GemmKernel::avx512_binary64);
  CHECK(kernel("e11m20") == GemmKernel::avx512_binary64);
  CHECK(kernel("ps4", Rounding::sr, 18) == GemmKernel::avx512_binary32);  // sr_bits ≤ 23 − p
  CHECK(kernel("ps4", Rounding::sr, 19) == GemmKernel::avx512_binary64);
  CHECK(kernel("e5m0") == GemmKernel::portable);                   // μ = 0
  GemmSpec fnuz{.acc = format_lookup("e4m3")};
  fnuz.acc.specials = Specials::fnuz;
  CHECK(fastest_kernel(fnuz) == GemmKernel::portable);
  CHECK(plan_gemm(GemmSpec{.acc = format_lookup("ps4")}).kernel == GemmKernel::avx512_binary32);
  // K = 0: every output is the initial accumulator, +0, on both kernels
  const float a = 1, b = 1;
  for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
    const GemmPlan p = plan_gemm(GemmSpec{.acc = format_lookup("ps4"), .acc_mode = Rounding::sr, .accumulation = acc,
                                          .sr_bits = 8});
    std::vector<double> c(15, 1.0), r(15, 1.0);
    gemm(p, &a, &b, c.data(), 3, 5, 0, 0);
    gemm(portable(p), &a, &b, r.data(), 3, 5, 0, 0);
    CHECK(std::memcmp(c.data(), r.data(), c.size() * 8) == 0);
    CHECK(c[0] == 0.0);
    CHECK(!std::signbit(c[14]));
  }
}

TEST_CASE("AVX-512 kernel == portable kernel on ragged shapes, every mode, both containers") {
  const char* formats[] = {"ps4", "bf16", "fp16", "e4m3", "e5m2", "ps13", "ps21", "ps22", "fp32", "e11m20", "ps1"};
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                            Rounding::rd, Rounding::ro, Rounding::sr, Rounding::sre};
  const Data data[] = {Data::normal, Data::wide, Data::tiny, Data::huge, Data::special, Data::cancel, Data::top};
  uint64_t seed = 1;
  size_t cases = 0, kernels[3] = {0, 0, 0}, packed = 0;
  for (int rep = 0; rep < 3; ++rep)
  for (const char* fname : formats)
    for (Rounding m : modes)
      for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc};
        s.block = int(1 + seed % 11);
        s.seed = seed;
        s.stream = seed % 5;
        // sr: alternately the binary32 container's bound and the binary64 one's
        if (m == Rounding::sr) s.sr_bits = seed % 2 ? std::max(1, 23 - s.acc.precision()) : std::min(32, 52 - s.acc.precision());
        // Packed random bits (philox.h sr_word) on every fourth stochastic case: 2 or 4 per word.
        if (is_stochastic(m) && seed % 4 < 2) {
          s.sr_packed = true;
          s.sr_bits = std::min(s.sr_bits, seed % 4 == 0 ? 8 : 16);
        }
        // Shapes around the tiles (4 rows × 64 or 32 binary32 lanes, × 32 or 16 binary64 lanes)
        // and K both ≡ 0 (mod 16) and (mod 4) (one Philox block per 4·2^pack steps) and not.
        const size_t M = 1 + seed % 9, N = 1 + (seed * 7) % 71;
        const size_t K = seed % 3 == 0 ? 4 * (1 + seed % 13) : seed % 3 == 1 && s.sr_packed ? 16 * (1 + seed % 5)
                                                                                         : 1 + (seed * 13) % 53;
        const Data d = data[seed % 7];
        const auto A = matrix(M * K, seed, d), B = matrix(K * N, seed + 1000, d);
        const GemmPlan p = plan_gemm(s);
        std::vector<double> fast(M * N), ref(M * N);
        gemm(p, A.data(), B.data(), fast.data(), M, N, K, s.stream);
        gemm(portable(p), A.data(), B.data(), ref.data(), M, N, K, s.stream);
        std::string first;
        const size_t bad = mismatches(fast, ref, first);
        INFO(fmt::format("{} {} {} {} {}x{}x{} block {} sr_bits {}{} data {}{}", fname, to_string(m), to_string(acc),
                         to_string(p.kernel), M, N, K, s.block, s.sr_bits, s.sr_packed ? " packed" : "", name(d),
                         first));
        CHECK(bad == 0);
        ++kernels[int(p.kernel)];
        packed += s.sr_packed;
        ++cases, ++seed;
      }
  INFO(fmt::format("{} cases: portable {}, binary32 {}, binary64 {}", cases, kernels[0], kernels[1], kernels[2]));
  CHECK(kernels[1] > 300);
  CHECK(kernels[2] > 200);
  CHECK(packed > 80);
}

TEST_CASE("AVX-512 kernel: values past the largest finite one, inf and NaN, where no step is guarded") {
  // ps4 and bf16 end where binary32 does: deterministic modes take no per-step guard there.
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                            Rounding::rd, Rounding::ro, Rounding::sr, Rounding::sre};
  size_t bad = 0, nonfinite = 0, n = 0;
  for (const char* fname : {"ps4", "bf16"})
    for (Rounding m : modes)
      for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked})
        for (uint64_t seed = 0; seed < 6; ++seed) {
          GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc, .block = 3, .sr_bits = 12,
                     .seed = seed};
          const size_t M = 6, N = 70, K = 8 + seed;
          const auto A = matrix(M * K, seed + 40, seed % 3 == 2 ? Data::special : Data::top);
          const auto B = matrix(K * N, seed + 80, Data::top);
          const GemmPlan p = plan_gemm(s);
          std::vector<double> fast(M * N), ref(M * N);
          gemm(p, A.data(), B.data(), fast.data(), M, N, K, 1);
          gemm(portable(p), A.data(), B.data(), ref.data(), M, N, K, 1);
          for (size_t i = 0; i < fast.size(); ++i) {
            bad += std::memcmp(&fast[i], &ref[i], 8) != 0;  // NaN bits included
            nonfinite += !std::isfinite(ref[i]);
          }
          n += fast.size();
        }
  INFO(fmt::format("{} outputs, {} of them inf or NaN", n, nonfinite));
  CHECK(bad == 0);
  CHECK(nonfinite > n / 10);  // the data reach the top
  CHECK(nonfinite < n);       // .. and not only
}

// Under sr the kernel keeps each step's RZ, not RO (gemm_avx512.cpp exact()): they differ where a
// sum lies just past the largest finite value (RZ: that value; RO: one container ulp more) or
// below the container's least subnormal (RZ: ±0). Sums placed there on purpose, every seed.
TEST_CASE("AVX-512 kernel, sr: sums just past the largest finite and below the least subnormal") {
  size_t cases = 0;
  for (const char* fname : {"ps4", "bf16", "fp16", "e5m2", "ps13", "ps22", "fp32"})
    for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked})
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = Rounding::sr, .accumulation = acc, .block = 2,
                   .seed = seed};
        const bool b32 = s.acc.precision() <= 22;  // the container (all these have emin ≥ −126)
        s.sr_bits = std::min(b32 ? 23 - s.acc.precision() : 52 - s.acc.precision(), seed % 2 ? 8 : 32);
        s.sr_packed = seed % 3 == 0 && s.sr_bits <= 8;
        const double top = std::ldexp(2 - std::ldexp(1, -s.acc.mu), s.acc.emax);  // largest finite
        // Rows 0..3 × columns 0..7: the largest finite (less 0..2 of its ulps) then terms of up to
        // half a container ulp of it; rows 4..7 × columns 8..15: products of 2^-150 · (1 .. 2),
        // below binary32's least subnormal (in binary64 they are normal: extra cases there).
        const size_t M = 8, N = 16, K = 6;
        std::vector<float> A(M * K), B(K * N);
        for (size_t k = 0; k < K; ++k)
          for (size_t j = 0; j < N; ++j) B[k * N + j] = j < 8 ? 1.0f : 0x1p-20f;
        for (size_t i = 0; i < M; ++i)
          for (size_t k = 0; k < K; ++k) {
            const uint32_t r = random_word(seed, 7, i * K + k);
            const double sign = i % 2 ? -1 : 1;
            const double x = i >= 4 ? 0x1p-130 * (1 + (r % 8) / 8.0)
                             : k == 0 ? top - std::ldexp(double(i % 3), s.acc.emax - s.acc.mu)
                                      : std::ldexp(top, -(b32 ? 25 : 54)) * (r % 4 + 1) / 4;
            A[i * K + k] = float(sign * x);
          }
        const GemmPlan p = plan_gemm(s);
        std::vector<double> fast(M * N), ref(M * N);
        gemm(p, A.data(), B.data(), fast.data(), M, N, K, 0);
        gemm(portable(p), A.data(), B.data(), ref.data(), M, N, K, 0);
        std::string first;
        INFO(fmt::format("{} {} {} sr_bits {}{}{}", fname, to_string(acc), to_string(p.kernel), s.sr_bits,
                         s.sr_packed ? " packed" : "", first));
        CHECK(mismatches(fast, ref, first) == 0);
        ++cases;
      }
  CHECK(cases == 126);
}

TEST_CASE("AVX-512 kernel == MPFR on tiles and their edges") {
  uint64_t seed = 500;
  for (const char* fname : {"ps4", "bf16", "fp32", "e5m2"})
    for (Rounding m : {Rounding::rne, Rounding::rd, Rounding::sr})
      for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc, .block = 5, .seed = seed};
        if (m == Rounding::sr) s.sr_bits = std::min(16, 23 - s.acc.precision() > 0 ? 23 - s.acc.precision() : 16);
        if (m == Rounding::sr && seed % 2) s.sr_packed = true, s.sr_bits = std::min(s.sr_bits, seed % 4 == 1 ? 8 : 16);
        const size_t M = 5, N = 67, K = seed % 2 ? 32 : 21;
        const Data d = seed % 3 == 0 ? Data::tiny : Data::wide;
        const auto A = matrix(M * K, seed, d), B = matrix(K * N, seed + 7, d);
        std::vector<double> fast(M * N), ref(M * N);
        gemm(plan_gemm(s), A.data(), B.data(), fast.data(), M, N, K, 0);
        oracle_gemm(A.data(), B.data(), ref.data(), M, N, K, s);
        std::string first;
        const size_t bad = mismatches(fast, ref, first);
        INFO(fmt::format("{} {} {} {}{}{}", fname, to_string(m), to_string(acc), to_string(plan_gemm(s).kernel),
                         s.sr_packed ? " packed" : "", first));
        CHECK(bad == 0);
        ++seed;
      }
}

TEST_CASE("the constructed case a plain fma-then-round gets wrong") {
  // acc = 1 after step 0; step 1 adds a·b with a = 0x1.ffc004p-2, b = 0x1.002002p-7. The exact
  // sum rounds to 0x1.02p+0 in bf16; binary64 fma then RNE gives 0x1p+0 (double rounding).
  const float A[2] = {1.0f, 0x1.ffc004p-2f}, B[2] = {1.0f, 0x1.002002p-7f};
  GemmSpec s{.acc = format_lookup("bf16")};
  const GemmPlan p = plan_gemm(s);
  REQUIRE(p.kernel == GemmKernel::avx512_binary32);
  double fast = 0, port = 0, ref = 0;
  gemm(p, A, B, &fast, 1, 1, 2, 0);
  gemm(portable(p), A, B, &port, 1, 1, 2, 0);
  oracle_gemm(A, B, &ref, 1, 1, 2, s);
  CHECK(ref == 0x1.02p+0);
  CHECK(fast == ref);
  CHECK(port == ref);
  const double shortcut = round_value<Rounding::rne>(std::fma(double(A[1]), double(B[1]), 1.0), p.acc);
  CHECK(shortcut == 0x1p+0);  // the shortcut the kernel must not take
  // The same inside a full tile, in every lane.
  const size_t M = 4, N = 64, K = 2;
  std::vector<float> At(M * K), Bt(K * N);
  for (size_t i = 0; i < M; ++i) At[i * K] = A[0], At[i * K + 1] = A[1];
  for (size_t j = 0; j < N; ++j) Bt[j] = B[0], Bt[N + j] = B[1];
  std::vector<double> C(M * N);
  gemm(p, At.data(), Bt.data(), C.data(), M, N, K, 0);
  for (double c : C) CHECK(c == 0x1.02p+0);
}

TEST_CASE("AVX-512 kernel: 1 thread == 2 threads") {
  const size_t M = 37, N = 150, K = 96;
  const auto A = matrix(M * K, 3, Data::wide), B = matrix(K * N, 4, Data::tiny);
  for (const char* fname : {"ps4", "fp32"})
    for (Rounding m : {Rounding::rne, Rounding::sr})
      for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc, .sr_bits = 16, .seed = 9};
        const GemmPlan p = plan_gemm(s);
        std::vector<double> c1(M * N), c2(M * N), ref(M * N);
        set_num_threads(1);
        gemm(p, A.data(), B.data(), c1.data(), M, N, K, 3);
        set_num_threads(2);
        gemm(p, A.data(), B.data(), c2.data(), M, N, K, 3);
        gemm(portable(p), A.data(), B.data(), ref.data(), M, N, K, 3);
        INFO(fmt::format("{} {} {}", fname, to_string(m), to_string(acc)));
        CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * 8) == 0);
        CHECK(std::memcmp(c1.data(), ref.data(), c1.size() * 8) == 0);
      }
  set_num_threads(0);
}

int main(int argc, char** argv) {
  if (!cpu_has_avx512()) {
    std::puts("SKIP: this CPU lacks AVX-512 (F, DQ, BW, VL): the AVX-512 GEMM kernel cannot run here");
    std::fflush(stdout);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
