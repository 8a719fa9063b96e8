// Fast path (round.h via round_array) == MPFR oracle, bit for bit: every 16-bit pattern, millions
// of stratified random values and every boundary, for every test format and every mode.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/oracle.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "testutil.h"

using namespace mantis;
using namespace mantis::test;

namespace {

const Rounding kAllModes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                              Rounding::rd,  Rounding::ro,  Rounding::sr, Rounding::sre};

// Compares fast results `got` (rounded from inputs xs) with the oracle; returns mismatches.
size_t compare(const std::vector<double>& xs, const std::vector<double>& got, const Format& f, Rounding m,
               const RoundOptions& o, const char* what) {
  size_t bad = 0;
  std::string first;
  const long n = long(xs.size());
#pragma omp parallel for reduction(+ : bad) schedule(static) if (oracle_thread_safe())
  for (long i = 0; i < n; ++i) {
    const double want = oracle_round(xs[size_t(i)], f, m, random_word(o.seed, o.stream, o.index0 + uint64_t(i)), o.sr_bits);
    if (!same(want, got[size_t(i)])) {
      ++bad;
#pragma omp critical
      if (first.size() < 600)
        first += fmt::format("\n  {} x={} fast={} mpfr={}", what, hex(xs[size_t(i)]), hex(got[size_t(i)]), hex(want));
    }
  }
  if (bad) FAIL_CHECK(fmt::format("{} {} {}: {} mismatches{}", f.name, to_string(m), what, bad, first));
  return bad;
}

// All container combinations for one input set.
void check_all(const Format& f, Rounding m, const std::vector<double>& xd, const std::vector<float>& xf,
               uint64_t seed, int sr_bits = 32) {
  RoundOptions o{.mode = m, .sr_bits = sr_bits, .seed = seed, .stream = 3};
  std::vector<double> outd(xd.size());
  round_array(xd.data(), outd.data(), xd.size(), f, o);
  CHECK(compare(xd, outd, f, m, o, "double->double") == 0);

  std::vector<double> xf_as_d(xf.begin(), xf.end()), outfd(xf.size());
  round_array(xf.data(), outfd.data(), xf.size(), f, o);
  CHECK(compare(xf_as_d, outfd, f, m, o, "float->double") == 0);

  if (fits_float(f)) {
    std::vector<float> outf(xf.size());
    round_array(xf.data(), outf.data(), xf.size(), f, o);
    CHECK(compare(xf_as_d, std::vector<double>(outf.begin(), outf.end()), f, m, o, "float->float") == 0);
    std::vector<float> outdf(xd.size());
    round_array(xd.data(), outdf.data(), xd.size(), f, o);
    CHECK(compare(xd, std::vector<double>(outdf.begin(), outdf.end()), f, m, o, "double->float") == 0);
    // In place gives the same bits.
    std::vector<float> inplace = xf;
    round_array(inplace.data(), inplace.data(), inplace.size(), f, o);
    CHECK(std::memcmp(inplace.data(), outf.data(), outf.size() * 4) == 0);
  }
}

float half_to_float(uint16_t h) {  // exact decoding of an IEEE binary16 pattern
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return float(s ? -v : v);
}

}  // namespace

TEST_CASE("every bf16 and fp16 bit pattern, every test format and mode") {
  std::vector<float> xf;
  // every pattern in the release job; every 16th under the sanitizers (MANTIS_TEST_SCALE < 1)
  const uint32_t step = scale() < 1 ? 16 : 1;
  for (uint32_t u = 0; u < 65536; u += step) {
    uint32_t b = u << 16;
    float x;
    std::memcpy(&x, &b, 4);
    xf.push_back(x);
    xf.push_back(half_to_float(uint16_t(u)));
  }
  const std::vector<double> xd(xf.begin(), xf.end());
  for (const Format& f : test_formats())
    for (Rounding m : kAllModes) {
      INFO(f.name << " " << to_string(m));
      check_all(f, m, xd, xf, 11);
    }
}

TEST_CASE("stratified random binary32 and binary64 inputs plus boundaries, named formats") {
  for (const std::string& name : named_formats()) {
    const Format f = format_lookup(name);
    // formats of ≤ 8 bits have few values (and every 16-bit pattern is checked above): fewer samples
    const size_t n = scaled(f.mu >= 7 ? 1'000'000 : 200'000);
    auto xd = stratified_doubles(f, n, 1);
    auto xf = stratified_floats(f, n, 2);
    for (double b : boundary_doubles(f)) xd.push_back(b);
    for (float b : boundary_floats(f)) xf.push_back(b);
    for (Rounding m : kAllModes) {
      const bool random = m == Rounding::sr || m == Rounding::sre;
      if (random) {  // stochastic modes: fewer inputs, same exactness requirement
        std::vector<double> sd(xd.end() - long(n / 10), xd.end());
        std::vector<float> sf(xf.end() - long(n / 10), xf.end());
        check_all(f, m, sd, sf, 5);
        if (m == Rounding::sr) check_all(f, m, sd, sf, 6, 7);  // few random bits
      } else {
        check_all(f, m, xd, xf, 0);
      }
    }
  }
}

TEST_CASE("generated families and custom formats: sampled inputs and boundaries") {
  std::vector<Format> fs = test_formats();
  for (int mu = 1; mu <= 23; ++mu) fs.push_back(format_lookup(fmt::format("ps{}", mu)));
  for (int E = 2; E <= 11; ++E)
    for (int M : {0, 1, 3, 10, 23, 52}) fs.push_back(format_lookup(fmt::format("e{}m{}", E, M)));
  for (int P = 1; P <= 7; ++P) fs.push_back(format_lookup(fmt::format("p3109_p{}", P)));
  for (const char* t : {"name='e3m2_none_nan'\nmantissa_bits=2\nexponent_bits=3\nspecials='none'\noverflow='nan'",
                        "name='u_e5m2'\nmantissa_bits=2\nexponent_bits=5\nspecials='none'\nsigned=false",
                        "name='e8m0_sat'\nmantissa_bits=0\nemin=-127\nemax=127\nsubnormals=false\nspecials='none'\n"
                        "signed=false\nzero=false\noverflow='saturate'"})
    fs.push_back(format_from_toml(t, "test"));
  for (int B : {2, 3, 8, 16, 32})
    for (const char* k : {"int{}", "int{}tc", "uint{}"}) fs.push_back(format_lookup(fmt::format(fmt::runtime(k), B)));
  const size_t n = scaled(20'000);
  for (const Format& f : fs) {
    auto xd = stratified_doubles(f, n, 3);
    auto xf = stratified_floats(f, n, 4);
    for (double b : boundary_doubles(f)) xd.push_back(b);
    for (float b : boundary_floats(f)) xf.push_back(b);
    for (Rounding m : kAllModes) check_all(f, m, xd, xf, 9);
  }
}

TEST_CASE("hand-checked values from the format definitions") {
  auto r = [](const char* fmtname, Rounding m, double x) {
    return round_scalar(x, format_lookup(fmtname), RoundOptions{.mode = m});
  };
  // bf16: 8 significant bits
  CHECK(r("bf16", Rounding::rne, 1 + std::ldexp(1, -8)) == 1.0);                    // tie → even
  CHECK(r("bf16", Rounding::rne, 1 + 3 * std::ldexp(1, -8)) == 1 + std::ldexp(1, -6));  // tie → even (up)
  CHECK(r("bf16", Rounding::rna, 1 + std::ldexp(1, -8)) == 1 + std::ldexp(1, -7));
  CHECK(r("bf16", Rounding::ru, 1 + std::ldexp(1, -50)) == 1 + std::ldexp(1, -7));
  CHECK(r("bf16", Rounding::rd, -(1 + std::ldexp(1, -50))) == -(1 + std::ldexp(1, -7)));
  CHECK(r("bf16", Rounding::rz, 1 - std::ldexp(1, -50)) == 1 - std::ldexp(1, -8));
  CHECK(r("bf16", Rounding::ro, 1 + std::ldexp(1, -50)) == 1 + std::ldexp(1, -7));  // odd neighbour
  // OCP E4M3: largest finite 448; 464 is the midpoint to the (NaN) code 480: ties to even 448
  CHECK(r("e4m3", Rounding::rne, 464) == 448);
  CHECK(std::isnan(r("e4m3", Rounding::rne, 465)));
  CHECK(r("e4m3", Rounding::rz, 1e6) == 448);
  CHECK(std::isnan(r("e4m3", Rounding::rne, INFINITY)));
  // binary16 overflow threshold 65520 → inf under rne; 65519 → 65504
  CHECK(std::isinf(r("fp16", Rounding::rne, 65520)));
  CHECK(r("fp16", Rounding::rne, 65519) == 65504);
  CHECK(r("fp16", Rounding::rd, 1e9) == 65504);
  // Signed zero survives underflow; half the smallest subnormal ties to 0 under rne
  CHECK(std::signbit(r("fp16", Rounding::rne, -1e-30)));
  CHECK(r("fp16", Rounding::rne, -1e-30) == 0);
  CHECK(r("fp16", Rounding::rne, std::ldexp(1, -25)) == 0);
  CHECK(r("fp16", Rounding::rna, std::ldexp(1, -25)) == std::ldexp(1, -24));
  CHECK(r("fp16", Rounding::ru, 1e-30) == std::ldexp(1, -24));
  // A double rounded to bf16 directly (no double rounding through binary32):
  // x = 1 + 2^-8 + 2^-30 rounds up in bf16, but via float it would hit the tie and go to 1.
  CHECK(r("bf16", Rounding::rne, 1 + std::ldexp(1, -8) + std::ldexp(1, -30)) == 1 + std::ldexp(1, -7));
  CHECK(std::isnan(r("bf16", Rounding::rne, NAN)));
  // OCP FP4 E2M1: ties to even on its grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}; saturates; keeps −0
  CHECK(r("fp4_e2m1", Rounding::rne, 5) == 4);
  CHECK(r("fp4_e2m1", Rounding::rne, 5.01) == 6);
  CHECK(r("fp4_e2m1", Rounding::rne, 0.25) == 0);
  CHECK(r("fp4_e2m1", Rounding::rne, 0.75) == 1);
  CHECK(r("fp4_e2m1", Rounding::rne, 100) == 6);
  CHECK(r("fp4_e2m1", Rounding::rne, -INFINITY) == -6);
  CHECK(std::signbit(r("fp4_e2m1", Rounding::rne, -0.1)));
  CHECK(r("fp6_e3m2", Rounding::rne, 30) == 28);
  CHECK(r("fp6_e2m3", Rounding::ru, 7.6) == 7.5);  // saturation beats the direction
  // E8M0: powers of two; below 2^-127 (and 0) → 2^-127; negative → NaN; past 2^127 → NaN
  CHECK(r("e8m0", Rounding::rne, 5) == 4);
  CHECK(r("e8m0", Rounding::rne, 6.5) == 8);
  CHECK(r("e8m0", Rounding::rz, 7.9) == 4);
  CHECK(r("e8m0", Rounding::rne, 0) == std::ldexp(1, -127));
  CHECK(r("e8m0", Rounding::rz, std::ldexp(1, -140)) == std::ldexp(1, -127));
  CHECK(std::isnan(r("e8m0", Rounding::rne, -1)));
  CHECK(std::isnan(r("e8m0", Rounding::rne, std::ldexp(1, 128))));
  // P3109 binary8p4: largest 224; 232 is the midpoint to the (inf) code 240: ties to even 224, then inf
  CHECK(r("p3109_p4", Rounding::rne, 232) == 224);
  CHECK(std::isinf(r("p3109_p4", Rounding::rne, 232.5)));
  CHECK(r("p3109_p4", Rounding::rz, 1e9) == 224);
  CHECK_FALSE(std::signbit(r("p3109_p4", Rounding::rne, -1e-30)));
  CHECK(std::isinf(r("p3109_p4", Rounding::rne, -INFINITY)));
  // integers: quantum 1, ties to even, saturating, +0; two's complement reaches −128
  CHECK(r("int8", Rounding::rne, 2.5) == 2);
  CHECK(r("int8", Rounding::rne, 3.5) == 4);
  CHECK(r("int8", Rounding::rne, -200) == -127);
  CHECK(r("int8tc", Rounding::rne, -200) == -128);
  CHECK(r("int8tc", Rounding::rne, -127.6) == -128);
  CHECK(r("int8tc", Rounding::rne, 127.6) == 127);
  CHECK(r("int8tc", Rounding::rz, -128.9) == -128);
  CHECK_FALSE(std::signbit(r("int8", Rounding::rne, -0.3)));
  CHECK(r("uint8", Rounding::rne, -3) == 0);
  CHECK(r("uint8", Rounding::rne, 255.4) == 255);
  CHECK(r("int4", Rounding::rd, -6.5) == -7);
  CHECK(r("int4", Rounding::rd, -7.5) == -7);
}

TEST_CASE("integer grids: chunks inside the grid's ends (round_array's rne shortcut) and chunks with one value outside") {
  // Every value of a 1024-element chunk inside [lo, hi] takes round_array.cpp's int_chunk under rne;
  // a chunk with one value outside takes round_value. Inputs: random reals, every integer and
  // half-integer of the range, and their neighbours one ulp either side (ties and near-ties).
  for (int B : {2, 3, 4, 8, 16, 25, 32})
    for (const char* k : {"int{}", "int{}tc", "uint{}"}) {
      const Format f = format_lookup(fmt::format(fmt::runtime(k), B));
      const RoundPlan p = plan_round(f, Rounding::rne);
      REQUIRE(p.int_grid);
      const double hi = std::ldexp(1.0, f.is_signed ? B - 1 : B) - 1, lo = !f.is_signed ? 0 : f.twos_complement ? -hi - 1 : -hi;
      CHECK(p.int_max == std::max(hi, -lo));
      std::vector<double> xd;
      std::vector<float> xf;
      auto add = [&](double v) {
        for (double w : {v, std::nextafter(v, -INFINITY), std::nextafter(v, INFINITY)})
          if (w >= lo && w <= hi) xd.push_back(w);
        for (float w : {float(v), std::nextafter(float(v), -INFINITY), std::nextafter(float(v), INFINITY)})
          if (w >= lo && w <= hi) xf.push_back(w);
      };
      const double span = hi - lo;
      const size_t n = std::min<size_t>(scaled(4096), size_t(span) + 1);
      for (size_t i = 0; i < n; ++i) {  // integers and half-integers spread over the range, ends included
        const double v = std::round(lo + span * double(i) / double(std::max<size_t>(n - 1, 1)));
        add(v), add(v + 0.5), add(v - 0.5);
      }
      for (uint64_t i = 0; i < scaled(8192); ++i) add(lo + span * (double(random_word(7, uint64_t(B), i)) / 4294967296.0));
      for (bool with_outside : {false, true}) {
        INFO(f.name << (with_outside ? " with an outside value per chunk" : " all inside"));
        std::vector<double> d = xd;
        std::vector<float> fl = xf;
        if (with_outside)
          for (size_t i = 0; i < d.size(); i += 1024) d[i] = hi + 1, fl[std::min(i, fl.size() - 1)] = float(lo - 1);
        check_all(f, Rounding::rne, d, fl, 0);
      }
    }
}
