// Emulated dot/GEMM == MPFR reference GEMM bit for bit; thread invariance; semantics checks.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/gemm.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "testutil.h"

using namespace mantis;

namespace {

std::vector<float> random_matrix(size_t n, uint64_t seed, bool wide) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = random_word(seed, 1, i), e = random_word(seed, 2, i);
    double x = (double(r) / 4294967296.0) * 2 - 1;
    if (wide) x = std::ldexp(x, int(e % 40) - 20);  // large dynamic range: cancellations, underflow
    v[i] = float(x);
  }
  return v;
}

void check(const GemmSpec& s, size_t M, size_t N, size_t K, uint64_t seed, bool wide) {
  const auto A = random_matrix(M * K, seed, wide), B = random_matrix(K * N, seed + 100, wide);
  std::vector<double> fast(M * N), ref(M * N);
  gemm(A.data(), B.data(), fast.data(), M, N, K, s);
  oracle_gemm(A.data(), B.data(), ref.data(), M, N, K, s);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < M * N; ++i)
    if (!test::same(fast[i], ref[i])) {
      if (bad++ < 3) first += fmt::format(" [{}] fast={} mpfr={}", i, test::hex(fast[i]), test::hex(ref[i]));
    }
  INFO(fmt::format("{} {} {} {}x{}x{} block {} input {} sr_bits {}{}{}", s.acc.name, to_string(s.acc_mode),
                   to_string(s.accumulation), M, N, K, s.block, s.input ? s.input->name : "-", s.sr_bits,
                   s.sr_packed ? " packed" : "", first));
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("strict, unfused and blocked GEMM == MPFR reference on random shapes") {
  const char* formats[] = {"ps4", "bf16", "fp16", "e4m3", "ps13", "fp32", "e5m2", "e11m20", "p3109_p4", "fp6_e3m2",
                           "e4m3fnuz", "int8tc"};
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                            Rounding::rd, Rounding::ro, Rounding::sr, Rounding::sre};
  uint64_t seed = 1;
  for (const char* fname : formats)
    for (Rounding m : modes)
      for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc};
        s.block = int(1 + seed % 9);
        s.seed = seed;
        if (m == Rounding::sr) s.sr_bits = std::min(32, 52 - s.acc.precision());
        // packed random bits (philox.h sr_word) on two of every three stochastic cases
        if (is_stochastic(m) && seed % 3 != 0) s.sr_packed = true, s.sr_bits = std::min(s.sr_bits, seed % 3 == 1 ? 8 : 16);
        const size_t M = 1 + seed % 5, N = 1 + (seed * 7) % 13, K = 1 + (seed * 13) % 70;
        check(s, M, N, K, seed, seed % 2 == 0);
        ++seed;
      }
}

TEST_CASE("promoted and tensor-core accumulation == MPFR reference (every mode, ragged blocks, wide data)") {
  const Rounding modes[] = {Rounding::rne, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::ro, Rounding::sr,
                            Rounding::sre};
  uint64_t seed = 300;
  for (const char* fname : {"ps13", "bf16", "fp32", "fp16", "e5m2"})
    for (Rounding m : modes)
      for (Accumulation acc : {Accumulation::promoted, Accumulation::tensor_core}) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc};
        s.block = int(1 + seed % 9) * (acc == Accumulation::promoted ? 3 : 1);
        s.align_bits = int(8 + seed % 17);
        s.seed = seed;
        if (m == Rounding::sr) s.sr_bits = std::min(32, 52 - s.acc.precision());
        if (is_stochastic(m) && seed % 3 != 0) s.sr_packed = true, s.sr_bits = std::min(s.sr_bits, seed % 3 == 1 ? 8 : 16);
        const size_t M = 1 + seed % 4, N = 1 + (seed * 7) % 11, K = 1 + (seed * 13) % 90;
        check(s, M, N, K, seed, seed % 2 == 0);
        ++seed;
      }
  for (const TensorCorePreset& p : tensor_core_presets()) {
    GemmSpec s{.acc = format_lookup(p.accumulator), .acc_mode = p.mode, .accumulation = Accumulation::tensor_core};
    s.block = p.block, s.align_bits = p.align_bits;
    check(s, 3, 7, 200, 5, true);
  }
  // the model on a hand-made block: 1 + 2^-30 + 2^-30 with F = 24 truncates both small terms away
  std::vector<float> a = {1.0f, 0x1p-30f, 0x1p-30f}, b = {1.0f, 1.0f, 1.0f};
  GemmSpec tc{.acc = format_lookup("fp32"), .acc_mode = Rounding::rz, .accumulation = Accumulation::tensor_core};
  tc.block = 4, tc.align_bits = 24;
  CHECK(dot(a.data(), b.data(), 3, tc) == 1.0);
  tc.align_bits = 30;  // kept
  CHECK(dot(a.data(), b.data(), 3, tc) == 1.0);  // 1 + 2^-29 rounded toward zero in binary32: 1
  tc.acc = format_lookup("e11m40");
  CHECK_THROWS_WITH(validate(tc), Catch::Contains("2^1000"));  // an accumulator reaching 2^1023: no exact binary64 sum
  tc.acc = format_lookup("e11m40");
  tc.acc.emax = 900;
  CHECK(dot(a.data(), b.data(), 3, tc) == 1.0 + 0x1p-29);
  // promoted: chunks of 2 in ps4, promoted into binary32
  GemmSpec pr{.acc = format_lookup("ps4"), .acc_mode = Rounding::rne, .accumulation = Accumulation::promoted};
  pr.block = 2;
  std::vector<float> x = {1.0f, 0.0625f, 1.0f, 0.0625f}, y = {1.0f, 1.0f, 1.0f, 1.0f};
  CHECK(dot(x.data(), y.data(), 4, pr) == 2.125);  // each chunk 1.0625 is exact in ps4; 2.125 in binary32
  GemmSpec bad = tc;
  bad.align_bits = 50, bad.block = 32;
  CHECK_THROWS_AS(validate(bad), InputError);
  // At and past every edge, without overflow (issue 32: align_bits = 2^31 − 7 overflowed the bound
  // check, passed, and the GEMM returned inf). Block 32: F + 1 + 6 ≤ 53, F ≤ 46.
  bad.block = 32;
  for (int f : {47, 53, 1 << 30, std::numeric_limits<int>::max() - 6, std::numeric_limits<int>::max(), -1,
                std::numeric_limits<int>::min()}) {
    bad.align_bits = f;
    CHECK_THROWS_WITH(validate(bad), Catch::Contains(fmt::format("tensor_core: align_bits = {} with a block of 32", f)));
  }
  bad.align_bits = 46;
  CHECK_NOTHROW(validate(bad));
  bad.block = kGemmMaxBlock, bad.align_bits = 21;  // ⌈log2(2^30 + 1)⌉ = 31: F ≤ 21
  CHECK_NOTHROW(validate(bad));
  bad.align_bits = 22;
  CHECK_THROWS_AS(validate(bad), InputError);
  // block ≥ 1 under every accumulation: strict and unfused ignore it, but block = 0 reached a chunk
  // count's division (SIGFPE in `mantis dot --block 0`, issue 32)
  for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked, Accumulation::promoted,
                           Accumulation::tensor_core})
    for (int b : {0, -1, std::numeric_limits<int>::min(), kGemmMaxBlock + 1, std::numeric_limits<int>::max()}) {
      GemmSpec z{.acc = format_lookup("bf16"), .accumulation = acc};
      z.block = b;
      CHECK_THROWS_WITH(validate(z), fmt::format("block = {} is outside 1..1073741824 (k_b of blocked, promoted and "
                                                 "tensor_core accumulation)", b));
    }
}

TEST_CASE("input-format rounding before the product") {
  GemmSpec s{.acc = format_lookup("fp32"), .acc_mode = Rounding::rne};
  for (const char* in : {"e4m3", "bf16", "e5m2", "fp4_e2m1", "p3109_p3", "int4"})
    for (Rounding im : {Rounding::rne, Rounding::sr}) {
      s.input = format_lookup(in);
      s.input_mode = im;
      s.sr_bits = 20;
      check(s, 3, 17, 40, 77, true);
    }
  // packed random bits for the operands, with and without a stochastic accumulator
  for (Rounding am : {Rounding::rne, Rounding::sr}) {
    s.input = format_lookup("e4m3");
    s.input_mode = Rounding::sr;
    s.acc_mode = am;
    s.sr_packed = true;
    for (int bits : {8, 16}) {
      s.sr_bits = bits;
      check(s, 3, 17, 40, 78, true);
    }
  }
  s.input_mode = Rounding::rne;
  s.acc_mode = Rounding::rne;
  CHECK_THROWS_WITH(validate(s), Catch::Contains("sr_packed is for stochastic rounding"));
  s.acc_mode = Rounding::sr;
  s.sr_bits = 20;
  CHECK_THROWS_WITH(validate(s), Catch::Contains("sr_bits = 20 does not fit"));
}

TEST_CASE("1 thread == 2 threads; dot == 1x1 GEMM") {
  const size_t M = 64, N = 48, K = 300;
  const auto A = random_matrix(M * K, 5, false), B = random_matrix(K * N, 6, false);
  for (Rounding m : {Rounding::rne, Rounding::sr}) {
    GemmSpec s{.acc = format_lookup("ps4"), .acc_mode = m, .seed = 9};
    std::vector<double> c1(M * N), c2(M * N);
    set_num_threads(1);
    gemm(A.data(), B.data(), c1.data(), M, N, K, s);
    set_num_threads(2);
    gemm(A.data(), B.data(), c2.data(), M, N, K, s);
    CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * 8) == 0);
  }
  GemmSpec s{.acc = format_lookup("bf16")};
  std::vector<float> x(A.begin(), A.begin() + K), y(K);
  for (size_t k = 0; k < K; ++k) y[k] = B[k * N];  // column 0 of B
  double c[N];
  std::vector<double> row(N);
  gemm(x.data(), B.data(), row.data(), 1, N, K, s);
  CHECK(test::same(dot(x.data(), y.data(), K, s), row[0]));
  (void)c;
}

TEST_CASE("accumulation semantics: strict ps23 differs from native float only by fusion") {
  // strict with a binary32-shaped accumulator is exactly a chain of fmaf in order.
  const size_t K = 1000;
  const auto x = random_matrix(K, 11, true), y = random_matrix(K, 12, true);
  float acc = 0;
  for (size_t k = 0; k < K; ++k) acc = std::fma(x[k], y[k], acc);
  GemmSpec s{.acc = format_lookup("ps23")};
  CHECK(dot(x.data(), y.data(), K, s) == double(acc));
  // unfused ps23 is the plain float loop with separate rounding of the product
  float acc2 = 0;
  for (size_t k = 0; k < K; ++k) {
    const float p = x[k] * y[k];
    acc2 = acc2 + p;
  }
  s.accumulation = Accumulation::unfused;
  CHECK(dot(x.data(), y.data(), K, s) == double(acc2));
  // blocked with a block covering everything is one fp32 chunk then one rounding into ps23
  s.accumulation = Accumulation::blocked;
  s.block = int(K);
  CHECK(dot(x.data(), y.data(), K, s) == double(acc));
}

TEST_CASE("gemm validation names the problem") {
  GemmSpec s{.acc = format_lookup("fp64")};
  const float a = 1, b = 1;
  double c;
  CHECK_THROWS_WITH(gemm(&a, &b, &c, 1, 1, 1, s), Catch::Contains("fp64"));
  s.acc = format_lookup("fp32");
  s.acc_mode = Rounding::sr;
  s.sr_bits = 32;
  CHECK_THROWS_WITH(gemm(&a, &b, &c, 1, 1, 1, s), Catch::Contains("sr_bits"));
  s.acc_mode = Rounding::rne;
  s.accumulation = Accumulation::blocked;
  s.block = 0;
  CHECK_THROWS_AS(gemm(&a, &b, &c, 1, 1, 1, s), InputError);
  s.block = 4;
  s.input = format_lookup("fp64");
  CHECK_THROWS_WITH(gemm(&a, &b, &c, 1, 1, 1, s), Catch::Contains("input format"));
  float cf;
  GemmSpec w{.acc = format_lookup("e11m20")};
  CHECK_THROWS_AS(gemm(&a, &b, &cf, 1, 1, 1, w), InputError);
  CHECK_THROWS_AS(accumulation_from_string("kahan"), InputError);
}

TEST_CASE("a GemmPlan gives the bits of its GemmSpec") {
  const char* formats[] = {"ps4", "bf16", "e4m3", "fp32", "e11m20"};
  const Rounding modes[] = {Rounding::rne, Rounding::ru, Rounding::ro, Rounding::sr, Rounding::sre};
  uint64_t seed = 3;
  for (const char* fname : formats)
    for (Rounding m : modes)
      for (Accumulation acc : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        GemmSpec s{.acc = format_lookup(fname), .acc_mode = m, .accumulation = acc};
        s.block = int(1 + seed % 7);
        s.seed = seed;
        s.stream = 5 + seed % 3;
        if (m == Rounding::sr) s.sr_bits = std::min(20, 52 - s.acc.precision());
        if (seed % 3 == 0) s.input = format_lookup(seed % 2 ? "e5m2" : "bf16"), s.input_mode = m;
        const size_t M = 1 + seed % 4, N = 1 + (seed * 5) % 11, K = 1 + (seed * 11) % 50;
        const auto A = random_matrix(M * K, seed, seed % 2 == 0), B = random_matrix(K * N, seed + 50, false);
        const GemmPlan p = plan_gemm(s);
        std::vector<double> c_spec(M * N), c_plan(M * N);
        gemm(A.data(), B.data(), c_spec.data(), M, N, K, s);
        gemm(p, A.data(), B.data(), c_plan.data(), M, N, K, s.stream);
        INFO(fmt::format("{} {} {} seed {}", fname, to_string(m), to_string(acc), seed));
        CHECK(std::memcmp(c_spec.data(), c_plan.data(), c_spec.size() * 8) == 0);
        CHECK(p.acc_fits_float == fits_float(s.acc));
        if (p.acc_fits_float) {
          std::vector<float> f_spec(M * N), f_plan(M * N);
          gemm(A.data(), B.data(), f_spec.data(), M, N, K, s);
          gemm(p, A.data(), B.data(), f_plan.data(), M, N, K, s.stream);
          CHECK(std::memcmp(f_spec.data(), f_plan.data(), f_spec.size() * 4) == 0);
        }
        ++seed;
      }
}

TEST_CASE("plan_gemm rejects what validate rejects, with the same message") {
  std::vector<GemmSpec> bad;
  bad.push_back(GemmSpec{.acc = format_lookup("fp64")});
  bad.push_back(GemmSpec{.acc = format_lookup("fp32"), .acc_mode = Rounding::sr, .sr_bits = 32});
  bad.push_back(GemmSpec{.acc = format_lookup("fp32"), .accumulation = Accumulation::blocked, .block = 0});
  bad.push_back(GemmSpec{.acc = format_lookup("fp32"), .input = format_lookup("fp64")});
  bad.push_back(GemmSpec{.acc = format_lookup("bf16"), .sr_bits = 0});
  Format broken = format_lookup("bf16");
  broken.emax = broken.emin - 1;
  bad.push_back(GemmSpec{.acc = broken});
  for (const GemmSpec& s : bad) {
    try {
      validate(s);
      FAIL("validate accepted a bad spec");
    } catch (const InputError& e) {
      CHECK_THROWS_WITH(plan_gemm(s), Catch::Equals(e.what()));
    }
  }
}

namespace {

// The GPU's tiled kernel (src/cuda/gemm.cu) on the CPU: each output's OutputAccumulator fed its
// products slice by slice (16 k per slice, as the kernel's shared-memory tiles), each slice's
// outputs visited in the kernel's order; the result must be gemm()'s, bit for bit.
template <Rounding M, Accumulation kAcc>
std::vector<double> tiled_like_gpu(const GemmPlan& p, const std::vector<float>& A, const std::vector<float>& B,
                                   size_t Mr, size_t N, size_t K, uint64_t stream) {
  constexpr size_t kBK = 16;
  std::vector<OutputAccumulator<M, kAcc>> acc(Mr * N, OutputAccumulator<M, kAcc>(p.seed, stream, p.sr_pack));
  const uint64_t nchunks = chunk_count(K, p.block);
  for (size_t k0 = 0; k0 < K; k0 += kBK)
    for (size_t o = 0; o < Mr * N; ++o)
      for (size_t k = k0; k < std::min(K, k0 + kBK); ++k)
        acc[o].step(A[(o / N) * K + k], B[k * N + o % N], p.acc, o, K, k, p.block, nchunks);
  std::vector<double> C(Mr * N);
  for (size_t o = 0; o < C.size(); ++o) C[o] = acc[o].value();
  return C;
}

}  // namespace

TEST_CASE("the GPU kernel's per-tile accumulation (OutputAccumulator) == gemm, every mode and accumulation") {
  const size_t shapes[][3] = {{1, 1, 1}, {3, 5, 17}, {9, 7, 100}, {2, 3, 0}};
  uint64_t seed = 40;
  for (const char* fn : {"ps4", "bf16", "fp16", "ps23"})
    for (Rounding m : {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::ro,
                       Rounding::sr, Rounding::sre})
      for (Accumulation a : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked, Accumulation::promoted})
        for (const auto& sh : shapes) {
          GemmSpec s;
          s.acc = format_lookup(fn), s.acc_mode = m, s.accumulation = a, s.block = 7, s.sr_bits = 16, s.seed = ++seed;
          if (is_stochastic(m) && seed % 3 != 0) s.sr_packed = true, s.sr_bits = seed % 3 == 1 ? 8 : 16;
          const GemmPlan p = plan_gemm(s);
          const auto A = random_matrix(sh[0] * sh[2], seed, true), B = random_matrix(sh[2] * sh[1], seed + 1, true);
          std::vector<double> want(sh[0] * sh[1]);
          gemm(p, A.data(), B.data(), want.data(), sh[0], sh[1], sh[2], 6);
          const std::vector<double> got = with_rounding(m, [&](auto mode) {
            constexpr Rounding R = decltype(mode)::value;
            switch (a) {
              case Accumulation::strict: return tiled_like_gpu<R, Accumulation::strict>(p, A, B, sh[0], sh[1], sh[2], 6);
              case Accumulation::unfused: return tiled_like_gpu<R, Accumulation::unfused>(p, A, B, sh[0], sh[1], sh[2], 6);
              case Accumulation::blocked: return tiled_like_gpu<R, Accumulation::blocked>(p, A, B, sh[0], sh[1], sh[2], 6);
              default: return tiled_like_gpu<R, Accumulation::promoted>(p, A, B, sh[0], sh[1], sh[2], 6);
            }
          });
          size_t bad = 0;
          for (size_t i = 0; i < want.size(); ++i) bad += !test::same(want[i], got[i]);
          INFO(fmt::format("{} {} {} {}x{}x{}{}", fn, to_string(m), to_string(a), sh[0], sh[1], sh[2],
                           s.sr_packed ? " packed" : ""));
          CHECK(bad == 0);
        }
}
