// Gefen's codebook (optim/gefen_codebook.h): the histogram's bins, the authors' padding, the DP
// against a brute-force search over every partition of the points into K contiguous clusters, and
// the fast DP against the reference DP, bit for bit.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "optim/gefen_codebook.h"
#include "testutil.h"

using namespace mantis;
using mantis::test::error_of;
using Catch::Contains;

namespace {

// Every partition of points 1..B into K non-empty contiguous clusters, each costed exactly as the
// DP's recurrence adds it (left to right, the same prefix sums and the same cost expressions).
struct Brute {
  double best = INFINITY;
  int ties = 0;
  std::vector<float> codes;
};

Brute brute_force(const std::vector<double>& x, const std::vector<double>& w, int K) {
  const size_t B = x.size();
  std::vector<double> W(B + 1, 0), WX(B + 1, 0), WX2(B + 1, 0);
  for (size_t i = 0; i < B; ++i) {
    W[i + 1] = W[i] + w[i];
    WX[i + 1] = WX[i] + w[i] * x[i];
    WX2[i + 1] = WX2[i] + w[i] * (x[i] * x[i]);
  }
  auto cost = [&](size_t s, size_t e, int c) {  // points s..e (1-based), cluster c
    const double a = W[e] - W[s - 1], b = WX[e] - WX[s - 1], q = WX2[e] - WX2[s - 1];
    return c == 1 ? (q - (-2.0 * b)) + a : c == K ? (q - 2.0 * b) + a : q - (b * b) / a;
  };
  Brute r;
  std::vector<size_t> starts;
  std::function<void(size_t, int, double)> go = [&](size_t s, int c, double acc) {
    if (c == K) {  // the last cluster takes s..B
      const double total = acc + cost(s, B, c);
      starts.push_back(s);
      if (total < r.best) {
        r.best = total, r.ties = 1;
        r.codes.assign(size_t(K), 0.0f);
        for (int k = 0; k < K; ++k) {
          const size_t a = starts[size_t(k)], b = k + 1 < K ? starts[size_t(k) + 1] - 1 : B;
          r.codes[size_t(k)] = k == 0 ? -1.0f : k == K - 1 ? 1.0f : float((WX[b] - WX[a - 1]) / (W[b] - W[a - 1]));
        }
        std::sort(r.codes.begin(), r.codes.end());
      } else if (total == r.best) {
        ++r.ties;
      }
      starts.pop_back();
      return;
    }
    starts.push_back(s);
    for (size_t e = s; e + size_t(K - c) <= B; ++e) go(e + 1, c + 1, acc + cost(s, e, c));
    starts.pop_back();
  };
  go(1, 1, 0.0);
  return r;
}

}  // namespace

TEST_CASE("gefen codebook: the DP's cost and codes equal a brute-force search over every partition") {
  int compared = 0, unique = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const size_t B = 2 + random_word(seed, 1, 0) % 9;  // 2..10 points
    const int K = int(2 + random_word(seed, 1, 1) % std::min<size_t>(B - 1, 5));
    std::vector<double> x, w;
    for (size_t j = 0; j < size_t(kGefenHistogramBins) && x.size() < B; ++j)  // random occupied bins
      if (random_word(seed, 2, j) % (kGefenHistogramBins / (4 * B)) == 0) {
        x.push_back(-1.0 + double(2 * j + 1) * 0x1p-12);
        w.push_back(double(1 + random_word(seed, 3, j) % 1000));
      }
    if (x.size() < size_t(K)) continue;
    INFO("seed " << seed << " B " << x.size() << " K " << K);
    const GefenCodebook dp = learn_gefen_codebook(x, w, K);
    const Brute bf = brute_force(x, w, K);
    REQUIRE(dp.codes.size() == size_t(K));
    CHECK(mantis::test::same(dp.cost, bf.best));  // the minimum, bit for bit
    if (bf.ties == 1) {
      CHECK(dp.codes == bf.codes);
      ++unique;
    }
    CHECK(dp.codes.front() == -1.0f);
    CHECK(dp.codes.back() == 1.0f);
    CHECK(std::is_sorted(dp.codes.begin(), dp.codes.end()));
    ++compared;
  }
  CHECK(compared > 200);
  CHECK(unique > 150);
}

TEST_CASE("gefen codebook: fewer occupied bins than codes are padded as the authors pad") {
  const std::vector<double> x = {-0.5, 0.125, 0.375}, w = {3, 1, 2};
  const GefenCodebook c = learn_gefen_codebook(x, w, 5);
  // [−0.5, 0.125, 0.375, 0.375, 0.375] → entry 0 := −1 (dropping −0.5), entry 4 := +1, sorted
  CHECK(c.codes == std::vector<float>{-1.0f, 0.125f, 0.375f, 0.375f, 1.0f});
  CHECK(c.cost == 0.0);
}

TEST_CASE("gefen histogram: block-absmax normalisation, the bin rule, clamping, zero blocks") {
  std::vector<int64_t> counts(kGefenHistogramBins, 0);
  const std::vector<float> g = {2.0f, -1.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  add_to_gefen_histogram(g, 4, counts);
  CHECK(counts[4095] == 1);  // x = 1: ⌊2/2⁻¹¹⌋ = 4096, clamped
  CHECK(counts[1024] == 1);  // x = −0.5
  CHECK(counts[2560] == 1);  // x = 0.25
  CHECK(counts[2048] == 5);  // x = 0, and the all-zero block
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  CHECK(total == 8);
  CHECK_THAT(error_of([&] { add_to_gefen_histogram(g, 3, counts); }), Contains("period 3 does not divide 8"));
  std::vector<int64_t> wrong(10, 0);
  CHECK_THAT(error_of([&] { add_to_gefen_histogram(g, 4, wrong); }), Contains("10 bins"));
  CHECK_THAT(error_of([&] { learn_gefen_codebook(std::vector<int64_t>(kGefenHistogramBins, 0)); }),
             Contains("empty"));
  // 4 occupied bins, K = 4: one cluster per bin; the outer two are pinned to ∓1, the inner two are
  // the centres of bins 2048 and 2560, −1 + (2j + 1)·2⁻¹²
  const GefenCodebook small = learn_gefen_codebook(counts, 4);
  CHECK(small.codes == std::vector<float>{-1.0f, 0.000244140625f, 0.250244140625f, 1.0f});
}

TEST_CASE("gefen codebook: K = 256 on a gradient-like histogram") {
  std::vector<int64_t> counts(kGefenHistogramBins, 0);
  std::vector<float> g(1 << 14);
  for (size_t i = 0; i < g.size(); ++i) {  // heavy-tailed: a ratio of uniforms
    const double u = (double(random_word(5, 0, i)) + 0.5) / 4294967296.0;
    const double v = (double(random_word(5, 1, i)) + 0.5) / 4294967296.0;
    g[i] = float((u - 0.5) / v);
  }
  add_to_gefen_histogram(g, 64, counts);
  const GefenCodebook c = learn_gefen_codebook(counts);
  REQUIRE(c.codes.size() == 256);
  CHECK(c.codes.front() == -1.0f);
  CHECK(c.codes.back() == 1.0f);
  CHECK(std::adjacent_find(c.codes.begin(), c.codes.end(), std::greater_equal<float>()) == c.codes.end());  // strictly ascending
  CHECK(c.cost > 0);
  // The same histogram given as points and weights learns the same codebook.
  std::vector<double> x, w;
  for (size_t j = 0; j < counts.size(); ++j)
    if (counts[j] > 0) x.push_back(-1.0 + double(2 * j + 1) * 0x1p-12), w.push_back(double(counts[j]));
  CHECK(x.size() > 256);
  const GefenCodebook same = learn_gefen_codebook(x, w, 256);
  CHECK(same.codes == c.codes);
  CHECK(mantis::test::same(same.cost, c.cost));
}

namespace {

// Compares the fast DP with the reference on one instance: codes bit for bit and the cost.
bool same_dp(const std::vector<double>& x, const std::vector<double>& w, int K) {
  const GefenCodebook a = learn_gefen_codebook(x, w, K), b = learn_gefen_codebook_reference(x, w, K);
  return a.codes.size() == b.codes.size() &&
         std::memcmp(a.codes.data(), b.codes.data(), a.codes.size() * sizeof(float)) == 0 &&
         mantis::test::same(a.cost, b.cost);
}

// B occupied bins out of 4096 (evenly spread when `even`, else at random), weights 1..wmax.
void instance(uint64_t seed, size_t B, bool even, uint64_t wmax, std::vector<double>& x, std::vector<double>& w) {
  x.clear(), w.clear();
  std::vector<size_t> bins;
  if (even)
    for (size_t j = 0; j < B; ++j) bins.push_back(j * size_t(kGefenHistogramBins) / B);
  else {
    std::vector<char> used(kGefenHistogramBins, 0);
    for (uint64_t k = 0; bins.size() < B; ++k) {
      const size_t j = random_word(seed, 7, k) % kGefenHistogramBins;
      if (!used[j]) used[j] = 1, bins.push_back(j);
    }
    std::sort(bins.begin(), bins.end());
  }
  for (size_t j : bins) {
    x.push_back(-1.0 + double(2 * j + 1) * 0x1p-12);
    w.push_back(double(1 + random_word(seed, 8, j) % wmax));
  }
}

}  // namespace

TEST_CASE("gefen codebook: the fast DP equals the reference DP bit for bit (codes and cost)") {
  std::vector<double> x, w;
  int n = 0;
  // random sizes, random or even spacing, weights from constant (many exact ties) to wide
  for (uint64_t seed = 0; seed < 120; ++seed) {
    const size_t B = 2 + random_word(seed, 1, 0) % 300;
    const int K = int(2 + random_word(seed, 1, 1) % (B - 1));  // K ≤ B, B near K included
    const uint64_t wmax = std::array<uint64_t, 4>{1, 2, 1000, 1000000}[seed % 4];
    instance(seed, B, seed % 3 == 0, wmax, x, w);
    INFO("seed " << seed << " B " << B << " K " << K << " wmax " << wmax);
    CHECK(same_dp(x, w, K));
    ++n;
  }
  // B at and just above K = 256; crafted ties: equally spaced points, equal weights, symmetric
  for (size_t B : {256, 257, 259, 300, 600}) {
    instance(B, B, true, 1, x, w);
    INFO("even, equal weights, B " << B);
    CHECK(same_dp(x, w, 256));
    instance(B, B, false, 5, x, w);
    CHECK(same_dp(x, w, 256));
    n += 2;
  }
  // sparse: a few bins far apart, and a near-tie between two pairs of points
  CHECK(same_dp({-0.9, -0.1, 0.1, 0.9}, {1, 1, 1, 1}, 3));
  CHECK(same_dp({-0.5, -0.25, 0.25, 0.5, 0.75}, {3, 3, 3, 3, 3}, 4));
  CHECK(same_dp({-1.0 + 0x1p-12, 1.0 - 0x1p-12}, {1e12, 1}, 2));
  // all 4096 bins, a gradient-like histogram (fewer codes, so that the reference stays fast)
  std::vector<int64_t> counts(kGefenHistogramBins);
  for (size_t j = 0; j < counts.size(); ++j) {
    const double t = (double(j) - 2047.5) / 300.0;
    counts[j] = 1 + int64_t(1e6 * std::exp(-t * t / 2)) + int64_t(random_word(9, 0, j) % 7);
  }
  for (int K : {2, 3, 17}) {
    const GefenCodebook a = learn_gefen_codebook(counts, K), b = learn_gefen_codebook_reference(counts, K);
    CHECK(a.codes == b.codes);
    CHECK(mantis::test::same(a.cost, b.cost));
  }
  CHECK(n > 120);
}

// Hidden (run with `test_gefen_codebook "[full]"`): the reference takes seconds at this size.
TEST_CASE("gefen codebook: the fast DP equals the reference on 4096 occupied bins with K = 256", "[.][full]") {
  std::vector<int64_t> counts(kGefenHistogramBins);
  for (size_t j = 0; j < counts.size(); ++j) {
    const double t = (double(j) - 2047.5) / 300.0;
    counts[j] = 1 + int64_t(1e6 * std::exp(-t * t / 2)) + int64_t(random_word(9, 0, j) % 7);
  }
  const GefenCodebook a = learn_gefen_codebook(counts), b = learn_gefen_codebook_reference(counts);
  CHECK(a.codes == b.codes);
  CHECK(mantis::test::same(a.cost, b.cost));
}
