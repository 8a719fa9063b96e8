// CUDA kernels (src/cuda) == CPU fast path, bit for bit: round_array for every mode on ~1e6
// stratified values plus every boundary per format (both containers), and gemm (strict, unfused,
// blocked, with and without input rounding) on several shapes.
//
// Without a CUDA device (CI, most developer machines) the executable prints
// "SKIP: no CUDA device" and exits 77, which Meson reports as SKIP.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "cuda/cuda.h"
#include "core/gemm.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "testutil.h"

using namespace mantis;
using namespace mantis::test;

namespace {

const Rounding kAllModes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                              Rounding::rd,  Rounding::ro,  Rounding::sr, Rounding::sre};

template <class T> uint64_t bits_of(T x) {
  if constexpr (sizeof(T) == 4) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  } else {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    return u;
  }
}

// Exact bit patterns (NaNs included: both paths produce the canonical NaN).
template <class T>
size_t count_diff(const std::vector<T>& in, const std::vector<T>& cpu, const std::vector<T>& gpu,
                  std::string& first) {
  size_t bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (bits_of(cpu[i]) != bits_of(gpu[i])) {
      if (bad < 5)
        first += fmt::format("\n  i={} x={} cpu={} gpu={}", i, hex(double(in[i])), hex(double(cpu[i])),
                             hex(double(gpu[i])));
      ++bad;
    }
  }
  return bad;
}

template <class T>
void check_round(const Format& f, const std::vector<T>& xs, Rounding m, int sr_bits, uint64_t index0,
                 uint64_t seed) {
  const RoundOptions o{.mode = m, .sr_bits = sr_bits, .seed = seed, .stream = 5, .index0 = index0};
  std::vector<T> cpu(xs.size()), gpu(xs.size());
  round_array(xs.data(), cpu.data(), xs.size(), f, o);
  cuda_round_array(xs.data(), gpu.data(), xs.size(), f, o);
  std::string first;
  const size_t bad = count_diff(xs, cpu, gpu, first);
  INFO(fmt::format("{} {} {} sr_bits={} index0={}: {} of {} differ{}", f.name, to_string(m),
                   sizeof(T) == 4 ? "float" : "double", sr_bits, index0, bad, xs.size(), first));
  CHECK(bad == 0);
}

std::vector<Format> float_formats() {
  std::vector<Format> v;
  for (const char* n : {"bf16", "fp16", "e4m3", "e5m2", "ps4", "ps13", "fp32"}) v.push_back(format_lookup(n));
  for (const Format& f : test_formats())  // custom variants: fnuz, saturating, no subnormals, ...
    if (fits_float(f)) v.push_back(f);
  return v;
}

template <class T> std::vector<T> inputs(const Format& f, size_t n, uint64_t seed) {
  std::vector<T> xs;
  if constexpr (sizeof(T) == 4) {
    xs = stratified_floats(f, n, seed);
    const auto b = boundary_floats(f);
    xs.insert(xs.end(), b.begin(), b.end());
  } else {
    xs = stratified_doubles(f, n, seed);
    const auto b = boundary_doubles(f);
    xs.insert(xs.end(), b.begin(), b.end());
  }
  return xs;
}

}  // namespace

TEST_CASE("cuda_round_array float == round_array, all modes", "[cuda][round]") {
  const std::vector<Format> formats = float_formats();
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    const Format& f = formats[fi];
    const size_t n = fi < 7 ? scaled(1'000'000) : scaled(100'000);
    const auto xs = inputs<float>(f, n, 1000 + fi);
    for (Rounding m : kAllModes) check_round(f, xs, m, 32, 3, 11);  // index0 = 3: unaligned Philox
    // Stochastic options: few random bits, aligned and large index0, another seed.
    check_round(f, xs, Rounding::sr, 5, 0, 12);
    check_round(f, xs, Rounding::sr, 13, (uint64_t(1) << 40) + 1, 13);
    check_round(f, xs, Rounding::sre, 32, 2, 14);
  }
}

TEST_CASE("cuda_round_array double == round_array, all modes", "[cuda][round]") {
  std::vector<Format> formats;
  for (const char* n : {"bf16", "fp16", "e4m3", "e5m2", "ps4", "ps13", "fp32", "tf32", "fp64", "e11m20"})
    formats.push_back(format_lookup(n));
  for (const Format& f : test_formats()) formats.push_back(f);
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    const Format& f = formats[fi];
    const size_t n = fi < 7 ? scaled(1'000'000) : scaled(100'000);
    const auto xs = inputs<double>(f, n, 2000 + fi);
    for (Rounding m : kAllModes) check_round(f, xs, m, 32, 1, 21);
    check_round(f, xs, Rounding::sr, 3, 0, 22);
    check_round(f, xs, Rounding::sr, 17, 6, 23);
  }
}

TEST_CASE("cuda_round_array in place, empty and odd sizes", "[cuda][round]") {
  const Format f = format_lookup("bf16");
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(5), size_t(1027)}) {
    auto xs = stratified_floats(f, std::max<size_t>(n, 1), 77);
    xs.resize(n);
    for (Rounding m : {Rounding::rne, Rounding::sr}) {
      const RoundOptions o{.mode = m, .seed = 9, .stream = 1, .index0 = 2};
      std::vector<float> cpu(n), gpu = xs;
      round_array(xs.data(), cpu.data(), n, f, o);
      cuda_round_array(gpu.data(), gpu.data(), n, f, o);  // in place
      std::string first;
      CHECK(count_diff(xs, cpu, gpu, first) == 0);
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

namespace {

// Operands: random significands, exponents in [lo, hi], random signs; a few exact zeros.
std::vector<float> operands(size_t n, int lo, int hi, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r0 = random_word(seed, 99, 2 * i), r1 = random_word(seed, 99, 2 * i + 1);
    if (r1 % 53 == 0) { v[i] = 0.0f; continue; }
    const int e = lo + int(r1 % uint32_t(hi - lo + 1));
    const float s = 1.0f + std::ldexp(float(r0 >> 9), -23);
    v[i] = ((r1 >> 16) & 1 ? -1.0f : 1.0f) * std::ldexp(s, e);
  }
  return v;
}

struct Shape { size_t M, N, K; };

void check_gemm(const GemmSpec& s, Shape sh, int lo, int hi, uint64_t seed) {
  const auto A = operands(sh.M * sh.K, lo, hi, seed), B = operands(sh.K * sh.N, lo, hi, seed + 1);
  std::vector<double> cpu(sh.M * sh.N, -1.0), gpu(sh.M * sh.N, -2.0);
  gemm(A.data(), B.data(), cpu.data(), sh.M, sh.N, sh.K, s);
  cuda_gemm(A.data(), B.data(), gpu.data(), sh.M, sh.N, sh.K, s);
  std::string first;
  const size_t bad = count_diff(cpu, cpu, gpu, first);
  INFO(fmt::format("gemm {}x{}x{} acc={} {} {} block={} input={} {}: {} of {} differ{}", sh.M, sh.N,
                           sh.K, s.acc.name, to_string(s.acc_mode), to_string(s.accumulation), s.block,
                           s.input ? s.input->name : "-", to_string(s.input_mode), bad, cpu.size(), first));
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("cuda_gemm == gemm: strict, unfused, blocked, all modes", "[cuda][gemm]") {
  const Shape shapes[] = {{1, 1, 1}, {3, 5, 7}, {17, 31, 257}, {2, 3, 0}, {1, 40, 1000}};
  uint64_t seed = 500;
  for (const char* acc : {"bf16", "fp16", "ps13", "fp32", "e5m2"}) {
    for (Rounding m : kAllModes) {
      for (Accumulation a : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        for (int block : a == Accumulation::blocked ? std::vector<int>{1, 8, 32} : std::vector<int>{32}) {
          GemmSpec s;
          s.acc = format_lookup(acc);
          s.acc_mode = m;
          s.accumulation = a;
          s.block = block;
          s.sr_bits = 16;
          s.seed = seed++;
          s.stream = 4;
          for (Shape sh : shapes) check_gemm(s, sh, -6, 6, seed);
          check_gemm(s, {7, 9, 64}, 10, 14, seed);      // overflows the narrow accumulators
          check_gemm(s, {7, 9, 64}, -75, -60, seed);    // subnormal / underflowing products
        }
      }
    }
  }
}

TEST_CASE("cuda_gemm == gemm: input rounding and a larger shape", "[cuda][gemm]") {
  struct In { const char* name; Rounding mode; };
  uint64_t seed = 900;
  for (In in : {In{"bf16", Rounding::sr}, In{"e4m3", Rounding::rne}, In{"ps4", Rounding::sre},
                In{"fp16", Rounding::rz}}) {
    for (Rounding m : kAllModes) {
      for (Accumulation a : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked}) {
        GemmSpec s;
        s.acc = format_lookup("fp16");
        s.acc_mode = m;
        s.accumulation = a;
        s.block = 16;
        s.input = format_lookup(in.name);
        s.input_mode = in.mode;
        s.sr_bits = 20;
        s.seed = seed++;
        s.stream = 10;
        check_gemm(s, {9, 11, 40}, -4, 4, seed);
      }
    }
  }
  for (Rounding m : {Rounding::rne, Rounding::sr, Rounding::ro}) {
    GemmSpec s;
    s.acc = format_lookup("bf16");
    s.acc_mode = m;
    s.sr_bits = 8;
    s.seed = 7;
    check_gemm(s, {64, 96, 300}, -3, 3, 77);
  }
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
    std::puts("SKIP: no CUDA device");
    std::fflush(stdout);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
