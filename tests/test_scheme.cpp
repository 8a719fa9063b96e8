// Scaled formats (scheme.h): every preset against the MPFR reference of its written definition
// (oracle_quantize), bit for bit, on random, outlier, all-zero, non-finite and subnormal blocks,
// every mode; every element code under every power-of-two scale; hand-checked OCP MX and NVFP4
// values; presets, TOML schemes and their errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/oracle.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "core/scheme.h"
#include "core/threads.h"
#include "testutil.h"

using namespace mantis;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

bool same(double a, double b) { return test::same(a, b); }

// rows × cols values of several magnitudes (an exponent spread of ±spread binades), reproducible.
std::vector<double> values(int64_t n, uint64_t seed, int spread, bool as_float) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t w = random_word(seed, 1, uint64_t(i)), e = random_word(seed, 2, uint64_t(i));
    double x = (double(w) / 4294967296.0) * 2 - 1;
    x = std::ldexp(x, int(e % uint32_t(2 * spread + 1)) - spread);
    v[size_t(i)] = as_float ? double(float(x)) : x;
  }
  return v;
}

// quantize_scheme (float or double array) == oracle_quantize, bit for bit; returns mismatches.
size_t compare(const Scheme& s, const std::vector<double>& x, int64_t rows, int64_t cols, bool as_float, Rounding m,
               uint64_t seed, const char* what) {
  std::vector<double> got(x.size());
  if (as_float) {
    std::vector<float> xf(x.begin(), x.end()), yf(x.size());
    quantize_scheme<float>(s, xf.data(), yf.data(), rows, cols, m, 20, seed, 4, 0);
    got.assign(yf.begin(), yf.end());
  } else {
    quantize_scheme<double>(s, x.data(), got.data(), rows, cols, m, 20, seed, 4, 0);
  }
  const std::vector<double> want = oracle_quantize(s, x, rows, cols, as_float, m, 20, seed, 4, 0);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < x.size(); ++i)
    if (!same(got[i], want[i]) && bad++ < 4)
      first += fmt::format(" [{}] x={} fast={} mpfr={}", i, test::hex(x[i]), test::hex(got[i]), test::hex(want[i]));
  if (bad) FAIL_CHECK(fmt::format("{} {} {} {}x{}: {} mismatches{}", s.name, to_string(m), what, rows, cols, bad, first));
  return bad;
}

}  // namespace

TEST_CASE("every preset == the MPFR reference of its definition (random, outliers, zeros, NaN/inf, subnormals)") {
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::ro,
                            Rounding::sr, Rounding::sre};
  uint64_t seed = 1;
  for (const std::string& name : scheme_presets()) {
    Scheme s = scheme_lookup(name);
    // deepseek_weight's 128×128 blocks: a smaller block keeps the test short (same arithmetic)
    if (name == "deepseek_weight") s.block_rows = s.block_cols = 24;
    for (const bool as_float : {true, false})
      for (Rounding m : modes) {
        const int64_t rows = 3 + int64_t(seed % 8), cols = 37 + int64_t(seed * 7 % 160);  // ragged partial blocks
        std::vector<double> x = values(rows * cols, seed, as_float ? 30 : 200, as_float);
        // one huge outlier, an all-zero stretch, a signed zero, subnormal values
        x[size_t(cols + 3)] = as_float ? double(3.0e37f) : 1e300;
        for (int64_t j = 0; j < std::min<int64_t>(cols, 40); ++j) x[size_t(2 * cols + j)] = 0.0;
        x[size_t(2 * cols + 1)] = -0.0;
        x[size_t(cols * (rows - 1))] = as_float ? 0x1p-140 : 0x1p-1060;
        x[size_t(cols * (rows - 1) + 1)] = as_float ? -0x1p-149 : -0x1p-1074;
        CHECK(compare(s, x, rows, cols, as_float, m, seed, "mixed") == 0);
        // a non-finite element poisons its block (and, two-level, the tensor)
        std::vector<double> y = values(rows * cols, seed + 50, 10, as_float);
        y[5] = kNaN;
        y[size_t(cols + 7)] = -INFINITY;
        CHECK(compare(s, y, rows, cols, as_float, m, seed, "non-finite") == 0);
        ++seed;
      }
  }
}

TEST_CASE("binary32 data at and next to the element grid's midpoints (the plain-quotient case) == MPFR") {
  // quantize_scheme divides binary32 data plainly in binary64 for deterministic modes (the proof
  // in scheme.cpp); quotients on, and one binary32 ulp either side of, every midpoint and grid
  // value are where a double rounding would show.
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::ro};
  for (const char* name : {"int8_channel", "mxfp8_e4m3", "mxfp4", "deepseek_act", "int8_tensor"}) {
    const Scheme s = scheme_lookup(name);
    const double M = max_finite(s.element);
    const int64_t cols = 128;
    std::vector<double> x;
    for (int64_t r = 0; r < 6; ++r) {
      // the row's scale as the absmax rule makes it (power-of-two rules: amax = M · 2^r is exact)
      const float amax = float(std::ldexp(M * (1 + 0.37 * double(r)), int(r) - 3));
      const double S = s.rule == ScaleRule::absmax ? double(float(double(amax) / M)) : 0;
      std::vector<double> row{double(amax)};
      for (int64_t k = 1; int64_t(row.size()) < cols; ++k) {
        // a grid value or midpoint of the element format, times the scale (or its binade's power of two)
        const double g = std::ldexp(double(k % 64) * 0.5 * (k % 3 ? 1 : -1), int(k / 64) - 2 * (k % 2));
        const float v = float(S ? g * S : std::ldexp(g, int(r) - 3));
        for (float w : {v, std::nextafter(v, INFINITY), std::nextafter(v, -INFINITY)})
          if (int64_t(row.size()) < cols && std::fabs(w) <= amax) row.push_back(double(w));
      }
      x.insert(x.end(), row.begin(), row.end());
    }
    for (Rounding m : modes) CHECK(compare(s, x, 6, cols, true, m, 1, "midpoints") == 0);
  }
}

TEST_CASE("deepseek_weight's 128×128 blocks on a ragged 150×140 matrix == MPFR") {
  const Scheme s = scheme_lookup("deepseek_weight");
  for (const bool as_float : {true, false}) {
    std::vector<double> x = values(150 * 140, 31, 20, as_float);
    x[140 * 100 + 130] = as_float ? double(2.5e20f) : 2.5e20;  // an outlier in the last block column
    CHECK(compare(s, x, 150, 140, as_float, Rounding::rne, 1, "128x128") == 0);
  }
}

TEST_CASE("the scale rules' variants and the NVFP4 reciprocal order == MPFR") {
  for (const char* toml : {"element='fp4_e2m1'\nrule='ceil'", "element='fp6_e3m2'\nrule='nearest'\nblock=[2,8]",
                           "element='int8'\nrule='absmax'\nscale='bf16'\nblock='column'",
                           "element='int4tc'\nrule='absmax'\nscale='e4m3'\nblock='row'",
                           "element='fp4_e2m1'\nrule='absmax'\nscale='e4m3'\nblock=[1,16]\ntwo_level=true\n"
                           "division='reciprocal'"}) {
    INFO(toml);
    const Scheme s = scheme_from_toml(toml, "t.toml");
    for (const bool as_float : {true, false})
      for (Rounding m : {Rounding::rne, Rounding::rd, Rounding::sr}) {
        const std::vector<double> x = values(7 * 45, 77, as_float ? 40 : 300, as_float);
        CHECK(compare(s, x, 7, 45, as_float, m, 3, "variant") == 0);
      }
  }
}

TEST_CASE("every element code of FP4 / FP6 / FP8 / MXINT8 under every E8M0 scale round-trips with that scale") {
  for (const char* name : {"mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"}) {
    const Scheme s = scheme_lookup(name);
    INFO(name);
    // the element format's non-negative values, largest first (so every block holds the largest)
    std::vector<double> codes;
    const Format& f = s.element;
    const double mx = max_finite(f);
    for (double v = mx; v > 0; v = std::nextafter(v, 0.0)) {
      const double r = round_scalar(v, f, RoundOptions{.mode = Rounding::rd});
      if (r <= 0) break;
      if (codes.empty() || r != codes.back()) codes.push_back(r);
      v = r;
    }
    codes.push_back(0.0);  // (MXINT8's −2 needs an amax of 2: the floor rule then picks the next scale)
    // blocks of 32: the largest value, then the codes (and their negatives) in turn
    std::vector<double> block_vals;
    for (double c : codes) block_vals.push_back(c), block_vals.push_back(-c);
    const int64_t per = 31, nblocks = int64_t((block_vals.size() + per - 1) / per);
    size_t checked = 0;
    for (int k = -127 + 2; k <= 127 - f.emax - 1; k += 3) {  // every third scale keeps it quick
      std::vector<double> x;
      for (int64_t b = 0; b < nblocks; ++b) {
        x.push_back(std::ldexp(mx, k));
        for (int64_t i = 0; i < per; ++i) {
          const size_t at = size_t(b * per + i);
          x.push_back(at < block_vals.size() ? std::ldexp(block_vals[at], k) : 0.0);
        }
      }
      std::vector<double> y(x.size()), scales;
      quantize_scheme<double>(s, x.data(), y.data(), 1, int64_t(x.size()), Rounding::rne, 32, 0, 0, 0, &scales);
      for (double sc : scales) CHECK(sc == std::ldexp(1.0, k));  // X = 2^(⌊log2 amax⌋ − emax), amax = max·2^k
      for (size_t i = 0; i < x.size(); ++i) {
        const bool ok = same(x[i], y[i]) || (x[i] == 0 && y[i] == 0 && !f.negative_zero);
        if (!ok) FAIL_CHECK(fmt::format("k={} x={} y={}", k, test::hex(x[i]), test::hex(y[i])));
        ++checked;
      }
    }
    CHECK(checked > 1000);
  }
}

TEST_CASE("hand-checked values: OCP MX (the floor from the exponent bits, saturation, NaN blocks) and NVFP4") {
  auto q = [](const char* scheme, std::vector<double> x, std::vector<double>* scales = nullptr) {
    std::vector<double> y(x.size());
    quantize_scheme<double>(scheme_lookup(scheme), x.data(), y.data(), 1, int64_t(x.size()), Rounding::rne, 32, 0, 0,
                            0, scales);
    return y;
  };
  std::vector<double> sc;
  // MXFP4: amax 5 → ⌊log2 5⌋ = 2, emax(E2M1) = 2: X = 1; 5 is a tie between 4 and 6 → 4 (even)
  CHECK(q("mxfp4", {5, 1.25, -0.3}, &sc) == std::vector<double>{4, 1, -0.5});
  CHECK(sc == std::vector<double>{1.0});
  // amax just below a power of two: 7.999… has ⌊log2⌋ = 2 (a float log2 would say 3): X = 1, saturates to 6
  CHECK(q("mxfp4", {std::nextafter(8.0, 0.0)}, &sc) == std::vector<double>{6});
  CHECK(sc == std::vector<double>{1.0});
  // MXFP8 E4M3: amax 448·2^-3 → X = 2^(5−8)... every value exact
  CHECK(q("mxfp8_e4m3", {56, -1.75, 0.0078125}) == std::vector<double>{56, -1.75, 0.0078125});
  // a NaN or inf anywhere makes the whole block NaN; other blocks are untouched
  std::vector<double> x(64, 1.0);
  x[3] = INFINITY;
  const auto y = q("mxfp4", x);
  for (int i = 0; i < 32; ++i) CHECK(std::isnan(y[size_t(i)]));
  for (int i = 32; i < 64; ++i) CHECK(y[size_t(i)] == 1.0);
  // an all-zero block stays zero (−0 kept for FP elements; MXINT8 has +0 only); its scale is 2^−127
  const auto z = q("mxfp4", {0.0, -0.0}, &sc);
  CHECK(sc == std::vector<double>{std::ldexp(1.0, -127)});
  CHECK(std::signbit(z[1]));
  CHECK_FALSE(std::signbit(q("mxint8", {0.0, -0.0})[1]));
  // MXINT8: elements k/64, k = −128 … 127: amax 1.5 → X = 1; −2.0 is produced (two's complement)
  CHECK(q("mxint8", {1.5, -1.0 - 63.0 / 64, 0.01}) == std::vector<double>{1.5, -1.0 - 63.0 / 64, 0.015625});
  CHECK(q("mxint8", {-1.999, 1.0}) == std::vector<double>{-2.0, 1.0});
  // a float64 block whose exponent passes 127 + emax: NaN block
  CHECK(std::isnan(q("mxfp4", {1e300})[0]));
  // NVFP4: G = amax/2688; a block of amax 6·G·448 gets S_b = 448 (E4M3's largest): values exact
  std::vector<double> n = {2688, 1344, -672, 0.5 * 2688 / 6};
  std::vector<double> nsc;
  const auto ny = q("nvfp4", n, &nsc);
  CHECK(ny == n);
  CHECK(nsc == std::vector<double>{448});
  // int8 per tensor: s = RN32(amax/127)
  CHECK(q("int8_tensor", {127, -63.4, 0.49}) == std::vector<double>{127, -63, 0});
  // uint8 with a zero point: lo = −1, hi = 3, S = RN32(4/255), z = RN(1/S) = RN(63.75) = 64;
  // 0 maps to z exactly; −1 → RN(0.25) = 0 → −64·S; 3 → RN(255.25) = 255 → 191·S
  {
    const Scheme zp = scheme_lookup("uint8_tensor_zp");
    std::vector<double> in = {-1.0, 0.0, 3.0}, out(3), scl, zpt;
    quantize_scheme<double>(zp, in.data(), out.data(), 1, 3, Rounding::rne, 32, 0, 0, 0, &scl, &zpt);
    const double S = double(float(4.0 / 255.0));
    CHECK(scl == std::vector<double>{S});
    CHECK(zpt == std::vector<double>{64});
    CHECK(out == std::vector<double>{-64 * S, 0.0, 191 * S});
    // an all-positive block: lo = 0, z = 0
    std::vector<double> pos = {0.5, 2.0}, pout(2);
    quantize_scheme<double>(zp, pos.data(), pout.data(), 1, 2, Rounding::rne, 32, 0, 0, 0, &scl, &zpt);
    CHECK(zpt == std::vector<double>{0});
    CHECK(pout[1] == 255 * scl[0]);  // 2/S rounds to 255
    CHECK(scl[0] == double(float(2.0 / 255.0)));
  }
}

TEST_CASE("1 thread == 2 threads (blocks split over threads), sr included") {
  const int64_t rows = 300, cols = 400;  // past the parallel threshold
  std::vector<float> x(size_t(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int32_t(random_word(8, 0, i))) * 0x1p-28f;
  for (const char* name : {"mxfp4", "nvfp4", "deepseek_weight", "int8_channel"}) {
    const Scheme s = scheme_lookup(name);
    std::vector<float> y1(x.size()), y2(x.size());
    std::vector<double> s1, s2;
    set_num_threads(1);
    const SchemeStats a = quantize_scheme<float>(s, x.data(), y1.data(), rows, cols, Rounding::sr, 20, 4, 1, 0, &s1);
    set_num_threads(2);
    const SchemeStats b = quantize_scheme<float>(s, x.data(), y2.data(), rows, cols, Rounding::sr, 20, 4, 1, 0, &s2);
    INFO(name);
    CHECK(test::same_bits(y1, y2));
    CHECK(s1 == s2);
    CHECK(a.blocks == b.blocks);
    CHECK(a.clipped == b.clipped);
  }
}

TEST_CASE("presets, scheme TOML files and their errors") {
  for (const std::string& n : scheme_presets()) {
    INFO(n);
    const Scheme s = scheme_lookup(n);
    CHECK(s.name == n);
    CHECK_NOTHROW(validate(s));
  }
  const Scheme mx = scheme_lookup("MXFP8_E4M3");  // case-insensitive
  CHECK(mx.element.emax == 8);
  CHECK(mx.element.overflow == Overflow::saturate);
  CHECK(mx.block_cols == 32);
  CHECK(mx.scale.name == "e8m0");
  const Scheme nv = scheme_lookup("nvfp4");
  CHECK(nv.two_level);
  CHECK(nv.block_cols == 16);
  CHECK(max_finite(nv.scale) == 448);
  CHECK(scheme_lookup("deepseek_weight").block_rows == 128);
  CHECK(scheme_lookup("int8_channel").block_cols == 0);
  auto err = [](const char* text) { return test::error_of([&] { scheme_from_toml(text, "bad.toml"); }); };
  CHECK_THAT(err("rule='floor'"), Catch::Contains("element"));
  CHECK_THAT(err("element='fp4_e2m1'\nrule='round'"), Catch::Contains("floor, ceil"));
  CHECK_THAT(err("element='fp4_e2m1'\nrule='floor'\nscale='fp32'"), Catch::Contains("e8m0"));
  CHECK_THAT(err("element='e4m3'"), Catch::Contains("saturate"));
  CHECK_THAT(err("element='fp4_e2m1'\nblock=[1]"), Catch::Contains("[rows, cols]"));
  CHECK_THAT(err("element='fp4_e2m1'\nblock=[-1,4]"), Catch::Contains("block"));
  CHECK_THAT(err("element='fp4_e2m1'\ncolour=1"), Catch::Contains("colour"));
  CHECK_THAT(err("element='fp4_e2m1'\nrule='absmax'\ntwo_level=true\nscale='e8m0'"), Catch::Contains("absmax"));
  CHECK_THAT(err("element='fp4_e2m1'\nrule='absmax'\ndivision='reciprocal'"), Catch::Contains("two_level"));
  CHECK_THAT(err("element='fp32'"), Catch::Contains("saturate"));
  CHECK_THAT(err("element='p3109_p4'\nrule='absmax'"), Catch::Contains("saturate"));
  CHECK_THAT(err("element='int8'\nrule='minmax'"), Catch::Contains("uint<B>"));
  CHECK_THAT(err("element='uint8'\nrule='absmax'"), Catch::Contains("uint<B>"));
  CHECK_THAT(err("element='uint24'\nrule='minmax'"), Catch::Contains("16 bits"));
  CHECK_THAT(test::error_of([] { scheme_lookup("mxfp5"); }), Catch::Contains("mxfp4") && Catch::Contains("nvfp4"));
}

TEST_CASE("round-to-odd division and the stochastic rounding of quotients") {
  // RO(a/b) then RN to p bits == RN of the exact quotient: checked against MPFR through the oracle
  // above; here the RO property itself on random operands: odd unless exact, between the neighbours.
  for (uint64_t i = 0; i < 20000; ++i) {
    const double a = std::ldexp(double(random_word(9, 1, i)) + 1, int(random_word(9, 2, i) % 40) - 20);
    const double b = std::ldexp(double(random_word(9, 3, i)) + 1, int(random_word(9, 4, i) % 40) - 20);
    const double q = div_round_odd(a, b), d = a / b;
    CHECK(std::fabs(q - d) <= std::fabs(std::nextafter(d, INFINITY) - d));
    uint64_t u;
    std::memcpy(&u, &q, 8);
    if (std::fma(-d, b, a) != 0) CHECK((u & 1) == 1);
  }
  CHECK(div_round_odd(1.0, 4.0) == 0.25);
  CHECK(std::signbit(div_round_odd(-0.0, 3.0)));
}

#include "core/scheme_block.h"

// The device-facing entry points of scheme_block.h (what src/cuda/scheme.cu runs per block and per
// element) driven by hand, one element at a time, against the array path, bit for bit: the plan,
// the tensor scale (amax gathered in reverse order), the block extremes (two halves joined by
// amax_merge, as a GPU group does), the scale, the kind and scheme_element with each word.
template <class T>
static size_t by_element(const Scheme& s, const std::vector<T>& x, int64_t rows, int64_t cols, Rounding m) {
  const int sr_bits = 20;
  const uint64_t seed = 6, stream = 4, index0 = 5;
  std::vector<T> want(x.size());
  std::vector<double> want_scales, want_z;
  const SchemeStats ws = quantize_scheme<T>(s, x.data(), want.data(), rows, cols, m, sr_bits, seed, stream, index0,
                                            &want_scales, &want_z);
  const SchemeBlockPlan p = plan_scheme_blocks(s, rows, cols, m, sr_bits, seed);
  BlockAmax all;
  for (int64_t i = rows * cols - 1; i >= 0; --i) amax_add(all, double(x[size_t(i)]));
  const TensorScale ts = tensor_scale(p, all.amax, all.bad);
  std::vector<T> got(x.size());
  SchemeStats gs;
  gs.global_scale = s.two_level ? ts.G : 1.0;
  size_t bad = 0;
  for (int64_t bi = 0; bi < p.nbr; ++bi)
    for (int64_t bj = 0; bj < p.nbc; ++bj) {
      const int64_t r0 = bi * p.br, c0 = bj * p.bc;
      const int64_t nr = std::min(p.br, rows - r0), nc = std::min(p.bc, cols - c0), n = nr * nc;
      auto at = [&](int64_t e) { return (r0 + e / nc) * cols + c0 + e % nc; };
      BlockAmax a, tail;
      for (int64_t e = 0; e < n; ++e) amax_add(e < n / 2 ? a : tail, double(x[size_t(at(e))]));
      amax_merge(a, tail);
      const BlockScale b = block_scale(p, ts, a);
      const BlockKind kind = block_kind(a, b);
      ++gs.blocks;
      gs.nan_blocks += kind == BlockKind::nan, gs.zero_blocks += kind == BlockKind::zero;
      const size_t k = size_t(bi * p.nbc + bj);
      if (!same(b.reported, want_scales[k]) || b.z != want_z[k]) ++bad;
      const bool plain = plain_quotient<T>(p, b);
      for (int64_t e = 0; e < n; ++e) {
        const int64_t i = at(e);
        const T v = x[size_t(i)];
        if (kind == BlockKind::values) gs.clipped += element_clipped(p, b, double(v));
        const uint32_t word = random_word(seed, stream, index0 + uint64_t(i));
        got[size_t(i)] = with_rounding(m, [&](auto mode) {
          return scheme_element<decltype(mode)::value>(p, b, kind, plain, v, word);
        });
      }
    }
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ < 3)
      FAIL_CHECK(fmt::format("{} {} [{}] x={} hd={} array={}", s.name, to_string(m), i, test::hex(double(x[i])),
                             test::hex(double(got[i])), test::hex(double(want[i]))));
  if (gs.blocks != ws.blocks || gs.nan_blocks != ws.nan_blocks || gs.zero_blocks != ws.zero_blocks ||
      gs.clipped != ws.clipped || !same(gs.global_scale, ws.global_scale))
    ++bad;
  return bad;
}

TEST_CASE("scheme_block.h one element at a time == quantize_scheme: presets, modes, containers, NaN and zero blocks") {
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::ro,
                            Rounding::sr, Rounding::sre};
  std::vector<Scheme> schemes;
  for (const std::string& name : scheme_presets()) schemes.push_back(scheme_lookup(name));
  schemes.back().block_rows = 3;  // uint8_tensor_zp as 3-row blocks: several ragged zero-point blocks
  schemes.push_back(scheme_from_toml("element='fp4_e2m1'\nrule='ceil'", "ceil.toml"));
  schemes.push_back(scheme_from_toml("element='fp6_e3m2'\nrule='nearest'\nblock=[2,8]", "nearest.toml"));
  schemes.push_back(scheme_from_toml(
      "element='fp4_e2m1'\nrule='absmax'\nscale='e4m3'\nblock=[1,16]\ntwo_level=true\ndivision='reciprocal'",
      "reciprocal.toml"));
  const int64_t rows = 9, cols = 150;  // partial blocks of every shape; deepseek_weight: one ragged 9×128 + 9×22
  for (const Scheme& s : schemes)
    for (const bool special : {false, true})
      for (Rounding m : modes) {
        INFO(s.name << " " << to_string(m) << (special ? " with NaN / inf" : ""));
        std::vector<double> x = values(rows * cols, 17, 40, true);
        for (int64_t j = 0; j < 64; ++j) x[size_t(4 * cols + j)] = 0.0;  // whole zero blocks of 16 and 32
        x[size_t(4 * cols + 3)] = -0.0;
        x[size_t(cols + 2)] = 3.0e37;
        if (special) x[size_t(2 * cols + 40)] = kNaN, x[size_t(6 * cols + 7)] = INFINITY;
        CHECK(by_element(s, std::vector<float>(x.begin(), x.end()), rows, cols, m) == 0);
        std::vector<double> xd = values(rows * cols, 18, 250, false);
        for (int64_t j = 0; j < 64; ++j) xd[size_t(4 * cols + j)] = 0.0;
        if (special) xd[size_t(3 * cols + 1)] = -INFINITY;
        CHECK(by_element(s, xd, rows, cols, m) == 0);
      }
}
