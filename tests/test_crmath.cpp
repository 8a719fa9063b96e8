// crmath: the correctly rounded binary32 exp, erf and tanh against MPFR, the array kernels against the
// scalar definitions, and the activation buffers (GELU, SwiGLU, softmax) against their element
// definitions, bit for bit. The exhaustive comparison of all 2^32 inputs is hidden ([full]).
#include <catch2/catch.hpp>

#include <gmp.h>
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/crmath.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "nn/activation.h"
#include "nn/policy.h"
#include "testutil.h"

using namespace mantis;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

float next_up(float x, int k = 1) {
  for (int i = 0; i < k; ++i) x = std::nextafter(x, kInf);
  return x;
}
float next_down(float x, int k = 1) {
  for (int i = 0; i < k; ++i) x = std::nextafter(x, -kInf);
  return x;
}

// Inputs every check sees: specials, subnormals, each function's thresholds and piece boundaries
// with their neighbours, then random bit patterns and random values of ordinary magnitude.
std::vector<float> inputs(uint64_t seed, size_t random) {
  std::vector<float> v = {0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(),
                          float_from_bits(0x7f800001u), float_from_bits(0xffc12345u), 0x1p-149f, -0x1p-149f,
                          0x1p-126f, 0x1.fffffcp-127f, std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), 1.0f, -1.0f, 0x1p-24f, 0x1p-25f, -0x1p-24f, -0x1p-25f,
                          -0x1p-26f, 0x1p-23f};
  // exp: overflow (≈ 88.72), the subnormal range (≈ −87.34) and underflow to 0 (≈ −103.97);
  // erf: where it rounds to 1 (≈ 3.92), the polynomial's end (4), the pieces (j/4)
  std::vector<float> edges = {88.72283935546875f, -87.33654475f, -103.972084045410f, -103.27892f, 3.9192059f, 4.0f,
                              -4.0f, 90.0f, -110.0f, 0.5f, -0.5f, 0.25f, 9.0109f, 9.5f, -9.5f};
  for (int j = 1; j <= 16; ++j) edges.push_back(float(j) / 4);
  for (float e : edges)
    for (int k = 0; k < 40; ++k) v.push_back(next_up(e, k)), v.push_back(next_down(e, k)), v.push_back(-next_up(e, k));
  for (size_t i = 0; i < random; ++i) {
    const uint32_t w = random_word(seed, 1, i);
    v.push_back(float_from_bits(w));
    v.push_back(float(int32_t(w)) * 0x1p-26f);  // |x| < 32
  }
  return v;
}

bool same(float a, float b) { return to_bits(a) == to_bits(b); }

// The exception tables of crmath_exceptions.h (0 exp, 1 erf, 2 tanh), without the sentinel.
std::vector<std::pair<uint32_t, uint32_t>> table(int fn) {
  constexpr uint32_t e[][2] = MANTIS_CRMATH_EXP_EXCEPTIONS;
  constexpr uint32_t r[][2] = MANTIS_CRMATH_ERF_EXCEPTIONS;
  constexpr uint32_t h[][2] = MANTIS_CRMATH_TANH_EXCEPTIONS;
  std::vector<std::pair<uint32_t, uint32_t>> t;
  for (const auto* row = fn == 0 ? e : fn == 1 ? r : h; row[0][0] != 0xffffffffu; ++row) t.push_back({row[0][0], row[0][1]});
  return t;
}

float cr(int fn, float x) { return fn == 0 ? cr_expf(x) : fn == 1 ? cr_erff(x) : cr_tanhf(x); }
float oracle(int fn, float x) { return fn == 0 ? oracle_expf(x) : fn == 1 ? oracle_erff(x) : oracle_tanhf(x); }
double eval(int fn, float a) { return fn == 0 ? crmath::exp_eval(a) : fn == 1 ? crmath::erf_eval(a) : crmath::tanh_eval(a); }

}  // namespace

TEST_CASE("crmath's constants are the binary64 roundings of what they name (MPFR)") {
  mpfr_t a, b;
  mpfr_inits2(300, a, b, (mpfr_ptr)0);
  constexpr double T[16] = MANTIS_CRMATH_EXP_T;
  for (int j = 0; j < 16; ++j) {
    mpfr_set_ui(a, 2, MPFR_RNDN);
    mpfr_set_si(b, j, MPFR_RNDN);
    mpfr_div_ui(b, b, 16, MPFR_RNDN);
    mpfr_pow(a, a, b, MPFR_RNDN);
    INFO("2^(" << j << "/16)");
    CHECK(mpfr_get_d(a, MPFR_RNDN) == T[j]);
  }
  mpfr_const_log2(a, MPFR_RNDN);
  mpfr_ui_div(b, 16, a, MPFR_RNDN);
  CHECK(mpfr_get_d(b, MPFR_RNDN) == crmath::kExpInvLn2_16);
  // head + tail = ln2/16 to far beyond binary64, and k·head is exact for |k| < 2^11
  mpfr_div_ui(a, a, 16, MPFR_RNDN);
  mpfr_sub_d(a, a, crmath::kExpLn2_16Hi, MPFR_RNDN);
  mpfr_sub_d(a, a, crmath::kExpLn2_16Lo, MPFR_RNDN);
  CHECK(std::fabs(mpfr_get_d(a, MPFR_RNDN)) < 0x1p-100);
  const uint64_t head = to_bits(crmath::kExpLn2_16Hi) & 0xfffffffffffffull;
  CHECK((head & ((uint64_t(1) << 11) - 1)) == 0);
  mpfr_clears(a, b, (mpfr_ptr)0);
}

TEST_CASE("crmath's binary64 evaluations are within 2^-50 of the exact value (MPFR), inside kHardWidth") {
  // Dense over the domains: every piece of erf and every table entry of exp, with the ends.
  double worst_exp = 0, worst_erf = 0;
  const std::vector<float> xs = inputs(7, test::scaled(200000));
  for (float x : xs) {
    if (!(x > -87.0f && x < 88.0f)) continue;
    const double y = crmath::exp_eval(x), ref = oracle_exp64(x);
    worst_exp = std::max(worst_exp, std::fabs(y / ref - 1));
  }
  for (float x : xs) {
    const float a = std::fabs(x);
    if (!(a > 0x1p-100f && a < 4.0f)) continue;
    const double y = crmath::erf_eval(a), ref = oracle_erf64(a);
    worst_erf = std::max(worst_erf, std::fabs(y / ref - 1));
  }
  double worst_tanh = 0;
  for (float x : xs) {
    const float a = std::fabs(x);
    if (!(a > 0x1p-100f && a < 9.5f)) continue;
    const double y = crmath::tanh_eval(a), ref = oracle_tanh64(a);
    worst_tanh = std::max(worst_tanh, std::fabs(y / ref - 1));
  }
  INFO("exp " << std::log2(worst_exp) << ", erf " << std::log2(worst_erf) << ", tanh " << std::log2(worst_tanh)
              << " (log2 of the largest relative error)");
  CHECK(worst_exp > 0);
  CHECK(worst_erf > 0);
  CHECK(worst_tanh > 0);
  CHECK(worst_exp < 0x1p-50);
  CHECK(worst_erf < 0x1p-50);
  CHECK(worst_tanh < 0x1p-48);  // (E − 1)/(E + 1) loses ~2 bits near a = 1/4
  CHECK(0x1p-50 * 16 <= crmath::kHardWidth);  // the flagging margin
}

TEST_CASE("cr_expf and cr_erff are correctly rounded (MPFR) on specials, thresholds, pieces and random inputs") {
  const std::vector<float> xs = inputs(11, test::scaled(300000));
  size_t bad_exp = 0, bad_erf = 0, bad_tanh = 0, checked = 0;
  for (float x : xs) {
    const float e = cr_expf(x), r = cr_erff(x), t = cr_tanhf(x);
    const float we = oracle_expf(x), wr = oracle_erff(x), wt = oracle_tanhf(x);
    if (std::isnan(x)) {  // the canonical quiet NaN
      CHECK(to_bits(e) == crmath::kQuietNaN);
      CHECK(to_bits(r) == crmath::kQuietNaN);
      CHECK(to_bits(t) == crmath::kQuietNaN);
      continue;
    }
    if (!same(e, we) && bad_exp++ < 5) FAIL_CHECK("exp " << test::hex(x) << ": " << test::hex(e) << " vs MPFR " << test::hex(we));
    if (!same(r, wr) && bad_erf++ < 5) FAIL_CHECK("erf " << test::hex(x) << ": " << test::hex(r) << " vs MPFR " << test::hex(wr));
    if (!same(t, wt) && bad_tanh++ < 5) FAIL_CHECK("tanh " << test::hex(x) << ": " << test::hex(t) << " vs MPFR " << test::hex(wt));
    ++checked;
  }
  CHECK(bad_exp == 0);
  CHECK(bad_erf == 0);
  CHECK(bad_tanh == 0);
  CHECK(same(cr_tanhf(-0.0f), -0.0f));
  CHECK(same(cr_tanhf(-kInf), -1.0f));
  CHECK(same(cr_tanhf(0x1p-149f), 0x1p-149f));
  CHECK(checked > 600000 * test::scale());
  // the IEEE cases, spelled out
  CHECK(same(cr_expf(0.0f), 1.0f));
  CHECK(same(cr_expf(-0.0f), 1.0f));
  CHECK(same(cr_expf(kInf), kInf));
  CHECK(same(cr_expf(-kInf), 0.0f));
  CHECK(same(cr_expf(89.0f), kInf));
  CHECK(same(cr_expf(-104.0f), 0.0f));
  CHECK(same(cr_erff(-0.0f), -0.0f));
  CHECK(same(cr_erff(-kInf), -1.0f));
  CHECK(same(cr_erff(0x1p-149f), oracle_erff(0x1p-149f)));
}

TEST_CASE("crmath's exception lookup: a listed input gets its entry, any other keeps the rounded value") {
  constexpr uint32_t tab[][2] = {{0x3f800000u, 0x40000000u}, {0x40400000u, 0x3f000000u}, {0xffffffffu, 0}};
  CHECK(same(crmath::lookup(tab, 0x3f800000u, 7.0f), 2.0f));
  CHECK(same(crmath::lookup(tab, 0x40400000u, 7.0f), 0.5f));
  for (const uint32_t miss : {0u, 0x3f7fffffu, 0x3f800001u, 0x40400001u, 0x7f800000u, 0xfffffffeu})
    CHECK(same(crmath::lookup(tab, miss, 7.0f), 7.0f));
  constexpr uint32_t none[][2] = {{0xffffffffu, 0}};
  CHECK(same(crmath::lookup(none, 0x3f800000u, 7.0f), 7.0f));
}

TEST_CASE("crmath's exception tables: sorted, each entry flagged near a boundary and equal to MPFR") {
  // Both committed tables are empty: on every binary32 input the binary64 values round correctly
  // (mantis verify --function exp|erf --exhaustive). The checks below cover any entry a change of
  // the constants brings.
  CHECK(table(0).size() + table(1).size() + table(2).size() < 1000);
  for (int fn = 0; fn < 3; ++fn) {
    const auto t = table(fn);
    INFO("function " << fn << ": " << t.size() << " entries");
    for (size_t i = 0; i < t.size(); ++i) {
      const float x = float_from_bits(t[i].first);
      INFO("entry " << test::hex(x));
      if (i) CHECK(t[i - 1].first < t[i].first);
      if (fn) CHECK((t[i].first & 0x80000000u) == 0);
      bool hard;
      const float f = crmath::round_checked(eval(fn, x), hard);
      CHECK(hard);
      CHECK(!same(f, float_from_bits(t[i].second)));  // needed: the binary64 value rounds wrongly
      CHECK(same(float_from_bits(t[i].second), oracle(fn, x)));
      CHECK(same(cr(fn, x), float_from_bits(t[i].second)));
      if (fn) CHECK(same(cr(fn, -x), -float_from_bits(t[i].second)));
      for (int k = 1; k <= 64; ++k)
        for (const float z : {next_up(x, k), next_down(x, k)}) CHECK(same(cr(fn, z), oracle(fn, z)));
    }
  }
}

TEST_CASE("crmath's array kernels equal the scalar definitions (any length, in place, every input class)") {
  std::vector<float> xs = inputs(13, test::scaled(1000000));
  std::vector<float> e(xs.size()), r(xs.size()), ep(xs.size()), rp(xs.size()), h(xs.size()), hp(xs.size());
  cr_expf_array(xs.data(), e.data(), xs.size());
  cr_erff_array(xs.data(), r.data(), xs.size());
  cr_tanhf_array(xs.data(), h.data(), xs.size());
  cr_expf_array_portable(xs.data(), ep.data(), xs.size());
  cr_erff_array_portable(xs.data(), rp.data(), xs.size());
  cr_tanhf_array_portable(xs.data(), hp.data(), xs.size());
  size_t bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float se = cr_expf(xs[i]), sr = cr_erff(xs[i]), sh = cr_tanhf(xs[i]);
    if (!same(e[i], se) || !same(r[i], sr) || !same(ep[i], se) || !same(rp[i], sr) || !same(h[i], sh) ||
        !same(hp[i], sh)) {
      if (bad++ < 5) FAIL_CHECK("x = " << test::hex(xs[i]) << ": exp " << test::hex(e[i]) << " / " << test::hex(se)
                                       << ", erf " << test::hex(r[i]) << " / " << test::hex(sr));
    }
  }
  CHECK(bad == 0);
  // every tail length and offset, in place
  for (size_t n = 0; n <= 40; ++n)
    for (size_t off = 0; off < 3; ++off) {
      std::vector<float> a(xs.begin() + long(off * 97), xs.begin() + long(off * 97 + n)), b = a, c = a;
      cr_expf_array(a.data(), a.data(), n);
      cr_erff_array(b.data(), b.data(), n);
      cr_tanhf_array(c.data(), c.data(), n);
      for (size_t i = 0; i < n; ++i) {
        CHECK(same(a[i], cr_expf(xs[off * 97 + i])));
        CHECK(same(b[i], cr_erff(xs[off * 97 + i])));
        CHECK(same(c[i], cr_tanhf(xs[off * 97 + i])));
      }
    }
  // inputs that need the exception lookup, inside full vectors
  for (int fn = 0; fn < 3; ++fn)
    for (const auto& [x, res] : table(fn)) {
      std::vector<float> v(37, 0.5f), out(37);
      v[17] = float_from_bits(x), v[3] = -float_from_bits(x);
      (fn == 0 ? cr_expf_array : fn == 1 ? cr_erff_array : cr_tanhf_array)(v.data(), out.data(), v.size());
      CHECK(same(out[17], float_from_bits(res)));
      CHECK(same(out[3], cr(fn, v[3])));
    }
}

TEST_CASE("activation buffers equal their element definitions bit for bit (GELU, SwiGLU, softmax)") {
  const std::vector<float> xs = inputs(17, 20000);
  const Eigen::Index T = 37, H = 91;  // ragged against the 1024-element chunks and 16-lane vectors
  Matrix<float> x(T, H), u(T, H), d(T, H);
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    x.data()[i] = float(int32_t(random_word(3, 0, uint64_t(i)))) * 0x1p-28f;  // |x| < 8
    u.data()[i] = float(int32_t(random_word(3, 1, uint64_t(i)))) * 0x1p-30f;
    d.data()[i] = float(int32_t(random_word(3, 2, uint64_t(i)))) * 0x1p-31f;
  }
  x(0, 0) = 0, x(0, 1) = -0.0f, x(0, 2) = 100, x(0, 3) = -100, x(0, 4) = 1e-40f, x(0, 5) = -200;
  SitePlan plain;
  for (const bool keep : {false, true}) {
    INFO("aux kept: " << keep);
    {  // the tanh GELU
      Matrix<float> h = x, aux;
      detail::gelu_forward<float>(plain, 0, true, h, nullptr, keep ? &aux : nullptr);
      Matrix<float> g = d;
      detail::gelu_backward<float>(x, true, g, keep ? &aux : nullptr);
      for (Eigen::Index i = 0; i < x.size(); ++i) {
        const float v = x.data()[i];
        INFO("tanh GELU x = " << test::hex(v));
        CHECK(same(h.data()[i], act::gelu(v, true)));
        if (keep) CHECK(same(aux.data()[i], cr_tanhf(act::gelu_tanh_arg(v))));
        CHECK(same(g.data()[i], d.data()[i] * act::gelu_grad(v, true)));
      }
    }
    Matrix<float> h = x, aux;
    detail::gelu_forward<float>(plain, 0, false, h, nullptr, keep ? &aux : nullptr);
    CHECK(aux.size() == (keep ? x.size() : 0));
    Matrix<float> g = d;
    detail::gelu_backward<float>(x, false, g, keep ? &aux : nullptr);
    Matrix<float> gg = x, uu = u, dh = d, dup(T, H), saux;
    detail::silu_forward<float>(plain, 0, gg, uu, nullptr, keep ? &saux : nullptr);
    detail::swiglu_backward<float>(x, u, dh, dup, keep ? &saux : nullptr);
    for (Eigen::Index i = 0; i < x.size(); ++i) {
      const float v = x.data()[i];
      INFO("x = " << test::hex(v));
      CHECK(same(h.data()[i], act::gelu(v, false)));
      if (keep) CHECK(same(aux.data()[i], cr_erff(v * 0.7071067811865476f)));
      CHECK(same(g.data()[i], d.data()[i] * act::gelu_grad(v, false)));
      CHECK(same(gg.data()[i], act::swiglu(v, u.data()[i])));
      float dg, du;
      act::swiglu_backward(d.data()[i], v, u.data()[i], dg, du);
      CHECK(same(dh.data()[i], dg));
      CHECK(same(dup.data()[i], du));
    }
  }
  // an input rounding at the site: nothing kept (the backward recomputes at the tape's inputs)
  {
    SitePolicy sp;
    sp.input = format_lookup("bf16");
    const SitePlan rounded = plan_site(sp);
    Matrix<float> h = x, aux(1, 1);
    detail::gelu_forward<float>(rounded, 5, false, h, nullptr, &aux);
    CHECK(aux.size() == 0);
  }
  // softmax numerators: rows of every length up to 70, with NaNs, infinities and signed-zero maxima
  std::vector<std::vector<float>> rows;
  for (int n = 1; n <= 70; ++n) {
    std::vector<float> r(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) r[size_t(j)] = float(int32_t(random_word(5, uint64_t(n), uint64_t(j)))) * 0x1p-27f;
    rows.push_back(r);
  }
  auto with = [&](std::vector<float> r, size_t at, float v) {
    r[std::min(at, r.size() - 1)] = v;
    return r;
  };
  for (size_t n : {17u, 33u, 64u}) {
    rows.push_back(with(rows[n - 1], 0, std::numeric_limits<float>::quiet_NaN()));
    rows.push_back(with(rows[n - 1], 9, std::numeric_limits<float>::quiet_NaN()));
    rows.push_back(with(rows[n - 1], 20, kInf));
    rows.push_back(with(rows[n - 1], 5, -kInf));
    std::vector<float> z(n, -1.0f);
    z[3] = -0.0f, z[11] = 0.0f;
    rows.push_back(z);
    z[3] = 0.0f, z[11] = -0.0f;
    rows.push_back(z);
    rows.push_back(std::vector<float>(n, -200.0f));
  }
  for (const auto& r : rows) {
    std::vector<float> e1(r.size()), e2 = r;
    float m1, m2;
    const float s1 = act::softmax_numerators(r.data(), e1.data(), int64_t(r.size()), m1);
    const float s2 = detail::softmax_numerators(e2.data(), e2.data(), int64_t(r.size()), m2);  // in place
    INFO("row of " << r.size());
    CHECK((same(s1, s2) || (std::isnan(s1) && std::isnan(s2))));
    CHECK((same(m1, m2) || (std::isnan(m1) && std::isnan(m2))));
    for (size_t j = 0; j < r.size(); ++j) CHECK((same(e1[j], e2[j]) || (std::isnan(e1[j]) && std::isnan(e2[j]))));
  }
}

// Hidden (`test_crmath "[full]"`, ~50 min on 2 cores): every binary32 input against MPFR, the three
// functions, through the array kernel and the scalar definition (mantis verify --function does the
// same from the command line).
TEST_CASE("cr_expf, cr_erff and cr_tanhf equal MPFR on all 2^32 inputs", "[.][full]") {
  for (int fn = 0; fn < 3; ++fn) {
    uint64_t bad = 0;
    std::vector<float> in(1 << 16), out(1 << 16);
    for (uint64_t c = 0; c < (uint64_t(1) << 32); c += in.size()) {
      for (size_t i = 0; i < in.size(); ++i) in[i] = float_from_bits(uint32_t(c + i));
      (fn == 0 ? cr_expf_array : fn == 1 ? cr_erff_array : cr_tanhf_array)(in.data(), out.data(), in.size());
#pragma omp parallel for reduction(+ : bad) schedule(static)
      for (size_t i = 0; i < in.size(); ++i) {
        const float want = oracle(fn, in[i]);
        bad += !(same(out[i], want) && same(cr(fn, in[i]), want));
      }
    }
    INFO("function " << fn);
    CHECK(bad == 0);
  }
}
