// test_gefen — Gefen's period rule (against brute force and crafted tensors) and the Gefen
// optimizer (against a scalar binary32 restatement of optim/gefen.h, bit for bit, and a binary64
// restatement of its definition with a tolerance; state bytes, state round trip, threads, errors).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "core/format.h"
#include "core/round.h"
#include "core/threads.h"
#include "optim/adamw.h"
#include "optim/gefen.h"
#include "optim/gefen_codebook.h"
#include "optim/gefen_muon.h"
#include "optim/gefen_period.h"
#include "optim/optimizer.h"
#include "testutil.h"
#include "train/train.h"

using namespace mantis;
using mantis::test::error_of;

namespace {

// The code's rule restated by brute force: divisors by trial division, plain sequential sums
// (not numpy's pairwise order: equal to the last bits, so only non-near-tie inputs are used).
size_t brute_period(const std::vector<float>& g) {
  const size_t n = g.size();
  std::vector<std::pair<size_t, double>> sc;
  for (size_t p = 1; p <= n; ++p) {
    if (n % p || n / p < 4) continue;
    std::vector<double> mu;
    for (size_t b = 0; b < n / p; ++b) {
      double s = 0;
      for (size_t i = b * p; i < (b + 1) * p; ++i) s += std::log(double(g[i] * g[i]) + 1e-12);
      mu.push_back(s / double(p));
    }
    double d = 0;
    for (size_t b = 0; b + 1 < mu.size(); ++b) d += std::abs(mu[b + 1] - mu[b]);
    sc.push_back({p, d / double(mu.size() - 1)});
  }
  size_t best = 1;
  double bs = -1;
  for (size_t i = 1; i + 1 < sc.size(); ++i)
    if (sc[i].first > 8 && sc[i].second > sc[i - 1].second && sc[i].second > sc[i + 1].second &&
        (sc[i].second > bs || (sc[i].second == bs && sc[i].first > best)))
      best = sc[i].first, bs = sc[i].second;
  if (best > 1024)
    for (size_t p = 1025; p <= best; ++p)
      if (n % p == 0 && best % p == 0) return p;
  return best;
}

// rows × cols, every row its own scale (a gradient whose v varies by row).
std::vector<float> rowwise(size_t rows, size_t cols, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> z(0, 1);
  std::uniform_real_distribution<float> sc(-6, 2);
  std::vector<float> g(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    const float s = std::exp(sc(r));
    for (size_t j = 0; j < cols; ++j) g[i * cols + j] = s * z(r);
  }
  return g;
}

}  // namespace

TEST_CASE("gefen period: numpy's pairwise summation order, divisors, the magnitude block") {
  std::vector<double> a(300);
  for (size_t i = 0; i < a.size(); ++i) a[i] = double(i % 7) - 2.5;  // exact sums
  double exact = 0;
  for (double x : a) exact += x;
  CHECK(gefen_pairwise_sum(a) == exact);
  // A case where the order shows: 1 + 2^-53 + … sequentially loses what pairs keep.
  std::vector<double> b(16, 0x1p-53);
  b[0] = 1.0;
  double seq = 0;
  for (double x : b) seq += x;
  CHECK(seq == 1.0);
  // eight lanes: lane 0 is 1 + 2^-53 = 1, lanes 1..7 hold 2·2^-53 each; (r0+r1) = 1+2^-52, …
  const double lane = 2 * 0x1p-53;
  CHECK(gefen_pairwise_sum(b) == ((1.0 + lane) + (lane + lane)) + ((lane + lane) + (lane + lane)));
  CHECK(gefen_pairwise_sum(std::vector<double>{}) == 0.0);
  CHECK(gefen_divisors(1).empty());
  CHECK(gefen_divisors(12) == std::vector<size_t>{1, 2, 3, 4, 6, 12});
  CHECK(gefen_divisors(49) == std::vector<size_t>{1, 7, 49});
  CHECK(gefen_magnitude_block(768 * 3072, 768) == 768);
  CHECK(gefen_magnitude_block(768, 1) == 256);
  CHECK(gefen_magnitude_block(200, 1) == 200);
  CHECK(gefen_magnitude_block(257, 1) == 1);  // prime: 9 bytes per element
  CHECK(gefen_magnitude_block(1000, 1) == 250);
}

TEST_CASE("gefen period (code): rows, n < 8, primes, zeros, ties, the cap, brute force") {
  for (size_t cols : {16, 24, 64, 96}) {
    const auto g = rowwise(32, cols, cols);
    CHECK(gefen_period(g, GefenPeriodRule::code) == cols);
    CHECK(brute_period(g) == cols);
  }
  for (size_t n = 1; n < 8; ++n) CHECK(gefen_period(std::vector<float>(n, 1.0f), GefenPeriodRule::code) == 1);
  // n = 8: candidates 1, 2, no interior one
  CHECK(gefen_period(rowwise(4, 2, 1), GefenPeriodRule::code) == 1);
  // primes: the only candidate is 1
  for (size_t n : {257, 1031}) {
    const auto g = rowwise(1, n, n);
    CHECK(gefen_period_scores(g, GefenPeriodRule::code).size() == 1);
    CHECK(gefen_period(g, GefenPeriodRule::code) == 1);
  }
  // all zero: every block mean is ln 1e-12, every score 0, no strict maximum
  const std::vector<float> zero(4096, 0.0f);
  for (auto& s : gefen_period_scores(zero, GefenPeriodRule::code)) CHECK(s.score == 0.0);
  CHECK(gefen_period(zero, GefenPeriodRule::code) == 1);
  // zero rows among scaled ones: still the row length
  auto gz = rowwise(32, 48, 7);
  for (size_t r = 0; r < 32; r += 3) std::fill(gz.begin() + long(r * 48), gz.begin() + long(r * 48 + 48), 0.0f);
  CHECK(gefen_period(gz, GefenPeriodRule::code) == 48);
  CHECK(brute_period(gz) == 48);
  // the choice: interior strict maxima with p > 8, the largest score, ties to the larger p
  const size_t n = 720;
  std::vector<GefenPeriodScore> s = {{1, 0.1}, {2, 0.5}, {4, 0.2}, {9, 0.3}, {10, 0.2}, {12, 0.3}, {16, 0.1}};
  CHECK(gefen_period_choice(s, n, GefenPeriodRule::code) == 12);  // 9 and 12 tie: the larger p; 2 is ≤ 8
  s[3].score = 0.31;
  CHECK(gefen_period_choice(s, n, GefenPeriodRule::code) == 9);
  s = {{1, 0.1}, {9, 0.3}, {10, 0.3}, {12, 0.2}};  // a plateau is no strict maximum
  CHECK(gefen_period_choice(s, n, GefenPeriodRule::code) == 1);
  s = {{1, 0.1}, {9, 0.3}, {10, 0.2}, {12, 0.5}};  // the last candidate is not interior
  CHECK(gefen_period_choice(s, n, GefenPeriodRule::code) == 9);
  // the cap: the smallest divisor of n in (1024, P] that divides P
  CHECK(gefen_period_cap(1024, 4096) == 1024);
  CHECK(gefen_period_cap(3000, 24000) == 1500);
  CHECK(gefen_period_cap(2048, 8192) == 2048);
  CHECK(gefen_period_cap(4099, 4 * 4099) == 4099);
  const auto wide = rowwise(8, 3000, 3);
  CHECK(gefen_period(wide, GefenPeriodRule::code) == 1500);
  CHECK(brute_period(wide) == 1500);
  // random structure (rows of random length, random noise) against brute force
  std::mt19937_64 r(11);
  for (int k = 0; k < 40; ++k) {
    const size_t rows = 2 + r() % 40, cols = 1 + r() % 70;
    auto g = rowwise(rows, cols, r());
    if (k % 3 == 0)
      for (auto& x : g) x *= float(1 + r() % 3);
    INFO(rows << " x " << cols);
    CHECK(gefen_period(g, GefenPeriodRule::code) == brute_period(g));
  }
  CHECK_THROWS_WITH(gefen_period(std::vector<float>{1, 2, 3, 4, 5, 6, 7, NAN}, GefenPeriodRule::code),
                    "gefen period: gradient element 7 is not finite (nan)");
}

TEST_CASE("gefen period (brief): E(p) and where its drop from the top ends") {
  for (size_t cols : {16, 24, 64, 96}) CHECK(gefen_period(rowwise(32, cols, cols + 1), GefenPeriodRule::brief) == cols);
  // E(p) by hand: blocks {0,0} and {1,1} of ln(g²+1e-12) values
  const std::vector<float> g = {1, 1, 1, 1, 2, 2, 2, 2};
  const auto e = gefen_period_scores(g, GefenPeriodRule::brief);
  REQUIRE(e.size() == 2);  // p = 1, 2 (n/p ≥ 4)
  CHECK(e[0].score == 0.0);
  CHECK(e[1].score == 0.0);
  std::vector<GefenPeriodScore> s = {{1, 0}, {2, 1.0}, {4, 1.0}, {16, 1.0}, {32, 1.0}, {64, 3.0}};
  CHECK(gefen_period_choice(s, 1024, GefenPeriodRule::brief) == 32);
  s[5].score = 1.25;  // within 25% of the floor: the drop ends at 64
  CHECK(gefen_period_choice(s, 1024, GefenPeriodRule::brief) == 64);
  s[5].score = 1.2500001;
  CHECK(gefen_period_choice(s, 1024, GefenPeriodRule::brief) == 32);
  s = {{1, 0}, {2, 1.0}, {4, 3.0}, {8, 3.0}};  // a drop at p = 2 < 8 gives 1
  CHECK(gefen_period_choice(s, 1024, GefenPeriodRule::brief) == 1);
  CHECK(gefen_period(std::vector<float>(4096, 0.0f), GefenPeriodRule::brief) == 1);
}

namespace {

// A parameter set with every kind of tensor Gefen meets: a row-structured matrix (P = its row),
// one big enough for the threaded path, 1-D gains (P = 1, Q ≤ 256), a prime length (Q = 1), a
// single element, and a gradient that is zero throughout (mag = 0: the code nearest 0).
struct Fixture {
  Model m;
  ParamSet ps;
  std::vector<std::string> names;
};

Fixture fixture() {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"w", {40, 24}}, {"big", {96, 256}}, {"gain", {768}}, {"prime", {257}}, {"one", {1}}, {"zero", {8, 16}}};
  Fixture f;
  f.ps = param_set(shapes);
  std::mt19937_64 r(5);
  std::normal_distribution<float> z(0, 1);
  for (auto& [n, s] : shapes) {
    Tensor t;
    t.shape = s;
    t.data.resize(size_t(t.numel()));
    for (auto& x : t.data) x = 0.02f * z(r);
    f.m.params[n] = t;
    f.names.push_back(n);
  }
  return f;
}

// Gradients of step t: row scales times integers / 256 (a few hundred occupied histogram bins, so
// the DP runs but stays fast); "zero" stays zero.
GradMap<float> grads(const Fixture& f, int t) {
  GradMap<float> g;
  std::mt19937_64 r(100 + uint64_t(t));
  for (auto& n : f.names) {
    const auto& p = f.m.params.at(n);
    std::vector<float> x(p.data.size(), 0.0f);
    const size_t cols = p.shape.size() == 2 ? size_t(p.shape[1]) : x.size();
    if (n != "zero")
      for (size_t i = 0; i < x.size(); i += cols) {
        const float s = std::ldexp(1.0f, int(r() % 9) - 12);
        for (size_t j = i; j < i + cols; ++j)  // ±1 at every 8th element: each block's absmax is s
          x[j] = s * (j % 8 == 0 ? (r() % 2 ? 1.0f : -1.0f) : float(int(r() % 401) - 200) / 256.0f);
      }
    g[n] = x;
  }
  return g;
}

// optim/gefen.h's step restated as a plain scalar loop in binary32, operation by operation.
struct RefSlot {
  size_t P = 0, Q = 0;
  std::vector<uint8_t> idx;
  std::vector<float> mag, v;
};
struct Ref {
  GefenConfig c;
  std::vector<float> C;
  std::map<std::string, RefSlot> s;
  uint64_t t = 0;
};

// torch.mean(g·g, dim=1)'s binary32 sum (ATen's cascade, 8 lanes), restated from the
// description in optim/gefen.h over explicit vectors (a second writing, not the library's).
using Lanes = std::vector<float>;
Lanes cascade(const std::vector<Lanes>& v) {  // multi_row_sum + row_sum over elements v
  const size_t L = v.empty() ? 1 : v[0].size(), size = v.size(), nil = size / 4;
  int64_t cl = nil <= 2 ? 1 : int64_t(std::bit_width(uint64_t(nil - 1)));
  const size_t power = size_t(std::max<int64_t>(4, cl / 4)), step = size_t(1) << power;
  std::vector<std::vector<Lanes>> acc(4, std::vector<Lanes>(4, Lanes(L, 0.0f)));
  auto add = [](Lanes& a, const Lanes& b) {
    for (size_t l = 0; l < a.size(); ++l) a[l] = a[l] + b[l];
  };
  size_t i = 0;
  while (i + step <= nil) {
    for (size_t j = 0; j < step; ++j)
      for (size_t k = 0; k < 4; ++k) add(acc[0][k], v[(i + j) * 4 + k]);
    i += step;
    for (size_t j = 1; j < 4; ++j) {
      for (size_t k = 0; k < 4; ++k) add(acc[j][k], acc[j - 1][k]), acc[j - 1][k] = Lanes(L, 0.0f);
      if ((i & ((step - 1) << (j * power))) != 0) break;
    }
  }
  for (; i < nil; ++i)
    for (size_t k = 0; k < 4; ++k) add(acc[0][k], v[i * 4 + k]);
  for (size_t j = 1; j < 4; ++j)
    for (size_t k = 0; k < 4; ++k) add(acc[0][k], acc[j][k]);
  for (size_t e = nil * 4; e < size; ++e) add(acc[0][0], v[e]);
  for (size_t k = 1; k < 4; ++k) add(acc[0][0], acc[0][k]);
  return acc[0][0];
}
float ref_torch_sum(const std::vector<float>& x) {
  if (x.size() < 8) {
    std::vector<Lanes> v;
    for (float y : x) v.push_back({y});
    return cascade(v)[0];
  }
  std::vector<Lanes> v;
  for (size_t e = 0; e + 8 <= x.size(); e += 8) v.emplace_back(x.begin() + long(e), x.begin() + long(e + 8));
  const Lanes lanes = cascade(v);
  float fin = 0;
  for (size_t k = v.size() * 8; k < x.size(); ++k) fin = fin + x[k];
  for (float l : lanes) fin = fin + l;
  return fin;
}

uint8_t ref_nearest(const std::vector<float>& C, float x) {
  size_t k = 0;
  while (k < C.size() && C[k] < x) ++k;  // searchsorted, left
  const size_t l = k == 0 ? 0 : std::min(k - 1, C.size() - 1), rr = std::min(k, C.size() - 1);
  const float dl = std::abs(x - C[l]), dr = std::abs(x - C[rr]);
  return uint8_t(dl <= dr ? l : rr);
}

void ref_step(Ref& R, Fixture& f, const GradMap<float>& g, double lr) {
  if (R.t == 0) {
    std::vector<int64_t> counts(kGefenHistogramBins, 0);
    for (auto& n : f.names) {
      RefSlot& s = R.s[n];
      const auto& x = g.at(n);
      s.P = gefen_period(x, R.c.period_rule);
      s.Q = s.P > 1 ? s.P : gefen_magnitude_block(x.size(), 1);
      s.idx.assign(x.size(), 0), s.mag.assign(x.size() / s.Q, 0), s.v.assign(x.size() / s.P, 0);
      add_to_gefen_histogram(x, s.P, counts);
    }
    R.C = learn_gefen_codebook(counts).codes;
  }
  ++R.t;
  const double bc1 = 1 - std::pow(R.c.beta1, double(R.t)), bc2 = 1 - std::pow(R.c.beta2, double(R.t));
  for (auto& n : f.names) {
    RefSlot& s = R.s[n];
    const auto& x = g.at(n);
    auto& p = f.m.params.at(n).data;
    const size_t N = x.size();
    std::vector<float> stepsize(N / s.P), m(N);
    for (size_t b = 0; b < N / s.P; ++b) {
      std::vector<float> sq;
      for (size_t i = b * s.P; i < (b + 1) * s.P; ++i) sq.push_back(x[i] * x[i]);
      const float ms = ref_torch_sum(sq) / float(s.P);
      const float bv = float(R.c.beta2) * s.v[b];
      s.v[b] = std::fma(ms, float(1 - R.c.beta2), bv);
      const float root = std::sqrt(s.v[b]);
      const float h = root / float(std::sqrt(bc2)) + float(R.c.eps);
      const float rec = 1.0f / h;
      stepsize[b] = rec * float(1 / bc1);
    }
    if (f.ps.params[size_t(std::find(f.names.begin(), f.names.end(), n) - f.names.begin())].shape.size() >= 2 &&
        R.c.weight_decay > 0)
      for (auto& y : p) y = y * float(1 - lr * R.c.weight_decay);
    const float w = float(1 - R.c.beta1);
    for (size_t i = 0; i < N; ++i) {
      const float old = R.C[s.idx[i]] * s.mag[i / s.Q];
      const float d = x[i] - old;
      m[i] = std::abs(w) < 0.5f ? std::fma(w, d, old) : std::fma(w - 1.0f, d, x[i]);
    }
    for (size_t q = 0; q < N / s.Q; ++q) {
      float mx = 0;
      for (size_t i = q * s.Q; i < (q + 1) * s.Q; ++i) mx = std::max(mx, std::abs(m[i]));
      s.mag[q] = mx;
    }
    for (size_t i = 0; i < N; ++i) {
      const float mx = s.mag[i / s.Q];
      const float xn = mx > 0 ? m[i] / mx : 0.0f;
      s.idx[i] = ref_nearest(R.C, xn);
      const float qm = R.C[s.idx[i]] * mx;
      const float u1 = qm * stepsize[i / s.P];
      const float u = u1 * float(lr);
      p[i] = p[i] + (-u);
    }
  }
}

template <class T>
std::vector<T> tensor_values(const std::vector<StateTensor>& st, const std::string& name) {
  for (auto& t : st)
    if (t.name == name) {
      std::vector<T> v(t.numel());
      if (!v.empty()) t.copy_to(std::span<T>(v));
      return v;
    }
  FAIL("no state tensor " << name);
  return {};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

namespace {

// Codebooks for NearestCode: learned ones (a Gaussian histogram; a padded one from few bins),
// crafted ones with ±0, duplicates, ±inf, subnormals, a dense cluster inside one key bucket
// (window 6), one too dense for the table (window > 8), short ones; and invalid ones (descending,
// NaN) that must take the reference.
std::vector<std::vector<float>> nearest_codebooks() {
  std::vector<std::vector<float>> out;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<int64_t> counts(kGefenHistogramBins, 0);
  std::vector<float> gr(20000);
  for (auto& x : gr) x = float(nd(rng));
  add_to_gefen_histogram(gr, 50, counts);
  out.push_back(learn_gefen_codebook(counts).codes);
  std::vector<int64_t> few(kGefenHistogramBins, 0);
  few[100] = 3, few[2000] = 5, few[2048] = 1, few[4000] = 2;
  out.push_back(learn_gefen_codebook(few).codes);  // padded: duplicates
  out.push_back({-1.0f, -0.0f, 0.0f, 0.0f, 1e-40f, 3e-39f, 0.25f, 1.0f});
  out.push_back({-std::numeric_limits<float>::infinity(), -2.0f, 0.5f, std::numeric_limits<float>::infinity()});
  out.push_back({0.75f});
  out.push_back({-0.5f, 0.5f});
  std::vector<float> dense;  // 7 codes in [0.5, 0.5 + 2^-8): one bucket of the key's top 16 bits
  for (int j = 0; j < 7; ++j) dense.push_back(0.5f + float(j) * 0x1p-11f);
  dense.push_back(0.9f);
  out.push_back(dense);
  std::vector<float> too_dense;  // 12 codes in one bucket
  for (int j = 0; j < 12; ++j) too_dense.push_back(0.5f + float(j) * 0x1p-12f);
  out.push_back(too_dense);
  out.push_back({0.5f, -0.5f, 1.0f});                                     // not ascending
  out.push_back({-1.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f});  // a NaN
  return out;
}

// Inputs: every code and its neighbours up to 40 ulps either side, midpoints of neighbours and
// their ulps, both ends of every key bucket, the specials, and random bit patterns.
std::vector<float> nearest_inputs(const std::vector<float>& C) {
  std::vector<float> x;
  auto around = [&](float c, int n) {
    float lo = c, hi = c;
    x.push_back(c);
    for (int i = 0; i < n; ++i) {
      lo = std::nextafter(lo, -INFINITY), hi = std::nextafter(hi, INFINITY);
      x.push_back(lo), x.push_back(hi);
    }
  };
  for (size_t j = 0; j < C.size(); ++j) {
    if (std::isnan(C[j])) continue;
    around(C[j], 40);
    if (j > 0 && std::isfinite(C[j]) && std::isfinite(C[j - 1])) around((C[j - 1] + C[j]) * 0.5f, 16);
  }
  for (uint32_t b = 0; b < (1u << 16); ++b)
    for (uint32_t key : {b << 16, (b << 16) | 0xffffu}) {
      const uint32_t u = key & 0x80000000u ? key ^ 0x80000000u : ~key;
      x.push_back(std::bit_cast<float>(u));
    }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, std::numeric_limits<float>::denorm_min(),
                  -std::numeric_limits<float>::max(), std::numeric_limits<float>::max()})
    x.push_back(f);
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) x.push_back(std::bit_cast<float>(uint32_t(rng())));
  for (int i = 0; i < 200000; ++i) x.push_back(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
  return x;
}

}  // namespace

TEST_CASE("nearest code: the table path equals the reference (searchsorted) on every kind of input") {
  const auto books = nearest_codebooks();
  int fast = 0;
  for (size_t bi = 0; bi < books.size(); ++bi) {
    const std::vector<float>& C = books[bi];
    const NearestCode nc(C);
    fast += nc.fast();
    const bool valid =
        std::is_sorted(C.begin(), C.end()) && std::none_of(C.begin(), C.end(), [](float c) { return std::isnan(c); });
    if (!valid) CHECK_FALSE(nc.fast());
    const std::vector<float> x = valid ? nearest_inputs(C) : std::vector<float>{-2.0f, 0.0f, 0.7f, 2.0f};
    std::vector<uint32_t> got(x.size());
    nc.codes(x.data(), x.size(), got.data());
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const uint8_t want = gefen_nearest_code(C, x[i]);
      bad += got[i] != want || nc(x[i]) != want;
      if (valid) bad += want != ref_nearest(C, x[i]);  // the reference against the plain loop
    }
    INFO("codebook " << bi << " (" << C.size() << " codes, window " << nc.window() << "), " << x.size() << " inputs");
    CHECK(bad == 0);
  }
  // The table takes the valid codebooks but a run of equal codes (a padded codebook: equal
  // thresholds), infinities and the too dense one.
  for (size_t bi : {0, 2, 4, 5, 6}) CHECK(NearestCode(books[bi]).fast());
  for (size_t bi : {1, 3, 7, 8, 9}) CHECK_FALSE(NearestCode(books[bi]).fast());
  CHECK(fast == 5);
  CHECK(NearestCode(books[0]).window() <= 2);
  CHECK(NearestCode(books[6]).window() == 6);  // the 7 codes in one bucket: 6 thresholds inside it
}

// Hidden (run with `test_gefen "[full]"`): every one of the 2^32 binary32 inputs, one learned
// codebook (about three minutes: the reference is a binary search per input).
TEST_CASE("nearest code: the table path equals the reference on all 2^32 inputs", "[.][full]") {
  const std::vector<float> C = nearest_codebooks()[0];
  const NearestCode nc(C);
  REQUIRE(nc.fast());
  std::vector<float> x(1 << 20);
  std::vector<uint32_t> got(x.size());
  uint64_t bad = 0;
  for (uint64_t base = 0; base < (uint64_t(1) << 32); base += x.size()) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(uint32_t(base + i));
    nc.codes(x.data(), x.size(), got.data());
    for (size_t i = 0; i < x.size(); ++i) bad += got[i] != gefen_nearest_code(C, x[i]);
  }
  CHECK(bad == 0);
}

TEST_CASE("gefen: a scalar binary32 restatement, bit for bit, and binary64 with a tolerance") {
  for (double wd : {0.0, 0.1}) {
    for (double beta1 : {0.9, 0.3}) {  // both of lerp's forms
      INFO("wd " << wd << ", beta1 " << beta1);
      GefenConfig c;
      c.weight_decay = wd, c.beta1 = beta1;
      Fixture f = fixture(), fr = fixture();
      auto opt = make_gefen(f.ps, c);
      Ref R;
      R.c = c;
      const double lr = 1e-2;
      for (int t = 0; t < 6; ++t) {
        const auto g = grads(f, t);
        const auto before = opt->state();
        std::map<std::string, std::vector<float>> p0;
        for (auto& n : f.names) p0[n] = f.m.params.at(n).data;
        opt->step(f.m, g, lr);
        ref_step(R, fr, g, lr);
        const auto st = opt->state();
        CHECK(same_bits(tensor_values<float>(st, "codebook"), R.C));
        for (auto& n : f.names) {
          INFO(n << " step " << t);
          const RefSlot& s = R.s.at(n);
          CHECK(same_bits(f.m.params.at(n).data, fr.m.params.at(n).data));
          CHECK(tensor_values<uint8_t>(st, n + ".idx") == s.idx);
          CHECK(same_bits(tensor_values<float>(st, n + ".mag"), s.mag));
          CHECK(same_bits(tensor_values<float>(st, n + ".v"), s.v));
          CHECK(tensor_values<uint64_t>(st, n + ".period") == std::vector<uint64_t>{s.P});
        }
        // binary64: the definition (§3.2 D) from the binary32 state before this step
        const double bc1 = 1 - std::pow(beta1, t + 1.0), bc2 = 1 - std::pow(c.beta2, t + 1.0);
        for (size_t k = 0; k < f.names.size(); ++k) {
          const std::string& n = f.names[k];
          const RefSlot& s = R.s.at(n);
          const auto& x = g.at(n);
          const size_t N = x.size();
          const auto m_old = t == 0 ? std::vector<float>(N, 0.0f) : gefen_momentum(before, n);
          const auto v_old = t == 0 ? std::vector<float>(N / s.P, 0.0f) : tensor_values<float>(before, n + ".v");
          const auto v_new = tensor_values<float>(st, n + ".v");
          const auto mag = tensor_values<float>(st, n + ".mag");
          const auto idx = tensor_values<uint8_t>(st, n + ".idx");
          std::vector<double> sb(N / s.P), md(N);
          size_t bad_v = 0, bad_mag = 0, bad_code = 0, bad_p = 0;
          for (size_t b = 0; b < N / s.P; ++b) {
            double ms = 0;
            for (size_t i = b * s.P; i < (b + 1) * s.P; ++i) ms += double(x[i]) * double(x[i]);
            const double vd = c.beta2 * double(v_old[b]) + (1 - c.beta2) * ms / double(s.P);
            bad_v += !(std::abs(vd - double(v_new[b])) <= 1e-6 * vd);
            sb[b] = (1 / bc1) / (std::sqrt(vd / bc2) + c.eps);
          }
          for (size_t i = 0; i < N; ++i) md[i] = beta1 * double(m_old[i]) + (1 - beta1) * double(x[i]);
          for (size_t q = 0; q < N / s.Q; ++q) {
            double mx = 0;
            for (size_t i = q * s.Q; i < (q + 1) * s.Q; ++i) mx = std::max(mx, std::abs(md[i]));
            double sc = 0;  // the block's scale before cancellation
            for (size_t i = q * s.Q; i < (q + 1) * s.Q; ++i)
              sc = std::max(sc, std::abs(beta1 * double(m_old[i])) + std::abs((1 - beta1) * double(x[i])));
            bad_mag += !(std::abs(mx - double(mag[q])) <= 1e-6 * sc);
            for (size_t i = q * s.Q; i < (q + 1) * s.Q; ++i) {
              const double xn = mx > 0 ? md[i] / mx : 0.0;
              const auto up = std::lower_bound(R.C.begin(), R.C.end(), xn);  // the two neighbours
              double dmin = INFINITY;
              if (up != R.C.end()) dmin = std::abs(xn - double(*up));
              if (up != R.C.begin()) dmin = std::min(dmin, std::abs(xn - double(*(up - 1))));
              bad_code += !(std::abs(xn - double(R.C[idx[i]])) <= dmin + 1e-5);  // nearest (up to float ties)
              const bool dec = f.ps.params[k].shape.size() >= 2 && wd > 0;
              const double pd = double(p0[n][i]) * (dec ? 1 - lr * wd : 1.0) -
                                lr * sb[i / s.P] * double(R.C[idx[i]]) * mx;
              const double got = double(f.m.params.at(n).data[i]);
              bad_p += !(std::abs(got - pd) <= 1e-6 * std::abs(pd) + 1e-5 * lr * std::abs(sb[i / s.P] * mx));
            }
          }
          INFO(n << " step " << t);
          CHECK(bad_v == 0);
          CHECK(bad_mag == 0);
          CHECK(bad_code == 0);
          CHECK(bad_p == 0);
        }
      }
      // the periods: each matrix its row, the zero gradient and the 1-D ones P = 1
      CHECK(R.s.at("w").P == 24);
      CHECK(R.s.at("big").P == 256);
      CHECK(R.s.at("zero").P == 1);
      CHECK(R.s.at("prime").Q == 1);
      CHECK(R.s.at("one").P == 1);
      CHECK(R.s.at("zero").Q == 128);
      CHECK(std::adjacent_find(R.C.begin(), R.C.end()) == R.C.end());  // learned by the DP, not padded
      const uint8_t z = ref_nearest(R.C, 0.0f);  // mag = 0: the code nearest 0
      CHECK(std::all_of(R.s.at("zero").idx.begin(), R.s.at("zero").idx.end(), [&](uint8_t i) { return i == z; }));
    }
  }
}

TEST_CASE("gefen: state bytes, the unset state, round trip, threads, the tiny model") {
  Fixture f = fixture();
  auto opt = make_gefen(f.ps, GefenConfig{});
  auto sum_bytes = [](const std::vector<StateTensor>& st) {
    uint64_t b = 0;
    for (auto& t : st) b += t.bytes.size();
    return b;
  };
  // before the first step: periods 0, mag and v empty, a zero codebook
  uint64_t n_all = 0;
  for (auto& p : f.ps.params) n_all += uint64_t(f.m.params.at(p.name).numel());
  auto st0 = opt->state();
  CHECK(st0.size() == 1 + 4 * f.names.size());
  CHECK(opt->state_bytes() == n_all + 8 * f.names.size() + 1024 + 8);
  CHECK(opt->state_bytes() == sum_bytes(st0) + 8);
  for (auto& n : f.names) {
    CHECK(tensor_values<uint64_t>(st0, n + ".period") == std::vector<uint64_t>{0});
    CHECK(tensor_values<float>(st0, n + ".v").empty());
  }
  CHECK(tensor_values<float>(st0, "codebook") == std::vector<float>(256, 0.0f));
  {  // an unset state loads back and steps as a fresh one does
    Fixture f2 = fixture();
    auto o2 = make_gefen(f2.ps, GefenConfig{});
    o2->load_state(st0, 0);
    CHECK_THROWS_WITH(o2->load_state(st0, 3), "optimizer state: gefen has no periods but 3 steps");
    o2->step(f2.m, grads(f2, 0), 1e-3);
    Fixture f3 = fixture();
    auto o3 = make_gefen(f3.ps, GefenConfig{});
    o3->step(f3.m, grads(f3, 0), 1e-3);
    for (auto& n : f.names) CHECK(same_bits(f2.m.params.at(n).data, f3.m.params.at(n).data));
  }
  for (int t = 0; t < 3; ++t) opt->step(f.m, grads(f, t), 1e-3);
  const auto st = opt->state();
  uint64_t want = 1024 + 8;
  for (auto& n : f.names) {
    const uint64_t N = uint64_t(f.m.params.at(n).numel()), P = tensor_values<uint64_t>(st, n + ".period")[0];
    want += N + 4 * (N / gefen_magnitude_block(N, P)) + 4 * (N / P) + 8;
  }
  CHECK(opt->state_bytes() == want);
  CHECK(opt->state_bytes() == sum_bytes(st) + 8);
  CHECK(opt->steps() == 3);

  // round trip: a second optimizer loaded from the state continues bit for bit
  Fixture g2 = f;
  auto o2 = make_gefen(g2.ps, GefenConfig{});
  o2->load_state(st, opt->steps());
  for (int t = 3; t < 6; ++t) {
    opt->step(f.m, grads(f, t), 1e-3);
    o2->step(g2.m, grads(g2, t), 1e-3);
  }
  for (auto& n : f.names) CHECK(same_bits(f.m.params.at(n).data, g2.m.params.at(n).data));
  const auto a = opt->state(), b = o2->state();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK((a[i].name == b[i].name && a[i].bytes == b[i].bytes));
  // gefen_momentum: codebook[idx]·mag
  const auto mw = gefen_momentum(a, "w");
  const auto C = tensor_values<float>(a, "codebook"), mag = tensor_values<float>(a, "w.mag");
  const auto idx = tensor_values<uint8_t>(a, "w.idx");
  for (size_t i = 0; i < mw.size(); i += 37) CHECK(mw[i] == C[idx[i]] * mag[i / 24]);
  CHECK_THROWS_WITH(gefen_momentum(a, "nope"), "gefen momentum: no state tensor 'nope.idx'");

  // load_state's checks
  auto bad = st;
  for (auto& t : bad)
    if (t.name == "w.period") {
      const uint64_t p = 7;
      std::memcpy(t.bytes.data(), &p, 8);
    }
  CHECK_THROWS_WITH(o2->load_state(bad, 3), "optimizer state: gefen period 7 of 'w' does not divide its 960 elements");
  bad = st;
  bad.erase(bad.begin());
  CHECK_THROWS_AS(o2->load_state(bad, 3), InputError);
  bad = st;
  for (auto& t : bad)
    if (t.name == "one.period") std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0});
  for (auto& t : bad)
    if (t.name == "one.mag" || t.name == "one.v") t.shape = {0}, t.bytes.clear();
  CHECK_THROWS_WITH(o2->load_state(bad, 3), "optimizer state: gefen periods are set for some tensors but not for others");
  bad = st;
  for (int i = 0; i < 4; ++i) std::swap(bad[0].bytes[size_t(i)], bad[0].bytes[size_t(1020 + i)]);  // −1 ↔ +1
  CHECK_THROWS_WITH(o2->load_state(bad, 3), "optimizer state: the gefen codebook is not ascending");

  // 1 and 2 threads (the "big" tensor takes the threaded path), relearning included
  for (uint64_t relearn : {0, 2}) {
    std::vector<Fixture> runs;
    for (int th : {1, 2}) {
      set_num_threads(th);
      Fixture h = fixture();
      GefenConfig c;
      c.weight_decay = 0.1, c.relearn_every = relearn;
      auto o = make_gefen(h.ps, c);
      for (int t = 0; t < 5; ++t) o->step(h.m, grads(h, t), 1e-3);
      runs.push_back(h);
    }
    set_num_threads(1);
    for (auto& n : f.names) CHECK(same_bits(runs[0].m.params.at(n).data, runs[1].m.params.at(n).data));
  }

  // the tiny model: every parameter has a period, state bytes as counted
  ModelConfig c;
  c.vocab = 256, c.ctx = 48, c.layers = 2, c.heads = c.kv_heads = 4, c.dim = 32, c.hidden = 128;
  Model m = init_model(c, 1);
  auto om = make_gefen(param_set(c), GefenConfig{});
  GradMap<float> gm;
  std::mt19937_64 r(3);
  for (auto& [n, t] : m.params) {
    std::vector<float> x(t.data.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(r() % 65) - 32) / 32.0f * (i % 8 == 0 ? 1.0f : 0.5f);
    gm[n] = x;
  }
  om->step(m, gm, 1e-3);
  CHECK(om->state_bytes() == sum_bytes(om->state()) + 8);
  for (auto& t : om->state())
    if (t.name.size() > 7 && t.name.ends_with(".period")) CHECK(tensor_values<uint64_t>(om->state(), t.name)[0] > 0);
}

TEST_CASE("gefen: the registry entry, its keys and their errors") {
  OptimizerOptions o;
  o.name = "gefen";
  o.source = "x.toml";
  CHECK_NOTHROW(check_optimizer(o));
  o.values["period_rule"] = {std::string("brief"), "x.toml:2"};
  o.values["relearn_every"] = {int64_t(10), "x.toml:3"};
  CHECK_NOTHROW(check_optimizer(o));
  o.values["period_rule"] = {std::string("row"), "x.toml:2"};
  CHECK_THROWS_WITH(check_optimizer(o), "x.toml: gefen: period_rule = 'row' (known: code, brief)");
  o.values = {{"beta2", {1.0, "x.toml:2"}}};
  CHECK_THROWS_WITH(check_optimizer(o), "gefen: betas (0.9, 1) must lie in [0, 1)");
  o.values = {{"eps", {0.0, "x.toml:2"}}};
  CHECK_THROWS_WITH(check_optimizer(o), "gefen: eps = 0 must be positive");
  o.values = {{"weight_decay", {-0.1, "x.toml:2"}}};
  CHECK_THROWS_WITH(check_optimizer(o), "gefen: weight_decay = -0.1 must be ≥ 0");
  o.values = {{"momentum", {0.9, "x.toml:4"}}};
  CHECK_THROWS_WITH(check_optimizer(o), Catch::Matchers::StartsWith("x.toml:4: unknown key 'momentum' in [optimizer]"));
  o.values.clear();
  Fixture f = fixture();
  auto opt = make_optimizer(f.ps, o);
  CHECK(opt->name() == "gefen");
  GradMap<float> g = grads(f, 0);
  g["w"][3] = INFINITY;
  CHECK_THROWS_WITH(opt->step(f.m, g, 1e-3), "gefen period: gradient element 3 is not finite (inf)");
}

namespace {

// Newton–Schulz in binary64 without any rounding: the definition NS emulates in bf16.
// Newton–Schulz as gefen_muon.h states it, in the plainest loops: every product an ascending
// binary32 dot product (no fma), rounded once to bf16 (core/round.h RNE) after the scaling and the
// added term — the reference the fast kernel must equal bit for bit.
std::vector<float> ns_f32_reference(const std::vector<float>& G, size_t rows, size_t cols, const GefenMuonConfig& c) {
  const Target<float> bt = make_target<float>(format_lookup("bf16"));
  auto bf = [&](float x) { return round_value<Rounding::rne>(x, bt); };
  const bool tr = rows > cols;
  const size_t r = tr ? cols : rows, k = tr ? rows : cols;
  std::vector<float> X(r * k);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) X[tr ? j * k + i : i * cols + j] = bf(G[i * cols + j]);
  double ss = 0;
  for (float x : X) ss += double(x) * double(x);
  const float den = bf(std::max(bf(float(std::sqrt(ss))), float(c.eps)));
  for (auto& x : X) x = bf(x / den);
  // out(i,j) = bf(alpha·Σ_l P(i,l)·Q(l,j) + beta·add(i,j)); Q given by an accessor
  auto mul = [&](const std::vector<float>& P, auto Q, size_t n, size_t kk, size_t m, float alpha, float beta,
                 const std::vector<float>* add) {
    std::vector<float> out(n * m);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < m; ++j) {
        float acc = 0;
        for (size_t l = 0; l < kk; ++l) acc += P[i * kk + l] * Q(l, j);
        float v = alpha == 1.0f ? acc : alpha * acc;
        if (add) v = v + beta * (*add)[i * m + j];
        out[i * m + j] = bf(v);
      }
    return out;
  };
  for (uint64_t s = 0; s < c.ns_steps; ++s) {
    const auto A = mul(X, [&](size_t l, size_t j) { return X[j * k + l]; }, r, k, r, 1.0f, 0.0f, nullptr);
    const auto B = mul(A, [&](size_t l, size_t j) { return A[l * r + j]; }, r, r, r, float(c.ns_c), float(c.ns_b), &A);
    X = mul(B, [&](size_t l, size_t j) { return X[l * k + j]; }, r, r, k, 1.0f, float(c.ns_a), &X);
  }
  std::vector<float> out(rows * cols);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) out[i * cols + j] = X[tr ? j * k + i : i * cols + j];
  return out;
}

std::vector<double> ns_double(const std::vector<float>& G, size_t rows, size_t cols, const GefenMuonConfig& c) {
  const bool tr = rows > cols;
  const size_t r = tr ? cols : rows, k = tr ? rows : cols;
  std::vector<double> X(r * k);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) X[tr ? j * k + i : i * cols + j] = G[i * cols + j];
  double ss = 0;
  for (double x : X) ss += x * x;
  for (auto& x : X) x /= std::max(std::sqrt(ss), c.eps);
  for (uint64_t s = 0; s < c.ns_steps; ++s) {
    std::vector<double> A(r * r, 0), B(r * r, 0), Xn(r * k, 0);
    for (size_t i = 0; i < r; ++i)
      for (size_t j = 0; j < r; ++j)
        for (size_t l = 0; l < k; ++l) A[i * r + j] += X[i * k + l] * X[j * k + l];
    for (size_t i = 0; i < r; ++i)
      for (size_t j = 0; j < r; ++j) {
        double acc = 0;
        for (size_t l = 0; l < r; ++l) acc += A[i * r + l] * A[l * r + j];
        B[i * r + j] = c.ns_b * A[i * r + j] + c.ns_c * acc;
      }
    for (size_t i = 0; i < r; ++i)
      for (size_t j = 0; j < k; ++j) {
        double acc = 0;
        for (size_t l = 0; l < r; ++l) acc += B[i * r + l] * X[l * k + j];
        Xn[i * k + j] = c.ns_a * X[i * k + j] + acc;
      }
    X = Xn;
  }
  std::vector<double> out(rows * cols);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) out[i * cols + j] = X[tr ? j * k + i : i * cols + j];
  return out;
}

Fixture muon_fixture() {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"w", {40, 24}}, {"big", {96, 256}},
                                                                            {"tall", {64, 16}}};
  Fixture f;
  f.ps = param_set(shapes);
  std::mt19937_64 r(9);
  std::normal_distribution<float> z(0, 1);
  for (auto& [n, s] : shapes) {
    Tensor t;
    t.shape = s;
    t.data.resize(size_t(t.numel()));
    for (auto& x : t.data) x = 0.02f * z(r);
    f.m.params[n] = t;
    f.names.push_back(n);
  }
  return f;
}

}  // namespace

TEST_CASE("gefen-muon: Newton–Schulz in bf16 against binary64, transposes, bf16 values") {
  const GefenMuonConfig c;
  std::mt19937_64 r(4);
  std::normal_distribution<float> z(0, 1);
  for (auto [rows, cols] : std::vector<std::pair<size_t, size_t>>{{6, 10}, {10, 6}, {8, 8}, {3, 17}, {24, 40}, {40, 70}}) {
    INFO(rows << " x " << cols);
    std::vector<float> G(rows * cols);
    for (auto& x : G) x = z(r);
    const auto O = gefen_newton_schulz(G, rows, cols, c);
    CHECK(O == ns_f32_reference(G, rows, cols, c));  // the kernel equals the plain loops bit for bit
    const auto Od = ns_double(G, rows, cols, c);
    double err = 0, nrm = 0;
    bool bf = true;
    for (size_t i = 0; i < O.size(); ++i) {
      err += (double(O[i]) - Od[i]) * (double(O[i]) - Od[i]), nrm += Od[i] * Od[i];
      uint32_t u;
      std::memcpy(&u, &O[i], 4);
      bf = bf && (u & 0xFFFFu) == 0;  // a bf16 value
    }
    CHECK(bf);
    // bf16 keeps 8 significant bits (unit roundoff 2^-8); ~20 roundings over 5 steps, each
    // amplified at most by the quintic's slope: a few percent of the norm
    CHECK(std::sqrt(err / nrm) < 0.05);
    // NS(Gᵀ) = NS(G)ᵀ exactly (the wide orientation is the one computed)
    std::vector<float> Gt(G.size());
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) Gt[j * rows + i] = G[i * cols + j];
    const auto Ot = gefen_newton_schulz(Gt, cols, rows, c);
    bool same_t = true;
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) same_t = same_t && Ot[j * rows + i] == O[i * cols + j];
    if (rows != cols) CHECK(same_t);
  }
  // the learning-rate ratios
  CHECK(gefen_muon_lr_ratio(64, 16, false) == 2.0);
  CHECK(gefen_muon_lr_ratio(16, 64, false) == 1.0);
  CHECK(gefen_muon_lr_ratio(16, 64, true) == 0.2 * 8.0);
  // zero gradient: the norm is clamped by eps, the output stays 0
  const auto Z = gefen_newton_schulz(std::vector<float>(12, 0.0f), 3, 4, c);
  CHECK(std::all_of(Z.begin(), Z.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("gefen-muon: state, round trip, threads, errors") {
  auto sum_bytes = [](const std::vector<StateTensor>& st) {
    uint64_t b = 0;
    for (auto& t : st) b += t.bytes.size();
    return b;
  };
  auto run = [&](int threads, int steps, Fixture& f, std::unique_ptr<Optimizer>& o) {
    set_num_threads(threads);
    for (int t = int(o->steps()); t < steps; ++t) o->step(f.m, grads(f, t), 1e-2);
    set_num_threads(1);
  };
  Fixture a = muon_fixture(), b = muon_fixture();
  auto oa = make_gefen_muon(a.ps, GefenMuonConfig{}), ob = make_gefen_muon(b.ps, GefenMuonConfig{});
  CHECK(oa->state_bytes() == sum_bytes(oa->state()) + 8);
  run(1, 4, a, oa);
  run(2, 4, b, ob);
  for (auto& n : a.names) CHECK(same_bits(a.m.params.at(n).data, b.m.params.at(n).data));
  const auto st = oa->state();
  CHECK(st.size() == 1 + 3 * a.names.size());
  CHECK(oa->state_bytes() == sum_bytes(st) + 8);
  uint64_t want = 1024 + 8;
  for (auto& n : a.names) {
    const uint64_t N = uint64_t(a.m.params.at(n).numel()), P = tensor_values<uint64_t>(st, n + ".period")[0];
    want += N + 4 * (N / gefen_magnitude_block(N, P)) + 8;
  }
  CHECK(oa->state_bytes() == want);
  CHECK(tensor_values<uint64_t>(st, "w.period")[0] == 24);
  // the momentum is Gefen's: codebook[idx]·mag, the requantised value
  const auto mom = gefen_momentum(st, "w");
  CHECK(std::any_of(mom.begin(), mom.end(), [](float x) { return x != 0.0f; }));
  // round trip
  Fixture c2 = a;
  auto oc = make_gefen_muon(c2.ps, GefenMuonConfig{});
  oc->load_state(st, oa->steps());
  run(1, 7, a, oa);
  run(1, 7, c2, oc);
  for (auto& n : a.names) CHECK(same_bits(a.m.params.at(n).data, c2.m.params.at(n).data));
  // the parameters moved, at most lr·ratio·|O_ij| a step (NS keeps singular values ≲ 1.25, so |O_ij| ≲ 1.25)
  Fixture fresh = muon_fixture();
  double moved = 0;
  for (size_t i = 0; i < a.m.params.at("w").data.size(); ++i)
    moved = std::max(moved, std::abs(double(a.m.params.at("w").data[i]) - double(fresh.m.params.at("w").data[i])));
  CHECK(moved > 1e-3);
  CHECK(moved < 7 * 1e-2 * gefen_muon_lr_ratio(40, 24, false) * 1.25);
  // errors: a vector parameter under rest = "refuse" (the released behaviour), keys
  GefenMuonConfig refuse;
  refuse.rest = GefenMuonRest::refuse;
  CHECK_THROWS_WITH(make_gefen_muon(fixture().ps, refuse),
                    "gefen-muon: parameter 'gain' has shape [768]: GefenMuon takes only matrices (2-D parameters), as "
                    "the authors' code");
  CHECK_NOTHROW(make_gefen_muon(muon_fixture().ps, refuse));
  OptimizerOptions o;
  o.name = "gefen-muon";
  o.source = "x.toml";
  CHECK_NOTHROW(check_optimizer(o));
  o.values = {{"adjust_lr_fn", {std::string("match_rms_adamw"), "x.toml:2"}}, {"nesterov", {false, "x.toml:3"}}};
  CHECK_NOTHROW(check_optimizer(o));
  o.values = {{"adjust_lr_fn", {std::string("none"), "x.toml:2"}}};
  CHECK_THROWS_WITH(check_optimizer(o), "x.toml: gefen-muon: adjust_lr_fn = 'none' (known: original, match_rms_adamw)");
  o.values = {{"momentum", {1.0, "x.toml:2"}}};
  CHECK_THROWS_WITH(check_optimizer(o), "gefen-muon: momentum = 1 must lie in [0, 1)");
  o.values = {{"ns_steps", {int64_t(100), "x.toml:2"}}};
  CHECK_THROWS_WITH(check_optimizer(o), "gefen-muon: ns_steps = 100 must be < 100");
  o.values = {{"beta1", {0.9, "x.toml:5"}}};
  CHECK_THROWS_WITH(check_optimizer(o), Catch::Matchers::StartsWith("x.toml:5: unknown key 'beta1' in [optimizer]"));
}

namespace {

// A subset of f (names in `keep`), roles unknown, same values.
Fixture subset(const Fixture& f, const std::vector<std::string>& keep) {
  Fixture g;
  g.ps.roles = f.ps.roles;
  for (auto& p : f.ps.params)
    if (std::find(keep.begin(), keep.end(), p.name) != keep.end()) {
      g.ps.params.push_back(p);
      g.m.params[p.name] = f.m.params.at(p.name);
      g.names.push_back(p.name);
    }
  return g;
}
GradMap<float> only(const GradMap<float>& g, const Fixture& f) {
  GradMap<float> out;
  for (auto& n : f.names) out[n] = g.at(n);
  return out;
}
bool has_state(const std::vector<StateTensor>& st, const std::string& name) {
  return std::any_of(st.begin(), st.end(), [&](const StateTensor& t) { return t.name == name; });
}
OptimizerOptions muon_options(std::map<std::string, OptionValue> v) {
  OptimizerOptions o;
  o.name = "gefen-muon", o.source = "x.toml", o.values = std::move(v);
  return o;
}

}  // namespace

TEST_CASE("gefen-muon: the two groups are GefenMuon on the matrices and Gefen / AdamW on the rest, bit for bit") {
  const std::vector<std::string> mats = {"w", "big", "zero"}, rest = {"gain", "prime", "one"};
  for (const char* kind : {"gefen", "adamw"}) {
    INFO("rest = " << kind);
    // non-default rest settings, so that each key is seen to reach the rest group's optimizer
    const OptimizerOptions o = muon_options({{"rest", {std::string(kind), "x.toml:2"}},
                                             {"rest_beta1", {0.8, "x.toml:3"}},
                                             {"rest_beta2", {0.99, "x.toml:4"}},
                                             {"rest_eps", {1e-6, "x.toml:5"}},
                                             {"rest_weight_decay", {0.05, "x.toml:6"}},
                                             {"momentum", {0.9, "x.toml:7"}}});
    Fixture whole = fixture();  // roles unknown: every matrix in the Muon group
    Fixture fm = subset(whole, mats), fr = subset(whole, rest);
    auto opt = make_optimizer(whole.ps, o);
    GefenMuonConfig mc;
    mc.momentum = 0.9, mc.rest = GefenMuonRest::refuse;
    auto om = make_gefen_muon(fm.ps, mc);
    std::unique_ptr<Optimizer> orr;
    if (std::string(kind) == "gefen") {
      GefenConfig gc;
      gc.beta1 = 0.8, gc.beta2 = 0.99, gc.eps = 1e-6, gc.weight_decay = 0.05;
      orr = make_gefen(fr.ps, gc);
    } else {
      AdamWConfig ac;
      ac.beta1 = 0.8, ac.beta2 = 0.99, ac.eps = 1e-6, ac.weight_decay = 0.05;
      orr = make_adamw(fr.ps, ac);
    }
    for (int t = 0; t < 3; ++t) {
      const GradMap<float> g = grads(whole, t);
      opt->step(whole.m, g, 1e-2);
      om->step(fm.m, only(g, fm), 1e-2);
      orr->step(fr.m, only(g, fr), 1e-2);
    }
    for (auto& n : mats) CHECK(same_bits(whole.m.params.at(n).data, fm.m.params.at(n).data));
    for (auto& n : rest) CHECK(same_bits(whole.m.params.at(n).data, fr.m.params.at(n).data));
    // the state: the Muon group's tensors under their names, then the rest group's prefixed "rest."
    const auto st = opt->state(), sm = om->state(), sr = orr->state();
    REQUIRE(st.size() == sm.size() + sr.size());
    for (size_t i = 0; i < st.size(); ++i) {
      const StateTensor& want = i < sm.size() ? sm[i] : sr[i - sm.size()];
      INFO(st[i].name);
      CHECK(st[i].name == (i < sm.size() ? "" : "rest.") + want.name);
      CHECK(st[i].dtype == want.dtype);
      CHECK(st[i].shape == want.shape);
      CHECK(st[i].bytes == want.bytes);
    }
    CHECK(opt->state_bytes() == om->state_bytes() + orr->state_bytes() - 8);
    uint64_t total = 8;
    for (auto& t : st) total += t.bytes.size();
    CHECK(opt->state_bytes() == total);
    CHECK(opt->steps() == 3);
    // round trip: a fresh one takes the state and continues bit for bit
    Fixture copy = whole;
    auto o2 = make_optimizer(copy.ps, o);
    o2->load_state(st, opt->steps());
    for (int t = 3; t < 5; ++t) {
      const GradMap<float> g = grads(whole, t);
      opt->step(whole.m, g, 1e-2);
      o2->step(copy.m, g, 1e-2);
    }
    for (auto& n : whole.names) CHECK(same_bits(whole.m.params.at(n).data, copy.m.params.at(n).data));
    const auto s1 = opt->state(), s2 = o2->state();
    REQUIRE(s1.size() == s2.size());
    for (size_t i = 0; i < s1.size(); ++i) CHECK((s1[i].name == s2[i].name && s1[i].bytes == s2[i].bytes));
    // a state without the rest group's tensors, or with a wrong one, is refused naming it
    std::vector<StateTensor> bad(st.begin(), st.begin() + std::ptrdiff_t(sm.size()));
    CHECK_THROWS_AS(make_optimizer(whole.ps, o)->load_state(bad, 3), InputError);
    bad = st;
    bad.back().shape.push_back(1);
    CHECK_THROWS_WITH(make_optimizer(whole.ps, o)->load_state(bad, 3),
                      Catch::Matchers::Contains("gefen-muon's rest group, prefix 'rest.'"));
  }
  // no rest group (matrices only): the state is the released GefenMuon's, nothing prefixed
  Fixture mf = muon_fixture();
  auto a = make_gefen_muon(mf.ps, GefenMuonConfig{});
  a->step(mf.m, grads(mf, 0), 1e-2);
  for (auto& t : a->state()) CHECK(!t.name.starts_with("rest."));
  // no matrix at all: an empty Muon group (its codebook stays zero) and a resumable state
  Fixture vf = subset(fixture(), rest);
  auto b = make_gefen_muon(vf.ps, GefenMuonConfig{});
  for (int t = 0; t < 2; ++t) b->step(vf.m, grads(vf, t), 1e-2);
  auto b2 = make_gefen_muon(vf.ps, GefenMuonConfig{});
  CHECK_NOTHROW(b2->load_state(b->state(), b->steps()));
  CHECK(b2->state_bytes() == b->state_bytes());
  // a Muon-group name that could collide with the rest group's prefix
  Fixture cf = fixture();
  cf.ps.params[0].name = "rest.w";
  CHECK_THROWS_WITH(make_gefen_muon(cf.ps, GefenMuonConfig{}),
                    "gefen-muon: parameter 'rest.w' of the Muon group begins with 'rest.', the rest group's state "
                    "prefix");
}

TEST_CASE("gefen-muon: the partition by shape and role, the embeddings key, the keys' errors") {
  for (const char* arch : {"gpt2", "llama"}) {
    INFO(arch);
    ModelConfig c;
    c.arch = std::string(arch) == "gpt2" ? Arch::gpt2 : Arch::llama;
    c.vocab = 256, c.ctx = 16, c.layers = 1, c.heads = 4, c.kv_heads = c.arch == Arch::gpt2 ? 4 : 2, c.dim = 32,
    c.hidden = 64, c.tied = c.arch == Arch::gpt2;  // llama untied: its lm_head too
    const ParamSet ps = param_set(c);
    ParamSet anon = ps;
    anon.roles = false;
    for (bool emb_muon : {false, true}) {
      GefenMuonConfig gc;
      gc.embeddings_muon = emb_muon;
      const auto st = make_gefen_muon(ps, gc)->state(), sa = make_gefen_muon(anon, gc)->state();
      size_t muon = 0, embeddings = 0;
      for (auto& p : ps.params) {
        const bool emb = p.role == Role::tok_emb || p.role == Role::pos_emb || p.role == Role::lm_head;
        const bool want = p.shape.size() == 2 && (emb_muon || !emb);
        INFO(p.name << " emb " << emb << " embeddings = muon " << emb_muon);
        embeddings += emb;
        CHECK(gefen_muon_takes(p, true, gc) == want);
        CHECK(gefen_muon_takes(p, false, gc) == (p.shape.size() == 2));  // no roles: every matrix
        muon += want;
        CHECK(has_state(st, p.name + ".idx") == want);
        CHECK(has_state(st, "rest." + p.name + ".idx") == !want);
        CHECK(has_state(st, "rest." + p.name + ".v") == !want);  // Gefen's v: the rest group only
        CHECK(has_state(sa, p.name + ".idx") == (p.shape.size() == 2));
      }
      CHECK(embeddings == 2);  // gpt2 wte, wpe; llama tok_embeddings, output
      CHECK(muon > 0);
      CHECK(muon < ps.params.size());
      CHECK(has_state(st, "codebook"));
      CHECK(has_state(st, "rest.codebook"));
    }
    // rest = "refuse": the first non-matrix is named, as the authors' constructor raises
    GefenMuonConfig refuse;
    refuse.rest = GefenMuonRest::refuse;
    std::string first;
    for (auto& p : ps.params)
      if (p.shape.size() != 2 && first.empty()) first = p.name;
    CHECK_THROWS_WITH(make_gefen_muon(ps, refuse), Catch::Matchers::StartsWith("gefen-muon: parameter '" + first + "'"));
    CHECK_THROWS_AS(make_optimizer(ps, muon_options({{"rest", {std::string("refuse"), "x.toml:2"}}})), InputError);
  }
  // the keys
  CHECK_NOTHROW(check_optimizer(muon_options({{"rest", {std::string("adamw"), "x.toml:2"}},
                                              {"embeddings", {std::string("muon"), "x.toml:3"}},
                                              {"rest_weight_decay", {0.1, "x.toml:4"}}})));
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"rest", {std::string("sgd"), "x.toml:2"}}})),
                    "x.toml: gefen-muon: rest = 'sgd' (known: gefen, adamw, refuse)");
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"embeddings", {std::string("adam"), "x.toml:2"}}})),
                    "x.toml: gefen-muon: embeddings = 'adam' (known: rest, muon)");
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"rest_beta1", {1.0, "x.toml:2"}}})),
                    "gefen-muon: rest_beta1 = 1 must lie in [0, 1)");
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"rest_beta2", {-0.5, "x.toml:2"}}})),
                    "gefen-muon: rest_beta2 = -0.5 must lie in [0, 1)");
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"rest_eps", {0.0, "x.toml:2"}}})),
                    "gefen-muon: rest_eps = 0 must be positive");
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"rest_weight_decay", {-1.0, "x.toml:2"}}})),
                    "gefen-muon: rest_weight_decay = -1 must be ≥ 0");
  CHECK_THROWS_WITH(check_optimizer(muon_options({{"rest", {true, "x.toml:7"}}})),
                    Catch::Matchers::StartsWith("x.toml:7: 'rest' in [optimizer] must be"));
}

TEST_CASE("gefen-muon trains tiny gpt2 and llama models: finite, deterministic, 1 and 2 threads identical") {
  for (const char* arch : {"gpt2", "llama"})
    for (const char* rest : {"gefen", "adamw"}) {
      INFO(arch << ", rest = " << rest);
      auto train = [&](int threads, const std::string& tag) {
        const std::string t = fmt::format(R"([model]
arch = "{}"
layers = 1
heads = 4
kv_heads = {}
dim = 32
ctx = 32

[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"

[train]
steps = 4
batch = 2
lr = 3e-3
warmup = 1
val_seqs = 2

[optimizer]
name = "gefen-muon"
rest = "{}"
)", arch, std::string(arch) == "llama" ? 2 : 4, rest);
        TrainConfig c = train_config_from_toml(t, "tiny.toml");
        c.out = mantis::test::scratch(fmt::format("muon-{}-{}-{}", arch, rest, tag)).string();
        set_num_threads(threads);
        auto tr = std::make_unique<Trainer>(c);
        tr->run();
        set_num_threads(1);
        return tr;
      };
      const auto a = train(1, "a"), b = train(2, "b"), again = train(1, "c");
      REQUIRE(a->log().size() == 4);
      const Model init = init_model(a->model().cfg, a->config().init_seed);
      bool moved = false;
      for (auto& [n, t] : a->model().params) {
        INFO(n);
        CHECK(std::all_of(t.data.begin(), t.data.end(), [](float x) { return std::isfinite(x); }));
        CHECK(same_bits(t.data, b->model().params.at(n).data));
        CHECK(same_bits(t.data, again->model().params.at(n).data));
        moved = moved || !same_bits(t.data, init.params.at(n).data);
      }
      CHECK(moved);
      for (size_t i = 0; i < a->log().size(); ++i) {
        CHECK(std::isfinite(a->log()[i].loss));
        CHECK(a->log()[i].loss == b->log()[i].loss);
      }
      // every parameter in one group; the vectors in the rest group
      const auto st = a->optimizer().state();
      for (auto& [n, t] : a->model().params) {
        const bool muon = has_state(st, n + ".idx");
        CHECK(muon != has_state(st, std::string("rest.") + n + (std::string(rest) == "gefen" ? ".idx" : ".m")));
        if (t.shape.size() != 2) CHECK(!muon);
      }
      uint64_t total = 8;
      for (auto& t : st) total += t.bytes.size();
      CHECK(a->optimizer().state_bytes() == total);
      CHECK(a->log().back().state_bytes == total);
    }
}

TEST_CASE("gefen: ATen's binary32 sum order, against a second restatement and exact sums") {
  std::mt19937_64 r(2);
  std::normal_distribution<float> z(0, 1);
  size_t differs_from_sequential = 0;
  for (size_t n : {1, 2, 5, 7, 8, 9, 15, 16, 24, 63, 64, 65, 100, 255, 256, 768, 1000, 1024, 1500, 3072, 5000}) {
    std::vector<float> x(n);
    for (auto& y : x) y = z(r) * z(r);
    const float got = gefen_torch_sum(x.data(), n);
    const float want = ref_torch_sum(x);
    CHECK(std::memcmp(&got, &want, 4) == 0);
    float seq = 0;
    for (float y : x) seq += y;
    differs_from_sequential += got != seq;
    double exact = 0;
    for (float y : x) exact += double(y);
    CHECK(std::abs(double(got) - exact) <= 1e-6 * double(n) * std::max(1.0, std::abs(exact)));
    std::vector<float> ints(n);
    for (size_t i = 0; i < n; ++i) ints[i] = float(i % 13);  // exact in any order
    double e2 = 0;
    for (float y : ints) e2 += y;
    CHECK(double(gefen_torch_sum(ints.data(), n)) == e2);
  }
  CHECK(differs_from_sequential > 0);  // the order is not index order
}
